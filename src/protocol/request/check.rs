//! The remote check of a lock: [`CHECK`](crate::protocol::scripts::CHECK)
//! or [`CHECK_MANY`](crate::protocol::scripts::CHECK_MANY), marked under the
//! restart guard.

use redis::Value;

use super::{Kind, Marked, Request, either, marked, read_flag, script};
use crate::protocol::generation::Generation;
use crate::protocol::quorum::Reply;
use crate::protocol::scripts;

/// The remote check of a lock: [`scripts::CHECK`] or
/// [`scripts::CHECK_MANY`], with the generation marker under the restart
/// guard. Read by [`read`].
pub(crate) fn request(generation: &Generation, keys: &[&str], token: &str) -> Request {
    let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    let args = [token.as_bytes()];
    match (keys.len(), generation.guard.is_some()) {
        (_, false) => script(
            Kind::Other,
            &scripts::CHECK,
            &scripts::CHECK_MANY,
            &keys,
            &args,
        ),
        (1, true) => marked(
            generation,
            &scripts::CHECK_MARKED,
            &keys,
            &args,
            Marked::Known,
        ),
        (_, true) => marked(
            generation,
            &scripts::CHECK_MANY_MARKED,
            &keys,
            &args,
            Marked::Known,
        ),
    }
}

/// How the reply of [`request`] is read.
pub(crate) fn read(generation: &Generation) -> impl Fn(&Value) -> Result<Reply, String> {
    either(generation, read_flag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_reply_is_a_flag() {
        let off = Generation {
            marker: crate::protocol::keys::marker_key(""),
            candidate: "c".into(),
            guard: None,
        };
        let read = read(&off);
        assert_eq!(read(&Value::Int(1)), Ok(Reply::Agreed(None)));
        assert_eq!(read(&Value::Int(0)), Ok(Reply::Refused { holder: None }));
        assert!(read(&Value::Int(2)).is_err());
        assert!(read(&Value::Nil).is_err());
    }
}
