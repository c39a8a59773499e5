//! Final audit of e53110f/ee35545: the connection gate's bounded wait
//! (fails with `Timeout` past the connect timeout), the send cutoff of a
//! send again, the restart guard's take-back, against real nodes. Every
//! step under a timeout.

use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use redlock_harness::proxy::{Fault, Proxy};
use redlock_harness::runtimes::{current_thread, multi_thread};
use redlock_harness::steps::{eventually, node_failures, step};
use redlock_harness::{Cluster, releases_drained, resource};
use redlock_quorum::{Error, NodeError, Redlock};

fn timeouts(err: &Error) -> Vec<String> {
    match err {
        Error::NoQuorum { failures, .. } => failures
            .iter()
            .filter(|f| matches!(f.cause, NodeError::Timeout))
            .map(|f| f.node.clone())
            .collect(),
        _ => vec![],
    }
}
async fn proxies(cluster: &mut Cluster, latency: Duration) -> Vec<Proxy> {
    let mut out = Vec::new();
    for i in 0..cluster.len() {
        let p = Proxy::to_port(cluster.node(i).port()).await;
        p.set(Fault::Latency(latency));
        out.push(p);
    }
    out
}

/// (a1) 64 tasks on a fresh manager at once, on a multi-thread runtime,
/// every connect slow (latency below the connect timeout).
#[test]
fn cold_start_64_tasks_slow_connect() {
    let mut cluster = Cluster::start(3);
    let rt = multi_thread();
    let _g = rt.enter();
    let ps = rt.block_on(proxies(&mut cluster, Duration::from_millis(150)));
    let urls: Vec<String> = ps.iter().map(Proxy::url).collect();
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .retry_count(0)
        .node_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let names: Vec<String> = (0..64).map(|i| resource(&format!("cold64-{i}"))).collect();
    let results = rt.block_on(step("64 locks", async {
        let mut set = tokio::task::JoinSet::new();
        for name in names.clone() {
            let r = redlock.clone();
            set.spawn(async move {
                let out = r.try_lock(&name, Duration::from_secs(30)).await;
                (name, out)
            });
        }
        let mut v = Vec::new();
        while let Some(x) = set.join_next().await {
            v.push(x.unwrap());
        }
        v
    }));
    let mut failed = Vec::new();
    let mut gate_timeouts = 0;
    for (name, out) in &results {
        match out {
            Ok(lock) => {
                let n = rt
                    .block_on(step("unlock", redlock.unlock(lock)))
                    .expect("unlock");
                assert_eq!(n, 3, "{name}: released on {n}");
            }
            Err(e) => {
                gate_timeouts += timeouts(e).len();
                failed.push(format!("{name}: {e}"));
            }
        }
    }
    eprintln!(
        "cold64: {} of 64 failed, {gate_timeouts} node timeouts; failures {:?}",
        failed.len(),
        node_failures(&redlock)
    );
    assert!(failed.is_empty(), "failed: {failed:#?}");
    let before = node_failures(&redlock);
    for i in 0..20 {
        let name = resource(&format!("cold64-after-{i}"));
        let lock = rt
            .block_on(step(
                "after",
                redlock.try_lock(&name, Duration::from_secs(30)),
            ))
            .expect("lock after");
        assert_eq!(
            rt.block_on(step("unlock after", redlock.unlock(&lock)))
                .unwrap(),
            3
        );
    }
    assert_eq!(node_failures(&redlock), before, "node failures grew after");
    assert!(cluster.left_of(&names).is_empty());
}

/// (a2) A fresh manager on several current-thread runtimes at once (each
/// its own connection, made one at a time through the gate), every
/// connect slow but well below the connect timeout.
#[test]
fn cold_start_several_runtimes_slow_connect() {
    several_runtimes(6, Duration::from_millis(150));
}

/// (a2') The same, eight runtimes, 200 ms per reply (a connect of a few
/// round trips, still well below the 1 s connect timeout).
#[test]
fn cold_start_eight_runtimes_slower_connect() {
    several_runtimes(8, Duration::from_millis(200));
}

fn several_runtimes(n: usize, latency: Duration) {
    let mut cluster = Cluster::start(3);
    let ctl = multi_thread();
    let ps = ctl.block_on(proxies(&mut cluster, latency));
    let urls: Vec<String> = ps.iter().map(Proxy::url).collect();
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .retry_count(0)
        .node_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    // How long one connect takes through the proxy, alone (a separate
    // manager, one runtime).
    {
        let probe = Redlock::builder(urls.iter().map(String::as_str))
            .retry_count(0)
            .node_timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let rt = current_thread();
        let t = Instant::now();
        let r = rt.block_on(step(
            "probe",
            probe.try_lock(&resource("probe"), Duration::from_secs(5)),
        ));
        eprintln!(
            "one cold lock alone: {:?} in {:?}",
            r.as_ref().map(|_| ()),
            t.elapsed()
        );
    }
    #[allow(non_snake_case)]
    let N: usize = n;
    let barrier = Arc::new(Barrier::new(N));
    let report = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..N)
        .map(|t| {
            let (redlock, barrier, report) = (redlock.clone(), barrier.clone(), report.clone());
            std::thread::spawn(move || {
                let rt = current_thread();
                barrier.wait();
                let name = resource(&format!("cold-rt-{t}"));
                let started = Instant::now();
                let out = rt.block_on(step(
                    "lock",
                    redlock.try_lock(&name, Duration::from_secs(30)),
                ));
                let took = started.elapsed();
                let line = match &out {
                    Ok(lock) => {
                        let n = rt.block_on(step("unlock", redlock.unlock(lock)));
                        format!("rt {t}: ok after {took:?}, unlock {n:?}")
                    }
                    Err(e) => format!(
                        "rt {t}: FAILED after {took:?}: {e} (timeouts {:?})",
                        timeouts(e)
                    ),
                };
                barrier.wait();
                if t == 0 {
                    eprintln!(
                        "after the first locks: node failures {:?}",
                        node_failures(&redlock)
                    );
                }
                barrier.wait();
                // Later: does it work on this runtime now?
                let mut later_ok = 0;
                for i in 0..5 {
                    let name = resource(&format!("cold-rt-{t}-later-{i}"));
                    if let Ok(lock) = rt.block_on(step(
                        "later",
                        redlock.try_lock(&name, Duration::from_secs(30)),
                    )) && rt.block_on(step("unlock", redlock.unlock(&lock))).ok() == Some(3)
                    {
                        later_ok += 1;
                    }
                }
                report
                    .lock()
                    .unwrap()
                    .push((out.is_ok(), format!("{line}; later ok {later_ok}/5")));
                // Keep the runtime alive until all are done (its connection).
                barrier.wait();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let report = report.lock().unwrap();
    for (_, line) in report.iter() {
        eprintln!("{line}");
    }
    eprintln!("node failures {:?}", node_failures(&redlock));
    let bad: Vec<_> = report
        .iter()
        .filter(|(ok, _)| !ok)
        .map(|(_, l)| l.clone())
        .collect();
    assert!(
        bad.is_empty(),
        "first locks failed on cold runtimes: {bad:#?}"
    );
    // Every connect succeeds within the connect timeout: no request should
    // have failed (at 2a97f67, the gate's bounded wait fails the requests
    // queued behind other runtimes' connects: [6, 6, 6] here for 8 runtimes
    // at 200 ms; [0, 0, 0] with the gate's pre-e53110f line).
    assert!(
        node_failures(&redlock).iter().all(|&n| n == 0),
        "node failures on a cold start whose connects all succeed in time: {:?}",
        node_failures(&redlock)
    );
}

/// (a3) A current-thread runtime takes a lock while node 2's connection is
/// slow to make, then is not driven: its connection attempt holds node 2's
/// gate. Do requests from another runtime still reach node 2?
#[test]
fn an_idle_runtimes_connect_attempt_and_another_runtime() {
    let mut cluster = Cluster::start(3);
    let other = multi_thread();
    let proxy = other.block_on(Proxy::to_port(cluster.node(2).port()));
    let mut urls = cluster.urls().to_vec();
    urls[2] = proxy.url();
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .retry_count(0)
        .node_timeout(Duration::from_millis(100))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    proxy.set(Fault::Latency(Duration::from_millis(300)));
    let idle = current_thread();
    let name = resource("idle-connect");
    let lock = idle
        .block_on(step(
            "lock",
            redlock.try_lock(&name, Duration::from_secs(30)),
        ))
        .expect("nodes 0 and 1");
    // `idle` not driven from here.
    proxy.set(Fault::NONE);
    let mut reached = 0;
    let mut lines = Vec::new();
    let started = Instant::now();
    for i in 0..6 {
        let n = resource(&format!("idle-connect-other-{i}"));
        let t = Instant::now();
        let r = other.block_on(step(
            "other lock",
            redlock.try_lock(&n, Duration::from_secs(30)),
        ));
        match r {
            Ok(l) => {
                other.block_on(async { tokio::time::sleep(Duration::from_millis(2500)).await });
                let on2 = cluster.exists_on(2, &n);
                let u = other.block_on(step("other unlock", redlock.unlock(&l)));
                if on2 {
                    reached += 1;
                }
                lines.push(format!("{i}: lock ok in {:?}, on node 2 after 2.5 s: {on2}, unlock {u:?}, failures {:?}", t.elapsed(), node_failures(&redlock)));
            }
            Err(e) => lines.push(format!("{i}: {e} in {:?}", t.elapsed())),
        }
    }
    eprintln!(
        "{lines:#?}\nfailures {:?} over {:?}",
        node_failures(&redlock),
        started.elapsed()
    );
    // Clean up: let idle run, release.
    idle.block_on(async { tokio::time::sleep(Duration::from_millis(500)).await });
    let _ = other.block_on(step("unlock", redlock.unlock(&lock)));
    let _ = other.block_on(releases_drained(&redlock, Duration::from_secs(10)));
    // Once the idle runtime ran again: node 2 reached from the other?
    let n = resource("idle-connect-recovered");
    let l = other
        .block_on(step(
            "recovered lock",
            redlock.try_lock(&n, Duration::from_secs(30)),
        ))
        .unwrap();
    other.block_on(async { tokio::time::sleep(Duration::from_millis(2500)).await });
    eprintln!(
        "after the idle runtime ran: on node 2: {}, failures {:?}",
        cluster.exists_on(2, &n),
        node_failures(&redlock)
    );
    let _ = other.block_on(step("unlock", redlock.unlock(&l)));
    assert!(
        reached > 0,
        "node 2 never reached from another runtime while the idle runtime holds its gate: {lines:#?}"
    );
}

/// (b) A node restarted while 16 tasks take and release locks in a loop.
#[test]
fn restart_under_a_locking_loop() {
    let mut cluster = Cluster::start(5);
    let rt = multi_thread();
    let redlock = Redlock::builder(cluster.urls().iter().map(String::as_str))
        .retry_count(3)
        .retry_delay(Duration::from_millis(20))
        .node_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let names = Arc::new(Mutex::new(Vec::<String>::new()));
    let end = Instant::now() + Duration::from_secs(8);
    let mut handles = Vec::new();
    for t in 0..16 {
        let (r, names) = (redlock.clone(), names.clone());
        handles.push(rt.spawn(async move {
            let (mut ok, mut err, mut unl_err) = (0, 0, 0);
            let mut i = 0;
            while Instant::now() < end {
                let name = resource(&format!("rs-{t}-{i}"));
                i += 1;
                names.lock().unwrap().push(name.clone());
                match tokio::time::timeout(
                    Duration::from_secs(20),
                    r.try_lock(&name, Duration::from_secs(60)),
                )
                .await
                {
                    Ok(Ok(lock)) => {
                        ok += 1;
                        match tokio::time::timeout(Duration::from_secs(20), r.unlock(&lock)).await {
                            Ok(Ok(_)) => {}
                            _ => unl_err += 1,
                        }
                    }
                    Ok(Err(_)) => err += 1,
                    Err(_) => panic!("try_lock hung"),
                }
            }
            (ok, err, unl_err)
        }));
    }
    std::thread::sleep(Duration::from_secs(2));
    cluster.node(1).restart();
    std::thread::sleep(Duration::from_secs(1));
    cluster.node(3).restart();
    let mut totals = (0, 0, 0);
    for h in handles {
        let (a, b, c) = rt.block_on(step("worker", h)).unwrap();
        totals.0 += a;
        totals.1 += b;
        totals.2 += c;
    }
    eprintln!(
        "restart loop: ok {} err {} unlock errors {}; failures {:?}",
        totals.0,
        totals.1,
        totals.2,
        node_failures(&redlock)
    );
    assert!(totals.0 > 0);
    // Locks reach every node again.
    rt.block_on(step("reach", redlock_harness::reach_every_node(&redlock)));
    let mut all = 0;
    for i in 0..20 {
        let n = resource(&format!("rs-after-{i}"));
        let l = rt
            .block_on(step("after", redlock.try_lock(&n, Duration::from_secs(60))))
            .unwrap();
        if rt
            .block_on(step("after unlock", redlock.unlock(&l)))
            .unwrap()
            == 5
        {
            all += 1;
        }
    }
    assert_eq!(
        all, 20,
        "not every lock after the restarts reached all 5 nodes"
    );
    assert!(
        rt.block_on(releases_drained(&redlock, Duration::from_secs(20))),
        "releases owed"
    );
    let names = names.lock().unwrap().clone();
    let clean = eventually(Duration::from_secs(10), || {
        cluster.left_of(&names).is_empty()
    });
    assert!(clean, "keys left behind: {:?}", cluster.left_of(&names));
}

/// (c) The restart guard with a node restarted (and a slow node) while
/// tasks lock and unlock: no lock key left behind anywhere.
#[test]
fn restart_guard_restart_leaves_nothing() {
    let mut cluster = Cluster::start(3);
    let rt = multi_thread();
    let proxy = rt.block_on(Proxy::to_port(cluster.node(2).port()));
    let mut urls = cluster.urls().to_vec();
    urls[2] = proxy.url();
    let max_ttl = Duration::from_secs(6);
    let build = |urls: &[String]| {
        Redlock::builder(urls.iter().map(String::as_str))
            .restart_guard(max_ttl)
            .retry_count(2)
            .retry_delay(Duration::from_millis(20))
            .node_timeout(Duration::from_millis(300))
            .connect_timeout(Duration::from_millis(400))
            .build()
            .unwrap()
    };
    // Age the markers with a short guard first.
    let ager = Redlock::builder(urls.iter().map(String::as_str))
        .restart_guard(max_ttl)
        .build()
        .unwrap();
    let _ = rt.block_on(step(
        "age",
        ager.try_lock(&resource("age"), Duration::from_millis(300)),
    ));
    std::thread::sleep(max_ttl + Duration::from_millis(300));
    let redlock = build(&urls);
    let names = Arc::new(Mutex::new(Vec::<String>::new()));
    let end = Instant::now() + Duration::from_secs(8);
    let mut handles = Vec::new();
    for t in 0..12 {
        let (r, names) = (redlock.clone(), names.clone());
        handles.push(rt.spawn(async move {
            let (mut ok, mut err) = (0, 0);
            let mut i = 0;
            let mut causes = std::collections::BTreeMap::<String, usize>::new();
            while Instant::now() < end {
                let name = resource(&format!("gr-{t}-{i}"));
                i += 1;
                names.lock().unwrap().push(name.clone());
                match tokio::time::timeout(
                    Duration::from_secs(30),
                    r.try_lock(&name, Duration::from_secs(6)),
                )
                .await
                {
                    Ok(Ok(lock)) => {
                        ok += 1;
                        let _ =
                            tokio::time::timeout(Duration::from_secs(30), r.unlock(&lock)).await;
                    }
                    Ok(Err(e)) => {
                        err += 1;
                        if let Error::NoQuorum { failures, .. } = &e {
                            for f in failures {
                                let k = format!("{:?}", f.cause);
                                let k = k.split([' ', '(', '{']).next().unwrap_or("").to_string();
                                *causes.entry(k).or_default() += 1;
                            }
                        } else {
                            *causes.entry(format!("{e}")).or_default() += 1;
                        }
                    }
                    Err(_) => panic!("try_lock hung"),
                }
            }
            (ok, err, causes)
        }));
    }
    std::thread::sleep(Duration::from_secs(2));
    proxy.set(Fault::Latency(Duration::from_millis(250)));
    std::thread::sleep(Duration::from_secs(1));
    cluster.node(2).restart();
    std::thread::sleep(Duration::from_secs(1));
    proxy.set(Fault::NONE);
    std::thread::sleep(Duration::from_secs(1));
    cluster.node(0).restart();
    let mut ok = 0;
    let mut err = 0;
    let mut causes = std::collections::BTreeMap::<String, usize>::new();
    for h in handles {
        let (a, b, c) = rt.block_on(step("worker", h)).unwrap();
        ok += a;
        err += b;
        for (k, v) in c {
            *causes.entry(k).or_default() += v;
        }
    }
    eprintln!(
        "guard loop: ok {ok} err {err} causes {causes:?} failures {:?}",
        node_failures(&redlock)
    );
    assert!(
        rt.block_on(releases_drained(&redlock, Duration::from_secs(20))),
        "releases owed"
    );
    let names = names.lock().unwrap().clone();
    eprintln!("{} names", names.len());
    let clean = eventually(Duration::from_secs(5), || {
        cluster.left_of(&names).is_empty()
    });
    let left = cluster.left_of(&names);
    let per_node: Vec<usize> = (0..3)
        .map(|i| {
            left.iter()
                .filter(|n| cluster.exists_on(i, n.as_str()))
                .count()
        })
        .collect();
    assert!(
        clean,
        "{} keys left behind (per node {per_node:?}): {:?}",
        left.len(),
        &left[..left.len().min(5)]
    );
}
