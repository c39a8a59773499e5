//! Real `redis-server` processes on free loopback ports, stopped on drop.

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The `redis-server` binary: `$REDIS_SERVER`, or the one on `PATH`.
pub fn redis_server_binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// Whether a `redis-server` binary can be run here.
pub fn redis_server_available() -> bool {
    Command::new(redis_server_binary())
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A free loopback port: bind port 0, read the port, let it go.
pub fn free_port() -> u16 {
    TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

static NEXT_DIR: AtomicU64 = AtomicU64::new(0);

/// One `redis-server` process that this harness started. It can be paused,
/// resumed, killed and restarted on the same port; it is killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
    paused: bool,
}

impl RedisServer {
    /// Starts a node with no persistence (`--save "" --appendonly no`).
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a node with extra `--option value` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_with_ports(|| extra.iter().map(|s| s.to_string()).collect())
    }

    /// As [`RedisServer::start_with`], with the extra arguments made anew
    /// for each try: for arguments that name a port of their own (a TLS
    /// port, say), which another process may also take before the server
    /// binds it.
    pub fn start_with_ports(extra: impl Fn() -> Vec<String>) -> Self {
        let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("redlock-quorum-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        // A port freed by `free_port` can be taken by someone else before the
        // server binds it; try a few.
        let mut reasons = Vec::new();
        for _ in 0..10 {
            let mut server = RedisServer {
                port: free_port(),
                dir: dir.clone(),
                extra: extra(),
                child: None,
                paused: false,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => reasons.push(e),
            }
        }
        panic!(
            "could not start {} ({reasons:?}; is it installed?)",
            redis_server_binary()
        );
    }

    fn spawn(&mut self) -> Result<(), String> {
        // A failed try's server was dropped, and its drop removed the
        // directory that the next try shares.
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let mut cmd = Command::new(redis_server_binary());
        cmd.args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--protected-mode", "no"])
            .args(["--daemonize", "no"])
            .args(["--loglevel", "warning"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                // Its log went to stdout: say why it stopped.
                // A bad argument is reported on stderr, before the log.
                let mut log = String::new();
                if let Some(mut out) = child.stdout.take() {
                    use std::io::Read;
                    let _ = out.read_to_string(&mut log);
                }
                if let Some(mut err) = child.stderr.take() {
                    use std::io::Read;
                    let _ = err.read_to_string(&mut log);
                }
                let last = log
                    .lines()
                    .rfind(|l| !l.trim().is_empty())
                    .unwrap_or_default()
                    .to_owned();
                return Err(format!("port {}: exited {status}: {last}", self.port));
            }
            if self.pings() {
                // Another test's server may have taken the port between
                // `free_port` and this bind, and answered the ping while
                // ours fails to bind: the server that answers must be ours.
                if let Some(pid) = self.answering_pid()
                    && pid != child.id()
                {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("port {}: taken by process {pid}", self.port));
                }
                // Nobody reads its log from here on (the server ignores
                // SIGPIPE, so a closed pipe cannot stop it).
                drop(child.stdout.take());
                drop(child.stderr.take());
                self.child = Some(child);
                self.paused = false;
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        Err("redis-server did not answer PING".into())
    }

    /// The `process_id` of the server that answers on the port, when it
    /// tells (a password-protected one does not).
    fn answering_pid(&self) -> Option<u32> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).ok()?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .ok()?;
        let info: String = redis::cmd("INFO").arg("server").query(&mut conn).ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Whether the server answers at all (a password-protected one answers
    /// `PING` with a `NOAUTH` error, which counts).
    fn pings(&self) -> bool {
        use std::io::{Read, Write};
        let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port);
        let Ok(mut stream) = TcpStream::connect_timeout(&addr.into(), Duration::from_millis(200))
        else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        let mut reply = [0u8; 1];
        stream.write_all(b"PING\r\n").is_ok()
            && stream.read_exact(&mut reply).is_ok()
            && (reply[0] == b'+' || reply[0] == b'-')
    }

    /// The node's loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The OS process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the process with SIGSTOP: it keeps its socket open and answers
    /// nothing, like a node in a long GC pause or a stalled VM.
    pub fn pause(&mut self) {
        self.signal("-STOP");
        self.paused = true;
    }

    /// Resumes a paused process with SIGCONT.
    pub fn resume(&mut self) {
        self.signal("-CONT");
        self.paused = false;
    }

    fn signal(&self, sig: &str) {
        let pid = self.pid().expect("server is not running");
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid} failed");
    }

    /// Kills the process with SIGKILL; its data (no persistence) is lost.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// Starts the process again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => panic!("restart failed: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Whether the process is running (paused counts as running).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// A plain synchronous connection, for checking and planting state.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .expect("url")
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("connect to test node")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
