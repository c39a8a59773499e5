//! The redlock-quorum demo: a flash sale and a nightly job shared by several
//! workers through Redlock on five Redis nodes, riding out a node failure.
//!
//! ```sh
//! scripts/demo.sh                    # installs redis-server if missing, then runs this
//! cargo run --release -p redlock-demo
//! ```
//!
//! A crate of its own (`demo/`), so that it compiles the library and the
//! harness only, none of the root crate's test and benchmark dependencies.
//!
//! Nodes: `REDLOCK_NODES` if set; else the cluster of `scripts/cluster.sh` or
//! `docker-compose.redlock.yml` on ports 7001-7005 if it answers; else five
//! `redis-server` processes started here (and one of them killed part-way).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redlock_harness::RedisServer;
use redlock_harness::server;
use redlock_quorum::{Error, Redlock};
use tokio::sync::Mutex;

const WORKERS: usize = 8;
const INITIAL_STOCK: u64 = 400;
const ROUNDS: u64 = 4;
const SALE_TTL: Duration = Duration::from_secs(2);
const JOB_TTL: Duration = Duration::from_millis(300);
const JOB_LENGTH: Duration = Duration::from_millis(700);

/// Where the nodes come from.
enum Nodes {
    External(Vec<String>, &'static str),
    Owned(Vec<RedisServer>),
}

impl Nodes {
    fn urls(&self) -> Vec<String> {
        match self {
            Nodes::External(urls, _) => urls.clone(),
            Nodes::Owned(servers) => servers.iter().map(RedisServer::url).collect(),
        }
    }
}

fn pings(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let Ok(mut con) = client.get_connection_with_timeout(Duration::from_millis(300)) else {
        return false;
    };
    redis::cmd("PING").query::<String>(&mut con).is_ok()
}

fn find_nodes() -> Result<Nodes, String> {
    if let Some(urls) = redlock_harness::external_nodes() {
        return Ok(Nodes::External(urls, "REDLOCK_NODES"));
    }
    let cluster: Vec<String> = (7001..=7005)
        .map(|p| format!("redis://127.0.0.1:{p}/"))
        .collect();
    if cluster.iter().all(|u| pings(u)) {
        return Ok(Nodes::External(cluster, "the cluster on ports 7001-7005"));
    }
    if server::redis_server_available() {
        return Ok(Nodes::Owned((0..5).map(|_| RedisServer::start()).collect()));
    }
    Err(
        "no Redis nodes: set REDLOCK_NODES, start the cluster (scripts/cluster.sh up, or \
         docker compose -f docker-compose.redlock.yml up -d --wait), or install redis-server \
         (apt-get install redis-server; scripts/demo.sh does it for you)"
            .to_owned(),
    )
}

#[derive(Default)]
struct Stats {
    acquisitions: AtomicU64,
    conflicts: AtomicU64,
    latencies: Mutex<Vec<Duration>>,
    min_validity_ms: Mutex<Option<(Duration, Duration)>>,
    sold: AtomicU64,
    jobs_lost: AtomicU64,
}

#[tokio::main]
async fn main() {
    let nodes = match find_nodes() {
        Ok(nodes) => nodes,
        Err(message) => {
            eprintln!("demo: {message}");
            std::process::exit(1);
        }
    };
    let urls = nodes.urls();
    match &nodes {
        Nodes::External(_, source) => println!("nodes: {} from {source}", urls.len()),
        Nodes::Owned(_) => println!(
            "nodes: started 5 local redis-server processes on ports {}",
            urls.iter()
                .map(|u| u.trim_end_matches('/').rsplit(':').next().unwrap_or("?"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
    // What a readiness endpoint would report.
    let health = Redlock::new(urls.iter().map(String::as_str))
        .expect("node URLs")
        .health()
        .await;
    println!(
        "health: quorum {}reachable",
        if health.quorum_reachable { "" } else { "NOT " }
    );
    for n in &health.nodes {
        match &n.error {
            None => println!(
                "  {}: {} {}, round trip {:?}, appendonly {:?}, appendfsync {}",
                n.node,
                n.role.as_deref().unwrap_or("?"),
                n.version.as_deref().unwrap_or("?"),
                n.round_trip.unwrap_or_default(),
                n.appendonly,
                n.appendfsync.as_deref().unwrap_or("?")
            ),
            Some(e) => println!("  {}: unreachable ({e})", n.node),
        }
    }
    for w in &health.warnings {
        println!("  warning: {w}");
    }
    let run = std::process::id();
    let sale_key = format!("demo:{run}:sale:sku-42");

    // The stock lives outside Redis (think: a database row), read and
    // written back with a pause in between: without mutual exclusion,
    // concurrent workers oversell.
    let stock = Arc::new(AtomicU64::new(INITIAL_STOCK));
    let stats = Arc::new(Stats::default());
    let job_runs: Arc<Vec<AtomicU64>> = Arc::new((0..ROUNDS).map(|_| AtomicU64::new(0)).collect());
    let (round_tx, round_rx) = tokio::sync::watch::channel(None::<u64>);
    let done = Arc::new(AtomicBool::new(false));

    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        // Each worker is its own client, as each instance of a service is.
        let sale = Redlock::builder(urls.iter().map(String::as_str))
            .retry_delay(Duration::from_millis(2))
            .retry_jitter(Duration::from_millis(3))
            .build()
            .expect("valid configuration");
        // A few quick retries: eight workers starting at once can split the
        // votes so that nobody wins the first attempt.
        let nightly = Redlock::builder(urls.iter().map(String::as_str))
            .retry_count(5)
            .retry_delay(Duration::from_millis(10))
            .retry_jitter(Duration::from_millis(20))
            .build()
            .expect("valid configuration");
        let (stock, stats, job_runs, done) =
            (stock.clone(), stats.clone(), job_runs.clone(), done.clone());
        let job_stats = stats.clone();
        let sale_key = sale_key.clone();
        let mut rounds = round_rx.clone();

        // The nightly job: every worker tries at the start of each round;
        // only one may run it. It runs longer than its ttl, under a guard.
        let job = tokio::spawn(async move {
            while rounds.changed().await.is_ok() {
                let Some(round) = *rounds.borrow_and_update() else {
                    break;
                };
                let resource = format!("demo:{run}:nightly:{round}");
                if let Ok(guard) = nightly.acquire(&resource, JOB_TTL).await {
                    job_runs[round as usize].fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(JOB_LENGTH).await;
                    if !guard.is_held() {
                        job_stats.jobs_lost.fetch_add(1, Ordering::Relaxed);
                    }
                    // Keep the round's lock until it expires, so no late
                    // worker runs this round's job again.
                    guard.forget();
                }
            }
        });

        // The flash sale: lock, read, pause, write back.
        let sale_task = tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                let t = Instant::now();
                match sale.try_lock(&sale_key, SALE_TTL).await {
                    Ok(lock) => {
                        let took = t.elapsed();
                        stats.acquisitions.fetch_add(1, Ordering::Relaxed);
                        stats.latencies.lock().await.push(took);
                        {
                            let mut min = stats.min_validity_ms.lock().await;
                            let v = lock.validity();
                            if min.is_none_or(|(m, _)| v < m) {
                                *min = Some((v, SALE_TTL));
                            }
                        }
                        let left = stock.load(Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_micros(300)).await;
                        if left == 0 {
                            done.store(true, Ordering::SeqCst);
                        } else if lock.is_valid() {
                            stock.store(left - 1, Ordering::SeqCst);
                            stats.sold.fetch_add(1, Ordering::SeqCst);
                        }
                        let _ = sale.unlock(&lock).await;
                    }
                    Err(Error::Conflict { .. }) => {
                        stats.conflicts.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_micros(500 + 200 * w as u64)).await;
                    }
                    Err(e) => {
                        stats.conflicts.fetch_add(1, Ordering::Relaxed);
                        eprintln!("worker {w}: {e}");
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
        });
        workers.push((job, sale_task));
    }

    // The conductor: starts the nightly rounds and, when it owns the
    // nodes, kills one once half the stock is sold.
    let mut nodes = nodes;
    let mut killed = Vec::new();
    let mut next_round = 0;
    while !done.load(Ordering::SeqCst) || next_round < ROUNDS {
        if next_round < ROUNDS && started.elapsed() >= JOB_LENGTH * 2 * next_round as u32 {
            let _ = round_tx.send(Some(next_round));
            next_round += 1;
        }
        if killed.is_empty()
            && stock.load(Ordering::SeqCst) <= INITIAL_STOCK / 2
            && let Nodes::Owned(servers) = &mut nodes
        {
            servers[2].kill();
            killed.push(urls[2].clone());
            println!(
                "t={:>5} ms  killed node {} with {} items left; locking goes on",
                started.elapsed().as_millis(),
                urls[2],
                stock.load(Ordering::SeqCst)
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(JOB_LENGTH + Duration::from_millis(100)).await;
    drop(round_tx);
    for (job, sale) in workers {
        sale.await.expect("sale worker");
        job.await.expect("job worker");
    }

    let mut latencies = stats.latencies.lock().await.clone();
    if latencies.is_empty() {
        eprintln!("demo: no acquisition succeeded");
        std::process::exit(1);
    }
    latencies.sort();
    let mean = latencies.iter().sum::<Duration>() / latencies.len().max(1) as u32;
    let p99 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];
    let (min_validity, ttl) = stats.min_validity_ms.lock().await.unwrap_or_default();
    let final_stock = stock.load(Ordering::SeqCst);
    let sold = stats.sold.load(Ordering::SeqCst);
    let runs: Vec<u64> = job_runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
    let stock_ok = final_stock == 0 && sold == INITIAL_STOCK;
    let jobs_ok = runs.iter().all(|&r| r == 1);

    println!();
    println!("redlock-quorum demo report");
    println!("  workers                  {WORKERS} (each its own Redlock client)");
    println!(
        "  nodes                    {} (quorum {})",
        urls.len(),
        urls.len() / 2 + 1
    );
    println!(
        "  nodes lost               {}{}",
        killed.len(),
        if killed.is_empty() {
            ""
        } else {
            " (killed mid-sale)"
        }
    );
    println!(
        "  acquisitions             {}",
        stats.acquisitions.load(Ordering::Relaxed)
    );
    println!(
        "  conflicts                {}",
        stats.conflicts.load(Ordering::Relaxed)
    );
    println!(
        "  acquire latency          mean {:.3} ms, p99 {:.3} ms",
        ms(mean),
        ms(p99)
    );
    println!(
        "  smallest validity left   {:.1} ms of a {} ms ttl",
        ms(min_validity),
        ttl.as_millis()
    );
    println!(
        "  nightly job runs/round   {runs:?} {}",
        if jobs_ok {
            "(exactly once each)"
        } else {
            "WRONG"
        }
    );
    println!(
        "  stock                    {INITIAL_STOCK} -> {final_stock}, sold {sold} {}",
        if stock_ok { "(exact)" } else { "WRONG" }
    );
    println!(
        "  job locks lost mid-job   {}",
        stats.jobs_lost.load(Ordering::Relaxed)
    );
    println!(
        "  time                     {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if !(stock_ok && jobs_ok) {
        std::process::exit(1);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
