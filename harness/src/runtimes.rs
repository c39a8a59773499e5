//! The Tokio runtimes the tests that build their own (one per test, or
//! one after another) use.

/// A multi-thread runtime of two workers, every driver on.
///
/// # Panics
/// When the runtime cannot be built.
pub fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A current-thread runtime, every driver on.
///
/// # Panics
/// When the runtime cannot be built.
pub fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}
