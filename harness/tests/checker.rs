//! The safety checker's negative controls on histories planted by hand: a
//! planted violation (overlapping windows, two valid holders inside at
//! once, a stale write accepted past fencing) is caught, also when the
//! history comes from another process as lines; an overrun (work past the
//! holder's validity) is classified as an overrun and not as a violation;
//! and a clean history passes. The controls that plant a violation through
//! real locks on real nodes are in the root crate's
//! `tests/checker_controls.rs`.

use redlock_harness::checker::{Checker, Report, line_window, mono_now};

/// A millisecond in the checker's monotonic nanoseconds.
const MS: u64 = 1_000_000;

/// Holders a, b, c one after another, each entering and leaving the
/// critical section inside its validity window, with fencing tokens that
/// grow and a store that takes each write in order: nothing to report.
#[test]
fn a_clean_history_passes() {
    let t = mono_now();
    let c = Checker::default();
    for (i, holder) in ["a", "b", "c"].into_iter().enumerate() {
        let start = t + 10 * MS * i as u64;
        let token = format!("tok-{holder}");
        c.record_mono(holder, &token, start, start + 10 * MS);
        c.section_at(holder, true, start + MS);
        c.write_at(holder, &token, i as u64 + 1, true, start + 2 * MS);
        c.section_at(holder, false, start + 9 * MS);
    }
    // a late write that the fenced store refused is no violation either
    c.write_at("a", "tok-a", 1, false, t + 35 * MS);
    let report = c.report();
    assert_eq!(
        report,
        Report {
            windows: 3,
            ..Report::default()
        }
    );
    assert!(c.overlaps().is_empty() && c.interleavings().is_empty());
    assert!(c.overruns().is_empty() && c.stale_writes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_catches_a_planted_overlap() {
    let checker = Checker::default();
    let ms = 1_000_000u64;
    let t0 = mono_now();
    checker.record_mono("a", "tok-a", t0, t0 + 10 * ms);
    checker.record_mono("b", "tok-b", t0 + 10 * ms, t0 + 20 * ms);
    assert!(
        checker.overlaps().is_empty(),
        "touching windows do not overlap"
    );
    checker.record_mono("c", "tok-c", t0 + 15 * ms, t0 + 30 * ms);
    let overlaps = checker.overlaps();
    assert_eq!(overlaps.len(), 1);
    assert_eq!(
        (
            overlaps[0].first.holder.as_str(),
            overlaps[0].second.holder.as_str()
        ),
        ("b", "c")
    );
}

#[test]
fn control_the_checker_tells_an_overrun_from_an_overlap() {
    // The same two critical sections interleave in both cases; only the
    // validity windows differ. Milliseconds on the monotonic clock.
    let ms = 1_000_000;
    let t = mono_now();
    let run = |a_valid_until: u64| {
        let c = Checker::default();
        c.record_mono("a", "tok-a", t, t + a_valid_until * ms);
        c.section_at("a", true, t + ms);
        c.section_at("a", false, t + 13 * ms);
        c.record_mono("b", "tok-b", t + 11 * ms, t + 20 * ms);
        c.section_at("b", true, t + 12 * ms);
        c.section_at("b", false, t + 15 * ms);
        c.report()
    };
    // a's validity ended at 10 ms, b was granted at 11: a's work overran
    let overrun = run(10);
    println!("control overrun: {overrun:?}");
    assert_eq!(overrun.violations(), 0, "{overrun:?}");
    assert_eq!((overrun.overruns, overrun.overrun_interleavings), (1, 1));
    // a was still valid until 12.5 ms: the windows overlap and both were
    // valid inside the critical section from 12 ms
    let c = Checker::default();
    c.record_mono("a", "tok-a", t, t + 12 * ms + ms / 2);
    c.section_at("a", true, t + ms);
    c.section_at("a", false, t + 12 * ms + ms / 4);
    c.record_mono("b", "tok-b", t + 11 * ms, t + 20 * ms);
    c.section_at("b", true, t + 12 * ms);
    c.section_at("b", false, t + 15 * ms);
    let overlap = c.report();
    println!("control overlap: {overlap:?}");
    assert_eq!(overlap.overlaps, 1, "{overlap:?}");
    assert_eq!(overlap.unexplained_interleavings, 1, "{overlap:?}");
    assert_eq!(overlap.overruns, 0, "{overlap:?}");
    // entering after the validity ended is an overrun too, even alone
    let c = Checker::default();
    c.record_mono("a", "tok-a", t, t + 10 * ms);
    c.section_at("a", true, t + 10 * ms);
    c.section_at("a", false, t + 11 * ms);
    let late = c.report();
    assert_eq!((late.violations(), late.overruns), (0, 1), "{late:?}");
    // and a stale write accepted is a violation, a rejected one is not
    let c = Checker::default();
    c.record_mono("a", "tok-a", t, t + 10 * ms);
    c.record_mono("b", "tok-b", t + 11 * ms, t + 20 * ms);
    c.write_at("b", "tok-b", 2, true, t + 12 * ms);
    c.write_at("a", "tok-a", 1, false, t + 13 * ms);
    assert_eq!(c.report().violations(), 0);
    c.write_at("a", "tok-a", 1, true, t + 14 * ms);
    assert_eq!(c.stale_writes().len(), 1);
    assert_eq!(c.report().violations(), 1);
}

/// A history printed by other processes (the contender processes of the
/// fault tests) is read back line by line, other output ignored, and a
/// violation in it is caught as if it had been recorded here.
#[test]
fn a_violation_in_a_history_from_another_process_is_caught() {
    let t = mono_now();
    let output = [
        "running 1 test".to_owned(),
        line_window("p1", "tok-1", t, t + 10 * MS),
        format!("@@S p1 1 {}", t + MS),
        format!("@@S p1 0 {}", t + 8 * MS),
        format!(
            "test child ... {}",
            line_window("p2", "tok-2", t + 5 * MS, t + 15 * MS)
        ),
        format!("@@S p2 1 {}", t + 6 * MS),
        format!("@@S p2 0 {}", t + 7 * MS),
        format!("@@F p2 tok-2 2 1 {}", t + 6 * MS + MS / 2),
        format!("@@F p1 tok-1 1 1 {}", t + 7 * MS + MS / 2),
        "test result: ok".to_owned(),
    ]
    .join("\n");
    let c = Checker::default();
    assert_eq!(c.ingest(&output), 8, "every record line, and no other");
    let report = c.report();
    assert_eq!(report.windows, 2, "{report:?}");
    assert_eq!(report.overlaps, 1, "{report:?}");
    assert_eq!(report.unexplained_interleavings, 1, "{report:?}");
    assert_eq!(report.stale_writes, 1, "{report:?}");
    assert_eq!(report.overruns, 0, "{report:?}");
    assert_eq!(report.violations(), 3, "{report:?}");
}
