//! Bad input and replies that make no sense for a lock: each a typed error,
//! no panic, and no key of ours left behind.

use std::time::Duration;

use redis::Commands;
use redlock_harness::raw::exists;
use redlock_harness::{Cluster, resource};
use redlock_quorum::{Error, MAX_TTL, Redlock};

const TTL: Duration = Duration::from_secs(10);

#[test]
fn an_empty_node_list_is_rejected() {
    let err = Redlock::new(Vec::<String>::new()).unwrap_err();
    assert!(matches!(err, Error::EmptyNodeList), "{err}");
}

#[test]
fn an_unparsable_url_names_its_position() {
    let err = Redlock::new([
        "redis://127.0.0.1:7001/",
        "not a url",
        "redis://127.0.0.1:7003/",
    ])
    .unwrap_err();
    assert!(
        matches!(err, Error::InvalidNodeAddress { index: 1, .. }),
        "{err}"
    );
    let err = Redlock::new(["http://127.0.0.1:7001/"]).unwrap_err();
    assert!(
        matches!(err, Error::InvalidNodeAddress { index: 0, .. }),
        "{err}"
    );
}

#[test]
fn a_bad_url_is_echoed_without_its_password_and_says_what_is_wrong() {
    for (url, says) in [
        ("not a url", "no scheme"),
        ("redis://:hunter2@127.0.0.1:99999/", "port `99999`"),
        ("redis://:hunter2@127.0.0.1:7001/db0", "database `db0`"),
        ("http://127.0.0.1:7001/", "unknown scheme `http`"),
    ]
    .into_iter()
    // without the `tls` feature, a rediss:// URL is refused and says why
    .chain(
        (!cfg!(feature = "tls"))
            .then_some(("rediss://:hunter2@cache.example:6380/", "feature `tls`")),
    ) {
        let err = Redlock::new([url]).unwrap_err().to_string();
        assert!(err.contains(says), "{url}: {err}");
        assert!(!err.contains("hunter2"), "password shown: {err}");
        assert!(err.contains("node 0 ("), "entry echoed: {err}");
    }
}

#[test]
fn a_duplicate_node_is_rejected() {
    let err = Redlock::new([
        "redis://127.0.0.1:7001/",
        "redis://127.0.0.1:7002/",
        "redis://127.0.0.1:7001",
    ])
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DuplicateNode {
                index: 2,
                first: 0,
                ..
            }
        ),
        "{err}"
    );
    // the same server in another database is another keyspace, but still one
    // failure domain: refused, naming both entries
    let err = Redlock::new(["redis://127.0.0.1:7001/0", "redis://127.0.0.1:7001/1"]).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::DuplicateNode {
                index: 1,
                first: 0,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("127.0.0.1:7001/1"), "{err}");
}

#[test]
fn settings_out_of_range_are_named() {
    let nodes = ["redis://127.0.0.1:7001/"];
    for (builder, setting) in [
        (
            Redlock::builder(nodes).node_timeout(Duration::ZERO),
            "node_timeout",
        ),
        (
            Redlock::builder(nodes).drift_factor(f64::NAN),
            "drift_factor",
        ),
        (Redlock::builder(nodes).drift_factor(-0.1), "drift_factor"),
        (Redlock::builder(nodes).drift_factor(1.0), "drift_factor"),
    ] {
        match builder.build() {
            Err(Error::InvalidSetting { setting: s, .. }) => assert_eq!(s, setting),
            other => panic!("expected InvalidSetting({setting}), got {other:?}"),
        }
    }
}

#[test]
fn build_needs_no_runtime_and_no_server() {
    // nothing listens on this port; build() still succeeds
    let port = redlock_harness::server::free_port();
    let redlock = Redlock::new([format!("redis://127.0.0.1:{port}/")]).unwrap();
    assert_eq!((redlock.node_count(), redlock.quorum()), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_are_typed_errors_before_anything_is_sent() {
    let cluster = Cluster::shared(5);
    let redlock = cluster.redlock();
    let res = resource("args");
    type Case<'a> = (&'a str, Duration, fn(&Error) -> bool);
    let cases: Vec<Case<'_>> = vec![
        ("", TTL, |e| matches!(e, Error::EmptyResource)),
        (&res, Duration::ZERO, |e| matches!(e, Error::ZeroTtl)),
        (&res, Duration::from_millis(1), |e| {
            matches!(e, Error::TtlNotAboveDrift { .. })
        }),
        (&res, Duration::from_millis(2), |e| {
            matches!(e, Error::TtlNotAboveDrift { .. })
        }),
        (&res, MAX_TTL + Duration::from_millis(1), |e| {
            matches!(e, Error::TtlTooLarge { .. })
        }),
        (&res, Duration::MAX, |e| {
            matches!(e, Error::TtlTooLarge { .. })
        }),
    ];
    for (resource, ttl, expected) in cases {
        let err = redlock.lock(resource, ttl).await.expect_err("must fail");
        assert!(expected(&err), "{resource:?} {ttl:?}: {err}");
        let err = redlock
            .try_lock(resource, ttl)
            .await
            .expect_err("must fail");
        assert!(expected(&err), "{resource:?} {ttl:?}: {err}");
    }
    assert_eq!(cluster.values(&res), vec![None; 5]);

    // extend checks its ttl too
    let lock = redlock.try_lock(&res, TTL).await.unwrap();
    assert!(matches!(
        redlock.extend(&lock, Duration::ZERO).await,
        Err(Error::ZeroTtl)
    ));
    assert!(matches!(
        redlock.extend(&lock, Duration::MAX).await,
        Err(Error::TtlTooLarge { .. })
    ));
    redlock.unlock(&lock).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_ttl_is_accepted_by_redis() {
    let cluster = Cluster::shared(5);
    let redlock = cluster.redlock();
    let res = resource("max-ttl");
    let lock = redlock
        .try_lock(&res, MAX_TTL)
        .await
        .expect("PX accepts MAX_TTL");
    redlock.unlock(&lock).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_on_a_majority_is_a_typed_error() {
    let cluster = Cluster::shared(5);
    let redlock = cluster.builder().retry_count(1).build().unwrap();
    let res = resource("wrongtype");
    for i in [0, 1, 2] {
        let _: () = cluster.conn(i).rpush(&res, "not a lock").unwrap();
    }
    // SET NX GET answers WRONGTYPE for an existing key of another type: a
    // typed error, at once (retrying cannot fix it)
    let err = redlock
        .lock(&res, TTL)
        .await
        .expect_err("a list is no lock");
    assert!(
        matches!(&err, Error::Redis { failures, .. } if failures.len() == 3),
        "{err}"
    );
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    let values: Vec<String> = (0..5)
        .map(|i| {
            redis::cmd("TYPE")
                .arg(&res)
                .query(&mut cluster.conn(i))
                .unwrap()
        })
        .collect();
    assert_eq!(
        values,
        ["list", "list", "list", "none", "none"],
        "nothing of ours left"
    );

    // A held lock whose key became a list on a majority: the scripts' GET
    // answers WRONGTYPE, which is a Redis error, not "not held".
    let res = resource("wrongtype-held");
    let lock = redlock.try_lock(&res, TTL).await.unwrap();
    // try_lock returned at the quorum: wait for every node's SET, or a late
    // one could land between the DEL and the RPUSH below
    assert!(
        cluster.eventually(Duration::from_secs(2), |c| c.count(&res, lock.token()) == 5),
        "{:?}",
        cluster.values(&res)
    );
    for i in [0, 1, 2] {
        let _: () = cluster.conn(i).del(&res).unwrap();
        let _: () = cluster.conn(i).rpush(&res, "not a lock").unwrap();
    }
    let err = redlock.extend(&lock, TTL).await.expect_err("wrong type");
    match &err {
        Error::Redis {
            failures, granted, ..
        } => {
            assert!(*granted <= 2);
            assert!(err.to_string().contains("WRONGTYPE"), "{err}");
            assert_eq!(failures.len(), 3);
        }
        other => panic!("expected Error::Redis, got {other}"),
    }
    // unlock releases the two nodes still ours, leaves the lists alone, and
    // says that a majority answered with errors
    let err = redlock
        .unlock(&lock)
        .await
        .expect_err("errors on a majority");
    assert!(matches!(err, Error::Redis { .. }), "{err}");
    for i in 0..5 {
        let t: String = redis::cmd("TYPE")
            .arg(&res)
            .query(&mut cluster.conn(i))
            .unwrap();
        assert_eq!(t, if i < 3 { "list" } else { "none" }, "node {i}");
    }
}

/// Checks that a manager over `urls` (one server named twice) is refused
/// with `DuplicateNode`, at build or at the first call, and that no key was
/// left anywhere in `check`.
async fn refused_as_duplicate(urls: &[String], check: &[String]) {
    let res = resource("dup");
    match Redlock::builder(urls.iter().map(String::as_str)).build() {
        Err(Error::DuplicateNode { .. }) => {}
        Err(e) => panic!("{urls:?}: build failed with {e}"),
        Ok(redlock) => {
            let r = redlock.try_lock(&res, TTL).await;
            assert!(
                matches!(r, Err(Error::DuplicateNode { .. })),
                "{urls:?}: try_lock gave {r:?}"
            );
        }
    }
    for url in check {
        assert!(!exists(url, &res), "key left at {url}");
    }
}

/// One server given by two host names counts once, not twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_under_two_host_names_is_a_duplicate() {
    let mut cluster = Cluster::start(2);
    let port = cluster.node(0).port();
    let third = cluster.urls()[1].clone();
    let urls = [
        format!("redis://127.0.0.1:{port}"),
        format!("redis://localhost:{port}"),
        third.clone(),
    ];
    refused_as_duplicate(&urls, &[urls[0].clone(), third]).await;
}

/// Two databases of one server are one node, not two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_databases_of_one_server_are_a_duplicate() {
    let mut cluster = Cluster::start(2);
    let port = cluster.node(0).port();
    let third = cluster.urls()[1].clone();
    let urls = [
        format!("redis://127.0.0.1:{port}/0"),
        format!("redis://127.0.0.1:{port}/1"),
        third,
    ];
    refused_as_duplicate(&urls, &urls).await;
}

/// The largest connect timeout the builder takes is used without an
/// overflow: a lock is taken, extended and released (a round of a request
/// that writes the keys works out until when it may send from it).
///
/// Catches `Instant + connect_timeout` unchecked (it panicked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_connect_timeout_does_not_overflow() {
    let cluster = Cluster::start(3);
    let redlock = cluster
        .builder()
        .connect_timeout(Duration::MAX)
        .build()
        .expect("valid");
    let name = resource("largest-connect-timeout");
    let lock = redlock
        .try_lock(&name, Duration::from_secs(5))
        .await
        .expect("granted");
    let lock = redlock
        .extend(&lock, Duration::from_secs(5))
        .await
        .expect("extended");
    assert_eq!(redlock.unlock(&lock).await.ok(), Some(3));
    assert!(cluster.nowhere(&name));
}

/// The largest node timeout the builder takes is used without an
/// overflow: a lock is taken and released (a round's deadline is checked).
///
/// Catches `Instant + node_timeout` unchecked in the round (it panicked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_node_timeout_does_not_overflow() {
    let cluster = Cluster::start(3);
    let redlock = cluster
        .builder()
        .node_timeout(Duration::MAX)
        .build()
        .expect("valid");
    let name = resource("largest-node-timeout");
    let lock = redlock
        .try_lock(&name, Duration::from_secs(5))
        .await
        .expect("granted");
    assert_eq!(redlock.unlock(&lock).await.ok(), Some(3));
    assert!(cluster.nowhere(&name));
}
