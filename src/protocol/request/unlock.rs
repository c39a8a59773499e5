//! Release: [`UNLOCK`](crate::protocol::scripts::UNLOCK) or
//! [`UNLOCK_MANY`](crate::protocol::scripts::UNLOCK_MANY), loud or quiet,
//! and the native conditional delete sent instead to a node that refuses
//! scripts. The one place the unlock request is built: the release round,
//! the retry queue and a cancelled attempt all send this.

use redis::{Cmd, Value};

use super::{Kind, Request, read_flag, script};
use crate::protocol::quorum::Reply;
use crate::protocol::scripts;

/// The release of keys held by `token`: [`scripts::UNLOCK`] or
/// [`scripts::UNLOCK_MANY`]; `quiet` leaves the release unpublished (see
/// [`scripts::UNLOCK`]).
pub(crate) fn request(keys: &[&str], token: &str, quiet: bool) -> Request {
    let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    let args: &[&[u8]] = if quiet {
        &[token.as_bytes(), b"quiet"]
    } else {
        &[token.as_bytes()]
    };
    script(
        Kind::Unlock,
        &scripts::UNLOCK,
        &scripts::UNLOCK_MANY,
        &keys,
        args,
    )
}

/// Reads the reply of [`UNLOCK`](crate::protocol::scripts::UNLOCK) and [`UNLOCK_MANY`](crate::protocol::scripts::UNLOCK_MANY): 1 released, 2
/// released and a successor named (`Agreed(Some(2))`), 0 not ours.
pub(crate) fn read(value: &Value) -> Result<Reply, String> {
    match value {
        Value::Int(2) => Ok(Reply::Agreed(Some(2))),
        other => read_flag(other),
    }
}

/// What conditional delete a server has natively, learned from its
/// `INFO` (see [`crate::engine::node`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Native {
    /// None: the unlock script is the only way.
    None,
    /// `DELIFEQ key token` (Valkey 9.0 or later).
    DelIfEq,
    /// `DELEX key IFEQ token` (Redis 8.4 or later).
    DelEx,
}

/// The server's native "delete if the value equals" command for `key`
/// and `token`, if it has one (`DELIFEQ` on Valkey 9.0 or later,
/// `DELEX key IFEQ token` on Redis 8.4 or later). It answers 1 or 0 as
/// the unlock script does; used where the node refuses scripts.
pub(crate) fn native(native: Native, key: &[u8], token: &[u8]) -> Option<Cmd> {
    match native {
        Native::DelIfEq => {
            let mut cmd = redis::cmd("DELIFEQ");
            cmd.arg(key).arg(token);
            Some(cmd)
        }
        Native::DelEx => {
            let mut cmd = redis::cmd("DELEX");
            cmd.arg(key).arg("IFEQ").arg(token);
            Some(cmd)
        }
        Native::None => None,
    }
}

/// The native conditional delete to send instead of `request`, when
/// `request` is the unlock of one key ([`Kind::Unlock`]) and the node has
/// one; `None` for any other request.
pub(crate) fn native_instead(native_kind: Native, request: &Request) -> Option<Cmd> {
    let Request::Script {
        keys, args, kind, ..
    } = request
    else {
        return None;
    };
    if *kind != Kind::Unlock || keys.len() != 1 {
        return None;
    }
    native(native_kind, &keys[0], args.first()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_is_a_named_successor() {
        assert_eq!(read(&Value::Int(2)), Ok(Reply::Agreed(Some(2))));
        assert_eq!(read(&Value::Int(1)), Ok(Reply::Agreed(None)));
        assert_eq!(read(&Value::Int(0)), Ok(Reply::Refused { holder: None }));
        assert!(read(&Value::Nil).is_err());
    }

    #[test]
    fn only_the_unlock_of_one_key_has_a_native_form() {
        let one = request(&["k"], "t", false);
        let cmd = native_instead(Native::DelIfEq, &one).expect("one key");
        assert_eq!(cmd.args_iter().count(), 3);
        assert!(native_instead(Native::DelEx, &one).is_some());
        assert!(native_instead(Native::None, &one).is_none());
        let two = request(&["k", "l"], "t", false);
        assert!(native_instead(Native::DelIfEq, &two).is_none());
        let check = crate::protocol::request::check::request(
            &crate::protocol::generation::Generation {
                marker: crate::protocol::keys::marker_key(""),
                candidate: "c".into(),
                guard: None,
            },
            &["k"],
            "t",
        );
        assert!(native_instead(Native::DelIfEq, &check).is_none());
    }
}
