//! What a server says of itself in `INFO`: its family and version (and so
//! which commands it has), its run id, and single fields. Pure parsing;
//! the engine asks ([`crate::engine::node`]).

/// Which native conditional delete a server has, from `INFO server`: see
/// [`Node::native_release`](crate::engine::node::Node::native_release).
pub(crate) fn native_release(info: &str) -> u8 {
    let version = |field| {
        info_field(info, field).map(|v| {
            let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
            (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
        })
    };
    if info_field(info, "server_name") == Some("valkey") {
        match version("valkey_version") {
            Some(v) if v >= (9, 0) => 1,
            _ => 0,
        }
    } else {
        match version("redis_version") {
            Some(v) if v >= (8, 4) => 2,
            _ => 0,
        }
    }
}

/// Whether `INFO server` names Redis before 7.0, which refuses `SET … NX
/// … GET` (Valkey began at 7.2).
pub(crate) fn before_7(info: &str) -> bool {
    info_field(info, "server_name") != Some("valkey")
        && info_field(info, "redis_version")
            .and_then(|v| v.split('.').next())
            .and_then(|major| major.parse::<u32>().ok())
            .is_some_and(|major| major < 7)
}

/// The `run_id` line of `INFO server`.
pub(crate) fn run_id(info: &str) -> Option<String> {
    info_field(info, "run_id").map(str::to_owned)
}

/// The identity of a cluster, from its `CLUSTER SLOTS` reply: the node id
/// of the master that serves slot 0, as `cluster:<id>`. Two entries of the
/// node list that name one cluster by different seeds get the same one
/// (unless a failover came between their connections); two clusters never
/// do. `None` where the reply does not say (an older server gives no ids).
pub(crate) fn cluster_identity(slots: &redis::Value) -> Option<String> {
    use redis::Value;
    let Value::Array(ranges) = slots else {
        return None;
    };
    ranges.iter().find_map(|range| {
        let Value::Array(range) = range else {
            return None;
        };
        match range.as_slice() {
            [Value::Int(0), _, Value::Array(master), ..] => match master.get(2) {
                Some(Value::BulkString(id)) if !id.is_empty() => {
                    Some(format!("cluster:{}", String::from_utf8_lossy(id)))
                }
                _ => None,
            },
            _ => None,
        }
    })
}

/// The error of a standalone entry of the node list that reaches a member
/// of a Redis Cluster (`cluster_enabled:1`): it would vote only for the
/// keys of its own slots (and answer `MOVED` for the others), so it is
/// refused at connection, whatever the key.
pub(crate) fn cluster_member() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "the server is a member of a Redis Cluster",
        "give the whole cluster as one node, redis+cluster://host:port,host:port (feature `cluster`)"
            .to_owned(),
    ))
}

/// The value of one `name:value` line of an `INFO` reply.
pub(crate) fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// The `INFO` sections the engine asks for, in one request where the
/// server takes several (Redis 7.0 and later, Valkey); Redis before 7.0
/// takes one section or none, and answers the default `INFO` (which has
/// the server, persistence and replication sections) instead.
pub(crate) fn sections_refused(error: &redis::RedisError) -> bool {
    error.code() == Some("ERR")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_before_redis_7_are_told_apart() {
        assert!(before_7("redis_version:6.2.5\r\n"));
        assert!(!before_7("redis_version:7.0.15\r\n"));
        assert!(!before_7("redis_version:8.4.0\r\n"));
        assert!(!before_7(
            "redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\n"
        ));
        assert!(!before_7(""), "unknown (INFO denied): found by the reply");
    }

    #[test]
    fn native_release_by_server_and_version() {
        let valkey = |v: &str| {
            format!("redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:{v}\r\n")
        };
        assert_eq!(native_release(&valkey("9.1.0")), 1);
        assert_eq!(native_release(&valkey("9.0.0")), 1);
        assert_eq!(native_release(&valkey("8.1.2")), 0);
        assert_eq!(native_release("redis_version:8.4.0\r\n"), 2);
        assert_eq!(native_release("redis_version:10.0.1\r\n"), 2);
        assert_eq!(native_release("redis_version:8.2.1\r\n"), 0);
        assert_eq!(native_release("redis_version:7.0.15\r\n"), 0);
        assert_eq!(native_release(""), 0);
    }

    #[test]
    fn run_id_is_read_from_info() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\ntcp_port:6379\r\n";
        assert_eq!(run_id(info).as_deref(), Some("abc123"));
        assert_eq!(run_id("# Server\r\n"), None);
        let info = "run_id:x\r\n# Persistence\r\naof_enabled:1\r\naof_rewrite:0\r\n";
        assert_eq!(info_field(info, "aof_enabled"), Some("1"));
        assert_eq!(info_field(info, "aof"), None);
    }

    #[test]
    fn a_cluster_is_named_by_its_slot_zero_master() {
        use redis::Value;
        let node = |id: &str| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(7000),
                Value::BulkString(id.as_bytes().to_vec()),
            ])
        };
        let slots = Value::Array(vec![
            Value::Array(vec![Value::Int(5461), Value::Int(16383), node("b")]),
            Value::Array(vec![Value::Int(0), Value::Int(5460), node("a"), node("r")]),
        ]);
        assert_eq!(cluster_identity(&slots).as_deref(), Some("cluster:a"));
        assert_eq!(cluster_identity(&Value::Array(vec![])), None);
        assert_eq!(cluster_identity(&Value::Nil), None);
    }
}
