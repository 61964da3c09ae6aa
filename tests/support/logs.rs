//! What `tracing` prints, captured for a test's assertions.

use std::{
    io,
    sync::{Arc, Mutex, OnceLock},
};

/// A `tracing` subscriber's output, kept in memory.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Makes this capture the thread's subscriber, for WARN and above,
    /// until the guard drops (a `#[tokio::test]`'s runtime runs its tasks
    /// on the test's thread).
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        self.install_at(tracing::Level::WARN)
    }

    /// As [`install`](Self::install), for `level` and above.
    pub fn install_at(&self, level: tracing::Level) -> tracing::subscriber::DefaultGuard {
        never_just_one_dispatcher();
        let out = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(level)
            .with_writer(move || out.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    /// Runs `f` with this capture installed; returns the WARN lines printed.
    pub fn warnings(&self, f: impl FnOnce()) -> Vec<String> {
        let guard = self.install();
        f();
        drop(guard);
        self.warning_lines()
    }

    /// The WARN lines printed so far.
    pub fn warning_lines(&self) -> Vec<String> {
        self.lines_at("WARN")
    }

    /// The lines of `level` (`"INFO"`, `"WARN"`, ...) printed so far.
    pub fn lines_at(&self, level: &str) -> Vec<String> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .filter(|l| l.contains(level))
            .map(str::to_owned)
            .collect()
    }
}

/// Keeps a second `tracing` dispatcher registered for the life of the test
/// binary. While only one is registered, tracing-core decides a callsite's
/// interest, when it is first reached, from the reaching thread's default
/// alone, and caches it: a log line first reached on a thread without a
/// capture (another test, running at the same time) was cached as never
/// wanted, and a capture on another thread missed it for good (the
/// breaker's "closed" line, first reached by a test without a capture,
/// failed `breaker_opens_when_redis_hangs_so_nobody_waits_for_timeouts`).
/// With two registered, it asks every dispatcher, and a line some capture
/// wants is checked at each event.
fn never_just_one_dispatcher() {
    static SECOND: OnceLock<tracing::Dispatch> = OnceLock::new();
    SECOND.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
}
