//! A mutual-exclusion checker on one monotonic clock.
//!
//! Every holder records the window in which it believed it held the lock:
//! from the instant its acquisition returned to the earlier of its
//! `expires_at` and the instant it started to release. Holders also record
//! when they enter and leave the critical section, and may record the writes
//! they made to a store guarded by fencing tokens. All processes on this
//! machine read the same `CLOCK_MONOTONIC`, so holders in other processes
//! report their times in it (see [`mono_window`]) and the check stays exact.
//!
//! # Two categories
//!
//! The checker tells what the lock promises from what no lock with an expiry
//! can promise, reports both, and counts only the first as a failure:
//!
//! - **Violations** ([`Checker::violations`]): the validity windows of two
//!   holders overlap ([`Checker::overlaps`]); two holders were inside the
//!   critical section at an instant when both were within their validity
//!   ([`Interleaving::overrun`] false); or a store accepted a write from a
//!   holder after a later holder's write had been accepted, past fencing
//!   ([`Checker::stale_writes`]). Each is a broken lock.
//! - **Overruns** ([`Checker::overruns`]): a critical section that was not
//!   entirely inside its holder's validity window, because the holder's
//!   process was descheduled (a loaded machine, a GC pause, a stopped VM)
//!   between checking its validity and entering, or while it worked. The
//!   next holder may then enter while it still works, an
//!   [`Interleaving`] with `overrun` true. This is the documented limit of
//!   every lease; fencing tokens are the remedy, and a stale write they let
//!   through is a violation again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// Nanoseconds on `CLOCK_MONOTONIC`, the clock behind `Instant` on Linux,
/// comparable across processes.
pub fn mono_now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass and reads
    // nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A window's two instants on the monotonic clock, converted together so
/// that their order is kept exactly.
pub fn mono_window(granted: Instant, ended: Instant) -> (u64, u64) {
    let (now_i, now_m) = (Instant::now(), mono_now());
    (
        mono_from(granted, now_i, now_m),
        mono_from(ended, now_i, now_m),
    )
}

/// `at` converted with one reading of both clocks, so that instants converted
/// together keep their order exactly.
fn mono_from(at: Instant, now_i: Instant, now_m: u64) -> u64 {
    if at <= now_i {
        now_m - (now_i - at).as_nanos() as u64
    } else {
        now_m + (at - now_i).as_nanos() as u64
    }
}

/// One holder's window, in monotonic nanoseconds.
#[derive(Debug, Clone)]
pub struct Window {
    /// Who held it.
    pub holder: String,
    /// The lock's token.
    pub token: String,
    /// When the acquisition returned.
    pub granted: u64,
    /// When the holder stopped believing it held the lock.
    pub ended: u64,
}

/// Two windows of different holders that overlap: a violation.
#[derive(Debug, Clone)]
pub struct Overlap {
    /// The earlier window.
    pub first: Window,
    /// The window that began before `first` ended.
    pub second: Window,
}

/// A critical-section entry or exit.
#[derive(Debug, Clone)]
struct Section {
    holder: String,
    at: u64,
    enter: bool,
}

/// One critical section: an entry and the exit that followed it (none when
/// the holder never recorded one, for a process killed inside).
#[derive(Debug, Clone)]
struct Span {
    holder: String,
    enter: u64,
    exit: u64,
}

/// Two holders inside the critical section at once.
#[derive(Debug, Clone)]
pub struct Interleaving {
    /// The holder already inside.
    pub inside: String,
    /// The holder that entered.
    pub entered: String,
    /// When.
    pub at: u64,
    /// Whether at every instant they were both inside, at least one of them
    /// was past its validity window (or had no window at all for the time
    /// it was inside): the documented limit, not a violation. False when
    /// both were inside their validity at some instant, which means their
    /// windows overlap.
    pub overrun: bool,
}

/// A critical section that was not entirely inside its holder's validity
/// window: the holder was descheduled past its validity, and its work
/// overran. The documented limit of any lease, not a violation.
#[derive(Debug, Clone)]
pub struct Overrun {
    /// Who overran.
    pub holder: String,
    /// When it entered the critical section.
    pub entered: u64,
    /// When it left (`u64::MAX` when it never recorded leaving).
    pub left: u64,
    /// When its validity window ended (`0` when it recorded no window for
    /// this section).
    pub valid_until: u64,
    /// Whether another holder entered while this one was inside.
    pub interleaved: bool,
}

/// A write to a store guarded by fencing tokens.
#[derive(Debug, Clone)]
pub struct Write {
    /// Who wrote.
    pub holder: String,
    /// The token of the lock the write was made under.
    pub token: String,
    /// The fencing token sent with it.
    pub fence: u64,
    /// Whether the store accepted it.
    pub accepted: bool,
    /// When the store answered.
    pub at: u64,
}

/// A write the store accepted although a later holder's write had been
/// accepted before it: the stale write that fencing exists to stop.
#[derive(Debug, Clone)]
pub struct StaleWrite {
    /// The stale write.
    pub write: Write,
    /// The later holder's write accepted before it.
    pub after: Write,
}

/// Everything the checker found, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// Windows recorded.
    pub windows: usize,
    /// Pairs of overlapping windows (violations).
    pub overlaps: usize,
    /// Interleaved critical sections while both holders were valid
    /// (violations).
    pub unexplained_interleavings: usize,
    /// Stale writes accepted past fencing (violations).
    pub stale_writes: usize,
    /// Critical sections that ran past their holder's validity (the
    /// documented limit).
    pub overruns: usize,
    /// Of those, how many another holder entered during (the documented
    /// limit).
    pub overrun_interleavings: usize,
}

impl Report {
    /// Violations of every kind: the lock failed.
    pub fn violations(&self) -> usize {
        self.overlaps + self.unexplained_interleavings + self.stale_writes
    }
}

/// Collects windows, critical-section events and fenced writes from many
/// tasks (and, via [`Checker::ingest`], from other processes) and checks
/// them.
#[derive(Debug, Default)]
pub struct Checker {
    windows: Mutex<Vec<Window>>,
    sections: Mutex<Vec<Section>>,
    writes: Mutex<Vec<Write>>,
}

impl Checker {
    /// Records a window given as `Instant`s.
    pub fn record(&self, holder: &str, token: &str, granted: Instant, ended: Instant) {
        let (granted, ended) = mono_window(granted, ended);
        self.record_mono(holder, token, granted, ended);
    }

    /// Records a window given in monotonic nanoseconds.
    pub fn record_mono(&self, holder: &str, token: &str, granted: u64, ended: u64) {
        assert!(ended >= granted, "a window cannot end before it begins");
        self.windows.lock().unwrap().push(Window {
            holder: holder.to_owned(),
            token: token.to_owned(),
            granted,
            ended,
        });
    }

    /// Records entering (`true`) or leaving the critical section now. A
    /// holder's sections are matched to its windows by time: a section
    /// belongs to the holder's latest window granted before it was entered.
    pub fn section(&self, holder: &str, enter: bool) {
        self.section_at(holder, enter, mono_now());
    }

    /// Records entering (`true`) or leaving the critical section at `at`
    /// (monotonic nanoseconds).
    pub fn section_at(&self, holder: &str, enter: bool, at: u64) {
        self.sections.lock().unwrap().push(Section {
            holder: holder.to_owned(),
            at,
            enter,
        });
    }

    /// Records a write made under the lock with `token`, with fencing token
    /// `fence`, that the store answered (`accepted` or not) now.
    pub fn write(&self, holder: &str, token: &str, fence: u64, accepted: bool) {
        self.write_at(holder, token, fence, accepted, mono_now());
    }

    /// [`Checker::write`] answered at `at` (monotonic nanoseconds).
    pub fn write_at(&self, holder: &str, token: &str, fence: u64, accepted: bool, at: u64) {
        self.writes.lock().unwrap().push(Write {
            holder: holder.to_owned(),
            token: token.to_owned(),
            fence,
            accepted,
            at,
        });
    }

    /// How many windows were recorded.
    pub fn len(&self) -> usize {
        self.windows.lock().unwrap().len()
    }

    /// Whether no window was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every pair of windows of different holders that overlap
    /// (violations).
    pub fn overlaps(&self) -> Vec<Overlap> {
        let mut windows = self.windows.lock().unwrap().clone();
        windows.sort_by_key(|w| w.granted);
        let mut found = Vec::new();
        for (i, a) in windows.iter().enumerate() {
            for b in &windows[i + 1..] {
                if b.granted >= a.ended {
                    break;
                }
                if a.holder != b.holder || a.token != b.token {
                    found.push(Overlap {
                        first: a.clone(),
                        second: b.clone(),
                    });
                }
            }
        }
        found
    }

    /// The critical sections, each entry paired with the holder's next exit,
    /// sorted by entry.
    fn spans(&self) -> Vec<Span> {
        let mut events = self.sections.lock().unwrap().clone();
        // exits before entries at the same instant
        events.sort_by_key(|e| (e.at, e.enter));
        let mut open: HashMap<String, usize> = HashMap::new();
        let mut spans: Vec<Span> = Vec::new();
        for e in events {
            if e.enter {
                open.insert(e.holder.clone(), spans.len());
                spans.push(Span {
                    holder: e.holder,
                    enter: e.at,
                    exit: u64::MAX,
                });
            } else if let Some(i) = open.remove(&e.holder) {
                spans[i].exit = e.at;
            }
        }
        spans
    }

    /// Each holder's windows, sorted by grant.
    fn windows_by_holder(&self) -> HashMap<String, Vec<(u64, u64)>> {
        let mut by: HashMap<String, Vec<(u64, u64)>> = HashMap::new();
        for w in self.windows.lock().unwrap().iter() {
            by.entry(w.holder.clone())
                .or_default()
                .push((w.granted, w.ended));
        }
        for v in by.values_mut() {
            v.sort_unstable();
        }
        by
    }

    /// Every critical section with the validity window it belongs to (the
    /// holder's latest window granted at or before the entry), if any.
    fn spans_with_windows(&self) -> Vec<(Span, Option<(u64, u64)>)> {
        let by = self.windows_by_holder();
        self.spans()
            .into_iter()
            .map(|s| {
                let w = by.get(&s.holder).and_then(|ws| {
                    let i = ws.partition_point(|w| w.0 <= s.enter);
                    i.checked_sub(1).map(|i| ws[i])
                });
                (s, w)
            })
            .collect()
    }

    /// Every pair of critical sections of different holders that were open
    /// at once, as indexes into `spans` (the earlier entry first).
    fn pairs(spans: &[(Span, Option<(u64, u64)>)]) -> Vec<(usize, usize)> {
        let mut found = Vec::new();
        for (i, (a, _)) in spans.iter().enumerate() {
            // sorted by entry: every later section that entered before a
            // left was open together with a
            for (j, (b, _)) in spans.iter().enumerate().skip(i + 1) {
                if b.enter >= a.exit {
                    break;
                }
                if a.holder != b.holder {
                    found.push((i, j));
                }
            }
        }
        found
    }

    /// Every entry into the critical section while another holder was in it,
    /// each classified as an overrun or not (see [`Interleaving::overrun`]).
    pub fn interleavings(&self) -> Vec<Interleaving> {
        let spans = self.spans_with_windows();
        Self::pairs(&spans)
            .into_iter()
            .map(|(i, j)| {
                let ((a, wa), (b, wb)) = (&spans[i], &spans[j]);
                // both inside during [b.enter, min(a.exit, b.exit)): a
                // violation when both were valid at some instant of it
                let both_valid = match (wa, wb) {
                    (Some(wa), Some(wb)) => {
                        let lo = b.enter.max(wa.0).max(wb.0);
                        let hi = a.exit.min(b.exit).min(wa.1).min(wb.1);
                        lo < hi
                    }
                    _ => false,
                };
                Interleaving {
                    inside: a.holder.clone(),
                    entered: b.holder.clone(),
                    at: b.enter,
                    overrun: !both_valid,
                }
            })
            .collect()
    }

    /// Every critical section that was not entirely inside its holder's
    /// validity window (the documented limit, not a violation).
    pub fn overruns(&self) -> Vec<Overrun> {
        let spans = self.spans_with_windows();
        let mut interleaved = vec![false; spans.len()];
        for (i, j) in Self::pairs(&spans) {
            interleaved[i] = true;
            interleaved[j] = true;
        }
        spans
            .iter()
            .zip(interleaved)
            .filter(|((s, w), _)| match w {
                Some((g, e)) => !(*g <= s.enter && s.enter < *e && s.exit <= *e),
                None => true,
            })
            .map(|((s, w), interleaved)| Overrun {
                holder: s.holder.clone(),
                entered: s.enter,
                left: s.exit,
                valid_until: w.map_or(0, |w| w.1),
                interleaved,
            })
            .collect()
    }

    /// Every write accepted after a later holder's write had been accepted:
    /// a violation. Holders are ordered by their windows' grants; a write
    /// whose lock token has no window is not judged.
    pub fn stale_writes(&self) -> Vec<StaleWrite> {
        let granted: HashMap<String, u64> = self
            .windows
            .lock()
            .unwrap()
            .iter()
            .map(|w| (w.token.clone(), w.granted))
            .collect();
        let mut writes: Vec<Write> = self
            .writes
            .lock()
            .unwrap()
            .iter()
            .filter(|w| w.accepted)
            .cloned()
            .collect();
        writes.sort_by_key(|w| w.at);
        let mut latest: Option<(u64, Write)> = None;
        let mut found = Vec::new();
        for w in writes {
            let Some(&g) = granted.get(&w.token) else {
                continue;
            };
            match &latest {
                Some((lg, lw)) if g < *lg => found.push(StaleWrite {
                    write: w,
                    after: lw.clone(),
                }),
                Some((lg, _)) if g == *lg => {}
                _ => latest = Some((g, w)),
            }
        }
        found
    }

    /// Violations of every kind (overlapping windows, interleaved sections
    /// of two valid holders, stale writes accepted); overruns are not
    /// counted.
    pub fn violations(&self) -> usize {
        self.report().violations()
    }

    /// Everything found, counted.
    pub fn report(&self) -> Report {
        let interleavings = self.interleavings();
        let overruns = self.overruns();
        Report {
            windows: self.len(),
            overlaps: self.overlaps().len(),
            unexplained_interleavings: interleavings.iter().filter(|i| !i.overrun).count(),
            stale_writes: self.stale_writes().len(),
            overruns: overruns.len(),
            overrun_interleavings: overruns.iter().filter(|o| o.interleaved).count(),
        }
    }

    /// Reads records another process printed with [`line_window`],
    /// [`line_section`] and [`line_write`]; other lines are ignored. Returns
    /// how many it read.
    pub fn ingest(&self, output: &str) -> usize {
        let mut n = 0;
        for line in output.lines() {
            // the test harness may print its own words before the first record
            let Some(at) = line.find("@@") else { continue };
            let parts: Vec<&str> = line[at..].split_whitespace().collect();
            match parts.as_slice() {
                ["@@W", holder, token, granted, ended] => {
                    self.record_mono(
                        holder,
                        token,
                        granted.parse().unwrap(),
                        ended.parse().unwrap(),
                    );
                    n += 1;
                }
                ["@@S", holder, enter, at] => {
                    self.section_at(holder, *enter == "1", at.parse().unwrap());
                    n += 1;
                }
                ["@@F", holder, token, fence, accepted, at] => {
                    self.write_at(
                        holder,
                        token,
                        fence.parse().unwrap(),
                        *accepted == "1",
                        at.parse().unwrap(),
                    );
                    n += 1;
                }
                _ => {}
            }
        }
        n
    }
}

/// A window as a line for [`Checker::ingest`].
pub fn line_window(holder: &str, token: &str, granted: u64, ended: u64) -> String {
    format!("@@W {holder} {token} {granted} {ended}")
}

/// A critical-section event, now, as a line for [`Checker::ingest`].
pub fn line_section(holder: &str, enter: bool) -> String {
    format!("@@S {holder} {} {}", u8::from(enter), mono_now())
}

/// A fenced write the store answered now, as a line for [`Checker::ingest`].
pub fn line_write(holder: &str, token: &str, fence: u64, accepted: bool) -> String {
    format!(
        "@@F {holder} {token} {fence} {} {}",
        u8::from(accepted),
        mono_now()
    )
}
