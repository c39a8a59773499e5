//! Raw key checks on one node, by URL, with plain commands and no lock
//! logic: what a test reads to see what the library wrote or left behind.
//! [`Cluster`](crate::Cluster) has the same checks by node index and over
//! every node.
//!
//! Each call opens a connection of its own (2 s to connect) and panics when
//! the node does not answer: a check that cannot read is a failed test, not
//! a missing key. Keys are bytes, so the names of [`keys`](crate::keys) can
//! be checked as well as lock keys.

use std::time::Duration;

/// A plain synchronous connection to `url`.
///
/// # Panics
/// When the URL is invalid or the node does not accept a connection in 2 s.
pub fn conn(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .expect("url")
        .get_connection_with_timeout(Duration::from_secs(2))
        .expect("connect to test node")
}

/// Whether `key` exists at `url` (a node, or one of its databases).
pub fn exists(url: &str, key: impl AsRef<[u8]>) -> bool {
    exists_with(&mut conn(url), key)
}

/// Whether `key` exists, on a connection the caller made.
pub fn exists_with(con: &mut redis::Connection, key: impl AsRef<[u8]>) -> bool {
    redis::cmd("EXISTS")
        .arg(key.as_ref())
        .query::<i64>(con)
        .expect("EXISTS")
        == 1
}

/// `PTTL key` at `url`: milliseconds left, -1 without expiry, -2 when the
/// key does not exist.
pub fn pttl(url: &str, key: impl AsRef<[u8]>) -> i64 {
    redis::cmd("PTTL")
        .arg(key.as_ref())
        .query(&mut conn(url))
        .expect("PTTL")
}

/// `GET key` at `url`, as UTF-8.
pub fn get(url: &str, key: impl AsRef<[u8]>) -> Option<String> {
    let stored: Option<Vec<u8>> = redis::cmd("GET")
        .arg(key.as_ref())
        .query(&mut conn(url))
        .expect("GET");
    stored.map(|s| String::from_utf8(s).expect("a UTF-8 value"))
}

/// `HLEN key` at `url`.
pub fn hlen(url: &str, key: impl AsRef<[u8]>) -> usize {
    redis::cmd("HLEN")
        .arg(key.as_ref())
        .query(&mut conn(url))
        .expect("HLEN")
}

/// Every key at `url` (`KEYS *`: test nodes hold a few keys).
pub fn keys(url: &str) -> Vec<Vec<u8>> {
    redis::cmd("KEYS")
        .arg("*")
        .query(&mut conn(url))
        .expect("KEYS")
}

/// How many times the node at `url` ran `command` (lower case: `publish`,
/// `evalsha`) since it started or its last [`reset_stats`], from `INFO
/// commandstats` (a command a script runs counts too).
pub fn calls(url: &str, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn(url))
        .expect("INFO commandstats");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Resets the node's command statistics (`CONFIG RESETSTAT`).
pub fn reset_stats(url: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut conn(url))
        .expect("CONFIG RESETSTAT");
}

/// Empties the node's script cache (`SCRIPT FLUSH`): its next `EVALSHA`
/// gets `NOSCRIPT`.
pub fn script_flush(url: &str) {
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut conn(url))
        .expect("SCRIPT FLUSH");
}

/// Whether the node at `url` runs Redis before 7.0 (Valkey never does),
/// by `INFO server`: such a node takes no `SET … NX … GET`, and the
/// library sends it scripts instead.
pub fn before_redis_7(url: &str) -> bool {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut conn(url))
        .expect("INFO server");
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
            .map(str::trim)
    };
    field("server_name") != Some("valkey")
        && field("redis_version")
            .and_then(|v| v.split('.').next())
            .and_then(|m| m.parse::<u32>().ok())
            .is_some_and(|major| major < 7)
}
