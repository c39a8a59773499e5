//! The keeper: see the docs of the `child` module. Everything in the forked processes
//! before the command's exec is plain system calls, with no allocation and
//! no lock: redlock has other threads (tokio's blocking pool), whose locks
//! a forked copy may find taken for ever.

use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use tokio::process::Command;
use tokio::sync::oneshot;

use super::{Group, Report};

/// How often the keeper looks at its parent even without the death
/// signal (which the kernel sends when the *thread* that forked it
/// ends, and which a set-up failure could lose).
pub(super) const LOOK: Duration = Duration::from_millis(100);

/// The signal the kernel sends the keeper when redlock dies. Anyone can
/// send it too: the keeper believes only its parent's change.
const DEATH: libc::c_int = libc::SIGUSR1;

/// The signals redlock forwards to the group (for the command, not the
/// keeper), and SIGPIPE (a report to a redlock gone must not end the
/// keeper before it ends the group).
const IGNORED: [libc::c_int; 5] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGPIPE,
];

/// Spawns the keeper, which starts the command as `cmd` says.
pub(super) fn spawn(mut cmd: Command) -> io::Result<Group> {
    let (read, write) = pipe()?;
    let supervisor = libc::pid_t::try_from(std::process::id())
        .map_err(|_| io::Error::other("pid out of range"))?;
    let report_fd = write.as_raw_fd();
    // SAFETY: the closure runs in the forked child between fork and
    // exec; `split` makes only async-signal-safe system calls there.
    unsafe {
        cmd.pre_exec(move || split(supervisor, report_fd));
    }
    let leader = cmd.spawn()?;
    // Only the keeper may hold the write end: the pipe closes when it
    // ends, reported or not.
    drop(write);
    let (tx, rx) = oneshot::channel();
    // A thread of its own for one blocking read: tokio's pipe needs its
    // `net` feature, and a blocking-pool task would hold up the
    // runtime's shutdown while the keeper lives.
    // Without the thread the command still runs: the keeper's own exit
    // status, when the group is empty, is the command's.
    let reader = std::thread::Builder::new()
        .name("redlock-keeper-report".into())
        .spawn(move || {
            let mut raw = [0u8; 8];
            if std::fs::File::from(read).read_exact(&mut raw).is_ok() {
                let (status, left) = raw.split_at(4);
                let _ = tx.send(Report {
                    status: i32::from_ne_bytes(status.try_into().unwrap_or_default()),
                    left_behind: left != [0; 4],
                });
            }
        });
    Ok(Group::new(leader, reader.ok().map(|_| rx)))
}

/// A close-on-exec pipe, both ends numbered 3 or more (so that neither
/// is taken for the command's stdin, stdout or stderr when redlock was
/// started with one of those closed).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors, which we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just created, owned here only.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(read)?, above_stdio(write)?))
}

fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: fcntl duplicates a descriptor we own into a new one.
    let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the duplicate is new and ours.
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}

/// In the child redlock forked (the group's leader, in its new group):
/// set up the keeper, fork the command, and return in the command so
/// that it goes on to exec. The keeper never returns.
///
/// # Safety
/// Only between fork and exec, in the forked child.
unsafe fn split(supervisor: libc::pid_t, report: RawFd) -> io::Result<()> {
    // SAFETY (all of it): system calls on this process only.
    unsafe {
        // Set up before the command exists, so that none of its ends
        // (its exit, redlock's death) can come before the keeper waits.
        let mut waited: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut waited);
        libc::sigaddset(&mut waited, libc::SIGCHLD);
        libc::sigaddset(&mut waited, DEATH);
        libc::sigprocmask(libc::SIG_BLOCK, &waited, std::ptr::null_mut());
        for sig in IGNORED {
            libc::signal(sig, libc::SIG_IGN);
        }
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        // Named for `ps` and `top` (15 bytes at most, and the NUL).
        libc::prctl(libc::PR_SET_NAME, c"redlock-keeper".as_ptr(), 0, 0, 0);
        libc::prctl(libc::PR_SET_PDEATHSIG, DEATH, 0, 0, 0);
        if libc::getppid() != supervisor {
            // redlock died before the death signal was asked for.
            libc::_exit(1);
        }
        let keeper = libc::getpid();
        let command = libc::fork();
        if command < 0 {
            return Err(io::Error::last_os_error());
        }
        if command == 0 {
            // The command: undo the keeper's signals (an ignored
            // signal stays ignored across exec), and die with the
            // keeper.
            for sig in IGNORED {
                libc::signal(sig, libc::SIG_DFL);
            }
            libc::sigprocmask(libc::SIG_UNBLOCK, &waited, std::ptr::null_mut());
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            if libc::getppid() != keeper {
                libc::_exit(1);
            }
            return Ok(());
        }
        keep(command, supervisor, report, &waited)
    }
}

/// The keeper's life: reap, report the command's status, end the group
/// if redlock dies, leave once the group has no child of ours left.
unsafe fn keep(
    command: libc::pid_t,
    supervisor: libc::pid_t,
    report: RawFd,
    waited: &libc::sigset_t,
) -> ! {
    // SAFETY (all of it): system calls on this process and its group.
    unsafe {
        // Hold nothing but the report's pipe: std's exec-error pipe must
        // close for redlock's spawn to return, and the command's stdio
        // must close when the command's processes end.
        close_from(0, report);
        let look = libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::c_long::try_from(LOOK.as_nanos()).unwrap_or(100_000_000),
        };
        let mut command_status = None;
        loop {
            loop {
                let mut status = 0;
                let pid = libc::waitpid(-1, &mut status, libc::WNOHANG);
                if pid <= 0 {
                    break;
                }
                if pid == command {
                    command_status = Some(status);
                    // One write of 8 bytes: atomic on a pipe.
                    let mut raw = [0u8; 8];
                    raw[..4].copy_from_slice(&status.to_ne_bytes());
                    raw[4] = u8::from(children_in_group());
                    libc::write(report, raw.as_ptr().cast(), raw.len());
                }
            }
            if let Some(status) = command_status
                && !children_in_group()
            {
                exit_as(status);
            }
            libc::sigtimedwait(waited, std::ptr::null_mut(), &look);
            if libc::getppid() != supervisor {
                // redlock is gone, and the lock with it: no process of
                // the group may run on. This ends the keeper too.
                libc::killpg(0, libc::SIGKILL);
                libc::_exit(1);
            }
        }
    }
}

/// Whether any child of the keeper is in its group (a zombie counts; all
/// were just reaped).
unsafe fn children_in_group() -> bool {
    // SAFETY: waitid with WNOWAIT and WNOHANG only looks.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let pgid = libc::id_t::try_from(libc::getpgrp()).unwrap_or(0);
        libc::waitid(
            libc::P_PGID,
            pgid,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        ) == 0
    }
}

/// Closes every descriptor from `first` on, except `keep`.
unsafe fn close_from(first: RawFd, keep: RawFd) {
    // SAFETY: closing descriptors of this process, which uses none of
    // them any more.
    unsafe {
        let mut ranges = [(first, keep - 1), (keep + 1, RawFd::MAX)];
        for (lo, hi) in &mut ranges {
            if lo > hi {
                continue;
            }
            let (lo, hi) = (
                libc::c_uint::try_from(*lo).unwrap_or(0),
                libc::c_uint::try_from(*hi).unwrap_or(libc::c_uint::MAX),
            );
            if libc::syscall(libc::SYS_close_range, lo, hi, 0) == 0 {
                continue;
            }
            // Kernels before 5.9: one by one, up to the descriptor limit.
            let mut limit: libc::rlimit = std::mem::zeroed();
            let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
                libc::c_uint::try_from(limit.rlim_cur.min(1 << 20)).unwrap_or(1 << 20)
            } else {
                1 << 16
            };
            for fd in lo..=hi.min(max) {
                libc::close(fd as RawFd);
            }
        }
    }
}

/// Ends the keeper as the command ended: the same exit code, or death
/// by the same signal (without a core file of the keeper's).
unsafe fn exit_as(status: libc::c_int) -> ! {
    // SAFETY: system calls on this process only.
    unsafe {
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            let no_core = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(libc::WEXITSTATUS(status));
    }
}
