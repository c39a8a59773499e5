//! The fault-injecting proxy does what it says, so that the fault tests and
//! benchmarks that rely on it measure what they claim: in front of a real
//! `redis-server` it forwards, delays replies or requests, blackholes, drops
//! replies, resets, and heals.

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redlock_harness::RedisServer;
use redlock_harness::proxy::{Fault, Proxy};

async fn conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_forwards_delays_blackholes_drops_and_resets() {
    let server = RedisServer::start();
    let proxy = Proxy::to_port(server.port()).await;
    let mut c = conn(&proxy.url()).await;

    // forwards
    let _: () = c.set("k", "v").await.unwrap();
    assert_eq!(c.get::<_, String>("k").await.unwrap(), "v");

    // latency: at least the delay, on every reply
    proxy.set(Fault::Latency(Duration::from_millis(30)));
    let t = Instant::now();
    let _: String = c.get("k").await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(30),
        "{:?}",
        t.elapsed()
    );
    proxy.set(Fault::NONE);

    // drop replies: the command runs on the node, then the connection breaks
    proxy.set(Fault::DropReplies);
    let r = tokio::time::timeout(Duration::from_secs(2), c.set::<_, _, ()>("dropped", "1")).await;
    assert!(
        matches!(r, Ok(Err(_))),
        "expected a broken connection, got {r:?}"
    );
    let direct: Option<String> = conn(&server.url()).await.get("dropped").await.unwrap();
    assert_eq!(direct.as_deref(), Some("1"), "the command ran on the node");
    proxy.set(Fault::NONE);
    let mut c = conn(&proxy.url()).await;

    // blackhole: nothing moves while it lasts; the command arrives late, in
    // order, when it heals
    proxy.set(Fault::Blackhole);
    let fresh = conn_nowait(&proxy.url()).await;
    assert!(
        fresh.is_none(),
        "a new connection through the blackhole cannot say hello"
    );
    let late = tokio::spawn({
        let mut c = c.clone();
        async move { c.set::<_, _, ()>("hole", "1").await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!late.is_finished(), "a reply came through the blackhole");
    let direct: Option<String> = conn(&server.url()).await.get("hole").await.unwrap();
    assert_eq!(direct, None, "the command crossed the partition");
    proxy.set(Fault::NONE);
    late.await
        .unwrap()
        .expect("delivered after the partition healed");
    let direct: Option<String> = conn(&server.url()).await.get("hole").await.unwrap();
    assert_eq!(direct.as_deref(), Some("1"));
    assert_eq!(
        c.get::<_, String>("k").await.unwrap(),
        "v",
        "replies still match requests"
    );

    // reset: live and new connections fail fast
    proxy.set(Fault::Reset);
    let r = tokio::time::timeout(Duration::from_secs(2), c.get::<_, String>("k")).await;
    assert!(
        matches!(r, Ok(Err(_))),
        "expected a connection error, got {r:?}"
    );
    let fresh = tokio::time::timeout(
        Duration::from_secs(2),
        redis::Client::open(proxy.url())
            .unwrap()
            .get_multiplexed_async_connection(),
    )
    .await;
    assert!(
        matches!(fresh, Ok(Err(_))),
        "a new connection got through the reset"
    );

    // healed
    proxy.set(Fault::NONE);
    let mut c = conn(&proxy.url()).await;
    assert_eq!(c.get::<_, String>("k").await.unwrap(), "v");
    assert!(proxy.connections() >= 3);
}

/// Tries to connect through the proxy for 200 ms; `None` if it could not.
async fn conn_nowait(url: &str) -> Option<redis::aio::MultiplexedConnection> {
    tokio::time::timeout(
        Duration::from_millis(200),
        redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection(),
    )
    .await
    .ok()
    .and_then(Result::ok)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_latency_holds_requests_and_every_connection_is_counted() {
    let server = RedisServer::start();
    let proxy = Proxy::to_port(server.port()).await;
    assert_eq!(proxy.connections(), 0);
    let mut c = conn(&proxy.url()).await;
    assert_eq!(proxy.fault(), Fault::NONE);

    // requests are held before they go upstream: a write is not on the node
    // before the delay, and is once the reply is back
    proxy.set(Fault::RequestLatency(Duration::from_millis(300)));
    assert_eq!(
        proxy.fault(),
        Fault::RequestLatency(Duration::from_millis(300))
    );
    let t = Instant::now();
    let write = tokio::spawn({
        let mut c = c.clone();
        async move { c.set::<_, _, ()>("held", "1").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let direct: Option<String> = conn(&server.url()).await.get("held").await.unwrap();
    assert_eq!(direct, None, "the request went upstream before its delay");
    write.await.unwrap().expect("delivered after the delay");
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    let direct: Option<String> = conn(&server.url()).await.get("held").await.unwrap();
    assert_eq!(direct.as_deref(), Some("1"));

    // healed: no delay to speak of, and a second client is a second
    // connection
    proxy.set(Fault::NONE);
    let _: String = c.get("held").await.unwrap();
    let mut second = conn(&proxy.url()).await;
    assert_eq!(second.get::<_, String>("held").await.unwrap(), "1");
    assert_eq!(proxy.connections(), 2);
}
