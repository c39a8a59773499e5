//! The harness's nodes and its helpers against real `redis-server`
//! processes: a node pauses, resumes, dies and restarts empty on its port;
//! the raw key checks read what was written; an ACL user the helper adds
//! works within its rule and nowhere else; and the names in
//! `redlock_harness::keys` are those of the keys and channels the library
//! writes.

use std::time::{Duration, Instant};

use redlock_harness::{Cluster, keys, raw, resource};
use redlock_quorum::Redlock;

const TTL: Duration = Duration::from_secs(10);

#[test]
fn a_node_pauses_resumes_dies_and_restarts_empty_on_its_port() {
    let mut cluster = Cluster::start(1);
    let (url, port) = (cluster.urls()[0].clone(), cluster.node(0).port());
    cluster.plant(&[0], "k", "v", TTL);
    assert_eq!(cluster.value_on(0, "k").as_deref(), Some("v"));

    cluster.node(0).pause();
    let t = Instant::now();
    assert_eq!(cluster.value_on(0, "k"), None, "a paused node answers");
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    cluster.node(0).resume();
    assert_eq!(cluster.value_on(0, "k").as_deref(), Some("v"));

    cluster.node(0).kill();
    assert!(!cluster.node(0).is_running());
    assert_eq!(cluster.value_on(0, "k"), None);
    cluster.node(0).restart();
    assert!(cluster.node(0).is_running());
    assert_eq!(cluster.node(0).port(), port);
    assert_eq!(cluster.urls()[0], url);
    assert!(cluster.nowhere("k"), "restarted empty");
}

#[test]
fn raw_checks_read_what_was_written_on_each_node() {
    let cluster = Cluster::start(3);
    let key = resource("raw");
    assert!(cluster.nowhere(&key));
    assert_eq!(cluster.pttls(&key), vec![-2; 3]);

    cluster.plant(&[0, 2], &key, "v", TTL);
    assert!(cluster.exists_on(0, &key) && !cluster.exists_on(1, &key));
    assert!(!cluster.nowhere(&key));
    assert!(raw::exists(&cluster.urls()[2], &key));
    assert_eq!(cluster.get_on(2, &key).as_deref(), Some("v"));
    assert_eq!(cluster.get_on(1, &key), None);
    let pttls = cluster.pttls(&key);
    assert_eq!(pttls[1], -2);
    for i in [0, 2] {
        assert!(pttls[i] > 0 && pttls[i] <= 10_000, "{pttls:?}");
    }

    // bytes keys, without expiry, and a hash
    let counter = keys::counter("raw-test:");
    let _: () = redis::cmd("SET")
        .arg(&counter)
        .arg("7")
        .query(&mut cluster.conn(1))
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(keys::waiters(&key))
        .arg("a")
        .arg(1)
        .arg("b")
        .arg(2)
        .query(&mut cluster.conn(1))
        .unwrap();
    assert_eq!(cluster.pttl_on(1, &counter), -1);
    assert_eq!(cluster.get_on(1, &counter).as_deref(), Some("7"));
    assert_eq!(cluster.hlen_on(1, keys::waiters(&key)), 2);
    assert_eq!(cluster.hlen_on(0, keys::waiters(&key)), 0);
    let mut on_1 = cluster.keys_on(1);
    on_1.sort();
    let mut want = vec![counter, keys::waiters(&key)];
    want.sort();
    assert_eq!(on_1, want);
    let all = cluster.all_keys();
    assert_eq!(all.iter().map(Vec::len).collect::<Vec<_>>(), vec![1, 2, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_works_within_its_rule_and_nowhere_else() {
    let cluster = Cluster::start(3);
    let urls = cluster.acl_user(
        "tester",
        &["on", ">tester-pass", "resetkeys", "~mine:*", "+@all"],
    );
    assert_eq!(urls.len(), 3);
    for (url, node) in urls.iter().zip(cluster.urls()) {
        assert!(
            url.starts_with("redis://tester:tester-pass@127.0.0.1:"),
            "{url}"
        );
        assert!(url.ends_with(node.trim_start_matches("redis://")), "{url}");
        let mut con = raw::conn(url);
        let whoami: String = redis::cmd("ACL").arg("WHOAMI").query(&mut con).unwrap();
        assert_eq!(whoami, "tester");
        let _: () = redis::cmd("SET")
            .arg("mine:k")
            .arg("1")
            .query(&mut con)
            .unwrap();
        let other: redis::RedisResult<()> =
            redis::cmd("SET").arg("theirs:k").arg("1").query(&mut con);
        assert!(other.is_err(), "a key outside the rule was written");
    }
    assert!(!cluster.nowhere("mine:k") && cluster.nowhere("theirs:k"));
}

/// The fencing counter and the generation marker under a key prefix, the
/// waiting hash and the release channel of a key while a manager waits for
/// it, and the hand-off marker its release leaves: each where
/// `redlock_harness::keys` says, read back with raw commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_layout_is_the_one_the_library_writes() {
    let cluster = Cluster::start(3);
    let prefix = format!("{}:", resource("layout"));
    let build = || -> Redlock { cluster.builder().key_prefix(&prefix).build().unwrap() };
    let (holder, waiter) = (build(), build());
    let name = "job";
    let key = format!("{prefix}{name}");

    let lock = holder.try_lock(name, TTL).await.unwrap();
    // `try_lock` returns at the quorum: the third node's `SET` may still
    // be on its way.
    assert!(
        cluster.eventually(Duration::from_secs(5), |c| c.count(&key, lock.token()) == 3),
        "the lock key: {:?}",
        cluster.values(&key)
    );
    let token = holder.fencing_token(&lock).await.unwrap();
    assert!(cluster.eventually(Duration::from_secs(5), |c| {
        (0..3).all(|i| {
            c.get_on(i, keys::counter(&prefix))
                .is_some_and(|v| v.split(':').next() == Some(&token.to_string()))
                && c.exists_on(i, keys::generation(&prefix))
        })
    }));
    assert!(cluster.nowhere(keys::legacy_counter(&key)));

    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.lock_within(name, TTL, Duration::from_secs(30)).await }
    });
    let subscribed = cluster.eventually(Duration::from_secs(10), |c| {
        (0..3).all(|i| {
            let (_, n): (Vec<u8>, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(keys::release_channel(&key))
                .query(&mut c.conn(i))
                .unwrap();
            n == 1 && c.hlen_on(i, keys::waiters(&key)) == 1
        })
    });
    assert!(
        subscribed,
        "the waiter subscribed and registered everywhere"
    );
    holder.unlock(&lock).await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiter got the lock")
        .unwrap()
        .unwrap();
    let handed = (0..3)
        .filter(|&i| cluster.exists_on(i, keys::handoff(&key)))
        .count();
    assert!(
        handed >= 2,
        "the release named a successor on a quorum: {handed}"
    );
    waiter.unlock(&next).await.unwrap();
}
