//! Acquisition: `SET key token NX PX ttl GET` for one key,
//! [`ACQUIRE_MANY`](crate::protocol::scripts::ACQUIRE_MANY) for several,
//! the marked scripts under the restart guard; and, for an attempt of a
//! caller that waits, the same `SET` with `PTTL` behind it in one pipeline,
//! whose refusals tell when the holder's keys expire ([`Pttls`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{Cmd, Value};

use super::{Kind, Marked, Request, either, marked, script};
use crate::protocol::generation::Generation;
use crate::protocol::quorum::Reply;
use crate::protocol::scripts;

/// The request of an acquisition round: `SET key token NX PX ttl GET` for
/// one key, [`scripts::ACQUIRE_MANY`] for several; under the restart guard,
/// the same with the generation marker.
pub(crate) fn request(
    generation: &Generation,
    keys: &[String],
    token: &str,
    millis: u64,
) -> Request {
    let guarded = generation.guard.is_some();
    if let ([key], false) = (keys, guarded) {
        return Request::Set(Arc::new(Set::new(key, token, millis, false)));
    }
    let millis = millis.to_string();
    let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    let args = [token.as_bytes(), millis.as_bytes()];
    match (keys.len(), guarded) {
        (1, _) => marked(
            generation,
            &scripts::SET_MARKED,
            &keys,
            &args,
            Marked::Known,
        ),
        (_, true) => marked(
            generation,
            &scripts::ACQUIRE_MANY_MARKED,
            &keys,
            &args,
            Marked::Known,
        ),
        (_, false) => script(
            Kind::Other,
            &scripts::ACQUIRE_MANY,
            &scripts::ACQUIRE_MANY,
            &keys,
            &args,
        ),
    }
}

/// The guarded acquisition of one key ([`scripts::SET_MARKED`]) as a node
/// whose marker the manager knows to be old takes it: `SET key token NX PX
/// ttl GET`, then `GET` of the marker, in one pipeline (two replies; the
/// script costs the node about three times a bare `SET`, a transaction
/// four replies). Read by [`read_known_old`]. `None` for any other
/// request.
///
/// The marker is read *after* the write, on the same connection: where it
/// still holds the generation the manager knew to be old, the `SET` ran in
/// that generation's dataset. That generation existed before the request
/// was sent; a restart in between closes the connection (the `GET` never
/// runs), and a flush or an eviction removes the marker, which is never
/// made again with the same id. A read before the write would miss a
/// flush between the two (the model's planted violation `check-before`,
/// `model/src/lib.rs` `MarkerCheck`; `pipelined` checks this form).
pub(crate) fn known_old(request: &Request) -> Option<Request> {
    let Request::Script {
        script, keys, args, ..
    } = request
    else {
        return None;
    };
    if !std::ptr::eq(*script, &*scripts::SET_MARKED) {
        return None;
    }
    let ([key, marker], [token, millis, _candidate]) = (&keys[..], &args[..]) else {
        return None;
    };
    // Sized ahead, as in `Set::new`: grown argument by argument, the two
    // commands reallocated their buffers about ten times a round.
    let mut set = Cmd::with_capacity(7, 3 + 2 + 2 + 3 + key.len() + token.len() + millis.len());
    set.arg("SET")
        .arg(key.as_slice())
        .arg(token.as_slice())
        .arg("NX")
        .arg("PX")
        .arg(millis.as_slice())
        .arg("GET");
    let mut get = Cmd::with_capacity(2, 3 + marker.len());
    get.arg("GET").arg(marker.as_slice());
    let mut pipe = redis::Pipeline::with_capacity(2);
    pipe.add_command(set).add_command(get).ignore_errors();
    Some(Request::Pipe(Arc::new(pipe)))
}

/// Reads the reply of [`known_old`]: where the marker, read after the
/// `SET`, still holds `known`, `Ok(Ok(short))`: the `SET`'s reply in the
/// marked scripts' short form (`{body}`: the node is as old as it was, see
/// [`Known`](crate::protocol::generation::Known)), made in the reply's own
/// array (no allocation on every guarded acquisition). `Ok(Err(value))`,
/// the reply as it came, where the marker changed (the node lost its
/// data, or the marker was touched): the caller asks again with the
/// script, which reads the marker's age (its `SET` then finds our own
/// token, which is agreement). The `SET`'s error (a key of the wrong type)
/// is the request's error.
pub(crate) fn read_known_old(
    value: Value,
    known: &[u8],
) -> redis::RedisResult<Result<Value, Value>> {
    let Value::Array(mut parts) = value else {
        return Ok(Err(value));
    };
    let still_old = match parts.as_slice() {
        // (`run_pipe` makes the `SET`'s error the request's error, and
        // the script then decides; this is for a reply read some other
        // way.)
        [Value::ServerError(e), _] => return Err(e.clone().into()),
        [_, Value::BulkString(held)] => held.as_slice() == known && !known.is_empty(),
        _ => false,
    };
    if !still_old {
        return Ok(Err(Value::Array(parts)));
    }
    parts.truncate(1);
    Ok(Ok(Value::Array(parts)))
}

/// Where the marker changed ([`read_known_old`] gave the reply back): whether
/// the pipeline's `SET` took (it found the key free, or ours), so that our
/// key is on the node should the script that follows fail. A node that
/// answers the acquisition with an error is not released by a failed
/// attempt (it did not take our `SET`, as far as the round knows), so the
/// caller then takes the key back itself ([`taken_back`]).
pub(crate) fn set_took(request: &Request, value: &Value) -> bool {
    let (Request::Script { args, .. }, Value::Array(parts)) = (request, value) else {
        return false;
    };
    match (args.first(), parts.first()) {
        (Some(_), Some(Value::Nil)) => true,
        (Some(token), Some(Value::BulkString(held))) => held == token,
        _ => false,
    }
}

/// The quiet release of the key of the guarded acquisition of one key
/// ([`scripts::SET_MARKED`]) with its token; `None` for any other request.
pub(crate) fn taken_back(request: &Request) -> Option<Request> {
    let Request::Script {
        script: sent,
        keys,
        args,
        ..
    } = request
    else {
        return None;
    };
    if !std::ptr::eq(*sent, &*scripts::SET_MARKED) {
        return None;
    }
    let ([key, _marker], [token, ..]) = (&keys[..], &args[..]) else {
        return None;
    };
    Some(script(
        Kind::Unlock,
        &scripts::UNLOCK,
        &scripts::UNLOCK_MANY,
        &[key.as_slice()],
        &[token.as_slice(), b"quiet"],
    ))
}

/// How the reply of [`request`] is read.
pub(crate) fn read<'a>(
    generation: &'a Generation,
    token: &'a str,
    several: bool,
) -> impl Fn(&Value) -> Result<Reply, String> + 'a {
    let body = move |value: &Value| {
        if several {
            read_acquire_many(token)(value)
        } else {
            read_set(token)(value)
        }
    };
    either(generation, body)
}

/// Reads the reply of `SET key token NX PX ttl GET`: nil where it set the
/// key; the value already there where it did not. Our own token there (a
/// request sent again after its connection broke) is agreement.
pub(crate) fn read_set(token: &str) -> impl Fn(&Value) -> Result<Reply, String> + '_ {
    move |value| match value {
        Value::Nil => Ok(Reply::Agreed(None)),
        Value::BulkString(held) if held.as_slice() == token.as_bytes() => Ok(Reply::Agreed(None)),
        Value::BulkString(held) => Ok(Reply::Refused {
            holder: Some(held.clone()),
        }),
        other => Err(format!("{other:?}")),
    }
}

/// Reads the reply of [`ACQUIRE_MANY`](crate::protocol::scripts::ACQUIRE_MANY): 1 where it set every key; the value
/// of the first key held by another token where it set none. Our own token
/// there (the script sent again after its connection broke) cannot come
/// back: the script treats our keys as free.
pub(crate) fn read_acquire_many(token: &str) -> impl Fn(&Value) -> Result<Reply, String> + '_ {
    move |value| match value {
        Value::Int(1) => Ok(Reply::Agreed(None)),
        Value::BulkString(held) if held.as_slice() != token.as_bytes() => Ok(Reply::Refused {
            holder: Some(held.clone()),
        }),
        other => Err(format!("{other:?}")),
    }
}

/// The remaining times to live the nodes that refused an attempt reported:
/// `Some(ms)`, or `None` for a key without expiry.
#[derive(Debug, Default)]
pub(crate) struct Pttls(Mutex<Vec<Option<u64>>>);

impl Pttls {
    pub(crate) fn push(&self, pttl: i64) {
        let pttl = match pttl {
            // Gone since the SET: free now.
            -2 => Some(0),
            -1 => None,
            n if n >= 0 => Some(n as u64),
            _ => return,
        };
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(pttl);
    }

    /// How long until a quorum of the nodes is free, as far as these replies
    /// tell; see [`timing::holder_expiry`](crate::protocol::timing::holder_expiry).
    pub(crate) fn holder_expiry(&self, nodes: usize) -> Option<Duration> {
        crate::protocol::timing::holder_expiry(
            &self.0.lock().unwrap_or_else(|e| e.into_inner()),
            nodes,
        )
    }
}

/// The acquisition of one key when the caller may wait:
/// `SET key token NX PX ttl GET` then `PTTL key`, in one pipeline.
pub(crate) fn waiting_request(key: &str, token: &str, millis: u64) -> Request {
    Request::Set(Arc::new(Set::new(key, token, millis, true)))
}

/// The acquisition of one key without the marker: `SET key token NX PX ttl
/// GET`, alone or with `PTTL key` behind it in one pipeline (`pttl`), and
/// what a server older than Redis 7.0 gets instead ([`Set::compat`]).
pub(crate) struct Set {
    key: String,
    token: String,
    millis: u64,
    pttl: bool,
    /// The request for Redis 7.0 or later and Valkey, made once.
    modern: Request,
}

impl Set {
    fn new(key: &str, token: &str, millis: u64, pttl: bool) -> Set {
        // Sized ahead: grown argument by argument, the command reallocated
        // its buffers about eight times (on every acquisition).
        let mut set = Cmd::with_capacity(7, 3 + 3 + 2 + 2 + 20 + 3 + key.len() + token.len());
        set.arg("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(millis)
            .arg("GET");
        Set {
            key: key.to_owned(),
            token: token.to_owned(),
            millis,
            pttl,
            modern: Set::with_pttl(set, key, pttl),
        }
    }

    fn with_pttl(set: Cmd, key: &str, pttl: bool) -> Request {
        if !pttl {
            return Request::Cmd(Arc::new(set));
        }
        let mut pipe = redis::pipe();
        pipe.add_command(set).cmd("PTTL").arg(key).ignore_errors();
        Request::Pipe(Arc::new(pipe))
    }

    /// The request for Redis 7.0 or later and Valkey: a [`Request::Cmd`] or
    /// a [`Request::Pipe`].
    pub(crate) fn modern(&self) -> &Request {
        &self.modern
    }

    /// The waiting acquisition (`SET` with `PTTL` behind it) as one
    /// command for a cluster node: `EVAL` of
    /// [`SET_PTTL`](scripts::SET_PTTL), with the pipeline's replies. A
    /// pipeline cannot follow `ASK` while the key's slot migrates (one
    /// `ASKING` covers one command), a command can. `None` for the
    /// acquisition without `PTTL`.
    #[cfg(feature = "cluster")]
    pub(crate) fn one_command(&self) -> Option<Cmd> {
        if !self.pttl {
            return None;
        }
        let mut eval = Cmd::new();
        eval.arg("EVAL")
            .arg(scripts::SET_PTTL)
            .arg(1)
            .arg(&self.key)
            .arg(&self.token)
            .arg(self.millis);
        Some(eval)
    }

    /// The same for a server that refuses `NX` with `GET` (Redis before
    /// 7.0): [`SET_NX_GET`](scripts::SET_NX_GET) sent with `EVAL`, still
    /// one round trip, and the same replies.
    pub(crate) fn compat(&self) -> Request {
        let mut eval = Cmd::new();
        eval.arg("EVAL")
            .arg(scripts::SET_NX_GET)
            .arg(1)
            .arg(&self.key)
            .arg(&self.token)
            .arg(self.millis);
        Set::with_pttl(eval, &self.key, self.pttl)
    }
}

/// Reads the reply of [`waiting_request`]: the `SET`'s reply by `read`, and
/// where it refused, the `PTTL` into `pttls` (a `PTTL` the ACL denies is
/// left out: the expiry is then unknown).
pub(crate) fn read_waiting<'a, F>(
    pttls: &'a Pttls,
    read: F,
) -> impl Fn(&Value) -> Result<Reply, String> + 'a
where
    F: Fn(&Value) -> Result<Reply, String> + 'a,
{
    move |value| match value {
        Value::Array(parts) if parts.len() == 2 => {
            let reply = read(&parts[0])?;
            if let (Reply::Refused { .. }, Value::Int(pttl)) = (&reply, &parts[1]) {
                pttls.push(*pttl);
            }
            Ok(reply)
        }
        other => Err(format!("{other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_acquire_reply_is_read_strictly() {
        let off = Generation {
            marker: crate::protocol::keys::marker_key(""),
            candidate: "c".into(),
            guard: None,
        };
        let read = super::read(&off, "mine", true);
        assert_eq!(read(&Value::Int(1)), Ok(Reply::Agreed(None)));
        assert_eq!(
            read(&Value::BulkString(b"theirs".to_vec())),
            Ok(Reply::Refused {
                holder: Some(b"theirs".to_vec())
            })
        );
        assert!(read(&Value::Nil).is_err());
        assert!(read(&Value::Int(0)).is_err());
        assert!(read(&Value::BulkString(b"mine".to_vec())).is_err());
        let read = super::read(&off, "mine", false);
        assert_eq!(read(&Value::Nil), Ok(Reply::Agreed(None)));
        assert!(read(&Value::Int(1)).is_err());
        // Under the guard the reply carries the marker's age.
        let on = Generation {
            guard: Some(std::time::Duration::from_secs(1)),
            ..off.clone()
        };
        let read = super::read(&on, "mine", false);
        let marked = |body: Value, age: i64| {
            Value::Array(vec![
                body,
                Value::Int(age),
                Value::BulkString(b"1:g".to_vec()),
            ])
        };
        assert_eq!(read(&marked(Value::Nil, 5_000)), Ok(Reply::Agreed(None)));
        assert!(matches!(
            read(&marked(Value::Nil, 5)),
            Ok(Reply::Young { healed: false, .. })
        ));
        assert!(read(&Value::Nil).is_err());
    }

    #[test]
    fn pttl_replies_are_read() {
        let pttls = Pttls::default();
        for p in [-2, -1, 7, -5] {
            pttls.push(p);
        }
        assert_eq!(
            *pttls.0.lock().unwrap(),
            vec![Some(0), None, Some(7)],
            "-5 is no PTTL reply"
        );
    }

    #[test]
    fn the_set_reply_is_read_strictly() {
        let read = read_set("mine");
        assert_eq!(read(&Value::Nil), Ok(Reply::Agreed(None)));
        assert_eq!(
            read(&Value::BulkString(b"mine".to_vec())),
            Ok(Reply::Agreed(None))
        );
        assert_eq!(
            read(&Value::BulkString(b"theirs".to_vec())),
            Ok(Reply::Refused {
                holder: Some(b"theirs".to_vec())
            })
        );
        assert!(read(&Value::Okay).is_err());
    }

    #[test]
    fn the_waiting_reply_reads_the_pttl_of_refusals_only() {
        let pttls = Pttls::default();
        let read = read_waiting(&pttls, read_set("mine"));
        let pair = |set: Value, pttl: i64| Value::Array(vec![set, Value::Int(pttl)]);
        assert_eq!(read(&pair(Value::Nil, 40)), Ok(Reply::Agreed(None)));
        assert!(read(&pair(Value::BulkString(b"theirs".to_vec()), 40)).is_ok());
        assert!(read(&Value::Nil).is_err());
        assert_eq!(*pttls.0.lock().unwrap(), vec![Some(40)]);
    }
}
