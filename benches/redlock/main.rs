//! Side-by-side benchmark: our `Redlock`, `rslock` 0.10, and the floor (raw
//! `SET NX PX` to the five nodes in parallel with plain redis-rs, timed to the
//! quorum-th OK), in one process, on the same five nodes.
//!
//! ```sh
//! cargo bench -p redlock-bench --bench redlock              # full run, a few minutes
//! cargo bench -p redlock-bench --bench redlock -- --quick   # under a minute
//! cargo bench -p redlock-bench --bench redlock -- --only 6,6c  # scenario 1 (the floor) and those
//! cargo bench -p redlock-bench --bench redlock -- --only 10     # clusters as nodes
//! cargo bench -p redlock-bench --bench redlock -- --profile-seconds 10  # scenario 5's loop, ours only
//! ```
//!
//! `--in-task` runs the scenarios from a task on the runtime's worker
//! threads, as a service calls the library, instead of from `block_on`'s
//! own thread (where a spawn, such as the one that finishes the requests
//! still pending at a quorum, wakes a parked worker). Such a run leaves
//! `docs/performance.md` as it is.
//!
//! `--profile-seconds N` runs nothing but scenario 5's 64 tasks for about N
//! seconds, on one subject (`--profile-subject ours|rslock|floor|guard`,
//! ours by default; `guard` is ours with the restart guard on), and prints
//! the rate and the client's and the nodes' CPU per cycle: a steady load for
//! a sampling profiler (`scripts/profile.sh`). It writes no report.
//!
//! Writes a table to stdout, and `target/bench/redlock.{json,md}` plus the
//! latency chart `target/bench/redlock-latency.svg`. A full run also writes
//! its tables into `docs/performance.md` (between `<!-- bench:full:begin -->`
//! and `<!-- bench:full:end -->`) and its chart as `docs/bench-latency.svg`;
//! a `--quick` run writes its own section there (`bench:quick`) and leaves
//! the full run's alone; `--only` and `--no-docs` runs leave the docs as they
//! are (see the `docs` module).
//!
//! # Layout
//! - `subjects`: ours, rslock and the raw floor, behind one interface.
//! - `scenarios`: what is measured, scenario by scenario.
//! - `cost`: what a cycle costs the client and the nodes (scenario 5's 5b).
//! - `samples`: latency samples, percentiles and CDFs.
//! - `report`: the table on stdout, and the JSON and Markdown files.
//! - `chart`: the latency CDFs as SVG.
//! - `docs`: the tables written into `docs/performance.md`.
//! - `heap`: the counting allocator behind the memory figures of scenarios
//!   6e and 7.
//! - `waiters`: scenario 6e, what 10,000 waiters cost the client's memory.
//! - `cluster_nodes`: scenario 10, Redis Clusters of 1, 2 and 3 masters as
//!   the five nodes, against standalone nodes (the crate's `cluster`
//!   feature; the bench starts the clusters itself).

mod chart;
mod cluster_budget;
mod cluster_nodes;
mod contend;
mod cost;
mod docs;
mod heap;
mod report;
mod samples;
mod scenarios;
mod subjects;
mod waiters;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_harness::RedisServer;
use redlock_harness::proxy::Proxy;

use chart::chart;
use report::Report;
use scenarios::{
    Env, scenario_guards, scenario_handoff, scenario_handoff_processes, scenario_healthy,
    scenario_latency, scenario_safety_options, scenario_starvation, scenario_throughput,
    scenario_two_down, scenario_two_resources, scenario_validity, scenario_waiting_cost,
};
use subjects::Subjects;

/// The five per-node latencies of scenario 2; the quorum bound is the third.
const LATENCIES_MS: [f64; 5] = [0.5, 1.0, 2.0, 5.0, 40.0];
const TTL: Duration = Duration::from_secs(10);

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let redis = std::process::Command::new(redlock_harness::server::redis_server_binary())
        .arg("--version")
        .output()
        .ok()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .nth(2)
                .unwrap_or("")
                .trim_start_matches("v=")
                .to_owned()
        })
        .unwrap_or_default();
    format!("{cores} cores, {cpu}, redis-server {redis}, loopback")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--contender") {
        contend::child(&args[i + 1..]);
        return;
    }
    heap::self_check();
    let quick = args.iter().any(|a| a == "--quick");
    // A run from a task leaves the docs alone: their tables are of runs
    // from `block_on`, comparable with each other.
    let no_docs = args.iter().any(|a| a == "--no-docs" || a == "--in-task");
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|list| list.split(',').map(str::to_owned).collect());
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if let Some(secs) = value("--profile-seconds") {
        let secs: f64 = secs.parse().expect("--profile-seconds takes a number");
        let who = match value("--profile-subject").as_deref() {
            None | Some("ours") => Some(subjects::Subject::Ours),
            Some("rslock") => Some(subjects::Subject::Rslock),
            Some("floor") => Some(subjects::Subject::Floor),
            Some("guard") => None,
            Some(other) => panic!("--profile-subject: ours, rslock, floor or guard, not {other}"),
        };
        runtime.block_on(profile_loop(who, Duration::from_secs_f64(secs)));
        return;
    }
    if args.iter().any(|a| a == "--in-task") {
        // Every scenario from a task on the runtime's workers, as a
        // service calls the library, instead of from `block_on`'s thread.
        let task = runtime.spawn(run(quick, only, no_docs));
        runtime.block_on(task).unwrap();
    } else {
        runtime.block_on(run(quick, only, no_docs));
    }
}

/// `--profile-seconds`: scenario 5's loop on one subject (`None`: ours with
/// the restart guard), one-second slices until `length` has passed; prints
/// the rate and the client's and the nodes' CPU.
async fn profile_loop(who: Option<subjects::Subject>, length: Duration) {
    let (urls, _servers) = match redlock_harness::external_nodes() {
        Some(urls) => (urls, Vec::new()),
        None => {
            let servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
            (servers.iter().map(RedisServer::url).collect(), servers)
        }
    };
    let s = Arc::new(Subjects::new(&urls).await);
    // The guard's subject: its markers count once they are TTL old.
    let guarded = match who {
        Some(_) => None,
        None => {
            let guarded = redlock_quorum::Redlock::builder(urls.iter().map(String::as_str))
                .retry_count(0)
                .restart_guard(TTL)
                .build()
                .unwrap();
            let _ = guarded.try_lock("bench:profile:age", TTL).await;
            tokio::time::sleep(TTL + Duration::from_millis(100)).await;
            Some(Arc::new(guarded))
        }
    };
    println!(
        "profiling loop: scenario 5 ({} tasks), {} only, {:.0} s; pid {}",
        scenarios::THROUGHPUT_TASKS,
        who.map_or("redlock-quorum with the restart guard", |w| w.name()),
        length.as_secs_f64(),
        std::process::id()
    );
    let started = Instant::now();
    let cpu0 = cost::cpu_time();
    let stats = cost::Nodes::connect(&urls).await;
    let nodes0 = stats.cpu().await;
    let (mut cycles, mut took, mut round) = (0, Duration::ZERO, 0);
    while started.elapsed() < length {
        let slice = Duration::from_secs(1);
        let (n, t) = match (who, &guarded) {
            (Some(who), _) => scenarios::throughput_slice(&s, who, round, slice).await,
            (None, Some(guarded)) => {
                let guarded = guarded.clone();
                scenarios::run_slice(scenarios::THROUGHPUT_TASKS, slice, move |t, i| {
                    let guarded = guarded.clone();
                    async move {
                        let res = format!("bench:tp:guard:{round}:{t}:{i}");
                        match guarded.try_lock(&res, TTL).await {
                            Ok(lock) => guarded.unlock(&lock).await.is_ok(),
                            Err(_) => false,
                        }
                    }
                })
                .await
            }
            (None, None) => unreachable!("the guard's subject has its manager"),
        };
        cycles += n;
        took += t;
        round += 1;
    }
    let cpu = cost::cpu_time().saturating_sub(cpu0);
    let nodes = stats.cpu().await.saturating_sub(nodes0).as_secs_f64();
    let per = |d: f64| d * 1e6 / cycles.max(1) as f64;
    println!(
        "{cycles} cycles in {:.1} s: {:.0} cycles/s, client CPU {:.1} us per cycle, nodes' CPU {:.1} us per cycle",
        took.as_secs_f64(),
        cycles as f64 / took.as_secs_f64(),
        per(cpu.as_secs_f64()),
        per(nodes)
    );
}

async fn run(quick: bool, only: Option<Vec<String>>, no_docs: bool) {
    // Scenario 1 always runs: it measures the floor the others compare to.
    let wanted = |s: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == s));
    let started = Instant::now();
    // The machine's load before the run, for the docs page: on a shared
    // machine the figures move with it.
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned));
    let (urls, servers) = match redlock_harness::external_nodes() {
        Some(urls) => (urls, Vec::new()),
        None => {
            let servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
            (servers.iter().map(RedisServer::url).collect(), servers)
        }
    };
    let mut proxies = Vec::new();
    for u in &urls {
        let port: u16 = u
            .trim_end_matches('/')
            .rsplit(':')
            .next()
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        proxies.push(Proxy::to_port(port).await);
    }
    let mut env = Env {
        quick,
        urls,
        servers,
        proxies,
    };
    let machine = machine();
    println!(
        "redlock-quorum benchmark{} on {machine}",
        if quick { " (--quick)" } else { "" }
    );
    println!(
        "subjects: redlock-quorum (this crate), rslock 0.10, floor = raw SET NX PX to 5 nodes in parallel, timed to the 3rd OK"
    );

    let mut report = Report::default();
    let healthy = Arc::new(Subjects::new(&env.urls).await);
    let t = Instant::now();
    let floor = scenario_healthy(&env, &healthy, &mut report).await;
    let mut times = vec![("1", t.elapsed())];
    macro_rules! timed {
        ($name:expr, $body:expr) => {
            if wanted($name) {
                let t = Instant::now();
                $body;
                times.push(($name, t.elapsed()));
            }
        };
    }
    timed!("2", scenario_latency(&env, &mut report).await);
    timed!("3", scenario_two_down(&mut env, &mut report).await);
    timed!("4", scenario_validity(&env, &healthy, &mut report).await);
    timed!("5", scenario_throughput(&env, &healthy, &mut report).await);
    timed!("6", scenario_handoff(&env, floor, &mut report).await);
    timed!("6b", scenario_waiting_cost(&env, &mut report).await);
    timed!("6c", scenario_handoff_processes(&env, &mut report).await);
    timed!("6d", scenario_starvation(&env, &mut report).await);
    timed!(
        "6e",
        waiters::scenario_waiter_memory(&env, &mut report).await
    );
    timed!("7", scenario_guards(&env, &mut report).await);
    timed!("8", scenario_two_resources(&env, &mut report).await);
    timed!("9", scenario_safety_options(&env, &mut report).await);
    timed!(
        "10",
        cluster_nodes::scenario_cluster_nodes(&env, &mut report).await
    );
    println!(
        "\nscenario wall times (s): {}",
        times
            .iter()
            .map(|(name, d)| format!("{name}: {:.1}", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    );

    // This crate lives in `benches/`; its outputs go to the workspace's.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("benches/ has a parent");
    let dir = root.join("target/bench");
    let _ = std::fs::create_dir_all(&dir);
    report.save(&dir, &machine, quick);
    let svg = dir.join("redlock-latency.svg");
    if let Err(e) = chart(&report, &svg) {
        eprintln!("chart: {e}");
    }
    println!(
        "\nwrote {}/redlock.{{json,md}} and redlock-latency.svg in {:.1} s",
        dir.display(),
        started.elapsed().as_secs_f64()
    );

    // The docs page: a full run and a quick run each write their own
    // section; a partial run (`--only`) would leave holes, so it writes none.
    let page = root.join("docs/performance.md");
    if no_docs || only.is_some() {
        println!("docs/performance.md left as it is (--only, --no-docs or --in-task)");
        return;
    }
    let kind = if quick {
        docs::Kind::Quick
    } else {
        docs::Kind::Full
    };
    let machine = match load {
        Some(load) => format!("{machine}, load average {load} at the start"),
        None => machine,
    };
    match docs::write(&page, kind, &machine, root, report.markdown()) {
        Ok(()) => println!("wrote this run's tables into {}", page.display()),
        Err(e) => eprintln!("docs: {e}"),
    }
    if !quick {
        match std::fs::copy(&svg, root.join("docs/bench-latency.svg")) {
            Ok(_) => println!("copied the chart to docs/bench-latency.svg"),
            Err(e) => eprintln!("docs/bench-latency.svg: {e}"),
        }
    }
}
