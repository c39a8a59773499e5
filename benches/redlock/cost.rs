//! What one lock+unlock cycle costs, measured over scenario 5's slices
//! (issue 23, item 1): the client's CPU from `getrusage(RUSAGE_SELF)`, each
//! node's CPU from `INFO cpu`, and each node's commands from `INFO
//! commandstats` (reset with `CONFIG RESETSTAT` before every slice), summed
//! over the five nodes and divided by the slice's cycles.
//!
//! Redis counts a command that a script runs (`redis.call`) in
//! `commandstats` as a call of its own, and its time inside the script's:
//! the `GET`, `DEL`, `HGETALL`, `PUBLISH` and `TIME` of a release script are
//! shares of the `EVALSHA` line, not additions to it. `commandstats` times
//! the execution of a command only; the node's CPU (`INFO cpu`) also counts
//! reading, parsing and answering it, which for commands this small is most
//! of the work.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use serde_json::json;

use crate::report::{Report, ratio};
use crate::subjects::Subject;

/// This process's user + system CPU time so far (`getrusage(RUSAGE_SELF)`,
/// microsecond resolution).
pub(crate) fn cpu_time() -> Duration {
    // SAFETY: `getrusage` only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    if rc != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// The commands whose columns the table shows, in its order; every other
/// command goes to "other".
const SHOWN: [&str; 8] = [
    "set", "evalsha", "eval", "publish", "hgetall", "time", "del", "get",
];

/// Commands that both subjects send only from inside their scripts in this
/// scenario: left out of the execution total, which their script's time
/// already holds. (If a subject sent one of them itself, its calls per cycle
/// would exceed its scripts'; the table shows both.)
const INSIDE_SCRIPTS: [&str; 8] = [
    "get", "del", "hgetall", "hdel", "hset", "publish", "time", "pexpire",
];

/// One connection per node for the statistics, apart from the subjects'.
pub(crate) struct Nodes {
    conns: Vec<MultiplexedConnection>,
}

impl Nodes {
    pub(crate) async fn connect(urls: &[String]) -> Self {
        let mut conns = Vec::new();
        for u in urls {
            let client = redis::Client::open(u.as_str()).unwrap();
            conns.push(client.get_multiplexed_async_connection().await.unwrap());
        }
        Nodes { conns }
    }

    /// `CONFIG RESETSTAT` on every node, and their CPU so far.
    pub(crate) async fn reset(&self) -> Duration {
        for c in &self.conns {
            let mut c = c.clone();
            let _: redis::RedisResult<()> = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut c)
                .await;
        }
        self.cpu().await
    }

    /// The nodes' user + system CPU time so far (`INFO cpu`), summed.
    pub(crate) async fn cpu(&self) -> Duration {
        let mut total = 0.0;
        for c in &self.conns {
            let info = info(c, "cpu").await;
            for field in ["used_cpu_user:", "used_cpu_sys:"] {
                total += info
                    .lines()
                    .find_map(|l| l.strip_prefix(field))
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .unwrap_or(0.0);
            }
        }
        Duration::from_secs_f64(total)
    }

    /// (calls, microseconds) of each command since the last reset, summed
    /// over the nodes; the statistics' own `INFO` and `CONFIG` left out.
    pub(crate) async fn commands(&self) -> BTreeMap<String, (u64, u64)> {
        let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for c in &self.conns {
            for (name, calls, usec) in command_stats(&info(c, "commandstats").await) {
                let e = out.entry(name.to_owned()).or_default();
                e.0 += calls;
                e.1 += usec;
            }
        }
        out
    }

    /// Each node's calls of every command since its last reset (or start),
    /// in the nodes' order; the statistics' own `INFO` and `CONFIG` left
    /// out. Scenario 10 takes differences, without a reset.
    pub(crate) async fn calls(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.conns.len());
        for c in &self.conns {
            let stats = info(c, "commandstats").await;
            out.push(command_stats(&stats).map(|(_, calls, _)| calls).sum());
        }
        out
    }

    /// Each node's socket reads so far (`INFO stats`,
    /// `total_reads_processed`), in the nodes' order: with
    /// [`Nodes::calls`], how many commands one read brought.
    pub(crate) async fn reads(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.conns.len());
        for c in &self.conns {
            let stats = info(c, "stats").await;
            out.push(
                stats
                    .lines()
                    .find_map(|l| l.strip_prefix("total_reads_processed:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0),
            );
        }
        out
    }
}

/// (name, calls, microseconds) of each `cmdstat_` line of `INFO
/// commandstats`, but `INFO` and `CONFIG`: the statistics' own.
fn command_stats(info: &str) -> impl Iterator<Item = (&str, u64, u64)> {
    info.lines().filter_map(|line| {
        let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
        if name == "info" || name.starts_with("config") {
            return None;
        }
        let field = |key: &str| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(key))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Some((name, field("calls="), field("usec=")))
    })
}

async fn info(c: &MultiplexedConnection, section: &str) -> String {
    let mut c = c.clone();
    redis::cmd("INFO")
        .arg(section)
        .query_async(&mut c)
        .await
        .unwrap_or_default()
}

/// What one subject's slices cost, summed.
#[derive(Default)]
pub(crate) struct Cost {
    pub(crate) cycles: u64,
    pub(crate) client_cpu: Duration,
    pub(crate) node_cpu: Duration,
    pub(crate) commands: BTreeMap<String, (u64, u64)>,
}

impl Cost {
    pub(crate) fn add_commands(&mut self, commands: BTreeMap<String, (u64, u64)>) {
        for (name, (calls, usec)) in commands {
            let e = self.commands.entry(name).or_default();
            e.0 += calls;
            e.1 += usec;
        }
    }

    fn per_cycle(&self, x: f64) -> f64 {
        x / self.cycles.max(1) as f64
    }

    fn client_us(&self) -> f64 {
        self.per_cycle(self.client_cpu.as_secs_f64() * 1e6)
    }

    fn node_us(&self) -> f64 {
        self.per_cycle(self.node_cpu.as_secs_f64() * 1e6)
    }

    /// (calls, µs) per cycle of one command, 0 when it was not called.
    fn command(&self, name: &str) -> (f64, f64) {
        let (calls, usec) = self.commands.get(name).copied().unwrap_or_default();
        (self.per_cycle(calls as f64), self.per_cycle(usec as f64))
    }

    /// (calls, µs) per cycle of the commands not shown in a column.
    fn other(&self) -> (f64, f64) {
        let (calls, usec) = self
            .commands
            .iter()
            .filter(|(n, _)| !SHOWN.contains(&n.as_str()))
            .fold((0, 0), |(c, u), (_, (c2, u2))| (c + c2, u + u2));
        (self.per_cycle(calls as f64), self.per_cycle(usec as f64))
    }

    /// Execution µs per cycle of the commands the client sent: every
    /// command but those run inside scripts, which their script's time holds.
    fn exec_us(&self) -> f64 {
        let usec: u64 = self
            .commands
            .iter()
            .filter(|(n, _)| !INSIDE_SCRIPTS.contains(&n.as_str()))
            .map(|(_, (_, u))| u)
            .sum();
        self.per_cycle(usec as f64)
    }
}

/// Section 5b: the per-cycle breakdown of scenario 5's slices.
pub(crate) fn emit(report: &mut Report, costs: &[Cost; 3]) {
    let mut header = vec![
        "subject",
        "client CPU us",
        "node CPU us (5 nodes)",
        "node exec us",
    ];
    let cols: Vec<String> = SHOWN
        .iter()
        .map(|c| c.to_uppercase())
        .chain(["other".to_owned()])
        .collect();
    header.extend(cols.iter().map(String::as_str));
    report.section(
        "5b. where a cycle goes: scenario 5's slices, per lock+unlock cycle; client CPU = getrusage(RUSAGE_SELF) user+sys; node CPU = INFO cpu, summed over the 5 nodes; per command: calls / us per cycle from INFO commandstats, summed over the 5 nodes (a script's us include the commands it runs; node exec us = the commands the client sent)",
        &header,
    );
    let floor = &costs[2];
    for (k, who) in Subject::ALL.into_iter().enumerate() {
        let c = &costs[k];
        let mut cells = vec![
            who.name().to_owned(),
            format!(
                "{:.1} ({})",
                c.client_us(),
                ratio(c.client_us(), floor.client_us())
            ),
            format!(
                "{:.1} ({})",
                c.node_us(),
                ratio(c.node_us(), floor.node_us())
            ),
            format!(
                "{:.1} ({})",
                c.exec_us(),
                ratio(c.exec_us(), floor.exec_us())
            ),
        ];
        let mut commands = serde_json::Map::new();
        for (name, (calls, us)) in SHOWN
            .iter()
            .map(|n| (*n, c.command(n)))
            .chain([("other", c.other())])
        {
            cells.push(if calls == 0.0 {
                "-".into()
            } else {
                format!("{calls:.2} / {us:.1}")
            });
            commands.insert(
                name.into(),
                json!({"calls_per_cycle": calls, "us_per_cycle": us}),
            );
        }
        let others: Vec<&str> = c
            .commands
            .keys()
            .map(String::as_str)
            .filter(|n| !SHOWN.contains(n))
            .collect();
        report.line(
            &cells,
            json!({"scenario": "5b", "subject": who.name(), "cycles": c.cycles,
                   "client_cpu_us_per_cycle": c.client_us(), "node_cpu_us_per_cycle": c.node_us(),
                   "node_exec_us_per_cycle": c.exec_us(), "commands": commands, "other_commands": others}),
        );
    }
}
