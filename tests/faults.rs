//! The fault-injection safety suite: at least eight clients (two of them in
//! another OS process) contend for one resource while nodes pause, die,
//! restart, drop off the network, slow down and lose replies. The checker
//! judges mutual exclusion on one monotonic clock; at the end no key may be
//! left on any node, and a fresh client must get the lock. The sequence
//! (plan, checker, workload, settle) is `redlock_harness::fault::run`; each
//! test here supplies its fault.
//!
//! Each fault runs for `REDLOCK_FAULT_SECS` seconds (default 3); set it
//! higher for a longer run. Each prints one summary line. The checker's own
//! negative controls are in `tests/checker_controls.rs` and
//! `harness/tests/checker.rs`.

use std::time::{Duration, Instant};

use rand::RngExt;
use redlock_harness::checker::{self, Checker};
use redlock_harness::fault::{
    self, Child, builder, minority, minority_cycles, minority_server_cycles, plan, proxies,
};
use redlock_harness::proxy::{Fault, Proxy};
use redlock_harness::workload::{self, Plan};
use redlock_harness::{Cluster, RedisServer, resource};
use redlock_quorum::{Error, Redlock};
use tokio::io::{AsyncBufReadExt, BufReader};

/// The child side: this test binary, re-run with `--ignored --exact
/// child_contender` and a plan in the environment, is a contender in its own
/// process. It prints its records for the parent's checker. Two tests below
/// ask it instead to hold the lock once (`REDLOCK_CHILD_ONCE`) or until it
/// is killed (`REDLOCK_CHILD_DIE`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the fault tests as a separate contender process"]
async fn child_contender() {
    let once = std::env::var("REDLOCK_CHILD_ONCE").is_ok();
    let die = std::env::var("REDLOCK_CHILD_DIE").is_ok();
    if !(once || die) {
        fault::child_contender().await;
        return;
    }
    let (plan, holder) = workload::plan_from_env().expect("run only by the fault tests");
    let redlock = builder(&plan.urls).build().unwrap();
    if once {
        hold_once(redlock, plan, holder).await;
    } else {
        hold_until_killed(redlock, plan).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_paused_and_resumed_repeatedly() {
    let mut cluster = Cluster::start(5);
    let ttl = Duration::from_millis(500);
    let plan = plan(cluster.urls().to_vec(), "f-pause", ttl, (1, 10), false);
    let (on, off) = (Duration::from_millis(300), Duration::from_millis(150));
    fault::run("paused minority", &mut cluster, &plan, async |c, end| {
        minority_server_cycles(c, end, on, off, RedisServer::pause, RedisServer::resume).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_killed_and_restarted_after_the_largest_ttl() {
    let mut cluster = Cluster::start(5);
    let ttl = Duration::from_millis(400);
    let plan = plan(cluster.urls().to_vec(), "f-kill", ttl, (1, 10), false);
    // a delayed restart: the nodes rejoin only after every lock they could
    // have held has expired
    let (on, off) = (ttl + Duration::from_millis(150), Duration::from_millis(100));
    let name = "killed minority, delayed restart";
    fault::run(name, &mut cluster, &plan, async |c, end| {
        minority_server_cycles(c, end, on, off, RedisServer::kill, RedisServer::restart).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_move_between_minorities_then_heal() {
    let mut cluster = Cluster::start(5);
    let proxies = proxies(&mut cluster).await;
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let ttl = Duration::from_millis(500);
    let plan = plan(urls, "f-partition", ttl, (1, 10), false);
    fault::run("moving partitions", &mut cluster, &plan, async |_, end| {
        let mut n = 0;
        while Instant::now() < end {
            // one minority cut off, then a different one, then healed
            let first = minority();
            let second = [(first[0] + 2) % 5, (first[1] + 2) % 5];
            for side in [first, second] {
                for p in &proxies {
                    p.set(Fault::NONE);
                }
                for i in side {
                    proxies[i].set(Fault::Blackhole);
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            for p in &proxies {
                p.set(Fault::NONE);
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_spikes_on_a_minority_with_short_ttls() {
    let mut cluster = Cluster::start(5);
    let proxies = proxies(&mut cluster).await;
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let plan = plan(urls, "f-latency", Duration::from_millis(120), (1, 5), false);
    let (on, off) = (Duration::from_millis(200), Duration::from_millis(50));
    fault::run("latency spikes", &mut cluster, &plan, async |_, end| {
        minority_cycles(end, on, off, |m, on| {
            for i in m {
                let spike = Duration::from_millis(rand::rng().random_range(10..=60));
                proxies[i].set(if on {
                    Fault::Latency(spike)
                } else {
                    Fault::NONE
                });
            }
        })
        .await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_whose_reply_is_lost_is_cleaned_up_by_the_failure_path() {
    let mut cluster = Cluster::start(5);
    let proxies = proxies(&mut cluster).await;
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let redlock = builder(&urls).build().unwrap();
    redlock_harness::warm(&redlock).await;

    // A majority applies the SET but its reply never arrives: the attempt
    // times out there, fails, and must release what the nodes applied. The
    // ttl is long, so only the release can explain a missing key.
    let res = resource("f-lost-reply");
    for p in &proxies[..3] {
        p.set(Fault::DropReplies);
    }
    let err = redlock
        .try_lock(&res, Duration::from_secs(60))
        .await
        .expect_err("no replies");
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
    // The connection broke after each SET ran, and so does every new one
    // while the fault lasts: the release cannot get through yet, and the
    // keys would block the resource for the whole minute.
    let held: usize = (0..3)
        .filter(|&i| cluster.value_on(i, &res).is_some())
        .count();
    for p in &proxies[..3] {
        p.set(Fault::NONE);
    }
    // Once the network heals, the failure path's background retry releases
    // them, long before their ttl.
    let clean = cluster.eventually(Duration::from_secs(3), |c| c.values(&res) == vec![None; 5]);
    let leaked = cluster.values(&res).iter().filter(|v| v.is_some()).count();
    println!(
        "fault lost replies (majority): acquisitions 0, faults injected 3, SETs applied without a reply {held}, violations 0, keys leaked {leaked}"
    );
    assert!(held > 0, "the fault did not apply any SET");
    assert!(
        clean,
        "applied SETs were not released: {:?}",
        cluster.values(&res)
    );

    // Replies lost on a minority during a contended workload.
    for p in &proxies {
        p.set(Fault::NONE);
    }
    let ttl = Duration::from_millis(500);
    let plan = plan(urls, "f-lost-reply-load", ttl, (1, 10), false);
    let (on, off) = (Duration::from_millis(250), Duration::from_millis(100));
    let name = "lost replies on a minority";
    fault::run(name, &mut cluster, &plan, async |_, end| {
        minority_cycles(end, on, off, |m, on| {
            for i in m {
                proxies[i].set(if on { Fault::DropReplies } else { Fault::NONE });
            }
        })
        .await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_and_a_node_restart_during_watchdog_holds() {
    let mut cluster = Cluster::start(5);
    // holds longer than the ttl: only renewal keeps them
    let ttl = Duration::from_millis(300);
    let plan = plan(cluster.urls().to_vec(), "f-flush", ttl, (350, 700), true);
    let name = "script flush + restart (watchdog)";
    fault::run(name, &mut cluster, &plan, async |c, end| {
        // a script flush on every node every 120 ms, and a node killed and
        // restarted (after a ttl) every 10 flushes, from the 4th on: once in
        // a 3 s run, many times in a soak
        let mut n = 0;
        let mut flushes = 0;
        while Instant::now() < end {
            for i in 0..5 {
                if c.node(i).is_running() {
                    let _: Result<(), _> = redis::cmd("SCRIPT").arg("FLUSH").query(&mut c.conn(i));
                }
            }
            n += 1;
            flushes += 1;
            if flushes % 10 == 4 {
                let i = rand::rng().random_range(0..5);
                c.node(i).kill();
                tokio::time::sleep(ttl + Duration::from_millis(100)).await;
                c.node(i).restart();
                n += 1;
            }
            tokio::time::sleep(Duration::from_millis(120)).await;
        }
        n
    })
    .await;
}

/// The child side of `a_paused_holder_outlives_its_lock`: take the lock once,
/// announce it, work (during which the parent pauses this process), then
/// try to write with a fencing token.
async fn hold_once(redlock: Redlock, plan: Plan, holder: String) {
    let lock = redlock
        .lock(&plan.resource, plan.ttl)
        .await
        .expect("child lock");
    let granted = Instant::now();
    let fence = redlock
        .fencing_token(&lock)
        .await
        .expect("child fencing token");
    let store = std::env::var("REDLOCK_CHILD_STORE").expect("store url");
    println!("{}", checker::line_section(&holder, true));
    println!("@@GRANTED {fence}");
    // the parent stops this process somewhere in here
    tokio::time::sleep(Duration::from_millis(200)).await;
    let accepted = fenced_write(&store, &plan.resource, fence, &holder);
    println!(
        "{}",
        checker::line_write(&holder, lock.token(), fence, accepted)
    );
    println!("{}", checker::line_section(&holder, false));
    let ended = Instant::now().min(lock.expires_at()).max(granted);
    let (granted, ended) = checker::mono_window(granted, ended);
    println!(
        "{}",
        checker::line_window(&holder, lock.token(), granted, ended)
    );
    println!("@@WRITE {}", u8::from(accepted));
}

/// The child side of `a_holder_process_that_dies_loses_its_lock_after_one_ttl`:
/// hold the lock under a renewing guard, say so once it has been renewed past
/// its first ttl, and keep holding until the parent kills this process.
async fn hold_until_killed(redlock: Redlock, plan: Plan) {
    let guard = redlock
        .acquire(&plan.resource, plan.ttl)
        .await
        .expect("child acquire");
    println!("@@GRANTED");
    while guard.renewals() < 4 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("@@RENEWED");
    tokio::time::sleep(Duration::from_secs(60)).await;
    drop(guard);
}

/// Reads the child's stdout until a line contains `marker`, for at most
/// `within`.
async fn wait_for_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    marker: &str,
    within: Duration,
) {
    tokio::time::timeout(within, async {
        loop {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("child ended before {marker}"));
            if line.contains(marker) {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {marker} from the child within {within:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_process_that_dies_loses_its_lock_after_one_ttl() {
    // README: "when the process dies, renewal stops and the lock expires
    // after one ttl". The holder is a separate process renewing under a
    // guard; it is killed with SIGKILL (no drop, no release).
    let cluster = Cluster::start(5);
    let ttl = Duration::from_millis(1000);
    let plan = plan(cluster.urls().to_vec(), "f-dead-holder", ttl, (1, 1), true);
    let mut child = Child::spawn_env(&plan, "dying-holder", &[("REDLOCK_CHILD_DIE", "1".into())]);
    let stdout = child.stdout();
    let mut lines = BufReader::new(stdout).lines();
    // generous bounds: the child starts and renews on a loaded machine
    wait_for_line(&mut lines, "@@GRANTED", Duration::from_secs(60)).await;
    let granted = Instant::now();
    wait_for_line(&mut lines, "@@RENEWED", Duration::from_secs(30)).await;
    let other = builder(cluster.urls()).retry_count(1000).build().unwrap();
    // renewed past its first ttl, and still held
    assert!(granted.elapsed() > ttl);
    let err = other
        .try_lock(&plan.resource, ttl)
        .await
        .expect_err("held by the child");
    assert!(matches!(err, Error::Conflict { .. }), "{err}");

    child.kill();
    let killed = Instant::now();
    child.wait().await;
    // Nothing renews the keys after the kill: on every node that has the
    // key, it expires within one ttl (read right after the kill, so a
    // loaded machine cannot stretch it).
    for i in 0..cluster.len() {
        let pttl = cluster.pttl_on(i, &plan.resource);
        assert!(
            pttl <= ttl.as_millis() as i64,
            "node {i}: the dead holder's key has {pttl} ms left, more than a ttl"
        );
    }
    // and the lock is free once they did; the margin is for a loaded machine
    let margin = fault::FRESH_MARGIN;
    let lock = tokio::time::timeout(ttl + margin, other.lock(&plan.resource, ttl))
        .await
        .unwrap_or_else(|_| panic!("the dead holder's lock outlived ttl + {margin:?}"))
        .expect("another client gets the lock");
    let waited = killed.elapsed();
    println!(
        "fault dead holder process: lock free {:.0} ms after SIGKILL (ttl {} ms)",
        waited.as_secs_f64() * 1e3,
        ttl.as_millis()
    );
    // The last renewal came at most one interval (ttl / 3) before the kill,
    // so the keys lived on for at least two thirds of a ttl: the lock expired,
    // it was not released.
    assert!(waited >= ttl / 2, "freed after only {waited:?}");
    other.unlock(&lock).await.unwrap();
}

/// The protected resource (a store apart from the lock nodes): accepts a
/// write only with a fencing token at least as high as any it has seen.
fn fenced_write(url: &str, resource: &str, fence: u64, writer: &str) -> bool {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    let script = redis::Script::new(
        r#"local seen = tonumber(redis.call("get", KEYS[1]) or "0")
if tonumber(ARGV[1]) < seen then return 0 end
redis.call("set", KEYS[1], ARGV[1])
redis.call("rpush", KEYS[2], ARGV[2])
return 1"#,
    );
    let accepted: i64 = script
        .key(format!("{resource}:seen"))
        .key(format!("{resource}:writes"))
        .arg(fence)
        .arg(writer)
        .invoke(&mut con)
        .unwrap();
    accepted == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_outlives_its_lock_and_only_a_fencing_token_stops_its_write() {
    let cluster = Cluster::start(5);
    let ttl = Duration::from_millis(300);
    let plan = plan(
        cluster.urls().to_vec(),
        "f-paused-holder",
        ttl,
        (1, 1),
        false,
    );
    let checker = Checker::default();
    let store = RedisServer::start();
    let env = [
        ("REDLOCK_CHILD_STORE", store.url()),
        ("REDLOCK_CHILD_ONCE", "1".to_owned()),
    ];
    let mut child = Child::spawn_env(&plan, "paused-holder", &env);
    let stdout = child.stdout();
    let mut lines = BufReader::new(stdout).lines();
    let mut out = String::new();
    loop {
        let line = lines
            .next_line()
            .await
            .unwrap()
            .expect("child ended before the lock");
        out.push_str(&line);
        out.push('\n');
        if line.contains("@@GRANTED") {
            break;
        }
    }
    // The holder stops (a GC pause, a stalled VM) for longer than its ttl.
    child.pause();
    let redlock = builder(cluster.urls()).retry_count(200).build().unwrap();
    let lock = redlock
        .lock(&plan.resource, Duration::from_secs(5))
        .await
        .expect("after expiry");
    let granted = Instant::now();
    checker.section("second-holder", true);
    let fence = redlock.fencing_token(&lock).await.expect("fencing token");
    let accepted = fenced_write(&store.url(), &plan.resource, fence, "second-holder");
    checker.write("second-holder", lock.token(), fence, accepted);
    assert!(accepted);
    // The paused holder wakes up while the second one still works.
    child.resume();
    tokio::time::sleep(Duration::from_millis(400)).await;
    checker.section("second-holder", false);
    checker.record("second-holder", lock.token(), granted, Instant::now());
    redlock.unlock(&lock).await.unwrap();
    while let Some(line) = lines.next_line().await.unwrap() {
        out.push_str(&line);
        out.push('\n');
    }
    child.wait().await;
    checker.ingest(&out);

    // The lock did its part: the paused holder's validity window closed
    // before the second holder's began, so the checker finds no violation.
    assert!(checker.overlaps().is_empty(), "{:?}", checker.overlaps());
    let report = checker.report();
    assert_eq!(report.violations(), 0, "{report:?}");
    // But the paused holder's critical section ran on into the second
    // holder's: no lock with an expiry can prevent that. The checker tells
    // it for what it is, an overrun (the documented limit).
    let interleavings = checker.interleavings();
    assert!(
        !interleavings.is_empty() && interleavings.iter().all(|i| i.overrun),
        "the paused holder should have overrun into the second one: {interleavings:?} {out}"
    );
    let overruns = checker.overruns();
    assert!(
        overruns
            .iter()
            .any(|o| o.holder == "paused-holder" && o.interleaved),
        "{overruns:?}"
    );
    // Only the fencing token (Redlock::fencing_token) stopped its late write.
    assert!(
        out.contains("@@WRITE 0"),
        "the stale write was accepted: {out}"
    );
    let writes: Vec<String> = redis::cmd("LRANGE")
        .arg(format!("{}:writes", plan.resource))
        .arg(0)
        .arg(-1)
        .query(&mut store.conn())
        .unwrap();
    assert_eq!(writes, ["second-holder"]);
    println!(
        "fault paused holder: acquisitions 2, faults injected 1, violations {}, overruns {} (interleaved {}; expected: the limit of any lease), stale writes accepted {}",
        report.violations(),
        report.overruns,
        report.overrun_interleavings,
        report.stale_writes
    );
}
