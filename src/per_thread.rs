//! [`PerThread`]: a copy of a shared, read-only value for each thread, so
//! that what a request clones of it counts on its own thread's copy.
//!
//! A request clones the layer's core (its future holds it, and hyper, tonic
//! and axum's routes clone the service, which holds it, for every request:
//! see `Core::local`) and the limiter's policies (its decision holds them,
//! and its `RateLimit-Policy` header is a clone of theirs). Cloning an
//! `Arc` or a shared `Bytes` writes its reference count; when every worker
//! thread clones the same one, that count's cache line moves between cores
//! at each request, which costs a cache miss each time (tens of ns) where a
//! thread's own line costs a few. Each thread takes the copy of its slot,
//! one of a fixed number (twice the cores, rounded up to a power of two),
//! made by the slot's first thread; the copies are equal, so which one a
//! request holds changes nothing but whose count it writes.
//! `benches/decision.rs`'s `two_threads` measures what this saves with two
//! threads sending through one layer at once: the layer's request went from
//! 2.0 µs to about 1.6 µs, and later, on another machine, from 1.0 µs to
//! 0.73 µs (medians of 11 runs) when the service's clones came to hold
//! their thread's copy too.
//!
//! Hand-rolled rather than `thread_local::ThreadLocal`, which bounds its
//! `T: Send` on the struct: a core holding its own copies would then carry
//! `Send + Sync` bounds into every generic type that holds a core.
//!
//! A copy's count must sit on a cache line of its own, or two threads'
//! copies would still share one: a type kept per thread is aligned to 128
//! bytes (two lines, for the adjacent-line prefetch), which puts the `Arc`'s
//! counts at the start of an allocation that no other value shares.

use std::{
    cell::Cell,
    fmt,
    sync::{
        Arc, OnceLock, Weak,
        atomic::{AtomicUsize, Ordering},
    },
    thread,
};

/// The alignment of a type kept per thread (see the module docs).
pub(crate) const ALIGN: usize = 128;

/// Copies of one value, one for each thread slot (see the module docs).
pub(crate) struct PerThread<T> {
    /// One entry per slot, each filled by the first thread of its slot.
    copies: OnceLock<Box<[OnceLock<Arc<T>>]>>,
}

impl<T> PerThread<T> {
    /// No copies yet: each is made at the first [`get`](Self::get) of its
    /// slot's threads, so a value used by one thread is copied once.
    pub(crate) const fn new() -> Self {
        Self {
            copies: OnceLock::new(),
        }
    }

    /// This thread's copy, made with `copy` if its slot has none yet.
    pub(crate) fn get(&self, copy: impl FnOnce() -> T) -> &Arc<T> {
        const { assert!(align_of::<T>() >= ALIGN) };
        let copies = self
            .copies
            .get_or_init(|| (0..slots()).map(|_| OnceLock::new()).collect());
        copies[index()].get_or_init(|| Arc::new(copy()))
    }

    /// Whether `arc` is one of the copies.
    pub(crate) fn holds(&self, arc: &Arc<T>) -> bool {
        self.made().any(|c| Arc::ptr_eq(c, arc))
    }

    /// The copies made so far.
    fn made(&self) -> impl Iterator<Item = &Arc<T>> {
        self.copies
            .get()
            .into_iter()
            .flatten()
            .filter_map(OnceLock::get)
    }
}

impl<T> Default for PerThread<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for PerThread<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let copies = self.made().count();
        f.debug_struct("PerThread")
            .field("copies", &copies)
            .finish()
    }
}

/// How many copies a value gets: at least twice the threads that can run
/// at once (so that the slots of a runtime's workers, given out in turn,
/// seldom meet), rounded up to a power of two, at most 64.
fn slots() -> usize {
    static SLOTS: OnceLock<usize> = OnceLock::new();
    *SLOTS.get_or_init(|| {
        let cores = thread::available_parallelism().map_or(4, |n| n.get());
        (2 * cores).next_power_of_two().clamp(2, 64)
    })
}

/// One empty place per slot, for weak references to a value's copies,
/// by [`index`].
pub(crate) fn weak_slots<T>() -> Arc<[OnceLock<Weak<T>>]> {
    (0..slots()).map(|_| OnceLock::new()).collect()
}

/// The index of this thread's copy in every [`PerThread`].
pub(crate) fn index() -> usize {
    // `slots()` is a power of two: a mask, not a division, per request.
    slot() & (slots() - 1)
}

/// This thread's slot: threads are numbered in the order they first ask.
fn slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    SLOT.with(|slot| {
        if slot.get() == usize::MAX {
            slot.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        slot.get()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(align(128))]
    #[derive(Debug, PartialEq)]
    struct Value(u32);

    #[test]
    fn a_thread_keeps_its_copy_and_another_slot_gets_its_own() {
        let per = PerThread::new();
        let mut made = 0;
        let here = Arc::as_ptr(per.get(|| {
            made += 1;
            Value(7)
        }));
        assert_eq!(made, 1, "one copy, for this thread's slot");
        assert_eq!(Arc::as_ptr(per.get(|| unreachable!())), here);
        let (there_slot, there) = thread::scope(|s| {
            s.spawn(|| (slot(), Arc::as_ptr(per.get(|| Value(7))) as usize))
                .join()
                .unwrap()
        });
        assert_ne!(there_slot, slot(), "each thread has a slot of its own");
        assert!(slots().is_power_of_two());
        if there_slot % slots() != slot() % slots() {
            assert_ne!(there, here as usize, "another slot, another copy");
        }
        assert_eq!(**per.get(|| unreachable!()), Value(7));
        assert!(per.made().count() <= 2);
    }

    #[test]
    fn holds_only_its_own_copies() {
        let per = PerThread::new();
        let mine = per.get(|| Value(1)).clone();
        assert!(per.holds(&mine));
        assert!(!per.holds(&Arc::new(Value(1))));
        assert!(!PerThread::<Value>::new().holds(&mine));
    }

    #[test]
    fn a_copy_starts_a_cache_line_of_its_own() {
        let per = PerThread::new();
        let copy = per.get(|| Value(0));
        // The data follows the counts by its alignment: the allocation, and
        // so its counts, start on a 128-byte boundary too.
        assert_eq!(Arc::as_ptr(copy) as usize % ALIGN, 0);
    }
}
