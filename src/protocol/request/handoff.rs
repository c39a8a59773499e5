//! The releaser's hand-off check
//! ([`HANDOFF_CHECK`](crate::protocol::scripts::HANDOFF_CHECK)), sent to
//! the nodes that released after a release that named a successor (see
//! [`crate::engine::wait`]).

use std::sync::Arc;

use redis::Value;

use super::{Kind, Marked, Request};
use crate::protocol::scripts;

/// The hand-off check of a release of `keys` by `token`.
pub(crate) fn request(keys: Vec<Vec<u8>>, token: Vec<u8>) -> Request {
    Request::Script {
        script: &scripts::HANDOFF_CHECK,
        keys: keys.into(),
        args: Arc::from([token]),
        kind: Kind::Other,
        marked: Marked::No,
    }
}

/// Whether the check published the release again on the node (it answers
/// how many keys it published).
pub(crate) fn republished(reply: &Value) -> bool {
    matches!(reply, Value::Int(n) if *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_positive_count_republished() {
        assert!(republished(&Value::Int(2)));
        assert!(!republished(&Value::Int(0)));
        assert!(!republished(&Value::Nil));
        assert_eq!(request(vec![b"k".to_vec()], b"t".to_vec()).keys(), 1);
    }
}
