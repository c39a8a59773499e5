//! Node failures: paused, killed, down at start and back again, busy with a
//! long script, or refusing our password until it is rotated.

use std::time::{Duration, Instant};

use redlock_harness::raw::exists;
use redlock_harness::{Cluster, RedisServer, manager, resource};
use redlock_quorum::{Error, NodeError, Redlock};

const TTL: Duration = Duration::from_secs(10);

/// A manager over `cluster` with `node_timeout`, its connections made.
async fn warm_with_timeout(cluster: &Cluster, node_timeout: Duration) -> Redlock {
    let redlock = cluster
        .builder()
        .node_timeout(node_timeout)
        .build()
        .unwrap();
    redlock_harness::warm(&redlock).await;
    redlock
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_paused_nodes_do_not_slow_the_lock_down_to_the_timeout() {
    let mut cluster = Cluster::start(5);
    // A long node timeout, so that finishing well before it proves the round
    // did not wait for the paused nodes (a loaded machine takes a second or
    // two at worst; waiting would take the full 30 s).
    let node_timeout = Duration::from_secs(30);
    let redlock = warm_with_timeout(&cluster, node_timeout).await;

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

/// A node that went silent (paused) holds up one release for the node
/// timeout, the one that finds it silent; later releases send it their
/// request but do not wait for it: each ends well before the node timeout,
/// with `Ok` from the four other nodes, and owes the silent node its
/// release. Once the node is back, every release lands (no key is left,
/// nothing is owed), and the releases after it release all five again
/// (`Ok(5)`: a silent node that answers while the others are still pending
/// counts).
///
/// Catches a release that waits for every node (each later unlock takes
/// the full node timeout: "round 0: the unlock took 4.002s").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_does_not_wait_for_a_node_that_went_silent() {
    let mut cluster = Cluster::start(5);
    let node_timeout = Duration::from_secs(4);
    let redlock = warm_with_timeout(&cluster, node_timeout).await;
    let ttl = Duration::from_secs(30);

    cluster.node(4).pause();
    // The first release waits for the paused node (its grant's SET is
    // pending there, and the node is not known silent yet).
    let res = resource("silent-first");
    let lock = redlock.lock(&res, ttl).await.expect("4 live nodes");
    let released = redlock.unlock(&lock).await;
    assert!(matches!(released, Ok(4)), "first unlock: {released:?}");
    let mut names = vec![res];
    for round in 0..5 {
        let res = resource(&format!("silent-{round}"));
        let lock = redlock.lock(&res, ttl).await.expect("4 live nodes");
        let start = Instant::now();
        let released = redlock.unlock(&lock).await;
        let took = start.elapsed();
        assert!(
            took < node_timeout / 2,
            "round {round}: the unlock took {took:?}, waiting for the silent node"
        );
        assert!(matches!(released, Ok(4)), "round {round}: {released:?}");
        names.push(res);
    }
    assert!(
        redlock.pending_releases() > 0,
        "the silent node is owed its releases"
    );
    cluster.node(4).resume();
    let gone = cluster.eventually(Duration::from_secs(20), |c| {
        names.iter().all(|res| c.values(res) == vec![None; 5])
    });
    assert!(
        gone,
        "keys left once the node was back: {:?}",
        names
            .iter()
            .map(|res| cluster.values(res))
            .collect::<Vec<_>>()
    );
    let drained = Instant::now() + Duration::from_secs(20);
    while redlock.pending_releases() > 0 && Instant::now() < drained {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(redlock.pending_releases(), 0, "releases still owed");
    // Back, the node answers the releases again: within a few cycles an
    // unlock releases all five.
    let mut all_five = false;
    for round in 0..20 {
        let res = resource(&format!("heard-{round}"));
        let lock = redlock.lock(&res, ttl).await.expect("5 live nodes");
        tokio::time::sleep(Duration::from_millis(10)).await;
        if let Ok(5) = redlock.unlock(&lock).await {
            all_five = true;
            break;
        }
    }
    assert!(
        all_five,
        "no unlock released all five nodes once node 4 was back"
    );
}

/// A fresh manager (a new process, say) with a node paused before its
/// first call: the first lock does not wait the connect timeout for it (the
/// warm-up gives the others the node timeout once a quorum connected, and
/// the paused node's connection goes on in the background), and the node,
/// not connected within that grace, is silent: neither the first unlock
/// (which would wait for the connection under way) nor one after the
/// connection failed (which would try again) waits for it. When the node
/// is back, no key is left.
///
/// Catches a warm-up that waits for every node (the first lock takes the
/// 5 s connect timeout) and a node still connecting after the grace that is
/// not silent (the first unlock waits out the connect timeout, 4.8 s here:
/// found by a new user's trial, 449 ms with the defaults).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_manager_does_not_wait_for_a_paused_node() {
    let mut cluster = Cluster::start(5);
    let connect_timeout = Duration::from_secs(5);
    cluster.node(4).pause();
    let redlock = cluster
        .builder()
        .connect_timeout(connect_timeout)
        .node_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let res = resource("fresh-paused");
    let start = Instant::now();
    let lock = redlock.try_lock(&res, TTL).await.expect("4 live nodes");
    let took = start.elapsed();
    assert!(
        took < connect_timeout / 2,
        "the first lock took {took:?}, waiting for the paused node's connection"
    );
    // Right away: the paused node, still connecting after the warm-up's
    // grace, is silent already.
    let start = Instant::now();
    let released = redlock.unlock(&lock).await;
    let took = start.elapsed();
    assert!(
        took < connect_timeout / 2,
        "the first unlock took {took:?}, waiting for the paused node's connection"
    );
    assert!(matches!(released, Ok(4)), "first unlock: {released:?}");
    // Once its connection attempt failed (the connect timeout passed), the
    // node stays silent: a later unlock, whose connection attempt to it
    // would take the connect timeout again, does not wait for it.
    tokio::time::sleep(connect_timeout + Duration::from_millis(500)).await;
    let lock = redlock.try_lock(&res, TTL).await.expect("4 live nodes");
    let start = Instant::now();
    let released = redlock.unlock(&lock).await;
    let took = start.elapsed();
    assert!(
        took < connect_timeout / 2,
        "the unlock took {took:?}, waiting for the paused node"
    );
    assert!(matches!(released, Ok(4)), "unlock: {released:?}");
    cluster.node(4).resume();
    assert!(
        cluster.eventually(Duration::from_secs(20), |c| c.values(&res) == vec![None; 5]),
        "key left once the node was back: {:?}",
        cluster.values(&res)
    );
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
    let redlock = warm_with_timeout(&cluster, node_timeout).await;
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
    // Time for the proxy's task to see the fault: beside four CPU burners,
    // the release reached node 2 once before the proxy had (the proxy
    // forwarded the request, then reset on the reply), and the key was
    // gone before any retry.
    tokio::time::sleep(Duration::from_millis(200)).await;
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

/// A node whose first connection failed with an error reply (a
/// wrong password) is tried again, and used once the password is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_refused_authentication_is_tried_again() {
    let rotated = RedisServer::start_with(&["--requirepass", "old"]);
    let mut down = RedisServer::start();
    let up = RedisServer::start();
    let new_url = format!("redis://:new@127.0.0.1:{}/", rotated.port());
    let redlock = manager(&[new_url.clone(), down.url(), up.url()]);
    down.kill(); // the rotated node is needed for the quorum
    let res = resource("auth-rotated");
    let first = redlock.try_lock(&res, TTL).await;
    assert!(first.is_err(), "locked with a wrong password: {first:?}");

    let mut admin = redis::Client::open(format!("redis://:old@127.0.0.1:{}/", rotated.port()))
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("new")
        .query(&mut admin)
        .unwrap();

    let start = Instant::now();
    let lock = loop {
        match redlock.try_lock(&res, TTL).await {
            Ok(lock) => break lock,
            Err(e) if start.elapsed() < Duration::from_secs(5) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the node was never tried again: {e}"),
        }
    };
    assert!(exists(&new_url, &res), "the key reached the rotated node");
    redlock.unlock(&lock).await.unwrap();
}

/// A node answering `BUSY` (a long script) is a transient failure:
/// `lock` retries until the script ends instead of failing at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_retries_through_a_busy_node() {
    const BUSY_FOR_ONE_SECOND: &str = "local t = redis.call('TIME') \
        local s = tonumber(t[1]) * 1000000 + tonumber(t[2]) \
        while true do \
            local n = redis.call('TIME') \
            if tonumber(n[1]) * 1000000 + tonumber(n[2]) - s > 1000000 then return 1 end \
        end";
    let mut nodes: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with(&["--lua-time-limit", "10"]))
        .collect();
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .retry_count(50)
        .retry_delay(Duration::from_millis(50))
        .retry_jitter(Duration::from_millis(10))
        .node_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    redlock_harness::warm(&redlock).await;
    nodes[2].kill();

    let mut probe = nodes[0].conn();
    let mut script_con = nodes[0].conn();
    let script = std::thread::spawn(move || {
        redis::cmd("EVAL")
            .arg(BUSY_FOR_ONE_SECOND)
            .arg(0)
            .query::<i64>(&mut script_con)
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while redis::cmd("PING").query::<String>(&mut probe).is_ok() {
        assert!(Instant::now() < deadline, "node 0 never became busy");
        std::thread::sleep(Duration::from_millis(5));
    }

    let start = Instant::now();
    let outcome = redlock.lock(&resource("busy"), TTL).await;
    let took = start.elapsed();
    script.join().unwrap().expect("the busy script ran");
    assert!(outcome.is_ok(), "lock gave up after {took:?}: {outcome:?}");
}
