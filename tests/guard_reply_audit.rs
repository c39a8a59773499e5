//! An audit of commit a39b763: the reply of the restart guard's pipeline
//! (`SET key token NX PX ttl GET`, then `GET <marker>`) on a node whose
//! generation marker the manager knows to be old is now read in its own
//! array (`acquire::read_known_old` takes the reply by value, truncates it
//! to the `SET`'s reply where the marker still holds the known generation,
//! and hands the whole reply back to `call` where it changed, for
//! `acquire::set_took`).
//!
//! Against real `redis-server` processes (loopback only), over RESP2 and
//! over RESP3 (`?protocol=resp3` in the manager's URLs): three nodes whose
//! markers are old, a manager that knows every node's generation, and
//! someone else's key on node 2, so that node 0 alone decides each
//! attempt. Between two acquisitions, node 0's marker or data is changed
//! (made a list, replaced by another generation, flushed, its scripts
//! flushed, the lock key made a hash), and each case says what node 0 must
//! answer: it counts, it is young, or it is the node's `WRONGTYPE` error;
//! and where it did not count, no key of the attempt is left on it.

use std::time::{Duration, Instant};

use redlock_harness::raw::{self, calls, reset_stats, script_flush};
use redlock_harness::{Cluster, keys, resource};
use redlock_quorum::{Error, Lock, NodeError, Redlock};

/// The guard's `max_ttl`, and the ttl of the locks here: a key left
/// behind must outlive [`SETTLE`] by far, or a leak would look like a
/// release (and a busy machine must not see a held key expire before it
/// is checked).
const MAX_TTL: Duration = Duration::from_secs(5);

/// Generous bounds for a machine shared with CPU burners: a 50 ms node
/// timeout fires there.
const NODE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a check waits for a release owed to a node (the failed
/// attempt's releases and take-backs are awaited before `try_lock`
/// returns: this is slack for a busy machine), well under [`MAX_TTL`].
const SETTLE: Duration = Duration::from_secs(2);

/// The value of the key planted on node 2 (someone else's lock).
const OTHER_HOLDER: &str = "someone-else";

/// The protocol of the manager's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Resp2,
    Resp3,
}

impl Protocol {
    const BOTH: [Protocol; 2] = [Protocol::Resp2, Protocol::Resp3];

    /// `url` (a harness node's `redis://127.0.0.1:PORT/`) as the manager
    /// names it.
    fn url(self, url: &str) -> String {
        match self {
            Protocol::Resp2 => url.to_owned(),
            Protocol::Resp3 => format!("{url}?protocol=resp3"),
        }
    }
}

/// What node 0 must answer the attempt that follows a change.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// It counts: the lock is granted with nodes 0 and 1, node 0 holds our
    /// token, and the manager takes the pipeline there again afterwards
    /// (it knows node 0's generation, the same or a new one).
    Counts,
    /// It is young (`NodeError::Young`): no lock, nothing left behind.
    Young,
    /// Its `WRONGTYPE` error (`NodeError::Reply`): no lock, and no key of
    /// ours left on it (where the pipeline's `SET` took, it is taken back).
    WrongType,
}

/// A change made to node 0 between two acquisitions, given the resource
/// of the attempt that follows.
type Change = fn(&KnownOld, &str);

/// One case: its name, the change, and what node 0 must answer.
type Case = (&'static str, Change, Expect);

/// Runs `args` on the node at `url` with a connection of its own.
fn run(url: &str, args: &[&[u8]]) -> redis::Value {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut raw::conn(url))
        .unwrap_or_else(|e| panic!("{args:?} on {url}: {e}"))
}

/// The marker key of the empty key prefix.
fn marker() -> Vec<u8> {
    keys::generation("")
}

/// A manager over `urls` with the restart guard, one attempt per
/// `try_lock` and timeouts a busy machine keeps within.
fn guarded(urls: &[String]) -> Redlock {
    Redlock::builder(urls.iter().map(String::as_str))
        .restart_guard(MAX_TTL)
        .retry_delay(Duration::from_millis(20))
        .retry_jitter(Duration::from_millis(10))
        .retry_count(20)
        .node_timeout(NODE_TIMEOUT)
        .connect_timeout(NODE_TIMEOUT)
        .build()
        .unwrap()
}

/// Three nodes whose markers are old, and a manager over `protocol` that
/// knows every node's generation as old: its acquisitions of one key at
/// node 0 are the pipeline.
struct KnownOld {
    cluster: Cluster,
    protocol: Protocol,
    manager: Redlock,
    /// Node 0's generation when the manager learned it.
    generation: Vec<u8>,
}

impl KnownOld {
    async fn start(protocol: Protocol) -> KnownOld {
        let cluster = Cluster::start(3);
        let urls: Vec<String> = cluster.urls().iter().map(|u| protocol.url(u)).collect();
        let manager = guarded(&urls);
        // The markers are made (every node young: refused), then grow old.
        let _ = manager.try_lock(&resource("age"), MAX_TTL).await;
        tokio::time::sleep(MAX_TTL + Duration::from_millis(200)).await;
        let generation = run(&cluster.urls()[0], &[b"GET", &marker()]);
        let redis::Value::BulkString(generation) = generation else {
            panic!("{protocol:?}: node 0 has no marker: {generation:?}");
        };
        let known = KnownOld {
            cluster,
            protocol,
            manager,
            generation,
        };
        known.learn().await;
        known
    }

    /// Node 0's plain URL (the harness's own connections: RESP2).
    fn url(&self) -> &str {
        &self.cluster.urls()[0]
    }

    /// Takes and releases a lock until the manager knows every node's
    /// generation as old again, and checks that it then takes the pipeline
    /// at node 0.
    async fn learn(&self) {
        for _ in 0..2 {
            let lock = self
                .manager
                .lock_within(&resource("learn"), MAX_TTL, Duration::from_secs(20))
                .await
                .unwrap_or_else(|e| panic!("{:?}: old nodes grant: {e}", self.protocol));
            self.manager.unlock(&lock).await.unwrap();
        }
        assert!(
            self.pipelined().await,
            "{:?}: the manager knows node 0 as old",
            self.protocol
        );
    }

    /// Whether the manager's acquisition of one key at node 0 is the
    /// pipeline: an acquisition and its release cost node 0 one `EVALSHA`
    /// (the release's), one `SET` and two `GET`s (the marker's, and the
    /// release script's of the key).
    async fn pipelined(&self) -> bool {
        reset_stats(self.url());
        let lock = self
            .manager
            .lock_within(&resource("probe"), MAX_TTL, Duration::from_secs(20))
            .await
            .unwrap_or_else(|e| panic!("{:?}: probe: {e}", self.protocol));
        self.manager.unlock(&lock).await.unwrap();
        let counts = ["evalsha", "set", "get"].map(|c| calls(self.url(), c));
        counts == [1, 1, 2]
    }

    /// The attempt that follows `change`: someone else holds `res` on node
    /// 2, so that the lock is granted exactly when node 0 counts.
    async fn attempt(&self, res: &str, change: Change) -> Result<Lock, Error> {
        self.cluster
            .plant(&[2], res, OTHER_HOLDER, Duration::from_secs(60));
        change(self, res);
        self.manager.try_lock(res, MAX_TTL).await
    }

    /// Runs one case and checks what node 0 answered, and what it keeps.
    async fn check(&self, (name, change, expect): &Case) {
        let at = format!("{:?}, {name}", self.protocol);
        let res = resource("decide");
        let outcome = self.attempt(&res, *change).await;
        match (expect, outcome) {
            (Expect::Counts, Ok(lock)) => {
                assert_eq!(
                    self.cluster.value_on(0, &res).as_deref(),
                    Some(lock.token()),
                    "{at}: node 0 holds our key"
                );
                assert_eq!(
                    self.manager.unlock(&lock).await.unwrap(),
                    2,
                    "{at}: released on nodes 0 and 1"
                );
                assert!(
                    self.pipelined().await,
                    "{at}: the manager knows node 0's generation afterwards"
                );
            }
            (Expect::Counts, Err(err)) => panic!("{at}: node 0 did not count: {err}"),
            (expect, Ok(lock)) => {
                let _ = self.manager.unlock(&lock).await;
                panic!("{at}: granted where node 0 should be {expect:?}")
            }
            (expect, Err(err)) => {
                let cause = self.cause_on_node_0(&err);
                let as_expected = match (expect, cause) {
                    (Expect::Young, Some(NodeError::Young { max_ttl, .. })) => *max_ttl == MAX_TTL,
                    (Expect::WrongType, Some(NodeError::Reply(e))) => {
                        e.code() == Some("WRONGTYPE") || e.to_string().contains("WRONGTYPE")
                    }
                    _ => false,
                };
                assert!(as_expected, "{at}: expected {expect:?} of node 0: {err}");
                // Any string there but the other holder's is the attempt's.
                let ours = |i: usize| {
                    let held = self.cluster.value_on(i, &res);
                    held.filter(|v| v != OTHER_HOLDER)
                };
                assert!(
                    within(SETTLE, || ours(0).is_none() && ours(1).is_none()).await,
                    "{at}: the refused attempt left {:?} on nodes 0 and 1 ({err})",
                    [ours(0), ours(1)]
                );
                assert_eq!(
                    self.cluster.value_on(2, &res).as_deref(),
                    Some(OTHER_HOLDER),
                    "{at}: node 2 keeps the other holder's key"
                );
            }
        }
    }

    /// What node 0 answered, among the failures of `err` (`None` where it
    /// is not among them).
    fn cause_on_node_0<'e>(&self, err: &'e Error) -> Option<&'e NodeError> {
        let failures = match err {
            Error::NoQuorum { failures, .. } | Error::Conflict { failures, .. } => failures,
            other => panic!("{:?}: not a refusal: {other}", self.protocol),
        };
        let port = self.url().trim_end_matches('/').rsplit(':').next().unwrap();
        failures
            .iter()
            .find(|f| f.node.rsplit(':').next() == Some(port))
            .map(|f| &f.cause)
    }

    /// Gives node 0 back the data of the generation the manager knew:
    /// emptied, then its marker set to that generation again (as old as
    /// it was), its script cache left as it is. A manager that forgot the
    /// generation learns it again from the script's reply.
    fn restore(&self) {
        run(self.url(), &[b"FLUSHALL"]);
        run(self.url(), &[b"SET", &marker(), &self.generation]);
    }

    /// Node 0's generation marker now.
    fn marker_now(&self) -> Option<String> {
        raw::get(self.url(), marker())
    }

    /// A generation born now on node 0's clock, with `id`.
    fn born_now(&self, id: &str) -> Vec<u8> {
        let redis::Value::Array(time) = run(self.url(), &[b"TIME"]) else {
            panic!("TIME");
        };
        let part = |v: &redis::Value| -> u64 {
            match v {
                redis::Value::BulkString(b) => std::str::from_utf8(b).unwrap().parse().unwrap(),
                other => panic!("TIME: {other:?}"),
            }
        };
        let millis = part(&time[0]) * 1000 + part(&time[1]) / 1000;
        format!("{millis}:{id}").into_bytes()
    }

    /// The id of the generation the manager knew.
    fn known_id(&self) -> String {
        let generation = String::from_utf8(self.generation.clone()).unwrap();
        generation.split_once(':').unwrap().1.to_owned()
    }
}

/// Polls `check` until it holds or `limit` has passed; whether it held.
async fn within(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !check() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// Runs `cases` in order on a fresh cluster known old over each protocol
/// (the two at once), node 0 given back its known generation after each.
async fn run_cases(cases: &[Case]) {
    futures::future::join_all(Protocol::BOTH.map(|protocol| async move {
        let known = KnownOld::start(protocol).await;
        for case in cases {
            known.check(case).await;
            known.restore();
            known.learn().await;
        }
    }))
    .await;
}

/// Node 0's marker made a list (holding the known generation as its one
/// element): its `GET` answers `WRONGTYPE`, in the pipeline and in the
/// script's prelude.
fn make_marker_a_list(k: &KnownOld, _: &str) {
    run(k.url(), &[b"DEL", &marker()]);
    run(k.url(), &[b"RPUSH", &marker(), &k.generation]);
}

/// Catches: a marker of the wrong type read as the known one (the
/// pipeline's `GET` answers `WRONGTYPE` in the second slot), or the
/// pipeline's `SET`, which took, not taken back once the script that
/// decides fails on the marker (`set_took` given another value than the
/// reply as it came: the failed round releases no node that answered with
/// an error); and the `SET`'s own error (the lock key a hash, first slot)
/// not the node's `WRONGTYPE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_that_became_a_list_is_the_nodes_wrongtype_and_leaves_no_key() {
    run_cases(&[
        ("marker made a list", make_marker_a_list, Expect::WrongType),
        (
            "lock key a hash",
            |k, res| {
                run(k.url(), &[b"HSET", res.as_bytes(), b"f", b"v"]);
            },
            Expect::WrongType,
        ),
        ("nothing changed", |_, _| {}, Expect::Counts),
    ])
    .await;
}

/// Catches: a marker that holds another generation taken for the known
/// one (young with a new id, young with the known id: a comparison of the
/// ids alone), or a missing one (nil in the second slot); and one that is
/// old not counted, or not learned (the manager then never takes the
/// pipeline there again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_replaced_by_another_generation_is_judged_by_its_own_age() {
    run_cases(&[
        (
            "a young generation, a new id",
            |k, _| {
                let young = k.born_now("another-manager-0000");
                run(k.url(), &[b"SET", &marker(), &young]);
            },
            Expect::Young,
        ),
        (
            "a young generation, the known id",
            |k, _| {
                let young = k.born_now(&k.known_id());
                run(k.url(), &[b"SET", &marker(), &young]);
            },
            Expect::Young,
        ),
        (
            "an old generation of another id",
            |k, _| {
                run(k.url(), &[b"SET", &marker(), b"1000:another-manager-0000"]);
            },
            Expect::Counts,
        ),
        (
            "marker deleted",
            |k, _| {
                run(k.url(), &[b"DEL", &marker()]);
            },
            Expect::Young,
        ),
    ])
    .await;
}

/// Catches: a node flushed between two acquisitions (the marker's `GET`
/// answers nil) counted as the node it was; its new generation never
/// counted, or never learned, once it is `max_ttl` old.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_flushed_between_acquisitions_is_young_then_counts_with_its_new_generation() {
    let flush: Case = (
        "FLUSHALL",
        |k, _| {
            run(k.url(), &[b"FLUSHALL"]);
        },
        Expect::Young,
    );
    // Then nothing more: the script (the known generation forgotten)
    // finds the new marker young, then old.
    let young: Case = ("after FLUSHALL", |_, _| {}, Expect::Young);
    let old: Case = ("after FLUSHALL and max_ttl", |_, _| {}, Expect::Counts);
    futures::future::join_all(Protocol::BOTH.map(|protocol| async move {
        let known = KnownOld::start(protocol).await;
        let before = known.marker_now();
        known.check(&flush).await;
        known.check(&young).await;
        let new = known.marker_now();
        assert!(
            new.is_some() && new != before,
            "{protocol:?}: a new generation"
        );
        // Once max_ttl old on node 0's clock, it counts, and the manager
        // takes the pipeline there with the new generation.
        tokio::time::sleep(MAX_TTL).await;
        known.check(&old).await;
        assert_eq!(known.marker_now(), new, "{protocol:?}: the same generation");
    }))
    .await;
}

/// Catches: `?protocol=resp3` not in effect (the other tests' RESP3 runs
/// would then prove nothing), and the pipeline's reply or the marked
/// scripts' replies misread over RESP3 (a grant, a young node, the short
/// reply): the same answers as over RESP2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_over_resp3_reads_the_pipeline_as_over_resp2() {
    futures::future::join_all(Protocol::BOTH.map(|protocol| async move {
        let known = KnownOld::start(protocol).await;
        let clients = match run(known.url(), &[b"CLIENT", b"LIST"]) {
            redis::Value::BulkString(b) => String::from_utf8(b).unwrap(),
            redis::Value::VerbatimString { text, .. } => text,
            other => panic!("CLIENT LIST: {other:?}"),
        };
        let resp3 = clients.lines().filter(|l| l.contains(" resp=3")).count();
        match protocol {
            Protocol::Resp2 => assert_eq!(resp3, 0, "{clients}"),
            Protocol::Resp3 => assert!(resp3 >= 1, "no RESP3 connection: {clients}"),
        }
        for _ in 0..3 {
            known
                .check(&("nothing changed", |_, _| {}, Expect::Counts))
                .await;
        }
        known
            .check(&(
                "marker deleted",
                |k, _| {
                    run(k.url(), &[b"DEL", &marker()]);
                },
                Expect::Young,
            ))
            .await;
    }))
    .await;
}

/// Catches: a node whose script cache was emptied (`SCRIPT FLUSH`) and
/// whose marker then changed, answered with `NOSCRIPT` or misread where
/// the script that decides must be loaded again; its pipeline (no script)
/// not taken where the marker did not change; the `SET` that took not
/// taken back where the release script must be loaded again first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_scripts_were_flushed_answers_the_pipeline_and_the_script_that_follows() {
    run_cases(&[
        ("SCRIPT FLUSH", |k, _| script_flush(k.url()), Expect::Counts),
        (
            "SCRIPT FLUSH, marker deleted",
            |k, _| {
                script_flush(k.url());
                run(k.url(), &[b"DEL", &marker()]);
            },
            Expect::Young,
        ),
        (
            "SCRIPT FLUSH, marker made a list",
            |k, res| {
                script_flush(k.url());
                make_marker_a_list(k, res);
            },
            Expect::WrongType,
        ),
        (
            "SCRIPT FLUSH, an old generation of another id",
            |k, _| {
                script_flush(k.url());
                run(k.url(), &[b"SET", &marker(), b"1000:another-manager-0000"]);
            },
            Expect::Counts,
        ),
    ])
    .await;
}
