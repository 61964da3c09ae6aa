//! What `tracing` prints, captured for a test's assertions.

use std::{
    io,
    sync::{Arc, Mutex},
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
