//! A model of `redlock-quorum`'s protocol for the `stateright` model checker.
//!
//! One explicit state machine (not stateright's actor runtime): clients,
//! nodes, and a network that is a *set* of messages, so that any message can
//! be delivered in any order, at any later time, or lost. Time is discrete
//! ticks of real time; the clients' clocks are real time, each node's clock
//! may run fast by one tick in any window of `ttl` ticks (the drift the
//! client's allowance must cover; a slow node only keeps keys longer).
//!
//! Each rule names the function in `src/` that implements it. The
//! generation markers, the restart guard and the generation-checked fencing
//! read (issue 11) are implemented in `src/protocol/generation.rs`, `src/protocol/scripts.rs`
//! and `src/engine/fence.rs`; this model was their specification first (see
//! README.md). Issue 21's shared counter (one fencing counter per node for
//! every name, `Resync`, `Cfg::other_fences`) was modeled before it was
//! implemented in `src/engine/fence.rs`.
//!
//! Properties (see [`LockModel::properties`]):
//! - `mutual exclusion`: at no instant do two clients whose locks share a
//!   key believe they hold them (a client believes while its clock is
//!   before its `expires_at` and it has not released); each node has two
//!   lock keys, and a client locks one or a set of them (multi-resource
//!   locks, `Cfg::keys`);
//! - `fencing tokens increase`: every fencing token issued is larger than
//!   every token issued before it;
//! - `tenure continuity`: a client never believes it holds while another
//!   client believed during the same tenure (same lock token) of it;
//! - `recovers` (liveness): from every reachable state, once faults stop,
//!   a client acquires the free resource (and gets a fencing token, when
//!   fencing is modeled) within a bounded fault-free schedule;
//! - witnesses (`sometimes`): a lock is granted, a fencing token is issued.
//!
//! Redis Clusters as nodes (issue 24): a node may be a cluster node, whose
//! vote is the vote of the shard master that owns the lock key's slot, with
//! a replica ([`Replica`]). The master's writes reach the replica in order,
//! each at some later step (replication lags), and a failover rolls the
//! node's data back to the replica's ([`Action::Failover`]). Agreement is
//! plain or acknowledged by the replica (`WAIT 1`, [`Agreement`]).
//!
//! The release gate of the waiting protocol ([`gate`]): a second, small
//! model, of one standalone node and the managers that wait on it, which
//! checks that a release that skips its publish never leaves a waiter
//! asleep. It shares [`check_model`] and [`Run`] with this one.

use std::fmt::Write as _;

use stateright::{Checker, Model, Path, Property};

pub mod gate;

/// Which fencing-token scheme the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fencing {
    /// No fencing actions.
    Off,
    /// Today's `Redlock::fencing_token` (src/engine/fence.rs): read the counters
    /// of a quorum where the lock is ours, take the largest plus one, raise
    /// a quorum to it. Every answer counts toward the read quorum.
    WriteBack,
    /// The design for issue 11: as `WriteBack`, but the read is proven only
    /// when the nodes whose counter may have been lost (absent, or written
    /// in an earlier generation of the node) cannot hide a write quorum;
    /// see [`LockModel::read_proven`]. Fails closed otherwise.
    Generation,
    /// Negative model: `INCR` the counter on every node where the lock is
    /// ours and take the largest result of a quorum; no write-back.
    IncrNoWriteBack,
}

/// How a node whose fencing counter is untrusted (missing, bare, or from an
/// earlier generation) becomes trusted again: the shared counter of issue
/// 21 (one counter per node for every name, src/engine/fence.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resync {
    /// The design: a write stores the largest of the node's value and the
    /// new number; it tags it with the node's generation (trusted) only
    /// when the fencing read that made the number started after the
    /// node's generation was born, by more than the write limit (a token
    /// is issued only while its write round is within that limit of its
    /// start: `fence::WRITE_LIMIT`; here, within the tick it started).
    /// Otherwise the value is stored bare (untrusted).
    Aged,
    /// Negative model (the first reading of the issue's suggestion, and
    /// the per-resource code before it): a write in a new generation sets
    /// the counter outright and trusts it at once. Safe for one name;
    /// with another name sharing the counter, a write made from a read
    /// that began before an earlier token was issued trusts a restarted
    /// node that lost that token.
    Always,
    /// Negative model (planted): a missing counter is read as a trusted 0,
    /// i.e. a node that restarted empty is trusted.
    MissingTrusted,
}

/// When a node's agreement to a write counts (`Durability`,
/// src/protocol/durability.rs; issue 24: Redis Clusters as nodes). The code
/// has one setting per manager, for every write of a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Agreement {
    /// `Durability::Memory`, the default: the agreement counts as soon as
    /// the node (a cluster node's shard master) wrote it.
    Plain,
    /// `Durability::Replicas { replicas: 1, .. }`: every write (`SET`,
    /// `EXTEND`, `FENCE_WRITE`) is pipelined with `WAIT 1 <timeout>`, and
    /// the node answers only once its replica has the write. A node whose
    /// replica does not confirm in time answers `NotDurable` (unknown: the
    /// client's `Timeout`); a node without a replica never confirms.
    Acknowledged,
    /// Negative model (not a mode of the code): acquisitions acknowledged,
    /// extensions plain. It shows that the extension needs the `WAIT` too.
    AcquireOnly,
}

/// How the model schedules a cluster node's replication (issue 24). Both
/// give the same behaviours of the clients; the second has fewer states.
/// How a guarded acquisition of one key on a standalone node checks the
/// node's generation marker (`restart_guard`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MarkerCheck {
    /// One atomic step: the script `SET_MARKED` (src/protocol/scripts.rs)
    /// makes or reads the marker and sets the key. The code's form on a
    /// node whose marker the manager does not know to be old.
    Script,
    /// Two steps, one pipeline on one connection: `SET key token NX PX ttl
    /// GET`, then `GET` of the marker (`acquire::known_old`, src/protocol/request/acquire.rs).
    /// Other requests, and a flush ([`Action::Flush`]), may run between
    /// them. The node counts only where the marker read is the
    /// generation that was old when the `SET` ran (the code: the one the
    /// manager knows to be old, which existed before the request was
    /// sent, so the same or fewer nodes count); anything else sends the
    /// script (`Body::Script`), as the code does where the marker
    /// changed. Every guarded `SET` takes this form first, so the model
    /// also has the code's script-only acquisitions, one extra `SET` of
    /// the same token earlier.
    After,
    /// Planted violation: the marker's `GET` first, then the `SET` that
    /// counts where that read was old (a `MULTI` without the atomicity).
    /// A flush between the two empties the node under a `SET` that then
    /// counts as old.
    Before,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Replication {
    /// The definition: each entry of the replication stream reaches the
    /// replica in its own step (`Action::Replicate`), at any time, in
    /// order; a failover promotes the replica as it is.
    Stepwise,
    /// The replica's position in the stream is chosen when it can be
    /// seen: when a held reply is sent (`Replicate` applies every entry up
    /// to the first one with a reply), or at a failover (`Failover(n, k)`:
    /// the replica had the first `k` entries). A replication step that no
    /// reply waits for changes nothing that a client can see until the
    /// next failover, so leaving it until then removes states, not
    /// behaviours (`tests/cluster_failover.rs` compares the two).
    Deferred,
}

/// The token of the other name's holder (`Cfg::other_fences`): its lock is
/// taken to be ours on every node at every time (an over-approximation of
/// any holder of any other name).
pub const OTHER: u8 = 0;

/// The model's parameters.
#[derive(Clone, Debug)]
pub struct Cfg {
    pub nodes: usize,
    pub clients: usize,
    /// The lock ttl in ticks (`PX`), on the node's clock.
    pub ttl: u8,
    /// The drift allowance in ticks: a client's lock ends at
    /// `start + ttl - drift` (`timing::Ttl::expires_at`). Node clocks gain
    /// at most this much over any `ttl` ticks (`fast_clocks`).
    pub drift: u8,
    /// The restart guard (design for issue 11): off, or `Some(max_ttl)` in
    /// ticks of the node's clock.
    pub guard: Option<u8>,
    pub fencing: Fencing,
    /// Node clocks may run fast (one extra tick per `ttl` ticks).
    pub fast_clocks: bool,
    /// The lock is dropped at `expires_at` even when an extend round is
    /// still running (the watchdog, src/engine/watchdog.rs `watchdog`). When
    /// false, a direct `Redlock::extend` may finish after the lock it was
    /// called with expired.
    pub watchdog: bool,
    /// The grant of an extension re-checks the lock's validity when the
    /// round ends (`Redlock::extend_inner`): a round that ends after the
    /// lock's `expires_at` fails and releases the lock's keys everywhere.
    /// `false` is the rule before issue 21 (validity checked only before the
    /// round), kept for the planted-violation test.
    pub extend_recheck: bool,
    /// The lock keys of each client, as a bit mask over the keys K0 and K1
    /// (`KEYS`): 0b01 a lock on K0 (`lock`), 0b11 a lock on the set
    /// {K0, K1} (`lock` given a set, scripts `ACQUIRE_MANY` / `EXTEND_MANY` /
    /// `UNLOCK_MANY`). A client not listed locks K0: an empty list is the
    /// single-resource model.
    pub keys: Vec<u8>,
    /// Nodes start without a generation marker (a brand-new cluster);
    /// otherwise every node starts with an old marker.
    pub fresh_cluster: bool,
    /// Time bound: no tick past this.
    pub max_time: u8,
    /// Acquisition rounds per client.
    pub attempts: u8,
    /// Extend rounds per client.
    pub extends: u8,
    /// Fencing requests per client (at most one per tenure).
    pub fences: u8,
    /// Nemesis budgets over the whole run.
    pub crashes: u8,
    pub losses: u8,
    pub drops: u8,
    /// Check the liveness oracle on every state (costly).
    pub liveness: bool,
    /// Symmetry reduction over nodes: every state is replaced by the one
    /// with its nodes in a canonical order (traces then show nodes
    /// renumbered along the way; keep it off for readable traces).
    pub symmetry: bool,
    /// Scenario shaping for a negative model: a client starts an
    /// acquisition only while no other client is acquiring or holding
    /// (successive holders, as on issue 11's schedule).
    pub sequential: bool,
    /// How untrusted fencing counters become trusted (issue 21).
    pub resync: Resync,
    /// Fencing calls of a holder of *another* name, which shares the
    /// node's counter (issue 21): its reads and writes interleave with
    /// everything; its tokens are for another resource and are not
    /// compared. 0: no such holder.
    pub other_fences: u8,
    /// The nodes start with node 0's counter at 1 (trusted) and the others
    /// missing: an earlier fencing write that reached one node only (a
    /// state `other_fences` reaches with one more call; given here to keep
    /// the search small).
    pub uneven: bool,
    /// Cluster nodes (issue 24): nodes `0..cluster_nodes` are each a Redis
    /// Cluster whose vote is that of the shard master owning the lock key's
    /// slot, with one replica. The master's writes reach the replica in
    /// order, each at some later step (`Action::Replicate`: replication
    /// may lag), and a failover (`Action::Failover`) rolls the node's data
    /// back to the replica's. The other nodes are standalone.
    pub cluster_nodes: usize,
    /// When a node's agreement to a write counts.
    pub agreement: Agreement,
    /// Failovers of cluster nodes over the run (a nemesis budget).
    pub failovers: u8,
    /// How replication steps are scheduled.
    pub replication: Replication,
    /// How a guarded acquisition of one key checks the marker (guard on,
    /// standalone nodes; a set of keys always takes the script). `Script`
    /// in every configuration but [`Cfg::pipelined`] and
    /// [`Cfg::check_before`]: the pipeline's extra step multiplies the
    /// states about a hundredfold.
    pub marker_check: MarkerCheck,
    /// Flushes over the run (a nemesis budget): a standalone node loses
    /// its data, marker included, and keeps its connections
    /// (`FLUSHALL`; [`Action::Flush`]).
    pub flushes: u8,
}

impl Cfg {
    /// The positive model: guard on (max_ttl = ttl), generation fencing,
    /// every nemesis; sizes for the quick CI run.
    pub fn quick() -> Self {
        Cfg {
            nodes: 3,
            clients: 2,
            ttl: 3,
            drift: 1,
            guard: Some(3),
            fencing: Fencing::Generation,
            fast_clocks: true,
            watchdog: true,
            extend_recheck: true,
            keys: Vec::new(),
            fresh_cluster: false,
            max_time: 3,
            attempts: 1,
            extends: 0,
            fences: 1,
            crashes: 0,
            losses: 1,
            drops: 0,
            liveness: true,
            symmetry: true,
            sequential: false,
            resync: Resync::Aged,
            other_fences: 0,
            uneven: false,
            cluster_nodes: 0,
            agreement: Agreement::Plain,
            failovers: 0,
            replication: Replication::Deferred,
            marker_check: MarkerCheck::Script,
            flushes: 0,
        }
    }

    /// Issue 24, sizes for CI: three cluster nodes (each a Redis Cluster,
    /// one replica per shard), two clients with an acquisition each, one
    /// failover, fast node clocks, 2 ticks. No restart guard (`build`
    /// refuses it with cluster nodes) and no fencing (a cluster node
    /// refuses it unless every key shares one slot; see README.md). No
    /// data-losing restart: a cluster node's loss is the failover. The
    /// command line adds a watchdog renewal per client (`extends`), more
    /// failovers and ticks.
    pub fn cluster(agreement: Agreement) -> Self {
        Cfg {
            cluster_nodes: 3,
            agreement,
            failovers: 1,
            guard: None,
            fencing: Fencing::Off,
            fences: 0,
            losses: 0,
            extends: 0,
            max_time: 2,
            liveness: false,
            ..Cfg::quick()
        }
    }

    /// Issue 24, a mixed list: nodes 0 and 1 are cluster nodes, node 2 a
    /// standalone master (fsync always: its fault would be a crash that
    /// keeps its data, `crashes`, 0 here), otherwise [`Cfg::cluster`].
    pub fn mixed(agreement: Agreement) -> Self {
        Cfg {
            cluster_nodes: 2,
            ..Cfg::cluster(agreement)
        }
    }

    /// Whether node `i` is a cluster node (has a replica).
    pub fn is_cluster(&self, i: usize) -> bool {
        i < self.cluster_nodes
    }

    /// The shared counter (issue 21): two successive holders of one name
    /// and a holder of another name with two fencing calls, all on one
    /// counter per node, with one data-losing restart. No guard (the
    /// restart guard plays no part in the counter's rule: young nodes are
    /// only more silent), exact clocks, one tick.
    pub fn shared_counter() -> Self {
        Cfg {
            guard: None,
            fast_clocks: false,
            max_time: 0,
            liveness: false,
            sequential: true,
            other_fences: 1,
            uneven: true,
            ..Cfg::quick()
        }
    }

    /// The exhaustive run: `quick` with one more tick (every ordering of
    /// both clients' acquire, fence and release around a data-losing
    /// restart, with fast node clocks, checked with the liveness oracle).
    pub fn exhaustive() -> Self {
        Cfg {
            max_time: 4,
            ..Cfg::quick()
        }
    }

    /// Every nemesis and an extend per client: too large to exhaust here;
    /// searched by random walks (`Search::Random`).
    pub fn all_faults(nodes: usize) -> Self {
        Cfg {
            nodes,
            max_time: 5,
            extends: 1,
            crashes: 1,
            losses: if nodes >= 5 { 2 } else { 1 },
            drops: 1,
            liveness: true,
            symmetry: false,
            ..Cfg::quick()
        }
    }

    /// Negative model: no restart guard, data-losing restarts.
    pub fn no_guard() -> Self {
        Cfg {
            guard: None,
            fencing: Fencing::Off,
            fast_clocks: false,
            max_time: 2,
            extends: 0,
            fences: 0,
            crashes: 0,
            losses: 1,
            drops: 0,
            liveness: false,
            symmetry: false,
            ..Cfg::quick()
        }
    }

    /// Negative model: fencing by the largest of a quorum of per-node
    /// `INCR`s, without write-back. No node fault; one lost message.
    pub fn incr_no_write_back() -> Self {
        Cfg {
            guard: None,
            fencing: Fencing::IncrNoWriteBack,
            fast_clocks: false,
            max_time: 1,
            attempts: 2,
            extends: 0,
            fences: 2,
            crashes: 0,
            losses: 0,
            drops: 1,
            liveness: false,
            symmetry: false,
            ..Cfg::quick()
        }
    }

    /// Negative model: today's fencing (quorum read, write-back) without
    /// the generation check, on the schedule of issue 11 (one node down
    /// while A locks and fences, one restarted empty, one paused while B
    /// locks and fences; "down" and "paused" are requests that are not
    /// delivered). A releases before B locks, so the restart guard
    /// plays no part in it; it is off here to keep the search small.
    pub fn fencing_without_generations() -> Self {
        Cfg {
            guard: None,
            fencing: Fencing::WriteBack,
            fast_clocks: false,
            max_time: 0,
            attempts: 1,
            extends: 0,
            fences: 1,
            crashes: 0,
            losses: 1,
            drops: 0,
            liveness: false,
            symmetry: false,
            sequential: true,
            ..Cfg::quick()
        }
    }

    /// Issue 21, item 10: an extend per client called directly, so that
    /// no watchdog drops the lock at `expires_at` while the round runs and
    /// a round may end after the lock expired. Sizes for CI: `quick`
    /// without fencing and without data loss, 3 ticks. (With `quick`'s
    /// fencing and its data loss, an extend per client did not finish at 2
    /// ticks in 8 GB here; the fencing token is issued only within
    /// validity, and an extension does not touch the counters. The data
    /// loss is checked at 2 ticks: `cargo run --release --
    /// direct-extend-loss`.)
    pub fn direct_extend() -> Self {
        Cfg {
            watchdog: false,
            extends: 1,
            fencing: Fencing::Off,
            fences: 0,
            losses: 0,
            ..Cfg::quick()
        }
    }

    /// Negative model (planted violation): [`Cfg::direct_extend`] with the
    /// grant rule before issue 21 (validity checked only before the
    /// round), 2 ticks. Node symmetry on (traces renumber nodes; run it
    /// with `SYMMETRY=0 cargo run --release -- extend-no-recheck` for a
    /// readable one).
    pub fn extend_without_recheck() -> Self {
        Cfg {
            extend_recheck: false,
            max_time: 2,
            liveness: false,
            ..Cfg::direct_extend()
        }
    }

    /// Multi-resource locks: client 0 locks K0, client 1 the set {K0, K1}
    /// (a single lock and a set sharing a key), each with an acquisition
    /// and an extension (by the watchdog), the data loss of `quick`, 2
    /// ticks. No fencing: `FENCE_READ_MANY` is not modeled (the fencing
    /// counters are being redesigned, issue 21 item 7).
    pub fn multi() -> Self {
        Cfg {
            keys: vec![0b01, 0b11],
            fencing: Fencing::Off,
            fences: 0,
            extends: 1,
            max_time: 2,
            ..Cfg::quick()
        }
    }

    /// The guarded acquisition's pipeline (`MarkerCheck::After`) against
    /// a flush, the one fault that empties a node between its two steps
    /// (a restart breaks the connection: the marker's `GET` is then never
    /// run). `quick` without its restart, fencing and liveness oracle, and
    /// with a flush, 2 ticks: 6.9 million states, about a minute here
    /// (`quick`'s script form has 0.07 million at this size; `TICKS=3
    /// cargo run --release -- pipelined` checks 18 million in 2.5 min).
    pub fn pipelined() -> Self {
        Cfg {
            marker_check: MarkerCheck::After,
            losses: 0,
            flushes: 1,
            max_time: 2,
            fencing: Fencing::Off,
            fences: 0,
            liveness: false,
            ..Cfg::quick()
        }
    }

    /// Negative model (planted violation): [`Cfg::pipelined`] with the
    /// marker read before the `SET` (`MarkerCheck::Before`).
    pub fn check_before() -> Self {
        Cfg {
            marker_check: MarkerCheck::Before,
            max_time: 2,
            ..Cfg::pipelined()
        }
    }

    /// The keys client `c` locks (a bit mask over `KEYS`).
    pub fn mask(&self, c: usize) -> u8 {
        self.keys.get(c).copied().unwrap_or(1)
    }

    /// Whether the locks of clients `c` and `d` share a key (and so must
    /// exclude each other).
    pub fn conflict(&self, c: usize, d: usize) -> bool {
        self.mask(c) & self.mask(d) != 0
    }

    pub fn quorum(&self) -> usize {
        self.nodes / 2 + 1
    }

    /// How many nodes may lose their data (a minority).
    pub fn minority(&self) -> usize {
        self.nodes - self.quorum()
    }
}

/// A node's generation marker (design for issue 11): a key without expiry
/// holding a generation id and the node's own `TIME` at its creation. A
/// data-losing restart loses it; the first request after it creates a new
/// one. `born` is `None` once the marker is older than `max_ttl` (it never
/// becomes young again), which keeps the state space small.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gen {
    pub id: u8,
    pub born: Option<u8>,
    /// The tick it was born, while a fencing read that started at or before
    /// it may still reach the node (the shared counter's re-sync rule,
    /// `Resync::Aged`); `None` once it is older than every such read.
    pub since: Option<u8>,
}

/// The lock keys a node has (K0 and K1).
pub const KEYS: usize = 2;

/// The keys of a mask.
fn each(mask: u8) -> impl Iterator<Item = usize> {
    (0..KEYS).filter(move |k| mask >> k & 1 == 1)
}

/// The first key of `mask` that holds another token than `tok`, if any.
fn held_by_other(n: &Node, mask: u8, tok: u8) -> Option<u8> {
    each(mask).find_map(|k| match n.keys[k] {
        Some((t, _)) if t != tok => Some(t),
        _ => None,
    })
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node {
    pub up: bool,
    /// The lock keys K0 and K1: (token, the instant it expires on a node
    /// clock that runs at the clients' rate; it may expire up to `drift`
    /// ticks earlier, see `Action::Expire`). Single-resource runs use K0
    /// only.
    pub keys: [Option<(u8, u8)>; KEYS],
    /// The fencing counter: (value, generation it was written in); the
    /// generation 0 marks a bare value (stored untrusted, `Resync::Aged`).
    pub fence: Option<(u8, u8)>,
    pub generation: Option<Gen>,
    /// Generations created so far (the source of ids).
    pub gens: u8,
    /// A cluster node's replica (issue 24); `None` for a standalone node.
    pub replica: Option<Replica>,
}

/// The replica of a cluster node's shard master (issue 24): its data, and
/// the master's writes it has not received yet. The generation marker is
/// taken to be on the replica (it is old, and a failover keeps it: neither
/// the guard nor the generation check sees a rollback).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Replica {
    /// The lock keys K0 and K1, as on the master.
    pub keys: [Option<(u8, u8)>; KEYS],
    /// The fencing counter, as on the master.
    pub fence: Option<(u8, u8)>,
    /// The replication stream not yet applied, oldest first: one entry per
    /// request the master ran, with the reply held until the replica has
    /// it (acknowledged agreement, `WAIT 1`).
    pub backlog: Vec<Repl>,
}

/// One request's effect in the replication stream.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Repl {
    /// What the request changed on the master.
    pub writes: Writes,
    /// The reply that waits for this entry (acknowledged agreement): it is
    /// sent when the replica applies the entry. `None` once no round waits
    /// for it.
    pub reply: Option<Held>,
}

/// What one request changed on the master, as replication sends it: the
/// new value of each key it changed (`Some(None)`: deleted) and of the
/// fencing counter. Key expiry on the master is not replicated: the
/// replica's copy expires at the same instant on its own (a fast clock of
/// the promoted replica is the master's `Expire` after the failover).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Writes {
    pub keys: [Option<Option<(u8, u8)>>; KEYS],
    pub fence: Option<Option<(u8, u8)>>,
}

impl Writes {
    fn is_empty(&self) -> bool {
        *self == Writes::default()
    }
}

/// A reply held for replication: the round it answers, and the answer.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Held {
    pub client: u8,
    pub rid: u8,
    pub reply: Reply,
}

impl Replica {
    fn apply(&mut self, writes: &Writes) {
        for (key, w) in self.keys.iter_mut().zip(writes.keys) {
            if let Some(v) = w {
                *key = v;
            }
        }
        if let Some(v) = writes.fence {
            self.fence = v;
        }
    }

    /// Whether `writes` would change nothing here.
    fn has(&self, writes: &Writes) -> bool {
        self.keys
            .iter()
            .zip(writes.keys)
            .all(|(key, w)| w.is_none_or(|v| *key == v))
            && writes.fence.is_none_or(|v| self.fence == v)
    }
}

/// A node's data as replication sees it: its lock keys and its counter.
type Data = ([Option<(u8, u8)>; KEYS], Option<(u8, u8)>);

impl Node {
    fn data(&self) -> Data {
        (self.keys, self.fence)
    }

    /// The master's writes since its data was `before`.
    fn writes_since(&self, before: &Data) -> Writes {
        let mut writes = Writes::default();
        for ((w, now), then) in writes.keys.iter_mut().zip(self.keys).zip(before.0) {
            if now != then {
                *w = Some(now);
            }
        }
        if self.fence != before.1 {
            writes.fence = Some(self.fence);
        }
        writes
    }

    /// On a cluster node, puts the master's writes since `before` in the
    /// replication stream.
    fn replicate_later(&mut self, before: &Data) {
        let writes = self.writes_since(before);
        if let Some(r) = &mut self.replica
            && !writes.is_empty()
        {
            r.backlog.push(Repl {
                writes,
                reply: None,
            });
        }
    }
}

/// A node's answer, as the tally reads it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// SET took (or found our token); extend: still ours; fence write done.
    Ok,
    /// SET found another holder's token.
    Held(u8),
    /// The key is not ours (extend, fencing).
    NotOurs,
    /// Extend found the key missing and set it again.
    Healed,
    /// Fencing read (or INCR): the counter, and whether it belongs to the
    /// node's current generation.
    Counter(u8, bool),
    /// Fencing read where the lock is not ours (generation fencing only):
    /// the counter is read all the same, as `FENCE_READ` does.
    Foreign(u8, bool),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reply {
    pub kind: Kind,
    /// The node's generation is younger than max_ttl (guard on only).
    pub young: bool,
    /// Fencing read: the node's generation id when it was born before the
    /// read started (by more than the write limit), so that the write made
    /// from this read may trust it (`Resync::Aged`); 0 otherwise. The code
    /// compares the marker's age with twice the write limit plus the
    /// read's duration, and names the generation in the write.
    pub resync: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ans {
    Pending,
    /// Timed out, lost, or the node was down.
    Unknown,
    Got(Reply),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Sub {
    None,
    Extending { start: u8, ans: Vec<Ans> },
    FenceRead { ans: Vec<Ans> },
    FenceWrite { v: u8, ans: Vec<Ans>, start: u8 },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Idle,
    Acquiring { tok: u8, start: u8, ans: Vec<Ans> },
    Holding { tok: u8, exp: u8, sub: Sub },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    pub phase: Phase,
    /// The current round's id; replies of other rounds are ignored.
    pub rid: u8,
    pub attempts: u8,
    pub extends: u8,
    pub fences: u8,
    /// This tenure has fenced already.
    pub fenced: bool,
    /// Another client believed it held the lock during this tenure.
    pub overlap: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Body {
    /// `SET key token NX PX ttl GET`: with the guard on a standalone node,
    /// the first step of the pipeline ([`MarkerCheck`]); otherwise atomic.
    Set(u8),
    /// The guarded script (`SET_MARKED`): one atomic step.
    Script(u8),
    /// [`MarkerCheck::After`]'s second step: the marker's `GET`, with the
    /// token, the old generation the `SET` ran in (0: none) and the
    /// `SET`'s reply (`None`: agreement; `Some(t)`: held by `t`).
    MarkerAfter(u8, u8, Option<u8>),
    /// [`MarkerCheck::Before`]'s second step: the `SET`, with the token
    /// and the old generation the marker's `GET` read.
    SetAfterMarker(u8, u8),
    Extend(u8),
    Unlock(u8),
    /// Token, the tick the read round started.
    FenceRead(u8, u8),
    /// Token, number, and the generation the write may trust the counter
    /// in (0: none; `Resync::Aged`).
    FenceWrite(u8, u8, u8),
    FenceIncr(u8),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Msg {
    pub client: u8,
    pub node: u8,
    pub rid: u8,
    pub body: Body,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub now: u8,
    pub nodes: Vec<Node>,
    pub clients: Vec<Client>,
    /// Messages in flight, sorted.
    pub net: Vec<Msg>,
    pub next_tok: u8,
    pub crashes: u8,
    pub losses: u8,
    pub drops: u8,
    pub failovers: u8,
    pub flushes: u8,
    /// History: the largest fencing token issued so far.
    pub fence_max: u8,
    /// History: a token was issued that was not larger than an earlier one.
    pub fence_repeat: Option<(u8, u8)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Real time advances one tick; every clock with it.
    Tick,
    /// Node `n`'s clock runs fast: its key `k` expires now, up to `drift`
    /// ticks before `ttl` has passed at the clients' rate.
    Expire(u8, u8),
    /// Node `n`'s clock runs fast: its generation marker is older than
    /// max_ttl on its clock up to `drift` ticks early.
    Age(u8),
    Acquire(u8),
    Extend(u8),
    Fence(u8),
    Release(u8),
    /// Client `c`'s round stops waiting: pending answers are unknown.
    Timeout(u8),
    /// The node runs the request; its reply reaches the client.
    Deliver(Msg),
    /// The node runs the request; its reply is lost.
    DeliverLoseReply(Msg),
    /// The request is lost.
    Drop(Msg),
    /// Node crash, data kept (fsync always).
    Crash(u8),
    Restart(u8),
    /// Data-losing restart: at once for an up node; for a down node, its
    /// data is gone when it restarts (at any later time, e.g. after the
    /// max ttl). Standalone nodes only.
    Lose(u8),
    /// Standalone node `n` loses its data (keys, counter, marker) and
    /// keeps its connections: requests in flight to it stay in flight
    /// (`FLUSHALL`, or an eviction that takes everything). Up nodes only.
    Flush(u8),
    /// Cluster node `n`'s replica receives the oldest write it lacks; a
    /// reply held for it (acknowledged agreement) reaches its client.
    /// (`Replication::Deferred`: every write up to the first one whose
    /// reply is held, and that reply.)
    Replicate(u8),
    /// Cluster node `n`'s shard master fails and its replica is promoted:
    /// the node's data rolls back to the replica's, and the replies held
    /// for replication are lost with the master's connections. Requests in
    /// flight stay in flight (redis-rs's cluster client retries them on the
    /// new master, or they are lost: a request never delivered). The old
    /// master rejoins as the new replica, with a full copy.
    /// (`Replication::Deferred`: the replica had received the first `k`
    /// entries of the stream; `Stepwise`: `k` is 0.)
    Failover(u8, u8),
}

/// The model.
#[derive(Clone, Debug)]
pub struct LockModel {
    pub cfg: Cfg,
}

impl LockModel {
    pub fn new(cfg: Cfg) -> Self {
        LockModel { cfg }
    }

    fn q(&self) -> usize {
        self.cfg.quorum()
    }

    /// Whether client `c` believes it holds the lock: its own clock is
    /// before the lock's `expires_at` (`Lock::is_valid`, src/engine/lock.rs;
    /// `timing::Ttl::expires_at`), and it has not released.
    pub fn believes(&self, s: &State, c: usize) -> bool {
        matches!(s.clients[c].phase, Phase::Holding { exp, .. } if s.now < exp)
    }

    /// The guarded acquisition of one key on a standalone node in two
    /// steps ([`MarkerCheck`]): runs one step of it, and puts the next
    /// (the second step, or the script where the marker is not the old
    /// generation) in flight on the same connection. `None` for every
    /// other request; `Some(reply)` where this was a step of it (`reply`:
    /// the answer, once the second step counts the node).
    fn pipelined(&self, s: &mut State, m: &Msg) -> Option<Option<Reply>> {
        let i = m.node as usize;
        let mask = self.cfg.mask(m.client as usize);
        if self.cfg.guard.is_none()
            || self.cfg.marker_check == MarkerCheck::Script
            || self.cfg.is_cluster(i)
            || mask.count_ones() != 1
        {
            return None;
        }
        let k = each(mask).next().unwrap_or(0);
        let now = s.now;
        let ttl = self.cfg.ttl;
        let n = &mut s.nodes[i];
        // The marker's id where it is old; 0 where it is young or missing.
        let old = match &n.generation {
            Some(Gen { id, born: None, .. }) => *id,
            _ => 0,
        };
        // A plain `SET … NX PX … GET` (no marker made): `None` where it
        // agreed, the holder's token where it did not.
        let mut set = |tok: u8| match n.keys[k] {
            Some((t, _)) if t != tok => Some(t),
            Some(_) => None,
            None => {
                n.keys[k] = Some((tok, now + ttl));
                None
            }
        };
        let answer = |held: Option<u8>| Reply {
            kind: held.map_or(Kind::Ok, Kind::Held),
            young: false,
            resync: 0,
        };
        let next = match (self.cfg.marker_check, &m.body) {
            (MarkerCheck::After, &Body::Set(tok)) => Body::MarkerAfter(tok, old, set(tok)),
            (MarkerCheck::After, &Body::MarkerAfter(tok, set_in, held)) => {
                if set_in != 0 && old == set_in {
                    return Some(Some(answer(held)));
                }
                Body::Script(tok)
            }
            (MarkerCheck::Before, &Body::Set(tok)) if old != 0 => Body::SetAfterMarker(tok, old),
            (MarkerCheck::Before, &Body::Set(tok)) => Body::Script(tok),
            (MarkerCheck::Before, &Body::SetAfterMarker(tok, _)) => {
                return Some(Some(answer(set(tok))));
            }
            _ => return None,
        };
        s.net.push(Msg {
            body: next,
            ..m.clone()
        });
        s.net.sort();
        Some(None)
    }

    /// Nodes answer with `young` only when the guard is on and their
    /// marker is younger than max_ttl on their own clock
    /// (`generation::Generation::reader`).
    fn young(&self, n: &Node) -> bool {
        self.cfg.guard.is_some() && matches!(&n.generation, Some(Gen { born: Some(_), .. }))
    }

    /// A node runs one request (design for issue 11 wraps every command in
    /// a script that first makes sure the generation marker exists: the
    /// first request after a data-losing restart creates it, born "now").
    fn serve(&self, s: &mut State, m: &Msg) -> Option<Reply> {
        if let Some(reply) = self.pipelined(s, m) {
            return reply;
        }
        let ttl = self.cfg.ttl;
        let generation_fencing = self.cfg.fencing == Fencing::Generation;
        let now = s.now;
        let n = &mut s.nodes[m.node as usize];
        if n.generation.is_none() {
            n.gens += 1;
            n.generation = Some(Gen {
                id: n.gens,
                born: if self.cfg.guard.is_some() {
                    Some(now)
                } else {
                    None
                },
                since: Some(now),
            });
            // A marker older than max_ttl at birth cannot happen; normalize
            // keeps `born` until it is old.
        }
        let gen_id = n.generation.as_ref().map_or(0, |g| g.id);
        let since = n.generation.as_ref().and_then(|g| g.since);
        let mut resync = 0;
        // The keys of the sender's lock: one, or a set. The other name's
        // lock (`OTHER`) is taken to be held everywhere.
        let mask = self.cfg.mask(m.client as usize);
        let ours = |n: &Node, tok: u8| {
            tok == OTHER || each(mask).all(|k| matches!(n.keys[k], Some((t, _)) if t == tok))
        };
        let kind = match m.body {
            // One key: `SET key token NX PX ttl GET` (redlock.rs
            // `round_once` in src/engine/acquire.rs, `read_set` in src/protocol/request/acquire.rs): nil or our own token is
            // agreement, and our own key keeps its expiry. A set: scripts.rs
            // `ACQUIRE_MANY`: a key held by another token refuses and sets
            // nothing; otherwise every key is set with the ttl, ours too.
            Body::Set(tok) | Body::Script(tok) => match held_by_other(n, mask, tok) {
                Some(t) => Kind::Held(t),
                None => {
                    let single = mask.count_ones() == 1;
                    for k in each(mask) {
                        if !(single && n.keys[k].is_some()) {
                            n.keys[k] = Some((tok, now + ttl));
                        }
                    }
                    Kind::Ok
                }
            },
            // src/protocol/scripts.rs `EXTEND` / `EXTEND_MANY`: a key held
            // by another token → 0, nothing changed; part of a set missing
            // (others still ours) → 0, nothing changed; otherwise every key
            // is set to ours with the ttl: 1 when each was ours, 2 when
            // every key was missing (the node lost the lock: set again,
            // "healed", so the keys a failed extension releases are only
            // those it set).
            Body::Extend(tok) => {
                let missing = each(mask).filter(|&k| n.keys[k].is_none()).count();
                let all = each(mask).count();
                if held_by_other(n, mask, tok).is_some() || (missing > 0 && missing < all) {
                    Kind::NotOurs
                } else {
                    for k in each(mask) {
                        n.keys[k] = Some((tok, now + ttl));
                    }
                    if missing > 0 { Kind::Healed } else { Kind::Ok }
                }
            }
            // Steps of the pipeline, run by `pipelined` only.
            Body::MarkerAfter(..) | Body::SetAfterMarker(..) => {
                unreachable!("a pipeline step outside the guarded acquisition")
            }
            // scripts.rs `UNLOCK` / `UNLOCK_MANY`: token-checked delete of
            // each key. No reply is modeled: the client stops believing
            // when it sends it.
            Body::Unlock(tok) => {
                for k in each(mask) {
                    if matches!(n.keys[k], Some((t, _)) if t == tok) {
                        n.keys[k] = None;
                    }
                }
                return None;
            }
            // scripts.rs `FENCE_READ`, with the generation tag of the design
            // for issue 11: the counter, and whether it was written in the
            // node's current generation.
            // The counter is read whoever holds the lock there: a read sent
            // after the grant follows every earlier holder's acknowledged
            // write. Only generation fencing does so; the negative
            // no-generation model keeps the older ownership-only read.
            // Issue 21: one counter per node for every name; a bare value
            // (tag 0) is untrusted; `resync` says whether the write made
            // from this read may trust this node (`Resync::Aged`).
            Body::FenceRead(tok, start) => {
                let (v, trusted) = match n.fence {
                    Some((v, tag)) => (v, tag == gen_id),
                    None => (0, self.cfg.resync == Resync::MissingTrusted),
                };
                if since.is_none_or(|b| start > b) {
                    resync = gen_id;
                }
                if ours(n, tok) {
                    Kind::Counter(v, trusted)
                } else if generation_fencing {
                    Kind::Foreign(v, trusted)
                } else {
                    Kind::NotOurs
                }
            }
            // scripts.rs `FENCE_WRITE`: raise only, tagged with the
            // generation (design for issue 11).
            // Issue 21 (`Resync::Aged`): raise, never lower; trusted within
            // the generation; an untrusted value is trusted only in the
            // generation the write names (`permit`), else stored bare.
            Body::FenceWrite(tok, v, permit) => {
                if ours(n, tok) {
                    n.fence = Some(match (self.cfg.resync, n.fence) {
                        (_, Some((cur, tag))) if tag == gen_id => (cur.max(v), gen_id),
                        (Resync::Aged, cur) => {
                            let raised = cur.map_or(v, |(c, _)| c.max(v));
                            (raised, if permit == gen_id { gen_id } else { 0 })
                        }
                        // The per-resource code before issue 21: set
                        // outright in a new generation, trusted.
                        (Resync::Always | Resync::MissingTrusted, _) => (v, gen_id),
                    });
                    Kind::Ok
                } else {
                    Kind::NotOurs
                }
            }
            // Negative model only: INCR where the lock is ours.
            Body::FenceIncr(tok) => {
                if ours(n, tok) {
                    let v = n.fence.map_or(0, |(v, _)| v) + 1;
                    n.fence = Some((v, gen_id));
                    Kind::Counter(v, true)
                } else {
                    Kind::NotOurs
                }
            }
        };
        let young = self.young(&s.nodes[m.node as usize]);
        Some(Reply {
            kind,
            young,
            resync,
        })
    }

    /// Sends `body` to every up node (`round::round`, `round::round_on`);
    /// a down node refuses the connection: its answer is unknown at once.
    fn send(&self, s: &mut State, c: usize, only: Option<&[usize]>, body: Body) -> Vec<Ans> {
        let rid = s.clients[c].rid;
        let mut ans = vec![Ans::Unknown; self.cfg.nodes];
        for (i, a) in ans.iter_mut().enumerate() {
            if only.is_some_and(|o| !o.contains(&i)) || !s.nodes[i].up {
                continue;
            }
            *a = Ans::Pending;
            s.net.push(Msg {
                client: c as u8,
                node: i as u8,
                rid,
                body: body.clone(),
            });
        }
        ans
    }

    /// As [`send`](Self::send) to every node, with the body for node `i`
    /// from `body(i)`. (The code sends one request to every node, naming
    /// every generation it may trust; each node finds its own.)
    fn send_each(&self, s: &mut State, c: usize, body: impl Fn(usize) -> Body) -> Vec<Ans> {
        let rid = s.clients[c].rid;
        let mut ans = vec![Ans::Unknown; self.cfg.nodes];
        for (i, a) in ans.iter_mut().enumerate() {
            if !s.nodes[i].up {
                continue;
            }
            *a = Ans::Pending;
            s.net.push(Msg {
                client: c as u8,
                node: i as u8,
                rid,
                body: body(i),
            });
        }
        ans
    }

    /// The ownership-checked release (`release::release_on`, scripts.rs
    /// `UNLOCK`) on the nodes given, or every node. It reaches every node
    /// that is up at once: the releasing client stops believing when it
    /// sends it, so a release only removes an obstacle for others, and the
    /// two extremes (at once, or never: a down node keeps the key until it
    /// expires) bound what a delayed one does. A `SET` still in flight
    /// lands after it (the leftover that the retry queue and `InFlight`
    /// are there for).
    /// On a cluster node the delete is replicated like any write (without
    /// `WAIT`: the release has no agreement to count).
    fn release(&self, s: &mut State, _c: usize, tok: u8, only: Option<&[usize]>) {
        for (i, n) in s.nodes.iter_mut().enumerate() {
            if n.up && only.is_none_or(|o| o.contains(&i)) {
                let before = n.data();
                for key in &mut n.keys {
                    if matches!(key, Some((t, _)) if *t == tok) {
                        *key = None;
                    }
                }
                n.replicate_later(&before);
            }
        }
    }

    /// Whether the node's reply to `body` waits for its replica (`WAIT 1`
    /// pipelined behind the write: `Request::durable`, `run_durable` in
    /// src/engine/round.rs): the writes whose agreement counts.
    pub fn acknowledged(&self, body: &Body) -> bool {
        match self.cfg.agreement {
            Agreement::Plain => false,
            Agreement::Acknowledged => matches!(
                body,
                Body::Set(_)
                    | Body::Script(_)
                    | Body::Extend(_)
                    | Body::FenceWrite(..)
                    | Body::FenceIncr(_)
            ),
            Agreement::AcquireOnly => matches!(body, Body::Set(_) | Body::Script(_)),
        }
    }

    /// A node runs a request (`serve`) and answers, or holds its answer.
    /// On a cluster node the master's writes enter the replication stream;
    /// with acknowledged agreement, the reply to a write is held until the
    /// replica has this request's entry and every one before it (`WAIT`
    /// waits for the replication offset: a refusal that wrote nothing waits
    /// only for the writes before it, and is sent at once when the replica
    /// is up to date). A standalone node has no replica: `WAIT 1` never
    /// confirms, and its agreement never counts (`NotDurable`, unknown).
    fn run(&self, s: &mut State, m: &Msg, reply_lost: bool) -> Option<Reply> {
        let i = m.node as usize;
        let before = s.nodes[i].data();
        let reply = self.serve(s, m);
        let waits = self.acknowledged(&m.body);
        let node = &mut s.nodes[i];
        let writes = node.writes_since(&before);
        let Some(r) = &mut node.replica else {
            return if waits { None } else { reply };
        };
        if waits && (!writes.is_empty() || !r.backlog.is_empty()) {
            let reply = reply.filter(|_| !reply_lost).map(|reply| Held {
                client: m.client,
                rid: m.rid,
                reply,
            });
            r.backlog.push(Repl { writes, reply });
            return None;
        }
        if !writes.is_empty() {
            r.backlog.push(Repl {
                writes,
                reply: None,
            });
        }
        reply
    }

    /// A node's reply reaches client `c`: it counts if the round it answers
    /// still waits for this node.
    fn answer(&self, s: &mut State, node: u8, c: u8, rid: u8, reply: Reply) {
        let c = c as usize;
        if s.clients[c].rid == rid
            && let Some(a) =
                answers_mut(&mut s.clients[c].phase).and_then(|ans| ans.get_mut(node as usize))
            && *a == Ans::Pending
        {
            *a = Ans::Got(reply);
            self.conclude(s, c);
        }
    }

    fn new_round(&self, s: &mut State, c: usize) {
        s.clients[c].rid += 1;
    }

    /// Acquisition (`Inner::round_once`, src/engine/acquire.rs): a fresh token, `SET NX PX` to
    /// every node.
    fn acquire(&self, s: &mut State, c: usize) {
        s.next_tok += 1;
        let tok = s.next_tok;
        self.new_round(s, c);
        s.clients[c].attempts += 1;
        let ans = self.send(s, c, None, Body::Set(tok));
        s.clients[c].phase = Phase::Acquiring {
            tok,
            start: s.now,
            ans,
        };
        self.conclude(s, c);
    }

    /// Decides client `c`'s round if its answers allow (`Tally::decided`,
    /// `Tally::outcome`, `Redlock::grant`).
    fn conclude(&self, s: &mut State, c: usize) {
        let q = self.q();
        let now = s.now;
        let cfg = &self.cfg;
        let phase = s.clients[c].phase.clone();
        match phase {
            Phase::Idle => {}
            Phase::Acquiring { tok, start, ans } => {
                // A young node's agreement does not count (design for issue
                // 11); it may still hold our key.
                let granted = ans
                    .iter()
                    .filter(|a| {
                        matches!(
                            a,
                            Ans::Got(Reply {
                                kind: Kind::Ok,
                                young: false,
                                ..
                            })
                        )
                    })
                    .count();
                let pending = ans.iter().filter(|a| **a == Ans::Pending).count();
                if granted >= q {
                    // `Redlock::grant`: validity = ttl − elapsed − drift,
                    // measured now; `expires_at` = start + ttl − drift.
                    let exp = start + cfg.ttl - cfg.drift;
                    if now < exp {
                        let cl = &mut s.clients[c];
                        cl.phase = Phase::Holding {
                            tok,
                            exp,
                            sub: Sub::None,
                        };
                        cl.fenced = false;
                        cl.overlap = false;
                    } else {
                        // `Failed::Late`: released everywhere.
                        s.clients[c].phase = Phase::Idle;
                        self.release(s, c, tok, None);
                    }
                } else if pending == 0 {
                    // A failed round is released where our key may be: the
                    // nodes that agreed and those that did not answer
                    // (`Failed::nodes_that_may_hold_ours`).
                    let maybe: Vec<usize> = (0..cfg.nodes)
                        .filter(|&i| {
                            matches!(
                                ans[i],
                                Ans::Unknown | Ans::Got(Reply { kind: Kind::Ok, .. })
                            )
                        })
                        .collect();
                    s.clients[c].phase = Phase::Idle;
                    self.release(s, c, tok, Some(&maybe));
                }
            }
            Phase::Holding { tok, exp, sub } => match sub {
                Sub::None => {}
                Sub::Extending { start, ans } => {
                    // `Redlock::extend` with `Tally` (`Ask::Owned`): only
                    // nodes that still held our token count; healed ones
                    // count as "not ours" for this round.
                    let granted = ans
                        .iter()
                        .filter(|a| {
                            matches!(
                                a,
                                Ans::Got(Reply {
                                    kind: Kind::Ok,
                                    young: false,
                                    ..
                                })
                            )
                        })
                        .count();
                    let refused = ans
                        .iter()
                        .filter(|a| {
                            matches!(
                                a,
                                Ans::Got(Reply {
                                    kind: Kind::NotOurs | Kind::Healed,
                                    ..
                                })
                            )
                        })
                        .count();
                    let healed: Vec<usize> = (0..cfg.nodes)
                        .filter(|&i| {
                            matches!(
                                ans[i],
                                Ans::Got(Reply {
                                    kind: Kind::Healed,
                                    ..
                                })
                            )
                        })
                        .collect();
                    let pending = ans.iter().filter(|a| **a == Ans::Pending).count();
                    // `Tally::decided` for an owned round.
                    let decided = pending == 0
                        || (granted + pending < q
                            && healed.is_empty()
                            && (refused >= q || refused + pending < q));
                    if cfg.extend_recheck && now >= exp && (granted >= q || decided) {
                        // The re-check at the grant (`extend_inner`): the
                        // round ended after the lock's validity. Another
                        // client may have held in between; the lock is over,
                        // and the keys of its token are released on every
                        // node (the extension reports `NotHeld`).
                        s.clients[c].phase = Phase::Idle;
                        self.release(s, c, tok, None);
                        return;
                    }
                    if granted >= q {
                        let new_exp = start + cfg.ttl - cfg.drift;
                        let exp = if now < new_exp { new_exp } else { exp };
                        s.clients[c].phase = Phase::Holding {
                            tok,
                            exp,
                            sub: Sub::None,
                        };
                        return;
                    }
                    if !decided {
                        return;
                    }
                    if refused >= q {
                        // NotHeld: the keys this extension set again are
                        // released; the watchdog reports `TakenOver` and
                        // the guard releases (`release_guarded`).
                        if !healed.is_empty() {
                            self.release(s, c, tok, Some(&healed));
                        }
                        s.clients[c].phase = Phase::Idle;
                        self.release(s, c, tok, None);
                    } else {
                        // NoQuorum: the lock may still be ours; keep it.
                        s.clients[c].phase = Phase::Holding {
                            tok,
                            exp,
                            sub: Sub::None,
                        };
                    }
                }
                Sub::FenceRead { ans } => {
                    // Nodes where the lock is ours (and not young): the
                    // ownership quorum of the read round.
                    let owned = ans
                        .iter()
                        .filter(|a| {
                            matches!(
                                a,
                                Ans::Got(Reply {
                                    kind: Kind::Counter(..),
                                    young: false,
                                    ..
                                })
                            )
                        })
                        .count();
                    let counters: Vec<(u8, bool)> = ans
                        .iter()
                        .filter_map(|a| match a {
                            Ans::Got(Reply {
                                kind: Kind::Counter(v, t) | Kind::Foreign(v, t),
                                young: false,
                                ..
                            }) => Some((*v, *t)),
                            _ => None,
                        })
                        .collect();
                    let highest = ans
                        .iter()
                        .filter_map(|a| match a {
                            Ans::Got(Reply {
                                kind: Kind::Counter(v, _) | Kind::Foreign(v, _),
                                ..
                            }) => Some(*v),
                            _ => None,
                        })
                        .max()
                        .unwrap_or(0);
                    let pending = ans.iter().filter(|a| **a == Ans::Pending).count();
                    let proven = match cfg.fencing {
                        Fencing::WriteBack => counters.len() >= q,
                        Fencing::Generation => owned >= q && self.read_proven(&counters),
                        Fencing::IncrNoWriteBack => counters.len() >= q,
                        Fencing::Off => false,
                    };
                    let set = |s: &mut State, sub| {
                        s.clients[c].phase = Phase::Holding { tok, exp, sub };
                    };
                    if proven {
                        if cfg.fencing == Fencing::IncrNoWriteBack {
                            // The token is the largest INCR result; no
                            // write round.
                            set(s, Sub::None);
                            self.issue(s, c, highest);
                        } else {
                            // `fencing_token`: largest plus one, then raise
                            // a quorum to it.
                            let v = highest + 1;
                            // The generations this read may re-sync
                            // (`Resync::Aged`): of nodes read, not young,
                            // born before the read started.
                            let permits: Vec<u8> = ans
                                .iter()
                                .map(|a| match a {
                                    Ans::Got(Reply {
                                        kind: Kind::Counter(..) | Kind::Foreign(..),
                                        young: false,
                                        resync,
                                    }) => *resync,
                                    _ => 0,
                                })
                                .collect();
                            self.new_round(s, c);
                            let ans =
                                self.send_each(s, c, |i| Body::FenceWrite(tok, v, permits[i]));
                            let start = s.now;
                            set(s, Sub::FenceWrite { v, ans, start });
                            self.conclude(s, c);
                        }
                    } else if pending == 0 {
                        // Fails closed (or NotHeld / NoQuorum).
                        set(s, Sub::None);
                    }
                }
                Sub::FenceWrite { v, ans, start } => {
                    let granted = ans
                        .iter()
                        .filter(|a| {
                            matches!(
                                a,
                                Ans::Got(Reply {
                                    kind: Kind::Ok,
                                    young: false,
                                    ..
                                })
                            )
                        })
                        .count();
                    let pending = ans.iter().filter(|a| **a == Ans::Pending).count();
                    // Issue 21: a token is issued only when its write
                    // quorum came within the write limit of the write's
                    // start (`fence::WRITE_LIMIT`): here, within its tick.
                    // Later, the round fails: the number is not issued.
                    let in_time = cfg.fencing != Fencing::Generation
                        || cfg.resync != Resync::Aged
                        || now == start;
                    if granted >= q {
                        s.clients[c].phase = Phase::Holding {
                            tok,
                            exp,
                            sub: Sub::None,
                        };
                        if in_time {
                            self.issue(s, c, v);
                        }
                    } else if pending == 0 {
                        s.clients[c].phase = Phase::Holding {
                            tok,
                            exp,
                            sub: Sub::None,
                        };
                    }
                }
            },
        }
    }

    /// The fencing read of the design for issue 11: `counters` are the
    /// answers of nodes where the lock is ours and whose generation is old
    /// enough, each `(value, written in the node's current generation)`.
    /// A node whose counter is absent or from an earlier generation may
    /// have lost the last token; a node that did not answer may hold it.
    /// With at most a minority `f` of nodes losing data, the last write
    /// quorum can hide only among `min(untrusted, f)` nodes plus the
    /// silent ones: the read is proven when those are fewer than a quorum
    /// (and a quorum answered). A brand-new cluster bootstraps when every
    /// node answers. Otherwise `fencing_token` fails closed.
    pub fn read_proven(&self, counters: &[(u8, bool)]) -> bool {
        let q = self.q();
        let untrusted = counters.iter().filter(|(_, t)| !t).count();
        let silent = self.cfg.nodes - counters.len();
        counters.len() >= q && untrusted.min(self.cfg.minority()) + silent < q
    }

    /// A fencing token is issued to client `c` if its lock is still valid
    /// (`fencing_token` checks `lock.is_valid()` last).
    fn issue(&self, s: &mut State, c: usize, v: u8) {
        // The other name's tokens are not compared with this name's.
        if !self.believes(s, c) || c >= self.cfg.clients {
            return;
        }
        s.clients[c].fenced = true;
        if v <= s.fence_max && s.fence_repeat.is_none() {
            s.fence_repeat = Some((s.fence_max, v));
        }
        s.fence_max = s.fence_max.max(v);
    }

    fn tick(&self, s: &mut State) {
        s.now += 1;
        // At `expires_at` the lock is lost (the watchdog's alarm,
        // `timing::alarm`); the guard then releases it.
        for c in 0..self.cfg.clients {
            if let Phase::Holding { tok, exp, sub } = &s.clients[c].phase
                && s.now >= *exp
                && (self.cfg.watchdog || *sub == Sub::None)
            {
                let tok = *tok;
                s.clients[c].phase = Phase::Idle;
                self.release(s, c, tok, None);
            }
        }
    }

    /// Applies an action; `None` when it is not enabled.
    fn apply(&self, s: &mut State, a: &Action) {
        match a {
            Action::Tick => self.tick(s),
            Action::Expire(n, k) => s.nodes[*n as usize].keys[*k as usize] = None,
            Action::Age(n) => {
                if let Some(g) = &mut s.nodes[*n as usize].generation {
                    g.born = None;
                }
            }
            Action::Acquire(c) => self.acquire(s, *c as usize),
            Action::Extend(c) => {
                // `Redlock::extend`: from the watchdog, or called directly
                // (`Cfg::watchdog` false), while the lock is valid.
                let c = *c as usize;
                let Phase::Holding { tok, exp, .. } = s.clients[c].phase else {
                    unreachable!()
                };
                self.new_round(s, c);
                s.clients[c].extends += 1;
                let ans = self.send(s, c, None, Body::Extend(tok));
                let start = s.now;
                s.clients[c].phase = Phase::Holding {
                    tok,
                    exp,
                    sub: Sub::Extending { start, ans },
                };
                self.conclude(s, c);
            }
            Action::Fence(c) => {
                // `Redlock::fencing_token`.
                let c = *c as usize;
                let Phase::Holding { tok, exp, .. } = s.clients[c].phase else {
                    unreachable!()
                };
                self.new_round(s, c);
                s.clients[c].fences += 1;
                let start = s.now;
                let body = if self.cfg.fencing == Fencing::IncrNoWriteBack {
                    Body::FenceIncr(tok)
                } else {
                    Body::FenceRead(tok, start)
                };
                let ans = self.send(s, c, None, body);
                s.clients[c].phase = Phase::Holding {
                    tok,
                    exp,
                    sub: Sub::FenceRead { ans },
                };
                self.conclude(s, c);
            }
            Action::Release(c) => {
                // `Redlock::unlock`.
                let c = *c as usize;
                let Phase::Holding { tok, .. } = s.clients[c].phase else {
                    unreachable!()
                };
                s.clients[c].phase = Phase::Idle;
                self.release(s, c, tok, None);
            }
            Action::Timeout(c) => {
                let c = *c as usize;
                for a in answers_mut(&mut s.clients[c].phase).into_iter().flatten() {
                    if *a == Ans::Pending {
                        *a = Ans::Unknown;
                    }
                }
                self.conclude(s, c);
            }
            Action::Deliver(m) | Action::DeliverLoseReply(m) => {
                let i = s.net.iter().position(|x| x == m).unwrap();
                s.net.remove(i);
                let lost = matches!(a, Action::DeliverLoseReply(_));
                let reply = self.run(s, m, lost);
                if lost {
                    s.drops += 1;
                    return;
                }
                // The reply reaches the client at once: a later reply only
                // shortens the client's belief (its validity counts from the
                // round's start), so delaying replies adds no behaviour the
                // safety properties care about; a lost reply is
                // `DeliverLoseReply`, and the client's `Timeout`.
                if let Some(r) = reply {
                    self.answer(s, m.node, m.client, m.rid, r);
                }
            }
            Action::Drop(m) => {
                let i = s.net.iter().position(|x| x == m).unwrap();
                s.net.remove(i);
                s.drops += 1;
            }
            Action::Crash(n) => {
                s.crashes += 1;
                s.nodes[*n as usize].up = false;
                // Its connections break: requests not yet run are lost,
                // and so are replies held for replication.
                s.net.retain(|m| m.node != *n);
                if let Some(r) = &mut s.nodes[*n as usize].replica {
                    for e in &mut r.backlog {
                        e.reply = None;
                    }
                }
            }
            Action::Restart(n) => s.nodes[*n as usize].up = true,
            Action::Flush(n) => {
                s.flushes += 1;
                let node = &mut s.nodes[*n as usize];
                node.keys = [None; KEYS];
                node.fence = None;
                node.generation = None;
            }
            Action::Lose(n) => {
                s.losses += 1;
                let node = &mut s.nodes[*n as usize];
                node.keys = [None; KEYS];
                node.fence = None;
                node.generation = None;
                s.net.retain(|m| m.node != *n);
            }
            Action::Replicate(n) => {
                let r = s.nodes[*n as usize].replica.as_mut().unwrap();
                let upto = match self.cfg.replication {
                    Replication::Stepwise => 1,
                    Replication::Deferred => {
                        r.backlog.iter().position(|e| e.reply.is_some()).unwrap() + 1
                    }
                };
                let mut held = None;
                let stream: Vec<Repl> = r.backlog.drain(..upto).collect();
                for e in stream {
                    r.apply(&e.writes);
                    held = e.reply;
                }
                if let Some(h) = held {
                    self.answer(s, *n, h.client, h.rid, h.reply);
                }
            }
            Action::Failover(n, k) => {
                s.failovers += 1;
                let node = &mut s.nodes[*n as usize];
                let r = node.replica.as_mut().unwrap();
                let stream = std::mem::take(&mut r.backlog);
                for e in &stream[..*k as usize] {
                    r.apply(&e.writes);
                }
                node.keys = r.keys;
                node.fence = r.fence;
            }
        }
    }

    /// Keeps states canonical: expired keys and old markers are normalized,
    /// replies no round waits for are gone (delivering them is a no-op).
    fn normalize(&self, s: &mut State) {
        for n in &mut s.nodes {
            for key in &mut n.keys {
                if matches!(key, Some((_, exp)) if s.now >= *exp) {
                    *key = None;
                }
            }
            if let (Some(g), Some(max_ttl)) = (&mut n.generation, self.cfg.guard)
                && let Some(b) = g.born
                && s.now >= b + max_ttl
            {
                g.born = None;
            }
            // A replica's keys expire as the master's do; a replicated
            // value that has expired is a delete.
            if let Some(r) = &mut n.replica {
                let expired = |key: &mut Option<(u8, u8)>| {
                    if matches!(key, Some((_, exp)) if s.now >= *exp) {
                        *key = None;
                    }
                };
                r.keys.iter_mut().for_each(expired);
                for e in &mut r.backlog {
                    e.writes.keys.iter_mut().flatten().for_each(expired);
                }
            }
        }
        // Replies held for replication that no round waits for are gone
        // (sending them would change nothing), and so are entries left
        // with nothing to replicate and no reply. Once no failover is left
        // in the budget, what the replica has can no longer matter: only
        // the held replies and their order remain (exact reductions).
        let spent = s.failovers >= self.cfg.failovers;
        for (i, n) in s.nodes.iter_mut().enumerate() {
            if let Some(r) = &mut n.replica {
                for e in &mut r.backlog {
                    if let Some(h) = &e.reply {
                        let c = &s.clients[h.client as usize];
                        if c.rid != h.rid || answers(&c.phase).is_none_or(|a| a[i] != Ans::Pending)
                        {
                            e.reply = None;
                        }
                    }
                    if spent {
                        e.writes = Writes::default();
                    }
                }
                if spent {
                    r.keys = [None; KEYS];
                    r.fence = None;
                }
                r.backlog
                    .retain(|e| !e.writes.is_empty() || e.reply.is_some());
                // The next entry changes nothing and waits for no reply:
                // replicating it is a step that changes nothing.
                while let Some(e) = r.backlog.first()
                    && e.reply.is_none()
                    && r.has(&e.writes)
                {
                    r.backlog.remove(0);
                }
            }
        }
        // Requests that can no longer change anything are gone: a fencing
        // read whose round is over, a release whose token is on no node
        // and in no request that could set it.
        let clients = &s.clients;
        let nodes = &s.nodes;
        let live: Vec<u8> = s
            .net
            .iter()
            .filter_map(|m| match m.body {
                Body::Set(t)
                | Body::Script(t)
                | Body::MarkerAfter(t, ..)
                | Body::SetAfterMarker(t, _)
                | Body::Extend(t) => Some(t),
                _ => None,
            })
            .chain(
                nodes
                    .iter()
                    .flat_map(|n| n.keys.iter().filter_map(|k| k.map(|(t, _)| t))),
            )
            // A failover may bring a key back from the replica.
            .chain(
                nodes
                    .iter()
                    .filter_map(|n| n.replica.as_ref())
                    .flat_map(|r| {
                        r.keys.iter().filter_map(|k| k.map(|(t, _)| t)).chain(
                            r.backlog.iter().flat_map(|e| {
                                e.writes.keys.iter().flatten().flatten().map(|(t, _)| *t)
                            }),
                        )
                    }),
            )
            .collect();
        s.net.retain(|m| match m.body {
            Body::FenceRead(..) => {
                let c = &clients[m.client as usize];
                c.rid == m.rid && answers(&c.phase).is_some()
            }
            Body::Unlock(t) => live.contains(&t),
            _ => true,
        });
        s.net.sort();
        s.net.dedup();
        // A generation's birth tick matters only to fencing reads that
        // started at or before it (`Resync::Aged`).
        for (i, n) in s.nodes.iter_mut().enumerate() {
            if let Some(g) = &mut n.generation
                && let Some(b) = g.since
                && s.now > b
                && !s.net.iter().any(|m| {
                    m.node as usize == i
                        && matches!(m.body, Body::FenceRead(_, start) if start <= b)
                })
            {
                g.since = None;
            }
        }
        if self.cfg.symmetry {
            canonical(s);
        }
        // Tenure continuity history.
        let clients = self.cfg.clients;
        for c in 0..clients {
            if matches!(s.clients[c].phase, Phase::Holding { .. })
                && (0..clients).any(|d| d != c && self.cfg.conflict(c, d) && self.believes(s, d))
            {
                s.clients[c].overlap = true;
            }
        }
    }

    fn step(&self, s: &State, a: &Action) -> State {
        let mut s = s.clone();
        self.apply(&mut s, a);
        self.normalize(&mut s);
        s
    }

    /// The liveness oracle: faults stop (every node restarts with its data,
    /// nothing more is lost), every message is delivered, held replies are
    /// replicated and sent, rounds that wait
    /// for lost answers time out, holders release; after `ttl` + max_ttl
    /// ticks a client acquires (and, with fencing, gets a token larger than
    /// every earlier one). Budgets do not apply to it.
    pub fn recovers(&self, s: &State) -> bool {
        let mut s = s.clone();
        for n in &mut s.nodes {
            n.up = true;
        }
        self.settle(&mut s, true);
        // One request to every node (an attempt, released at once) so that
        // a node that lost its data has its new marker, then wait for keys
        // to expire and markers to grow old.
        s.clients[0].phase = Phase::Idle;
        self.apply(&mut s, &Action::Acquire(0));
        self.normalize(&mut s);
        self.settle(&mut s, true);
        let wait = self.cfg.ttl + self.cfg.guard.unwrap_or(0) + 1;
        for _ in 0..wait {
            self.apply(&mut s, &Action::Tick);
            self.normalize(&mut s);
            self.settle(&mut s, true);
        }
        let before = s.fence_max;
        self.apply(&mut s, &Action::Acquire(0));
        self.normalize(&mut s);
        self.settle(&mut s, false);
        if !self.believes(&s, 0) {
            return false;
        }
        if self.cfg.fencing != Fencing::Off {
            self.apply(&mut s, &Action::Fence(0));
            self.normalize(&mut s);
            self.settle(&mut s, false);
            if s.fence_max <= before || s.fence_repeat.is_some() {
                return false;
            }
        }
        true
    }

    fn settle(&self, s: &mut State, release: bool) {
        loop {
            let a = if let Some(m) = s.net.first() {
                Action::Deliver(m.clone())
            } else if let Some(i) = s.nodes.iter().position(|n| {
                n.replica
                    .as_ref()
                    .is_some_and(|r| r.backlog.iter().any(|e| e.reply.is_some()))
            }) {
                Action::Replicate(i as u8)
            } else if let Some(c) = (0..self.cfg.clients)
                .find(|&c| answers(&s.clients[c].phase).is_some_and(|a| a.contains(&Ans::Pending)))
            {
                Action::Timeout(c as u8)
            } else if let Some(c) = (0..self.cfg.clients)
                .find(|&c| release && matches!(s.clients[c].phase, Phase::Holding { .. }))
            {
                Action::Release(c as u8)
            } else {
                return;
            };
            self.apply(s, &a);
            self.normalize(s);
        }
    }

    /// A short account of a state for traces.
    pub fn summary(&self, s: &State) -> String {
        let mut out = format!("t={}", s.now);
        for (i, n) in s.nodes.iter().enumerate() {
            let _ = write!(out, " n{i}[");
            if !n.up {
                out.push_str("down ");
            }
            for (k, key) in n.keys.iter().enumerate() {
                if let Some((t, e)) = key {
                    let _ = write!(out, " K{k}=tok{t}@{e}");
                }
            }
            match n.fence {
                Some((v, 0)) => {
                    let _ = write!(out, " fence={v}/bare");
                }
                Some((v, g)) => {
                    let _ = write!(out, " fence={v}/g{g}");
                }
                None => {}
            }
            match &n.generation {
                Some(Gen {
                    id, born: Some(b), ..
                }) => {
                    let _ = write!(out, " g{id}(born {b})");
                }
                Some(Gen { id, born: None, .. }) => {
                    let _ = write!(out, " g{id}");
                }
                None => out.push_str(" no-marker"),
            }
            if let Some(r) = &n.replica {
                out.push_str(" | replica");
                for (k, key) in r.keys.iter().enumerate() {
                    if let Some((t, e)) = key {
                        let _ = write!(out, " K{k}=tok{t}@{e}");
                    }
                }
                if let Some((v, g)) = r.fence {
                    let _ = write!(out, " fence={v}/g{g}");
                }
                for e in &r.backlog {
                    out.push_str(" <-");
                    for (k, w) in e.writes.keys.iter().enumerate() {
                        match w {
                            Some(Some((t, x))) => {
                                let _ = write!(out, " K{k}=tok{t}@{x}");
                            }
                            Some(None) => {
                                let _ = write!(out, " K{k}=del");
                            }
                            None => {}
                        }
                    }
                    if let Some(v) = e.writes.fence {
                        let _ = write!(out, " fence={v:?}");
                    }
                    if let Some(h) = &e.reply {
                        let _ = write!(out, " (reply to c{})", h.client);
                    }
                }
            }
            out.push(']');
        }
        for (c, cl) in s.clients.iter().enumerate() {
            match &cl.phase {
                Phase::Idle => {}
                Phase::Acquiring { tok, .. } => {
                    let _ = write!(out, " c{c}:acquiring(tok{tok})");
                }
                Phase::Holding { sub, .. } if c >= self.cfg.clients => {
                    match sub {
                        Sub::FenceRead { .. } => out.push_str(" other:fence-read"),
                        Sub::FenceWrite { v, .. } => {
                            let _ = write!(out, " other:fence-write({v})");
                        }
                        _ => {}
                    }
                    continue;
                }
                Phase::Holding { tok, exp, sub } => {
                    let held = if self.believes(s, c) {
                        "HOLDS"
                    } else {
                        "lapsed"
                    };
                    let _ = write!(out, " c{c}:{held}(tok{tok},until {exp})");
                    match sub {
                        Sub::None => {}
                        Sub::Extending { .. } => out.push_str("+extending"),
                        Sub::FenceRead { .. } => out.push_str("+fence-read"),
                        Sub::FenceWrite { v, .. } => {
                            let _ = write!(out, "+fence-write({v})");
                        }
                    }
                }
            }
        }
        if s.fence_max > 0 {
            let _ = write!(out, " fence_max={}", s.fence_max);
        }
        if let Some((m, v)) = s.fence_repeat {
            let _ = write!(out, " REPEAT({v} after {m})");
        }
        out
    }

    /// A counterexample path as text: the initial state, then each action
    /// and the state after it.
    pub fn trace(&self, path: &Path<State, Action>) -> String {
        let steps = path.clone().into_vec();
        let mut out = String::new();
        if let Some((s, _)) = steps.first() {
            let _ = writeln!(out, "  init: {}", self.summary(s));
        }
        for w in steps.windows(2) {
            if let Some(a) = &w[0].1 {
                let mut line = fmt_action(a);
                if let Action::Deliver(m) | Action::DeliverLoseReply(m) = a {
                    let mut before = w[0].0.clone();
                    if let Some(r) = self.serve(&mut before, m) {
                        let _ = write!(
                            line,
                            " → {:?}{}",
                            r.kind,
                            if r.young { " (young node)" } else { "" }
                        );
                        if self.acknowledged(&m.body) {
                            line.push_str(if before.nodes[m.node as usize].replica.is_some() {
                                " (WAIT: sent once replicated)"
                            } else {
                                " (WAIT: no replica, never confirmed)"
                            });
                        }
                    }
                }
                if let Action::Replicate(n) = a
                    && let Some(r) = &w[0].0.nodes[*n as usize].replica
                    && let Some(Repl { reply: Some(h), .. }) = r.backlog.first()
                {
                    let _ = write!(
                        line,
                        ", its reply reaches c{}: {:?}",
                        h.client, h.reply.kind
                    );
                }
                let _ = writeln!(out, "  {line}");
                let _ = writeln!(out, "      {}", self.summary(&w[1].0));
            }
        }
        out
    }
}

/// One action, readably.
fn fmt_action(a: &Action) -> String {
    match a {
        Action::Deliver(m) | Action::Drop(m) | Action::DeliverLoseReply(m) => {
            let verb = match a {
                Action::Deliver(_) => "deliver",
                Action::Drop(_) => "LOSE request",
                _ => "deliver, LOSE reply of",
            };
            format!("{verb} c{}→n{} {:?}", m.client, m.node, m.body)
        }
        other => format!("{other:?}"),
    }
}

/// Puts the nodes of `s` in a canonical order (symmetry reduction): by
/// their state, the requests in flight to them, and each client's answer
/// from them; node indices in messages and answers follow.
fn canonical(s: &mut State) {
    let n = s.nodes.len();
    let sig = |i: usize| {
        let mut msgs: Vec<(u8, u8, Body)> = s
            .net
            .iter()
            .filter(|m| m.node as usize == i)
            .map(|m| (m.client, m.rid, m.body.clone()))
            .collect();
        msgs.sort();
        let ans: Vec<Option<&Ans>> = s
            .clients
            .iter()
            .map(|c| answers(&c.phase).map(|a| &a[i]))
            .collect();
        (&s.nodes[i], msgs, ans)
    };
    let mut order: Vec<usize> = (0..n).collect();
    let sigs: Vec<_> = (0..n).map(sig).collect();
    order.sort_by(|&a, &b| sigs[a].cmp(&sigs[b]));
    if order.iter().enumerate().all(|(k, &i)| k == i) {
        return;
    }
    // order[k] = old index of the node that goes to position k.
    let mut new_of_old = vec![0u8; n];
    for (k, &i) in order.iter().enumerate() {
        new_of_old[i] = k as u8;
    }
    s.nodes = order.iter().map(|&i| s.nodes[i].clone()).collect();
    for m in &mut s.net {
        m.node = new_of_old[m.node as usize];
    }
    s.net.sort();
    for c in &mut s.clients {
        if let Some(a) = answers_mut(&mut c.phase) {
            *a = order.iter().map(|&i| a[i].clone()).collect();
        }
    }
}

fn answers(p: &Phase) -> Option<&Vec<Ans>> {
    match p {
        Phase::Acquiring { ans, .. } => Some(ans),
        Phase::Holding { sub, .. } => match sub {
            Sub::None => None,
            Sub::Extending { ans, .. } | Sub::FenceRead { ans } | Sub::FenceWrite { ans, .. } => {
                Some(ans)
            }
        },
        Phase::Idle => None,
    }
}

fn answers_mut(p: &mut Phase) -> Option<&mut Vec<Ans>> {
    match p {
        Phase::Acquiring { ans, .. } => Some(ans),
        Phase::Holding { sub, .. } => match sub {
            Sub::None => None,
            Sub::Extending { ans, .. } | Sub::FenceRead { ans } | Sub::FenceWrite { ans, .. } => {
                Some(ans)
            }
        },
        Phase::Idle => None,
    }
}

impl Model for LockModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let cfg = &self.cfg;
        let node = Node {
            up: true,
            keys: [None; KEYS],
            fence: None,
            generation: if cfg.fresh_cluster {
                None
            } else {
                Some(Gen {
                    id: 1,
                    born: None,
                    since: None,
                })
            },
            gens: if cfg.fresh_cluster { 0 } else { 1 },
            replica: None,
        };
        let client = Client {
            phase: Phase::Idle,
            rid: 0,
            attempts: 0,
            extends: 0,
            fences: 0,
            fenced: false,
            overlap: false,
        };
        let mut nodes = vec![node; cfg.nodes];
        if cfg.uneven {
            nodes[0].fence = Some((1, 1));
        }
        // Cluster nodes start with their replicas up to date.
        for (i, n) in nodes.iter_mut().enumerate() {
            if cfg.is_cluster(i) {
                n.replica = Some(Replica {
                    keys: n.keys,
                    fence: n.fence,
                    backlog: Vec::new(),
                });
            }
        }
        // The other name's holder, after the clients (`OTHER`).
        let mut clients = vec![client.clone(); cfg.clients];
        if cfg.other_fences > 0 {
            clients.push(Client {
                phase: Phase::Holding {
                    tok: OTHER,
                    exp: u8::MAX,
                    sub: Sub::None,
                },
                ..client
            });
        }
        vec![State {
            now: 0,
            nodes,
            clients,
            net: Vec::new(),
            next_tok: 0,
            crashes: 0,
            losses: 0,
            drops: 0,
            failovers: 0,
            flushes: 0,
            fence_max: 0,
            fence_repeat: None,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let cfg = &self.cfg;
        if s.now < cfg.max_time {
            out.push(Action::Tick);
        }
        for (i, n) in s.nodes.iter().enumerate() {
            let i = i as u8;
            if cfg.fast_clocks {
                for (k, key) in n.keys.iter().enumerate() {
                    if matches!(key, Some((_, exp)) if s.now + cfg.drift >= *exp) {
                        out.push(Action::Expire(i, k as u8));
                    }
                }
                if let (Some(Gen { born: Some(b), .. }), Some(max_ttl)) = (&n.generation, cfg.guard)
                    && s.now + cfg.drift >= b + max_ttl
                {
                    out.push(Action::Age(i));
                }
            }
            if n.up && s.crashes < cfg.crashes {
                out.push(Action::Crash(i));
            }
            if !n.up {
                out.push(Action::Restart(i));
            }
            if s.losses < cfg.losses
                && n.replica.is_none()
                && (n.keys.iter().any(Option::is_some)
                    || n.fence.is_some()
                    || n.generation.is_some())
            {
                out.push(Action::Lose(i));
            }
            if n.up
                && s.flushes < cfg.flushes
                && n.replica.is_none()
                && (n.keys.iter().any(Option::is_some)
                    || n.fence.is_some()
                    || n.generation.is_some())
            {
                out.push(Action::Flush(i));
            }
            // A failover changes something only while the replica lags.
            if let Some(r) = &n.replica
                && !r.backlog.is_empty()
            {
                let held = r.backlog.iter().position(|e| e.reply.is_some());
                if cfg.replication == Replication::Stepwise || held.is_some() {
                    out.push(Action::Replicate(i));
                }
                // Deferred: the replica may have any entries before the
                // first held reply (with that one, the reply is sent first:
                // `Replicate`); with every entry it is up to date, and a
                // failover then changes nothing.
                let upto = match cfg.replication {
                    Replication::Stepwise => 0,
                    Replication::Deferred => held.unwrap_or(r.backlog.len() - 1),
                };
                if s.failovers < cfg.failovers {
                    for k in 0..=upto {
                        out.push(Action::Failover(i, k as u8));
                    }
                }
            }
        }
        for (c, cl) in s.clients.iter().enumerate() {
            let c8 = c as u8;
            match &cl.phase {
                Phase::Idle => {
                    let others_busy = cfg.sequential
                        && s.clients[..cfg.clients]
                            .iter()
                            .any(|o| o.phase != Phase::Idle);
                    if cl.attempts < cfg.attempts && !others_busy {
                        out.push(Action::Acquire(c8));
                    }
                }
                Phase::Acquiring { ans, .. } => {
                    if ans.contains(&Ans::Pending) {
                        out.push(Action::Timeout(c8));
                    }
                }
                // The other name's holder only fences (and times out).
                Phase::Holding { sub: Sub::None, .. } if c >= cfg.clients => {
                    if cl.fences < cfg.other_fences {
                        out.push(Action::Fence(c8));
                    }
                }
                Phase::Holding { sub, .. } => match sub {
                    Sub::None => {
                        out.push(Action::Release(c8));
                        if self.believes(s, c) {
                            if cl.extends < cfg.extends {
                                out.push(Action::Extend(c8));
                            }
                            if cfg.fencing != Fencing::Off && !cl.fenced && cl.fences < cfg.fences {
                                out.push(Action::Fence(c8));
                            }
                        }
                    }
                    _ => {
                        if answers(&cl.phase).is_some_and(|a| a.contains(&Ans::Pending)) {
                            out.push(Action::Timeout(c8));
                        }
                    }
                },
            }
        }
        for m in &s.net {
            out.push(Action::Deliver(m.clone()));
            if s.drops < cfg.drops {
                out.push(Action::Drop(m.clone()));
                if !matches!(m.body, Body::Unlock(_)) {
                    out.push(Action::DeliverLoseReply(m.clone()));
                }
            }
        }
    }

    fn next_state(&self, s: &State, a: Action) -> Option<State> {
        Some(self.step(s, &a))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut p = vec![
            // Clients whose locks share a key (a single lock and a set
            // containing it, or two overlapping sets) never believe at once.
            Property::always("mutual exclusion", |m: &LockModel, s: &State| {
                let n = m.cfg.clients;
                (0..n).all(|c| {
                    !m.believes(s, c)
                        || (c + 1..n).all(|d| !(m.cfg.conflict(c, d) && m.believes(s, d)))
                })
            }),
            Property::always("tenure continuity", |m: &LockModel, s: &State| {
                (0..m.cfg.clients).all(|c| !(s.clients[c].overlap && m.believes(s, c)))
            }),
            Property::sometimes("a lock is granted", |m: &LockModel, s: &State| {
                (0..m.cfg.clients).any(|c| m.believes(s, c))
            }),
        ];
        if (0..self.cfg.clients).any(|c| self.cfg.mask(c).count_ones() > 1) {
            p.push(Property::sometimes(
                "a set lock is granted",
                |m: &LockModel, s: &State| {
                    (0..m.cfg.clients).any(|c| m.cfg.mask(c).count_ones() > 1 && m.believes(s, c))
                },
            ));
        }
        if self.cfg.fencing != Fencing::Off {
            p.push(Property::always(
                "fencing tokens increase",
                |_: &LockModel, s: &State| s.fence_repeat.is_none(),
            ));
            p.push(Property::sometimes(
                "a fencing token is issued",
                |_: &LockModel, s: &State| s.fence_max > 0,
            ));
        }
        if self.cfg.liveness {
            p.push(Property::always("recovers", |m: &LockModel, s: &State| {
                m.recovers(s)
            }));
        }
        p
    }
}

/// The outcome of one run of the checker.
pub struct Run {
    pub unique_states: usize,
    pub max_depth: usize,
    pub seconds: f64,
    /// Every reachable state was visited (BFS only): false when the search
    /// stopped at its first counterexample or at a bound.
    pub exhausted: bool,
    /// Property name → counterexample (for `always`) or witness (for
    /// `sometimes`) as text.
    pub discoveries: Vec<(&'static str, String)>,
}

impl Run {
    pub fn found(&self, name: &str) -> Option<&str> {
        self.discoveries
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| t.as_str())
    }
}

/// How to search.
#[derive(Clone, Copy, Debug)]
pub enum Search {
    /// Breadth first over every reachable state (shortest traces).
    Bfs,
    /// Depth first, stopping at a depth.
    Dfs { max_depth: usize },
    /// Random walks from a seed, bounded by a time.
    Random { seed: u64, seconds: u64 },
}

/// A model whose counterexample paths print as readable traces, so that
/// [`check_model`] can run it.
pub trait Traced: Model {
    /// The path as text: the initial state, then each action and the state
    /// after it.
    fn trace(&self, path: &Path<Self::State, Self::Action>) -> String;
}

impl Traced for LockModel {
    fn trace(&self, path: &Path<State, Action>) -> String {
        LockModel::trace(self, path)
    }
}

/// Runs the checker on `cfg` and reports every discovery.
///
/// With `stop_at`, the search ends as soon as that property has a
/// discovery (for the negative models); otherwise it ends when every
/// property has one or the space is exhausted.
pub fn check(cfg: Cfg, search: Search, threads: usize, stop_at: Option<&'static str>) -> Run {
    check_model(LockModel::new(cfg), search, threads, stop_at)
}

/// [`check`] for any traced model (the lock model, or the release gate of
/// [`gate`]): one home for the search and its report.
///
/// Stateright keeps, for each property, the *last* discovery it meets, not
/// the first: a search that goes on after a counterexample (no `stop_at`,
/// or another property still awaited) may report a longer trace than the
/// shortest. For a short trace, stop at the property (on one thread, BFS
/// finds the shortest).
pub fn check_model<M>(
    model: M,
    search: Search,
    threads: usize,
    stop_at: Option<&'static str>,
) -> Run
where
    M: Traced + Clone + Send + Sync + 'static,
    M::State: std::hash::Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Clone + PartialEq,
{
    let t = std::time::Instant::now();
    let mut builder = model.clone().checker().threads(threads);
    if let Some(name) = stop_at {
        builder = builder.finish_when(stateright::HasDiscoveries::AnyOf([name].into()));
    }
    let properties = model.properties().len();
    let (unique_states, max_depth, disc, exhausted) = match search {
        Search::Bfs => {
            let c = builder.spawn_bfs().join();
            let disc = c.discoveries();
            // `is_done` is also true when the search stopped because its
            // finishing condition was met (the property of `stop_at` has a
            // discovery, or by default every property has one): that run
            // did not visit every state.
            let stopped = match stop_at {
                Some(name) => disc.contains_key(name),
                None => disc.len() == properties,
            };
            let done = c.is_done() && !stopped;
            (c.unique_state_count(), c.max_depth(), disc, done)
        }
        Search::Dfs { max_depth } => {
            let c = builder.target_max_depth(max_depth).spawn_dfs().join();
            (
                c.unique_state_count(),
                c.max_depth(),
                c.discoveries(),
                false,
            )
        }
        Search::Random { seed, seconds } => {
            let c = builder
                .timeout(std::time::Duration::from_secs(seconds))
                .spawn_simulation(seed, stateright::UniformChooser)
                .join();
            (
                c.unique_state_count(),
                c.max_depth(),
                c.discoveries(),
                false,
            )
        }
    };
    let mut discoveries: Vec<_> = disc
        .into_iter()
        .map(|(name, path)| (name, model.trace(&path)))
        .collect();
    discoveries.sort_by_key(|(n, _)| *n);
    Run {
        unique_states,
        max_depth,
        seconds: t.elapsed().as_secs_f64(),
        exhausted,
        discoveries,
    }
}
