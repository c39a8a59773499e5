//! Locks on several resources at once, against real `redis-server` nodes:
//! all or nothing per node, the quorum rule over the set, exclusion across
//! overlapping sets and with single locks, partial conflicts, the limits,
//! the renewing guard, fencing, and node-redlock 5 on the same nodes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::RngExt;
use redlock_harness::checker::Checker;
use redlock_harness::node_redlock::{self, NodeClient};
use redlock_harness::{Cluster, keys, resource};
use redlock_quorum::{Error, MAX_RESOURCES};

const TTL: Duration = Duration::from_secs(10);

fn names(topic: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| resource(&format!("{topic}-{i}"))).collect()
}

fn refs(names: &[String]) -> Vec<&str> {
    names.iter().map(String::as_str).collect()
}

/// Every acquisition call takes one name or a set, in any of the forms of
/// `Resources`: the calls that had no set form before (`acquire_within`,
/// `with_lock`) hold every key of the set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acquisition_call_takes_a_set_in_any_form() {
    let cluster = Cluster::shared(5);
    let redlock = cluster.redlock();
    let set = names("grid", 2);
    let held_everywhere = |c: &Cluster, token: &str| set.iter().all(|k| c.count(k, token) == 5);

    let guard = redlock
        .acquire_within(set.clone(), TTL, Duration::from_secs(1))
        .await
        .expect("acquire_within a Vec<String>");
    let token = guard.lock().token().to_owned();
    assert!(cluster.eventually(Duration::from_secs(2), |c| held_everywhere(c, &token)));
    guard.release().await.expect("release");
    assert!(set.iter().all(|k| cluster.nowhere(k)));

    let seen = redlock
        .with_lock(&set, TTL, |watch| async move {
            (
                watch.lock().resources().len(),
                watch.lock().token().to_owned(),
            )
        })
        .await
        .expect("with_lock over &Vec<String>");
    assert_eq!(seen.0, 2);
    assert!(
        set.iter().all(|k| cluster.nowhere(k)),
        "released after the work"
    );

    let lock = redlock
        .try_lock(&set[..], TTL)
        .await
        .expect("try_lock over &[String]");
    // The same names again, as another form of set, are held.
    let busy = redlock
        .try_lock([set[1].as_str(), set[0].as_str()], TTL)
        .await
        .expect_err("held");
    assert!(busy.is_held_elsewhere() && busy.is_retryable(), "{busy}");
    redlock.unlock(&lock).await.expect("unlock");
    // A set of one name is that name's lock.
    let one = redlock
        .try_lock([set[0].as_str()], TTL)
        .await
        .expect("a set of one");
    assert!(matches!(
        redlock.try_lock(set[0].clone(), TTL).await,
        Err(Error::Conflict { .. })
    ));
    redlock.unlock(&one).await.expect("unlock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_is_held_extended_checked_and_released_as_one() {
    let cluster = Cluster::shared(5);
    let redlock = cluster.redlock();
    let set = names("set", 3);
    let lock = redlock.try_lock(&refs(&set), TTL).await.expect("lock");
    assert_eq!(lock.resources().collect::<Vec<_>>(), refs(&set));
    assert_eq!(lock.keys().collect::<Vec<_>>(), refs(&set));
    assert_eq!(lock.resources().len(), set.len());
    for name in &set {
        assert!(
            cluster.eventually(Duration::from_secs(2), |c| c.count(name, lock.token()) == 5),
            "every node holds every key"
        );
    }
    assert!(redlock.verify(&lock).await.expect("verify"));
    let extended = redlock.extend(&lock, TTL * 2).await.expect("extend");
    assert_eq!(extended.resources().count(), 3, "the set survives extend");
    assert!(extended.validity() > TTL);
    assert_eq!(redlock.unlock(&extended).await.expect("unlock"), 5);
    for name in &set {
        assert_eq!(cluster.values(name), vec![None; 5], "{name} released");
    }
    assert!(!redlock.verify(&lock).await.expect("verify"));
    assert!(matches!(
        redlock.unlock(&lock).await,
        Err(Error::NotHeld { resource }) if resource == set.join(", ")
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_heals_a_set_and_fails_as_a_whole_when_one_key_is_taken() {
    let cluster = Cluster::shared(5);
    let redlock = cluster.redlock();
    let (x, y) = (resource("heal-x"), resource("heal-y"));
    let lock = redlock.try_lock(&[&x, &y], TTL).await.expect("lock");
    assert!(cluster.eventually(Duration::from_secs(2), |c| c.count(&y, lock.token()) == 5));
    // The set lost on a minority (nodes restarted empty, say): the renewal
    // puts it back.
    for i in [0, 1] {
        let _: () = redis::cmd("DEL")
            .arg(&x)
            .arg(&y)
            .query(&mut cluster.conn(i))
            .unwrap();
    }
    let lock = redlock
        .extend(&lock, TTL)
        .await
        .expect("extend on a quorum");
    assert!(
        cluster.eventually(Duration::from_secs(2), |c| {
            c.count(&x, lock.token()) == 5 && c.count(&y, lock.token()) == 5
        }),
        "healed"
    );
    // Part of the set gone on a minority (y alone deleted: the set was
    // taken apart there): those nodes do not count and are left as they
    // are; the others extend.
    for i in [0, 1] {
        let _: () = redis::cmd("DEL")
            .arg(&y)
            .query(&mut cluster.conn(i))
            .unwrap();
    }
    let lock = redlock
        .extend(&lock, TTL)
        .await
        .expect("extend on the quorum that holds the whole set");
    assert!(cluster.eventually(Duration::from_secs(2), |c| c.count(&y, lock.token()) == 3));
    assert_eq!(cluster.count(&x, lock.token()), 5);
    // y taken by another holder on a majority: the set is not ours any
    // more, as a whole.
    for i in [0, 1, 2] {
        let _: () = redis::cmd("SET")
            .arg(&y)
            .arg("thief")
            .query(&mut cluster.conn(i))
            .unwrap();
    }
    assert!(!redlock.verify(&lock).await.expect("verify"));
    let err = redlock.extend(&lock, TTL).await.expect_err("not held");
    assert!(matches!(err, Error::NotHeld { .. }), "{err}");
    // The failed extension touched nothing: x is still ours where it was.
    assert_eq!(cluster.count(&x, lock.token()), 5);
    // Unlock deletes what still holds the token, and only that.
    assert_eq!(redlock.unlock(&lock).await.expect("unlock"), 5);
    assert_eq!(cluster.values(&x), vec![None; 5]);
    assert_eq!(cluster.count(&y, "thief"), 3);
    assert_eq!(cluster.count(&y, lock.token()), 0);
}

/// A failed extension of a set deletes no key that was ours before it.
/// Before, a set with one key missing on a node was "healed" there (every
/// key written again), and the failed extension then released every key
/// of those nodes: another manager that adopted the holder's token with a
/// set one name larger deleted the holder's whole valid lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_extension_of_a_set_deletes_no_key_that_was_ours() {
    let cluster = Cluster::shared(5);
    let holder = cluster.redlock();
    let other = cluster.redlock();
    let set = names("kept", 3);
    let extra = resource("kept-extra");
    let lock = holder.try_lock(&set, TTL).await.expect("lock");
    assert!(cluster.eventually(Duration::from_secs(2), |c| {
        set.iter().all(|k| c.count(k, lock.token()) == 5)
    }));
    // Adopted with a name the holder never locked.
    let mut larger = set.clone();
    larger.push(extra.clone());
    let adopted = other.adopt(&larger, lock.token()).expect("adopt");
    let err = other
        .extend(&adopted, Duration::from_secs(50))
        .await
        .expect_err("not the holder's set");
    assert!(matches!(err, Error::NotHeld { .. }), "{err}");
    for key in &set {
        assert_eq!(cluster.count(key, lock.token()), 5, "{key} kept");
        assert!(
            cluster.pttls(key).iter().all(|&t| t > 0 && t <= 10_000),
            "{key} keeps its ttl: {:?}",
            cluster.pttls(key)
        );
    }
    assert!(cluster.nowhere(&extra), "nothing set for the extra name");
    assert!(holder.verify(&lock).await.expect("verify"));
    // One key of the holder's set freed everywhere: its own failed
    // extension leaves the other keys as they were.
    for i in 0..5 {
        let _: () = redis::cmd("DEL")
            .arg(&set[2])
            .query(&mut cluster.conn(i))
            .unwrap();
    }
    let err = holder
        .extend(&lock, TTL)
        .await
        .expect_err("part of the set is free");
    assert!(matches!(err, Error::NotHeld { .. }), "{err}");
    assert_eq!(cluster.count(&set[0], lock.token()), 5);
    assert_eq!(cluster.count(&set[1], lock.token()), 5);
    assert!(cluster.nowhere(&set[2]));
    holder.unlock(&lock).await.expect("unlock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_set_acquisition_leaves_nothing_behind() {
    let cluster = Cluster::shared(5);
    let redlock = cluster.redlock();
    redlock_harness::warm(&redlock).await;
    let set = names("cancelled", 50);
    let names = refs(&set);
    for micros in [0, 100, 300, 1_000] {
        let attempt = redlock.try_lock(&names, TTL);
        if let Ok(Ok(lock)) = tokio::time::timeout(Duration::from_micros(micros), attempt).await {
            redlock.unlock(&lock).await.unwrap();
        }
        assert!(
            cluster.eventually(Duration::from_secs(3), |c| {
                [&set[0], &set[49]]
                    .iter()
                    .all(|n| c.values(n) == vec![None; 5])
            }),
            "keys left behind after a cancel at {micros} us"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_before_anything_is_sent() {
    let cluster = Cluster::shared(3);
    let redlock = cluster.redlock();
    let a = resource("bad");
    assert!(matches!(
        redlock.lock(&[] as &[&str], TTL).await,
        Err(Error::NoResources)
    ));
    assert!(matches!(
        redlock.lock(&[&a, "b", &a], TTL).await,
        Err(Error::DuplicateResource { resource }) if resource == a
    ));
    assert!(matches!(
        redlock.try_lock(&[&a, ""], TTL).await,
        Err(Error::EmptyResource)
    ));
    let many: Vec<String> = (0..=MAX_RESOURCES).map(|i| format!("{a}-{i}")).collect();
    assert!(matches!(
        redlock.try_lock(&refs(&many), TTL).await,
        Err(Error::TooManyResources { count, .. }) if count == MAX_RESOURCES + 1
    ));
    assert!(matches!(
        redlock.acquire(Vec::<String>::new(), TTL).await,
        Err(Error::NoResources)
    ));
    assert_eq!(cluster.values(&a), vec![None; 3], "nothing was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_lock_and_a_set_that_contains_it_exclude_each_other() {
    let cluster = Cluster::shared(5);
    let (a, b) = (cluster.redlock(), cluster.redlock());
    let (x, y) = (resource("single-x"), resource("single-y"));

    let single = a.try_lock(&x, TTL).await.expect("single");
    let err = b.try_lock(&[&y, &x], TTL).await.expect_err("refused");
    assert!(matches!(err, Error::Conflict { held: 3.., .. }), "{err}");
    assert_eq!(cluster.values(&y), vec![None; 5], "nothing left behind");
    a.unlock(&single).await.unwrap();

    let set = b.try_lock(&[&y, &x], TTL).await.expect("set");
    for name in [&x, &y] {
        let err = a.try_lock(name, TTL).await.expect_err("refused");
        assert!(matches!(err, Error::Conflict { .. }), "{err}");
    }
    b.unlock(&set).await.unwrap();
    let single = a.try_lock(&y, TTL).await.expect("free again");
    a.unlock(&single).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_on_a_minority_the_set_is_granted_and_leaves_nothing_behind() {
    let cluster = Cluster::shared(5);
    let redlock = cluster.redlock();
    let (x, y) = (resource("minority-x"), resource("minority-y"));
    cluster.plant(&[0, 1], &y, "someone-else", TTL);

    let lock = redlock.try_lock(&[&x, &y], TTL).await.expect("granted");
    // Nodes 0 and 1 set nothing, not even x: all or nothing per node.
    assert!(cluster.eventually(Duration::from_secs(2), |c| {
        c.values(&x)
            == [
                None,
                None,
                Some(lock.token().into()),
                Some(lock.token().into()),
                Some(lock.token().into()),
            ]
    }));
    assert_eq!(redlock.unlock(&lock).await.expect("unlock"), 3);
    assert_eq!(cluster.values(&x), vec![None; 5], "nothing left behind");
    let planted = Some("someone-else".to_owned());
    assert_eq!(
        cluster.values(&y),
        vec![planted.clone(), planted, None, None, None],
        "the other holder's keys untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_on_a_majority_the_set_is_refused_and_leaves_nothing_behind() {
    let cluster = Cluster::shared(5);
    let redlock = cluster.redlock();
    let (x, y, z) = (
        resource("majority-x"),
        resource("majority-y"),
        resource("majority-z"),
    );
    cluster.plant(&[1, 2, 4], &z, "someone-else", TTL);

    let err = redlock
        .try_lock(&[&x, &y, &z], TTL)
        .await
        .expect_err("refused");
    assert!(
        matches!(&err, Error::Conflict { held: 3, required: 3, resource, .. }
            if *resource == format!("{x}, {y}, {z}")),
        "{err}"
    );
    // Nodes 0 and 3 set the whole set; the failed attempt released it.
    for name in [&x, &y] {
        assert_eq!(cluster.values(name), vec![None; 5], "{name} left behind");
    }
    assert_eq!(cluster.count(&z, "someone-else"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_sets_exclude_each_other_without_deadlock() {
    const TASKS: usize = 12;
    const ROUNDS: usize = 25;
    let cluster = Cluster::shared(5);
    // Contention, not latency, is under test: see tests/acquire.rs.
    let redlock = cluster
        .builder()
        .node_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let (x, y, z) = (
        resource("overlap-x"),
        resource("overlap-y"),
        resource("overlap-z"),
    );
    let sets: Arc<[Vec<String>; 3]> = Arc::new([
        vec![x.clone(), y.clone()],
        vec![y.clone(), z.clone()],
        vec![x.clone()],
    ]);
    let checkers: Arc<[(String, Checker); 3]> = Arc::new([
        (x.clone(), Checker::default()),
        (y.clone(), Checker::default()),
        (z.clone(), Checker::default()),
    ]);
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (redlock, sets, checkers) = (redlock.clone(), sets.clone(), checkers.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let set = &sets[rand::rng().random_range(0..3)];
                let lock = loop {
                    match redlock.lock(&refs(set), Duration::from_secs(5)).await {
                        Ok(lock) => break lock,
                        Err(Error::Conflict { .. }) => continue,
                        Err(e) => panic!("task {t}: {e}"),
                    }
                };
                let granted = Instant::now();
                tokio::task::yield_now().await;
                let ended = Instant::now().min(lock.expires_at());
                for (name, checker) in checkers.iter() {
                    if set.contains(name) {
                        checker.record(&format!("task-{t}"), lock.token(), granted, ended);
                    }
                }
                redlock.unlock(&lock).await.expect("unlock");
            }
        }));
    }
    // A deadlock, or a set nobody can get, would hang here: fail instead.
    let bound = Duration::from_secs(90);
    let all = async {
        for task in tasks {
            task.await.expect("task panicked");
        }
    };
    tokio::time::timeout(bound, all)
        .await
        .unwrap_or_else(|_| panic!("not done within {bound:?}: a deadlock or starvation"));
    let mut windows = 0;
    for (name, checker) in checkers.iter() {
        let overlaps = checker.overlaps();
        assert!(overlaps.is_empty(), "{name}: {:?}", &overlaps[..1]);
        windows += checker.len();
    }
    assert!(windows >= TASKS * ROUNDS, "{windows} windows recorded");
    for name in [&x, &y, &z] {
        assert_eq!(cluster.values(name), vec![None; 5], "{name} leaked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_set_allowed_works() {
    assert_eq!(MAX_RESOURCES, 1_000);
    let cluster = Cluster::shared(3);
    let redlock = cluster.redlock();
    let set = names("thousand", MAX_RESOURCES);
    let started = Instant::now();
    let lock = redlock.try_lock(&refs(&set), TTL).await.expect("lock");
    let took = started.elapsed();
    assert!(redlock.verify(&lock).await.expect("verify"));
    let fence = redlock.fencing_token(&lock).await.expect("fence");
    assert!(fence >= 1);
    let lock = redlock.extend(&lock, TTL).await.expect("extend");
    assert_eq!(redlock.unlock(&lock).await.expect("unlock"), 3);
    for name in [&set[0], &set[499], &set[999]] {
        assert_eq!(cluster.values(name), vec![None; 3]);
    }
    eprintln!("{MAX_RESOURCES} resources locked in {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_renews_every_resource() {
    let cluster = Cluster::shared(3);
    let redlock = cluster.redlock();
    let set = names("guard", 2);
    let ttl = Duration::from_millis(600);
    let guard = redlock.acquire(&refs(&set), ttl).await.expect("guard");
    tokio::time::sleep(ttl * 3).await;
    assert!(guard.is_held(), "renewed past its first ttl");
    let token = guard.lock().token().to_owned();
    for name in &set {
        assert_eq!(cluster.count(name, &token), 3, "{name} kept");
    }
    guard.release().await.expect("release");
    for name in &set {
        assert_eq!(cluster.values(name), vec![None; 3], "{name} released");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_fences_above_every_resource_and_every_later_holder_above_it() {
    let cluster = Cluster::shared(3);
    let redlock = cluster.redlock();
    let (x, y) = (resource("fence-x"), resource("fence-y"));
    let mut on_y = 0;
    for _ in 0..3 {
        let lock = redlock.try_lock(&y, TTL).await.unwrap();
        on_y = redlock.fencing_token(&lock).await.unwrap();
        redlock.unlock(&lock).await.unwrap();
    }
    assert_eq!(on_y, 3);
    let set = redlock.try_lock(&[&x, &y], TTL).await.unwrap();
    let fenced = redlock.fencing_token(&set).await.unwrap();
    assert_eq!(fenced, 4, "above y's counter");
    redlock.unlock(&set).await.unwrap();
    let lock = redlock.try_lock(&x, TTL).await.unwrap();
    assert_eq!(
        redlock.fencing_token(&lock).await.unwrap(),
        5,
        "x was raised"
    );
    redlock.unlock(&lock).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_redlock_and_this_crate_exclude_each_other_on_sets() {
    let Some(dir) = node_redlock::install() else {
        // CI sets REDLOCK_REQUIRE_NODE, so there a missing peer fails the
        // test instead of passing it unseen.
        assert!(
            std::env::var_os("REDLOCK_REQUIRE_NODE").is_none(),
            "node and npm (with the npm registry) are needed for the node-redlock interop test"
        );
        eprintln!("skipped: node and npm (with the npm registry) are needed");
        return;
    };
    let cluster = Cluster::shared(5);
    let redlock = cluster.redlock();
    let mut node = NodeClient::spawn(&dir, &cluster.urls().join(";"));
    let (a, b, c) = (
        resource("interop-a"),
        resource("interop-b"),
        resource("interop-c"),
    );
    let ttl = 10_000;

    // node-redlock holds {a, b}: our set on {b, c} and our single a are
    // refused.
    let answer = node.ask(&format!("acquire {a},{b} {ttl}")).await;
    let value = answer.strip_prefix("held ").expect(&answer).to_owned();
    // node-redlock answers at the quorum too; the other nodes follow.
    assert!(
        cluster.eventually(Duration::from_secs(2), |cl| cl.count(&a, &value) == 5
            && cl.count(&b, &value) == 5),
        "same key layout: the key is the resource name"
    );
    let err = redlock.try_lock(&[&b, &c], TTL).await.unwrap_err();
    assert!(matches!(err, Error::Conflict { held: 3.., .. }), "{err}");
    assert!(matches!(
        redlock.try_lock(&a, TTL).await,
        Err(Error::Conflict { .. })
    ));
    assert_eq!(cluster.values(&c), vec![None; 5], "nothing left behind");
    assert_eq!(node.ask("release").await, "released");
    let gone = |names: &[&String]| {
        cluster.eventually(Duration::from_secs(2), |cl| {
            names.iter().all(|n| cl.values(n) == vec![None; 5])
        })
    };
    assert!(gone(&[&a, &b]), "node-redlock released everywhere");

    // We hold {b, c}: node-redlock's set on {a, b} and on {c} are refused.
    let lock = redlock.try_lock(&[&b, &c], TTL).await.expect("ours");
    let answer = node.ask(&format!("acquire {a},{b} {ttl}")).await;
    assert!(answer.starts_with("refused"), "{answer}");
    let answer = node.ask(&format!("acquire {c} {ttl}")).await;
    assert!(answer.starts_with("refused"), "{answer}");
    assert_eq!(
        cluster.values(&a),
        vec![None; 5],
        "node left nothing behind"
    );
    redlock.unlock(&lock).await.unwrap();

    // Free again for both.
    let answer = node.ask(&format!("acquire {a},{b},{c} {ttl}")).await;
    assert!(answer.starts_with("held "), "{answer}");
    assert_eq!(node.ask("release").await, "released");
    node.quit().await;
    assert!(gone(&[&a, &b, &c]), "nothing left behind");
}

/// Extend, fencing and unlock of the largest set while another manager
/// waits for it, with the default node timeout. The release names a
/// successor for each key (a hash read and a publish per key), which made
/// the unlock script of 1,000 keys outlast the 50 ms node timeout on every
/// node: `NoQuorum` although every key was deleted, and 1,000 releases
/// queued per unanswered node. A request now gets `PER_KEY` more per key, the
/// script reads the message and the clock once, and a release is owed per
/// lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_set_is_extended_fenced_and_released_with_a_contender_waiting() {
    let cluster = Cluster::start(3);
    let default_timeouts = || {
        cluster
            .builder()
            .node_timeout(redlock_quorum::DEFAULT_NODE_TIMEOUT)
            .build()
            .expect("valid")
    };
    // No warm-up: a single-key request gets only the default 50 ms, which a
    // loaded machine can overrun; every request here names 1,000 keys.
    let (holder, waiter) = (default_timeouts(), default_timeouts());
    for trial in 0..3 {
        let set = names(&format!("contended-{trial}"), MAX_RESOURCES);
        let lock = holder.try_lock(&refs(&set), TTL).await.expect("lock");
        let waiting = {
            let (waiter, set) = (waiter.clone(), set.clone());
            tokio::spawn(async move {
                let lock = waiter.lock_within(&refs(&set), TTL, TTL * 2).await?;
                Ok::<_, Error>(lock.token().to_owned())
            })
        };
        // Until it was refused, subscribed and registered on every key on
        // every node (each key's waiting hash is its name, 0xFF, `waiters`).
        let mut exists = redis::cmd("EXISTS");
        for name in &set {
            exists.arg(keys::waiters(name));
        }
        let registered = |c: &Cluster| {
            (0..3).all(|i| {
                exists
                    .query::<usize>(&mut c.conn(i))
                    .is_ok_and(|n| n == MAX_RESOURCES)
            })
        };
        // A node whose registration did not come through (its pipeline is
        // bounded by a second) wakes every manager instead: still waiting.
        let named = cluster.eventually(Duration::from_secs(5), registered);
        let lock = holder.extend(&lock, TTL).await.expect("extend");
        let fence = holder.fencing_token(&lock).await.expect("fencing token");
        assert!(fence >= 1);
        let started = Instant::now();
        let unlocked = holder.unlock(&lock).await;
        eprintln!(
            "trial {trial} (registered on every node: {named}): unlock in {:?}: {unlocked:?}, {} pending",
            started.elapsed(),
            holder.pending_releases()
        );
        assert_eq!(unlocked.expect("unlock with a contender waiting"), 3);
        let token = tokio::time::timeout(TTL, waiting)
            .await
            .expect("the waiter ends")
            .expect("the waiter's task")
            .expect("the waiter takes the set");
        assert!(
            cluster.eventually(Duration::from_secs(2), |c| c.count(&set[999], &token) >= 2),
            "the waiter holds the set"
        );
        assert_eq!(holder.pending_releases(), 0);
    }
}

/// A release that a node did not answer is owed to it once per lock, not
/// once per key (1,000 entries for a lock on 1,000 resources before), and
/// the retry releases the whole set when the node is back, after the set's
/// `SET` that was still queued on that node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_release_of_a_set_is_owed_once() {
    let mut cluster = Cluster::start(3);
    let redlock = cluster
        .builder()
        .node_timeout(Duration::from_millis(200))
        .build()
        .expect("valid");
    redlock_harness::warm(&redlock).await;
    let set = names("owed", MAX_RESOURCES);
    cluster.node(2).pause();
    let lock = redlock.try_lock(&refs(&set), TTL).await.expect("lock");
    let unlocked = redlock.unlock(&lock).await;
    let owed = redlock.pending_releases();
    cluster.node(2).resume();
    assert_eq!(unlocked.expect("released on a quorum"), 2);
    assert_eq!(owed, 1, "one release owed, for the lock");
    assert!(
        cluster.eventually(Duration::from_secs(5), |_| redlock.pending_releases() == 0),
        "{} still owed",
        redlock.pending_releases()
    );
    assert!(
        cluster.eventually(Duration::from_secs(2), |c| {
            [&set[0], &set[500], &set[999]]
                .iter()
                .all(|n| c.values(n) == vec![None; 3])
        }),
        "the set is released on the node that was paused"
    );
}
