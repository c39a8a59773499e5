//! The harness's Redis Clusters against real servers: they form, the slot
//! of a key is the server's, the owner of a slot is found on the servers, a
//! slot migrates (whole, or half-way with `ASK` in between), a killed or
//! paused master is replaced by its replica with the writes it had
//! acknowledged, and five clusters of three masters start in seconds.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use redis::Connection;
use redlock_harness::{RedisCluster, RedisClusters};

fn set(con: &mut Connection, key: &[u8], value: &[u8]) -> redis::RedisResult<()> {
    redis::cmd("SET").arg(key).arg(value).query(con)
}

fn get(con: &mut Connection, key: &[u8]) -> redis::RedisResult<Option<Vec<u8>>> {
    redis::cmd("GET").arg(key).query(con)
}

/// The error code of a failed reply (`MOVED`, `ASK`, ...).
fn code(result: redis::RedisResult<impl std::fmt::Debug>) -> String {
    match result {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.code().unwrap_or("?").to_owned(),
    }
}

/// Keys named `{prefix}{i}` until `n` of them fall on pairwise distinct
/// masters (or every master has one).
fn keys_on_distinct_masters(cluster: &RedisCluster, prefix: &str) -> Vec<(Vec<u8>, usize)> {
    let mut found: Vec<(Vec<u8>, usize)> = Vec::new();
    for i in 0..200 {
        let key = format!("{prefix}{i}").into_bytes();
        let master = cluster.master_of(&key);
        if found.iter().all(|(_, m)| *m != master) {
            found.push((key, master));
        }
        if found.len() == cluster.masters() {
            break;
        }
    }
    found
}

#[test]
fn slot_agrees_with_cluster_keyslot() {
    let cluster = RedisCluster::start(1, 0);
    let keys: [&[u8]; 14] = [
        b"",
        b"foo",
        b"123456789",
        b"{user1000}.following",
        b"{user1000}.followers",
        b"foo{}{bar}",
        b"foo{{bar}}zap",
        b"foo{bar}{zap}",
        b"{}",
        b"{",
        b"}{a}",
        b"a{b",
        b"\xff\xfe{\xff}\x00",
        b"\xff{}\xff",
    ];
    let mut con = cluster.master_conn(0);
    for key in keys {
        let server: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut con)
            .unwrap();
        assert_eq!(RedisCluster::slot(key), server, "key {key:?}");
    }
    // Tags put keys together, and only tags do.
    assert_eq!(
        RedisCluster::slot(b"{user1000}.following"),
        RedisCluster::slot(b"{user1000}.followers")
    );
    assert_ne!(
        RedisCluster::slot(b"foo{}{bar}"),
        RedisCluster::slot(b"bar")
    );
}

#[test]
fn one_master_forms_and_serves_every_slot() {
    let cluster = RedisCluster::start(1, 0);
    assert!(cluster.is_ok());
    let port = cluster.master_port(0);
    assert_eq!(cluster.url(), format!("redis+cluster://127.0.0.1:{port}"));
    for key in [&b"a"[..], b"b", b"{x}y", b"\xff"] {
        assert_eq!(cluster.master_of(key), 0);
        set(&mut cluster.conn_master_of(key), key, b"v").unwrap();
        assert_eq!(cluster.get(key).as_deref(), Some(&b"v"[..]));
    }
    assert_eq!(cluster.get(b"absent"), None);
    assert_eq!(cluster.keys_everywhere().len(), 4);
    cluster.flushall();
    assert!(cluster.keys_everywhere().is_empty());
}

#[test]
fn three_masters_own_distinct_ranges_and_refuse_the_others_keys() {
    let cluster = RedisCluster::start(3, 0);
    assert!(cluster.is_ok());
    let ports: BTreeSet<u16> = (0..3).map(|i| cluster.master_port(i)).collect();
    assert_eq!(ports.len(), 3);
    let url = cluster.url();
    for port in &ports {
        assert!(url.contains(&format!("127.0.0.1:{port}")), "{url}");
    }
    let keys = keys_on_distinct_masters(&cluster, "k");
    assert_eq!(keys.len(), 3, "keys on three masters: {keys:?}");
    for (key, master) in &keys {
        // The ranges are contiguous thirds, master 0 first.
        assert_eq!(usize::from(RedisCluster::slot(key)) * 3 / 16384, *master);
        let value = format!("value of {}", String::from_utf8_lossy(key));
        set(&mut cluster.conn_master_of(key), key, value.as_bytes()).unwrap();
        assert_eq!(cluster.get(key), Some(value.into_bytes()));
        // Another master does not serve it.
        let other = (master + 1) % 3;
        assert_eq!(code(get(&mut cluster.master_conn(other), key)), "MOVED");
    }
    let everywhere: BTreeSet<Vec<u8>> = cluster.keys_everywhere().into_iter().collect();
    let written: BTreeSet<Vec<u8>> = keys.into_iter().map(|(k, _)| k).collect();
    assert_eq!(everywhere, written);
}

#[test]
fn a_migrated_slot_takes_its_keys_and_every_master_sees_it() {
    let cluster = RedisCluster::start(3, 0);
    let key = b"{moving}key".as_slice();
    let sibling = b"{moving}sibling".as_slice();
    let from = cluster.master_of(key);
    let to = (from + 1) % 3;
    set(&mut cluster.conn_master_of(key), key, b"1").unwrap();
    set(&mut cluster.conn_master_of(sibling), sibling, b"2").unwrap();
    assert_eq!(cluster.owners_seen(key), vec![Some(from); 3]);

    cluster.migrate_slot(key, to);

    assert_eq!(cluster.master_of(key), to);
    assert_eq!(cluster.owners_seen(key), vec![Some(to); 3]);
    assert_eq!(
        get(&mut cluster.master_conn(to), key).unwrap().as_deref(),
        Some(&b"1"[..])
    );
    assert_eq!(
        get(&mut cluster.master_conn(to), sibling)
            .unwrap()
            .as_deref(),
        Some(&b"2"[..])
    );
    assert_eq!(code(get(&mut cluster.master_conn(from), key)), "MOVED");
    assert_eq!(cluster.keys_everywhere().len(), 2, "moved, not copied");
    // Other slots stayed where they were.
    let keys = keys_on_distinct_masters(&cluster, "still");
    assert_eq!(keys.len(), 3);
    assert!(cluster.is_ok());
}

#[test]
fn a_half_migrated_slot_redirects_new_keys_with_ask() {
    let cluster = RedisCluster::start(3, 0);
    let old = b"{half}old".as_slice();
    let new = b"{half}new".as_slice();
    let from = cluster.master_of(old);
    let to = (from + 2) % 3;
    set(&mut cluster.conn_master_of(old), old, b"old").unwrap();

    let migration = cluster.begin_migration(old, to);
    assert_eq!(migration.slot(), RedisCluster::slot(new));
    // The source keeps serving what it holds and sends the rest on.
    assert_eq!(cluster.master_of(old), from, "ownership moves at the end");
    assert_eq!(cluster.get(old).as_deref(), Some(&b"old"[..]));
    assert_eq!(
        code(set(&mut cluster.master_conn(from), new, b"new")),
        "ASK"
    );
    // The target takes it after ASKING, and only then.
    let mut target = cluster.master_conn(to);
    assert_eq!(code(set(&mut target, new, b"new")), "MOVED");
    redis::cmd("ASKING").query::<()>(&mut target).unwrap();
    set(&mut target, new, b"new").unwrap();
    assert_eq!(
        cluster.get(new).as_deref(),
        Some(&b"new"[..]),
        "get follows ASK"
    );
    assert_eq!(migration.move_keys(), 1);
    assert_eq!(code(get(&mut cluster.master_conn(from), old)), "ASK");

    migration.finish();
    assert_eq!(cluster.master_of(new), to);
    assert_eq!(cluster.get(old).as_deref(), Some(&b"old"[..]));
    assert_eq!(cluster.get(new).as_deref(), Some(&b"new"[..]));
    assert_eq!(cluster.keys_everywhere().len(), 2);
}

/// `WAIT 1 1000` until it says the one replica has the write (at most
/// 30 s, for a loaded machine).
fn replicated(con: &mut Connection) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let acked: i64 = redis::cmd("WAIT").arg(1).arg(1000).query(con).unwrap();
        if acked == 1 {
            return;
        }
        assert!(Instant::now() < deadline, "the replica never acknowledged");
    }
}

#[test]
fn a_killed_master_is_replaced_by_its_replica_with_acknowledged_writes() {
    let mut cluster = RedisCluster::start(2, 1);
    let key = b"{failover}key".as_slice();
    let master = cluster.master_of(key);
    let (old_port, replica) = (cluster.master_port(master), cluster.replica_ports(master));
    assert_eq!(replica.len(), 1);
    let mut con = cluster.conn_master_of(key);
    set(&mut con, key, b"acknowledged").unwrap();
    replicated(&mut con);
    drop(con);

    cluster.kill_master(master);
    cluster.failover(master);

    assert_eq!(cluster.master_of(key), master, "the shard keeps its number");
    assert_eq!(
        cluster.master_port(master),
        replica[0],
        "the replica is its master now"
    );
    assert_eq!(cluster.replica_ports(master), [old_port]);
    assert_eq!(cluster.owners_seen(key)[1 - master], Some(master));
    assert_eq!(cluster.get(key).as_deref(), Some(&b"acknowledged"[..]));
    assert!(cluster.url().contains(&format!(":{}", replica[0])));
    assert!(cluster.is_ok());
    // The promoted master takes writes.
    set(&mut cluster.conn_master_of(key), key, b"after").unwrap();
    assert_eq!(cluster.get(key).as_deref(), Some(&b"after"[..]));
}

#[test]
fn a_paused_master_replaced_then_resumed_becomes_a_replica() {
    let mut cluster = RedisCluster::start(2, 1);
    let key = b"{pause}key".as_slice();
    let master = cluster.master_of(key);
    let old_port = cluster.master_port(master);
    let mut con = cluster.conn_master_of(key);
    set(&mut con, key, b"v").unwrap();
    replicated(&mut con);
    drop(con);

    cluster.pause_master(master);
    cluster.failover(master);
    assert_ne!(cluster.master_port(master), old_port);
    assert_eq!(cluster.get(key).as_deref(), Some(&b"v"[..]));

    cluster.resume_master(master);
    // It learns that it was replaced and follows the new master.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut old = redis::Client::open(format!("redis://127.0.0.1:{old_port}/"))
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap();
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut old)
            .unwrap();
        if info.contains("role:slave") && info.contains("master_link_status:up") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the old master stays one: {info}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    cluster.wait_ok();
    assert_eq!(cluster.master_of(key), master);
    assert_eq!(cluster.get(key).as_deref(), Some(&b"v"[..]));
    assert_eq!(cluster.keys_everywhere(), [key.to_vec()]);
}

#[test]
fn five_clusters_of_three_masters_start_in_seconds() {
    let started = Instant::now();
    let clusters = RedisClusters::start(5, 3, 0);
    let took = started.elapsed();
    println!(
        "5 clusters x 3 masters formed in {:.2} s",
        took.as_secs_f64()
    );
    assert_eq!(clusters.len(), 5);
    let urls = clusters.urls();
    let mut ports = BTreeSet::new();
    for (i, url) in urls.iter().enumerate() {
        let seeds = url.strip_prefix("redis+cluster://").expect(url);
        assert_eq!(seeds.split(',').count(), 3, "{url}");
        ports.extend((0..3).map(|m| clusters[i].master_port(m)));
    }
    assert_eq!(ports.len(), 15, "fifteen distinct processes");
    for cluster in clusters.iter() {
        assert!(cluster.is_ok());
        let keys = keys_on_distinct_masters(cluster, "five");
        assert_eq!(keys.len(), 3);
        for (key, _) in &keys {
            set(&mut cluster.conn_master_of(key), key, b"x").unwrap();
            assert_eq!(cluster.get(key).as_deref(), Some(&b"x"[..]));
        }
    }
    // Generous: the masters alone wait 2 s before they call the cluster ok.
    assert!(took < Duration::from_secs(60), "{took:?}");
}
