//! Fencing tokens grow with every holder, survive a minority of nodes losing
//! their counters, and are given only to the lock's holder. One counter per
//! node serves every resource: a name never used before gets a token while a
//! node is down, names leave no key behind, and a resource named like a
//! counter is an ordinary lock.

use std::time::{Duration, Instant};

use redlock_harness::{Cluster, keys, manager, resource};
use redlock_quorum::{Error, Redlock};

const TTL: Duration = Duration::from_secs(10);

/// Node `i`'s counter as stored: `<number>:<generation>` when trusted, a
/// bare `<number>` when not, `None` when missing.
fn stored(cluster: &Cluster, i: usize, prefix: &str) -> Option<String> {
    cluster.get_on(i, keys::counter(prefix))
}

/// The number of a stored counter.
fn number(stored: &str) -> u64 {
    stored.split(':').next().unwrap().parse().unwrap()
}

/// One holder of `name`: lock, token, unlock.
async fn token_of(redlock: &Redlock, name: &str) -> Result<u64, Error> {
    let lock = redlock.lock(name, TTL).await?;
    let token = redlock.fencing_token(&lock).await;
    let _ = redlock.unlock(&lock).await;
    token
}

/// Takes tokens (on a name of their own) with every node answering until
/// every node's counter is trusted: on brand-new nodes that is once their
/// generation markers, made by the first token, are a few seconds old.
/// Whether they all were within 30 s.
async fn trust_every_node(cluster: &Cluster, redlock: &Redlock, prefix: &str) -> bool {
    let warm = resource("fence-warm");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        token_of(redlock, &warm).await.expect("every node answers");
        let all =
            (0..cluster.len()).all(|i| stored(cluster, i, prefix).is_some_and(|s| s.contains(':')));
        if all || Instant::now() > deadline {
            return all;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_grow_with_every_holder() {
    let cluster = Cluster::shared(5);
    let res = resource("fence-grow");
    // A prefix of its own: a counter of its own, even on shared nodes.
    let prefix = format!("{res}/");
    let mut last = 0;
    for holder in 0..20 {
        // each holder its own client
        let redlock = cluster.builder().key_prefix(&prefix).build().unwrap();
        let lock = redlock.lock(&res, TTL).await.unwrap();
        let token = redlock.fencing_token(&lock).await.unwrap();
        assert!(token > last, "holder {holder}: {token} after {last}");
        last = token;
        redlock.unlock(&lock).await.unwrap();
    }
    assert_eq!(last, 20, "one step per holder");
    // the counter is one key per prefix, without expiry, under a name that
    // no resource's lock key can have; no key per resource
    let key = keys::counter(&prefix);
    assert!(cluster.eventually(Duration::from_secs(2), |c| { c.pttls(&key) == vec![-1; 5] }));
    for old_layout in [
        format!("{prefix}{res}:fence").into_bytes(),
        keys::legacy_counter(&format!("{prefix}{res}")),
    ] {
        assert!(!cluster.exists_on(0, &old_layout));
    }
}

/// With one of five nodes stopped, a name never used before gets a token.
/// With one counter per resource it got none ("fencing token … not proven
/// … every node must answer"): a missing per-resource counter could not be
/// told from one lost by a restart. With one counter per node for every
/// name, a quorum of trusted nodes proves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_never_used_name_gets_a_token_with_one_of_five_nodes_stopped() {
    let mut cluster = Cluster::start(5);
    let redlock = cluster.redlock();
    let trusted = trust_every_node(&cluster, &redlock, "").await;
    let before = token_of(&redlock, &resource("fence-before")).await.unwrap();
    cluster.node(4).kill();
    for n in 0..3 {
        let name = resource("fence-brandnew");
        let fresh = cluster.redlock();
        let token = token_of(&fresh, &name)
            .await
            .unwrap_or_else(|e| panic!("name {n} ({name}): {e}"));
        assert!(token > before, "{token} after {before}");
    }
    assert!(trusted, "the counters were trusted");
}

/// The nodes keep one counter and a generation marker, whatever the number
/// of names (with one counter per resource, every name left a key for ever:
/// 74 on one node after a short trial).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_distinct_names_leave_at_most_one_counter_key_per_node() {
    let cluster = Cluster::start(3);
    let redlock = cluster.redlock();
    let mut last = 0;
    for n in 0..60 {
        let token = token_of(&redlock, &resource(&format!("fence-daily-{n}")))
            .await
            .unwrap();
        assert!(token > last, "name {n}: {token} after {last}");
        last = token;
    }
    let mut multi = redlock
        .lock(&[&resource("fence-a"), &resource("fence-b")], TTL)
        .await
        .unwrap();
    assert!(redlock.fencing_token(&multi).await.unwrap() > last);
    redlock.unlock(&multi).await.unwrap();
    multi = redlock.lock(&[&resource("fence-c")], TTL).await.unwrap();
    redlock.unlock(&multi).await.unwrap();
    // the fencing writes to the slower nodes land on their own
    cluster.eventually(Duration::from_secs(2), |c| {
        (0..3).all(|i| c.keys_on(i).len() <= 2)
    });
    for i in 0..3 {
        let on_node = cluster.keys_on(i);
        let counters = on_node.iter().filter(|k| keys::is_counter(k)).count();
        let legacy = on_node
            .iter()
            .filter(|k| keys::is_legacy_counter(k))
            .count();
        assert_eq!(
            (counters, legacy),
            (1, 0),
            "node {i}: {} keys",
            on_node.len()
        );
        assert!(
            on_node.len() <= 2,
            "node {i}: the counter and the marker only: {on_node:?}"
        );
    }
}

/// A node that restarted empty (no persistence) is not trusted again by the
/// next tokens, of any name: a holder that then reads it and a node behind
/// the last token, with the node that has it paused, fails closed rather
/// than repeat; once another name's token went through every node, the
/// counters carry the last token across names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_empty_does_not_make_a_token_repeat() {
    let mut cluster = Cluster::start(3);
    let redlock = cluster.builder().retry_count(50).build().unwrap();
    assert!(trust_every_node(&cluster, &redlock, "").await);
    let x = resource("fence-x");
    // Node 2 paused while A takes a token for x: nodes 0 and 1 have it.
    cluster.node(2).pause();
    let a = cluster.builder().retry_count(50).build().unwrap();
    let token_a = token_of(&a, &x).await.unwrap();
    cluster.node(2).resume();
    // Node 0 restarts empty; node 1, the only other node with A's token, is
    // paused while B takes a token for x on nodes 0 and 2.
    cluster.node(0).restart();
    cluster.node(1).pause();
    let b = cluster.builder().retry_count(50).build().unwrap();
    match token_of(&b, &x).await {
        Ok(token) => assert!(token > token_a, "{token} after {token_a}"),
        Err(Error::FencingUnproven { untrusted, .. }) => assert!(untrusted >= 1),
        Err(other) => panic!("{other}"),
    }
    cluster.node(1).resume();
    // Another name's token, every node answering: its write reaches the
    // restarted node, but does not trust it yet (its marker is young).
    let z = cluster.builder().retry_count(50).build().unwrap();
    let mut token_z = None;
    for _ in 0..40 {
        match token_of(&z, &resource("fence-z")).await {
            Ok(token) => {
                token_z = Some(token);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let token_z = token_z.expect("a token once every node answers");
    assert!(token_z > token_a);
    let restarted = stored(&cluster, 0, "").expect("written");
    assert!(!restarted.contains(':'), "trusted at once: {restarted}");
    assert!(number(&restarted) >= token_z);
    // Once its marker is a few seconds old, a token made with every node
    // answering trusts the restarted node again; then x, with node 1
    // paused, is proven by nodes 0 and 2, which carry the later tokens.
    assert!(trust_every_node(&cluster, &z, "").await);
    cluster.node(1).pause();
    let c = cluster.builder().retry_count(50).build().unwrap();
    let outcome = token_of(&c, &x).await;
    cluster.node(1).resume();
    let token_c = outcome.expect("proven by two trusted nodes");
    assert!(
        token_c > token_z,
        "{token_c} after {token_z} (and {token_a})"
    );
}

/// An older version's per-resource counter is a floor: the first token
/// under one counter per node is above it, and the write deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_per_resource_counter_is_a_floor_and_then_removed() {
    let cluster = Cluster::start(3);
    let redlock = cluster.redlock();
    let res = resource("fence-legacy");
    for i in 0..3 {
        let _: () = redis::cmd("SET")
            .arg(keys::legacy_counter(&res))
            .arg("41:an-older-generation")
            .query(&mut cluster.conn(i))
            .unwrap();
    }
    let token = token_of(&redlock, &res).await.unwrap();
    assert_eq!(token, 42);
    assert!(cluster.eventually(Duration::from_secs(2), |c| {
        c.nowhere(keys::legacy_counter(&res))
    }));
    assert!(token_of(&redlock, &res).await.unwrap() > token);
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
    let res = resource("fence-holder");
    let prefix = format!("{res}/");
    let redlock = cluster.builder().key_prefix(&prefix).build().unwrap();
    // A counter holds `<number>:<generation>` or a bare `<number>`; the
    // number is compared.
    let counters = |c: &Cluster| -> Vec<Option<String>> {
        (0..5)
            .map(|i| stored(c, i, &prefix).map(|s| number(&s).to_string()))
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
    cluster.plant(
        &[0, 1, 2, 3, 4],
        &format!("{prefix}{res}"),
        "other-holder",
        TTL,
    );
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

/// The fencing counter of `X` must not take the lock key of the
/// resource `X:fence`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_named_like_a_fencing_counter_can_be_locked() {
    let cluster = Cluster::shared(5);
    let redlock = manager(cluster.urls());
    let x = resource("fence-x");
    let lock = redlock.try_lock(&x, TTL).await.unwrap();
    assert!(redlock.fencing_token(&lock).await.unwrap() >= 1);
    redlock.unlock(&lock).await.unwrap();

    let named_like_counter = redlock.try_lock(&format!("{x}:fence"), TTL).await;
    assert!(
        named_like_counter.is_ok(),
        "{x}:fence refused: {named_like_counter:?}"
    );
    redlock.unlock(&named_like_counter.unwrap()).await.unwrap();
}

/// Fencing `Y` works while someone holds the resource `Y:fence`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_works_while_a_resource_named_like_its_counter_is_locked() {
    let cluster = Cluster::shared(5);
    let (redlock, other) = (manager(cluster.urls()), manager(cluster.urls()));
    let y = resource("fence-y");
    let squatter = other.try_lock(&format!("{y}:fence"), TTL).await.unwrap();
    let lock = redlock.try_lock(&y, TTL).await.unwrap();
    let token = redlock.fencing_token(&lock).await;
    redlock.unlock(&lock).await.unwrap();
    other.unlock(&squatter).await.unwrap();
    assert!(token.is_ok(), "fencing_token failed: {token:?}");
}
