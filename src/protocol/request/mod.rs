//! The requests of the protocol, one module per operation: what is sent to
//! a node and how its reply is read. The engine sends them
//! ([`crate::engine::round`]); nothing here does I/O.
//!
//! - [`acquire`]: `SET … NX PX … GET` for one key, `ACQUIRE_MANY` for
//!   several, the marked scripts under the restart guard, and the waiting
//!   attempt's `SET` + `PTTL` pipeline;
//! - [`extend`], [`check`], [`unlock`] (and its native conditional delete),
//!   [`fence`] (the fencing read and write), [`handoff`] (the releaser's
//!   hand-off check) and [`register`] (a waiting manager's registration).
//!
//! A request over one key uses the single-key script, over several the
//! `*_MANY` script of [`scripts`](crate::protocol::scripts).
//!
//! # Several resources
//! Locks on several resources at once, all or nothing, on one quorum.
//!
//! ## The handle
//! A lock on several resources is a [`Lock`](crate::Lock) like any other: it carries the
//! first resource and key as a single lock does, and the others in
//! `Lock::rest` (empty for one resource). One token holds every key, so
//! `extend`, `unlock`, `verify`, `fencing_token` and the watchdog need no
//! second type: each builds its request from the lock's keys, with the
//! single-key script for one key and the `*_MANY` script of
//! [`crate::protocol::scripts`] for several.
//!
//! ## The rule
//! On each node one script sets every key or none (`ACQUIRE_MANY`), so a
//! node agrees only when it set the whole set, and the quorum rule of the
//! [`tally`](crate::protocol::tally) applies to the set as it does to one key. Two
//! requests whose sets overlap cannot both reach a quorum, and no request
//! ever holds part of its set while it waits for the rest: deadlock is
//! impossible by construction, whatever order the names come in.
//!
//! # Fencing
//! One counter per resource, as for single locks. A multi-lock's fencing
//! token is the largest of its resources' counters (read on a quorum) plus
//! one, written back to every resource's counter: it is larger than any
//! token given before on any of its resources, and any later holder of any
//! of them, alone or in a set, gets a larger one.
//!
//! ## The limit
//! Redis puts no useful limit on the number of keys of one script (a
//! command may carry up to 2^31 − 1 arguments, and the scripts loop over
//! `KEYS` rather than `unpack` it). What bounds a set is time: each node
//! runs the script in one go, blocking every other client of that node
//! meanwhile, and the round must hear a quorum within the node timeout,
//! which grows by 1 ms per key past the first for such a request
//! ([`crate::engine::round`]). [`MAX_RESOURCES`](crate::MAX_RESOURCES) caps a request well below where
//! that bites (its docs give the numbers).
//!
//! A release that a node did not answer is owed to it once for the whole
//! set, and retried with the set's script ([`crate::engine::release`]).

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::{Cmd, Value};

use crate::protocol::durability::Durability;
use crate::protocol::generation::Generation;
use crate::protocol::quorum::Reply;
#[cfg(test)]
use crate::protocol::scripts;
use crate::protocol::scripts::Script;

pub(crate) mod acquire;
pub(crate) mod check;
pub(crate) mod extend;
pub(crate) mod fence;
pub(crate) mod handoff;
pub(crate) mod register;
#[cfg(feature = "cluster")]
pub(crate) mod shard;
pub(crate) mod unlock;

/// The time a node is given for each key of a request past the first, on
/// top of the node timeout.
///
/// Measured with 3 local nodes on a 2-core machine: the release of 1,000
/// keys, each with a waiting manager to name (a hash read and a publish per
/// key), runs for 5 to 7 ms on an idle node (5 to 7 µs a key); setting,
/// extending or reading them costs less. On the same machine under a load
/// of 15 the same script ran for 70 to 100 ms (the node waits for a core),
/// and the whole release round took up to 300 ms (the client waits too).
/// 1 ms a key leaves three times that: a request over 1,000 keys may take
/// about 1 s with the default node timeout, where the plain 50 ms timed
/// out on every node under load.
pub(crate) const PER_KEY: Duration = Duration::from_millis(1);

/// One request, the same for every node of a round; cheap to clone.
#[derive(Clone)]
pub(crate) enum Request {
    /// A plain command.
    Cmd(Arc<Cmd>),
    /// Commands sent back to back, read as one array of replies; the first
    /// reply's error is the request's error, a later one is left in the
    /// array for the reader (see [`acquire::waiting_request`]).
    Pipe(Arc<redis::Pipeline>),
    /// The acquisition of one key without the marker: `SET … NX PX … GET`,
    /// or what a server older than Redis 7.0 gets instead (see
    /// [`acquire::Set`]).
    Set(Arc<acquire::Set>),
    /// A script, run by `EVALSHA` with the `NOSCRIPT` fallback.
    Script {
        script: &'static Script,
        keys: Arc<[Vec<u8>]>,
        args: Arc<[Vec<u8>]>,
        /// Which operation it is, where the engine needs to know
        /// (the native fallback of the unlock).
        kind: Kind,
        /// Whether it carries the generation marker, and how.
        marked: Marked,
    },
    /// A write followed, in the same round trip, by the command that
    /// confirms its durability (`WAITAOF` or `WAIT`); see
    /// [`Durability`].
    Durable {
        write: Box<Request>,
        durability: Durability,
    },
}

/// Whether a script carries the generation marker (a script made by
/// [`with_marker`](crate::protocol::generation::with_marker)), and so takes
/// one more argument, per node: the generation the manager knows to be old
/// there ([`Known`](crate::protocol::generation::Known)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marked {
    /// No marker.
    No,
    /// The marker, and the node's known generation: a node whose marker
    /// still holds it answers without the marker's age.
    Known,
    /// The marker, always with its age (the fencing read, which needs the
    /// age of every node with an untrusted counter).
    WithAge,
}

/// What a script request does, where the engine must tell requests apart:
/// a node that refuses scripts gets the unlock of one key as its native
/// conditional delete instead ([`unlock::native`]), and nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The release of keys held by a token ([`unlock::request`]).
    Unlock,
    /// Any other script.
    Other,
}

impl Request {
    /// How many keys the request names: a command or pipeline counts as
    /// one (they are the single-key requests).
    pub(crate) fn keys(&self) -> usize {
        match self {
            Request::Cmd(_) | Request::Pipe(_) | Request::Set(_) => 1,
            Request::Script { keys, .. } => keys.len().max(1),
            Request::Durable { write, .. } => write.keys(),
        }
    }

    /// Whether a standalone node's connection gets the request once, as it
    /// is: a command or a pipeline. A script is not (it is sent again after
    /// loading it, when the node answers `NOSCRIPT`), so a later request on
    /// the lock waits for it to settle (see
    /// [`inflight`](crate::engine::inflight)).
    pub(crate) fn sent_once(&self) -> bool {
        match self {
            Request::Cmd(_) | Request::Pipe(_) | Request::Set(_) => true,
            Request::Script { .. } => false,
            Request::Durable { write, .. } => write.sent_once(),
        }
    }

    /// Whether the request is a marked script, and how (a durable write's
    /// own request says).
    pub(crate) fn marked(&self) -> Marked {
        match self {
            Request::Script { marked, .. } => *marked,
            Request::Durable { write, .. } => write.marked(),
            Request::Cmd(_) | Request::Pipe(_) | Request::Set(_) => Marked::No,
        }
    }

    /// How long a node may take to answer this request: `node_timeout`,
    /// plus [`PER_KEY`] for each key past the first.
    pub(crate) fn timeout(&self, node_timeout: Duration) -> Duration {
        let extra = u32::try_from(self.keys() - 1).unwrap_or(u32::MAX);
        node_timeout.saturating_add(PER_KEY.saturating_mul(extra))
    }

    /// This request as a server older than Redis 7.0 takes it: an
    /// acquisition ([`Request::Set`]) becomes its [`acquire::Set::compat`],
    /// the guarded one ([`SET_MARKED`](crate::protocol::scripts::SET_MARKED))
    /// its compatible twin; `None` for any other request (the same
    /// everywhere).
    pub(crate) fn compat(&self) -> Option<Request> {
        match self {
            Request::Set(set) => Some(set.compat()),
            Request::Script {
                script,
                keys,
                args,
                kind,
                marked,
            } if std::ptr::eq(*script, &*crate::protocol::scripts::SET_MARKED) => {
                Some(Request::Script {
                    script: &crate::protocol::scripts::SET_MARKED_COMPAT,
                    keys: keys.clone(),
                    args: args.clone(),
                    kind: *kind,
                    marked: *marked,
                })
            }
            Request::Durable { write, durability } => {
                write.compat().map(|write| Request::Durable {
                    write: Box::new(write),
                    durability: *durability,
                })
            }
            _ => None,
        }
    }

    /// This request, confirmed as `durability` asks (a write of a lock).
    pub(crate) fn durable(self, durability: Durability) -> Self {
        match durability {
            Durability::Memory => self,
            durability => Request::Durable {
                write: Box::new(self),
                durability,
            },
        }
    }
}

/// A script request over a lock's keys: `one` for a single key, `many` for
/// several.
pub(crate) fn script(
    kind: Kind,
    one: &'static LazyLock<Script>,
    many: &'static LazyLock<Script>,
    keys: &[&[u8]],
    args: &[&[u8]],
) -> Request {
    let script: &'static Script = if keys.len() == 1 { one } else { many };
    Request::Script {
        script,
        keys: keys.iter().map(|k| k.to_vec()).collect(),
        args: args.iter().map(|a| a.to_vec()).collect(),
        kind,
        marked: Marked::No,
    }
}

/// A request for a script made by [`with_marker`](crate::protocol::generation::with_marker): the keys and
/// arguments, then the marker key and the manager's candidate id (the
/// engine appends the node's known generation, `how`).
pub(crate) fn marked(
    generation: &Generation,
    script: &'static LazyLock<Script>,
    keys: &[&[u8]],
    args: &[&[u8]],
    how: Marked,
) -> Request {
    // Sized for the marker and the candidate that `append` adds (grown,
    // each vector was allocated twice on every guarded request).
    let owned = |items: &[&[u8]]| {
        let mut all = Vec::with_capacity(items.len() + 1);
        all.extend(items.iter().map(|i| i.to_vec()));
        all
    };
    let (mut keys, mut args) = (owned(keys), owned(args));
    generation.append(&mut keys, &mut args);
    Request::Script {
        script,
        keys: keys.into(),
        args: args.into(),
        kind: Kind::Other,
        marked: how,
    }
}

/// Reads a reply with `body`, through the marker's reader when the restart
/// guard is on (the requests then carry the marker).
pub(crate) fn either<'a, F>(
    generation: &Generation,
    body: F,
) -> impl Fn(&Value) -> Result<Reply, String> + 'a
where
    F: Fn(&Value) -> Result<Reply, String> + Copy + 'a,
{
    let marked = generation.reader(body);
    let guarded = generation.guard.is_some();
    move |value| if guarded { marked(value) } else { body(value) }
}

/// Reads the reply of the unlock, fence-write and check scripts: 1 agreed,
/// 0 not ours.
pub(crate) fn read_flag(value: &Value) -> Result<Reply, String> {
    match value {
        Value::Int(1) => Ok(Reply::Agreed(None)),
        Value::Int(0) => Ok(Reply::Refused { holder: None }),
        other => Err(format!("{other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::durability::Durability;

    #[test]
    fn a_request_gets_time_for_each_key_past_the_first() {
        let base = Duration::from_millis(50);
        let set = Request::Cmd(Arc::new(redis::cmd("SET")));
        assert_eq!(set.timeout(base), base, "one key: the node timeout");
        let script = |n: usize| Request::Script {
            script: &scripts::UNLOCK_MANY,
            keys: (0..n).map(|i| i.to_string().into_bytes()).collect(),
            args: Arc::new([]),
            kind: Kind::Other,
            marked: Marked::No,
        };
        assert_eq!(script(1).timeout(base), base);
        assert_eq!(script(0).timeout(base), base);
        assert_eq!(script(2).timeout(base), base + PER_KEY);
        assert_eq!(
            script(1_000).timeout(base),
            base + Duration::from_millis(999)
        );
        let durable = script(10).durable(Durability::Disk {
            timeout: Duration::from_secs(1),
        });
        assert_eq!(durable.timeout(base), base + PER_KEY * 9);
        assert_eq!(script(3).timeout(Duration::MAX), Duration::MAX);
    }
}
