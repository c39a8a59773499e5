//! Ownership: only the token's holder releases or extends, extension keeps a
//! lock alive, and the scripts survive a flushed script cache.

mod support;

use std::time::Duration;

use redlock_quorum::Error;
use support::{Cluster, resource};

const TTL: Duration = Duration::from_secs(10);

fn pttl(cluster: &Cluster, i: usize, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut cluster.conn(i))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_and_extend_with_a_foreign_token_leave_the_keys_untouched() {
    let cluster = Cluster::shared(5);
    let redlock = cluster.redlock();
    let res = resource("foreign");
    let lock = redlock.try_lock(&res, TTL).await.unwrap();

    // Someone else's value on every node (as after expiry and takeover).
    cluster.plant(
        &[0, 1, 2, 3, 4],
        &res,
        "other-holder",
        Duration::from_secs(60),
    );

    let err = redlock
        .extend(&lock, Duration::from_secs(120))
        .await
        .expect_err("not ours");
    assert!(matches!(err, Error::NotHeld { .. }), "{err}");
    let err = redlock.unlock(&lock).await.expect_err("not ours");
    assert!(matches!(err, Error::NotHeld { .. }), "{err}");

    assert_eq!(cluster.count(&res, "other-holder"), 5, "values untouched");
    for i in 0..5 {
        let left = pttl(&cluster, i, &res);
        assert!(
            left > 0 && left <= 60_000,
            "expiry untouched on node {i}: {left}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_keeps_the_lock_past_its_original_ttl() {
    let cluster = Cluster::shared(5);
    let (a, b) = (cluster.redlock(), cluster.redlock());
    let res = resource("extend");
    let ttl = Duration::from_millis(400);
    let mut lock = a.try_lock(&res, ttl).await.unwrap();
    let first_expiry = lock.expires_at();

    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let extended = a.extend(&lock, ttl).await.expect("still ours");
        assert!(
            extended.expires_at() > lock.expires_at(),
            "validity moves forward"
        );
        assert_eq!(extended.token(), lock.token(), "same token");
        assert!(extended.validity() <= ttl);
        lock = extended;
    }
    // 800 ms after the original 400 ms ttl began, still held
    assert!(std::time::Instant::now() > first_expiry);
    assert!(matches!(
        b.try_lock(&res, ttl).await,
        Err(Error::Conflict { .. })
    ));
    assert_eq!(cluster.count(&res, lock.token()), 5);
    a.unlock(&lock).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_after_expiry_is_not_held_and_spares_the_new_holder() {
    let cluster = Cluster::shared(5);
    let (a, b) = (cluster.redlock(), cluster.redlock());
    let res = resource("extend-expired");
    let ttl = Duration::from_millis(200);
    let old = a.try_lock(&res, ttl).await.unwrap();
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;
    let new = b.try_lock(&res, TTL).await.expect("expired, so free");

    let err = a.extend(&old, TTL).await.expect_err("expired");
    assert!(matches!(err, Error::NotHeld { .. }), "{err}");
    assert_eq!(cluster.count(&res, new.token()), 5);
    b.unlock(&new).await.unwrap();

    // extend of an expired lock whose keys are gone creates nothing
    let gone = a.try_lock(&res, ttl).await.unwrap();
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;
    assert!(a.extend(&gone, TTL).await.is_err());
    assert_eq!(cluster.values(&res), vec![None; 5], "no key recreated");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_extension_deletes_nothing_that_is_still_ours() {
    let cluster = Cluster::shared(5);
    let redlock = cluster.redlock();
    let res = resource("extend-fail");
    let lock = redlock.try_lock(&res, TTL).await.unwrap();
    // a majority taken over by another value: the extension must fail, and
    // the two nodes still ours keep our key (other clients delete it there)
    cluster.plant(&[0, 1, 2], &res, "other-holder", TTL);
    let err = redlock
        .extend(&lock, TTL)
        .await
        .expect_err("lost the majority");
    assert!(matches!(err, Error::NotHeld { .. }), "{err}");
    let values = cluster.values(&res);
    assert_eq!(values[3].as_deref(), Some(lock.token()));
    assert_eq!(values[4].as_deref(), Some(lock.token()));
    assert_eq!(cluster.count(&res, "other-holder"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_and_extend_survive_a_flushed_script_cache() {
    let cluster = Cluster::shared(5);
    let redlock = cluster.redlock();
    let res = resource("flush");
    // run both scripts once so their SHA is cached, then flush every node
    let lock = redlock.try_lock(&res, TTL).await.unwrap();
    let lock = redlock.extend(&lock, TTL).await.unwrap();
    redlock.unlock(&lock).await.unwrap();
    let flush = || {
        for i in 0..cluster.len() {
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query(&mut cluster.conn(i))
                .unwrap();
        }
    };

    let lock = redlock.try_lock(&res, TTL).await.unwrap();
    flush();
    let lock = redlock
        .extend(&lock, Duration::from_secs(20))
        .await
        .expect("extend after flush");
    assert!(
        pttl(&cluster, 0, &res) > 10_000,
        "the extension reached the node"
    );
    flush();
    assert_eq!(redlock.unlock(&lock).await.expect("unlock after flush"), 5);
    assert_eq!(cluster.values(&res), vec![None; 5]);
}
