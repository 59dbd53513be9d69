//! `tollgate`: the rate limiter's command-line entry point.
//!
//! Each subcommand has a clap `Args` struct and a `run` function (`serve`'s
//! in the `tollgate_server` library, which tests start in process too); this
//! file only dispatches and reports errors. Run under the name `ratelimit`
//! (envoyproxy/ratelimit's binary's), it is `serve` reading envoyproxy/ratelimit's
//! environment, with no subcommand.

use std::io;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Subcommand};
use tollgate_server::serve;

mod check_config;
mod simulate;

/// Tollgate, a rate limiter.
#[derive(Debug, clap::Parser)]
#[command(name = "tollgate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a request trace through the rate limiting algorithms and compare
    /// them with the exact sliding log, generate a trace, or preview a config
    /// change on recorded requests.
    Simulate(Box<simulate::Args>),
    /// Serve rate limit checks: Envoy's Rate Limit Service over gRPC and an
    /// HTTP API, with metrics, health checks, an admin API and hot reload.
    Serve(Box<serve::Args>),
    /// Check config files or directories as `serve` would load them, and
    /// print their rules, or every error with its file, line and field
    /// (exit status 1). For CI pipelines and pre-commit hooks.
    CheckConfig(check_config::Args),
}

/// Whether the error is only that whoever read our output stopped reading
/// (`tollgate simulate --generate poisson | head`).
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain()
        .filter_map(|e| e.downcast_ref::<io::Error>())
        .any(|e| e.kind() == io::ErrorKind::BrokenPipe)
}

fn main() -> ExitCode {
    let result = if serve::invoked_as_ratelimit() {
        let flags = serve::ratelimit_command().get_matches();
        serve::Args::from_envoy_env(&flags, true).and_then(serve::run)
    } else {
        // The matches, not only the parsed flags: envoyproxy/ratelimit's
        // variables yield to the flags given, and only the matches tell them
        // from defaults.
        let matches = Cli::command().get_matches();
        let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        match (cli.command, matches.subcommand()) {
            (Command::Simulate(args), _) => simulate::run(*args),
            (Command::Serve(_), Some((_, flags))) => {
                serve::Args::from_envoy_env(flags, false).and_then(serve::run)
            }
            (Command::Serve(args), None) => serve::run(*args),
            (Command::CheckConfig(args), _) => match check_config::run(&args) {
                // Its own status: 1 for an invalid config.
                Ok(code) => return code,
                Err(err) => Err(err),
            },
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tollgate --help` opens with the crate's description, which names the
    /// subcommands: it must name exactly those that exist.
    #[test]
    fn the_help_summary_names_every_subcommand_and_no_other() {
        let cli = Cli::command();
        cli.clone().debug_assert();
        let about = cli.get_about().expect("a summary").to_string();
        let (_, list) = about.split_once(": ").expect("`...: a, b, c`");
        let mut named: Vec<&str> = list.split(", ").collect();
        let mut commands: Vec<&str> = cli.get_subcommands().map(|c| c.get_name()).collect();
        named.sort_unstable();
        commands.sort_unstable();
        assert_eq!(named, commands, "{about}");
    }
}
