//! `redlock run`: wait for the lock, run the command under it, and end both
//! cleanly whatever happens first (the command exits, the lock is lost, a
//! signal arrives).

use std::time::{Duration, Instant};

use futures::FutureExt;
use rand::RngExt;
use redlock_quorum::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_RETRY_DELAY, DEFAULT_RETRY_JITTER, Error, LockGuard, Redlock,
};

use crate::args::{RunArgs, Wait};
use crate::child::{self, Signals};
use crate::exit::{self, Failure};
use crate::log::Log;

/// Runs the command under the lock; returns the exit code.
pub(crate) async fn run(args: RunArgs, signals: &mut Signals, log: &Log) -> Result<u8, Failure> {
    let urls = args.nodes.urls()?;
    if args.ttl.is_zero() {
        return Err(Failure::config("--ttl must be longer than zero"));
    }
    if args.name.is_empty() {
        return Err(Failure::config("the lock's NAME is empty"));
    }
    let hold_for = args.hold_for.filter(|h| !h.is_zero());
    // With --hold-for, the keys themselves must last until the hold ends,
    // even if redlock dies right after acquiring: acquire (and renew) with a
    // ttl whose validity covers it. The end is shortened again when the
    // command finishes early; see `finish`.
    let ttl = match hold_for {
        Some(hold) => args.ttl.max(ttl_covering(hold)),
        None => args.ttl,
    };
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(args.nodes.node_timeout)
        .connect_timeout(DEFAULT_CONNECT_TIMEOUT.max(args.nodes.node_timeout))
        .build()
        .map_err(Failure::config)?;

    let guard = acquire(&redlock, &args.name, ttl, args.wait, signals, log).await?;
    let acquired_at = guard.lock().started_at();
    log.info(format_args!(
        "acquired {:?} on a quorum of {} nodes, ttl {}",
        args.name,
        redlock.node_count(),
        humantime::format_duration(ttl)
    ));

    // The token is taken right after acquiring, as `fencing_token` asks.
    let token = match redlock.fencing_token(&guard.lock()).await {
        Ok(token) => token,
        Err(e) => {
            let _ = guard.release().await;
            return Err(Failure::config(format_args!(
                "no fencing token for {:?}: {e}; the command did not run",
                args.name
            )));
        }
    };
    log.info(format_args!("fencing token {token}"));
    // A signal that came during the acquisition ends it here: no command is
    // started during shutdown.
    if let Some((signal, name)) = signals.recv().now_or_never() {
        let _ = guard.release().await;
        return Err(Failure::interrupted(signal, name));
    }

    let mut cmd = child::command(&args.command, args.shell);
    cmd.env("REDLOCK_RESOURCE", &args.name)
        .env("REDLOCK_FENCING_TOKEN", token.to_string());
    let mut group = match child::spawn(cmd) {
        Ok(group) => group,
        Err(e) => {
            let _ = guard.release().await;
            log.error(format_args!(
                "cannot run {:?}: {e}",
                args.command[0].to_string_lossy()
            ));
            return Ok(child::spawn_failure(&e));
        }
    };
    let pgid = group.pgid;
    log.info(format_args!("started the command, process group {pgid}"));

    // Supervise: forward signals until the command exits or the lock is lost.
    let lost = loop {
        tokio::select! {
            _ = group.wait_command() => break None,
            (signal, name) = signals.recv() => {
                log.info(format_args!("forwarding {name} to the command's process group"));
                child::signal_group(pgid, signal);
            }
            reason = guard.lost() => break Some(reason),
        }
    };

    if let Some(reason) = lost {
        // End the command first, then say so: nothing may stand between the
        // loss and the group's end (a write could block on a full pipe).
        group.terminate(signals, args.kill_after).await;
        let _ = guard.release().await;
        log.error(format_args!(
            "lost the lock {:?} while the command ran: {reason}; its process group was terminated",
            args.name
        ));
        return Ok(exit::LOST);
    }

    let status = group.wait_command().await;
    let code = child::exit_code(status);
    log.info(format_args!("the command exited: {status}"));
    // The keeper (Linux) may still be leaving; SIGTERM does not reach it,
    // and a group of the keeper alone ends at once.
    let left_behind = group.left_behind();
    if child::group_alive(pgid) {
        group.terminate(signals, args.kill_after).await;
    }
    if left_behind {
        log.info(format_args!(
            "the command left processes in its group; they were terminated"
        ));
    }
    if !guard.is_held() {
        let reason = guard.loss().map(|r| r.to_string()).unwrap_or_default();
        log.error(format_args!(
            "lost the lock {:?} before the command's processes ended: {reason}",
            args.name
        ));
        let _ = guard.release().await;
        return Ok(exit::LOST);
    }
    finish(&redlock, guard, acquired_at, hold_for, log).await;
    Ok(code)
}

/// Waits for the lock as `--wait` says, one attempt at a time, so that a
/// signal ends the wait between attempts and never abandons an attempt
/// under way (whose keys a dropped future would leave to a cleanup task
/// that exits with the process).
async fn acquire(
    redlock: &Redlock,
    name: &str,
    ttl: Duration,
    wait: Wait,
    signals: &mut Signals,
    log: &Log,
) -> Result<LockGuard, Failure> {
    let give_up_at = match wait {
        Wait::For(d) => Instant::now().checked_add(d),
        Wait::Forever => None,
    };
    loop {
        let attempt = redlock.try_acquire(name, ttl).await;
        let pending = signals.recv().now_or_never();
        let error = match attempt {
            Ok(guard) => match pending {
                None => return Ok(guard),
                Some((signal, signal_name)) => {
                    let _ = guard.release().await;
                    return Err(Failure::interrupted(signal, signal_name));
                }
            },
            Err(e) => e,
        };
        if let Some((signal, signal_name)) = pending {
            return Err(Failure::interrupted(signal, signal_name));
        }
        // What waiting can change: another holder letting go, nodes coming
        // back. Everything else is final.
        if !matches!(
            error,
            Error::Conflict { .. } | Error::NoQuorum { .. } | Error::ValidityExpired { .. }
        ) {
            return Err(not_acquired(name, error));
        }
        let mut pause = DEFAULT_RETRY_DELAY + jitter(DEFAULT_RETRY_JITTER);
        // Attempts go on until the wait has run out; the last one starts when
        // it runs out (the pause before it is cut short), so a lock freed
        // within the wait is taken.
        let give_up = match (wait, give_up_at) {
            (Wait::For(d), _) if d.is_zero() => true,
            (Wait::For(_), Some(at)) => {
                let now = Instant::now();
                pause = pause.min(at.saturating_duration_since(now));
                now >= at
            }
            // Forever, or a wait too long to represent.
            _ => false,
        };
        if give_up {
            return Err(not_acquired(name, error));
        }
        log.info(format_args!("not acquired ({error}); trying again"));
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            (signal, signal_name) = signals.recv() => {
                return Err(Failure::interrupted(signal, signal_name));
            }
        }
    }
}

/// The failure for an acquisition that did not succeed.
fn not_acquired(name: &str, error: Error) -> Failure {
    match error {
        Error::Conflict { held, nodes, .. } => Failure::held(format_args!(
            "{name:?} is locked elsewhere ({held} of {nodes} nodes hold it); the command did not run"
        )),
        other => Failure::config(format_args!(
            "could not lock {name:?}: {other}; the command did not run"
        )),
    }
}

/// After the command: release the lock, or with `--hold-for` keep it until
/// the hold ends. The keys already last at least that long (acquired with
/// `ttl_covering(hold)`), but renewals may have pushed their expiry up to
/// one ttl past the hold, into the next scheduled run: extend them to just
/// what is left, then leave them to expire.
async fn finish(
    redlock: &Redlock,
    guard: LockGuard,
    acquired_at: Instant,
    hold_for: Option<Duration>,
    log: &Log,
) {
    let hold_until = hold_for.and_then(|h| acquired_at.checked_add(h));
    let left = hold_until.map(|until| until.saturating_duration_since(Instant::now()));
    let Some(left) = left.filter(|left| !left.is_zero()) else {
        match guard.release().await {
            Ok(n) => log.info(format_args!("released the lock on {n} nodes")),
            Err(e) => log.info(format_args!(
                "release: {e} (the keys expire with their ttl)"
            )),
        }
        return;
    };
    // Stop the renewals first, so that none lands after the shortening: the
    // lock as last renewed, whose requests still in flight to slow nodes
    // the shortening waits for on each node.
    let lock = guard.stop_renewing().await;
    match redlock.extend(&lock, ttl_covering(left)).await {
        Ok(shortened) if hold_until.is_some_and(|until| shortened.expires_at() >= until) => {
            log.info(format_args!(
                "holding the lock for {} more, until the hold ends",
                humantime::format_duration(round_ms(left))
            ));
        }
        // The keys keep their earlier expiry, which covers the hold.
        Ok(_) | Err(_) => log.info(format_args!(
            "holding the lock until its keys expire (at least {} more)",
            humantime::format_duration(round_ms(left))
        )),
    }
}

/// A ttl whose validity covers `d`: the validity of a lock is its ttl less
/// `ttl × 1 % + 2 ms` (the library's default drift allowance) less the
/// round's time, so ask for 2 % and 5 ms more.
fn ttl_covering(d: Duration) -> Duration {
    d.saturating_add(d / 50)
        .saturating_add(Duration::from_millis(5))
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A random pause in `[0, up_to]`, so that waiting instances do not retry in
/// step.
fn jitter(up_to: Duration) -> Duration {
    let micros = u64::try_from(up_to.as_micros()).unwrap_or(u64::MAX);
    Duration::from_micros(rand::rng().random_range(0..=micros))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hold_ttl_covers_the_hold_after_the_drift() {
        for ms in [1, 10, 999, 5_000, 240_000, 86_400_000] {
            let hold = Duration::from_millis(ms);
            let ttl = ttl_covering(hold);
            let drift = ttl.mul_f64(0.01) + Duration::from_millis(2);
            assert!(ttl - drift > hold, "{hold:?}: ttl {ttl:?}");
        }
    }
}
