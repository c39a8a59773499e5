//! Hostile nodes and odd input, table-driven: each case gives a typed error
//! or works correctly, never panics, and leaves no key of ours behind.

use std::time::Duration;

use redlock_harness::{RedisServer, resource};
use redlock_quorum::{Error, Redlock};

const TTL: Duration = Duration::from_secs(10);

/// Whether any of the servers holds `key` (checked with the right password).
fn key_anywhere(servers: &[RedisServer], key: &str, password: Option<&str>) -> bool {
    servers.iter().any(|s| {
        let url = match password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}/", s.port()),
            None => s.url(),
        };
        redlock_harness::raw::exists(&url, key)
    })
}

fn five(extra: &[&str]) -> Vec<RedisServer> {
    (0..5).map(|_| RedisServer::start_with(extra)).collect()
}

type Check = fn(&Result<(), Error>) -> bool;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_nodes_give_typed_errors_and_leave_nothing_behind() {
    // Servers shared by the cases.
    let secured = five(&["--requirepass", "s3cret"]);
    let plain = five(&[]);
    let upstream = RedisServer::start();
    let upstream_port = upstream.port().to_string();
    let replicas: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with(&["--replicaof", "127.0.0.1", &upstream_port]))
        .collect();
    let no_scripts: Vec<RedisServer> = (0..3)
        .map(|_| {
            RedisServer::start_with(&[
                "--user",
                "default",
                "on",
                "nopass",
                "~*",
                "&*",
                "+@all",
                "-@scripting",
            ])
        })
        .collect();

    let url_with = |s: &RedisServer, auth: &str| format!("redis://{auth}127.0.0.1:{}/", s.port());
    struct Case {
        name: &'static str,
        urls: Vec<String>,
        check_servers: Vec<u16>,
        password: Option<&'static str>,
        resource: String,
        ttl: Duration,
        expect: Check,
    }
    let ports = |v: &[RedisServer]| v.iter().map(RedisServer::port).collect::<Vec<_>>();
    let cases = vec![
        Case {
            name: "no password on password-protected nodes (NOAUTH)",
            urls: secured.iter().map(|s| url_with(s, "")).collect(),
            check_servers: ports(&secured),
            password: Some("s3cret"),
            resource: resource("h-noauth"),
            ttl: TTL,
            expect: |r| matches!(r, Err(Error::Redis { .. })),
        },
        Case {
            name: "wrong password",
            urls: secured.iter().map(|s| url_with(s, ":wrong@")).collect(),
            check_servers: ports(&secured),
            password: Some("s3cret"),
            resource: resource("h-wrongpass"),
            ttl: TTL,
            expect: |r| matches!(r, Err(Error::Redis { .. })),
        },
        Case {
            name: "right password",
            urls: secured.iter().map(|s| url_with(s, ":s3cret@")).collect(),
            check_servers: ports(&secured),
            password: Some("s3cret"),
            resource: resource("h-pass"),
            ttl: TTL,
            expect: |r| r.is_ok(),
        },
        Case {
            name: "a majority of read-only replicas (READONLY)",
            urls: replicas
                .iter()
                .map(RedisServer::url)
                .chain(plain[..2].iter().map(RedisServer::url))
                .collect(),
            check_servers: ports(&plain[..2]),
            password: None,
            resource: resource("h-readonly"),
            ttl: TTL,
            expect: |r| matches!(r, Err(Error::Redis { .. })),
        },
        Case {
            name: "a majority that refuses scripts (NOPERM)",
            urls: no_scripts
                .iter()
                .map(RedisServer::url)
                .chain(plain[..2].iter().map(RedisServer::url))
                .collect(),
            check_servers: ports(&plain[..2]),
            password: None,
            resource: resource("h-noscript"),
            // the lock itself works there (SET is allowed); its release does
            // not, so the keys on those nodes live out this short ttl
            ttl: Duration::from_millis(300),
            expect: |r| matches!(r, Err(Error::Redis { .. })),
        },
        Case {
            name: "binary resource name",
            urls: plain.iter().map(RedisServer::url).collect(),
            check_servers: ports(&plain),
            password: None,
            resource: format!("{}\0\u{1F512}\r\n*3\r\n$3\r\nDEL", resource("h-binary")),
            ttl: TTL,
            expect: |r| r.is_ok(),
        },
        Case {
            name: "64 KiB resource name",
            urls: plain.iter().map(RedisServer::url).collect(),
            check_servers: ports(&plain),
            password: None,
            resource: format!("{}{}", resource("h-long"), "x".repeat(64 * 1024)),
            ttl: TTL,
            expect: |r| r.is_ok(),
        },
        Case {
            name: "ttl of one millisecond",
            urls: plain.iter().map(RedisServer::url).collect(),
            check_servers: ports(&plain),
            password: None,
            resource: resource("h-1ms"),
            ttl: Duration::from_millis(1),
            expect: |r| matches!(r, Err(Error::TtlNotAboveDrift { .. })),
        },
    ];

    let mut failures = Vec::new();
    for case in &cases {
        // timeouts far above the defaults: no case is about a slow node,
        // and a loaded machine may be slower than 50 ms
        let redlock = Redlock::builder(case.urls.iter().map(String::as_str))
            .retry_count(1)
            .retry_delay(Duration::from_millis(5))
            .node_timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_secs(5))
            .build()
            .expect("valid configuration");
        // lock, extend and unlock; the first failure is the case's outcome
        let outcome: Result<(), Error> = async {
            let lock = redlock.lock(&case.resource, case.ttl).await?;
            assert_eq!(
                lock.keys().collect::<Vec<_>>(),
                [case.resource.as_str()],
                "{}: the key is the resource",
                case.name
            );
            let lock = match redlock.extend(&lock, case.ttl).await {
                Ok(l) => l,
                Err(e) => {
                    let _ = redlock.unlock(&lock).await;
                    return Err(e);
                }
            };
            redlock.unlock(&lock).await.map(|_| ())
        }
        .await;
        let ok = (case.expect)(&outcome);
        // wait out the ttl where the node would not let us release
        if case.ttl < Duration::from_secs(1) {
            tokio::time::sleep(case.ttl + Duration::from_millis(50)).await;
        }
        let servers: Vec<&RedisServer> = secured
            .iter()
            .chain(&plain)
            .chain(&no_scripts)
            .filter(|s| case.check_servers.contains(&s.port()))
            .collect();
        let leaked = servers
            .iter()
            .any(|s| key_anywhere(std::slice::from_ref(*s), &case.resource, case.password));
        let no_scripts_leak =
            case.ttl < Duration::from_secs(1) && key_anywhere(&no_scripts, &case.resource, None);
        println!(
            "{:<55} {:?}",
            case.name,
            outcome.as_ref().map_err(|e| e.to_string())
        );
        if !ok || leaked || no_scripts_leak {
            failures.push(format!(
                "{}: outcome {outcome:?}, key left {leaked}",
                case.name
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn duplicate_nodes_and_an_empty_list_are_rejected() {
    assert!(matches!(
        Redlock::new(["redis://127.0.0.1:1/", "redis://127.0.0.1:1"]),
        Err(Error::DuplicateNode { .. })
    ));
    assert!(matches!(
        Redlock::new(Vec::<&str>::new()),
        Err(Error::EmptyNodeList)
    ));
}
