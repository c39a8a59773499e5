//! The release gate of the waiting protocol (`src/gate.rs`): a release
//! publishes only when the flag key F was there, and a confirmed waiter
//! always has F there. The design must hold exhaustively, with broadcast
//! wake-ups and with a named successor; each planted violation must be
//! found, with its trace printed (these tests fail if the checker stops
//! finding them).
//!
//! One checker at a time (the machine has two cores, and each checker uses
//! two threads): every test holds `CHECKER`.

use std::sync::Mutex;

use redlock_model::gate::{self, GATE_OPEN, GateCfg, NOT_STRANDED, Wake};
use redlock_model::{Run, Search};

static CHECKER: Mutex<()> = Mutex::new(());

const WITNESSES: [&str; 3] = [
    "a release publishes",
    "a release takes the cheap path",
    "a woken waiter takes the lock",
];

/// An exhaustive BFS (on two threads) in which `properties` hold.
///
/// Stateright keeps the last counterexample it meets for a property, not
/// the first (a violation stays in every later state here), so a property
/// expected to fail is shown by [`fails`] instead.
fn holds(name: &str, cfg: GateCfg, properties: &[&str]) -> Run {
    let _one = CHECKER.lock().unwrap_or_else(|e| e.into_inner());
    let run = gate::check(cfg, Search::Bfs, 2, None);
    report(name, &run);
    assert!(run.exhausted, "{name}: checked exhaustively");
    for p in properties {
        if let Some(trace) = run.found(p) {
            panic!("{name}: \"{p}\" fails:\n{trace}");
        }
    }
    run
}

/// A BFS on one thread (the shortest trace) that stops at the first
/// counterexample to `property`, which it must find.
fn fails(name: &str, cfg: GateCfg, property: &'static str) -> String {
    let _one = CHECKER.lock().unwrap_or_else(|e| e.into_inner());
    let run = gate::check(cfg, Search::Bfs, 1, Some(property));
    report(name, &run);
    let trace = run
        .found(property)
        .unwrap_or_else(|| panic!("{name}: the checker found no counterexample to {property}"));
    println!("{name}: counterexample to \"{property}\":\n{trace}");
    trace.to_owned()
}

fn report(name: &str, run: &Run) {
    println!(
        "{name}: {} unique states, max depth {}, {:.1} s, exhausted: {}",
        run.unique_states, run.max_depth, run.seconds, run.exhausted
    );
}

/// The design: both properties hold in every reachable state, and each
/// witness is reached (the cheap path, a publish, a woken waiter served).
fn design_holds(name: &str, cfg: GateCfg) {
    let run = holds(name, cfg, &[GATE_OPEN, NOT_STRANDED]);
    for w in WITNESSES {
        assert!(run.found(w).is_some(), "{name}: vacuous, no \"{w}\"");
    }
}

/// A planted fault in the gate: a loud release skips the publish while a
/// confirmed waiter may sleep (the gate's trace is returned), and a
/// sleeper is left with K free.
fn gate_fails(name: &str, cfg: GateCfg) -> String {
    fails(name, cfg.clone(), NOT_STRANDED);
    fails(name, cfg, GATE_OPEN)
}

#[test]
fn broadcast_design_opens_the_gate_for_every_confirmed_waiter() {
    design_holds(
        "broadcast, 3 managers, 2 waits each, 3 holder turns",
        GateCfg::design(Wake::Broadcast),
    );
}

#[test]
fn named_successor_design_opens_the_gate_for_every_confirmed_waiter() {
    design_holds(
        "named successor, 3 managers, 2 waits each, 3 holder turns",
        GateCfg::design(Wake::Named),
    );
}

/// Planted violation 1: F deleted on the slow path and not re-created; the
/// next release finds no F while a waiter still waits.
#[test]
fn without_recreation_the_next_release_misses_a_waiter() {
    for wake in [Wake::Broadcast, Wake::Named] {
        let trace = gate_fails(
            &format!("no re-creation ({wake:?}, planted)"),
            GateCfg::no_recreate(wake),
        );
        assert!(
            trace.matches("Release").count() >= 2,
            "the second release misses:\n{trace}"
        );
    }
}

/// Planted violation 2: the link confirms before `SET F` lands.
#[test]
fn confirming_before_f_lands_misses_a_waiter() {
    gate_fails("confirmed before F (planted)", GateCfg::confirm_early());
}

/// Planted violation 3, a negative configuration (the documented
/// degradation): F lapses while a manager renews it.
#[test]
fn a_lapsed_flag_misses_a_waiter() {
    let trace = gate_fails("F lapses while renewed (negative)", GateCfg::lapse());
    assert!(trace.contains("Lapse"), "{trace}");
}

/// The remedy for the lapse: the release still skips its publish, but the
/// link that sees its renewal late sets F again and wakes its waiters, so
/// no sleeper is stranded.
#[test]
fn a_relink_after_a_lapse_strands_nobody() {
    let name = "F lapses, the link sets it again and wakes its waiters";
    holds(name, GateCfg::lapse_relink(), &[NOT_STRANDED]);
    fails(name, GateCfg::lapse_relink(), GATE_OPEN);
}

/// `SET F` sent without waiting for `SUBSCRIBE`: the node may run it first,
/// and a release between deletes F without re-creating it (NUMSUB 0).
#[test]
fn set_f_before_subscribe_misses_a_waiter() {
    let trace = gate_fails(
        "SUBSCRIBE not awaited (planted)",
        GateCfg::subscribe_unawaited(),
    );
    assert!(trace.contains("Subscribe("), "{trace}");
}

/// The gate holds, but a wake-up that overtakes the attempt's refusal (two
/// connections) and is dropped strands the waiter.
#[test]
fn a_dropped_early_wake_strands_a_sleeper() {
    let name = "a wake-up before the refusal dropped (planted)";
    holds(name, GateCfg::drop_early_wake(), &[GATE_OPEN]);
    fails(name, GateCfg::drop_early_wake(), NOT_STRANDED);
}

/// The gate holds, but a named waiter that gives up strands the others
/// unless the releaser's hand-off check publishes again.
#[test]
fn a_named_release_needs_the_handoff_check() {
    let name = "named, no hand-off check, a waiter gives up (planted)";
    holds(name, GateCfg::named_without_check(), &[GATE_OPEN]);
    let trace = fails(name, GateCfg::named_without_check(), NOT_STRANDED);
    assert!(trace.contains("Leave("), "{trace}");
}
