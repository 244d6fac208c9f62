//! `siphon`: the command-line tool. Every subcommand lives in its own module under `cmd/`,
//! holding its clap `Args` and a `run` function; this file only dispatches.

use clap::{Parser, Subcommand};

mod cmd;

#[derive(Parser)]
#[command(name = "siphon", version, about = "Extract LLM activations over large corpora into sharded datasets")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    cmd::init_logging();
    let result = match cli.command {
        Command::Doctor(args) => cmd::doctor::run(args),
        Command::Forward(args) => cmd::forward::run(args),
        Command::Plan(args) => cmd::plan::run(args),
        Command::Bench(command) => cmd::bench::run(command),
        Command::Coordinator(args) => cmd::coordinator::run(args),
        Command::Cluster(command) => cmd::cluster::run(command),
        Command::Data(args) => cmd::data::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
