//! Tracing: quiet at `info` on the happy path, a warning when a lock is
//! lost, node failures at `debug`, and never a token or a password.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlock_harness::{Cluster, resource};
use redlock_quorum::Redlock;
use tracing_subscriber::fmt::MakeWriter;

/// Everything the subscriber wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Runs `body` on a current-thread runtime with a subscriber at `level`
/// installed for this thread, and returns what it wrote.
fn capture<F, Fut>(level: tracing::Level, body: F) -> String
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(captured.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(body());
    captured.text()
}

#[test]
fn the_happy_path_is_quiet_at_info() {
    let cluster = Cluster::start(5);
    let redlock = cluster.redlock();
    let out = capture(tracing::Level::INFO, || async {
        for _ in 0..5 {
            let lock = redlock
                .lock(&resource("quiet"), Duration::from_secs(5))
                .await
                .unwrap();
            redlock.extend(&lock, Duration::from_secs(5)).await.unwrap();
            redlock.unlock(&lock).await.unwrap();
        }
        let guard = redlock
            .acquire(&resource("quiet-guard"), Duration::from_millis(300))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(guard.renewals() > 0);
        guard.release().await.unwrap();
    });
    // The harness's nodes run without AOF, which is warned about once per
    // node (see below); apart from that, nothing.
    let other: Vec<&str> = out
        .lines()
        .filter(|l| !l.contains("without AOF persistence"))
        .collect();
    assert!(
        other.is_empty(),
        "nothing at info on the happy path: {other:?}"
    );
    // at most once per node (a node whose replies come after the quorum,
    // on a loaded machine, may be looked at after the capture ended)
    assert!(out.lines().count() <= 5, "{out}");
}

#[test]
fn a_loss_is_a_warning_and_failures_are_debug_without_secrets() {
    let mut cluster = Cluster::start(3);
    for i in 0..3 {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg("s3cret-pass")
            .query(&mut cluster.conn(i))
            .unwrap();
    }
    let urls: Vec<String> = (0..3)
        .map(|i| format!("redis://:s3cret-pass@127.0.0.1:{}/", cluster.node(i).port()))
        .collect();
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .node_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let res = resource("lost");
    let mut token = String::new();
    let out = capture(tracing::Level::DEBUG, || async {
        let guard = redlock
            .acquire(&res, Duration::from_millis(600))
            .await
            .unwrap();
        token = guard.lock().token().to_owned();
        // a majority gone: renewals fail until the lock is lost
        cluster.node(0).kill();
        cluster.node(1).kill();
        let reason = guard.lost().await;
        assert!(!guard.is_held(), "{reason}");
    });
    assert!(out.contains("WARN"), "{out}");
    assert!(out.contains("lock lost"), "{out}");
    assert!(out.contains(&res), "the resource is named: {out}");
    assert!(out.contains("node did not agree"), "{out}");
    assert!(out.contains("renewal failed"), "{out}");
    assert!(!out.contains(&token), "a token was recorded: {out}");
    assert!(
        !out.contains("s3cret-pass"),
        "a password was recorded: {out}"
    );
}

#[test]
fn a_node_without_persistence_is_named_once() {
    let cluster = Cluster::start(3);
    let redlock = cluster.redlock();
    let out = capture(tracing::Level::WARN, || async {
        for _ in 0..3 {
            let lock = redlock
                .lock(&resource("aof"), Duration::from_secs(5))
                .await
                .unwrap();
            redlock.unlock(&lock).await.unwrap();
        }
    });
    // the harness's nodes run without AOF: one warning per node, once
    assert_eq!(out.matches("without AOF persistence").count(), 3, "{out}");
    let even = capture(tracing::Level::WARN, || async {
        let _ = Redlock::new(["redis://127.0.0.1:1/", "redis://127.0.0.1:2/"]).unwrap();
    });
    assert!(even.contains("even number of nodes"), "{even}");
}

#[test]
fn events_carry_the_node_the_cause_and_the_attempt() {
    let mut cluster = Cluster::start(3);
    let down_port = cluster.node(2).port();
    cluster.node(2).kill();
    let redlock = cluster
        .builder()
        .retry_count(2)
        .retry_delay(Duration::from_millis(10))
        .retry_jitter(Duration::from_millis(1))
        .build()
        .unwrap();
    let res = resource("fields");
    cluster.plant(&[0, 1], &res, "other-holder", Duration::from_secs(10));
    let out = capture(tracing::Level::DEBUG, || async {
        let err = redlock
            .lock(&res, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(err, redlock_quorum::Error::Conflict { .. }),
            "{err}"
        );
    });
    // Every attempt's span, numbered, inside the lock's span, with the
    // resource as a field. Up to 3 attempts (retry_count 2); the retry
    // budget counts the time actually slept, so on a loaded machine, whose
    // timers fire late, the third may not start: at least 2.
    for n in 0..2 {
        assert!(
            out.contains(&format!("attempt{{n={n}}}")),
            "attempt {n}: {out}"
        );
    }
    assert!(
        out.contains(&format!("resource=\"{res}\"")) || out.contains(&format!("resource={res}")),
        "{out}"
    );
    // The down node's failure names the node and why.
    let failed: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("node did not agree") && l.contains(&down_port.to_string()))
        .collect();
    assert!(!failed.is_empty(), "{out}");
    assert!(
        failed
            .iter()
            .all(|l| l.contains("cause=") && l.contains("node=")),
        "{failed:?}"
    );
    // Each retry is an event with its attempt number and the error.
    assert!(out.contains("attempt failed; waiting"), "{out}");
    assert!(out.contains("attempt=0"), "{out}");
}
