//! The `redlock` command end to end: real `redis-server` nodes, real
//! `redlock` processes, real children and grandchildren.
//!
//! The binary needs the `cli` feature. Under `cargo test --features cli`
//! Cargo builds it for these tests; under a plain `cargo test` (CI) the
//! first test builds it once with `cargo build --features cli`, into the
//! same target directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use redlock_harness::{Cluster, resource};

/// Exit codes, as `redlock run --help` documents them.
const UNAVAILABLE: i32 = 69;
const LOST: i32 = 74;
const HELD: i32 = 75;

/// The `redlock` binary, built on first use when Cargo did not build it.
fn binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        if let Some(path) = option_env!("CARGO_BIN_EXE_redlock") {
            return PathBuf::from(path);
        }
        // target/debug/deps/cli-HASH → target
        let exe = std::env::current_exe().expect("test executable");
        let target = exe
            .ancestors()
            .nth(3)
            .expect("the test executable lives in target/PROFILE/deps")
            .to_path_buf();
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let status = Command::new(env!("CARGO"))
            .args(["build", "--features", "cli", "--bin", "redlock"])
            .arg("--manifest-path")
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target)
            .status()
            .expect("run cargo build");
        assert!(status.success(), "cargo build --features cli failed");
        target.join("debug").join("redlock")
    })
}

/// A scratch directory for one test's files.
fn scratch(topic: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(resource(&format!("redlock-cli-{topic}")).replace(':', "-"));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// `redlock ARGS` against the cluster's nodes (through `REDLOCK_NODES`),
/// with `DIR` in the environment for the children's files.
fn redlock(cluster: &Cluster, dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(binary());
    cmd.args(args)
        .env("REDLOCK_NODES", cluster.urls().join(","))
        .env("DIR", dir)
        .stdin(Stdio::null());
    cmd
}

/// `redlock run RUN_ARGS --shell -- SCRIPT`, with a node timeout of 1 s
/// (for a loaded 2-core machine) unless RUN_ARGS set one.
fn run(cluster: &Cluster, dir: &Path, run_args: &[&str], script: &str) -> Command {
    let mut args = vec!["run"];
    if !run_args.contains(&"--node-timeout") {
        args.extend_from_slice(&["--node-timeout", "1s"]);
    }
    args.extend_from_slice(run_args);
    args.extend_from_slice(&["--shell", "--", script]);
    redlock(cluster, dir, &args)
}

fn output(mut cmd: Command) -> Output {
    cmd.output().expect("run redlock")
}

fn code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| panic!("redlock died of a signal: {status}"))
}

/// Lines of a file the children append to; none when it does not exist.
fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|s| s.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Waits for the first complete line of a file a shell writes with
/// `echo ... > file`: the file exists, empty, before the line is in it.
fn wait_for_line(path: &Path, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some((line, _)) = text.split_once('\n') {
            return line.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "{} never had a complete line",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wait_for_file(path: &Path, within: Duration) {
    let deadline = Instant::now() + within;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for a child process with a limit, killing it past the limit.
fn wait_within(child: &mut Child, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("redlock did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn signal(child: &Child, signal: i32) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    // SAFETY: kill only sends a signal, to a process we started.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill failed");
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
fn process_gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // `PID (comm) STATE ...`
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

fn assert_released(cluster: &Cluster, name: &str) {
    assert_eq!(
        cluster.values(name),
        vec![None; cluster.len()],
        "the lock {name:?} is still held somewhere"
    );
}

#[test]
fn five_concurrent_runs_run_the_command_once() {
    let cluster = Cluster::start(5);
    let dir = scratch("five");
    let count = dir.join("count");
    let mut runs = 0;
    for round in 0..20 {
        let name = resource("five");
        let go = dir.join(format!("go-{round}"));
        // The winner waits until the test saw the four others exit, so that
        // no loser can come late, find the lock released, and run too.
        let script = format!(
            "echo run >> \"$DIR/count\"; while [ ! -e \"$DIR/go-{round}\" ]; do sleep 0.02; done"
        );
        let errs = dir.join(format!("stderr-{round}"));
        let mut children: Vec<Child> = (0..5)
            .map(|_| {
                let err = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&errs)
                    .expect("stderr file");
                run(&cluster, &dir, &["--wait", "0", &name], &script)
                    .stderr(err)
                    .spawn()
                    .expect("spawn redlock")
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut codes = Vec::new();
        while codes.len() < 4 {
            assert!(
                Instant::now() < deadline,
                "round {round}: codes so far {codes:?}"
            );
            children.retain_mut(|c| match c.try_wait().expect("try_wait") {
                Some(status) => {
                    codes.push(code(status));
                    false
                }
                None => true,
            });
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            codes,
            [HELD; 4],
            "round {round}: {}",
            std::fs::read_to_string(&errs).unwrap_or_default()
        );
        assert_eq!(children.len(), 1);
        std::fs::write(&go, "").expect("go");
        // The fifth ran the command, or (votes split between contenders
        // that started together, each short of a quorum) skipped it too.
        let status = wait_within(&mut children[0], Duration::from_secs(60));
        match code(status) {
            0 => runs += 1,
            HELD => {}
            other => panic!(
                "round {round}: the fifth exited {other}: {}",
                std::fs::read_to_string(&errs).unwrap_or_default()
            ),
        }
        assert_eq!(lines(&count).len(), runs, "round {round}: runs");
        assert_released(&cluster, &name);
    }
    assert!(runs >= 10, "only {runs} of 20 rounds ran the command");
}

#[test]
fn hold_for_keeps_a_short_job_from_running_twice() {
    let cluster = Cluster::start(5);
    let dir = scratch("hold");
    let name = resource("hold");
    let job = "echo run >> \"$DIR/count\"; sleep 0.1";
    // The hold is long enough that the second run below starts within it
    // however loaded the machine; the third waits it out.
    let hold = Duration::from_secs(8);
    let first = output(run(&cluster, &dir, &["--hold-for", "8s", &name], job));
    let first_ended = Instant::now();
    assert_eq!(code(first.status), 0, "{first:?}");

    // An instance whose timer fired a little later skips the job.
    let second = output(run(&cluster, &dir, &["--hold-for", "8s", &name], job));
    assert_eq!(code(second.status), HELD, "{second:?}");
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("locked elsewhere"),
        "{second:?}"
    );
    assert_eq!(lines(&dir.join("count")), ["run"]);

    // The keys were shortened to what was left of the hold, not left at the
    // 30 s ttl, on a quorum (the shortening round stops at a quorum; a node
    // it did not reach in time keeps the longer expiry, which cannot make
    // a quorum). What was left is at most the hold and its drift allowance.
    let mut pttls = cluster.pttls(&name);
    pttls.sort_unstable();
    assert!(pttls[2] <= 8_200, "pttls {pttls:?} ms");
    if Instant::now() < first_ended + hold {
        assert!(
            pttls[2] >= 1,
            "pttls {pttls:?} ms: released within the hold"
        );
    }

    // After the hold the next schedule runs the job again. The hold began
    // before the first run ended.
    std::thread::sleep((hold + Duration::from_millis(300)).saturating_sub(first_ended.elapsed()));
    let third = output(run(&cluster, &dir, &["--hold-for", "8s", &name], job));
    assert_eq!(code(third.status), 0, "{third:?}");
    assert_eq!(lines(&dir.join("count")), ["run", "run"]);
}

#[test]
fn renewal_keeps_the_lock_for_a_command_longer_than_three_ttls() {
    let cluster = Cluster::start(5);
    let dir = scratch("long");
    let name = resource("long");
    // A 2 s ttl renewed every 667 ms, a command of 7 s: three and a half
    // ttls. (A loaded machine delays the renewals, but not by a ttl.)
    let mut long = run(
        &cluster,
        &dir,
        &["--ttl", "2s", &name],
        "touch \"$DIR/started\"; sleep 7; touch \"$DIR/long-done\"",
    )
    .spawn()
    .expect("spawn");
    wait_for_file(&dir.join("started"), Duration::from_secs(30));
    let started = Instant::now();
    let mut tries = 0;
    while long.try_wait().expect("try_wait").is_none() {
        // A run that starts after the long command ended may rightly get
        // the lock: only one that ran before it ended is a violation.
        let second = output(run(
            &cluster,
            &dir,
            &[&name],
            "[ -e \"$DIR/long-done\" ] || touch \"$DIR/second\"",
        ));
        if long.try_wait().expect("try_wait").is_some() {
            break;
        }
        assert_eq!(
            code(second.status),
            HELD,
            "after {:?}: {second:?}",
            started.elapsed()
        );
        tries += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        started.elapsed() >= Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    assert!(tries >= 2, "only {tries} tries");
    assert_eq!(code(wait_within(&mut long, Duration::from_secs(30))), 0);
    assert!(!dir.join("second").exists(), "the second command ran");
    assert_released(&cluster, &name);
}

#[test]
fn a_lost_lock_terminates_the_whole_process_group() {
    let mut cluster = Cluster::start(5);
    let dir = scratch("lost");
    let name = resource("lost");
    // Both shells log the SIGTERM and carry on, so only the SIGKILL that
    // follows --kill-after can end them.
    let script = r#"
        trap 'echo child-term >> "$DIR/log"' TERM
        sh -c 'trap "echo grandchild-term >> \"$DIR/log\"" TERM
               echo $$ > "$DIR/gpid"
               while :; do sleep 0.1; done' &
        echo $$ > "$DIR/cpid"
        while :; do sleep 0.1; done"#;
    // A ttl that a loaded machine's delays do not lose before the nodes
    // stop (a lock lost early would end the job before it wrote its pids).
    let mut redlock = run(
        &cluster,
        &dir,
        &["--ttl", "3s", "--kill-after", "1s", &name],
        script,
    )
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn");
    let gpid = wait_for_line(&dir.join("gpid"), Duration::from_secs(30));
    let cpid = wait_for_line(&dir.join("cpid"), Duration::from_secs(30));
    assert!(!process_gone(&cpid) && !process_gone(&gpid));

    for i in 0..3 {
        cluster.node(i).pause();
    }
    let status = wait_within(&mut redlock, Duration::from_secs(60));
    for i in 0..3 {
        cluster.node(i).resume();
    }
    let mut stderr = String::new();
    std::io::Read::read_to_string(redlock.stderr.as_mut().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert_eq!(code(status), LOST, "{stderr}");
    assert!(stderr.contains("lost the lock"), "{stderr}");
    // Both shells got SIGTERM and carried on: only the SIGKILL after
    // --kill-after can have ended them.
    let mut log = lines(&dir.join("log"));
    log.sort();
    log.dedup();
    assert_eq!(log, ["child-term", "grandchild-term"]);
    assert!(process_gone(&cpid), "the child {cpid} survived");
    assert!(process_gone(&gpid), "the grandchild {gpid} survived");
}

#[test]
fn signals_reach_the_command_and_its_status_comes_back() {
    let cluster = Cluster::start(5);
    let dir = scratch("signals");

    // A command that handles SIGTERM: its exit code passes through.
    let name = resource("signals");
    let mut trapping = run(
        &cluster,
        &dir,
        &[&name],
        "trap 'exit 7' TERM; touch \"$DIR/a\"; while :; do sleep 0.1; done",
    )
    .spawn()
    .expect("spawn");
    wait_for_file(&dir.join("a"), Duration::from_secs(30));
    signal(&trapping, libc::SIGTERM);
    assert_eq!(code(wait_within(&mut trapping, Duration::from_secs(30))), 7);
    assert_released(&cluster, &name);

    // Commands that die of the signal: 128 + the signal, for each signal
    // forwarded. Run directly, without --shell.
    for (sig, marker) in [
        (libc::SIGTERM, "b"),
        (libc::SIGHUP, "c"),
        (libc::SIGINT, "d"),
        (libc::SIGQUIT, "e"),
    ] {
        let name = resource("signals");
        let script = format!("echo $$ > \"$DIR/{marker}\"; exec sleep 30");
        let mut dying = redlock(
            &cluster,
            &dir,
            &[
                "run",
                "--node-timeout",
                "500ms",
                &name,
                "--",
                "sh",
                "-c",
                &script,
            ],
        )
        .spawn()
        .expect("spawn");
        let pid = wait_for_line(&dir.join(marker), Duration::from_secs(30));
        // `exec sleep` replaces the shell: wait until it did, so that the
        // signal finds sleep (a shell would die of most of them too).
        let comm = Path::new("/proc").join(&pid).join("comm");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::fs::read_to_string(&comm).unwrap_or_default().trim() != "sleep" {
            assert!(Instant::now() < deadline, "{pid} never became sleep");
            std::thread::sleep(Duration::from_millis(10));
        }
        signal(&dying, sig);
        let status = wait_within(&mut dying, Duration::from_secs(30));
        assert_eq!(code(status), 128 + sig, "signal {sig}");
        assert_released(&cluster, &name);
    }
}

#[test]
fn a_signal_ends_the_wait_without_running_the_command() {
    let cluster = Cluster::start(5);
    let dir = scratch("wait");
    let name = resource("wait");
    let mut holder = run(
        &cluster,
        &dir,
        &[&name],
        "touch \"$DIR/held\"; while [ ! -e \"$DIR/done\" ]; do sleep 0.02; done",
    )
    .spawn()
    .expect("spawn");
    wait_for_file(&dir.join("held"), Duration::from_secs(30));

    // The waiter's --verbose lines go to a file, where the test sees it
    // try, fail and wait (its signal handlers are in place by then).
    let errors = dir.join("waiter-stderr");
    let mut waiter = run(
        &cluster,
        &dir,
        &["--verbose", "--wait", "forever", &name],
        "touch \"$DIR/waiter-ran\"",
    )
    .stderr(std::fs::File::create(&errors).expect("stderr file"))
    .spawn()
    .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&errors)
        .unwrap_or_default()
        .contains("trying again")
    {
        assert!(Instant::now() < deadline, "the waiter never tried");
        assert!(waiter.try_wait().expect("try_wait").is_none(), "gave up");
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(&waiter, libc::SIGTERM);
    let status = wait_within(&mut waiter, Duration::from_secs(30));
    assert_eq!(code(status), 128 + libc::SIGTERM);
    let stderr = std::fs::read_to_string(&errors).expect("stderr");
    assert!(
        stderr.contains("SIGTERM received while waiting"),
        "{stderr}"
    );

    std::fs::write(dir.join("done"), "").expect("done");
    assert_eq!(code(wait_within(&mut holder, Duration::from_secs(30))), 0);
    assert!(!dir.join("waiter-ran").exists());
    assert_released(&cluster, &name);

    // With the holder gone, a run with a --wait duration gets the lock.
    let out = output(run(&cluster, &dir, &["--wait", "3s", &name], "true"));
    assert_eq!(code(out.status), 0, "{out:?}");
}

#[test]
fn bad_input_is_refused_with_the_config_code_and_leaves_no_key() {
    let cluster = Cluster::start(5);
    let dir = scratch("bad");
    let name = resource("bad");
    let marker = dir.join("ran");
    let touch = format!("touch {}", marker.display());
    let bad_url = format!("{},http://127.0.0.1:1/", cluster.urls()[0]);
    let cases: Vec<(Vec<&str>, bool, &str)> = vec![
        // (arguments, with REDLOCK_NODES, what stderr must say)
        (
            vec!["run", &name, "--", "sh", "-c", &touch],
            false,
            "REDLOCK_NODES",
        ),
        (
            vec!["run", "--nodes", &bad_url, &name, "--", "sh", "-c", &touch],
            false,
            "node 1 (http://127.0.0.1:1/) is not a valid address",
        ),
        (vec!["run", &name], true, "<COMMAND>"),
        (vec!["run", &name, "--"], true, "<COMMAND>"),
        (
            vec!["run", "--ttl", "0", &name, "--", "sh", "-c", &touch],
            true,
            "--ttl must be longer than zero",
        ),
        (
            vec!["run", "--ttl", "soon", &name, "--", "sh", "-c", &touch],
            true,
            "expected a duration",
        ),
        (
            vec!["run", "--ttl", "3ms", &name, "--", "sh", "-c", &touch],
            true,
            "too short for a renewing guard",
        ),
        (vec!["status"], true, "<NAME>"),
    ];
    for (args, with_nodes, says) in cases {
        let mut cmd = redlock(&cluster, &dir, &args);
        if !with_nodes {
            cmd.env_remove("REDLOCK_NODES");
        }
        let out = output(cmd);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(out.status), UNAVAILABLE, "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!marker.exists(), "{args:?} ran the command");
    }
    assert_eq!(
        cluster.all_keys(),
        vec![Vec::<Vec<u8>>::new(); 5],
        "keys left"
    );

    // A command that cannot be found: the shell's 127, the lock released.
    let out = output(redlock(
        &cluster,
        &dir,
        &["run", &name, "--", "/nonexistent/command"],
    ));
    assert_eq!(code(out.status), 127);
    assert_released(&cluster, &name);
}

#[test]
fn the_fencing_token_grows_from_one_run_to_the_next() {
    let cluster = Cluster::start(5);
    let dir = scratch("fence");
    let name = resource("fence");
    let script = "echo \"$REDLOCK_FENCING_TOKEN\" >> \"$DIR/tokens\"; echo \"$REDLOCK_RESOURCE\" > \"$DIR/resource\"";
    for _ in 0..3 {
        let out = output(run(&cluster, &dir, &[&name], script));
        assert_eq!(code(out.status), 0, "{out:?}");
    }
    let tokens: Vec<u64> = lines(&dir.join("tokens"))
        .iter()
        .map(|t| t.parse().expect("a number"))
        .collect();
    assert_eq!(tokens.len(), 3);
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    assert_eq!(lines(&dir.join("resource")), [name]);
}

#[test]
fn status_shows_the_lock_per_node_without_its_token() {
    let mut cluster = Cluster::start(5);
    let dir = scratch("status");
    let name = resource("status");

    let free = output(redlock(
        &cluster,
        &dir,
        &["status", "--node-timeout", "5s", &name],
    ));
    assert_eq!(code(free.status), 1);
    assert!(String::from_utf8_lossy(&free.stdout).contains("free"));

    let mut holder = run(
        &cluster,
        &dir,
        &[&name],
        "touch \"$DIR/held\"; while [ ! -e \"$DIR/done\" ]; do sleep 0.02; done",
    )
    .spawn()
    .expect("spawn");
    wait_for_file(&dir.join("held"), Duration::from_secs(30));
    cluster.node(4).kill();
    let held = output(redlock(
        &cluster,
        &dir,
        &["status", "--node-timeout", "5s", &name],
    ));
    let stdout = String::from_utf8_lossy(&held.stdout);
    assert_eq!(code(held.status), 0, "{stdout}");
    assert!(stdout.contains("held: on 4 of 5 nodes"), "{stdout}");
    assert_eq!(stdout.matches("held, expires in").count(), 4, "{stdout}");
    let down = cluster.urls()[4]
        .trim_start_matches("redis://")
        .trim_end_matches('/');
    assert!(
        stdout
            .lines()
            .any(|l| l.contains(down) && l.contains("FAILED")),
        "{stdout}"
    );
    let token = cluster.value_on(0, &name).expect("held on node 0");
    assert!(!stdout.contains(&token), "{stdout}");

    std::fs::write(dir.join("done"), "").expect("done");
    assert_eq!(code(wait_within(&mut holder, Duration::from_secs(30))), 0);
}

#[test]
fn a_bounded_wait_runs_out_with_the_held_code_and_a_free_lock_is_taken_within_it() {
    let cluster = Cluster::start(5);
    let dir = scratch("wait");
    let name = resource("wait");
    // A holder that keeps the lock until the test lets it go.
    let mut holder = run(
        &cluster,
        &dir,
        &["--wait", "0", &name],
        "touch \"$DIR/held\"; while [ ! -e \"$DIR/done\" ]; do sleep 0.02; done",
    )
    .spawn()
    .expect("spawn holder");
    wait_for_file(&dir.join("held"), Duration::from_secs(30));

    // A 1 s wait runs out while it is held: 75, after at least a second.
    let started = Instant::now();
    let out = output(run(
        &cluster,
        &dir,
        &["--wait", "1s", &name],
        "touch \"$DIR/ran-early\"",
    ));
    let waited = started.elapsed();
    assert_eq!(
        code(out.status),
        HELD,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        waited >= Duration::from_millis(900),
        "gave up after {waited:?}"
    );
    assert!(!dir.join("ran-early").exists(), "the command must not run");

    // A long wait that sees the lock held, then free, runs the command.
    let errors = dir.join("waiter-stderr");
    let mut waiter = run(
        &cluster,
        &dir,
        &["--verbose", "--wait", "10m", &name],
        "touch \"$DIR/ran-later\"",
    )
    .stderr(std::fs::File::create(&errors).expect("stderr file"))
    .spawn()
    .expect("spawn waiter");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&errors)
        .unwrap_or_default()
        .contains("trying again")
    {
        assert!(Instant::now() < deadline, "the waiter never tried");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!dir.join("ran-later").exists(), "ran while held");
    std::fs::write(dir.join("done"), "").expect("done");
    assert_eq!(code(wait_within(&mut holder, Duration::from_secs(30))), 0);
    let status = wait_within(&mut waiter, Duration::from_secs(60));
    assert_eq!(
        code(status),
        0,
        "{}",
        std::fs::read_to_string(&errors).unwrap_or_default()
    );
    assert!(dir.join("ran-later").exists());
    assert_released(&cluster, &name);
}

#[test]
fn no_quorum_is_the_config_code_and_the_output_levels_hold() {
    let mut cluster = Cluster::start(5);
    let dir = scratch("levels");
    let marker = dir.join("ran");
    let touch = format!("touch {}", marker.display());

    // A run that gets the lock says nothing by default, and each step
    // with --verbose.
    let free = resource("levels-free");
    for (flag, lines_ok) in [
        (None, (0usize, 0usize)),
        (Some("--verbose"), (4, usize::MAX)),
    ] {
        let mut args = vec!["run", "--node-timeout", "1s"];
        args.extend(flag);
        args.extend([free.as_str(), "--", "true"]);
        let out = output(redlock(&cluster, &dir, &args));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(out.status), 0, "{flag:?}: {stderr}");
        let n = stderr.lines().count();
        assert!(
            (lines_ok.0..=lines_ok.1).contains(&n),
            "{flag:?}: {n} lines: {stderr}"
        );
    }

    // Held elsewhere: by default exactly one line on stderr, with --quiet
    // none. Exit 75 either way.
    let name = resource("levels");
    cluster.plant(
        &[0, 1, 2, 3, 4],
        &name,
        "other-holder",
        Duration::from_secs(30),
    );
    for (flag, lines_ok) in [(None, (1usize, 1usize)), (Some("--quiet"), (0, 0))] {
        let mut args = vec!["run", "--node-timeout", "1s"];
        args.extend(flag);
        args.extend([name.as_str(), "--", "sh", "-c", touch.as_str()]);
        let out = output(redlock(&cluster, &dir, &args));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(out.status), HELD, "{flag:?}: {stderr}");
        let n = stderr.lines().count();
        assert!(
            (lines_ok.0..=lines_ok.1).contains(&n),
            "{flag:?}: {n} lines: {stderr}"
        );
        assert!(!marker.exists(), "{flag:?} ran the command");
    }

    // No quorum (three of five nodes down): the lock-or-config code, one
    // line that says so, and nothing run.
    for i in 0..3 {
        cluster.node(i).kill();
    }
    let other = resource("levels-noquorum");
    let out = output(redlock(
        &cluster,
        &dir,
        &[
            "run",
            "--node-timeout",
            "200ms",
            &other,
            "--",
            "sh",
            "-c",
            &touch,
        ],
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(out.status), UNAVAILABLE, "{stderr}");
    assert!(stderr.contains("no quorum"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(!marker.exists(), "the command ran without the lock");
}

/// The write end of a pipe whose read end is already closed: every write to
/// it fails with EPIPE, as when `redlock ... 2>&1 | head -1` has had its line.
fn broken_pipe() -> std::fs::File {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe fills the two descriptors, which we then own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: both descriptors were just created and are owned here only.
    unsafe {
        libc::close(fds[0]);
        std::fs::File::from_raw_fd(fds[1])
    }
}

/// Waits until every process in `pids` is gone (or a zombie), up to
/// `within`; returns those still running.
fn survivors(pids: &[&str], within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    loop {
        let alive: Vec<String> = pids
            .iter()
            .filter(|pid| !process_gone(pid))
            .map(|pid| (*pid).to_owned())
            .collect();
        if alive.is_empty() || Instant::now() > deadline {
            return alive;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills what a failed test left running, so that it does not outlive it.
fn kill_pids(pids: &[&str]) {
    for pid in pids {
        if let Ok(pid) = pid.parse::<libc::pid_t>() {
            // SAFETY: kill only sends a signal.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

#[test]
fn a_broken_stdout_or_stderr_never_makes_redlock_panic() {
    let cluster = Cluster::start(5);
    let dir = scratch("epipe");

    // A run that gets the lock, with --verbose lines to write: the
    // command's own code, and the lock released.
    let name = resource("epipe");
    let out = run(&cluster, &dir, &["--verbose", &name], "true")
        .stderr(broken_pipe())
        .output()
        .expect("run redlock");
    assert_eq!(code(out.status), 0, "a run with a broken stderr");
    assert_released(&cluster, &name);

    // The command's own failing code passes through too.
    let out = run(&cluster, &dir, &["--verbose", &name], "exit 3")
        .stderr(broken_pipe())
        .stdout(broken_pipe())
        .output()
        .expect("run redlock");
    assert_eq!(
        code(out.status),
        3,
        "a failing command, broken stdout and stderr"
    );
    assert_released(&cluster, &name);

    // Held elsewhere: the notice cannot be written, the code is still 75.
    let held = resource("epipe-held");
    cluster.plant(&[0, 1, 2, 3, 4], &held, "other", Duration::from_secs(30));
    let out = run(&cluster, &dir, &[&held], "touch \"$DIR/ran\"")
        .stderr(broken_pipe())
        .output()
        .expect("run redlock");
    assert_eq!(code(out.status), HELD, "held, with a broken stderr");
    assert!(!dir.join("ran").exists());

    // `status` writes its report to stdout.
    let out = redlock(&cluster, &dir, &["status", "--node-timeout", "5s", &name])
        .stdout(broken_pipe())
        .output()
        .expect("run redlock");
    assert_eq!(code(out.status), 1, "status of a free lock, broken stdout");
}

#[test]
fn a_lost_lock_ends_the_job_first_even_with_a_broken_stderr() {
    let mut cluster = Cluster::start(5);
    let dir = scratch("lost-epipe");
    let name = resource("lost-epipe");
    let script = r#"
        sh -c 'echo $$ > "$DIR/gpid"; while :; do sleep 0.1; done' &
        echo $$ > "$DIR/cpid"
        while :; do sleep 0.1; done"#;
    let mut redlock = run(
        &cluster,
        &dir,
        &[
            "--ttl",
            "3s",
            "--node-timeout",
            "1s",
            "--kill-after",
            "1s",
            &name,
        ],
        script,
    )
    .stderr(broken_pipe())
    .spawn()
    .expect("spawn");
    let gpid = wait_for_line(&dir.join("gpid"), Duration::from_secs(30));
    let cpid = wait_for_line(&dir.join("cpid"), Duration::from_secs(30));
    for i in 0..3 {
        cluster.node(i).pause();
    }
    let status = wait_within(&mut redlock, Duration::from_secs(60));
    for i in 0..3 {
        cluster.node(i).resume();
    }
    let left = survivors(&[&cpid, &gpid], Duration::from_secs(5));
    kill_pids(&[&cpid, &gpid]);
    assert_eq!(
        status.code(),
        Some(LOST),
        "{status}; still running: {left:?}"
    );
    assert!(left.is_empty(), "{left:?} outlived the lost lock");
}

#[test]
fn a_killed_supervisor_takes_the_whole_job_with_it_while_the_lock_still_holds() {
    let cluster = Cluster::start(5);
    let dir = scratch("sigkill");
    let name = resource("sigkill");
    // The command, a child of it in the background, and an orphan whose
    // parent (a subshell) exited at once: all three in the command's
    // process group, the orphan re-parented.
    let script = r#"
        sh -c 'echo $$ > "$DIR/gpid"; while :; do sleep 0.1; done' &
        ( sh -c 'echo $$ > "$DIR/opid"; while :; do sleep 0.1; done' & )
        echo $$ > "$DIR/cpid"
        while :; do sleep 0.1; done"#;
    let mut redlock = run(&cluster, &dir, &["--ttl", "30s", &name], script)
        .spawn()
        .expect("spawn");
    let cpid = wait_for_line(&dir.join("cpid"), Duration::from_secs(30));
    let gpid = wait_for_line(&dir.join("gpid"), Duration::from_secs(30));
    let opid = wait_for_line(&dir.join("opid"), Duration::from_secs(30));
    signal(&redlock, libc::SIGKILL);
    let status = redlock.wait().expect("wait");
    assert_eq!(status.to_string(), "signal: 9 (SIGKILL)");

    // Every process of the job ends, well within the ttl the keys still
    // have: no process of the job outlives the lock.
    let left = survivors(&[&cpid, &gpid, &opid], Duration::from_secs(20));
    kill_pids(&[&cpid, &gpid, &opid]);
    assert!(left.is_empty(), "{left:?} outlived the killed redlock");
    let holding = cluster.values(&name).iter().flatten().count();
    assert!(
        holding >= 3,
        "the keys expired before the test could look ({holding} of 5 left)"
    );
}

/// A command that starts a background child and an orphan (its parent, a
/// subshell, exits at once), both ignoring SIGTERM, writes their pids and
/// its own, and exits with `code`.
fn leaving_script(code: i32) -> String {
    format!(
        r#"
        trap '' TERM
        sh -c 'echo $$ > "$DIR/gpid"; while :; do sleep 0.1; done' &
        ( sh -c 'echo $$ > "$DIR/opid"; while :; do sleep 0.1; done' & )
        while [ ! -s "$DIR/gpid" ] || [ ! -s "$DIR/opid" ]; do sleep 0.02; done
        echo $$ > "$DIR/cpid"
        exit {code}"#
    )
}

#[test]
fn what_the_command_leaves_in_its_group_ends_before_the_lock_is_released() {
    let cluster = Cluster::start(5);
    let dir = scratch("left");
    let name = resource("left");
    let mut redlock = run(
        &cluster,
        &dir,
        &["--kill-after", "1s", &name],
        &leaving_script(5),
    )
    .spawn()
    .expect("spawn");
    let status = wait_within(&mut redlock, Duration::from_secs(60));
    let gpid = wait_for_line(&dir.join("gpid"), Duration::from_secs(1));
    let opid = wait_for_line(&dir.join("opid"), Duration::from_secs(1));
    let left = survivors(&[&gpid, &opid], Duration::ZERO);
    kill_pids(&[&gpid, &opid]);
    assert_eq!(code(status), 5, "the command's own code");
    assert!(left.is_empty(), "{left:?} outlived the run");
    assert_released(&cluster, &name);
}

#[test]
fn a_supervisor_killed_after_the_command_exited_takes_what_it_left_behind() {
    let cluster = Cluster::start(5);
    let dir = scratch("left-kill");
    let name = resource("left-kill");
    // A long --kill-after: redlock is still waiting to SIGKILL the
    // leftovers (which ignore its SIGTERM) when it is killed itself.
    let mut redlock = run(
        &cluster,
        &dir,
        &["--ttl", "30s", "--kill-after", "5m", &name],
        &leaving_script(0),
    )
    .spawn()
    .expect("spawn");
    let cpid = wait_for_line(&dir.join("cpid"), Duration::from_secs(30));
    let gpid = wait_for_line(&dir.join("gpid"), Duration::from_secs(30));
    let opid = wait_for_line(&dir.join("opid"), Duration::from_secs(30));
    assert!(
        survivors(&[&cpid], Duration::from_secs(30)).is_empty(),
        "the command did not exit"
    );
    assert!(
        redlock.try_wait().expect("try_wait").is_none(),
        "redlock ended"
    );
    signal(&redlock, libc::SIGKILL);
    let _ = redlock.wait();
    let left = survivors(&[&gpid, &opid], Duration::from_secs(20));
    kill_pids(&[&gpid, &opid]);
    assert!(left.is_empty(), "{left:?} outlived the killed redlock");
    let holding = cluster.values(&name).iter().flatten().count();
    assert!(holding >= 3, "the keys expired before the test could look");
}

/// The command on cluster nodes (`redis+cluster://`, the seeds of each
/// cluster one entry of `REDLOCK_NODES`): `run` holds the lock while its
/// child runs, a second `run` is refused, and `status` reads each
/// cluster's slot master.
#[test]
fn run_and_status_work_on_cluster_nodes() {
    let clusters = redlock_harness::shards::RedisClusters::start(3, 2, 0);
    let nodes = clusters.urls().join(",");
    let dir = scratch("clusters");
    let name = resource("clusters");
    let command = |args: &[&str]| {
        let mut cmd = Command::new(binary());
        cmd.args(args)
            .env("REDLOCK_NODES", &nodes)
            .env("DIR", &dir)
            .stdin(Stdio::null());
        cmd
    };
    let mut holder = command(&[
        "run",
        "--node-timeout",
        "1s",
        &name,
        "--shell",
        "--",
        "touch \"$DIR/held\"; while [ ! -e \"$DIR/done\" ]; do sleep 0.02; done",
    ])
    .spawn()
    .expect("spawn");
    wait_for_file(&dir.join("held"), Duration::from_secs(30));
    let second = output(command(&[
        "run",
        "--node-timeout",
        "1s",
        &name,
        "--shell",
        "--",
        "true",
    ]));
    assert_eq!(code(second.status), HELD, "{second:?}");
    let held = output(command(&["status", "--node-timeout", "5s", &name]));
    let stdout = String::from_utf8_lossy(&held.stdout);
    assert_eq!(code(held.status), 0, "{stdout}");
    assert_eq!(stdout.matches("held, expires in").count(), 3, "{stdout}");
    std::fs::write(dir.join("done"), "").expect("done");
    let status = wait_within(&mut holder, Duration::from_secs(60));
    assert_eq!(code(status), 0);
    let free = output(command(&["status", "--node-timeout", "5s", &name]));
    assert_eq!(code(free.status), 1, "{free:?}");
}
