//! Issue 21's schedule for the shared fencing counter, replayed step by
//! step: with a write that trusts a restarted node at once (`Resync::Always`)
//! a token repeats; with the design (`Resync::Aged`) the second holder's
//! read fails closed.

use redlock_model::{Action, Body, Cfg, LockModel, Msg, OTHER, Resync, State};
use stateright::Model;

fn deliver(m: &LockModel, s: &State, client: u8, node: u8, pick: impl Fn(&Body) -> bool) -> State {
    let msg: Msg = s
        .net
        .iter()
        .find(|x| x.client == client && x.node == node && pick(&x.body))
        .unwrap_or_else(|| panic!("no message c{client}→n{node} in {}", m.summary(s)))
        .clone();
    m.next_state(s, Action::Deliver(msg)).unwrap()
}

fn schedule(resync: Resync) -> (LockModel, State) {
    let m = LockModel::new(Cfg {
        resync,
        symmetry: false,
        ..Cfg::shared_counter()
    });
    let (a, b, o) = (0u8, 1u8, 2u8);
    let set = |b: &Body| matches!(b, Body::Set(_));
    let read = |b: &Body| matches!(b, Body::FenceRead(..));
    let write = |b: &Body| matches!(b, Body::FenceWrite(..));
    let mut s = m.init_states().remove(0);
    let step = |s: &State, a: Action| m.next_state(s, a).unwrap();
    // A locks and reads: n0 is ahead (1), n1 and n2 have no counter.
    s = step(&s, Action::Acquire(a));
    for n in 0..3 {
        s = deliver(&m, &s, a, n, set);
    }
    s = step(&s, Action::Fence(a));
    for n in 0..3 {
        s = deliver(&m, &s, a, n, read);
    }
    // A's write of 2 reaches n0, which then restarts empty.
    s = deliver(&m, &s, a, 0, write);
    s = step(&s, Action::Lose(0));
    // The other name's holder reads every node (n1 before A's write).
    s = step(&s, Action::Fence(o));
    for n in 0..3 {
        s = deliver(&m, &s, o, n, read);
    }
    // Its write of 1 lands on n0 and n2; then A's write reaches n1: A's
    // token 2 is issued (n0 and n1).
    s = deliver(&m, &s, o, 0, write);
    s = deliver(&m, &s, o, 2, write);
    s = deliver(&m, &s, a, 1, write);
    assert_eq!(s.fence_max, 2, "{}", m.summary(&s));
    s = step(&s, Action::Release(a));
    // B locks on n0 and n2 and reads them; n1 is silent.
    s = step(&s, Action::Acquire(b));
    s = deliver(&m, &s, b, 0, set);
    s = deliver(&m, &s, b, 2, set);
    s = step(&s, Action::Fence(b));
    s = deliver(&m, &s, b, 0, read);
    s = deliver(&m, &s, b, 2, read);
    if s.net
        .iter()
        .any(|x| x.client == b && matches!(x.body, Body::FenceWrite(..)))
    {
        s = deliver(&m, &s, b, 0, write);
        s = deliver(&m, &s, b, 2, write);
    }
    let _ = OTHER;
    (m, s)
}

#[test]
fn trusting_a_restarted_node_at_once_repeats_a_token() {
    let (m, s) = schedule(Resync::Always);
    assert_eq!(s.fence_repeat, Some((2, 2)), "{}", m.summary(&s));
}

#[test]
fn the_aged_rule_fails_closed_instead() {
    let (m, s) = schedule(Resync::Aged);
    assert_eq!(s.fence_repeat, None, "{}", m.summary(&s));
    assert_eq!(s.fence_max, 2);
}
