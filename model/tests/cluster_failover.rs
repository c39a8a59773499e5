//! Redis Clusters as nodes (issue 24): a cluster node's data rolls back to
//! its replica's in a failover. With plain agreement the checker must find
//! the mutual-exclusion violation (a planted violation: these tests fail if
//! it stops finding it); with acknowledged agreement (`WAIT 1`) exclusion
//! must hold, on cluster nodes and on a mixed list. Each schedule is also
//! replayed step by step, and the cheaper `Replication::Deferred` is
//! checked against the definition, `Replication::Stepwise`.
//!
//! One checker at a time (the machine has two cores, and each checker uses
//! two threads): every test that runs one holds `CHECKER`.

use std::collections::{HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};

use redlock_model::{
    Action, Agreement, Body, Cfg, Held, KEYS, LockModel, Msg, Replication, Run, Search, State,
    check,
};
use stateright::Model;

static CHECKER: Mutex<()> = Mutex::new(());

fn one_checker() -> MutexGuard<'static, ()> {
    CHECKER.lock().unwrap_or_else(|e| e.into_inner())
}

const SAFETY: [&str; 3] = ["mutual exclusion", "tenure continuity", "recovers"];

fn report(name: &str, run: &Run) {
    println!(
        "{name}: {} unique states, max depth {}, {:.1} s, exhausted: {}",
        run.unique_states, run.max_depth, run.seconds, run.exhausted
    );
}

/// The checker must find a counterexample to `property` whose trace has a
/// failover in it (the violation comes from the rollback).
fn must_fail(name: &str, cfg: Cfg, property: &'static str) -> String {
    let _one = one_checker();
    let run = check(cfg, Search::Bfs, 2, Some(property));
    report(name, &run);
    let trace = run
        .found(property)
        .unwrap_or_else(|| panic!("{name}: the checker found no counterexample to {property}"));
    println!("{name}: counterexample to \"{property}\":\n{trace}");
    assert!(
        trace.contains("Failover"),
        "{name}: a counterexample without a failover:\n{trace}"
    );
    trace.to_owned()
}

/// Every safety property holds in an exhaustive search, and each witness
/// is reached.
fn must_hold(name: &str, cfg: Cfg, witnesses: &[&str]) {
    let _one = one_checker();
    let run = check(cfg, Search::Bfs, 2, None);
    report(name, &run);
    assert!(run.exhausted, "{name}: checked exhaustively");
    for p in SAFETY {
        assert!(
            run.found(p).is_none(),
            "{name}: {p} fails:\n{}",
            run.found(p).unwrap()
        );
    }
    for w in witnesses {
        assert!(run.found(w).is_some(), "{name}: vacuous, no \"{w}\"");
    }
}

#[test]
fn plain_agreement_loses_the_lock_in_a_failover() {
    must_fail(
        "cluster nodes, plain agreement, 1 failover (planted)",
        Cfg::cluster(Agreement::Plain),
        "mutual exclusion",
    );
}

#[test]
fn plain_agreement_on_a_mixed_list_loses_the_lock_in_a_failover() {
    must_fail(
        "two cluster nodes and a standalone one, plain agreement, 1 failover (planted)",
        Cfg::mixed(Agreement::Plain),
        "mutual exclusion",
    );
}

/// The control: the same configuration without the failover holds, so the
/// violation above is the rollback's.
#[test]
fn plain_agreement_holds_without_a_failover() {
    must_hold(
        "cluster nodes, plain agreement, no failover",
        Cfg {
            failovers: 0,
            ..Cfg::cluster(Agreement::Plain)
        },
        &["a lock is granted"],
    );
}

#[test]
fn acknowledged_agreement_keeps_exclusion_through_a_failover() {
    must_hold(
        "cluster nodes, acknowledged agreement, 1 failover",
        Cfg::cluster(Agreement::Acknowledged),
        &["a lock is granted"],
    );
}

#[test]
fn acknowledged_agreement_recovers_after_a_failover() {
    must_hold(
        "cluster nodes, acknowledged agreement, 1 failover (liveness, 1 tick)",
        Cfg {
            max_time: 1,
            liveness: true,
            ..Cfg::cluster(Agreement::Acknowledged)
        },
        &["a lock is granted"],
    );
}

/// A standalone node has no replica: with acknowledged agreement its vote
/// never counts, and the lock needs both cluster nodes.
#[test]
fn acknowledged_agreement_on_a_mixed_list_keeps_exclusion() {
    must_hold(
        "two cluster nodes and a standalone one, acknowledged agreement, 1 failover",
        Cfg::mixed(Agreement::Acknowledged),
        &["a lock is granted"],
    );
}

/// Larger budgets than the exhaustive rows (a watchdog renewal per client,
/// a failover on every node, 4 ticks), by random walks: not exhaustive.
#[test]
fn acknowledged_agreement_survives_random_walks_with_every_node_failing_over() {
    let _one = one_checker();
    let cfg = Cfg {
        max_time: 4,
        extends: 1,
        failovers: 3,
        ..Cfg::cluster(Agreement::Acknowledged)
    };
    let run = check(
        cfg,
        Search::Random {
            seed: 24,
            seconds: 4,
        },
        2,
        None,
    );
    report(
        "cluster nodes, acknowledged agreement, 3 failovers, random walks (4 s)",
        &run,
    );
    for p in SAFETY {
        assert!(
            run.found(p).is_none(),
            "{p} fails:\n{}",
            run.found(p).unwrap()
        );
    }
    assert!(run.found("a lock is granted").is_some());
}

// Replayed schedules.

fn deliver(m: &LockModel, s: &State, client: u8, node: u8, pick: impl Fn(&Body) -> bool) -> State {
    let msg: Msg = s
        .net
        .iter()
        .find(|x| x.client == client && x.node == node && pick(&x.body))
        .unwrap_or_else(|| panic!("no message c{client}→n{node} in {}", m.summary(s)))
        .clone();
    step(m, s, Action::Deliver(msg))
}

/// Takes `a`, which must be enabled.
fn step(m: &LockModel, s: &State, a: Action) -> State {
    let mut enabled = Vec::new();
    m.actions(s, &mut enabled);
    assert!(
        enabled.contains(&a),
        "{a:?} is not enabled in {}",
        m.summary(s)
    );
    m.next_state(s, a).unwrap()
}

fn set(b: &Body) -> bool {
    matches!(b, Body::Set(_))
}

fn extend(b: &Body) -> bool {
    matches!(b, Body::Extend(_))
}

fn model(agreement: Agreement, extends: u8) -> (LockModel, State) {
    let m = LockModel::new(Cfg {
        symmetry: false,
        extends,
        ..Cfg::cluster(agreement)
    });
    let s = m.init_states().remove(0);
    (m, s)
}

/// A's SET lands on n0 and n1; n0 fails over before its replica has it;
/// B's SET lands on n0 and n2.
fn rollback_of_an_acquisition(agreement: Agreement) -> (LockModel, State) {
    let (m, mut s) = model(agreement, 0);
    let acked = agreement == Agreement::Acknowledged;
    let (a, b) = (0u8, 1u8);
    s = step(&m, &s, Action::Acquire(a));
    s = step(&m, &s, Action::Acquire(b));
    s = deliver(&m, &s, a, 0, set);
    s = deliver(&m, &s, a, 1, set);
    if acked {
        s = step(&m, &s, Action::Replicate(1));
    }
    s = step(&m, &s, Action::Failover(0, 0));
    s = deliver(&m, &s, b, 0, set);
    if acked {
        s = step(&m, &s, Action::Replicate(0));
    }
    s = deliver(&m, &s, b, 2, set);
    if acked {
        s = step(&m, &s, Action::Replicate(2));
        // A's SET reaches n2 last, and is refused there.
        s = deliver(&m, &s, a, 2, set);
    }
    (m, s)
}

#[test]
fn plain_agreement_grants_twice_when_a_failover_rolls_back_a_set() {
    let (m, s) = rollback_of_an_acquisition(Agreement::Plain);
    assert!(m.believes(&s, 0) && m.believes(&s, 1), "{}", m.summary(&s));
}

#[test]
fn acknowledged_agreement_counts_no_set_that_a_failover_rolls_back() {
    let (m, s) = rollback_of_an_acquisition(Agreement::Acknowledged);
    assert!(!m.believes(&s, 0), "{}", m.summary(&s));
    assert!(m.believes(&s, 1), "{}", m.summary(&s));
}

/// A holds on n0 and n1 (acknowledged), and its watchdog extends on both
/// at t1; n0 fails over before its replica has the extension, so A's key
/// there keeps the old expiry, which a fast clock ends at t2; B then takes
/// n0 and n2 while A believes its extension.
fn rollback_of_an_extension(agreement: Agreement) -> (LockModel, State) {
    let (m, mut s) = model(agreement, 1);
    let (a, b) = (0u8, 1u8);
    s = step(&m, &s, Action::Acquire(a));
    for n in 0..2 {
        s = deliver(&m, &s, a, n, set);
        s = step(&m, &s, Action::Replicate(n));
    }
    assert!(m.believes(&s, 0), "{}", m.summary(&s));
    s = step(&m, &s, Action::Tick);
    s = step(&m, &s, Action::Extend(a));
    s = deliver(&m, &s, a, 0, extend);
    s = deliver(&m, &s, a, 1, extend);
    s = step(&m, &s, Action::Failover(0, 0));
    if agreement == Agreement::Acknowledged {
        s = step(&m, &s, Action::Replicate(1));
    }
    s = step(&m, &s, Action::Tick);
    if s.nodes[0].keys[0].is_some() {
        s = step(&m, &s, Action::Expire(0, 0));
    }
    s = step(&m, &s, Action::Acquire(b));
    for n in [0, 2] {
        s = deliver(&m, &s, b, n, set);
        s = step(&m, &s, Action::Replicate(n));
    }
    (m, s)
}

#[test]
fn an_extension_not_acknowledged_is_lost_in_a_failover() {
    let (m, s) = rollback_of_an_extension(Agreement::AcquireOnly);
    assert!(m.believes(&s, 0) && m.believes(&s, 1), "{}", m.summary(&s));
}

#[test]
fn an_acknowledged_extension_counts_only_what_the_replica_has() {
    let (m, s) = rollback_of_an_extension(Agreement::Acknowledged);
    assert!(!m.believes(&s, 0), "{}", m.summary(&s));
    assert!(m.believes(&s, 1), "{}", m.summary(&s));
}

// Deferred replication against the definition.

/// A node as the clients see it: up, its keys, the replies it holds.
type SeenNode = (bool, [Option<(u8, u8)>; KEYS], Vec<Held>);

/// What a client or the properties can see of a state: everything but the
/// replica's data and how much of the stream it has.
#[derive(PartialEq, Eq, Hash, Debug)]
struct Seen {
    now: u8,
    nodes: Vec<SeenNode>,
    clients: Vec<redlock_model::Client>,
    net: Vec<Msg>,
    failovers: u8,
}

fn seen(s: &State) -> Seen {
    Seen {
        now: s.now,
        nodes: s
            .nodes
            .iter()
            .map(|n| {
                let held = n
                    .replica
                    .iter()
                    .flat_map(|r| r.backlog.iter().filter_map(|e| e.reply.clone()))
                    .collect();
                (n.up, n.keys, held)
            })
            .collect(),
        clients: s.clients.clone(),
        net: s.net.clone(),
        failovers: s.failovers,
    }
}

/// Every reachable state, by breadth-first search, as the clients see it.
fn reachable(cfg: Cfg) -> (usize, HashSet<Seen>) {
    let m = LockModel::new(cfg);
    let mut states: HashSet<State> = HashSet::new();
    let mut queue: VecDeque<State> = m.init_states().into();
    let mut out = HashSet::new();
    let mut actions = Vec::new();
    while let Some(s) = queue.pop_front() {
        if !states.insert(s.clone()) {
            continue;
        }
        out.insert(seen(&s));
        actions.clear();
        m.actions(&s, &mut actions);
        for a in actions.drain(..) {
            let next = m.next_state(&s, a).unwrap();
            if !states.contains(&next) {
                queue.push_back(next);
            }
        }
    }
    (states.len(), out)
}

/// Both schedulings reach the same states as the clients see them, with
/// each agreement. `extends` renewals per client at 0 ticks: 1 is about
/// 2.5 M stepwise states (the ignored test below), 0 is small.
fn deferred_matches_stepwise(extends: u8) {
    let _one = one_checker();
    for agreement in [Agreement::Plain, Agreement::Acknowledged] {
        let cfg = |replication| Cfg {
            max_time: 0,
            extends,
            symmetry: false,
            replication,
            ..Cfg::cluster(agreement)
        };
        let (n_step, stepwise) = reachable(cfg(Replication::Stepwise));
        let (n_def, deferred) = reachable(cfg(Replication::Deferred));
        println!(
            "{agreement:?}, {extends} renewals: stepwise {n_step} states, deferred {n_def}, {} as the clients see them",
            stepwise.len()
        );
        assert!(n_def < n_step, "{agreement:?}: deferred is no smaller");
        assert_eq!(stepwise.len(), deferred.len(), "{agreement:?}");
        assert!(
            stepwise == deferred,
            "{agreement:?}: the clients see different states"
        );
    }
}

#[test]
fn deferred_replication_has_the_behaviours_of_stepwise_replication() {
    deferred_matches_stepwise(0);
}

/// About 8 minutes and 8 GB: `cargo test --release --test cluster_failover
/// -- --ignored`.
#[test]
#[ignore]
fn deferred_replication_has_the_behaviours_of_stepwise_replication_with_renewals() {
    deferred_matches_stepwise(1);
}
