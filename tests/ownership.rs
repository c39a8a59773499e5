//! Ownership: only the token's holder releases or extends, extension keeps a
//! lock alive, the scripts survive a flushed script cache, `verify` tells
//! whether a lock is still held, and `adopt` rebuilds a lock from its token.

use std::time::Duration;

use redlock_harness::{Cluster, resource};
use redlock_quorum::Error;

const TTL: Duration = Duration::from_secs(10);

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
        let left = cluster.pttl_on(i, &res);
        assert!(
            left > 0 && left <= 60_000,
            "expiry untouched on node {i}: {left}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_keeps_the_lock_past_its_original_ttl() {
    let cluster = Cluster::shared(5);
    // a generous node timeout: under load a 50 ms timeout turns b's
    // conflict into NoQuorum, which says nothing about the lock
    let (a, b) = (
        cluster
            .builder()
            .node_timeout(Duration::from_secs(1))
            .build()
            .unwrap(),
        cluster
            .builder()
            .node_timeout(Duration::from_secs(1))
            .build()
            .unwrap(),
    );
    let res = resource("extend");
    // each extension comes half a ttl after the one before: a loaded
    // machine may delay it by up to another half before the lock expires
    let ttl = Duration::from_millis(1200);
    let mut lock = a.try_lock(&res, ttl).await.unwrap();
    let first_expiry = lock.expires_at();

    for _ in 0..4 {
        tokio::time::sleep(ttl / 2).await;
        let extended = a.extend(&lock, ttl).await.expect("still ours");
        assert!(
            extended.expires_at() > lock.expires_at(),
            "validity moves forward"
        );
        assert_eq!(extended.token(), lock.token(), "same token");
        assert!(extended.validity() <= ttl);
        lock = extended;
    }
    // two ttls after the original ttl began, still held
    assert!(std::time::Instant::now() > first_expiry);
    let other = b.try_lock(&res, ttl).await;
    assert!(
        matches!(other, Err(Error::Conflict { .. })),
        "b during a's extended lock (still valid: {}): {other:?}",
        lock.is_valid()
    );
    assert_eq!(cluster.count(&res, lock.token()), 5);
    a.unlock(&lock).await.unwrap();
}

/// Waits until every node holds `token` under `key`: calls that return at
/// the quorum leave the slower nodes' requests in flight.
fn wait_for_all(cluster: &Cluster, key: &str, token: &str) {
    assert!(
        cluster.eventually(Duration::from_secs(5), |c| c.count(key, token) == c.len()),
        "not every node got {token}: {:?}",
        cluster.values(key)
    );
}

/// Expires `key` on every node now, as the nodes do when a ttl runs out.
fn expire_on_nodes(cluster: &Cluster, key: &str) {
    for i in 0..cluster.len() {
        let _: i64 = redis::cmd("PEXPIRE")
            .arg(key)
            .arg(1)
            .query(&mut cluster.conn(i))
            .unwrap();
    }
    assert!(cluster.eventually(Duration::from_secs(5), |c| c.values(key) == vec![None; 5]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_after_expiry_is_not_held_and_spares_the_new_holder() {
    let cluster = Cluster::shared(5);
    let (a, b) = (cluster.redlock(), cluster.redlock());
    let res = resource("extend-expired");

    // The nodes let a's keys expire and b takes over, while a's handle is
    // still valid on a's clock (as when the nodes' clocks ran fast): the
    // client cannot refuse the extension itself, the nodes must.
    let old = a.try_lock(&res, TTL).await.unwrap();
    wait_for_all(&cluster, &res, old.token());
    expire_on_nodes(&cluster, &res);
    let new = b.try_lock(&res, TTL).await.expect("expired, so free");
    wait_for_all(&cluster, &res, new.token());
    assert!(old.is_valid(), "the extension must reach the nodes");
    let err = a
        .extend(&old, Duration::from_secs(60))
        .await
        .expect_err("not ours on the nodes");
    assert!(matches!(err, Error::NotHeld { .. }), "{err}");
    // the new holder's keys keep their value and their expiry (not a's 60 s);
    // a's requests to the two slower nodes may still be in flight: look twice
    for _ in 0..2 {
        assert_eq!(cluster.count(&res, new.token()), 5);
        for i in 0..5 {
            let left = cluster.pttl_on(i, &res);
            assert!(
                left > 0 && left <= TTL.as_millis() as i64,
                "expiry untouched on node {i}: {left}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.unlock(&new).await.unwrap();

    // An extension of a lock whose keys are gone creates nothing, decided by
    // the nodes too (the handle is still valid on the client).
    let gone = a.try_lock(&res, TTL).await.unwrap();
    wait_for_all(&cluster, &res, gone.token());
    expire_on_nodes(&cluster, &res);
    assert!(gone.is_valid(), "the extension must reach the nodes");
    let err = a.extend(&gone, TTL).await.expect_err("no key to extend");
    assert!(matches!(err, Error::NotHeld { .. }), "{err}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(cluster.values(&res), vec![None; 5], "no key recreated");

    // And once the handle itself has expired, the client refuses at once.
    let short = a.try_lock(&res, Duration::from_millis(200)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let err = a.extend(&short, TTL).await.expect_err("expired");
    assert!(matches!(err, Error::NotHeld { .. }), "{err}");
    assert!(
        cluster.eventually(Duration::from_secs(5), |c| c.values(&res) == vec![None; 5]),
        "no key recreated: {:?}",
        cluster.values(&res)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_extension_deletes_nothing_that_is_still_ours() {
    let cluster = Cluster::shared(5);
    let redlock = cluster.redlock();
    let res = resource("extend-fail");
    let lock = redlock.try_lock(&res, TTL).await.unwrap();
    wait_for_all(&cluster, &res, lock.token());
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
    // extend returned at the quorum; the slower nodes' extensions (each
    // loading the flushed script first) finish on their own
    assert!(
        cluster.eventually(Duration::from_secs(5), |c| (0..c.len())
            .all(|i| c.pttl_on(i, &res) > 10_000)),
        "the extension reached every node: {:?}",
        (0..5).map(|i| cluster.pttl_on(i, &res)).collect::<Vec<_>>()
    );
    flush();
    assert_eq!(redlock.unlock(&lock).await.expect("unlock after flush"), 5);
    assert_eq!(cluster.values(&res), vec![None; 5]);
}

/// A remote check of whether a lock is still held, and a lock
/// rebuilt from a token that another process handed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_checks_the_holder_and_adopt_rebuilds_a_lock_from_its_token() {
    let cluster = Cluster::start(5);
    let (a, b) = (cluster.redlock(), cluster.redlock());
    let res = resource("verify");
    let lock = a.try_lock(&res, TTL).await.unwrap();
    assert!(a.verify(&lock).await.unwrap());

    // another process takes over the lock by its token
    let adopted = b.adopt(&res, lock.token()).unwrap();
    assert_eq!(adopted.validity(), Duration::ZERO, "validity unknown");
    assert!(b.verify(&adopted).await.unwrap());
    let extended = b.extend(&adopted, TTL).await.unwrap();
    assert!(extended.validity() > Duration::from_secs(9));
    assert_eq!(b.unlock(&extended).await.unwrap(), 5);
    assert!(!a.verify(&lock).await.unwrap(), "released by the adopter");
    assert!(matches!(
        a.extend(&lock, TTL).await,
        Err(Error::NotHeld { .. })
    ));

    // a wrong token adopts nothing it can use
    let lock = a.try_lock(&res, TTL).await.unwrap();
    let forged = b.adopt(&res, "not-the-token").unwrap();
    assert!(!b.verify(&forged).await.unwrap());
    assert!(matches!(
        b.unlock(&forged).await,
        Err(Error::NotHeld { .. })
    ));
    assert!(cluster.eventually(Duration::from_secs(5), |c| c.count(&res, lock.token()) == 5));
    assert!(matches!(b.adopt("", "t"), Err(Error::EmptyResource)));
    assert!(matches!(b.adopt(&res, ""), Err(Error::InvalidToken { .. })));
    // A short token is shown in part, without panicking.
    let short = b.adopt(&res, "abc").unwrap();
    assert!(format!("{short:?}").contains("abc…"));
    a.unlock(&lock).await.unwrap();

    // A set is adopted by its names, in the holder's order.
    let (x, y) = (resource("adopt-x"), resource("adopt-y"));
    let set = a.try_lock([&x, &y], TTL).await.unwrap();
    // `try_lock` returns at a quorum: the other nodes' requests may still
    // be on their way, and another manager's release does not wait for
    // them (seen under load: released on 4, the fifth set afterwards).
    assert!(cluster.eventually(Duration::from_secs(5), |c| {
        c.count(&x, set.token()) == 5 && c.count(&y, set.token()) == 5
    }));
    let adopted = b.adopt([&x, &y], set.token()).unwrap();
    assert_eq!(adopted.resources().collect::<Vec<_>>(), [&x, &y]);
    assert!(b.verify(&adopted).await.unwrap());
    assert_eq!(b.unlock(&adopted).await.unwrap(), 5);
    assert!(cluster.nowhere(&x) && cluster.nowhere(&y));
    assert!(matches!(
        b.adopt([&x, &x], "t"),
        Err(Error::DuplicateResource { .. })
    ));
}
