//! What redlock says on stderr, by `--quiet` and `--verbose`.

use std::fmt;

/// Where redlock's own lines go: stderr, each prefixed with `redlock: `.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Log {
    pub(crate) quiet: bool,
    pub(crate) verbose: bool,
}

impl Log {
    /// A step of a normal run: with `--verbose` only.
    pub(crate) fn info(&self, message: fmt::Arguments<'_>) {
        if self.verbose {
            eprintln!("redlock: {message}");
        }
    }

    /// An expected outcome that the caller may not care about (the lock held
    /// elsewhere): unless `--quiet`.
    pub(crate) fn notice(&self, message: &str) {
        if !self.quiet {
            eprintln!("redlock: {message}");
        }
    }

    /// An error: always.
    pub(crate) fn error(&self, message: fmt::Arguments<'_>) {
        eprintln!("redlock: {message}");
    }
}
