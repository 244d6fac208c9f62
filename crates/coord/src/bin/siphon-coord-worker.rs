//! Test worker for the control plane's multi-process tests and benchmark: one process of a
//! job, identity from the usual flags/environment, token from `SIPHON_JOB_TOKEN`.
//!
//! Usage: `siphon-coord-worker SCENARIO [--rounds N] [--config KEY=VALUE]...`
//! - `check`: barriers, a KV broadcast from task 0, the config check, then shutdown.
//! - `wait`: join, print "waiting", wait in a barrier of all tasks for up to 60 s.
//! - `hold`: join, print "waiting", sleep 60 s without entering that barrier (the process the
//!   tests kill).
//! - `fail`: join, print "waiting", report an error "worker failed on purpose" and exit 1.
//! - `panic`: join, print "waiting", panic (the panic hook reports it).
//!
//! - `report`: the pre-flight check ([`siphon_coord::check::run_check`]); process 0 prints the
//!   report as JSON.
//! - `bench [--rounds N] [--processes 2,8,32]`: runs `report` jobs of each size locally and
//!   prints a Markdown table (what `siphon cluster bench` does, without building the CLI).
//!
//! Exits 0 on success; on any error prints `error: ...` to stderr and exits 1, or
//! [`siphon_coord::EXIT_PREEMPTED`] when the job was preempted.

use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use siphon_coord::{Coordination, JoinOptions, identity};

fn main() {
    match run() {
        Ok(()) => {}
        Err(Failure { message, preempted }) => {
            eprintln!("error: {message}");
            std::process::exit(if preempted { siphon_coord::EXIT_PREEMPTED } else { 1 });
        }
    }
}

struct Failure {
    message: String,
    preempted: bool,
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure { message, preempted: false }
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Failure {
        Failure::from(message.to_string())
    }
}

impl From<siphon_coord::CoordError> for Failure {
    fn from(error: siphon_coord::CoordError) -> Failure {
        Failure { preempted: error.is_preemption(), message: error.to_string() }
    }
}

fn run() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scenario = args.first().cloned().ok_or("missing scenario")?;
    let mut rounds = 10u32;
    let mut processes = vec![2u32, 8, 32];
    let mut config = Map::new();
    let mut rest = args[1..].iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--rounds" => rounds = rest.next().and_then(|v| v.parse().ok()).ok_or("bad --rounds")?,
            "--processes" => {
                let list = rest.next().ok_or("missing --processes value")?;
                processes = list
                    .split(',')
                    .map(|n| n.trim().parse())
                    .collect::<Result<_, _>>()
                    .map_err(|_| "bad --processes")?;
            }
            "--config" => {
                let pair = rest.next().ok_or("missing --config value")?;
                let (key, value) = pair.split_once('=').ok_or("--config wants KEY=VALUE")?;
                config.insert(key.to_string(), Value::String(value.to_string()));
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    if scenario == "bench" {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let args = vec!["report".to_string(), "--rounds".to_string(), rounds.to_string()];
        println!("| processes | barrier p50 | barrier p99 | kv set+get p50 | kv broadcast p50 | kv broadcast p99 |");
        println!("|---|---|---|---|---|---|");
        for n in processes {
            let report =
                siphon_coord::check::run_local(&exe, &args, n, Duration::from_secs(600)).map_err(|e| e.to_string())?;
            let barrier = report.barrier_all_processes.clone().unwrap_or(report.barrier.clone());
            let ms = |us: f64| format!("{:.3} ms", us / 1e3);
            let (bp50, bp99) =
                report.kv_broadcast.as_ref().map(|b| (ms(b.p50_us), ms(b.p99_us))).unwrap_or(("-".into(), "-".into()));
            println!(
                "| {n} | {} | {} | {} | {bp50} | {bp99} |",
                ms(barrier.p50_us),
                ms(barrier.p99_us),
                ms(report.kv_round_trip.p50_us)
            );
        }
        return Ok(());
    }
    let token = std::env::var("SIPHON_JOB_TOKEN").map_err(|_| "SIPHON_JOB_TOKEN is not set")?;
    let me = identity::resolve_from_process(&identity::IdentityFlags::default()).map_err(|e| e.to_string())?;
    let mut options = JoinOptions::new(token);
    options.client.connect_timeout = Duration::from_secs(20);
    options.client.register_timeout =
        Duration::from_secs(std::env::var("WORKER_REGISTER_TIMEOUT_S").ok().and_then(|v| v.parse().ok()).unwrap_or(20));
    let job = Coordination::join(&me, options).map_err(|e| e.to_string())?;
    job.install_failure_reporting();
    let task = job.process_id();
    let timeout = Duration::from_secs(30);
    match scenario.as_str() {
        "check" => {
            let mut latencies = Vec::new();
            for _ in 0..rounds {
                let started = Instant::now();
                job.barrier("round", timeout).map_err(|e| e.to_string())?;
                latencies.push(started.elapsed());
            }
            if task == 0 {
                job.kv_set("broadcast", b"from task 0", false).map_err(|e| e.to_string())?;
            }
            let value = job.kv_get("broadcast", timeout).map_err(|e| e.to_string())?;
            if value != b"from task 0" {
                return Err(format!("broadcast value {value:?}").into());
            }
            let run = job.broadcast_config(&Value::Object(config), timeout).map_err(|e| e.to_string())?;
            job.kv_set(&format!("run/{task}"), run["run_name"].to_string().as_bytes(), false)
                .map_err(|e| e.to_string())?;
            job.barrier("names", timeout).map_err(|e| e.to_string())?;
            let names = job.kv_list("run/").map_err(|e| e.to_string())?;
            if names.len() != me.num_processes as usize || names.iter().any(|(_, n)| n != &names[0].1) {
                return Err(format!("tasks disagree on the run name: {names:?}").into());
            }
            latencies.sort();
            println!("ok task {task} barrier p50 {:?}", latencies[latencies.len() / 2]);
            job.shutdown(timeout).map_err(|e| e.to_string())?;
        }
        "report" => {
            let options = siphon_coord::check::CheckOptions { rounds, timeout };
            let report = siphon_coord::check::run_check(&job, &options).map_err(|e| e.to_string())?;
            job.shutdown(timeout).map_err(|e| e.to_string())?;
            if task == 0 {
                println!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
            }
        }
        "wait" => {
            eprintln!("waiting");
            job.barrier("forever", Duration::from_secs(60))?;
        }
        "hold" => {
            eprintln!("waiting");
            std::thread::sleep(Duration::from_secs(60));
        }
        "fail" => {
            eprintln!("waiting");
            std::thread::sleep(Duration::from_millis(300));
            job.report_error("worker failed on purpose").map_err(|e| e.to_string())?;
            return Err("worker failed on purpose".into());
        }
        "panic" => {
            eprintln!("waiting");
            std::thread::sleep(Duration::from_millis(300));
            panic!("worker panicked on purpose");
        }
        other => return Err(format!("unknown scenario {other}").into()),
    }
    Ok(())
}
