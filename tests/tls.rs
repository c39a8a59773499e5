//! TLS (feature `tls`): `rediss://` nodes with a throwaway CA made here by
//! `openssl`, a wrong CA (a clear error, and that node never counts), and
//! mutual TLS. The nodes are real `redis-server` processes with a TLS port
//! beside their plain one (the harness uses the plain one to look).
#![cfg(feature = "tls")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use redlock_harness::server::free_port;
use redlock_harness::{RedisServer, resource};
use redlock_quorum::{Error, NodeError, Redlock, TlsConfig};

const TTL: Duration = Duration::from_secs(10);

/// A CA, a server certificate for 127.0.0.1 and a client certificate, all
/// made with `openssl` in a fresh temporary directory.
struct Pki {
    dir: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Pki {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "redlock-tls-{name}-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_subject = format!("/CN=redlock-test-ca-{name}");
        openssl(
            &dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-subj",
                &ca_subject,
            ],
        );
        std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
        for who in ["server", "client"] {
            openssl(
                &dir,
                &[
                    "req",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-keyout",
                    &format!("{who}.key"),
                    "-out",
                    &format!("{who}.csr"),
                    "-subj",
                    &format!("/CN={who}"),
                ],
            );
            openssl(
                &dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &format!("{who}.csr"),
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "1",
                    "-extfile",
                    "san.ext",
                    "-out",
                    &format!("{who}.crt"),
                ],
            );
        }
        Pki { dir }
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).to_string_lossy().into_owned()
    }

    fn read(&self, file: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(file)).unwrap()
    }

    fn ca(&self) -> TlsConfig {
        TlsConfig::new().ca_pem(self.read("ca.crt"))
    }

    /// A node with a TLS port (returned) beside its plain one.
    fn node(&self, client_certificates: bool) -> (RedisServer, u16) {
        let auth = if client_certificates { "yes" } else { "no" };
        // A fresh TLS port for each try: another test's server may take the
        // one `free_port` found before this server binds it.
        let tls_port = std::cell::Cell::new(0);
        let server = RedisServer::start_with_ports(|| {
            tls_port.set(free_port());
            [
                "--tls-port",
                &tls_port.get().to_string(),
                "--tls-cert-file",
                &self.path("server.crt"),
                "--tls-key-file",
                &self.path("server.key"),
                "--tls-ca-cert-file",
                &self.path("ca.crt"),
                "--tls-auth-clients",
                auth,
            ]
            .map(str::to_owned)
            .to_vec()
        });
        (server, tls_port.get())
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether `key` exists on `server` (looked at through its plain port).
fn exists(server: &RedisServer, key: &str) -> bool {
    redlock_harness::raw::exists(&server.url(), key)
}

fn rediss(port: u16) -> String {
    format!("rediss://127.0.0.1:{port}/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_nodes_with_a_custom_ca() {
    let pki = Pki::new("ok");
    let nodes: Vec<_> = (0..3).map(|_| pki.node(false)).collect();
    let urls: Vec<String> = nodes.iter().map(|(_, p)| rediss(*p)).collect();
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .tls(pki.ca())
        .connect_timeout(Duration::from_secs(2))
        .node_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let res = resource("tls");
    let lock = redlock.lock(&res, TTL).await.unwrap();
    let lock = redlock.extend(&lock, TTL).await.unwrap();
    assert_eq!(redlock.fencing_token(&lock).await.unwrap(), 1);
    assert_eq!(redlock.unlock(&lock).await.unwrap(), 3);
    assert!(nodes.iter().all(|(s, _)| !exists(s, &res)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_is_a_clear_error_and_that_node_never_counts() {
    let pki = Pki::new("server");
    let other = Pki::new("other");
    let plain: Vec<RedisServer> = (0..2).map(|_| RedisServer::start()).collect();
    let (tls_node, tls_port) = pki.node(false);
    // two plain nodes and one that we do not trust
    let urls = [plain[0].url(), plain[1].url(), rediss(tls_port)];
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .tls(other.ca())
        .connect_timeout(Duration::from_secs(2))
        .node_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let res = resource("tls-wrong-ca");
    let lock = redlock.lock(&res, TTL).await.unwrap();
    // the untrusted node took nothing: the lock stands on the other two
    assert!(!exists(&tls_node, &res));
    assert_eq!(redlock.unlock(&lock).await.unwrap(), 2);

    // alone with untrusted nodes, nothing is granted and the cause is named
    let (n1, p1) = pki.node(false);
    let (n2, p2) = pki.node(false);
    let urls = [rediss(tls_port), rediss(p1), rediss(p2)];
    let untrusted = Redlock::builder(urls.iter().map(String::as_str))
        .tls(other.ca())
        .retry_count(1)
        .retry_delay(Duration::from_millis(10))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let err = untrusted.lock(&res, TTL).await.expect_err("untrusted");
    let text = err.to_string().to_lowercase();
    assert!(
        matches!(
            err,
            Error::NoQuorum { granted: 0, .. } | Error::Redis { granted: 0, .. }
        ),
        "{err}"
    );
    assert!(
        text.contains("certificate") || text.contains("issuer"),
        "{err}"
    );
    for node in [&tls_node, &n1, &n2] {
        assert!(!exists(node, &res));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_identity() {
    let pki = Pki::new("mtls");
    let nodes: Vec<_> = (0..3).map(|_| pki.node(true)).collect();
    let urls: Vec<String> = nodes.iter().map(|(_, p)| rediss(*p)).collect();
    let res = resource("mtls");

    let anonymous = Redlock::builder(urls.iter().map(String::as_str))
        .tls(pki.ca())
        .retry_count(0)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    anonymous
        .try_lock(&res, TTL)
        .await
        .expect_err("no client certificate");

    let identified = Redlock::builder(urls.iter().map(String::as_str))
        .tls(
            pki.ca()
                .client_identity_pem(pki.read("client.crt"), pki.read("client.key")),
        )
        // every node must answer the unlock below: timeouts for a loaded
        // machine (500 ms gave 2 of 3 beside four CPU burners)
        .connect_timeout(Duration::from_secs(5))
        .node_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let lock = identified.try_lock(&res, TTL).await.unwrap();
    assert!(nodes.iter().all(|(s, _)| exists(s, &res)) || identified.verify(&lock).await.unwrap());
    assert_eq!(identified.unlock(&lock).await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_the_node_does_not_trust_is_a_tls_error_not_retried() {
    let pki = Pki::new("alert");
    let other = Pki::new("alert-other");
    let nodes: Vec<_> = (0..3).map(|_| pki.node(true)).collect();
    let urls: Vec<String> = nodes.iter().map(|(_, p)| rediss(*p)).collect();
    // We trust the nodes' CA, but our identity comes from another CA: each
    // node answers the handshake with a fatal alert (UnknownCA).
    let stranger = Redlock::builder(urls.iter().map(String::as_str))
        .tls(
            pki.ca()
                .client_identity_pem(other.read("client.crt"), other.read("client.key")),
        )
        // Were the alert taken for an unreachable node, these retries would
        // run and the error would be `NoQuorum` of unreachable nodes.
        .retry_count(50)
        .retry_delay(Duration::from_millis(100))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let res = resource("tls-alert");
    let err = stranger
        .lock(&res, TTL)
        .await
        .expect_err("untrusted client");
    let Error::Redis { failures, .. } = &err else {
        panic!("a permanent TLS failure on every node, got: {err}")
    };
    assert_eq!(failures.len(), 3, "{err}");
    for failure in failures {
        assert!(matches!(failure.cause, NodeError::Tls(_)), "{err}");
        assert!(!failure.cause.is_transient(), "{err}");
    }
    assert!(err.to_string().contains("TLS"), "{err}");
    assert!(nodes.iter().all(|(s, _)| !exists(s, &res)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_url_to_a_tls_port_hints_at_rediss() {
    let pki = Pki::new("plain-to-tls");
    let nodes: Vec<_> = (0..3).map(|_| pki.node(false)).collect();
    let urls: Vec<String> = nodes
        .iter()
        .map(|(_, p)| format!("redis://127.0.0.1:{p}/"))
        .collect();
    let redlock = Redlock::builder(urls.iter().map(String::as_str))
        .retry_count(0)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let res = resource("plain-to-tls");
    let err = redlock
        .try_lock(&res, TTL)
        .await
        .expect_err("TLS-only port");
    assert!(err.to_string().contains("rediss://"), "{err}");
    assert!(nodes.iter().all(|(s, _)| !exists(s, &res)));
}
