//! Negative controls: the fault suite's checker is shown to fail when it
//! should, and only then. A planted violation (a node restarted at once
//! without persistence under a lock held on a bare majority, a release by
//! bare `DEL`, a stale write to a store that ignores fencing tokens) must be
//! reported as a violation; a holder descheduled past its validity (the
//! documented limit of a lease) must be reported as an overrun and not as a
//! violation; without either, nothing may be. These controls plant the
//! violation through real locks on real nodes; the controls on histories
//! planted by hand are the harness's own tests (`harness/tests/checker.rs`).

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use redlock_harness::checker::Checker;
use redlock_harness::fault::{self, builder, fault_secs, plan, run_workload};
use redlock_harness::{Cluster, RedisServer, resource};

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
    // both enter the critical section while valid (the ttl is 10 s)
    assert!(Instant::now() < first.expires_at());
    checker.section("a", true);
    checker.section("b", true);
    checker.section("b", false);
    checker.section("a", false);
    checker.record("a", first.token(), first_granted, first.expires_at());
    checker.record("b", second.token(), second_granted, second.expires_at());
    let overlaps = checker.overlaps();
    let report = checker.report();
    println!("control immediate restart: {report:?}");
    assert_eq!(overlaps.len(), 1, "the checker missed a planted violation");
    // two valid holders inside at once: a violation, not an overrun
    assert_eq!(report.unexplained_interleavings, 1, "{report:?}");
    assert_eq!(report.overruns, 0, "{report:?}");
    assert_eq!(report.violations(), 2, "{report:?}");
}

/// A write to the protected store: with `fenced`, accepted only with a
/// fencing token at least as high as any seen; without, always (the store
/// that ignores fencing, the planted bug).
fn store_write(url: &str, key: &str, fence: u64, writer: &str, fenced: bool) -> bool {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    let script = redis::Script::new(
        r#"local seen = tonumber(redis.call("get", KEYS[1]) or "0")
if ARGV[3] == "1" and tonumber(ARGV[1]) < seen then return 0 end
redis.call("set", KEYS[1], ARGV[1])
redis.call("rpush", KEYS[2], ARGV[2])
return 1"#,
    );
    let accepted: i64 = script
        .key(format!("{key}:seen"))
        .key(format!("{key}:writes"))
        .arg(fence)
        .arg(writer)
        .arg(u8::from(fenced))
        .invoke(&mut con)
        .unwrap();
    accepted == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_a_descheduled_holder_overruns_and_only_an_unfenced_store_takes_its_write() {
    // Holder a checks its validity, enters, and is descheduled (its thread
    // does not run: a GC pause, a stopped VM) past its validity. Holder b, on
    // a thread of its own, gets the lock after a's keys expired, enters and
    // writes with its fencing token. Then a resumes, writes with its older
    // token and leaves. The lock did its part: an overrun, no violation.
    // A store that checks fencing tokens refuses a's write; one that ignores
    // them takes it, and the checker must report that stale write as a
    // violation.
    let cluster = Cluster::start(3);
    let store = RedisServer::start();
    let ttl = Duration::from_millis(300);
    for fenced in [true, false] {
        let res = resource(if fenced {
            "control-overrun-fenced"
        } else {
            "control-overrun-unfenced"
        });
        let checker = Arc::new(Checker::default());
        let a = builder(cluster.urls()).build().unwrap();
        let lock = a.lock(&res, ttl).await.expect("a");
        let fence_a = a.fencing_token(&lock).await.expect("a's fencing token");
        let granted = Instant::now();
        assert!(granted < lock.expires_at(), "enter only while valid");
        checker.section("a", true);

        let (written_tx, written_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let b = {
            let (urls, res, checker, store_url) = (
                cluster.urls().to_vec(),
                res.clone(),
                checker.clone(),
                store.url(),
            );
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let b = builder(&urls).retry_count(100_000).build().unwrap();
                    let lock = b.lock(&res, Duration::from_secs(30)).await.expect("b");
                    let granted = Instant::now();
                    checker.section("b", true);
                    let fence = b.fencing_token(&lock).await.expect("b's fencing token");
                    let accepted = store_write(&store_url, &res, fence, "b", fenced);
                    checker.write("b", lock.token(), fence, accepted);
                    written_tx.send(()).unwrap();
                    done_rx.recv().unwrap();
                    checker.section("b", false);
                    checker.record("b", lock.token(), granted, Instant::now());
                    b.unlock(&lock).await.unwrap();
                    fence
                })
            })
        };
        // a's thread stops here, its validity long gone before it wakes
        written_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("b wrote");
        assert!(Instant::now() > lock.expires_at());
        let accepted = store_write(&store.url(), &res, fence_a, "a", fenced);
        checker.write("a", lock.token(), fence_a, accepted);
        checker.section("a", false);
        checker.record(
            "a",
            lock.token(),
            granted,
            Instant::now().min(lock.expires_at()),
        );
        done_tx.send(()).unwrap();
        let fence_b = b.join().unwrap();
        assert!(fence_a < fence_b);

        let report = checker.report();
        println!(
            "control descheduled holder, {} store: {report:?}",
            if fenced { "fenced" } else { "unfenced" }
        );
        assert_eq!(report.overlaps, 0, "{report:?}");
        assert_eq!(report.unexplained_interleavings, 0, "{report:?}");
        assert_eq!(
            (report.overruns, report.overrun_interleavings),
            (1, 1),
            "a's work overran into b's: {report:?}"
        );
        if fenced {
            assert!(!accepted, "the fenced store took a's stale write");
            assert_eq!(report.violations(), 0, "{report:?}");
        } else {
            assert!(accepted);
            assert_eq!(report.stale_writes, 1, "{report:?}");
            assert_eq!(report.violations(), 1, "the checker missed the stale write");
        }
    }
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
        let report = checker.report();
        println!(
            "control {} release, late: acquisitions {}, {report:?}",
            if bare_del { "bare DEL" } else { "checked" },
            tally.acquisitions,
        );
        assert_eq!(checker.len() as u64, tally.acquisitions);
        assert!(tally.acquisitions >= 4, "too few acquisitions to judge");
        found.push(report);
    }
    // (a holder descheduled past its validity on a loaded machine may
    // overrun in either run: that is not what this control is about)
    assert_eq!(
        found[0].violations(),
        0,
        "the checked release must not let holders overlap: {:?}",
        found[0]
    );
    assert!(
        found[1].overlaps > 0 && found[1].unexplained_interleavings > 0,
        "the checker missed the bare DEL's violations: {:?}",
        found[1]
    );
}
