//! The waiting state of one manager, shared by its waiters and its links
//! and guarded by one mutex (never held across an await): the queues per
//! release channel, each link's changed channels and status, and what a
//! release message does to them ([`deliver`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;

use crate::engine::node::Node;

/// How many release messages each channel remembers, to count a release
/// published on several nodes once.
const RECENT: usize = 16;

/// The most channels a link keeps as changed before it looks at them; past
/// that it forgets them and compares every channel with what it has
/// subscribed (a node that hangs must not make the queue grow with every
/// waiter that comes and goes).
const MAX_DIRTY: usize = 4096;

pub(super) struct Shared {
    pub(super) nodes: Vec<Arc<Node>>,
    /// This manager's id in the keys' waiting hashes
    /// ([`keys::waiters_key`](crate::protocol::keys::waiters_key)): 16 random hex digits.
    pub(super) id: String,
    /// How long a registration in a waiting hash lasts unless renewed.
    pub(super) lease: Duration,
    /// Never held across an await.
    pub(super) state: Mutex<State>,
    /// Notified whenever a subscription was confirmed or a link changed
    /// status.
    pub(super) changed: Notify,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("Waits")
            .field("channels", &state.channels.len())
            .finish()
    }
}

pub(super) struct State {
    pub(super) channels: HashMap<Vec<u8>, Channel>,
    /// The last releases that woke a waiter here, whatever their key.
    pub(super) used: VecDeque<Vec<u8>>,
    pub(super) links: Vec<Link>,
    pub(super) next_id: u64,
}

/// One key's release channel: its waiters in registration order.
pub(super) struct Channel {
    pub(super) waiters: VecDeque<Slot>,
    /// Per node: whether the link confirmed the subscription.
    pub(super) subscribed: Vec<bool>,
    /// The last release messages seen on it, and the waiter each woke.
    pub(super) recent: VecDeque<(Vec<u8>, u64)>,
}

pub(super) struct Slot {
    pub(super) id: u64,
    pub(super) wake: Arc<Notify>,
    /// Woken by a release and not yet awake to it.
    pub(super) woken: bool,
}

#[derive(Default)]
pub(super) struct Link {
    /// Channels whose wanted state may have changed since the link looked
    /// (at most [`MAX_DIRTY`]).
    pub(super) dirty: HashSet<Vec<u8>>,
    /// The link must compare every channel with what it subscribed: more
    /// than [`MAX_DIRTY`] changed.
    pub(super) resync: bool,
    /// Rings the link's task when `dirty` or `resync` changed: one pending
    /// ring is enough, so the channel holds one. Dropped with the manager,
    /// which ends the task.
    pub(super) bell: Option<mpsc::Sender<()>>,
    pub(super) task: Option<JoinHandle<()>>,
    pub(super) status: Status,
}

impl Link {
    /// Marks `channel` as changed and rings the task.
    pub(super) fn mark(&mut self, channel: &[u8]) {
        if self.dirty.len() >= MAX_DIRTY {
            self.dirty.clear();
            self.resync = true;
        }
        if !self.resync {
            self.dirty.insert(channel.to_vec());
        }
        if let Some(bell) = &self.bell {
            let _ = bell.try_send(());
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    #[default]
    Connecting,
    Up,
    /// Unreachable, broken, or subscription denied.
    Down,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // Every write under it is a single insert, remove or assignment; a
        // panic cannot leave it inconsistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Channel {
    /// Wakes the first waiter not already woken; returns its id.
    pub(super) fn wake_one(&mut self) -> Option<u64> {
        let slot = self.waiters.iter_mut().find(|s| !s.woken)?;
        slot.woken = true;
        slot.wake.notify_one();
        Some(slot.id)
    }

    /// Passes the wake-up of waiter `from` (which cannot use it: it left,
    /// or is held up by another of its keys) to the first other waiter not
    /// already woken, and with it the releases that woke `from`: their
    /// copies from the other nodes go to the new waiter. Returns its id.
    pub(super) fn pass_on(&mut self, from: u64) -> Option<u64> {
        let slot = self.waiters.iter_mut().find(|s| !s.woken && s.id != from)?;
        slot.woken = true;
        slot.wake.notify_one();
        let to = slot.id;
        for (_, woke) in self.recent.iter_mut().filter(|(_, w)| *w == from) {
            *woke = to;
        }
        Some(to)
    }
}

/// Wakes every waiter of every channel: a node's subscription broke or was
/// made again, and a release may have been missed in between.
pub(super) fn wake_all(state: &State) {
    for channel in state.channels.values() {
        for slot in &channel.waiters {
            slot.wake.notify_one();
        }
    }
}

/// Counts a release message on `channel` (a key's release channel): once
/// per release, however many nodes publish it, waking one waiter. `named`:
/// it came on this manager's own channel for the key, naming it the
/// successor. Returns the message when it named this manager and no waiter
/// of the key is left: the caller passes the release on to every manager.
pub(super) fn deliver(
    shared: &Shared,
    channel: &[u8],
    message: &[u8],
    named: bool,
) -> Option<Vec<u8>> {
    let mut state = shared.lock();
    let State { channels, used, .. } = &mut *state;
    let Some(entry) = channels.get_mut(channel) else {
        // The copies from the other nodes of a release that a waiter here
        // already took are no orphans.
        let took = used.iter().any(|m| m == message);
        return (named && !took).then(|| message.to_vec());
    };
    if let Some((_, woke)) = entry.recent.iter().find(|(m, _)| m == message) {
        // The same release from another node: it goes to the waiter the
        // first copy woke. That waiter's attempt may have reached this node
        // before the release did and found the old holder; it tries again.
        // If that waiter left with the lock, the release is used up; if it
        // left without, it passed the wake-up on already.
        let woke = *woke;
        if let Some(slot) = entry.waiters.iter_mut().find(|s| s.id == woke) {
            slot.woken = true;
            slot.wake.notify_one();
        }
        return None;
    }
    if entry.recent.len() == RECENT {
        entry.recent.pop_front();
    }
    let woke = entry.wake_one();
    entry
        .recent
        .push_back((message.to_vec(), woke.unwrap_or(u64::MAX)));
    if woke.is_some() {
        if used.len() == RECENT {
            used.pop_front();
        }
        used.push_back(message.to_vec());
    }
    None
}

/// Sets node `index`'s status and, when it went down, forgets its
/// subscriptions.
pub(super) fn set_status(shared: &Shared, index: usize, status: Status) {
    let mut state = shared.lock();
    state.links[index].status = status;
    if status == Status::Down {
        for channel in state.channels.values_mut() {
            channel.subscribed[index] = false;
        }
    }
    drop(state);
    shared.changed.notify_waiters();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_keeps_a_bounded_set_of_changes() {
        // A link whose task does not read (its node hangs) while waiters
        // come and go on ever new keys.
        let (bell, mut rings) = mpsc::channel(1);
        let mut link = Link {
            bell: Some(bell),
            ..Link::default()
        };
        for round in 0..3 {
            for k in 0..MAX_DIRTY * 3 {
                link.mark(format!("key:{round}:{k}").as_bytes());
                // The same channel again (its waiter left) adds nothing.
                link.mark(format!("key:{round}:{k}").as_bytes());
                assert!(link.dirty.len() <= MAX_DIRTY);
            }
        }
        assert!(link.resync, "past the bound, the link compares everything");
        assert!(rings.try_recv().is_ok(), "rung");
        assert!(rings.try_recv().is_err(), "one ring pending at most");
    }

    #[test]
    fn a_wake_up_passed_on_takes_the_later_copies_with_it() {
        let slot = |id| Slot {
            id,
            wake: Arc::new(Notify::new()),
            woken: false,
        };
        let mut channel = Channel {
            waiters: VecDeque::from([slot(0), slot(1), slot(2)]),
            subscribed: vec![],
            recent: VecDeque::new(),
        };
        let first = channel.wake_one();
        channel.recent.push_back((b"m".to_vec(), first.unwrap()));
        // Waiter 0 woke (its flag reset) and cannot use it.
        channel.waiters[0].woken = false;
        assert_eq!(channel.pass_on(0), Some(1), "not back to itself");
        assert_eq!(channel.recent[0].1, 1, "the release's copies go to 1");
        assert_eq!(channel.pass_on(0), Some(2), "1 is woken already");
        assert_eq!(channel.pass_on(0), None);
    }
}
