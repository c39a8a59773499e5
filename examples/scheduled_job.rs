//! A scheduled job that every instance of a service starts at the same
//! minute, and exactly one runs. Start it in several terminals at once:
//!
//! ```sh
//! REDLOCK_NODES=redis://127.0.0.1:7001/,redis://127.0.0.1:7002/,... \
//!     cargo run --example scheduled_job
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

async fn send_daily_report() {
    tokio::time::sleep(Duration::from_millis(500)).await;
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let redlock = Redlock::new(nodes())?;
    // One key per slot of the schedule (here: this minute; a real scheduler
    // passes the slot it fired for). The ttl outlasts the slot.
    let minute = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 60;
    let resource = format!("job:daily-report:{minute}");

    // One attempt: if another instance has the slot, this one has nothing
    // to do. The guard renews the lock while the job runs.
    match redlock
        .try_acquire(&resource, Duration::from_secs(120))
        .await
    {
        Ok(guard) => {
            println!("{resource}: running the job");
            send_daily_report().await;
            if let Some(reason) = guard.loss() {
                eprintln!("{resource}: the lock was lost while the job ran: {reason}");
            }
            // Not released: the key lives on until its ttl, so an instance
            // whose timer fires late in this slot does not run the job again.
            guard.forget();
            println!("{resource}: done");
        }
        Err(Error::Conflict { .. }) => println!("{resource}: another instance has it; skipping"),
        Err(e) => return Err(e),
    }
    Ok(())
}
