//! Scripts on cluster nodes (feature `cluster`) whose masters lost their
//! script cache, on real Redis Clusters started by the harness on
//! loopback.
//!
//! A master answers `EVALSHA` with `NOSCRIPT` after `SCRIPT FLUSH`, or
//! when it is a replica just promoted. The script must then reach that
//! master alone: redis-rs sends `SCRIPT LOAD` to every node of the cluster,
//! replicas included, and needs all of them to answer, so a single silent
//! replica would keep the script from ever being loaded.
#![cfg(feature = "cluster")]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use redlock_harness::resource;
use redlock_harness::shards::{RedisCluster, RedisClusters};
use redlock_quorum::{Durability, Lock, Redlock};

/// The ttl a lock is taken with.
const TTL: Duration = Duration::from_secs(30);
/// The ttl it is extended to: a key whose `PTTL` is over [`TTL`] was
/// extended.
const EXTENDED: Duration = Duration::from_secs(120);
/// How long a check waits for what a round's last requests do after the
/// round returned. It bounds liveness; it does not time anything.
const SETTLE: Duration = Duration::from_secs(30);

/// The clusters whose replica is paused: a majority of the three, so that
/// no round can succeed without one of them.
const FAULTED: [usize; 2] = [0, 1];

/// Names whose keys are in `n` distinct slots.
fn names_in_distinct_slots(prefix: &str, n: usize) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut names = Vec::new();
    let mut i = 0;
    while names.len() < n {
        let name = resource(&format!("{prefix}-{i}"));
        if seen.insert(RedisCluster::slot(name.as_bytes())) {
            names.push(name);
        }
        i += 1;
    }
    names
}

/// `SCRIPT FLUSH` on every master of every cluster.
fn flush(clusters: &RedisClusters) {
    for cluster in clusters.iter() {
        for m in 0..cluster.masters() {
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query(&mut cluster.master_conn(m))
                .unwrap();
        }
    }
}

/// `PTTL key` on the master of `cluster` that owns it (-2: missing).
fn pttl(cluster: &RedisCluster, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut cluster.conn_master_of(key.as_bytes()))
        .unwrap()
}

/// Waits until every key of `lock` on each faulted cluster has a ttl over
/// [`TTL`] (extended there: the round may return at its quorum, before the
/// last cluster answered); panics after [`SETTLE`] with the ttls last
/// seen.
async fn extended_on_faulted(clusters: &RedisClusters, lock: &Lock, who: &str) {
    let deadline = Instant::now() + SETTLE;
    let limit = i64::try_from(TTL.as_millis()).unwrap();
    loop {
        let ttls: Vec<(usize, i64)> = FAULTED
            .iter()
            .flat_map(|&c| lock.keys().map(move |k| (c, k)))
            .map(|(c, k)| (c, pttl(&clusters[c], k)))
            .collect();
        if ttls.iter().all(|&(_, t)| t > limit) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{who}: not extended on every cluster with a paused replica: {ttls:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The lock keys (not the crate's own keys, which hold the byte 0xFF) on
/// every master of every cluster.
fn lock_keys_left(clusters: &RedisClusters) -> Vec<String> {
    clusters
        .iter()
        .flat_map(RedisCluster::keys_everywhere)
        .filter(|k| !k.contains(&0xFF))
        .map(|k| String::from_utf8_lossy(&k).into_owned())
        .collect()
}

/// Verifies, extends and releases `lock`, with the script caches flushed
/// before each: each runs its script on every cluster.
async fn verify_extend_unlock(clusters: &RedisClusters, redlock: &Redlock, lock: &Lock, who: &str) {
    flush(clusters);
    let verified = redlock.verify(lock).await;
    assert!(
        matches!(verified, Ok(true)),
        "{who}: verify after SCRIPT FLUSH: {verified:?}"
    );
    flush(clusters);
    let lock = match redlock.extend(lock, EXTENDED).await {
        Ok(lock) => lock,
        Err(e) => panic!("{who}: extend after SCRIPT FLUSH: {e:?}"),
    };
    extended_on_faulted(clusters, &lock, who).await;
    flush(clusters);
    let released = redlock.unlock(&lock).await;
    assert!(
        matches!(released, Ok(3)),
        "{who}: unlock after SCRIPT FLUSH, released on how many clusters: {released:?}"
    );
}

/// Locks (one resource, and a set over several slots) are held through
/// managers with plain and with acknowledged votes on three clusters of
/// two masters with two replicas each. Then a replica is paused (SIGSTOP)
/// on two of the clusters and every master's script cache is flushed
/// before each request: verification, extension and release still succeed
/// on those clusters (the extension lands there, every cluster releases),
/// and so does a new lock on the set (its acquisition is a script too).
///
/// Before the fallback to `EVAL`, the `NOSCRIPT` answer led to `SCRIPT
/// LOAD`, which redis-rs sends to every node and which waited for the
/// paused replica: those clusters timed out, and with two of three no
/// quorum was reached.
///
/// A panic drops the clusters, whose processes are killed (SIGKILL ends a
/// paused process too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_reach_the_master_while_a_replica_is_paused() {
    let mut clusters = RedisClusters::start(3, 2, 2);
    // As in production, the replicas are in `CLUSTER SLOTS` when the
    // managers connect (a replica that has replicated nothing is left out,
    // and redis-rs would send it nothing).
    for cluster in clusters.iter() {
        cluster.list_replicas();
    }
    let urls = clusters.urls();
    // Timeouts for a loaded 2-core machine running 18 servers.
    let plain = Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(Duration::from_secs(2))
        .retry_count(0)
        .build()
        .unwrap();
    // `WAIT 1`: one replica of each master is enough, and each master
    // keeps one that answers.
    let durable = Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(Duration::from_secs(3))
        .retry_count(0)
        .durability(Durability::Replicas {
            replicas: 1,
            timeout: Duration::from_secs(1),
        })
        .build()
        .unwrap();
    let managers = [("plain", &plain), ("durable", &durable)];
    // Locks taken before the fault, so that each manager's cluster
    // connections know every node, the paused replica included.
    let mut held = Vec::new();
    for (who, redlock) in managers {
        let one = vec![resource(&format!("cs-{who}-one"))];
        let set = names_in_distinct_slots(&format!("cs-{who}-set"), 6);
        for names in [one, set] {
            let lock = redlock.try_lock(names.as_slice(), TTL).await.unwrap();
            held.push((who, redlock, lock));
        }
    }
    for &c in &FAULTED {
        let port = clusters[c].pause_replica(0);
        println!("cluster {c}: replica {port} of master 0 paused");
    }

    for (who, redlock, lock) in &held {
        let who = format!("{who}, {} names", lock.resources().len());
        verify_extend_unlock(&clusters, redlock, lock, &who).await;
    }
    for (who, redlock) in managers {
        let set = names_in_distinct_slots(&format!("cs-{who}-again"), 6);
        flush(&clusters);
        let lock = match redlock.try_lock(set.as_slice(), TTL).await {
            Ok(lock) => lock,
            Err(e) => panic!("{who}: lock after SCRIPT FLUSH: {e:?}"),
        };
        verify_extend_unlock(&clusters, redlock, &lock, who).await;
    }

    for &c in &FAULTED {
        clusters[c].resume_master(0);
    }
    let left = lock_keys_left(&clusters);
    assert!(left.is_empty(), "lock keys left: {left:?}");
}
