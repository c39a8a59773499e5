//! The basics: take a lock, use it within its validity, release it.
//!
//! ```sh
//! REDLOCK_NODES=redis://127.0.0.1:7001/,redis://127.0.0.1:7002/,... \
//!     cargo run --example basic
//! ```

use std::time::Duration;

use redlock_quorum::{Error, Redlock};

/// `REDLOCK_NODES` (comma-separated URLs), or five local nodes.
fn nodes() -> Vec<String> {
    match std::env::var("REDLOCK_NODES") {
        Ok(list) => redlock_quorum::split_node_list(&list),
        Err(_) => (7001..=7005)
            .map(|port| format!("redis://127.0.0.1:{port}/"))
            .collect(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let redlock = Redlock::new(nodes())?;
    // Waits up to 2 s for another holder to let go.
    let lock = redlock
        .lock_within(
            "invoice:42",
            Duration::from_secs(10),
            Duration::from_secs(2),
        )
        .await?;
    println!(
        "locked {} with {:?} of validity",
        lock.resources().collect::<Vec<_>>().join(", "),
        lock.validity()
    );
    // ... the work, checking lock.validity() before each step ...
    let released = redlock.unlock(&lock).await?;
    println!("released on {released} of {} nodes", redlock.node_count());
    Ok(())
}
