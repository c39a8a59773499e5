//! A waiting manager's requests about its registrations, sent by its link
//! on each node (see [`crate::engine::wait`]): the registration in a key's
//! waiting hash, its removal, the key's waiting flag, and a release passed
//! on to every manager.

use std::time::Duration;

use redis::Cmd;

use crate::protocol::keys;
use crate::protocol::scripts;

/// The registration of this manager (`id`) in the waiting hash of
/// `channel`'s key, for `lease` ([`scripts::REGISTER`]).
pub(crate) fn register(channel: &[u8], id: &str, lease: Duration) -> redis::Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(scripts::REGISTER)
        .arg(1)
        .arg(keys::waiters_key(keys::channel_lock_key(channel)))
        .arg(id)
        .arg(lease.as_millis() as u64);
    cmd
}

/// The waiting flag of `channel`'s key ([`keys::waiting_key`]), set for
/// `lease`: the release publishes only where it finds one.
pub(crate) fn flag(channel: &[u8], lease: Duration) -> Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(keys::waiting_key(keys::channel_lock_key(channel)))
        .arg(1)
        .arg("PX")
        .arg(lease.as_millis() as u64);
    cmd
}

/// The renewal of the waiting flag of `channel`'s key: [`flag`] with
/// `GET`, whose `nil` reply tells that the flag was gone.
pub(crate) fn renew_flag(channel: &[u8], lease: Duration) -> Cmd {
    let mut cmd = flag(channel, lease);
    cmd.arg("GET");
    cmd
}

/// The removal of manager `id` from the waiting hash of `channel`'s key.
pub(crate) fn unregister(channel: &[u8], id: &str) -> Cmd {
    let mut cmd = redis::cmd("HDEL");
    cmd.arg(keys::waiters_key(keys::channel_lock_key(channel)))
        .arg(id);
    cmd
}

/// A release message published again on the key's release `channel`, for
/// every manager (with `SPUBLISH` on a cluster node: `sharded`).
pub(crate) fn publish(channel: &[u8], message: &[u8], sharded: bool) -> Cmd {
    let mut cmd = redis::cmd(if sharded { "SPUBLISH" } else { "PUBLISH" });
    cmd.arg(channel).arg(message);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_name_the_waiting_hash() {
        let channel = keys::release_channel("k");
        let cmd = register(&channel, "id", Duration::from_secs(6));
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(args[2], b"1");
        assert_eq!(args[3], keys::waiters_key(b"k"));
        assert_eq!(args[5], b"6000");
        let args = unregister(&channel, "id").args_iter().count();
        assert_eq!(args, 3);
        let flag = flag(&channel, Duration::from_secs(6));
        let args: Vec<Vec<u8>> = flag
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(args[1], keys::waiting_key(b"k"));
        assert_eq!(args[4], b"6000");
    }
}
