//! Tenth pass of issue 23, audited against real `redis-server` processes:
//! - `node_failures` is counted by each failing request of a round: once
//!   per request, heard in the round or left to finish after the quorum
//!   (acquire, extend, release, locks on several resources), never for a
//!   restart that the retry on a fresh connection hides, nothing with
//!   `stats(false)` (where the `metrics` feature still sees each failure);
//! - the acquisition's cancel guard, borrowing now and re-armed for the
//!   failure path: an attempt cancelled mid-round, or while its failure
//!   path releases, leaves no key; one dropped after its runtime is gone
//!   does not panic;
//! - the bench's counting allocator (`benches/redlock/heap.rs`, this
//!   binary's global allocator): frees on other threads, reallocs, and
//!   its peak.

#[path = "../benches/redlock/heap.rs"]
#[allow(dead_code, unreachable_pub)]
mod heap;

use std::time::{Duration, Instant};

use redlock_harness::proxy::{Fault, Proxy};
use redlock_harness::steps::node_failures;
use redlock_harness::{Cluster, resource, warm};
use redlock_quorum::Redlock;

const TTL: Duration = Duration::from_secs(10);

/// Waits for the leftovers to count up to `want`, then a while more: a
/// count past it (counted twice) or short of it fails.
async fn failures_settle_at(redlock: &Redlock, want: &[u64]) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while node_failures(redlock).iter().zip(want).any(|(n, w)| n < w) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(node_failures(redlock), want, "{:?}", redlock.stats());
}

/// Polls until none of `keys` is on any node (6 s at most); whether so.
async fn gone_everywhere(cluster: &Cluster, keys: &[String]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(6);
    while !keys.iter().all(|k| cluster.nowhere(k)) {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

fn refs(names: &[String]) -> Vec<&str> {
    names.iter().map(String::as_str).collect()
}

/// Node 2 answers every request with an error (its lock keys are lists),
/// 100 ms after the others: acquisitions and extensions hear it after
/// their quorum (the leftover), releases wait for it. Each request counts
/// once, on node 2 alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_erroring_on_every_request_counts_once_per_request() {
    let mut cluster = Cluster::start(3);
    let proxy = Proxy::to_port(cluster.node(2).port()).await;
    let mut urls = cluster.urls()[..2].to_vec();
    urls.push(proxy.url());
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(Duration::from_secs(3))
        .retry_count(0)
        .build()
        .unwrap();
    warm(&redlock).await;
    assert_eq!(node_failures(&redlock), [0, 0, 0]);
    proxy.set(Fault::Latency(Duration::from_millis(100)));
    let one = resource("wrong-type");
    let multi = [resource("wrong-type-a"), resource("wrong-type-b")];
    let mut node2 = cluster.node(2).conn();
    for key in [&one, &multi[0]] {
        redis::cmd("RPUSH")
            .arg(key)
            .arg("x")
            .query::<()>(&mut node2)
            .unwrap();
    }
    let lock = redlock.try_lock(&one, TTL).await.expect("nodes 0 and 1");
    let lock = redlock.extend(&lock, TTL).await.expect("nodes 0 and 1");
    assert_eq!(redlock.unlock(&lock).await.unwrap(), 2);
    let lock = redlock.try_lock(&refs(&multi), TTL).await.expect("0 and 1");
    assert_eq!(redlock.unlock(&lock).await.unwrap(), 2);
    // Acquire, extend, release; acquire, release.
    failures_settle_at(&redlock, &[0, 0, 5]).await;
}

/// A paused node: each acquisition's request to it times out after the
/// quorum, in the leftover, and counts once. A node restarted between
/// rounds is no failure: the send on the dead connection is retried on a
/// fresh one, which answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_count_once_and_a_hidden_restart_not_at_all() {
    let mut cluster = Cluster::start(3);
    let redlock = cluster
        .builder()
        .node_timeout(Duration::from_secs(1))
        .retry_count(0)
        .build()
        .unwrap();
    warm(&redlock).await;
    cluster.node(2).pause();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(redlock.try_lock(&resource("paused"), TTL).await.unwrap());
    }
    let multi = [resource("paused-a"), resource("paused-b")];
    held.push(redlock.try_lock(&refs(&multi), TTL).await.unwrap());
    failures_settle_at(&redlock, &[0, 0, 4]).await;
    cluster.node(2).resume();

    cluster.node(1).restart();
    let lock = redlock.try_lock(&resource("restarted"), TTL).await.unwrap();
    redlock.unlock(&lock).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        node_failures(&redlock)[..2],
        [0, 0],
        "{:?}",
        redlock.stats()
    );
}

/// `stats(false)`: no failure counted, while the `metrics` feature still
/// reports each one once (the leftovers run on this runtime's thread).
#[cfg(feature = "metrics")]
#[test]
fn stats_off_counts_nothing_but_metrics_see_each_failure_once() {
    use metrics_util::MetricKind;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let mut cluster = Cluster::start(3);
    let redlock = cluster
        .builder()
        .node_timeout(Duration::from_secs(1))
        .retry_count(0)
        .stats(false)
        .build()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(warm(&redlock));
    cluster.node(2).pause();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            for _ in 0..3 {
                let _held = redlock.try_lock(&resource("metrics"), TTL).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(2500)).await;
        })
    });
    cluster.node(2).resume();
    let node2 = format!("node={}", redlock.stats().node_failures[2].0);
    let mut counted = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (kind, key) = key.into_parts();
        if key.name() != "redlock_node_failures_total" {
            continue;
        }
        let label: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        if let (MetricKind::Counter, DebugValue::Counter(n)) = (kind, value) {
            counted.push((label.join(","), n));
        }
    }
    assert_eq!(counted, [(node2, 3)]);
    assert_eq!(node_failures(&redlock), [0, 0, 0]);
}

/// Attempts cancelled mid-round (nodes 1 and 2 answer a second late; our
/// `SET` is on node 0 already): the guard releases each, one resource or
/// two, and no key stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_cancelled_mid_round_leave_no_key() {
    let mut cluster = Cluster::start(3);
    let p1 = Proxy::to_port(cluster.node(1).port()).await;
    let p2 = Proxy::to_port(cluster.node(2).port()).await;
    let urls = [cluster.urls()[0].clone(), p1.url(), p2.url()];
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(Duration::from_secs(3))
        .retry_count(0)
        .build()
        .unwrap();
    warm(&redlock).await;
    p1.set(Fault::Latency(Duration::from_secs(1)));
    p2.set(Fault::Latency(Duration::from_secs(1)));
    let names: Vec<String> = (0..6)
        .map(|i| resource(&format!("cancelled-{i}")))
        .collect();
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let (redlock, names) = (redlock.clone(), names.clone());
            tokio::spawn(async move {
                let mine = match i {
                    0 | 1 => vec![names[i].as_str()],
                    _ => vec![names[2 * i - 2].as_str(), names[2 * i - 1].as_str()],
                };
                tokio::time::timeout(Duration::from_millis(300), redlock.try_lock(&mine, TTL))
                    .await
                    .is_err()
            })
        })
        .collect();
    for task in tasks {
        assert!(task.await.unwrap(), "ended before it was cancelled");
    }
    let left = !gone_everywhere(&cluster, &names).await;
    assert!(!left, "{:?}", cluster.left_of(&names));
}

/// An attempt on two resources whose quorum came too late (a drift factor
/// of 0.98 leaves 198 ms of a 10 s ttl; node 2 answers after 300 ms) is
/// released everywhere; nodes 3 and 4 answer its `SET` script only after
/// 2 s, and their release waits for it (a script may be sent again). The
/// attempt is cancelled meanwhile: the guard, armed again for the failure
/// path, releases it; nothing else would on nodes 3 and 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_cancelled_in_its_failure_release_leaves_no_key() {
    let mut cluster = Cluster::start(5);
    let mut proxies = Vec::new();
    for i in 2..5 {
        proxies.push(Proxy::to_port(cluster.node(i).port()).await);
    }
    let mut urls = cluster.urls()[..2].to_vec();
    urls.extend(proxies.iter().map(Proxy::url));
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(Duration::from_secs(4))
        .drift_factor(0.98)
        .retry_count(0)
        .build()
        .unwrap();
    warm(&redlock).await;
    // The scripts of a lock on two resources loaded everywhere: no
    // `NOSCRIPT` round trip later.
    let warm2 = [resource("warm-a"), resource("warm-b")];
    let lock = redlock.try_lock(&refs(&warm2), TTL).await.unwrap();
    redlock.unlock(&lock).await.unwrap();
    proxies[0].set(Fault::Latency(Duration::from_millis(300)));
    proxies[1].set(Fault::Latency(Duration::from_secs(2)));
    proxies[2].set(Fault::Latency(Duration::from_secs(2)));
    let names = [resource("late-a"), resource("late-b")];
    let both = refs(&names);
    let attempt = redlock.try_lock(&both, TTL);
    // Cancelled after the late quorum (300 ms), before nodes 3 and 4
    // answer (2 s): in the failure path's release.
    let cancelled = tokio::time::timeout(Duration::from_millis(900), attempt).await;
    assert!(cancelled.is_err(), "{cancelled:?}");
    let left = !gone_everywhere(&cluster, &names).await;
    assert!(!left, "{:?}", cluster.left_of(&names));
}

/// Runtimes that go away mid-round: an attempt polled on a runtime since
/// dropped, then dropped outside any runtime, and a task dropped while its
/// runtime shuts down. Neither panics (the guard finds no runtime to
/// release from: the keys expire with their ttl), and the manager locks
/// the same resources on a new runtime.
#[test]
fn attempts_outliving_their_runtime_drop_quietly() {
    let mut cluster = Cluster::start(3);
    let redlock = cluster
        .builder()
        .node_timeout(Duration::from_secs(2))
        .retry_count(0)
        .build()
        .unwrap();
    let short = Duration::from_secs(1);
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    runtime().block_on(warm(&redlock));
    cluster.node(1).pause();
    cluster.node(2).pause();
    let (one, two) = (resource("runtime-gone"), resource("runtime-shut"));
    let first = runtime();
    let mut attempt = Box::pin(redlock.try_lock(&one, short));
    let polled = first
        .block_on(async { tokio::time::timeout(Duration::from_millis(200), &mut attempt).await });
    assert!(polled.is_err());
    drop(first);
    drop(attempt);
    let second = runtime();
    let task = {
        let (redlock, two) = (redlock.clone(), two.clone());
        second.spawn(async move { redlock.try_lock(&two, short).await.map(|_| ()) })
    };
    second.block_on(async { tokio::time::sleep(Duration::from_millis(200)).await });
    drop(second);
    drop(task);
    cluster.node(1).resume();
    cluster.node(2).resume();
    runtime().block_on(async {
        for name in [&one, &two] {
            let lock = redlock
                .lock_within(name.as_str(), TTL, Duration::from_secs(5))
                .await
                .expect("the key expired");
            redlock.unlock(&lock).await.unwrap();
        }
    });
}

/// One heap test at a time (the peak is the process's).
static HEAP: std::sync::Mutex<()> = std::sync::Mutex::new(());

const MIB: usize = 1 << 20;

/// Live bytes follow blocks allocated on one thread and freed on another,
/// and reallocs; the peak follows from `reset_peak` until `stop_peak`.
/// (Blocks of 64 MiB: the other tests of this binary allocate meanwhile.)
#[test]
fn the_heap_count_follows_frees_elsewhere_reallocs_and_the_peak_window() {
    let _one = HEAP.lock().unwrap();
    let near = |got: f64, want: usize| (got - want as f64).abs() < (16 * MIB) as f64;
    let before = heap::live_bytes();
    let grown = || heap::live_bytes() - before;
    let block: Vec<u8> = std::thread::spawn(|| Vec::with_capacity(64 * MIB))
        .join()
        .unwrap();
    assert!(near(grown(), 64 * MIB), "{}", grown());
    let mut moved: Vec<u8> = Vec::with_capacity(MIB);
    moved.reserve_exact(128 * MIB);
    assert!(near(grown(), 192 * MIB), "{}", grown());
    moved.shrink_to(32 * MIB);
    assert!(near(grown(), 96 * MIB), "{}", grown());
    drop(block);
    std::thread::spawn(move || drop(moved)).join().unwrap();
    assert!(near(grown(), 0), "{}", grown());

    heap::reset_peak();
    let start = heap::peak_bytes();
    let big: Vec<u8> = std::hint::black_box(Vec::with_capacity(64 * MIB));
    assert!(near(heap::peak_bytes() - start, 64 * MIB));
    drop(big);
    heap::stop_peak();
    let stopped = heap::peak_bytes();
    let bigger: Vec<u8> = std::hint::black_box(Vec::with_capacity(256 * MIB));
    assert_eq!(heap::peak_bytes(), stopped, "the peak moved while stopped");
    drop(bigger);
}

/// The peak was the sum of the shards read one by one, not at one
/// instant: a thread preempted in the middle of the sum added shards read
/// before a run of frees to shards read after the matching allocations.
/// Here blocks of 4 MiB made on one thread and freed on another (never
/// more than 8 MiB live) showed a peak of gigabytes; the peak is now taken
/// from one exact counter while it is followed.
#[test]
fn the_heap_peak_is_not_inflated_by_frees_on_other_threads() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let _one = HEAP.lock().unwrap();
    heap::reset_peak();
    let start = heap::peak_bytes();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::black_box(Box::new([0u8; 48]));
                }
            })
        })
        .collect();
    for _ in 0..4 {
        // The freeing thread takes its shard first: the sum reads it
        // before the making thread's.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(0);
        let ready = Arc::new(std::sync::Barrier::new(2));
        let freer = {
            let ready = ready.clone();
            std::thread::spawn(move || {
                drop(std::hint::black_box(Box::new(0u8)));
                ready.wait();
                while rx.recv().is_ok() {}
            })
        };
        ready.wait();
        let maker = std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_millis(400);
            while Instant::now() < end {
                tx.send(std::hint::black_box(Vec::with_capacity(4 * MIB)))
                    .unwrap();
            }
        });
        maker.join().unwrap();
        freer.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    readers.into_iter().for_each(|r| r.join().unwrap());
    heap::stop_peak();
    let over = heap::peak_bytes() - start;
    assert!(
        over < (32 * MIB) as f64,
        "peak {} MiB over 8 MiB live at most",
        over / MIB as f64
    );
}
