//! `siphon cluster`: identity and pre-flight checks of a multi-host job, plus the control-plane
//! benchmark. [`ClusterArgs`] holds the identity/coordinator flags every multi-host command
//! flattens in (`#[command(flatten)]`).

use std::time::Duration;

use anyhow::Context;
use siphon_coord::Identity;
use siphon_coord::check::{CheckOptions, CheckReport, Latency};

use crate::args::{ClusterArgs, limits};

#[derive(clap::Subcommand)]
pub enum Command {
    /// Print the resolved identity and where each part came from.
    Info(InfoArgs),
    /// Join the job and run barriers and key-value round trips with every process (pre-flight).
    Check(CheckArgs),
    /// Benchmark: run `siphon cluster check` as N local processes on 127.0.0.1.
    Bench(BenchArgs),
}

#[derive(clap::Args)]
pub struct InfoArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Rounds of each measurement.
    #[arg(long, default_value_t = 200, value_parser = limits::count_of::<u32>(1, limits::MAX_ROUNDS))]
    pub rounds: u32,
    /// Timeout of each barrier and get, in seconds.
    #[arg(long, default_value_t = 60.0, value_parser = limits::positive_seconds)]
    pub timeout_s: f64,
    /// Print the report as one JSON line.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Process counts to run, e.g. 2,8,32 (each run starts that many siphon processes here).
    #[arg(long, value_delimiter = ',', default_value = "2,8,32",
          value_parser = limits::count_of::<u32>(1, limits::MAX_LOCAL_PROCESSES))]
    pub processes: Vec<u32>,
    /// Rounds of each measurement in every run.
    #[arg(long, default_value_t = 1000, value_parser = limits::count_of::<u32>(1, limits::MAX_ROUNDS))]
    pub rounds: u32,
    /// Print one JSON line per run as well.
    #[arg(long)]
    pub json: bool,
}

pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Info(args) => info(args),
        Command::Check(args) => check(args),
        Command::Bench(args) => bench(args),
    }
}

fn info(args: InfoArgs) -> anyhow::Result<()> {
    let identity = args.cluster.identity()?;
    let token = match args.cluster.job_token(&identity) {
        Ok((_, source)) => source.to_string(),
        Err(error) => format!("missing ({})", crate::outcome::describe(&error)),
    };
    let [id_source, count_source, coordinator_source] = identity.field_sources;
    if args.json {
        let value = serde_json::json!({
            "process_id": identity.process_id,
            "num_processes": identity.num_processes,
            "coordinator": identity.coordinator,
            "machine_id": identity.machine_id,
            "total_machines": identity.total_machines,
            "source": identity.source.to_string(),
            "sources": {
                "process_id": id_source.to_string(),
                "num_processes": count_source.to_string(),
                "coordinator": coordinator_source.to_string(),
            },
            "job_token": token,
        });
        println!("{value}");
        return Ok(());
    }
    println!("process id:    {}  (from {id_source})", identity.process_id);
    println!("processes:     {}  (from {count_source})", identity.num_processes);
    println!("coordinator:   {}  (from {coordinator_source})", identity.coordinator);
    println!("machine:       {} of {}", identity.machine_id, identity.total_machines);
    println!("hosts service: {}", identity.process_id == 0 && !args.cluster.external_coordinator);
    println!("job token:     {token}");
    println!("source:        {}", identity.source);
    Ok(())
}

fn check(args: CheckArgs) -> anyhow::Result<()> {
    let job = args.cluster.join()?;
    let options = CheckOptions { rounds: args.rounds, timeout: Duration::from_secs_f64(args.timeout_s) };
    let report = siphon_coord::check::run_check(&job, &options).context("the cluster check failed")?;
    job.shutdown(options.timeout).context("shutting down after the check")?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report, job.identity());
    }
    Ok(())
}

fn ms(latency: &Latency) -> String {
    format!(
        "p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms  ({} samples)",
        latency.p50_us / 1e3,
        latency.p99_us / 1e3,
        latency.max_us / 1e3,
        latency.samples
    )
}

fn print_report(report: &CheckReport, identity: &Identity) {
    println!(
        "cluster check: process {} of {}, coordinator {}",
        report.process_id, report.num_processes, identity.coordinator
    );
    if let Some(alive) = &report.alive {
        println!("alive processes:          {} of {}", alive.len(), report.num_processes);
    }
    if let Some(all) = &report.barrier_all_processes {
        println!("barrier (all processes):  {}", ms(all));
    }
    println!("barrier (this process):   {}", ms(&report.barrier));
    println!("kv set+get round trip:    {}", ms(&report.kv_round_trip));
    if let Some(broadcast) = &report.kv_broadcast {
        println!("kv broadcast to {} (set → all read → acked): {}", report.num_processes - 1, ms(broadcast));
    }
}

fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the siphon executable")?;
    let check_args: Vec<String> =
        ["cluster", "check", "--json", "--rounds", &args.rounds.to_string()].iter().map(|s| s.to_string()).collect();
    println!("{}", bench_header());
    for &n in &args.processes {
        let report = siphon_coord::check::run_local(&exe, &check_args, n, Duration::from_secs(600))
            .with_context(|| format!("the {n}-process run failed"))?;
        println!("{}", bench_row(&report));
        if args.json {
            println!("{}", serde_json::to_string(&report)?);
        }
    }
    Ok(())
}

/// Header of the benchmark table (Markdown).
pub fn bench_header() -> String {
    "| processes | barrier p50 | barrier p99 | kv set+get p50 | kv broadcast p50 | kv broadcast p99 |\n\
     |---|---|---|---|---|---|"
        .to_string()
}

/// One row of the benchmark table (Markdown).
pub fn bench_row(report: &CheckReport) -> String {
    let barrier = report.barrier_all_processes.clone().unwrap_or_else(|| report.barrier.clone());
    let ms = |us: f64| format!("{:.3} ms", us / 1e3);
    let (bp50, bp99) =
        report.kv_broadcast.as_ref().map(|b| (ms(b.p50_us), ms(b.p99_us))).unwrap_or_else(|| ("-".into(), "-".into()));
    format!(
        "| {} | {} | {} | {} | {bp50} | {bp99} |",
        report.num_processes,
        ms(barrier.p50_us),
        ms(barrier.p99_us),
        ms(report.kv_round_trip.p50_us)
    )
}
