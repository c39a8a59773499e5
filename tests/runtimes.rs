//! One manager used from several Tokio runtimes, against real
//! `redis-server` nodes that are paused (SIGSTOP) and resumed: a failure on
//! one runtime keeps another runtime's connection, a release sent from
//! another runtime is queued behind the lock's `SET` on the node, and the
//! releases owed when a runtime ends are still retried, and a manager whose
//! runtime shut down works on the next one from its first call.

use std::time::{Duration, Instant};

use redlock_harness::runtimes::{current_thread, multi_thread};
use redlock_harness::{Cluster, resource};
use redlock_quorum::Redlock;

const TTL: Duration = Duration::from_secs(10);

fn manager(cluster: &Cluster) -> Redlock {
    cluster
        .builder()
        .node_timeout(Duration::from_millis(100))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .expect("valid")
}

/// `total_connections_received` of the node behind `conn`.
fn connections_received(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("stats").query(conn).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("total_connections_received")
}

/// Lock on one runtime while a node is paused, unlock on another, keep the
/// node paused for twice the ttl, resume it. Before: the unlock's
/// connection attempt on the second runtime timed out and its failure path
/// dropped the first runtime's connection; the owed release's worker died
/// with the second runtime; the node then ran the lock's queued `SET` and
/// kept the key with a fresh ttl (PTTL 697 ms 300 ms after the resume), and
/// `pending_releases()` never went down. Now the unlock rides the first
/// (multi-thread, running) runtime's connection, queued behind that `SET`.
#[test]
fn a_release_from_another_runtime_follows_the_locks_set_on_a_paused_node() {
    let mut cluster = Cluster::start(3);
    let redlock = manager(&cluster);
    let ttl = Duration::from_secs(1);
    let first = multi_thread();
    first.block_on(redlock_harness::warm(&redlock));
    for round in 0..2 {
        let name = resource(&format!("two-runtimes-{round}"));
        cluster.node(2).pause();
        let paused = Instant::now();
        let lock = first
            .block_on(redlock.try_lock(&name, ttl))
            .expect("granted by two nodes");
        let second = current_thread();
        let released = second.block_on(redlock.unlock(&lock)).expect("unlock");
        drop(second);
        assert_eq!(released, 2);
        std::thread::sleep((ttl * 2).saturating_sub(paused.elapsed()));
        cluster.node(2).resume();
        std::thread::sleep(Duration::from_millis(300));
        let pttl = cluster.pttl_on(2, &name);
        assert_eq!(
            pttl, -2,
            "round {round}: the key is back on the resumed node with a fresh ttl"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while redlock.pending_releases() > 0 {
            assert!(
                Instant::now() < deadline,
                "round {round}: {} releases still owed",
                redlock.pending_releases()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A release owed from a runtime that then ends is retried anyway. Before:
/// its worker task was dropped with the runtime, and the release stayed
/// owed (48 of them for 30 s) while the key stayed for its whole ttl.
#[test]
fn a_release_owed_from_a_runtime_that_ended_is_still_retried() {
    let mut cluster = Cluster::start(3);
    let redlock = manager(&cluster);
    let ttl = Duration::from_secs(30);
    let name = resource("runtime-ended");
    let runtime = current_thread();
    runtime.block_on(redlock_harness::warm(&redlock));
    let lock = runtime
        .block_on(redlock.try_lock(&name, ttl))
        .expect("lock");
    cluster.node(2).pause();
    let released = runtime.block_on(redlock.unlock(&lock)).expect("unlock");
    assert_eq!(released, 2);
    assert_eq!(redlock.pending_releases(), 1);
    drop(runtime);
    cluster.node(2).resume();
    let resumed = Instant::now();
    assert!(
        cluster.eventually(Duration::from_secs(10), |c| {
            redlock.pending_releases() == 0 && c.value_on(2, &name).is_none()
        }),
        "after {:?}: {} owed, node 2 holds {:?} (ttl {ttl:?})",
        resumed.elapsed(),
        redlock.pending_releases(),
        cluster.value_on(2, &name)
    );
}

/// A connection attempt that fails on one runtime leaves another runtime's
/// connection alone. Before: the failure path dropped it, and that runtime
/// connected again (and lost the ordering behind its queued requests).
#[test]
fn a_failed_connection_on_one_runtime_keeps_anothers() {
    let mut cluster = Cluster::start(3);
    let redlock = manager(&cluster);
    // Current-thread runtimes: neither shares its connection.
    let first = current_thread();
    first.block_on(redlock_harness::warm(&redlock));
    cluster.node(2).pause();
    let second = current_thread();
    second.block_on(async {
        let lock = redlock
            .try_lock(&resource("other-runtime"), Duration::from_secs(5))
            .await
            .expect("granted by two nodes");
        let _ = redlock.unlock(&lock).await;
    });
    drop(second);
    cluster.node(2).resume();
    // Let the node accept and drop what the paused attempts left.
    std::thread::sleep(Duration::from_millis(300));
    let mut node = cluster.conn(2);
    let before = connections_received(&mut node);
    first.block_on(async {
        let lock = redlock
            .try_lock(&resource("first-runtime"), Duration::from_secs(5))
            .await
            .expect("lock");
        assert_eq!(redlock.unlock(&lock).await.expect("unlock"), 3);
    });
    assert_eq!(
        connections_received(&mut node) - before,
        0,
        "the first runtime connected again"
    );
}

/// Releases that become owed while their runtime shuts down. The owing
/// call starts the node's retry worker on the current runtime; a runtime
/// that is shutting down drops such a task at once, and the dropped worker
/// moves itself to the crate's own release runtime. Before, that move took
/// the lock of the node's queue, which the owing call still held: the
/// thread deadlocked on itself and the runtime's shutdown never ended (seen
/// once in `tests/observability.rs`, whose guard was released as its test
/// ended). Here one node is down, so every unlock owes it a release, and
/// runtimes are dropped while their unlocks run, at varying points.
#[test]
fn a_release_owed_while_its_runtime_shuts_down_does_not_hang_the_shutdown() {
    let mut cluster = Cluster::start(3);
    cluster.node(2).kill();
    let (done, finished) = std::sync::mpsc::channel();
    let urls = cluster.urls().to_vec();
    std::thread::spawn(move || {
        for round in 0..300u64 {
            // A fresh manager each round: its first owed release starts the
            // node's worker.
            let manager = Redlock::builder(urls.iter().map(String::as_str))
                .node_timeout(Duration::from_millis(100))
                .build()
                .expect("valid");
            let runtime = multi_thread();
            let lock = runtime
                .block_on(manager.lock(
                    &resource(&format!("shutdown-{round}")),
                    Duration::from_secs(2),
                ))
                .expect("two of three nodes are up");
            for _ in 0..4 {
                let (manager, lock) = (manager.clone(), lock.clone());
                runtime.spawn(async move {
                    let _ = manager.unlock(&lock).await;
                });
            }
            std::thread::sleep(Duration::from_micros(round * 37 % 1_500));
            drop(runtime);
        }
        let _ = done.send(());
    });
    finished
        .recv_timeout(Duration::from_secs(120))
        .expect("300 runtimes dropped while their unlocks ran: a shutdown hung");
}

/// A manager used on a runtime that has shut down works on the
/// next runtime from its first call.
#[test]
fn a_manager_works_on_a_second_runtime_from_its_first_call() {
    let cluster = Cluster::shared(5);
    let redlock = redlock_harness::manager(cluster.urls());
    let res = resource("two-runtimes");
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    first.block_on(async {
        let lock = redlock.try_lock(&res, TTL).await.expect("first runtime");
        redlock.unlock(&lock).await.expect("first runtime");
    });
    drop(first);
    let second = runtime();
    let outcome = second.block_on(async {
        let outcome = redlock.try_lock(&res, TTL).await;
        if let Ok(lock) = &outcome {
            redlock.unlock(lock).await.expect("second runtime");
        }
        outcome
    });
    assert!(
        outcome.is_ok(),
        "first call on the second runtime: {outcome:?}"
    );
}

/// A lock taken in `block_on` of a current-thread runtime that stays alive
/// but is not driven afterwards, with node 2's `SET` still pending at the
/// grant (left on that runtime, with the connection it rides), is released
/// from another runtime: the release ends, on nodes 0 and 1, with node 2
/// timed out (the wait for its `SET` to settle is bounded), and a second
/// release, once the first runtime ran again, clears node 2.
///
/// Catches the release's wait for the earlier requests without a bound:
/// it never ended (new users hit it in two passes, 2 in 5 runs with every
/// node healthy).
#[test]
fn a_lock_taken_on_an_idle_current_thread_runtime_is_released_from_another() {
    use redlock_harness::proxy::{Fault, Proxy};
    let mut cluster = Cluster::start(3);
    let other = multi_thread();
    let proxy = other.block_on(Proxy::to_port(cluster.node(2).port()));
    let mut urls = cluster.urls()[..2].to_vec();
    urls.push(proxy.url());
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .retry_count(0)
        .build()
        .expect("valid");
    let idle = current_thread();
    idle.block_on(redlock_harness::warm(&redlock));
    proxy.set(Fault::Latency(Duration::from_millis(5)));
    for round in 0..3 {
        let name = resource(&format!("idle-runtime-{round}"));
        let lock = idle
            .block_on(redlock.try_lock(&name, TTL))
            .expect("nodes 0 and 1");
        // `idle` is not driven from here: node 2's `SET` waits there.
        let started = Instant::now();
        let released = other
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(20), redlock.unlock(&lock)).await
            })
            .unwrap_or_else(|_| panic!("round {round}: the release never ended"));
        assert!(
            matches!(released, Ok(n) if n >= 2),
            "round {round}: {released:?} after {:?}",
            started.elapsed()
        );
        assert!(
            !cluster.exists_on(0, &name) && !cluster.exists_on(1, &name),
            "round {round}: released on nodes 0 and 1"
        );
        // The first runtime runs again: node 2's `SET` lands, and a second
        // release, behind it, clears it.
        idle.block_on(async { tokio::time::sleep(Duration::from_millis(500)).await });
        let again = other.block_on(async {
            tokio::time::timeout(Duration::from_secs(20), redlock.unlock(&lock)).await
        });
        assert!(
            again.is_ok(),
            "round {round}: the second release never ended"
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while !cluster.nowhere(&name) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(cluster.nowhere(&name), "round {round}: a key was left");
    }
    proxy.set(Fault::NONE);
}

/// A new runtime's first lock makes its connection to node 2 inside the
/// round, and that connection is slow to make (its handshake's replies
/// come 100 ms late, past the 50 ms node timeout, well within the 2 s
/// connect timeout): the quorum of nodes 0 and 1 grants the lock, and the
/// `SET` still goes to node 2 once connected, while the lock is held.
///
/// Catches a cutoff of that first send at the round's deadline (node 2
/// then never gets the key): only a send after the node's earlier
/// requests, or a second send, is bounded so; a first one is bounded by
/// the connect timeout (`SendUntil::first`).
#[test]
fn a_first_lock_on_a_new_runtime_reaches_a_node_slow_to_connect() {
    use redlock_harness::proxy::{Fault, Proxy};
    let mut cluster = Cluster::start(3);
    let proxies = multi_thread();
    let proxy = proxies.block_on(Proxy::to_port(cluster.node(2).port()));
    let mut urls = cluster.urls()[..2].to_vec();
    urls.push(proxy.url());
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(Duration::from_millis(50))
        .connect_timeout(Duration::from_secs(2))
        .retry_count(0)
        .build()
        .expect("valid");
    for round in 0..3 {
        // A current-thread runtime's connections are its own, and are
        // forgotten when it shuts down: each round's runtime makes new ones.
        let first = current_thread();
        first.block_on(redlock_harness::warm(&redlock));
        drop(first);
        proxy.set(Fault::Latency(Duration::from_millis(100)));
        let fresh = current_thread();
        let name = resource(&format!("slow-connect-{round}"));
        let lock = fresh
            .block_on(redlock.try_lock(&name, TTL))
            .expect("nodes 0 and 1");
        let reached = fresh.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !cluster.exists_on(2, &name) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            cluster.exists_on(2, &name)
        });
        assert!(reached, "round {round}: the held lock never reached node 2");
        proxy.set(Fault::NONE);
        let released = fresh.block_on(redlock.unlock(&lock));
        assert!(released.is_ok(), "round {round}: {released:?}");
        assert!(cluster.nowhere(&name), "round {round}: a key was left");
    }
}
