//! An audit of the finisher (`engine/finisher.rs`): one task per manager
//! and per Tokio runtime that finishes the requests a round left pending
//! when it stopped at a quorum, for rounds run outside a task (a round run
//! in a task spawns a task for them); and of those spawned tasks beside
//! it. On real servers, on their worst days:
//! - a node paused (SIGSTOP) or blackholed while rounds leave requests to
//!   it pending, and every later step on the lock (unlock, extend, verify,
//!   fencing) right behind them: each must end, and no key may be left on
//!   any node once the pending requests settled (a late `SET` or an
//!   extension sent again after `NOSCRIPT`, landing after the release,
//!   keeps the key for its ttl);
//! - the runtime that owns a finisher shuts down with requests pending:
//!   runtimes made and dropped in sequence around one manager (one per
//!   test, as `#[tokio::test]` makes them), and two runtimes alive at once
//!   with one of them dropped mid-wait. No panic anywhere (a timer of a
//!   dead runtime polled by another runtime's task panics in Tokio), and
//!   the later calls still end, still behind the earlier requests;
//! - calls from `Runtime::block_on`'s thread, plain threads and
//!   `spawn_blocking` threads, on current-thread and multi-thread runtimes;
//! - thousands of leftovers pending at once behind a paused node (200
//!   lockers, and locks on 1,000 resources, from tasks and from
//!   `block_on`): they all settle within about the node timeout, one
//!   finisher task holds those of `block_on`'s calls, the work per
//!   lock does not grow with the leftovers pending, and the memory they
//!   took is given back;
//! - the manager dropped, with leftovers pending and with none: its
//!   finisher task ends, and so do the spawned ones (the runtime's `num_alive_tasks` goes back to 0);
//! - and what the finisher is for: the requests left at a quorum still
//!   reach the slower node (sent again there after `NOSCRIPT`).
//!
//! Each test names, in its comment, the defects it catches; each was
//! planted in a copy of the library and seen to fail it.
//!
//! The tests take one lock each ([`Audit`]): they run one at a time, so
//! that the panic count, the heap count (this binary's allocator counts
//! its live bytes), the CPU time and the runtimes' task counts are theirs
//! alone. Wall-clock times are printed, never asserted: every wait is
//! bounded generously (a hang fails, a slow machine does not). The one
//! bound on work is a ratio of CPU times, each burst against a reference
//! burst measured on the same machine at the same time.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use redlock_harness::proxy::{Fault, Proxy};
use redlock_harness::raw::script_flush;
use redlock_harness::runtimes::{current_thread, multi_thread};
use redlock_harness::{Cluster, reach_every_node, releases_drained, resource, warm};
use redlock_quorum::{Lock, Redlock};

/// Live heap bytes of the whole test binary.
static LIVE: AtomicIsize = AtomicIsize::new(0);

/// The system allocator, counting the bytes it has out.
struct Counting;

// SAFETY: every call is passed to `System` unchanged; the counter is only
// arithmetic on the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live_heap() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Panics anywhere in the process (a runtime's task included) since the
/// hook was installed.
static PANICS: AtomicUsize = AtomicUsize::new(0);
static HOOK: Once = Once::new();
static SERIAL: Mutex<()> = Mutex::new(());

/// One test at a time, and the panics seen while it runs.
struct Audit {
    _serial: MutexGuard<'static, ()>,
    panics_before: usize,
}

impl Audit {
    fn start() -> Audit {
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                PANICS.fetch_add(1, Ordering::SeqCst);
                previous(info);
            }));
        });
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        Audit {
            _serial: serial,
            panics_before: PANICS.load(Ordering::SeqCst),
        }
    }

    /// Panics since the test started, on any thread.
    fn panics(&self) -> usize {
        PANICS.load(Ordering::SeqCst) - self.panics_before
    }
}

const TTL: Duration = Duration::from_secs(60);
const NODE_TIMEOUT: Duration = Duration::from_secs(1);
/// The bound on one step (lock, unlock, extend, ...): far past what a step
/// behind a paused node takes (its earlier requests' deadline, then its own
/// timeout), so that only a step that never ends reaches it.
const STEP: Duration = Duration::from_secs(30);

fn build(urls: &[String]) -> Redlock {
    build_with(urls, NODE_TIMEOUT)
}

fn build_with(urls: &[String], node_timeout: Duration) -> Redlock {
    Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(node_timeout)
        .connect_timeout(Duration::from_secs(1))
        .retry_delay(Duration::from_millis(5))
        .retry_jitter(Duration::from_millis(10))
        .build()
        .unwrap()
}

fn flush_all(cluster: &Cluster) {
    for i in 0..cluster.len() {
        let _: () = redis::cmd("FLUSHALL").query(&mut cluster.conn(i)).unwrap();
    }
}

/// Sends SIGCONT to `pid` after `after`, from a thread of its own (the
/// test's runtime may be busy, or blocked on purpose).
fn resume_after(pid: u32, after: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(after);
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &pid.to_string()])
            .status();
    })
}

/// A proxy to node 4, run on `rt`, and the cluster's URLs with node 4's
/// through it.
fn node_4_behind_a_proxy(
    cluster: &mut Cluster,
    rt: &tokio::runtime::Runtime,
) -> (Proxy, Vec<String>) {
    let proxy = rt.block_on(Proxy::to_port(cluster.node(4).port()));
    let mut urls = cluster.urls()[..4].to_vec();
    urls.push(proxy.url());
    (proxy, urls)
}

/// The names of `names` whose key is on some node (one `KEYS *` per node).
fn keys_left(cluster: &Cluster, names: &[String]) -> Vec<String> {
    cluster.left_of(names)
}

/// The keys of `names` still somewhere once the owed releases drained and
/// the requests in flight have had time to land.
async fn left_after_settling(
    cluster: &Cluster,
    redlock: &Redlock,
    names: &[String],
) -> Vec<String> {
    assert!(
        releases_drained(redlock, Duration::from_secs(60)).await,
        "owed releases never drained: {}",
        redlock.pending_releases()
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    keys_left(cluster, names)
}

/// What a batch of steps saw.
#[derive(Default, Debug)]
struct Seen {
    names: Vec<String>,
    /// Steps that did not end within [`STEP`].
    hung: Vec<String>,
    /// Steps that ended with an error (not a failure of the audit by
    /// itself: a node is paused).
    errors: Vec<String>,
    cycles: usize,
    granted: usize,
    slowest: Duration,
}

impl Seen {
    fn add(&mut self, other: Seen) {
        self.names.extend(other.names);
        self.hung.extend(other.hung);
        self.errors.extend(other.errors);
        self.cycles += other.cycles;
        self.granted += other.granted;
        self.slowest = self.slowest.max(other.slowest);
    }

    /// Fails when a step never ended or fewer than 9 in 10 locks were
    /// granted.
    fn assert_ended_and_granted(&self) {
        assert!(
            self.hung.is_empty(),
            "steps never ended: {:?}",
            &self.hung[..self.hung.len().min(10)]
        );
        assert!(
            self.granted * 10 >= self.cycles * 9,
            "too few locks: {} of {}",
            self.granted,
            self.cycles
        );
    }

    /// Records a bounded step's outcome under `what`: hung (`None`) or an
    /// error. The step's value when it ended well.
    fn note<T, E: std::fmt::Display>(
        &mut self,
        what: &str,
        outcome: Option<Result<T, E>>,
    ) -> Option<T> {
        match outcome {
            None => {
                self.hung.push(what.to_string());
                None
            }
            Some(Err(e)) => {
                self.errors.push(format!("{what}: {e}"));
                None
            }
            Some(Ok(value)) => Some(value),
        }
    }
}

/// Bounds `step` by [`STEP`]: `None` when it did not end.
async fn bounded<T>(step: impl Future<Output = T>) -> Option<T> {
    tokio::time::timeout(STEP, step).await.ok()
}

/// One lock and the steps right behind it, by `kind`: 0 unlock; 1 extend,
/// then unlock through the old handle; 2 verify, then unlock; 3 a lock on
/// three resources (a script), then unlock; 4 a fencing token, then
/// unlock.
async fn cycle(redlock: &Redlock, topic: &str, kind: usize) -> Seen {
    let mut seen = Seen {
        cycles: 1,
        ..Seen::default()
    };
    let names: Vec<String> = if kind == 3 {
        (0..3)
            .map(|i| resource(&format!("{topic}-set{i}")))
            .collect()
    } else {
        vec![resource(topic)]
    };
    seen.names.extend(names.iter().cloned());
    let t = Instant::now();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let outcome = bounded(redlock.try_lock(refs, TTL)).await;
    let Some(lock) = seen.note(&format!("{topic}: lock"), outcome) else {
        return seen;
    };
    seen.granted += 1;
    match kind {
        1 => {
            let outcome = bounded(redlock.extend(&lock, TTL)).await;
            seen.note(&format!("{topic}: extend"), outcome.map(|o| o.map(drop)));
        }
        2 => {
            let outcome = bounded(redlock.verify(&lock)).await;
            seen.note(&format!("{topic}: verify"), outcome);
        }
        4 => {
            let outcome = bounded(redlock.fencing_token(&lock)).await;
            seen.note(&format!("{topic}: fencing token"), outcome);
        }
        _ => {}
    }
    let outcome = bounded(redlock.unlock(&lock)).await;
    seen.note(&format!("{topic}: unlock"), outcome);
    seen.slowest = t.elapsed();
    seen
}

fn report(what: &str, seen: &Seen, left: &[String]) {
    eprintln!(
        "{what}: {} cycles, {} granted; slowest cycle {:?}; hung {} {:?}; errors {} {:?}; keys left {} {:?}",
        seen.cycles,
        seen.granted,
        seen.slowest,
        seen.hung.len(),
        seen.hung.iter().take(5).collect::<Vec<_>>(),
        seen.errors.len(),
        seen.errors.iter().take(3).collect::<Vec<_>>(),
        left.len(),
        left.iter().take(5).collect::<Vec<_>>(),
    );
}

/// Node 3 paused (SIGSTOP), node 4 blackholed behind a proxy, or both,
/// while 40 tasks each lock and step right behind the lock (unlock;
/// extend then unlock through the old handle; verify then unlock; a lock
/// on three resources; a fencing token then unlock). Each lock returns at
/// a quorum of the others and leaves its request to the silent node to
/// the finisher. The silent nodes' script caches are flushed first (the
/// release's script loaded again by a side lock), so the extension and the
/// set's script get `NOSCRIPT` there and are sent again when the node comes
/// back: a release that did not wait for them to settle would run first,
/// and the extension (its heal path) or the set would keep the keys for a
/// whole ttl. The node comes back before the requests' deadline or after
/// it. Every step must end, and no key may be left once things settle.
///
/// Catches a hand-off that does not poll the new leftover with the
/// finisher's waker (pushed alone, or polled with a waker that wakes
/// nobody: the next step on the lock waits for it for ever), and a round
/// that counts the requests it hands off as settled (the late extensions
/// and sets keep keys on the silent nodes).
#[test]
fn steps_behind_a_paused_or_blackholed_node_end_and_leave_no_key() {
    let audit = Audit::start();
    let mut cluster = Cluster::start(5);
    let rt = multi_thread();
    let (proxy, urls) = node_4_behind_a_proxy(&mut cluster, &rt);
    let redlock = Arc::new(build(&urls));
    rt.block_on(warm(&redlock));
    let pid = cluster.node(3).pid().expect("running");
    let mut all = Seen::default();
    for round in 0..6usize {
        // 0, 3: paused; 1, 4: blackholed; 2, 5: both.
        let (pause, blackhole) = match round % 3 {
            0 => (true, false),
            1 => (false, true),
            _ => (true, true),
        };
        let back_after = Duration::from_millis(if round < 3 { 300 } else { 1500 });
        if pause {
            script_flush(&cluster.urls()[3]);
        }
        if blackhole {
            script_flush(&cluster.urls()[4]);
        }
        let side = rt.block_on(cycle(&redlock, &format!("side-{round}"), 0));
        all.add(side);
        if !all.hung.is_empty() {
            break;
        }
        if pause {
            cluster.node(3).pause();
        }
        if blackhole {
            proxy.set(Fault::Blackhole);
        }
        let resumer = pause.then(|| resume_after(pid, back_after));
        let seen = rt.block_on(async {
            let tasks: Vec<_> = (0..40usize)
                .map(|task| {
                    let redlock = redlock.clone();
                    tokio::spawn(async move {
                        cycle(&redlock, &format!("silent-{round}-{task}"), task % 5).await
                    })
                })
                .collect();
            tokio::time::sleep(back_after).await;
            proxy.set(Fault::NONE);
            let mut seen = Seen::default();
            for t in tasks {
                seen.add(t.await.unwrap());
            }
            seen
        });
        if let Some(resumer) = resumer {
            resumer.join().unwrap();
            cluster.node(3).resume();
        }
        report(
            &format!(
                "round {round} (paused {pause}, blackholed {blackhole}, back after {back_after:?})"
            ),
            &seen,
            &[],
        );
        let hung = !seen.hung.is_empty();
        all.add(seen);
        if hung {
            break;
        }
    }
    let left = rt.block_on(left_after_settling(&cluster, &redlock, &all.names));
    report("all rounds", &all, &left);
    assert!(all.hung.is_empty(), "steps never ended: {:#?}", all.hung);
    assert!(
        all.granted * 5 >= all.cycles * 4,
        "too few locks granted for the audit to mean anything: {} of {}",
        all.granted,
        all.cycles
    );
    for k in &left {
        eprintln!("left: {k} pttls {:?}", cluster.pttls(k));
    }
    assert!(left.is_empty(), "keys left: {left:#?}");
    assert_eq!(audit.panics(), 0, "a task panicked");
}

/// Unlocks each of `locks` at once, each bounded by [`STEP`]; records the
/// hung and failed ones in `seen`.
async fn unlock_all(redlock: &Redlock, locks: &[Lock], what: &str, seen: &mut Seen) {
    let outcomes =
        futures::future::join_all(locks.iter().map(|lock| bounded(redlock.unlock(lock)))).await;
    for (i, outcome) in outcomes.into_iter().enumerate() {
        seen.note(&format!("{what}: unlock {i}"), outcome);
    }
}

/// Takes a lock on each of `names` at once (a name with a `+` in it is a
/// set of three resources, `+0`, `+1`, `+2`), each bounded by [`STEP`].
async fn lock_all(redlock: &Redlock, names: &[String], what: &str, seen: &mut Seen) -> Vec<Lock> {
    let outcomes = futures::future::join_all(names.iter().map(|name| async move {
        let set: Vec<String> = if name.ends_with('+') {
            (0..3).map(|i| format!("{name}{i}")).collect()
        } else {
            vec![name.clone()]
        };
        let refs: Vec<&str> = set.iter().map(String::as_str).collect();
        (set.clone(), bounded(redlock.try_lock(refs, TTL)).await)
    }))
    .await;
    let mut locks = Vec::new();
    for (set, outcome) in outcomes {
        seen.cycles += 1;
        seen.names.extend(set.iter().cloned());
        if let Some(lock) = seen.note(&format!("{what}: lock {set:?}"), outcome) {
            seen.granted += 1;
            locks.push(lock);
        }
    }
    locks
}

/// One manager around runtimes made and dropped in sequence, as a test
/// suite's `#[tokio::test]`s make them (current-thread, and a multi-thread
/// one now and then), each dropped while node 4 is paused and its rounds'
/// requests there are pending (the finisher's task and its leftovers are
/// dropped with the runtime, each request counted as settled). Each
/// runtime first unlocks what the previous one kept, before handing
/// anything to a finisher of its own (so that nothing prunes the dead
/// runtime's entry first), then locks, extends, unlocks some at once and
/// keeps the rest. Node 4 comes back during the next runtime's unlocks or
/// after them. No task may panic (a timer of a dead runtime polled by
/// another runtime panics in Tokio), every step must end, and no key may
/// be left.
///
/// The manager keeps a finisher entry for this runtime and at most the
/// one before it (an entry is pruned when a new runtime comes).
///
/// Catches a finisher whose task, dropped with its runtime, keeps its
/// leftovers (their requests never count as settled: the next runtime's
/// unlocks wait for ever), entries of dead runtimes never pruned (one per
/// runtime for the manager's life), and one finisher for all runtimes
/// that hands a dead runtime's leftovers to the next runtime's task (Tokio
/// panics: "A Tokio 1.x context was found, but it is being shutdown").
#[test]
fn runtimes_made_and_dropped_in_sequence_around_one_manager() {
    let audit = Audit::start();
    let mut cluster = Cluster::start(5);
    let redlock = Arc::new(build(cluster.urls()));
    let pid = cluster.node(4).pid().expect("running");
    let mut kept: Vec<Lock> = Vec::new();
    let mut seen = Seen::default();
    let mut resumer: Option<std::thread::JoinHandle<()>> = None;
    // The most runtimes the manager kept a finisher entry for at once.
    let mut entries = 0;
    for test in 0..9usize {
        let rt = if test % 3 == 2 {
            multi_thread()
        } else {
            current_thread()
        };
        let previous = std::mem::take(&mut kept);
        let t = Instant::now();
        rt.block_on(unlock_all(
            &redlock,
            &previous,
            &format!("runtime {test}, the previous one's"),
            &mut seen,
        ));
        let unlocked_in = t.elapsed();
        if let Some(resumer) = resumer.take() {
            resumer.join().unwrap();
            cluster.node(4).resume();
        }
        // This runtime's connection to node 4 is made (its rounds' requests
        // there are then pending while it is paused).
        rt.block_on(reach_every_node(&redlock));
        cluster.node(4).pause();
        let t = Instant::now();
        let (locks, pending) = rt.block_on(async {
            let mut mine = Seen::default();
            let names: Vec<String> = (0..16)
                .map(|i| {
                    let name = resource(&format!("sequence-{test}-{i}"));
                    if i % 4 == 3 { format!("{name}+") } else { name }
                })
                .collect();
            let locks = lock_all(&redlock, &names, &format!("runtime {test}"), &mut mine).await;
            let mut keep = Vec::new();
            let mut now = Vec::new();
            for (i, lock) in locks.into_iter().enumerate() {
                match i % 4 {
                    0 => now.push(lock),
                    1 => match bounded(redlock.extend(&lock, TTL)).await {
                        None => mine.hung.push(format!("runtime {test}: extend")),
                        // The old handle: behind the extension all the same.
                        Some(_) => keep.push(lock),
                    },
                    _ => keep.push(lock),
                }
            }
            // Unlocked at once: behind the requests still pending.
            let unlocking = {
                let redlock = redlock.clone();
                tokio::spawn(async move {
                    let mut seen = Seen::default();
                    unlock_all(&redlock, &now, "at once", &mut seen).await;
                    seen
                })
            };
            tokio::time::sleep(Duration::from_millis(50)).await;
            // Detached: dropped with the runtime if not done (a cancelled
            // unlock, whose requests already sent run on the nodes).
            drop(unlocking);
            (keep, mine)
        });
        let took = t.elapsed();
        entries = entries.max(finisher_entries(&redlock));
        // Dropped with requests to the paused node pending.
        drop(rt);
        eprintln!(
            "runtime {test}: the previous runtime's {} locks unlocked in {unlocked_in:?}; {} locks kept, {:?} on this runtime; {} hung, errors {:?}",
            previous.len(),
            locks.len(),
            took,
            pending.hung.len(),
            pending.errors.iter().take(3).collect::<Vec<_>>()
        );
        seen.add(pending);
        kept = locks;
        // Back while the next runtime unlocks, or after.
        resumer = Some(resume_after(
            pid,
            Duration::from_millis(if test % 2 == 0 { 300 } else { 1500 }),
        ));
        if !seen.hung.is_empty() {
            break;
        }
    }
    let rt = current_thread();
    rt.block_on(unlock_all(&redlock, &kept, "the last runtime's", &mut seen));
    if let Some(resumer) = resumer.take() {
        resumer.join().unwrap();
        cluster.node(4).resume();
    }
    // A later runtime still works, at once.
    let s = rt.block_on(cycle(&redlock, "after", 1));
    seen.add(s);
    let left = rt.block_on(left_after_settling(&cluster, &redlock, &seen.names));
    report("runtimes in sequence", &seen, &left);
    eprintln!("finisher entries at most {entries} at once, over 10 runtimes");
    assert_eq!(audit.panics(), 0, "a task panicked");
    assert!(
        entries <= 2,
        "the entries of runtimes that shut down are not pruned: {entries}"
    );
    assert!(seen.hung.is_empty(), "steps never ended: {:#?}", seen.hung);
    assert!(
        seen.granted * 5 >= seen.cycles * 4,
        "too few locks granted: {} of {}",
        seen.granted,
        seen.cycles
    );
    assert!(left.is_empty(), "keys left: {left:#?}");
}

/// How many runtimes the manager keeps a finisher entry for, as its
/// `Debug` output says (`Finishers { runtimes: N }`).
fn finisher_entries(redlock: &Redlock) -> usize {
    let debug = format!("{redlock:?}");
    let at = debug
        .find("Finishers { runtimes: ")
        .expect("the manager's Debug output names its finishers")
        + "Finishers { runtimes: ".len();
    debug[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a count of runtimes")
}

/// `count` resource names for [`lock_all`], every fourth a set of three.
fn names(topic: &str, count: usize) -> Vec<String> {
    (0..count)
        .map(|i| {
            let name = resource(&format!("{topic}-{i}"));
            if i % 4 == 3 { format!("{name}+") } else { name }
        })
        .collect()
}

/// Two runtimes alive at once around one manager: A (multi-thread, whose
/// connections B borrows, having none of its own) and B (current-thread,
/// or multi-thread with one worker), B dropped mid-wait.
///
/// Node 3 paused: A locks (its finisher holds leftovers), B locks (B's
/// finisher holds leftovers whose timers are B's), A unlocks B's locks
/// (behind B's requests to node 3), and B is dropped while those requests
/// are pending; A keeps locking meanwhile. A finisher that took another
/// runtime's leftovers would poll B's timers after B shut down: a panic.
///
/// Node 4 slow (replies 400 ms late): B locks and goes idle (a
/// current-thread runtime outside `block_on` runs nothing); A unlocks B's
/// locks, each answered behind B's `SET` on A's connection and then
/// waiting for B's request to settle, which B's finisher tells. B is
/// dropped: its leftovers are dropped with it, and A's unlocks must end.
///
/// Then a new runtime locks and unlocks at once; no task panicked, every
/// step ended, and no key is left.
///
/// A's unlocks wait for as long as B lives idle (a current-thread B runs
/// its finisher only inside `block_on`): printed, not asserted, as it was
/// so with the task spawned per round before the finisher.
///
/// Catches finishers not found by runtime (B's leftovers in A's finisher:
/// Tokio panics polling B's timers once B is gone), a finisher dropped
/// with its runtime that keeps its leftovers (A's unlocks wait for ever),
/// and a hand-off that does not poll the new leftover.
#[test]
fn two_runtimes_one_manager_one_dropped_mid_wait() {
    let audit = Audit::start();
    let mut cluster = Cluster::start(5);
    let proxy_rt = multi_thread();
    let (proxy, urls) = node_4_behind_a_proxy(&mut cluster, &proxy_rt);
    let redlock = Arc::new(build(&urls));
    let a = multi_thread();
    a.block_on(warm(&redlock));
    let pid = cluster.node(3).pid().expect("running");
    let mut seen = Seen::default();
    for round in 0..4usize {
        let b_runtime = || {
            if round % 2 == 0 {
                current_thread()
            } else {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .unwrap()
            }
        };
        let flavor = if round % 2 == 0 {
            "current-thread"
        } else {
            "multi-thread"
        };

        // Node 3 paused; B dropped with its requests there pending.
        cluster.node(3).pause();
        let resumer = resume_after(pid, Duration::from_millis(2500));
        let a_locks = a.block_on(lock_all(
            &redlock,
            &names(&format!("a-{round}"), 12),
            "A",
            &mut seen,
        ));
        let b = b_runtime();
        let b_locks = b.block_on(lock_all(
            &redlock,
            &names(&format!("b-{round}"), 24),
            "B",
            &mut seen,
        ));
        let unlocking = {
            let redlock = redlock.clone();
            a.spawn(async move {
                let mut seen = Seen::default();
                unlock_all(&redlock, &b_locks, "A unlocks B's (paused)", &mut seen).await;
                seen
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        let t = Instant::now();
        drop(b);
        let dropped_in = t.elapsed();
        let more = a.block_on(async {
            let cycles: Vec<_> = (0..10)
                .map(|i| {
                    let redlock = redlock.clone();
                    tokio::spawn(async move {
                        cycle(&redlock, &format!("a-more-{round}-{i}"), i % 5).await
                    })
                })
                .collect();
            let mut seen = Seen::default();
            for c in cycles {
                seen.add(c.await.unwrap());
            }
            seen
        });
        seen.add(more);
        seen.add(a.block_on(unlocking).unwrap());
        a.block_on(unlock_all(
            &redlock,
            &a_locks,
            "A unlocks its own",
            &mut seen,
        ));
        resumer.join().unwrap();
        cluster.node(3).resume();
        eprintln!(
            "round {round} (B {flavor}), node 3 paused: B dropped in {dropped_in:?} mid-wait; {} hung so far, panics {}",
            seen.hung.len(),
            audit.panics()
        );

        // Node 4 slow; B idle after its locks; A's unlocks wait for B's
        // requests to settle; B dropped.
        proxy.set(Fault::Latency(Duration::from_millis(400)));
        let b = b_runtime();
        let b_locks = b.block_on(lock_all(
            &redlock,
            &names(&format!("b-slow-{round}"), 24),
            "B",
            &mut seen,
        ));
        let count = b_locks.len();
        let ended = Arc::new(AtomicUsize::new(0));
        let unlocking = {
            let (redlock, ended) = (redlock.clone(), ended.clone());
            a.spawn(async move {
                let mut seen = Seen::default();
                futures::future::join_all(b_locks.iter().map(|lock| async {
                    let outcome = bounded(redlock.unlock(lock)).await;
                    ended.fetch_add(1, Ordering::SeqCst);
                    outcome
                }))
                .await
                .into_iter()
                .for_each(|outcome| match outcome {
                    None => seen.hung.push("A unlocks B's (slow): unlock".into()),
                    Some(Err(e)) => seen.errors.push(format!("A unlocks B's (slow): {e}")),
                    Some(Ok(_)) => {}
                });
                seen
            })
        };
        std::thread::sleep(Duration::from_millis(1500));
        let while_b_lives = ended.load(Ordering::SeqCst);
        let t = Instant::now();
        drop(b);
        let s = a.block_on(unlocking).unwrap();
        let after_drop = t.elapsed();
        proxy.set(Fault::NONE);
        eprintln!(
            "round {round} (B {flavor}), node 4 slow: {while_b_lives} of {} unlocks on A ended in the 1.5 s B lived after its locks; the rest within {after_drop:?} of B's drop; hung {}",
            count,
            s.hung.len()
        );
        seen.add(s);
        if !seen.hung.is_empty() {
            break;
        }
    }
    // A new runtime, at once.
    let c = current_thread();
    let s = c.block_on(cycle(&redlock, "c", 1));
    seen.add(s);
    drop(c);
    let left = a.block_on(left_after_settling(&cluster, &redlock, &seen.names));
    report("two runtimes", &seen, &left);
    assert_eq!(audit.panics(), 0, "a task panicked");
    assert!(seen.hung.is_empty(), "steps never ended: {:#?}", seen.hung);
    assert!(
        seen.granted * 5 >= seen.cycles * 4,
        "too few locks granted: {} of {}",
        seen.granted,
        seen.cycles
    );
    assert!(left.is_empty(), "keys left: {left:#?}");
}

/// `count` cycles in a row ([`cycle`], every kind in turn).
async fn cycles(redlock: &Redlock, topic: &str, count: usize) -> Seen {
    let mut seen = Seen::default();
    for i in 0..count {
        seen.add(cycle(redlock, &format!("{topic}-{i}"), i % 5).await);
        if !seen.hung.is_empty() {
            break;
        }
    }
    seen
}

/// Calls from `Runtime::block_on`'s thread, from three plain threads and
/// from three `spawn_blocking` threads (each in `Handle::block_on`) at
/// once, on a current-thread and on a multi-thread runtime: none of these
/// threads is a worker. The rounds of the first two, outside any task,
/// hand their leftovers to the finisher, whose task is spawned and woken
/// from them; those of `spawn_blocking` closures (tasks of the blocking
/// pool) spawn a task each, which goes through the runtime's shared queue. Node 4 slow (150 ms),
/// then node 3 paused (back after 600 ms, before the node timeout), then
/// node 4 blackholed (healed after 1.5 s). Each thread runs lock-and-step
/// cycles in a row, so that most hand-offs go to a finisher that is idle
/// (its leftovers done): a hand-off that does not wake it later loses the
/// leftover, and the next step on that lock waits for it for ever. Every
/// step must end, and no key may be left.
///
/// Catches a hand-off that does not poll the new leftover with the
/// finisher's waker (pushed alone, or polled with a waker that wakes
/// nobody).
#[test]
fn calls_from_block_on_and_spawn_blocking_threads() {
    let audit = Audit::start();
    let mut all = Seen::default();
    for multi in [false, true] {
        let mut cluster = Cluster::start(5);
        let proxy_rt = multi_thread();
        let (proxy, urls) = node_4_behind_a_proxy(&mut cluster, &proxy_rt);
        let proxy = Arc::new(proxy);
        let redlock = Arc::new(build(&urls));
        let rt = if multi {
            multi_thread()
        } else {
            current_thread()
        };
        rt.block_on(warm(&redlock));
        let pid = cluster.node(3).pid().expect("running");
        let mut seen = Seen::default();
        for phase in 0..3usize {
            let heal: Option<std::thread::JoinHandle<()>> = match phase {
                0 => {
                    proxy.set(Fault::Latency(Duration::from_millis(150)));
                    None
                }
                1 => {
                    cluster.node(3).pause();
                    Some(resume_after(pid, Duration::from_millis(600)))
                }
                _ => {
                    proxy.set(Fault::Blackhole);
                    let proxy = proxy.clone();
                    Some(std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_millis(1500));
                        proxy.set(Fault::NONE);
                    }))
                }
            };
            let s = rt.block_on(async {
                let blocking: Vec<_> = (0..3)
                    .map(|thread| {
                        let redlock = redlock.clone();
                        tokio::task::spawn_blocking(move || {
                            tokio::runtime::Handle::current().block_on(cycles(
                                &redlock,
                                &format!("blocking-{multi}-{phase}-{thread}"),
                                10,
                            ))
                        })
                    })
                    .collect();
                // Plain threads in `Handle::block_on`: outside any task,
                // so their rounds hand their leftovers to the finisher, from
                // several threads at once (a `spawn_blocking` closure runs
                // as a task, and its rounds spawn).
                let plain: Vec<_> = (0..3)
                    .map(|thread| {
                        let redlock = redlock.clone();
                        let handle = tokio::runtime::Handle::current();
                        let (done, seen) = tokio::sync::oneshot::channel();
                        std::thread::spawn(move || {
                            let _ = done.send(handle.block_on(cycles(
                                &redlock,
                                &format!("plain-{multi}-{phase}-{thread}"),
                                10,
                            )));
                        });
                        seen
                    })
                    .collect();
                let mut seen = cycles(&redlock, &format!("block-on-{multi}-{phase}"), 10).await;
                for b in blocking {
                    seen.add(b.await.unwrap());
                }
                for p in plain {
                    seen.add(p.await.expect("a plain thread's calls ended"));
                }
                seen
            });
            if let Some(heal) = heal {
                heal.join().unwrap();
            }
            if phase == 1 {
                cluster.node(3).resume();
            }
            proxy.set(Fault::NONE);
            report(
                &format!(
                    "{} runtime, phase {phase}",
                    if multi {
                        "multi-thread"
                    } else {
                        "current-thread"
                    }
                ),
                &s,
                &[],
            );
            seen.add(s);
            if !seen.hung.is_empty() {
                break;
            }
        }
        let left = rt.block_on(left_after_settling(&cluster, &redlock, &seen.names));
        report(
            if multi {
                "multi-thread runtime"
            } else {
                "current-thread runtime"
            },
            &seen,
            &left,
        );
        all.add(seen);
        for k in left {
            all.hung.push(format!("key left: {k}"));
        }
        drop(redlock);
        drop(rt);
        drop(proxy);
        drop(proxy_rt);
        if !all.hung.is_empty() {
            break;
        }
    }
    assert_eq!(audit.panics(), 0, "a task panicked");
    assert!(
        all.hung.is_empty(),
        "steps never ended, or keys left: {:#?}",
        all.hung
    );
    assert!(
        all.granted * 5 >= all.cycles * 4,
        "too few locks granted: {} of {}",
        all.granted,
        all.cycles
    );
}

/// A runtime of its own for the tests that count its tasks.
fn dedicated(multi: bool) -> tokio::runtime::Runtime {
    if multi {
        multi_thread()
    } else {
        current_thread()
    }
}

/// Waits, driving `rt`, until it has at most `tasks` tasks alive, for at
/// most `within`: how long that took, or `None`.
fn tasks_down_to(rt: &tokio::runtime::Runtime, tasks: usize, within: Duration) -> Option<Duration> {
    let metrics = rt.handle().metrics();
    rt.block_on(async {
        let t = Instant::now();
        while metrics.num_alive_tasks() > tasks {
            if t.elapsed() > within {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Some(t.elapsed())
    })
}

/// The CPU time this process used so far, on all its threads (user and
/// system): a measure of work that a loaded machine does not stretch the
/// way it stretches wall-clock time.
fn cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` fills the struct it is given; zeroed, it is a
    // valid `rusage` either way.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1_000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// The names of a lock on `count` resources.
fn set_of(topic: &str, count: usize) -> Vec<String> {
    let base = resource(topic);
    (0..count).map(|i| format!("{base}:{i}")).collect()
}

/// Where a burst's lockers run: as tasks of their own (a round's leftover
/// then gets a task of its own), or as futures joined on `block_on`'s
/// thread (it goes to the manager's finisher).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Callers {
    Tasks,
    BlockOn,
}

/// A burst of locks: 200 lockers take `each` locks each, and four more take
/// a lock on 1,000 resources each. Behind paused node 4, every round
/// leaves its request there pending. Returns the locks and what the burst
/// saw.
async fn burst(
    redlock: &Arc<Redlock>,
    topic: &str,
    each: usize,
    from: Callers,
) -> (Vec<Lock>, Seen) {
    let lockers = (0..204usize).map(|locker| {
        let redlock = redlock.clone();
        let topic = format!("{topic}-{locker}");
        async move {
            let mut seen = Seen::default();
            let mut locks = Vec::new();
            let sets: Vec<Vec<String>> = if locker < 200 {
                (0..each)
                    .map(|i| vec![resource(&format!("{topic}-{i}"))])
                    .collect()
            } else {
                vec![set_of(&topic, redlock_quorum::MAX_RESOURCES)]
            };
            for set in sets {
                seen.cycles += 1;
                seen.names.extend(set.iter().cloned());
                let refs: Vec<&str> = set.iter().map(String::as_str).collect();
                match bounded(redlock.try_lock(refs, TTL)).await {
                    None => seen.hung.push(format!("{topic}: lock")),
                    Some(Err(e)) => seen.errors.push(format!("{topic}: lock {e}")),
                    Some(Ok(lock)) => {
                        seen.granted += 1;
                        locks.push(lock);
                    }
                }
            }
            (locks, seen)
        }
    });
    let outcomes = match from {
        Callers::Tasks => {
            let tasks: Vec<_> = lockers.map(tokio::spawn).collect();
            futures::future::join_all(tasks)
                .await
                .into_iter()
                .map(Result::unwrap)
                .collect::<Vec<_>>()
        }
        Callers::BlockOn => futures::future::join_all(lockers).await,
    };
    let mut locks = Vec::new();
    let mut seen = Seen::default();
    for (l, s) in outcomes {
        locks.extend(l);
        seen.add(s);
    }
    (locks, seen)
}

/// Thousands of leftovers pending at once behind paused node 4, from 200
/// lockers, with four locks on 1,000 resources among them (whose requests
/// get a second more), on a runtime of the test's own. The lockers run as
/// futures on `block_on`'s thread (their rounds' leftovers go to the
/// manager's finisher) and, by turns, as tasks (each leftover gets a task
/// of its own):
/// - a manager with a node timeout of 5 s, dropped right after a burst of
///   5,000 locks, all of whose requests to node 4 are pending at once:
///   from `block_on`, one finisher task holds them all (right after the
///   burst the runtime has no more tasks than before it but that one; a
///   task or a finisher per round would leave 5,000); the burst costs no
///   more CPU time than a few times a reference burst with every node up,
///   made from the same place (a finisher that polls every leftover at
///   each hand-off costs in the square of the leftovers pending); and
///   every leftover settles, about the node timeout after the last lock,
///   and with them every task of the manager;
/// - a manager (node timeout 1 s) that lives on through three bursts of
///   2,000 locks, each unlocked behind the paused node and the node back
///   afterwards: every unlock ends (a lock on 1,000 resources waits for its
///   set's request to settle, 2 s, first), no key is left, and the heap
///   and the task count come back to the same level after each burst (the
///   leftovers and their finisher's bookkeeping freed).
///
/// Catches a finisher per round (a task per hand-off from `block_on`: 5,000
/// tasks after the burst), a finisher that polls every leftover at each
/// hand-off or wake-up (the burst's CPU time several times the
/// reference's), and a hand-off that does not poll the new leftover (the
/// unlocks wait for ever).
#[test]
fn thousands_of_leftovers_behind_a_paused_node_settle_within_the_node_timeout() {
    let audit = Audit::start();
    let mut cluster = Cluster::start(5);
    let rt = dedicated(true);
    let metrics = rt.handle().metrics();
    let mut all = Seen::default();

    let long = Duration::from_secs(5);
    // The work (CPU time) of a burst with every node up, from each place:
    // its rounds leave requests pending for a moment only.
    let reference = |from: Callers| {
        let redlock = Arc::new(build_with(cluster.urls(), long));
        rt.block_on(warm(&redlock));
        let (cpu, t) = (cpu_time(), Instant::now());
        let (locks, seen) = rt.block_on(burst(&redlock, &format!("reference-{from:?}"), 25, from));
        let (cpu, took) = (cpu_time() - cpu, t.elapsed());
        eprintln!(
            "reference burst from {from:?}, every node up: {} locks in {took:?}, {cpu:?} of CPU",
            seen.granted
        );
        assert!(
            seen.granted * 10 >= seen.cycles * 9,
            "too few locks: {} of {}",
            seen.granted,
            seen.cycles
        );
        drop(locks);
        drop(redlock);
        assert!(tasks_down_to(&rt, 0, Duration::from_secs(60)).is_some());
        flush_all(&cluster);
        cpu
    };
    let references = [reference(Callers::BlockOn), reference(Callers::Tasks)];

    // A manager dropped right after a burst.
    for (wave, from) in [Callers::BlockOn, Callers::Tasks].into_iter().enumerate() {
        let reference = references[wave];
        // A burst behind the paused node may cost a few times the
        // reference (its leftovers' timers, the finisher's bookkeeping),
        // not the tenfold of a finisher whose every hand-off or wake-up
        // polls every leftover.
        let bound = reference * 4 + Duration::from_millis(250);
        let redlock = Arc::new(build_with(cluster.urls(), long));
        rt.block_on(warm(&redlock));
        let tasks_before = metrics.num_alive_tasks();
        cluster.node(4).pause();
        let (cpu, t) = (cpu_time(), Instant::now());
        let (locks, seen) = rt.block_on(burst(&redlock, &format!("dropped-{wave}"), 25, from));
        let (cpu, burst_took) = (cpu_time() - cpu, t.elapsed());
        let tasks_after = metrics.num_alive_tasks();
        drop(locks);
        drop(redlock);
        let settled_in = tasks_down_to(&rt, 0, Duration::from_secs(60));
        cluster.node(4).resume();
        eprintln!(
            "dropped manager, wave {wave} from {from:?}: {} locks in {burst_took:?}, {cpu:?} of CPU ({:.2}x the reference); tasks {tasks_before} before the burst, {tasks_after} after; every task ended {settled_in:?} after the manager was dropped",
            seen.granted,
            cpu.as_secs_f64() / reference.as_secs_f64()
        );
        assert!(
            cpu <= bound,
            "a burst behind the paused node cost {cpu:?} of CPU, against {reference:?} with every node up"
        );
        seen.assert_ended_and_granted();
        if from == Callers::BlockOn {
            assert!(
                tasks_after <= tasks_before + 2,
                "one finisher holds the burst's leftovers: {tasks_before} tasks before, {tasks_after} after"
            );
        }
        assert!(
            settled_in.is_some(),
            "the leftovers never ended: {} tasks alive a minute after the manager was dropped",
            metrics.num_alive_tasks()
        );
        flush_all(&cluster);
    }

    // A manager that lives on.
    let redlock = Arc::new(build(cluster.urls()));
    rt.block_on(warm(&redlock));
    let mut heap = Vec::new();
    let mut tasks = Vec::new();
    for (wave, from) in [Callers::BlockOn, Callers::Tasks, Callers::BlockOn]
        .into_iter()
        .enumerate()
    {
        cluster.node(4).pause();
        let (cpu, t) = (cpu_time(), Instant::now());
        let (locks, seen) = rt.block_on(burst(&redlock, &format!("kept-{wave}"), 10, from));
        let (cpu, burst_took) = (cpu_time() - cpu, t.elapsed());
        let peak = live_heap();
        let t = Instant::now();
        let unlocked = rt.block_on(async {
            let mut unlocked = Seen::default();
            let slowest = Arc::new(Mutex::new(Duration::ZERO));
            let redlock = &redlock;
            let outcomes = futures::future::join_all(locks.iter().map(|lock| {
                let slowest = slowest.clone();
                async move {
                    let t = Instant::now();
                    let outcome = bounded(redlock.unlock(lock)).await;
                    let mut slowest = slowest.lock().unwrap();
                    *slowest = slowest.max(t.elapsed());
                    outcome
                }
            }))
            .await;
            for outcome in outcomes {
                match outcome {
                    None => unlocked.hung.push(format!("wave {wave}: unlock")),
                    Some(Err(e)) => unlocked.errors.push(format!("wave {wave}: unlock {e}")),
                    Some(Ok(_)) => {}
                }
            }
            unlocked.slowest = *slowest.lock().unwrap();
            unlocked
        });
        let unlock_took = t.elapsed();
        cluster.node(4).resume();
        let left = rt.block_on(left_after_settling(&cluster, &redlock, &seen.names));
        drop(locks);
        // Every leftover long settled, and the owed releases drained.
        heap.push(live_heap());
        tasks.push(metrics.num_alive_tasks());
        eprintln!(
            "kept manager, wave {wave} from {from:?}: {} locks in {burst_took:?}, {cpu:?} of CPU; unlocked behind the paused node in {unlock_took:?} (slowest {:?}); heap {} KiB at the peak, {} KiB after; tasks after {}; keys left {}",
            seen.granted,
            unlocked.slowest,
            peak / 1024,
            live_heap() / 1024,
            metrics.num_alive_tasks(),
            left.len()
        );
        // Counted, not kept: the heap is compared from burst to burst.
        all.cycles += seen.cycles;
        all.granted += seen.granted;
        all.hung.extend(seen.hung);
        all.errors.extend(seen.errors);
        drop(seen.names);
        all.hung.extend(unlocked.hung);
        all.hung
            .extend(left.iter().map(|k| format!("wave {wave}: key left {k}")));
        if !all.hung.is_empty() {
            break;
        }
        flush_all(&cluster);
    }
    assert_eq!(audit.panics(), 0, "a task panicked");
    all.assert_ended_and_granted();
    let first = heap[0];
    for (wave, &h) in heap.iter().enumerate() {
        assert!(
            h <= first + 4 * 1024 * 1024,
            "the heap grew from burst to burst: {heap:?} (wave {wave})"
        );
    }
    assert!(
        tasks.iter().all(|&t| t <= tasks[0] + 2),
        "tasks left from burst to burst: {tasks:?}"
    );
    drop(redlock);
    assert!(
        tasks_down_to(&rt, 0, Duration::from_secs(60)).is_some(),
        "tasks alive after the manager was dropped: {}",
        metrics.num_alive_tasks()
    );
}

/// The manager dropped, on a runtime of the test's own (both kinds): with
/// leftovers pending behind paused node 4, and with a finisher that is
/// idle (its leftovers done, node 4 back). Either way the finisher's task
/// ends, and with it every task the manager had: the runtime's
/// `num_alive_tasks` goes back to 0 (within about the node timeout when
/// leftovers were pending). A finisher the drop does not close, or does
/// not wake when idle, stays parked for ever.
///
/// Catches a manager's drop that does not close its finishers (every
/// case), and one that closes them without waking them (the idle cases).
#[test]
fn the_finisher_task_ends_with_the_manager() {
    let audit = Audit::start();
    let mut cluster = Cluster::start(5);
    let mut failures = Vec::new();
    for multi in [false, true] {
        for pending in [true, false] {
            let rt = dedicated(multi);
            let metrics = rt.handle().metrics();
            let redlock = Arc::new(build(cluster.urls()));
            rt.block_on(warm(&redlock));
            cluster.node(4).pause();
            let mut seen = Seen::default();
            let locks = rt.block_on(lock_all(&redlock, &names("dropped", 20), "lock", &mut seen));
            if !pending {
                cluster.node(4).resume();
                // Its leftovers answered: the finisher is parked, idle.
                rt.block_on(async { tokio::time::sleep(Duration::from_millis(500)).await });
            }
            let tasks = metrics.num_alive_tasks();
            drop(locks);
            drop(redlock);
            let ended = tasks_down_to(&rt, 0, Duration::from_secs(30));
            if pending {
                cluster.node(4).resume();
            }
            let what = format!(
                "{} runtime, {}",
                if multi {
                    "multi-thread"
                } else {
                    "current-thread"
                },
                if pending {
                    "leftovers pending"
                } else {
                    "finisher idle"
                }
            );
            eprintln!(
                "{what}: {} locks; {tasks} tasks when the manager was dropped; all ended after {ended:?}",
                seen.granted
            );
            if seen.granted < 18 || !seen.hung.is_empty() {
                failures.push(format!("{what}: locks {seen:?}"));
            }
            if ended.is_none() {
                failures.push(format!(
                    "{what}: {} tasks still alive 30 s after the manager was dropped",
                    metrics.num_alive_tasks()
                ));
            }
            flush_all(&cluster);
        }
    }
    assert_eq!(audit.panics(), 0, "a task panicked");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// What the finisher is for: the requests a round leaves pending at a
/// quorum still reach the slower node. Node 4 paused, its script cache
/// flushed, back after 300 ms (well before the requests' deadline: the
/// node timeout is 3 s here, so that a loaded machine makes it): locks on
/// three resources (a script, answered `NOSCRIPT` there and sent again)
/// and extensions of single locks to a longer ttl (a script too, queued
/// behind the lock's `SET`) must land on node 4, once it is back, from the
/// finisher. A finisher that drops what it is handed (or a round that
/// drops its leftovers at a quorum) leaves node 4 without them. Then every
/// lock is unlocked and no key may be left.
///
/// Catches a hand-off that drops the leftover.
#[test]
fn the_requests_left_at_a_quorum_reach_the_slow_node() {
    let audit = Audit::start();
    let mut cluster = Cluster::start(5);
    let rt = multi_thread();
    let redlock = Arc::new(build_with(cluster.urls(), Duration::from_secs(3)));
    rt.block_on(warm(&redlock));
    let pid = cluster.node(4).pid().expect("running");
    let mut seen = Seen::default();
    let mut missing = Vec::new();
    for round in 0..4usize {
        script_flush(&cluster.urls()[4]);
        cluster.node(4).pause();
        let resumer = resume_after(pid, Duration::from_millis(300));
        let (sets, singles, extended, mine) = rt.block_on(async {
            let mut mine = Seen::default();
            let set_names: Vec<String> = (0..8)
                .map(|i| format!("{}+", resource(&format!("reach-set-{round}-{i}"))))
                .collect();
            let single_names: Vec<String> = (0..8)
                .map(|i| resource(&format!("reach-one-{round}-{i}")))
                .collect();
            let sets = lock_all(&redlock, &set_names, "sets", &mut mine).await;
            let singles = lock_all(&redlock, &single_names, "singles", &mut mine).await;
            let mut extended = Vec::new();
            for lock in &singles {
                match bounded(redlock.extend(lock, TTL * 2)).await {
                    None => mine.hung.push("extend".into()),
                    Some(Err(e)) => mine.errors.push(format!("extend {e}")),
                    Some(Ok(e)) => extended.push(e),
                }
            }
            (sets, singles, extended, mine)
        });
        seen.add(mine);
        resumer.join().unwrap();
        cluster.node(4).resume();
        // Past the requests' deadline.
        std::thread::sleep(Duration::from_millis(3500));
        for lock in &sets {
            for res in lock.resources() {
                if !cluster.exists_on(4, res) {
                    missing.push(format!("round {round}: {res} (a set's) not on node 4"));
                }
            }
        }
        for lock in &extended {
            for res in lock.resources() {
                let pttl = cluster.pttl_on(4, res);
                if pttl < TTL.as_millis() as i64 + 10_000 {
                    missing.push(format!(
                        "round {round}: {res} not extended on node 4 (pttl {pttl})"
                    ));
                }
            }
        }
        rt.block_on(unlock_all(&redlock, &sets, "sets", &mut seen));
        // (The extensions are the same locks as `singles`.)
        rt.block_on(unlock_all(&redlock, &extended, "extended", &mut seen));
        drop(singles);
        eprintln!(
            "round {round}: {} sets, {} extended; missing on node 4 so far {}",
            sets.len(),
            extended.len(),
            missing.len()
        );
    }
    let left = rt.block_on(left_after_settling(&cluster, &redlock, &seen.names));
    report("reach the slow node", &seen, &left);
    assert_eq!(audit.panics(), 0, "a task panicked");
    assert!(seen.hung.is_empty(), "steps never ended: {:#?}", seen.hung);
    assert!(
        seen.granted * 5 >= seen.cycles * 4,
        "too few locks: {} of {}",
        seen.granted,
        seen.cycles
    );
    assert!(
        missing.is_empty(),
        "writes that never reached node 4: {missing:#?}"
    );
    assert!(left.is_empty(), "keys left: {left:#?}");
}
