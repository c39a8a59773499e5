//! Exit codes, one per outcome a caller must tell apart, and the failure
//! that carries one to `main`.
//!
//! The numbers come from BSD's `sysexits.h`, which cron wrappers and init
//! systems already know; 128+N for a signal is the shell's convention.

use std::fmt;

/// The lock could not be tried or is unusable (`EX_UNAVAILABLE`): bad
/// arguments, no nodes, a bad node URL, a ttl out of range, no quorum of
/// nodes answered, no fencing token could be made.
pub(crate) const UNAVAILABLE: u8 = 69;

/// The lock was lost while the command ran (`EX_IOERR`: the nodes could not
/// be reached to renew it, or a quorum no longer held our token).
pub(crate) const LOST: u8 = 74;

/// The lock is held elsewhere and the wait ran out (`EX_TEMPFAIL`: try
/// again later). The command did not run.
pub(crate) const HELD: u8 = 75;

/// The command could not be executed (as in the shell).
pub(crate) const CANNOT_EXECUTE: u8 = 126;

/// The command was not found (as in the shell).
pub(crate) const NOT_FOUND: u8 = 127;

/// `redlock status`: the lock is not held on a quorum.
pub(crate) const NOT_HELD: u8 = 1;

/// The code for death by signal `signal`: 128 + signal, as in the shell.
pub(crate) fn signaled(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(255)
}

/// Why redlock ends without the command's own exit code: the code, and the
/// one line to print (unless `quiet_ok` and `--quiet`).
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
    /// Whether `--quiet` drops the message: true for the expected outcomes
    /// (the lock held elsewhere, a wait ended by a signal), false for
    /// errors.
    pub(crate) quiet_ok: bool,
}

impl Failure {
    /// A configuration or lock error: exit 69, always reported.
    pub(crate) fn config(message: impl fmt::Display) -> Self {
        Failure {
            code: UNAVAILABLE,
            message: message.to_string(),
            quiet_ok: false,
        }
    }

    /// The lock is held elsewhere: exit 75.
    pub(crate) fn held(message: impl fmt::Display) -> Self {
        Failure {
            code: HELD,
            message: message.to_string(),
            quiet_ok: true,
        }
    }

    /// A signal ended the wait: exit 128 + signal.
    pub(crate) fn interrupted(signal: i32, name: &str) -> Self {
        Failure {
            code: signaled(signal),
            message: format!("{name} received while waiting for the lock; the command did not run"),
            quiet_ok: true,
        }
    }
}
