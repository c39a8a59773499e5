//! The contention loop of scenarios 6, 6c and 6d: tasks take one resource
//! in turn (hold 2 ms, think 1 ms), and every grant is recorded. Scenario 6c
//! runs it in separate OS processes: the bench binary started again with
//! `--contender`, one manager per process.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use redlock_quorum::Redlock;

use crate::TTL;
use crate::samples::Samples;

/// How long a contender holds the lock.
const HOLD: Duration = Duration::from_millis(2);
/// How long it waits after its release before it calls `lock` again:
/// shorter than the hold, so that with two contenders the other one is
/// always waiting when the lock is released (a longer think time measures
/// the think timer, not the hand-off).
const THINK: Duration = Duration::from_millis(1);

/// Who contends: this crate (with a retry delay, or `None` for the
/// defaults) or rslock with its defaults.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Who {
    Ours(Option<Duration>),
    Rslock,
}

impl Who {
    pub(crate) fn arg(self) -> String {
        match self {
            Who::Ours(None) => "ours".into(),
            Who::Ours(Some(d)) => format!("ours:{}", d.as_millis()),
            Who::Rslock => "rslock".into(),
        }
    }

    fn parse(s: &str) -> Who {
        match s.split_once(':') {
            _ if s == "rslock" => Who::Rslock,
            Some((_, ms)) => Who::Ours(Some(Duration::from_millis(ms.parse().unwrap()))),
            None => Who::Ours(None),
        }
    }
}

/// One grant: the contender, when it called `lock`, when it was granted and
/// when it released (nanoseconds since the Unix epoch: one clock for every
/// process of the machine).
pub(crate) type Grant = (usize, u128, u128, u128);

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

/// The stop time `after` from now, in the grants' clock.
pub(crate) fn stop_after(after: Duration) -> u128 {
    now_ns() + after.as_nanos()
}

/// A manager for `who`, or `None` for rslock.
pub(crate) fn manager(who: Who, urls: &[&str]) -> Option<Redlock> {
    match who {
        Who::Ours(Some(d)) => Some(
            Redlock::builder(urls.to_vec())
                .retry_delay(d)
                .retry_jitter(d)
                .build()
                .unwrap(),
        ),
        Who::Ours(None) => Some(Redlock::new(urls.to_vec()).unwrap()),
        Who::Rslock => None,
    }
}

/// One run of the contention loop.
pub(crate) struct Run<'a> {
    pub(crate) who: Who,
    pub(crate) urls: &'a [&'a str],
    pub(crate) resource: &'a str,
    pub(crate) tasks: usize,
    /// The first contender's number.
    pub(crate) first: usize,
    /// One manager for every task; otherwise each makes its own.
    pub(crate) shared: Option<Redlock>,
    /// The stop time, in the grants' clock.
    pub(crate) stop_at: u128,
    /// Stop after this many grants.
    pub(crate) max: usize,
}

/// Runs the contenders of `run` until it stops, and returns their grants.
pub(crate) async fn contend(run: Run<'_>) -> Vec<Grant> {
    let Run {
        who,
        urls,
        resource,
        tasks,
        first,
        shared,
        stop_at,
        max,
    } = run;
    let grants = Arc::new(std::sync::Mutex::new(Vec::new()));
    let done = Arc::new(AtomicBool::new(false));
    let mut all = FuturesUnordered::new();
    for task in 0..tasks {
        let (grants, done) = (grants.clone(), done.clone());
        let ours = shared.clone().or_else(|| manager(who, urls));
        let theirs = rslock::LockManager::new(urls.to_vec());
        let resource = resource.to_owned();
        all.push(async move {
            while !done.load(Ordering::Relaxed) && now_ns() < stop_at {
                let called = now_ns();
                let granted;
                let released;
                if let Some(r) = &ours {
                    let Ok(lock) = r.lock(&resource, TTL).await else {
                        continue;
                    };
                    granted = now_ns();
                    tokio::time::sleep(HOLD).await;
                    released = now_ns();
                    let _ = r.unlock(&lock).await;
                } else {
                    let Ok(lock) = theirs.lock(resource.as_str(), TTL).await else {
                        continue;
                    };
                    granted = now_ns();
                    tokio::time::sleep(HOLD).await;
                    released = now_ns();
                    theirs.unlock(&lock).await;
                }
                {
                    let mut g = grants.lock().unwrap();
                    g.push((first + task, called, granted, released));
                    if g.len() > max {
                        done.store(true, Ordering::Relaxed);
                    }
                }
                // think time, so that the releaser does not simply take the
                // lock again before anyone else can
                tokio::time::sleep(THINK).await;
            }
        });
    }
    while all.next().await.is_some() {}
    grants.lock().unwrap().clone()
}

/// [`contend`] in this process on a fresh resource named after `prefix`,
/// for at most `run` and `max` grants; with `one_manager`, every task
/// shares one warmed-up manager.
pub(crate) async fn contend_here(
    who: Who,
    urls: &[&str],
    prefix: &str,
    tasks: usize,
    one_manager: bool,
    run: Duration,
    max: usize,
) -> Vec<Grant> {
    let resource = format!("{prefix}:{}", crate::subjects::token());
    let shared = one_manager.then(|| manager(who, urls)).flatten();
    if let Some(r) = &shared {
        redlock_harness::warm(r).await;
    }
    contend(Run {
        who,
        urls,
        resource: &resource,
        tasks,
        first: 0,
        shared,
        stop_at: stop_after(run),
        max,
    })
    .await
}

/// The release-to-next-grant gaps of hand-offs: the next grant went to
/// another contender that was already waiting (had called `lock` before the
/// release). A grant to a contender that came back from its think time
/// after the release measures its timer, not the hand-off, and is left out.
pub(crate) fn gaps(grants: &[Grant]) -> Samples {
    let mut sorted = grants.to_vec();
    sorted.sort_by_key(|g| g.2);
    let mut gaps = Samples::default();
    for w in sorted.windows(2) {
        let (prev, next) = (w[0], w[1]);
        if prev.0 != next.0 && next.1 < prev.3 {
            gaps.push(Duration::from_nanos(next.2.saturating_sub(prev.3) as u64));
        }
    }
    gaps
}

/// Scenario 6c's child: `--contender <who> <urls,> <resource> <tasks>
/// <first> <start_ns> <stop_ns>`. Warms its connections, waits for the
/// common start, contends, and prints one `contender granted released` line
/// per grant.
pub(crate) fn child(args: &[String]) {
    let who = Who::parse(&args[0]);
    let urls: Vec<&str> = args[1].split(',').collect();
    let resource = args[2].clone();
    let tasks: usize = args[3].parse().unwrap();
    let first: usize = args[4].parse().unwrap();
    let start: u128 = args[5].parse().unwrap();
    let stop: u128 = args[6].parse().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let grants = runtime.block_on(async {
        let shared = manager(who, &urls);
        if let Some(r) = &shared {
            redlock_harness::warm(r).await;
        } else {
            let warm = rslock::LockManager::new(urls.clone());
            let _ = warm.lock("bench:warm", Duration::from_millis(10)).await;
        }
        let wait = start.saturating_sub(now_ns());
        tokio::time::sleep(Duration::from_nanos(wait as u64)).await;
        contend(Run {
            who,
            urls: &urls,
            resource: &resource,
            tasks,
            first,
            shared,
            stop_at: stop,
            max: usize::MAX,
        })
        .await
    });
    for (n, c, g, r) in &grants {
        println!("{n} {c} {g} {r}");
    }
}

/// Runs `processes` children of `tasks` contenders each (one manager per
/// process) for `run`, and gathers their grants.
pub(crate) fn in_processes(
    who: Who,
    urls: &[String],
    processes: usize,
    tasks: usize,
    run: Duration,
) -> Vec<Grant> {
    let exe = std::env::current_exe().unwrap();
    let resource = format!("bench:handoff-proc:{}", crate::subjects::token());
    // time for every child to start and connect
    let start = now_ns() + Duration::from_millis(1500).as_nanos();
    let stop = start + run.as_nanos();
    let children: Vec<_> = (0..processes)
        .map(|p| {
            std::process::Command::new(&exe)
                .arg("--contender")
                .args([
                    who.arg(),
                    urls.join(","),
                    resource.clone(),
                    tasks.to_string(),
                    (p * tasks).to_string(),
                    start.to_string(),
                    stop.to_string(),
                ])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut grants = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let v: Vec<u128> = line.split(' ').filter_map(|x| x.parse().ok()).collect();
            if let [n, c, g, r] = v[..] {
                grants.push((n as usize, c, g, r));
            }
        }
    }
    grants
}

/// The hand-off floor: the shortest release-to-grant gap any
/// notification-driven client could reach here, with nothing but redis-rs.
/// A waiter holds one plain pub/sub connection per node, subscribed to one
/// channel; the releaser's script deletes the key and publishes on it (the
/// same work as ours), sent to every node at once; at the first message the
/// waiter sends `SET NX PX` to every node and is granted at the quorum-th
/// OK (again at each later message, if that attempt fell short). Timed from
/// the release's start, as scenario 6 times ours. `rounds` hand-offs, one
/// after another.
pub(crate) async fn handoff_floor(urls: &[String], rounds: usize) -> Samples {
    use redis::AsyncCommands;
    let key = format!("bench:handoff-floor:{}", crate::subjects::token());
    let channel = format!("{key}:released");
    let mut streams = Vec::new();
    for u in urls {
        let mut pubsub = redis::Client::open(u.as_str())
            .unwrap()
            .get_async_pubsub()
            .await
            .unwrap();
        pubsub.subscribe(&channel).await.unwrap();
        streams.push(pubsub.into_on_message());
    }
    let mut messages = futures::stream::select_all(streams);
    let release = redis::Script::new(
        r#"if redis.call("get", KEYS[1]) == ARGV[1] then
    redis.call("del", KEYS[1])
    redis.call("publish", KEYS[2], "released")
    return 1
end
return 0"#,
    );
    let mut conns = Vec::new();
    for u in urls {
        let client = redis::Client::open(u.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        // load the script, so that the timed releases are EVALSHAs
        let _: Option<String> = conn.get("bench:warm").await.unwrap();
        let _: i64 = release
            .key(&key)
            .key(&channel)
            .arg("none")
            .invoke_async(&mut conn)
            .await
            .unwrap();
        conns.push(conn);
    }
    let mut gaps = Samples::default();
    for _ in 0..rounds {
        let token = crate::subjects::token();
        let now = std::time::Instant::now();
        if acquire_all(&conns, &key, &token, now).await.is_none() {
            break;
        }
        tokio::time::sleep(HOLD).await;
        // what earlier releases left in the streams is no notification
        while messages.next().now_or_never().flatten().is_some() {}
        let started = std::time::Instant::now();
        let releases: FuturesUnordered<_> = conns
            .iter()
            .map(|c| {
                let mut c = c.clone();
                let mut call = release.key(&key);
                call.key(&channel).arg(&token);
                async move {
                    let _: Result<i64, _> = call.invoke_async(&mut c).await;
                }
            })
            .collect();
        let next = crate::subjects::token();
        let waiter = async {
            while let Some(_message) = messages.next().await {
                let granted = acquire_all(&conns, &key, &next, started).await;
                if granted.is_some() {
                    return granted;
                }
            }
            None
        };
        let (_, granted) = tokio::join!(releases.collect::<Vec<()>>(), waiter);
        let Some(gap) = granted else {
            break;
        };
        gaps.push(gap);
        let releases: FuturesUnordered<_> = conns
            .iter()
            .map(|c| {
                let mut c = c.clone();
                let mut call = release.key(&key);
                call.key(&channel).arg(&next);
                async move {
                    let _: Result<i64, _> = call.invoke_async(&mut c).await;
                }
            })
            .collect();
        releases.collect::<Vec<()>>().await;
    }
    gaps
}

/// `SET key token NX PX GET` on every connection at once: the time from
/// `since` to the quorum-th node that holds `token` (set now, or by an
/// earlier try), or `None` if fewer did. Waits for every reply, so that no
/// request is still in flight when the caller releases.
async fn acquire_all(
    conns: &[redis::aio::MultiplexedConnection],
    key: &str,
    token: &str,
    since: std::time::Instant,
) -> Option<Duration> {
    let quorum = conns.len() / 2 + 1;
    let mut replies: FuturesUnordered<_> = conns
        .iter()
        .map(|c| {
            let mut c = c.clone();
            let mut cmd = redis::cmd("SET");
            cmd.arg(key)
                .arg(token)
                .arg("NX")
                .arg("PX")
                .arg(TTL.as_millis() as u64)
                .arg("GET");
            async move { cmd.query_async::<Option<String>>(&mut c).await }
        })
        .collect();
    let (mut held, mut at) = (0, None);
    while let Some(reply) = replies.next().await {
        if matches!(&reply, Ok(None)) || matches!(&reply, Ok(Some(old)) if old == token) {
            held += 1;
            if held == quorum {
                at = Some(since.elapsed());
            }
        }
    }
    at
}
