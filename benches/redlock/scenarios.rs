//! The scenarios, numbered as in the report: 1 healthy, 2 per-node latency,
//! 3 two nodes down, 4 validity, 5 throughput (5b what a cycle costs), 6 contention hand-off (6b waiting cost, 6c across OS processes, 6d starvation),
//! 7 many guards under the watchdog, 8 two resources as one set or as two
//! single locks, 9 the restart-safety options. Scenario 6e lives in
//! `waiters`, scenario 10 (clusters as nodes) in `cluster_nodes`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use redlock_harness::RedisServer;
use redlock_harness::proxy::{Fault, Proxy};
use redlock_quorum::Redlock;
use serde_json::json;

use crate::contend::{Who, contend_here};
use crate::cost::{self, Cost, Nodes};
use crate::heap::live_bytes;
use crate::report::{Report, f, ratio};
use crate::samples::Samples;
use crate::subjects::{Subject, Subjects, token};
use crate::{LATENCIES_MS, TTL};

pub(crate) struct Env {
    pub(crate) quick: bool,
    pub(crate) urls: Vec<String>,
    pub(crate) servers: Vec<RedisServer>,
    pub(crate) proxies: Vec<Proxy>,
}

impl Env {
    pub(crate) fn rounds(&self, full: usize, quick: usize) -> usize {
        if self.quick { quick } else { full }
    }
    pub(crate) fn proxy_urls(&self) -> Vec<String> {
        self.proxies.iter().map(Proxy::url).collect()
    }
}

/// Measures `rounds` acquire+release cycles of each subject, interleaved so
/// that drift in the machine's load hits all three alike.
///
/// A subject leaves work behind when its timing stops: the requests still
/// pending at the quorum, finished by a spawned task (the floor's, and this
/// crate's when a node is slow or down). Run with the next subject's, it
/// was charged to whoever came next: in a fixed order (or one rotated,
/// which keeps who follows whom) the floor's leftovers fell on this crate
/// every round. So each cycle is followed by a yield, which lets the
/// spawned task take its first step, and the order runs forward and
/// backward by turns, so that each subject is followed by itself or by
/// rslock, never always by the same other subject.
pub(crate) async fn latency_rounds(
    s: &Subjects,
    rounds_per: [usize; 3],
    ttl: Duration,
    release: bool,
) -> [(Samples, Samples, Samples); 3] {
    let mut out: [(Samples, Samples, Samples); 3] = Default::default();
    let max = *rounds_per.iter().max().unwrap();
    for i in 0..max {
        for step in 0..3 {
            let k = if i % 2 == 0 { step } else { 2 - step };
            let who = Subject::ALL[k];
            if i >= rounds_per[k] {
                continue;
            }
            let res = format!("bench:lat:{}", token());
            if let Some((a, r, v)) = s.cycle(who, &res, ttl, release).await {
                out[k].0.push(a);
                out[k].1.push(r);
                out[k].2.push(v);
            }
            tokio::task::yield_now().await;
        }
    }
    out
}

pub(crate) async fn scenario_healthy(env: &Env, s: &Subjects, report: &mut Report) -> f64 {
    let n = env.rounds(3000, 300);
    let res = latency_rounds(s, [n, n, n], TTL, true).await;
    report.section(
        &format!("1. healthy loopback, {n} rounds each: acquire and release latency (ms)"),
        &[
            "subject",
            "acquire p50",
            "acquire p99",
            "release p50",
            "release p99",
            "acquire p50 / floor",
            "acquire p50 / rslock",
        ],
    );
    let floor_p50 = res[2].0.p50();
    let rs_p50 = res[1].0.p50();
    for (k, who) in Subject::ALL.into_iter().enumerate() {
        let (a, r, _) = &res[k];
        report.line(
            &[who.name().into(), f(a.p50()), f(a.p99()), f(r.p50()), f(r.p99()), ratio(a.p50(), floor_p50), ratio(a.p50(), rs_p50)],
            json!({"scenario": 1, "subject": who.name(), "acquire_p50_ms": a.p50(), "acquire_p99_ms": a.p99(),
                   "release_p50_ms": r.p50(), "release_p99_ms": r.p99(), "rounds": a.0.len()}),
        );
        report
            .curves
            .push((format!("healthy: {}", who.name()), a.cdf()));
    }
    floor_p50
}

pub(crate) async fn scenario_latency(env: &Env, report: &mut Report) {
    for (p, l) in env.proxies.iter().zip(LATENCIES_MS) {
        p.set(Fault::Latency(Duration::from_secs_f64(l / 1e3)));
    }
    let s = Subjects::new(&env.proxy_urls()).await;
    let n = env.rounds(400, 40);
    let res = latency_rounds(&s, [n, env.rounds(100, 10), n], TTL, false).await;
    let bound = LATENCIES_MS[2];
    report.section(
        "2. per-node latency 0.5/1/2/5/40 ms (proxy): acquire latency (ms); the quorum bound is the 3rd-fastest node, 2 ms",
        &["subject", "acquire p50", "acquire p99", "p50 / 2 ms bound", "p50 / floor", "p50 / rslock"],
    );
    for (k, who) in Subject::ALL.into_iter().enumerate() {
        let a = &res[k].0;
        report.line(
            &[who.name().into(), f(a.p50()), f(a.p99()), ratio(a.p50(), bound), ratio(a.p50(), res[2].0.p50()), ratio(a.p50(), res[1].0.p50())],
            json!({"scenario": 2, "subject": who.name(), "acquire_p50_ms": a.p50(), "acquire_p99_ms": a.p99(), "bound_ms": bound, "rounds": a.0.len()}),
        );
        report
            .curves
            .push((format!("latency: {}", who.name()), a.cdf()));
    }
    for p in &env.proxies {
        p.set(Fault::NONE);
    }
}

pub(crate) async fn scenario_two_down(env: &mut Env, report: &mut Report) {
    let n = env.rounds(300, 30);
    let rs = env.rounds(10, 2);
    report.section(
        "3. two of five nodes unavailable: acquire latency (ms)",
        &[
            "fault",
            "subject",
            "acquire p50",
            "acquire p99",
            "p50 / floor",
            "p50 / rslock",
        ],
    );
    // The releases of 3b, timed after each fault's acquisitions: ours and
    // the floor's (whose every release waits its 50 ms timeout for the two
    // silent nodes, so it gets fewer rounds); rslock's unlock is not timed.
    let released = [n, 0, env.rounds(40, 5)];
    let mut releases = Vec::new();
    // blackholed through the proxies
    let s = Subjects::new(&env.proxy_urls()).await;
    env.proxies[3].set(Fault::Blackhole);
    env.proxies[4].set(Fault::Blackhole);
    let res = latency_rounds(&s, [n, rs, n], TTL, false).await;
    emit_fault_rows(report, "blackholed", &res);
    releases.push(("blackholed", latency_rounds(&s, released, TTL, true).await));
    env.proxies[3].set(Fault::NONE);
    env.proxies[4].set(Fault::NONE);
    drop(s);

    // paused with SIGSTOP (only on nodes this bench started)
    if env.servers.len() == 5 {
        let s = Subjects::new(&env.urls).await;
        env.servers[3].pause();
        env.servers[4].pause();
        let res = latency_rounds(&s, [n, rs, n], TTL, false).await;
        releases.push((
            "paused (SIGSTOP)",
            latency_rounds(&s, released, TTL, true).await,
        ));
        env.servers[3].resume();
        env.servers[4].resume();
        emit_fault_rows(report, "paused (SIGSTOP)", &res);
    }

    report.section(
        "3b. two of five nodes unavailable: release latency (ms), right after each acquisition; this crate does not wait for a node found silent (its last request timed out), the floor waits for every node (50 ms timeout)",
        &["fault", "subject", "release p50", "release p99", "release p50 / floor's"],
    );
    for (fault, res) in &releases {
        let floor = res[2].1.p50();
        for k in [0, 2] {
            let who = Subject::ALL[k];
            let r = &res[k].1;
            report.line(
                &[(*fault).into(), who.name().into(), f(r.p50()), f(r.p99()), ratio(r.p50(), floor)],
                json!({"scenario": "3b", "fault": fault, "subject": who.name(), "release_p50_ms": r.p50(),
                       "release_p99_ms": r.p99(), "rounds": r.0.len()}),
            );
        }
    }
}

pub(crate) fn emit_fault_rows(
    report: &mut Report,
    fault: &str,
    res: &[(Samples, Samples, Samples); 3],
) {
    for (k, who) in Subject::ALL.into_iter().enumerate() {
        let a = &res[k].0;
        report.line(
            &[fault.into(), who.name().into(), f(a.p50()), f(a.p99()), ratio(a.p50(), res[2].0.p50()), ratio(a.p50(), res[1].0.p50())],
            json!({"scenario": 3, "fault": fault, "subject": who.name(), "acquire_p50_ms": a.p50(), "acquire_p99_ms": a.p99(), "rounds": a.0.len()}),
        );
        report
            .curves
            .push((format!("{fault}: {}", who.name()), a.cdf()));
    }
}

pub(crate) async fn scenario_validity(env: &Env, healthy: &Subjects, report: &mut Report) {
    let ttls = [
        Duration::from_millis(100),
        Duration::from_secs(1),
        Duration::from_secs(10),
        Duration::from_secs(30),
    ];
    let n = env.rounds(100, 10);
    report.section(
        "4. validity left at acquisition / ttl; target: (ttl - drift - 1.5 x the floor's quorum round trip) / ttl",
        &["network", "ttl", "redlock-quorum median", "redlock-quorum lowest", "rslock 0.10 median", "target", "median met"],
    );
    for p in &env.proxies {
        p.set(Fault::NONE);
    }
    let proxied = Subjects::new(&env.proxy_urls()).await;
    for (network, s, latency) in [("healthy", healthy, false), ("0.5-40 ms", &proxied, true)] {
        if latency {
            for (p, l) in env.proxies.iter().zip(LATENCIES_MS) {
                p.set(Fault::Latency(Duration::from_secs_f64(l / 1e3)));
            }
        }
        for ttl in ttls {
            let res = latency_rounds(s, [n, n.min(20), n], ttl, false).await;
            let ratio_at = |v: &Samples, p: f64| {
                let mut x: Vec<Duration> = v.0.clone();
                x.sort();
                x.get(((x.len() as f64 - 1.0) * p).round() as usize)
                    .map_or(f64::NAN, |d| d.as_secs_f64() / ttl.as_secs_f64())
            };
            let quorum_rtt = res[2].0.p50() / 1e3;
            let drift = ttl.as_secs_f64() * 0.01 + 0.002;
            let target = (ttl.as_secs_f64() - drift - 1.5 * quorum_rtt) / ttl.as_secs_f64();
            let ours = ratio_at(&res[0].2, 0.5);
            let ours_low = ratio_at(&res[0].2, 0.0);
            let theirs = ratio_at(&res[1].2, 0.5);
            report.line(
                &[
                    network.into(),
                    format!("{} ms", ttl.as_millis()),
                    format!("{ours:.4}"),
                    format!("{ours_low:.4}"),
                    format!("{theirs:.4}"),
                    format!("{target:.4}"),
                    if ours >= target { "yes".into() } else { "NO".into() },
                ],
                json!({"scenario": 4, "network": network, "ttl_ms": ttl.as_millis() as u64, "ours_median_ratio": ours,
                       "ours_lowest_ratio": ours_low, "rslock_median_ratio": theirs, "target_ratio": target}),
            );
        }
    }
    for p in &env.proxies {
        p.set(Fault::NONE);
    }
}

pub(crate) async fn scenario_throughput(env: &Env, s: &Arc<Subjects>, report: &mut Report) {
    // Short slices, the subjects taking turns in a rotating order, so that
    // drift in the machine's load hits all three alike.
    let slices = if env.quick { 3 } else { 15 };
    let slice = Duration::from_millis(300);
    let nodes = Nodes::connect(&env.urls).await;
    let mut costs: [Cost; 3] = Default::default();
    let mut elapsed = [Duration::ZERO; 3];
    for round in 0..slices {
        for step in 0..3 {
            let k = (round + step) % 3;
            // The nodes' statistics and CPU, and the client's CPU, around
            // the slice (its tasks' ends included).
            let node0 = nodes.reset().await;
            let cpu0 = cost::cpu_time();
            let (cycles, took) = throughput_slice(s, Subject::ALL[k], round, slice).await;
            let cpu1 = cost::cpu_time();
            let c = &mut costs[k];
            c.client_cpu += cpu1.saturating_sub(cpu0);
            c.add_commands(nodes.commands().await);
            c.node_cpu += nodes.cpu().await.saturating_sub(node0);
            c.cycles += cycles;
            elapsed[k] += took;
        }
    }
    report.section(
        &format!(
            "5. throughput: {THROUGHPUT_TASKS} tasks locking and unlocking distinct resources, {slices} x {} ms slices per subject, interleaved",
            slice.as_millis()
        ),
        &["subject", "cycles/s", "/ floor", "/ rslock"],
    );
    let rates: Vec<f64> = (0..3)
        .map(|k| costs[k].cycles as f64 / elapsed[k].as_secs_f64())
        .collect();
    for (k, who) in Subject::ALL.into_iter().enumerate() {
        report.line(
            &[
                who.name().into(),
                format!("{:.0}", rates[k]),
                ratio(rates[k], rates[2]),
                ratio(rates[k], rates[1]),
            ],
            json!({"scenario": 5, "subject": who.name(), "cycles_per_s": rates[k], "tasks": THROUGHPUT_TASKS}),
        );
    }
    cost::emit(report, &costs);
}

/// Scenario 5's tasks, each locking and unlocking resources of its own.
pub(crate) const THROUGHPUT_TASKS: usize = 64;

/// One slice of scenario 5: `THROUGHPUT_TASKS` tasks cycling `who` on
/// distinct resources for `slice`; (cycles, time until every task ended).
pub(crate) async fn throughput_slice(
    s: &Arc<Subjects>,
    who: Subject,
    round: usize,
    slice: Duration,
) -> (u64, Duration) {
    let s = s.clone();
    run_slice(THROUGHPUT_TASKS, slice, move |t, i| {
        let s = s.clone();
        async move {
            let res = format!("bench:tp:{round}:{t}:{i}");
            s.acquire_release(who, &res, TTL).await.is_some()
        }
    })
    .await
}

/// `tasks` tasks, each running `cycle(task, i)` for i = 0, 1, ... until
/// `slice` has passed; a cycle counts when it returns true. Returns the
/// cycles counted and the time until every task ended (its last cycle
/// included). The throughput scenarios (5, 8, 9b, 10) all measure with it.
pub(crate) async fn run_slice<F, Fut>(tasks: usize, slice: Duration, cycle: F) -> (u64, Duration)
where
    F: Fn(usize, u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
{
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (count, stop, cycle) = (count.clone(), stop.clone(), cycle.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if cycle(t, i).await {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                }
            })
        })
        .collect();
    tokio::time::sleep(slice).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.await;
    }
    (count.load(Ordering::Relaxed), start.elapsed())
}

/// The three subjects of the hand-off scenarios.
const HANDOFF_SUBJECTS: [(&str, Who); 3] = [
    (
        "redlock-quorum (defaults: notified; timed retry 200 ms + 0-100 ms)",
        Who::Ours(None),
    ),
    (
        "redlock-quorum (retry 5 ms + 0-5 ms)",
        Who::Ours(Some(Duration::from_millis(5))),
    ),
    ("rslock 0.10 (defaults: 0-200 ms)", Who::Rslock),
];

pub(crate) async fn scenario_handoff(env: &Env, floor: f64, report: &mut Report) {
    let handoffs = env.rounds(400, 60);
    report.section(
        &format!("6. contention hand-off: one holder's release -> another holder's grant, one resource, each task its own manager (up to {handoffs} grants, hold 2 ms, think 1 ms); floor = scenario 1's, hand-off floor = raw PUBLISH in the release script, raw SUBSCRIBE, raw SET NX to 5 nodes"),
        &["subject", "tasks", "hand-offs", "median ms", "p99 ms", "median / floor", "median / hand-off floor"],
    );
    let raw = crate::contend::handoff_floor(&env.urls, handoffs).await;
    let raw_p50 = raw.p50();
    report.line(
        &["hand-off floor (redis-rs only)".into(), "1 + 1".into(), raw.0.len().to_string(), f(raw_p50), f(raw.p99()), ratio(raw_p50, floor), ratio(raw_p50, raw_p50)],
        json!({"scenario": 6, "subject": "hand-off floor", "handoff_p50_ms": raw_p50, "handoff_p99_ms": raw.p99(), "handoffs": raw.0.len()}),
    );
    let urls: Vec<&str> = env.urls.iter().map(String::as_str).collect();
    for tasks in [2usize, 8, 32] {
        let shared = (
            "redlock-quorum (defaults), one manager for all tasks",
            Who::Ours(None),
        );
        for (k, (label, who)) in HANDOFF_SUBJECTS.into_iter().chain([shared]).enumerate() {
            let one = k == HANDOFF_SUBJECTS.len();
            let limit = Duration::from_millis(if env.quick { 1500 } else { 20_000 });
            let grants =
                contend_here(who, &urls, "bench:handoff", tasks, one, limit, handoffs).await;
            let gaps = crate::contend::gaps(&grants);
            report.line(
                &[label.into(), tasks.to_string(), gaps.0.len().to_string(), f(gaps.p50()), f(gaps.p99()), ratio(gaps.p50(), floor), ratio(gaps.p50(), raw_p50)],
                json!({"scenario": 6, "subject": label, "tasks": tasks, "handoff_p50_ms": gaps.p50(), "handoff_p99_ms": gaps.p99(), "handoffs": gaps.0.len()}),
            );
        }
    }
}

/// 6c. The hand-off with contenders in 8 separate OS processes, one manager
/// per process: 1 task each (8 contenders) and 4 each (32).
pub(crate) async fn scenario_handoff_processes(env: &Env, report: &mut Report) {
    const PROCESSES: usize = 8;
    let run = Duration::from_millis(if env.quick { 1500 } else { 6000 });
    report.section(
        &format!("6c. contention hand-off across {PROCESSES} OS processes, one manager each ({} s each, hold 2 ms, think 1 ms)", run.as_secs_f64()),
        &["subject", "tasks", "hand-offs", "median ms", "p99 ms"],
    );
    for per in [1usize, 4] {
        for (label, who) in HANDOFF_SUBJECTS {
            let urls = env.urls.clone();
            let grants = tokio::task::spawn_blocking(move || {
                crate::contend::in_processes(who, &urls, PROCESSES, per, run)
            })
            .await
            .unwrap();
            let gaps = crate::contend::gaps(&grants);
            let tasks = PROCESSES * per;
            report.line(
                &[label.into(), format!("{tasks} ({PROCESSES} x {per})"), gaps.0.len().to_string(), f(gaps.p50()), f(gaps.p99())],
                json!({"scenario": "6c", "subject": label, "processes": PROCESSES, "tasks": tasks, "handoff_p50_ms": gaps.p50(), "handoff_p99_ms": gaps.p99(), "handoffs": gaps.0.len()}),
            );
        }
    }
}

/// 6d. Starvation: 32 contenders on one resource for 10 s; how the grants
/// spread over the contenders.
pub(crate) async fn scenario_starvation(env: &Env, report: &mut Report) {
    const TASKS: usize = 32;
    let run = Duration::from_millis(if env.quick { 2000 } else { 10_000 });
    report.section(
        &format!("6d. starvation: {TASKS} contenders, one resource, {} s (hold 2 ms, think 1 ms); grants per contender", run.as_secs_f64()),
        &["subject", "grants", "min", "median", "max", "contenders with none", "max / mean"],
    );
    let urls: Vec<&str> = env.urls.iter().map(String::as_str).collect();
    let subjects = [
        (
            "redlock-quorum (defaults), one manager per contender",
            Who::Ours(None),
            false,
        ),
        (
            "redlock-quorum (defaults), one manager for all",
            Who::Ours(None),
            true,
        ),
        ("rslock 0.10 (defaults)", Who::Rslock, false),
    ];
    for (label, who, one) in subjects {
        let grants = contend_here(who, &urls, "bench:starve", TASKS, one, run, usize::MAX).await;
        let mut per = vec![0u64; TASKS];
        for (c, _, _, _) in &grants {
            per[*c] += 1;
        }
        let total: u64 = per.iter().sum();
        per.sort_unstable();
        let none = per.iter().filter(|&&n| n == 0).count();
        let mean = total as f64 / TASKS as f64;
        report.line(
            &[label.into(), total.to_string(), per[0].to_string(), per[TASKS / 2].to_string(), per[TASKS - 1].to_string(), none.to_string(), format!("{:.2}", per[TASKS - 1] as f64 / mean)],
            json!({"scenario": "6d", "subject": label, "tasks": TASKS, "run_s": run.as_secs_f64(), "grants": total, "per_contender_sorted": per}),
        );
    }
}

pub(crate) fn cpu_seconds() -> f64 {
    // utime + stime of this process, in clock ticks (USER_HZ = 100 on Linux)
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields.get(11).and_then(|x| x.parse().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|x| x.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

pub(crate) async fn scenario_guards(env: &Env, report: &mut Report) {
    let guards = if env.quick { 1_000 } else { 10_000 };
    // every guard renews each second: 10,000 renewals (50,000 scripts across
    // the five nodes) per second on a machine that also runs the servers
    let ttl = Duration::from_secs(3);
    let rounds = if env.quick { 2 } else { 4 };
    let redlock = Redlock::new(env.urls.iter().map(String::as_str)).unwrap();
    let heap_before = live_bytes();
    let sem = Arc::new(tokio::sync::Semaphore::new(64));
    let mut pending = FuturesUnordered::new();
    for g in 0..guards {
        let (redlock, sem) = (redlock.clone(), sem.clone());
        pending.push(async move {
            let _permit = sem.acquire_owned().await.unwrap();
            redlock.acquire(&format!("bench:guard:{g}"), ttl).await
        });
    }
    let mut held = Vec::with_capacity(guards);
    while let Some(g) = pending.next().await {
        if let Ok(g) = g {
            held.push(g);
        }
    }
    let heap_after = live_bytes();
    let cpu0 = cpu_seconds();
    let renewals0: u64 = held.iter().map(|g| g.renewals()).sum();
    let t0 = Instant::now();
    tokio::time::sleep(ttl / 3 * rounds).await;
    let wall = t0.elapsed();
    let cpu = cpu_seconds() - cpu0;
    let renewals: u64 = held.iter().map(|g| g.renewals()).sum::<u64>() - renewals0;
    let still = held.iter().filter(|g| g.is_held()).count();
    let per_round = cpu / rounds as f64;
    let per_guard = (heap_after - heap_before) / held.len().max(1) as f64;
    report.section(
        &format!(
            "7. {} guards held at once (ttl {} s, renewal every {} ms)",
            held.len(),
            ttl.as_secs(),
            (ttl / 3).as_millis()
        ),
        &[
            "renewal rounds",
            "renewals",
            "still held",
            "CPU s / round",
            "CPU us / renewal",
            "memory / guard",
        ],
    );
    report.line(
        &[rounds.to_string(), renewals.to_string(), still.to_string(), format!("{per_round:.3}"), format!("{:.1}", cpu * 1e6 / renewals.max(1) as f64), format!("{:.0} B", per_guard)],
        json!({"scenario": 7, "guards": held.len(), "rounds": rounds, "renewals": renewals, "still_held": still,
               "cpu_s_per_round": per_round, "cpu_us_per_renewal": cpu * 1e6 / renewals.max(1) as f64,
               "heap_bytes_per_guard": per_guard, "wall_s": wall.as_secs_f64()}),
    );
    report.note("CPU is this process's user+system time (the client side; the Redis servers are separate processes); memory is the live heap (counted by the bench's allocator) that the guards hold, divided by the guards: the renewal task, its timer, the watch channel and the lock.");
    for g in held {
        let _ = g.release().await;
    }
}

/// One cycle of scenario 8: both resources taken and released, either as
/// one set or as two single locks in turn (acquired one after the other,
/// released together). Returns the acquisition and the whole cycle.
async fn two_resources(
    redlock: &Redlock,
    many: bool,
    x: &str,
    y: &str,
) -> Option<(Duration, Duration)> {
    let start = Instant::now();
    if many {
        let lock = redlock.try_lock(&[x, y], TTL).await.ok()?;
        let acquired = start.elapsed();
        redlock.unlock(&lock).await.ok()?;
        Some((acquired, start.elapsed()))
    } else {
        let first = redlock.try_lock(x, TTL).await.ok()?;
        let Ok(second) = redlock.try_lock(y, TTL).await else {
            let _ = redlock.unlock(&first).await;
            return None;
        };
        let acquired = start.elapsed();
        let (a, b) = futures::join!(redlock.unlock(&first), redlock.unlock(&second));
        a.ok()?;
        b.ok()?;
        Some((acquired, start.elapsed()))
    }
}

pub(crate) async fn scenario_two_resources(env: &Env, report: &mut Report) {
    const TASKS: usize = 64;
    const WAYS: [(&str, bool); 2] = [("lock([x, y])", true), ("lock(x); lock(y)", false)];
    let redlock = Redlock::new(env.urls.iter().map(String::as_str)).unwrap();
    let n = env.rounds(2000, 300);
    let mut samples: [(Samples, Samples); 2] = Default::default();
    // Interleaved, so that drift in the machine's load hits both alike.
    for i in 0..n {
        for (k, (_, many)) in WAYS.into_iter().enumerate() {
            let (x, y) = (format!("bench:two:{i}:x"), format!("bench:two:{i}:y"));
            if let Some((acquired, cycle)) = two_resources(&redlock, many, &x, &y).await {
                samples[k].0.push(acquired);
                samples[k].1.push(cycle);
            }
        }
    }
    let slices = if env.quick { 3 } else { 15 };
    let slice = Duration::from_millis(300);
    let rates = interleaved_rates(2, slices, slice, TASKS, move |k, name| {
        let redlock = redlock.clone();
        async move {
            let (x, y) = (
                format!("bench:two-tp:{name}:x"),
                format!("bench:two-tp:{name}:y"),
            );
            two_resources(&redlock, WAYS[k].1, &x, &y).await.is_some()
        }
    })
    .await;
    report.section(
        &format!(
            "8. two resources: one set against two single locks taken one after the other (released together); {n} cycles each for latency (ms), {TASKS} tasks x {slices} x {} ms slices for throughput",
            slice.as_millis()
        ),
        &[
            "way",
            "acquire p50",
            "acquire p99",
            "cycle p50",
            "cycle p99",
            "cycles/s",
            "cycles/s / two singles",
        ],
    );
    for (k, (name, _)) in WAYS.into_iter().enumerate() {
        let (acquire, cycle) = &samples[k];
        report.line(
            &[
                name.into(),
                f(acquire.p50()),
                f(acquire.p99()),
                f(cycle.p50()),
                f(cycle.p99()),
                format!("{:.0}", rates[k]),
                ratio(rates[k], rates[1]),
            ],
            json!({
                "scenario": 8, "way": name,
                "acquire_p50_ms": acquire.p50(), "acquire_p99_ms": acquire.p99(),
                "cycle_p50_ms": cycle.p50(), "cycle_p99_ms": cycle.p99(),
                "cycles_per_s": rates[k], "tasks": TASKS,
            }),
        );
    }
}

/// Commands processed by each node so far (`INFO commandstats`, every
/// command but `INFO` itself).
async fn commands_per_node(urls: &[String]) -> Vec<u64> {
    let mut out = Vec::new();
    for u in urls {
        let client = redis::Client::open(u.as_str()).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut c)
            .await
            .unwrap();
        let calls = info
            .lines()
            .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum();
        out.push(calls);
    }
    out
}

/// 6b. What waiting costs the nodes: 32 contenders wait 2 s on a lock held
/// throughout, and each node's processed commands are counted before and
/// after.
pub(crate) async fn scenario_waiting_cost(env: &Env, report: &mut Report) {
    const WAITERS: usize = 32;
    let wait = Duration::from_secs(2);
    report.section(
        &format!("6b. waiting cost: {WAITERS} contenders wait {} s on one held lock; commands per node (INFO commandstats)", wait.as_secs()),
        &["subject", "commands per node", "per waiter per node"],
    );
    let urls: Vec<&str> = env.urls.iter().map(String::as_str).collect();
    for label in [
        "redlock-quorum (defaults), one manager per contender",
        "redlock-quorum (defaults), one manager for all",
        "rslock 0.10 (defaults: 3 retries, 0-200 ms; called again until 2 s)",
    ] {
        let resource = format!("bench:wait:{}", token());
        let holder = Redlock::new(urls.clone()).unwrap();
        let held = holder.lock(&resource, TTL).await.unwrap();
        let shared = Redlock::new(urls.clone()).unwrap();
        // connections made before counting
        redlock_harness::warm(&shared).await;
        let mut all = FuturesUnordered::new();
        let mut managers = Vec::new();
        for _ in 0..WAITERS {
            let ours = if label.contains("one manager for all") {
                shared.clone()
            } else {
                let r = Redlock::new(urls.clone()).unwrap();
                redlock_harness::warm(&r).await;
                r
            };
            let theirs = rslock::LockManager::new(urls.clone());
            let _ = theirs.lock("bench:warm", Duration::from_millis(10)).await;
            managers.push((ours, theirs));
        }
        let before = commands_per_node(&env.urls).await;
        for (ours, theirs) in managers {
            let resource = resource.clone();
            let rslock = label.starts_with("rslock");
            all.push(async move {
                if rslock {
                    let until = Instant::now() + wait;
                    while Instant::now() < until {
                        if theirs.lock(resource.as_str(), TTL).await.is_ok() {
                            break;
                        }
                    }
                } else {
                    let _ = ours.lock_within(&resource, TTL, wait).await;
                }
            });
        }
        while all.next().await.is_some() {}
        tokio::time::sleep(Duration::from_millis(100)).await;
        let after = commands_per_node(&env.urls).await;
        let per_node: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        let mean = per_node.iter().sum::<u64>() as f64 / per_node.len() as f64;
        let _ = holder.unlock(&held).await;
        report.line(
            &[label.into(), format!("{per_node:?}"), format!("{:.1}", mean / WAITERS as f64)],
            json!({"scenario": "6b", "subject": label, "waiters": WAITERS, "wait_s": wait.as_secs_f64(), "commands_per_node": per_node, "per_waiter_per_node": mean / WAITERS as f64}),
        );
    }
}

/// Scenario 9: what the restart-safety options cost on a healthy cluster:
/// the restart guard (a Lua script with the generation marker instead of a
/// plain `SET`) and acknowledged durability (`WAITAOF` pipelined behind the
/// write, on five extra nodes with `appendonly yes` and `appendfsync
/// always`, where the server has `WAITAOF`). Interleaved, one lock and
/// unlock at a time, compared with the default manager of the same run.
pub(crate) async fn scenario_safety_options(env: &Env, report: &mut Report) {
    // Every way locks with this ttl; it is also the guard's max_ttl.
    const GUARD: Duration = Duration::from_millis(300);
    let urls = || env.urls.iter().map(String::as_str);
    let plain = Redlock::new(urls()).unwrap();
    let guarded = Redlock::builder(urls())
        .restart_guard(GUARD)
        .build()
        .unwrap();
    // The markers of a fresh cluster count once they are GUARD old.
    let _ = guarded.try_lock("bench:safety:age", GUARD).await;
    tokio::time::sleep(GUARD + Duration::from_millis(50)).await;
    // Five more nodes that fsync every write, for the durable subject.
    let aof: Vec<RedisServer> = (0..5)
        .map(|_| RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]))
        .collect();
    let aof_urls: Vec<String> = aof.iter().map(RedisServer::url).collect();
    let on_aof = Redlock::new(aof_urls.iter().map(String::as_str)).unwrap();
    let durable = Redlock::builder(aof_urls.iter().map(String::as_str))
        .durability(redlock_quorum::Durability::Disk {
            timeout: Duration::from_millis(40),
        })
        .build()
        .unwrap();
    let durable_works = durable.try_lock("bench:safety:probe", GUARD).await.is_ok();
    let mut ways: Vec<(&str, &Redlock)> = vec![("default", &plain), ("restart_guard", &guarded)];
    ways.push(("appendfsync always, default", &on_aof));
    if durable_works {
        ways.push(("appendfsync always, durability Disk", &durable));
    }
    let n = env.rounds(2000, 300);
    let mut samples: Vec<(Samples, Samples)> = ways.iter().map(|_| Default::default()).collect();
    for i in 0..n {
        for (k, (_, redlock)) in ways.iter().enumerate() {
            let key = format!("bench:safety:{i}:{k}");
            let start = Instant::now();
            let Ok(lock) = redlock.try_lock(&key, GUARD).await else {
                continue;
            };
            let acquired = start.elapsed();
            if redlock.unlock(&lock).await.is_ok() {
                samples[k].0.push(acquired);
                samples[k].1.push(start.elapsed());
            }
        }
    }
    report.section(
        &format!(
            "9. restart-safety options: {n} lock+unlock cycles each (300 ms ttl), interleaved (ms){}",
            if durable_works {
                ""
            } else {
                "; durability Disk not measured: this server has no WAITAOF (Redis < 7.2)"
            }
        ),
        &[
            "way",
            "acquire p50",
            "acquire p99",
            "cycle p50",
            "cycle p99",
            "acquire p50 / default",
        ],
    );
    let base = samples[0].0.p50();
    for (k, (name, _)) in ways.iter().enumerate() {
        let (acquire, cycle) = &samples[k];
        report.line(
            &[
                (*name).into(),
                f(acquire.p50()),
                f(acquire.p99()),
                f(cycle.p50()),
                f(cycle.p99()),
                ratio(acquire.p50(), base),
            ],
            json!({
                "scenario": 9, "way": name,
                "acquire_p50_ms": acquire.p50(), "acquire_p99_ms": acquire.p99(),
                "cycle_p50_ms": cycle.p50(), "cycle_p99_ms": cycle.p99(),
            }),
        );
    }
    drop(aof);

    // Throughput of the options that cost CPU, not disk: 64 tasks, slices
    // taken in a rotating order.
    let stats_off = Redlock::builder(urls()).stats(false).build().unwrap();
    let ways: [(&str, &Redlock); 3] = [
        ("default (stats on)", &plain),
        ("stats(false)", &stats_off),
        ("restart_guard", &guarded),
    ];
    const TASKS: usize = 64;
    let slices = if env.quick { 3 } else { 15 };
    let slice = Duration::from_millis(300);
    let managers: Arc<[Redlock]> = ways.iter().map(|(_, r)| (*r).clone()).collect();
    let rates = interleaved_rates(3, slices, slice, TASKS, move |k, name| {
        let redlock = managers[k].clone();
        async move {
            let key = format!("bench:safety-tp:{k}:{name}");
            match redlock.try_lock(&key, GUARD).await {
                Ok(lock) => redlock.unlock(&lock).await.is_ok(),
                Err(_) => false,
            }
        }
    })
    .await;
    report.section(
        &format!(
            "9b. throughput of the same options: {TASKS} tasks, {slices} x {} ms slices each, interleaved",
            slice.as_millis()
        ),
        &["way", "cycles/s", "/ stats(false)"],
    );
    for (k, (name, _)) in ways.iter().enumerate() {
        report.line(
            &[
                (*name).into(),
                format!("{:.0}", rates[k]),
                ratio(rates[k], rates[1]),
            ],
            json!({"scenario": "9b", "way": name, "cycles_per_s": rates[k], "tasks": TASKS}),
        );
    }
}

/// Cycles per second of each of `ways` ways, measured in `slices` rounds of
/// one `slice` per way, the ways taking turns in a rotating order (so that
/// drift in the machine's load hits all alike), `tasks` tasks each running
/// `cycle(way, unique name)` until the slice ends; a cycle counts when it
/// returns true.
async fn interleaved_rates<F, Fut>(
    ways: usize,
    slices: usize,
    slice: Duration,
    tasks: usize,
    cycle: F,
) -> Vec<f64>
where
    F: Fn(usize, String) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
{
    let mut cycles = vec![0u64; ways];
    let mut elapsed = vec![Duration::ZERO; ways];
    for round in 0..slices {
        for step in 0..ways {
            let k = (round + step) % ways;
            let cycle = cycle.clone();
            let (n, took) = run_slice(tasks, slice, move |t, i| {
                cycle(k, format!("{round}:{t}:{}", i + 1))
            })
            .await;
            cycles[k] += n;
            elapsed[k] += took;
        }
    }
    (0..ways)
        .map(|k| cycles[k] as f64 / elapsed[k].as_secs_f64())
        .collect()
}
