//! An audit of event-driven waiting on cluster nodes (feature `cluster`,
//! sharded pub/sub since a6d56e3) on its worst days, on real clusters of
//! real servers started by the harness on loopback: slot masters paused
//! mid-wait, killed and replaced, replaced while silent; a thousand
//! waiters over every master; a slot migrating while many wait, and back;
//! churn of waiters that come and go on the same keys; managers and
//! runtimes that go away while waiters wait; an ACL that denies sharded
//! channels; a slot range without a master; Redis 6.2 (no sharded
//! pub/sub) and Valkey 9.1.
//!
//! The tests marked `audit finding` fail today: each shows one defect
//! (its doc says what it checks); they are ignored so that the suite stays
//! green until the defect is fixed.
//!
//! Every waiter here has a timed retry far longer than the test's bounds
//! (`retry_delay` 30 s) and every holder a ttl longer still, so a waiter
//! that was not woken by the release shows up as a wait of tens of
//! seconds, not as a timed retry that hides it.
//!
//! The tests that need a given server say so in their `ignore` reason and
//! check the version they run on.
#![cfg(feature = "cluster")]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_harness::resource;
use redlock_harness::shards::{RedisCluster, RedisClusters};
use redlock_quorum::Redlock;

/// Far longer than any waiter's patience.
const HOLD: Duration = Duration::from_secs(60);
/// A waiter's patience.
const PATIENCE: Duration = Duration::from_secs(20);
/// How soon after the release a woken waiter must hold the lock: far under
/// the timed retry, with room for a loaded 2-core machine.
const WOKEN: Duration = Duration::from_secs(3);
/// The waiters' timed retry: longer than any bound here.
const RETRY: Duration = Duration::from_secs(30);

/// A manager whose timed retry comes after every bound of these tests.
fn manager(urls: &[String]) -> Redlock {
    Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(Duration::from_millis(500))
        .retry_delay(RETRY)
        .retry_jitter(Duration::from_millis(1))
        .build()
        .unwrap()
}

/// A manager that polls every `delay` (for the fallback tests).
fn polling_manager(urls: &[String], delay: Duration) -> Redlock {
    Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(Duration::from_millis(500))
        .retry_delay(delay)
        .retry_jitter(Duration::from_millis(1))
        .build()
        .unwrap()
}

/// Runs blocking harness work (cluster commands, `settle` loops) without
/// stalling the runtime's other worker.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// `(major, text)` of the server the harness starts (`REDIS_SERVER`).
fn server_version() -> (u32, String) {
    let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned());
    let out = std::process::Command::new(&bin)
        .arg("--version")
        .output()
        .expect("the server runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let major = text
        .split_once("v=")
        .and_then(|(_, v)| v.split('.').next())
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    (major, text)
}

/// One connection to each master of each cluster, kept, so that what the
/// probes ask does not count among the connections the masters accept.
/// Made again after a failover ([`Probe::new`]).
/// Masters that are down are left out.
struct Probe {
    conns: Vec<Vec<Option<redis::Connection>>>,
}

impl Probe {
    fn new(clusters: &RedisClusters) -> Self {
        Probe {
            conns: clusters
                .iter()
                .map(|c| {
                    (0..c.masters())
                        .map(|m| {
                            redis::Client::open(c.master_url(m))
                                .and_then(|client| {
                                    client.get_connection_with_timeout(Duration::from_secs(2))
                                })
                                .ok()
                        })
                        .collect()
                })
                .collect(),
        }
    }

    fn each<T>(&mut self, mut f: impl FnMut(&mut redis::Connection) -> T) -> Vec<Vec<T>> {
        self.conns
            .iter_mut()
            .map(|c| c.iter_mut().flatten().map(&mut f).collect())
            .collect()
    }

    fn info_sum(&mut self, section: &str, field: &str) -> u64 {
        self.each(|conn| {
            let info: String = redis::cmd("INFO").arg(section).query(conn).unwrap();
            info.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        })
        .into_iter()
        .flatten()
        .sum()
    }

    /// Connections the masters accepted so far (`total_connections_received`):
    /// a new subscription session of a manager opens one to each master of
    /// its cluster.
    fn connections_received(&mut self) -> u64 {
        self.info_sum("stats", "total_connections_received")
    }

    /// The client connections open on each master (cluster by cluster),
    /// without replicas and without the probe's own.
    fn clients(&mut self) -> Vec<Vec<usize>> {
        self.each(|conn| {
            let list: String = redis::cmd("CLIENT").arg("LIST").query(conn).unwrap();
            list.lines()
                .filter(|l| !l.trim().is_empty())
                .filter(|l| !l.contains(" flags=S "))
                .count()
                - 1
        })
    }

    /// Sharded channels subscribed on the masters, summed (`PUBSUB
    /// SHARDCHANNELS`: each master lists those of its own slots).
    fn shard_channels(&mut self) -> usize {
        self.each(|conn| {
            let channels: Vec<Vec<u8>> = redis::cmd("PUBSUB")
                .arg("SHARDCHANNELS")
                .query(conn)
                .unwrap();
            channels.len()
        })
        .into_iter()
        .flatten()
        .sum()
    }

    /// `used_memory` of the masters, summed.
    fn used_memory(&mut self) -> u64 {
        self.info_sum("memory", "used_memory")
    }

    /// `calls` of `command` in `INFO commandstats`, summed over the masters
    /// (a script's inner commands count too).
    fn calls(&mut self, command: &str) -> u64 {
        let field = format!("cmdstat_{command}:calls=");
        self.each(|conn| {
            let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
            info.lines()
                .filter_map(|l| l.strip_prefix(field.as_str()))
                .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .into_iter()
        .flatten()
        .sum()
    }
}

/// Lock keys (no byte 0xFF) left on any master.
fn lock_keys(clusters: &RedisClusters) -> Vec<String> {
    let mut left = Vec::new();
    for cluster in clusters.iter() {
        for key in cluster.keys_everywhere() {
            if !key.contains(&0xFF) {
                left.push(String::from_utf8_lossy(&key).into_owned());
            }
        }
    }
    left
}

/// The crate's own keys left (waiting hashes, hand-off markers), with
/// their `PTTL` (-1: no expiry), as `(name, pttl)`.
fn crate_keys(clusters: &RedisClusters) -> Vec<(String, i64)> {
    let mut left = Vec::new();
    for cluster in clusters.iter() {
        for m in 0..cluster.masters() {
            let mut conn = cluster.master_conn(m);
            let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
            for key in keys.into_iter().filter(|k| k.contains(&0xFF)) {
                let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
                left.push((String::from_utf8_lossy(&key).into_owned(), pttl));
            }
        }
    }
    left
}

/// Waits (at most `within`) until no lock key is left and every key of
/// the waiting protocol left expires; then, at most `lease_within` more,
/// until no waiting hash is left. Panics with what is left.
async fn nothing_left(clusters: &RedisClusters, managers: &[&Redlock]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while managers.iter().any(|m| m.pending_releases() > 0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let locks = blocking(|| lock_keys(clusters));
    assert!(locks.is_empty(), "lock keys left: {locks:?}");
    let own = blocking(|| crate_keys(clusters));
    let persistent: Vec<_> = own.iter().filter(|(_, t)| *t == -1).collect();
    assert!(
        persistent.is_empty(),
        "keys of the waiting protocol without expiry: {persistent:?}"
    );
    // Registrations have a 6 s lease; the last waiter's removal deletes
    // the hash at once.
    let deadline = Instant::now() + Duration::from_secs(8);
    loop {
        let own = blocking(|| crate_keys(clusters));
        let hashes: Vec<_> = own.iter().filter(|(k, _)| k.ends_with("waiters")).collect();
        if hashes.is_empty() {
            let markers = own.iter().filter(|(k, _)| k.ends_with("handoff")).count();
            println!("left: no waiting hash; {markers} hand-off markers (30 s expiry)");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "waiting hashes outlived their lease: {hashes:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What one waiter saw: when it got the lock, and when it began to
/// release it.
#[derive(Debug, Clone, Copy)]
struct Turn {
    got: Instant,
    released: Instant,
    /// The release reached a quorum at once (else it is owed).
    unlocked: bool,
}

/// A waiter on `res`: waits (patience `within`), holds `hold`, releases.
fn waiter(
    m: &Redlock,
    res: &str,
    within: Duration,
    hold: Duration,
) -> tokio::task::JoinHandle<Result<Turn, redlock_quorum::Error>> {
    let (m, res) = (m.clone(), res.to_owned());
    tokio::spawn(async move {
        let lock = m.lock_within(&res, HOLD, within).await?;
        let got = Instant::now();
        tokio::time::sleep(hold).await;
        // When the release starts: the next holder may have the lock
        // before this call returns.
        let released = Instant::now();
        // A release that does not reach a quorum in time is owed and sent
        // again by the manager (`pending_releases`): not under test here.
        let unlocked = m.unlock(&lock).await.is_ok();
        Ok(Turn {
            got,
            released,
            unlocked,
        })
    })
}

/// The hand-off delays of one key's waiters whose first release was at
/// `first`: each waiter's `got` after the release before it.
fn handoffs(first: Instant, mut turns: Vec<Turn>) -> Vec<Duration> {
    turns.sort_by_key(|t| t.got);
    let mut before = first;
    let mut out = Vec::new();
    for t in turns {
        out.push(t.got.saturating_duration_since(before));
        before = t.released;
    }
    out
}

/// Collects waiters' turns; panics on a waiter that failed.
async fn turns(
    waiting: Vec<tokio::task::JoinHandle<Result<Turn, redlock_quorum::Error>>>,
) -> Vec<Turn> {
    let mut out = Vec::new();
    for w in waiting {
        out.push(w.await.unwrap().expect("a waiter got the lock"));
    }
    out
}

/// Lets the managers' links subscribe (and register) what their waiters
/// wait for.
async fn settle_waiters() {
    tokio::time::sleep(Duration::from_millis(700)).await;
}

// ---------------------------------------------------------------------
// Scenario 1: slot masters paused, killed, replaced.
// ---------------------------------------------------------------------

/// The master that owns the resource's slot is paused (SIGSTOP) for five
/// seconds on two of five clusters (both go `CLUSTERDOWN`), then resumed;
/// the release right after wakes the waiters (two in one manager, one in
/// another) within the bound, and every hand-off after it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_masters_on_two_clusters_then_resumed_the_release_wakes() {
    let mut clusters = RedisClusters::start(5, 3, 0);
    let urls = clusters.urls();
    let (a, b, c) = (manager(&urls), manager(&urls), manager(&urls));
    let res = resource("audit-pause");
    let held = a.lock(&res, HOLD).await.unwrap();
    let hold = Duration::from_millis(100);
    let waiting = vec![
        waiter(&b, &res, PATIENCE, hold),
        waiter(&b, &res, PATIENCE, hold),
        waiter(&c, &res, PATIENCE, hold),
    ];
    settle_waiters().await;
    let paused: Vec<usize> = (0..2)
        .map(|i| {
            let m = blocking(|| clusters[i].master_of(res.as_bytes()));
            clusters[i].pause_master(m);
            m
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (i, m) in paused.iter().enumerate() {
        clusters[i].resume_master(*m);
    }
    blocking(|| (0..2).for_each(|i| clusters[i].wait_ok()));
    let released = Instant::now();
    let n = a.unlock(&held).await.unwrap();
    let delays = handoffs(released, turns(waiting).await);
    println!("released on {n}; hand-offs {delays:?}");
    assert!(
        delays.iter().all(|d| *d < WOKEN),
        "a waiter not woken by the release: {delays:?}"
    );
    nothing_left(&clusters, &[&a, &b, &c]).await;
}

/// The same pause, and the release comes while the two masters are still
/// paused: the three other clusters' messages wake the waiters, and each
/// waiter takes the lock on those three. Then new waiters come during the
/// pause, on a new lock of the same slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_while_two_masters_are_paused_wakes_the_waiters() {
    let mut clusters = RedisClusters::start(5, 3, 0);
    let urls = clusters.urls();
    let (a, b, c) = (manager(&urls), manager(&urls), manager(&urls));
    let res = resource("audit-pause-release");
    let held = a.lock(&res, HOLD).await.unwrap();
    let hold = Duration::from_millis(100);
    let waiting = vec![
        waiter(&b, &res, PATIENCE, hold),
        waiter(&b, &res, PATIENCE, hold),
        waiter(&c, &res, PATIENCE, hold),
    ];
    settle_waiters().await;
    let paused: Vec<usize> = (0..2)
        .map(|i| {
            let m = blocking(|| clusters[i].master_of(res.as_bytes()));
            clusters[i].pause_master(m);
            m
        })
        .collect();
    // Past the cluster node timeout: both clusters are down.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let released = Instant::now();
    let n = a.unlock(&held).await.unwrap();
    let delays = handoffs(released, turns(waiting).await);
    println!("released on {n} while paused; hand-offs {delays:?}");
    assert!(
        delays.iter().all(|d| *d < WOKEN),
        "a waiter not woken by the release: {delays:?}"
    );
    // Still paused: a new lock in the same slot (on the three live
    // clusters), and new waiters, whose subscriptions on the two down
    // clusters fail (the slot's master is paused): the three others
    // still wake them.
    let res2 = format!("{{{res}}}:2");
    let held = a.lock(&res2, HOLD).await.unwrap();
    let waiting = vec![
        waiter(&b, &res2, PATIENCE, hold),
        waiter(&b, &res2, PATIENCE, hold),
        waiter(&c, &res2, PATIENCE, hold),
    ];
    tokio::time::sleep(Duration::from_secs(2)).await;
    let released = Instant::now();
    let n = a.unlock(&held).await.unwrap();
    let delays = handoffs(released, turns(waiting).await);
    println!("new waiters during the pause, released on {n}; hand-offs {delays:?}");
    assert!(
        delays.iter().all(|d| *d < WOKEN),
        "a new waiter not woken by the release: {delays:?}"
    );
    for (i, m) in paused.iter().enumerate() {
        clusters[i].resume_master(*m);
    }
    blocking(|| (0..2).for_each(|i| clusters[i].wait_ok()));
    nothing_left(&clusters, &[&a, &b, &c]).await;
}

/// The slot master is killed (SIGKILL) on two of five clusters and its
/// replica takes over; the release afterwards wakes the waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_masters_replaced_then_the_release_wakes() {
    let mut clusters = RedisClusters::start(5, 2, 1);
    let urls = clusters.urls();
    let (a, b, c) = (manager(&urls), manager(&urls), manager(&urls));
    let res = resource("audit-kill");
    let held = a.lock(&res, HOLD).await.unwrap();
    let hold = Duration::from_millis(100);
    let waiting = vec![
        waiter(&b, &res, PATIENCE, hold),
        waiter(&b, &res, PATIENCE, hold),
        waiter(&c, &res, PATIENCE, hold),
    ];
    settle_waiters().await;
    for i in 0..2 {
        let m = blocking(|| clusters[i].master_of(res.as_bytes()));
        clusters[i].kill_master(m);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        blocking(|| clusters[i].failover(m));
    }
    // The links made new sessions on the promoted masters (backoff at
    // most 1 s).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let released = Instant::now();
    let n = a.unlock(&held).await.unwrap();
    let delays = handoffs(released, turns(waiting).await);
    println!("released on {n} after the failovers; hand-offs {delays:?}");
    assert!(
        delays.iter().all(|d| *d < WOKEN),
        "a waiter not woken by the release: {delays:?}"
    );
    nothing_left(&clusters, &[&a, &b, &c]).await;
}

/// The slot master goes silent (SIGSTOP: a hung host, or a partition that
/// drops packets) on three of five clusters and its replica takes over
/// there while it stays silent; on the two others the slot master dies
/// (no replica takes over: those clusters are down). The release reaches
/// a quorum (the three promoted masters), and the waiters' links, which
/// still believe they are subscribed on those three clusters, must hear
/// it. Their subscriptions are still on the silent old masters: nothing
/// ends those sessions (no `Disconnection`, no `SUNSUBSCRIBE`), so the
/// release is not heard, and a waiter that counts three subscribed nodes
/// as a quorum sleeps on notifications alone. When the old masters come
/// back (they learn they were replaced), the waiters recover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "audit finding: fails (a replaced silent master keeps the link's session); see report"]
async fn a_silent_master_replaced_keeps_a_stale_subscription() {
    let mut clusters = RedisClusters::start(5, 2, 1);
    let urls = clusters.urls();
    // The setup below takes tens of seconds: the holder's ttl, the
    // waiters' patience and timed retry are longer still.
    let long = Duration::from_secs(150);
    let a = manager(&urls);
    let b = Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(Duration::from_millis(500))
        .retry_delay(Duration::from_secs(120))
        .retry_jitter(Duration::from_millis(1))
        .build()
        .unwrap();
    let res = resource("audit-silent");
    let held = a.lock(&res, long).await.unwrap();
    let hold = Duration::from_millis(100);
    let waiting = vec![
        waiter(&b, &res, Duration::from_secs(110), hold),
        waiter(&b, &res, Duration::from_secs(110), hold),
    ];
    settle_waiters().await;
    let mut silent = Vec::new();
    for i in 0..3 {
        let m = blocking(|| clusters[i].master_of(res.as_bytes()));
        clusters[i].pause_master(m);
        blocking(|| clusters[i].failover(m));
        silent.push(m);
    }
    for i in 3..5 {
        let m = blocking(|| clusters[i].master_of(res.as_bytes()));
        clusters[i].kill_master(m);
    }
    // The request connections of both managers go on to the promoted
    // masters after two timeouts in a row (`Node::timed_out`): made here,
    // so that only the subscriptions are under test.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let verified = a.verify(&held).await;
        let tried = b.try_lock(&res, long).await;
        let timeouts = format!("{tried:?}").contains("Timeout");
        if verified.as_ref().is_ok_and(|v| *v) && !timeouts {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the managers' requests do not reach the promoted masters: {verified:?} {tried:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let released = Instant::now();
    let unlocked = a.unlock(&held).await;
    let gone: Vec<bool> = blocking(|| {
        (0..3)
            .map(|i| clusters[i].get(res.as_bytes()).is_none())
            .collect()
    });
    println!("unlock: {unlocked:?}; key gone on the promoted masters: {gone:?}");
    assert!(
        gone.iter().all(|g| *g),
        "released on the three promoted masters"
    );
    let mut waiting = waiting.into_iter();
    let mut first = waiting.next().unwrap();
    let heard = tokio::time::timeout(Duration::from_secs(10), &mut first).await;
    let heard_in = match &heard {
        Ok(Ok(Ok(t))) => Some(t.got - released),
        _ => None,
    };
    println!("the first waiter after the release: {heard_in:?}");
    if heard.is_err() {
        // Recovery: the old masters resume, learn that they were replaced
        // and end their shard channels' subscriptions.
        for (i, m) in silent.iter().enumerate() {
            clusters[i].resume_master(*m);
        }
        let resumed = Instant::now();
        let later = tokio::time::timeout(Duration::from_secs(20), &mut first).await;
        match later {
            Ok(Ok(Ok(t))) => println!(
                "after the old masters resumed, the first waiter took it {:?} later",
                t.got - resumed
            ),
            other => println!("not even after the resume: {other:?}"),
        }
    }
    let second = waiting.next().unwrap();
    let second = tokio::time::timeout(Duration::from_secs(20), second).await;
    println!(
        "the second waiter: {:?}",
        second.map(|r| r.map(|t| t.map(|t| t.got - released)))
    );
    assert!(
        heard_in.is_some_and(|d| d < WOKEN),
        "the release was not heard: the first waiter {heard_in:?} after it"
    );
}

// ---------------------------------------------------------------------
// Scenario 2: many waiters over every master.
// ---------------------------------------------------------------------

/// `keys * per_key` waiters in one manager on `keys` keys over every
/// master of five clusters, each key held and released once, each waiter
/// holding 5 ms: prints how long subscribing took, the masters' clients
/// and memory, the hand-offs; checks every waiter is served by a release,
/// registrations are made and renewed, no session is made again, and
/// every channel and connection is gone or back afterwards.
async fn many_waiters(keys: usize, per_key: usize) {
    let clusters = RedisClusters::start(5, 3, 0);
    let mut probe = Probe::new(&clusters);
    let urls = clusters.urls();
    let holder = manager(&urls);
    let names: Vec<String> = (0..keys)
        .map(|i| resource(&format!("audit-many-{i}")))
        .collect();
    let masters_hit: std::collections::HashSet<usize> = names
        .iter()
        .map(|k| blocking(|| clusters[0].master_of(k.as_bytes())))
        .collect();
    assert_eq!(masters_hit.len(), 3, "the keys are on every master");
    let mut held = Vec::new();
    for k in &names {
        held.push(holder.lock(k, HOLD).await.unwrap());
    }
    let w = manager(&urls);
    // The waiting manager's connections before it waits (its request
    // connection is made by a first call).
    let warm = w
        .try_lock(&resource("audit-many-warm"), HOLD)
        .await
        .unwrap();
    w.unlock(&warm).await.unwrap();
    let before = blocking(|| probe.clients());
    let mem_before = blocking(|| probe.used_memory());
    let conns_before = blocking(|| probe.connections_received());
    let hello_before = blocking(|| probe.calls("hello"));
    let start = Instant::now();
    let mut waiting: Vec<(usize, _)> = Vec::new();
    for (i, k) in names.iter().enumerate() {
        for _ in 0..per_key {
            waiting.push((
                i,
                waiter(&w, k, Duration::from_secs(40), Duration::from_millis(5)),
            ));
        }
    }
    // Every key's channel and the manager's own channel for it, on every
    // cluster.
    let want = 2 * keys * clusters.len();
    let subscribed_in = loop {
        let now = blocking(|| probe.shard_channels());
        if now >= want {
            break start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "only {now} of {want} channels subscribed after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The manager's registrations (one waiting hash per key and cluster),
    // sent on the request connection by `queue_commands`; then again past
    // the 6 s lease: the renewals (every 2 s) landed.
    let registered = || {
        blocking(|| crate_keys(&clusters))
            .iter()
            .filter(|(k, _)| k.ends_with("waiters"))
            .count()
    };
    // Not awaited by the link: on a loaded machine (load 7) some land
    // after the 500 ms above (596 of 640 once); they are given 10 s.
    let total = keys * clusters.len();
    let mut first = registered();
    let deadline = Instant::now() + Duration::from_secs(10);
    while first < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        first = registered();
    }
    tokio::time::sleep(Duration::from_secs(7)).await;
    let renewed = registered();
    println!(
        "waiting hashes: {first} after subscribing, {renewed} 7 s later (of {})",
        keys * clusters.len()
    );
    assert_eq!(first, keys * clusters.len(), "registrations missing");
    // Renewals are sent within a 1 s bound, one command per key on a
    // cluster node: beside four CPU burners some batches ran out of it
    // three times in a row (512 of 640 renewed). A hash that lapses only
    // means its releases wake every manager instead of one.
    assert!(
        renewed * 4 >= keys * clusters.len() * 3,
        "registrations not renewed: {renewed}"
    );
    let during = blocking(|| probe.clients());
    let mem_during = blocking(|| probe.used_memory());
    println!(
        "{} waiters on {keys} keys: {want} channels subscribed in {subscribed_in:?}; \
         clients per master before {before:?}, while waiting {during:?}; \
         memory of the masters +{} KiB",
        keys * per_key,
        mem_during.saturating_sub(mem_before) / 1024
    );
    for (c, (b, d)) in before.iter().zip(&during).enumerate() {
        for (m, (b, d)) in b.iter().zip(d).enumerate() {
            // The link's connection; one more on a loaded machine, where a
            // session may be made again while the old one closes.
            assert!(
                *d <= *b + 2,
                "cluster {c} master {m}: {b} clients before, {d} while waiting"
            );
        }
    }
    let released = Instant::now();
    // At most 32 releases at once (the holder's own load is not under
    // test).
    use futures::StreamExt;
    let releases: Vec<(usize, Instant, _)> =
        futures::stream::iter(held.iter().enumerate().map(|(i, l)| {
            let holder = &holder;
            async move {
                let at = Instant::now();
                (i, at, holder.unlock(l).await)
            }
        }))
        .buffer_unordered(32)
        .collect()
        .await;
    let release_at: HashMap<usize, Instant> = releases.iter().map(|(i, at, _)| (*i, *at)).collect();
    let refused: Vec<_> = releases.iter().filter(|r| r.2.is_err()).collect();
    assert!(
        refused.is_empty(),
        "{} releases failed, first {:?}",
        refused.len(),
        refused.first()
    );
    let mut by_key: HashMap<usize, Vec<Turn>> = HashMap::new();
    let mut failed = 0;
    let mut owed = 0;
    for (i, w) in waiting {
        match w.await.unwrap() {
            Ok(t) => {
                owed += usize::from(!t.unlocked);
                by_key.entry(i).or_default().push(t);
            }
            Err(e) => {
                failed += 1;
                eprintln!("key {i}: {e}");
            }
        }
    }
    let all = released.elapsed();
    let mut delays: Vec<Duration> = by_key
        .into_iter()
        .flat_map(|(i, t)| handoffs(release_at[&i], t))
        .collect();
    delays.sort();
    let p = |q: f64| delays[((delays.len() - 1) as f64 * q) as usize];
    let conns = blocking(|| probe.connections_received()) - conns_before;
    // redis-rs greets only RESP3 connections (the links') with `HELLO`.
    let sessions = (blocking(|| probe.calls("hello")) - hello_before) / 3;
    println!(
        "all served in {all:?}; hand-offs p50 {:?} p99 {:?} max {:?}; \
         {failed} failed, {owed} releases owed at first; connections accepted meanwhile \
         {conns}, subscription sessions made {sessions} (5 clusters)",
        p(0.5),
        p(0.99),
        p(1.0)
    );
    // One session per cluster; on a loaded machine more (a request
    // connection made anew after two timeouts takes its cluster's
    // subscriptions with it: 12 beside four CPU burners). A restart storm
    // makes hundreds.
    assert!(
        sessions <= 25,
        "{sessions} subscription sessions for 5 clusters: sessions were made again and again"
    );
    assert_eq!(failed, 0, "waiters failed");
    assert!(
        p(1.0) < Duration::from_secs(10),
        "a hand-off took {:?}: a lost wake-up",
        p(1.0)
    );
    // Every channel unsubscribed, connections back.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = blocking(|| probe.shard_channels());
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} channels still subscribed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = blocking(|| probe.clients());
    println!("clients per master after {after:?}");
    for (c, (b, a)) in before.iter().zip(&after).enumerate() {
        for (m, (b, a)) in b.iter().zip(a).enumerate() {
            assert!(
                *a <= *b + 1,
                "cluster {c} master {m}: {b} clients before, {a} after"
            );
        }
    }
    nothing_left(&clusters, &[&holder, &w]).await;
}

/// 1,000 waiters in one manager on 128 keys over every master of five
/// clusters (8 per key, chained), each key released once by its holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_waiters_on_128_keys_are_all_served_by_releases() {
    many_waiters(128, 8).await;
}

/// 4,000 waiters on 2,000 keys: the subscriptions of one session are
/// 4,000 `SSUBSCRIBE`s per cluster, one slot at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow audit: 4,000 waiters on 2,000 keys (about a minute)"]
async fn four_thousand_waiters_on_2000_keys() {
    many_waiters(2000, 2).await;
}

// ---------------------------------------------------------------------
// Scenario 3: slot migration while many wait.
// ---------------------------------------------------------------------

/// Keys of one slot (a common hash tag), held; `per_key` waiters on each in
/// one manager. The slot's migration begins on every cluster and its keys
/// (the locks, the waiting hashes) move to the target; a release while
/// the migration is open must wake its waiters (the source still serves
/// the slot's sharded channels until `SETSLOT NODE`, but the release runs
/// on the target, through `ASK`). Then the migration finishes, the rest
/// is released, and the slot migrates back the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "audit finding: fails (a release on the importing master is not heard); see report"]
async fn a_release_while_the_slot_migrates_wakes_its_waiters() {
    migration_round_trip(true).await;
}

/// As above, but the releases come only after each migration finished
/// (and between begin and the keys' move): the part of scenario 3 that
/// works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiters_follow_their_slot_there_and_back() {
    migration_round_trip(false).await;
}

async fn migration_round_trip(release_mid_migration: bool) {
    let clusters = RedisClusters::start(5, 3, 0);
    let mut probe = Probe::new(&clusters);
    let urls = clusters.urls();
    let holder = manager(&urls);
    let w = manager(&urls);
    let tag = format!("{{{}}}", resource("audit-mig"));
    let names: Vec<String> = (0..10).map(|i| format!("{tag}:k{i}")).collect();
    let slot = RedisCluster::slot(names[0].as_bytes());
    assert!(
        names
            .iter()
            .all(|k| RedisCluster::slot(k.as_bytes()) == slot)
    );
    let per_key = 20;
    let hello_before = blocking(|| probe.calls("hello"));
    let mut failures = Vec::new();
    for pass in ["there", "back"] {
        let mut held = Vec::new();
        for k in &names {
            held.push(holder.lock(k, HOLD).await.unwrap());
        }
        let mut waiting: Vec<Vec<_>> = names
            .iter()
            .map(|k| {
                (0..per_key)
                    .map(|_| waiter(&w, k, Duration::from_secs(30), Duration::from_millis(5)))
                    .collect()
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let sources: Vec<usize> = blocking(|| {
            clusters
                .iter()
                .map(|c| c.master_of(names[0].as_bytes()))
                .collect()
        });
        let migrations: Vec<_> = clusters
            .iter()
            .zip(&sources)
            .map(|(c, from)| c.begin_migration(names[0].as_bytes(), (from + 1) % 3))
            .collect();
        let mut early = Vec::new();
        if release_mid_migration {
            // Key 0: released after `MIGRATING`/`IMPORTING`, its keys still
            // on the source.
            let at = Instant::now();
            holder.unlock(&held[0]).await.unwrap();
            let wait = std::mem::take(&mut waiting[0]);
            early.push((0, at, tokio::spawn(turns(wait))));
            tokio::time::sleep(Duration::from_millis(1000)).await;
        }
        let moved: usize = blocking(|| migrations.iter().map(|m| m.move_keys()).sum());
        if release_mid_migration {
            // Key 1: released once the slot's keys (its lock keys and
            // waiting hashes) are on the importing master, the channels
            // still served by the source.
            let at = Instant::now();
            holder.unlock(&held[1]).await.unwrap();
            let wait = std::mem::take(&mut waiting[1]);
            early.push((1, at, tokio::spawn(turns(wait))));
            tokio::time::sleep(Duration::from_millis(6000)).await;
        }
        let finishing = Instant::now();
        blocking(|| migrations.into_iter().for_each(|m| m.finish()));
        let finished = Instant::now();
        println!(
            "{pass}: {moved} keys moved; migration finished in {:?}",
            finished - finishing
        );
        let owners: Vec<usize> = blocking(|| {
            clusters
                .iter()
                .map(|c| c.master_of(names[0].as_bytes()))
                .collect()
        });
        assert!(
            owners.iter().zip(&sources).all(|(o, s)| o != s),
            "moved: {owners:?} from {sources:?}"
        );
        // The links made new sessions (`SUNSUBSCRIBE` from the source).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let at = Instant::now();
        let first_rest = if release_mid_migration { 2 } else { 0 };
        for l in &held[first_rest..] {
            // A release that misses a quorum (the holder's first request to
            // a moved slot, on a loaded machine) is owed and sent again.
            if let Err(e) = holder.unlock(l).await {
                println!("{pass}: a release after the migration is owed: {e}");
            }
        }
        let mut worst = Duration::ZERO;
        for (i, wait) in waiting.iter_mut().enumerate().skip(first_rest) {
            let d = handoffs(at, turns(std::mem::take(wait)).await);
            worst = worst.max(d.iter().copied().max().unwrap_or_default());
            if d.iter().any(|d| *d >= WOKEN) {
                failures.push(format!("{pass}: after the migration, key {i}: {d:?}"));
            }
        }
        println!("{pass}: released after the migration: worst hand-off {worst:?}");
        for (i, at, joined) in early {
            let t = joined.await.unwrap();
            let first = t.iter().map(|t| t.got).min().unwrap();
            let d = handoffs(at, t);
            println!(
                "{pass}: key {i} released mid-migration: first waiter {:?} after the release \
                 ({:?} after the migration finished), worst hand-off {:?}",
                first - at,
                first.saturating_duration_since(finished),
                d.iter().max().unwrap()
            );
            if d[0] >= WOKEN {
                failures.push(format!(
                    "{pass}: key {i} released mid-migration, first waiter after {:?}",
                    d[0]
                ));
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while (holder.pending_releases() > 0 || w.pending_releases() > 0)
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let sessions = (blocking(|| probe.calls("hello")) - hello_before) / 3;
    println!("subscription sessions made: {sessions} (5 clusters, 2 migrations)");
    assert!(failures.is_empty(), "{failures:#?}");
    nothing_left(&clusters, &[&holder, &w]).await;
}

// ---------------------------------------------------------------------
// Scenario 4: Redis 6.2 and Valkey 9.1.
// ---------------------------------------------------------------------

/// On Redis 6.2 clusters (no sharded pub/sub) waiters fall back to the
/// timed retry: a waiter takes the lock within about one `retry_delay`
/// after the release, releases succeed on every cluster (the unlock
/// script's `PUBSUB SHARDNUMSUB` and `SPUBLISH` fail inside `pcall`), and
/// the links do not reconnect in a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs REDIS_SERVER=\"$(scripts/redis62-server.sh)\" (CI's Redis 6.2 step runs it)"]
async fn on_redis_6_2_waiters_fall_back_to_the_timed_retry() {
    if std::env::var("AUDIT_TRACE").is_ok() {
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_test_writer()
            .try_init();
    }
    let (major, text) = server_version();
    assert_eq!(major, 6, "run with a Redis 6.2 server: {text}");
    let clusters = RedisClusters::start(5, 3, 0);
    let mut probe = Probe::new(&clusters);
    let urls = clusters.urls();
    let delay = Duration::from_millis(300);
    let (a, b, c) = (
        polling_manager(&urls, delay),
        polling_manager(&urls, delay),
        polling_manager(&urls, delay),
    );
    let mut worst = Duration::ZERO;
    for round in 0..5 {
        let res = resource(&format!("audit-62-{round}"));
        let held = a.lock(&res, HOLD).await.unwrap();
        let waiting = vec![
            waiter(&b, &res, PATIENCE, Duration::from_millis(20)),
            waiter(&b, &res, PATIENCE, Duration::from_millis(20)),
            waiter(&c, &res, PATIENCE, Duration::from_millis(20)),
        ];
        settle_waiters().await;
        let conns = blocking(|| probe.connections_received());
        let hellos = blocking(|| probe.calls("hello"));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let churn = blocking(|| probe.connections_received()) - conns;
        let hellos = blocking(|| probe.calls("hello")) - hellos;
        let released = Instant::now();
        // A quorum at least: beside CPU burners one of the 15 masters may
        // answer after the 500 ms node timeout (seen once: 4), and its
        // release is then owed (`nothing_left` below waits for it).
        let count = a.unlock(&held).await.unwrap();
        assert!(count >= 3, "released on {count} nodes");
        let delays = handoffs(released, turns(waiting).await);
        println!(
            "round {round}: hand-offs {delays:?}; in 2 s of waiting: {churn} connections, \
             {hellos} HELLO (RESP3 connections: the links')"
        );
        worst = worst.max(delays.iter().copied().max().unwrap());
        // A link denied its subscription waits 30 s before it tries again:
        // 2 s of waiting open (almost) no connection.
        assert!(churn <= 6, "the links reconnect in a loop: {churn}");
    }
    // Not woken by releases (none is heard), the waiters poll: the last
    // waiter of a key may wait a whole pause per hand-off before it.
    assert!(worst < Duration::from_secs(2), "worst hand-off {worst:?}");
    nothing_left(&clusters, &[&a, &b, &c]).await;
}

/// On Valkey 9.1 clusters, waiters are woken by the release (sharded
/// pub/sub), with three managers taking turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs REDIS_SERVER=\"$(scripts/valkey-server.sh)\""]
async fn on_valkey_9_waiters_are_woken_by_the_release() {
    let (major, text) = server_version();
    assert!(
        major >= 8 && text.to_lowercase().contains("valkey"),
        "run with a Valkey server: {text}"
    );
    let clusters = RedisClusters::start(5, 3, 0);
    let mut probe = Probe::new(&clusters);
    let urls = clusters.urls();
    let (a, b, c) = (manager(&urls), manager(&urls), manager(&urls));
    for round in 0..5 {
        let res = resource(&format!("audit-valkey-{round}"));
        let held = a.lock(&res, HOLD).await.unwrap();
        let waiting = vec![
            waiter(&b, &res, PATIENCE, Duration::from_millis(20)),
            waiter(&b, &res, PATIENCE, Duration::from_millis(20)),
            waiter(&c, &res, PATIENCE, Duration::from_millis(20)),
        ];
        settle_waiters().await;
        let before = clusters.holding(&res);
        let released = Instant::now();
        clusters.assert_released(a.unlock(&held).await.unwrap(), before);
        let delays = handoffs(released, turns(waiting).await);
        println!("round {round}: hand-offs {delays:?}");
        assert!(delays.iter().all(|d| *d < WOKEN), "{delays:?}");
    }
    let spublish = blocking(|| probe.calls("spublish"));
    println!("SPUBLISH calls {spublish}");
    assert!(spublish > 0);
    nothing_left(&clusters, &[&a, &b, &c]).await;
}

// ---------------------------------------------------------------------
// Scenario 5: managers and runtimes that go away.
// ---------------------------------------------------------------------

/// A manager dropped while 50 of its waiters wait (their tasks aborted):
/// its subscription connections close and every master is back to the
/// connections it had before the manager existed (the holder's aside).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_manager_closes_its_subscription_connections() {
    let clusters = RedisClusters::start(5, 3, 0);
    let mut probe = Probe::new(&clusters);
    let urls = clusters.urls();
    let holder = manager(&urls);
    let names: Vec<String> = (0..10)
        .map(|i| resource(&format!("audit-drop-{i}")))
        .collect();
    let mut held = Vec::new();
    for k in &names {
        held.push(holder.lock(k, HOLD).await.unwrap());
    }
    let baseline = blocking(|| probe.clients());
    let w = manager(&urls);
    let mut waiting = Vec::new();
    for k in &names {
        for _ in 0..5 {
            waiting.push(waiter(&w, k, PATIENCE, Duration::ZERO));
        }
    }
    let want = 2 * names.len() * clusters.len();
    let deadline = Instant::now() + Duration::from_secs(10);
    while blocking(|| probe.shard_channels()) < want {
        assert!(Instant::now() < deadline, "not subscribed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let during = blocking(|| probe.clients());
    println!("clients per master: before {baseline:?}, while waiting {during:?}");
    for w in &waiting {
        w.abort();
    }
    for w in waiting {
        let _ = w.await;
    }
    drop(w);
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        let now = blocking(|| probe.clients());
        let channels = blocking(|| probe.shard_channels());
        if now == baseline && channels == 0 {
            break now;
        }
        if Instant::now() > deadline {
            break now;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let channels = blocking(|| probe.shard_channels());
    println!("after the drop: {after:?}, {channels} channels");
    assert_eq!(
        after, baseline,
        "connections left behind by the dropped manager"
    );
    assert_eq!(channels, 0, "subscriptions left behind");
    for l in &held {
        holder.unlock(l).await.unwrap();
    }
    nothing_left(&clusters, &[&holder]).await;
}

/// A manager made outside any runtime is used by a runtime whose waiters
/// are mid-wait when it shuts down, then by a second runtime: the second
/// runtime's waiter is woken by the release (the link is made again
/// there), and when the manager is dropped every master is back to its
/// baseline.
#[test]
fn a_manager_outlives_a_runtime_shut_down_mid_wait() {
    let clusters = RedisClusters::start(5, 3, 0);
    let mut probe = Probe::new(&clusters);
    let urls = clusters.urls();
    let holder = manager(&urls);
    let w = manager(&urls);
    let res = resource("audit-runtimes");
    let rt = |threads| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
            .unwrap()
    };
    let main = rt(1);
    let held = main.block_on(holder.lock(&res, HOLD)).unwrap();
    let baseline = probe.clients();
    {
        let first = rt(2);
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let (w, res) = (w.clone(), res.clone());
                first.spawn(async move { w.lock_within(&res, HOLD, PATIENCE).await })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(1000));
        assert_eq!(
            probe.shard_channels(),
            2 * 5,
            "the first runtime subscribed"
        );
        first.shutdown_timeout(Duration::from_secs(1));
        drop(handles);
    }
    std::thread::sleep(Duration::from_millis(500));
    let channels = probe.shard_channels();
    println!("after the first runtime shut down: {channels} channels");
    assert_eq!(channels, 0, "a dead runtime's subscriptions stay");
    let second = rt(2);
    let took = second.block_on(async {
        let waiting = {
            let (w, res) = (w.clone(), res.clone());
            tokio::spawn(async move { w.lock_within(&res, HOLD, PATIENCE).await })
        };
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let released = Instant::now();
        holder.unlock(&held).await.unwrap();
        let lock = waiting.await.unwrap().expect("woken in the second runtime");
        let took = released.elapsed();
        w.unlock(&lock).await.unwrap();
        took
    });
    println!("the second runtime's waiter took it {took:?} after the release");
    assert!(took < WOKEN, "not woken by the release: {took:?}");
    drop(second);
    drop(w);
    std::thread::sleep(Duration::from_millis(1000));
    let after = probe.clients();
    println!("clients per master: baseline {baseline:?}, after {after:?}");
    assert_eq!(after, baseline, "connections left behind");
    drop(main);
}

/// One manager shared by two live runtimes (a `static` manager used by
/// two `#[tokio::test]`s at once): the link runs on the runtime of the
/// first waiter. When that runtime shuts down while the other's waiters
/// wait, those waiters must still be woken by the release.
#[test]
fn a_link_spawned_on_a_runtime_that_shuts_down_leaves_other_runtimes_deaf() {
    let clusters = RedisClusters::start(5, 3, 0);
    let urls = clusters.urls();
    let holder = manager(&urls);
    let w = manager(&urls);
    let res = resource("audit-two-runtimes");
    let rt = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };
    let main = rt();
    let held = main.block_on(holder.lock(&res, HOLD)).unwrap();
    let first = rt();
    let second = rt();
    // The first runtime's waiter starts the links.
    let _early = {
        let (w, res) = (w.clone(), res.clone());
        first.spawn(async move { w.lock_within(&res, HOLD, PATIENCE).await })
    };
    std::thread::sleep(Duration::from_millis(800));
    let later = {
        let (w, res) = (w.clone(), res.clone());
        second.spawn(async move {
            let lock = w.lock_within(&res, HOLD, PATIENCE).await;
            (lock, Instant::now())
        })
    };
    std::thread::sleep(Duration::from_millis(800));
    first.shutdown_timeout(Duration::from_secs(1));
    std::thread::sleep(Duration::from_millis(500));
    let released = Instant::now();
    main.block_on(holder.unlock(&held)).unwrap();
    let (lock, got) = second.block_on(later).unwrap();
    let took = lock.as_ref().map(|_| got - released);
    println!("the other runtime's waiter: {took:?}");
    assert!(
        took.as_ref().is_ok_and(|t| *t < WOKEN),
        "not woken by the release: {took:?}"
    );
}

// ---------------------------------------------------------------------
// Scenario 6: an ACL that denies sharded channels.
// ---------------------------------------------------------------------

/// A lock user on every master whose ACL allows the lock keys and the
/// commands but no channel (`resetchannels`): subscriptions are refused
/// (`NOPERM`), waiters fall back to the timed retry, releases still
/// succeed, and the links do not reconnect in a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_without_sharded_channels_falls_back_to_the_timed_retry() {
    acl_fallback(&["on", ">pw", "~*", "resetchannels", "+@all"]).await;
}

/// The same with every channel allowed but the `SSUBSCRIBE` command
/// denied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_without_ssubscribe_falls_back_to_the_timed_retry() {
    acl_fallback(&["on", ">pw", "~*", "allchannels", "+@all", "-ssubscribe"]).await;
}

async fn acl_fallback(rule: &[&str]) {
    let clusters = RedisClusters::start(5, 3, 0);
    let mut probe = Probe::new(&clusters);
    let mut urls = Vec::new();
    for cluster in clusters.iter() {
        for m in 0..cluster.masters() {
            let mut conn = cluster.master_conn(m);
            let _: () = redis::cmd("ACL")
                .arg("SETUSER")
                .arg("locker")
                .arg(rule)
                .query(&mut conn)
                .unwrap();
        }
        urls.push(
            cluster
                .url()
                .replacen("redis+cluster://", "redis+cluster://locker:pw@", 1),
        );
    }
    let delay = Duration::from_millis(300);
    let (a, b, c) = (
        polling_manager(&urls, delay),
        polling_manager(&urls, delay),
        polling_manager(&urls, delay),
    );
    let mut worst = Duration::ZERO;
    for round in 0..3 {
        let res = resource(&format!("audit-acl-{round}"));
        let held = a.lock(&res, HOLD).await.unwrap();
        let waiting = vec![
            waiter(&b, &res, PATIENCE, Duration::from_millis(20)),
            waiter(&b, &res, PATIENCE, Duration::from_millis(20)),
            waiter(&c, &res, PATIENCE, Duration::from_millis(20)),
        ];
        settle_waiters().await;
        let conns = blocking(|| probe.connections_received());
        let hellos = blocking(|| probe.calls("hello"));
        tokio::time::sleep(Duration::from_secs(3)).await;
        let churn = blocking(|| probe.connections_received()) - conns;
        let hellos = blocking(|| probe.calls("hello")) - hellos;
        let released = Instant::now();
        // A quorum at least: beside CPU burners one of the 15 masters may
        // answer after the 500 ms node timeout (seen once: 4), and its
        // release is then owed (`nothing_left` below waits for it).
        let count = a.unlock(&held).await.unwrap();
        assert!(count >= 3, "released on {count} nodes");
        let delays = handoffs(released, turns(waiting).await);
        println!(
            "round {round}: hand-offs {delays:?}; in 3 s of waiting: {churn} connections, \
             {hellos} HELLO (RESP3 connections: the links')"
        );
        worst = worst.max(delays.iter().copied().max().unwrap());
        assert!(churn <= 6, "the links reconnect in a loop: {churn}");
    }
    assert!(worst < Duration::from_secs(2), "worst hand-off {worst:?}");
    assert_eq!(blocking(|| probe.shard_channels()), 0);
    nothing_left(&clusters, &[&a, &b, &c]).await;
}

// ---------------------------------------------------------------------
// Scenario 7: what the code suggests.
// ---------------------------------------------------------------------

/// Waiters that come and go on the same keys, as a lock convoy does: a
/// key's last waiter leaves (its channels are unsubscribed) and the next
/// one comes before the link has read the server's confirmations of that
/// unsubscription, which are pushes too (redis-rs hands every
/// subscription confirmation to the push sender). The link must not take
/// its own `SUNSUBSCRIBE` confirmation for a channel it subscribed again
/// as the server ending it (`Event::Dropped`), which ends the session,
/// wakes every waiter and subscribes everything again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_of_waiters_does_not_restart_sessions() {
    let clusters = RedisClusters::start(5, 3, 0);
    let mut probe = Probe::new(&clusters);
    let urls = clusters.urls();
    let managers: Vec<Redlock> = (0..2).map(|_| manager(&urls)).collect();
    let names: Vec<String> = (0..6)
        .map(|i| resource(&format!("audit-churn-{i}")))
        .collect();
    // Connections made (request and subscription) before the count.
    for m in &managers {
        let l = m.lock(&names[0], HOLD).await.unwrap();
        let waiting = waiter(m, &names[0], PATIENCE, Duration::ZERO);
        tokio::time::sleep(Duration::from_millis(500)).await;
        m.unlock(&l).await.unwrap();
        waiting.await.unwrap().unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = blocking(|| probe.connections_received());
    let ssub_before = blocking(|| probe.calls("ssubscribe"));
    let hello_before = blocking(|| probe.calls("hello"));
    let stop = Instant::now() + Duration::from_secs(10);
    let served = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for m in &managers {
        for t in 0..4 {
            let (m, names, served) = (m.clone(), names.clone(), served.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = t;
                let mut worst = Duration::ZERO;
                while Instant::now() < stop {
                    let k = &names[i % names.len()];
                    i += 1;
                    let asked = Instant::now();
                    let lock = m
                        .lock_within(k, Duration::from_secs(20), Duration::from_secs(25))
                        .await
                        .unwrap();
                    worst = worst.max(asked.elapsed());
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    m.unlock(&lock).await.unwrap();
                    served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                worst
            }));
        }
    }
    let mut worst = Duration::ZERO;
    for t in tasks {
        worst = worst.max(t.await.unwrap());
    }
    let after = blocking(|| probe.connections_received());
    let ssub = blocking(|| probe.calls("ssubscribe")) - ssub_before;
    let new = after - before;
    let sessions = (blocking(|| probe.calls("hello")) - hello_before) / 3;
    println!(
        "{} locks served in 10 s, worst wait {worst:?}; connections opened by the managers: {new}; \
         subscription sessions made {sessions}; SSUBSCRIBE calls {ssub}",
        served.load(std::sync::atomic::Ordering::Relaxed)
    );
    assert_eq!(sessions, 0, "subscription sessions were made again");
}

/// What the churn above costs the other waiters of the manager: each
/// session made again wakes every waiter (twice: when it ends and when the
/// new one is up), and each woken waiter tries once more, on every
/// cluster. Twenty waiters on keys of one slot (their master counts their
/// `SET`s alone) sleep behind a holder while the same manager contends on
/// a hot key of another master; they should not try at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_on_one_key_does_not_wake_waiters_of_other_keys() {
    let clusters = RedisClusters::start(5, 3, 0);
    let mut probe = Probe::new(&clusters);
    let urls = clusters.urls();
    let holder = manager(&urls);
    let w = manager(&urls);
    let tag = format!("{{{}}}", resource("audit-quiet"));
    let quiet: Vec<String> = (0..20).map(|i| format!("{tag}:{i}")).collect();
    let quiet_masters: Vec<usize> = blocking(|| {
        clusters
            .iter()
            .map(|c| c.master_of(quiet[0].as_bytes()))
            .collect()
    });
    // A hot key on another master in every cluster.
    let hot = (0..)
        .map(|i| resource(&format!("audit-hot-{i}")))
        .find(|k| {
            blocking(|| {
                clusters
                    .iter()
                    .zip(&quiet_masters)
                    .all(|(c, q)| c.master_of(k.as_bytes()) != *q)
            })
        })
        .unwrap();
    let mut held = Vec::new();
    for k in &quiet {
        held.push(holder.lock(k, HOLD).await.unwrap());
    }
    let sleepers: Vec<_> = quiet
        .iter()
        .map(|k| waiter(&w, k, Duration::from_secs(40), Duration::ZERO))
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let quiet_sets = |probe: &mut Probe| -> u64 {
        probe
            .conns
            .iter_mut()
            .zip(&quiet_masters)
            .map(|(conns, q)| {
                let info: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query(conns[*q].as_mut().unwrap())
                    .unwrap();
                info.lines()
                    .filter_map(|l| l.strip_prefix("cmdstat_set:calls="))
                    .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
                    .sum::<u64>()
            })
            .sum()
    };
    let before = blocking(|| quiet_sets(&mut probe));
    let hello_before = blocking(|| probe.calls("hello"));
    // Churn: the same manager takes the hot key again and again, with a
    // second manager contending so that it waits each time.
    let other = manager(&urls);
    let stop = Instant::now() + Duration::from_secs(8);
    let mut tasks = Vec::new();
    for m in [w.clone(), w.clone(), other.clone(), other.clone()] {
        let hot = hot.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < stop {
                let l = m
                    .lock_within(&hot, Duration::from_secs(20), Duration::from_secs(25))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
                m.unlock(&l).await.unwrap();
                n += 1;
            }
            n
        }));
    }
    let mut served = 0;
    for t in tasks {
        served += t.await.unwrap();
    }
    let sets = blocking(|| quiet_sets(&mut probe)) - before;
    let sessions = (blocking(|| probe.calls("hello")) - hello_before) / 3;
    println!(
        "{served} hot locks; the 20 sleepers tried {sets} times (SETs on their masters); \
         subscription sessions made {sessions}"
    );
    assert_eq!(sets, 0, "the sleepers on other keys were woken");
    for l in &held {
        holder.unlock(l).await.unwrap();
    }
    for s in sleepers {
        s.await.unwrap().unwrap();
    }
}

// ---------------------------------------------------------------------
// Scenario 3, the two causes apart, on one cluster (a quorum of one).
// ---------------------------------------------------------------------

/// The name of the waiting protocol (`K`, `0xFF`, then `suffix`) in the
/// slot of lock key `K`, as the crate names it on a cluster node.
fn in_slot_of(key: &str, suffix: &[u8]) -> Vec<u8> {
    let slot = RedisCluster::slot(key.as_bytes());
    let tag = (0u64..)
        .map(|n| n.to_string())
        .find(|t| RedisCluster::slot(t.as_bytes()) == slot)
        .unwrap();
    let mut name = format!("{{{tag}}}{key}").into_bytes();
    name.push(0xFF);
    name.extend_from_slice(suffix);
    name
}

/// A raw RESP2 connection subscribed (`SSUBSCRIBE`) to `channel` on the
/// server at `port`: it says whether anything was published there.
fn raw_subscriber(port: u16, channel: &[u8]) -> std::net::TcpStream {
    use std::io::{Read, Write};
    let mut sub = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut command = format!("*2\r\n$10\r\nSSUBSCRIBE\r\n${}\r\n", channel.len()).into_bytes();
    command.extend_from_slice(channel);
    command.extend_from_slice(b"\r\n");
    sub.write_all(&command).unwrap();
    sub.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = sub.read(&mut buf).unwrap();
    assert!(
        buf[..n].windows(10).any(|w| w == b"ssubscribe"),
        "subscribed"
    );
    sub
}

/// Whether `sub` received a sharded message within its read timeout.
fn heard(sub: &mut std::net::TcpStream) -> bool {
    use std::io::Read;
    let mut buf = [0u8; 4096];
    let mut got = false;
    while let Ok(n) = sub.read(&mut buf) {
        if n == 0 {
            break;
        }
        got |= buf[..n].windows(8).any(|w| w == b"smessage");
    }
    got
}

/// A lock key that moved to the importing master with its slot's keys
/// (`MIGRATE`, before `SETSLOT NODE`) is released there (redis-rs follows
/// the source's `ASK`). The slot's sharded channels are still served by
/// the source until the migration ends, and the waiters subscribe there;
/// the unlock script, on the target, sees no subscriber of the channel
/// (`PUBSUB SHARDNUMSUB` counts the target's own) and publishes nothing.
/// A subscriber of the channel on the source must hear the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "audit finding: fails (no release published from the importing master); see report"]
async fn a_release_on_the_importing_master_is_published_where_waiters_listen() {
    let clusters = RedisClusters::start(1, 3, 0);
    let urls = clusters.urls();
    let a = manager(&urls);
    let res = resource("audit-importing");
    let held = a.lock(&res, HOLD).await.unwrap();
    let cluster = &clusters[0];
    let from = blocking(|| cluster.master_of(res.as_bytes()));
    let mut listener = raw_subscriber(cluster.master_port(from), &in_slot_of(&res, b"released"));
    let migration = cluster.begin_migration(res.as_bytes(), (from + 1) % 3);
    let moved = blocking(|| migration.move_keys());
    assert_eq!(moved, 1, "the lock key moved");
    assert_eq!(a.unlock(&held).await.unwrap(), 1, "released on the target");
    let published = blocking(|| heard(&mut listener));
    blocking(|| migration.finish());
    println!("moved {moved}; the release was heard on the source: {published}");
    assert!(
        published,
        "a release on the importing master reached no subscriber"
    );
}

/// A waiter woken by a release while its slot is half-way through a
/// migration (`MIGRATING` on the source; the key, released, is gone from
/// it): its attempt, `SET … NX PX … GET` with `PTTL` behind it in one
/// pipeline, is answered `ASK` by the source, which redis-rs does not
/// follow for that pipeline, so the cluster counts as busy; without a
/// quorum the waiter sleeps a whole `retry_delay`. (A first attempt, a
/// single `SET`, follows `ASK` and takes the lock.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_woken_while_its_slot_migrates_takes_the_lock() {
    let clusters = RedisClusters::start(1, 3, 0);
    let urls = clusters.urls();
    let (a, b) = (manager(&urls), manager(&urls));
    let res = resource("audit-migrating");
    let held = a.lock(&res, HOLD).await.unwrap();
    let cluster = &clusters[0];
    let from = blocking(|| cluster.master_of(res.as_bytes()));
    let mut listener = raw_subscriber(cluster.master_port(from), &in_slot_of(&res, b"released"));
    let migration = cluster.begin_migration(res.as_bytes(), (from + 1) % 3);
    let waiting = waiter(&b, &res, Duration::from_secs(12), Duration::from_millis(5));
    settle_waiters().await;
    let released = Instant::now();
    assert_eq!(a.unlock(&held).await.unwrap(), 1);
    let published = blocking(|| heard(&mut listener));
    let turn = waiting.await.unwrap().unwrap();
    let took = turn.got - released;
    blocking(|| migration.finish());
    println!("the release was published: {published}; the waiter took the lock {took:?} after it");
    assert!(published, "the release is published on the source");
    assert!(took < WOKEN, "woken, but its attempt failed: {took:?}");
}

// ---------------------------------------------------------------------
// A slot range without a master, on clusters that keep serving.
// ---------------------------------------------------------------------

/// Clusters that keep serving when a slot range has no master
/// (`cluster-require-full-coverage no`, common in production): the slot
/// master of key J dies on three of five clusters, with no replica. One
/// waiter of the manager waits on J (it cannot get a quorum); its
/// channel's subscription on those three clusters fails, over and over.
/// The other waiters of the manager, on a key K of a served slot, must
/// still be woken by K's release, and the links must not reconnect in a
/// loop: one unserved channel should not take the whole cluster's
/// subscriptions down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "audit finding: fails (one unserved slot keeps the cluster's session down, reconnecting every second); see report"]
async fn an_unserved_slot_does_not_take_the_other_subscriptions_down() {
    let mut clusters =
        RedisClusters::start_with(5, 3, 0, &["--cluster-require-full-coverage", "no"]);
    let urls = clusters.urls();
    let (a, b) = (manager(&urls), manager(&urls));
    let j = resource("audit-unserved-j");
    let k = (0..)
        .map(|i| resource(&format!("audit-served-{i}")))
        .find(|k| {
            blocking(|| {
                clusters
                    .iter()
                    .all(|c| c.master_of(k.as_bytes()) != c.master_of(j.as_bytes()))
            })
        })
        .unwrap();
    for i in 0..3 {
        let m = blocking(|| clusters[i].master_of(j.as_bytes()));
        clusters[i].kill_master(m);
    }
    // The live masters see the dead one failed (node timeout 1 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut probe = Probe::new(&clusters);
    let held = a.lock(&k, HOLD).await.unwrap();
    let stuck = {
        let (b, j) = (b.clone(), j.clone());
        tokio::spawn(async move { b.lock_within(&j, HOLD, Duration::from_secs(15)).await })
    };
    let waiting = vec![
        waiter(&b, &k, PATIENCE, Duration::from_millis(50)),
        waiter(&b, &k, PATIENCE, Duration::from_millis(50)),
    ];
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let hellos = blocking(|| probe.calls("hello"));
    tokio::time::sleep(Duration::from_secs(4)).await;
    let sessions = (blocking(|| probe.calls("hello")) - hellos) / 2;
    let before = clusters.holding(&k);
    let released = Instant::now();
    clusters.assert_released(a.unlock(&held).await.unwrap(), before);
    let delays = handoffs(released, turns(waiting).await);
    println!(
        "hand-offs on the served key {delays:?}; subscription connections made in 4 s \
         (two live masters per broken cluster): {sessions}"
    );
    stuck.abort();
    assert!(delays.iter().all(|d| *d < WOKEN), "{delays:?}");
    assert!(
        sessions <= 3,
        "{sessions} sessions in 4 s: the links reconnect in a loop"
    );
}
