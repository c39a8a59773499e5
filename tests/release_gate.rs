//! The release's gate, on real servers: a release that nobody waits for
//! costs the node what the classic token-checked unlock costs (no
//! `PUBSUB NUMSUB`, no `PUBLISH`), and a release made while managers wait
//! publishes, the second one as much as the first (the flag that opens the
//! gate is set again for the managers the first one did not wake).
//!
//! As in `tests/wait.rs`, the waiters' timed retry and the holders' ttl are
//! far longer than a hand-off is allowed: only a published release can
//! explain a grant in time.

use std::time::{Duration, Instant};

use redlock_harness::{Cluster, keys, resource};
use redlock_quorum::Redlock;

/// The holders' ttl.
const TTL: Duration = Duration::from_secs(30);
/// The waiters' timed retry.
const POLL: Duration = Duration::from_secs(30);
/// A hand-off within this of the release came from a notification.
const NOTIFIED: Duration = Duration::from_secs(5);
/// How long a waiter waits: longer than [`NOTIFIED`] (twice: two hand-offs
/// in a row), far shorter than [`POLL`] and [`TTL`].
const PATIENCE: Duration = Duration::from_secs(15);

fn slow_poller(cluster: &Cluster) -> Redlock {
    cluster
        .builder()
        .retry_delay(POLL)
        .retry_jitter(Duration::ZERO)
        .build()
        .unwrap()
}

/// Whether, within 5 s, every node counts `managers` subscribers of
/// `key`'s release channel and has its waiting flag.
fn waiting_everywhere(cluster: &Cluster, key: &str, managers: i64) -> bool {
    cluster.eventually(Duration::from_secs(5), |c| {
        (0..c.len()).all(|i| c.subscribers(i, key) == managers && c.flagged(i, key))
    })
}

/// `cycles` uncontended `try_lock` + `unlock` of `res`; then, on every
/// node, how many `PUBSUB NUMSUB` and `PUBLISH` calls they cost (the
/// unlocks are checked to have reached the nodes: the test can fail).
async fn uncontended(cluster: &Cluster, redlock: &Redlock, res: &str, cycles: u64) -> Vec<u64> {
    cluster.reset_stats();
    for _ in 0..cycles {
        let lock = redlock.try_lock(res, TTL).await.unwrap();
        redlock.unlock(&lock).await.unwrap();
    }
    (0..cluster.len())
        .map(|i| {
            // Every release ran on every node (the script, or its load
            // and run again after `NOSCRIPT`).
            assert!(cluster.calls(i, "evalsha") >= cycles, "node {i}");
            cluster.calls(i, "pubsub|numsub") + cluster.calls(i, "publish")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_nobody_waits_for_neither_asks_nor_publishes() {
    let cluster = Cluster::start(3);
    let holder = cluster.redlock();
    let res = resource("gate");
    assert_eq!(
        uncontended(&cluster, &holder, &res, 20).await,
        vec![0; 3],
        "no waiter ever: the gate is the DEL's count"
    );

    // A waiter flags the key on every node while it waits.
    let waiter = slow_poller(&cluster);
    let lock = holder.lock(&res, TTL).await.unwrap();
    let waiting = {
        let (waiter, res) = (waiter.clone(), res.clone());
        tokio::spawn(async move { waiter.lock_within(&res, TTL, PATIENCE).await })
    };
    assert!(
        waiting_everywhere(&cluster, &res, 1),
        "the waiter subscribed and flagged the key on every node"
    );
    let released = Instant::now();
    holder.unlock(&lock).await.unwrap();
    let lock = waiting.await.unwrap().expect("woken by the release");
    assert!(released.elapsed() < NOTIFIED, "{:?}", released.elapsed());
    waiter.unlock(&lock).await.unwrap();

    // Once nobody subscribes, the next release leaves the flag deleted,
    // and releases are cheap again.
    assert!(cluster.eventually(Duration::from_secs(5), |c| {
        (0..c.len()).all(|i| c.subscribers(i, &res) == 0)
    }));
    let lock = holder.try_lock(&res, TTL).await.unwrap();
    holder.unlock(&lock).await.unwrap();
    for i in 0..cluster.len() {
        assert!(!cluster.flagged(i, &res), "node {i}: the flag is gone");
    }
    assert_eq!(
        uncontended(&cluster, &holder, &res, 20).await,
        vec![0; 3],
        "after the waiters left"
    );
}

/// Two managers wait; the holder's release wakes one of them (the one it
/// names), which holds the lock half a second (past the releaser's hand-off
/// check, which would otherwise publish again) and releases. That second
/// release must wake the other manager: the first one deleted the flag with
/// the key, and set it again because a manager still subscribed. Without
/// that, the second release finds no flag, publishes nothing, and the other
/// manager sleeps until its 30 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_release_wakes_a_manager_while_managers_wait() {
    let cluster = Cluster::start(3);
    let holder = cluster.redlock();
    for round in 0..3 {
        let res = resource(&format!("successive-{round}"));
        let lock = holder.lock(&res, TTL).await.unwrap();
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (waiter, res) = (slow_poller(&cluster), res.clone());
                tokio::spawn(async move {
                    let lock = waiter.lock_within(&res, TTL, PATIENCE).await?;
                    let got = Instant::now();
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    waiter.unlock(&lock).await?;
                    Ok::<_, redlock_quorum::Error>(got)
                })
            })
            .collect();
        assert!(
            waiting_everywhere(&cluster, &res, 2),
            "round {round}: both managers subscribed and flagged"
        );
        // Their registrations (sent after the subscriptions) land.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        holder.unlock(&lock).await.unwrap();
        let mut grants = Vec::new();
        for waiter in waiters {
            let got = waiter.await.unwrap().unwrap_or_else(|e| {
                panic!("round {round}: a waiting manager missed a release: {e}")
            });
            grants.push(got - released);
        }
        grants.sort();
        println!("round {round}: grants after the first release {grants:?}");
        assert!(
            grants[1] < NOTIFIED * 2,
            "round {round}: the second manager was woken by the second release: {grants:?}"
        );
    }
}

/// A flag lost while a manager waits (evicted under `maxmemory`, flushed,
/// or lapsed while the node stood still): the holder's release finds none
/// and publishes nothing, and the manager's next renewal of the flag (every
/// 2 s) finds it gone, sets it again and wakes its waiters, which try
/// again. Without that, the waiter sleeps until its 30 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flag_lost_while_waiting_wakes_the_waiter_at_the_next_renewal() {
    let cluster = Cluster::start(3);
    let holder = cluster.redlock();
    let waiter = slow_poller(&cluster);
    let res = resource("lost-flag");
    let lock = holder.lock(&res, TTL).await.unwrap();
    let waiting = {
        let (waiter, res) = (waiter.clone(), res.clone());
        tokio::spawn(async move { waiter.lock_within(&res, TTL, PATIENCE).await })
    };
    assert!(
        waiting_everywhere(&cluster, &res, 1),
        "the waiter subscribed and flagged the key on every node"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..cluster.len() {
        let _: i64 = redis::cmd("DEL")
            .arg(keys::waiting(&res))
            .query(&mut cluster.conn(i))
            .unwrap();
    }
    cluster.reset_stats();
    let released = Instant::now();
    holder.unlock(&lock).await.unwrap();
    for i in 0..cluster.len() {
        assert_eq!(
            cluster.calls(i, "publish"),
            0,
            "node {i}: no flag, no publish"
        );
    }
    let lock = waiting.await.unwrap().expect("woken after the renewal");
    let gap = released.elapsed();
    println!("flag lost: release -> grant {gap:?}");
    assert!(
        gap < NOTIFIED,
        "woken by the renewal, not the 30 s poll: {gap:?}"
    );
    // (The other nodes' links set their flags again at their own
    // renewals: a node's flag may be missing while the granted waiter's
    // subscription there is still being ended.)
    waiter.unlock(&lock).await.unwrap();
}
