//! `redlock`: run a command under a distributed lock held on a Redlock
//! quorum, the cluster-wide `flock` for cron jobs and deploy steps.
//!
//! Built with the `cli` feature: `cargo install --path . --features cli`.
//! See `redlock run --help` for the behaviour and the exit codes.
//!
//! # Layout
//! - `args`: the command line and its help text.
//! - `exit`: the exit codes and the failure that carries one.
//! - `run`: `redlock run`: the wait, the supervision, the hold.
//! - `child`: the command's process group, its keeper (Linux), and the
//!   signals.
//! - `status`: `redlock status`.
//! - `log`: `--quiet` and `--verbose`.

mod args;
mod child;
mod exit;
mod log;
mod run;
mod status;

use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;

use crate::args::{Cli, Command};
use crate::log::Log;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // Help and version are answers, not errors; a usage error is a
            // configuration error like any other, with its exit code.
            return match e.kind() {
                ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => ExitCode::SUCCESS,
                _ => ExitCode::from(exit::UNAVAILABLE),
            };
        }
    };
    let log = match &cli.command {
        Command::Run(run) => Log {
            quiet: run.output.quiet,
            verbose: run.output.verbose,
        },
        Command::Status(_) => Log::default(),
    };
    // One thread is plenty: a handful of connections, one child, signals.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            log.error(format_args!("cannot start the runtime: {e}"));
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => {
                // Listen before anything else, so that a signal during the
                // wait ends it cleanly instead of killing redlock mid-round.
                let mut signals = child::Signals::listen().map_err(|e| {
                    exit::Failure::config(format_args!("cannot listen for signals: {e}"))
                })?;
                child::become_subreaper();
                run::run(args, &mut signals, &log).await
            }
            Command::Status(args) => status::status(args).await,
        }
    });
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            if failure.quiet_ok {
                log.notice(&failure.message);
            } else {
                log.error(format_args!("{}", failure.message));
            }
            ExitCode::from(failure.code)
        }
    }
}
