//! The bench's global allocator: counts live heap bytes, for the memory
//! cost of a guard (scenario 7).

use std::sync::atomic::Ordering;

/// Counts live heap bytes, for the memory cost of a guard (exact, unlike the
/// resident set, which the allocator's reuse of freed memory blurs).
pub(crate) struct Counting;

pub(crate) static LIVE_BYTES: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

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
pub(crate) static GLOBAL: Counting = Counting;

pub(crate) fn live_bytes() -> f64 {
    LIVE_BYTES.load(Ordering::Relaxed) as f64
}
