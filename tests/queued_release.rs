//! A release queued behind its lock's `SET` on the same connection, on its
//! worst days: a connection queue thousands deep behind a partitioned node,
//! a node paused or reset with both in flight, a script cache flushed under
//! the release, a `SET` sent again on Redis 6.2, many locks beside one slow
//! node, and a lock released from another runtime. In every case no key may
//! be left once the owed releases drained. (From an audit of the queued
//! release; each runs against real servers.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_harness::proxy::{Fault, Proxy};
use redlock_harness::raw::exists;
use redlock_harness::{Cluster, releases_drained, resource, warm};
use redlock_quorum::Redlock;

const TTL: Duration = Duration::from_secs(60);

/// The slow node is partitioned with its socket buffers full, so its
/// connection's driver takes nothing more, and thousands of requests queue
/// there. The `SET` of each lock then stands in the queue, and its release,
/// queued behind it, must stay behind it. With redis-rs's default room (50
/// requests) the `SET` waited for room, was put in the queue only when its
/// task ran again, and the release, whose task ran first, overtook it:
/// 1-5 of 30 keys left for their whole ttl in each of 7 runs (an audit).
/// The connection now has room for every request (`node::QUEUE_ROOM`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_waiting_for_room_in_a_full_connection_queue_stays_behind_its_set() {
    let fillers: usize = 1500;
    let filler_bytes: usize = 4096;
    let pairs: usize = 30;
    let mut cluster = Cluster::start(5);
    let proxy = Proxy::to_port(cluster.node(4).port()).await;
    let mut urls = cluster.urls()[..4].to_vec();
    urls.push(proxy.url());
    let redlock = Arc::new(
        Redlock::builder(urls.iter().map(String::as_str))
            .node_timeout(Duration::from_secs(10))
            .retry_count(0)
            .build()
            .unwrap(),
    );
    warm(&redlock).await;
    proxy.set(Fault::Blackhole);
    let pad = "f".repeat(filler_bytes);
    for i in 0..fillers {
        redlock
            .try_lock(format!("queued-filler:{pad}:{i}"), TTL)
            .await
            .expect("four nodes answer");
    }
    let mut names = Vec::new();
    let mut unlocks = Vec::new();
    for _ in 0..pairs {
        let res = resource("queued-full");
        let lock = redlock
            .try_lock(&res, TTL)
            .await
            .expect("four nodes answer");
        let redlock = redlock.clone();
        unlocks.push(tokio::spawn(async move { redlock.unlock(&lock).await }));
        names.push(res);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set(Fault::NONE);
    let mut results = Vec::new();
    for u in unlocks {
        results.push(u.await.unwrap());
    }
    assert!(releases_drained(&redlock, Duration::from_secs(30)).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let left: Vec<usize> = names
        .iter()
        .enumerate()
        .filter(|(_, n)| exists(&cluster.urls()[4], n.as_str()))
        .map(|(i, _)| i)
        .collect();
    for &i in &left {
        eprintln!(
            "left {i}: unlock {:?}, pttl on the slow node {} ms",
            results[i],
            redlock_harness::raw::pttl(&cluster.urls()[4], names[i].as_str())
        );
    }
    eprintln!("pairs {pairs}: keys left on the slow node: {left:?}");
    assert!(
        left.is_empty(),
        "{} of {pairs} keys left on the slow node after unlock: {left:?}",
        left.len()
    );
}

fn with_proxies(cluster: &Cluster, proxies: &[Proxy], first_proxied: usize) -> Vec<String> {
    let mut urls = cluster.urls()[..first_proxied].to_vec();
    urls.extend(proxies.iter().map(Proxy::url));
    urls
}

fn build(urls: &[String], node_timeout: Duration) -> Redlock {
    Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(node_timeout)
        .retry_delay(Duration::from_millis(5))
        .retry_jitter(Duration::from_millis(10))
        .build()
        .unwrap()
}

async fn gone_after_drain(cluster: &Cluster, redlock: &Redlock, keys: &[String]) -> Vec<String> {
    assert!(
        releases_drained(redlock, Duration::from_secs(40)).await,
        "owed releases never drained: {}",
        redlock.pending_releases()
    );
    keys.iter()
        .filter(|k| !cluster.nowhere(k.as_str()))
        .cloned()
        .collect()
}

/// Node 4 paused (SIGSTOP) with the lock's SET in flight there (paused
/// before the lock, or right after it returned), unlock at once, resumed
/// later (before or after the node timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_node_then_unlock_at_once_leaves_no_key() {
    let mut cluster = Cluster::start(5);
    let redlock = Arc::new(build(cluster.urls(), Duration::from_millis(500)));
    warm(&redlock).await;
    let mut failures = Vec::new();
    for (round, (before, pause_ms)) in [(true, 100u64), (true, 1500), (false, 100), (false, 1500)]
        .into_iter()
        .cycle()
        .take(12)
        .enumerate()
    {
        let res = resource("paused");
        if before {
            cluster.node(4).pause();
        }
        let lock = redlock
            .try_lock(&res, Duration::from_secs(30))
            .await
            .expect("4 nodes");
        if !before {
            cluster.node(4).pause();
        }
        let r = redlock.clone();
        let unlock = tokio::spawn(async move { r.unlock(&lock).await });
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        cluster.node(4).resume();
        let released = unlock.await.unwrap();
        let left = gone_after_drain(&cluster, &redlock, std::slice::from_ref(&res)).await;
        eprintln!(
            "round {round} (paused before lock {before}, {pause_ms} ms): unlock {released:?}, left {}",
            left.len()
        );
        if !left.is_empty() {
            failures.push((round, cluster.pttls(&res)));
        }
    }
    assert!(failures.is_empty(), "keys left: {failures:?}");
}

/// The slow node's connection reset while the SET (held back by the proxy)
/// and the queued release are in flight; healed shortly after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_reset_under_a_queued_release_leaves_no_key() {
    let mut cluster = Cluster::start(5);
    let proxy = Proxy::to_port(cluster.node(4).port()).await;
    let urls = with_proxies(&cluster, std::slice::from_ref(&proxy), 4);
    let redlock = Arc::new(build(&urls, Duration::from_secs(1)));
    warm(&redlock).await;
    let mut failures = Vec::new();
    for round in 0..15u64 {
        let res = resource("reset");
        proxy.set(Fault::RequestLatency(Duration::from_millis(100)));
        let lock = redlock
            .try_lock(&res, Duration::from_secs(30))
            .await
            .expect("4 nodes");
        let r = redlock.clone();
        let unlock = tokio::spawn(async move { r.unlock(&lock).await });
        tokio::time::sleep(Duration::from_millis((round % 5) * 40)).await;
        proxy.set(Fault::Reset);
        tokio::time::sleep(Duration::from_millis(60)).await;
        proxy.set(Fault::NONE);
        let released = unlock.await.unwrap();
        let left = gone_after_drain(&cluster, &redlock, std::slice::from_ref(&res)).await;
        eprintln!("round {round}: unlock {released:?}, left {}", left.len());
        if !left.is_empty() {
            failures.push((round, cluster.pttls(&res)));
        }
    }
    let _ = cluster.node(0).port();
    assert!(failures.is_empty(), "keys left: {failures:?}");
}

/// SCRIPT FLUSH on the slow node while the release is queued behind the
/// SET: the release's EVALSHA gets NOSCRIPT, loads, resends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_under_a_queued_release_leaves_no_key() {
    let mut cluster = Cluster::start(5);
    let proxy = Proxy::to_port(cluster.node(4).port()).await;
    let urls = with_proxies(&cluster, std::slice::from_ref(&proxy), 4);
    let redlock = Arc::new(build(&urls, Duration::from_secs(2)));
    warm(&redlock).await;
    let mut failures = Vec::new();
    for round in 0..8 {
        let res = resource("flush");
        redlock_harness::raw::reset_stats(&cluster.urls()[4]);
        proxy.set(Fault::RequestLatency(Duration::from_millis(150)));
        let lock = redlock
            .try_lock(&res, Duration::from_secs(30))
            .await
            .expect("4 nodes");
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut cluster.node(4).conn())
            .unwrap();
        let released = redlock.unlock(&lock).await;
        proxy.set(Fault::NONE);
        let loads = redlock_harness::raw::calls(&cluster.urls()[4], "script|load");
        let left = gone_after_drain(&cluster, &redlock, std::slice::from_ref(&res)).await;
        eprintln!(
            "round {round}: unlock {released:?}, script loads {loads}, left {}",
            left.len()
        );
        if !left.is_empty() || !matches!(released, Ok(5)) {
            failures.push((round, format!("{released:?}"), cluster.pttls(&res)));
        }
    }
    assert!(failures.is_empty(), "failures: {failures:?}");
}

/// Redis 6.2 with INFO denied: the first `SET … NX … GET` gets a syntax
/// error and the acquisition is sent again as a script. `extend` right
/// after `lock` (queued behind the first SET), then unlock. Run with
/// REDIS_SERVER pointing at Redis 6.2 (on 7.0 it checks the plain path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_queued_behind_a_set_sent_again_then_unlock() {
    let mut cluster = Cluster::start(5);
    let users = cluster.acl_user("noinfo", &["on", ">pw", "~*", "&*", "+@all", "-info"]);
    let proxy = Proxy::to_port(cluster.node(4).port()).await;
    let mut urls = users[..4].to_vec();
    urls.push(proxy.url().replacen("redis://", "redis://noinfo:pw@", 1));
    let old = redlock_harness::raw::before_redis_7(&cluster.urls()[4]);
    eprintln!("before Redis 7: {old}");
    let mut failures = Vec::new();
    for round in 0..6 {
        let redlock = build(&urls, Duration::from_secs(2));
        redlock_harness::raw::reset_stats(&cluster.urls()[4]);
        proxy.set(Fault::RequestLatency(Duration::from_millis(150)));
        let res = resource("extend-62");
        let lock = redlock
            .try_lock(&res, Duration::from_secs(10))
            .await
            .expect("4 nodes");
        let extended = redlock.extend(&lock, Duration::from_secs(60)).await;
        proxy.set(Fault::NONE);
        let Ok(extended) = extended else {
            failures.push(format!("round {round}: extend {extended:?}"));
            continue;
        };
        // Let the slow node's requests settle, then read its ttl.
        tokio::time::sleep(Duration::from_millis(800)).await;
        let pttls = cluster.pttls(&res);
        let evals = redlock_harness::raw::calls(&cluster.urls()[4], "eval");
        let released = redlock.unlock(&extended).await;
        let left = gone_after_drain(&cluster, &redlock, std::slice::from_ref(&res)).await;
        eprintln!(
            "round {round}: pttls after extend {pttls:?}, evals on slow node {evals}, unlock {released:?}, left {}",
            left.len()
        );
        if pttls.iter().any(|&p| p < 30_000) {
            failures.push(format!("round {round}: not extended everywhere: {pttls:?}"));
        }
        if !left.is_empty() || !matches!(released, Ok(5)) {
            failures.push(format!(
                "round {round}: unlock {released:?}, left {:?}",
                cluster.pttls(&res)
            ));
        }
    }
    let _ = cluster.node(0).port();
    assert!(failures.is_empty(), "failures: {failures:#?}");
}

/// One node blackholed, node timeout 50 ms: lock returns at once (quorum
/// of 4), unlock within about the node timeout, no hang; everything gone
/// after the partition heals and owed releases drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_node_with_a_50ms_node_timeout() {
    let mut cluster = Cluster::start(5);
    let proxy = Proxy::to_port(cluster.node(4).port()).await;
    let urls = with_proxies(&cluster, std::slice::from_ref(&proxy), 4);
    let redlock = build(&urls, Duration::from_millis(50));
    warm(&redlock).await;
    proxy.set(Fault::Blackhole);
    let mut names = Vec::new();
    let (mut lock_max, mut unlock_max) = (Duration::ZERO, Duration::ZERO);
    let mut unlock_times = Vec::new();
    for _ in 0..20 {
        let res = resource("blackhole");
        let t = Instant::now();
        let lock = redlock
            .try_lock(&res, Duration::from_secs(20))
            .await
            .expect("4 nodes");
        lock_max = lock_max.max(t.elapsed());
        let t = Instant::now();
        let released = tokio::time::timeout(Duration::from_secs(5), redlock.unlock(&lock))
            .await
            .expect("unlock hung");
        let took = t.elapsed();
        unlock_max = unlock_max.max(took);
        unlock_times.push(took.as_millis());
        assert!(matches!(released, Ok(4)), "{released:?}");
        names.push(res);
    }
    eprintln!("lock max {lock_max:?}; unlock max {unlock_max:?}; unlock ms {unlock_times:?}");
    eprintln!(
        "pending releases while partitioned: {}",
        redlock.pending_releases()
    );
    proxy.set(Fault::NONE);
    let left = gone_after_drain(&cluster, &redlock, &names).await;
    eprintln!("left after heal: {}", left.len());
    assert!(left.is_empty());
    assert!(
        unlock_max < Duration::from_millis(150),
        "unlock took {unlock_max:?}"
    );
    let _ = cluster.node(0).port();
}

/// 1,000 lock+unlock cycles on distinct keys from 64 tasks, one node
/// 20 ms slower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_locks_with_one_slow_node() {
    let mut cluster = Cluster::start(5);
    let proxy = Proxy::to_port(cluster.node(4).port()).await;
    let urls = with_proxies(&cluster, std::slice::from_ref(&proxy), 4);
    let redlock = Arc::new(build(&urls, Duration::from_secs(1)));
    warm(&redlock).await;
    proxy.set(Fault::Latency(Duration::from_millis(20)));
    let t = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..64 {
        let redlock = redlock.clone();
        tasks.push(tokio::spawn(async move {
            let mut names = Vec::new();
            let mut bad = Vec::new();
            for i in 0..(1000 / 64 + usize::from(task < 1000 % 64)) {
                let res = resource(&format!("many-{task}-{i}"));
                match redlock.try_lock(&res, Duration::from_secs(30)).await {
                    Ok(lock) => {
                        let r = redlock.unlock(&lock).await;
                        if !matches!(r, Ok(5)) {
                            bad.push(format!("{r:?}"));
                        }
                    }
                    Err(e) => bad.push(format!("lock {e}")),
                }
                names.push(res);
            }
            (names, bad)
        }));
    }
    let mut names = Vec::new();
    let mut bad = Vec::new();
    for t in tasks {
        let (n, b) = t.await.unwrap();
        names.extend(n);
        bad.extend(b);
    }
    let took = t.elapsed();
    proxy.set(Fault::NONE);
    let left = gone_after_drain(&cluster, &redlock, &names).await;
    eprintln!(
        "{} cycles in {took:?}; odd outcomes {} {:?}; keys left {}",
        names.len(),
        bad.len(),
        bad.iter().take(5).collect::<Vec<_>>(),
        left.len()
    );
    for k in &left {
        eprintln!("left: {k} pttls {:?}", cluster.pttls(k));
    }
    assert!(left.is_empty());
    let _ = cluster.node(0).port();
}

/// Lock on one runtime, unlock on another (threads with their own
/// runtimes), the slow node holding the SET back.
#[test]
fn lock_and_unlock_on_two_runtimes() {
    for (flavor_a, flavor_b) in [(false, false), (true, false), (true, true), (false, true)] {
        let rt = |multi: bool| {
            if multi {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap()
            } else {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
            }
        };
        let cluster = Cluster::start(5);
        let setup = rt(false);
        let proxy_rt = rt(true);
        let proxy = proxy_rt.block_on(Proxy::to_port(
            cluster.urls()[4]
                .rsplit(':')
                .next()
                .unwrap()
                .trim_end_matches('/')
                .parse()
                .unwrap(),
        ));
        let urls = with_proxies(&cluster, std::slice::from_ref(&proxy), 4);
        let redlock = Arc::new(build(&urls, Duration::from_secs(2)));
        drop(setup);
        let mut names = Vec::new();
        let mut results = Vec::new();
        let rt_a = rt(flavor_a);
        let rt_b = rt(flavor_b);
        // Warm both runtimes' connections for the "own connection" cases.
        rt_a.block_on(warm(&redlock));
        if !flavor_a || flavor_b {
            rt_b.block_on(warm(&redlock));
        }
        for _ in 0..5 {
            let res = resource("two-runtimes");
            proxy.set(Fault::RequestLatency(Duration::from_millis(150)));
            let (tx, rx) = std::sync::mpsc::channel();
            let ra = redlock.clone();
            let res_a = res.clone();
            std::thread::scope(|s| {
                let rt_a = &rt_a;
                let rt_b = &rt_b;
                s.spawn(move || {
                    rt_a.block_on(async {
                        let lock = ra
                            .try_lock(&res_a, Duration::from_secs(30))
                            .await
                            .expect("4 nodes");
                        tx.send(lock).unwrap();
                        // Keep this runtime driven a while (its tasks finish
                        // the SET on the slow node).
                        tokio::time::sleep(Duration::from_millis(600)).await;
                    })
                });
                let rb = redlock.clone();
                let r = s
                    .spawn(move || {
                        let lock = rx.recv().unwrap();
                        rt_b.block_on(async { rb.unlock(&lock).await })
                    })
                    .join()
                    .unwrap();
                results.push(format!("{r:?}"));
            });
            proxy.set(Fault::NONE);
            names.push(res);
        }
        let left = rt_b.block_on(async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            gone_after_drain(&cluster, &redlock, &names).await
        });
        eprintln!(
            "runtimes multi-thread (A {flavor_a}, B {flavor_b}): unlock {results:?}; left {}",
            left.len()
        );
        assert!(left.is_empty(), "{left:?}");
        drop(proxy);
        drop(proxy_rt);
    }
}
