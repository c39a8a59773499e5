//! A mutual-exclusion checker on one monotonic clock.
//!
//! Every holder records the window in which it believed it held the lock:
//! from the instant its acquisition returned to the earlier of its
//! `expires_at` and the instant it started to release. Windows of different
//! holders must not overlap; every process here reads the same `Instant`
//! clock, so the check is exact.

use std::sync::Mutex;
use std::time::Instant;

/// One holder's window.
#[derive(Debug, Clone)]
pub struct Window {
    /// Who held it.
    pub holder: String,
    /// The lock's token.
    pub token: String,
    /// When the acquisition returned.
    pub granted: Instant,
    /// When the holder stopped believing it held the lock.
    pub ended: Instant,
}

/// Two windows of different holders that overlap.
#[derive(Debug, Clone)]
pub struct Overlap {
    /// The earlier window.
    pub first: Window,
    /// The window that began before `first` ended.
    pub second: Window,
}

/// Collects windows from many tasks and checks them.
#[derive(Debug, Default)]
pub struct Checker {
    windows: Mutex<Vec<Window>>,
}

impl Checker {
    /// Records a window.
    pub fn record(&self, holder: &str, token: &str, granted: Instant, ended: Instant) {
        assert!(ended >= granted, "a window cannot end before it begins");
        self.windows.lock().unwrap().push(Window {
            holder: holder.to_owned(),
            token: token.to_owned(),
            granted,
            ended,
        });
    }

    /// How many windows were recorded.
    pub fn len(&self) -> usize {
        self.windows.lock().unwrap().len()
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
}
