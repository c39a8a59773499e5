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
//! acquisition, extension, check and release of several keys (with the
//! restart guard's marker or without). The fencing scripts read one
//! counter for the whole set: over lock keys in several slots a cluster
//! node answers them with [`NodeError::Unsupported`] (a set whose names
//! share a hash tag is one slot, and works).
//!
//! # The crate's own keys in a cluster
//! Every key of the crate other than a lock key (the fencing counter, an
//! old version's per-resource counter, the restart guard's generation
//! marker) has the byte `0xFF` in its name, which no lock key has. On a
//! cluster node each request names them in the slot of its lock keys
//! ([`localize`]): `{<tag>}` before the standalone name, where the tag is
//! the shortest decimal number whose slot is that slot ([`slot_tag`]). So a
//! cluster node keeps one counter and one generation marker per slot, moved
//! with the slot's keys by a migration and copied with them to a replica,
//! and a master that restarts empty loses its slots' markers with their
//! locks, which makes exactly those slots young again.

use std::sync::{Arc, LazyLock};

use redis::Value;

use super::{Marked, Request};
use crate::protocol::error::NodeError;
use crate::protocol::keys::SEPARATOR;
use crate::protocol::scripts::{self, Script};

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
    /// Whether the parts carry the marker (their replies then too).
    pub(crate) marked: Marked,
}

/// The hash slot of `key`, as a cluster computes it: CRC16 (XMODEM) of its
/// hash tag (the bytes between the first `{` and the next `}`, when not
/// empty) or of the whole key, modulo 16,384. (redis-rs routes by the same
/// rule but does not expose the number.)
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tag = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    let mut crc: u16 = 0;
    for &byte in tag.unwrap_or(key) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// Whether `key` is one of the crate's own keys (counter, marker), not a
/// lock key.
fn own(key: &[u8]) -> bool {
    key.contains(&SEPARATOR)
}

/// For each of the 16,384 slots, the shortest decimal number whose hash
/// slot it is: `{<it>}` puts a name in that slot.
static SLOT_TAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut tags = vec![String::new(); 16384];
    let mut missing = tags.len();
    let mut n: u64 = 0;
    while missing > 0 {
        let tag = n.to_string();
        let slot = usize::from(slot(tag.as_bytes()));
        if tags[slot].is_empty() {
            tags[slot] = tag;
            missing -= 1;
        }
        n += 1;
    }
    tags
});

/// The tag that names `slot` (see the module docs).
pub(crate) fn slot_tag(slot: u16) -> &'static str {
    &SLOT_TAGS[usize::from(slot)]
}

/// `key` in `slot`: `{<slot's tag>}` then the key.
pub(crate) fn in_slot(key: &[u8], slot: u16) -> Vec<u8> {
    let tag = slot_tag(slot);
    let mut named = Vec::with_capacity(key.len() + tag.len() + 2);
    named.push(b'{');
    named.extend_from_slice(tag.as_bytes());
    named.push(b'}');
    named.extend_from_slice(key);
    named
}

/// The request with the crate's own keys named in the slot of its lock
/// keys, for a cluster node (see the module docs); `None` where it names
/// none of them (send it as it is). The lock keys must share one slot (a
/// part of [`split`]).
pub(crate) fn localize(request: &Request) -> Option<Request> {
    match request {
        Request::Durable { write, durability } => {
            localize(write).map(|write| write.durable(*durability))
        }
        Request::Set(set) => set.one_command().map(|eval| Request::Cmd(Arc::new(eval))),
        Request::Script {
            script,
            keys,
            args,
            kind,
            ..
        } if is_release(script) => {
            let slot = slot(keys.first()?);
            let tag = in_slot(b"", slot);
            let token = args.first()?.clone();
            let args: Vec<Vec<u8>> = if std::ptr::eq(*script, &*scripts::HANDOFF_CHECK) {
                vec![token, tag]
            } else {
                let loud = args.get(1).is_none_or(|a| a.as_slice() != b"quiet");
                let quiet = if loud {
                    b"loud".to_vec()
                } else {
                    b"quiet".to_vec()
                };
                vec![token, quiet, tag]
            };
            let sharded: &'static Script = if std::ptr::eq(*script, &*scripts::HANDOFF_CHECK) {
                &scripts::HANDOFF_CHECK_SHARD
            } else {
                &scripts::UNLOCK_SHARD
            };
            Some(Request::Script {
                script: sharded,
                keys: keys.clone(),
                args: args.into(),
                kind: *kind,
                marked: Marked::No,
            })
        }
        Request::Script {
            script,
            keys,
            args,
            kind,
            marked,
        } if keys.iter().any(|k| own(k)) => {
            let slot = slot(keys.iter().find(|k| !own(k))?);
            let keys: Vec<Vec<u8>> = keys
                .iter()
                .map(|k| if own(k) { in_slot(k, slot) } else { k.clone() })
                .collect();
            Some(Request::Script {
                script,
                keys: keys.into(),
                args: args.clone(),
                kind: *kind,
                marked: *marked,
            })
        }
        _ => None,
    }
}

/// Whether `script` publishes releases ([`scripts::UNLOCK`],
/// [`scripts::UNLOCK_MANY`], [`scripts::HANDOFF_CHECK`]): on a cluster node
/// it becomes [`scripts::UNLOCK_SHARD`] or
/// [`scripts::HANDOFF_CHECK_SHARD`], which name the waiting protocol's
/// channels and keys in the lock keys' slot and publish with `SPUBLISH`.
fn is_release(script: &Script) -> bool {
    [
        &*scripts::UNLOCK,
        &*scripts::UNLOCK_MANY,
        &*scripts::HANDOFF_CHECK,
    ]
    .into_iter()
    .any(|s| std::ptr::eq(script, s))
}

/// The name of the waiting protocol (release or own channel, waiting hash:
/// a lock key, `0xFF`, then the rest) in the slot of its lock key, as a
/// cluster node knows it: see [`scripts::UNLOCK_SHARD`].
pub(crate) fn wire_name(name: &[u8]) -> Vec<u8> {
    let key = name.split(|&b| b == SEPARATOR).next().unwrap_or(name);
    in_slot(name, slot(key))
}

/// The name of the waiting protocol that [`wire_name`] put in a slot.
pub(crate) fn unwire_name(name: &[u8]) -> &[u8] {
    if name.first() == Some(&b'{')
        && let Some(close) = name.iter().position(|&b| b == b'}')
    {
        return &name[close + 1..];
    }
    name
}

/// The request cut into one per slot, where its lock keys are in several
/// slots; `None` where they are in one (send it as it is, [`localize`]d).
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
    let mut groups: Vec<(u16, Vec<Vec<u8>>)> = Vec::new();
    for key in keys.iter().filter(|k| !own(k)) {
        let slot = slot(key);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(key.clone()),
            None => groups.push((slot, vec![key.clone()])),
        }
    }
    if groups.len() <= 1 {
        return Ok(None);
    }
    let is = |one: &LazyLock<Script>| std::ptr::eq(script, &**one);
    // The marked scripts name the marker last: each part names it too.
    let combine = if is(&scripts::ACQUIRE_MANY) || is(&scripts::ACQUIRE_MANY_MARKED) {
        Combine::Acquire
    } else if is(&scripts::EXTEND_MANY) || is(&scripts::EXTEND_MANY_MARKED) {
        Combine::Extend
    } else if is(&scripts::CHECK_MANY) || is(&scripts::CHECK_MANY_MARKED) {
        Combine::Check
    } else if is(&scripts::UNLOCK_MANY) || is(&scripts::HANDOFF_CHECK) {
        // The hand-off check answers how many keys it published: any part
        // that published makes the node's answer positive.
        Combine::Unlock
    } else {
        return Err(NodeError::Unsupported(
            "a cluster node runs this script (fencing) only over keys of one hash slot: \
             give the key prefix a hash tag, such as `{app}:`",
        ));
    };
    let marker = match marked {
        Marked::No => None,
        Marked::Known | Marked::WithAge => keys.last().filter(|k| own(k)),
    };
    let parts = groups
        .into_iter()
        .map(|(_, mut group)| {
            group.extend(marker.cloned());
            Request::Script {
                script,
                keys: group.into(),
                args: args.clone(),
                kind,
                marked,
            }
        })
        .collect();
    Ok(Some(Split {
        combine,
        parts,
        token: args.first().cloned().unwrap_or_default(),
        marked,
    }))
}

/// Whether a part's reply to [`Combine::Acquire`] set its keys (marked or
/// not).
pub(crate) fn acquired(reply: &Value) -> bool {
    match reply {
        Value::Array(parts) => parts.first().is_some_and(acquired),
        other => matches!(other, Value::Int(1)),
    }
}

/// The node's reply, from its parts' replies (in order). Marked parts
/// reply `{body}` or `{body, age, generation}` (see
/// [`with_marker`](crate::protocol::generation::with_marker)): the node's
/// reply combines the bodies and carries the youngest marker's age and
/// generation, if any part gave one (one young slot makes the node's vote
/// young).
pub(crate) fn combine_marked(combine: Combine, marked: Marked, replies: &[Value]) -> Value {
    if marked == Marked::No {
        return self::combine(combine, replies);
    }
    let mut bodies = Vec::with_capacity(replies.len());
    let mut youngest: Option<(i64, &Value)> = None;
    for reply in replies {
        match reply {
            Value::Array(parts) => match parts.as_slice() {
                [body] => bodies.push(body.clone()),
                [body, Value::Int(age), generation] => {
                    bodies.push(body.clone());
                    if youngest.is_none_or(|(y, _)| *age < y) {
                        youngest = Some((*age, generation));
                    }
                }
                _ => return reply.clone(),
            },
            other => return other.clone(),
        }
    }
    let body = self::combine(combine, &bodies);
    match youngest {
        Some((age, generation)) => Value::Array(vec![body, Value::Int(age), generation.clone()]),
        None => Value::Array(vec![body]),
    }
}

/// The node's reply, from its parts' unmarked replies (in order).
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
        keys: keys.iter().filter(|k| !own(k)).cloned().collect(),
        args: Arc::new([token.to_vec(), b"quiet".to_vec()]),
        kind: super::Kind::Unlock,
        marked: super::Marked::No,
    })
}

#[cfg(test)]
mod tests;
