//! Scenario 6e: what waiting costs the client's memory. 10,000 callers of
//! `lock_within` on 1,000 held keys in one manager (the five nodes), in the
//! optimised build: the resident set and the live heap per waiter, and
//! where the heap goes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_quorum::Redlock;
use serde_json::json;

use crate::TTL;
use crate::heap::{live_bytes, peak_bytes, reset_peak, stop_peak};
use crate::report::Report;
use crate::scenarios::Env;
use crate::subjects::token;

const KEYS: usize = 1_000;
const WAITERS: usize = 10_000;

/// `VmRSS` or `VmHWM` of this process, in bytes.
fn status_bytes(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
        * 1024.0
}

fn rss() -> f64 {
    status_bytes("VmRSS:")
}

/// Starts a new resident-set peak (`VmHWM`) from the resident set now.
fn reset_rss_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// How many of the run's release channels every node has subscribers on
/// (the least of the five).
async fn subscribed(urls: &[String], pattern: &str) -> usize {
    let mut least = usize::MAX;
    for url in urls {
        let n = async {
            let client = redis::Client::open(url.as_str()).ok()?;
            let mut conn = client.get_multiplexed_async_connection().await.ok()?;
            let channels: Vec<Vec<u8>> = redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .arg(pattern)
                .query_async(&mut conn)
                .await
                .ok()?;
            Some(channels.len())
        };
        least = least.min(n.await.unwrap_or(0));
    }
    least
}

/// Waits until every node has `channels` of the run's channels, the
/// manager's attempt count reached `attempts` (each waiter's first attempt
/// and its attempt after subscribing) and stood still for half a second:
/// every waiter sleeps.
async fn settle(
    urls: &[String],
    pattern: &str,
    manager: &Redlock,
    channels: usize,
    attempts: u64,
) -> Duration {
    let started = Instant::now();
    let mut last = u64::MAX;
    while started.elapsed() < Duration::from_secs(300) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = manager.stats().attempts;
        if now == last && now >= attempts && subscribed(urls, pattern).await >= channels {
            break;
        }
        last = now;
    }
    started.elapsed()
}

/// One stage's figures: the resident set and live heap now, and their peaks
/// since the stage began.
struct Figures {
    rss: f64,
    rss_peak: f64,
    heap: f64,
    heap_peak: f64,
}

impl Figures {
    fn now() -> Figures {
        Figures {
            rss: rss(),
            rss_peak: status_bytes("VmHWM:"),
            heap: live_bytes(),
            heap_peak: peak_bytes(),
        }
    }
}

fn kib(bytes: f64) -> String {
    format!("{:.0} KiB", bytes / 1024.0)
}

fn per(bytes: f64, n: usize) -> String {
    format!("{:.0} B", bytes / n as f64)
}

pub(crate) async fn scenario_waiter_memory(env: &Env, report: &mut Report) {
    let urls: Vec<&str> = env.urls.iter().map(String::as_str).collect();
    let holder = Redlock::builder(urls.clone())
        .node_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    // The timed retry is 30 s: every waiter sleeps on notifications.
    let waiter = Redlock::builder(urls.clone())
        .node_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
        .retry_delay(Duration::from_secs(30))
        .retry_jitter(Duration::ZERO)
        .build()
        .unwrap();
    redlock_harness::warm(&waiter).await;
    let run = token();
    let names: Arc<Vec<String>> = Arc::new(
        (0..KEYS)
            .map(|k| format!("bench:waitmem:{run}:{k}"))
            .collect(),
    );
    let pattern = format!("*bench:waitmem:{run}:*released");
    let mut held = Vec::with_capacity(KEYS);
    for name in names.iter() {
        held.push(holder.try_lock(name, TTL * 30).await.unwrap());
    }
    let future = std::mem::size_of_val(&waiter.lock_within(
        names[0].as_str(),
        Duration::from_secs(30),
        Duration::from_secs(600),
    ));
    let spawn = |w: usize, gate: Arc<tokio::sync::Semaphore>| {
        let (waiter, names) = (waiter.clone(), names.clone());
        tokio::spawn(async move {
            let _open = gate.acquire().await;
            let name = names[w % KEYS].as_str();
            waiter
                .lock_within(name, Duration::from_secs(30), Duration::from_secs(600))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The figure: 10,000 waiters started at once.
    let base = Figures::now();
    reset_peak();
    reset_rss_peak();
    let attempts0 = waiter.stats().attempts;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut tasks: Vec<_> = (0..WAITERS).map(|w| spawn(w, gate.clone())).collect();
    // The tasks exist and wait at the gate: their cells (the future) only.
    let spawned = Figures::now();
    gate.add_permits(WAITERS);
    let expect = attempts0 + 2 * WAITERS as u64;
    let took = settle(&env.urls, &pattern, &waiter, KEYS, expect).await;
    let waiting = Figures::now();
    let attempts = waiter.stats().attempts - attempts0;

    // Where the heap goes: the same again, one waiter per key first (the
    // keys' state, and the first waiter of each), then the other 9,000.
    for t in &tasks {
        t.abort();
    }
    for t in tasks.drain(..) {
        let _ = t.await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let left = Figures::now();
    stop_peak();
    let gate = Arc::new(tokio::sync::Semaphore::new(WAITERS));
    let before_keys = live_bytes();
    tasks.extend((0..KEYS).map(|w| spawn(w, gate.clone())));
    let expect = waiter.stats().attempts + 2 * KEYS as u64;
    settle(&env.urls, &pattern, &waiter, KEYS, expect).await;
    let one_per_key = live_bytes() - before_keys;
    let before_rest = live_bytes();
    tasks.extend((KEYS..WAITERS).map(|w| spawn(w, gate.clone())));
    let expect = waiter.stats().attempts + 2 * (WAITERS - KEYS) as u64;
    settle(&env.urls, &pattern, &waiter, KEYS, expect).await;
    let rest = live_bytes() - before_rest;
    for t in &tasks {
        t.abort();
    }
    for t in tasks.drain(..) {
        let _ = t.await;
    }
    for lock in &held {
        let _ = holder.unlock(lock).await;
    }

    let task_cell = (spawned.heap - base.heap) / WAITERS as f64;
    let per_more = rest / (WAITERS - KEYS) as f64;
    let per_key = one_per_key / KEYS as f64 - per_more;
    let rss_growth = waiting.rss - base.rss;
    println!(
        "6e: {WAITERS} waiters on {KEYS} keys settled in {took:?} ({attempts} attempts); lock_within future {future} B; \
         RSS +{} ({} per waiter), peak +{}; heap live +{} ({} per waiter), peak +{}; \
         task cells {task_cell:.0} B each; per extra waiter {per_more:.0} B, per key {per_key:.0} B beyond; \
         after all left: RSS +{}, heap +{}",
        kib(rss_growth),
        per(rss_growth, WAITERS),
        kib(waiting.rss_peak - base.rss),
        kib(waiting.heap - base.heap),
        per(waiting.heap - base.heap, WAITERS),
        kib(waiting.heap_peak - base.heap),
        kib(left.rss - base.rss),
        kib(left.heap - base.heap),
    );
    report.section(
        &format!("6e. waiting memory: {WAITERS} waiters (lock_within) on {KEYS} held keys, one manager, started at once"),
        &["measure", "total", "per waiter"],
    );
    let rows = [
        ("client RSS growth, all waiting", rss_growth, WAITERS),
        (
            "client RSS peak growth (start-up burst)",
            waiting.rss_peak - base.rss,
            WAITERS,
        ),
        ("live heap, all waiting", waiting.heap - base.heap, WAITERS),
        (
            "live heap peak (start-up burst)",
            waiting.heap_peak - base.heap,
            WAITERS,
        ),
        (
            "tokio tasks with their futures (heap at spawn)",
            spawned.heap - base.heap,
            WAITERS,
        ),
        (
            "live heap per waiter beyond a key's first",
            rest,
            WAITERS - KEYS,
        ),
        (
            "live heap per key (its first waiter's extra)",
            per_key * KEYS as f64,
            KEYS,
        ),
        (
            "RSS kept after every waiter left",
            left.rss - base.rss,
            WAITERS,
        ),
        (
            "live heap kept after every waiter left",
            left.heap - base.heap,
            WAITERS,
        ),
    ];
    for (what, total, n) in rows {
        report.line(
            &[what.into(), kib(total), per(total, n)],
            json!({"scenario": "6e", "measure": what, "bytes": total, "per": n, "bytes_each": total / n as f64}),
        );
    }
    report.line(
        &[
            "size_of the lock_within future".into(),
            "".into(),
            format!("{future} B"),
        ],
        json!({"scenario": "6e", "measure": "future_size", "bytes_each": future}),
    );
    report.note(&format!(
        "Optimised build, one runtime of the bench, the five nodes. RSS is the process's resident set (VmRSS; its peak VmHWM, reset before the start); heap is the live bytes the bench's counting allocator sees. The waiters wait at a gate when spawned (their task cells measured there), then all start at once; figures are taken once every node has the {KEYS} release channels and the attempt count stood still. The per-key and per-waiter split comes from a second run in the same process: one waiter per key, then the other {} waiters.",
        WAITERS - KEYS
    ));
}
