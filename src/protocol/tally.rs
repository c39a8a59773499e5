//! The quorum rule: how many nodes must agree, when a round has heard
//! enough to be decided, and what a round that did not reach a quorum means.
//!
//! Every "no" is read strictly. A node that did not answer, or answered that
//! it is busy, says nothing about the key: it never counts as a refusal. So:
//! - an acquisition is a [`Conflict`](Error::Conflict) only when another
//!   holder has, or may have, a quorum (the nodes it holds plus the nodes we
//!   know nothing about reach a quorum);
//! - a round where contenders shared the nodes and none can have a quorum is
//!   a split vote, which the attempt settles by trying again at once;
//! - extend and unlock answer [`NotHeld`](Error::NotHeld) only when a quorum
//!   answered that the key is not ours; fewer answers are a
//!   [`NoQuorum`](Error::NoQuorum), which a watchdog retries.

use std::time::Instant;

use crate::protocol::error::{Error, NodeError, NodeFailure};
use crate::protocol::quorum::{self, Ask, Outcome, Reply, quorum};

/// What a round found.
#[derive(Debug)]
pub(crate) struct Tally {
    ask: Ask,
    nodes: usize,
    /// Nodes that agreed.
    pub(crate) granted: usize,
    /// Nodes that answered that the key is not ours (healed ones included).
    pub(crate) refused: usize,
    /// The positions of the nodes where a renewal set the missing key again.
    pub(crate) healed: Vec<usize>,
    /// For acquisitions: how many nodes each other holder's value was seen on.
    holders: Vec<(Vec<u8>, usize)>,
    /// Nodes whose state is unknown: timed out, unreachable, busy.
    pub(crate) unknown: usize,
    /// The positions of the nodes that agreed but are too young to count
    /// (restart guard): our key may be there.
    pub(crate) young: Vec<usize>,
    /// How many nodes' fencing counters were read (not too young), the lock
    /// ours there or not.
    pub(crate) read: usize,
    /// How many of them had an untrusted counter.
    pub(crate) untrusted: usize,
    /// Nodes that answered with an error retrying cannot fix.
    pub(crate) errors: usize,
    /// The positions of the nodes that took a write but could not confirm
    /// its durability: our key may be there.
    pub(crate) wrote: Vec<usize>,
    /// What each node that did not agree said.
    pub(crate) failures: Vec<NodeFailure>,
    /// The positions of the nodes whose state is unknown.
    pub(crate) unanswered: Vec<usize>,
    /// The positions of the nodes that agreed.
    pub(crate) agreed: Vec<usize>,
    /// Two entries of the node list that reach one server, if seen: the
    /// later entry's index and label, the earlier one's index and label.
    pub(crate) same_server: Option<(usize, String, usize, String)>,
    /// When the quorum was reached, if it was.
    pub(crate) quorum_at: Option<Instant>,
    /// The highest integer reply of the nodes that agreed (the fencing read
    /// uses it).
    pub(crate) highest: Option<i64>,
}

impl Tally {
    pub(crate) fn new(ask: Ask, nodes: usize) -> Self {
        Tally {
            ask,
            nodes,
            granted: 0,
            refused: 0,
            healed: Vec::new(),
            holders: Vec::new(),
            unknown: 0,
            young: Vec::new(),
            read: 0,
            untrusted: 0,
            errors: 0,
            wrote: Vec::new(),
            failures: Vec::new(),
            unanswered: Vec::new(),
            agreed: Vec::new(),
            same_server: None,
            quorum_at: None,
            highest: None,
        }
    }

    fn required(&self) -> usize {
        quorum(self.nodes)
    }

    fn answered(&self) -> usize {
        self.granted + self.refused + self.unknown + self.young.len() + self.errors
    }

    fn pending(&self) -> usize {
        self.nodes - self.answered()
    }

    /// Counts one node's answer.
    pub(crate) fn record(&mut self, index: usize, node: &str, answer: Result<Reply, NodeError>) {
        let cause = match answer {
            Ok(Reply::Agreed(number)) => {
                if self.ask == Ask::Fence {
                    self.read += 1;
                }
                self.granted += 1;
                self.agreed.push(index);
                self.highest = self.highest.max(number);
                if self.granted == self.required() {
                    self.quorum_at = Some(Instant::now());
                }
                return;
            }
            Ok(Reply::Untrusted(number)) => {
                self.untrusted += 1;
                return self.record(index, node, Ok(Reply::Agreed(Some(number))));
            }
            Ok(Reply::Foreign { number, trusted }) => {
                self.read += 1;
                self.untrusted += usize::from(!trusted);
                self.highest = self.highest.max(Some(number));
                self.refused += 1;
                NodeError::NotOurs
            }
            Ok(Reply::Young {
                age,
                max_ttl,
                healed,
            }) => {
                self.young.push(index);
                if healed {
                    self.healed.push(index);
                }
                NodeError::Young { age, max_ttl }
            }
            Ok(Reply::Healed) => {
                self.refused += 1;
                self.healed.push(index);
                NodeError::NotOurs
            }
            Ok(Reply::Refused { holder }) => {
                self.refused += 1;
                match holder {
                    None => NodeError::NotOurs,
                    Some(value) => {
                        match self.holders.iter_mut().find(|(v, _)| *v == value) {
                            Some((_, n)) => *n += 1,
                            None => self.holders.push((value, 1)),
                        }
                        NodeError::Held
                    }
                }
            }
            Err(cause) => {
                if let NodeError::SameServer {
                    other_index,
                    other_node,
                } = &cause
                {
                    self.same_server =
                        Some((index, node.to_owned(), *other_index, other_node.clone()));
                }
                if matches!(cause, NodeError::Durability(_)) {
                    self.wrote.push(index);
                }
                if cause.is_transient() {
                    self.unknown += 1;
                    self.unanswered.push(index);
                } else {
                    self.errors += 1;
                }
                cause
            }
        };
        self.failures.push(NodeFailure {
            node: node.to_owned(),
            cause,
        });
    }

    /// The refusals that make up someone else's quorum: the largest number
    /// of nodes one other holder was seen on (acquire), or all the "not
    /// ours" answers (owned).
    fn claim(&self) -> usize {
        match self.ask {
            Ask::Acquire => self.holders.iter().map(|(_, n)| *n).max().unwrap_or(0),
            Ask::Owned | Ask::Fence => self.refused,
        }
    }

    /// Whether the round can stop listening. An acquisition stops at a
    /// quorum, and otherwise hears every node: its error then counts every
    /// holder, and it knows which nodes it need not release (those that
    /// answered with another holder's value did not take our `SET`). Other
    /// rounds stop as soon as more answers could not change the outcome.
    pub(crate) fn decided(&self) -> bool {
        let required = self.required();
        if self.pending() == 0 {
            return true;
        }
        if self.granted >= required {
            // More answers can only prove a fencing read, never unprove it:
            // one that comes in moves a node from silent to answering.
            return self.ask != Ask::Fence || self.proven();
        }
        if self.ask == Ask::Acquire || self.granted + self.pending() >= required {
            return false;
        }
        if !self.healed.is_empty() {
            // A failed renewal that set keys again hears every node, to
            // know every key it set.
            return false;
        }
        // No quorum for us. Is it refused, and can more answers change that?
        let claim = self.claim();
        claim >= required || claim + self.pending() < required
    }

    /// Whether a fencing read may be used: see [`quorum::proven`].
    pub(crate) fn proven(&self) -> bool {
        quorum::proven(self.nodes, self.read, self.untrusted)
    }

    /// The configuration error when two entries of the node list turned out
    /// to be one server.
    pub(crate) fn same_server_error(&self) -> Option<Error> {
        self.same_server
            .as_ref()
            .map(|(index, node, first, first_node)| Error::DuplicateNode {
                index: *index,
                node: node.clone(),
                first: *first,
                first_node: first_node.clone(),
            })
    }

    /// What the round amounts to.
    pub(crate) fn outcome(&self) -> Outcome {
        let required = self.required();
        let claim = self.claim();
        if self.quorum_at.is_some() {
            Outcome::Quorum
        } else if claim >= required {
            Outcome::Refused
        } else if self.ask == Ask::Acquire && claim > 0 && claim + self.unknown >= required {
            // Nodes we know nothing about may be the holder's too.
            Outcome::MayBeHeld
        } else if self.errors > 0 && self.nodes - self.errors < required {
            Outcome::Errors
        } else if self.ask == Ask::Acquire && !self.holders.is_empty() {
            Outcome::Split
        } else {
            Outcome::NoQuorum
        }
    }

    /// Whether a release round is `Ok` ([`into_released`](Tally::into_released))
    /// whatever `silent` more nodes answer, counting them as not answering:
    /// only then may it stop without them.
    pub(crate) fn released_without(&self, silent: usize) -> bool {
        self.granted > 0 && self.unknown + self.errors + silent < self.required()
    }

    /// Unlock's rule, for a release round: released when some node released
    /// the key and the nodes that may still hold it (they failed or did not
    /// answer) are too few to make a quorum; otherwise the error that says
    /// why the lock may still be in force, or that it was not ours.
    pub(crate) fn into_released(self, resource: &str) -> Result<usize, Error> {
        if self.granted > 0 && self.unknown + self.errors < self.required() {
            return Ok(self.granted);
        }
        Err(self.into_error(resource))
    }

    /// The error for a round that did not reach a quorum, named after what
    /// prevented it (see the module docs).
    pub(crate) fn into_error(self, resource: &str) -> Error {
        if let Some(error) = self.same_server_error() {
            return error;
        }
        let required = self.required();
        let resource = resource.to_owned();
        match (self.outcome(), self.ask) {
            (Outcome::Refused | Outcome::MayBeHeld | Outcome::Split, Ask::Acquire) => {
                Error::Conflict {
                    resource,
                    held: self.refused,
                    required,
                    nodes: self.nodes,
                    failures: self.failures,
                }
            }
            (Outcome::Refused, Ask::Owned | Ask::Fence) => Error::NotHeld { resource },
            (Outcome::Errors, _) => Error::Redis {
                resource,
                granted: self.granted,
                required,
                failures: self.failures,
            },
            _ => Error::NoQuorum {
                resource,
                granted: self.granted,
                required,
                failures: self.failures,
            },
        }
    }
}

#[cfg(test)]
mod tests {
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
}
