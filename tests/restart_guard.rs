//! The restart guard and the generation markers, against real
//! nodes that restart without persistence: a node that lost its data does
//! not count until its data is `max_ttl` old, and fencing tokens never
//! repeat or go down while fewer than half the nodes lose their data.

use std::time::{Duration, Instant};

use rand::RngExt;
use redlock_harness::checker::Checker;
use redlock_harness::fault::{self, plan};
use redlock_harness::raw::{before_redis_7, calls, reset_stats};
use redlock_harness::{Cluster, keys, resource};
use redlock_quorum::{Error, NodeError, Redlock};

/// The guard's `max_ttl`, and the ttl of the guarded locks here.
const MAX_TTL: Duration = Duration::from_millis(1500);

fn guarded(cluster: &Cluster) -> Redlock {
    cluster
        .builder()
        .restart_guard(MAX_TTL)
        .retry_delay(Duration::from_millis(50))
        .retry_jitter(Duration::from_millis(20))
        .retry_count(200)
        .build()
        .unwrap()
}

/// Node `node`'s generation marker of the empty key prefix.
fn marker(cluster: &Cluster, node: usize) -> Option<String> {
    cluster.get_on(node, keys::generation(""))
}

/// Makes the markers of a fresh cluster and waits until they are old enough
/// to count.
async fn age_markers(cluster: &Cluster) {
    let redlock = guarded(cluster);
    let _ = redlock.try_lock(&resource("age"), MAX_TTL).await;
    tokio::time::sleep(MAX_TTL + Duration::from_millis(100)).await;
}

/// The contender processes of the workload test below: this test binary,
/// re-run by `fault::run`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the workload test as a separate contender process"]
async fn child_contender() {
    fault::child_contender().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_contention_an_immediate_restart_without_persistence_lets_no_one_in_twice() {
    // The fault suite's workload (six tasks and two processes contending,
    // the checker on one clock), against the negative control's fault made
    // repeatable: a random minority is paused (its data kept), so holders
    // get a bare majority; one node of that majority restarts at once,
    // empty; the paused ones resume. The nodes without the holder's key are
    // now a majority. Unguarded, a second client walks in (planting
    // `restart_guard = None` here gave violations); guarded, the restarted
    // node counts only once its data is max_ttl old.
    let mut cluster = Cluster::start(5);
    let ttl = Duration::from_millis(400);
    let mut p = plan(
        cluster.urls().to_vec(),
        "guard-workload",
        ttl,
        (100, 200),
        false,
    );
    p.restart_guard = Some(ttl);
    // The markers of the fresh cluster first grow old enough to count.
    let warm = fault::plan_builder(&p).build().unwrap();
    let _ = warm.try_lock(&resource("guard-warm"), ttl).await;
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;
    let name = "bare majority, one of it restarted at once, restart guard";
    fault::run(name, &mut cluster, &p, async |c, end| {
        let mut faults = 0;
        while Instant::now() < end {
            let paused = fault::minority();
            for i in paused {
                c.node(i).pause();
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
            let others: Vec<usize> = (0..5).filter(|i| !paused.contains(i)).collect();
            let forgetful = others[rand::rng().random_range(0..others.len())];
            c.node(forgetful).restart();
            for i in paused {
                c.node(i).resume();
            }
            faults += 1;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        faults
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_cluster_bootstraps_after_max_ttl_once() {
    let cluster = Cluster::start(3);
    let redlock = guarded(&cluster);
    let res = resource("guard-bootstrap");
    let first = Instant::now();
    // No marker yet: every node is new, and none counts.
    let err = redlock.try_lock(&res, MAX_TTL).await.unwrap_err();
    match &err {
        Error::NoQuorum { failures, .. } => {
            assert_eq!(failures.len(), 3, "{err}");
            assert!(
                failures
                    .iter()
                    .all(|f| matches!(f.cause, NodeError::Young { .. })),
                "{err}"
            );
        }
        other => panic!("expected NoQuorum from young nodes, got {other}"),
    }
    assert!(err.to_string().contains("old"), "{err}");
    // Refused, and nothing left behind.
    assert!(cluster.eventually(Duration::from_secs(2), |c| {
        c.values(&res).iter().all(Option::is_none)
    }));
    for node in 0..3 {
        let stamp = marker(&cluster, node).expect("a marker on every node");
        let (born, id) = stamp.split_once(':').expect("born:id");
        assert!(born.parse::<u64>().is_ok() && id.len() >= 16, "{stamp}");
    }
    // `lock` waits the guard out, then gets it; fencing bootstraps at 1.
    let lock = redlock.lock(&res, MAX_TTL).await.unwrap();
    let waited = first.elapsed();
    assert!(waited >= MAX_TTL, "granted after {waited:?}");
    assert_eq!(redlock.fencing_token(&lock).await.unwrap(), 1);
    redlock.unlock(&lock).await.unwrap();
    // From then on, the markers are old: granted at once.
    let again = redlock.try_lock(&res, MAX_TTL).await.unwrap();
    redlock.unlock(&again).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_immediate_restart_without_persistence_does_not_let_a_second_holder_in() {
    // The negative control of tests/checker_controls.rs, guarded: three
    // nodes, the first holder on exactly two, one of those restarted at once
    // and empty. Unguarded, the second client gets in (the control shows
    // it); guarded, it must wait until the first lock has expired.
    let mut cluster = Cluster::start(3);
    age_markers(&cluster).await;
    let checker = Checker::default();
    for round in 0..3 {
        let res = resource("guard-restart");
        let forgetful = 1 + round % 2; // node 1 or node 2 holds a and forgets
        let absent = 3 - forgetful; // the other of them is down for a
        cluster.node(absent).kill();
        let a = guarded(&cluster);
        let first = a.try_lock(&res, MAX_TTL).await.expect("2 of 3");
        let first_granted = Instant::now();
        cluster.node(absent).restart();
        cluster.node(forgetful).restart(); // at once, no persistence
        assert_eq!(cluster.count(&res, first.token()), 1, "forgotten");
        let b = guarded(&cluster);
        let second = b.lock(&res, MAX_TTL).await.expect("b gets it in the end");
        let second_granted = Instant::now();
        assert!(
            second_granted >= first.expires_at(),
            "round {round}: b was granted while a's lock was valid"
        );
        checker.record("a", first.token(), first_granted, first.expires_at());
        checker.record("b", second.token(), second_granted, second.expires_at());
        b.unlock(&second).await.unwrap();
        // The restarted nodes count again once their data is max_ttl old.
        tokio::time::sleep(MAX_TTL).await;
    }
    assert_eq!(checker.overlaps().len(), 0, "{:?}", checker.overlaps());
    assert_eq!(checker.len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_its_data_counts_again_after_max_ttl() {
    let mut cluster = Cluster::start(3);
    age_markers(&cluster).await;
    let redlock = guarded(&cluster);
    let res = resource("guard-rejoin");
    let before = marker(&cluster, 0).unwrap();
    cluster.node(0).restart();
    // Young node 0 and a down node 2: only node 1 counts.
    cluster.node(2).kill();
    let err = redlock.try_lock(&res, MAX_TTL).await.unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
    let after = marker(&cluster, 0).expect("a new marker");
    assert_ne!(before, after, "a new generation");
    // After max_ttl on node 0's clock, it counts: nodes 0 and 1 grant it.
    tokio::time::sleep(MAX_TTL).await;
    let lock = redlock.try_lock(&res, MAX_TTL).await.unwrap();
    redlock.unlock(&lock).await.unwrap();
    cluster.node(2).restart();
}

/// A manager that has seen every node old names each node's generation in
/// its requests, and a node whose marker still holds it answers without
/// its clock. A node that lost its data has a new marker: the same manager
/// must count it as young, not as the old node it knew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_that_knew_a_node_as_old_does_not_count_it_once_it_lost_its_data() {
    known_old_then_lost("guard-known", |cluster| cluster.node(0).restart()).await;
}

/// A flush keeps the connection (no restart for the manager to notice):
/// the marker's `GET` after the pipeline's `SET` finds no marker, the
/// script makes a new one, and the node does not count until it is old.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_that_knew_a_node_as_old_does_not_count_it_once_it_was_flushed() {
    known_old_then_lost("guard-flushed", |cluster| {
        let _: () = redis::cmd("FLUSHALL").query(&mut cluster.conn(0)).unwrap();
    })
    .await;
}

/// Every node known old to a manager; then node 0 loses its data (`lose`)
/// and node 2 is down: no quorum while node 0 is young (it says so), one
/// once it is old again.
async fn known_old_then_lost(name: &str, lose: impl FnOnce(&mut Cluster)) {
    let mut cluster = Cluster::start(3);
    age_markers(&cluster).await;
    let redlock = guarded(&cluster);
    let res = resource(name);
    for _ in 0..2 {
        let lock = redlock.try_lock(&res, MAX_TTL).await.unwrap();
        redlock.unlock(&lock).await.unwrap();
    }
    lose(&mut cluster);
    cluster.node(2).kill();
    let err = redlock.try_lock(&res, MAX_TTL).await.unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
    assert!(
        err.to_string().contains("restarted empty"),
        "node 0 is young: {err}"
    );
    let err = redlock.try_lock(&res, MAX_TTL).await.unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "still young: {err}");
    tokio::time::sleep(MAX_TTL).await;
    let lock = redlock.try_lock(&res, MAX_TTL).await.unwrap();
    redlock.unlock(&lock).await.unwrap();
    cluster.node(2).restart();
}

/// Once a manager has seen a node's marker old enough, its guarded
/// acquisitions there are the `SET` and then the marker's `GET`, in one
/// pipeline, not a script (Redis before 7.0 keeps the script); a key of
/// the wrong type is still a typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_known_old_takes_the_guarded_acquisition_as_a_pipeline() {
    let cluster = Cluster::start(3);
    age_markers(&cluster).await;
    let redlock = guarded(&cluster);
    let res = resource("guard-pipeline");
    let lock = redlock.try_lock(&res, MAX_TTL).await.unwrap();
    redlock.unlock(&lock).await.unwrap();
    for url in cluster.urls() {
        reset_stats(url);
    }
    for _ in 0..10 {
        let lock = redlock.try_lock(&res, MAX_TTL).await.unwrap();
        redlock.unlock(&lock).await.unwrap();
    }
    for url in cluster.urls() {
        if before_redis_7(url) {
            // No `SET … NX … GET` to queue there: the script stays.
            assert_eq!(calls(url, "evalsha"), 20, "{url}");
            continue;
        }
        assert_eq!(calls(url, "set"), 10, "{url}: a SET per acquisition");
        assert_eq!(calls(url, "exec"), 0, "{url}: no transaction");
        // The marker's `GET` after each `SET`, and the release script's.
        assert_eq!(calls(url, "get"), 20, "{url}: one GET of the marker each");
        assert_eq!(
            calls(url, "evalsha"),
            10,
            "{url}: scripts for releases only"
        );
    }
    let wrong = resource("guard-wrong-type");
    for i in 0..3 {
        let _: () = redis::cmd("HSET")
            .arg(&wrong)
            .arg("f")
            .arg("v")
            .query(&mut cluster.conn(i))
            .unwrap();
    }
    let err = redlock.try_lock(&wrong, MAX_TTL).await.unwrap_err();
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
}

/// A marker that is not a generation (empty here, as a hand-made or
/// corrupted one could be) is refused, not taken for the generation a
/// manager that knows none names (the empty argument): no lock, no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_marker_is_refused_not_taken_for_an_old_one() {
    let cluster = Cluster::start(3);
    for i in 0..3 {
        let _: () = redis::cmd("SET")
            .arg(keys::generation(""))
            .arg("")
            .query(&mut cluster.conn(i))
            .unwrap();
    }
    let redlock = guarded(&cluster);
    let res = resource("guard-empty-marker");
    let err = redlock.try_lock(&res, MAX_TTL).await.unwrap_err();
    assert!(err.to_string().contains("malformed"), "{err}");
    assert!(cluster.nowhere(&res), "{:?}", cluster.values(&res));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_stopped_then_restarted_empty_then_paused_never_repeats_a_token() {
    // 3 nodes, at most one faulty at a time. Unguarded (the generation
    // check on the counters is always on), then guarded.
    for guard in [false, true] {
        let mut cluster = Cluster::start(3);
        let ttl = Duration::from_millis(800);
        let build = |c: &Cluster| {
            let b = c
                .builder()
                .retry_delay(Duration::from_millis(50))
                .retry_count(200);
            if guard { b.restart_guard(ttl) } else { b }
                .build()
                .unwrap()
        };
        if guard {
            age_markers(&cluster).await;
        }
        let res = resource("guard-fence");
        // An earlier holder, with every node up, sets the counters (one per
        // node for every name). Brand-new nodes are trusted by a token made
        // once their markers are a few seconds old.
        let z = build(&cluster);
        let stored = |node: usize| cluster.get_on(node, keys::counter(""));
        let mut token_z = 0;
        for _ in 0..60 {
            let lock = z.lock(&res, ttl).await.unwrap();
            token_z = z.fencing_token(&lock).await.unwrap();
            z.unlock(&lock).await.unwrap();
            if (0..3).all(|node| stored(node).is_some_and(|s| s.contains(':'))) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // The fencing write waited for every node.
        for node in 0..3 {
            assert!(
                stored(node).is_some_and(|s| s.starts_with(&format!("{token_z}:"))),
                "guard {guard}: node {node}"
            );
        }
        assert!(cluster.eventually(Duration::from_secs(2), |c| {
            c.values(&res).iter().all(Option::is_none)
        }));

        // 1. Node 2 is down (stopped, its data kept) while A locks and
        // takes a token.
        cluster.node(2).pause();
        let a = build(&cluster);
        let lock_a = a.lock(&res, ttl).await.unwrap();
        let token_a = a.fencing_token(&lock_a).await.unwrap();
        assert_eq!(token_a, token_z + 1);
        cluster.node(2).resume(); // back, with only the earlier counter
        // 2. Node 0 is killed and restarted empty after ttl + 200 ms.
        cluster.node(0).kill();
        tokio::time::sleep(ttl + Duration::from_millis(200)).await;
        cluster.node(0).restart();
        // 3. Node 1 is paused while B locks and takes a token.
        cluster.node(1).pause();
        let b = build(&cluster);
        let lock_b = b.lock(&res, ttl).await;
        let outcome = match &lock_b {
            Ok(lock) => Some(b.fencing_token(lock).await),
            Err(_) => None,
        };
        cluster.node(1).resume();
        match outcome {
            // Before the generation check: Ok(2), A's token again.
            Some(Ok(token_b)) => assert!(token_b > token_a, "guard {guard}: {token_b}"),
            Some(Err(Error::FencingUnproven { untrusted, .. })) => assert!(untrusted >= 1),
            Some(Err(other)) => panic!("guard {guard}: {other}"),
            // Guarded, node 0 is young and node 1 paused: no quorum for B.
            None => assert!(guard, "unguarded, B locks on nodes 0 and 2"),
        }
        // Once every node answers again (node 1 is reconnected after its
        // backoff), B's token is proven, and above A's.
        if let Ok(lock) = lock_b {
            let _ = b.unlock(&lock).await;
        }
        let mut token_b = None;
        for _ in 0..20 {
            let lock = b.lock(&res, ttl).await.unwrap();
            let token = b.fencing_token(&lock).await;
            let _ = b.unlock(&lock).await;
            match token {
                Ok(token) => {
                    token_b = Some(token);
                    break;
                }
                Err(Error::FencingUnproven { .. }) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(other) => panic!("guard {guard}: {other}"),
            }
        }
        let token_b = token_b.expect("proven once every node answers");
        assert!(
            token_b > token_a,
            "guard {guard}: {token_b} after {token_a}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_strictly_increase_under_random_minority_data_loss() {
    // Five nodes, many successive holders; between (and during) holders a
    // random minority restarts empty or is paused. Every token issued is
    // larger than every token issued before it; a call that cannot prove it
    // fails closed.
    let mut cluster = Cluster::start(5);
    let res = resource("guard-random");
    let mut rng = rand::rng();
    let (mut issued, mut unproven, mut last) = (0, 0, 0u64);
    // The guarantee's assumption: fewer than half the nodes lose their data
    // between two successive tokens (a call that failed closed issued none).
    let mut lost_since_token: Vec<usize> = Vec::new();
    for round in 0..30 {
        let redlock = cluster.builder().retry_count(50).build().unwrap();
        let lock = redlock.lock(&res, Duration::from_secs(5)).await.unwrap();
        // A fault during the holder's tenure: one node paused.
        let paused = rng.random_bool(0.3).then(|| rng.random_range(0..5));
        if let Some(p) = paused {
            cluster.node(p).pause();
        }
        match redlock.fencing_token(&lock).await {
            Ok(token) => {
                assert!(token > last, "round {round}: {token} after {last}");
                last = token;
                issued += 1;
                lost_since_token.clear();
            }
            Err(Error::FencingUnproven { .. }) => unproven += 1,
            Err(other) => panic!("round {round}: {other}"),
        }
        if let Some(p) = paused {
            cluster.node(p).resume();
        }
        let _ = redlock.unlock(&lock).await;
        // Then up to two nodes restart empty, within the assumption.
        for _ in 0..rng.random_range(0..=2) {
            let n = rng.random_range(0..5);
            if lost_since_token.len() < 2 && !lost_since_token.contains(&n) {
                lost_since_token.push(n);
                cluster.node(n).restart();
            }
        }
    }
    println!("tokens issued {issued}, failed closed {unproven}, last {last}");
    assert!(issued >= 10, "only {issued} of 30 rounds issued a token");
}

#[test]
fn the_guard_refuses_longer_ttls_and_bad_settings() {
    let urls = [
        "redis://127.0.0.1:1/",
        "redis://127.0.0.1:2/",
        "redis://127.0.0.1:3/",
    ];
    // Zero, and a max_ttl no ttl fits under (every ttl at most its drift
    // allowance of 2 ms and more): refused at build.
    for max_ttl in [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_millis(2),
    ] {
        let err = Redlock::builder(urls)
            .restart_guard(max_ttl)
            .build()
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidSetting {
                    setting: "restart_guard",
                    ..
                }
            ),
            "{max_ttl:?}: {err}"
        );
    }
    // The shortest that works: 3 ms (drift 2.03 ms).
    Redlock::builder(urls)
        .restart_guard(Duration::from_millis(3))
        .build()
        .unwrap();
    let redlock = Redlock::builder(urls)
        .restart_guard(Duration::from_secs(10))
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = rt
        .block_on(redlock.try_lock("x", Duration::from_secs(11)))
        .unwrap_err();
    assert!(matches!(err, Error::TtlAboveRestartGuard { .. }), "{err}");
    assert!(err.to_string().contains("max_ttl"), "{err}");
}
