//! The bench's global allocator: counts live heap bytes (and their peak),
//! for the memory cost of a guard (scenario 7) and of a waiter (6e).

use std::sync::atomic::Ordering;

/// Counts live heap bytes, for the memory cost of a guard (exact, unlike the
/// resident set, which the allocator's reuse of freed memory blurs).
pub(crate) struct Counting;

pub(crate) static LIVE_BYTES: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// The most `LIVE_BYTES` has been since the last [`reset_peak`].
static PEAK_BYTES: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

fn grew(by: i64) {
    let now = LIVE_BYTES.fetch_add(by, Ordering::Relaxed) + by;
    PEAK_BYTES.fetch_max(now, Ordering::Relaxed);
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
        LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
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
    LIVE_BYTES.load(Ordering::Relaxed) as f64
}

/// The peak of the live heap since the last [`reset_peak`].
pub(crate) fn peak_bytes() -> f64 {
    PEAK_BYTES.load(Ordering::Relaxed) as f64
}

/// Starts a new peak from the live heap now.
pub(crate) fn reset_peak() {
    PEAK_BYTES.store(LIVE_BYTES.load(Ordering::Relaxed), Ordering::Relaxed);
}
