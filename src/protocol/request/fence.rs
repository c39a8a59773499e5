//! Fencing: the read ([`FENCE_READ`](crate::protocol::scripts::FENCE_READ))
//! and the write ([`FENCE_WRITE`](crate::protocol::scripts::FENCE_WRITE)) of
//! the node's counter, always marked, and how their replies are read. The
//! rule that proves a read is [`proven`](crate::protocol::quorum::proven);
//! the round that uses them is [`crate::engine::fence`].

use redis::Value;

use super::{Marked, Request, marked};
use crate::protocol::generation::Generation;
use crate::protocol::keys;
use crate::protocol::quorum::Reply;
use crate::protocol::scripts;

/// The fencing read (`number` = `None`) or write of a lock: the lock keys,
/// then their legacy counter keys, then the node's counter, then the
/// generation marker ([`scripts::FENCE_READ`], [`scripts::FENCE_WRITE`],
/// for one key or several). The write names the generations it may trust
/// the counter in (`trust`). Their replies are read by
/// [`Generation::reader`] over [`read`] and
/// [`read_flag`](super::read_flag).
pub(crate) fn request(
    generation: &Generation,
    prefix: &str,
    lock_keys: &[&str],
    token: &str,
    number: Option<(u64, &[Vec<u8>])>,
) -> Request {
    let legacy: Vec<Vec<u8>> = lock_keys
        .iter()
        .map(|k| keys::legacy_fence_key(k))
        .collect();
    let counter = keys::fence_key(prefix);
    let keys: Vec<&[u8]> = lock_keys
        .iter()
        .map(|k| k.as_bytes())
        .chain(legacy.iter().map(Vec::as_slice))
        .chain([counter.as_slice()])
        .collect();
    match number {
        None => marked(
            generation,
            &scripts::FENCE_READ,
            &keys,
            &[token.as_bytes()],
            Marked::WithAge,
        ),
        Some((number, trust)) => {
            let number = number.to_string();
            let args: Vec<&[u8]> = [token.as_bytes(), number.as_bytes()]
                .into_iter()
                .chain(trust.iter().map(Vec::as_slice))
                .collect();
            marked(
                generation,
                &scripts::FENCE_WRITE,
                &keys,
                &args,
                Marked::Known,
            )
        }
    }
}

/// Reads the body's reply of the fencing read: `{counter, trusted, ours,
/// generation}` (the generation is read by [`generation`]).
pub(crate) fn read(value: &Value) -> Result<Reply, String> {
    match value {
        Value::Array(parts) => match parts.as_slice() {
            [
                Value::Int(n),
                Value::Int(t @ (0 | 1)),
                Value::Int(ours @ (0 | 1)),
                Value::BulkString(_),
            ] if *n >= 0 => {
                let trusted = *t == 1;
                Ok(match (*ours == 1, trusted) {
                    (true, true) => Reply::Agreed(Some(*n)),
                    (true, false) => Reply::Untrusted(*n),
                    (false, _) => Reply::Foreign {
                        number: *n,
                        trusted,
                    },
                })
            }
            _ => Err(format!("{value:?}")),
        },
        other => Err(format!("{other:?}")),
    }
}

/// The node's generation and the marker's age in milliseconds from a whole
/// fencing read reply (`{body, age, generation}`, see [`with_marker`](crate::protocol::generation::with_marker)).
pub(crate) fn generation(value: &Value) -> Option<(Vec<u8>, i64)> {
    let Value::Array(parts) = value else {
        return None;
    };
    let [Value::Array(body), Value::Int(age), _] = parts.as_slice() else {
        return None;
    };
    match body.as_slice() {
        [_, _, _, Value::BulkString(generation)] => Some((generation.clone(), *age)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_replies_are_read_strictly() {
        let read = |n, t, o| {
            super::read(&Value::Array(vec![
                Value::Int(n),
                Value::Int(t),
                Value::Int(o),
                Value::BulkString(b"17:g".to_vec()),
            ]))
        };
        assert_eq!(
            generation(&Value::Array(vec![
                Value::Array(vec![
                    Value::Int(7),
                    Value::Int(0),
                    Value::Int(1),
                    Value::BulkString(b"17:g".to_vec()),
                ]),
                Value::Int(9000),
                Value::BulkString(b"17:g".to_vec()),
            ])),
            Some((b"17:g".to_vec(), 9000))
        );
        assert_eq!(generation(&Value::Int(7)), None);
        assert_eq!(read(7, 1, 1), Ok(Reply::Agreed(Some(7))));
        assert_eq!(read(7, 0, 1), Ok(Reply::Untrusted(7)));
        assert_eq!(
            read(7, 0, 0),
            Ok(Reply::Foreign {
                number: 7,
                trusted: false
            })
        );
        assert!(read(-3, 1, 1).is_err());
        assert!(read(3, 2, 1).is_err());
        assert!(super::read(&Value::Int(7)).is_err());
        assert!(super::read(&Value::Int(-1)).is_err());
    }
}
