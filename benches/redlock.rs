//! Side-by-side benchmark: our `Redlock`, `rslock` 0.10, and the floor (raw
//! `SET NX PX` to the five nodes in parallel with plain redis-rs, timed to the
//! quorum-th OK), in one process, on the same five nodes.
//!
//! ```sh
//! cargo bench --bench redlock              # full run, a few minutes
//! cargo bench --bench redlock -- --quick   # under 30 seconds
//! ```
//!
//! Writes a table to stdout, and `target/bench/redlock.{json,md}` plus the
//! latency chart `target/bench/redlock-latency.svg`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use redis::aio::MultiplexedConnection;
use redlock_harness::RedisServer;
use redlock_harness::proxy::{Fault, Proxy};
use redlock_quorum::Redlock;
use serde_json::json;

/// The five per-node latencies of scenario 2; the quorum bound is the third.
const LATENCIES_MS: [f64; 5] = [0.5, 1.0, 2.0, 5.0, 40.0];
const TTL: Duration = Duration::from_secs(10);

/// Counts live heap bytes, for the memory cost of a guard (exact, unlike the
/// resident set, which the allocator's reuse of freed memory blurs).
struct Counting;

static LIVE_BYTES: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; only a
// counter is updated beside it.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live_bytes() -> f64 {
    LIVE_BYTES.load(Ordering::Relaxed) as f64
}

// ---------------------------------------------------------------- samples

#[derive(Debug, Clone, Default)]
struct Samples(Vec<Duration>);

impl Samples {
    fn push(&mut self, d: Duration) {
        self.0.push(d);
    }
    fn pct(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let mut v = self.0.clone();
        v.sort();
        let i = ((v.len() as f64 - 1.0) * p).round() as usize;
        ms(v[i])
    }
    fn p50(&self) -> f64 {
        self.pct(0.5)
    }
    fn p99(&self) -> f64 {
        self.pct(0.99)
    }
    fn cdf(&self) -> Vec<(f64, f64)> {
        let mut v: Vec<f64> = self.0.iter().map(|d| ms(*d)).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len() as f64;
        v.iter()
            .enumerate()
            .map(|(i, x)| (*x, (i + 1) as f64 / n))
            .collect()
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

// ---------------------------------------------------------------- subjects

/// The three subjects, built over one list of node URLs.
struct Subjects {
    ours: Redlock,
    rslock: rslock::LockManager,
    floor: Floor,
}

impl Subjects {
    async fn new(urls: &[String]) -> Self {
        let ours = Redlock::builder(urls.iter().map(String::as_str))
            .retry_count(0)
            .build()
            .unwrap();
        let rslock = rslock::LockManager::new(urls.to_vec());
        let floor = Floor::connect(urls).await;
        let s = Subjects {
            ours,
            rslock,
            floor,
        };
        // warm every connection
        for _ in 0..3 {
            let r = format!("warm:{}", token());
            let _ = s.acquire_release(Subject::Ours, &r, TTL).await;
            let _ = s.acquire_release(Subject::Rslock, &r, TTL).await;
            let _ = s.acquire_release(Subject::Floor, &r, TTL).await;
        }
        s
    }

    /// One acquisition and release; (acquire time, release time, validity
    /// left at acquisition). `None` when the acquisition failed.
    async fn acquire_release(
        &self,
        who: Subject,
        resource: &str,
        ttl: Duration,
    ) -> Option<(Duration, Duration, Duration)> {
        self.cycle(who, resource, ttl, true).await
    }

    /// As `acquire_release`; with `release` false the lock is left to expire
    /// (the fault scenarios time acquisition only, on fresh resources).
    async fn cycle(
        &self,
        who: Subject,
        resource: &str,
        ttl: Duration,
        release: bool,
    ) -> Option<(Duration, Duration, Duration)> {
        match who {
            Subject::Ours => {
                let t = Instant::now();
                let lock = self.ours.try_lock(resource, ttl).await.ok()?;
                let acquire = t.elapsed();
                let validity = lock.validity();
                let t = Instant::now();
                if release {
                    let _ = self.ours.unlock(&lock).await;
                }
                Some((acquire, t.elapsed(), validity))
            }
            Subject::Rslock => {
                let t = Instant::now();
                let lock = self.rslock.lock(resource, ttl).await.ok()?;
                let acquire = t.elapsed();
                let validity = Duration::from_millis(lock.validity_time as u64);
                let t = Instant::now();
                if release {
                    self.rslock.unlock(&lock).await;
                }
                Some((acquire, t.elapsed(), validity))
            }
            Subject::Floor => {
                let (acquire, token) = self.floor.acquire(resource, ttl).await?;
                let drift = ttl.mul_f64(0.01) + Duration::from_millis(2);
                let validity = ttl.saturating_sub(acquire + drift);
                let t = Instant::now();
                if release {
                    self.floor.release(resource, &token).await;
                }
                Some((acquire, t.elapsed(), validity))
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subject {
    Ours,
    Rslock,
    Floor,
}

impl Subject {
    const ALL: [Subject; 3] = [Subject::Ours, Subject::Rslock, Subject::Floor];
    fn name(self) -> &'static str {
        match self {
            Subject::Ours => "redlock-quorum",
            Subject::Rslock => "rslock 0.10",
            Subject::Floor => "floor",
        }
    }
}

/// The floor: plain redis-rs, one multiplexed connection per node, `SET NX
/// PX` to all nodes at once, timed to the quorum-th OK; the release is the
/// same token-checked script, sent to all nodes. Each request bounded by
/// 50 ms, as ours are by default.
struct Floor {
    conns: Vec<MultiplexedConnection>,
}

const FLOOR_TIMEOUT: Duration = Duration::from_millis(50);

impl Floor {
    async fn connect(urls: &[String]) -> Self {
        let mut conns = Vec::new();
        for u in urls {
            let client = redis::Client::open(u.as_str()).unwrap();
            conns.push(client.get_multiplexed_async_connection().await.unwrap());
        }
        Floor { conns }
    }

    async fn acquire(&self, key: &str, ttl: Duration) -> Option<(Duration, String)> {
        let token = token();
        let quorum = self.conns.len() / 2 + 1;
        let start = Instant::now();
        let mut pending: FuturesUnordered<_> = self
            .conns
            .iter()
            .map(|c| {
                let mut c = c.clone();
                let cmd = redis::cmd("SET")
                    .arg(key)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl.as_millis() as u64)
                    .clone();
                async move {
                    tokio::time::timeout(FLOOR_TIMEOUT, cmd.query_async::<Option<String>>(&mut c))
                        .await
                }
            })
            .collect();
        let mut ok = 0;
        let mut at = None;
        while let Some(r) = pending.next().await {
            if matches!(r, Ok(Ok(Some(_)))) {
                ok += 1;
                if ok == quorum {
                    at = Some(start.elapsed());
                    break;
                }
            }
        }
        // the rest finish untimed, in the background (bounded by the timeout)
        tokio::spawn(async move { while pending.next().await.is_some() {} });
        at.map(|t| (t, token))
    }

    async fn release(&self, key: &str, token: &str) {
        let script = redis::Script::new(
            r#"if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end"#,
        );
        let script = &script;
        let all: FuturesUnordered<_> = self
            .conns
            .iter()
            .map(|c| {
                let mut c = c.clone();
                async move {
                    let mut call = script.key(key);
                    call.arg(token);
                    let _ =
                        tokio::time::timeout(FLOOR_TIMEOUT, call.invoke_async::<i64>(&mut c)).await;
                }
            })
            .collect();
        all.collect::<Vec<()>>().await;
    }
}

fn token() -> String {
    use rand::RngExt;
    format!("{:032x}", rand::rng().random::<u128>())
}

// ---------------------------------------------------------------- report

#[derive(Default)]
struct Report {
    rows: Vec<serde_json::Value>,
    text: String,
    md: String,
    /// (label, CDF points) for the chart
    curves: Vec<(String, Vec<(f64, f64)>)>,
}

impl Report {
    fn section(&mut self, title: &str, header: &[&str]) {
        let _ = writeln!(self.text, "\n{title}");
        let _ = writeln!(self.text, "  {}", header.join(" | "));
        let _ = writeln!(self.md, "\n### {title}\n");
        let _ = writeln!(self.md, "| {} |", header.join(" | "));
        let _ = writeln!(self.md, "|{}", "---|".repeat(header.len()));
        print!("\n{title}\n  {}\n", header.join(" | "));
    }

    fn line(&mut self, cells: &[String], row: serde_json::Value) {
        let line = cells.join(" | ");
        println!("  {line}");
        let _ = writeln!(self.text, "  {line}");
        let _ = writeln!(self.md, "| {line} |");
        self.rows.push(row);
    }

    fn note(&mut self, text: &str) {
        println!("  {text}");
        let _ = writeln!(self.text, "  {text}");
        let _ = writeln!(self.md, "\n{text}");
    }
}

fn f(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

fn ratio(a: f64, b: f64) -> String {
    if a.is_nan() || b.is_nan() || b == 0.0 {
        "-".into()
    } else {
        format!("{:.2}x", a / b)
    }
}

// ---------------------------------------------------------------- scenarios

struct Env {
    quick: bool,
    urls: Vec<String>,
    servers: Vec<RedisServer>,
    proxies: Vec<Proxy>,
}

impl Env {
    fn rounds(&self, full: usize, quick: usize) -> usize {
        if self.quick { quick } else { full }
    }
    fn proxy_urls(&self) -> Vec<String> {
        self.proxies.iter().map(Proxy::url).collect()
    }
}

/// Measures `rounds` acquire+release cycles of each subject, interleaved so
/// that drift in the machine's load hits all three alike.
async fn latency_rounds(
    s: &Subjects,
    rounds_per: [usize; 3],
    ttl: Duration,
    release: bool,
) -> [(Samples, Samples, Samples); 3] {
    let mut out: [(Samples, Samples, Samples); 3] = Default::default();
    let max = *rounds_per.iter().max().unwrap();
    for i in 0..max {
        for (k, who) in Subject::ALL.into_iter().enumerate() {
            if i >= rounds_per[k] {
                continue;
            }
            let res = format!("bench:lat:{}", token());
            if let Some((a, r, v)) = s.cycle(who, &res, ttl, release).await {
                out[k].0.push(a);
                out[k].1.push(r);
                out[k].2.push(v);
            }
        }
    }
    out
}

async fn scenario_healthy(env: &Env, s: &Subjects, report: &mut Report) -> f64 {
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

async fn scenario_latency(env: &Env, report: &mut Report) {
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

async fn scenario_two_down(env: &mut Env, report: &mut Report) {
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
    // blackholed through the proxies
    let s = Subjects::new(&env.proxy_urls()).await;
    env.proxies[3].set(Fault::Blackhole);
    env.proxies[4].set(Fault::Blackhole);
    let res = latency_rounds(&s, [n, rs, n], TTL, false).await;
    emit_fault_rows(report, "blackholed", &res);
    env.proxies[3].set(Fault::NONE);
    env.proxies[4].set(Fault::NONE);
    drop(s);

    // paused with SIGSTOP (only on nodes this bench started)
    if env.servers.len() == 5 {
        let s = Subjects::new(&env.urls).await;
        env.servers[3].pause();
        env.servers[4].pause();
        let res = latency_rounds(&s, [n, rs, n], TTL, false).await;
        env.servers[3].resume();
        env.servers[4].resume();
        emit_fault_rows(report, "paused (SIGSTOP)", &res);
    }
}

fn emit_fault_rows(report: &mut Report, fault: &str, res: &[(Samples, Samples, Samples); 3]) {
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

async fn scenario_validity(env: &Env, healthy: &Subjects, report: &mut Report) {
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

async fn scenario_throughput(env: &Env, s: &Arc<Subjects>, report: &mut Report) {
    const TASKS: usize = 64;
    // Short slices, the subjects taking turns in a rotating order, so that
    // drift in the machine's load hits all three alike.
    let slices = if env.quick { 3 } else { 15 };
    let slice = Duration::from_millis(300);
    report.section(
        &format!(
            "5. throughput: {TASKS} tasks locking and unlocking distinct resources, {slices} x {} ms slices per subject, interleaved",
            slice.as_millis()
        ),
        &["subject", "cycles/s", "/ floor", "/ rslock"],
    );
    let mut cycles = [0u64; 3];
    let mut elapsed = [Duration::ZERO; 3];
    for round in 0..slices {
        for step in 0..3 {
            let k = (round + step) % 3;
            let who = Subject::ALL[k];
            let count = Arc::new(AtomicU64::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let start = Instant::now();
            let tasks: Vec<_> = (0..TASKS)
                .map(|t| {
                    let (count, stop, s) = (count.clone(), stop.clone(), s.clone());
                    tokio::spawn(async move {
                        let mut i = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            let res = format!("bench:tp:{round}:{t}:{i}");
                            i += 1;
                            if s.acquire_release(who, &res, TTL).await.is_some() {
                                count.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })
                })
                .collect();
            tokio::time::sleep(slice).await;
            stop.store(true, Ordering::Relaxed);
            for t in tasks {
                let _ = t.await;
            }
            cycles[k] += count.load(Ordering::Relaxed);
            elapsed[k] += start.elapsed();
        }
    }
    let rates: Vec<f64> = (0..3)
        .map(|k| cycles[k] as f64 / elapsed[k].as_secs_f64())
        .collect();
    for (k, who) in Subject::ALL.into_iter().enumerate() {
        report.line(
            &[
                who.name().into(),
                format!("{:.0}", rates[k]),
                ratio(rates[k], rates[2]),
                ratio(rates[k], rates[1]),
            ],
            json!({"scenario": 5, "subject": who.name(), "cycles_per_s": rates[k], "tasks": TASKS}),
        );
    }
}

async fn scenario_handoff(env: &Env, report: &mut Report) {
    let handoffs = env.rounds(60, 8);
    report.section(
        &format!("6. contention hand-off: one holder's release -> another holder's grant, one resource ({handoffs} grants, hold 1 ms, think 2 ms)"),
        &["subject", "tasks", "hand-offs", "median ms", "p99 ms"],
    );
    let urls: Vec<&str> = env.urls.iter().map(String::as_str).collect();
    for tasks in [2usize, 8, 32] {
        for (label, retry) in [
            ("redlock-quorum (defaults: 200 ms + 0-100 ms)", None),
            (
                "redlock-quorum (retry 5 ms + 0-5 ms)",
                Some(Duration::from_millis(5)),
            ),
            ("rslock 0.10 (defaults: 0-200 ms)", Some(Duration::ZERO)),
        ] {
            let events = Arc::new(std::sync::Mutex::new(
                Vec::<(usize, Instant, Instant)>::new(),
            ));
            let done = Arc::new(AtomicBool::new(false));
            let resource = format!("bench:handoff:{}", token());
            let mut all = FuturesUnordered::new();
            for task in 0..tasks {
                let (events, done, resource) = (events.clone(), done.clone(), resource.clone());
                let ours = match retry {
                    Some(d) if d.is_zero() => None,
                    Some(d) => Some(
                        Redlock::builder(urls.clone())
                            .retry_delay(d)
                            .retry_jitter(d)
                            .build()
                            .unwrap(),
                    ),
                    None => Some(Redlock::new(urls.clone()).unwrap()),
                };
                let theirs = rslock::LockManager::new(urls.clone());
                all.push(async move {
                    while !done.load(Ordering::Relaxed) {
                        let granted;
                        let released;
                        if let Some(r) = &ours {
                            let Ok(lock) = r.lock(&resource, TTL).await else {
                                continue;
                            };
                            granted = Instant::now();
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            released = Instant::now();
                            let _ = r.unlock(&lock).await;
                        } else {
                            let Ok(lock) = theirs.lock(resource.as_str(), TTL).await else {
                                continue;
                            };
                            granted = Instant::now();
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            released = Instant::now();
                            theirs.unlock(&lock).await;
                        }
                        {
                            let mut ev = events.lock().unwrap();
                            ev.push((task, granted, released));
                            if ev.len() > handoffs {
                                done.store(true, Ordering::Relaxed);
                            }
                        }
                        // think time, so that the releaser does not simply
                        // take the lock again before anyone else can
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                });
            }
            let limit = Duration::from_millis(if env.quick { 1200 } else { 30_000 });
            let _ =
                tokio::time::timeout(limit, async { while all.next().await.is_some() {} }).await;
            done.store(true, Ordering::Relaxed);
            drop(all);
            let mut ev = events.lock().unwrap().clone();
            ev.sort_by_key(|e| e.1);
            let mut gaps = Samples::default();
            for w in ev.windows(2) {
                if w[0].0 != w[1].0 {
                    gaps.push(w[1].1.saturating_duration_since(w[0].2));
                }
            }
            report.line(
                &[label.into(), tasks.to_string(), gaps.0.len().to_string(), f(gaps.p50()), f(gaps.p99())],
                json!({"scenario": 6, "subject": label, "tasks": tasks, "handoff_p50_ms": gaps.p50(), "handoff_p99_ms": gaps.p99(), "handoffs": gaps.0.len()}),
            );
        }
    }
}

fn cpu_seconds() -> f64 {
    // utime + stime of this process, in clock ticks (USER_HZ = 100 on Linux)
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields.get(11).and_then(|x| x.parse().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|x| x.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

async fn scenario_guards(env: &Env, report: &mut Report) {
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

// ---------------------------------------------------------------- chart

fn chart(report: &Report, path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let groups = ["healthy", "latency", "blackholed", "paused (SIGSTOP)"];
    let root = SVGBackend::new(path, (1200, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((2, 2));
    for (area, group) in areas.iter().zip(groups) {
        let curves: Vec<_> = report
            .curves
            .iter()
            .filter(|(l, _)| l.starts_with(&format!("{group}:")))
            .collect();
        if curves.is_empty() {
            continue;
        }
        let max_x = curves
            .iter()
            .flat_map(|(_, c)| c.iter().map(|p| p.0))
            .fold(0.01f64, f64::max);
        let min_x = curves
            .iter()
            .flat_map(|(_, c)| c.iter().map(|p| p.0))
            .fold(f64::INFINITY, f64::min)
            .max(0.01);
        let mut ctx = ChartBuilder::on(area)
            .caption(format!("acquire latency CDF: {group}"), ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(45)
            .build_cartesian_2d((min_x * 0.9..max_x * 1.1).log_scale(), 0f64..1f64)?;
        ctx.configure_mesh()
            .x_labels(8)
            .x_label_formatter(&|x| {
                let t = format!("{x:.2}");
                t.trim_end_matches('0').trim_end_matches('.').to_owned()
            })
            .light_line_style(WHITE)
            .x_desc("ms (log)")
            .y_desc("fraction")
            .draw()?;
        for (i, (label, points)) in curves.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            ctx.draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(label.split(": ").nth(1).unwrap_or(label).to_string())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
        ctx.configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

// ---------------------------------------------------------------- main

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
    let quick = std::env::args().any(|a| a == "--quick");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(quick));
}

async fn run(quick: bool) {
    let started = Instant::now();
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
    scenario_healthy(&env, &healthy, &mut report).await;
    let mut times = vec![t.elapsed()];
    let t = Instant::now();
    scenario_latency(&env, &mut report).await;
    times.push(t.elapsed());
    let t = Instant::now();
    scenario_two_down(&mut env, &mut report).await;
    times.push(t.elapsed());
    let t = Instant::now();
    scenario_validity(&env, &healthy, &mut report).await;
    times.push(t.elapsed());
    let t = Instant::now();
    scenario_throughput(&env, &healthy, &mut report).await;
    times.push(t.elapsed());
    let t = Instant::now();
    scenario_handoff(&env, &mut report).await;
    times.push(t.elapsed());
    let t = Instant::now();
    scenario_guards(&env, &mut report).await;
    times.push(t.elapsed());
    println!(
        "\nscenario wall times (s): {}",
        times
            .iter()
            .map(|d| format!("{:.1}", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    let _ = std::fs::create_dir_all(&dir);
    let json = json!({"machine": machine, "quick": quick, "rows": report.rows});
    let _ = std::fs::write(
        dir.join("redlock.json"),
        serde_json::to_string_pretty(&json).unwrap(),
    );
    let md = format!(
        "## redlock-quorum benchmark\n\nMachine: {machine}. Command: `cargo bench --bench redlock{}`.\n{}",
        if quick { " -- --quick" } else { "" },
        report.md
    );
    let _ = std::fs::write(dir.join("redlock.md"), md);
    if let Err(e) = chart(&report, &dir.join("redlock-latency.svg")) {
        eprintln!("chart: {e}");
    }
    println!(
        "\nwrote {}/redlock.{{json,md}} and redlock-latency.svg in {:.1} s",
        dir.display(),
        started.elapsed().as_secs_f64()
    );
}
