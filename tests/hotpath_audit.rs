//! An audit of three hot-path changes, on real servers: each node's request
//! owning its in-flight `Mark` (`call(..).map(..)`), the mark that notifies
//! only where a waiter watches (`Settled::watched`), and the unlock script's
//! early return at a `DEL` count of 1. Each test targets one way these can
//! go wrong: a later step overtaking an earlier request still in flight
//! (a key left behind), a lost wake-up (an unlock that never ends), a
//! request dropped unfinished that never counts as settled (cancelled, or
//! its runtime shut down), and a release that skips the gate's slow path
//! (a waiter never told) or leaves its key (a user denied the flag).

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_harness::proxy::{Fault, Proxy};
use redlock_harness::runtimes::{current_thread, multi_thread};
use redlock_harness::{Cluster, releases_drained, resource, warm};
use redlock_quorum::Redlock;

const TTL: Duration = Duration::from_secs(60);

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

/// The keys of `names` still on some node once the owed releases drained
/// and every request still in flight has had time to land.
async fn left_after_settling(
    cluster: &Cluster,
    redlock: &Redlock,
    names: &[String],
    settle: Duration,
) -> Vec<String> {
    assert!(
        releases_drained(redlock, Duration::from_secs(30)).await,
        "owed releases never drained: {}",
        redlock.pending_releases()
    );
    tokio::time::sleep(settle).await;
    names
        .iter()
        .filter(|k| !cluster.nowhere(k.as_str()))
        .cloned()
        .collect()
}

/// Unlock, extend and verify right after `try_lock` returned at a quorum,
/// while one or two nodes (behind proxies) are 100-300 ms slow, replies or
/// requests held back. Before each round the slow nodes' script caches
/// are flushed and the release's script loaded again (a side lock): the
/// extension's `EVALSHA` then gets `NOSCRIPT` there and is sent again, so
/// a release that does not wait for it to settle runs first, and the
/// extension's heal path sets the key again for a whole ttl. Every step
/// must end (10 s each) and no key may be left once things settle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_right_after_a_quorum_beside_slow_nodes_leave_no_key() {
    let mut cluster = Cluster::start(5);
    let proxies = [
        Proxy::to_port(cluster.node(3).port()).await,
        Proxy::to_port(cluster.node(4).port()).await,
    ];
    let urls = with_proxies(&cluster, &proxies, 3);
    let redlock = Arc::new(build(&urls, Duration::from_secs(1)));
    warm(&redlock).await;
    let step = Duration::from_secs(10);
    let mut names = Vec::new();
    let mut failures = Vec::new();
    let mut slowest = Duration::ZERO;
    for round in 0..12u32 {
        let delay = Duration::from_millis([100, 200, 300][round as usize % 3]);
        let fault = if round % 4 < 2 {
            Fault::Latency(delay)
        } else {
            Fault::RequestLatency(delay)
        };
        let slow = if round % 2 == 0 { 1 } else { 2 };
        for (i, p) in proxies.iter().enumerate() {
            p.set(if i < slow { fault } else { Fault::NONE });
        }
        for i in 3..3 + slow {
            redlock_harness::raw::script_flush(&cluster.urls()[i]);
        }
        let side = redlock
            .try_lock(&resource("side"), TTL)
            .await
            .expect("side lock");
        let _ = redlock.unlock(&side).await;
        let res = resource("hot");
        let lock = redlock
            .try_lock(&res, TTL)
            .await
            .expect("a quorum of fast nodes");
        names.push(res.clone());
        let t = Instant::now();
        let outcome: Result<String, String> = async {
            let timed = |what: &'static str| move |_| format!("{what} hung for {step:?}");
            match round % 4 {
                0 => {
                    let n = tokio::time::timeout(step, redlock.unlock(&lock))
                        .await
                        .map_err(timed("unlock"))?;
                    Ok(format!("unlock {n:?}"))
                }
                1 => {
                    let e = tokio::time::timeout(step, redlock.extend(&lock, TTL))
                        .await
                        .map_err(timed("extend"))?;
                    // Through the old handle: behind the extension all the same.
                    let n = tokio::time::timeout(step, redlock.unlock(&lock))
                        .await
                        .map_err(timed("unlock"))?;
                    Ok(format!("extend {:?}, unlock (old handle) {n:?}", e.is_ok()))
                }
                2 => {
                    let v = tokio::time::timeout(step, redlock.verify(&lock))
                        .await
                        .map_err(timed("verify"))?;
                    let n = tokio::time::timeout(step, redlock.unlock(&lock))
                        .await
                        .map_err(timed("unlock"))?;
                    Ok(format!("verify {v:?}, unlock {n:?}"))
                }
                _ => {
                    let e = tokio::time::timeout(step, redlock.extend(&lock, TTL))
                        .await
                        .map_err(timed("extend"))?
                        .map_err(|e| format!("extend {e}"))?;
                    let v = tokio::time::timeout(step, redlock.verify(&e))
                        .await
                        .map_err(timed("verify"))?;
                    let n = tokio::time::timeout(step, redlock.unlock(&e))
                        .await
                        .map_err(timed("unlock"))?;
                    Ok(format!(
                        "extend ok, verify {v:?}, unlock (new handle) {n:?}"
                    ))
                }
            }
        }
        .await;
        let took = t.elapsed();
        slowest = slowest.max(took);
        eprintln!("round {round} ({slow} slow, {fault:?}): {outcome:?} in {took:?}");
        if let Err(e) = outcome {
            failures.push(format!("round {round}: {e}"));
        }
    }
    for p in &proxies {
        p.set(Fault::NONE);
    }
    let left = left_after_settling(&cluster, &redlock, &names, Duration::from_millis(1500)).await;
    for k in &left {
        failures.push(format!("left: {k} pttls {:?}", cluster.pttls(k)));
    }
    eprintln!("slowest round {slowest:?}; keys left {}", left.len());
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Hundreds of tasks, each: lock, extend, then unlock after a pause that
/// puts the unlock's wait near the moment the slow node's extension
/// settles. The extension is a script (sent again after `NOSCRIPT`), so
/// the unlock does not queue behind it on the connection: it waits for the
/// extension's mark (`InFlight::settled`). A lost wake-up leaves it there
/// for good: nothing bounds that wait but the mark. Each unlock must end
/// within twice the node timeout plus a generous margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_unlocks_waiting_behind_extensions_all_wake() {
    let mut cluster = Cluster::start(5);
    let proxy = Proxy::to_port(cluster.node(4).port()).await;
    let urls = with_proxies(&cluster, std::slice::from_ref(&proxy), 4);
    let node_timeout = Duration::from_secs(1);
    let redlock = Arc::new(build(&urls, node_timeout));
    warm(&redlock).await;
    proxy.set(Fault::Latency(Duration::from_millis(120)));
    let bound = node_timeout * 2 + Duration::from_secs(5);
    let tasks: u64 = 300;
    let cycles: u64 = 8;
    let started = Instant::now();
    let mut handles = Vec::new();
    for task in 0..tasks {
        let redlock = redlock.clone();
        handles.push(tokio::spawn(async move {
            let mut names = Vec::new();
            let mut hung = Vec::new();
            let mut odd = Vec::new();
            let mut slowest = Duration::ZERO;
            for cycle in 0..cycles {
                let res = resource(&format!("wake-{task}-{cycle}"));
                let lock = match redlock.try_lock(&res, TTL).await {
                    Ok(lock) => lock,
                    Err(e) => {
                        odd.push(format!("lock: {e}"));
                        continue;
                    }
                };
                names.push(res);
                let extended = match tokio::time::timeout(bound, redlock.extend(&lock, TTL)).await {
                    Ok(Ok(extended)) => extended,
                    Ok(Err(e)) => {
                        odd.push(format!("extend: {e}"));
                        lock
                    }
                    Err(_) => {
                        hung.push(format!("{task}/{cycle}: extend"));
                        continue;
                    }
                };
                // 0-200 ms: around the slow node's 120 ms.
                let pause = (task * 7919 + cycle * 104_729) % 200;
                tokio::time::sleep(Duration::from_millis(pause)).await;
                let t = Instant::now();
                match tokio::time::timeout(bound, redlock.unlock(&extended)).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => odd.push(format!("unlock: {e}")),
                    Err(_) => hung.push(format!("{task}/{cycle}: unlock (pause {pause} ms)")),
                }
                slowest = slowest.max(t.elapsed());
            }
            (names, hung, odd, slowest)
        }));
    }
    let (mut names, mut hung, mut odd, mut slowest) =
        (Vec::new(), Vec::new(), Vec::new(), Duration::ZERO);
    for h in handles {
        let (n, h, o, s) = h.await.unwrap();
        names.extend(n);
        hung.extend(h);
        odd.extend(o);
        slowest = slowest.max(s);
    }
    let took = started.elapsed();
    proxy.set(Fault::NONE);
    let left = left_after_settling(&cluster, &redlock, &names, Duration::from_millis(1500)).await;
    eprintln!(
        "{} cycles in {took:?}; slowest unlock {slowest:?}; hung {} {:?}; odd {} {:?}; left {}",
        names.len(),
        hung.len(),
        hung.iter().take(5).collect::<Vec<_>>(),
        odd.len(),
        odd.iter().take(5).collect::<Vec<_>>(),
        left.len()
    );
    assert!(
        hung.is_empty(),
        "{} steps never ended: {:?}",
        hung.len(),
        &hung[..hung.len().min(10)]
    );
    assert!(
        left.is_empty(),
        "keys left: {:?}",
        &left[..left.len().min(10)]
    );
}

/// The lock future dropped (cancelled) mid-round while the quorum needs a
/// slow node (three of five behind proxies, 100-300 ms): the attempt's
/// cleanup releases what its round set, behind the requests already on
/// their connections. Rounds also cancel an extension or an unlock mid-round
/// and then unlock in full: that unlock must end, and no key may be left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_cancelled_mid_round_leave_no_key_and_no_hang() {
    let mut cluster = Cluster::start(5);
    let mut proxies = Vec::new();
    for i in 2..5 {
        proxies.push(Proxy::to_port(cluster.node(i).port()).await);
    }
    let urls = with_proxies(&cluster, &proxies, 2);
    let redlock = Arc::new(build(&urls, Duration::from_secs(1)));
    warm(&redlock).await;
    let step = Duration::from_secs(10);
    let mut names = Vec::new();
    let mut failures = Vec::new();
    let (mut cancelled, mut granted) = (0, 0);
    for round in 0..24u64 {
        let delay = [100u64, 200, 300][round as usize % 3];
        for (i, p) in proxies.iter().enumerate() {
            // Each slow node a little slower than the one before it.
            let d = Duration::from_millis(delay + 20 * i as u64);
            p.set(if round % 2 == 0 {
                Fault::Latency(d)
            } else {
                Fault::RequestLatency(d)
            });
        }
        let res = resource("cancelled");
        names.push(res.clone());
        let cut = Duration::from_millis((round * 37) % (delay + 60));
        match round % 3 {
            0 => match tokio::time::timeout(cut, redlock.try_lock(&res, TTL)).await {
                Err(_) => cancelled += 1,
                Ok(Ok(lock)) => {
                    granted += 1;
                    match tokio::time::timeout(step, redlock.unlock(&lock)).await {
                        Ok(_) => {}
                        Err(_) => failures.push(format!("round {round}: unlock hung")),
                    }
                }
                Ok(Err(e)) => failures.push(format!("round {round}: lock {e}")),
            },
            1 => {
                let lock = redlock.try_lock(&res, TTL).await.expect("lock");
                let _ = tokio::time::timeout(cut, redlock.extend(&lock, TTL)).await;
                if tokio::time::timeout(step, redlock.unlock(&lock))
                    .await
                    .is_err()
                {
                    failures.push(format!(
                        "round {round}: unlock after a cancelled extension hung"
                    ));
                }
            }
            _ => {
                let lock = redlock.try_lock(&res, TTL).await.expect("lock");
                let _ = tokio::time::timeout(cut, redlock.unlock(&lock)).await;
                match tokio::time::timeout(step, redlock.unlock(&lock)).await {
                    Ok(_) => {}
                    Err(_) => failures.push(format!(
                        "round {round}: unlock after a cancelled unlock hung"
                    )),
                }
            }
        }
    }
    for p in &proxies {
        p.set(Fault::NONE);
    }
    let left = left_after_settling(&cluster, &redlock, &names, Duration::from_millis(1500)).await;
    for k in &left {
        failures.push(format!("left: {k} pttls {:?}", cluster.pttls(k)));
    }
    // Every resource can be locked again at once.
    for res in &names {
        match redlock.try_lock(res, TTL).await {
            Ok(lock) => {
                let _ = redlock.unlock(&lock).await;
            }
            Err(e) => failures.push(format!("{res} not free again: {e}")),
        }
    }
    eprintln!(
        "lock rounds: cancelled {cancelled}, granted {granted}; keys left {}",
        left.len()
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Lock and extend on a runtime while two of five nodes are slow (300 ms
/// replies) or paused, so that both return at a quorum and their requests
/// to the slow nodes are left to the finisher task; then that runtime is shut
/// down with them in flight (and with a lock attempt of its own cancelled
/// mid-round). On a new runtime the same manager unlocks: the requests the
/// shutdown dropped count as settled (their marks dropped with them), so
/// the unlock must end (10 s), and no key of the lock may be left.
#[test]
fn a_runtime_shut_down_mid_round_then_the_manager_on_a_new_one() {
    let mut cluster = Cluster::start(5);
    // The proxies on a runtime of their own, alive throughout.
    let proxy_rt = multi_thread();
    let ports = [cluster.node(3).port(), cluster.node(4).port()];
    let proxies: Vec<Proxy> = ports
        .iter()
        .map(|&p| proxy_rt.block_on(Proxy::to_port(p)))
        .collect();
    let urls = with_proxies(&cluster, &proxies, 3);
    let redlock = Arc::new(build(&urls, Duration::from_secs(1)));
    let step = Duration::from_secs(10);
    let mut failures = Vec::new();
    let mut names = Vec::new();
    let mut cancelled_names = Vec::new();
    for round in 0..8u32 {
        let paused = round % 4 == 3;
        let first = if round % 2 == 0 {
            multi_thread()
        } else {
            current_thread()
        };
        first.block_on(warm(&redlock));
        let res = resource("shutdown");
        names.push(res.clone());
        let other = resource("shutdown-cancelled");
        cancelled_names.push(other.clone());
        if paused {
            cluster.node(4).pause();
            proxies[0].set(Fault::Latency(Duration::from_millis(300)));
        } else {
            for p in &proxies {
                p.set(Fault::Latency(Duration::from_millis(300)));
            }
        }
        let handles = first.block_on(async {
            let lock = redlock
                .try_lock(&res, TTL)
                .await
                .expect("a quorum of fast nodes");
            let extended = redlock.extend(&lock, TTL).await.expect("extended");
            let r = redlock.clone();
            tokio::spawn(async move {
                let _ = r.try_lock(&other, TTL).await;
            });
            tokio::task::yield_now().await;
            (lock, extended)
        });
        drop(first);
        // The slow nodes answer at once now: the new runtime's connections
        // are made within the timeouts, and its unlock reaches the point
        // where it goes after the requests the shutdown dropped.
        for p in &proxies {
            p.set(Fault::NONE);
        }
        let second = if round % 3 == 0 {
            current_thread()
        } else {
            multi_thread()
        };
        let (lock, extended) = handles;
        let resumer = paused.then(|| {
            // Back before the unlock's own timeout (1 s), or after it.
            let pid = cluster.node(4).pid().expect("running").to_string();
            let after = Duration::from_millis(if round < 4 { 300 } else { 1500 });
            std::thread::spawn(move || {
                std::thread::sleep(after);
                let _ = std::process::Command::new("kill")
                    .args(["-CONT", &pid])
                    .status();
            })
        });
        let t = Instant::now();
        let outcome = second.block_on(async {
            let which = if round % 2 == 0 { &lock } else { &extended };
            tokio::time::timeout(step, redlock.unlock(which)).await
        });
        let took = t.elapsed();
        if let Some(resumer) = resumer {
            resumer.join().unwrap();
            cluster.node(4).resume();
        }
        eprintln!("round {round} (paused {paused}): unlock {outcome:?} in {took:?}");
        match outcome {
            Err(_) => {
                failures.push(format!("round {round}: unlock hung on the new runtime"));
                break;
            }
            Ok(Err(e)) => failures.push(format!("round {round}: unlock {e}")),
            Ok(Ok(_)) => {}
        }
        drop(second);
    }
    let check = current_thread();
    let left = check.block_on(left_after_settling(
        &cluster,
        &redlock,
        &names,
        Duration::from_millis(1500),
    ));
    for k in &left {
        failures.push(format!("left: {k} pttls {:?}", cluster.pttls(k)));
    }
    let cancelled_left = cancelled_names
        .iter()
        .filter(|k| !cluster.nowhere(k.as_str()))
        .count();
    eprintln!(
        "keys left {}; attempts cancelled by the shutdown whose keys stay for their ttl: {cancelled_left} of {}",
        left.len(),
        cancelled_names.len()
    );
    drop(proxies);
    drop(proxy_rt);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A hand-off within this of the release came from its publish: the
/// waiters' timed retry and the holder's ttl are both 30 s.
const NOTIFIED: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_secs(30);

/// Whether a `PUBLISH` ran on some node since the stats were reset. (On
/// every node it need not: the first publish wakes the waiter, which may
/// take the lock and unsubscribe before a slower node runs the release;
/// seen on a loaded machine.)
fn published_somewhere(cluster: &Cluster) -> bool {
    (0..cluster.len()).any(|i| cluster.calls(i, "publish") > 0)
}

fn flush_everywhere(cluster: &Cluster) {
    for url in cluster.urls() {
        redlock_harness::raw::script_flush(url);
    }
}

/// Waits for the first of `waiters` to be granted, within [`NOTIFIED`]:
/// its index and lock.
async fn first_granted(
    waiters: &mut Vec<tokio::task::JoinHandle<Result<redlock_quorum::Lock, redlock_quorum::Error>>>,
) -> Result<(usize, redlock_quorum::Lock), String> {
    let deadline = Instant::now() + NOTIFIED;
    loop {
        if let Some(i) = waiters.iter().position(|w| w.is_finished()) {
            let lock = waiters
                .remove(i)
                .await
                .unwrap()
                .map_err(|e| format!("waiter {i}: {e}"))?;
            return Ok((i, lock));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "no waiter granted within {NOTIFIED:?} of the release"
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The gate's slow path: two managers wait for a key (each flags it on
/// every node), the script caches are flushed (every release is loaded
/// and sent again after `NOSCRIPT`), and the key is released twice: each
/// release finds the flag (set again by the first for the manager it did
/// not wake) and publishes, so each waiter is granted long before its
/// timed retry or the holder's ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flagged_releases_after_script_flush_wake_each_waiter() {
    let cluster = Cluster::start(3);
    let holder = cluster
        .builder()
        .node_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let poller = || {
        cluster
            .builder()
            .node_timeout(Duration::from_secs(2))
            .retry_delay(POLL)
            .retry_jitter(Duration::ZERO)
            .build()
            .unwrap()
    };
    let managers = [poller(), poller()];
    let mut failures = Vec::new();
    for round in 0..3 {
        let res = resource("gate");
        let lock = holder.try_lock(&res, POLL).await.unwrap();
        let mut waiters: Vec<_> = managers
            .iter()
            .map(|m| {
                let (m, res) = (m.clone(), res.clone());
                tokio::spawn(
                    async move { m.lock_within(&res, POLL, Duration::from_secs(20)).await },
                )
            })
            .collect();
        assert!(
            cluster.eventually(Duration::from_secs(5), |c| (0..3)
                .all(|i| c.subscribers(i, &res) == 2 && c.flagged(i, &res))),
            "round {round}: the waiters never subscribed and flagged the key everywhere"
        );
        flush_everywhere(&cluster);
        cluster.reset_stats();
        let t = Instant::now();
        let released = holder.unlock(&lock).await;
        // A quorum: on a loaded machine a waiter's first attempt can reach
        // a node before the holder's own `SET` (their connections differ).
        if !matches!(released, Ok(2 | 3)) {
            failures.push(format!("round {round}: holder's unlock {released:?}"));
        }
        // The nodes found the flag, and published.
        if !published_somewhere(&cluster) {
            failures.push(format!(
                "round {round}: the holder's release published nowhere"
            ));
        }
        let (i, first) = match first_granted(&mut waiters).await {
            Ok(granted) => granted,
            Err(e) => {
                failures.push(format!("round {round}, first hand-off: {e}"));
                for w in waiters {
                    w.abort();
                }
                continue;
            }
        };
        let first_gap = t.elapsed();
        flush_everywhere(&cluster);
        let manager = &managers[i];
        let held = cluster.values(&res);
        cluster.reset_stats();
        let t = Instant::now();
        let released = manager.unlock(&first).await;
        // The first release set the flag again for the manager it did not
        // wake: this one finds it wherever it deleted the key, and publishes.
        if !published_somewhere(&cluster) {
            failures.push(format!(
                "round {round}: the first waiter's release published nowhere"
            ));
        }
        // A waiter may be granted by two nodes, the third still the
        // holder's when its attempt got there: a quorum released.
        if !matches!(released, Ok(2 | 3)) {
            failures.push(format!(
                "round {round}: first waiter's unlock {released:?}; token {}, values before {held:?}",
                first.token()
            ));
        }
        match first_granted(&mut waiters).await {
            Ok((_, second)) => {
                let second_gap = t.elapsed();
                eprintln!("round {round}: hand-offs {first_gap:?}, {second_gap:?}");
                let other = &managers[1 - i];
                let held = cluster.values(&res);
                let released = other.unlock(&second).await;
                if !matches!(released, Ok(2 | 3)) {
                    failures.push(format!(
                        "round {round}: second waiter's unlock {released:?}; token {}, values before {held:?}",
                        second.token()
                    ));
                }
            }
            Err(e) => {
                failures.push(format!("round {round}, second hand-off: {e}"));
                for w in waiters {
                    w.abort();
                }
            }
        }
        if !cluster.eventually(Duration::from_secs(2), |c| c.nowhere(&res)) {
            failures.push(format!("round {round}: key left {:?}", cluster.pttls(&res)));
        }
        if !failures.is_empty() {
            break;
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A holder whose ACL key pattern covers the lock key alone (`~app:lock1`):
/// the unlock's `DEL` of the key and its flag is refused, and the script
/// deletes the key alone and takes `PUBSUB NUMSUB` as the gate. With the
/// script caches flushed, uncontended, and with a waiter of a full-rights
/// user subscribed and flagging the key: the release counts every node,
/// deletes the key everywhere, and wakes the waiter long before its timed
/// retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_denied_the_flag_releases_and_wakes_a_waiter() {
    let cluster = Cluster::start(3);
    let urls = cluster.acl_user(
        "exact",
        &[
            "on",
            ">pw",
            "resetkeys",
            "~app:lock1",
            "resetchannels",
            "&*",
            "+@all",
        ],
    );
    let holder = Redlock::builder(urls.iter().map(String::as_str))
        .key_prefix("app:")
        .node_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let waiter = cluster
        .builder()
        .key_prefix("app:")
        .node_timeout(Duration::from_secs(2))
        .retry_delay(POLL)
        .retry_jitter(Duration::ZERO)
        .build()
        .unwrap();
    let key = "app:lock1";
    let mut failures = Vec::new();
    for round in 0..3 {
        // Uncontended, after NOSCRIPT.
        flush_everywhere(&cluster);
        let lock = holder.try_lock("lock1", POLL).await.unwrap();
        let released = holder.unlock(&lock).await;
        if !matches!(released, Ok(3)) || !cluster.nowhere(key) {
            failures.push(format!(
                "round {round}: uncontended unlock {released:?}, pttls {:?}",
                cluster.pttls(key)
            ));
            break;
        }
        // A waiter subscribed and flagging the key, after NOSCRIPT.
        let lock = holder.try_lock("lock1", POLL).await.unwrap();
        let w = waiter.clone();
        let mut waiting = vec![tokio::spawn(async move {
            w.lock_within("lock1", POLL, Duration::from_secs(20)).await
        })];
        assert!(
            cluster.eventually(Duration::from_secs(5), |c| (0..3)
                .all(|i| c.subscribers(i, key) == 1 && c.flagged(i, key))),
            "round {round}: the waiter never subscribed and flagged the key everywhere"
        );
        flush_everywhere(&cluster);
        cluster.reset_stats();
        let t = Instant::now();
        let released = holder.unlock(&lock).await;
        // A quorum (see `flagged_releases_after_script_flush_wake_each_waiter`).
        if !matches!(released, Ok(2 | 3)) {
            failures.push(format!(
                "round {round}: unlock with a waiter {released:?}, values {:?}",
                cluster.values(key)
            ));
        }
        if !published_somewhere(&cluster) {
            failures.push(format!("round {round}: the release published nowhere"));
        }
        match first_granted(&mut waiting).await {
            Ok((_, taken)) => {
                eprintln!("round {round}: hand-off {:?}", t.elapsed());
                let released = waiter.unlock(&taken).await;
                if !matches!(released, Ok(2 | 3)) {
                    failures.push(format!("round {round}: waiter's unlock {released:?}"));
                }
            }
            Err(e) => {
                failures.push(format!(
                    "round {round}: {e}; values {:?}",
                    cluster.values(key)
                ));
                for w in waiting {
                    w.abort();
                }
            }
        }
        if !cluster.eventually(Duration::from_secs(2), |c| c.nowhere(key)) {
            failures.push(format!("round {round}: key left {:?}", cluster.pttls(key)));
        }
        if !failures.is_empty() {
            break;
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A node paused (SIGSTOP) under a hundred concurrent lock, extend and
/// unlock cycles, resumed before or after the node timeout: every unlock
/// waits there for the lock's `SET` and the extension (each bounded by the
/// node timeout) and then for its own request, so it ends within twice the
/// node timeout plus a margin; once the node is back and the owed releases
/// drained, no key is left (the node runs the queued `SET`, extension and
/// release in that order, on their one connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlocks_behind_a_paused_node_end_within_the_timeouts() {
    let mut cluster = Cluster::start(5);
    let node_timeout = Duration::from_secs(1);
    let redlock = Arc::new(build(cluster.urls(), node_timeout));
    warm(&redlock).await;
    let bound = node_timeout * 2 + Duration::from_secs(5);
    let mut names = Vec::new();
    let mut hung = Vec::new();
    let mut odd = Vec::new();
    let mut slowest = Duration::ZERO;
    for round in 0..3u64 {
        cluster.node(4).pause();
        let resume_after = Duration::from_millis(if round % 2 == 0 { 500 } else { 1500 });
        let mut tasks = Vec::new();
        for task in 0..100u64 {
            let redlock = redlock.clone();
            tasks.push(tokio::spawn(async move {
                let res = resource(&format!("paused-{round}-{task}"));
                let lock = redlock
                    .try_lock(&res, TTL)
                    .await
                    .map_err(|e| (res.clone(), format!("lock {e}")))?;
                let lock = match tokio::time::timeout(bound, redlock.extend(&lock, TTL)).await {
                    Ok(Ok(extended)) => extended,
                    Ok(Err(_)) => lock,
                    Err(_) => return Err((res, "extend hung".into())),
                };
                tokio::time::sleep(Duration::from_millis(task % 50)).await;
                let t = Instant::now();
                match tokio::time::timeout(bound, redlock.unlock(&lock)).await {
                    Ok(Ok(_)) => Ok((res, t.elapsed())),
                    Ok(Err(e)) => Err((res, format!("unlock {e}"))),
                    Err(_) => Err((res, "unlock hung".into())),
                }
            }));
        }
        tokio::time::sleep(resume_after).await;
        cluster.node(4).resume();
        for t in tasks {
            match t.await.unwrap() {
                Ok((res, took)) => {
                    slowest = slowest.max(took);
                    names.push(res);
                }
                Err((res, e)) if e.ends_with("hung") => {
                    hung.push(format!("round {round}: {res}: {e}"));
                    names.push(res);
                }
                Err((res, e)) => {
                    odd.push(format!("round {round}: {e}"));
                    names.push(res);
                }
            }
        }
    }
    let left = left_after_settling(&cluster, &redlock, &names, Duration::from_millis(1500)).await;
    eprintln!(
        "{} cycles; slowest unlock {slowest:?}; hung {}; odd {} {:?}; left {}",
        names.len(),
        hung.len(),
        odd.len(),
        odd.iter().take(3).collect::<Vec<_>>(),
        left.len()
    );
    assert!(
        hung.is_empty(),
        "{} steps never ended: {:?}",
        hung.len(),
        &hung[..hung.len().min(10)]
    );
    assert!(
        left.is_empty(),
        "keys left: {:?}",
        &left[..left.len().min(10)]
    );
}
