//! Negative controls: the fault suite's checker is shown to fail when it
//! should. A planted violation (a node restarted at once without
//! persistence under a lock held on a bare majority, a release by bare
//! `DEL`) must be reported; without it, nothing may be.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_harness::checker::Checker;
use redlock_harness::fault::{self, builder, fault_secs, plan, run_workload};
use redlock_harness::{Cluster, resource};

/// The contender processes of the bare-DEL control: this test binary, re-run
/// by `fault::run_workload`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the controls as a separate contender process"]
async fn child_contender() {
    fault::child_contender().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_an_immediate_restart_without_persistence_lets_a_second_holder_in() {
    // Three nodes, quorum 2. The first holder gets exactly two of them; one
    // of those restarts at once, empty; the second holder gets a majority of
    // nodes that do not know the first lock. The checker must see it.
    let mut cluster = Cluster::start(3);
    let checker = Checker::default();
    let res = resource("control-restart");
    let ttl = Duration::from_secs(10);
    cluster.node(2).kill();
    let a = builder(cluster.urls()).build().unwrap();
    let first = a.try_lock(&res, ttl).await.expect("2 of 3");
    let first_granted = Instant::now();
    cluster.node(2).restart();
    cluster.node(1).restart(); // immediately, no persistence: forgets the lock
    let b = builder(cluster.urls()).retry_count(50).build().unwrap();
    let second = b
        .lock(&res, ttl)
        .await
        .expect("the forgotten lock lets b in");
    let second_granted = Instant::now();
    checker.record("a", first.token(), first_granted, first.expires_at());
    checker.record("b", second.token(), second_granted, second.expires_at());
    let overlaps = checker.overlaps();
    println!(
        "control immediate restart: violations detected {}",
        overlaps.len()
    );
    assert_eq!(overlaps.len(), 1, "the checker missed a planted violation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_a_bare_del_release_lets_two_holders_interleave() {
    // The real workload and checker (six tasks, two child processes), with
    // holders that stall between their work and their release, past their
    // ttl. With the ownership-checked unlock that is harmless: the late
    // release finds the next holder's token and leaves it. With a bare DEL
    // (the mistake the script exists to prevent) a late release deletes the
    // next holder's key while it works, a third client walks in, and the
    // checker must report it. The work itself ends well within the validity,
    // so only the release can cause a violation.
    let cluster = Cluster::start(5);
    let duration = fault_secs().max(Duration::from_secs(3));
    let control = |bare_del: bool| {
        let mut p = plan(
            cluster.urls().to_vec(),
            if bare_del {
                "control-del"
            } else {
                "control-checked"
            },
            Duration::from_millis(250),
            (100, 150),
            false,
        );
        p.duration = duration;
        p.release_after_ms = (250, 400);
        p.bare_del = bare_del;
        p
    };
    let mut found = Vec::new();
    for bare_del in [false, true] {
        let plan = control(bare_del);
        let checker = Arc::new(Checker::default());
        let (tally, _) = run_workload(&plan, &checker, async { 0 }).await;
        let (overlaps, interleavings) = (checker.overlaps(), checker.interleavings());
        println!(
            "control {} release, late: acquisitions {}, overlapping windows {}, interleaved sections {}",
            if bare_del { "bare DEL" } else { "checked" },
            tally.acquisitions,
            overlaps.len(),
            interleavings.len()
        );
        assert_eq!(checker.len() as u64, tally.acquisitions);
        assert!(tally.acquisitions >= 4, "too few acquisitions to judge");
        found.push((overlaps.len(), interleavings.len()));
    }
    assert_eq!(
        found[0],
        (0, 0),
        "the checked release must not let holders overlap"
    );
    assert!(
        found[1].0 > 0 && found[1].1 > 0,
        "the checker missed the bare DEL's violations: {:?}",
        found[1]
    );
}
