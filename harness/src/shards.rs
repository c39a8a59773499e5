//! Real Redis Clusters on loopback, for Redlock over clusters: each Redlock
//! node is a whole cluster ([`RedisCluster`]), and a test runs against
//! several ([`RedisClusters`]).
//!
//! Every cluster node is a [`RedisServer`] started with `--cluster-enabled
//! yes` and a config file of its own in its temporary directory. The
//! harness forms the cluster itself with plain commands (`CLUSTER MEET`,
//! `CLUSTER ADDSLOTS`, `CLUSTER REPLICATE`), not with `redis-cli --cluster`:
//! redis-cli may be missing, or be another version than `REDIS_SERVER`.
//! `ADDSLOTS` rather than `ADDSLOTSRANGE`, and `MEET` with a bus port only
//! on 7.0 and later, so that the same code forms Redis 6.2, 7.x and Valkey
//! clusters.
//!
//! Choices a test should know:
//! - Masters are numbered `0..masters` by the slot range they were given;
//!   the number stays with that shard. After [`RedisCluster::failover`],
//!   master `i` is the promoted process ([`RedisCluster::master_port`]
//!   changes), and [`RedisCluster::master_of`] still says `i` for its keys.
//! - Replicas never fail over by themselves (`cluster-replica-no-failover
//!   yes`): a test decides when a failover happens, with
//!   [`RedisCluster::failover`]. Pass `--cluster-replica-no-failover no` to
//!   [`RedisCluster::start_with`] for automatic failovers.
//! - `cluster-require-full-coverage` keeps its default (`yes`): while a
//!   master is down or paused and not replaced, the whole cluster answers
//!   `CLUSTERDOWN`, as a default production cluster does.
//! - The node timeout is one second, so that faults are seen quickly.
//! - Every wait for the cluster to settle is bounded (30 s, generous for a
//!   loaded 2-core machine) and panics with what it last saw.

use std::cell::Cell;
use std::ops::{Index, IndexMut};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::{ErrorKind, FromRedisValue, ServerErrorKind};

use crate::server::{RedisServer, free_port, redis_server_binary};

/// How many hash slots a Redis Cluster has.
pub const SLOTS: u16 = 16384;

/// How long a wait for the cluster to settle may take before it panics.
/// It bounds liveness; it does not time anything.
const SETTLE: Duration = Duration::from_secs(30);

/// `cluster-node-timeout` of every node, in milliseconds.
const NODE_TIMEOUT_MS: &str = "1000";

/// How many keys one `MIGRATE` moves.
const MIGRATE_BATCH: usize = 100;

static NEXT_CONFIG: AtomicU64 = AtomicU64::new(0);

/// One Redis Cluster of real server processes on loopback: `masters`
/// masters, each with `replicas` replicas. Its processes are killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    /// Masters first (shard order), then the replicas of master 0, of 1, ...
    nodes: Vec<Node>,
    /// The node that is master of each shard, as the harness made it.
    masters: Vec<usize>,
}

#[derive(Debug)]
struct Node {
    server: RedisServer,
    /// `CLUSTER MYID`.
    id: String,
    /// Its cluster bus port.
    bus: u16,
    /// The shard (master number) the node serves or replicates.
    shard: usize,
    paused: bool,
}

impl Node {
    fn port(&self) -> u16 {
        self.server.port()
    }

    /// Running and not paused: it answers.
    fn live(&self) -> bool {
        self.server.is_running() && !self.paused
    }

    /// Starts one cluster-enabled server for `shard`.
    fn spawn(shard: usize, extra: &[&str]) -> Node {
        // Redis 7.0 takes the bus port as an option; before, it is always
        // the port + 10000 (a server whose bus port is taken, or above
        // 65535, exits, and `start_with_ports` tries another port).
        let own_bus = server_major() >= 7;
        let bus = Cell::new(0u16);
        let server = RedisServer::start_with_ports(|| {
            // A config file per try, in the server's own directory (`--dir`
            // comes before these): a failed try leaves none to the next.
            let n = NEXT_CONFIG.fetch_add(1, Ordering::Relaxed);
            let mut args: Vec<String> = vec![
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-config-file".into(),
                format!("nodes-{n}.conf"),
                "--cluster-node-timeout".into(),
                NODE_TIMEOUT_MS.into(),
                "--cluster-replica-no-failover".into(),
                "yes".into(),
            ];
            if own_bus {
                bus.set(free_port());
                args.extend(["--cluster-port".into(), bus.get().to_string()]);
            }
            args.extend(extra.iter().map(|s| s.to_string()));
            args
        });
        // `start_with_ports` returns the server of its last try, whose
        // arguments were made last.
        let bus = if own_bus {
            bus.get()
        } else {
            server.port() + 10000
        };
        let id = must::<String>(server.port(), redis::cmd("CLUSTER").arg("MYID"));
        Node {
            server,
            id,
            bus,
            shard,
            paused: false,
        }
    }
}

impl RedisCluster {
    /// Starts and forms a cluster of `masters` masters with `replicas`
    /// replicas each, the slots spread over the masters in contiguous
    /// ranges, and waits until every node reports `cluster_state:ok`, all
    /// agree on the slot owners and every replica's link to its master is
    /// up.
    ///
    /// # Panics
    /// When `masters` is 0, a server does not start, or the cluster does not
    /// settle within 30 s.
    pub fn start(masters: usize, replicas: usize) -> Self {
        Self::start_with(masters, replicas, &[])
    }

    /// As [`RedisCluster::start`], with extra `redis-server` arguments on
    /// every node (they come last, so they override the harness's: e.g.
    /// `--cluster-require-full-coverage no`).
    pub fn start_with(masters: usize, replicas: usize, extra: &[&str]) -> Self {
        let mut cluster = Self::spawn(masters, replicas, extra);
        cluster.form();
        cluster
    }

    /// Starts the processes, in parallel, without forming the cluster.
    fn spawn(masters: usize, replicas: usize, extra: &[&str]) -> Self {
        assert!(masters > 0, "a cluster needs at least one master");
        let shards: Vec<usize> = (0..masters)
            .chain((0..masters).flat_map(|m| std::iter::repeat_n(m, replicas)))
            .collect();
        let nodes = std::thread::scope(|s| {
            let handles: Vec<_> = shards
                .iter()
                .map(|&shard| s.spawn(move || Node::spawn(shard, extra)))
                .collect();
            handles.into_iter().map(join).collect()
        });
        RedisCluster {
            nodes,
            masters: (0..masters).collect(),
        }
    }

    /// Joins the nodes into one cluster and waits until it settles.
    fn form(&mut self) {
        // Distinct config epochs before the nodes meet, as `redis-cli
        // --cluster create` does: no epoch collision to resolve later.
        // (A node that already has an epoch, seen on a loaded machine,
        // keeps it: the epochs only spare the cluster a collision to
        // resolve.)
        for (i, node) in self.nodes.iter().enumerate() {
            if let Err(e) = query::<()>(
                node.port(),
                redis::cmd("CLUSTER").arg("SET-CONFIG-EPOCH").arg(i + 1),
            ) && !e.contains("already non-zero")
            {
                panic!("{e}");
            }
        }
        let first = &self.nodes[0];
        for node in &self.nodes[1..] {
            must::<()>(node.port(), &meet(first.port(), first.bus));
        }
        let count = self.masters.len();
        for (shard, &m) in self.masters.iter().enumerate() {
            let (start, end) = shard_range(shard, count);
            must::<()>(
                self.nodes[m].port(),
                redis::cmd("CLUSTER")
                    .arg("ADDSLOTS")
                    .arg((start..=end).collect::<Vec<_>>()),
            );
        }
        for node in &self.nodes[count..] {
            let master = &self.nodes[self.masters[node.shard]];
            // It may not know the master yet: gossip brings it.
            settle(
                &format!("node {} to replicate {}", node.port(), master.port()),
                || {
                    query::<()>(
                        node.port(),
                        redis::cmd("CLUSTER").arg("REPLICATE").arg(&master.id),
                    )
                },
            );
        }
        settle(
            &format!("the cluster of ports {:?} to form", self.ports()),
            || self.formed(),
        );
    }

    /// `Ok` once every node reports `cluster_state:ok`, knows every other
    /// node (none in handshake or failed), sees the slot ranges owned as the
    /// harness assigned them and each replica under its master; and every
    /// replica's link is up.
    fn formed(&self) -> Result<(), String> {
        let count = self.masters.len();
        let expected: Vec<(u16, u16, &str)> = (0..count)
            .map(|s| {
                let (a, b) = shard_range(s, count);
                (a, b, self.nodes[self.masters[s]].id.as_str())
            })
            .collect();
        for node in &self.nodes {
            let info: String = query(node.port(), redis::cmd("CLUSTER").arg("INFO"))?;
            check_state_ok(node.port(), &info)?;
            let known = field(&info, "cluster_known_nodes").unwrap_or("?");
            if known != self.nodes.len().to_string() {
                return Err(format!("node {} knows {known} nodes", node.port()));
            }
            let lines = view(node.port())?;
            let owners = owners(&lines);
            let seen: Vec<(u16, u16, &str)> = owners
                .iter()
                .map(|(a, b, id)| (*a, *b, id.as_str()))
                .collect();
            if seen != expected {
                return Err(format!("node {} sees slot owners {seen:?}", node.port()));
            }
            for line in &lines {
                if let Some(bad) = line
                    .flags
                    .iter()
                    .find(|f| matches!(f.as_str(), "handshake" | "fail" | "fail?" | "noaddr"))
                {
                    return Err(format!("node {} flags {} as {bad}", node.port(), line.id));
                }
            }
            for replica in &self.nodes[count..] {
                let master = &self.nodes[self.masters[replica.shard]].id;
                let line = lines.iter().find(|l| l.id == replica.id);
                if line.and_then(|l| l.master.as_ref()) != Some(master) {
                    return Err(format!(
                        "node {} does not see {} as a replica of {master}",
                        node.port(),
                        replica.id
                    ));
                }
            }
        }
        for replica in &self.nodes[count..] {
            let info: String = query(replica.port(), redis::cmd("INFO").arg("replication"))?;
            if field(&info, "master_link_status") != Some("up") {
                return Err(format!("replica {}: master link is not up", replica.port()));
            }
        }
        Ok(())
    }

    /// The hash slot of `key`: CRC16 (XMODEM) of the key, or of its hash tag
    /// (the bytes between the first `{` and the first `}` after it, unless
    /// there are none), modulo 16384, as Redis computes it.
    pub fn slot(key: &[u8]) -> u16 {
        let hashed = match key.iter().position(|&b| b == b'{') {
            Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
                Some(len) if len > 0 => &key[open + 1..open + 1 + len],
                _ => key,
            },
            None => key,
        };
        crc16(hashed) % SLOTS
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...`: the current masters
    /// (master 0 first) as the seeds of a cluster node URL.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .masters
            .iter()
            .map(|&m| format!("127.0.0.1:{}", self.nodes[m].port()))
            .collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// How many masters (shards).
    pub fn masters(&self) -> usize {
        self.masters.len()
    }

    /// The port of master `i`: after [`RedisCluster::failover`], the
    /// promoted replica's.
    pub fn master_port(&self, i: usize) -> u16 {
        self.nodes[self.masters[i]].port()
    }

    /// `redis://127.0.0.1:PORT/` of master `i`.
    pub fn master_url(&self, i: usize) -> String {
        self.nodes[self.masters[i]].server.url()
    }

    /// A plain connection to master `i` (no redirects followed).
    ///
    /// # Panics
    /// When it does not accept a connection.
    pub fn master_conn(&self, i: usize) -> redis::Connection {
        connect(self.master_port(i)).unwrap_or_else(|e| panic!("master {i}: {e}"))
    }

    /// The ports of the other nodes of shard `i`: its replicas, and a former
    /// master that a failover replaced.
    pub fn replica_ports(&self, i: usize) -> Vec<u16> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|&(k, n)| n.shard == i && k != self.masters[i])
            .map(|(_, n)| n.port())
            .collect()
    }

    /// The master whose shard owns `key`'s slot, asked of the servers each
    /// time: every live node's `CLUSTER NODES` must name the same owner
    /// (it waits until they do).
    ///
    /// # Panics
    /// When no node answers, or they do not agree within 30 s.
    pub fn master_of(&self, key: &[u8]) -> usize {
        self.nodes[self.owner_node(key)].shard
    }

    /// The node that owns `key`'s slot, as every live node agrees.
    fn owner_node(&self, key: &[u8]) -> usize {
        let slot = Self::slot(key);
        let id = settle(
            &format!("the live nodes to agree on the owner of slot {slot}"),
            || self.agreed_owner(slot),
        );
        self.node_by_id(&id)
    }

    fn agreed_owner(&self, slot: u16) -> Result<String, String> {
        let mut agreed: Option<(u16, String)> = None;
        for node in self.nodes.iter().filter(|n| n.live()) {
            let owners = owners(&view(node.port())?);
            let owner = owner_in(&owners, slot)
                .ok_or_else(|| format!("node {} sees slot {slot} unowned", node.port()))?;
            match &agreed {
                Some((port, id)) if id != owner => {
                    return Err(format!(
                        "node {port} says {id} owns slot {slot}, node {} says {owner}",
                        node.port()
                    ));
                }
                Some(_) => {}
                None => agreed = Some((node.port(), owner.to_owned())),
            }
        }
        agreed
            .map(|(_, id)| id)
            .ok_or_else(|| "no node is running and unpaused".to_owned())
    }

    fn node_by_id(&self, id: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| n.id == id)
            .unwrap_or_else(|| panic!("node {id} is not one of this cluster's"))
    }

    /// For each master in order, the master that it says owns `key`'s slot;
    /// `None` for a master that is down or paused. For checks that every
    /// master sees a change (a migration, a failover).
    ///
    /// # Panics
    /// When a live master does not answer.
    pub fn owners_seen(&self, key: &[u8]) -> Vec<Option<usize>> {
        let slot = Self::slot(key);
        self.masters
            .iter()
            .map(|&m| {
                let node = &self.nodes[m];
                if !node.live() {
                    return None;
                }
                let owners = owners(&view(node.port()).unwrap_or_else(|e| panic!("{e}")));
                owner_in(&owners, slot).map(|id| self.nodes[self.node_by_id(id)].shard)
            })
            .collect()
    }

    /// A plain connection to the master that owns `key`'s slot now.
    ///
    /// # Panics
    /// As [`RedisCluster::master_of`], and when the owner does not accept a
    /// connection.
    pub fn conn_master_of(&self, key: &[u8]) -> redis::Connection {
        let port = self.nodes[self.owner_node(key)].port();
        connect(port).unwrap_or_else(|e| panic!("the owner of {key:?}: {e}"))
    }

    /// `GET key` on the master that owns its slot, as raw bytes. During a
    /// migration it follows an `ASK` redirect (with `ASKING`), as a cluster
    /// client does.
    ///
    /// # Panics
    /// When the owner does not answer, or answers an error.
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let mut con = self.conn_master_of(key);
        match redis::cmd("GET").arg(key).query(&mut con) {
            Ok(value) => value,
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::Ask) => {
                let (addr, _) = e.redirect_node().expect("an ASK names a node");
                let port = addr
                    .rsplit_once(':')
                    .and_then(|(_, p)| p.parse().ok())
                    .unwrap_or_else(|| panic!("ASK to {addr}"));
                let mut con = connect(port).unwrap_or_else(|e| panic!("{e}"));
                redis::cmd("ASKING").query::<()>(&mut con).expect("ASKING");
                redis::cmd("GET")
                    .arg(key)
                    .query(&mut con)
                    .unwrap_or_else(|e| panic!("GET {key:?} after ASK to {addr}: {e}"))
            }
            Err(e) => panic!("GET {key:?} on its owner: {e}"),
        }
    }

    /// Every key on every master (`KEYS *` on each, master 0 first; a
    /// killed master has none): for checks that nothing was left behind.
    ///
    /// # Panics
    /// When a master is paused (what it holds cannot be read) or does not
    /// answer.
    pub fn keys_everywhere(&self) -> Vec<Vec<u8>> {
        let mut keys = Vec::new();
        for port in self.readable_masters("read its keys") {
            keys.extend(must::<Vec<Vec<u8>>>(port, redis::cmd("KEYS").arg("*")));
        }
        keys
    }

    /// `FLUSHALL` on every master (their replicas follow).
    ///
    /// # Panics
    /// As [`RedisCluster::keys_everywhere`].
    pub fn flushall(&self) {
        for port in self.readable_masters("flush it") {
            must::<()>(port, &redis::cmd("FLUSHALL"));
        }
    }

    /// The ports of the running masters; panics on a paused one.
    fn readable_masters(&self, to: &str) -> Vec<u16> {
        self.masters
            .iter()
            .map(|&m| &self.nodes[m])
            .filter(|n| n.server.is_running())
            .map(|n| {
                assert!(!n.paused, "master {} is paused: resume it to {to}", n.shard);
                n.port()
            })
            .collect()
    }

    /// Kills master `i` with SIGKILL (its data is lost). Its slots stay
    /// its own until [`RedisCluster::failover`].
    pub fn kill_master(&mut self, i: usize) {
        let m = self.masters[i];
        self.nodes[m].server.kill();
        self.nodes[m].paused = false;
    }

    /// Pauses master `i` with SIGSTOP: its sockets stay open and it answers
    /// nothing. The other nodes flag it after the node timeout (1 s).
    pub fn pause_master(&mut self, i: usize) {
        let m = self.masters[i];
        self.nodes[m].server.pause();
        self.nodes[m].paused = true;
    }

    /// Makes every live replica known to a client that connects from now
    /// on: writes to each master (`SET` and `DEL` of a key in its slots),
    /// then waits until every live master's `CLUSTER SLOTS` names every
    /// live replica. Redis leaves out of `CLUSTER SLOTS` a replica that
    /// has replicated nothing yet (its replication offset is 0), as every
    /// replica of a cluster just formed and never written to is; a client
    /// connected before then does not know the replicas, and sends them
    /// nothing, not even what it sends to every node (`SCRIPT LOAD`).
    ///
    /// # Panics
    /// When a master does not answer, or the replicas are not listed
    /// within 30 s.
    pub fn list_replicas(&self) {
        let first = self.nodes[self.masters[0]].port();
        let owners = owners(&view(first).unwrap_or_else(|e| panic!("{e}")));
        for &m in &self.masters {
            let node = &self.nodes[m];
            let key = (0u64..)
                .map(|n| format!("harness-replicated-{n}"))
                .find(|k| owner_in(&owners, Self::slot(k.as_bytes())) == Some(node.id.as_str()))
                .expect("every master owns a slot");
            must::<()>(node.port(), redis::cmd("SET").arg(&key).arg(1));
            must::<()>(node.port(), redis::cmd("DEL").arg(&key));
        }
        let replicas: Vec<&str> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|&(k, n)| self.masters[n.shard] != k && n.live())
            .map(|(_, n)| n.id.as_str())
            .collect();
        settle("CLUSTER SLOTS to name every replica", || {
            for &m in &self.masters {
                let port = self.nodes[m].port();
                let slots: redis::Value = query(port, redis::cmd("CLUSTER").arg("SLOTS"))?;
                let listed = slot_node_ids(&slots);
                if let Some(missing) = replicas.iter().find(|id| !listed.contains(id)) {
                    return Err(format!("node {port} does not list replica {missing}"));
                }
            }
            Ok(())
        });
    }

    /// Pauses one replica of master `i` with SIGSTOP (the first that is
    /// running and not paused) and returns its port: the master goes on
    /// serving its slots, and a command that redis-rs sends to every node
    /// of the cluster (`SCRIPT LOAD`) waits for an answer that does not
    /// come. [`RedisCluster::resume_master`] resumes it; a drop kills it,
    /// paused or not.
    ///
    /// # Panics
    /// When master `i` has no such replica.
    pub fn pause_replica(&mut self, i: usize) -> u16 {
        let m = self.masters[i];
        let node = self
            .nodes
            .iter_mut()
            .enumerate()
            .find(|(k, n)| *k != m && n.shard == i && n.live())
            .map(|(_, n)| n)
            .unwrap_or_else(|| panic!("master {i} has no live replica to pause"));
        node.server.pause();
        node.paused = true;
        node.port()
    }

    /// Resumes every paused node of shard `i`: master `i`, a replica
    /// ([`RedisCluster::pause_replica`]), or the former master a failover
    /// replaced (which then learns that it was replaced and turns into a
    /// replica of the new one).
    pub fn resume_master(&mut self, i: usize) {
        for node in self.nodes.iter_mut().filter(|n| n.shard == i && n.paused) {
            node.server.resume();
            node.paused = false;
        }
    }

    /// Makes a live replica of master `i` take over its slots with
    /// `CLUSTER FAILOVER TAKEOVER` (no agreement of the other masters
    /// needed, so it works when the master is dead or paused), then waits
    /// until every live node sees the replica owning those slots and
    /// reports `cluster_state:ok`. Master `i` is the promoted node from then
    /// on.
    ///
    /// # Panics
    /// When shard `i` has no live replica, or the cluster does not settle
    /// within 30 s.
    pub fn failover(&mut self, i: usize) {
        let old = self.masters[i];
        let new = (0..self.nodes.len())
            .find(|&k| k != old && self.nodes[k].shard == i && self.nodes[k].live())
            .unwrap_or_else(|| panic!("master {i} has no live replica to promote"));
        let (old_id, new_node) = (self.nodes[old].id.clone(), &self.nodes[new]);
        // The slots to take over, as the replica sees them (a migration may
        // have changed them since the cluster formed).
        let slots: Vec<(u16, u16)> =
            owners(&view(new_node.port()).unwrap_or_else(|e| panic!("{e}")))
                .into_iter()
                .filter(|(_, _, id)| *id == old_id)
                .map(|(a, b, _)| (a, b))
                .collect();
        must::<()>(
            new_node.port(),
            redis::cmd("CLUSTER").arg("FAILOVER").arg("TAKEOVER"),
        );
        settle(
            &format!("node {} to take over master {i}'s slots", new_node.port()),
            || self.settled_with_owner(&slots, &new_node.id),
        );
        self.masters[i] = new;
    }

    /// `Ok` once every live node reports `cluster_state:ok` and sees `id`
    /// owning every range of `slots`.
    fn settled_with_owner(&self, slots: &[(u16, u16)], id: &str) -> Result<(), String> {
        for node in self.nodes.iter().filter(|n| n.live()) {
            let info: String = query(node.port(), redis::cmd("CLUSTER").arg("INFO"))?;
            check_state_ok(node.port(), &info)?;
            let owners = owners(&view(node.port())?);
            for &(a, b) in slots {
                if (a..=b).any(|s| owner_in(&owners, s) != Some(id)) {
                    return Err(format!(
                        "node {} does not see {id} owning slots {a}-{b}",
                        node.port()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether every live node reports `cluster_state:ok` now.
    pub fn is_ok(&self) -> bool {
        self.all_ok().is_ok()
    }

    /// Waits until every live node reports `cluster_state:ok` (after a
    /// paused master resumed, say).
    ///
    /// # Panics
    /// When that does not happen within 30 s.
    pub fn wait_ok(&self) {
        settle("every live node to report cluster_state:ok", || {
            self.all_ok()
        });
    }

    fn all_ok(&self) -> Result<(), String> {
        for node in self.nodes.iter().filter(|n| n.live()) {
            let info: String = query(node.port(), redis::cmd("CLUSTER").arg("INFO"))?;
            check_state_ok(node.port(), &info)?;
        }
        Ok(())
    }

    /// Moves the slot of `key`, with its keys, to master `to`, the official
    /// way (`SETSLOT IMPORTING`/`MIGRATING`, `MIGRATE` in batches, `SETSLOT
    /// NODE` on every master), and waits until every live node sees `to`
    /// owning it. [`RedisCluster::begin_migration`] stops half-way.
    ///
    /// # Panics
    /// As [`RedisCluster::begin_migration`] and [`Migration::finish`].
    pub fn migrate_slot(&self, key: &[u8], to: usize) {
        self.begin_migration(key, to).finish();
    }

    /// Starts moving the slot of `key` to master `to`: `CLUSTER SETSLOT
    /// <slot> IMPORTING` on `to`, then `MIGRATING` on the owner. No key
    /// moves yet. Until [`Migration::finish`], the owner still serves the
    /// slot's keys that it holds and answers `ASK` (redirect to `to`, once)
    /// for those it does not, and `to` accepts those after `ASKING`.
    ///
    /// # Panics
    /// When `to` already owns the slot, or a master refuses a command.
    pub fn begin_migration(&self, key: &[u8], to: usize) -> Migration<'_> {
        let slot = Self::slot(key);
        let from = self.owner_node(key);
        let to_node = self.masters[to];
        assert_ne!(from, to_node, "master {to} already owns slot {slot}");
        let setslot = |node: usize, state: &str, other: usize| {
            must::<()>(
                self.nodes[node].port(),
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg(state)
                    .arg(&self.nodes[other].id),
            );
        };
        setslot(to_node, "IMPORTING", from);
        setslot(from, "MIGRATING", to_node);
        Migration {
            cluster: self,
            slot,
            from,
            to: to_node,
        }
    }

    fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(Node::port).collect()
    }
}

/// A slot half-way through a migration, from [`RedisCluster::begin_migration`].
///
/// Dropping it without [`Migration::finish`] leaves the slot half-migrated,
/// as a migration tool that crashed would.
#[derive(Debug)]
#[must_use = "the slot stays half-migrated until `finish`"]
pub struct Migration<'a> {
    cluster: &'a RedisCluster,
    slot: u16,
    /// Node indices.
    from: usize,
    to: usize,
}

impl Migration<'_> {
    /// The slot being moved.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// Moves the keys of the slot that the source holds now to the target
    /// (`CLUSTER GETKEYSINSLOT`, then `MIGRATE ... KEYS` in batches) and
    /// returns how many moved. The slot stays half-migrated.
    ///
    /// # Panics
    /// When a node refuses a command (`MIGRATE` of a key that the target
    /// already holds, say).
    pub fn move_keys(&self) -> usize {
        let (from, to) = (&self.cluster.nodes[self.from], &self.cluster.nodes[self.to]);
        let mut moved = 0;
        loop {
            let keys: Vec<Vec<u8>> = must(
                from.port(),
                redis::cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(self.slot)
                    .arg(MIGRATE_BATCH),
            );
            if keys.is_empty() {
                return moved;
            }
            must::<redis::Value>(
                from.port(),
                redis::cmd("MIGRATE")
                    .arg("127.0.0.1")
                    .arg(to.port())
                    .arg("")
                    .arg(0)
                    .arg(5000)
                    .arg("KEYS")
                    .arg(&keys),
            );
            moved += keys.len();
        }
    }

    /// Moves the remaining keys, gives the slot to the target with `CLUSTER
    /// SETSLOT <slot> NODE` on the target, the source and every other live
    /// master, and waits until every live node sees the target owning it.
    ///
    /// # Panics
    /// When a node refuses a command, or the cluster does not settle within
    /// 30 s.
    pub fn finish(self) {
        let cluster = self.cluster;
        let to_id = &cluster.nodes[self.to].id;
        self.move_keys();
        let others = cluster
            .masters
            .iter()
            .copied()
            .filter(|&m| m != self.to && m != self.from && cluster.nodes[m].live());
        for node in [self.to, self.from].into_iter().chain(others) {
            let port = cluster.nodes[node].port();
            settle(&format!("node {port} to take SETSLOT NODE"), || {
                // The source refuses while it holds keys of the slot: a
                // client may have written one since the last batch.
                if node == self.from {
                    self.move_keys();
                }
                query::<()>(
                    port,
                    redis::cmd("CLUSTER")
                        .arg("SETSLOT")
                        .arg(self.slot)
                        .arg("NODE")
                        .arg(to_id),
                )
            });
        }
        settle(
            &format!("every live node to see slot {} moved", self.slot),
            || match cluster.agreed_owner(self.slot)? {
                id if &id == to_id => Ok(()),
                id => Err(format!("the nodes agree on {id}, not {to_id}")),
            },
        );
    }
}

/// `n` independent Redis Clusters ([`RedisCluster`]), the nodes of Redlock
/// over clusters. Indexing gives each cluster.
#[derive(Debug)]
pub struct RedisClusters {
    clusters: Vec<RedisCluster>,
}

impl RedisClusters {
    /// Starts `n` clusters of `masters` masters with `replicas` replicas
    /// each: every process first, in parallel, then every cluster is formed
    /// in parallel, so that their settling times overlap.
    ///
    /// # Panics
    /// As [`RedisCluster::start`].
    pub fn start(n: usize, masters: usize, replicas: usize) -> Self {
        Self::start_with(n, masters, replicas, &[])
    }

    /// As [`RedisClusters::start`], with extra `redis-server` arguments on
    /// every node (see [`RedisCluster::start_with`]).
    pub fn start_with(n: usize, masters: usize, replicas: usize, extra: &[&str]) -> Self {
        let mut clusters: Vec<RedisCluster> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|_| s.spawn(|| RedisCluster::spawn(masters, replicas, extra)))
                .collect();
            handles.into_iter().map(join).collect()
        });
        std::thread::scope(|s| {
            let handles: Vec<_> = clusters
                .iter_mut()
                .map(|c| s.spawn(move || c.form()))
                .collect();
            handles.into_iter().for_each(join);
        });
        RedisClusters { clusters }
    }

    /// Each cluster's [`RedisCluster::url`], in order: the values of a
    /// Redlock over these clusters (joined with `;` in `REDLOCK_NODES`,
    /// since each URL has commas of its own).
    pub fn urls(&self) -> Vec<String> {
        self.clusters.iter().map(RedisCluster::url).collect()
    }

    /// How many clusters.
    pub fn len(&self) -> usize {
        self.clusters.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty()
    }

    /// The clusters, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, RedisCluster> {
        self.clusters.iter()
    }

    /// How many of the clusters hold `key` now.
    pub fn holding(&self, key: &str) -> usize {
        self.iter()
            .filter(|c| c.get(key.as_bytes()).is_some())
            .count()
    }

    /// Asserts what a release of a lock told (`unlocked`: the clusters it
    /// released on) against the clusters that held its key just before
    /// (`held`, from [`holding`](RedisClusters::holding)). A lock is granted
    /// at a quorum: a cluster whose request outlasted the node timeout (its
    /// first, with the connection made at that call, on a loaded machine)
    /// never took the key and has nothing to release. Every cluster that
    /// held it must release it, and at least a quorum of the clusters.
    ///
    /// # Panics
    /// When it released on fewer.
    pub fn assert_released(&self, unlocked: usize, held: usize) {
        let quorum = self.len() / 2 + 1;
        assert!(
            unlocked >= held.max(quorum),
            "released on {unlocked} clusters, held on {held}"
        );
    }
}

impl Index<usize> for RedisClusters {
    type Output = RedisCluster;

    fn index(&self, i: usize) -> &RedisCluster {
        &self.clusters[i]
    }
}

impl IndexMut<usize> for RedisClusters {
    fn index_mut(&mut self, i: usize) -> &mut RedisCluster {
        &mut self.clusters[i]
    }
}

/// `CLUSTER MEET 127.0.0.1 port [bus]`: the bus port is an argument since
/// Redis 7.0, and the port + 10000 before.
fn meet(port: u16, bus: u16) -> redis::Cmd {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("MEET").arg("127.0.0.1").arg(port);
    if server_major() >= 7 {
        cmd.arg(bus);
    }
    cmd
}

/// The major version of `REDIS_SERVER` (`v=7.0.15` gives 7; Valkey's
/// numbers count as Redis's, 8 and 9 being later than 7). 7 when it cannot
/// be read.
fn server_major() -> u32 {
    static MAJOR: OnceLock<u32> = OnceLock::new();
    *MAJOR.get_or_init(|| {
        let out = Command::new(redis_server_binary())
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        out.split_once("v=")
            .and_then(|(_, v)| v.split('.').next())
            .and_then(|major| major.parse().ok())
            .unwrap_or(7)
    })
}

/// CRC16/XMODEM (polynomial 0x1021, initial value 0), Redis Cluster's key
/// hash.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The contiguous slot range (inclusive) of shard `i` of `count`.
fn shard_range(i: usize, count: usize) -> (u16, u16) {
    let slots = usize::from(SLOTS);
    (
        (i * slots / count) as u16,
        ((i + 1) * slots / count - 1) as u16,
    )
}

/// One line of `CLUSTER NODES`.
#[derive(Debug)]
struct Line {
    id: String,
    flags: Vec<String>,
    /// The master of a replica.
    master: Option<String>,
    /// Inclusive slot ranges (a master's).
    slots: Vec<(u16, u16)>,
}

/// `CLUSTER NODES` of the node on `port`: how it sees the cluster.
fn view(port: u16) -> Result<Vec<Line>, String> {
    let text: String = query(port, redis::cmd("CLUSTER").arg("NODES"))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| parse_line(l).ok_or_else(|| format!("node {port}: CLUSTER NODES line `{l}`")))
        .collect()
}

/// `<id> <ip:port@cport[,hostname]> <flags> <master> <ping-sent>
/// <pong-recv> <config-epoch> <link-state> <slot> <slot> ...`, where a slot
/// is `n` or `a-b`, and `[n->-id]` or `[n-<-id]` marks a slot migrating or
/// importing (skipped: it does not change the owner).
fn parse_line(line: &str) -> Option<Line> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 8 {
        return None;
    }
    let mut slots = Vec::new();
    for field in fields[8..].iter().filter(|f| !f.starts_with('[')) {
        let (a, b) = field.split_once('-').unwrap_or((field, field));
        slots.push((a.parse().ok()?, b.parse().ok()?));
    }
    Some(Line {
        id: fields[0].to_owned(),
        flags: fields[2].split(',').map(str::to_owned).collect(),
        master: (fields[3] != "-").then(|| fields[3].to_owned()),
        slots,
    })
}

/// Who owns which slots in a view: inclusive ranges with the owner's id,
/// in slot order, adjacent ranges of one owner merged.
fn owners(lines: &[Line]) -> Vec<(u16, u16, String)> {
    let mut ranges: Vec<(u16, u16, &str)> = lines
        .iter()
        .filter(|l| l.flags.iter().any(|f| f == "master"))
        .flat_map(|l| l.slots.iter().map(|&(a, b)| (a, b, l.id.as_str())))
        .collect();
    ranges.sort_unstable();
    let mut merged: Vec<(u16, u16, String)> = Vec::new();
    for (a, b, id) in ranges {
        match merged.last_mut() {
            Some(last) if last.2 == id && last.1 + 1 == a => last.1 = b,
            _ => merged.push((a, b, id.to_owned())),
        }
    }
    merged
}

/// The node ids a `CLUSTER SLOTS` reply names: each range is `[start,
/// end, master, replica, ...]`, each node `[host, port, id, ...]`.
fn slot_node_ids(reply: &redis::Value) -> Vec<&str> {
    let redis::Value::Array(ranges) = reply else {
        return Vec::new();
    };
    ranges
        .iter()
        .filter_map(|range| match range {
            redis::Value::Array(parts) => Some(parts.iter().skip(2)),
            _ => None,
        })
        .flatten()
        .filter_map(|node| match node {
            redis::Value::Array(fields) => match fields.get(2) {
                Some(redis::Value::BulkString(id)) => std::str::from_utf8(id).ok(),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// The owner of `slot` in [`owners`]' ranges.
fn owner_in(owners: &[(u16, u16, String)], slot: u16) -> Option<&str> {
    owners
        .iter()
        .find(|(a, b, _)| (*a..=*b).contains(&slot))
        .map(|(_, _, id)| id.as_str())
}

/// The value of `name` in an `INFO`-style reply (`name:value` lines).
fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

fn check_state_ok(port: u16, cluster_info: &str) -> Result<(), String> {
    match field(cluster_info, "cluster_state") {
        Some("ok") => Ok(()),
        state => Err(format!("node {port}: cluster_state {state:?}")),
    }
}

/// A connection to the node on `port`: 2 s to connect, 5 s to answer
/// (generous, for a loaded machine).
fn connect(port: u16) -> Result<redis::Connection, String> {
    let fail = |e: redis::RedisError| format!("node {port}: {e}");
    let con = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .map_err(fail)?
        .get_connection_with_timeout(Duration::from_secs(2))
        .map_err(fail)?;
    con.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(fail)?;
    con.set_write_timeout(Some(Duration::from_secs(5)))
        .map_err(fail)?;
    Ok(con)
}

/// `cmd` on the node on `port`, on a connection of its own.
fn query<T: FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Result<T, String> {
    cmd.query(&mut connect(port)?)
        .map_err(|e| format!("node {port}: {e}"))
}

/// As [`query`], for commands that must succeed.
fn must<T: FromRedisValue>(port: u16, cmd: &redis::Cmd) -> T {
    query(port, cmd).unwrap_or_else(|e| panic!("{e}"))
}

/// Polls `check` every 50 ms until it gives a value, for at most
/// [`SETTLE`]; then panics with what the last try said.
fn settle<T>(what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + SETTLE;
    loop {
        match check() {
            Ok(value) => return value,
            Err(last) if Instant::now() >= deadline => {
                panic!("waited {SETTLE:?} for {what}; last: {last}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Joins a scoped thread, passing its panic (and message) on.
fn join<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_is_xmodem() {
        // The check value of CRC-16/XMODEM, and Redis's own test vector.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
        assert_eq!(RedisCluster::slot(b"123456789"), 12739);
    }

    #[test]
    fn a_hash_tag_is_the_first_non_empty_braces() {
        let slot = RedisCluster::slot;
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        // Empty braces first: the whole key.
        assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(slot(b"a{b"), crc16(b"a{b") % SLOTS);
    }

    #[test]
    fn shard_ranges_cover_every_slot_once() {
        for count in 1..=5 {
            let ranges: Vec<_> = (0..count).map(|i| shard_range(i, count)).collect();
            assert_eq!(ranges[0].0, 0);
            assert_eq!(ranges[count - 1].1, SLOTS - 1);
            assert!(ranges.windows(2).all(|w| w[0].1 + 1 == w[1].0));
        }
    }

    #[test]
    fn a_nodes_line_gives_flags_master_and_owned_ranges() {
        let line = parse_line(
            "07c37 127.0.0.1:30004@31004,host myself,master - 0 1426238317239 4 connected 0-99 200 [300->-292f8]",
        )
        .unwrap();
        assert_eq!(line.flags, ["myself", "master"]);
        assert_eq!(line.master, None);
        assert_eq!(line.slots, [(0, 99), (200, 200)]);
        let replica = parse_line(
            "e7d1e 127.0.0.1:30006@31006 slave,nofailover 07c37 0 1426238316232 4 connected",
        )
        .unwrap();
        assert_eq!(replica.master.as_deref(), Some("07c37"));
        let merged = owners(&[
            line,
            parse_line("ab 127.0.0.1:1@2 master - 0 0 1 connected 100-199 201-16383").unwrap(),
        ]);
        assert_eq!(owner_in(&merged, 150), Some("ab"));
        assert_eq!(owner_in(&merged, 200), Some("07c37"));
        assert_eq!(merged.len(), 4);
    }
}
