//! Helpers the fault tests of the kept leftover and its audits share:
//! steps bounded in time, conditions polled with or without a runtime,
//! a test body run in a task, the node failures, and three nodes with one
//! slow node behind a proxy.

use std::future::Future;
use std::time::{Duration, Instant};

use redlock_quorum::Redlock;

use crate::cluster::{Cluster, warm};
use crate::proxy::{Fault, Proxy};

/// The bound on any one step: a step that takes longer hung.
pub const STEP: Duration = Duration::from_secs(60);

/// `future` under [`STEP`], or a panic naming `what`.
pub async fn step<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(STEP, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: hung (more than {STEP:?})"))
}

/// Whether `check` holds within `limit`, looked at every 20 ms from a
/// plain thread (outside any runtime: it blocks the thread).
pub fn eventually(limit: Duration, check: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `check` holds within `limit`, looked at every 20 ms without
/// blocking the runtime's thread (a task spawned from it may be queued
/// there, where no other worker takes it).
pub async fn within(limit: Duration, check: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `test` in a task of the current multi-thread runtime, its panic
/// passed on: a lock keeps its leftover only when taken from a task there
/// (a test's body runs in `block_on`, outside any task).
pub async fn in_a_task(test: impl Future<Output = ()> + Send + 'static) {
    if let Err(e) = tokio::spawn(test).await {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// Each node's failure count, in the order the manager was given them.
pub fn node_failures(redlock: &Redlock) -> Vec<u64> {
    redlock
        .stats()
        .node_failures
        .iter()
        .map(|(_, n)| *n)
        .collect()
}

/// Three nodes, node 2 behind a proxy that delays its replies by
/// `latency`, and a warm manager over them with `node_timeout` and no
/// retries.
pub async fn three_with_a_slow_node(
    node_timeout: Duration,
    latency: Duration,
) -> (Cluster, Proxy, Redlock) {
    let mut cluster = Cluster::start(3);
    let proxy = Proxy::to_port(cluster.node(2).port()).await;
    let mut urls = cluster.urls()[..2].to_vec();
    urls.push(proxy.url());
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(node_timeout)
        .retry_count(0)
        .build()
        .expect("valid");
    warm(&redlock).await;
    proxy.set(Fault::Latency(latency));
    (cluster, proxy, redlock)
}
