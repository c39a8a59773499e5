//! The commands and Lua scripts of a lock, created once, and how each
//! node's reply to them is read.
//!
//! The scripts compare the stored value with the caller's token before they
//! touch the key, inside one script so that nothing can run between the
//! comparison and the write (a `GET` followed by a `DEL` from the client could
//! delete a lock that changed hands in between). They are invoked with
//! `EVALSHA` and, when the node answers `NOSCRIPT` (a restarted node,
//! `SCRIPT FLUSH`), loaded and retried once, or on a cluster node sent
//! once more with `EVAL` ([`Script`] keeps each script's source for it;
//! see [`send`](crate::engine::send)).
//!
//! The key and channel names they use are in [`keys`](crate::protocol::keys).

use std::sync::LazyLock;

use crate::protocol::generation;

pub(crate) mod script;
#[cfg(feature = "cluster")]
mod sharded;

pub(crate) use script::Script;
#[cfg(feature = "cluster")]
pub(crate) use sharded::{HANDOFF_CHECK_SHARD, SET_PTTL, UNLOCK_SHARD};

/// `KEYS[1]` = key, `ARGV[1]` = token, `ARGV[2]` = `quiet` or absent.
/// Deletes the key only when it holds the token, and then, in the same
/// script, publishes the release on the key's [`release_channel`](crate::protocol::keys::release_channel) (see
/// [`released`] for the message) unless `ARGV[2]` is `quiet`. Returns 1 when
/// it deleted, 2 when it deleted and named a successor (the releaser then
/// checks the hand-off, [`HANDOFF_CHECK`]), 0 otherwise; read by
/// [`unlock::read`](crate::protocol::request::unlock::read).
///
/// `quiet` is for the release of a failed attempt that never had a quorum:
/// no waiter saw it as a holder, and waking waiters for it would only start
/// rounds that find the real holder (two contenders' partial releases could
/// wake each other forever).
///
/// **The gate.** The key is deleted together with its waiting flag
/// ([`waiting_key`](crate::protocol::keys::waiting_key)), in one `DEL`: a
/// count of 1 means no manager flagged the key, nobody may wait, and the
/// release costs the node the classic token-checked unlock and a second
/// key in its `DEL` (about 0.25 µs a call, `benches/gate/run.sh`). A
/// waiting manager's link sets the flag on a node after subscribing the
/// key's channel there and before its waiters count that node as
/// subscribed, and renews it every [`LEASE`](crate::protocol::timing::LEASE)
/// / 3 while it stays subscribed (`engine::wait::link`). Where the flag
/// was there, the release asks `PUBSUB NUMSUB` whether anyone still
/// subscribes the key's channel: if so, it sets the flag again (the
/// managers it does not wake still wait, and their next release must find
/// it) and publishes ([`released`]); if not, it leaves the flag deleted.
/// So every release made while some manager's subscription is confirmed
/// publishes; `model/src/gate.rs` checks this, and the schedules that lose
/// a wake-up without the flag's order or its setting again.
///
/// The publish is a `pcall`: a user whose ACL denies `PUBLISH` on the
/// channel still releases (its waiters fall back to the timed retry). So
/// is the `DEL` of the flag: a user whose key pattern covers the lock key
/// but not its flag (`~app:lock1`) deletes the key alone, and the gate is
/// then `PUBSUB NUMSUB`, as before the flag.
pub(crate) static UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    let released = released("publish");
    let lease = crate::protocol::timing::LEASE.as_millis();
    Script::new(&format!(
        r#"if redis.call("get", KEYS[1]) == ARGV[1] then
    if ARGV[2] == "quiet" then
        return redis.call("del", KEYS[1])
    end
    local flag = KEYS[1] .. "\255waiting"
    local n = redis.pcall("del", KEYS[1], flag)
    -- nobody flagged the key: the common case, before any other check
    if n == 1 then
        return 1
    end
    if type(n) ~= "number" then
        -- the flag out of the user's reach (an ACL): the key alone, and
        -- the gate is the subscription count
        n = redis.call("del", KEYS[1]) + 1
    end
    if n == 1 then
        return 1
    end
    -- flagged: the gate of unlock_many, then the flag again
    local channel = KEYS[1] .. "\255released"
    local n = redis.pcall("pubsub", "numsub", channel)
    if type(n) ~= "table" or n.err ~= nil or n[2] ~= 0 then
        redis.pcall("set", flag, "1", "PX", {lease})
        {released}
        if released(channel, KEYS[1] .. "\255waiters", KEYS[1] .. "\255handoff") then
            return 2
        end
    end
    return 1
else
    return 0
end"#
    ))
});

/// The gate of the unlock scripts (written out inline in [`UNLOCK`]):
/// whether anyone may wait for a key on this node, that is, whether anyone
/// subscribes its release channel (`PUBSUB NUMSUB`; `SHARDNUMSUB` on a
/// cluster node). Every waiting manager subscribes that channel before its
/// last attempt, and a manager registered for the key subscribes it first,
/// so where nobody subscribes nobody could be told: the release skips
/// [`released`] (the waiters' hash, the digest, the publish) and costs the
/// node about what the classic token-checked unlock costs, plus this one
/// command. Where `PUBSUB` is refused (an ACL), it answers yes, and the
/// release publishes as before.
///
/// The body of the release of several keys ([`UNLOCK_MANY`], and
/// `UNLOCK_SHARD` on a cluster node): `publish` and `numsub` are the
/// commands of the node's kind of pub/sub, `prefix` the Lua expression
/// put before a lock key to name the waiting protocol's channels and keys
/// (empty, or the slot's tag `ARGV[3] .. ` on a cluster node).
fn unlock_many(publish: &str, numsub: &str, prefix: &str) -> String {
    format!(
        r#"{released}
local deleted = 0
local named = false
for _, key in ipairs(KEYS) do
    if redis.call("get", key) == ARGV[1] then
        deleted = deleted + redis.call("del", key)
        if ARGV[2] ~= "quiet" then
            local name = {prefix}key
            local channel = name .. "\255released"
            local n = redis.pcall("pubsub", "{numsub}", channel)
            if (type(n) ~= "table" or n.err ~= nil or n[2] ~= 0)
                and released(channel, name .. "\255waiters", name .. "\255handoff") then
                named = true
            end
        end
    end
end
if named then
    return 2
end
if deleted > 0 then
    return 1
end
return 0"#,
        released = released(publish)
    )
}

/// The Lua helper of the unlock scripts, with `publish` the command that
/// publishes (`publish`, or `spublish` on a cluster node):
/// `released(channel, queue, marker)` publishes the release of a key whose
/// release channel, waiting hash and hand-off marker these are, with a
/// message that names the release without giving the token away (the
/// first 16 hex digits of the SHA-1 of the token, `ARGV[1]`: the same on
/// every node), on the own channel of one live registered waiting
/// manager, the successor (at most 3 tries; then it leaves the key's
/// hand-off marker and returns true), or else on the key's release
/// channel, for every manager. The names are those of
/// [`keys`](crate::protocol::keys) (`"\255"` is the byte `0xFF`), in the
/// key's slot on a cluster node; the protocol, and the reason for each
/// step, is described in `docs/waiting.md`.
///
/// The message and the node's clock are read once per script run, at the
/// first key that needs them: a release of many keys ([`UNLOCK_MANY`]) pays
/// per key only the hash read and the publish (and only for keys someone
/// may wait for, [`unlock_many`]).
fn released(publish: &str) -> String {
    format!(
        r#"local message, now
local function released(channel, queue, marker)
    if not message then
        message = string.sub(redis.sha1hex(ARGV[1]), 1, 16)
    end
    local ok, live = pcall(function()
        local ids = redis.call("hgetall", queue)
        if #ids == 0 then
            return {{}}
        end
        if not now then
            local t = redis.call("time")
            now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        end
        local live = {{}}
        for i = 1, #ids, 2 do
            local deadline = tonumber(ids[i + 1])
            if deadline and deadline > now then
                live[#live + 1] = ids[i]
            else
                redis.call("hdel", queue, ids[i])
            end
        end
        table.sort(live)
        return live
    end)
    if ok and #live > 0 then
        local at = tonumber(string.sub(message, 1, 8), 16) % #live
        for try = 1, math.min(#live, 3) do
            local successor = live[(at + try - 1) % #live + 1]
            local sent = redis.pcall("{publish}", channel .. "\255" .. successor, message)
            if type(sent) ~= "number" then
                break
            end
            if sent > 0 then
                redis.pcall("set", marker, message, "PX", 30000)
                return true
            end
            redis.pcall("hdel", queue, successor)
        end
        redis.pcall("del", marker)
    end
    redis.pcall("{publish}", channel, message)
    return false
end"#
    )
}

/// `KEYS` = the lock keys of a release, `ARGV[1]` = its token. Sent by the
/// releaser, [`wait::HANDOFF_CHECK`](crate::protocol::timing::HANDOFF_CHECK) after a
/// release that named a successor ([`UNLOCK`] returned 2), to each node
/// that released: for each key that is still free, and whose last
/// contended release is still this one (its hand-off marker, see
/// [`released`], holds this release's message), publishes the release
/// again, with the same message, on the key's [`release_channel`](crate::protocol::keys::release_channel), for
/// every manager, and drops the marker. A successor that took the lock left
/// the key held, and a later release replaced or dropped the marker: then
/// nothing is sent. Returns how many keys it published.
pub(crate) static HANDOFF_CHECK: LazyLock<Script> =
    LazyLock::new(|| Script::new(&handoff_check("publish", "")));

/// The body of [`HANDOFF_CHECK`] (and of `HANDOFF_CHECK_SHARD` on a
/// cluster node): `publish` and `prefix` as in [`unlock_many`]. The
/// marker is read and dropped with `pcall`: on a cluster node it is not
/// declared (see `UNLOCK_SHARD`).
fn handoff_check(publish: &str, prefix: &str) -> String {
    format!(
        r#"local message = string.sub(redis.sha1hex(ARGV[1]), 1, 16)
local published = 0
for _, key in ipairs(KEYS) do
    local name = {prefix}key
    local marker = name .. "\255handoff"
    if not redis.call("get", key) and redis.pcall("get", marker) == message then
        redis.pcall("del", marker)
        redis.pcall("{publish}", name .. "\255released", message)
        published = published + 1
    end
end
return published"#
    )
}

/// `KEYS[1]` = a [`waiters_key`](crate::protocol::keys::waiters_key), `ARGV[1]` = manager id, `ARGV[2]` = lease
/// in milliseconds. Registers the manager as waiting until the node's
/// clock plus the lease, and keeps the hash that long (every manager
/// registers with the same lease and renews it). Returns 1.
/// Sent with `EVAL` (it is short, and survives a `SCRIPT FLUSH`).
pub(crate) const REGISTER: &str = r#"local t = redis.call("time")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("hset", KEYS[1], ARGV[1], now + tonumber(ARGV[2]))
redis.call("pexpire", KEYS[1], ARGV[2])
return 1"#;

/// `KEYS[1]` = key, `ARGV[1]` = token, `ARGV[2]` = ttl in milliseconds.
/// Where the key holds the token, resets its expiry and returns 1. Where the
/// key is missing (a node that restarted empty, or was down when the lock
/// was taken), sets it again with the token and the ttl and returns 2: the
/// renewal heals the lock, and the caller counts such a node as not ours
/// for this round. Where another value holds it, returns 0.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_BODY));

const EXTEND_BODY: &str = r#"local held = redis.call("get", KEYS[1])
if held == ARGV[1] then
    redis.call("pexpire", KEYS[1], ARGV[2])
    return 1
elseif not held then
    redis.call("set", KEYS[1], ARGV[1], "PX", ARGV[2])
    return 2
else
    return 0
end"#;

/// [`EXTEND`] with the generation marker (restart guard on).
pub(crate) static EXTEND_MARKED: LazyLock<Script> =
    LazyLock::new(|| generation::with_marker(EXTEND_BODY));

/// `KEYS[1]` = key, `ARGV[1]` = token, `ARGV[2]` = ttl in milliseconds:
/// `SET key token NX PX ttl GET` with the generation marker (restart guard
/// on); the body's reply is that of the `SET`, read by [`acquire::read_set`](crate::protocol::request::acquire::read_set).
pub(crate) static SET_MARKED: LazyLock<Script> = LazyLock::new(|| {
    generation::with_marker(
        r#"return redis.call("set", KEYS[1], ARGV[1], "NX", "PX", ARGV[2], "GET")"#,
    )
});

/// [`SET_MARKED`] for servers that refuse `NX` with `GET` (Redis before
/// 7.0): the same replies, from [`SET_NX_GET`]'s body.
pub(crate) static SET_MARKED_COMPAT: LazyLock<Script> =
    LazyLock::new(|| generation::with_marker(SET_NX_GET));

/// `KEYS[1]` = key, `ARGV[1]` = token, `ARGV[2]` = ttl in milliseconds:
/// what `SET key token NX PX ttl GET` does, for servers that refuse `NX`
/// with `GET` (Redis before 7.0): the value there, or, where the key is
/// missing, sets it and answers nil. Sent with `EVAL` (it is short, and
/// survives a `SCRIPT FLUSH`); see
/// [`Set::compat`](crate::protocol::request::acquire::Set::compat).
pub(crate) const SET_NX_GET: &str = r#"local held = redis.call("get", KEYS[1])
if held then
    return held
end
redis.call("set", KEYS[1], ARGV[1], "PX", ARGV[2])
return false"#;

/// `KEYS[1]` = a generation marker, `ARGV[1]` = the manager's candidate id:
/// sets the marker as the marked scripts' prelude does where it is
/// missing (`<now in ms>:<candidate>`, on the node's clock), and keeps one
/// that is there. A cluster node's markers, one per slot, are made ahead
/// with it ([`crate::engine::cluster::make_markers`]).
#[cfg(feature = "cluster")]
pub(crate) static MARKER_INIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"local clock = redis.call("time")
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
return redis.call("set", KEYS[1], now .. ":" .. ARGV[1], "NX")"#,
    )
});

/// `KEYS[1]` = key, `ARGV[1]` = token. Returns 1 where the key holds the
/// token, 0 elsewhere. Changes nothing.
pub(crate) static CHECK: LazyLock<Script> = LazyLock::new(|| Script::new(CHECK_BODY));

const CHECK_BODY: &str = r#"if redis.call("get", KEYS[1]) == ARGV[1] then
    return 1
else
    return 0
end"#;

/// [`CHECK`] with the generation marker (restart guard on).
pub(crate) static CHECK_MARKED: LazyLock<Script> =
    LazyLock::new(|| generation::with_marker(CHECK_BODY));

/// `KEYS` = the lock keys of a lock (one or more), then their
/// [`legacy_fence_key`](crate::protocol::keys::legacy_fence_key)s in the same order, then the node's counter
/// ([`fence_key`](crate::protocol::keys::fence_key)); `ARGV[1]` = token; with the generation marker. Returns
/// `{counter, trusted, ours, generation}`: the larger of the counter's
/// number and the legacy counters' (0 if all are missing); 1 when the
/// counter is trusted, i.e. written in the node's current generation and
/// not bare, 0 otherwise (see [`generation`]); 1 when every lock key holds
/// the token there; and the node's generation. The counter is read whoever
/// holds the lock on that node: a read made after the grant comes after
/// every earlier holder's acknowledged write, so any counter is a valid
/// lower bound.
pub(crate) static FENCE_READ: LazyLock<Script> =
    LazyLock::new(|| generation::with_marker(&format!("{COUNTER}\n{FENCE_READ_BODY}")));

const FENCE_READ_BODY: &str = r#"local n = (#KEYS - 1) / 2
local highest, trusted = counter(KEYS[#KEYS])
local ours = 1
for i = 1, n do
    if redis.call("get", KEYS[i]) ~= ARGV[1] then
        ours = 0
    end
    local floor = legacy(KEYS[n + i])
    if floor > highest then
        highest = floor
    end
end
return {highest, trusted, ours, generation}"#;

/// `KEYS` as [`FENCE_READ`]; `ARGV[1]` = token, `ARGV[2]` = the new fencing
/// number, then the generations the write may trust the counter in; with
/// the generation marker. Where every lock key holds the token: raises the
/// counter to the number (never lowers it); keeps it trusted when it was,
/// makes it trusted when the node's generation is one of those named, and
/// stores it bare (untrusted) otherwise; deletes each legacy counter that
/// the counter now holds as much as; returns 1. Elsewhere changes nothing
/// and returns 0.
pub(crate) static FENCE_WRITE: LazyLock<Script> =
    LazyLock::new(|| generation::with_marker(&format!("{COUNTER}\n{FENCE_WRITE_BODY}")));

const FENCE_WRITE_BODY: &str = r#"local n = (#KEYS - 1) / 2
for i = 1, n do
    if redis.call("get", KEYS[i]) ~= ARGV[1] then
        return 0
    end
end
local permitted = false
for i = 3, #ARGV do
    if ARGV[i] == generation then
        permitted = true
    end
end
local value = raise(KEYS[#KEYS], ARGV[2], permitted)
for i = 1, n do
    local floor = redis.call("get", KEYS[n + i])
    if floor and legacy(KEYS[n + i]) <= value then
        redis.call("del", KEYS[n + i])
    end
end
return 1"#;

/// Lua helpers of the fencing scripts (`generation` is the prelude's
/// local). The counter holds `<number>:<generation>` (trusted when that is
/// the node's current generation) or a bare `<number>` (untrusted).
/// `counter(key)` returns the number (0 if missing) and 1 if it is trusted;
/// `legacy(key)` the number of an older version's per-resource counter (0
/// if missing); `raise(key, number, permitted)` stores the larger of the
/// stored number and `number` (a decimal string), tagged with the
/// generation when the counter was trusted or `permitted`, bare otherwise,
/// and returns the number stored. Numbers are compared as Lua numbers and
/// stored as the strings they came in.
const COUNTER: &str = r#"local function parse(stored)
    local sep = string.find(stored, ":", 1, true)
    if not sep then
        return tonumber(stored) or 0, stored, nil
    end
    local text = string.sub(stored, 1, sep - 1)
    return tonumber(text) or 0, text, string.sub(stored, sep + 1)
end
local function counter(key)
    local stored = redis.call("get", key)
    if not stored then
        return 0, 0
    end
    local number, _, tag = parse(stored)
    if tag == generation then
        return number, 1
    end
    return number, 0
end
local function legacy(key)
    local stored = redis.call("get", key)
    if not stored then
        return 0
    end
    local number = parse(stored)
    return number
end
local function raise(key, text, permitted)
    local number = tonumber(text)
    local stored = redis.call("get", key)
    local current, current_text, tag = 0, nil, nil
    if stored then
        current, current_text, tag = parse(stored)
    end
    local trusted = permitted or (stored ~= nil and tag == generation)
    if current_text and current >= number then
        number, text = current, current_text
    end
    if trusted then
        redis.call("set", key, text .. ":" .. generation)
    else
        redis.call("set", key, text)
    end
    return number
end"#;

// The scripts of a lock on several resources. Each takes every lock key of
// the set as `KEYS`, so one script call per node acts on the whole set
// atomically; on one key each does what its single-key counterpart above
// does, and locks on one resource keep using those.
//
// There is no limit on the number of keys in Redis itself (a command may
// have up to 2^31 − 1 arguments, and the scripts walk `KEYS` with a loop,
// never `unpack`): the limit is time. A node runs the script in one go, so
// the set must be written within the node timeout (see `request` and `PER_KEY`).

/// `KEYS` = the lock keys, `ARGV[1]` = token, `ARGV[2]` = ttl in
/// milliseconds. When no key is held by another value, sets every key to the
/// token with the ttl and returns 1. Otherwise sets nothing and returns the
/// value of the first key held by another value, so that the tally counts
/// holders as it does for `SET … GET`. The same key layout and the same
/// all-or-nothing rule as node-redlock's acquire script, so the two exclude
/// each other.
pub(crate) static ACQUIRE_MANY: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_MANY_BODY));

const ACQUIRE_MANY_BODY: &str = r#"for _, key in ipairs(KEYS) do
    local held = redis.call("get", key)
    if held and held ~= ARGV[1] then
        return held
    end
end
for _, key in ipairs(KEYS) do
    redis.call("set", key, ARGV[1], "PX", ARGV[2])
end
return 1"#;

/// [`ACQUIRE_MANY`] with the generation marker (restart guard on).
pub(crate) static ACQUIRE_MANY_MARKED: LazyLock<Script> =
    LazyLock::new(|| generation::with_marker(ACQUIRE_MANY_BODY));

/// `KEYS` = the lock keys, `ARGV[1]` = token, `ARGV[2]` = ttl in
/// milliseconds. When any key holds another value, or some keys of the set
/// hold the token and others are missing (part of the set was released or
/// taken apart), changes nothing and returns 0. Otherwise sets every key to
/// the token with the ttl: returns 1 when each held the token, 2 when every
/// key was missing (the node lost the lock) and all were set again (healed,
/// as [`EXTEND`] does for one key). So the keys of a node that answered 2
/// are exactly the keys this extension set, and a failed extension that
/// releases them deletes nothing that was ours before it.
pub(crate) static EXTEND_MANY: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_MANY_BODY));

/// [`EXTEND_MANY`] with the generation marker (restart guard on).
pub(crate) static EXTEND_MANY_MARKED: LazyLock<Script> =
    LazyLock::new(|| generation::with_marker(EXTEND_MANY_BODY));

const EXTEND_MANY_BODY: &str = r#"local present = 0
for _, key in ipairs(KEYS) do
    local held = redis.call("get", key)
    if held then
        if held ~= ARGV[1] then
            return 0
        end
        present = present + 1
    end
end
if present > 0 and present < #KEYS then
    return 0
end
for _, key in ipairs(KEYS) do
    redis.call("set", key, ARGV[1], "PX", ARGV[2])
end
if present == 0 then
    return 2
end
return 1"#;

/// `KEYS` = the lock keys, `ARGV[1]` = token, `ARGV[2]` = `quiet` or absent.
/// Deletes every key that holds the token, publishing each release as
/// [`UNLOCK`] does (the message and the clock read once for the whole
/// set). Returns 1 when it deleted any, 2 when it also named a successor
/// for any, 0 otherwise.
pub(crate) static UNLOCK_MANY: LazyLock<Script> =
    LazyLock::new(|| Script::new(&unlock_many("publish", "numsub", "")));

/// `KEYS` = the lock keys, `ARGV[1]` = token. Returns 1 where every key
/// holds the token, 0 elsewhere. Changes nothing.
pub(crate) static CHECK_MANY: LazyLock<Script> = LazyLock::new(|| Script::new(CHECK_MANY_BODY));

const CHECK_MANY_BODY: &str = r#"for _, key in ipairs(KEYS) do
    if redis.call("get", key) ~= ARGV[1] then
        return 0
    end
end
return 1"#;

/// [`CHECK_MANY`] with the generation marker (restart guard on).
pub(crate) static CHECK_MANY_MARKED: LazyLock<Script> =
    LazyLock::new(|| generation::with_marker(CHECK_MANY_BODY));

// The fencing scripts above take any number of lock keys: a lock on
// several resources uses them too (there are no `FENCE_*_MANY` scripts).
