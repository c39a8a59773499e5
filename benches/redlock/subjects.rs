//! The three subjects, side by side on the same nodes: our `Redlock`,
//! `rslock` 0.10, and the floor (raw `SET NX PX` with plain redis-rs).

use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use redis::aio::MultiplexedConnection;
use redlock_quorum::Redlock;

use crate::TTL;

/// The three subjects, built over one list of node URLs.
pub(crate) struct Subjects {
    ours: Redlock,
    rslock: rslock::LockManager,
    floor: Floor,
}

impl Subjects {
    pub(crate) async fn new(urls: &[String]) -> Self {
        let ours = Redlock::builder(urls.iter().map(String::as_str))
            .retry_count(0)
            .build()
            .unwrap();
        let rslock = rslock::LockManager::new(urls.to_vec());
        let floor = Floor::connect(urls).await;
        let s = Subjects {
            ours,
            rslock,
            floor,
        };
        // warm every connection
        for _ in 0..3 {
            let r = format!("warm:{}", token());
            let _ = s.acquire_release(Subject::Ours, &r, TTL).await;
            let _ = s.acquire_release(Subject::Rslock, &r, TTL).await;
            let _ = s.acquire_release(Subject::Floor, &r, TTL).await;
        }
        s
    }

    /// One acquisition and release; (acquire time, release time, validity
    /// left at acquisition). `None` when the acquisition failed.
    pub(crate) async fn acquire_release(
        &self,
        who: Subject,
        resource: &str,
        ttl: Duration,
    ) -> Option<(Duration, Duration, Duration)> {
        self.cycle(who, resource, ttl, true).await
    }

    /// As `acquire_release`; with `release` false the lock is left to expire
    /// (the fault scenarios time acquisition only, on fresh resources).
    pub(crate) async fn cycle(
        &self,
        who: Subject,
        resource: &str,
        ttl: Duration,
        release: bool,
    ) -> Option<(Duration, Duration, Duration)> {
        match who {
            Subject::Ours => {
                let t = Instant::now();
                let lock = self.ours.try_lock(resource, ttl).await.ok()?;
                let acquire = t.elapsed();
                let validity = lock.validity();
                let t = Instant::now();
                if release {
                    let _ = self.ours.unlock(&lock).await;
                }
                Some((acquire, t.elapsed(), validity))
            }
            Subject::Rslock => {
                let t = Instant::now();
                let lock = self.rslock.lock(resource, ttl).await.ok()?;
                let acquire = t.elapsed();
                let validity = Duration::from_millis(lock.validity_time as u64);
                let t = Instant::now();
                if release {
                    self.rslock.unlock(&lock).await;
                }
                Some((acquire, t.elapsed(), validity))
            }
            Subject::Floor => {
                let (acquire, token) = self.floor.acquire(resource, ttl).await?;
                let drift = ttl.mul_f64(0.01) + Duration::from_millis(2);
                let validity = ttl.saturating_sub(acquire + drift);
                let t = Instant::now();
                if release {
                    self.floor.release(resource, &token).await;
                }
                Some((acquire, t.elapsed(), validity))
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Subject {
    Ours,
    Rslock,
    Floor,
}

impl Subject {
    pub(crate) const ALL: [Subject; 3] = [Subject::Ours, Subject::Rslock, Subject::Floor];
    pub(crate) fn name(self) -> &'static str {
        match self {
            Subject::Ours => "redlock-quorum",
            Subject::Rslock => "rslock 0.10",
            Subject::Floor => "floor",
        }
    }
}

/// The floor: plain redis-rs, one multiplexed connection per node, `SET NX
/// PX` to all nodes at once, timed to the quorum-th OK; the release is the
/// same token-checked script, sent to all nodes. Each request bounded by
/// 50 ms, as ours are by default.
pub(crate) struct Floor {
    conns: Vec<MultiplexedConnection>,
}

pub(crate) const FLOOR_TIMEOUT: Duration = Duration::from_millis(50);

impl Floor {
    pub(crate) async fn connect(urls: &[String]) -> Self {
        let mut conns = Vec::new();
        for u in urls {
            let client = redis::Client::open(u.as_str()).unwrap();
            conns.push(client.get_multiplexed_async_connection().await.unwrap());
        }
        Floor { conns }
    }

    pub(crate) async fn acquire(&self, key: &str, ttl: Duration) -> Option<(Duration, String)> {
        let token = token();
        let quorum = self.conns.len() / 2 + 1;
        let start = Instant::now();
        let mut pending: FuturesUnordered<_> = self
            .conns
            .iter()
            .map(|c| {
                let mut c = c.clone();
                let cmd = redis::cmd("SET")
                    .arg(key)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl.as_millis() as u64)
                    .clone();
                async move {
                    tokio::time::timeout(FLOOR_TIMEOUT, cmd.query_async::<Option<String>>(&mut c))
                        .await
                }
            })
            .collect();
        let mut ok = 0;
        let mut at = None;
        while let Some(r) = pending.next().await {
            if matches!(r, Ok(Ok(Some(_)))) {
                ok += 1;
                if ok == quorum {
                    at = Some(start.elapsed());
                    break;
                }
            }
        }
        // the rest finish untimed, in the background (bounded by the timeout)
        tokio::spawn(async move { while pending.next().await.is_some() {} });
        at.map(|t| (t, token))
    }

    pub(crate) async fn release(&self, key: &str, token: &str) {
        let script = redis::Script::new(
            r#"if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end"#,
        );
        let script = &script;
        let all: FuturesUnordered<_> = self
            .conns
            .iter()
            .map(|c| {
                let mut c = c.clone();
                async move {
                    let mut call = script.key(key);
                    call.arg(token);
                    let _ =
                        tokio::time::timeout(FLOOR_TIMEOUT, call.invoke_async::<i64>(&mut c)).await;
                }
            })
            .collect();
        all.collect::<Vec<()>>().await;
    }
}

pub(crate) fn token() -> String {
    use rand::RngExt;
    format!("{:032x}", rand::rng().random::<u128>())
}
