//! One waiter's place in the queues of its keys ([`Registration`]): how it
//! waits for its subscriptions, sleeps until a release or a deadline,
//! passes on a wake-up it cannot use, and leaves. See the
//! [module docs](super) for the protocol.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

use super::state::{Shared, State, Status};
use crate::protocol::quorum::quorum;

/// One waiter's place in the queues of its keys. Leaves them when dropped.
#[derive(Debug)]
pub(crate) struct Registration {
    pub(super) shared: Arc<Shared>,
    pub(super) id: u64,
    pub(super) channels: Vec<Vec<u8>>,
    pub(super) wake: Arc<Notify>,
    /// Woke to a release and has not seen a holder since: leaving without
    /// the lock passes that wake-up on.
    pub(super) owes: bool,
    /// Per channel (as in `channels`): a release on it woke this waiter
    /// since it last used or passed on a wake-up.
    pub(super) woke_by: Vec<bool>,
    pub(super) granted: bool,
}

impl Registration {
    /// Waits until a quorum of nodes confirmed this waiter's channels, or
    /// every node confirmed them or is down. A quorum is enough: a release
    /// that succeeded deleted the key on a quorum, and two quorums share a
    /// node, so one of its messages reaches this waiter. A node that hangs
    /// (paused) does not hold it up.
    pub(super) async fn confirmed(&self) {
        loop {
            let changed = self.shared.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            if self.enough_confirmed() {
                return;
            }
            changed.await;
        }
    }

    fn enough_confirmed(&self) -> bool {
        let nodes = self.shared.nodes.len();
        if self.subscribed_on() >= quorum(nodes) {
            return true;
        }
        let state = self.shared.lock();
        self.channels.iter().all(|channel| {
            state.channels.get(channel).is_none_or(|c| {
                c.subscribed
                    .iter()
                    .zip(&state.links)
                    .all(|(s, l)| *s || l.status == Status::Down)
            })
        })
    }

    /// On how many nodes every channel of this waiter is subscribed.
    pub(crate) fn subscribed_on(&self) -> usize {
        let state = self.shared.lock();
        (0..self.shared.nodes.len())
            .filter(|&i| {
                self.channels
                    .iter()
                    .all(|c| state.channels.get(c).is_some_and(|c| c.subscribed[i]))
            })
            .count()
    }

    /// Whether this waiter is the first of any of its keys' queues: that one
    /// keeps the timed retry as a safety net for releases nobody publishes.
    pub(crate) fn is_first(&self) -> bool {
        let state = self.shared.lock();
        self.channels.iter().any(|c| {
            state
                .channels
                .get(c)
                .and_then(|c| c.waiters.front())
                .is_some_and(|s| s.id == self.id)
        })
    }

    /// The last attempt found a holder. On one key, any wake-up this waiter
    /// had was used: the key has a holder again (whose release wakes the
    /// next waiter), or the release has not reached every node yet (its
    /// later copies wake this waiter again). On a set of keys, the holder
    /// may be another key's: a release that woke this waiter goes on to
    /// the next waiter of its key, in this manager, as if this one had
    /// left. A key with no other waiter here keeps it: the releaser's
    /// hand-off check ([`HANDOFF_CHECK`](crate::protocol::timing::HANDOFF_CHECK)) tells the other managers.
    pub(crate) fn saw_holder(&mut self) {
        if self.owes && self.channels.len() > 1 {
            let mut state = self.shared.lock();
            for (channel, woke) in self.channels.iter().zip(&self.woke_by) {
                if let (true, Some(entry)) = (*woke, state.channels.get_mut(channel)) {
                    let _ = entry.pass_on(self.id);
                }
            }
        }
        self.owes = false;
        self.woke_by.iter_mut().for_each(|w| *w = false);
    }

    /// Sleeps until a release wakes this waiter (`true`) or until `at`
    /// (`false`). A wake-up that came while the waiter was not sleeping (in
    /// an attempt) is kept and ends the next sleep at once.
    ///
    /// # Cancel safety
    /// Cancel-safe: a wake-up is consumed only when this returns `true`.
    pub(crate) async fn sleep_until(&mut self, at: Instant) -> bool {
        {
            // A link that died with the runtime it ran on (another one than
            // this waiter's) starts again here.
            let mut state = self.shared.lock();
            super::start::ensure_links(&self.shared, &mut state);
        }
        let woke = tokio::select! {
            _ = self.wake.notified() => true,
            _ = tokio::time::sleep_until(at.into()) => false,
        };
        if woke {
            self.owes = true;
            let mut state = self.shared.lock();
            for (channel, woke_by) in self.channels.iter().zip(&mut self.woke_by) {
                if let Some(entry) = state.channels.get_mut(channel)
                    && let Some(slot) = entry.waiters.iter_mut().find(|s| s.id == self.id)
                {
                    *woke_by |= slot.woken;
                    slot.woken = false;
                }
            }
        }
        woke
    }

    /// Leaves the queues with the lock: nothing is passed on (the holder's
    /// release will wake the next waiter).
    pub(crate) fn granted(mut self) {
        self.granted = true;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        let State {
            channels: all,
            links,
            ..
        } = &mut *state;
        for (channel, woke_by) in self.channels.iter().zip(&self.woke_by) {
            let Some(entry) = all.get_mut(channel) else {
                continue;
            };
            let Some(at) = entry.waiters.iter().position(|s| s.id == self.id) else {
                continue;
            };
            let slot = entry.waiters.remove(at).expect("found above");
            if !self.granted && (slot.woken || (self.owes && *woke_by)) {
                let _ = entry.pass_on(self.id);
            }
            if entry.waiters.is_empty() {
                all.remove(channel);
                for link in links.iter_mut() {
                    link.mark(channel);
                }
            }
        }
    }
}
