//! Nodes that are each a whole Redis Cluster (feature `cluster`): real
//! clusters of real `redis-server` processes (`cluster-enabled yes`),
//! started by the harness on loopback ports.
//!
//! - locks, extension, verification and release on five clusters of three
//!   masters, and contention judged by the checker;
//! - locks on many resources, whose keys span slots and masters: one
//!   script per slot, a partial acquisition released, nothing left behind;
//! - a slot migrating while clients lock (the `ASK` window included);
//! - a shard master killed and its replica promoted, with votes that a
//!   replica acknowledged (`Durability::Replicas`);
//! - what a cluster node cannot do yet gives a typed error;
//! - a mixed list of standalone and cluster nodes.
#![cfg(feature = "cluster")]

use std::sync::Arc;
use std::time::Duration;

use redlock_harness::checker::Checker;
use redlock_harness::shards::RedisClusters;
use redlock_harness::workload::{self, Plan, Sink};
use redlock_harness::{Cluster, resource};
use redlock_quorum::{Durability, Error, NodeError, Redlock};

const TTL: Duration = Duration::from_secs(10);

/// A manager for these tests: short retry delays, and a node timeout for a
/// loaded 2-core machine that runs every cluster's servers (a lock on 40
/// resources is 40 scripts per cluster node).
fn manager(urls: &[String]) -> Redlock {
    Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(Duration::from_millis(500))
        .retry_delay(Duration::from_millis(5))
        .retry_jitter(Duration::from_millis(10))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_on_five_clusters_is_taken_extended_checked_and_released() {
    let clusters = RedisClusters::start(5, 3, 0);
    let (a, b) = (manager(&clusters.urls()), manager(&clusters.urls()));
    let res = resource("c-basic");
    let lock = a.lock(&res, TTL).await.unwrap();
    assert!(lock.validity() > Duration::from_secs(9));
    for cluster in clusters.iter() {
        let held = cluster
            .get(res.as_bytes())
            .expect("the key on its slot's master");
        assert_eq!(held, lock.token().as_bytes());
    }
    assert!(matches!(
        b.try_lock(&res, TTL).await,
        Err(Error::Conflict { .. })
    ));
    let lock = a.extend(&lock, TTL).await.unwrap();
    assert!(a.verify(&lock).await.unwrap());
    assert_eq!(a.unlock(&lock).await.unwrap(), 5);
    let again = b.try_lock(&res, TTL).await.unwrap();
    b.unlock(&again).await.unwrap();
    for cluster in clusters.iter() {
        assert!(cluster.keys_everywhere().is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_resources_span_slots_and_a_partial_vote_leaves_nothing() {
    let clusters = RedisClusters::start(5, 3, 0);
    let (a, b) = (manager(&clusters.urls()), manager(&clusters.urls()));
    let names: Vec<String> = (0..40).map(|i| resource(&format!("c-many-{i}"))).collect();
    let masters: std::collections::HashSet<usize> = names
        .iter()
        .map(|n| clusters[0].master_of(n.as_bytes()))
        .collect();
    assert_eq!(masters.len(), 3, "the set spans every master");
    let lock = a.lock(names.as_slice(), TTL).await.unwrap();
    // A set that overlaps in five names: on every cluster, the parts in the
    // other slots set their keys, the overlapping part refused, and the
    // parts that agreed were released at once.
    let overlap: Vec<String> = names[35..]
        .iter()
        .cloned()
        .chain((0..30).map(|i| resource(&format!("c-other-{i}"))))
        .collect();
    let refused = b.try_lock(overlap.as_slice(), TTL).await;
    assert!(
        matches!(refused, Err(Error::Conflict { .. })),
        "{refused:?}"
    );
    // Only keys of the held set are left (`lock` returned at a quorum: a
    // slow cluster may still be setting them, or may have timed out and
    // hold part of the set, ours until the unlock): none of the refused
    // set's other names, anywhere.
    for cluster in clusters.iter() {
        for key in cluster.keys_everywhere() {
            let key = String::from_utf8(key).unwrap();
            assert!(names.contains(&key), "a key of the refused set left: {key}");
        }
    }
    let lock = a.extend(&lock, TTL).await.unwrap();
    assert!(a.verify(&lock).await.unwrap());
    assert_eq!(a.unlock(&lock).await.unwrap(), 5);
    for cluster in clusters.iter() {
        assert!(cluster.keys_everywhere().is_empty());
    }
}

/// The checker's workload (six contenders, one resource) on five clusters,
/// while the slot of the resource migrates between two masters of two of
/// them, begun and finished repeatedly, so that clients meet `ASK` and
/// `MOVED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_with_a_slot_migrating_keeps_exclusion() {
    let clusters = RedisClusters::start(5, 3, 0);
    let res = resource("c-migrate");
    let plan = Plan::new(
        clusters.urls(),
        res.clone(),
        Duration::from_millis(800),
        (1, 5),
        false,
        Duration::from_secs(4),
    );
    let checker = Arc::new(Checker::default());
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let redlock = manager(&plan.urls);
            let (plan, sink) = (plan.clone(), Sink::Checker(checker.clone()));
            tokio::spawn(workload::contend(redlock, format!("task-{i}"), plan, sink))
        })
        .collect();
    let mut moves = 0;
    let end = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < end {
        for cluster in clusters.iter().take(2) {
            let from = cluster.master_of(res.as_bytes());
            let to = (from + 1) % 3;
            let migration = cluster.begin_migration(res.as_bytes(), to);
            tokio::time::sleep(Duration::from_millis(100)).await;
            migration.finish();
            moves += 1;
        }
    }
    let mut acquisitions = 0;
    for task in tasks {
        acquisitions += task.await.unwrap().acquisitions;
    }
    let report = checker.report();
    println!(
        "cluster slot migration: acquisitions {acquisitions}, slot moves {moves}, violations {}",
        report.violations()
    );
    assert_eq!(report.violations(), 0, "{report:?}");
    assert!(acquisitions > 10, "the workload ran: {acquisitions}");
    assert!(moves >= 4);
}

/// The checker's workload on five clusters (two masters and a replica
/// each, votes acknowledged by a replica) while the master that owns the
/// resource is paused and resumed on two clusters, and then paused and
/// replaced by its replica (the old master comes back as a replica) on one
/// of them: 0 violations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_with_masters_paused_and_failed_over_keeps_exclusion() {
    let clusters = RedisClusters::start(5, 2, 1);
    let res = resource("c-faults");
    let urls = clusters.urls();
    let plan = Plan::new(
        urls.clone(),
        res.clone(),
        Duration::from_millis(1500),
        (1, 5),
        false,
        Duration::from_secs(5),
    );
    let checker = Arc::new(Checker::default());
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let redlock = Redlock::builder(urls.iter().map(String::as_str))
                .node_timeout(Duration::from_millis(300))
                .durability(Durability::Replicas {
                    replicas: 1,
                    timeout: Duration::from_millis(200),
                })
                .retry_delay(Duration::from_millis(5))
                .retry_jitter(Duration::from_millis(10))
                .build()
                .unwrap();
            let (plan, sink) = (plan.clone(), Sink::Checker(checker.clone()));
            tokio::spawn(workload::contend(redlock, format!("task-{i}"), plan, sink))
        })
        .collect();
    let key = res.clone();
    let faults = tokio::task::spawn_blocking(move || {
        let mut clusters = clusters;
        let mut faults = 0;
        for round in 0..2 {
            for i in [round, round + 1] {
                let master = clusters[i].master_of(key.as_bytes());
                clusters[i].pause_master(master);
                std::thread::sleep(Duration::from_millis(400));
                clusters[i].resume_master(master);
                faults += 1;
            }
            clusters[round].wait_ok();
            clusters[round + 1].wait_ok();
        }
        let master = clusters[0].master_of(key.as_bytes());
        clusters[0].pause_master(master);
        clusters[0].failover(master);
        clusters[0].resume_master(master);
        (faults + 1, clusters)
    })
    .await
    .unwrap();
    let (faults, _clusters) = faults;
    let mut acquisitions = 0;
    for task in tasks {
        acquisitions += task.await.unwrap().acquisitions;
    }
    let report = checker.report();
    println!(
        "cluster faults: acquisitions {acquisitions}, faults injected {faults}, violations {}",
        report.violations()
    );
    assert_eq!(report.violations(), 0, "{report:?}");
    assert!(acquisitions > 10, "the workload ran: {acquisitions}");
}

/// Votes acknowledged by a replica survive a failover: after the masters
/// that own the key die on three of five clusters and their replicas take
/// over, the key is still there, and no second manager can take the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_votes_survive_a_shard_failover() {
    let mut clusters = RedisClusters::start(5, 2, 1);
    let durable = |urls: &[String]| {
        Redlock::builder(urls.iter().map(String::as_str))
            .node_timeout(Duration::from_millis(500))
            .durability(Durability::Replicas {
                replicas: 1,
                timeout: Duration::from_millis(400),
            })
            .build()
            .unwrap()
    };
    let (a, b) = (durable(&clusters.urls()), durable(&clusters.urls()));
    let res = resource("c-failover");
    let lock = a.lock(&res, Duration::from_secs(30)).await.unwrap();
    // `lock` returned at a quorum: the slower clusters' writes may still
    // be in flight. Once every replica has the key, every vote is
    // acknowledged, and a failover anywhere keeps it.
    let replicas_hold = |clusters: &RedisClusters| {
        clusters.iter().all(|cluster| {
            let master = cluster.master_of(res.as_bytes());
            cluster.replica_ports(master).iter().all(|port| {
                let url = format!("redis://127.0.0.1:{port}/");
                let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
                let _: () = redis::cmd("READONLY").query(&mut conn).unwrap();
                let held: Option<String> = redis::cmd("GET").arg(&res).query(&mut conn).unwrap();
                held.as_deref() == Some(lock.token())
            })
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !replicas_hold(&clusters) {
        assert!(
            std::time::Instant::now() < deadline,
            "every replica has the key"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..3 {
        let cluster = &mut clusters[i];
        let master = cluster.master_of(res.as_bytes());
        cluster.kill_master(master);
        cluster.failover(master);
        eprintln!(
            "cluster {i}: killed {master}, now {}",
            cluster.master_of(res.as_bytes())
        );
        assert_eq!(
            cluster.get(res.as_bytes()).as_deref(),
            Some(lock.token().as_bytes()),
            "cluster {i}: the promoted replica has the acknowledged key"
        );
    }
    let second = b.try_lock(&res, Duration::from_secs(30)).await;
    assert!(matches!(second, Err(Error::Conflict { .. })), "{second:?}");
    assert!(a.verify(&lock).await.unwrap());
    a.unlock(&lock).await.unwrap();
}

/// Fencing on cluster nodes: each slot keeps its own counter (named with a
/// hash tag of that slot), so a resource's tokens grow as on standalone
/// nodes; a set over several slots cannot be fenced (one counter for the
/// set), and says so with a typed error; with a hash tag in the key prefix
/// every key shares one slot and a set is fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_grow_per_resource_on_cluster_nodes() {
    let clusters = RedisClusters::start(5, 3, 0);
    let redlock = manager(&clusters.urls());
    let res = resource("c-fence");
    let mut last = 0;
    for _ in 0..3 {
        let lock = redlock.lock(&res, TTL).await.unwrap();
        let token = redlock.fencing_token(&lock).await.unwrap();
        assert!(token > last, "{token} after {last}");
        last = token;
        redlock.unlock(&lock).await.unwrap();
    }
    let set = [
        resource("c-fence-a"),
        resource("c-fence-b"),
        resource("c-fence-c"),
    ];
    let lock = redlock.lock(set.as_slice(), TTL).await.unwrap();
    match redlock.fencing_token(&lock).await {
        Err(Error::Redis { failures, .. }) => assert!(
            failures
                .iter()
                .all(|f| matches!(f.cause, NodeError::Unsupported(_))),
            "{failures:?}"
        ),
        other => panic!("fencing a set over several slots: {other:?}"),
    }
    redlock.unlock(&lock).await.unwrap();
    let tagged = Redlock::builder(clusters.urls().iter().map(String::as_str))
        .key_prefix("{app}:")
        .build()
        .unwrap();
    let lock = tagged.lock(set.as_slice(), TTL).await.unwrap();
    let first = tagged.fencing_token(&lock).await.unwrap();
    tagged.unlock(&lock).await.unwrap();
    let lock = tagged.lock(&set[1], TTL).await.unwrap();
    assert!(tagged.fencing_token(&lock).await.unwrap() > first);
    tagged.unlock(&lock).await.unwrap();
}

/// The restart guard on cluster nodes: a generation marker per slot, made
/// ahead for every slot when the manager starts; a master that loses its
/// data (`FLUSHALL`, as a restart without persistence) makes its slots
/// young again, on that cluster only, until the guard's `max_ttl` passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_restart_guard_counts_a_slot_that_lost_its_data_only_once_old() {
    // Three clusters (49,152 markers to make ahead, in the background).
    let clusters = RedisClusters::start(3, 2, 0);
    let max_ttl = Duration::from_secs(4);
    let ttl = Duration::from_secs(1);
    // One attempt per call, each node given time on a loaded machine: the
    // failures then say what each node answered to that one attempt.
    let guarded = Redlock::builder(clusters.urls().iter().map(String::as_str))
        .restart_guard(max_ttl)
        .retry_count(0)
        .node_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let res = resource("c-guard");
    // Not granted: a young node agrees but is not counted (the error is a
    // conflict when a release of the attempt is still in flight somewhere).
    let young = |result: Result<redlock_quorum::Lock, Error>, at_least: usize| {
        let failures = match result {
            Err(Error::NoQuorum { failures, .. } | Error::Conflict { failures, .. }) => failures,
            other => panic!("a young quorum: {other:?}"),
        };
        let young = failures
            .iter()
            .filter(|f| matches!(f.cause, NodeError::Young { .. }))
            .count();
        assert!(young >= at_least, "{failures:?}");
    };
    // Every marker is younger than max_ttl: no quorum.
    young(guarded.try_lock(&res, ttl).await, 2);
    let markers = |cluster: &redlock_harness::shards::RedisCluster| -> usize {
        (0..cluster.masters())
            .map(|m| {
                let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
                    .arg("*generation")
                    .query(&mut cluster.master_conn(m))
                    .unwrap();
                keys.len()
            })
            .sum()
    };
    // Made ahead, in the background, for every slot (on a loaded 2-core
    // machine that takes a while; nothing depends on its speed). Each
    // master sets its flag once all its slots have markers: wait for the
    // flags (a cheap check, once a second, off the runtime's workers,
    // which make the markers), then count the markers once.
    let flags = |cluster: &redlock_harness::shards::RedisCluster| -> usize {
        (0..cluster.masters())
            .filter(|&m| {
                let made: Vec<Vec<u8>> = redis::cmd("KEYS")
                    .arg("*generation-made")
                    .query(&mut cluster.master_conn(m))
                    .unwrap();
                !made.is_empty()
            })
            .count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    loop {
        let done = tokio::task::block_in_place(|| clusters.iter().all(|c| flags(c) == c.masters()));
        if done {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "markers made ahead");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(clusters.iter().all(|c| markers(c) == 16384));
    tokio::time::sleep(max_ttl + Duration::from_millis(200)).await;
    let lock = guarded.try_lock(&res, ttl).await.unwrap();
    guarded.unlock(&lock).await.unwrap();
    for cluster in clusters.iter().take(2) {
        let master = cluster.master_of(res.as_bytes());
        let _: () = redis::cmd("FLUSHALL")
            .query(&mut cluster.master_conn(master))
            .unwrap();
    }
    young(guarded.try_lock(&res, ttl).await, 2);
    tokio::time::sleep(max_ttl + Duration::from_millis(200)).await;
    let lock = guarded.try_lock(&res, ttl).await.unwrap();
    guarded.unlock(&lock).await.unwrap();
}

/// One cluster named twice, by seeds that share no address (so the
/// builder cannot tell): the second entry to connect is refused as the
/// same failure domain (the cluster is named by the node id of the master
/// that serves slot 0), and no key is left anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_cluster_named_twice_by_different_seeds_is_a_duplicate() {
    let clusters = RedisClusters::start(3, 3, 0);
    let c = &clusters[0];
    let urls = vec![
        format!("redis+cluster://127.0.0.1:{}", c.master_port(0)),
        clusters[1].url(),
        format!(
            "redis+cluster://127.0.0.1:{},127.0.0.1:{}",
            c.master_port(1),
            c.master_port(2)
        ),
        clusters[2].url(),
    ];
    let twice = manager(&urls);
    let res = resource("c-dup");
    let r = twice.try_lock(&res, TTL).await;
    match &r {
        Err(e @ Error::DuplicateNode { index, first, .. }) => {
            // Whichever entry connected second is the one refused.
            assert_eq!((*index).min(*first), 0, "{e}");
            assert_eq!((*index).max(*first), 2, "{e}");
        }
        other => panic!("one cluster named twice: {other:?}"),
    }
    for cluster in clusters.iter() {
        assert!(cluster.keys_everywhere().is_empty(), "nothing left behind");
    }
    // Named once each, the same clusters lock.
    let once = manager(&clusters.urls());
    let lock = once.try_lock(&res, TTL).await.unwrap();
    assert_eq!(once.unlock(&lock).await.unwrap(), 3);
}

/// What a cluster node cannot do, or a cluster that does not answer: typed
/// errors, no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_does_not_answer_is_a_typed_error() {
    let res = resource("c-dead");
    let dead = Redlock::builder([
        "redis+cluster://127.0.0.1:1,127.0.0.1:2",
        "redis+cluster://127.0.0.1:3",
        "redis+cluster://127.0.0.1:4",
    ])
    .connect_timeout(Duration::from_millis(200))
    .retry_count(1)
    .build()
    .unwrap();
    let failed = dead.try_lock(&res, TTL).await;
    assert!(matches!(failed, Err(Error::NoQuorum { .. })), "{failed:?}");
    // A cluster's masters named as standalone nodes: the two that do not own
    // the key answer MOVED, which no retry fixes, and the error says what
    // to write instead.
    let cluster = redlock_harness::shards::RedisCluster::start(3, 0);
    let shards: Vec<String> = (0..3).map(|m| cluster.master_url(m)).collect();
    let wrong = manager(&shards);
    match wrong.lock(&res, TTL).await {
        Err(e @ Error::Redis { .. }) => assert!(e.to_string().contains("redis+cluster://"), "{e}"),
        other => panic!("a cluster's shards as nodes: {other:?}"),
    }
    // Refused whatever the key: also where each entry named is a master of
    // that key's slot (three clusters, one master of each), which would
    // otherwise vote as if it were a standalone node.
    let three: Vec<redlock_harness::shards::RedisCluster> = (0..3)
        .map(|_| redlock_harness::shards::RedisCluster::start(3, 0))
        .collect();
    let owners: Vec<String> = three
        .iter()
        .map(|c| c.master_url(c.master_of(res.as_bytes())))
        .collect();
    let owners_only = manager(&owners);
    match owners_only.lock(&res, TTL).await {
        Err(e @ Error::Redis { .. }) => assert!(
            e.to_string().contains("member of a Redis Cluster")
                && e.to_string().contains("redis+cluster://"),
            "{e}"
        ),
        other => panic!("the key's slot masters as standalone nodes: {other:?}"),
    }
    assert!(cluster.keys_everywhere().is_empty(), "nothing left behind");
    for c in &three {
        assert!(c.keys_everywhere().is_empty(), "nothing left behind");
    }
    let bad = Redlock::builder(["redis+cluster://127.0.0.1:7000,,127.0.0.1:7001"]).build();
    assert!(
        matches!(bad, Err(Error::InvalidNodeAddress { ref reason, .. }) if reason.contains("empty seed")),
        "{bad:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_and_cluster_nodes_mix_and_waiters_get_the_lock() {
    let clusters = RedisClusters::start(2, 2, 0);
    let standalone = Cluster::start(3);
    let urls: Vec<String> = clusters
        .urls()
        .into_iter()
        .chain(standalone.urls().iter().cloned())
        .collect();
    let (a, b) = (manager(&urls), manager(&urls));
    let res = resource("c-mixed");
    let lock = a.lock(&res, Duration::from_secs(2)).await.unwrap();
    let waiting = {
        let (b, res) = (b.clone(), res.clone());
        tokio::spawn(async move { b.lock_within(&res, TTL, Duration::from_secs(20)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    a.unlock(&lock).await.unwrap();
    let next = waiting.await.unwrap().unwrap();
    assert!(b.verify(&next).await.unwrap());
    b.unlock(&next).await.unwrap();
}

/// node-redlock 5 on ioredis `Cluster` clients and this crate on the same
/// five clusters exclude each other, in both directions: the same plain
/// lock key, each side's vote the key's slot master. (node-redlock runs a
/// lock on several resources as one script over all its keys, so on a
/// cluster its sets must share a hash tag; ours need not.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_redlock_on_ioredis_clusters_and_this_crate_exclude_each_other() {
    let Some(dir) = redlock_harness::node_redlock::install() else {
        assert!(
            std::env::var_os("REDLOCK_REQUIRE_NODE").is_none(),
            "node and npm (with the npm registry) are needed for the interop test"
        );
        eprintln!("skipped: node and npm (with the npm registry) are needed");
        return;
    };
    let clusters = RedisClusters::start(5, 3, 0);
    let specs: Vec<String> = clusters
        .urls()
        .iter()
        .map(|u| u.replace("redis+cluster://", "cluster:"))
        .collect();
    let mut node = redlock_harness::node_redlock::NodeClient::spawn(&dir, &specs.join(";"));
    let ours = manager(&clusters.urls());
    let ttl = 10_000;
    let a = resource("c-interop-a");
    let tag = format!("{{{}}}", resource("c-interop-tag"));
    let (b, c) = (format!("{tag}:b"), format!("{tag}:c"));

    // node-redlock holds a: ours is refused, on the same key.
    let answer = node.ask(&format!("acquire {a} {ttl}")).await;
    let value = answer.strip_prefix("held ").expect(&answer).to_owned();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while clusters
        .iter()
        .any(|cl| cl.get(a.as_bytes()).as_deref() != Some(value.as_bytes()))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the plain key on every cluster"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = ours.try_lock(&a, TTL).await;
    assert!(
        matches!(refused, Err(Error::Conflict { .. })),
        "{refused:?}"
    );
    assert_eq!(node.ask("release").await, "released");
    let lock = ours
        .try_lock(&a, TTL)
        .await
        .expect("free after node's release");

    // We hold a: node-redlock is refused, and leaves nothing.
    let answer = node.ask(&format!("acquire {a} {ttl}")).await;
    assert!(answer.starts_with("refused"), "{answer}");
    ours.unlock(&lock).await.unwrap();

    // Sets with a common hash tag, both ways.
    let answer = node.ask(&format!("acquire {b},{c} {ttl}")).await;
    assert!(answer.starts_with("held "), "{answer}");
    let refused = ours.try_lock([&c, &a].as_slice(), TTL).await;
    assert!(
        matches!(refused, Err(Error::Conflict { .. })),
        "{refused:?}"
    );
    assert_eq!(node.ask("release").await, "released");
    let set = ours.try_lock([&b, &c].as_slice(), TTL).await.expect("ours");
    let answer = node.ask(&format!("acquire {c} {ttl}")).await;
    assert!(answer.starts_with("refused"), "{answer}");
    ours.unlock(&set).await.unwrap();
    node.quit().await;
    for cluster in clusters.iter() {
        assert!(cluster.keys_everywhere().is_empty(), "nothing left behind");
    }
}
