//! `siphon`: the command-line tool. Every subcommand lives in its own module under `cmd/`,
//! holding its clap `Args` and a `run` function; this file only dispatches.

use clap::{Parser, Subcommand};

mod args;
mod cmd;
mod fatal;
mod job;
mod outcome;

#[derive(Parser)]
#[command(name = "siphon", version, about = "Extract LLM activations over large corpora into sharded datasets")]
pub(crate) struct Cli {
    /// Log lines: `auto` (plain; a progress bar on a terminal), `plain` or `json`.
    #[arg(long, global = true, env = "SIPHON_LOG_FORMAT", default_value = "auto", value_parser = ["auto", "plain", "json"])]
    log_format: String,
    #[command(subcommand)]
    pub(crate) command: Command,
}

// Parsed once and kept for the whole run: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub(crate) enum Command {
    /// Load the PJRT plugin, list devices and run a sharded self-test.
    Doctor(cmd::doctor::Args),
    /// One-shot forward pass: hook activations for a text or token ids into a safetensors file.
    Forward(cmd::forward::Args),
    /// Print the mesh, sharding and per-device memory a model would use.
    Plan(cmd::plan::Args),
    /// Benchmarks that run on the real runtime.
    #[command(subcommand)]
    Bench(cmd::bench::Command),
    /// Run the coordination service on its own.
    Coordinator(cmd::coordinator::Args),
    /// Identity and pre-flight checks of a multi-host job.
    #[command(subcommand)]
    Cluster(cmd::cluster::Command),
    /// Show how a corpus is partitioned over machines and hosts.
    Data(cmd::data::Args),
    /// Extract activations over a corpus into a sharded dataset (run on every host).
    #[command(args_override_self = true)]
    Extract(cmd::extract::Args),
    /// Run N hosts of a job on this machine (coordinator on 127.0.0.1).
    Launch(cmd::launch::Args),
    /// Verify a finished run and print a summary.
    Inspect(cmd::inspect::Args),
    /// Write a run in another tool's format (needs the siphon Python package).
    #[command(subcommand)]
    Export(cmd::export::Command),
    /// A run's feature dashboards as a static site (needs the siphon Python package).
    Dashboard(cmd::dashboard::Args),
}

fn main() -> std::process::ExitCode {
    fatal::install();
    let args = match cmd::extract::expand_config_file(std::env::args().collect()) {
        Ok(args) => args,
        Err(err) => {
            eprintln!("error: {}", outcome::describe(&err));
            return std::process::ExitCode::FAILURE;
        }
    };
    let cli = Cli::parse_from(args);
    cmd::init_logging(&cli.log_format);
    let result = match cli.command {
        Command::Doctor(args) => cmd::doctor::run(args),
        Command::Forward(args) => cmd::forward::run(args),
        Command::Plan(args) => cmd::plan::run(args),
        Command::Bench(command) => cmd::bench::run(command),
        Command::Coordinator(args) => cmd::coordinator::run(args),
        Command::Cluster(command) => cmd::cluster::run(command),
        Command::Data(args) => cmd::data::run(args),
        Command::Extract(args) => cmd::extract::run(args),
        Command::Launch(args) => cmd::launch::run(args),
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::Export(command) => cmd::export::run(command),
        Command::Dashboard(args) => cmd::dashboard::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) if outcome::is_preemption(&err) => {
            eprintln!("siphon: {}", outcome::describe(&err));
            std::process::ExitCode::from(siphon_coord::EXIT_PREEMPTED as u8)
        }
        Err(err) => {
            eprintln!("error: {}", outcome::describe(&err));
            std::process::ExitCode::FAILURE
        }
    }
}
