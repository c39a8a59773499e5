//! node-redlock 5 on ioredis, driven from a test: installed once with npm
//! into a temporary directory ([`install`]), run as a child process that
//! reads commands on stdin and answers on stdout ([`NodeClient`]). Its
//! nodes are standalone (`redis://…`) or, given as `cluster:host:port,…`,
//! ioredis `Cluster` clients.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The node side: node-redlock 5 with ioredis. `argv[2]` lists the nodes,
/// separated by `;`: a URL, or `cluster:` and the seeds `host:port,…`.
/// Commands, one per line: `acquire <names,…> <ttl ms>` (answers `held
/// <value>` or `refused <why>`), `release` (`released`), `quit`.
const NODE_SCRIPT: &str = r#"
const Redis = require("ioredis");
const Redlock = require("redlock").default;
const readline = require("readline");
const clients = process.argv[2].split(";").map((spec) => {
  if (!spec.startsWith("cluster:")) {
    return new Redis(spec, { lazyConnect: false });
  }
  const seeds = spec.slice("cluster:".length).split(",").map((hp) => {
    const [host, port] = hp.split(":");
    return { host, port: Number(port) };
  });
  return new Redis.Cluster(seeds);
});
const redlock = new Redlock(clients, { retryCount: 0, driftFactor: 0.01 });
redlock.on("error", () => {});
let lock = null;
const rl = readline.createInterface({ input: process.stdin });
rl.on("line", async (line) => {
  const [cmd, names, ttl] = line.trim().split(" ");
  try {
    if (cmd === "acquire") {
      lock = await redlock.acquire(names.split(","), Number(ttl));
      console.log("held " + lock.value);
    } else if (cmd === "release") {
      await lock.release();
      lock = null;
      console.log("released");
    } else if (cmd === "quit") {
      clients.forEach((c) => c.disconnect());
      process.exit(0);
    }
  } catch (e) {
    console.log("refused " + String(e.message).replace(/\n/g, " "));
  }
});
"#;

/// Whether `program --version` runs.
fn available(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A directory with node-redlock 5 and ioredis installed, reused across
/// runs; `None` when node or npm is missing or the install fails.
pub fn install() -> Option<PathBuf> {
    if !available("node") || !available("npm") {
        return None;
    }
    let dir = std::env::temp_dir().join("redlock-quorum-node-redlock-5");
    if !dir.join("node_modules/redlock/package.json").exists()
        || !dir.join("node_modules/ioredis/package.json").exists()
    {
        std::fs::create_dir_all(&dir).ok()?;
        std::fs::write(dir.join("package.json"), r#"{"private":true}"#).ok()?;
        // node-redlock 5 exists only as a pre-release, which `redlock@5`
        // does not match.
        let status = std::process::Command::new("npm")
            .args([
                "install",
                "--no-audit",
                "--no-fund",
                "redlock@5.0.0-beta.2",
                "ioredis",
            ])
            .current_dir(&dir)
            .stdout(Stdio::null())
            .status()
            .ok()?;
        if !status.success() {
            return None;
        }
    }
    std::fs::write(dir.join("interop.cjs"), NODE_SCRIPT).ok()?;
    Some(dir)
}

/// A running node-redlock client.
#[derive(Debug)]
pub struct NodeClient {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl NodeClient {
    /// Starts the client of [`install`]'s directory on `nodes` (see the
    /// module docs for the format).
    pub fn spawn(dir: &Path, nodes: &str) -> Self {
        let mut child = tokio::process::Command::new("node")
            .arg(dir.join("interop.cjs"))
            .arg(nodes)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node starts");
        NodeClient {
            stdin: child.stdin.take().expect("stdin"),
            stdout: BufReader::new(child.stdout.take().expect("stdout")).lines(),
            child,
        }
    }

    /// Sends one command and reads its answer (within 20 s).
    pub async fn ask(&mut self, line: &str) -> String {
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("node reads");
        let answer = tokio::time::timeout(Duration::from_secs(20), self.stdout.next_line())
            .await
            .expect("node answers in time")
            .expect("node's stdout");
        answer.expect("node still runs")
    }

    /// Tells it to quit, and waits (at most 5 s) for it to exit.
    pub async fn quit(mut self) {
        let _ = self.stdin.write_all(b"quit\n").await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}
