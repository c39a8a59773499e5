//! Thirteenth audit: the send cutoff of an acquisition (`Settled::may_send`)
//! and the bounded wait for a node's earlier requests on a lock
//! (`earlier_settled` in `src/engine/call.rs`), against real
//! `redis-server` processes, every step under a timeout.

use std::time::{Duration, Instant};

use redlock_harness::proxy::{Fault, Proxy};
use redlock_harness::runtimes::{current_thread, multi_thread};
use redlock_harness::steps::{eventually, step};
use redlock_harness::{Cluster, releases_drained, resource, warm};
use redlock_quorum::Redlock;

const TTL: Duration = Duration::from_secs(30);
/// A lock on two resources (a script: its request on a node is sent again
/// after `NOSCRIPT`, so a later request there waits for it to settle) is
/// taken in `block_on` of a current-thread runtime with node 2 paused,
/// and extended there at once: the extension's request to node 2 waits
/// behind the acquisition's. That runtime is then not driven. The lock is
/// released from another runtime: the bounded wait fires on node 2, its
/// release is owed, node 2 resumes, the owed release is retried and
/// answered. Then the first runtime runs again, its extension goes out to
/// node 2 after the release, finds the keys missing and sets them again
/// (the extension's heal path) for a whole ttl.
///
/// At 63f38be (no bound) the release never ends while the first runtime
/// is not driven.
#[test]
fn an_extension_left_on_an_idle_runtime_sets_the_keys_again_after_the_release() {
    let mut cluster = Cluster::start(3);
    let redlock = Redlock::builder(cluster.urls().iter().map(String::as_str))
        .retry_count(0)
        .node_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(200))
        .build()
        .expect("valid");
    let idle = current_thread();
    let other = multi_thread();
    // Each runtime its own connections (the idle runtime's first: a
    // current-thread runtime's connection is not shared).
    idle.block_on(step("warm idle", warm(&redlock)));
    other.block_on(step("warm other", warm(&redlock)));
    let a = resource("ext-idle-a");
    let b = resource("ext-idle-b");
    cluster.node(2).pause();
    let lock = idle
        .block_on(step(
            "lock",
            redlock.try_lock([a.as_str(), b.as_str()], TTL),
        ))
        .expect("nodes 0 and 1");
    let lock = idle
        .block_on(step("extend", redlock.extend(&lock, TTL)))
        .expect("extended on nodes 0 and 1");
    // `idle` is not driven from here.
    let started = Instant::now();
    let released = other.block_on(step("unlock", redlock.unlock(&lock)));
    assert!(
        matches!(released, Ok(n) if n >= 2),
        "{released:?} after {:?}",
        started.elapsed()
    );
    cluster.node(2).resume();
    assert!(
        other.block_on(releases_drained(&redlock, Duration::from_secs(15))),
        "the owed release to node 2 was never answered"
    );
    assert!(
        cluster.nowhere(&a) && cluster.nowhere(&b),
        "released everywhere before the first runtime runs again"
    );
    // The first runtime runs again.
    idle.block_on(async { tokio::time::sleep(Duration::from_millis(1_000)).await });
    let left: Vec<i64> = [&a, &b].iter().map(|k| cluster.pttl_on(2, k)).collect();
    assert!(
        cluster.nowhere(&a) && cluster.nowhere(&b),
        "after a release that returned Ok and drained its owed retry, node 2 \
         holds the keys again (pttl {left:?}): the extension left waiting on \
         the idle runtime went out after the release"
    );
}

/// A lock taken in `block_on` of a current-thread runtime on a fresh
/// manager, with node 2 slow to connect (latency at its proxy): the
/// grant comes from nodes 0 and 1 while node 2's connection is being made
/// on that runtime, which is then not driven. Another runtime then locks
/// other resources: node 2 should take part (its connection is made on
/// that runtime), and the first lock's release from there should end, its
/// owed release to node 2 retried.
///
/// Node 2's connection attempt holds the node's dial gate (one attempt at
/// a time, over every runtime). Catches the wait for the gate without a
/// bound (every other runtime waited for it, uncounted), and a bound
/// past which the request fails instead of connecting (node 2 then lost
/// to every runtime while the first one sleeps).
#[test]
fn a_connection_left_on_an_idle_runtime_keeps_every_runtime_off_the_node() {
    let mut cluster = Cluster::start(3);
    let other = multi_thread();
    let proxy = other.block_on(Proxy::to_port(cluster.node(2).port()));
    let mut urls = cluster.urls()[..2].to_vec();
    urls.push(proxy.url());
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .retry_count(0)
        .node_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(2_000))
        .build()
        .expect("valid");
    proxy.set(Fault::Latency(Duration::from_millis(400)));
    let idle = current_thread();
    let name = resource("dial-idle");
    let lock = idle
        .block_on(step("lock", redlock.try_lock(&name, TTL)))
        .expect("nodes 0 and 1");
    assert!(!cluster.exists_on(2, &name), "node 2 still connecting");
    // `idle` is not driven from here.
    proxy.set(Fault::NONE);
    let mut on_node_2 = false;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !on_node_2 && Instant::now() < deadline {
        let other_name = resource("dial-other");
        let taken = other.block_on(step("lock from the other runtime", async {
            redlock.try_lock(&other_name, TTL).await
        }));
        if let Ok(taken) = taken {
            on_node_2 = cluster.exists_on(2, &other_name);
            let _ = other.block_on(step("unlock other", redlock.unlock(&taken)));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let stats = redlock.stats();
    let started = Instant::now();
    let released = other.block_on(async {
        tokio::time::timeout(Duration::from_secs(20), redlock.unlock(&lock)).await
    });
    let took = started.elapsed();
    let drained = other.block_on(releases_drained(&redlock, Duration::from_secs(5)));
    // Let the first runtime finish what it left before the asserts.
    idle.block_on(async { tokio::time::sleep(Duration::from_millis(2_000)).await });
    assert!(
        on_node_2,
        "no lock taken from the other runtime reached node 2 in 10 s while the \
         idle runtime's connection attempt holds its gate (failures {:?}; then \
         the idle lock's release from there: {released:?} in {took:?}, owed release \
         drained in 5 s: {drained})",
        stats.node_failures
    );
    assert!(
        matches!(released, Ok(Ok(n)) if n >= 2),
        "release: {released:?}"
    );
    assert!(drained, "owed release to node 2 never retried");
    assert!(
        eventually(Duration::from_secs(5), || cluster.nowhere(&name)),
        "a key was left"
    );
}

/// A release queued on the same (shared) connection behind node 2's `SET`
/// of a lock taken on a current-thread runtime that is then not driven:
/// the release is answered (it deleted the key, after the `SET`), then
/// waits for the `SET`'s future to settle, which never happens there. It
/// should count node 2 as released; after the bound it counts it as timed
/// out, owes it a release, and the caller waits the whole bound.
#[test]
fn a_release_answered_behind_an_idle_runtimes_set_counts_as_released() {
    let mut cluster = Cluster::start(3);
    let other = multi_thread();
    let proxy = other.block_on(Proxy::to_port(cluster.node(2).port()));
    let mut urls = cluster.urls()[..2].to_vec();
    urls.push(proxy.url());
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .retry_count(0)
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("valid");
    // The multi-thread runtime's connections, shared with the idle one.
    other.block_on(step("warm", warm(&redlock)));
    let idle = current_thread();
    proxy.set(Fault::Latency(Duration::from_millis(100)));
    let name = resource("answered-idle");
    let lock = idle
        .block_on(step("lock", redlock.try_lock(&name, TTL)))
        .expect("nodes 0 and 1");
    let started = Instant::now();
    let released = other.block_on(step("unlock", redlock.unlock(&lock)));
    let took = started.elapsed();
    let owed = redlock.pending_releases();
    idle.block_on(async { tokio::time::sleep(Duration::from_millis(500)).await });
    proxy.set(Fault::NONE);
    assert!(
        eventually(Duration::from_secs(5), || cluster.nowhere(&name)),
        "a key was left"
    );
    assert!(
        matches!(released, Ok(3)) && owed == 0,
        "release {released:?} after {took:?}, {owed} owed: node 2 answered the \
         release (queued behind the SET), yet it counts as timed out"
    );
}

/// The send cutoff on first use: a fresh manager (no warm-up, every
/// connection being made by the acquisition) takes a lock on three
/// resources, on a multi-thread and on a current-thread runtime, and sets
/// the keys on every node.
#[test]
fn a_fresh_managers_first_lock_sets_its_keys_on_every_node() {
    let cluster = Cluster::start(3);
    for round in 0..6 {
        let runtime = match round % 2 {
            0 => multi_thread(),
            _ => current_thread(),
        };
        let redlock = Redlock::builder(cluster.urls().iter().map(String::as_str))
            .retry_count(0)
            .build()
            .expect("valid");
        let names: Vec<String> = (0..3)
            .map(|i| resource(&format!("fresh-{round}-{i}")))
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let lock = runtime.block_on(step("lock", async {
            tokio::spawn({
                let redlock = redlock.clone();
                let refs: Vec<String> = refs.iter().map(|s| s.to_string()).collect();
                async move {
                    let refs: Vec<&str> = refs.iter().map(String::as_str).collect();
                    redlock.try_lock(refs.as_slice(), TTL).await
                }
            })
            .await
            .expect("task")
        }));
        let lock = lock.unwrap_or_else(|e| panic!("round {round}: {e}"));
        for (i, name) in names.iter().enumerate() {
            for node in 0..3 {
                assert!(
                    eventually(Duration::from_secs(2), || cluster.exists_on(node, name)),
                    "round {round}: key {i} missing on node {node}"
                );
            }
        }
        runtime
            .block_on(step("unlock", redlock.unlock(&lock)))
            .expect("released");
    }
}

/// The send cutoff after a restart: node 2 is restarted just before each
/// acquisition (the request finds its connection broken and is sent again
/// on a fresh one, within the round's deadline); the lock holds node 2
/// too, and nothing is left after the release.
#[test]
fn a_lock_right_after_a_restart_sets_the_restarted_node() {
    let mut cluster = Cluster::start(3);
    let runtime = multi_thread();
    let redlock = Redlock::builder(cluster.urls().iter().map(String::as_str))
        .retry_count(0)
        .node_timeout(Duration::from_millis(500))
        .build()
        .expect("valid");
    runtime.block_on(step("warm", warm(&redlock)));
    let mut on_node_2 = 0;
    for round in 0..5 {
        cluster.node(2).restart();
        let name = resource(&format!("restarted-{round}"));
        let lock = runtime
            .block_on(step("lock", redlock.try_lock(&name, TTL)))
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        if eventually(Duration::from_secs(2), || cluster.exists_on(2, &name)) {
            on_node_2 += 1;
        }
        runtime
            .block_on(step("unlock", redlock.unlock(&lock)))
            .expect("released");
        assert!(
            eventually(Duration::from_secs(5), || cluster.nowhere(&name)),
            "round {round}: a key was left"
        );
    }
    assert_eq!(on_node_2, 5, "the restarted node missed the lock");
}

/// The restart guard on a fresh manager: once the nodes' markers are
/// old enough, a new manager's first lock (its connections being made,
/// the guarded script sent) sets the keys on every node.
#[test]
fn a_guarded_fresh_managers_first_lock_sets_its_keys_on_every_node() {
    let cluster = Cluster::start(3);
    let runtime = multi_thread();
    let guard = Duration::from_millis(1_500);
    let first = Redlock::builder(cluster.urls().iter().map(String::as_str))
        .retry_count(0)
        .restart_guard(guard)
        .build()
        .expect("valid");
    // Makes the markers.
    let _ = runtime.block_on(step("markers", first.try_lock(&resource("marker"), guard)));
    std::thread::sleep(guard + Duration::from_millis(500));
    for round in 0..4 {
        let redlock = Redlock::builder(cluster.urls().iter().map(String::as_str))
            .retry_count(0)
            .restart_guard(guard)
            .build()
            .expect("valid");
        let name = resource(&format!("guarded-{round}"));
        let other = resource(&format!("guarded-{round}-b"));
        let lock = runtime
            .block_on(step(
                "lock",
                redlock.try_lock(&name, Duration::from_secs(1)),
            ))
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let many = runtime
            .block_on(step(
                "lock two",
                redlock.try_lock([name.as_str(), other.as_str()], Duration::from_secs(1)),
            ))
            .err();
        for node in 0..3 {
            assert!(
                eventually(Duration::from_secs(2), || cluster.exists_on(node, &name)),
                "round {round}: missing on node {node}"
            );
        }
        assert!(many.is_some(), "round {round}: the held key locked twice");
        runtime
            .block_on(step("unlock", redlock.unlock(&lock)))
            .expect("released");
        assert!(
            eventually(Duration::from_secs(5), || cluster.nowhere(&name)
                && cluster.nowhere(&other)),
            "round {round}: a key was left"
        );
    }
}

/// The send cutoff with a ttl below the node timeout: node 2 restarted
/// just before each acquisition (its request sent again on a fresh
/// connection). Whatever the outcome, no key shows up on any node once
/// twice the ttl has passed: no `SET` is sent after the keys' expiry, and
/// one sent just before it lives one ttl from then.
#[test]
fn a_short_ttl_lock_after_a_restart_leaves_no_key_past_its_ttl() {
    let mut cluster = Cluster::start(3);
    let runtime = multi_thread();
    let redlock = Redlock::builder(cluster.urls().iter().map(String::as_str))
        .retry_count(0)
        .node_timeout(Duration::from_millis(200))
        .build()
        .expect("valid");
    runtime.block_on(step("warm", warm(&redlock)));
    let ttl = Duration::from_millis(40);
    let mut granted = 0;
    for round in 0..8 {
        cluster.node(2).restart();
        let name = resource(&format!("short-{round}"));
        let started = Instant::now();
        let outcome = runtime.block_on(step("lock", redlock.try_lock(&name, ttl)));
        granted += usize::from(outcome.is_ok());
        // Past twice the ttl from the attempt's start, with a margin.
        std::thread::sleep(
            (started + 2 * ttl + Duration::from_millis(100))
                .saturating_duration_since(Instant::now()),
        );
        let seen = (0..15).any(|_| {
            let seen = !cluster.nowhere(&name);
            std::thread::sleep(Duration::from_millis(20));
            seen
        });
        assert!(!seen, "round {round} ({outcome:?}): a key past the ttl");
    }
    assert!(granted > 0, "no short lock granted in 8 rounds");
}
