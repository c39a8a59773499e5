//! Node failures: paused, killed, down at start and back again.

use std::time::{Duration, Instant};

use redlock_harness::{Cluster, resource};
use redlock_quorum::{Error, NodeError};

const TTL: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_paused_nodes_do_not_slow_the_lock_down_to_the_timeout() {
    let mut cluster = Cluster::start(5);
    // A long node timeout, so that finishing well before it proves the round
    // did not wait for the paused nodes (a loaded machine takes a second or
    // two at worst; waiting would take the full 30 s).
    let node_timeout = Duration::from_secs(30);
    let redlock = cluster
        .builder()
        .node_timeout(node_timeout)
        .build()
        .unwrap();
    redlock_harness::warm(&redlock).await;

    cluster.node(1).pause();
    cluster.node(3).pause();
    let res = resource("paused");
    let start = Instant::now();
    let lock = redlock
        .lock(&res, TTL)
        .await
        .expect("3 live nodes are a quorum");
    let took = start.elapsed();
    assert!(
        took < node_timeout / 3,
        "took {took:?}, waited for a paused node"
    );
    let values = cluster.values(&res);
    for i in [0, 2, 4] {
        assert_eq!(values[i].as_deref(), Some(lock.token()), "node {i}");
    }
    cluster.node(1).resume();
    cluster.node(3).resume();
    // unlock reaches every node, the formerly paused ones included
    let released = redlock.unlock(&lock).await.unwrap();
    assert!(released >= 3, "released on {released}");
    assert!(cluster.eventually(Duration::from_secs(10), |c| c.values(&res) == vec![None; 5]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_down_is_no_quorum_and_leaves_no_key() {
    let mut cluster = Cluster::start(5);
    let redlock = cluster.builder().retry_count(1).build().unwrap();
    for i in [0, 2, 3] {
        cluster.node(i).kill();
    }
    let res = resource("down");
    let err = redlock
        .lock(&res, TTL)
        .await
        .expect_err("2 of 5 is no quorum");
    match &err {
        Error::NoQuorum {
            granted,
            required,
            failures,
            ..
        } => {
            assert_eq!(*required, 3);
            assert!(*granted <= 2);
            assert!(failures.len() >= 3, "{failures:?}");
            assert!(failures.iter().filter(|f| f.cause.is_unreachable()).count() >= 3);
        }
        other => panic!("expected NoQuorum, got {other}"),
    }
    assert!(
        err.to_string().contains("127.0.0.1:"),
        "names the nodes: {err}"
    );
    assert_eq!(cluster.values(&res)[1], None, "released on live node 1");
    assert_eq!(cluster.values(&res)[4], None, "released on live node 4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_paused_nodes_time_out_and_the_attempt_is_released() {
    let mut cluster = Cluster::start(5);
    // long enough for the live nodes to answer on a loaded machine
    let node_timeout = Duration::from_secs(1);
    let redlock = cluster
        .builder()
        .node_timeout(node_timeout)
        .build()
        .unwrap();
    redlock_harness::warm(&redlock).await;
    for i in 0..3 {
        cluster.node(i).pause();
    }
    let res = resource("timeouts");
    let err = redlock.try_lock(&res, TTL).await.expect_err("no quorum");
    match &err {
        Error::NoQuorum { failures, .. } => {
            let timeouts = failures
                .iter()
                .filter(|f| matches!(f.cause, NodeError::Timeout))
                .count();
            assert_eq!(timeouts, 3, "{failures:?}");
        }
        other => panic!("expected NoQuorum, got {other}"),
    }
    for i in 0..3 {
        cluster.node(i).resume();
    }
    // the SETs queued on the paused nodes ran on resume, and so did the
    // releases queued behind them
    assert!(
        cluster.eventually(Duration::from_secs(10), |c| c.values(&res) == vec![None; 5]),
        "left: {:?}",
        cluster.values(&res)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_down_at_start_does_not_stop_locking_and_is_used_when_back() {
    let mut cluster = Cluster::start(5);
    cluster.node(0).kill();
    cluster.node(4).kill();
    // build() connects to nothing, so it succeeds with nodes down
    let redlock = cluster.redlock();
    let res = resource("back");
    let lock = redlock.lock(&res, TTL).await.expect("3 of 5 up");
    assert_eq!(redlock.unlock(&lock).await.unwrap(), 3);

    cluster.node(0).restart();
    cluster.node(4).restart();
    let mut all_five = false;
    for _ in 0..50 {
        let lock = redlock.lock(&res, TTL).await.expect("lock");
        let holders = cluster.count(&res, lock.token());
        redlock.unlock(&lock).await.unwrap();
        if holders == 5 {
            all_five = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(all_five, "restarted nodes were never used again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_and_restarted_node_is_reconnected() {
    let mut cluster = Cluster::start(3);
    let redlock = cluster.redlock();
    let res = resource("reconnect");
    let lock = redlock.lock(&res, TTL).await.unwrap();
    redlock.unlock(&lock).await.unwrap();
    cluster.node(2).restart();
    cluster.node(1).restart();
    // 2 of 3 restarted: the quorum needs one of them, so locking works only
    // once the manager reconnected
    let start = Instant::now();
    let lock = loop {
        match redlock.try_lock(&res, TTL).await {
            Ok(lock) => break lock,
            Err(e) if start.elapsed() < Duration::from_secs(20) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("never reconnected: {e}"),
        }
    };
    assert!(cluster.count(&res, lock.token()) >= 2);
    redlock.unlock(&lock).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_retries_an_unreachable_node_in_the_background() {
    use redlock_harness::proxy::{Fault, Proxy};
    // Through proxies: a paused node would run the release queued on its
    // socket when resumed, retry or not. A reset connection loses it, so
    // only the background retry can remove the key there.
    let mut cluster = Cluster::start(5);
    let mut proxies = Vec::new();
    for i in 0..5 {
        proxies.push(Proxy::to_port(cluster.node(i).port()).await);
    }
    let redlock = redlock_quorum::Redlock::builder(proxies.iter().map(Proxy::url))
        .build()
        .unwrap();
    redlock_harness::warm(&redlock).await;
    let res = resource("unlock-retry");
    let ttl = Duration::from_secs(30);
    let lock = redlock.try_lock(&res, ttl).await.unwrap();
    assert!(
        cluster.eventually(Duration::from_secs(2), |c| c.count(&res, lock.token()) == 5),
        "{:?}",
        cluster.values(&res)
    );
    proxies[2].set(Fault::Reset);
    let released = redlock.unlock(&lock).await.expect("4 of 5 released");
    assert_eq!(released, 4);
    assert_eq!(
        cluster.value_on(2, &res).as_deref(),
        Some(lock.token()),
        "the unreachable node still holds the key"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        cluster.value_on(2, &res).is_some(),
        "released through a reset proxy?"
    );
    proxies[2].set(Fault::NONE);
    // the retry pauses double up to a second: within a few seconds of
    // healing (10 s for a loaded machine), and far before the 30 s ttl
    let healed = Instant::now();
    assert!(
        cluster.eventually(Duration::from_secs(10), |c| c.value_on(2, &res).is_none()),
        "the key stayed on the node that was unreachable during unlock"
    );
    println!(
        "released on the healed node {:?} after healing",
        healed.elapsed()
    );
}
