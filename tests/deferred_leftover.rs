//! A lock on one resource taken in a task on a multi-thread runtime may
//! keep its granting round's requests to the slower nodes (the leftover)
//! until the lock is next used or dropped, instead of a task per
//! acquisition (`Deferred` in `src/engine/deferred.rs`). These tests hold
//! with the leftover kept and with `KEEP_LEFTOVERS` off; with it on, each
//! failed with the part it names removed:
//! - a reply that came in while the lock was held counts as an answer,
//!   not as a timeout, when the leftover is polled after its deadline;
//! - a lock taken on one runtime and released on another, after the first
//!   shut down, is released and panics nowhere;
//! - the release right behind a grant still goes after each slow node's
//!   `SET`;
//! - a release cancelled midway hands the leftover to a task;
//! - a lock taken from `block_on` finishes its leftover at once;
//! - a lock taken while a node's connection is being made anew (the node
//!   restarted) reaches that node while it is held;
//! - a leftover polled after the lock expired does not send its `SET`
//!   again on a fresh connection;
//! - a release that is polled once and then neither polled nor dropped
//!   does not hold up another release of the same lock.

use std::time::Duration;

use redlock_harness::proxy::{Fault, Proxy};
use redlock_harness::steps::{in_a_task, node_failures, three_with_a_slow_node, within};
use redlock_harness::{Cluster, resource, warm};
use redlock_quorum::Redlock;

const TTL: Duration = Duration::from_secs(10);

/// Node 2 answers 300 ms late, within the 1 s node timeout. The lock is
/// held 1.5 s, past the leftover's deadline, before its release polls the
/// leftover: the reply that came in meanwhile is an answer, so node 2
/// counts no failure and is not taken for silent (the release waits for
/// it and it releases there).
///
/// Catches a leftover whose timer is looked at before its replies (the
/// late poll then reports a timeout for a node that answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_came_while_the_lock_was_held_is_an_answer() {
    in_a_task(async move {
        let (cluster, _proxy, redlock) =
            three_with_a_slow_node(Duration::from_secs(1), Duration::from_millis(300)).await;
        for round in 0..3 {
            let name = resource(&format!("held-past-deadline-{round}"));
            let lock = redlock.try_lock(&name, TTL).await.expect("nodes 0 and 1");
            tokio::time::sleep(Duration::from_millis(1500)).await;
            assert!(cluster.exists_on(2, &name), "the SET reached node 2");
            assert_eq!(redlock.unlock(&lock).await.ok(), Some(3), "round {round}");
            assert!(cluster.nowhere(&name), "round {round}: a key was left");
        }
        assert_eq!(node_failures(&redlock), [0, 0, 0], "{:?}", redlock.stats());
    })
    .await;
}

/// A lock taken in a task of a runtime that then shuts down, with its
/// leftover still waiting for a slow node, is released from another
/// runtime: the release must not poll the dead runtime's timer (it hands
/// the leftover to that runtime, which drops it), must not panic or hang,
/// and releases the lock.
///
/// The runtime check it exercises is defensive: with it removed this test
/// passes too on Tokio 1.54 (the dead runtime's timer is not polled with
/// a request still pending there), so it guards the release across
/// runtimes, not that check.
#[test]
fn a_lock_released_on_another_runtime_after_its_own_shut_down() {
    let mut cluster = Cluster::start(3);
    let shared = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let proxy = shared.block_on(Proxy::to_port(cluster.node(2).port()));
    let mut urls = cluster.urls()[..2].to_vec();
    urls.push(proxy.url());
    let redlock = std::sync::Arc::new(
        Redlock::builder(urls.iter().map(String::as_str))
            .node_timeout(Duration::from_secs(1))
            .retry_count(0)
            .build()
            .unwrap(),
    );
    shared.block_on(warm(&redlock));
    proxy.set(Fault::Latency(Duration::from_millis(300)));
    for round in 0..3 {
        let name = resource(&format!("other-runtime-{round}"));
        // Taken in a task of a multi-thread runtime (where a lock keeps
        // its leftover), which is then shut down.
        let first = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let lock = first
            .block_on(first.spawn({
                let (redlock, name) = (redlock.clone(), name.clone());
                async move { redlock.try_lock(&name, TTL).await }
            }))
            .expect("the task ended")
            .expect("nodes 0 and 1");
        first.shutdown_timeout(Duration::from_secs(1));
        let released = shared.block_on(redlock.unlock(&lock));
        assert!(
            matches!(released, Ok(2) | Ok(3)),
            "round {round}: {released:?}"
        );
        assert!(
            !cluster.exists_on(0, &name) && !cluster.exists_on(1, &name),
            "round {round}: released on nodes 0 and 1"
        );
    }
    // Node 2's SETs landed after their releases there or before: either
    // way the releases owed to it, or the ttl, clear them.
    proxy.set(Fault::NONE);
}

/// Node 2 answers 50 ms late; 20 locks are each released right after the
/// grant, their leftovers still pending: each release goes behind the
/// slow node's `SET` (it finds and deletes the key there, 3 of 3) and
/// finishes the leftover itself, so that no key is left and nothing
/// counts as failing.
///
/// Catches a release that overtakes the leftover's `SET` (the key left on
/// node 2 for its ttl), and a leftover that nobody drives (the release
/// then waits for it without end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_right_behind_the_grant_goes_after_the_slow_set() {
    in_a_task(async move {
        let (cluster, _proxy, redlock) =
            three_with_a_slow_node(Duration::from_secs(2), Duration::from_millis(50)).await;
        let mut names = Vec::new();
        for i in 0..20 {
            let name = resource(&format!("right-behind-{i}"));
            let lock = redlock.try_lock(&name, TTL).await.expect("nodes 0 and 1");
            let started = std::time::Instant::now();
            let released = tokio::time::timeout(Duration::from_secs(5), redlock.unlock(&lock))
                .await
                .unwrap_or_else(|_| panic!("lock {i}: the release never ended"));
            assert_eq!(released.ok(), Some(3), "lock {i}");
            assert!(
                started.elapsed() < Duration::from_secs(1),
                "lock {i}: the release took {:?}",
                started.elapsed()
            );
            names.push(name);
        }
        for name in &names {
            assert!(cluster.nowhere(name), "{name} was left");
        }
        assert_eq!(node_failures(&redlock), [0, 0, 0], "{:?}", redlock.stats());
    })
    .await;
}

/// Node 2 paused. Each lock's release is cancelled 5 ms in, after its round
/// polled the lock's kept leftover (the request to node 2, pending until
/// the 500 ms node timeout): the round, dropped, hands it to a task, so
/// that node 2's timeout counts once per lock, although the lock is still
/// held (not dropped, not used again).
///
/// Catches a cancelled round that leaves the leftover it was polling
/// without anyone to finish it (no count until the lock is used again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_release_gives_the_leftover_back() {
    in_a_task(async move {
        let mut cluster = Cluster::start(3);
        let redlock = cluster
            .builder()
            .node_timeout(Duration::from_millis(500))
            .retry_count(0)
            .build()
            .unwrap();
        warm(&redlock).await;
        cluster.node(2).pause();
        let mut held = Vec::new();
        for i in 0..3 {
            let lock = redlock
                .try_lock(&resource(&format!("cancelled-release-{i}")), TTL)
                .await
                .expect("nodes 0 and 1");
            let cancelled =
                tokio::time::timeout(Duration::from_millis(5), redlock.unlock(&lock)).await;
            assert!(
                cancelled.is_err(),
                "lock {i}: the release waited for node 2"
            );
            held.push(lock);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while node_failures(&redlock)[2] < 3 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(node_failures(&redlock), [0, 0, 3], "{:?}", redlock.stats());
        cluster.node(2).resume();
        for lock in &held {
            let _ = redlock.unlock(lock).await;
        }
    })
    .await;
}

/// A lock taken from `block_on` on a current-thread runtime (a test's body,
/// a command-line tool) does not keep its leftover: node 2 paused, the
/// request to it times out in its own task while the lock is still held,
/// and counts at once. A leftover kept there could be left to a runtime
/// that never runs again (a new user's program hung so, releasing from a
/// second runtime after the first had shut down).
///
/// Catches a lock that keeps its leftover outside a multi-thread
/// runtime's task (the count comes only when the lock is used).
#[test]
fn a_lock_taken_from_block_on_finishes_its_leftover_at_once() {
    let mut cluster = Cluster::start(3);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let redlock = cluster
        .builder()
        .node_timeout(Duration::from_millis(500))
        .retry_count(0)
        .build()
        .unwrap();
    runtime.block_on(warm(&redlock));
    cluster.node(2).pause();
    runtime.block_on(async {
        let lock = redlock
            .try_lock(&resource("from-block-on"), TTL)
            .await
            .expect("nodes 0 and 1");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while node_failures(&redlock)[2] < 1 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            node_failures(&redlock),
            [0, 0, 1],
            "the held lock's request to the paused node did not count"
        );
        drop(lock);
    });
    cluster.node(2).resume();
}

/// Node 2 restarted (its connection broken) just before each lock is
/// taken, in a task: the request to it is still being sent again, on a
/// fresh connection, when the quorum of nodes 0 and 1 grants the lock.
/// Held and not used, the lock must reach node 2 within a second, as a
/// task would send it there: a leftover kept with such a request sends it
/// only when the lock is next used, and the key is on the quorum alone
/// meanwhile.
///
/// Catches keeping a leftover whose every request is not in its
/// connection's queue (`Settled::all_queued`), and a request to be sent
/// again that still looks queued while it connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_as_a_node_restarts_reaches_it_while_held() {
    in_a_task(async move {
        let mut cluster = Cluster::start(3);
        let redlock = cluster
            .builder()
            .node_timeout(Duration::from_secs(1))
            .retry_count(0)
            .build()
            .unwrap();
        warm(&redlock).await;
        for round in 0..3 {
            cluster.node(2).restart();
            // The old connection's end has reached the client.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let name = resource(&format!("restarted-{round}"));
            let lock = redlock.try_lock(&name, TTL).await.expect("a quorum");
            let reached = within(Duration::from_secs(1), || cluster.exists_on(2, &name)).await;
            assert!(reached, "round {round}: the held lock never reached node 2");
            assert!(redlock.unlock(&lock).await.is_ok(), "round {round}");
            assert!(cluster.nowhere(&name), "round {round}: a key was left");
        }
    })
    .await;
}

/// Node 2 paused, a lock (2 s ttl) is taken in a task: its `SET` to node 2
/// waits in the connection. Node 2 is then killed and started again
/// (empty), which breaks that connection, and the lock is dropped only
/// after it expired. Its leftover, polled then for the first time, must
/// not send the `SET` again on a fresh connection: node 2 would hold a
/// fresh key for a whole ttl, long after the lock's validity ended.
///
/// Catches a kept leftover's request sent again past its round's deadline
/// (`Settled::may_send_again`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leftover_polled_after_expiry_sends_nothing_again() {
    in_a_task(async move {
        let mut cluster = Cluster::start(3);
        let redlock = cluster
            .builder()
            .node_timeout(Duration::from_millis(300))
            .retry_count(0)
            .build()
            .unwrap();
        warm(&redlock).await;
        for round in 0..2 {
            cluster.node(2).pause();
            let name = resource(&format!("late-poll-{round}"));
            let lock = redlock
                .try_lock(&name, Duration::from_secs(2))
                .await
                .expect("nodes 0 and 1");
            cluster.node(2).restart();
            tokio::time::sleep(Duration::from_millis(2500)).await;
            drop(lock);
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert!(
                !cluster.exists_on(2, &name),
                "round {round}: node 2 holds a fresh key, pttl {} ms",
                cluster.pttl_on(2, &name)
            );
            assert!(cluster.nowhere(&name), "round {round}");
        }
    })
    .await;
}

/// Node 2 answers 300 ms late. A lock is taken in a task, and its release
/// is polled once, as by a task that then stops (its waker wakes nothing),
/// and kept, neither polled nor dropped (as a `select!` over `&mut`
/// leaves the branch that lost). It polled the lock's kept leftover, whose
/// `SET` to node 2 is still on its way. A release of a copy of the lock,
/// polled before the parked one in some rounds and after it in others,
/// must still end: the leftover's wake-ups reach it.
///
/// Catches a round that takes the leftover for itself while it runs (the
/// other release then waits for node 2's `SET` to settle without end, in
/// the rounds where the parked one polled first). It does not catch a
/// leftover polled with the last round's waker alone: here the other
/// release's own request to node 2, queued behind the leftover's, wakes
/// it. `Pollers` is for a request that waits for the leftover's to settle
/// instead (one sent again on a fresh connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_release_does_not_hold_up_another() {
    in_a_task(async move {
        let (cluster, _proxy, redlock) =
            three_with_a_slow_node(Duration::from_secs(1), Duration::from_millis(300)).await;
        for round in 0..4 {
            let name = resource(&format!("parked-{round}"));
            let lock = redlock.try_lock(&name, TTL).await.expect("nodes 0 and 1");
            let copy = lock.clone();
            let mut parked = Box::pin(redlock.unlock(&lock));
            let mut second = Box::pin(redlock.unlock(&copy));
            let parked_first = round % 2 == 0;
            if !parked_first {
                assert!(futures::poll!(second.as_mut()).is_pending(), "round {round}");
            }
            assert!(
                parked
                    .as_mut()
                    .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
                    .is_pending(),
                "round {round}: the release waits for node 2"
            );
            let second = tokio::time::timeout(Duration::from_secs(5), second).await;
            assert!(
                second.is_ok(),
                "round {round} (parked first: {parked_first}): the second release waited on the parked one"
            );
            drop(parked);
            let gone = within(Duration::from_secs(3), || cluster.nowhere(&name)).await;
            assert!(gone, "round {round}: a key was left");
        }
    })
    .await;
}
