//! The tally's unit tests.

use super::*;

fn held(by: &str) -> Result<Reply, NodeError> {
    Ok(Reply::Refused {
        holder: Some(by.as_bytes().to_vec()),
    })
}
const OK: Result<Reply, NodeError> = Ok(Reply::Agreed(None));
const MISSING: Result<Reply, NodeError> = Ok(Reply::Refused { holder: None });
fn down() -> Result<Reply, NodeError> {
    Err(NodeError::Timeout)
}
fn wrongtype() -> Result<Reply, NodeError> {
    Err(NodeError::Reply(redis::RedisError::from((
        redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
        "WRONGTYPE",
    ))))
}

fn run(ask: Ask, answers: Vec<Result<Reply, NodeError>>) -> Tally {
    let mut t = Tally::new(ask, answers.len());
    for (i, a) in answers.into_iter().enumerate() {
        t.record(i, "n", a);
    }
    t
}

#[test]
fn conflict_only_when_another_holder_may_have_a_quorum() {
    let t = run(Ask::Acquire, vec![OK, held("a"), held("a"), held("a"), OK]);
    assert_eq!(t.outcome(), Outcome::Refused);
    let e = t.into_error("r");
    assert!(matches!(e, Error::Conflict { held: 3, .. }), "{e}");
    // a holder on two nodes plus one node we know nothing about
    let t = run(Ask::Acquire, vec![OK, held("a"), held("a"), down(), OK]);
    assert_eq!(t.outcome(), Outcome::MayBeHeld);
    assert!(matches!(t.into_error("r"), Error::Conflict { held: 2, .. }));
}

/// A release leaves silent nodes out only where it is `Ok` whatever
/// they answer: the rule `Until::AllAnswering` stops by.
#[test]
fn a_release_leaves_silent_nodes_out_only_where_they_cannot_decide_it() {
    let partial = |answers: Vec<Result<Reply, NodeError>>| {
        let mut t = Tally::new(Ask::Owned, 5);
        for (i, a) in answers.into_iter().enumerate() {
            t.record(i, "n", a);
        }
        t
    };
    // three released, two silent: Ok whatever they say
    assert!(partial(vec![OK, OK, OK]).released_without(2));
    // two released, one down, two silent: a quorum may still hold it
    assert!(!partial(vec![OK, OK, down()]).released_without(2));
    // two released, three silent
    assert!(!partial(vec![OK, OK]).released_without(3));
    // nothing released yet
    assert!(!partial(vec![]).released_without(1));
    // and the rule agrees with unlock's once the silent ones are counted
    let mut t = partial(vec![OK, OK, OK]);
    assert!(t.released_without(2));
    t.record(3, "n", Err(NodeError::Silent));
    t.record(4, "n", Err(NodeError::Silent));
    assert!(matches!(t.into_released("r"), Ok(3)));
    let mut t = partial(vec![OK, OK, down()]);
    t.record(3, "n", Err(NodeError::Silent));
    t.record(4, "n", Err(NodeError::Silent));
    assert!(t.into_released("r").is_err());
}

#[test]
fn a_shared_vote_is_a_split_not_a_conflict() {
    let t = run(Ask::Acquire, vec![OK, OK, held("a"), held("a"), held("b")]);
    assert_eq!(t.outcome(), Outcome::Split);
    assert!(t.decided());
}

#[test]
fn a_failed_acquisition_hears_every_node() {
    let mut t = Tally::new(Ask::Acquire, 5);
    t.record(0, "n", held("a"));
    t.record(1, "n", held("a"));
    t.record(2, "n", held("a"));
    assert_eq!(t.outcome(), Outcome::Refused);
    assert!(!t.decided(), "two more holders to count");
    t.record(3, "n", held("a"));
    t.record(4, "n", OK);
    assert!(t.decided());
    assert_eq!((t.refused, t.agreed.clone()), (4, vec![4]));
}

#[test]
fn owned_rounds_stop_once_the_answers_can_no_longer_change_it() {
    let mut t = Tally::new(Ask::Owned, 5);
    t.record(0, "n", MISSING);
    t.record(1, "n", MISSING);
    t.record(2, "n", OK);
    // no quorum of ours possible, and a third "no" would make it NotHeld
    assert!(!t.decided());
    t.record(3, "n", MISSING);
    assert!(t.decided());
    assert_eq!(t.outcome(), Outcome::Refused);
    let mut t = Tally::new(Ask::Owned, 5);
    t.record(0, "n", down());
    t.record(1, "n", down());
    t.record(2, "n", down());
    assert!(t.decided(), "neither outcome is possible any more");
    assert_eq!(t.outcome(), Outcome::NoQuorum);
}

#[test]
fn not_held_needs_a_quorum_of_answers() {
    // two refused, one paused: no quorum either way
    let t = run(Ask::Owned, vec![OK, OK, down(), MISSING, MISSING]);
    assert_eq!(t.outcome(), Outcome::NoQuorum);
    assert!(matches!(t.into_error("r"), Error::NoQuorum { .. }));
    let t = run(Ask::Owned, vec![OK, MISSING, MISSING, MISSING, down()]);
    assert!(matches!(t.into_error("r"), Error::NotHeld { .. }));
    // healed nodes are not ours yet
    let t = run(
        Ask::Owned,
        vec![OK, OK, Ok(Reply::Healed), Ok(Reply::Healed), down()],
    );
    assert_eq!((t.healed.len(), t.outcome()), (2, Outcome::NoQuorum));
}

#[test]
fn permanent_errors_and_unreachable_nodes() {
    let t = run(Ask::Acquire, vec![OK, OK, down(), down(), down()]);
    assert!(matches!(
        t.into_error("r"),
        Error::NoQuorum { granted: 2, .. }
    ));
    let t = run(
        Ask::Acquire,
        vec![OK, OK, wrongtype(), wrongtype(), wrongtype()],
    );
    assert!(matches!(t.into_error("r"), Error::Redis { .. }));
    // a minority of errors and a node down: retrying may help
    let t = run(Ask::Acquire, vec![OK, OK, wrongtype(), down(), down()]);
    assert!(matches!(t.into_error("r"), Error::NoQuorum { .. }));
}

#[test]
fn a_release_is_done_unless_a_quorum_may_still_hold_it() {
    let t = run(Ask::Owned, vec![OK, OK, down(), down(), MISSING]);
    assert_eq!(t.into_released("r").unwrap(), 2);
    let t = run(Ask::Owned, vec![OK, down(), down(), down(), MISSING]);
    assert!(matches!(t.into_released("r"), Err(Error::NoQuorum { .. })));
    let t = run(Ask::Owned, vec![MISSING; 5]);
    assert!(matches!(t.into_released("r"), Err(Error::NotHeld { .. })));
    let t = run(
        Ask::Owned,
        vec![OK, wrongtype(), wrongtype(), wrongtype(), OK],
    );
    assert!(matches!(t.into_released("r"), Err(Error::Redis { .. })));
}

#[test]
fn owned_rounds_wait_while_a_quorum_of_ours_is_possible() {
    let mut t = Tally::new(Ask::Owned, 5);
    t.record(0, "n", OK);
    t.record(1, "n", down());
    t.record(2, "n", down());
    assert!(!t.decided(), "the last two may still agree");
}

#[test]
fn owned_rounds_wait_while_one_answer_can_make_it_not_held() {
    let mut t = Tally::new(Ask::Owned, 5);
    t.record(0, "n", MISSING);
    t.record(1, "n", MISSING);
    t.record(2, "n", down());
    t.record(3, "n", down());
    assert!(!t.decided(), "a third \"no\" would make it NotHeld");
    t.record(4, "n", MISSING);
    assert!(t.decided());
    assert_eq!(t.outcome(), Outcome::Refused);
}

#[test]
fn healed_nodes_count_as_refusals() {
    let mut t = Tally::new(Ask::Owned, 5);
    t.record(0, "n", Ok(Reply::Healed));
    t.record(1, "n", Ok(Reply::Healed));
    t.record(2, "n", Ok(Reply::Healed));
    assert!(!t.decided(), "a healing renewal hears every node");
    t.record(3, "n", OK);
    t.record(4, "n", OK);
    assert!(t.decided());
    assert_eq!((t.refused, t.healed.clone()), (3, vec![0, 1, 2]));
    assert_eq!(t.outcome(), Outcome::Refused);
    assert!(matches!(t.into_error("r"), Error::NotHeld { .. }));
}

#[test]
fn errors_decide_only_when_they_leave_no_quorum() {
    let mut t = Tally::new(Ask::Owned, 5);
    for i in 0..3 {
        t.record(i, "n", wrongtype());
    }
    assert!(t.decided(), "two answers cannot make a quorum either way");
    assert_eq!(t.outcome(), Outcome::Errors);
    // two errors leave exactly a quorum of nodes: retrying may help
    let t = run(Ask::Acquire, vec![OK, OK, wrongtype(), wrongtype(), down()]);
    assert!(t.decided());
    assert_eq!((t.errors, t.unknown), (2, 1));
    assert_eq!(t.outcome(), Outcome::NoQuorum);
    assert!(matches!(t.into_error("r"), Error::NoQuorum { .. }));
}

#[test]
fn two_entries_for_one_server_are_a_configuration_error() {
    let mut t = Tally::new(Ask::Acquire, 3);
    t.record(0, "a:1", OK);
    t.record(
        1,
        "b:1",
        Err(NodeError::SameServer {
            other_index: 0,
            other_node: "a:1".to_owned(),
        }),
    );
    t.record(2, "c:1", down());
    assert_eq!(t.outcome(), Outcome::NoQuorum);
    let e = t.into_error("r");
    assert!(
        matches!(
            &e,
            Error::DuplicateNode { index: 1, node, first: 0, first_node }
                if node == "b:1" && first_node == "a:1"
        ),
        "{e}"
    );
}

#[test]
fn the_quorum_is_timed() {
    let t = run(Ask::Acquire, vec![OK, held("a"), OK]);
    assert!(t.quorum_at.is_some() && t.decided());
    assert_eq!(t.outcome(), Outcome::Quorum);
}
