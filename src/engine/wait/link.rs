//! The link of one node: the task that owns the manager's subscription
//! connection to that node, subscribes the channels the waiters need,
//! delivers the release messages to the registry ([`super::registry`]),
//! keeps the manager's registrations in the keys' waiting hashes, and
//! reconnects after a break. See the [module docs](super) for the protocol.

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::side::{self, Side};
use super::state::{Shared, Status, deliver, set_status, wake_all};
use super::subscriber::{Event, Subscriber};
use crate::engine::node::Node;
use crate::protocol::keys;
use crate::protocol::request::register;
use crate::protocol::timing::{FIRST_BACKOFF, next_backoff};

/// The most channels one `SUBSCRIBE` names.
const BATCH: usize = 512;

/// The pause before a node whose subscription was denied is asked again.
const DENIED_PAUSE: Duration = Duration::from_secs(30);

/// The bound on each call a link makes on its node (a subscription, an
/// unsubscription): [`CALL_SLICES`] timer slices of this, 5 s on a runtime
/// that keeps up. Past it, the connection counts as broken and is made
/// again: a node that hangs (paused, or a network that drops packets) ends
/// the link's session instead of holding it for ever. The slices are
/// counted, not the time: a slice counts once its timer fired, however
/// late, so on a runtime too busy to poll the link (ten thousand waiters
/// starting at once on two cores) the bound stretches with it, and a busy
/// process is not taken for a hung node (a broken session wakes every
/// waiter, which would only add to the load).
const CALL_SLICE: Duration = Duration::from_millis(100);

/// See [`CALL_SLICE`].
const CALL_SLICES: u32 = 50;

/// Why a link's connection ended.
enum Ended {
    /// The manager is gone.
    Closed,
    /// The node denied a subscription (ACL).
    Denied,
    /// Connecting failed, or the connection broke.
    Broken,
}

/// The task behind one node's subscription connection: connects, subscribes
/// every channel that has waiters, then delivers messages and follows the
/// channels' changes, until the connection breaks (then again, after a
/// backoff) or the manager is dropped (it holds only a weak reference).
pub(super) async fn run_link(
    shared: Weak<Shared>,
    index: usize,
    changes: mpsc::Receiver<()>,
    restarted: bool,
) {
    let mut gone = Gone {
        shared: shared.clone(),
        index,
        armed: true,
    };
    serve_link(shared, index, changes, restarted).await;
    gone.armed = false;
}

/// Marks a link down and wakes every waiter when its task is dropped
/// unfinished (the runtime it ran on shut down): waiters on other runtimes
/// must not go on counting its subscriptions, and the next of them to
/// sleep starts it again ([`super::start::ensure_links`]).
struct Gone {
    shared: Weak<Shared>,
    index: usize,
    armed: bool,
}

impl Drop for Gone {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(shared) = self.shared.upgrade() {
            set_status(&shared, self.index, Status::Down);
            wake_all(&shared.lock());
        }
    }
}

/// [`run_link`]'s work.
async fn serve_link(
    shared: Weak<Shared>,
    index: usize,
    mut changes: mpsc::Receiver<()>,
    restarted: bool,
) {
    let mut backoff = FIRST_BACKOFF;
    // Whether a session of this link (or of the task it replaces, which
    // died with its runtime) was up before: when the next one comes up,
    // every waiter tries once more (a release may have come while the
    // subscription was down).
    let mut was_up = restarted;
    loop {
        let Some(node) = shared.upgrade().map(|s| s.nodes[index].clone()) else {
            return;
        };
        // Whether this session came up: only then does its end wake the
        // waiters and reset the backoff (a node that stays down must not
        // wake every waiter at each reconnection attempt).
        let mut up = false;
        // Read before connecting: a remake while the session starts counts.
        let remade = node.remade.load(std::sync::atomic::Ordering::Relaxed);
        let ended = match Subscriber::connect(&node).await {
            Err(_) => Ended::Broken,
            Ok(sub) => {
                let ended =
                    serve(&shared, index, sub, &mut changes, (was_up, remade), &mut up).await;
                if up {
                    backoff = FIRST_BACKOFF;
                    was_up = true;
                }
                ended
            }
        };
        let pause = match ended {
            Ended::Closed => return,
            Ended::Denied => DENIED_PAUSE,
            Ended::Broken => backoff,
        };
        let Some(strong) = shared.upgrade() else {
            return;
        };
        set_status(&strong, index, Status::Down);
        if up {
            wake_all(&strong.lock());
        }
        drop(strong);
        crate::trace::debug!(
            node = node.label(),
            denied = matches!(ended, Ended::Denied),
            ?pause,
            "release subscriptions unavailable; waiters use the timed retry"
        );
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = async { while changes.recv().await.is_some() {} } => return,
        }
        backoff = next_backoff(backoff);
    }
}

/// `work`, bounded by [`CALL_SLICES`] slices of [`CALL_SLICE`]: a call
/// that does not finish within them counts as a broken connection.
async fn bounded<F>(work: F) -> Result<(), Ended>
where
    F: std::future::Future<Output = Result<(), Ended>>,
{
    let mut work = std::pin::pin!(work);
    for _ in 0..CALL_SLICES {
        if let Ok(done) = tokio::time::timeout(CALL_SLICE, work.as_mut()).await {
            return done;
        }
    }
    Err(Ended::Broken)
}

/// Runs one subscription connection until it ends. `was_up`: an earlier
/// session of the link was up (then every waiter tries once more when this
/// one is); `remade`: the node's count of remade request connections when
/// this session started; `up` is set once this one is.
async fn serve(
    shared: &Weak<Shared>,
    index: usize,
    mut sub: Subscriber,
    changes: &mut mpsc::Receiver<()>,
    (was_up, remade): (bool, u32),
    up: &mut bool,
) -> Ended {
    let Some(Begin {
        wanted,
        node,
        id,
        lease,
    }) = begin(shared, index)
    else {
        return Ended::Closed;
    };
    // This manager's channels for the keys it is named the successor of
    // end in this.
    let own_suffix = keys::successor_channel(b"", &id);
    // Registrations, their removals and passed-on releases go out in order
    // from a task of their own, so that this one keeps reading messages.
    // Their order against the subscriptions does not matter for safety: a
    // release that names this manager where it is not subscribed reaches
    // nobody, and is then published for every manager. The queue is
    // bounded, and the task ends with the session.
    let (side, _sender) = side::start(node.clone(), shared.clone(), lease);
    let mut session = Session {
        actual: HashSet::new(),
        owned: HashSet::new(),
        named: true,
    };
    let subscribed = subscribe(shared, index, &mut sub, &mut session, &side, wanted);
    if let Err(ended) = subscribed.await {
        return ended;
    }
    let Some(strong) = shared.upgrade() else {
        return Ended::Closed;
    };
    set_status(&strong, index, Status::Up);
    if was_up {
        // Made again: a release may have come while it was down.
        wake_all(&strong.lock());
    }
    drop(strong);
    *up = true;
    // A master that went silent (paused, cut off) sends no disconnection,
    // and its replica may take its slots over meanwhile: when the node's
    // request connection was made anew after timeouts, so is this one.
    let mut renew = tokio::time::interval_at((Instant::now() + lease / 3).into(), lease / 3);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let step = tokio::select! {
            event = sub.next() => match event {
                None => return Ended::Broken,
                Some(Event::Message { channel, payload }) => {
                    on_message(shared, &sub, channel, &payload, &own_suffix, &side)
                }
                // A subscription the node ended by itself (its slot moved):
                // a new session subscribes it where it went, and wakes the
                // waiters (a release may have come in between).
                Some(Event::Dropped(channel)) if session.actual.contains(&channel) => {
                    return Ended::Broken;
                }
                Some(Event::Dropped(_)) => Ok(()),
            },
            _ = renew.tick() => {
                if node.remade.load(std::sync::atomic::Ordering::Relaxed) != remade {
                    return Ended::Broken;
                }
                // The waiting flags of every key still subscribed here
                // (a flag found gone wakes its waiters), then the
                // registrations.
                if !node.is_cluster() {
                    let _ = side.try_send(Side::Flags(session.actual.iter().cloned().collect()));
                }
                let cmds = session
                    .owned
                    .iter()
                    .map(|c| register::register(&sub.wire(c), &id, lease))
                    .collect();
                let _ = side.try_send(Side::Commands(cmds));
                Ok(())
            }
            change = changes.recv() => {
                if change.is_none() {
                    return Ended::Closed;
                }
                on_changes(shared, index, &mut sub, &mut session, &side, &id).await
            }
        };
        if let Err(ended) = step {
            return ended;
        }
    }
}

/// The start of a session: the channels wanted now (every one is
/// subscribed by the session, so the changes noted so far are covered),
/// the node, this manager's id and its registrations' lease. `None` when
/// the manager is gone.
fn begin(shared: &Weak<Shared>, index: usize) -> Option<Begin> {
    let s = shared.upgrade()?;
    let mut state = s.lock();
    let link = &mut state.links[index];
    link.dirty.clear();
    link.resync = false;
    let wanted: Vec<Vec<u8>> = state.channels.keys().cloned().collect();
    drop(state);
    Some(Begin {
        wanted,
        node: s.nodes[index].clone(),
        id: s.id.clone(),
        lease: s.lease,
    })
}

/// What a session starts from; see [`begin`].
struct Begin {
    wanted: Vec<Vec<u8>>,
    node: Arc<Node>,
    id: String,
    lease: Duration,
}

/// A release message on one of the session's channels: delivered to the
/// registry; a release that named this manager with no waiter of its key
/// left here is published again for every manager.
fn on_message(
    shared: &Weak<Shared>,
    sub: &Subscriber,
    mut channel: Vec<u8>,
    payload: &[u8],
    own_suffix: &[u8],
    side: &mpsc::Sender<Side>,
) -> Result<(), Ended> {
    let Some(strong) = shared.upgrade() else {
        return Err(Ended::Closed);
    };
    let named = channel.ends_with(own_suffix);
    if named {
        channel.truncate(channel.len() - own_suffix.len());
    }
    let orphan = deliver(&strong, &channel, payload, named);
    drop(strong);
    if let Some(hash) = orphan {
        // Named, with no waiter left here: every manager is
        // told instead, on the key's channel.
        let publish = register::publish(&sub.wire(&channel), &hash, sub.is_cluster());
        let _ = side.try_send(Side::Commands(vec![publish]));
    }
    Ok(())
}

/// The channels whose wanted state changed: confirms those still
/// subscribed to their new waiters, unsubscribes those nobody wants (out
/// of the waiting hashes first), and subscribes the new ones.
async fn on_changes(
    shared: &Weak<Shared>,
    index: usize,
    sub: &mut Subscriber,
    session: &mut Session,
    side: &mpsc::Sender<Side>,
    id: &str,
) -> Result<(), Ended> {
    let Some(strong) = shared.upgrade() else {
        return Err(Ended::Closed);
    };
    let (add, remove): (Vec<_>, Vec<_>) = {
        let mut state = strong.lock();
        let link = &mut state.links[index];
        let resync = std::mem::take(&mut link.resync);
        let mut batch = std::mem::take(&mut link.dirty);
        if resync {
            batch.extend(state.channels.keys().cloned());
            batch.extend(session.actual.iter().cloned());
        }
        // A channel wanted again before its unsubscription went
        // out is still subscribed here: confirm it to the new
        // waiters.
        let mut confirmed = false;
        for c in batch.iter().filter(|c| session.actual.contains(*c)) {
            if let Some(entry) = state.channels.get_mut(c) {
                confirmed |= !entry.subscribed[index];
                entry.subscribed[index] = true;
            }
        }
        let split = batch
            .into_iter()
            .filter(|c| state.channels.contains_key(c) != session.actual.contains(c))
            .partition(|c| state.channels.contains_key(c));
        drop(state);
        if confirmed {
            strong.changed.notify_waiters();
        }
        split
    };
    drop(strong);
    for chunk in remove.chunks(BATCH) {
        // Out of the waiting hashes (sent first, not awaited): a
        // release that still names this manager once it is
        // unsubscribed reaches nobody there, drops the
        // registration and is published for every manager.
        let cmds = chunk
            .iter()
            .map(|c| register::unregister(&sub.wire(c), id))
            .collect();
        let _ = side.try_send(Side::Commands(cmds));
        let mut names = chunk.to_vec();
        for c in chunk {
            if session.owned.remove(c) {
                names.push(keys::successor_channel(c, id));
            }
        }
        let unsubscribed =
            bounded(async { sub.unsubscribe(&names).await.map_err(|_| Ended::Broken) });
        unsubscribed.await?;
        for c in chunk {
            session.actual.remove(c);
        }
    }
    subscribe(shared, index, sub, session, side, add).await
}

/// What one subscription connection has subscribed.
struct Session {
    /// The keys' release channels.
    actual: HashSet<Vec<u8>>,
    /// The keys' release channels whose own channel (this manager's, for
    /// that key) is subscribed too, and which are registered in the key's
    /// waiting hash: the registrations the link renews.
    owned: HashSet<Vec<u8>>,
    /// Whether own channels are still asked for: false once the node denied
    /// one (an ACL that allows the keys' channels only).
    named: bool,
}

/// Subscribes `channels` (keys' release channels) in batches and marks
/// them confirmed on node `index`; then, while `session.named`, subscribes
/// this manager's own channels for those keys
/// ([`keys::successor_channel`]) and registers it in the keys' waiting
/// hashes (after the subscription: a release that names it must reach it).
/// A node that denies the own channels turns `named` false: its releases
/// then wake every manager.
async fn subscribe(
    shared: &Weak<Shared>,
    index: usize,
    sub: &mut Subscriber,
    session: &mut Session,
    side: &mpsc::Sender<Side>,
    channels: Vec<Vec<u8>>,
) -> Result<(), Ended> {
    // Denied: an ACL, or a server without the command (sharded pub/sub
    // came in Redis 7.0; Redis 6.2 quotes the channel, with its byte 0xFF,
    // in an error that redis-rs then cannot read, a parse error). Anything
    // else (CLUSTERDOWN, a connection gone) breaks the session, which is
    // made again after a short backoff.
    let denied = move |e: redis::RedisError| {
        if e.code() == Some("NOPERM")
            || e.to_string().contains("unknown command")
            || matches!(
                e.kind(),
                redis::ErrorKind::Parse | redis::ErrorKind::UnexpectedReturnType
            )
        {
            Ended::Denied
        } else {
            Ended::Broken
        }
    };
    let Some(lease) = shared.upgrade().map(|s| s.lease) else {
        return Err(Ended::Closed);
    };
    for chunk in channels.chunks(BATCH) {
        bounded(async { sub.subscribe(chunk).await.map_err(denied) }).await?;
        session.actual.extend(chunk.iter().cloned());
        // The flags before the confirmation: a waiter's next attempt
        // reaches the node after them, so the release of a holder it finds
        // there finds a flag, and publishes.
        let node = match shared.upgrade() {
            Some(strong) => strong.nodes[index].clone(),
            None => return Err(Ended::Closed),
        };
        if !node.is_cluster() {
            let flags = chunk.iter().map(|c| register::flag(c, lease));
            let set = async {
                side::set_flags(&node, flags).await.map_err(|e| match e {
                    Some(e) if e.code() == Some("NOPERM") => Ended::Denied,
                    _ => Ended::Broken,
                })
            };
            bounded(set).await?;
        }
        let Some(strong) = shared.upgrade() else {
            return Err(Ended::Closed);
        };
        {
            let mut state = strong.lock();
            for channel in chunk {
                if let Some(entry) = state.channels.get_mut(channel) {
                    entry.subscribed[index] = true;
                }
            }
        }
        strong.changed.notify_waiters();
        if !session.named {
            continue;
        }
        let id = strong.id.clone();
        drop(strong);
        let own: Vec<Vec<u8>> = chunk
            .iter()
            .map(|c| keys::successor_channel(c, &id))
            .collect();
        match bounded(async { sub.subscribe(&own).await.map_err(denied) }).await {
            Ok(()) => {}
            Err(Ended::Denied) => {
                session.named = false;
                continue;
            }
            Err(ended) => return Err(ended),
        }
        session.owned.extend(chunk.iter().cloned());
        let cmds = chunk
            .iter()
            .map(|c| register::register(&sub.wire(c), &id, lease))
            .collect();
        let _ = side.try_send(Side::Commands(cmds));
    }
    Ok(())
}
