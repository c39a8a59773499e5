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

/// `KEYS[1]` = lock key, `KEYS[2]` = fencing counter key, `ARGV[1]` = token.
/// Where the lock holds the token, returns the counter (0 if never set);
/// elsewhere -1.
pub(crate) static FENCE_READ: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"if redis.call("get", KEYS[1]) == ARGV[1] then
    return tonumber(redis.call("get", KEYS[2]) or "0")
else
    return -1
end"#,
    )
});

/// `KEYS[1]` = lock key, `KEYS[2]` = fencing counter key, `ARGV[1]` = token,
/// `ARGV[2]` = the new fencing number. Where the lock holds the token, raises
/// the counter to the number (never lowers it) and returns 1; elsewhere 0.
pub(crate) static FENCE_WRITE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"if redis.call("get", KEYS[1]) == ARGV[1] then
    local current = tonumber(redis.call("get", KEYS[2]) or "0")
    if tonumber(ARGV[2]) > current then
        redis.call("set", KEYS[2], ARGV[2])
    end
    return 1
else
    return 0
end"#,
    )
});
