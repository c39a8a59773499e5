//! Generation markers and the restart guard: telling, per node, that a node
//! lost its data, and not counting it until it is old enough to be safe.
//!
//! # The marker
//! Each node keeps one key without expiry, the manager's key prefix followed
//! by the byte `0xFF` and `generation` (never a lock key, which is UTF-8; see
//! [`keys`](crate::protocol::keys)). It holds `<born>:<id>`: the node's own
//! `TIME` in milliseconds when the marker was made, and a random id. The
//! whole string is the node's *generation*. A node that loses its data loses
//! the marker with it, and the next request of ours that carries the
//! marker's prelude makes a new one, "born now", with a new generation.
//!
//! # The prelude
//! Every script that needs the marker starts with the same few lines: they
//! take the marker key from the end of `KEYS` and a candidate id from the
//! end of `ARGV`, make the marker if it is missing, and then run the
//! script's own body. The reply is `{body's reply, age}`, with `age` the
//! marker's age on the node's clock in milliseconds. So the marker rides
//! along in the same round trip as the command, at the cost of a script
//! where a plain `SET` would do.
//!
//! # The restart guard
//! With [`RedlockBuilder::restart_guard(max_ttl)`](crate::RedlockBuilder::restart_guard),
//! a node whose marker is younger than `max_ttl` does not count towards any
//! quorum (acquire, extend, fencing read and write), exactly as if it had
//! not answered: any key it held before it lost its data has expired by the
//! time it counts again. Its refusals still count as refusals. This is the
//! client-side equivalent of an operator who delays every restart past the
//! largest ttl. The model in `model/` checks this rule (`restart guard`).
//!
//! # Fencing counters
//! The fencing counter holds `<number>:<generation>`. The read reports a
//! counter as trusted only when its generation is the node's current one; a
//! counter that is missing, or was written in an earlier generation, is
//! untrusted. The write raises the counter within the node's generation and
//! sets it outright in a new one, which re-synchronises a node that lost its
//! data. [`proven`](crate::protocol::quorum::proven) is the rule that decides whether a read may
//! be used.

use std::time::Duration;

use redis::Value;

use crate::protocol::quorum::Reply;
// The type's own module: `scripts` imports this one.
use crate::protocol::scripts::script::Script;

/// The Lua lines every marker-carrying script starts with; see the module
/// docs. Defines the locals `generation` (the node's generation string) and
/// `age` (the marker's age in milliseconds on the node's clock).
const PRELUDE: &str = r#"local marker = table.remove(KEYS)
local known = table.remove(ARGV)
local candidate = table.remove(ARGV)
local generation = redis.call("get", marker)
local age = false
if not generation or known == "" or generation ~= known then
    local clock = redis.call("time")
    local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
    local born
    if generation then
        local sep = string.find(generation, ":", 1, true)
        born = sep and tonumber(string.sub(generation, 1, sep - 1))
        if not born then
            return redis.error_reply("ERR redlock-quorum: malformed generation marker")
        end
    else
        born = now
        generation = now .. ":" .. candidate
        redis.call("set", marker, generation)
    end
    age = now - born
end
"#;

/// A script made of [`PRELUDE`] and `body`, replying `{body's reply, age,
/// generation}`, or `{body's reply}` where the marker holds the generation
/// the caller named as known to be old (see [`Known`]).
pub(crate) fn with_marker(body: &str) -> Script {
    Script::new(&format!(
        "{PRELUDE}local function body()\n{body}\nend\nif age then\n    return {{body(), age, generation}}\nend\nreturn {{body()}}"
    ))
}

/// The generation a manager last saw on one node as old enough to count
/// (as old as the restart guard's `max_ttl`, or any age without the guard),
/// sent as the last argument of every marked script to that node.
///
/// Where the node's marker still holds it, the prelude skips the node's
/// clock and the marker's parsing: a node whose marker has not changed
/// since it was old enough is old enough now (a marker's age only grows;
/// a node that loses its data loses the marker with it, and gets a new
/// generation, which this one is not). So under the restart guard a
/// healthy node costs each call one `GET` of the marker beside the
/// command, not `TIME` and a parse as well.
#[derive(Debug, Default)]
pub(crate) struct Known {
    generation: std::sync::Mutex<Option<std::sync::Arc<[u8]>>>,
}

impl Known {
    /// The generation to name in the next request (empty when none).
    pub(crate) fn get(&self) -> Option<std::sync::Arc<[u8]>> {
        self.generation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Forgets the known generation (the node's marker changed).
    pub(crate) fn forget(&self) {
        *self.generation.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Learns from a marked script's reply: a full reply (`{body, age,
    /// generation}`) whose node is at least `old_after` old names the
    /// generation to send from now on; a node younger than that is
    /// forgotten (it lost its data since).
    pub(crate) fn learn(&self, value: &Value, old_after: Duration) {
        let Value::Array(parts) = value else { return };
        let [_, Value::Int(age), Value::BulkString(generation)] = parts.as_slice() else {
            return;
        };
        let old = u64::try_from(*age).is_ok_and(|age| Duration::from_millis(age) >= old_after);
        let mut known = self.generation.lock().unwrap_or_else(|e| e.into_inner());
        *known = old.then(|| generation.as_slice().into());
    }
}

/// A manager's view of the markers: the key, the id it proposes when it
/// makes a marker, and the restart guard's `max_ttl`, if set.
#[derive(Debug, Clone)]
pub(crate) struct Generation {
    pub(crate) marker: Vec<u8>,
    pub(crate) candidate: String,
    pub(crate) guard: Option<Duration>,
}

impl Generation {
    /// Appends the marker key and the candidate id to a script's keys and
    /// arguments, where [`PRELUDE`] takes them from (the engine appends the
    /// node's [`Known`] generation after them, per node).
    pub(crate) fn append(&self, keys: &mut Vec<Vec<u8>>, args: &mut Vec<Vec<u8>>) {
        keys.push(self.marker.clone());
        args.push(self.candidate.clone().into_bytes());
    }

    /// Reads the reply of a script made by [`with_marker`] with `read` for
    /// its body, and, under the restart guard, turns the agreement of a node
    /// younger than `max_ttl` into [`Reply::Young`].
    pub(crate) fn reader<F>(&self, read: F) -> impl Fn(&Value) -> Result<Reply, String> + use<F>
    where
        F: Fn(&Value) -> Result<Reply, String>,
    {
        let guard = self.guard;
        move |value| {
            let (body, age) = match value {
                // A body's nil reply reaches Lua as `false`, so the table
                // always has every element.
                Value::Array(parts) => match parts.as_slice() {
                    [body, Value::Int(age), _] => (body, Some(*age)),
                    // The marker holds the generation this manager named as
                    // old (`Known`).
                    [body] => (body, None),
                    _ => return Err(format!("{value:?}")),
                },
                other => return Err(format!("{other:?}")),
            };
            let reply = read(body)?;
            let Some(age) = age else {
                return Ok(reply);
            };
            // A node clock that went backwards gives a negative age: young.
            let age = Duration::from_millis(u64::try_from(age).unwrap_or(0));
            Ok(match (guard, reply) {
                (Some(max_ttl), Reply::Agreed(_) | Reply::Untrusted(_)) if age < max_ttl => {
                    Reply::Young {
                        age,
                        max_ttl,
                        healed: false,
                    }
                }
                (Some(max_ttl), Reply::Healed) if age < max_ttl => Reply::Young {
                    age,
                    max_ttl,
                    healed: true,
                },
                // A young node's counter is not read: it is silent.
                (Some(max_ttl), Reply::Foreign { .. }) if age < max_ttl => {
                    Reply::Refused { holder: None }
                }
                (_, reply) => reply,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::keys::marker_key;

    #[test]
    fn the_marker_is_never_a_lock_key() {
        let marker = marker_key("locks:");
        assert!(marker.starts_with(b"locks:"));
        assert!(std::str::from_utf8(&marker).is_err());
    }

    fn marker_value() -> Value {
        Value::BulkString(b"1700000000000:abc".to_vec())
    }

    #[test]
    fn a_known_generation_counts_as_old_and_is_learned_only_when_old() {
        let generation = Generation {
            marker: marker_key(""),
            candidate: "c".into(),
            guard: Some(Duration::from_secs(1)),
        };
        let read = generation.reader(|v| match v {
            Value::Int(1) => Ok(Reply::Agreed(None)),
            _ => Ok(Reply::Refused { holder: None }),
        });
        // `{body}`: the marker holds the generation the manager named.
        assert_eq!(
            read(&Value::Array(vec![Value::Int(1)])),
            Ok(Reply::Agreed(None))
        );
        assert!(read(&Value::Array(vec![])).is_err());
        let known = Known::default();
        let full = |age: i64| Value::Array(vec![Value::Int(1), Value::Int(age), marker_value()]);
        known.learn(&full(999), Duration::from_secs(1));
        assert_eq!(known.get(), None, "too young to be known");
        known.learn(&full(1000), Duration::from_secs(1));
        assert_eq!(known.get().as_deref(), Some(&b"1700000000000:abc"[..]));
        // A short reply changes nothing; a young full one forgets.
        known.learn(&Value::Array(vec![Value::Int(1)]), Duration::from_secs(1));
        assert!(known.get().is_some());
        known.learn(&full(-3), Duration::from_secs(1));
        assert_eq!(known.get(), None, "a node that went back is not known");
        known.learn(&full(0), Duration::ZERO);
        assert!(known.get().is_some(), "without the guard any age is old");
    }

    #[test]
    fn young_agreement_does_not_count() {
        let generation = Generation {
            marker: marker_key(""),
            candidate: "c".into(),
            guard: Some(Duration::from_secs(1)),
        };
        let read = generation.reader(|v| match v {
            Value::Int(1) => Ok(Reply::Agreed(None)),
            Value::Int(2) => Ok(Reply::Healed),
            _ => Ok(Reply::Refused { holder: None }),
        });
        let reply = |body: i64, age: i64| {
            read(&Value::Array(vec![
                Value::Int(body),
                Value::Int(age),
                marker_value(),
            ]))
        };
        assert_eq!(
            reply(1, 999),
            Ok(Reply::Young {
                age: Duration::from_millis(999),
                max_ttl: Duration::from_secs(1),
                healed: false
            })
        );
        assert_eq!(reply(1, 1000), Ok(Reply::Agreed(None)));
        assert_eq!(
            reply(2, -5),
            Ok(Reply::Young {
                age: Duration::ZERO,
                max_ttl: Duration::from_secs(1),
                healed: true
            })
        );
        assert_eq!(reply(0, 10), Ok(Reply::Refused { holder: None }));
        // A node as old as max_ttl counts: its healing is a healing.
        assert_eq!(reply(2, 1000), Ok(Reply::Healed));
        assert_eq!(reply(2, 5000), Ok(Reply::Healed));
        assert_eq!(
            reply(2, 999),
            Ok(Reply::Young {
                age: Duration::from_millis(999),
                max_ttl: Duration::from_secs(1),
                healed: true
            })
        );
        // A fencing read where the lock is not ours: a young node's counter
        // is not read (silent), an old one's is.
        let read = generation.reader(|v| match v {
            Value::Int(7) => Ok(Reply::Foreign {
                number: 7,
                trusted: true,
            }),
            _ => Ok(Reply::Refused { holder: None }),
        });
        let foreign = |age: i64| {
            read(&Value::Array(vec![
                Value::Int(7),
                Value::Int(age),
                marker_value(),
            ]))
        };
        let counted = Ok(Reply::Foreign {
            number: 7,
            trusted: true,
        });
        assert_eq!(foreign(999), Ok(Reply::Refused { holder: None }));
        assert_eq!(foreign(1000), counted);
        assert_eq!(foreign(1001), counted);
        assert_eq!(foreign(-1), Ok(Reply::Refused { holder: None }));
        assert!(read(&Value::Int(1)).is_err());
        let off = Generation {
            guard: None,
            ..generation
        };
        let read = off.reader(|_| Ok(Reply::Agreed(None)));
        assert_eq!(
            read(&Value::Array(vec![
                Value::Nil,
                Value::Int(0),
                marker_value()
            ])),
            Ok(Reply::Agreed(None))
        );
    }
}
