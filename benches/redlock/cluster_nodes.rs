//! Scenario 10: clusters as nodes. Five Redis Clusters of 1, 2 and 3
//! masters (no replicas) as the five Redlock nodes, against the five
//! standalone nodes of the other scenarios, all on this machine's loopback:
//!
//! - 10: lock+unlock cycles a second over distinct resources, measured as
//!   scenario 5 measures ours (`run_slice`, 64 tasks, 300 ms slices, the
//!   subjects taking turns in a rotating order), with the client's CPU
//!   (`getrusage`) and the masters' CPU (`INFO cpu`) per cycle;
//! - 10b: how those slices' commands spread over the masters: each
//!   master's `INFO commandstats` calls read before and after every slice
//!   (differences, no `CONFIG RESETSTAT`);
//! - 10c: the latency of one uncontended `try_lock` (its unlock untimed),
//!   the subjects interleaved cycle by cycle;
//! - 10d: cycles a second when every server has the same CPU budget
//!   ([`crate::cluster_budget`]).
//!
//! Every manager has the default settings but `retry_count(0)`, as ours in
//! scenario 5. The clusters are started here (`redlock_harness::shards`),
//! all before the first measurement so that the subjects can take turns,
//! and killed at the end.

use std::time::{Duration, Instant};

use redlock_harness::shards::RedisClusters;
use redlock_quorum::Redlock;
use serde_json::json;

use crate::TTL;
use crate::cost::{self, Nodes};
use crate::report::{Report, f, ratio};
use crate::samples::Samples;
use crate::scenarios::{Env, THROUGHPUT_TASKS, run_slice};

/// Masters per cluster, one subject each.
const MASTERS: [usize; 3] = [1, 2, 3];

/// One way of making the five Redlock nodes: standalone servers, or
/// clusters of `masters` masters.
struct Way {
    label: String,
    /// Masters per node (1 for a standalone node).
    masters: usize,
    /// The node URLs, and those of every master of every node.
    urls: Vec<String>,
    master_urls: Vec<String>,
    redlock: Redlock,
    /// A plain connection to every master of every node, for the statistics.
    stats: Nodes,
}

impl Way {
    /// A manager over `urls`, warmed by a short untimed slice (which also
    /// lets a cluster client learn its slot map and reach every master).
    async fn new(label: String, masters: usize, urls: &[String], master_urls: &[String]) -> Self {
        let redlock = Redlock::builder(urls.iter().map(String::as_str))
            .retry_count(0)
            .build()
            .unwrap();
        redlock_harness::warm(&redlock).await;
        let warm = redlock.clone();
        run_slice(THROUGHPUT_TASKS, Duration::from_millis(200), move |t, i| {
            let warm = warm.clone();
            async move { cycle(&warm, &format!("bench:cn-warm:{t}:{i}")).await }
        })
        .await;
        Way {
            label,
            masters,
            urls: urls.to_vec(),
            master_urls: master_urls.to_vec(),
            redlock,
            stats: Nodes::connect(master_urls).await,
        }
    }
}

/// One cycle, as ours in scenario 5: `try_lock`, then `unlock` (its
/// outcome not counted); true when the lock was granted.
async fn cycle(redlock: &Redlock, resource: &str) -> bool {
    match redlock.try_lock(resource, TTL).await {
        Ok(lock) => {
            let _ = redlock.unlock(&lock).await;
            true
        }
        Err(_) => false,
    }
}

/// One way's slices, summed.
#[derive(Default)]
struct Tally {
    cycles: u64,
    elapsed: Duration,
    client_cpu: Duration,
    server_cpu: Duration,
    /// Commands run by each master.
    calls: Vec<u64>,
    /// Socket reads of all the masters.
    reads: u64,
}

impl Tally {
    fn rate(&self) -> f64 {
        self.cycles as f64 / self.elapsed.as_secs_f64()
    }

    fn per_cycle_us(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1e6 / self.cycles.max(1) as f64
    }

    /// Each master's commands a second.
    fn master_rates(&self) -> Vec<f64> {
        let secs = self.elapsed.as_secs_f64();
        self.calls.iter().map(|&c| c as f64 / secs).collect()
    }

    /// Commands per cycle, summed over the masters.
    fn commands_per_cycle(&self) -> f64 {
        self.calls.iter().sum::<u64>() as f64 / self.cycles.max(1) as f64
    }

    /// The largest share of its own cluster's commands that one master ran
    /// (the masters are listed cluster by cluster, `masters` each); 1/m
    /// when the slots spread the work evenly.
    fn busiest_share(&self, masters: usize) -> f64 {
        self.calls
            .chunks(masters)
            .flat_map(|cluster| {
                let total = cluster.iter().sum::<u64>().max(1) as f64;
                cluster.iter().map(move |&c| c as f64 / total)
            })
            .fold(0.0, f64::max)
    }

    /// Commands per socket read, over the masters: how much the client's
    /// requests batch on each connection.
    fn commands_per_read(&self) -> f64 {
        self.calls.iter().sum::<u64>() as f64 / self.reads.max(1) as f64
    }
}

/// The three groups of five clusters, started at once (their processes
/// start and their clusters form in parallel), in `MASTERS` order.
async fn start_clusters() -> Vec<RedisClusters> {
    let starting: Vec<_> = MASTERS
        .iter()
        .map(|&m| tokio::task::spawn_blocking(move || RedisClusters::start(5, m, 0)))
        .collect();
    let mut clusters = Vec::new();
    for s in starting {
        clusters.push(s.await.expect("the clusters start"));
    }
    clusters
}

pub(crate) async fn scenario_cluster_nodes(env: &Env, report: &mut Report) {
    let t = Instant::now();
    let clusters = start_clusters().await;
    let startup = t.elapsed();
    let standalone = format!("{} standalone nodes", env.urls.len());
    let mut ways = vec![Way::new(standalone, 1, &env.urls, &env.urls).await];
    for (&m, group) in MASTERS.iter().zip(&clusters) {
        let masters: Vec<String> = group
            .iter()
            .flat_map(|c| (0..c.masters()).map(|i| c.master_url(i)))
            .collect();
        let label = format!("5 clusters of {m} master{}", if m == 1 { "" } else { "s" });
        ways.push(Way::new(label, m, &group.urls(), &masters).await);
    }
    throughput(env, &ways, report).await;
    latency(env, &ways, report).await;
    let subjects: Vec<crate::cluster_budget::Subject<'_>> = ways
        .iter()
        .map(|w| crate::cluster_budget::Subject {
            label: &w.label,
            masters: w.masters,
            urls: &w.urls,
            servers: &w.master_urls,
        })
        .collect();
    crate::cluster_budget::scenario(&subjects, env.quick, report).await;
    drop(ways);
    drop(clusters);
    report.note(&format!(
        "The {} clusters' {} servers took {:.1} s to start and form; they ran, idle, through every subject's slices.",
        MASTERS.len() * 5,
        MASTERS.iter().sum::<usize>() * 5,
        startup.as_secs_f64()
    ));
}

/// Sections 10 and 10b.
async fn throughput(env: &Env, ways: &[Way], report: &mut Report) {
    let slices = if env.quick { 3 } else { 15 };
    let slice = Duration::from_millis(300);
    let mut tallies: Vec<Tally> = ways.iter().map(|_| Tally::default()).collect();
    for round in 0..slices {
        for step in 0..ways.len() {
            let k = (round + step) % ways.len();
            let way = &ways[k];
            let (calls0, reads0) = (way.stats.calls().await, way.stats.reads().await);
            let server0 = way.stats.cpu().await;
            let cpu0 = cost::cpu_time();
            let redlock = way.redlock.clone();
            let (cycles, took) = run_slice(THROUGHPUT_TASKS, slice, move |t, i| {
                let redlock = redlock.clone();
                async move { cycle(&redlock, &format!("bench:cn:{k}:{round}:{t}:{i}")).await }
            })
            .await;
            let cpu1 = cost::cpu_time();
            let (calls1, reads1) = (way.stats.calls().await, way.stats.reads().await);
            let server1 = way.stats.cpu().await;
            let tally = &mut tallies[k];
            tally.cycles += cycles;
            tally.elapsed += took;
            tally.client_cpu += cpu1.saturating_sub(cpu0);
            tally.server_cpu += server1.saturating_sub(server0);
            tally.calls.resize(calls1.len(), 0);
            for (sum, (after, before)) in tally.calls.iter_mut().zip(calls1.iter().zip(&calls0)) {
                *sum += after.saturating_sub(*before);
            }
            tally.reads += reads1
                .iter()
                .sum::<u64>()
                .saturating_sub(reads0.iter().sum::<u64>());
        }
    }

    report.section(
        &format!(
            "10. clusters as nodes: five Redis Clusters of 1, 2 and 3 masters (no replicas) against five standalone nodes; {THROUGHPUT_TASKS} tasks locking and unlocking distinct resources, {slices} x {} ms slices each, interleaved; client CPU = getrusage(RUSAGE_SELF), server CPU = INFO cpu summed over every master",
            slice.as_millis()
        ),
        &[
            "nodes",
            "cycles/s",
            "/ standalone",
            "client CPU us / cycle",
            "server CPU us / cycle",
        ],
    );
    let base = &tallies[0];
    for (way, tally) in ways.iter().zip(&tallies) {
        let (client, server) = (
            tally.per_cycle_us(tally.client_cpu),
            tally.per_cycle_us(tally.server_cpu),
        );
        report.line(
            &[
                way.label.clone(),
                format!("{:.0}", tally.rate()),
                ratio(tally.rate(), base.rate()),
                format!("{client:.1}"),
                format!("{server:.1}"),
            ],
            json!({"scenario": 10, "nodes": way.label, "masters_per_node": way.masters,
                   "cycles_per_s": tally.rate(), "tasks": THROUGHPUT_TASKS, "cycles": tally.cycles,
                   "client_cpu_us_per_cycle": client, "server_cpu_us_per_cycle": server}),
        );
    }

    report.section(
        "10b. commands per shard: the same slices, each master's INFO commandstats calls (the commands a script runs included) a second; commands / read = calls / INFO stats total_reads_processed",
        &[
            "nodes",
            "masters",
            "commands / cycle",
            "commands / read",
            "total / s",
            "per master / s: min",
            "mean",
            "max",
            "max / mean",
        ],
    );
    for (way, tally) in ways.iter().zip(&tallies) {
        let rates = tally.master_rates();
        let total: f64 = rates.iter().sum();
        let mean = total / rates.len().max(1) as f64;
        let min = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let max = rates.iter().copied().fold(0.0, f64::max);
        report.line(
            &[
                way.label.clone(),
                rates.len().to_string(),
                format!("{:.1}", tally.commands_per_cycle()),
                format!("{:.2}", tally.commands_per_read()),
                format!("{total:.0}"),
                format!("{min:.0}"),
                format!("{mean:.0}"),
                format!("{max:.0}"),
                format!("{:.2}", max / mean),
            ],
            json!({"scenario": "10b", "nodes": way.label, "masters": rates.len(),
                   "commands_per_cycle": tally.commands_per_cycle(), "commands_per_read": tally.commands_per_read(),
                   "commands_per_s": total,
                   "per_master_commands_per_s": rates}),
        );
    }
    for paragraph in reading(ways, &tallies) {
        report.note(&paragraph);
    }
}

/// What this machine can and cannot show, and what the figures predict for
/// hosts with a core per master, with this run's numbers: two paragraphs.
fn reading(ways: &[Way], tallies: &[Tally]) -> [String; 2] {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let servers = 5 + MASTERS.iter().sum::<usize>() * 5;
    let list = |cell: fn(&Tally) -> String| -> String {
        let cells: Vec<String> = tallies.iter().map(cell).collect();
        cells.join(", ")
    };
    let per_read = list(|t| format!("{:.2}", t.commands_per_read()));
    let per_cycle = list(|t| format!("{:.1}", t.commands_per_cycle()));
    let busiest: Vec<String> = ways
        .iter()
        .zip(tallies)
        .filter(|(way, _)| way.masters > 1)
        .map(|(way, tally)| {
            format!(
                "{:.1}% at {} masters (1/{})",
                tally.busiest_share(way.masters) * 100.0,
                way.masters,
                way.masters
            )
        })
        .collect();
    let widest = tallies.len() - 1;
    let standalone = &tallies[0];
    // A cycle's server CPU over its nodes: one vote each.
    let vote_us = |k: usize| {
        let (way, tally) = (&ways[k], &tallies[k]);
        let nodes = (tally.calls.len() / way.masters).max(1);
        tally.per_cycle_us(tally.server_cpu) / nodes as f64
    };
    let client_us = |t: &Tally| t.per_cycle_us(t.client_cpu);
    let machine = format!(
        "What this machine can and cannot show: the client and all {servers} servers of this scenario share {cores} cores, so a master added here brings no CPU with it, and cycles/s cannot grow with the masters as they would with a core per master. The cluster rows measure what the cluster client and more processes on the same cores cost, not what clusters can carry: a cycle over cluster nodes costs the client more CPU ({:.1} us over 1-master clusters against {:.1} us over standalone nodes: redis-rs's cluster client passes each request through a channel to a task of its own, and the answer back), and as the same cycles go over more connections, each read brings the servers fewer commands (commands per read, standalone then 1, 2, 3 masters: {per_read}), so each command costs them more CPU.",
        client_us(&tallies[1]),
        client_us(standalone),
    );
    let prediction = format!(
        "What carries over is how the work splits, and that is what predicts scaling on real hosts. The commands per cycle do not change with the masters ({per_cycle}), and the slots spread them evenly: the busiest master ran {} of its cluster's commands. A master's load is its node's total / masters: at a given lock rate each master of an m-master cluster runs 1/m of what a standalone node runs, so with a core per master a node's server side carries about m times the cycles. A vote cost {:.1} us of server CPU on a standalone node and {:.1} us on a 3-master cluster here: one master's core serves very roughly {:.0} to {:.0} votes a second, a node of m masters m times that, until the client or the network is the limit. The client spent {:.1} us of CPU a cycle over standalone nodes and {:.1} us over 3-master clusters: about {:.0} and {:.0} cycles a second per client core.",
        busiest.join(" and "),
        vote_us(0),
        vote_us(widest),
        1e6 / vote_us(widest),
        1e6 / vote_us(0),
        client_us(standalone),
        client_us(&tallies[widest]),
        1e6 / client_us(standalone),
        1e6 / client_us(&tallies[widest]),
    );
    [machine, prediction]
}

/// Section 10c.
async fn latency(env: &Env, ways: &[Way], report: &mut Report) {
    let n = env.rounds(3000, 500);
    let mut samples: Vec<Samples> = ways.iter().map(|_| Samples::default()).collect();
    for i in 0..n {
        for (k, way) in ways.iter().enumerate() {
            let key = format!("bench:cn-lat:{k}:{i}");
            let start = Instant::now();
            let Ok(lock) = way.redlock.try_lock(&key, TTL).await else {
                continue;
            };
            samples[k].push(start.elapsed());
            let _ = way.redlock.unlock(&lock).await;
        }
    }
    report.section(
        &format!(
            "10c. acquire latency of a cluster node: {n} uncontended try_lock each (the unlock untimed), interleaved (ms)"
        ),
        &[
            "nodes",
            "acquire p50",
            "acquire p99",
            "p50 / standalone",
            "p99 / standalone",
        ],
    );
    let base = &samples[0];
    for (way, s) in ways.iter().zip(&samples) {
        report.line(
            &[
                way.label.clone(),
                f(s.p50()),
                f(s.p99()),
                ratio(s.p50(), base.p50()),
                ratio(s.p99(), base.p99()),
            ],
            json!({"scenario": "10c", "nodes": way.label, "masters_per_node": way.masters,
                   "acquire_p50_ms": s.p50(), "acquire_p99_ms": s.p99(), "rounds": s.0.len()}),
        );
    }
}
