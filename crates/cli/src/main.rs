//! `siphon`: the command-line tool. Every subcommand lives in its own module under `cmd/`,
//! holding its clap `Args` and a `run` function; this file only dispatches.
//!
//! # The rooms
//!
//! `src/job/` is the
//! extraction job: `options.rs` (flags → `RunSpec`, the part every host must agree on; the
//! context limit), `fits.rs` (the machine's memory before compiling: the host's `MemAvailable`
//! within its cgroup, a device's PJRT `bytes_limit`), the phases in their own modules (`mod.rs` lists them: `plan.rs` checks and plans before
//! anything expensive, `Span`, whether the mesh lies in a host or spans them; `agree.rs` the
//! configuration every host shares; `compute.rs` the plugin and engine, the `Member`s whose
//! steps this process runs, each step's chosen rows under `--positions` (`Compute::choose`, one
//! count a sequence for the step); `documents.rs` the kept columns (`--keep-columns`) of the
//! documents each batch stores rows of; `resume.rs` outputs and resume points; `steps.rs` the loop;
//! `finish.rs` the last shards and barriers), `pipeline.rs` (the output path: `--pipeline-depth`
//! slots of reused host buffers; the loop launches each step into a free slot while a drain
//! thread waits for earlier steps' programs, copies their rows into their slots and pushes them
//! to the writers (a step's chosen rows as the store's rows, `chosen_batch`), which give a slot
//! back when they have copied its rows; `PathTiming` and which
//! side waited for the other), `output.rs` (a writing member's `Output`: a `ShardWriter`, or a
//! stream on `PORT+reader`, and where readers reach every host: `Endpoints`, `advertised`), `fetch.rs` (models from `hf://`, `gs://`, `s3://`, `https://` into the
//! cache), `progress.rs` (its line says which side bounds the run), `timing.rs` (per host: device-only
//! compute, and every stage's seconds and bytes, which `siphon inspect` prints). `cmd/launch.rs` starts N local hosts with
//! their identities and draws one progress bar per host. `cmd/plan/target.rs` is `siphon plan
//! --target tpu:SLICE | gpu:GPUS` (`Target`): the slice's libtpu topology (`open_topology`, which
//! also serves `siphon bench memory --target`) or the CUDA plugin's topology of the GPUs
//! (`open_gpu_topology`), `siphon_engine::aot` for the planner's mesh, and the report of the
//! compiler's figures beside the planner's (on GPUs each block's attention as compiled and the
//! grouped products), refusing a program larger than a device by its largest term with a mesh that
//! fits. `cmd/forward.rs` is `siphon
//! forward`: one batch's hooks, and with `--sae` its dictionaries' latents (the engine's
//! `Activations::latents`), into one safetensors file; `siphon extract --sae` (the same
//! `SaeArgs`) computes them with each step; `job/dictionary.rs` holds the CLI's whole part of a
//! dictionary (opening it on its hook and cap, `open_capped` asking a non-TopK for
//! `--latent-cap`; its fingerprint; its run.json column; a step's latents for the writer);
//! `job/next_token.rs` likewise for `--outputs` (the store's columns, a step's outputs checked
//! for the writer), while `args::outputs` and `args::steer` parse what both commands take. `args::ClusterArgs` carries the
//! coordinator's TLS flags (`--coordinator-ca/-cert/-key/-tls-name`, `SIPHON_COORDINATOR_*`) to
//! every command that joins a job.

use clap::{Parser, Subcommand};

mod args;
mod cmd;
mod fatal;
mod huge_pages;
mod interrupt;
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
    /// Complete prompts with the model on a mesh, greedy or sampled, into a JSON-lines file
    /// with each completion's exact token ids.
    Generate(cmd::generate::Args),
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

/// Runs the command (in the process re-executed to ask for huge pages: `huge_pages`) and ends
/// the process through `siphon_coord::exit_now`: a plugin's threads may still run (a compile a
/// signal interrupted), and `exit(3)`'s C++ static destructors would crash them.
fn main() {
    huge_pages::ask();
    fatal::install();
    let code = run();
    siphon_coord::exit_now(code)
}

/// The command's exit code: 0, 1, [`siphon_coord::EXIT_PREEMPTED`], or a signal's
/// ([`interrupt::received`]).
fn run() -> i32 {
    let args = match cmd::extract::expand_config_file(std::env::args().collect()) {
        Ok(args) => args,
        Err(err) => {
            eprintln!("error: {}", outcome::describe(&err));
            return 1;
        }
    };
    let cli = Cli::parse_from(args);
    cmd::init_logging(&cli.log_format);
    let result = match cli.command {
        Command::Doctor(args) => cmd::doctor::run(args),
        Command::Forward(args) => cmd::forward::run(args),
        Command::Generate(args) => cmd::generate::run(args),
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
    let code = match &result {
        Ok(()) => 0,
        Err(err) if outcome::is_preemption(err) => {
            eprintln!("siphon: {}", outcome::describe(err));
            siphon_coord::EXIT_PREEMPTED
        }
        Err(err) => {
            eprintln!("error: {}", outcome::describe(err));
            1
        }
    };
    // A job that ended on its own just as a signal came still ends in the signal's code: SIGINT
    // always, SIGTERM unless the job failed for a reason of its own.
    match interrupt::received() {
        Some((name, signal_code)) if signal_code != code && (code == 0 || name == "SIGINT") => {
            eprintln!("siphon: received {name} as the job ended; exiting with {signal_code}");
            signal_code
        }
        _ => code,
    }
}
