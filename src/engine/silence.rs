//! Whether a node is silent: its last request, or connection attempt,
//! timed out, and nothing was heard from it since (paused, blackholed, or
//! slower than the node timeout). A release does not wait for a silent
//! node ([`Until::AllAnswering`](crate::engine::round::Until::AllAnswering)):
//! it sends the request, leaves it to finish in the background, and owes
//! the node the release. Any answer from the node, or a connection made to
//! it, ends its silence.

use std::sync::atomic::{AtomicBool, Ordering};

/// One node's silence; read on every release, written only when it
/// changes (a store per request would bounce the flag between cores).
#[derive(Debug, Default)]
pub(crate) struct Silence(AtomicBool);

impl Silence {
    /// A request or connection attempt timed out.
    pub(crate) fn timed_out(&self) {
        if !self.0.load(Ordering::Relaxed) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    /// The node said something (an answer, an error reply), or a
    /// connection to it was made.
    pub(crate) fn heard(&self) {
        if self.0.load(Ordering::Relaxed) {
            self.0.store(false, Ordering::Relaxed);
        }
    }

    /// Whether the node is silent now.
    pub(crate) fn is_silent(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}
