//! The command line: subcommands, options, their help text, and the parsing
//! of node lists and durations.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::exit;

/// The exit codes, as `--help` shows them after each subcommand's options.
const RUN_EXIT_CODES: &str = "\
Exit status:
  <child's>  the command ran and the lock was held throughout: its own exit
             code, or 128+N when it died of signal N
  69         the lock could not be tried or is unusable: bad arguments, no
             nodes, a bad node URL, too short a ttl, no quorum of nodes
             answered, no fencing token could be made
  74         the lock was lost while the command ran (the command's process
             group got SIGTERM, then SIGKILL after --kill-after)
  75         the lock is held elsewhere and --wait ran out; the command did
             not run
  126, 127   the command could not be executed, or was not found
  128+N      signal N (INT, TERM, HUP, QUIT) ended the wait for the lock; the
             command did not run

A command may itself exit with 69, 74 or 75; give it other codes if the
caller must tell them apart.

Examples:
  # Every instance's cron fires; one runs the job, the others skip it.
  redlock run --nodes redis://10.0.0.1/,redis://10.0.0.2/,redis://10.0.0.3/ \\
      --hold-for 4m nightly-report -- /usr/local/bin/nightly-report --full

  # Wait up to a minute for a deploy step held by another machine.
  REDLOCK_NODES=redis://a/,redis://b/,redis://c/ \\
      redlock run --wait 1m deploy-migrations -- ./migrate.sh

  # A pipeline: --shell runs the command with `sh -c`.
  redlock run --shell backup -- 'pg_dump app | gzip > /backup/app.sql.gz'";

const STATUS_EXIT_CODES: &str = "\
Exit status:
  0   held: a quorum of nodes holds the key
  1   not held on a quorum (free, or held on too few nodes to count)
  69  bad arguments or node URLs, or so many nodes failed that a quorum
      could hold the key unseen

Example:
  redlock status --nodes redis://10.0.0.1/,redis://10.0.0.2/,redis://10.0.0.3/ nightly-report";

/// Run a command under a distributed lock held on a Redlock quorum of
/// independent Redis masters: the cluster-wide `flock` for cron jobs,
/// systemd timers and deploy steps.
#[derive(Debug, Parser)]
#[command(name = "redlock", version, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a command while holding a lock; skip it when the lock is held.
    #[command(
        long_about = "\
Run COMMAND while holding the lock NAME on a quorum (N/2 + 1) of the Redis
nodes, the lock renewed in the background every ttl/3 for as long as the
command runs. When the lock is held elsewhere, the command does not run
(after waiting --wait for it), and redlock exits 75.

The command runs directly, without a shell, unless --shell is given. It
runs in its own process group, with stdin, stdout and stderr inherited, and
with two more environment variables:
  REDLOCK_RESOURCE       the lock's NAME
  REDLOCK_FENCING_TOKEN  a number larger than any earlier holder of NAME
                         was given: pass it with each write to the
                         protected storage and have the storage reject
                         numbers lower than one it has seen

Signals: INT, TERM, HUP and QUIT sent to redlock are forwarded to the
command's process group while it runs. While redlock still waits for the
lock they end the wait: the command does not run, and redlock exits 128+N.

Lock loss: if the lock cannot be renewed (a quorum of nodes unreachable for
longer than the validity) or is taken over, the command's whole process
group gets SIGTERM, then SIGKILL after --kill-after, and redlock exits 74.

When the command exits, whatever it left running in its process group gets
SIGTERM (then SIGKILL after --kill-after), so that nothing the job started
runs without the lock; then the lock is released, or kept until --hold-for
has passed since it was acquired. A job that must outlive redlock has to
leave the process group (setsid) and the lock's protection with it.

If redlock itself dies (SIGKILL, a crash), nothing renews the lock: it
expires one --ttl after the last renewal. On Linux the command's whole
process group gets SIGKILL at once, from a small keeper process that leads
the group (named redlock-keeper in ps), so that nothing of the job runs on
without the lock. Not covered: processes that left the group (setsid, a
daemon that detaches), redlock stopped rather than killed (SIGSTOP: the
lock expires while the command runs), and platforms other than Linux,
where the command keeps running.

Output: nothing of redlock's own on a normal run. By default one line on
stderr when the lock is not acquired, is lost, or an error occurs;
--quiet drops the line for the expected skip (exit 75) and for a wait
ended by a signal; --verbose adds a line for each step.",
        after_help = RUN_EXIT_CODES
    )]
    Run(RunArgs),

    /// Show whether a lock is held, on which nodes, and for how long.
    #[command(
        long_about = "\
Show whether the lock NAME is held on a quorum of the nodes, and for each
node whether it holds the key and its remaining time to live (PTTL). Nodes
that cannot be reached or fail are named with the error. Changes nothing,
and never prints a lock's token.",
        after_help = STATUS_EXIT_CODES
    )]
    Status(StatusArgs),
}

/// Where the nodes are and how long to wait for each.
#[derive(Debug, Args)]
pub(crate) struct NodeArgs {
    /// The Redis nodes: comma-separated URLs of independent masters, such
    /// as `redis://10.0.0.1:6379/,redis://:password@10.0.0.2:6379/`; a node
    /// may be a whole cluster, `redis+cluster://host:port,host:port`.
    #[arg(
        long,
        env = "REDLOCK_NODES",
        hide_env_values = true,
        value_name = "URL,URL,..."
    )]
    pub(crate) nodes: Option<String>,

    /// The bound on each request to one node; a node slower than this
    /// counts as unreachable for that round. Raise it for distant nodes;
    /// keep it well under the ttl.
    #[arg(long, value_name = "DURATION", default_value = "200ms", value_parser = duration)]
    pub(crate) node_timeout: Duration,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) nodes: NodeArgs,

    /// The lock's time to live, renewed every ttl/3 while the command runs;
    /// after a crash of redlock, how long the lock stays taken.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration)]
    pub(crate) ttl: Duration,

    /// How long to wait for a lock held elsewhere: `0` tries once and skips
    /// the command if it is held, a duration such as `90s` retries until
    /// it has passed, `forever` waits until the lock is free.
    #[arg(long, value_name = "0|DURATION|forever", default_value = "0", value_parser = wait)]
    pub(crate) wait: Wait,

    /// Keep the lock until at least this long after it was acquired, even
    /// if the command finished sooner: the "once per schedule" mode. An
    /// instance whose timer fired a little later finds the lock held and
    /// skips the job. The lock is then acquired with a ttl of at least this
    /// (plus the clock drift allowance), so it holds even if redlock dies,
    /// and is shortened to what is left of the hold when the command ends.
    /// Choose it shorter than the schedule's period.
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub(crate) hold_for: Option<Duration>,

    /// How long the command's process group has between SIGTERM and
    /// SIGKILL, when the lock is lost or the command left processes behind.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration)]
    pub(crate) kill_after: Duration,

    /// Run COMMAND with `sh -c`: a single argument that may contain pipes,
    /// redirections and variables.
    #[arg(long)]
    pub(crate) shell: bool,

    #[command(flatten)]
    pub(crate) output: Output,

    /// The lock's name (the Redis key), shared by every instance that must
    /// not run the command at the same time.
    pub(crate) name: String,

    /// The command and its arguments, after `--`.
    #[arg(
        required = true,
        last = true,
        value_name = "COMMAND",
        num_args = 1..,
        allow_hyphen_values = true
    )]
    pub(crate) command: Vec<OsString>,
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub(crate) nodes: NodeArgs,

    /// The lock's name.
    pub(crate) name: String,
}

/// How much redlock says.
#[derive(Debug, Args)]
pub(crate) struct Output {
    /// Say nothing when the lock is held elsewhere (exit 75) or a signal
    /// ended the wait; errors are still reported.
    #[arg(long, short, conflicts_with = "verbose")]
    pub(crate) quiet: bool,

    /// Report each step on stderr: acquired, fencing token, renewals
    /// lost, child exit, release.
    #[arg(long, short)]
    pub(crate) verbose: bool,
}

/// How long `run` waits for the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// At most this long; zero makes one attempt.
    For(Duration),
    /// Until the lock is free.
    Forever,
}

/// A human duration: `30s`, `5m`, `1h 30m`, `250ms`, or `0`.
fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e}; expected a duration such as 30s, 5m, 1h30m or 250ms"))
}

fn wait(s: &str) -> Result<Wait, String> {
    if s.trim().eq_ignore_ascii_case("forever") {
        return Ok(Wait::Forever);
    }
    duration(s).map(Wait::For)
}

impl NodeArgs {
    /// The node URLs: `--nodes` or `REDLOCK_NODES`, split at commas (a
    /// cluster's seeds stay one entry) and semicolons, blanks dropped.
    pub(crate) fn urls(&self) -> Result<Vec<String>, exit::Failure> {
        let urls = redlock_quorum::split_node_list(self.nodes.as_deref().unwrap_or(""));
        if urls.is_empty() {
            return Err(exit::Failure::config(
                "no Redis nodes: pass --nodes URL,URL,... or set REDLOCK_NODES",
            ));
        }
        if self.node_timeout.is_zero() {
            return Err(exit::Failure::config(
                "--node-timeout must be longer than zero",
            ));
        }
        Ok(urls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_and_waits() {
        assert_eq!(duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(duration("0"), Ok(Duration::ZERO));
        assert!(duration("soon").is_err());
        assert_eq!(wait("forever"), Ok(Wait::Forever));
        assert_eq!(wait("0"), Ok(Wait::For(Duration::ZERO)));
        assert_eq!(wait("90s"), Ok(Wait::For(Duration::from_secs(90))));
    }

    #[test]
    fn the_command_follows_the_double_dash() {
        let cli = Cli::try_parse_from(["redlock", "run", "job", "--", "ls", "-l", "--", "x"])
            .expect("parses");
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        assert_eq!(run.name, "job");
        assert_eq!(run.command, ["ls", "-l", "--", "x"]);
        assert!(Cli::try_parse_from(["redlock", "run", "job"]).is_err());
    }
}
