//! Scenario 10d: clusters as nodes when each master has a CPU budget of its
//! own. On this machine the client and every server share two cores, so
//! scenario 10 cannot show what a master on its own core adds. Here every
//! server of every subject (the five standalone nodes, and each master of
//! each cluster) is capped at the same small share of one core, through a
//! cgroup of its own (the cgroup v1 `cpu` controller, `cpu.cfs_quota_us`
//! of 1 ms over a 33 ms period): the servers, not the client, are the limit, as on
//! hosts where each master's core is busy, and a master added brings its
//! budget with it. The slices run as in scenario 10 (64 tasks, distinct
//! resources, the subjects taking turns), with a 1 s node timeout (a
//! capped server queues the requests it cannot serve yet). Skipped, with a
//! note, where the cgroups cannot be written (not root, no v1 `cpu`
//! hierarchy).

use std::path::PathBuf;
use std::time::Duration;

use redlock_quorum::Redlock;
use serde_json::json;

use crate::report::{Report, ratio};
use crate::scenarios::{THROUGHPUT_TASKS, run_slice};

/// The cgroup v1 `cpu` hierarchy.
const CPU_CGROUPS: &str = "/sys/fs/cgroup/cpu";
/// Each server's share of one core.
pub(crate) const SHARE: f64 = 0.03;
/// The quota's period: as short as the kernel's smallest quota (1 ms)
/// allows at [`SHARE`], so that a capped server is never stopped for long
/// (the default 100 ms period would hold requests for up to 97 ms at a
/// time; this one for up to about 32 ms).
const PERIOD_US: u64 = (1_000.0 / SHARE) as u64;

/// Servers moved into cgroups of their own, each capped at [`SHARE`];
/// dropping it moves them back and removes the cgroups.
pub(crate) struct Budget {
    groups: Vec<PathBuf>,
    pids: Vec<u32>,
}

impl Budget {
    /// Caps the server behind each of `urls` (their `process_id`, from
    /// `INFO server`); `Err` with the reason where it cannot.
    pub(crate) async fn cap(urls: &[String]) -> Result<Budget, String> {
        let root = PathBuf::from(CPU_CGROUPS);
        if !root.join("cpu.cfs_quota_us").exists() {
            return Err(format!("no cgroup v1 cpu hierarchy at {CPU_CGROUPS}"));
        }
        let mut budget = Budget {
            groups: Vec::new(),
            pids: Vec::new(),
        };
        for (i, url) in urls.iter().enumerate() {
            let pid = pid_of(url).await?;
            let group = root.join(format!("redlock-bench-{}-{i}", std::process::id()));
            std::fs::create_dir_all(&group).map_err(|e| format!("{}: {e}", group.display()))?;
            budget.groups.push(group.clone());
            let quota = ((PERIOD_US as f64 * SHARE) as u64).max(1_000);
            let write = |file: &str, value: String| {
                std::fs::write(group.join(file), value)
                    .map_err(|e| format!("{}/{file}: {e}", group.display()))
            };
            write("cpu.cfs_period_us", PERIOD_US.to_string())?;
            write("cpu.cfs_quota_us", quota.to_string())?;
            write("cgroup.procs", pid.to_string())?;
            budget.pids.push(pid);
        }
        Ok(budget)
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        let root = PathBuf::from(CPU_CGROUPS);
        for pid in &self.pids {
            let _ = std::fs::write(root.join("cgroup.procs"), pid.to_string());
        }
        for group in &self.groups {
            let _ = std::fs::remove_dir(group);
        }
    }
}

/// The `process_id` a server gives in `INFO server`.
async fn pid_of(url: &str) -> Result<u32, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
        .ok_or_else(|| format!("{url}: no process_id"))
}

/// One subject of 10d: its label, masters per node, node URLs and the URL
/// of each of its servers.
pub(crate) struct Subject<'a> {
    pub(crate) label: &'a str,
    pub(crate) masters: usize,
    pub(crate) urls: &'a [String],
    pub(crate) servers: &'a [String],
}

/// Section 10d.
pub(crate) async fn scenario(subjects: &[Subject<'_>], quick: bool, report: &mut Report) {
    let servers: Vec<String> = subjects
        .iter()
        .flat_map(|s| s.servers.iter().cloned())
        .collect();
    let budget = match Budget::cap(&servers).await {
        Ok(budget) => budget,
        Err(why) => {
            report.note(&format!(
                "10d (masters with a CPU budget each) skipped: the servers could not be capped ({why})."
            ));
            return;
        }
    };
    let managers: Vec<Redlock> = subjects
        .iter()
        .map(|s| {
            Redlock::builder(s.urls.iter().map(String::as_str))
                .retry_count(0)
                .node_timeout(Duration::from_secs(1))
                .build()
                .unwrap()
        })
        .collect();
    let slice = Duration::from_millis(500);
    // Warm each (connections, slot maps) under the caps, untimed.
    for (k, redlock) in managers.iter().enumerate() {
        let redlock = redlock.clone();
        run_slice(THROUGHPUT_TASKS, slice, move |t, i| {
            let redlock = redlock.clone();
            async move { cycle(&redlock, &format!("bench:cb-warm:{k}:{t}:{i}")).await }
        })
        .await;
    }
    let slices = if quick { 3 } else { 10 };
    let mut totals = vec![(0u64, Duration::ZERO); subjects.len()];
    for round in 0..slices {
        for step in 0..subjects.len() {
            let k = (round + step) % subjects.len();
            let redlock = managers[k].clone();
            let (cycles, took) = run_slice(THROUGHPUT_TASKS, slice, move |t, i| {
                let redlock = redlock.clone();
                async move { cycle(&redlock, &format!("bench:cb:{k}:{round}:{t}:{i}")).await }
            })
            .await;
            totals[k].0 += cycles;
            totals[k].1 += took;
        }
    }
    drop(budget);
    report.section(
        &format!(
            "10d. masters with a CPU budget: every server of every subject capped at {:.0}% of one core (its own cgroup, cpu.cfs_quota_us of 1 ms over a {} ms period), so that the servers are the limit and a master brings its budget; {THROUGHPUT_TASKS} tasks, distinct resources, {slices} x {} ms slices each, interleaved, 1 s node timeout",
            SHARE * 100.0,
            PERIOD_US / 1000,
            slice.as_millis()
        ),
        &["nodes", "servers", "cycles/s", "/ standalone", "/ ideal (masters x standalone)"],
    );
    let rate = |(cycles, took): (u64, Duration)| cycles as f64 / took.as_secs_f64().max(1e-9);
    let base = rate(totals[0]);
    let clusters: Vec<String> = subjects
        .iter()
        .zip(&totals)
        .filter(|(s, _)| s.urls.iter().any(|u| u.contains("+cluster://")))
        .map(|(s, &t)| {
            let plural = if s.masters == 1 { "" } else { "s" };
            format!("{} master{plural} {:.0}", s.masters, rate(t))
        })
        .collect();
    for (s, &total) in subjects.iter().zip(&totals) {
        let r = rate(total);
        report.line(
            &[
                s.label.to_string(),
                s.servers.len().to_string(),
                format!("{r:.0}"),
                ratio(r, base),
                ratio(r, base * s.masters as f64),
            ],
            json!({"scenario": "10d", "nodes": s.label, "masters_per_node": s.masters,
                   "servers": s.servers.len(), "share_of_a_core": SHARE,
                   "cycles_per_s": r, "cycles": total.0, "tasks": THROUGHPUT_TASKS}),
        );
    }
    report.note(&format!(
        "With each master's CPU fixed, cycles/s grow with the masters per cluster ({}): a master added brings its budget, and its slots' share of the votes. The growth is less than m times because a capped master that serves fewer commands a second also gets fewer of them per read (10b), so each command costs it more; a standalone node still beats a 1-master cluster at the same budget (the cluster client's extra hop, scenario 10).",
        clusters.join(", ")
    ));
}

/// One cycle, as scenario 10's.
async fn cycle(redlock: &Redlock, resource: &str) -> bool {
    match redlock.try_lock(resource, crate::TTL).await {
        Ok(lock) => {
            let _ = redlock.unlock(&lock).await;
            true
        }
        Err(_) => false,
    }
}
