//! ACL users: a lock user that may only touch keys under a prefix and run
//! the commands the crate needs (the minimal rule the README documents) can
//! lock, extend, fence, verify and unlock; outside its prefix it gets a typed
//! error at once and leaves nothing behind.

use std::time::Duration;

use redlock_harness::{Cluster, resource};
use redlock_quorum::{Error, NodeError, Redlock};

const TTL: Duration = Duration::from_secs(10);

/// The README's minimal rule for a lock user whose keys start with `app:`
/// (without `+info` and the pub/sub rights, which are optional: waiting
/// then falls back to the timed retry).
const RULE: &[&str] = &[
    "on",
    ">locker-pass",
    "resetkeys",
    "~app:*",
    "resetchannels",
    "-@all",
    "+set",
    "+get",
    "+del",
    "+pexpire",
    "+time",
    "+eval",
    "+evalsha",
    "+script|load",
];

fn cluster_with_lock_user() -> (Cluster, Vec<String>) {
    let cluster = Cluster::start(3);
    let urls = cluster.acl_user("locker", RULE);
    (cluster, urls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_limited_to_a_prefix_can_do_everything_under_it() {
    let (cluster, urls) = cluster_with_lock_user();
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .key_prefix("app:")
        .node_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let res = resource("acl");
    let lock = redlock.lock(&res, TTL).await.unwrap();
    let lock = redlock.extend(&lock, TTL).await.unwrap();
    assert_eq!(redlock.fencing_token(&lock).await.unwrap(), 1);
    assert!(redlock.verify(&lock).await.unwrap());
    assert_eq!(redlock.unlock(&lock).await.unwrap(), 3);
    // a renewing guard too
    let guard = redlock
        .acquire(&res, Duration::from_millis(300))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(guard.is_held() && guard.renewals() > 0);
    guard.release().await.unwrap();
    assert_eq!(cluster.values(&format!("app:{res}")), vec![None; 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_its_prefix_the_user_gets_a_typed_error_and_leaves_nothing() {
    let (cluster, urls) = cluster_with_lock_user();
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let res = resource("acl-outside");
    let started = std::time::Instant::now();
    let err = redlock.lock(&res, TTL).await.expect_err("no permission");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "NOPERM is not retried"
    );
    match &err {
        Error::Redis { failures, .. } => {
            assert_eq!(failures.len(), 3);
            assert!(
                failures
                    .iter()
                    .all(|f| matches!(&f.cause, NodeError::Reply(e) if e.code() == Some("NOPERM"))),
                "{err}"
            );
        }
        other => panic!("expected Error::Redis, got {other}"),
    }
    assert_eq!(cluster.values(&res), vec![None; 3]);
}

/// Whether the server has a native conditional delete (Valkey 9.0+ has
/// `DELIFEQ`, Redis 8.4+ has `DELEX … IFEQ`).
fn has_native_release(cluster: &Cluster) -> bool {
    cluster.has_command("DELIFEQ") || cluster.has_command("DELEX")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_scripts_releases_with_the_servers_native_delete() {
    // Scripting denied by the ACL. Acquisition is a plain SET; the release
    // falls back to DELIFEQ (Valkey 9.0+) or DELEX IFEQ (Redis 8.4+) where
    // the node has it, and is a clear NOPERM error where it has not.
    let cluster = Cluster::start(3);
    let rule: Vec<&str> = RULE
        .iter()
        .copied()
        .filter(|c| !c.starts_with("+eval") && !c.starts_with("+script"))
        .chain(["+delifeq", "+delex", "+info"])
        .collect();
    // A rule naming an unknown command is refused: name only those the
    // server has.
    let ok_rule: Vec<&str> = rule
        .iter()
        .copied()
        .filter(|c| match *c {
            "+delifeq" => cluster.has_command("DELIFEQ"),
            "+delex" => cluster.has_command("DELEX"),
            _ => true,
        })
        .collect();
    let urls = cluster.acl_user("noscripts", &ok_rule);
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .key_prefix("app:")
        .node_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let res = resource("acl-native");
    let key = format!("app:{res}");
    if redlock_harness::raw::before_redis_7(&cluster.urls()[0]) {
        // `SET … NX … GET` came in 7.0: older servers are sent a script,
        // which this user may not run. A clear error, nothing left behind.
        let err = redlock.lock(&res, TTL).await.unwrap_err();
        assert!(
            err.to_string().to_ascii_lowercase().contains("noperm"),
            "{err}"
        );
        assert_eq!(cluster.values(&key), vec![None; 3]);
        println!("a server before Redis 7.0 needs scripts to acquire: the NOPERM error is shown");
        return;
    }
    let lock = redlock.lock(&res, TTL).await.unwrap();
    let released = redlock.unlock(&lock).await;
    if has_native_release(&cluster) {
        assert_eq!(released.unwrap(), 3, "released natively on every node");
        assert_eq!(cluster.values(&key), vec![None; 3]);
        // The native delete checks the token too: another holder's key is
        // left alone.
        cluster.plant(&[0, 1, 2], &key, "other-holder", TTL);
        let err = redlock.unlock(&lock).await.unwrap_err();
        assert!(matches!(err, Error::NotHeld { .. }), "{err}");
        assert_eq!(cluster.count(&key, "other-holder"), 3);
    } else {
        let err = released.unwrap_err();
        assert!(
            err.to_string().to_ascii_lowercase().contains("noperm"),
            "{err}"
        );
        println!("no native conditional delete on this server: the NOPERM error is shown");
    }
}

/// The least-privilege rule of docs/operations.md, read from the page:
/// locks, waiting and releases under it leave no denial in any node's
/// `ACL LOG` (the unlock script's `PUBSUB NUMSUB` and `PUBLISH` included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_rule_allows_everything_the_crate_sends() {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .expect("docs/operations.md");
    let line = page
        .lines()
        .find(|l| l.starts_with("ACL SETUSER locker "))
        .expect("the documented rule");
    let rule: Vec<&str> = line
        .split_whitespace()
        .skip(3)
        .filter(|w| !w.starts_with('>'))
        .collect();
    let mut rule = rule;
    rule.insert(0, ">pw");
    let cluster = Cluster::start(3);
    // docs/operations.md: servers that know `CLIENT SETINFO` (which redis-rs
    // sends when it connects) or check it against ACLs before knowing it
    // (Redis before 7.0) need `+client|setinfo`; Redis 7.0 refuses that name.
    let knows_setinfo = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("probe")
        .arg("+client|setinfo")
        .query::<()>(&mut cluster.conn(0))
        .is_ok();
    if knows_setinfo {
        rule.push("+client|setinfo");
    }
    for i in 0..3 {
        let _: () = redis::cmd("ACL")
            .arg("LOG")
            .arg("RESET")
            .query(&mut cluster.conn(i))
            .unwrap();
    }
    let urls = cluster.acl_user("locker", &rule);
    let build = || {
        Redlock::builder(urls.iter().map(String::as_str))
            .key_prefix("app:")
            .build()
            .unwrap()
    };
    let (holder, waiter) = (build(), build());
    let res = resource("documented");
    let lock = holder.lock(&res, TTL).await.unwrap();
    let waiting = {
        let (waiter, res) = (waiter.clone(), res.clone());
        tokio::spawn(async move { waiter.lock_within(&res, TTL, Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.unlock(&lock).await.unwrap();
    let lock = waiting.await.unwrap().unwrap();
    waiter.unlock(&lock).await.unwrap();
    for _ in 0..5 {
        let lock = holder.try_lock(&res, TTL).await.unwrap();
        holder.unlock(&lock).await.unwrap();
    }
    for i in 0..3 {
        let log: Vec<redis::Value> = redis::cmd("ACL")
            .arg("LOG")
            .query(&mut cluster.conn(i))
            .unwrap();
        assert!(
            log.is_empty(),
            "node {i}: denials under the documented rule: {log:?}"
        );
    }
}
