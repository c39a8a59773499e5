//! An audit of commit 2a522de: under the restart guard, a node whose
//! generation marker the manager knows to be old takes the acquisition of
//! one key as a pipeline, `SET key token NX PX ttl GET` then `GET <marker>`
//! (the marker read after the write), instead of a transaction; where the
//! marker changed, the manager forgets it and the guarded script decides.
//!
//! On real `redis-server` processes (loopback only), on their worst days.
//! Each test names what it catches.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use rand::RngExt;
use redlock_harness::checker::Checker;
use redlock_harness::keys;
use redlock_harness::raw::{calls, reset_stats, script_flush};
use redlock_harness::{Cluster, RedisServer, resource};
use redlock_quorum::{Error, NodeError, Redlock};

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

/// Catches: a key left on a node whose pipeline `SET` ran before the node
/// answered with an error (the marker changed to something the script
/// refuses, or a `GET` the ACL denies): the failed round's release skips
/// nodes that answered with an error ("did not take our SET"), so the key
/// stays until its ttl and refuses every other client there. A manager
/// that does not know the node (the script alone) leaves nothing: the
/// control in each case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_leaves_no_key_where_the_pipeline_set_ran_before_an_error() {
    let mut found = Vec::new();
    type Spoil = fn(&Cluster);
    let cases: [(&str, Spoil); 4] = [
        ("marker set to a malformed string", |c| {
            cmd(&c.urls()[0], &[b"SET", &marker(), b"garbage"]).unwrap();
        }),
        ("marker replaced by a hash", |c| {
            cmd(&c.urls()[0], &[b"DEL", &marker()]).unwrap();
            cmd(&c.urls()[0], &[b"HSET", &marker(), b"f", b"v"]).unwrap();
        }),
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
        let cluster = Cluster::start(3);
        let urls = cluster.acl_user(
            "locker",
            &[
                "on",
                ">pw",
                "~*",
                "&*",
                "+@all",
            ],
        );
        age_markers_on(&urls, MAX_TTL).await;
        let knows = guarded_on(&urls, MAX_TTL);
        learn(&knows, MAX_TTL).await;
        assert!(pipelined_at(&knows, &urls[0], MAX_TTL).await, "{name}");
        spoil(&cluster);
        // Control: the script alone (a manager that knows no generation)
        // fails before its `SET`.
        let fresh = guarded_on(&urls, MAX_TTL);
        let control = resource("leak-control");
        let (left, err) = left_on_node_0_after_a_conflict(&cluster, &fresh, &control).await;
        assert_eq!(left, None, "{name}: the script left a key ({err})");
        let res = resource("leak");
        let (left, err) = left_on_node_0_after_a_conflict(&cluster, &knows, &res).await;
        println!("{name}: node 0 holds {left:?} after: {err}");
        if left.is_some() {
            found.push(format!(
                "{name}: node 0 kept the failed attempt's key {left:?} (pttl {}) after: {err}",
                cluster.pttl_on(0, &res)
            ));
        }
    }
    assert!(found.is_empty(), "{found:#?}");
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
    let node0 = cluster.urls()[0].trim_start_matches("redis://").trim_end_matches('/').to_owned();
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
            a.expires_at().saturating_duration_since(Instant::now()).as_millis()
        );
        let _ = first.unlock(&a).await;
        // Node 0 is young for max_ttl now: wait it out and learn it again.
        tokio::time::sleep(max_ttl + Duration::from_millis(100)).await;
        learn(&second, ttl).await;
    }
    assert_eq!(checker.overlaps().len(), 0, "{:?}", checker.overlaps());
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
        let (stop, grants, shared, checker) =
            (stop.clone(), grants.clone(), shared.clone(), checker.clone());
        move |redlock: Redlock, n: usize| {
        let (stop, grants, shared, checker) =
            (stop.clone(), grants.clone(), shared.clone(), checker.clone());
        async move {
            let own = resource(&format!("phases-{n}"));
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let res = if i % 2 == 0 { &shared } else { &own };
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
        ("FLUSHALL", Box::new(|c: &mut Cluster| flushall(&c.urls()[0]))),
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
        report.push((name.to_string(), early.len(), again, early.first().map(|x| x.granted - lost)));
    }
    stop.store(true, Ordering::Relaxed);
    main.block_on(async {
        for t in on_main {
            t.await.unwrap();
        }
    });
    second.join().unwrap();
    for (name, early, again, first) in &report {
        assert_eq!(*early, 0, "{name}: node 0 counted {first:?} after it lost its data");
        assert!(*again > 0, "{name}: node 0 never counted again");
    }
    assert_eq!(checker.overlaps().len(), 0, "{:?}", checker.overlaps());
    assert!(checker.len() > 10, "{} grants of the shared resource", checker.len());
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
    let lock = redlock.try_lock(&resource("swap"), MAX_TTL).await.expect("db 1 untouched");
    redlock.unlock(&lock).await.unwrap();
    cmd(&cluster.urls()[0], &[b"SWAPDB", b"0", b"1"]).unwrap();
    let swapped = Instant::now();
    let res = resource("swap");
    while swapped.elapsed() < MAX_TTL - Duration::from_millis(200) {
        let err = redlock.try_lock(&res, MAX_TTL).await.expect_err("node 0 is young");
        assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
        assert!(err.to_string().contains("restarted empty"), "{err}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    let urls = vec![cluster.urls()[0].clone(), cluster.urls()[1].clone(), proxy.url()];
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
        let _cut = redlock.try_lock(&resource("silent"), ttl).await.expect("0 and 1");
        // Its request there times out in the background.
        tokio::time::sleep(Duration::from_millis(500)).await;
        proxy.set(Fault::NONE);
        tokio::time::sleep(ttl + Duration::from_millis(100)).await;
        // Node 2 answers acquisitions again (none released: nothing owed).
        for _ in 0..3 {
            let _held = redlock.try_lock(&resource("heard"), ttl).await.expect("all");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Node 2 now answers within the timeout, but slower than the others.
        proxy.set(Fault::Latency(Duration::from_millis(100)));
        let lock = redlock.try_lock(&resource("after"), ttl).await.expect("all");
        tokio::time::sleep(Duration::from_millis(150)).await;
        let released = redlock.unlock(&lock).await.unwrap();
        proxy.set(Fault::NONE);
        println!("guard {guard}: unlock released on {released} of 3");
        seen.push((guard, released));
    }
    for (guard, released) in seen {
        assert_eq!(released, 3, "guard {guard}: node 2 answered but was left out of the unlock");
    }
}
