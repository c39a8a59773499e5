//! A mutual-exclusion checker on one monotonic clock.
//!
//! Every holder records the window in which it believed it held the lock:
//! from the instant its acquisition returned to the earlier of its
//! `expires_at` and the instant it started to release. Holders also record
//! when they enter and leave the critical section. Windows of different
//! holders must not overlap, and no two holders may be inside the critical
//! section at once. All processes on this machine read the same
//! `CLOCK_MONOTONIC`, so holders in other processes report their times in it
//! (see [`mono_window`]) and the check stays exact.

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

/// Two windows of different holders that overlap.
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

/// Two holders inside the critical section at once.
#[derive(Debug, Clone)]
pub struct Interleaving {
    /// The holder already inside.
    pub inside: String,
    /// The holder that entered.
    pub entered: String,
    /// When.
    pub at: u64,
}

/// Collects windows and critical-section events from many tasks (and, via
/// [`Checker::ingest`], from other processes) and checks them.
#[derive(Debug, Default)]
pub struct Checker {
    windows: Mutex<Vec<Window>>,
    sections: Mutex<Vec<Section>>,
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

    /// Records entering (`true`) or leaving the critical section now.
    pub fn section(&self, holder: &str, enter: bool) {
        self.section_at(holder, enter, mono_now());
    }

    fn section_at(&self, holder: &str, enter: bool, at: u64) {
        self.sections.lock().unwrap().push(Section {
            holder: holder.to_owned(),
            at,
            enter,
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

    /// Every pair of windows of different holders that overlap.
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

    /// Every entry into the critical section while another holder was in it.
    pub fn interleavings(&self) -> Vec<Interleaving> {
        let mut events = self.sections.lock().unwrap().clone();
        // exits before entries at the same instant
        events.sort_by_key(|e| (e.at, e.enter));
        let mut inside: Vec<String> = Vec::new();
        let mut found = Vec::new();
        for e in events {
            if e.enter {
                if let Some(other) = inside.iter().find(|h| **h != e.holder) {
                    found.push(Interleaving {
                        inside: other.clone(),
                        entered: e.holder.clone(),
                        at: e.at,
                    });
                }
                inside.push(e.holder);
            } else if let Some(i) = inside.iter().position(|h| *h == e.holder) {
                inside.remove(i);
            }
        }
        found
    }

    /// Violations of either kind.
    pub fn violations(&self) -> usize {
        self.overlaps().len() + self.interleavings().len()
    }

    /// Reads records another process printed with [`line_window`] and
    /// [`line_section`]; other lines are ignored. Returns how many it read.
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
