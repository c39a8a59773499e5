//! The contending-client workload of the fault tests: each client acquires
//! one resource, holds it for a random short time inside a critical section,
//! and releases it, recording everything for the [`Checker`]. Clients run as
//! tasks of the test process and as separate OS processes (the test binary
//! re-run as a child, which prints its records for [`Checker::ingest`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::RngExt;
use redlock_quorum::{Error, Redlock};

use crate::checker::{self, Checker};

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
    /// Pause between leaving the critical section and releasing, in
    /// milliseconds (a holder stalled before its release): `(0, 0)` for none.
    /// Lock/unlock only.
    pub release_after_ms: (u64, u64),
    /// Release with a bare `DEL` on every node instead of the
    /// ownership-checked `unlock`: the bug the negative control plants.
    pub bare_del: bool,
    /// The contenders' restart guard (`max_ttl`), if any.
    pub restart_guard: Option<Duration>,
}

impl Plan {
    /// A plan with no release delay and the real, checked release.
    pub fn new(
        urls: Vec<String>,
        resource: String,
        ttl: Duration,
        hold_ms: (u64, u64),
        watchdog: bool,
        duration: Duration,
    ) -> Self {
        Plan {
            urls,
            resource,
            ttl,
            hold_ms,
            watchdog,
            duration,
            release_after_ms: (0, 0),
            bare_del: false,
            restart_guard: None,
        }
    }
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
    /// Locks granted and worked under (each recorded one window and one
    /// critical section for the checker).
    pub acquisitions: u64,
    /// Attempts that failed (conflict, no quorum, lost).
    pub failures: u64,
    /// `unlock` calls that returned an error.
    pub unlock_errors: u64,
    /// `unlock` errors that indicate a bug: every node answered before the
    /// lock's validity ended and yet no node held our token (`NotHeld`), or
    /// a node answered with an error reply (`Redis`). The fault tests take
    /// out at most a minority, so neither can happen to a correct client.
    pub unlock_bugs: u64,
    /// Locks granted whose validity was gone when the holder came to enter
    /// the critical section (it was descheduled in between): the holder did
    /// not enter, recorded nothing, and released.
    pub expired_before_entry: u64,
}

impl Tally {
    /// Adds another client's tally.
    pub fn add(&mut self, other: Tally) {
        self.acquisitions += other.acquisitions;
        self.failures += other.failures;
        self.unlock_errors += other.unlock_errors;
        self.unlock_bugs += other.unlock_bugs;
        self.expired_before_entry += other.expired_before_entry;
    }

    /// The tally as a line for a parent process ([`Tally::parse`]).
    pub fn line(&self) -> String {
        format!(
            "@@T {} {} {} {} {}",
            self.acquisitions,
            self.failures,
            self.unlock_errors,
            self.unlock_bugs,
            self.expired_before_entry
        )
    }

    /// Reads a line made by [`Tally::line`] (anywhere in `line`).
    pub fn parse(line: &str) -> Option<Tally> {
        let at = line.find("@@T ")?;
        let mut it = line[at + 4..]
            .split_whitespace()
            .map(|x| x.parse::<u64>().ok());
        Some(Tally {
            acquisitions: it.next()??,
            failures: it.next()??,
            unlock_errors: it.next()??,
            unlock_bugs: it.next()??,
            expired_before_entry: it.next()??,
        })
    }
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
        // the exit first: the window ends no earlier than the work
        self.sink.section(&self.holder, false);
        let now = Instant::now();
        let ended = now.min((self.deadline)()).max(self.granted);
        self.sink
            .window(&self.holder, &self.token, self.granted, ended);
    }
}

/// Connections for a bare-`DEL` release, one per node.
async fn bare_connections(urls: &[String]) -> Vec<redis::aio::MultiplexedConnection> {
    let mut out = Vec::new();
    for url in urls {
        let client = redis::Client::open(url.as_str()).expect("url");
        out.push(
            client
                .get_multiplexed_async_connection()
                .await
                .expect("connect for the bare DEL"),
        );
    }
    out
}

/// One client's loop. A holder enters the critical section only inside its
/// validity window: it checks the lock's `expires_at` right before entering
/// and, when the validity is gone, does not enter (and counts it in
/// [`Tally::expired_before_entry`]). A holder descheduled after that check
/// or while it works overruns its validity; the [`Checker`] reports that as
/// an overrun, not a violation.
pub async fn contend(redlock: Redlock, holder: String, plan: Plan, sink: Sink) -> Tally {
    let mut tally = Tally::default();
    let mut bare = if plan.bare_del {
        bare_connections(&plan.urls).await
    } else {
        Vec::new()
    };
    let end = Instant::now() + plan.duration;
    while Instant::now() < end {
        let hold = Duration::from_millis(rand::rng().random_range(plan.hold_ms.0..=plan.hold_ms.1));
        let outcome = if plan.watchdog {
            let (sink, holder) = (sink.clone(), holder.clone());
            // with_lock may report a loss before the work ever ran; count
            // only acquisitions that recorded a window
            let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let ran2 = ran.clone();
            let late = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let late2 = late.clone();
            let result = redlock
                .with_lock(&plan.resource, plan.ttl, |watch| async move {
                    let granted = Instant::now();
                    // enter only inside the validity window
                    if granted >= watch.expires_at() {
                        late2.store(true, std::sync::atomic::Ordering::SeqCst);
                        return;
                    }
                    ran2.store(true, std::sync::atomic::Ordering::SeqCst);
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
                .await;
            if ran.load(std::sync::atomic::Ordering::SeqCst) {
                tally.acquisitions += 1;
            }
            if late.load(std::sync::atomic::Ordering::SeqCst) {
                tally.expired_before_entry += 1;
            }
            result
        } else {
            match redlock.lock(&plan.resource, plan.ttl).await {
                Ok(lock) => {
                    let granted = Instant::now();
                    // enter only inside the validity window
                    let valid = granted < lock.expires_at();
                    if valid {
                        sink.section(&holder, true);
                        let expires = lock.expires_at();
                        let _inside = Inside {
                            sink: sink.clone(),
                            holder: holder.clone(),
                            token: lock.token().to_owned(),
                            granted,
                            deadline: Box::new(move || expires),
                        };
                        tokio::time::sleep(hold).await;
                        tally.acquisitions += 1;
                    } else {
                        tally.expired_before_entry += 1;
                    }
                    let (lo, hi) = plan.release_after_ms;
                    if hi > 0 {
                        let stall = rand::rng().random_range(lo..=hi);
                        tokio::time::sleep(Duration::from_millis(stall)).await;
                    }
                    if plan.bare_del {
                        for con in &mut bare {
                            let _: Result<i64, _> =
                                redis::cmd("DEL").arg(&plan.resource).query_async(con).await;
                        }
                    } else if let Err(e) = redlock.unlock(&lock).await {
                        tally.unlock_errors += 1;
                        // Every node that answered did so before now; our
                        // keys outlive the validity on every node that took
                        // them, so "not held" before the validity ended
                        // means something deleted a live lock.
                        let answered_in_time = Instant::now() < lock.expires_at();
                        let bug = match e {
                            Error::NotHeld { .. } => answered_in_time,
                            Error::Redis { .. } => true,
                            _ => false,
                        };
                        if bug {
                            tally.unlock_bugs += 1;
                            eprintln!("{holder}: unlock error that indicates a bug: {e}");
                        }
                    }
                    Ok(())
                }
                Err(e) => Err(e),
            }
        };
        match outcome {
            Ok(()) => {}
            Err(Error::LockLost { .. }) => {
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
        (
            "REDLOCK_CHILD_RELEASE_AFTER_MS".into(),
            format!("{}-{}", plan.release_after_ms.0, plan.release_after_ms.1),
        ),
        (
            "REDLOCK_CHILD_BARE_DEL".into(),
            u8::from(plan.bare_del).to_string(),
        ),
        (
            "REDLOCK_CHILD_RESTART_GUARD_MS".into(),
            plan.restart_guard.map_or(0, |g| g.as_millis()).to_string(),
        ),
    ]
}

/// The [`Plan`] and holder name a child process was given, if it is one.
pub fn plan_from_env() -> Option<(Plan, String)> {
    let get = |k: &str| std::env::var(k).ok();
    let hold = get("REDLOCK_CHILD_HOLD_MS")?;
    let (lo, hi) = hold.split_once('-')?;
    let release_after = get("REDLOCK_CHILD_RELEASE_AFTER_MS")?;
    let (after_lo, after_hi) = release_after.split_once('-')?;
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
            release_after_ms: (after_lo.parse().ok()?, after_hi.parse().ok()?),
            bare_del: get("REDLOCK_CHILD_BARE_DEL")? == "1",
            restart_guard: match get("REDLOCK_CHILD_RESTART_GUARD_MS")?.parse().ok()? {
                0 => None,
                ms => Some(Duration::from_millis(ms)),
            },
        },
        get("REDLOCK_CHILD_HOLDER")?,
    ))
}
