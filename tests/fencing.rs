//! Fencing tokens grow with every holder, survive a minority of nodes losing
//! their counters, and are given only to the lock's holder.

use std::time::Duration;

use redlock_harness::{Cluster, resource};
use redlock_quorum::Error;

const TTL: Duration = Duration::from_secs(10);

/// The fencing counter's key: the lock key, the byte 0xFF, `fence`.
fn fence_key(lock_key: &str) -> Vec<u8> {
    let mut key = lock_key.as_bytes().to_vec();
    key.push(0xFF);
    key.extend_from_slice(b"fence");
    key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_grow_with_every_holder() {
    let cluster = Cluster::shared(5);
    let res = resource("fence-grow");
    let mut last = 0;
    for holder in 0..20 {
        let redlock = cluster.redlock(); // each holder its own client
        let lock = redlock.lock(&res, TTL).await.unwrap();
        let token = redlock.fencing_token(&lock).await.unwrap();
        assert!(token > last, "holder {holder}: {token} after {last}");
        last = token;
        redlock.unlock(&lock).await.unwrap();
    }
    assert_eq!(last, 20, "one step per holder");
    // the counter lives beside the lock key, without expiry, under a name
    // that no resource's lock key can have
    let key = fence_key(&res);
    assert!(cluster.eventually(Duration::from_secs(2), |c| {
        (0..5).all(|i| {
            let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut c.conn(i)).unwrap();
            pttl == -1
        })
    }));
    let old_layout: Option<String> = redis::cmd("GET")
        .arg(format!("{res}:fence"))
        .query(&mut cluster.conn(0))
        .unwrap();
    assert_eq!(old_layout, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_growing_when_a_minority_forgets_its_counters() {
    let mut cluster = Cluster::start(5);
    let res = resource("fence-restart");
    let mut last = 0;
    for round in 0..6 {
        let redlock = cluster.builder().retry_count(50).build().unwrap();
        let lock = redlock.lock(&res, TTL).await.unwrap();
        let token = redlock.fencing_token(&lock).await.unwrap();
        assert!(token > last, "round {round}: {token} after {last}");
        last = token;
        redlock.unlock(&lock).await.unwrap();
        // two nodes restart empty (no persistence): their counters are gone
        let a = round % 5;
        cluster.node(a).restart();
        cluster.node((a + 2) % 5).restart();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_holder_gets_a_token() {
    let cluster = Cluster::shared(5);
    let redlock = cluster.redlock();
    let res = resource("fence-holder");
    let fence_key = fence_key(&res);
    // A counter holds `<number>:<generation>`; the number is compared.
    let counters = |c: &Cluster| -> Vec<Option<String>> {
        (0..5)
            .map(|i| {
                let stored: Option<String> = redis::cmd("GET")
                    .arg(&fence_key)
                    .query(&mut c.conn(i))
                    .unwrap();
                stored.map(|s| s.split(':').next().unwrap_or_default().to_owned())
            })
            .collect()
    };

    let lock = redlock.lock(&res, TTL).await.unwrap();
    assert_eq!(redlock.fencing_token(&lock).await.unwrap(), 1);
    // fencing_token returned once a quorum wrote the counter; the slower
    // nodes' writes land on their own
    let ones = vec![Some("1".to_owned()); 5];
    assert!(
        cluster.eventually(Duration::from_secs(2), |c| counters(c) == ones),
        "counters: {:?}",
        counters(&cluster)
    );
    // the key taken over by someone else on every node
    cluster.plant(&[0, 1, 2, 3, 4], &res, "other-holder", TTL);
    let err = redlock.fencing_token(&lock).await.expect_err("not ours");
    assert!(matches!(err, Error::NotHeld { .. }), "{err}");
    // the refused call's requests to the slower nodes may still be in
    // flight when it returns: look again after they had time to land
    for _ in 0..2 {
        assert_eq!(counters(&cluster), ones, "counters untouched");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // an expired lock gets nothing either
    let short = redlock
        .lock(&resource("fence-expired"), Duration::from_millis(50))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    let err = redlock.fencing_token(&short).await.expect_err("expired");
    assert!(matches!(err, Error::NotHeld { .. }), "{err}");
}
