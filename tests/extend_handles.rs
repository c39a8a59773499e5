//! An extension's requests still in flight on a slow node when its caller
//! goes on: every later step on the lock, through any handle of it (the
//! one `extend` returned, or the one it was given), is sent behind them.
//! Without that, the old handle's release reached the slow node before the
//! extension, which then set the key again there (its heal path), for a
//! whole ttl. The extension's script is sent once more there after a
//! `NOSCRIPT` (the node's script cache flushed), which puts it behind the
//! release in every round.

use std::sync::Arc;
use std::time::Duration;

use redlock_harness::proxy::{Fault, Proxy};
use redlock_harness::raw::exists;
use redlock_harness::{Cluster, releases_drained, resource, warm};
use redlock_quorum::Redlock;

const TTL: Duration = Duration::from_secs(60);
const ROUNDS: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_handle_releases_behind_the_extension() {
    let mut cluster = Cluster::start(5);
    let proxy = Proxy::to_port(cluster.node(4).port()).await;
    let mut urls = cluster.urls()[..4].to_vec();
    urls.push(proxy.url());
    let redlock = Arc::new(
        Redlock::builder(urls.iter().map(String::as_str))
            .node_timeout(Duration::from_secs(5))
            .retry_count(0)
            .build()
            .unwrap(),
    );
    warm(&redlock).await;
    proxy.set(Fault::Latency(Duration::from_millis(200)));
    let mut left = Vec::new();
    for round in 0..ROUNDS {
        // The slow node forgets its scripts, and learns the release's
        // again: the extension's script is then sent once more after its
        // `NOSCRIPT`, behind anything sent meanwhile.
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(
                &mut redis::Client::open(cluster.urls()[4].as_str())
                    .unwrap()
                    .get_connection()
                    .unwrap(),
            )
            .unwrap();
        let side = redlock
            .try_lock(&resource("side"), TTL)
            .await
            .expect("side lock");
        redlock.unlock(&side).await.expect("side unlock");
        let res = resource("extend-old-handle");
        let lock = redlock
            .try_lock(&res, TTL)
            .await
            .expect("four nodes answer");
        // Returns at a quorum: the slow node's SET, and then its
        // extension, are still on their way.
        let _extended = redlock.extend(&lock, TTL).await.expect("extended");
        assert!(redlock.unlock(&lock).await.unwrap() >= 3, "round {round}");
        assert!(
            releases_drained(&redlock, Duration::from_secs(30)).await,
            "round {round}: owed releases drained"
        );
        // Every request to the slow node has landed by now.
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        if exists(&cluster.urls()[4], &res) {
            left.push(round);
        }
    }
    assert!(
        left.is_empty(),
        "rounds whose key the extension set again after the release: {left:?} of {ROUNDS}"
    );
}
