//! The fault-test runner, written once: a fault test supplies its plan and
//! the closure that injects its fault; [`run`] does the rest. It starts the
//! workload ([`IN_PROCESS`] tasks here and [`CHILDREN`] contender processes),
//! injects the fault while they contend, and then [`settle`]s: a fresh client
//! must get the lock at once, no key may be left on any node, the checker must
//! find no violation and the lock must have kept working.
//!
//! The contender processes are the test binary itself, re-run with
//! `--ignored --exact child_contender`: every test file that calls [`run`] or
//! [`run_workload`] declares an `#[ignore]`d test of that name which calls
//! [`child_contender`].
//!
//! Each fault runs for `REDLOCK_FAULT_SECS` seconds (default 3).

use std::future::Future;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::RngExt;
use redlock_quorum::{Redlock, RedlockBuilder};

use crate::checker::Checker;
use crate::cluster::{Cluster, resource};
use crate::proxy::Proxy;
use crate::server::RedisServer;
use crate::workload::{self, Plan, Sink, Tally};

/// Contenders that run as tasks of the test process.
pub const IN_PROCESS: usize = 6;
/// Contenders that run as processes of their own.
pub const CHILDREN: usize = 2;

/// How long each fault runs: `REDLOCK_FAULT_SECS`, default 3 seconds.
pub fn fault_secs() -> Duration {
    let secs = std::env::var("REDLOCK_FAULT_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(secs)
}

/// The contenders' builder: short retry delays, so that contention resolves
/// fast, and the default node timeout.
pub fn builder(urls: &[String]) -> RedlockBuilder {
    Redlock::builder(urls.iter().map(String::as_str))
        .retry_delay(Duration::from_millis(5))
        .retry_jitter(Duration::from_millis(10))
}

/// [`builder`] with the plan's options (its restart guard).
pub fn plan_builder(plan: &Plan) -> RedlockBuilder {
    let b = builder(&plan.urls);
    match plan.restart_guard {
        Some(max_ttl) => b.restart_guard(max_ttl),
        None => b,
    }
}

/// A plan over `urls` for a fresh resource named after `topic`, running for
/// [`fault_secs`].
pub fn plan(
    urls: Vec<String>,
    topic: &str,
    ttl: Duration,
    hold_ms: (u64, u64),
    watchdog: bool,
) -> Plan {
    Plan::new(urls, resource(topic), ttl, hold_ms, watchdog, fault_secs())
}

/// The child side of the workload: run the plan this process was given in
/// its environment and print the records and the tally for the parent.
///
/// # Panics
/// When this process was not started by [`Child`].
pub async fn child_contender() {
    let (plan, holder) = workload::plan_from_env().expect("run only by the fault tests");
    let redlock = plan_builder(&plan).build().unwrap();
    let tally = workload::contend(redlock, holder, plan, Sink::Print).await;
    println!("{}", tally.line());
}

/// A contender process the test can pause on its own: the test binary re-run
/// as `child_contender`, killed on drop.
#[derive(Debug)]
pub struct Child {
    child: tokio::process::Child,
}

impl Child {
    /// A contender running the workload loop.
    pub fn spawn(plan: &Plan, holder: &str) -> Self {
        Self::spawn_env(plan, holder, &[])
    }

    /// A contender with extra environment (which a test file's own
    /// `child_contender` may read to do something else than the loop).
    pub fn spawn_env(plan: &Plan, holder: &str, env: &[(&str, String)]) -> Self {
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

    /// Stops the process with SIGSTOP (a GC pause, a stalled VM).
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Resumes a paused process with SIGCONT.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// Kills the process with SIGKILL: no drop, no release.
    pub fn kill(&self) {
        self.signal(libc::SIGKILL);
    }

    /// The process's stdout, to read as it goes.
    ///
    /// # Panics
    /// When it was taken before.
    pub fn stdout(&mut self) -> tokio::process::ChildStdout {
        self.child.stdout.take().expect("stdout taken once")
    }

    /// Waits for the process to end.
    pub async fn wait(&mut self) {
        let _ = self.child.wait().await;
    }

    /// Waits for the process and returns what it printed.
    pub async fn output(self) -> String {
        let out = self.child.wait_with_output().await.expect("child output");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// Runs the workload (in-process tasks and child processes) while `inject`
/// injects faults; returns the tallies and the number of faults injected.
///
/// # Panics
/// When a contender process does not finish, or printed fewer records than
/// its acquisitions call for.
pub async fn run_workload<F: Future<Output = u64>>(
    plan: &Plan,
    checker: &Arc<Checker>,
    inject: F,
) -> (Tally, u64) {
    // each child's output is read as it goes: a pipe nobody reads fills up
    // and would stop a child inside its critical section
    let children: Vec<_> = (0..CHILDREN)
        .map(|i| tokio::spawn(Child::spawn(plan, &format!("proc-{i}")).output()))
        .collect();
    let tasks: Vec<_> = (0..IN_PROCESS)
        .map(|i| {
            let redlock = plan_builder(plan).build().unwrap();
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
        let out = child.await.expect("contender process reader");
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

/// One fault test: the workload of `plan` on `cluster` while `inject` injects
/// the fault, then [`settle`] under `name`. `inject` gets the cluster (to
/// pause, kill or restart its nodes) and the instant the workload ends, and
/// returns how many faults it injected.
///
/// `plan.urls` are the nodes the clients use: the cluster's own, or proxies
/// in front of them.
///
/// # Panics
/// On any violation [`settle`] finds.
pub async fn run(
    name: &str,
    cluster: &mut Cluster,
    plan: &Plan,
    inject: impl AsyncFnOnce(&mut Cluster, Instant) -> u64,
) {
    let checker = Arc::new(Checker::default());
    let end = Instant::now() + plan.duration;
    let (tally, faults) = run_workload(plan, &checker, inject(cluster, end)).await;
    settle(name, cluster, plan, &checker, tally, faults).await;
}

/// The hand-off between two holders in the workload: the test builder's
/// retry delay (5 ms) plus its mean jitter (5 ms).
const HAND_OFF: Duration = Duration::from_millis(10);

/// The fewest acquisitions a healthy run of `plan` gives, to catch a lock
/// that fails safe but stops working (a cleanup that leaves keys behind
/// blocks the resource for a ttl at a time: such a run got 1-3 acquisitions
/// in 3 s where 90-174 are normal). Derived from the time one acquisition
/// takes, the mean hold plus the hand-off. Lock/unlock runs are dominated by
/// the faults and the load: beside four CPU burners on a 2-core machine,
/// moving partitions gave 6 of an expected 200 (3%), so they must reach 2%;
/// a key left behind for good is caught by the fresh acquisition and the
/// leak count of [`settle`] instead. Watchdog runs hold for longer than the
/// ttl and are dominated by the hold itself, so they must reach a quarter.
fn liveness_floor(plan: &Plan) -> u64 {
    let mean_hold = Duration::from_millis((plan.hold_ms.0 + plan.hold_ms.1) / 2);
    let expected = plan.duration.as_secs_f64() / (mean_hold + HAND_OFF).as_secs_f64();
    let fraction = if plan.watchdog { 0.25 } else { 0.02 };
    (expected * fraction).floor() as u64
}

/// How long the fresh client of [`settle`] may take beyond one ttl. A key
/// left behind expires within a ttl, so only a key that never expires (or a
/// guard that kept renewing after its holder ended) makes it wait longer; the
/// margin is for a loaded machine, where the acquisition itself can take
/// seconds.
pub const FRESH_MARGIN: Duration = Duration::from_secs(10);

/// After the faults healed: a fresh client (on `plan.urls`) gets the lock
/// within a ttl plus [`FRESH_MARGIN`], and no key is left on any node of
/// `cluster`. Prints the summary line and checks it.
///
/// Fails only on what a correct lock never does: a violation the
/// [`Checker`] finds (overlapping validity windows, interleaved critical
/// sections of two valid holders), a leaked key, windows unaccounted for,
/// too few acquisitions, an unlock error that indicates a bug, or no fault
/// injected. Overruns (a holder descheduled past its validity while it
/// worked, the documented limit of a lease) are counted in the summary line
/// and do not fail.
///
/// # Panics
/// On any of the failures above.
pub async fn settle(
    name: &str,
    cluster: &Cluster,
    plan: &Plan,
    checker: &Checker,
    tally: Tally,
    faults: u64,
) {
    let fresh = plan_builder(plan).retry_count(100_000).build().unwrap();
    let start = Instant::now();
    let bound = plan.ttl + FRESH_MARGIN;
    let lock = tokio::time::timeout(bound, fresh.lock(&plan.resource, plan.ttl))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{name}: no fresh acquisition within {bound:?} (a ttl and a margin for load); keys {:?}",
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
    let report = checker.report();
    let violations = report.violations();
    let floor = liveness_floor(plan);
    println!(
        "fault {name}: acquisitions {} (floor {floor}), faults injected {faults}, violations {violations} (overlapping windows {}, interleaved valid holders {}, stale writes {}), overruns {} (interleaved {}), expired before entry {}, keys leaked {leaked}, unlock errors {} (bugs {}), fresh lock after {:.0} ms",
        tally.acquisitions,
        report.overlaps,
        report.unexplained_interleavings,
        report.stale_writes,
        report.overruns,
        report.overrun_interleavings,
        tally.expired_before_entry,
        tally.unlock_errors,
        tally.unlock_bugs,
        liveness.as_secs_f64() * 1e3
    );
    let overlaps = checker.overlaps();
    assert!(
        overlaps.is_empty(),
        "{name}: overlapping holders {:?}",
        &overlaps[..overlaps.len().min(3)]
    );
    let unexplained: Vec<_> = checker
        .interleavings()
        .into_iter()
        .filter(|i| !i.overrun)
        .collect();
    assert!(
        unexplained.is_empty(),
        "{name}: interleaved critical sections of two valid holders {unexplained:?}"
    );
    let stale = checker.stale_writes();
    assert!(stale.is_empty(), "{name}: stale writes accepted {stale:?}");
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

/// Two distinct node indexes out of five.
pub fn minority() -> [usize; 2] {
    let a = rand::rng().random_range(0..5);
    let b = (a + rand::rng().random_range(1..5)) % 5;
    [a, b]
}

/// Faults a random minority of nodes for `on` (`act(minority, true)`), heals
/// it for `off` (`act(minority, false)`), and again until `end`; returns how
/// many times.
pub async fn minority_cycles(
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

/// [`minority_cycles`] on the cluster's own servers: `fault` for `on`
/// (pause, kill), `heal` for `off` (resume, restart).
pub async fn minority_server_cycles(
    cluster: &mut Cluster,
    end: Instant,
    on: Duration,
    off: Duration,
    fault: fn(&mut RedisServer),
    heal: fn(&mut RedisServer),
) -> u64 {
    minority_cycles(end, on, off, |m, on| {
        for i in m {
            if on {
                fault(cluster.node(i));
            } else {
                heal(cluster.node(i));
            }
        }
    })
    .await
}

/// A fault proxy in front of each of the cluster's nodes, in order.
pub async fn proxies(cluster: &mut Cluster) -> Vec<Proxy> {
    let mut out = Vec::new();
    for i in 0..cluster.len() {
        out.push(Proxy::to_port(cluster.node(i).port()).await);
    }
    out
}
