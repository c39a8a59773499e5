//! The bench's global allocator: counts live heap bytes (and, while a
//! memory scenario asks for it, their peak), for the memory cost of a guard
//! (scenario 7) and of a waiter (6e).
//!
//! The count must not weigh on what the other scenarios time. One counter
//! that every thread adds to on every allocation moved its cache line
//! between the cores each time: in a profile of scenario 5's loop, the
//! counting was about a fifth of the samples of our node request's future,
//! and it charged each subject by its number of allocations, which a user's
//! allocator does not. So the live bytes are kept in shards, one per thread
//! (in turn, as the crate's own counters are), each on cache lines of its
//! own, and summed when read. The peak is followed only between
//! [`reset_peak`] and [`stop_peak`], with one exact counter that every
//! allocation and free updates while it is followed: a sum of the shards
//! read one after another can count a block's allocation on one shard and
//! miss its free on another (a peak gigabytes too high, found by the
//! audit of `tests/tenth_pass_audit.rs`).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};

/// Counts live heap bytes, for the memory cost of a guard (exact, unlike the
/// resident set, which the allocator's reuse of freed memory blurs).
pub(crate) struct Counting;

/// Shards of the live-byte count.
const SHARDS: usize = 16;

/// One thread's share of the live bytes (its allocations less its frees,
/// which may be negative: memory freed by another thread than the one that
/// allocated it).
#[repr(align(128))]
struct Shard(AtomicI64);

static LIVE: [Shard; SHARDS] = [const { Shard(AtomicI64::new(0)) }; SHARDS];

/// The most the live bytes have been since the last [`reset_peak`], while
/// [`TRACKING`].
static PEAK_BYTES: AtomicI64 = AtomicI64::new(0);

/// Whether allocations and frees update [`EXACT`] and [`PEAK_BYTES`].
static TRACKING: AtomicBool = AtomicBool::new(false);

/// The live bytes while [`TRACKING`]: the shards' sum when it began, then
/// every allocation and free since, in one counter.
static EXACT: AtomicI64 = AtomicI64::new(0);

/// This thread's shard, given in turn at its first allocation. A constant
/// initialiser without a destructor: reading it never allocates, and works
/// while the thread ends.
fn shard() -> &'static AtomicI64 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    let index = INDEX.with(|i| {
        if i.get() == usize::MAX {
            i.set(NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS);
        }
        i.get()
    });
    &LIVE[index].0
}

fn grew(by: i64) {
    shard().fetch_add(by, Ordering::Relaxed);
    if TRACKING.load(Ordering::Relaxed) {
        let now = EXACT.fetch_add(by, Ordering::Relaxed) + by;
        PEAK_BYTES.fetch_max(now, Ordering::Relaxed);
    }
}

fn live() -> i64 {
    LIVE.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
}

// SAFETY: every call is forwarded unchanged to the system allocator; only a
// counter is updated beside it.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        grew(layout.size() as i64);
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        shard().fetch_sub(layout.size() as i64, Ordering::Relaxed);
        if TRACKING.load(Ordering::Relaxed) {
            EXACT.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        grew(new as i64 - layout.size() as i64);
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
pub(crate) static GLOBAL: Counting = Counting;

pub(crate) fn live_bytes() -> f64 {
    live() as f64
}

/// The peak of the live heap since the last [`reset_peak`].
pub(crate) fn peak_bytes() -> f64 {
    PEAK_BYTES.load(Ordering::Relaxed) as f64
}

/// Starts a new peak from the live heap now, and follows it until
/// [`stop_peak`].
pub(crate) fn reset_peak() {
    let now = live();
    EXACT.store(now, Ordering::Relaxed);
    PEAK_BYTES.store(now, Ordering::Relaxed);
    TRACKING.store(true, Ordering::Relaxed);
}

/// Stops following the peak ([`peak_bytes`] keeps the last one).
pub(crate) fn stop_peak() {
    TRACKING.store(false, Ordering::Relaxed);
}

/// Checks the count at the bench's start (the bench has no test harness):
/// bytes allocated on one thread and freed on another cancel out in the
/// sum, and the peak follows only between [`reset_peak`] and [`stop_peak`].
/// Panics otherwise.
pub(crate) fn self_check() {
    let before = live_bytes();
    let block = std::thread::spawn(|| vec![0u8; 1 << 20]).join().unwrap();
    let grown = live_bytes() - before;
    assert!(grown >= (1 << 20) as f64, "heap count: grew {grown}");
    drop(block);
    let after = live_bytes() - before;
    assert!(after < (1 << 19) as f64, "heap count: {after} left");
    reset_peak();
    let start = peak_bytes();
    let big = std::hint::black_box(vec![1u8; 4 << 20]);
    assert!(
        peak_bytes() - start >= (4 << 20) as f64,
        "heap count: no peak"
    );
    drop(big);
    stop_peak();
    let stopped = peak_bytes();
    let again = std::hint::black_box(vec![1u8; 8 << 20]);
    assert_eq!(
        peak_bytes(),
        stopped,
        "heap count: the peak moved while stopped"
    );
    drop(again);
}
