//! The scripts of a release on a cluster node (feature `cluster`): the
//! waiting protocol's names in the lock keys' slot, and sharded pub/sub.

use std::sync::LazyLock;

use super::{Script, handoff_check, unlock_many};

/// The release on a cluster node (feature `cluster`): [`UNLOCK_MANY`](super::UNLOCK_MANY) over
/// lock keys of one hash slot, whose names of the waiting protocol are in
/// that slot too. `KEYS` = the lock keys, `ARGV[1]` = token, `ARGV[2]` =
/// `quiet` or `loud`, `ARGV[3]` = the slot's tag, `{<tag>}`, that puts a
/// name in the slot ([`shard::in_slot`](crate::protocol::request::shard::in_slot)):
/// the release channel, waiting hash and hand-off marker of key `K` are
/// the standalone names with the tag before them. The release is published
/// with `SPUBLISH` (sharded pub/sub: only on the shard that owns the slot),
/// behind the gate `PUBSUB SHARDNUMSUB` (the shard's subscribers are on
/// its master, where this runs). Same replies as [`UNLOCK_MANY`](super::UNLOCK_MANY).
///
/// The waiting hash and the marker are not in `KEYS`: they rarely exist,
/// and a command that declares several keys of a slot half-way through a
/// migration, some of them missing, is answered `TRYAGAIN` until the
/// migration ends, so every release there would fail. A script may touch
/// keys of its own slot that it did not declare (both Redis and Valkey
/// allow it for scripts without flags); each such access is a `pcall`, and
/// where it fails (the slot moving) the release is published for every
/// manager.
pub(crate) static UNLOCK_SHARD: LazyLock<Script> =
    LazyLock::new(|| Script::new(&unlock_many("spublish", "shardnumsub", "ARGV[3] .. ")));

/// [`HANDOFF_CHECK`](super::HANDOFF_CHECK) on a cluster node, over lock keys of one slot:
/// `ARGV[2]` = the slot's tag (see [`UNLOCK_SHARD`]), and the release is
/// published again with `SPUBLISH`.
pub(crate) static HANDOFF_CHECK_SHARD: LazyLock<Script> =
    LazyLock::new(|| Script::new(&handoff_check("spublish", "ARGV[2] .. ")));

/// `KEYS[1]` = key, `ARGV[1]` = token, `ARGV[2]` = ttl in milliseconds:
/// `SET key token NX PX ttl GET` then `PTTL key`, as the waiting
/// acquisition's pipeline, answering the pipeline's two replies (a `nil`
/// `SET` reply is Lua's `false`, sent back as `nil`; a `PTTL` the ACL
/// denies is an error in the reply, as the pipeline's). Sent with `EVAL` to a
/// cluster node, where the pipeline cannot follow `ASK`.
pub(crate) const SET_PTTL: &str = r#"local set = redis.call("set", KEYS[1], ARGV[1], "NX", "PX", ARGV[2], "GET")
return {set, redis.pcall("pttl", KEYS[1])}"#;
