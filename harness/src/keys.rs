//! The names of the keys and channels the library writes beside a lock key,
//! for tests that look at them with raw commands.
//!
//! They mirror the library's key layout (its "Key layout" docs): a test that
//! reads one of these names checks that the library wrote (or removed) what
//! its layout says. When the library's layout changes, change it here, once.
//!
//! Every name is a key prefix or a lock key (UTF-8), then [`SEPARATOR`], then
//! a suffix. `0xFF` never occurs in UTF-8, so none of these names can be a
//! lock key.

/// The byte between a lock key (or a manager's key prefix) and the suffix
/// of a name that belongs to it.
pub const SEPARATOR: u8 = 0xFF;

/// `base`, [`SEPARATOR`], `suffix`.
fn derived(base: &[u8], suffix: &[u8]) -> Vec<u8> {
    let mut name = Vec::with_capacity(base.len() + 1 + suffix.len());
    name.extend_from_slice(base);
    name.push(SEPARATOR);
    name.extend_from_slice(suffix);
    name
}

/// The fencing counter of a manager's key prefix, one per node for every
/// resource: the prefix, `0xFF`, `counter`.
pub fn counter(prefix: &str) -> Vec<u8> {
    derived(prefix.as_bytes(), b"counter")
}

/// The per-resource fencing counter of older versions: the lock key, `0xFF`,
/// `fence`.
pub fn legacy_counter(lock_key: &str) -> Vec<u8> {
    derived(lock_key.as_bytes(), b"fence")
}

/// The generation marker of a node for a manager's key prefix (the restart
/// guard's): the prefix, `0xFF`, `generation`.
pub fn generation(prefix: &str) -> Vec<u8> {
    derived(prefix.as_bytes(), b"generation")
}

/// The hash of the managers waiting for a lock key: the key, `0xFF`,
/// `waiters`.
pub fn waiters(lock_key: &str) -> Vec<u8> {
    derived(lock_key.as_bytes(), b"waiters")
}

/// The flag a waiting manager keeps on a lock key while it waits for it
/// (the release's gate): the key, `0xFF`, `waiting`.
pub fn waiting(lock_key: &str) -> Vec<u8> {
    derived(lock_key.as_bytes(), b"waiting")
}

/// The hand-off marker a release that named a successor leaves for 30 s:
/// the lock key, `0xFF`, `handoff`.
pub fn handoff(lock_key: &str) -> Vec<u8> {
    derived(lock_key.as_bytes(), b"handoff")
}

/// The pub/sub channel on which a lock key's releases are published: the
/// key, `0xFF`, `released`.
pub fn release_channel(lock_key: &str) -> Vec<u8> {
    derived(lock_key.as_bytes(), b"released")
}

/// The pattern of every manager's own release channel (a key's release
/// channel, `0xFF`, a manager id), for `PUBSUB CHANNELS`.
pub fn own_channel_pattern() -> Vec<u8> {
    derived(b"*released", b"*")
}

/// Whether `key` is a fencing counter (of any prefix).
pub fn is_counter(key: &[u8]) -> bool {
    key.ends_with(&derived(b"", b"counter"))
}

/// Whether `key` is an older per-resource fencing counter.
pub fn is_legacy_counter(key: &[u8]) -> bool {
    key.ends_with(&derived(b"", b"fence"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_base_the_separator_and_the_suffix() {
        assert_eq!(counter("app:"), b"app:\xFFcounter");
        assert_eq!(counter(""), b"\xFFcounter");
        assert_eq!(legacy_counter("app:x"), b"app:x\xFFfence");
        assert_eq!(generation(""), b"\xFFgeneration");
        assert_eq!(waiters("k"), b"k\xFFwaiters");
        assert_eq!(handoff("k"), b"k\xFFhandoff");
        assert_eq!(waiting("k"), b"k\xFFwaiting");
        assert_eq!(release_channel("k"), b"k\xFFreleased");
        assert_eq!(own_channel_pattern(), b"*released\xFF*");
        assert!(is_counter(&counter("p")) && !is_counter(&legacy_counter("p")));
        assert!(is_legacy_counter(&legacy_counter("p")) && !is_legacy_counter(b"p:fence"));
    }

    #[test]
    fn no_derived_name_is_utf8() {
        for name in [
            counter("x"),
            legacy_counter("x"),
            generation("x"),
            waiters("x"),
            handoff("x"),
            waiting("x"),
            release_channel("x"),
        ] {
            assert!(std::str::from_utf8(&name).is_err(), "{name:?}");
        }
    }
}
