//! Extension: [`EXTEND`](crate::protocol::scripts::EXTEND) or
//! [`EXTEND_MANY`](crate::protocol::scripts::EXTEND_MANY) (with healing),
//! marked under the restart guard.

use redis::Value;

use super::{Kind, Marked, Request, either, marked, read_flag, script};
use crate::protocol::generation::Generation;
use crate::protocol::quorum::Reply;
use crate::protocol::scripts;

/// The extension request of a lock: [`scripts::EXTEND`] or
/// [`scripts::EXTEND_MANY`], with the generation marker under the restart
/// guard.
pub(crate) fn request(generation: &Generation, keys: &[&str], token: &str, millis: u64) -> Request {
    let millis = millis.to_string();
    let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    let args = [token.as_bytes(), millis.as_bytes()];
    match (keys.len(), generation.guard.is_some()) {
        (_, false) => script(
            Kind::Other,
            &scripts::EXTEND,
            &scripts::EXTEND_MANY,
            &keys,
            &args,
        ),
        (1, true) => marked(
            generation,
            &scripts::EXTEND_MARKED,
            &keys,
            &args,
            Marked::Known,
        ),
        (_, true) => marked(
            generation,
            &scripts::EXTEND_MANY_MARKED,
            &keys,
            &args,
            Marked::Known,
        ),
    }
}

/// How the reply of [`request`] is read.
pub(crate) fn read(generation: &Generation) -> impl Fn(&Value) -> Result<Reply, String> {
    either(generation, read_extend)
}

/// Reads the reply of the extend script: 1 extended, 2 set again where it
/// was missing, 0 not ours.
pub(crate) fn read_extend(value: &Value) -> Result<Reply, String> {
    match value {
        Value::Int(2) => Ok(Reply::Healed),
        other => read_flag(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healed_is_two() {
        assert_eq!(read_extend(&Value::Int(2)), Ok(Reply::Healed));
        assert_eq!(read_extend(&Value::Int(1)), Ok(Reply::Agreed(None)));
        assert_eq!(
            read_extend(&Value::Int(0)),
            Ok(Reply::Refused { holder: None })
        );
        assert!(read_extend(&Value::Int(3)).is_err());
    }
}
