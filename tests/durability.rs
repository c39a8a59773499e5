//! Acknowledged durability: with `Durability::Disk`, a node's
//! agreement counts only once `WAITAOF` confirmed the write on its disk.
//! On servers with `WAITAOF` (Redis 7.2+, Valkey; the suite runs on Valkey
//! 9.1 in CI) the positive path is tested; everywhere, a node that cannot
//! confirm (AOF off, or no `WAITAOF`) is a clear configuration error that
//! leaves no key behind.

use std::time::Duration;

use redlock_harness::{Cluster, resource};
use redlock_quorum::{Durability, Error, NodeError};

const TTL: Duration = Duration::from_secs(10);
const DISK: Durability = Durability::Disk {
    timeout: Duration::from_millis(200),
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_cannot_confirm_is_a_configuration_error_and_keeps_nothing() {
    // AOF off (the harness default): WAITAOF is refused, or unknown.
    let cluster = Cluster::start(3);
    let redlock = cluster.builder().durability(DISK).build().unwrap();
    let res = resource("durable-off");
    let err = redlock.try_lock(&res, TTL).await.unwrap_err();
    let Error::Redis { failures, .. } = &err else {
        panic!("expected a configuration error, got {err}");
    };
    assert_eq!(failures.len(), 3, "{err}");
    assert!(
        failures
            .iter()
            .all(|f| matches!(f.cause, NodeError::Durability(_))),
        "{err}"
    );
    assert!(err.to_string().contains("WAITAOF"), "{err}");
    // The SETs ran before the confirmation failed: they are released.
    assert!(
        cluster.eventually(Duration::from_secs(5), |c| c
            .values(&res)
            .iter()
            .all(Option::is_none)),
        "left behind: {:?}",
        cluster.values(&res)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_on_aof_nodes_count_only_confirmed_writes() {
    let mut cluster = Cluster::start_with(3, &["--appendonly", "yes", "--appendfsync", "always"]);
    if !cluster.has_command("WAITAOF") {
        println!("this server has no WAITAOF (Redis < 7.2): positive path not run here");
        return;
    }
    let redlock = cluster.builder().durability(DISK).build().unwrap();
    let res = resource("durable-on");
    let lock = redlock.lock(&res, TTL).await.unwrap();
    // The extension is a script: after SCRIPT FLUSH the pipelined EVALSHA
    // answers NOSCRIPT, and the script is loaded and the pipeline sent again.
    for node in 0..3 {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut cluster.conn(node))
            .unwrap();
    }
    let lock = redlock.extend(&lock, TTL).await.unwrap();
    assert_eq!(redlock.fencing_token(&lock).await.unwrap(), 1);
    assert_eq!(redlock.unlock(&lock).await.unwrap(), 3);

    // One node with AOF switched off cannot confirm: it does not count,
    // and the other two still make the quorum.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("appendonly")
        .arg("no")
        .query(&mut cluster.conn(2))
        .unwrap();
    let lock = redlock.lock(&res, TTL).await.unwrap();
    assert!(redlock.verify(&lock).await.unwrap());
    // ... and a second node without AOF leaves no quorum: a clear error.
    redlock.unlock(&lock).await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("appendonly")
        .arg("no")
        .query(&mut cluster.conn(1))
        .unwrap();
    let err = redlock.try_lock(&res, TTL).await.unwrap_err();
    assert!(matches!(err, Error::Redis { .. }), "{err}");
    assert!(cluster.eventually(Duration::from_secs(5), |c| {
        c.values(&res).iter().all(Option::is_none)
    }));
    let _ = cluster.node(0);
}

#[test]
fn the_confirmation_must_fit_in_the_node_timeout() {
    let urls = [
        "redis://127.0.0.1:1/",
        "redis://127.0.0.1:2/",
        "redis://127.0.0.1:3/",
    ];
    for timeout in [
        Duration::ZERO,
        Duration::from_millis(50),
        Duration::from_secs(1),
    ] {
        let err = redlock_quorum::Redlock::builder(urls)
            .durability(Durability::Disk { timeout })
            .build()
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidSetting {
                    setting: "durability",
                    ..
                }
            ),
            "{timeout:?}: {err}"
        );
    }
    assert!(
        redlock_quorum::Redlock::builder(urls)
            .durability(Durability::Replicas {
                replicas: 1,
                timeout: Duration::from_millis(20),
            })
            .build()
            .is_ok()
    );
}
