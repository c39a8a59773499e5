//! Audit of the release's gate (the waiting flag, `<lock key> 0xFF
//! waiting`) on its worst days, against real servers. Both tests failed on
//! the gate as first written (commits 1dde4e6 and 9ca3cca), and pass since
//! the fixes named below:
//!
//! - a waiting manager cut off from every node for longer than the flag's
//!   6 s lease, while the holder releases: the renewal that would find the
//!   flag gone times out (1 s) with its `SET … GET` still queued in the
//!   socket; it runs when the partition heals, sets the flag again, and
//!   its `nil` is read by nobody. Later renewals find the flag there, so
//!   the waiter is never woken and sleeps until its timed retry. Fixed:
//!   after a renewal whose reply was not read, the next one wakes every
//!   waiter of its keys (`engine::wait::side`).
//! - a user whose ACL key pattern covers the lock key but not its flag
//!   (`~app:lock1`) can no longer release at all: the unlock script's
//!   `redis.call("del", KEYS[1], flag)` raises `NOPERM` (before the gate,
//!   the script touched other keys only with `pcall`). Fixed: the flag's
//!   `DEL` is a `pcall`, and where it is refused the key is deleted alone
//!   and the gate is `PUBSUB NUMSUB`.
//!
//! The waiters' timed retry is 30 s, so only the event path explains a
//! grant within [`NOTIFIED`].

use std::time::{Duration, Instant};

use redlock_harness::proxy::{Fault, Proxy};
use redlock_harness::{Cluster, resource};
use redlock_quorum::Redlock;

const TTL: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_secs(30);
const NOTIFIED: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_during_a_partition_longer_than_the_lease_still_wakes_the_waiter() {
    let mut cluster = Cluster::start(3);
    let mut proxies = Vec::new();
    for i in 0..cluster.len() {
        proxies.push(Proxy::to_port(cluster.node(i).port()).await);
    }
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let holder = cluster.redlock();
    let waiter = Redlock::builder(urls.iter().map(String::as_str))
        .retry_delay(POLL)
        .retry_jitter(Duration::ZERO)
        .node_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let res = resource("gate-partition");
    let lock = holder.lock(&res, TTL).await.unwrap();
    let waiting = {
        let (waiter, res) = (waiter.clone(), res.clone());
        tokio::spawn(async move { waiter.lock_within(&res, TTL, Duration::from_secs(60)).await })
    };
    assert!(cluster.eventually(Duration::from_secs(10), |c| {
        (0..c.len()).all(|i| c.flagged(i, &res))
    }));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The waiter's manager is cut off from every node for 8 s (its flags
    // lapse after 6 s); the holder releases at 7 s, then the cut heals.
    for p in &proxies {
        p.set(Fault::Blackhole);
    }
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(
        (0..cluster.len()).all(|i| !cluster.flagged(i, &res)),
        "the flags lapsed"
    );
    holder.unlock(&lock).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    for p in &proxies {
        p.set(Fault::NONE);
    }
    let healed = Instant::now();
    let lock = waiting.await.unwrap().expect("granted");
    let gap = healed.elapsed();
    println!("partition 8 s: heal -> grant {gap:?}");
    assert!(
        gap < NOTIFIED,
        "the waiter slept until its timed retry: heal -> grant {gap:?}"
    );
    waiter.unlock(&lock).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_allowed_the_lock_key_alone_can_still_release() {
    let cluster = Cluster::start(3);
    let urls = cluster.acl_user(
        "exact",
        &[
            "on",
            ">pw",
            "resetkeys",
            "~app:lock1",
            "resetchannels",
            "&*",
            "+@all",
        ],
    );
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .key_prefix("app:")
        .node_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let lock = redlock.try_lock("lock1", TTL).await.unwrap();
    let released = redlock.unlock(&lock).await;
    assert!(
        matches!(released, Ok(3)),
        "an uncontended release under `~app:lock1`: {released:?}"
    );
    assert!(cluster.nowhere("app:lock1"));
}
