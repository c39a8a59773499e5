//! The Lua scripts that release and extend a lock, created once.
//!
//! Both compare the stored value with the caller's token before they touch
//! the key, inside one script so that nothing can run between the comparison
//! and the write (a `GET` followed by a `DEL` from the client could delete a
//! lock that changed hands in between). They are invoked with
//! [`redis::Script::invoke_async`], which sends `EVALSHA` and, when the node
//! answers `NOSCRIPT` (a restarted node, `SCRIPT FLUSH`), loads the script and
//! retries once.

use std::sync::LazyLock;

use redis::Script;

/// `KEYS[1]` = key, `ARGV[1]` = token. Deletes the key only when it holds the
/// token. Returns 1 when it deleted, 0 otherwise.
pub(crate) static UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"if redis.call("get", KEYS[1]) == ARGV[1] then
    return redis.call("del", KEYS[1])
else
    return 0
end"#,
    )
});

/// `KEYS[1]` = key, `ARGV[1]` = token, `ARGV[2]` = ttl in milliseconds.
/// Resets the expiry only when the key holds the token; never creates a
/// missing key. Returns 1 when it extended, 0 otherwise.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"if redis.call("get", KEYS[1]) == ARGV[1] then
    return redis.call("pexpire", KEYS[1], ARGV[2])
else
    return 0
end"#,
    )
});
