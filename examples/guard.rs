//! Work that outlasts its lock's ttl, kept alive by the watchdog: a 3-second
//! task under a 1-second ttl. The work checks that the lock is still held
//! before each step; if the lock is lost, `with_lock` cancels it.
//!
//! ```sh
//! REDLOCK_NODES=redis://127.0.0.1:7001/,... cargo run --example guard
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
    let outcome = redlock
        .with_lock("reindex", Duration::from_secs(1), |watch| async move {
            for step in 0..10 {
                // Before each step that needs the lock: is it still ours?
                if !watch.is_held() {
                    return Err(step);
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
                println!(
                    "step {step} done; {} renewals, {:?} of validity left",
                    watch.renewals(),
                    watch.validity()
                );
            }
            Ok(())
        })
        .await;
    match outcome {
        Ok(Ok(())) => println!("all steps done; lock released"),
        Ok(Err(step)) => println!("gave up at step {step}: the lock was lost"),
        Err(Error::LockLost { reason, .. }) => println!("cancelled: {reason}"),
        Err(e) => return Err(e),
    }
    Ok(())
}
