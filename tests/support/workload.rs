//! The contending-client workload of the fault tests: each client acquires
//! one resource, holds it for a random short time inside a critical section,
//! and releases it, recording everything for the [`Checker`]. Clients run as
//! tasks of the test process and as separate OS processes (the test binary
//! re-run as a child, which prints its records for [`Checker::ingest`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::RngExt;
use redlock_quorum::{Error, Redlock};

use super::checker::{self, Checker};

/// What the clients do.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Node URLs.
    pub urls: Vec<String>,
    /// The one resource they contend for.
    pub resource: String,
    /// Lock ttl.
    pub ttl: Duration,
    /// Hold time range, milliseconds.
    pub hold_ms: (u64, u64),
    /// Hold under a renewing guard (`with_lock`) instead of lock/unlock.
    pub watchdog: bool,
    /// How long to keep contending.
    pub duration: Duration,
}

/// Where a client's records go.
#[derive(Debug, Clone)]
pub enum Sink {
    /// Straight into a checker in this process.
    Checker(Arc<Checker>),
    /// Printed as lines on stdout, for a parent process.
    Print,
}

impl Sink {
    fn section(&self, holder: &str, enter: bool) {
        match self {
            Sink::Checker(c) => c.section(holder, enter),
            Sink::Print => println!("{}", checker::line_section(holder, enter)),
        }
    }

    fn window(&self, holder: &str, token: &str, granted: Instant, ended: Instant) {
        match self {
            Sink::Checker(c) => c.record(holder, token, granted, ended),
            Sink::Print => {
                let (granted, ended) = checker::mono_window(granted, ended);
                println!("{}", checker::line_window(holder, token, granted, ended));
            }
        }
    }
}

/// What one client did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    /// Locks granted.
    pub acquisitions: u64,
    /// Attempts that failed (conflict, no quorum, lost).
    pub failures: u64,
}

/// Records the end of a critical section and of the window when dropped, so
/// that work cancelled by `with_lock` (on loss) still records both.
struct Inside {
    sink: Sink,
    holder: String,
    token: String,
    granted: Instant,
    deadline: Box<dyn Fn() -> Instant + Send>,
}

impl Drop for Inside {
    fn drop(&mut self) {
        let now = Instant::now();
        self.sink.section(&self.holder, false);
        let ended = now.min((self.deadline)()).max(self.granted);
        self.sink
            .window(&self.holder, &self.token, self.granted, ended);
    }
}

/// One client's loop.
pub async fn contend(redlock: Redlock, holder: String, plan: Plan, sink: Sink) -> Tally {
    let mut tally = Tally::default();
    let end = Instant::now() + plan.duration;
    while Instant::now() < end {
        let hold = Duration::from_millis(rand::rng().random_range(plan.hold_ms.0..=plan.hold_ms.1));
        let outcome = if plan.watchdog {
            let (sink, holder) = (sink.clone(), holder.clone());
            redlock
                .with_lock(&plan.resource, plan.ttl, |watch| async move {
                    let granted = Instant::now();
                    sink.section(&holder, true);
                    let token = watch.lock().token().to_owned();
                    let w = watch.clone();
                    let _inside = Inside {
                        sink: sink.clone(),
                        holder: holder.clone(),
                        token,
                        granted,
                        deadline: Box::new(move || w.expires_at()),
                    };
                    tokio::time::sleep(hold).await;
                })
                .await
        } else {
            match redlock.lock(&plan.resource, plan.ttl).await {
                Ok(lock) => {
                    let granted = Instant::now();
                    sink.section(&holder, true);
                    {
                        let expires = lock.expires_at();
                        let _inside = Inside {
                            sink: sink.clone(),
                            holder: holder.clone(),
                            token: lock.token().to_owned(),
                            granted,
                            deadline: Box::new(move || expires),
                        };
                        tokio::time::sleep(hold).await;
                    }
                    let _ = redlock.unlock(&lock).await;
                    Ok(())
                }
                Err(e) => Err(e),
            }
        };
        match outcome {
            Ok(()) => tally.acquisitions += 1,
            Err(Error::LockLost { .. }) => {
                tally.acquisitions += 1;
                tally.failures += 1;
            }
            Err(_) => {
                tally.failures += 1;
                let backoff = Duration::from_millis(rand::rng().random_range(1..=10));
                tokio::time::sleep(backoff).await;
            }
        }
    }
    tally
}

/// The environment variables that carry a [`Plan`] to a child process.
pub fn plan_env(plan: &Plan, holder: &str) -> Vec<(String, String)> {
    vec![
        ("REDLOCK_CHILD_URLS".into(), plan.urls.join(",")),
        ("REDLOCK_CHILD_RESOURCE".into(), plan.resource.clone()),
        (
            "REDLOCK_CHILD_TTL_MS".into(),
            plan.ttl.as_millis().to_string(),
        ),
        (
            "REDLOCK_CHILD_HOLD_MS".into(),
            format!("{}-{}", plan.hold_ms.0, plan.hold_ms.1),
        ),
        (
            "REDLOCK_CHILD_WATCHDOG".into(),
            u8::from(plan.watchdog).to_string(),
        ),
        (
            "REDLOCK_CHILD_MS".into(),
            plan.duration.as_millis().to_string(),
        ),
        ("REDLOCK_CHILD_HOLDER".into(), holder.to_owned()),
    ]
}

/// The [`Plan`] and holder name a child process was given, if it is one.
pub fn plan_from_env() -> Option<(Plan, String)> {
    let get = |k: &str| std::env::var(k).ok();
    let hold = get("REDLOCK_CHILD_HOLD_MS")?;
    let (lo, hi) = hold.split_once('-')?;
    Some((
        Plan {
            urls: get("REDLOCK_CHILD_URLS")?
                .split(',')
                .map(str::to_owned)
                .collect(),
            resource: get("REDLOCK_CHILD_RESOURCE")?,
            ttl: Duration::from_millis(get("REDLOCK_CHILD_TTL_MS")?.parse().ok()?),
            hold_ms: (lo.parse().ok()?, hi.parse().ok()?),
            watchdog: get("REDLOCK_CHILD_WATCHDOG")? == "1",
            duration: Duration::from_millis(get("REDLOCK_CHILD_MS")?.parse().ok()?),
        },
        get("REDLOCK_CHILD_HOLDER")?,
    ))
}
