//! How long lock, extend and unlock take as a lock grows from 1 to 1,000
//! resources, uncontended and with another manager waiting for the same
//! set; the figures of the README's table on sets.
//!
//! ```sh
//! cargo run --release --example set_sizes
//! ```
//!
//! Three `redis-server` processes started here (`REDLOCK_NODES` to use
//! others), default settings. With a waiter, "lock" is the hand-off: from
//! the start of the holder's `unlock` to the waiter's grant. Each cell is
//! the median and the largest of the cycles, and how many calls failed.

use std::time::{Duration, Instant};

use redlock_harness::{Cluster, resource};
use redlock_quorum::{Error, Redlock};

const TTL: Duration = Duration::from_secs(10);

/// Times of one operation over the cycles, and its failures.
#[derive(Default)]
struct Times(Vec<Duration>, usize);

impl Times {
    fn time<T>(&mut self, started: Instant, outcome: &Result<T, Error>) {
        match outcome {
            Ok(_) => self.0.push(started.elapsed()),
            Err(_) => self.1 += 1,
        }
    }

    fn cell(&mut self) -> String {
        self.0.sort();
        let ms = |d: &Duration| d.as_secs_f64() * 1e3;
        let (median, max) = match (self.0.get(self.0.len() / 2), self.0.last()) {
            (Some(median), Some(max)) => (ms(median), ms(max)),
            _ => (f64::NAN, f64::NAN),
        };
        let failed = if self.1 > 0 {
            format!(", {} failed", self.1)
        } else {
            String::new()
        };
        format!("{median:.1} / {max:.1}{failed}")
    }
}

/// One cycle: lock, (a waiter starts,) extend, unlock.
async fn cycle(holder: &Redlock, waiter: Option<&Redlock>, n: usize, t: &mut [Times; 3]) {
    let set: Vec<String> = (0..n).map(|i| resource(&format!("size-{n}-{i}"))).collect();
    let names: Vec<&str> = set.iter().map(String::as_str).collect();
    let started = Instant::now();
    let lock = holder.lock(&names, TTL).await;
    if waiter.is_none() {
        t[0].time(started, &lock);
    }
    let Ok(lock) = lock else { return };
    let waiting = waiter.map(|waiter| {
        let (waiter, set) = (waiter.clone(), set.clone());
        tokio::spawn(async move {
            let names: Vec<&str> = set.iter().map(String::as_str).collect();
            let lock = waiter.lock_within(&names, TTL, TTL * 2).await;
            (Instant::now(), lock.map(|lock| (waiter, lock)))
        })
    });
    if waiting.is_some() {
        // Time to be refused, subscribe and register on every key.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let started = Instant::now();
    let extended = holder.extend(&lock, TTL).await;
    t[1].time(started, &extended);
    let started = Instant::now();
    let unlocked = holder.unlock(extended.as_ref().unwrap_or(&lock)).await;
    t[2].time(started, &unlocked);
    if let Some(waiting) = waiting {
        let (granted, taken) = waiting.await.expect("waiter task");
        match taken {
            Ok((waiter, lock)) => {
                t[0].0.push(granted - started);
                let _ = waiter.unlock(&lock).await;
            }
            Err(_) => t[0].1 += 1,
        }
    }
}

#[tokio::main]
async fn main() {
    let cluster = Cluster::shared(3);
    let build = || Redlock::new(cluster.urls().iter().map(String::as_str)).expect("valid URLs");
    let (holder, waiter) = (build(), build());
    redlock_harness::warm(&holder).await;
    redlock_harness::warm(&waiter).await;
    println!("| keys | | lock (ms) | extend (ms) | unlock (ms) |");
    println!("|---:|---|---:|---:|---:|");
    for n in [1, 10, 100, 1_000] {
        let cycles = if n < 1_000 { 30 } else { 15 };
        for contended in [false, true] {
            let mut t: [Times; 3] = Default::default();
            for _ in 0..cycles {
                cycle(&holder, contended.then_some(&waiter), n, &mut t).await;
            }
            let how = if contended {
                "with a waiter (lock: hand-off)"
            } else {
                "uncontended"
            };
            let [lock, extend, unlock] = &mut t;
            println!(
                "| {n} | {how} | {} | {} | {} |",
                lock.cell(),
                extend.cell(),
                unlock.cell()
            );
        }
    }
}
