//! [`Script`]: one of the crate's Lua scripts, its source and the hash
//! that names it, made once (the statics of [`scripts`](super)).

/// One Lua script: its source, and the SHA-1 of the source, which names it
/// in `EVALSHA`.
///
/// The crate's own type rather than redis-rs's `Script`, which keeps the
/// source to itself: a cluster node that answers `NOSCRIPT` is sent the
/// source with `EVAL`, routed by key to the slot's master alone (see
/// [`send`](crate::engine::send)). redis-rs's cluster client sends
/// `SCRIPT LOAD` to every node of the cluster, replicas included, and
/// fails it while any of them does not answer.
#[derive(Debug)]
pub(crate) struct Script {
    source: Box<str>,
    hash: Box<str>,
}

impl Script {
    /// The script of `source`, hashed here, once.
    pub(crate) fn new(source: &str) -> Script {
        // redis-rs hashes as the server does (SHA-1, lower-case hex).
        let hash = redis::Script::new(source).get_hash().into();
        Script {
            source: source.into(),
            hash,
        }
    }

    /// The SHA-1 of the source in lower-case hex (40 digits): what
    /// `EVALSHA` takes.
    pub(crate) fn hash(&self) -> &str {
        &self.hash
    }

    /// The Lua source: what `EVAL` and `SCRIPT LOAD` take.
    pub(crate) fn source(&self) -> &str {
        &self.source
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_is_named_by_the_sha1_of_its_source() {
        // `SCRIPT LOAD "return 1"` answers this name.
        let script = Script::new("return 1");
        assert_eq!(script.hash(), "e0e1f9fabfc9d4800c877a703b823ac0578ff8db");
        assert_eq!(script.source(), "return 1");
    }
}
