//! `Redlock::stats()` counts what a scripted sequence of outcomes did, and
//! `Redlock::health()` reports a persistent node, a node without
//! persistence, a replica and a down node.

use std::time::Duration;

use redlock_harness::proxy::{Fault, Proxy};
use redlock_harness::{Cluster, RedisServer, resource, warm};
use redlock_quorum::{Error, HealthWarning, Redlock};

const TTL: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_a_scripted_sequence() {
    let mut cluster = Cluster::start(3);
    let redlock = cluster.builder().retry_count(0).build().unwrap();
    let other = cluster.redlock();
    let res = resource("stats");

    // two grants
    for _ in 0..2 {
        let lock = redlock.lock(&res, TTL).await.unwrap();
        redlock.unlock(&lock).await.unwrap();
    }
    // one conflict
    let held = other.lock(&res, TTL).await.unwrap();
    assert!(matches!(
        redlock.try_lock(&res, TTL).await,
        Err(Error::Conflict { .. })
    ));
    other.unlock(&held).await.unwrap();
    // a guard that renews, then loses its lock when a majority dies
    let guard = redlock
        .acquire(&resource("stats-guard"), Duration::from_millis(600))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.node(1).kill();
    cluster.node(2).kill();
    let _ = guard.lost().await;
    // one no-quorum
    assert!(matches!(
        redlock.try_lock(&resource("stats-none"), TTL).await,
        Err(Error::NoQuorum { .. })
    ));

    let stats = redlock.stats();
    assert_eq!(stats.grants, 3, "{stats:?}");
    assert_eq!(stats.conflicts, 1, "{stats:?}");
    assert_eq!(stats.no_quorum, 1, "{stats:?}");
    assert_eq!(stats.errors, 0, "{stats:?}");
    assert!(stats.attempts >= 5, "{stats:?}");
    assert!(stats.renewals >= 1, "{stats:?}");
    assert_eq!(stats.losses, 1, "{stats:?}");
    assert_eq!(stats.node_failures.len(), 3);
    assert_eq!(
        stats.node_failures[0].1, 0,
        "node 0 never failed: {stats:?}"
    );
    assert!(
        stats.node_failures[1].1 > 0 && stats.node_failures[2].1 > 0,
        "{stats:?}"
    );
    let (p50, p99) = (stats.acquire_p50.unwrap(), stats.acquire_p99.unwrap());
    assert!(p50 <= p99 && p99 < Duration::from_secs(5), "{stats:?}");
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_persistence_roles_and_down_nodes() {
    let persistent = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let plain = RedisServer::start();
    let replica = RedisServer::start();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(plain.port())
        .query(&mut replica.conn())
        .unwrap();
    let mut down = RedisServer::start();
    let urls = [persistent.url(), plain.url(), replica.url(), down.url()];
    down.kill();
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(Duration::from_millis(500))
        .build()
        .unwrap();

    let health = redlock.health().await;
    let [p, n, r, d] = &health.nodes[..] else {
        panic!("{health:?}")
    };
    assert!(p.is_reachable() && p.appendonly == Some(true), "{p:?}");
    assert_eq!(p.appendfsync.as_deref(), Some("always"));
    assert_eq!(p.role.as_deref(), Some("master"));
    assert!(p.version.is_some() && p.run_id.is_some() && p.round_trip.is_some());
    assert_eq!(n.appendonly, Some(false), "{n:?}");
    assert_eq!(r.role.as_deref(), Some("slave"), "{r:?}");
    assert!(!d.is_reachable() && d.version.is_none(), "{d:?}");
    // 3 of 4 answered, but the replica takes no writes: 2 masters are no
    // quorum of 4
    assert!(!health.quorum_reachable, "{health:?}");
    let without_down = Redlock::builder(urls[..3].iter().map(String::as_str))
        .node_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    assert!(
        without_down.health().await.quorum_reachable,
        "2 masters of 3 are a quorum"
    );
    let warnings = &health.warnings;
    assert!(
        warnings.contains(&HealthWarning::Replica {
            node: r.node.clone()
        }),
        "{warnings:?}"
    );
    assert!(
        warnings.contains(&HealthWarning::NoPersistence {
            node: n.node.clone()
        }),
        "{warnings:?}"
    );
    assert!(
        !warnings.contains(&HealthWarning::NoPersistence {
            node: p.node.clone()
        }),
        "{warnings:?}"
    );
    assert!(
        warnings.contains(&HealthWarning::EvenNodeCount { nodes: 4 }),
        "{warnings:?}"
    );
    // Each prints as a sentence.
    let text: Vec<String> = warnings.iter().map(ToString::to_string).collect();
    let text = text.join("\n");
    assert!(text.contains(&format!("{} is a replica", r.node)), "{text}");
    assert!(text.contains("even number"), "{text}");
}

/// A node that fails every request, but only after the others reached a
/// quorum, still shows in `node_failures`: its errors come back to the
/// round's leftover, which counts them (it counted nothing before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_failing_after_the_quorum_is_counted() {
    const ROUNDS: u64 = 5;
    let mut cluster = Cluster::start(5);
    let proxy = Proxy::to_port(cluster.node(4).port()).await;
    let mut urls = cluster.urls()[..4].to_vec();
    urls.push(proxy.url());
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(Duration::from_secs(5))
        .retry_count(0)
        .build()
        .unwrap();
    warm(&redlock).await;
    let before = redlock.stats().node_failures[4].1;
    // Slower than the other four, and each lock key there of the wrong
    // type: node 4 answers every acquisition with an error, always after
    // the quorum.
    proxy.set(Fault::Latency(Duration::from_millis(100)));
    let mut slow = cluster.node(4).conn();
    for round in 0..ROUNDS {
        let res = resource(&format!("failing-late-{round}"));
        let _: () = redis::cmd("RPUSH")
            .arg(&res)
            .arg("not a lock")
            .query(&mut slow)
            .unwrap();
        // Not released: the release would count node 4 on its own.
        let _held = redlock.try_lock(&res, TTL).await.expect("four nodes agree");
    }
    let counted = || redlock.stats().node_failures[4].1 - before;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while counted() < ROUNDS && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(counted(), ROUNDS, "{:?}", redlock.stats());
    let others: u64 = redlock.stats().node_failures[..4]
        .iter()
        .map(|(_, n)| n)
        .sum();
    assert_eq!(others, 0, "{:?}", redlock.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_off_counts_nothing() {
    let mut cluster = Cluster::start(3);
    let on = cluster.builder().retry_count(0).build().unwrap();
    let off = cluster
        .builder()
        .retry_count(0)
        .stats(false)
        .build()
        .unwrap();
    let res = resource("stats-off");
    for redlock in [&on, &off] {
        let lock = redlock.lock(&res, TTL).await.unwrap();
        redlock.unlock(&lock).await.unwrap();
    }
    cluster.node(2).kill();
    for redlock in [&on, &off] {
        let lock = redlock.lock(&res, TTL).await.unwrap();
        redlock.unlock(&lock).await.unwrap();
    }
    let (on, off) = (on.stats(), off.stats());
    assert_eq!((on.attempts, on.grants), (2, 2));
    assert!(on.node_failures.iter().any(|(_, n)| *n > 0));
    assert!(on.acquire_p50.is_some());
    assert_eq!((off.attempts, off.grants, off.conflicts), (0, 0, 0));
    assert!(off.node_failures.iter().all(|(_, n)| *n == 0));
    assert_eq!(off.acquire_p50, None);
}

/// The `metrics` feature: the same events through the `metrics` facade, as
/// a recorder (here metrics-util's debugging one) sees them.
#[cfg(feature = "metrics")]
#[test]
fn the_metrics_feature_emits_the_counters() {
    use metrics_util::MetricKind;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let mut cluster = Cluster::start(3);
    let redlock = cluster.builder().retry_count(0).build().unwrap();
    let other = cluster.redlock();
    let res = resource("metrics");
    // Runs `work` on a runtime of its own with the recorder installed.
    let recorded = |work: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + '_>>| {
        metrics::with_local_recorder(&recorder, || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(work)
        })
    };
    recorded(Box::pin(async {
        let lock = redlock.lock(&res, TTL).await.unwrap();
        redlock.unlock(&lock).await.unwrap();
        let held = other.lock(&res, TTL).await.unwrap();
        assert!(redlock.lock(&res, TTL).await.is_err());
        other.unlock(&held).await.unwrap();
    }));
    cluster.node(2).kill();
    recorded(Box::pin(async {
        let lock = redlock.lock(&res, TTL).await.unwrap();
        redlock.unlock(&lock).await.unwrap();
    }));
    let mut counters = std::collections::BTreeMap::new();
    let mut histogram_samples = 0;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (kind, key) = key.into_parts();
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        match (kind, value) {
            (MetricKind::Counter, DebugValue::Counter(n)) => {
                counters.insert(name, n);
            }
            (MetricKind::Histogram, DebugValue::Histogram(v)) => histogram_samples += v.len(),
            _ => {}
        }
    }
    // Both managers report to the recorder: four attempts (redlock's two
    // grants and its conflict, other's grant).
    assert_eq!(
        counters.get("redlock_attempts_total{}"),
        Some(&4),
        "{counters:?}"
    );
    assert_eq!(
        counters.get("redlock_acquisitions_total{outcome=granted}"),
        Some(&3),
        "{counters:?}"
    );
    assert_eq!(
        counters.get("redlock_acquisitions_total{outcome=conflict}"),
        Some(&1),
        "{counters:?}"
    );
    let node_failures: u64 = counters
        .iter()
        .filter(|(k, _)| k.starts_with("redlock_node_failures_total{node="))
        .map(|(_, n)| *n)
        .sum();
    assert!(node_failures >= 1, "{counters:?}");
    assert_eq!(histogram_samples, 3, "one latency per grant");
}
