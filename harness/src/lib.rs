//! The harness of `redlock-quorum`'s tests, benchmark and demo: real
//! `redis-server` processes and helpers around them. No mock of Redis
//! anywhere. Not published; a workspace member that the root crate takes as
//! a dev-dependency, as redis-rs does with `redis-test`.
//!
//! # Layout
//! - [`server`]: one `redis-server` process on a free loopback port, which
//!   can be paused, resumed, killed and restarted, and is killed on drop.
//! - [`cluster`]: the nodes a test runs against ([`Cluster`]: its own
//!   servers, or the ones `REDLOCK_NODES` names), a test builder, helpers to
//!   read and plant keys on every node and to add ACL users, and unique
//!   resource names ([`resource`]).
//! - [`shards`]: real Redis Clusters ([`RedisCluster`], formed without
//!   redis-cli) and groups of them ([`RedisClusters`]), the nodes of
//!   Redlock over clusters: slot of a key, owner of a slot, slot migration
//!   (whole or half-way), master kill, pause and failover, replicas made
//!   known to clients and paused.
//! - [`raw`]: raw key checks on one node by URL (exists, ttl, value, keys).
//! - [`keys`]: the names the library derives from a lock key or a key
//!   prefix (fencing counter, generation marker, waiters, hand-off, release
//!   channel), mirroring its key layout.
//! - [`proxy`]: a fault-injecting TCP proxy in front of one node (latency,
//!   partition, lost replies, resets).
//! - [`checker`]: the mutual-exclusion checker on one monotonic clock,
//!   across processes.
//! - [`workload`]: the contending clients of the fault tests and what they
//!   record.
//! - [`fault`]: the fault-test runner: plan, checker, workload, the fault a
//!   test injects, then the settling checks, written once.
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]

pub mod checker;
pub mod cluster;
pub mod fault;
pub mod keys;
pub mod node_redlock;
pub mod proxy;
pub mod raw;
pub mod runtimes;
pub mod server;
pub mod shards;
pub mod steps;
pub mod workload;

pub use cluster::{
    Cluster, external_nodes, manager, reach_every_node, releases_drained, resource, warm,
};
pub use server::RedisServer;
pub use shards::{Migration, RedisCluster, RedisClusters};
