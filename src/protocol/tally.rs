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
                if self.agreed.is_empty() {
                    // Room for every node at once: grown one push at a
                    // time, a release that every node agreed to
                    // allocated twice.
                    self.agreed.reserve_exact(self.nodes);
                }
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
mod tests;
