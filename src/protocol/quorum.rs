//! The quorum rule and its vocabulary: how many nodes must agree, what a
//! round asks, how one node answered, how a round ended, and when a fencing
//! read is proven. Counting the answers of a round is the
//! [`tally`](crate::protocol::tally).

/// How many of `nodes` nodes must agree: a strict majority, `nodes / 2 + 1`.
pub(crate) const fn quorum(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// What a round asks, which decides what a "no" means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// Acquisition: a "no" is another holder's key.
    Acquire,
    /// Extend, unlock, the fencing write, a remote check: a "no" is "not
    /// ours".
    Owned,
    /// The fencing read: as `Owned`, and it listens on past a quorum until
    /// the read is proven (see [`proven`]).
    Fence,
}

/// How one node answered, once its reply was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// It agreed; the number is the script's integer reply, if any.
    Agreed(Option<i64>),
    /// The key is not ours there: held by `holder` (when the reply says), or
    /// missing.
    Refused { holder: Option<Vec<u8>> },
    /// The key was missing and the renewal set it again with our token: not
    /// ours when the round started, ours now.
    Healed,
    /// A fencing read where the lock is ours, with a counter that is missing
    /// or from an earlier generation of the node: it agreed, with this
    /// number, but the number may be less than the last token.
    Untrusted(i64),
    /// A fencing read where the lock is not ours: refused, but its counter
    /// was read, and counts towards proving the read.
    Foreign { number: i64, trusted: bool },
    /// The node agreed (or healed, `healed`), but its data is younger than
    /// the restart guard's `max_ttl`: it does not count towards the quorum.
    Young {
        age: std::time::Duration,
        max_ttl: std::time::Duration,
        healed: bool,
    },
}

/// How a round that did not reach a quorum ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A quorum agreed.
    Quorum,
    /// Another holder has a quorum (acquire), or a quorum said the key is
    /// not ours (owned).
    Refused,
    /// Another holder may have a quorum: with the nodes that did not answer,
    /// it would. Acquisition only.
    MayBeHeld,
    /// Contenders shared the nodes: nobody can have a quorum. Acquisition
    /// only.
    Split,
    /// Errors that retrying cannot fix decided it.
    Errors,
    /// Too few nodes answered.
    NoQuorum,
}

/// The proven-read rule of the fencing read. With `answered` nodes whose
/// counters were read (not young; the lock ours there or not, the round
/// itself needs a quorum where it is ours), `untrusted` of them with a
/// counter that is missing or from an earlier generation, out of `nodes`:
/// the read is proven when a quorum answered and `min(untrusted, f) +
/// silent` is less than a quorum, where `silent = nodes − answered` and
/// `f = nodes − quorum` is the number of nodes that may have lost their
/// data.
///
/// Why: the last token was written to a quorum `W`. At most `f` nodes lost
/// their data, and those among the answers are untrusted, so at most
/// `min(untrusted, f)` answering nodes of `W` lost the token; the silent
/// ones may be the rest of `W`. If together they are fewer than a quorum,
/// some answering node of `W` kept its counter, in its generation, and the
/// largest counter read is at least the last token.
pub(crate) fn proven(nodes: usize, answered: usize, untrusted: usize) -> bool {
    let required = quorum(nodes);
    let f = nodes - required;
    let silent = nodes.saturating_sub(answered);
    answered >= required && untrusted.min(f) + silent < required
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorum_is_a_strict_majority() {
        let expected = [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)];
        for (n, q) in expected {
            assert_eq!(quorum(n), q, "quorum({n})");
            assert!(2 * quorum(n) > n, "two quorums of {n} must intersect");
        }
    }

    #[test]
    fn the_proven_read_rule() {
        // A brand-new cluster: every counter missing, every node answering.
        assert!(proven(3, 3, 3));
        assert!(proven(5, 5, 5));
        // ... but not with a node silent: it may hold the last token.
        assert!(!proven(3, 2, 2));
        assert!(!proven(5, 4, 4));
        // Issue 11's schedule: B sees n0 lost, n2 never written, n1 silent.
        assert!(!proven(3, 2, 2));
        // Trusted answers from a quorum with the rest silent: proven.
        assert!(proven(3, 2, 0));
        assert!(proven(5, 3, 0));
        // One untrusted among a bare quorum: the silent ones and it could
        // be the whole write quorum.
        assert!(!proven(3, 2, 1));
        assert!(!proven(5, 3, 1));
        assert!(proven(5, 4, 1));
        assert!(!proven(5, 4, 2));
        assert!(proven(5, 5, 2));
        // Fewer than a quorum answered: never.
        assert!(!proven(5, 2, 0));
    }
}
