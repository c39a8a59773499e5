//! A cluster node's share of a request over several keys (feature
//! `cluster`).
//!
//! A cluster runs a script only over keys of one hash slot. A lock on
//! several resources names keys in many slots, so a cluster node gets the
//! request as one script per slot, over that slot's keys with the same
//! arguments ([`split`]), and its answer is what the parts say together
//! ([`combine`]): the node agrees to the set only where every part agreed.
//! A lock's set is all or nothing on each node, as before, and a part that
//! agreed when another did not is released by the engine.
//!
//! Only the scripts that treat each key alike split this way: the
//! acquisition, extension, check and release of several keys. The fencing
//! scripts name a counter shared by every resource, in a slot of its own: a
//! cluster node answers them with [`NodeError::Unsupported`] unless every
//! key they name shares one slot (a key prefix with a hash tag, `{app}:`).

use std::sync::Arc;

use redis::Value;
use redis::cluster_routing::Slot;

use super::Request;
use crate::protocol::error::NodeError;
use crate::protocol::scripts;

/// How the replies of a split request's parts make the node's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Combine {
    /// [`scripts::ACQUIRE_MANY`]: 1 where every part set its keys, else the
    /// first part's refusal (the holder's value).
    Acquire,
    /// [`scripts::EXTEND_MANY`]: 1 or 2 where every part said the same,
    /// else 0 (part of the set lost, part held: not this node's vote).
    Extend,
    /// [`scripts::CHECK_MANY`]: 1 where every part holds the token.
    Check,
    /// [`scripts::UNLOCK_MANY`]: the most any part did (2, 1, then 0).
    Unlock,
}

/// A request cut into one per slot.
pub(crate) struct Split {
    /// How the parts' replies combine.
    pub(crate) combine: Combine,
    /// One request per slot, in the order the slots first appear.
    pub(crate) parts: Vec<Request>,
    /// The token the parts carry (their first argument): what releases a
    /// part that agreed when the whole did not.
    pub(crate) token: Vec<u8>,
}

/// The request cut into one per slot, where it names keys in several
/// slots; `None` where it names one slot (send it as it is).
///
/// # Errors
/// [`NodeError::Unsupported`] for a script over several slots that does not
/// treat each key alike (fencing).
pub(crate) fn split(request: &Request) -> Result<Option<Split>, NodeError> {
    let (script, keys, args, kind, marked) = match request {
        Request::Durable { write, durability } => {
            return Ok(split(write)?.map(|mut split| {
                split.parts = split
                    .parts
                    .into_iter()
                    .map(|part| part.durable(*durability))
                    .collect();
                split
            }));
        }
        Request::Script {
            script,
            keys,
            args,
            kind,
            marked,
        } => (*script, keys, args, *kind, *marked),
        Request::Cmd(_) | Request::Pipe(_) | Request::Set(_) => return Ok(None),
    };
    let mut groups: Vec<(Slot, Vec<Vec<u8>>)> = Vec::new();
    for key in keys.iter() {
        let slot = Slot::for_key(key);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(key.clone()),
            None => groups.push((slot, vec![key.clone()])),
        }
    }
    if groups.len() <= 1 {
        return Ok(None);
    }
    let combine = if std::ptr::eq(script, &*scripts::ACQUIRE_MANY) {
        Combine::Acquire
    } else if std::ptr::eq(script, &*scripts::EXTEND_MANY) {
        Combine::Extend
    } else if std::ptr::eq(script, &*scripts::CHECK_MANY) {
        Combine::Check
    } else if std::ptr::eq(script, &*scripts::UNLOCK_MANY) {
        Combine::Unlock
    } else {
        return Err(NodeError::Unsupported(
            "a cluster node runs this script (fencing) only over keys of one hash slot: \
             give the key prefix a hash tag, such as `{app}:`",
        ));
    };
    let parts = groups
        .into_iter()
        .map(|(_, group)| Request::Script {
            script,
            keys: group.into(),
            args: args.clone(),
            kind,
            marked,
        })
        .collect();
    Ok(Some(Split {
        combine,
        parts,
        token: args.first().cloned().unwrap_or_default(),
    }))
}

/// Whether a part's reply to [`Combine::Acquire`] set its keys.
pub(crate) fn acquired(reply: &Value) -> bool {
    matches!(reply, Value::Int(1))
}

/// The node's reply, from its parts' replies (in order).
pub(crate) fn combine(combine: Combine, replies: &[Value]) -> Value {
    let all = |n: i64| {
        replies
            .iter()
            .all(|r| matches!(r, Value::Int(v) if *v == n))
    };
    match combine {
        Combine::Acquire => replies
            .iter()
            .find(|r| !acquired(r))
            .cloned()
            .unwrap_or(Value::Int(1)),
        Combine::Extend if all(1) => Value::Int(1),
        Combine::Extend if all(2) => Value::Int(2),
        Combine::Extend => Value::Int(0),
        Combine::Check => Value::Int(i64::from(all(1))),
        Combine::Unlock => {
            let most = replies
                .iter()
                .filter_map(|r| match r {
                    Value::Int(v) => Some(*v),
                    _ => None,
                })
                .max()
                .unwrap_or(0);
            Value::Int(most)
        }
    }
}

/// The quiet release of a part that agreed when the whole did not.
pub(crate) fn release(part: &Request, token: &[u8]) -> Option<Request> {
    let keys = match part {
        Request::Script { keys, .. } => keys.clone(),
        Request::Durable { write, .. } => return release(write, token),
        _ => return None,
    };
    Some(Request::Script {
        script: &scripts::UNLOCK_MANY,
        keys,
        args: Arc::new([token.to_vec(), b"quiet".to_vec()]),
        kind: super::Kind::Unlock,
        marked: super::Marked::No,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::request::{Kind, Marked, script};

    fn many(script_: &'static std::sync::LazyLock<redis::Script>, keys: &[&str]) -> Request {
        let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        script(Kind::Other, script_, script_, &keys, &[b"tok", b"1000"])
    }

    fn keys_of(request: &Request) -> Vec<Vec<u8>> {
        match request {
            Request::Script { keys, .. } => keys.to_vec(),
            Request::Durable { write, .. } => keys_of(write),
            _ => panic!("not a script"),
        }
    }

    #[test]
    fn keys_of_one_slot_are_sent_as_they_are() {
        let one = many(&scripts::ACQUIRE_MANY, &["{a}x", "{a}y", "{a}z"]);
        assert!(split(&one).unwrap().is_none());
        let set = Request::Cmd(Arc::new(redis::cmd("SET")));
        assert!(split(&set).unwrap().is_none());
    }

    #[test]
    fn keys_are_grouped_by_slot_in_order() {
        let request = many(&scripts::ACQUIRE_MANY, &["{a}1", "{b}1", "{a}2", "{c}1"]);
        let split = split(&request).unwrap().expect("three slots");
        assert_eq!(split.combine, Combine::Acquire);
        assert_eq!(split.token, b"tok");
        let groups: Vec<Vec<Vec<u8>>> = split.parts.iter().map(keys_of).collect();
        assert_eq!(
            groups,
            vec![
                vec![b"{a}1".to_vec(), b"{a}2".to_vec()],
                vec![b"{b}1".to_vec()],
                vec![b"{c}1".to_vec()],
            ]
        );
        let durable = request.durable(crate::protocol::durability::Durability::Replicas {
            replicas: 1,
            timeout: std::time::Duration::from_millis(10),
        });
        let parts = super::split(&durable).unwrap().unwrap().parts;
        assert!(parts.iter().all(|p| matches!(p, Request::Durable { .. })));
    }

    #[test]
    fn fencing_over_several_slots_is_refused() {
        let request = many(&scripts::FENCE_WRITE, &["{a}1", "{b}1"]);
        assert!(matches!(split(&request), Err(NodeError::Unsupported(_))));
    }

    #[test]
    fn the_node_agrees_only_where_every_part_did() {
        let held = Value::BulkString(b"other".to_vec());
        let one = Value::Int(1);
        assert_eq!(
            combine(Combine::Acquire, &[one.clone(), one.clone()]),
            Value::Int(1)
        );
        assert_eq!(
            combine(Combine::Acquire, &[one.clone(), held.clone()]),
            held
        );
        assert_eq!(
            combine(Combine::Extend, &[Value::Int(1), Value::Int(2)]),
            Value::Int(0)
        );
        assert_eq!(
            combine(Combine::Extend, &[Value::Int(2), Value::Int(2)]),
            Value::Int(2)
        );
        assert_eq!(
            combine(Combine::Check, &[Value::Int(1), Value::Int(0)]),
            Value::Int(0)
        );
        assert_eq!(
            combine(
                Combine::Unlock,
                &[Value::Int(0), Value::Int(2), Value::Int(1)]
            ),
            Value::Int(2)
        );
        let release = release(&many(&scripts::ACQUIRE_MANY, &["k"]), b"tok").unwrap();
        assert!(
            matches!(release, Request::Script { script, marked: Marked::No, .. } if std::ptr::eq(script, &*scripts::UNLOCK_MANY))
        );
    }
}
