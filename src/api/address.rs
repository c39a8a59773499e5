//! Node addresses: what the builder accepts, and an error for a bad one that
//! echoes the entry (its password redacted) and says what is wrong with it.

use redis::{ConnectionInfo, IntoConnectionInfo};

pub(crate) use crate::engine::node::Target;

/// Something that names one Redis node: a URL (`&str`, `String`) such as
/// `redis://:password@10.0.0.1:6379/0` or `unix:///run/redis.sock`, or a
/// [`redis::ConnectionInfo`] made by hand.
///
/// With the crate feature `cluster`, one node may be a whole Redis Cluster
/// or Valkey Cluster: `redis+cluster://[user:password@]host:port,host:port`
/// (`valkey+cluster://` is the same) lists some of its masters as seeds;
/// the node's vote for a key is the vote of the master that owns the key's
/// slot (see the crate docs, "Clusters as nodes").
///
/// Sealed: implemented for those types only, so that a bad URL can be echoed
/// in the error.
pub trait NodeAddress: sealed::Sealed {}

impl NodeAddress for &str {}
impl NodeAddress for String {}
impl NodeAddress for &String {}
impl NodeAddress for ConnectionInfo {}

pub(crate) mod sealed {
    use super::Target;

    /// The conversion behind [`NodeAddress`](super::NodeAddress).
    pub trait Sealed {
        /// What the entry names, or the entry (redacted) and what is wrong
        /// with it.
        #[allow(private_interfaces)]
        fn resolve(self) -> Result<Target, (String, String)>;
    }
}

#[allow(private_interfaces)]
impl sealed::Sealed for &str {
    fn resolve(self) -> Result<Target, (String, String)> {
        parse_target(self)
    }
}

#[allow(private_interfaces)]
impl sealed::Sealed for String {
    fn resolve(self) -> Result<Target, (String, String)> {
        parse_target(&self)
    }
}

#[allow(private_interfaces)]
impl sealed::Sealed for &String {
    fn resolve(self) -> Result<Target, (String, String)> {
        parse_target(self)
    }
}

#[allow(private_interfaces)]
impl sealed::Sealed for ConnectionInfo {
    fn resolve(self) -> Result<Target, (String, String)> {
        Ok(Target::Single(self))
    }
}

/// Splits a list of node URLs written as one string (`REDLOCK_NODES`, a
/// command-line option) into its entries: at commas and semicolons, blanks
/// dropped. A piece without a scheme (`host:port`) continues the entry
/// before it, so that a cluster's seeds stay one entry:
///
/// ```
/// use redlock_quorum::split_node_list;
/// assert_eq!(
///     split_node_list("redis+cluster://a:7000,b:7001, redis://c:6379/"),
///     ["redis+cluster://a:7000,b:7001", "redis://c:6379/"]
/// );
/// assert_eq!(split_node_list("redis://a/;redis://b/"), ["redis://a/", "redis://b/"]);
/// ```
pub fn split_node_list(list: &str) -> Vec<String> {
    let mut entries: Vec<String> = Vec::new();
    for entry in list.split(';') {
        let mut in_entry = false;
        for piece in entry.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match entries.last_mut() {
                Some(last) if in_entry && !piece.contains("://") => {
                    last.push(',');
                    last.push_str(piece);
                }
                _ => {
                    entries.push(piece.to_owned());
                    in_entry = true;
                }
            }
        }
    }
    entries
}

/// Parses a node URL, a cluster's included, or says what is wrong with it.
fn parse_target(url: &str) -> Result<Target, (String, String)> {
    let trimmed = url.trim();
    if trimmed.matches("://").count() > 1 {
        return Err((
            redact(url),
            "several URLs in one entry: give each node as an entry of its own \
             (split a list with redlock_quorum::split_node_list)"
                .into(),
        ));
    }
    let Some((scheme, rest)) = trimmed.split_once("://") else {
        return parse(url).map(Target::Single);
    };
    match scheme {
        "redis+cluster" | "valkey+cluster" => parse_cluster(url, rest),
        "rediss+cluster" | "valkeys+cluster" => Err((
            redact(url),
            "TLS to a cluster node is not supported yet: use redis+cluster:// (crate feature `cluster`)".into(),
        )),
        _ => parse(url).map(Target::Single),
    }
}

/// Parses the part after `redis+cluster://`: optional credentials, then
/// comma-separated `host:port` seeds, then nothing but an optional `/` or
/// `/0` (a cluster has database 0 only).
#[cfg(feature = "cluster")]
fn parse_cluster(url: &str, rest: &str) -> Result<Target, (String, String)> {
    let fail = |reason: String| Err((redact(url), reason));
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    if !matches!(tail, "" | "/" | "/0") {
        return fail(format!(
            "`{tail}` after the seeds: a cluster has database 0 only and takes no options"
        ));
    }
    let (credentials, hosts) = match authority.rsplit_once('@') {
        Some((c, h)) => (Some(c), h),
        None => (None, authority),
    };
    if hosts.trim().is_empty() {
        return fail("no seeds: list some of the cluster's masters, host:port,host:port".into());
    }
    let mut seeds = Vec::new();
    for host in hosts.split(',') {
        let host = host.trim();
        if host.is_empty() {
            return fail("an empty seed between commas".into());
        }
        let single = match credentials {
            Some(c) => format!("redis://{c}@{host}/"),
            None => format!("redis://{host}/"),
        };
        match parse(&single) {
            Ok(info) => seeds.push(info),
            Err((_, reason)) => return fail(format!("seed `{host}`: {reason}")),
        }
    }
    Ok(Target::Cluster(seeds))
}

#[cfg(not(feature = "cluster"))]
fn parse_cluster(url: &str, _rest: &str) -> Result<Target, (String, String)> {
    Err((
        redact(url),
        "a cluster node (redis+cluster://) needs the crate feature `cluster` of redlock-quorum"
            .into(),
    ))
}

/// Parses a node URL, or says what is wrong with it.
fn parse(url: &str) -> Result<ConnectionInfo, (String, String)> {
    let fail = |reason: String| Err((redact(url), reason));
    let trimmed = url.trim();
    if trimmed.is_empty() {
        return fail("the address is empty".into());
    }
    let Some((scheme, rest)) = trimmed.split_once("://") else {
        return fail("no scheme: write it as redis://host:port/ (or unix:///path)".into());
    };
    match scheme {
        "redis" | "unix" | "redis+unix" => {}
        "rediss" if cfg!(feature = "tls") => {}
        "rediss" => {
            return fail("TLS (rediss://) needs the crate feature `tls` of redlock-quorum".into());
        }
        other => {
            return fail(format!(
                "unknown scheme `{other}`: expected redis://, unix:// or redis+cluster://"
            ));
        }
    }
    if scheme == "redis" || scheme == "rediss" {
        let authority = rest.split(['/', '?']).next().unwrap_or("");
        let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let (host, port) = match host_port.rsplit_once(':') {
            // `[::1]` without a port
            Some((h, p)) if !p.ends_with(']') => (h, Some(p)),
            _ => (host_port, None),
        };
        if host.is_empty() {
            return fail("no host".into());
        }
        if let Some(port) = port
            && !port.parse::<u16>().is_ok_and(|p| p > 0)
        {
            return fail(format!("the port `{port}` is not a number from 1 to 65535"));
        }
        let path = rest[authority.len()..].split('?').next().unwrap_or("");
        let db = path.trim_start_matches('/');
        if !db.is_empty() && db.parse::<i64>().is_err() {
            return fail(format!("the database `{db}` is not a number"));
        }
    }
    trimmed
        .into_connection_info()
        .or_else(|e| fail(format!("redis-rs could not read it ({e})")))
}

/// The entry with its password (and user name) replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://***@{host}{tail}"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(url: &str) -> String {
        let (entry, reason) = parse(url).expect_err(url);
        assert!(!entry.contains("hunter2"), "{entry}");
        reason
    }

    #[test]
    fn good_addresses_parse() {
        for url in [
            "redis://127.0.0.1:7001/",
            "redis://127.0.0.1:7001",
            "redis://:hunter2@10.0.0.1:6379/3",
            "redis://user:hunter2@localhost/",
            "redis://[::1]:6379/",
            "unix:///run/redis.sock",
        ] {
            assert!(parse(url).is_ok(), "{url}");
        }
    }

    #[test]
    fn each_mistake_is_named() {
        assert!(reason("").contains("empty"));
        assert!(reason("127.0.0.1:7001").contains("no scheme"));
        assert!(reason("http://127.0.0.1:7001/").contains("unknown scheme `http`"));
        if !cfg!(feature = "tls") {
            assert!(reason("rediss://:hunter2@cache:6380/").contains("feature `tls`"));
        }
        assert!(reason("redis://127.0.0.1:70001/").contains("port `70001`"));
        assert!(reason("redis://:hunter2@127.0.0.1:abc/").contains("port `abc`"));
        assert!(reason("redis://127.0.0.1:7001/zero").contains("database `zero`"));
        assert!(reason("redis://:hunter2@/").contains("no host"));
    }

    #[test]
    fn cluster_urls_parse_or_say_why_not() {
        let url = "redis+cluster://user:hunter2@10.0.0.1:7000,10.0.0.2:7001/";
        let reason = |url: &str| parse_target(url).expect_err(url).1;
        if cfg!(feature = "cluster") {
            assert!(parse_target(url).is_ok(), "{url}");
            assert!(parse_target("valkey+cluster://h:7000").is_ok());
            assert!(reason("redis+cluster://h:7000,,h:7001").contains("empty seed"));
            assert!(reason("redis+cluster://h:7000,h:99999").contains("seed `h:99999`"));
            assert!(reason("redis+cluster://h:7000/3").contains("database 0 only"));
        } else {
            assert!(reason(url).contains("feature `cluster`"));
        }
        assert!(reason("rediss+cluster://h:7000").contains("not supported yet"));
        assert!(reason("redis://a:1/,redis://b:2/").contains("split_node_list"));
        if cfg!(feature = "cluster") {
            assert!(reason("redis+cluster://").contains("no seeds"));
        }
        let (entry, _) = parse_target("rediss+cluster://u:hunter2@h:7000").unwrap_err();
        assert!(!entry.contains("hunter2"), "{entry}");
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("redis://user:hunter2@10.0.0.1:6379/0"),
            "redis://***@10.0.0.1:6379/0"
        );
        assert_eq!(redact("redis://10.0.0.1/"), "redis://10.0.0.1/");
        assert_eq!(redact("no scheme"), "no scheme");
    }
}
