//! The command under the lock: started in its own process group, signalled
//! as a group, and the signals redlock itself receives.
//!
//! # The keeper (Linux)
//! No process of the command may outlive the lock, not even when redlock
//! itself is killed with SIGKILL and cannot end the command. So on Linux the
//! command is not redlock's child: redlock's child is a *keeper*, a forked
//! copy of redlock that never execs, leads the command's process group and
//! is the command's parent. The keeper
//! - asks the kernel for a signal when redlock dies (`PR_SET_PDEATHSIG`),
//!   and looks at its parent every [`keeper::LOOK`] all the same; when
//!   redlock is gone it sends SIGKILL to the whole group, itself included;
//! - is a subreaper, so that the group's orphans become its children, and
//!   it stays until none of its children is left in the group, so that the
//!   group is covered for as long as it has a process;
//! - reports the command's exit status to redlock through a pipe as soon as
//!   the command exits (redlock then ends whatever the command left in the
//!   group, as before), and exits with that status itself;
//! - ignores the signals redlock forwards to the group (they are for the
//!   command) and writes nothing.
//!
//! The command itself gets `PR_SET_PDEATHSIG(SIGKILL)` for the keeper, so
//! that it cannot outlive a keeper killed on its own either.
//!
//! What this cannot cover: a process that leaves the group (`setsid`,
//! `setpgid`, a daemon that detaches) is not reached by the group's
//! SIGKILL; a set-user-ID command loses the death signal at exec (the
//! keeper still kills its group); and redlock stopped (SIGSTOP) rather than
//! killed is not dead: the keys expire while the command runs on. Other
//! platforms start the command directly, without a keeper.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::oneshot;

use crate::exit;

/// How often a group that outlived its leader is checked for being empty.
const GROUP_POLL: Duration = Duration::from_millis(20);

/// Builds the command: directly, or with `sh -c` when `shell`. It runs in a
/// new process group whose id is its pid, so that one `killpg` reaches
/// everything it starts (a shell's children and theirs) and a terminal's
/// Ctrl-C reaches only redlock, which forwards it.
pub(crate) fn command(argv: &[OsString], shell: bool) -> Command {
    let mut cmd = if shell {
        let mut cmd = Command::new("sh");
        cmd.arg("-c");
        // `sh -c STRING NAME ARGS...`: further words become $0, $1, ...
        cmd.args(argv);
        cmd
    } else {
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        cmd
    };
    cmd.process_group(0);
    cmd
}

/// The exit code the shell would give for a command that could not start.
pub(crate) fn spawn_failure(e: &io::Error) -> u8 {
    match e.kind() {
        io::ErrorKind::NotFound => exit::NOT_FOUND,
        _ => exit::CANNOT_EXECUTE,
    }
}

/// The command's exit code, or 128 + signal when a signal ended it.
pub(crate) fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(255),
        (None, Some(signal)) => exit::signaled(signal),
        (None, None) => 255,
    }
}

/// Sends `signal` to every process in the group `pgid`. Returns false when
/// the group has no process left.
pub(crate) fn signal_group(pgid: u32, signal: i32) -> bool {
    // Group 0 would be redlock's own.
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return false;
    };
    if pgid <= 0 {
        return false;
    }
    // SAFETY: killpg only sends a signal; the group is the one we created
    // (its id stays reserved while any member, zombie or not, exists).
    unsafe { libc::killpg(pgid, signal) == 0 }
}

/// Whether the group `pgid` still has a process (a zombie counts until it is
/// reaped).
pub(crate) fn group_alive(pgid: u32) -> bool {
    signal_group(pgid, 0)
}

/// Makes redlock the reaper of the command's orphans (Linux): a grandchild
/// whose parent died is re-parented to redlock instead of to init, so that
/// [`reap_group`] can collect it and the group is seen empty as soon as it
/// is, even where init is slow to reap.
pub(crate) fn become_subreaper() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER only sets a process flag.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
}

/// Reaps the exited processes of group `pgid` that were re-parented to
/// redlock (after the keeper, their subreaper, was killed; or without a
/// keeper). Called only after the group's leader was reaped by tokio, so it
/// cannot take the leader's status.
fn reap_group(pgid: u32) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    loop {
        let mut status = 0;
        // SAFETY: waitpid with WNOHANG on our own process group's children.
        let pid = unsafe { libc::waitpid(-pgid, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
    }
}

/// Starts `cmd` (from [`command`]) in its own process group: on Linux under
/// a keeper (see the module docs), elsewhere directly.
pub(crate) fn spawn(cmd: Command) -> io::Result<Group> {
    #[cfg(target_os = "linux")]
    {
        keeper::spawn(cmd)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let mut cmd = cmd;
        let child = cmd.spawn()?;
        Ok(Group::new(child, None))
    }
}

/// The command running in its own process group, led by redlock's child:
/// the keeper on Linux, the command itself elsewhere.
#[derive(Debug)]
pub(crate) struct Group {
    /// The group's leader: the keeper, or the command.
    leader: Child,
    pub(crate) pgid: u32,
    /// The command's exit status, once known.
    pub(crate) status: Option<ExitStatus>,
    /// The leader's exit status, once it was reaped.
    leader_status: Option<ExitStatus>,
    /// The keeper's report; `None` without a keeper, or once the keeper
    /// ended without one.
    report: Option<oneshot::Receiver<Report>>,
    /// Whether the keeper reported processes left in the group when the
    /// command exited.
    left_behind: bool,
}

/// What the keeper tells redlock when the command exits.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) struct Report {
    /// The command's raw wait status.
    status: i32,
    /// Whether the keeper still had children in the group.
    left_behind: bool,
}

impl Group {
    fn new(leader: Child, report: Option<oneshot::Receiver<Report>>) -> Self {
        Group {
            pgid: leader.id().unwrap_or(0),
            leader,
            status: None,
            leader_status: None,
            report,
            left_behind: false,
        }
    }

    /// After the command exited: whether it left processes in its group.
    /// The keeper said so in its report (and leaves at once when there were
    /// none); without one, whatever is in the group now.
    pub(crate) fn left_behind(&mut self) -> bool {
        if self.leader_gone() {
            group_alive(self.pgid)
        } else {
            self.left_behind
        }
    }

    /// Waits for the command's exit status.
    ///
    /// # Cancel safety
    /// Cancel-safe: a status received (the leader reaped, the keeper's
    /// report read) is kept for the next call.
    pub(crate) async fn wait_command(&mut self) -> ExitStatus {
        loop {
            if let Some(status) = self.status {
                return status;
            }
            // Without a report to wait for (no keeper, or a keeper killed
            // before the command ended), the leader's status is the
            // command's, or as close to it as there is.
            if self.report.is_none()
                && let Some(leader) = self.leader_status
            {
                self.status = Some(leader);
                continue;
            }
            tokio::select! {
                reported = report(&mut self.report) => match reported {
                    Some(report) => {
                        self.status = Some(ExitStatus::from_raw(report.status));
                        self.left_behind = report.left_behind;
                    }
                    None => self.report = None,
                },
                leader = self.leader.wait(), if self.leader_status.is_none() => {
                    self.leader_status =
                        Some(leader.unwrap_or_else(|_| ExitStatus::from_raw(255 << 8)));
                }
            }
        }
    }

    /// Whether the leader was reaped; reaps it if it has exited.
    fn leader_gone(&mut self) -> bool {
        if self.leader_status.is_none()
            && let Ok(Some(status)) = self.leader.try_wait()
        {
            self.leader_status = Some(status);
        }
        self.leader_status.is_some()
    }

    /// Waits until the command exits (if it has not yet) and every other
    /// process of the group has gone, or until `deadline`, forwarding the
    /// signals redlock receives. Returns whether the group is empty.
    ///
    /// # Cancel safety
    /// Cancel-safe: the command's status is kept once known.
    pub(crate) async fn wait_empty(
        &mut self,
        signals: &mut Signals,
        deadline: tokio::time::Instant,
    ) -> bool {
        loop {
            if self.status.is_none() {
                tokio::select! {
                    _ = self.wait_command() => continue,
                    (sig, _) = signals.recv() => {
                        signal_group(self.pgid, sig);
                        continue;
                    }
                    () = tokio::time::sleep_until(deadline) => return false,
                }
            }
            // The keeper stays for as long as the group has children of its
            // own; once it is reaped, what is left was re-parented to
            // redlock (or to init).
            if self.leader_gone() {
                reap_group(self.pgid);
                if !group_alive(self.pgid) {
                    return true;
                }
            }
            tokio::select! {
                () = tokio::time::sleep(GROUP_POLL) => {}
                (sig, _) = signals.recv() => { signal_group(self.pgid, sig); }
                () = tokio::time::sleep_until(deadline) => {
                    return self.leader_gone() && !group_alive(self.pgid);
                }
            }
        }
    }

    /// Ends the whole group: SIGTERM, then SIGKILL to whatever is left after
    /// `kill_after`; returns once the leader is reaped and the group empty
    /// (or, should SIGKILL not empty it, after another `kill_after`).
    pub(crate) async fn terminate(&mut self, signals: &mut Signals, kill_after: Duration) {
        if !group_alive(self.pgid) && self.status.is_some() {
            return;
        }
        signal_group(self.pgid, libc::SIGTERM);
        let deadline = tokio::time::Instant::now() + kill_after;
        if self.wait_empty(signals, deadline).await {
            return;
        }
        signal_group(self.pgid, libc::SIGKILL);
        let deadline = tokio::time::Instant::now() + kill_after.max(Duration::from_secs(1));
        self.wait_empty(signals, deadline).await;
    }
}

/// The keeper's report: `None` when there is none to wait for, or the
/// keeper ended without one. Never ends while a report may still come.
///
/// # Cancel safety
/// Cancel-safe: a oneshot receiver keeps its value until received.
async fn report(report: &mut Option<oneshot::Receiver<Report>>) -> Option<Report> {
    match report {
        Some(rx) => rx.await.ok(),
        None => std::future::pending().await,
    }
}

/// The signals redlock forwards to the command, or that end its wait for
/// the lock. Listening replaces their default action (ending redlock), from
/// the start, so that none is lost between the acquisition and the spawn.
#[derive(Debug)]
pub(crate) struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
    quit: Signal,
}

impl Signals {
    pub(crate) fn listen() -> io::Result<Self> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// The next signal received: its number and name.
    ///
    /// # Cancel safety
    /// Cancel-safe: a signal that arrives meanwhile is kept for the next
    /// call.
    pub(crate) async fn recv(&mut self) -> (i32, &'static str) {
        tokio::select! {
            _ = self.int.recv() => (libc::SIGINT, "SIGINT"),
            _ = self.term.recv() => (libc::SIGTERM, "SIGTERM"),
            _ = self.hup.recv() => (libc::SIGHUP, "SIGHUP"),
            _ = self.quit.recv() => (libc::SIGQUIT, "SIGQUIT"),
        }
    }
}

#[cfg(target_os = "linux")]
mod keeper;
