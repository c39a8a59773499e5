//! The nodes a test runs against, helpers to look at and plant state on
//! them (raw key checks on every node, ACL users), and unique resource
//! names.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::Commands;
use redlock_quorum::{Redlock, RedlockBuilder};

use crate::raw;
use crate::server::RedisServer;

/// The nodes a test runs against.
///
/// When `REDLOCK_NODES` names an existing cluster (comma-separated URLs),
/// [`Cluster::shared`] uses it; otherwise, and always for
/// [`Cluster::start`], the harness starts its own `redis-server` processes,
/// which it alone may pause, kill and restart.
#[derive(Debug)]
pub struct Cluster {
    urls: Vec<String>,
    owned: Vec<RedisServer>,
}

impl Cluster {
    /// Starts `n` fresh nodes that this test owns.
    pub fn start(n: usize) -> Self {
        let owned: Vec<RedisServer> = (0..n).map(|_| RedisServer::start()).collect();
        Cluster {
            urls: owned.iter().map(RedisServer::url).collect(),
            owned,
        }
    }

    /// Starts `n` fresh nodes with extra `redis-server` arguments (later
    /// arguments override the harness's defaults, e.g. `--appendonly yes`).
    pub fn start_with(n: usize, extra: &[&str]) -> Self {
        let owned: Vec<RedisServer> = (0..n).map(|_| RedisServer::start_with(extra)).collect();
        Cluster {
            urls: owned.iter().map(RedisServer::url).collect(),
            owned,
        }
    }

    /// The cluster named by `REDLOCK_NODES` if set, else `n` fresh nodes.
    /// For tests that inject no faults.
    pub fn shared(n: usize) -> Self {
        match external_nodes() {
            Some(urls) => Cluster {
                urls,
                owned: Vec::new(),
            },
            None => Self::start(n),
        }
    }

    /// The nodes' URLs.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// How many nodes.
    pub fn len(&self) -> usize {
        self.urls.len()
    }

    /// Whether there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }

    /// Node `i`, to pause, kill or restart. Panics on an external cluster.
    pub fn node(&mut self, i: usize) -> &mut RedisServer {
        assert!(
            !self.owned.is_empty(),
            "fault injection needs nodes the harness started itself"
        );
        &mut self.owned[i]
    }

    /// A builder over all nodes with settings for tests: short retry delays so
    /// contention resolves fast, and a node timeout of 500 ms instead of 50:
    /// on a loaded 2-core machine a fresh client's first requests (connecting
    /// included) took longer than 50 ms and failed with `NoQuorum` tests that
    /// are not about timeouts. Tests about timeouts set their own.
    pub fn builder(&self) -> RedlockBuilder {
        Redlock::builder(self.urls.iter().map(String::as_str))
            .retry_delay(Duration::from_millis(5))
            .retry_jitter(Duration::from_millis(10))
            .node_timeout(Duration::from_millis(500))
    }

    /// A manager with the test settings.
    pub fn redlock(&self) -> Redlock {
        self.builder().build().expect("valid test config")
    }

    /// A plain synchronous connection to node `i`.
    pub fn conn(&self, i: usize) -> redis::Connection {
        raw::conn(&self.urls[i])
    }

    /// How many times node `i` ran `command` since it started or the last
    /// [`reset_stats`](Cluster::reset_stats) ([`raw::calls`](crate::raw::calls)).
    pub fn calls(&self, i: usize, command: &str) -> u64 {
        raw::calls(&self.urls[i], command)
    }

    /// Resets every node's command statistics (`CONFIG RESETSTAT`).
    pub fn reset_stats(&self) {
        self.urls.iter().for_each(|url| raw::reset_stats(url));
    }

    /// How many clients subscribe the release channel of `lock_key` on
    /// node `i` (`PUBSUB NUMSUB`).
    pub fn subscribers(&self, i: usize, lock_key: &str) -> i64 {
        let (_, n): (Vec<u8>, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(crate::keys::release_channel(lock_key))
            .query(&mut self.conn(i))
            .expect("PUBSUB NUMSUB");
        n
    }

    /// Whether node `i` holds the waiting flag of `lock_key` (a waiting
    /// manager's mark for the release's gate).
    pub fn flagged(&self, i: usize, lock_key: &str) -> bool {
        redis::cmd("EXISTS")
            .arg(crate::keys::waiting(lock_key))
            .query::<i64>(&mut self.conn(i))
            .expect("EXISTS")
            == 1
    }

    /// Whether the nodes' server knows the command `name` (asked of node 0
    /// with `COMMAND INFO`): for tests whose path depends on the server
    /// family and version.
    pub fn has_command(&self, name: &str) -> bool {
        let info: redis::Value = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(name)
            .query(&mut self.conn(0))
            .expect("COMMAND INFO");
        matches!(&info, redis::Value::Array(v) if v.iter().any(|e| !matches!(e, redis::Value::Nil)))
    }

    /// The value of `key` on every node (`None` where absent or unreachable).
    pub fn values(&self, key: &str) -> Vec<Option<String>> {
        (0..self.len()).map(|i| self.value_on(i, key)).collect()
    }

    /// The value of `key` on node `i` (`None` where absent or unreachable;
    /// a paused node costs half a second).
    pub fn value_on(&self, i: usize, key: &str) -> Option<String> {
        let client = redis::Client::open(self.urls[i].as_str()).ok()?;
        let mut con = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        con.set_read_timeout(Some(Duration::from_millis(500)))
            .ok()?;
        con.get::<_, Option<String>>(key).ok().flatten()
    }

    /// How many nodes hold `key` with `value`.
    pub fn count(&self, key: &str, value: &str) -> usize {
        self.values(key)
            .iter()
            .filter(|v| v.as_deref() == Some(value))
            .count()
    }

    /// Sets `key` to `value` with a ttl on the given nodes, with raw commands.
    pub fn plant(&self, nodes: &[usize], key: &str, value: &str, ttl: Duration) {
        for &i in nodes {
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg(value)
                .arg("PX")
                .arg(ttl.as_millis() as u64)
                .query(&mut self.conn(i))
                .expect("plant");
        }
    }

    /// Whether `key` exists on node `i`.
    pub fn exists_on(&self, i: usize, key: impl AsRef<[u8]>) -> bool {
        raw::exists(&self.urls[i], key)
    }

    /// Whether no node has `key`.
    pub fn nowhere(&self, key: impl AsRef<[u8]>) -> bool {
        (0..self.len()).all(|i| !self.exists_on(i, key.as_ref()))
    }

    /// `PTTL key` on node `i`: milliseconds left, -1 without expiry, -2
    /// when the key does not exist.
    pub fn pttl_on(&self, i: usize, key: impl AsRef<[u8]>) -> i64 {
        raw::pttl(&self.urls[i], key)
    }

    /// `PTTL key` on every node.
    pub fn pttls(&self, key: impl AsRef<[u8]>) -> Vec<i64> {
        (0..self.len())
            .map(|i| self.pttl_on(i, key.as_ref()))
            .collect()
    }

    /// `GET key` on node `i`, for keys that are not lock keys (a counter, a
    /// marker); unlike [`Cluster::value_on`] it panics when the node does
    /// not answer.
    pub fn get_on(&self, i: usize, key: impl AsRef<[u8]>) -> Option<String> {
        raw::get(&self.urls[i], key)
    }

    /// `HLEN key` on node `i`.
    pub fn hlen_on(&self, i: usize, key: impl AsRef<[u8]>) -> usize {
        raw::hlen(&self.urls[i], key)
    }

    /// Every key on node `i`.
    pub fn keys_on(&self, i: usize) -> Vec<Vec<u8>> {
        raw::keys(&self.urls[i])
    }

    /// The names of `names` whose key is on some node (one `KEYS *` per
    /// node; every node must be up).
    pub fn left_of(&self, names: &[String]) -> Vec<String> {
        let on_nodes: Vec<std::collections::HashSet<Vec<u8>>> = (0..self.len())
            .map(|i| self.keys_on(i).into_iter().collect())
            .collect();
        names
            .iter()
            .filter(|name| on_nodes.iter().any(|keys| keys.contains(name.as_bytes())))
            .cloned()
            .collect()
    }

    /// Every key on every node, node by node.
    pub fn all_keys(&self) -> Vec<Vec<Vec<u8>>> {
        (0..self.len()).map(|i| self.keys_on(i)).collect()
    }

    /// Creates (or replaces) the ACL user `user` with `rule` on every node
    /// and returns the nodes' URLs as that user, with the password that
    /// `rule` sets (its `>password` entry).
    ///
    /// # Panics
    /// When `rule` sets no password, or a node refuses the rule.
    pub fn acl_user(&self, user: &str, rule: &[&str]) -> Vec<String> {
        let password = rule
            .iter()
            .find_map(|r| r.strip_prefix('>'))
            .expect("the rule sets a password (`>password`)");
        for i in 0..self.len() {
            let _: () = redis::cmd("ACL")
                .arg("SETUSER")
                .arg(user)
                .arg(rule)
                .query(&mut self.conn(i))
                .expect("ACL SETUSER");
        }
        self.urls
            .iter()
            .map(|u| u.replacen("redis://", &format!("redis://{user}:{password}@"), 1))
            .collect()
    }

    /// Polls `check` until it holds or `within` has passed.
    pub fn eventually(&self, within: Duration, mut check: impl FnMut(&Self) -> bool) -> bool {
        let deadline = std::time::Instant::now() + within;
        loop {
            if check(self) {
                return true;
            }
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The URLs in `REDLOCK_NODES`, if it is set and not empty.
pub fn external_nodes() -> Option<Vec<String>> {
    let raw = std::env::var("REDLOCK_NODES").ok()?;
    let urls = redlock_quorum::split_node_list(&raw);
    (!urls.is_empty()).then_some(urls)
}

/// Takes and releases a throwaway lock so that every node's connection is
/// made: later requests are then written to the sockets at once. Tries
/// again (for up to a minute) when a node is too slow for the manager's
/// timeouts, as on a loaded machine.
///
/// # Panics
/// When no try succeeded within a minute.
pub async fn warm(redlock: &Redlock) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let outcome = match redlock
            .try_lock(&resource("warm"), Duration::from_secs(5))
            .await
        {
            Ok(lock) => redlock.unlock(&lock).await.map(|_| ()),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(()) => return,
            Err(e) if std::time::Instant::now() > deadline => panic!("warm-up: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// A manager over the given URLs with the test settings of
/// [`Cluster::builder`] but a node timeout of a second, long enough that a
/// loaded machine does not time out.
pub fn manager(urls: &[String]) -> Redlock {
    Redlock::builder(urls.iter().map(String::as_str))
        .retry_delay(Duration::from_millis(5))
        .retry_jitter(Duration::from_millis(10))
        .node_timeout(Duration::from_secs(1))
        .build()
        .expect("valid config")
}

/// Locks and unlocks throwaway resources until every node released: the
/// manager's connections to all nodes work (again), as after a node was
/// restarted.
///
/// # Panics
/// When that did not happen within 20 s.
pub async fn reach_every_node(redlock: &Redlock) {
    // Generous: reconnection backs off up to 1 s per node, and a loaded
    // machine stretches it; this waits for liveness, it does not time it.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(lock) = redlock
            .try_lock(&resource("reach"), Duration::from_secs(10))
            .await
            && redlock.unlock(&lock).await.ok() == Some(redlock.node_count())
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never reached every node again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

static NEXT_RESOURCE: AtomicU64 = AtomicU64::new(0);

/// A resource name no other test (or earlier run on a shared cluster) uses.
pub fn resource(topic: &str) -> String {
    let n = NEXT_RESOURCE.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("test:{topic}:{}:{nanos}:{n}", std::process::id())
}

/// Waits until `redlock` owes no release (its retry workers drained), for
/// at most `within`; whether it drained.
pub async fn releases_drained(redlock: &Redlock, within: Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    while redlock.pending_releases() > 0 {
        if std::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}
