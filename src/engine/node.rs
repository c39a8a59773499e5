//! One Redis node: its address, its identity and its long-lived connection.
//!
//! The connection is a redis-rs `MultiplexedConnection`: one socket that many
//! requests share at once, pipelined in the order they were sent. It is made
//! on first use (the builder is synchronous and needs no runtime), kept, and
//! made again when:
//! - a request on it failed at the connection level (the node restarted, the
//!   link broke);
//! - the caller runs on another Tokio runtime than the ones it was made on:
//!   each runtime gets its own connection (a connection's driver task runs
//!   on the runtime that made it, dies with it, and stalls while that
//!   runtime is not driven; a test suite has one runtime per test, a CLI
//!   may build one per command), unless a multi-thread runtime's connection
//!   is there to share (below). What happens on one runtime (a connection
//!   attempt that fails, say) never drops another runtime's connection,
//!   whose queued requests must stay ahead of the later ones. A runtime's
//!   connection is forgotten once that runtime has shut down;
//! - making it failed, for any reason (refused, timed out, a wrong
//!   password): it is tried again after a backoff that doubles from 25 ms up
//!   to one second, so a node that comes back, or whose password is fixed,
//!   is used again without a restart of the client.
//!
//! A caller on a runtime without its own connection uses that of a running
//! multi-thread runtime, if any (its workers drive it). So the requests of a lock to a
//! node stay on one connection when the lock is taken on one runtime and
//! released on another: a release sent while the node hangs is queued
//! behind the lock's `SET` there and runs after it, instead of racing it
//! on a new connection (or not reaching the node at all). A current-thread
//! runtime's connection is not shared: it moves only while that runtime is
//! inside `block_on`.
//!
//! Making a connection is bounded by the connect timeout, apart from the
//! node timeout: a cold start under a burst of clients is not a slow node.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use redis::{AsyncConnectionConfig, RedisError, RedisResult};

use crate::engine::config::Config;
pub(crate) use crate::engine::conn::{NodeConn, info};
pub(crate) use crate::engine::dial::Dial;
use crate::engine::dial::single_client;
#[cfg(feature = "cluster")]
use crate::engine::dial::{Subscribing, cluster_client};
pub(crate) use crate::engine::dial::{Target, target_addrs, target_label};
pub(crate) use crate::engine::identities::Identities;
use crate::engine::silence::Silence;
use crate::protocol::error::NodeError;
use crate::protocol::generation::Known;
use crate::protocol::request::unlock::Native;
use crate::protocol::server_info::{before_7, info_field, native_release};
use crate::protocol::timing::{FIRST_BACKOFF, next_backoff};

/// Room in a standalone node's connection queue (redis-rs's pipeline
/// channel, 50 requests by default): so much that a request never waits for
/// room. A request handed to the connection is then in its queue when
/// the first poll of its future returns, which is what lets a later request
/// on the same lock queue behind it ([`inflight`](crate::engine::inflight)).
/// A request that waited for room was pushed only when its task ran again,
/// and a later request whose task ran first could overtake it (a release
/// ahead of its lock's `SET`, seen with the queue full behind a partitioned
/// node). The channel's blocks are allocated as requests queue, so the room
/// costs nothing unused; it stays under Tokio's largest capacity on 32-bit
/// targets.
pub(crate) const QUEUE_ROOM: usize = 1 << 28;

/// A node of the Redlock quorum.
pub(crate) struct Node {
    index: usize,
    label: String,
    addrs: Vec<String>,
    dial: Dial,
    connect_timeout: Duration,
    identities: Arc<Identities>,
    /// The connection and the failure state, behind a mutex that is never
    /// held across an await (it guards a clone or a swap).
    slot: Mutex<Slot>,
    /// One connection attempt at a time; the others wait for its outcome.
    gate: tokio::sync::Mutex<()>,
    /// Whether the server said it writes an append-only file: 0 unknown,
    /// 1 no, 2 yes.
    aof: std::sync::atomic::AtomicU8,
    /// The server's native conditional delete, as its last connection said:
    /// 0 unknown or none, 1 `DELIFEQ` (Valkey 9.0+), 2 `DELEX … IFEQ`
    /// (Redis 8.4+).
    native_release: std::sync::atomic::AtomicU8,
    /// Whether the server refuses `SET … NX … GET` (Redis before 7.0), as
    /// its `INFO` said or its reply showed: acquisitions then send the
    /// script of [`Set::compat`](crate::protocol::request::acquire::Set::compat).
    old_set: std::sync::atomic::AtomicBool,
    /// The generation last seen old enough here, named in marked scripts.
    pub(crate) known: Known,
    /// Requests that timed out in a row (cluster nodes; see
    /// [`Node::timed_out`]).
    timeouts: std::sync::atomic::AtomicU32,
    /// Whether the node is silent: a release does not wait for it.
    pub(crate) silence: Silence,
    /// How often a cluster node's connection was made anew after timeouts.
    pub(crate) remade: std::sync::atomic::AtomicU32,
    /// How old a marker must be to be known as old: the restart guard's
    /// `max_ttl`, or any age without the guard.
    pub(crate) old_after: Duration,
    /// Its requests that failed ([`Node::failed`]), where the manager counts.
    pub(crate) failures: std::sync::atomic::AtomicU64,
    counts: bool,
}

#[derive(Default)]
struct Slot {
    /// One connection per runtime that uses the node.
    live: Vec<Live>,
    failed: Option<Failure>,
    /// Increases with every connection made, so that a stale failure report
    /// cannot drop a newer connection.
    epoch: u64,
    /// The other entry naming the same server, once detected: a permanent
    /// configuration error.
    duplicate_of: Option<(usize, String)>,
}

struct Live {
    conn: NodeConn,
    runtime: tokio::runtime::Id,
    epoch: u64,
    /// Whether other runtimes may use it: made on a multi-thread runtime,
    /// whose worker threads drive it.
    shared: bool,
    /// Dead once the runtime shut down: the task that holds its strong
    /// side ([`sentinel`]) was dropped with the runtime.
    alive: Weak<()>,
    /// Dropped with this entry, which ends that task.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Live {
    fn usable_on(&self, runtime: tokio::runtime::Id) -> bool {
        self.runtime == runtime && self.alive.strong_count() > 0
    }

    fn shareable(&self) -> bool {
        self.shared && self.alive.strong_count() > 0
    }
}

/// Spawns on the current runtime a task that only waits for `stop` (or
/// for the runtime to shut down, which drops it), and returns what tells
/// whether it is still there: whether the runtime still runs.
fn sentinel() -> (Weak<()>, tokio::sync::oneshot::Sender<()>) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let alive = Arc::new(());
    let weak = Arc::downgrade(&alive);
    tokio::spawn(async move {
        let _alive = alive;
        let _ = stopped.await;
    });
    (weak, stop)
}

struct Failure {
    error: NodeError,
    retry_at: Instant,
    backoff: Duration,
}

/// A connection handed out for one request, and the epoch to report a
/// connection-level failure against.
pub(crate) struct Conn {
    pub(crate) conn: NodeConn,
    pub(crate) epoch: u64,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let connected = !self.lock_slot().live.is_empty();
        f.debug_struct("Node")
            .field("addr", &self.label)
            .field("connected", &connected)
            .finish()
    }
}

impl Node {
    pub(crate) fn new(
        index: usize,
        target: Target,
        config: &Config,
        identities: Arc<Identities>,
    ) -> RedisResult<Self> {
        let label = target_label(&target);
        let addrs = target_addrs(&target);
        let connect_timeout = config.connect_timeout;
        let dial = match target {
            Target::Single(info) => Dial::Single(single_client(info, config)?),
            #[cfg(feature = "cluster")]
            Target::Cluster(seeds) => Dial::Cluster(
                cluster_client(seeds.clone(), config)?,
                Box::new(Subscribing::new(seeds, config)?),
            ),
        };
        Ok(Node {
            index,
            label,
            addrs,
            dial,
            connect_timeout,
            identities,
            slot: Mutex::new(Slot::default()),
            gate: tokio::sync::Mutex::new(()),
            aof: std::sync::atomic::AtomicU8::new(0),
            native_release: std::sync::atomic::AtomicU8::new(0),
            old_set: std::sync::atomic::AtomicBool::new(false),
            known: Known::default(),
            timeouts: std::sync::atomic::AtomicU32::new(0),
            silence: Silence::default(),
            remade: std::sync::atomic::AtomicU32::new(0),
            failures: std::sync::atomic::AtomicU64::new(0),
            counts: config.stats,
            old_after: config.restart_guard.unwrap_or(Duration::ZERO),
        })
    }

    /// The address, without credentials, for error messages.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// Whether the server persists its data in an append-only file, as its
    /// last connection said (`None` before the first one).
    pub(crate) fn persistent(&self) -> Option<bool> {
        match self.aof.load(std::sync::atomic::Ordering::Relaxed) {
            1 => Some(false),
            2 => Some(true),
            _ => None,
        }
    }

    /// The server's native conditional delete, if it has one (see
    /// [`native`](crate::protocol::request::unlock::native)), used where the node refuses scripts.
    pub(crate) fn native_release(&self) -> Native {
        match self
            .native_release
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            1 => Native::DelIfEq,
            2 => Native::DelEx,
            _ => Native::None,
        }
    }

    /// Whether the server refuses `SET … NX … GET` (Redis before 7.0).
    pub(crate) fn old_set(&self) -> bool {
        self.old_set.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records that the server refused `SET … NX … GET`.
    pub(crate) fn set_old_set(&self) {
        self.old_set
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// `host:port` (or the socket path), without the database; a
    /// cluster's seeds.
    pub(crate) fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// Whether the node is a cluster (feature `cluster`).
    pub(crate) fn is_cluster(&self) -> bool {
        match self.dial {
            Dial::Single(_) => false,
            #[cfg(feature = "cluster")]
            Dial::Cluster(..) => true,
        }
    }

    fn lock_slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        // A panic while holding it cannot leave the slot inconsistent (every
        // write is a single assignment), so a poisoned mutex is still usable.
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached connection if it is usable on this runtime (its own, else
    /// a running multi-thread runtime's), else the cached failure while its
    /// backoff lasts, else `None` (connect). `runtime` gives the current
    /// runtime's id, asked only where it matters: with one connection,
    /// made on a multi-thread runtime that still runs, that connection is
    /// the answer on any runtime (every request's case in a service with
    /// one runtime), and `Handle::current` clones the runtime's handle, an
    /// `Arc` that every worker shares (two contended atomic operations per
    /// request).
    fn cached(
        &self,
        runtime: impl FnOnce() -> tokio::runtime::Id,
    ) -> Option<Result<Conn, NodeError>> {
        let slot = self.lock_slot();
        if let Some((other_index, other_node)) = &slot.duplicate_of {
            return Some(Err(NodeError::SameServer {
                other_index: *other_index,
                other_node: other_node.clone(),
            }));
        }
        let live = match slot.live.as_slice() {
            [only] if only.shareable() => Some(only),
            live => {
                let runtime = runtime();
                let own = live.iter().find(|l| l.usable_on(runtime));
                own.or_else(|| live.iter().find(|l| l.shareable()))
            }
        };
        if let Some(live) = live {
            return Some(Ok(Conn {
                conn: live.conn.clone(),
                epoch: live.epoch,
            }));
        }
        if let Some(failed) = &slot.failed
            && Instant::now() < failed.retry_at
        {
            return Some(Err(failed.error.clone()));
        }
        None
    }

    /// The node's connection, made (or made again) when needed. Must run
    /// inside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel-safe: a connection attempt that is dropped leaves the slot as
    /// it was, and the next caller tries again.
    pub(crate) async fn connection(&self) -> Result<Conn, NodeError> {
        if let Some(cached) = self.connection_now() {
            return cached;
        }
        // Boxed: the connection attempt's state is large, and the cached
        // path above is every request's (it keeps their futures small).
        Box::pin(self.connect_on(tokio::runtime::Handle::current())).await
    }

    /// [`connection`](Node::connection) when it needs no waiting: the
    /// cached connection usable on this runtime, or the cached failure
    /// while its backoff lasts; `None` when a connection must be made.
    pub(crate) fn connection_now(&self) -> Option<Result<Conn, NodeError>> {
        self.cached(|| tokio::runtime::Handle::current().id())
    }

    /// [`connection`](Node::connection) past the cache: one attempt at a
    /// time, on the runtime of `current`. The gate's wait is bounded (a
    /// frozen runtime's attempt holds it): past it, this one goes ahead.
    async fn connect_on(&self, current: tokio::runtime::Handle) -> Result<Conn, NodeError> {
        let runtime = current.id();
        let shared = matches!(
            current.runtime_flavor(),
            tokio::runtime::RuntimeFlavor::MultiThread
        );
        let _gate = tokio::time::timeout(self.connect_timeout, self.gate.lock()).await;
        // Someone else may have connected (or failed) while we waited.
        if let Some(cached) = self.cached(|| runtime) {
            return cached;
        }
        let made = self.connect().await;
        let mut slot = self.lock_slot();
        match made {
            Ok((conn, run_id)) => {
                if let Err((other_index, other_node)) =
                    self.identities.register(self.index, &self.label, &run_id)
                {
                    slot.duplicate_of = Some((other_index, other_node.clone()));
                    slot.live.clear();
                    return Err(NodeError::SameServer {
                        other_index,
                        other_node,
                    });
                }
                slot.epoch += 1;
                let epoch = slot.epoch;
                // This runtime's earlier connection, and those of runtimes
                // that shut down, are replaced; the others are kept.
                slot.live
                    .retain(|l| l.runtime != runtime && l.alive.strong_count() > 0);
                let (alive, stop) = sentinel();
                slot.live.push(Live {
                    conn: conn.clone(),
                    runtime,
                    epoch,
                    shared,
                    alive,
                    _stop: stop,
                });
                slot.failed = None;
                self.silence.heard();
                Ok(Conn { conn, epoch })
            }
            Err(error) => {
                if matches!(&error, NodeError::Timeout)
                    || matches!(&error, NodeError::Unreachable(e) if e.is_timeout())
                {
                    // Connected but unanswered (paused, blackholed), or no
                    // answer to the connection itself.
                    self.silence.timed_out();
                }
                let backoff = slot
                    .failed
                    .as_ref()
                    .map_or(FIRST_BACKOFF, |f| next_backoff(f.backoff));
                // Only this runtime's connection goes (if it had one): another
                // runtime's may still carry requests that must run before
                // that runtime's later ones.
                slot.live.retain(|l| l.runtime != runtime);
                slot.failed = Some(Failure {
                    error: error.clone(),
                    retry_at: Instant::now() + backoff,
                    backoff,
                });
                Err(error)
            }
        }
    }

    /// Connects, authenticates (as the URL says) and reads the server's
    /// `run_id`, all within the connect timeout.
    async fn connect(&self) -> Result<(NodeConn, String), NodeError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(None)
            .set_pipeline_buffer_size(QUEUE_ROOM);
        let work = async {
            let mut conn = match &self.dial {
                Dial::Single(client) => NodeConn::Single(
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?,
                ),
                #[cfg(feature = "cluster")]
                Dial::Cluster(client, _) => NodeConn::Cluster(client.get_async_connection().await?),
            };
            // A user whose ACL denies INFO (NOPERM) can still lock: the
            // server's identity and persistence are then unknown.
            let info = match info(&mut conn, &["server", "persistence", "cluster"]).await {
                Err(e) if e.code() == Some("NOPERM") => String::new(),
                other => other?,
            };
            if !conn.is_cluster() && info_field(&info, "cluster_enabled") == Some("1") {
                return Err(crate::protocol::server_info::cluster_member());
            }
            self.native_release
                .store(native_release(&info), std::sync::atomic::Ordering::Relaxed);
            if before_7(&info) {
                self.set_old_set();
            }
            if let Some(aof) = info_field(&info, "aof_enabled") {
                let flag = if aof == "1" { 2 } else { 1 };
                self.aof.store(flag, std::sync::atomic::Ordering::Relaxed);
            }
            // A cluster answers `INFO` from one master at a time: it is
            // named by its slot 0 master instead.
            let run_id = conn.identity(&info).await;
            Ok::<_, RedisError>((conn, run_id))
        };
        match tokio::time::timeout(self.connect_timeout, work).await {
            Err(_) => Err(NodeError::Timeout),
            Ok(Err(e)) => Err(NodeError::from_redis(self.hint_tls(e))),
            Ok(Ok(made)) => Ok(made),
        }
    }

    /// A plain (`redis://`) connection that the node closed or reset before
    /// its first reply is what a TLS-only port does to a client that speaks
    /// plain RESP: the error says so, and that the URL may want `rediss://`.
    /// Still [`NodeError::Unreachable`] (a node restarting mid-handshake
    /// looks the same), only with the hint in its text.
    pub(crate) fn hint_tls(&self, err: RedisError) -> RedisError {
        let plain = match &self.dial {
            Dial::Single(client) => matches!(
                client.get_connection_info().addr(),
                redis::ConnectionAddr::Tcp(..)
            ),
            // (A cluster takes no TLS here: no hint.)
            #[cfg(feature = "cluster")]
            Dial::Cluster(..) => false,
        };
        if plain && err.is_connection_dropped() && !err.is_connection_refusal() {
            RedisError::from((
                redis::ErrorKind::Io,
                "the node closed the connection before its first reply; \
                 if it serves TLS only, its URL wants rediss:// instead of redis://",
                err.to_string(),
            ))
        } else {
            err
        }
    }

    /// How the node is reached, and its connect timeout: what the links'
    /// subscription connections are made with ([`crate::engine::wait`]).
    pub(crate) fn dial(&self) -> (&Dial, Duration) {
        (&self.dial, self.connect_timeout)
    }

    /// Reports that a request on `conn` timed out. A cluster connection whose
    /// requests time out twice in a row is dropped, and the next request
    /// makes a new one, with a fresh slot map from the seeds: redis-rs
    /// keeps sending a slot's requests to its old master while that master
    /// is silent (paused, or cut off by a partition that drops packets),
    /// after a replica took its slots over, and a connection whose queue
    /// stalled (seen after a slot half-way through a migration) never
    /// recovers by itself. A standalone node's connection is kept: its
    /// queued requests must stay ahead of later ones.
    /// Either kind of node is silent from then on ([`Silence`]).
    pub(crate) fn timed_out(&self, conn: &Conn) {
        self.silence.timed_out();
        if !self.is_cluster() {
            return;
        }
        let before = self
            .timeouts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if before >= 1 {
            self.timeouts.store(0, std::sync::atomic::Ordering::Relaxed);
            self.remade
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.broken(conn);
        }
    }

    /// Counts a round's request that failed here (`Stats::node_failures`).
    pub(crate) fn failed(&self) {
        if self.counts {
            self.failures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        #[cfg(feature = "metrics")]
        metrics::counter!("redlock_node_failures_total", "node" => self.label.clone()).increment(1);
    }

    /// Reports an answer: the run of timeouts ends.
    pub(crate) fn answered(&self) {
        if self.timeouts.load(std::sync::atomic::Ordering::Relaxed) != 0 {
            self.timeouts.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        self.silence.heard();
    }

    /// Reports that a request on `conn` failed at the connection level: the
    /// next request connects again (at once: the node answered before).
    pub(crate) fn broken(&self, conn: &Conn) {
        self.lock_slot().live.retain(|l| l.epoch != conn.epoch);
    }
}
