//! The run's tables written into `docs/performance.md`, between the marker
//! comments of the run's kind, so that the page shows what a run measured
//! rather than figures copied by hand:
//!
//! - a full run replaces what is between `<!-- bench:full:begin -->` and
//!   `<!-- bench:full:end -->`, and the chart `docs/bench-latency.svg`;
//! - a `--quick` run replaces what is between `<!-- bench:quick:begin -->`
//!   and `<!-- bench:quick:end -->` only, so that a quick check (CI, a
//!   laptop) never overwrites the full run's figures;
//! - a run with `--only` (some scenarios) or `--no-docs` writes nothing there.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Which section of the page a run writes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Full,
    Quick,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Full => "full",
            Kind::Quick => "quick",
        }
    }

    fn command(self) -> &'static str {
        match self {
            Kind::Full => "cargo bench -p redlock-bench --bench redlock",
            Kind::Quick => "cargo bench -p redlock-bench --bench redlock -- --quick",
        }
    }
}

/// Replaces the `kind` section of the page at `page` with `tables` (the
/// report's Markdown), under a line that says where and when they were
/// measured. Leaves the page as it is, with an error, when its markers are
/// missing or out of order.
pub(crate) fn write(
    page: &Path,
    kind: Kind,
    machine: &str,
    root: &Path,
    tables: &str,
) -> Result<(), String> {
    let text = std::fs::read_to_string(page).map_err(|e| format!("{}: {e}", page.display()))?;
    let begin = format!("<!-- bench:{}:begin -->", kind.name());
    let end = format!("<!-- bench:{}:end -->", kind.name());
    // A marker counts only on a line of its own: the page's prose names the
    // markers too, inside backquotes.
    let (Some(b), Some(e)) = (marker_line(&text, &begin), marker_line(&text, &end)) else {
        return Err(format!(
            "{}: no {begin} … {end} markers, each alone on its line",
            page.display()
        ));
    };
    if e < b {
        return Err(format!("{}: {end} comes before {begin}", page.display()));
    }
    let section = format!(
        "{begin}\n<!-- Written by `{}`; edits here are overwritten by the next such run. -->\n\n\
         Measured {} at {} on {machine} (`{}`).\n{}\n{end}",
        kind.command(),
        today(),
        commit(root),
        kind.command(),
        tables.trim_end(),
    );
    let updated = format!("{}{section}{}", &text[..b], &text[e + end.len()..]);
    std::fs::write(page, updated).map_err(|e| format!("{}: {e}", page.display()))
}

/// The byte offset of the one line that is `marker` alone (surrounding
/// blanks aside); `None` when there is no such line or more than one.
fn marker_line(text: &str, marker: &str) -> Option<usize> {
    let mut found = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if line.trim() == marker {
            if found.is_some() {
                return None;
            }
            found = Some(offset + line.find(marker).unwrap_or(0));
        }
        offset += line.len();
    }
    found
}

/// The commit the run was built from, marked when the tree had changes
/// (other than to the two files a run writes).
fn commit(root: &Path) -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(hash) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| {
                s.lines().any(|l| {
                    !l.ends_with("docs/performance.md") && !l.ends_with("docs/bench-latency.svg")
                })
            });
            if dirty {
                format!("commit `{hash}` with local changes")
            } else {
                format!("commit `{hash}`")
            }
        }
        None => "an unknown commit".into(),
    }
}

/// Today's date (UTC) as YYYY-MM-DD, from the system clock: a label for the
/// reader, not a measurement.
fn today() -> String {
    let days = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0) as i64;
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
