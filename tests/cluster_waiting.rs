//! Waiting on cluster nodes (feature `cluster`): a waiter hears the
//! release through sharded pub/sub (`SSUBSCRIBE`, `SPUBLISH` on the shard
//! that owns the lock key's slot), with its registration in that slot, on
//! real clusters of real `redis-server` processes.
//!
//! Every holder here takes a ttl far longer than the waiters' patience,
//! and the waiters' timed retry (which the first waiter of a key keeps,
//! for releases nobody publishes) comes only after that patience: a
//! waiter that was not woken by the release (as on cluster nodes before
//! sharded pub/sub) takes the lock only with its last attempt, at its
//! deadline, and the test fails.
#![cfg(feature = "cluster")]

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use redlock_harness::resource;
use redlock_harness::shards::{RedisCluster, RedisClusters};
use redlock_quorum::Redlock;

/// Far longer than any waiter's patience.
const HOLD: Duration = Duration::from_secs(60);
/// A waiter's patience.
const PATIENCE: Duration = Duration::from_secs(12);
/// How soon after the release a woken waiter must hold the lock: far
/// under [`PATIENCE`], with room for a loaded machine.
const WOKEN: Duration = Duration::from_secs(4);

/// A manager whose timed retry comes after [`PATIENCE`].
fn manager(urls: &[String]) -> Redlock {
    Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(Duration::from_millis(500))
        .retry_delay(Duration::from_secs(30))
        .retry_jitter(Duration::from_millis(1))
        .build()
        .unwrap()
}

/// `calls` of `command` in `INFO commandstats`, summed over the masters of
/// every cluster (a script's inner commands count too).
fn calls(clusters: &RedisClusters, command: &str) -> u64 {
    let field = format!("cmdstat_{command}:calls=");
    let mut total = 0;
    for cluster in clusters.iter() {
        for m in 0..cluster.masters() {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut cluster.master_conn(m))
                .unwrap();
            total += info
                .lines()
                .filter_map(|l| l.strip_prefix(field.as_str()))
                .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
                .sum::<u64>();
        }
    }
    total
}

/// Keys of the waiting protocol left anywhere (waiting hashes, hand-off
/// markers): none of them outlives its lease by much, but a test that
/// ends must not count them as lock keys.
fn lock_keys(clusters: &RedisClusters) -> Vec<String> {
    let mut left = Vec::new();
    for cluster in clusters.iter() {
        for key in cluster.keys_everywhere() {
            if !key.contains(&0xFF) {
                left.push(String::from_utf8_lossy(&key).into_owned());
            }
        }
    }
    left
}

/// Three managers take turns on one resource and on a set over many slots
/// (a common key among them): each waiter is woken by the release before
/// it; the releases went out with `SPUBLISH` and never with `PUBLISH`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_cluster_nodes_are_woken_by_the_release() {
    let clusters = RedisClusters::start(5, 3, 0);
    let urls = clusters.urls();
    let managers: Vec<Redlock> = (0..3).map(|_| manager(&urls)).collect();
    let one = vec![resource("cw-one")];
    let set: Vec<String> = (0..12).map(|i| resource(&format!("cw-set-{i}"))).collect();
    let slots: std::collections::HashSet<u16> = set
        .iter()
        .map(|k| RedisCluster::slot(k.as_bytes()))
        .collect();
    assert!(slots.len() > 3, "the set spans slots");
    for names in [one, set] {
        let first = managers[0].lock(names.as_slice(), HOLD).await.unwrap();
        let mut waiting = Vec::new();
        for m in &managers[1..] {
            let (m, names) = (m.clone(), names.clone());
            waiting.push(tokio::spawn(async move {
                let lock = m.lock_within(names.as_slice(), HOLD, PATIENCE).await?;
                let got = Instant::now();
                // Hold a little, then hand on.
                tokio::time::sleep(Duration::from_millis(100)).await;
                m.unlock(&lock).await?;
                Ok::<_, redlock_quorum::Error>(got)
            }));
        }
        // Both waiters subscribed and registered.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let released = Instant::now();
        managers[0].unlock(&first).await.unwrap();
        for w in waiting {
            let got = w
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("a waiter on {} names was not woken: {e}", names.len()));
            let took = got - released;
            println!(
                "{} names: a waiter took the lock {took:?} after the first release",
                names.len(),
            );
            // The second waiter follows the first one's release, 100 ms
            // after it took the lock.
            assert!(took < WOKEN * 2, "not woken by a release: {took:?}");
        }
    }
    let spublish = calls(&clusters, "spublish");
    let publish = calls(&clusters, "publish");
    println!("SPUBLISH calls {spublish}, PUBLISH calls {publish}");
    assert!(spublish > 0, "the releases went out on sharded channels");
    assert_eq!(publish, 0, "nothing published cluster-wide");
    assert!(
        lock_keys(&clusters).is_empty(),
        "{:?}",
        lock_keys(&clusters)
    );
}

/// The slot of the resource moves to another master on three of the five
/// clusters while a waiter waits: the old master ends the waiter's
/// sharded subscription (`SUNSUBSCRIBE`), the link subscribes again where
/// the slot went, and the release, published by the new master, still
/// wakes the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_hears_the_release_after_its_slot_moved() {
    let clusters = RedisClusters::start(5, 3, 0);
    let urls = clusters.urls();
    let (a, b) = (manager(&urls), manager(&urls));
    let res = resource("cw-moved");
    let held = a.lock(&res, HOLD).await.unwrap();
    let waiting = {
        let (b, res) = (b.clone(), res.clone());
        tokio::spawn(async move { b.lock_within(&res, HOLD, PATIENCE).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    for cluster in clusters.iter().take(3) {
        let from = cluster.master_of(res.as_bytes());
        cluster.migrate_slot(res.as_bytes(), (from + 1) % 3);
    }
    // The link noticed and subscribed again.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let before = clusters.holding(&res);
    let released = Instant::now();
    clusters.assert_released(a.unlock(&held).await.unwrap(), before);
    let next = waiting
        .await
        .unwrap()
        .expect("the waiter is woken by the release after the move");
    let took = released.elapsed();
    println!("the waiter took it {took:?} after the release");
    assert!(took < WOKEN, "not woken by the release: {took:?}");
    let holding: Vec<bool> = clusters
        .iter()
        .map(|c| c.get(res.as_bytes()).is_some())
        .collect();
    println!("clusters holding the waiter's key: {holding:?}");
    assert!(b.verify(&next).await.unwrap());
    // The waiter's lock is granted at a quorum: a cluster whose slot just
    // moved may not have given it (its first request there can meet the
    // old master's `MOVED`), and then has nothing to release.
    let released = b.unlock(&next).await.unwrap();
    println!("released {released}, owed {}", b.pending_releases());
    assert!(released >= 3, "{released}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.pending_releases() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        lock_keys(&clusters).is_empty(),
        "{:?}",
        lock_keys(&clusters)
    );
}
/// The name of the waiting protocol (`K`, `0xFF`, then `suffix`) in the
/// slot of lock key `K`, as the crate names it on a cluster node: `{tag}`
/// first, the tag the shortest decimal number whose slot is `K`'s.
fn in_slot_of(key: &str, suffix: &[u8]) -> Vec<u8> {
    let slot = RedisCluster::slot(key.as_bytes());
    let tag = (0u64..)
        .map(|n| n.to_string())
        .find(|t| RedisCluster::slot(t.as_bytes()) == slot)
        .unwrap();
    let mut name = format!("{{{tag}}}{key}").into_bytes();
    name.push(0xFF);
    name.extend_from_slice(suffix);
    name
}

/// A manager that swallows the releases that name it: registered in the
/// key's waiting hash on every cluster, subscribed to its own channel
/// there, and never taking the lock (a stopped process). When a release
/// names it, the releaser's hand-off check (`HANDOFF_CHECK` in the key's
/// slot, 200 ms later) publishes it again for every manager, and the real
/// waiter, which the release did not name, takes the lock then, long
/// before its timed retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_swallowed_by_a_stopped_successor_is_published_again() {
    let clusters = RedisClusters::start(5, 2, 0);
    let urls = clusters.urls();
    let (a, c) = (manager(&urls), manager(&urls));
    let res = resource("cw-swallowed");
    let fake = "0000000000000000";
    let mut own = b"released".to_vec();
    own.push(0xFF);
    own.extend_from_slice(fake.as_bytes());
    let own_channel = in_slot_of(&res, &own);
    let waiters = in_slot_of(&res, b"waiters");
    let mut stopped = Vec::new();
    for cluster in clusters.iter() {
        let m = cluster.master_of(res.as_bytes());
        let mut conn = cluster.master_conn(m);
        let _: () = redis::cmd("HSET")
            .arg(&waiters)
            .arg(fake)
            .arg(u64::MAX / 2)
            .query(&mut conn)
            .unwrap();
        // A raw connection: the server counts it as a subscriber, and the
        // bytes it receives say whether a release named it.
        let mut sub = std::net::TcpStream::connect(("127.0.0.1", cluster.master_port(m))).unwrap();
        let mut command =
            format!("*2\r\n$10\r\nSSUBSCRIBE\r\n${}\r\n", own_channel.len()).into_bytes();
        command.extend_from_slice(&own_channel);
        command.extend_from_slice(b"\r\n");
        sub.write_all(&command).unwrap();
        sub.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        stopped.push(sub);
    }
    let mut swallowed_rounds = 0;
    for round in 0..10 {
        let held = a.lock(&res, HOLD).await.unwrap();
        let waiting = {
            let (c, res) = (c.clone(), res.clone());
            tokio::spawn(async move { c.lock_within(&res, HOLD, PATIENCE).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        a.unlock(&held).await.unwrap();
        let next = waiting.await.unwrap().expect("the waiter takes the lock");
        let took = released.elapsed();
        // Whether this release named the stopped manager (on any cluster).
        let mut named = false;
        for sub in &mut stopped {
            let mut buf = [0u8; 4096];
            while let Ok(n) = sub.read(&mut buf) {
                if n == 0 {
                    break;
                }
                named |= buf[..n].windows(8).any(|w| w == b"smessage");
            }
        }
        swallowed_rounds += usize::from(named);
        println!(
            "round {round}: stopped manager named {named}; the waiter took it {took:?} after the release"
        );
        assert!(took < WOKEN, "round {round}: not woken: {took:?}");
        c.unlock(&next).await.unwrap();
        // The stopped manager stays registered.
        for cluster in clusters.iter() {
            let m = cluster.master_of(res.as_bytes());
            let _: () = redis::cmd("HSET")
                .arg(&waiters)
                .arg(fake)
                .arg(u64::MAX / 2)
                .query(&mut cluster.master_conn(m))
                .unwrap();
        }
    }
    assert!(
        swallowed_rounds > 0,
        "no release named the stopped manager: the test proved nothing"
    );
}

/// The master that owns the resource's slot fails over to its replica on
/// three of five clusters while a waiter waits: the waiter's subscription
/// on those clusters is made again on the new masters, and the release
/// wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_hears_the_release_after_a_failover() {
    let mut clusters = RedisClusters::start(5, 2, 1);
    let urls = clusters.urls();
    let (a, b) = (manager(&urls), manager(&urls));
    let res = resource("cw-failover");
    let held = a.lock(&res, HOLD).await.unwrap();
    let waiting = {
        let (b, res) = (b.clone(), res.clone());
        tokio::spawn(async move { b.lock_within(&res, HOLD, PATIENCE).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..3 {
        let m = clusters[i].master_of(res.as_bytes());
        clusters[i].failover(m);
    }
    // The link noticed and subscribed again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let released = Instant::now();
    let count = a.unlock(&held).await.unwrap();
    let next = waiting
        .await
        .unwrap()
        .expect("the waiter is woken by the release after the failovers");
    let took = released.elapsed();
    println!("released on {count}; the waiter took it {took:?} after the release");
    assert!(took < WOKEN, "not woken by the release: {took:?}");
    b.unlock(&next).await.unwrap();
}

/// The rule docs/clusters.md gives a lock user on cluster nodes (key
/// prefix `app:`): the lock keys, and the crate's names in their slots
/// (`{<tag>}` first); sharded pub/sub; `CLUSTER SLOTS`, `ASKING` and
/// `PING` for redis-rs's cluster client.
const CLUSTER_RULE: &[&str] = &[
    "on",
    ">locker-pass",
    "resetkeys",
    "~app:*",
    "~{*}app:*",
    "resetchannels",
    "&app:*",
    "&{*}app:*",
    "-@all",
    "+set",
    "+get",
    "+del",
    "+pexpire",
    "+pttl",
    "+time",
    "+eval",
    "+evalsha",
    "+spublish",
    "+ssubscribe",
    "+sunsubscribe",
    "+pubsub|shardnumsub",
    "+hset",
    "+hgetall",
    "+hdel",
    "+info",
    "+cluster|slots",
    "+asking",
    "+ping",
];

/// A lock user with the documented rule on every master of five clusters
/// locks, waits (woken by the release), extends, fences and releases, and
/// no master logs a denial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_user_with_the_documented_rule_waits_on_cluster_nodes() {
    let clusters = RedisClusters::start(5, 2, 0);
    let mut urls = Vec::new();
    for cluster in clusters.iter() {
        for m in 0..cluster.masters() {
            let mut conn = cluster.master_conn(m);
            let mut set = redis::cmd("ACL");
            set.arg("SETUSER").arg("locker").arg(CLUSTER_RULE);
            let _: () = set.query(&mut conn).unwrap();
            // redis-rs names its connections (`CLIENT SETINFO`) where the
            // server knows the command (Redis 7.0 refuses the name).
            let _: Result<(), _> = redis::cmd("ACL")
                .arg("SETUSER")
                .arg("locker")
                .arg("+client|setinfo")
                .query(&mut conn);
            let _: () = redis::cmd("ACL")
                .arg("LOG")
                .arg("RESET")
                .query(&mut conn)
                .unwrap();
        }
        urls.push(cluster.url().replacen(
            "redis+cluster://",
            "redis+cluster://locker:locker-pass@",
            1,
        ));
    }
    let user = |urls: &[String]| {
        Redlock::builder(urls.iter().map(String::as_str))
            .key_prefix("app:")
            .node_timeout(Duration::from_millis(500))
            .retry_delay(Duration::from_secs(30))
            .retry_jitter(Duration::from_millis(1))
            .build()
            .unwrap()
    };
    let (a, c) = (user(&urls), user(&urls));
    let res = resource("cw-acl");
    let held = a.lock(&res, HOLD).await.unwrap();
    let waiting = {
        let (c, res) = (c.clone(), res.clone());
        tokio::spawn(async move { c.lock_within(&res, HOLD, PATIENCE).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let key = format!("app:{res}");
    let before = clusters.holding(&key);
    let released = Instant::now();
    clusters.assert_released(a.unlock(&held).await.unwrap(), before);
    let next = waiting.await.unwrap().expect("woken by the release");
    let took = released.elapsed();
    println!("a lock user's waiter took it {took:?} after the release");
    assert!(took < WOKEN, "not woken by the release: {took:?}");
    let next = c.extend(&next, HOLD).await.unwrap();
    assert_eq!(c.fencing_token(&next).await.unwrap(), 1);
    let before = clusters.holding(&key);
    clusters.assert_released(c.unlock(&next).await.unwrap(), before);
    let mut denials = Vec::new();
    for cluster in clusters.iter() {
        for m in 0..cluster.masters() {
            let log: Vec<redis::Value> = redis::cmd("ACL")
                .arg("LOG")
                .query(&mut cluster.master_conn(m))
                .unwrap();
            denials.extend(log.into_iter().map(|entry| format!("{entry:?}")));
        }
    }
    assert!(denials.is_empty(), "denials: {denials:#?}");
}

/// The slot master is paused (it answers nothing and sends no
/// disconnection) and its replica promoted, on each of five clusters,
/// while a waiter waits: once the waiting manager's requests have timed
/// out there twice and its connection to each such cluster was made anew
/// (on the new master), its subscriptions follow within a renewal tick,
/// and the release wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_hears_the_release_after_a_silent_master_was_replaced() {
    let mut clusters = RedisClusters::start(5, 2, 1);
    let urls = clusters.urls();
    let (a, b) = (manager(&urls), manager(&urls));
    let res = resource("cw-silent");
    let held = a.lock(&res, HOLD).await.unwrap();
    let waiting = {
        let (b, res) = (b.clone(), res.clone());
        tokio::spawn(async move { b.lock_within(&res, HOLD, PATIENCE * 3).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut paused = Vec::new();
    // On every cluster: a release from any node would wake the waiter.
    for i in 0..5 {
        let m = clusters[i].master_of(res.as_bytes());
        // The replica has the key before its master goes silent (on a
        // loaded machine its first sync may still be under way). Asked of
        // the replica itself: a `WAIT` on a connection that wrote nothing
        // counts the replicas at once, whatever they hold (under four CPU
        // burners a replica promoted without the key let the waiting
        // manager's own `try_lock` below take the lock).
        let deadline = Instant::now() + Duration::from_secs(20);
        for port in clusters[i].replica_ports(m) {
            let mut replica = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                .unwrap()
                .get_connection()
                .unwrap();
            let _: () = redis::cmd("READONLY").query(&mut replica).unwrap();
            loop {
                let has: i64 = redis::cmd("EXISTS")
                    .arg(&res)
                    .query(&mut replica)
                    .unwrap_or(0);
                if has == 1 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "cluster {i}: the replica on port {port} never got the key"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        clusters[i].pause_master(m);
        clusters[i].failover(m);
        paused.push((i, m));
    }
    // Both managers' requests reach the new masters once their connections
    // were made anew after two timeouts in a row.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let verified = a.verify(&held).await;
        let tried = b.try_lock(&res, HOLD).await;
        assert!(
            tried.is_err(),
            "the other manager took the held lock after the failovers"
        );
        let stale = format!("{verified:?}{tried:?}").contains("Timeout");
        if verified.as_ref().is_ok_and(|v| *v) && !stale {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "requests do not reach the new masters: {verified:?} {tried:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A renewal tick (2 s) for the link to follow.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let released = Instant::now();
    let count = a.unlock(&held).await.unwrap();
    let next = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the waiter answers")
        .unwrap()
        .expect("the waiter takes the lock");
    let took = released.elapsed();
    println!("released on {count}; the waiter took it {took:?} after the release");
    assert!(took < WOKEN, "not woken by the release: {took:?}");
    b.unlock(&next).await.unwrap();
    for (i, m) in paused {
        clusters[i].resume_master(m);
    }
}

/// A lock user denied scripts on cluster nodes still takes a lock by
/// waiting: the waiting attempt, a script on cluster nodes, is sent again
/// as the pipeline where the node answers `NOPERM`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_denied_scripts_still_waits_for_a_lock_on_cluster_nodes() {
    let clusters = RedisClusters::start(5, 1, 0);
    let rule: Vec<&str> = CLUSTER_RULE
        .iter()
        .copied()
        .filter(|r| !matches!(*r, "+eval" | "+evalsha"))
        .collect();
    let mut urls = Vec::new();
    for cluster in clusters.iter() {
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("noscript")
            .arg(&rule)
            .query(&mut cluster.master_conn(0))
            .unwrap();
        urls.push(cluster.url().replacen(
            "redis+cluster://",
            "redis+cluster://noscript:locker-pass@",
            1,
        ));
    }
    let admin = Redlock::builder(clusters.urls().iter().map(String::as_str))
        .key_prefix("app:")
        .build()
        .unwrap();
    let user = Redlock::builder(urls.iter().map(String::as_str))
        .key_prefix("app:")
        .node_timeout(Duration::from_millis(500))
        .retry_delay(Duration::from_millis(100))
        .build()
        .unwrap();
    let res = resource("cw-noscript");
    // Held by another for a second: the user's first attempt is refused,
    // its waiting attempts take it once the key expires.
    let _held = admin.lock(&res, Duration::from_secs(1)).await.unwrap();
    let lock = user
        .lock_within(&res, HOLD, Duration::from_secs(10))
        .await
        .expect("the waiting attempts work without scripts");
    assert!(lock.is_valid());
    let holding = clusters
        .iter()
        .filter(|c| c.get(format!("app:{res}").as_bytes()).is_some())
        .count();
    assert!(holding >= 3, "{holding}");
}
