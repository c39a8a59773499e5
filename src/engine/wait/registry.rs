//! The waiters of one manager ([`Waits`]): registering a waiter, which
//! subscribes its keys' release channels on every node through the links
//! ([`super::link`]), and starting those links. See the
//! [module docs](super) for the protocol.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::registration::Registration;
use super::state::{Channel, Link, Shared, Slot, State};
use crate::engine::node::Node;
use crate::protocol::keys;

/// The waiters of one manager and its subscription connections.
#[derive(Debug)]
pub(crate) struct Waits {
    shared: Arc<Shared>,
}

impl Waits {
    /// The waiters of a manager of `nodes`; its registrations as a waiting
    /// manager last `lease` unless renewed (each link renews them every
    /// third of it).
    pub(crate) fn new(nodes: Vec<Arc<Node>>, lease: Duration) -> Self {
        use rand::RngExt;
        let links = nodes.iter().map(|_| Link::default()).collect();
        Waits {
            shared: Arc::new(Shared {
                nodes,
                id: format!("{:016x}", rand::rng().random::<u64>()),
                lease,
                state: Mutex::new(State {
                    channels: HashMap::new(),
                    used: VecDeque::new(),
                    links,
                    next_id: 0,
                }),
                changed: Notify::new(),
            }),
        }
    }

    /// How many release channels have waiters.
    #[cfg(test)]
    fn channels(&self) -> usize {
        self.shared.lock().channels.len()
    }

    /// Registers a waiter for `keys`, subscribes their release channels on
    /// every node where they are not yet, and waits (at most `within`) until
    /// a quorum of nodes confirmed, or each node confirmed or is known to be
    /// unavailable.
    ///
    /// The waiter is in the queues once this returns; the future only
    /// waits for the confirmations. It is boxed: the caller's future, which
    /// lives as long as it waits, then holds a pointer rather than room for
    /// this wait, which ends before the first sleep.
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped registration leaves (and unsubscribes what no
    /// other waiter needs) at once.
    pub(crate) fn register(
        &self,
        keys: &[String],
        within: Duration,
    ) -> Pin<Box<dyn Future<Output = Registration> + Send>> {
        let channels: Vec<Vec<u8>> = keys.iter().map(|k| keys::release_channel(k)).collect();
        let wake = Arc::new(Notify::new());
        let id = {
            let mut state = self.shared.lock();
            super::start::ensure_links(&self.shared, &mut state);
            let id = state.next_id;
            state.next_id += 1;
            let nodes = self.shared.nodes.len();
            let State {
                channels: all,
                links,
                ..
            } = &mut *state;
            for channel in &channels {
                let entry = all.entry(channel.clone()).or_insert_with(|| {
                    for link in links.iter_mut() {
                        link.mark(channel);
                    }
                    Channel {
                        waiters: VecDeque::new(),
                        subscribed: vec![false; nodes],
                        recent: VecDeque::new(),
                    }
                });
                entry.waiters.push_back(Slot {
                    id,
                    wake: wake.clone(),
                    woken: false,
                });
            }
            id
        };
        let registration = Registration {
            shared: self.shared.clone(),
            id,
            woke_by: vec![false; channels.len()],
            channels,
            wake,
            owes: false,
            granted: false,
        };
        Box::pin(async move {
            let _ = tokio::time::timeout(within, registration.confirmed()).await;
            registration
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_waiter_not_woken_is_woken() {
        let slot = |id| Slot {
            id,
            wake: Arc::new(Notify::new()),
            woken: false,
        };
        let mut channel = Channel {
            waiters: VecDeque::from([slot(0), slot(1)]),
            subscribed: vec![],
            recent: VecDeque::new(),
        };
        assert_eq!(channel.wake_one(), Some(0));
        assert_eq!(channel.wake_one(), Some(1));
        assert_eq!(channel.wake_one(), None);
        assert!(channel.waiters.iter().all(|s| s.woken));
        let waits = Waits::new(Vec::new(), Duration::from_secs(3));
        assert_eq!(waits.channels(), 0);
    }
}
