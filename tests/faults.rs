//! The fault-injection safety suite: at least eight clients (two of them in
//! another OS process) contend for one resource while nodes pause, die,
//! restart, drop off the network, slow down and lose replies. The checker
//! judges mutual exclusion on one monotonic clock; at the end no key may be
//! left on any node, and a fresh client must get the lock.
//!
//! Each fault runs for `REDLOCK_FAULT_SECS` seconds (default 3); set it
//! higher for a longer run. Each prints one summary line.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::RngExt;
use redlock_harness::checker::{self, Checker};
use redlock_harness::proxy::{Fault, Proxy};
use redlock_harness::workload::{self, Plan, Sink, Tally};
use redlock_harness::{Cluster, resource};
use redlock_quorum::{Error, Redlock};
use tokio::io::{AsyncBufReadExt, BufReader};

const IN_PROCESS: usize = 6;
const CHILDREN: usize = 2;

fn fault_secs() -> Duration {
    let secs = std::env::var("REDLOCK_FAULT_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(secs)
}

/// The child side: this test binary, re-run with `--ignored --exact
/// child_contender` and a plan in the environment, is a contender in its own
/// process. It prints its records for the parent's checker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the fault tests as a separate contender process"]
async fn child_contender() {
    let (plan, holder) = workload::plan_from_env().expect("run only by the fault tests");
    let redlock = builder(&plan.urls).build().unwrap();
    if std::env::var("REDLOCK_CHILD_ONCE").is_ok() {
        hold_once(redlock, plan, holder).await;
        return;
    }
    if std::env::var("REDLOCK_CHILD_DIE").is_ok() {
        hold_until_killed(redlock, plan).await;
        return;
    }
    let tally = workload::contend(redlock, holder, plan, Sink::Print).await;
    println!("{}", tally.line());
}

fn builder(urls: &[String]) -> redlock_quorum::RedlockBuilder {
    Redlock::builder(urls.iter().map(String::as_str))
        .retry_delay(Duration::from_millis(5))
        .retry_jitter(Duration::from_millis(10))
}

/// A contender process the test can pause on its own.
struct Child {
    child: tokio::process::Child,
}

impl Child {
    /// A one-shot holder (see `hold_once`) with extra environment.
    fn spawn_with(plan: &Plan, holder: &str, env: &[(&str, String)]) -> Self {
        let mut env = env.to_vec();
        env.push(("REDLOCK_CHILD_ONCE", "1".to_owned()));
        Self::spawn_env(plan, holder, &env)
    }

    /// A contender running the workload loop.
    fn spawn(plan: &Plan, holder: &str) -> Self {
        Self::spawn_env(plan, holder, &[])
    }

    fn spawn_env(plan: &Plan, holder: &str, env: &[(&str, String)]) -> Self {
        let mut cmd = tokio::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--ignored",
            "--exact",
            "child_contender",
            "--nocapture",
            "--test-threads=1",
        ])
        .envs(workload::plan_env(plan, holder))
        .stdout(Stdio::piped())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stderr(Stdio::null())
        .kill_on_drop(true);
        Child {
            child: cmd.spawn().expect("spawn contender process"),
        }
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = self.child.id().expect("running") as libc::pid_t;
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }

    /// Waits for the child and returns what it printed.
    async fn output(self) -> String {
        let out = self.child.wait_with_output().await.expect("child output");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// Runs the workload (in-process tasks and child processes) while `inject`
/// injects faults; returns the tallies and the number of faults injected.
async fn run_workload<F: std::future::Future<Output = u64>>(
    plan: &Plan,
    checker: &Arc<Checker>,
    inject: F,
) -> (Tally, u64) {
    let children: Vec<Child> = (0..CHILDREN)
        .map(|i| Child::spawn(plan, &format!("proc-{i}")))
        .collect();
    let tasks: Vec<_> = (0..IN_PROCESS)
        .map(|i| {
            let redlock = builder(&plan.urls).build().unwrap();
            let (plan, sink) = (plan.clone(), Sink::Checker(checker.clone()));
            tokio::spawn(workload::contend(redlock, format!("task-{i}"), plan, sink))
        })
        .collect();
    let faults = inject.await;
    let mut total = Tally::default();
    for t in tasks {
        total.add(t.await.expect("contender task"));
    }
    for (i, child) in children.into_iter().enumerate() {
        let out = child.output().await;
        let records = checker.ingest(&out);
        let tally = out
            .lines()
            .find_map(Tally::parse)
            .unwrap_or_else(|| panic!("contender process {i} did not finish: {out}"));
        // each acquisition printed a window, an entry and an exit: the
        // checker judged all of them
        assert_eq!(
            records as u64,
            3 * tally.acquisitions,
            "contender process {i}: records read for {} acquisitions",
            tally.acquisitions
        );
        total.add(tally);
    }
    (total, faults)
}

/// The hand-off between two holders in the workload: the test builder's
/// retry delay (5 ms) plus its mean jitter (5 ms).
const HAND_OFF: Duration = Duration::from_millis(10);

/// The fewest acquisitions a healthy run of `plan` gives, to catch a lock
/// that fails safe but stops working (a cleanup that leaves keys behind
/// blocks the resource for a ttl at a time: such a run got 1-3 acquisitions
/// in 3 s where 90-174 are normal). Derived from the time one acquisition
/// takes, the mean hold plus the hand-off: lock/unlock runs are dominated by
/// the faults and the load (on a 2-core machine with two CPU burners beside
/// the suite, the slowest, lost replies, gave 28 of an expected 193), so
/// they must reach a tenth of that; watchdog runs hold for longer than the
/// ttl and are dominated by the hold itself, so they must reach half.
fn liveness_floor(plan: &Plan) -> u64 {
    let mean_hold = Duration::from_millis((plan.hold_ms.0 + plan.hold_ms.1) / 2);
    let expected = plan.duration.as_secs_f64() / (mean_hold + HAND_OFF).as_secs_f64();
    let fraction = if plan.watchdog { 0.5 } else { 0.1 };
    (expected * fraction).floor() as u64
}

/// After the faults healed: a fresh client gets the lock within `bound`,
/// and no key is left on any node. Prints the summary line and checks it.
async fn settle(
    name: &str,
    urls: &[String],
    cluster: &Cluster,
    plan: &Plan,
    checker: &Checker,
    tally: Tally,
    faults: u64,
) {
    // "At once": no leftover key may make the fresh client wait for an
    // expiry, so it must get the lock well within one ttl (the margin is for
    // a loaded machine; it takes a few milliseconds).
    let fresh = builder(urls).retry_count(1000).build().unwrap();
    let start = Instant::now();
    let bound = plan.ttl / 2;
    let lock = tokio::time::timeout(bound, fresh.lock(&plan.resource, plan.ttl))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{name}: no fresh acquisition within {bound:?} (half the ttl); keys {:?}",
                cluster.values(&plan.resource)
            )
        })
        .unwrap_or_else(|e| panic!("{name}: fresh acquisition failed: {e}"));
    let liveness = start.elapsed();
    fresh.unlock(&lock).await.unwrap();
    // late SETs from paused or partitioned nodes are released behind them;
    // give them a ttl to drain, then count what is left
    cluster.eventually(plan.ttl + Duration::from_secs(1), |c| {
        c.values(&plan.resource).iter().all(Option::is_none)
    });
    let leaked = cluster
        .values(&plan.resource)
        .iter()
        .filter(|v| v.is_some())
        .count();
    let overlaps = checker.overlaps();
    let interleavings = checker.interleavings();
    let violations = overlaps.len() + interleavings.len();
    let floor = liveness_floor(plan);
    println!(
        "fault {name}: acquisitions {} (floor {floor}), faults injected {faults}, violations {violations}, keys leaked {leaked}, unlock errors {} (bugs {}), fresh lock after {:.0} ms",
        tally.acquisitions,
        tally.unlock_errors,
        tally.unlock_bugs,
        liveness.as_secs_f64() * 1e3
    );
    assert!(
        overlaps.is_empty(),
        "{name}: overlapping holders {:?}",
        &overlaps[..overlaps.len().min(3)]
    );
    assert!(
        interleavings.is_empty(),
        "{name}: interleaved critical sections {interleavings:?}"
    );
    assert_eq!(
        leaked,
        0,
        "{name}: keys left {:?}",
        cluster.values(&plan.resource)
    );
    assert_eq!(
        checker.len() as u64,
        tally.acquisitions,
        "{name}: windows recorded (in this process and the children) vs acquisitions"
    );
    assert!(
        tally.acquisitions >= floor.max(1),
        "{name}: only {} acquisitions in {:?}, fewer than {floor}: the lock stopped working",
        tally.acquisitions,
        plan.duration
    );
    assert_eq!(
        tally.unlock_bugs, 0,
        "{name}: unlock said \"not held\" while the lock was valid, or a node answered with an error ({} unlock errors in all)",
        tally.unlock_errors
    );
    assert!(faults > 0, "{name}: no fault was injected");
}

fn plan(
    urls: Vec<String>,
    topic: &str,
    ttl: Duration,
    hold_ms: (u64, u64),
    watchdog: bool,
) -> Plan {
    Plan::new(urls, resource(topic), ttl, hold_ms, watchdog, fault_secs())
}

/// Two distinct node indexes out of five.
fn minority() -> [usize; 2] {
    let a = rand::rng().random_range(0..5);
    let b = (a + rand::rng().random_range(1..5)) % 5;
    [a, b]
}

/// Faults a random minority of nodes for `on` (`act(minority, true)`), heals
/// it for `off` (`act(minority, false)`), and again until `end`; returns how
/// many times.
async fn minority_cycles(
    end: Instant,
    on: Duration,
    off: Duration,
    mut act: impl FnMut([usize; 2], bool),
) -> u64 {
    let mut n = 0;
    while Instant::now() < end {
        let m = minority();
        act(m, true);
        n += 1;
        tokio::time::sleep(on).await;
        act(m, false);
        tokio::time::sleep(off).await;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_paused_and_resumed_repeatedly() {
    let mut cluster = Cluster::start(5);
    let plan = plan(
        cluster.urls().to_vec(),
        "f-pause",
        Duration::from_millis(500),
        (1, 10),
        false,
    );
    let checker = Arc::new(Checker::default());
    let end = Instant::now() + plan.duration;
    let inject = minority_cycles(
        end,
        Duration::from_millis(300),
        Duration::from_millis(150),
        |m, on| {
            for i in m {
                if on {
                    cluster.node(i).pause();
                } else {
                    cluster.node(i).resume();
                }
            }
        },
    );
    let (tally, faults) = run_workload(&plan, &checker, inject).await;
    settle(
        "paused minority",
        cluster.urls(),
        &cluster,
        &plan,
        &checker,
        tally,
        faults,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_killed_and_restarted_after_the_largest_ttl() {
    let mut cluster = Cluster::start(5);
    let ttl = Duration::from_millis(400);
    let plan = plan(cluster.urls().to_vec(), "f-kill", ttl, (1, 10), false);
    let checker = Arc::new(Checker::default());
    let end = Instant::now() + plan.duration;
    // a delayed restart: the nodes rejoin only after every lock they could
    // have held has expired
    let inject = minority_cycles(
        end,
        ttl + Duration::from_millis(150),
        Duration::from_millis(100),
        |m, on| {
            for i in m {
                if on {
                    cluster.node(i).kill();
                } else {
                    cluster.node(i).restart();
                }
            }
        },
    );
    let (tally, faults) = run_workload(&plan, &checker, inject).await;
    settle(
        "killed minority, delayed restart",
        cluster.urls(),
        &cluster,
        &plan,
        &checker,
        tally,
        faults,
    )
    .await;
}

async fn proxies(cluster: &mut Cluster) -> Vec<Proxy> {
    let mut out = Vec::new();
    for i in 0..cluster.len() {
        out.push(Proxy::to_port(cluster.node(i).port()).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_move_between_minorities_then_heal() {
    let mut cluster = Cluster::start(5);
    let proxies = proxies(&mut cluster).await;
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let plan = plan(
        urls.clone(),
        "f-partition",
        Duration::from_millis(500),
        (1, 10),
        false,
    );
    let checker = Arc::new(Checker::default());
    let end = Instant::now() + plan.duration;
    let inject = async {
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
    };
    let (tally, faults) = run_workload(&plan, &checker, inject).await;
    settle(
        "moving partitions",
        &urls,
        &cluster,
        &plan,
        &checker,
        tally,
        faults,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_spikes_on_a_minority_with_short_ttls() {
    let mut cluster = Cluster::start(5);
    let proxies = proxies(&mut cluster).await;
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let plan = plan(
        urls.clone(),
        "f-latency",
        Duration::from_millis(120),
        (1, 5),
        false,
    );
    let checker = Arc::new(Checker::default());
    let end = Instant::now() + plan.duration;
    let (on, off) = (Duration::from_millis(200), Duration::from_millis(50));
    let inject = minority_cycles(end, on, off, |m, on| {
        for i in m {
            let spike = Duration::from_millis(rand::rng().random_range(10..=60));
            proxies[i].set(if on {
                Fault::Latency(spike)
            } else {
                Fault::NONE
            });
        }
    });
    let (tally, faults) = run_workload(&plan, &checker, inject).await;
    settle(
        "latency spikes",
        &urls,
        &cluster,
        &plan,
        &checker,
        tally,
        faults,
    )
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
    let plan = plan(
        urls.clone(),
        "f-lost-reply-load",
        Duration::from_millis(500),
        (1, 10),
        false,
    );
    let checker = Arc::new(Checker::default());
    let end = Instant::now() + plan.duration;
    let (on, off) = (Duration::from_millis(250), Duration::from_millis(100));
    let inject = minority_cycles(end, on, off, |m, on| {
        for i in m {
            proxies[i].set(if on { Fault::DropReplies } else { Fault::NONE });
        }
    });
    let (tally, faults) = run_workload(&plan, &checker, inject).await;
    settle(
        "lost replies on a minority",
        &urls,
        &cluster,
        &plan,
        &checker,
        tally,
        faults,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_and_a_node_restart_during_watchdog_holds() {
    let mut cluster = Cluster::start(5);
    // holds longer than the ttl: only renewal keeps them
    let ttl = Duration::from_millis(300);
    let plan = plan(cluster.urls().to_vec(), "f-flush", ttl, (350, 700), true);
    let checker = Arc::new(Checker::default());
    let end = Instant::now() + plan.duration;
    let inject = async {
        let mut n = 0;
        let mut restarted = false;
        while Instant::now() < end {
            for i in 0..5 {
                if cluster.node(i).is_running() {
                    let _: Result<(), _> = redis::cmd("SCRIPT")
                        .arg("FLUSH")
                        .query(&mut cluster.conn(i));
                }
            }
            n += 1;
            if !restarted && n > 3 {
                let i = rand::rng().random_range(0..5);
                cluster.node(i).kill();
                tokio::time::sleep(ttl + Duration::from_millis(100)).await;
                cluster.node(i).restart();
                restarted = true;
                n += 1;
            }
            tokio::time::sleep(Duration::from_millis(120)).await;
        }
        n
    };
    let (tally, faults) = run_workload(&plan, &checker, inject).await;
    settle(
        "script flush + restart (watchdog)",
        cluster.urls(),
        &cluster,
        &plan,
        &checker,
        tally,
        faults,
    )
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
    let stdout = child.child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    wait_for_line(&mut lines, "@@GRANTED", Duration::from_secs(10)).await;
    let granted = Instant::now();
    wait_for_line(&mut lines, "@@RENEWED", 4 * ttl).await;
    let other = builder(cluster.urls()).retry_count(1000).build().unwrap();
    // renewed past its first ttl, and still held
    assert!(granted.elapsed() > ttl);
    let err = other
        .try_lock(&plan.resource, ttl)
        .await
        .expect_err("held by the child");
    assert!(matches!(err, Error::Conflict { .. }), "{err}");

    child.signal(libc::SIGKILL);
    let killed = Instant::now();
    let _ = child.child.wait().await;
    let margin = Duration::from_millis(500);
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
    let store = redlock_harness::RedisServer::start();
    let mut child = Child::spawn_with(
        &plan,
        "paused-holder",
        &[("REDLOCK_CHILD_STORE", store.url())],
    );
    let stdout = child.child.stdout.take().unwrap();
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
    child.signal(libc::SIGSTOP);
    let redlock = builder(cluster.urls()).retry_count(200).build().unwrap();
    let lock = redlock
        .lock(&plan.resource, Duration::from_secs(5))
        .await
        .expect("after expiry");
    let granted = Instant::now();
    checker.section("second-holder", true);
    let fence = redlock.fencing_token(&lock).await.expect("fencing token");
    assert!(fenced_write(
        &store.url(),
        &plan.resource,
        fence,
        "second-holder"
    ));
    // The paused holder wakes up while the second one still works.
    child.signal(libc::SIGCONT);
    tokio::time::sleep(Duration::from_millis(400)).await;
    checker.section("second-holder", false);
    checker.record("second-holder", lock.token(), granted, Instant::now());
    redlock.unlock(&lock).await.unwrap();
    while let Some(line) = lines.next_line().await.unwrap() {
        out.push_str(&line);
        out.push('\n');
    }
    let _ = child.child.wait().await;
    checker.ingest(&out);

    // The lock did its part: the paused holder's validity window closed
    // before the second holder's began.
    assert!(checker.overlaps().is_empty(), "{:?}", checker.overlaps());
    // But the paused holder's critical section ran on into the second
    // holder's: no lock with an expiry can prevent that.
    let interleavings = checker.interleavings();
    assert!(
        !interleavings.is_empty(),
        "the paused holder should have overlapped: {out}"
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
        "fault paused holder: acquisitions 2, faults injected 1, violations 0 (lock windows), critical-section overlaps {} (expected: the limit of any lease), stale writes accepted 0",
        interleavings.len()
    );
}

// ------------------------------------------------------ negative controls

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_an_immediate_restart_without_persistence_lets_a_second_holder_in() {
    // Three nodes, quorum 2. The first holder gets exactly two of them; one
    // of those restarts at once, empty; the second holder gets a majority of
    // nodes that do not know the first lock. The checker must see it.
    let mut cluster = Cluster::start(3);
    let checker = Checker::default();
    let res = resource("control-restart");
    let ttl = Duration::from_secs(10);
    cluster.node(2).kill();
    let a = builder(cluster.urls()).build().unwrap();
    let first = a.try_lock(&res, ttl).await.expect("2 of 3");
    let first_granted = Instant::now();
    cluster.node(2).restart();
    cluster.node(1).restart(); // immediately, no persistence: forgets the lock
    let b = builder(cluster.urls()).retry_count(50).build().unwrap();
    let second = b
        .lock(&res, ttl)
        .await
        .expect("the forgotten lock lets b in");
    let second_granted = Instant::now();
    checker.record("a", first.token(), first_granted, first.expires_at());
    checker.record("b", second.token(), second_granted, second.expires_at());
    let overlaps = checker.overlaps();
    println!(
        "control immediate restart: violations detected {}",
        overlaps.len()
    );
    assert_eq!(overlaps.len(), 1, "the checker missed a planted violation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_a_bare_del_release_lets_two_holders_interleave() {
    // The real workload and checker (six tasks, two child processes), with
    // holders that stall between their work and their release, past their
    // ttl. With the ownership-checked unlock that is harmless: the late
    // release finds the next holder's token and leaves it. With a bare DEL
    // (the mistake the script exists to prevent) a late release deletes the
    // next holder's key while it works, a third client walks in, and the
    // checker must report it. The work itself ends well within the validity,
    // so only the release can cause a violation.
    let cluster = Cluster::start(5);
    let duration = fault_secs().max(Duration::from_secs(3));
    let control = |bare_del: bool| {
        let mut p = plan(
            cluster.urls().to_vec(),
            if bare_del {
                "control-del"
            } else {
                "control-checked"
            },
            Duration::from_millis(250),
            (100, 150),
            false,
        );
        p.duration = duration;
        p.release_after_ms = (250, 400);
        p.bare_del = bare_del;
        p
    };
    let mut found = Vec::new();
    for bare_del in [false, true] {
        let plan = control(bare_del);
        let checker = Arc::new(Checker::default());
        let (tally, _) = run_workload(&plan, &checker, async { 0 }).await;
        let (overlaps, interleavings) = (checker.overlaps(), checker.interleavings());
        println!(
            "control {} release, late: acquisitions {}, overlapping windows {}, interleaved sections {}",
            if bare_del { "bare DEL" } else { "checked" },
            tally.acquisitions,
            overlaps.len(),
            interleavings.len()
        );
        assert_eq!(checker.len() as u64, tally.acquisitions);
        assert!(tally.acquisitions >= 4, "too few acquisitions to judge");
        found.push((overlaps.len(), interleavings.len()));
    }
    assert_eq!(
        found[0],
        (0, 0),
        "the checked release must not let holders overlap"
    );
    assert!(
        found[1].0 > 0 && found[1].1 > 0,
        "the checker missed the bare DEL's violations: {:?}",
        found[1]
    );
}
