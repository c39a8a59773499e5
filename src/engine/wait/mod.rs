//! Event-driven waiting: a refused acquisition sleeps until the holder's
//! release is published, the holder's keys expire, or its own patience runs
//! out, whichever comes first, instead of polling.
//!
//! # The pieces
//! - **A release notifies.** The unlock scripts publish, in the same script
//!   as the delete, on the key's release channel
//!   ([`scripts::release_channel`]). No extra round trip.
//! - **A refusal tells how long.** An attempt of a waiter (every one after
//!   the first refusal, which is a bare `SET`) sends `PTTL key` right
//!   behind its `SET … NX PX … GET` in one pipeline (one round trip); [`Pttls`] keeps what the refusing nodes said, and
//!   [`expiry`] turns it into the instant a quorum of them will be free.
//! - **Subscribe, then try.** The first refusal registers the waiter
//!   ([`Waits::register`]), which subscribes the key's channel on every node
//!   and waits for the confirmations of a quorum of nodes (or of every node
//!   that is not down); only then is the next attempt sent, so a release
//!   between the refusal and the subscription is never slept through (it
//!   deleted the key on a quorum, and two quorums share a node). A node
//!   that hangs does not hold the waiter up.
//! - **One subscription connection per node per manager**, shared by all
//!   its waiters: a task per node ([`run_link`]) owns it, subscribes a
//!   channel when its first waiter comes and unsubscribes it when the last
//!   one leaves. Every call it makes on its node is bounded
//!   ([`CALL_SLICE`]: past it, the connection counts as broken and is
//!   made again), and what it still has to do is bounded too: the channels
//!   that changed, as a set of at most [`MAX_DIRTY`] (past that, it
//!   compares every channel), and at most [`SIDE_QUEUE`] batches of
//!   registrations, dropped with the session.
//! - **One wake-up per release per manager.** A release is published on
//!   every node that deleted the key, with the same message (a hash of the
//!   token); each channel remembers the last messages and counts a release
//!   once. It wakes the first waiter of the key that is not already woken,
//!   in registration order; the copies from the other nodes go to the same
//!   waiter (its attempt may have overtaken the release on those nodes and
//!   found the old holder there: it tries again). A wake-up its waiter
//!   cannot use goes on to the next waiter of the key, with the copies
//!   still to come: a waiter that leaves without the lock after it was
//!   woken (cancelled, out of patience), and a waiter for a set of keys
//!   whose attempt found a holder (it may be another key's). A waiter for
//!   one key that finds a holder keeps it: the key is held again (that
//!   holder's release wakes the next) or the release has not reached every
//!   node yet (its copies wake the same waiter again).
//! - **One manager woken per release, across managers.** Each manager
//!   also subscribes its own channel for each key it waits for
//!   ([`scripts::successor_channel`]: the key's channel, `0xFF`, its id),
//!   and then registers in the key's waiting hash on that node
//!   ([`scripts::waiters_key`], [`scripts::REGISTER`]), with a lease
//!   ([`LEASE`]) it renews every third of it; it removes the registration
//!   before it unsubscribes. A release picks one registered manager, the
//!   successor, and publishes on that manager's channel only: the other
//!   managers receive nothing. A release whose successor has no subscriber
//!   there (it died, its connection broke, or it already took the lock on
//!   the nodes that were quicker and left) drops that registration and
//!   tries the next (at most 3), then publishes on the key's channel, for
//!   everyone; so does one whose own-channel `PUBLISH` is denied. A
//!   manager named when no waiter of the key is left passes the release
//!   on: its link publishes it again on the key's channel. A node that
//!   denies the own channels (an ACL that allows the keys' channels only)
//!   gets no registration: its releases wake every manager, as without
//!   this.
//! - **The releaser checks the hand-off.** A subscriber is not a taker:
//!   `PUBLISH` counts the connection of a manager whose process is stopped
//!   (SIGSTOP, a debugger, a VM paused), and a live manager's waiters may
//!   all be unable to use the release. So an unlock script that named a
//!   successor says so (it returns 2), and the releaser, [`HANDOFF_CHECK`]
//!   (200 ms) later, asks each node that released: where the key is still
//!   free and no later release of it came, the release is published again
//!   on the key's channel, for every manager ([`check_handoff`]). A named
//!   manager that does not take the lock delays the others by about that
//!   much, per release that names it (a stopped one stays registered for at
//!   most its [`LEASE`]). Only releases that named a successor pay for it:
//!   one script per node, off the caller's path.
//! - **Degrading.** A node whose subscription is denied (ACL), down, or
//!   broken counts as unsubscribed. A waiter sleeps on notifications alone
//!   only while a quorum of nodes confirmed its subscription: a release that
//!   succeeded deleted the key on a quorum, and two quorums share a node, so
//!   one of its messages reaches us. Otherwise it also sleeps at most the
//!   timed retry pause (`retry_delay` + `retry_jitter`). Whenever a node's
//!   subscription breaks or is made again after a break, every waiter of
//!   the manager tries once more (a release may have been missed in
//!   between).
//! - **Foreign releases.** A client that deletes without publishing (another
//!   Redlock library) is caught at the key's expiry and by the first waiter
//!   of each key in each manager, which keeps the timed retry as a safety
//!   net. The other waiters of that key sleep until a notification (which
//!   that first waiter's own release, once it holds the lock, provides).
//!
//! # Fairness
//! Within one manager, waiters of a key are woken in the order they
//! registered (first refusal first), one per release. Across managers
//! (processes), each release names one registered manager, picked
//! uniformly by the token's hash. A first attempt (not yet waiting) can
//! still take a free lock before the named waiter's round. FIFO across
//! processes would need one queue that every client agrees on; with
//! independent nodes that is a consensus problem (the nodes may order two
//! enqueues differently, and a majority vote on a queue position is
//! another Redlock round per position), so it is not offered.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use redis::Value;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;

use crate::engine::acquire::Inner;
use crate::engine::node::Node;
use crate::engine::round::Request;
use crate::protocol::scripts;
use crate::protocol::tally::{Reply, quorum};

/// How many release messages each channel remembers, to count a release
/// published on several nodes once.
const RECENT: usize = 16;
/// The most channels one `SUBSCRIBE` names.
const BATCH: usize = 512;
/// The pause before a node whose subscription was denied is asked again.
const DENIED_PAUSE: Duration = Duration::from_secs(30);
/// The first pause before a broken subscription connection is made again.
const FIRST_BACKOFF: Duration = Duration::from_millis(25);
/// The longest such pause.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How long a manager's registration in a key's waiting hash lasts unless
/// its link renews it (every third of it): a manager that dies is named as
/// a successor for at most this long.
pub(crate) const LEASE: Duration = Duration::from_secs(6);
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
/// The bound on a batch of registrations (sent on the node's ordinary
/// connection, not awaited by the link).
const SIDE_TIMEOUT: Duration = Duration::from_secs(1);
/// The most channels a link keeps as changed before it looks at them; past
/// that it forgets them and compares every channel with what it has
/// subscribed (a node that hangs must not make the queue grow with every
/// waiter that comes and goes).
const MAX_DIRTY: usize = 4096;
/// The most batches of registrations (and passed-on releases) waiting to
/// be sent to one node; past that, a batch is dropped (a registration is
/// sent again at the next renewal; a release passed on is then published
/// by its releaser's hand-off check, [`HANDOFF_CHECK`]).
const SIDE_QUEUE: usize = 64;
/// How long after a release that named a successor its releaser checks
/// that the successor took the lock: where the key is still free and
/// managers still wait, the release is published again for every manager
/// ([`scripts::HANDOFF_CHECK`]). A named manager that cannot take the lock
/// (its process stopped, or its waiters could not use the release) delays
/// the others by about this much.
pub(crate) const HANDOFF_CHECK: Duration = Duration::from_millis(200);

/// The remaining times to live the nodes that refused an attempt reported:
/// `Some(ms)`, or `None` for a key without expiry.
#[derive(Debug, Default)]
pub(crate) struct Pttls(Mutex<Vec<Option<u64>>>);

impl Pttls {
    fn push(&self, pttl: i64) {
        let pttl = match pttl {
            // Gone since the SET: free now.
            -2 => Some(0),
            -1 => None,
            n if n >= 0 => Some(n as u64),
            _ => return,
        };
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(pttl);
    }

    /// How long until a quorum of the nodes is free, as far as these replies
    /// tell; see [`expiry`].
    pub(crate) fn holder_expiry(&self, nodes: usize) -> Option<Duration> {
        expiry(&self.0.lock().unwrap_or_else(|e| e.into_inner()), nodes)
    }
}

/// How long until enough of the refusing nodes' keys have expired that,
/// with the nodes that did not refuse, a quorum is free: the k-th smallest
/// ttl, plus a millisecond for the node's rounding. Nodes that did not
/// refuse are taken as free (waking early costs one round; waking late is
/// what must not happen). `None` when that key has no expiry.
pub(crate) fn expiry(pttls: &[Option<u64>], nodes: usize) -> Option<Duration> {
    let mut sorted = pttls.to_vec();
    sorted.sort_by_key(|p| p.unwrap_or(u64::MAX));
    let free = nodes.saturating_sub(sorted.len());
    let more = quorum(nodes).saturating_sub(free).max(1);
    let ms = sorted.get(more - 1).copied().flatten()?;
    Some(Duration::from_millis(ms.saturating_add(1)))
}

/// The acquisition of one key when the caller may wait:
/// `SET key token NX PX ttl GET` then `PTTL key`, in one pipeline.
pub(crate) fn acquire_request(key: &str, token: &str, millis: u64) -> Request {
    let mut pipe = redis::pipe();
    pipe.cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(millis)
        .arg("GET")
        .cmd("PTTL")
        .arg(key)
        .ignore_errors();
    Request::Pipe(Arc::new(pipe))
}

/// Reads the reply of [`acquire_request`]: the `SET`'s reply by `read`, and
/// where it refused, the `PTTL` into `pttls` (a `PTTL` the ACL denies is
/// left out: the expiry is then unknown).
pub(crate) fn read_acquire<'a, F>(
    pttls: &'a Pttls,
    read: F,
) -> impl Fn(&Value) -> Result<Reply, String> + 'a
where
    F: Fn(&Value) -> Result<Reply, String> + 'a,
{
    move |value| match value {
        Value::Array(parts) if parts.len() == 2 => {
            let reply = read(&parts[0])?;
            if let (Reply::Refused { .. }, Value::Int(pttl)) = (&reply, &parts[1]) {
                pttls.push(*pttl);
            }
            Ok(reply)
        }
        other => Err(format!("{other:?}")),
    }
}

/// The releaser's side of a hand-off: after a release that named a
/// successor on some node (the unlock script answered 2, see
/// [`scripts::UNLOCK`]), waits [`HANDOFF_CHECK`] and then, on each node in
/// `nodes` (those that released), publishes the release again for every
/// manager where a key is still free and no later release of it named a
/// successor or found one ([`scripts::HANDOFF_CHECK`]). A named manager that does not take the
/// lock (its process stopped: `PUBLISH` counted its connection; or none of
/// its waiters could use the release) then delays the others by about
/// [`HANDOFF_CHECK`], not until the next release or the holder's expiry.
///
/// Only contended releases pay for it (one script per node, later, off the
/// caller's path); an uncontended release names nobody. The check runs on
/// a task of the current runtime and holds the manager weakly: a manager
/// dropped, or a runtime shut down, within [`HANDOFF_CHECK`] of the
/// release sends none.
pub(crate) fn check_handoff(inner: &Arc<Inner>, nodes: &[usize], keys: &[&str], token: &str) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let inner = Arc::downgrade(inner);
    let nodes = nodes.to_vec();
    let keys: Vec<Vec<u8>> = keys.iter().map(|k| k.as_bytes().to_vec()).collect();
    let token = token.as_bytes().to_vec();
    runtime.spawn(async move {
        tokio::time::sleep(HANDOFF_CHECK).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let request = Request::Script {
            script: &scripts::HANDOFF_CHECK,
            keys: keys.into(),
            args: Arc::from([token]),
        };
        let timeout = inner.config.node_timeout;
        let checks = nodes.iter().map(|&index| {
            crate::engine::round::call(
                inner.nodes[index].clone(),
                index,
                request.clone(),
                timeout,
                crate::engine::round::InFlight::default(),
            )
        });
        // Read only by the trace (a no-op without the `tracing` feature).
        #[allow(unused_variables)]
        let republished = futures::future::join_all(checks)
            .await
            .iter()
            .filter(|r| matches!(r, Ok(Value::Int(n)) if *n > 0))
            .count();
        crate::trace::debug!(
            republished,
            "hand-off check: a release published again on the nodes where its key stayed free"
        );
    });
}

/// The waiters of one manager and its subscription connections.
#[derive(Debug)]
pub(crate) struct Waits {
    shared: Arc<Shared>,
}

struct Shared {
    nodes: Vec<Arc<Node>>,
    /// This manager's id in the keys' waiting hashes
    /// ([`scripts::waiters_key`]): 16 random hex digits.
    id: String,
    /// How long a registration in a waiting hash lasts unless renewed.
    lease: Duration,
    /// Never held across an await.
    state: Mutex<State>,
    /// Notified whenever a subscription was confirmed or a link changed
    /// status.
    changed: Notify,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("Waits")
            .field("channels", &state.channels.len())
            .finish()
    }
}

struct State {
    channels: HashMap<Vec<u8>, Channel>,
    /// The last releases that woke a waiter here, whatever their key.
    used: VecDeque<Vec<u8>>,
    links: Vec<Link>,
    next_id: u64,
}

/// One key's release channel: its waiters in registration order.
struct Channel {
    waiters: VecDeque<Slot>,
    /// Per node: whether the link confirmed the subscription.
    subscribed: Vec<bool>,
    /// The last release messages seen on it, and the waiter each woke.
    recent: VecDeque<(Vec<u8>, u64)>,
}

struct Slot {
    id: u64,
    wake: Arc<Notify>,
    /// Woken by a release and not yet awake to it.
    woken: bool,
}

#[derive(Default)]
struct Link {
    /// Channels whose wanted state may have changed since the link looked
    /// (at most [`MAX_DIRTY`]).
    dirty: HashSet<Vec<u8>>,
    /// The link must compare every channel with what it subscribed: more
    /// than [`MAX_DIRTY`] changed.
    resync: bool,
    /// Rings the link's task when `dirty` or `resync` changed: one pending
    /// ring is enough, so the channel holds one. Dropped with the manager,
    /// which ends the task.
    bell: Option<mpsc::Sender<()>>,
    task: Option<JoinHandle<()>>,
    status: Status,
}

impl Link {
    /// Marks `channel` as changed and rings the task.
    fn mark(&mut self, channel: &[u8]) {
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
enum Status {
    #[default]
    Connecting,
    Up,
    /// Unreachable, broken, or subscription denied.
    Down,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every write under it is a single insert, remove or assignment; a
        // panic cannot leave it inconsistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Channel {
    /// Wakes the first waiter not already woken; returns its id.
    fn wake_one(&mut self) -> Option<u64> {
        let slot = self.waiters.iter_mut().find(|s| !s.woken)?;
        slot.woken = true;
        slot.wake.notify_one();
        Some(slot.id)
    }

    /// Passes the wake-up of waiter `from` (which cannot use it: it left,
    /// or is held up by another of its keys) to the first other waiter not
    /// already woken, and with it the releases that woke `from`: their
    /// copies from the other nodes go to the new waiter. Returns its id.
    fn pass_on(&mut self, from: u64) -> Option<u64> {
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
    /// # Cancel safety
    /// Cancel-safe: a dropped registration leaves (and unsubscribes what no
    /// other waiter needs) at once.
    pub(crate) async fn register(&self, keys: &[String], within: Duration) -> Registration {
        let channels: Vec<Vec<u8>> = keys.iter().map(|k| scripts::release_channel(k)).collect();
        let wake = Arc::new(Notify::new());
        let id = {
            let mut state = self.shared.lock();
            ensure_links(&self.shared, &mut state);
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
        let _ = tokio::time::timeout(within, registration.confirmed()).await;
        registration
    }
}

/// Starts the link task of every node that has none running (none yet, or
/// it died with the runtime it ran on).
fn ensure_links(shared: &Arc<Shared>, state: &mut State) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    for index in 0..state.links.len() {
        if state.links[index]
            .task
            .as_ref()
            .is_some_and(|t| !t.is_finished())
        {
            continue;
        }
        // A new task knows no subscription of the old one.
        for channel in state.channels.values_mut() {
            channel.subscribed[index] = false;
        }
        let (bell, changes) = mpsc::channel(1);
        let link = &mut state.links[index];
        link.bell = Some(bell);
        link.dirty.clear();
        link.resync = false;
        link.status = Status::Connecting;
        link.task = Some(runtime.spawn(run_link(Arc::downgrade(shared), index, changes)));
    }
}

/// One waiter's place in the queues of its keys. Leaves them when dropped.
#[derive(Debug)]
pub(crate) struct Registration {
    shared: Arc<Shared>,
    id: u64,
    channels: Vec<Vec<u8>>,
    wake: Arc<Notify>,
    /// Woke to a release and has not seen a holder since: leaving without
    /// the lock passes that wake-up on.
    owes: bool,
    /// Per channel (as in `channels`): a release on it woke this waiter
    /// since it last used or passed on a wake-up.
    woke_by: Vec<bool>,
    granted: bool,
}

impl Registration {
    /// Waits until a quorum of nodes confirmed this waiter's channels, or
    /// every node confirmed them or is down. A quorum is enough: a release
    /// that succeeded deleted the key on a quorum, and two quorums share a
    /// node, so one of its messages reaches this waiter. A node that hangs
    /// (paused) does not hold it up.
    async fn confirmed(&self) {
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
    /// hand-off check ([`HANDOFF_CHECK`]) tells the other managers.
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

/// Wakes every waiter of every channel: a node's subscription broke or was
/// made again, and a release may have been missed in between.
fn wake_all(state: &State) {
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
fn deliver(shared: &Shared, channel: &[u8], message: &[u8], named: bool) -> Option<Vec<u8>> {
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
fn set_status(shared: &Shared, index: usize, status: Status) {
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
async fn run_link(shared: Weak<Shared>, index: usize, mut changes: mpsc::Receiver<()>) {
    let mut backoff = FIRST_BACKOFF;
    // Whether a session of this link was up before: when the next one comes
    // up, every waiter tries once more (a release may have come while the
    // subscription was down).
    let mut was_up = false;
    loop {
        let Some(node) = shared.upgrade().map(|s| s.nodes[index].clone()) else {
            return;
        };
        // Whether this session came up: only then does its end wake the
        // waiters and reset the backoff (a node that stays down must not
        // wake every waiter at each reconnection attempt).
        let mut up = false;
        let ended = match node.pubsub().await {
            Err(_) => Ended::Broken,
            Ok(pubsub) => {
                let ended = serve(&shared, index, pubsub, &mut changes, was_up, &mut up).await;
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
        backoff = (backoff * 2).min(MAX_BACKOFF);
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

/// Aborts the session's task that sends registrations when the session
/// ends: a node that hangs must not keep a queue of them alive.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs one subscription connection until it ends. `was_up`: an earlier
/// session of the link was up (then every waiter tries once more when this
/// one is); `up` is set once this one is.
async fn serve(
    shared: &Weak<Shared>,
    index: usize,
    pubsub: redis::aio::PubSub,
    changes: &mut mpsc::Receiver<()>,
    was_up: bool,
    up: &mut bool,
) -> Ended {
    let (mut sink, mut stream) = pubsub.split();
    let (wanted, node, id, lease) = match shared.upgrade() {
        Some(s) => {
            let mut state = s.lock();
            // Every channel wanted now is subscribed below: the changes
            // noted so far are covered.
            let link = &mut state.links[index];
            link.dirty.clear();
            link.resync = false;
            let wanted: Vec<Vec<u8>> = state.channels.keys().cloned().collect();
            drop(state);
            (wanted, s.nodes[index].clone(), s.id.clone(), s.lease)
        }
        None => return Ended::Closed,
    };
    // This manager's channels for the keys it is named the successor of
    // end in this.
    let own_suffix = scripts::successor_channel(b"", &id);
    // Registrations, their removals and passed-on releases go out in order
    // from a task of their own, so that this one keeps reading messages.
    // Their order against the subscriptions does not matter for safety: a
    // release that names this manager where it is not subscribed reaches
    // nobody, and is then published for every manager. The queue is
    // bounded, and the task ends with the session.
    let (side, mut queued) = mpsc::channel::<Vec<redis::Cmd>>(SIDE_QUEUE);
    let _sender = AbortOnDrop(tokio::spawn({
        let node = node.clone();
        async move {
            while let Some(cmds) = queued.recv().await {
                queue_commands(&node, cmds).await;
            }
        }
    }));
    let mut session = Session {
        actual: HashSet::new(),
        owned: HashSet::new(),
        named: true,
    };
    let subscribed = subscribe(shared, index, &mut sink, &mut session, &side, wanted);
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
    let mut renew = tokio::time::interval_at((Instant::now() + lease / 3).into(), lease / 3);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            message = stream.next() => {
                let Some(message) = message else {
                    return Ended::Broken;
                };
                let Some(strong) = shared.upgrade() else {
                    return Ended::Closed;
                };
                let Ok(mut channel) = message.get_channel::<Vec<u8>>() else {
                    continue;
                };
                let named = channel.ends_with(&own_suffix);
                if named {
                    channel.truncate(channel.len() - own_suffix.len());
                }
                let orphan = deliver(&strong, &channel, message.get_payload_bytes(), named);
                drop(strong);
                if let Some(hash) = orphan {
                    // Named, with no waiter left here: every manager is
                    // told instead, on the key's channel.
                    let mut cmd = redis::cmd("PUBLISH");
                    cmd.arg(&channel).arg(hash);
                    let _ = side.try_send(vec![cmd]);
                }
            }
            _ = renew.tick() => {
                let cmds = session.owned.iter().map(|c| register_cmd(c, &id, lease)).collect();
                let _ = side.try_send(cmds);
            }
            change = changes.recv() => {
                if change.is_none() {
                    return Ended::Closed;
                }
                let Some(strong) = shared.upgrade() else {
                    return Ended::Closed;
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
                        .map(|c| {
                            let mut cmd = redis::cmd("HDEL");
                            cmd.arg(scripts::waiters_key(scripts::channel_lock_key(c)))
                                .arg(&id);
                            cmd
                        })
                        .collect();
                    let _ = side.try_send(cmds);
                    let mut names = chunk.to_vec();
                    for c in chunk {
                        if session.owned.remove(c) {
                            names.push(scripts::successor_channel(c, &id));
                        }
                    }
                    let unsubscribed = bounded(async {
                        sink.unsubscribe(names).await.map_err(|_| Ended::Broken)
                    });
                    if let Err(ended) = unsubscribed.await {
                        return ended;
                    }
                    for c in chunk {
                        session.actual.remove(c);
                    }
                }
                let subscribed = subscribe(shared, index, &mut sink, &mut session, &side, add);
                if let Err(ended) = subscribed.await {
                    return ended;
                }
            }
        }
    }
}

/// The registration of this manager (`id`) in the waiting hash of
/// `channel`'s key, for `lease` ([`scripts::REGISTER`]).
fn register_cmd(channel: &[u8], id: &str, lease: Duration) -> redis::Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(scripts::REGISTER)
        .arg(1)
        .arg(scripts::waiters_key(scripts::channel_lock_key(channel)))
        .arg(id)
        .arg(lease.as_millis() as u64);
    cmd
}

/// Sends `cmds` to the node on its ordinary connection in one pipeline,
/// within [`SIDE_TIMEOUT`], ignoring the replies: a registration that fails (an
/// ACL, a node down) only means that releases there do not name this
/// manager, and its waiters are woken as before the registration.
async fn queue_commands(node: &Node, cmds: Vec<redis::Cmd>) {
    if cmds.is_empty() {
        return;
    }
    let mut pipe = redis::pipe();
    for cmd in cmds {
        pipe.add_command(cmd).ignore();
    }
    let _ = tokio::time::timeout(SIDE_TIMEOUT, async {
        if let Ok(conn) = node.connection().await {
            let mut conn = conn.conn;
            let _: Result<(), _> = pipe.query_async(&mut conn).await;
        }
    })
    .await;
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
/// ([`scripts::successor_channel`]) and registers it in the keys' waiting
/// hashes (after the subscription: a release that names it must reach it).
/// A node that denies the own channels turns `named` false: its releases
/// then wake every manager.
async fn subscribe(
    shared: &Weak<Shared>,
    index: usize,
    sink: &mut redis::aio::PubSubSink,
    session: &mut Session,
    side: &mpsc::Sender<Vec<redis::Cmd>>,
    channels: Vec<Vec<u8>>,
) -> Result<(), Ended> {
    let denied = |e: redis::RedisError| {
        if e.code() == Some("NOPERM") {
            Ended::Denied
        } else {
            Ended::Broken
        }
    };
    for chunk in channels.chunks(BATCH) {
        bounded(async { sink.subscribe(chunk).await.map_err(denied) }).await?;
        session.actual.extend(chunk.iter().cloned());
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
        let (id, lease) = (strong.id.clone(), strong.lease);
        drop(strong);
        let own: Vec<Vec<u8>> = chunk
            .iter()
            .map(|c| scripts::successor_channel(c, &id))
            .collect();
        match bounded(async { sink.subscribe(own).await.map_err(denied) }).await {
            Ok(()) => {}
            Err(Ended::Denied) => {
                session.named = false;
                continue;
            }
            Err(ended) => return Err(ended),
        }
        session.owned.extend(chunk.iter().cloned());
        let cmds = chunk.iter().map(|c| register_cmd(c, &id, lease)).collect();
        let _ = side.try_send(cmds);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_waits_for_a_quorum_of_refusing_nodes() {
        let ms = |n| Some(Duration::from_millis(n));
        // 5 nodes, all refused: the third key to expire frees a quorum.
        assert_eq!(
            expiry(&[Some(50), Some(10), Some(30), Some(20), Some(40)], 5),
            ms(31)
        );
        // 2 nodes did not refuse (taken as free): the first expiry suffices.
        assert_eq!(expiry(&[Some(50), Some(10), Some(30)], 5), ms(11));
        // A key without expiry among those needed: unknown.
        assert_eq!(expiry(&[None, None, None, Some(1), Some(2)], 5), None);
        assert_eq!(expiry(&[None, Some(1), Some(2), None, None], 5), None);
        assert_eq!(expiry(&[None, Some(1), Some(2)], 5), ms(2));
        // Gone already.
        assert_eq!(expiry(&[Some(0)], 1), ms(1));
        assert_eq!(expiry(&[], 3), None);
    }

    #[test]
    fn pttl_replies_are_read() {
        let pttls = Pttls::default();
        for p in [-2, -1, 7, -5] {
            pttls.push(p);
        }
        assert_eq!(
            *pttls.0.lock().unwrap(),
            vec![Some(0), None, Some(7)],
            "-5 is no PTTL reply"
        );
    }

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
