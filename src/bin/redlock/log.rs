//! What redlock says on stderr, by `--quiet` and `--verbose`.
//!
//! Every line is written with [`say`], which drops a failed write: a
//! stderr whose reader went away (`redlock run ... 2>&1 | head -1`) must not
//! end redlock mid-run, with the command unsupervised and the lock held
//! until its ttl runs out (`eprintln!` panics on such an error).

use std::fmt;
use std::io::Write;

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
            say(message);
        }
    }

    /// An expected outcome that the caller may not care about (the lock held
    /// elsewhere): unless `--quiet`.
    pub(crate) fn notice(&self, message: &str) {
        if !self.quiet {
            say(format_args!("{message}"));
        }
    }

    /// An error: always.
    pub(crate) fn error(&self, message: fmt::Arguments<'_>) {
        say(message);
    }
}

/// Writes one line to stderr, ignoring any failure: there is nowhere else
/// to report it, and what redlock does next (end the command, release the
/// lock) matters more than the line.
fn say(message: fmt::Arguments<'_>) {
    // One write of the whole line, so that lines of concurrent writers to
    // the same stderr do not interleave mid-line.
    let line = format!("redlock: {message}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
