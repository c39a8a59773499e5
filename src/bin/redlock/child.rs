//! The command under the lock: started in its own process group, signalled
//! as a group, and the signals redlock itself receives.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal, SignalKind, signal};

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
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return false;
    };
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
/// redlock. Called only after the group's leader was reaped by tokio, so it
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

/// A child running in its own process group.
#[derive(Debug)]
pub(crate) struct Group {
    pub(crate) child: Child,
    pub(crate) pgid: u32,
    /// The leader's exit status, once it was reaped.
    pub(crate) status: Option<ExitStatus>,
}

impl Group {
    /// Waits until the leader exits (if it has not yet) and every other
    /// process of the group has gone, or until `deadline`, forwarding the
    /// signals redlock receives. Returns whether the group is empty.
    ///
    /// # Cancel safety
    /// Cancel-safe: the leader's status is kept once reaped.
    pub(crate) async fn wait_empty(
        &mut self,
        signals: &mut Signals,
        deadline: tokio::time::Instant,
    ) -> bool {
        loop {
            if self.status.is_none() {
                tokio::select! {
                    status = self.child.wait() => {
                        self.status = Some(status.unwrap_or_else(|_| ExitStatus::from_raw(255 << 8)));
                        continue;
                    }
                    (sig, _) = signals.recv() => {
                        signal_group(self.pgid, sig);
                        continue;
                    }
                    () = tokio::time::sleep_until(deadline) => return false,
                }
            }
            reap_group(self.pgid);
            if !group_alive(self.pgid) {
                return true;
            }
            tokio::select! {
                () = tokio::time::sleep(GROUP_POLL) => {}
                (sig, _) = signals.recv() => { signal_group(self.pgid, sig); }
                () = tokio::time::sleep_until(deadline) => return !group_alive(self.pgid),
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
