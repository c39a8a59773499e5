//! Extension: it is not refused while a quorum holds our token (nodes
//! restarted empty, one of ours paused), and an extension whose round ends
//! after the lock's validity ran out (the model's `watchdog = false`
//! schedule) must not report the lock held, nor leave our keys behind with
//! a fresh ttl.

use std::time::Duration;

use redlock_harness::{Cluster, manager, reach_every_node, resource};
use redlock_quorum::Error;

/// The lock's ttl. With a drift factor of 0.5 the client believes for half
/// of it while the nodes keep the keys for all of it: the window in which
/// the nodes still say "ours" to an extension although the lock ended, as
/// when node clocks run slow or the round is slow. The figures leave
/// seconds of margin on each side for a loaded machine.
const TTL: Duration = Duration::from_secs(8);

/// The ttl of a lock that stays held while nodes restart and pause.
const HELD_TTL: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_that_ends_after_the_validity_is_not_held_and_releases_its_keys() {
    let mut cluster = Cluster::start(3);
    let builder = || {
        cluster
            .builder()
            .drift_factor(0.5)
            // The paused nodes' requests wait for them instead of timing
            // out: the round lasts until they are resumed.
            .node_timeout(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let (a, b) = (builder(), builder());
    let res = resource("extend-lapsed");
    let lock = a.try_lock(&res, TTL).await.unwrap();
    assert!(
        cluster.eventually(Duration::from_secs(2), |c| c.count(&res, lock.token()) == 3),
        "not every node got the key: {:?}",
        cluster.values(&res)
    );
    // The validity is about 4 s (8 s − 4 s of drift allowance); the keys
    // live 8 s on the nodes.
    let validity = lock.validity();
    assert!(validity > Duration::from_secs(3), "validity {validity:?}");

    // Two of three nodes pause; the extension starts with 1.5 s of validity
    // left, and the only quorum it can get comes 1 s after the validity
    // ended (and 1.5 s before the extension's own validity would end, 3 s
    // before the keys expire on the nodes).
    cluster.node(1).pause();
    cluster.node(2).pause();
    tokio::time::sleep(lock.validity().saturating_sub(Duration::from_millis(1_500))).await;
    assert!(
        lock.is_valid(),
        "the extension must start while the lock is valid"
    );
    let extension = {
        let (a, lock) = (a.clone(), lock.clone());
        tokio::spawn(async move { a.extend(&lock, TTL).await })
    };
    tokio::time::sleep(lock.validity() + Duration::from_secs(1)).await;
    assert!(!lock.is_valid());
    cluster.node(1).resume();
    cluster.node(2).resume();
    let result = extension.await.unwrap();

    let err = result.expect_err("the lock ended while the extension ran: it must not come back");
    assert!(matches!(err, Error::NotHeld { .. }), "{err}");
    // The keys the extension renewed (with a fresh 8 s ttl) are released,
    // so nobody waits for a lock that nobody holds.
    assert!(
        cluster.eventually(Duration::from_secs(2), |c| c.count(&res, lock.token()) == 0),
        "stale keys of the lapsed lock: {:?}",
        cluster.values(&res)
    );
    let next = b
        .try_lock(&res, TTL)
        .await
        .expect("free once the lapsed lock's keys are released");
    b.unlock(&next).await.unwrap();
}

/// `extend` must not say `NotHeld` while our token is still on a
/// quorum (two nodes restarted empty, one of ours paused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_is_not_refused_while_a_quorum_holds_our_token() {
    let mut cluster = Cluster::start(5);
    let redlock = cluster
        .builder()
        .node_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    cluster.node(3).kill();
    cluster.node(4).kill();
    let res = resource("extend-split");
    let lock = redlock.try_lock(&res, HELD_TTL).await.expect("3 of 5 up");
    cluster.node(3).restart();
    cluster.node(4).restart();
    reach_every_node(&redlock).await;
    assert_eq!(cluster.count(&res, lock.token()), 3, "on nodes 0, 1, 2");

    cluster.node(2).pause();
    let extended = redlock.extend(&lock, HELD_TTL).await;
    let second = manager(cluster.urls()).try_lock(&res, HELD_TTL).await;
    cluster.node(2).resume();
    assert!(
        !matches!(extended, Err(Error::NotHeld { .. })),
        "extend said NotHeld while nodes 0, 1 and the paused 2 hold our token"
    );
    assert!(
        matches!(second, Err(Error::Conflict { .. })),
        "a second client got {second:?}"
    );
}
