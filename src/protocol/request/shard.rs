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
    let is = |one: &LazyLock<redis::Script>| std::ptr::eq(script, &**one);
    // The marked scripts name the marker last: each part names it too.
    let combine = if is(&scripts::ACQUIRE_MANY) || is(&scripts::ACQUIRE_MANY_MARKED) {
        Combine::Acquire
    } else if is(&scripts::EXTEND_MANY) || is(&scripts::EXTEND_MANY_MARKED) {
        Combine::Extend
    } else if is(&scripts::CHECK_MANY) || is(&scripts::CHECK_MANY_MARKED) {
        Combine::Check
    } else if is(&scripts::UNLOCK_MANY) {
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
    fn slots_are_computed_as_a_cluster_does() {
        // CRC16/XMODEM of "123456789" is 0x31C3; the rest from CLUSTER KEYSLOT.
        assert_eq!(slot(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"), "an empty tag is no tag");
        assert_eq!(slot(b"{a}\xff"), slot(b"a"));
        for s in 0..16384u16 {
            assert_eq!(slot(slot_tag(s).as_bytes()), s);
        }
        assert!(SLOT_TAGS.iter().all(|t| t.len() <= 6));
    }

    #[test]
    fn own_keys_move_into_the_lock_keys_slot() {
        let keys: [&[u8]; 3] = [b"app:x", b"app:x\xfffence", b"app:\xffcounter"];
        let request = script(
            Kind::Other,
            &scripts::FENCE_READ,
            &scripts::FENCE_READ,
            &keys,
            &[b"t"],
        );
        let local = localize(&request).expect("own keys to move");
        let moved = keys_of(&local);
        assert_eq!(moved[0], b"app:x");
        assert!(moved.iter().all(|k| slot(k) == slot(b"app:x")), "{moved:?}");
        assert_eq!(moved[2], in_slot(b"app:\xffcounter", slot(b"app:x")));
        let plain = many(&scripts::ACQUIRE_MANY, &["a", "b"]);
        assert!(localize(&plain).is_none());
    }

    #[test]
    fn a_marked_set_names_the_marker_in_every_part() {
        let request = Request::Script {
            script: &scripts::ACQUIRE_MANY_MARKED,
            keys: vec![
                b"{a}1".to_vec(),
                b"{b}1".to_vec(),
                b"app:\xffgeneration".to_vec(),
            ]
            .into(),
            args: Arc::new([b"tok".to_vec(), b"1000".to_vec(), b"cand".to_vec()]),
            kind: Kind::Other,
            marked: Marked::Known,
        };
        let split = split(&request).unwrap().unwrap();
        assert_eq!(split.marked, Marked::Known);
        for part in &split.parts {
            let keys = keys_of(part);
            assert_eq!(keys.len(), 2);
            assert_eq!(keys[1], b"app:\xffgeneration");
            let local = keys_of(&localize(part).unwrap());
            assert_eq!(slot(&local[1]), slot(&local[0]));
        }
        let young = Value::Array(vec![
            Value::Int(1),
            Value::Int(5),
            Value::BulkString(b"g1".to_vec()),
        ]);
        let old = Value::Array(vec![
            Value::Int(1),
            Value::Int(9000),
            Value::BulkString(b"g2".to_vec()),
        ]);
        assert_eq!(
            combine_marked(
                Combine::Acquire,
                Marked::Known,
                &[old.clone(), young.clone()]
            ),
            young
        );
        let known = Value::Array(vec![Value::Int(1)]);
        assert_eq!(
            combine_marked(
                Combine::Acquire,
                Marked::Known,
                &[known.clone(), known.clone()]
            ),
            known
        );
        assert!(acquired(&young));
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
