//! Every key and channel name of the crate, and the names of the
//! resources a lock takes: one place for the layout and its separator.
//!
//! # Key layout
//! - The lock key is the manager's key prefix followed by the resource name,
//!   as in the other Redlock clients, so that a mixed fleet excludes each
//!   other on the same keys.
//! - The fencing counter is one key per node for every resource: the
//!   manager's key prefix, then the byte `0xFF`, then `counter`
//!   ([`fence_key`]). Resource names and prefixes are UTF-8, and `0xFF`
//!   never occurs in UTF-8, so no lock key can ever equal it. It holds
//!   `<number>:<generation>` (trusted in that generation of the node) or a
//!   bare `<number>` (untrusted; see [`generation`](crate::protocol::generation)).
//! - Versions before it kept one counter per lock key `K`: `K`, then `0xFF`,
//!   then `fence` ([`legacy_fence_key`]). The fencing read takes such a key
//!   as a floor where it is still there, and the write deletes it once the
//!   node's counter holds as much.
//! - The release channel of a lock key `K` (pub/sub, a namespace apart from
//!   keys) is `K`, then `0xFF`, then `released` ([`release_channel`]): no
//!   channel named by a UTF-8 string can equal it.
//! - The managers waiting for a lock key `K` are a hash named `K`, `0xFF`,
//!   `waiters` ([`waiters_key`]), which the release reads to name a
//!   successor.
//! - A key `K` someone may wait for on a node has the flag `K`, `0xFF`,
//!   `waiting` there ([`waiting_key`]), set by each waiting manager's link
//!   before its waiters rely on that node, renewed with its registrations
//!   and deleted by the release together with `K` (one `DEL`): the
//!   release's cheap gate, see [`UNLOCK`](crate::protocol::scripts::UNLOCK).
//! - The last release of `K` that named a successor leaves its message in
//!   `K`, `0xFF`, `handoff` for 30 s, for the releaser's hand-off check
//!   ([`HANDOFF_CHECK`](crate::protocol::scripts::HANDOFF_CHECK)).
//! - The generation marker of a node is the key prefix, then `0xFF`, then
//!   `generation`: no lock key either, and no counter key (the counter ends
//!   in `counter`, an older counter key in `fence`).
//! - The Lua scripts spell the separator `"\255"` (the byte `0xFF`) and build
//!   the same names ([`scripts`](crate::protocol::scripts)); the tests in
//!   `tests/` spell it again to look at raw keys.
//!
//! # Resource names
//! [`check_resources`] checks the names of an acquisition (at most
//! [`MAX_RESOURCES`]), and [`label`] is the name errors and traces give a
//! set of them.

use std::borrow::Cow;
use std::collections::HashSet;

use crate::protocol::error::Error;

/// The byte that separates a lock key from the name of a key that belongs to
/// it: never part of a UTF-8 string, so never part of a lock key.
pub(crate) const SEPARATOR: u8 = 0xFF;

/// The lock key of `resource` under a manager's key `prefix`: the prefix
/// followed by the name, as in the other Redlock clients.
pub(crate) fn lock_key(prefix: &str, resource: &str) -> String {
    format!("{prefix}{resource}")
}

/// The fencing counter key of a manager's key prefix, one per node for
/// every resource; see the module docs.
pub(crate) fn fence_key(prefix: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(prefix.len() + 8);
    key.extend_from_slice(prefix.as_bytes());
    key.push(SEPARATOR);
    key.extend_from_slice(b"counter");
    key
}

/// The per-resource fencing counter key of versions before the shared
/// counter, for a lock key; read as a floor, deleted once covered.
pub(crate) fn legacy_fence_key(lock_key: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(lock_key.len() + 6);
    key.extend_from_slice(lock_key.as_bytes());
    key.push(SEPARATOR);
    key.extend_from_slice(b"fence");
    key
}

/// The bytes after a lock key in the name of its release channel.
const CHANNEL_SUFFIX: &[u8] = b"released";

/// The channel on which the release of lock key `K` is published: `K`,
/// then the byte `0xFF`, then `released`. Channels are a namespace apart
/// from keys; within it, no channel name that is UTF-8 (any other client's
/// channel named by a string) can equal it, because `0xFF` never occurs in
/// UTF-8. A single standalone node understands it: plain `PUBLISH` and
/// `SUBSCRIBE`, no hash slots.
pub(crate) fn release_channel(lock_key: &str) -> Vec<u8> {
    let mut channel = Vec::with_capacity(lock_key.len() + 1 + CHANNEL_SUFFIX.len());
    channel.extend_from_slice(lock_key.as_bytes());
    channel.push(SEPARATOR);
    channel.extend_from_slice(CHANNEL_SUFFIX);
    channel
}

/// The bytes after a lock key in the name of its waiting managers' hash.
const WAITERS_SUFFIX: &[u8] = b"waiters";

/// The hash of the managers waiting for lock key `K`: `K`, then `0xFF`, then
/// `waiters`. Fields are manager ids; values the registration's deadline in
/// milliseconds on the node's clock.
pub(crate) fn waiters_key(lock_key: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(lock_key.len() + 1 + WAITERS_SUFFIX.len());
    key.extend_from_slice(lock_key);
    key.push(SEPARATOR);
    key.extend_from_slice(WAITERS_SUFFIX);
    key
}

/// The bytes after a lock key in the name of its waiting flag.
const WAITING_SUFFIX: &[u8] = b"waiting";

/// The flag of a lock key `K` that someone may wait for: `K`, then `0xFF`,
/// then `waiting` (see the module docs). It is the release's gate: a
/// release that deletes `K` and finds no flag publishes nothing.
pub(crate) fn waiting_key(lock_key: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(lock_key.len() + 1 + WAITING_SUFFIX.len());
    key.extend_from_slice(lock_key);
    key.push(SEPARATOR);
    key.extend_from_slice(WAITING_SUFFIX);
    key
}

/// The channel on which the releases of a lock key go to the manager `id`
/// when a release names it as the successor: the key's [`release_channel`],
/// then `0xFF`, then the id.
pub(crate) fn successor_channel(release_channel: &[u8], id: &str) -> Vec<u8> {
    let mut channel = Vec::with_capacity(release_channel.len() + 1 + id.len());
    channel.extend_from_slice(release_channel);
    channel.push(SEPARATOR);
    channel.extend_from_slice(id.as_bytes());
    channel
}

/// The lock key of a [`release_channel`].
pub(crate) fn channel_lock_key(channel: &[u8]) -> &[u8] {
    channel
        .strip_suffix(CHANNEL_SUFFIX)
        .and_then(|c| c.strip_suffix(&[SEPARATOR]))
        .unwrap_or(channel)
}

/// The marker key of a manager's key prefix.
pub(crate) fn marker_key(prefix: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(prefix.len() + 11);
    key.extend_from_slice(prefix.as_bytes());
    key.push(SEPARATOR);
    key.extend_from_slice(b"generation");
    key
}

/// The most resources one lock may hold.
///
/// Redis itself would take far more keys in one script; the cap is set by
/// time. Each node runs a lock's script in one go, blocking its other
/// clients meanwhile, and the time grows with the keys: measured with 3
/// local nodes on a 2-core machine, one acquisition round over 1,000 keys
/// took 13 ms, over 5,000 63 ms, and 10,000 never reached a quorum within
/// the default 50 ms node timeout (with a 30 s node timeout, 226 ms). The
/// release costs the most per key when other managers wait for the keys:
/// it names a successor and publishes for each key (5 to 7 ms for 1,000
/// keys on an idle node, 70 to 100 ms under a load of 15). So each request
/// gets 1 ms per key past the first on top of the node timeout (see
/// [`RedlockBuilder::node_timeout`](crate::RedlockBuilder::node_timeout)),
/// and lock, extend, fencing and unlock of 1,000 resources succeed with the
/// default timeouts while another manager waits for them (the README's
/// table on sets gives the times at 1, 10, 100 and 1,000 resources).
/// 1,000 keeps a round well inside those bounds.
pub const MAX_RESOURCES: usize = 1_000;

/// How many names a label spells out before it counts the rest.
const LABEL_NAMES: usize = 4;

/// The name errors and traces give a set of resources: the resource itself
/// for one, the names joined by `", "` for several, and past four names,
/// the first four and how many more (`"a, b, c, d and 996 more"`).
pub(crate) fn label<'a>(resources: &[&'a str]) -> Cow<'a, str> {
    match resources {
        [one] => Cow::Borrowed(one),
        several if several.len() <= LABEL_NAMES => Cow::Owned(several.join(", ")),
        several => Cow::Owned(format!(
            "{} and {} more",
            several[..LABEL_NAMES].join(", "),
            several.len() - LABEL_NAMES
        )),
    }
}

/// Checks the names of an acquisition: at least one, none empty, none
/// twice, at most [`MAX_RESOURCES`].
pub(crate) fn check_resources(resources: &[&str]) -> Result<(), Error> {
    match resources {
        [] => return Err(Error::NoResources),
        [""] => return Err(Error::EmptyResource),
        [_] => return Ok(()),
        _ => {}
    }
    if resources.len() > MAX_RESOURCES {
        return Err(Error::TooManyResources {
            count: resources.len(),
            max: MAX_RESOURCES,
        });
    }
    let mut seen = HashSet::with_capacity(resources.len());
    for resource in resources {
        if resource.is_empty() {
            return Err(Error::EmptyResource);
        }
        if !seen.insert(*resource) {
            return Err(Error::DuplicateResource {
                resource: (*resource).to_owned(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_lock_key_is_a_fence_key() {
        let fence = legacy_fence_key("stock:42");
        assert!(fence.starts_with(b"stock:42"));
        assert!(std::str::from_utf8(&fence).is_err(), "never valid UTF-8");
        assert_ne!(fence, b"stock:42:fence");
        // One counter per prefix, never an older per-resource counter (of
        // any prefix and resource: those end in `fence`) nor a marker.
        let counter = fence_key("locks:");
        assert!(counter.starts_with(b"locks:"));
        assert!(std::str::from_utf8(&counter).is_err());
        assert!(!counter.ends_with(b"\xFFfence"));
        assert_ne!(counter, marker_key("locks:"));
    }

    #[test]
    fn names_are_checked_before_anything_is_sent() {
        assert!(matches!(check_resources(&[]), Err(Error::NoResources)));
        assert!(matches!(check_resources(&[""]), Err(Error::EmptyResource)));
        assert!(matches!(
            check_resources(&["a", ""]),
            Err(Error::EmptyResource)
        ));
        assert!(matches!(
            check_resources(&["a", "b", "a"]),
            Err(Error::DuplicateResource { resource }) if resource == "a"
        ));
        assert!(check_resources(&["a"]).is_ok());
        assert!(check_resources(&["a", "b"]).is_ok());
        let names: Vec<String> = (0..=MAX_RESOURCES).map(|i| i.to_string()).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        assert!(check_resources(&names[..MAX_RESOURCES]).is_ok());
        assert!(matches!(
            check_resources(&names),
            Err(Error::TooManyResources { count, max: MAX_RESOURCES }) if count == MAX_RESOURCES + 1
        ));
    }

    #[test]
    fn labels() {
        assert_eq!(label(&["a"]), "a");
        assert_eq!(label(&["a", "b"]), "a, b");
        assert_eq!(label(&["a", "b", "c", "d"]), "a, b, c, d");
        assert_eq!(
            label(&["a", "b", "c", "d", "e", "f"]),
            "a, b, c, d and 2 more"
        );
    }
}
