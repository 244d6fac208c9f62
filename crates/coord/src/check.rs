//! The pre-flight check behind `siphon cluster check`: barriers, key-value round trips and a
//! key-value broadcast with every process of the job, with latency percentiles.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{CoordError, Result};
use crate::join::Coordination;

/// How long the check runs.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Rounds of each measurement.
    pub rounds: u32,
    /// Timeout of each barrier and get.
    pub timeout: Duration,
}

impl Default for CheckOptions {
    fn default() -> CheckOptions {
        CheckOptions { rounds: 200, timeout: Duration::from_secs(60) }
    }
}

/// Percentiles of a latency sample, in microseconds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Latency {
    /// Number of samples.
    pub samples: usize,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Largest sample.
    pub max_us: f64,
}

impl Latency {
    /// Percentiles of `samples` (nearest-rank).
    pub fn of(samples: &[Duration]) -> Latency {
        let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        us.sort_by(f64::total_cmp);
        let pick = |q: f64| {
            if us.is_empty() {
                return 0.0;
            }
            let rank = ((q * us.len() as f64).ceil() as usize).clamp(1, us.len());
            us[rank - 1]
        };
        Latency { samples: us.len(), p50_us: pick(0.5), p99_us: pick(0.99), max_us: us.last().copied().unwrap_or(0.0) }
    }
}

/// What one process measured; on process 0 also the job-wide figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckReport {
    /// This process.
    pub process_id: u32,
    /// Processes in the job.
    pub num_processes: u32,
    /// Barrier of all processes, as this process saw it.
    pub barrier: Latency,
    /// One key-value set plus one get of it, from this process.
    pub kv_round_trip: Latency,
    /// Process 0 only: barrier latency pooled over every process's samples.
    pub barrier_all_processes: Option<Latency>,
    /// Process 0 only: set a key, every other process reads it and acknowledges (a counter);
    /// the last acknowledgement wakes process 0.
    pub kv_broadcast: Option<Latency>,
    /// Process 0 only: the processes GetAliveTasks reported alive.
    pub alive: Option<Vec<u32>>,
}

const PREFIX: &str = "siphon/check/";

/// Runs the check with every process of the job; every process must call it.
pub fn run_check(job: &Coordination, options: &CheckOptions) -> Result<CheckReport> {
    let me = job.process_id();
    let n = job.identity().num_processes;
    let timeout = options.timeout;
    let rounds = options.rounds.max(1);
    // Warm up connections and code paths.
    for _ in 0..5 {
        job.barrier("siphon/check/warmup", timeout)?;
    }
    let mut barrier = Vec::with_capacity(rounds as usize);
    for _ in 0..rounds {
        let started = Instant::now();
        job.barrier("siphon/check/barrier", timeout)?;
        barrier.push(started.elapsed());
    }
    let mut kv = Vec::with_capacity(rounds as usize);
    for round in 0..rounds {
        let key = format!("{PREFIX}rt/{me}/{round}");
        let started = Instant::now();
        job.kv_set(&key, b"x", false)?;
        let value = job.kv_get(&key, timeout)?;
        kv.push(started.elapsed());
        if value != b"x" {
            return Err(CoordError::Internal(format!("key {key} read back {value:?}")));
        }
    }
    let mut broadcast = Vec::new();
    if n > 1 {
        for round in 0..rounds {
            job.barrier("siphon/check/broadcast", timeout)?;
            let key = format!("{PREFIX}bcast/{round}");
            let done = format!("{PREFIX}done/{round}");
            if me == 0 {
                let started = Instant::now();
                job.kv_set(&key, b"payload", false)?;
                job.kv_get(&done, timeout)?;
                broadcast.push(started.elapsed());
            } else {
                job.kv_get(&key, timeout)?;
                let acks = job.kv_increment(&format!("{PREFIX}ack/{round}"), 1)?;
                if acks == i64::from(n - 1) {
                    job.kv_set(&done, b"", false)?;
                }
            }
        }
    }
    let samples: Vec<u64> = barrier.iter().map(|d| d.as_nanos() as u64).collect();
    let encoded = serde_json::to_vec(&samples).map_err(|e| CoordError::Internal(e.to_string()))?;
    job.kv_set(&format!("{PREFIX}samples/{me}"), &encoded, false)?;
    job.barrier("siphon/check/done", timeout)?;
    let mut report = CheckReport {
        process_id: me,
        num_processes: n,
        barrier: Latency::of(&barrier),
        kv_round_trip: Latency::of(&kv),
        barrier_all_processes: None,
        kv_broadcast: None,
        alive: None,
    };
    if me == 0 {
        let mut pooled = Vec::new();
        for (key, value) in job.kv_list(&format!("{PREFIX}samples/"))? {
            let samples: Vec<u64> =
                serde_json::from_slice(&value).map_err(|e| CoordError::Internal(format!("{key}: {e}")))?;
            pooled.extend(samples.into_iter().map(Duration::from_nanos));
        }
        report.barrier_all_processes = Some(Latency::of(&pooled));
        report.kv_broadcast = (n > 1).then(|| Latency::of(&broadcast));
        report.alive = Some(job.alive_tasks(&[])?);
    }
    // Leave the store as it was, so the check can run again within one job.
    job.barrier("siphon/check/cleanup", timeout)?;
    if me == 0 {
        job.kv_delete_prefix(PREFIX)?;
    }
    Ok(report)
}

/// Every child of one local run; killed on drop.
struct Children(Vec<std::process::Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs a job of `n` local processes on 127.0.0.1 (`program args…`, identity and a fresh job
/// token in the `SIPHON_*` environment) in which every process runs [`run_check`] and process 0
/// prints its [`CheckReport`] as JSON on the last line of stdout; returns that report. Every
/// child is killed if anything goes wrong. Used by `siphon cluster bench`.
pub fn run_local(program: &std::path::Path, args: &[String], n: u32, limit: Duration) -> Result<CheckReport> {
    use std::io::Read;
    use std::process::{Command, Stdio};
    if n == 0 {
        return Err(CoordError::InvalidArgument("a local run needs at least one process".into()));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| CoordError::Unavailable(format!("no free port on 127.0.0.1: {e}")))?
        .port();
    let token = crate::generate_job_token();
    let mut children = Children(Vec::new());
    for task in 0..n {
        let child = Command::new(program)
            .args(args)
            .env("SIPHON_PROCESS_ID", task.to_string())
            .env("SIPHON_NUM_PROCESSES", n.to_string())
            .env("SIPHON_COORDINATOR", format!("127.0.0.1:{port}"))
            .env("SIPHON_JOB_TOKEN", &token)
            .env("RUST_LOG", "warn")
            .stdout(if task == 0 { Stdio::piped() } else { Stdio::null() })
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| CoordError::Internal(format!("cannot start {}: {e}", program.display())))?;
        children.0.push(child);
    }
    let mut pipe = children.0[0].stdout.take().ok_or_else(|| CoordError::Internal("no stdout".into()))?;
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + limit;
    for (task, child) in children.0.iter_mut().enumerate() {
        loop {
            let status = child.try_wait().map_err(|e| CoordError::Internal(e.to_string()))?;
            if let Some(status) = status {
                if !status.success() {
                    return Err(CoordError::Internal(format!("process {task} of {n} failed ({status})")));
                }
                break;
            }
            if Instant::now() > deadline {
                return Err(CoordError::DeadlineExceeded(format!(
                    "process {task} of {n} did not finish within {limit:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let stdout = reader.join().map_err(|_| CoordError::Internal("stdout reader panicked".into()))?;
    let last = stdout.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
    serde_json::from_str(last)
        .map_err(|e| CoordError::Internal(format!("process 0 printed no report ({e}): {stdout:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        let latency = Latency::of(&samples);
        assert_eq!((latency.p50_us, latency.p99_us, latency.max_us), (50.0, 99.0, 100.0));
        let one = Latency::of(&[Duration::from_micros(7)]);
        assert_eq!((one.p50_us, one.p99_us), (7.0, 7.0));
        assert_eq!(Latency::of(&[]).samples, 0);
    }
}
