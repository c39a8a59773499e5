//! Release: an unlock right after a fresh grant releases the key on every
//! node, a slow one included, and releases owed to a node that cannot be
//! reached are retried by one task per node that drains when the node heals
//! and ends with the manager. A release publishes only on nodes where
//! someone subscribes the key's release channel.

use std::time::{Duration, Instant};

use redlock_harness::proxy::{Fault, Proxy};
use redlock_harness::raw::{before_redis_7, calls, exists, reset_stats};
use redlock_harness::{Cluster, keys, manager, reach_every_node, resource};
use redlock_quorum::Redlock;

const TTL: Duration = Duration::from_secs(10);

/// An `unlock` right after the grant, on a fresh manager whose
/// connections are still being made, must release the key on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_right_after_a_fresh_grant_releases_every_node() {
    let cluster = Cluster::start(5);
    for round in 0..200 {
        let redlock = cluster
            .builder()
            .node_timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let res = resource("fresh-unlock");
        let lock = redlock.try_lock(&res, TTL).await.expect("healthy nodes");
        let released = redlock.unlock(&lock).await;
        let gone = cluster.eventually(Duration::from_secs(5), |c| c.values(&res) == vec![None; 5]);
        assert!(
            gone,
            "round {round}: key left after unlock ({released:?}): {:?}",
            cluster.values(&res)
        );
        assert!(
            matches!(released, Ok(5)),
            "round {round}: unlock returned {released:?}"
        );
    }
}

/// The same with 15 ms of latency on one node: the late SET must not land
/// after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_right_after_a_fresh_grant_releases_a_slow_node() {
    let mut cluster = Cluster::start(5);
    let proxy = Proxy::to_port(cluster.node(4).port()).await;
    proxy.set(Fault::Latency(Duration::from_millis(15)));
    let mut urls = cluster.urls()[..4].to_vec();
    urls.push(proxy.url());
    for round in 0..30 {
        let redlock = Redlock::builder(urls.iter().map(String::as_str))
            .node_timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let res = resource("fresh-unlock-slow");
        let lock = redlock.try_lock(&res, TTL).await.expect("healthy nodes");
        let released = redlock.unlock(&lock).await;
        let gone = cluster.eventually(Duration::from_secs(5), |c| c.values(&res) == vec![None; 5]);
        assert!(
            gone,
            "round {round}: key left after unlock ({released:?}): {:?}",
            cluster.values(&res)
        );
    }
}

/// A release queued behind a `SET` still in flight, on the same connection,
/// goes after that `SET`, and is sent once more if the `SET` itself is sent
/// again after it. The user may not run `INFO`, so a server older than
/// Redis 7.0 is found old only by refusing `SET … NX … GET`: the slow node
/// answers the first `SET` with a syntax error, runs the release (nothing to
/// delete yet), and then gets the acquisition again as a script, which sets
/// the key. The release must follow it. On Redis 7.0 and later the first
/// `SET` stands, and the test checks the plain queued release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_queued_behind_a_set_sent_again_follows_it() {
    let mut cluster = Cluster::start(5);
    let urls = cluster.acl_user("noinfo", &["on", ">pw", "~*", "&*", "+@all", "-info"]);
    let proxy = Proxy::to_port(cluster.node(4).port()).await;
    let mut urls = urls[..4].to_vec();
    urls.push(proxy.url().replacen("redis://", "redis://noinfo:pw@", 1));
    let old = before_redis_7(&cluster.urls()[4]);
    for round in 0..5 {
        let redlock = Redlock::builder(urls.iter().map(String::as_str))
            .node_timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        // No warm-up: a lock taken there would teach the manager that the
        // slow node is old, and its first `SET` would be the script.
        reset_stats(&cluster.urls()[4]);
        proxy.set(Fault::RequestLatency(Duration::from_millis(150)));
        let res = resource("queued-release");
        let lock = redlock.try_lock(&res, TTL).await.expect("four fast nodes");
        let released = redlock.unlock(&lock).await;
        proxy.set(Fault::NONE);
        let resent = calls(&cluster.urls()[4], "eval");
        eprintln!(
            "round {round}: unlock {released:?}, acquisition scripts on the slow node {resent}"
        );
        assert!(
            !exists(&cluster.urls()[4], &res),
            "round {round}: key left on the slow node after unlock ({released:?})"
        );
        assert!(
            matches!(released, Ok(5)),
            "round {round}: unlock returned {released:?}"
        );
        if old && round == 0 {
            assert!(
                resent >= 1,
                "the slow node never got the script: nothing was sent again"
            );
        }
    }
}

/// Releases owed to a node that resets every connection are
/// coalesced per node. 500 lock/unlock cycles with a 1 h ttl used to leave
/// one retry task per release alive (505), making hundreds of connection
/// attempts a second; now the node gets one worker task, connection attempts
/// are paced by the backoff, the queue drains when the node heals, and the
/// worker ends when the manager is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_retries_are_one_task_per_node_and_end_with_the_manager() {
    const CYCLES: usize = 500;
    let mut cluster = Cluster::start(3);
    let proxy = Proxy::to_port(cluster.node(2).port()).await;
    let urls = vec![
        cluster.urls()[0].clone(),
        cluster.urls()[1].clone(),
        proxy.url(),
    ];
    let redlock = manager(&urls);
    reach_every_node(&redlock).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let tasks_before = metrics.num_alive_tasks();

    proxy.set(Fault::Reset);
    let hour = Duration::from_secs(3600);
    let prefix = resource("pile");
    for i in 0..CYCLES {
        let lock = redlock.lock(&format!("{prefix}:{i}"), hour).await.unwrap();
        redlock.unlock(&lock).await.unwrap();
    }
    let owed = redlock.pending_releases();
    let tasks = metrics.num_alive_tasks();
    let connections = proxy.connections();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let per_second = (proxy.connections() - connections) as f64 / 3.0;
    eprintln!(
        "after {CYCLES} cycles: {owed} releases owed, {} tasks alive ({tasks_before} before), {per_second:.1} connection attempts/s",
        tasks
    );
    assert!(owed > 0 && owed <= CYCLES, "owed {owed}");
    assert!(
        tasks <= tasks_before + 3,
        "{tasks} tasks alive, {tasks_before} before"
    );
    assert!(per_second <= 5.0, "{per_second} connection attempts/s");

    // The node heals: the queue drains and the keys are gone from it.
    proxy.set(Fault::NONE);
    let deadline = Instant::now() + Duration::from_secs(10);
    while redlock.pending_releases() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} owed",
            redlock.pending_releases()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let url = &cluster.urls()[2];
    for i in (0..CYCLES).step_by(50) {
        assert!(!exists(url, format!("{prefix}:{i}")), "key {i} left");
    }

    // Owed again, then the manager is dropped: its worker ends.
    proxy.set(Fault::Reset);
    let lock = redlock.lock(&resource("last"), hour).await.unwrap();
    redlock.unlock(&lock).await.unwrap();
    assert_eq!(redlock.pending_releases(), 1);
    drop(redlock);
    let deadline = Instant::now() + Duration::from_secs(5);
    while metrics.num_alive_tasks() > tasks_before {
        assert!(
            Instant::now() < deadline,
            "{} tasks alive after the manager was dropped, {tasks_before} before",
            metrics.num_alive_tasks()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A release nobody waits for publishes nothing and reads no waiters'
/// hash: the unlock script deletes the key with its waiting flag, and
/// goes on only where it deleted a flag. A subscriber that set no flag
/// (not a waiting manager of this crate) is not told; one that flagged the
/// key on every node, as a waiting manager's link does, is told by every
/// node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_publishes_only_where_someone_subscribes() {
    const CYCLES: u64 = 20;
    let cluster = Cluster::start(3);
    let redlock = cluster.redlock();
    reach_every_node(&redlock).await;
    for url in cluster.urls() {
        reset_stats(url);
    }
    let unwatched = resource("unwatched");
    for _ in 0..CYCLES {
        let lock = redlock.try_lock(&unwatched, TTL).await.unwrap();
        assert_eq!(redlock.unlock(&lock).await.unwrap(), 3);
    }
    for url in cluster.urls() {
        let scripts = calls(url, "evalsha");
        assert!(scripts >= CYCLES, "{url}: {scripts} scripts run");
        assert_eq!(
            calls(url, "publish"),
            0,
            "{url}: a release nobody waits for was published"
        );
        assert_eq!(
            calls(url, "hgetall"),
            0,
            "{url}: the waiters' hash was read"
        );
    }

    // A subscriber on every node: each node publishes the release.
    let watched = resource("watched");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut listeners = Vec::new();
    for url in cluster.urls() {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut pubsub = client.get_async_pubsub().await.unwrap();
        pubsub
            .subscribe(keys::release_channel(&watched))
            .await
            .unwrap();
        let (tx, url) = (tx.clone(), url.clone());
        listeners.push(tokio::spawn(async move {
            use futures::StreamExt;
            if pubsub.on_message().next().await.is_some() {
                let _ = tx.send(url);
            }
        }));
    }
    let lock = redlock.try_lock(&watched, TTL).await.unwrap();
    assert_eq!(redlock.unlock(&lock).await.unwrap(), 3);
    for url in cluster.urls() {
        assert_eq!(calls(url, "publish"), 0, "{url}: published with no flag");
    }
    for url in cluster.urls() {
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let _: () = redis::cmd("SET")
            .arg(keys::waiting(&watched))
            .arg(1)
            .arg("PX")
            .arg(10_000)
            .query(&mut conn)
            .unwrap();
    }
    let lock = redlock.try_lock(&watched, TTL).await.unwrap();
    assert_eq!(redlock.unlock(&lock).await.unwrap(), 3);
    let mut told = Vec::new();
    while told.len() < 3 {
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            Ok(Some(url)) => told.push(url),
            _ => panic!("only {told:?} published the watched release"),
        }
    }
}
