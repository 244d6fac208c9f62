//! Acceptance tests with real processes on 127.0.0.1: every process is killed when a test ends
//! (Drop guard), every wait is bounded.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WORKER: &str = env!("CARGO_BIN_EXE_siphon-coord-worker");

struct Proc {
    child: Child,
    stderr: Arc<Mutex<String>>,
    exit: Option<(i32, Instant)>,
}

/// Every process of one test; all are killed on drop.
struct Job {
    procs: Vec<Proc>,
}

impl Drop for Job {
    fn drop(&mut self) {
        for proc in &mut self.procs {
            let _ = proc.child.kill();
            let _ = proc.child.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Job {
    /// Starts `n` workers; `args(task)` gives each one's arguments.
    fn start(n: u32, args: impl Fn(u32) -> Vec<String>) -> Job {
        Job::start_some(n, (0..n).collect(), args)
    }

    fn start_some(n: u32, tasks: Vec<u32>, args: impl Fn(u32) -> Vec<String>) -> Job {
        let port = free_port();
        let procs = tasks
            .into_iter()
            .map(|task| {
                let mut child = Command::new(WORKER)
                    .args(args(task))
                    .env_clear()
                    .env("PATH", std::env::var("PATH").unwrap_or_default())
                    .env("SIPHON_PROCESS_ID", task.to_string())
                    .env("SIPHON_NUM_PROCESSES", n.to_string())
                    .env("SIPHON_COORDINATOR", format!("127.0.0.1:{port}"))
                    .env("SIPHON_JOB_TOKEN", "multi-process-test-token")
                    .env("WORKER_REGISTER_TIMEOUT_S", "3")
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn worker");
                let stderr = Arc::new(Mutex::new(String::new()));
                let mut pipe = child.stderr.take().unwrap();
                let sink = stderr.clone();
                std::thread::spawn(move || {
                    let mut buffer = [0u8; 4096];
                    while let Ok(n) = pipe.read(&mut buffer) {
                        if n == 0 {
                            break;
                        }
                        sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buffer[..n]));
                    }
                });
                Proc { child, stderr, exit: None }
            })
            .collect();
        Job { procs }
    }

    fn stderr(&self, index: usize) -> String {
        self.procs[index].stderr.lock().unwrap().clone()
    }

    /// Waits until every listed process printed `line`.
    fn wait_for_line(&self, indices: &[usize], line: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !indices.iter().all(|&i| self.stderr(i).contains(line)) {
            assert!(
                Instant::now() < deadline,
                "not all of {indices:?} printed {line:?}: {:?}",
                indices.iter().map(|&i| self.stderr(i)).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until the listed processes exited (bounded), recording when.
    fn wait_exit(&mut self, indices: &[usize], limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let mut pending = false;
            for &i in indices {
                let proc = &mut self.procs[i];
                if proc.exit.is_none() {
                    match proc.child.try_wait().unwrap() {
                        Some(status) => proc.exit = Some((status.code().unwrap_or(-1), Instant::now())),
                        None => pending = true,
                    }
                }
            }
            if !pending {
                // Let the stderr readers drain.
                std::thread::sleep(Duration::from_millis(20));
                return;
            }
            assert!(
                Instant::now() < deadline,
                "processes {indices:?} did not exit within {limit:?}: {:?}",
                indices.iter().map(|&i| self.stderr(i)).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn exit(&self, index: usize) -> (i32, Instant) {
        self.procs[index].exit.expect("exited")
    }

    fn kill9(&mut self, index: usize) -> Instant {
        self.procs[index].child.kill().unwrap();
        Instant::now()
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn four_processes_barriers_kv_broadcast_and_config_check() {
    let mut job = Job::start(4, |_| strings(&["check", "--rounds", "20", "--config", "model=qwen"]));
    job.wait_exit(&[0, 1, 2, 3], Duration::from_secs(30));
    for i in 0..4 {
        assert_eq!(job.exit(i).0, 0, "task {i}: {}", job.stderr(i));
    }
}

#[test]
fn a_differing_config_stops_every_process_naming_the_field() {
    let mut job = Job::start(4, |task| {
        let model = if task == 2 { "model=llama" } else { "model=qwen" };
        strings(&["check", "--rounds", "2", "--config", model, "--config", "batch=8"])
    });
    job.wait_exit(&[0, 1, 2, 3], Duration::from_secs(30));
    let culprit = job.stderr(2);
    assert_ne!(job.exit(2).0, 0);
    assert!(culprit.contains(r#"model (task 0: "qwen", here: "llama")"#), "{culprit}");
    assert!(!culprit.contains("batch"), "only differing fields are listed: {culprit}");
    for i in [0, 1, 3] {
        assert_ne!(job.exit(i).0, 0, "task {i} must stop too");
        let text = job.stderr(i);
        assert!(text.contains("task 2") && text.contains("model"), "task {i}: {text}");
    }
}

#[test]
fn kill_9_of_a_waiting_worker_stops_the_others_within_2s_naming_it() {
    let mut job = Job::start(4, |task| strings(&[if task == 3 { "hold" } else { "wait" }]));
    job.wait_for_line(&[0, 1, 2, 3], "waiting", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(100));
    let killed = job.kill9(3);
    job.wait_exit(&[0, 1, 2], Duration::from_secs(10));
    for i in 0..3 {
        let (code, at) = job.exit(i);
        assert_ne!(code, 0);
        assert!(at - killed < Duration::from_secs(2), "task {i} took {:?}", at - killed);
        let text = job.stderr(i);
        assert!(text.contains("task 3 was lost"), "task {i}: {text}");
    }
}

#[test]
fn kill_9_of_the_coordinator_stops_the_workers_within_1s() {
    let mut job = Job::start(4, |task| strings(&[if task == 0 { "hold" } else { "wait" }]));
    job.wait_for_line(&[0, 1, 2, 3], "waiting", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(100));
    let killed = job.kill9(0);
    job.wait_exit(&[1, 2, 3], Duration::from_secs(10));
    for i in 1..4 {
        let (code, at) = job.exit(i);
        assert_ne!(code, 0);
        assert!(at - killed < Duration::from_secs(1), "task {i} took {:?}", at - killed);
        let text = job.stderr(i);
        assert!(text.contains("lost the coordinator"), "task {i}: {text}");
    }
}

#[test]
fn a_failing_worker_stops_the_others_within_1s() {
    let mut job = Job::start(4, |task| strings(&[if task == 1 { "fail" } else { "wait" }]));
    job.wait_for_line(&[0, 1, 2, 3], "waiting", Duration::from_secs(30));
    job.wait_exit(&[1], Duration::from_secs(10));
    let (code, failed) = job.exit(1);
    assert_eq!(code, 1);
    job.wait_exit(&[0, 2, 3], Duration::from_secs(10));
    for i in [0, 2, 3] {
        let (code, at) = job.exit(i);
        assert_ne!(code, 0);
        // `failed` is when the failing process was seen gone, after it reported: a lower bound.
        assert!(at.saturating_duration_since(failed) < Duration::from_secs(1), "task {i} took {:?}", at - failed);
        let text = job.stderr(i);
        assert!(text.contains("task 1 reported an error: worker failed on purpose"), "task {i}: {text}");
    }
}

#[test]
fn a_panicking_worker_is_reported_by_its_panic_hook() {
    let mut job = Job::start(3, |task| strings(&[if task == 2 { "panic" } else { "wait" }]));
    job.wait_exit(&[0, 1, 2], Duration::from_secs(30));
    for i in [0, 1] {
        let text = job.stderr(i);
        assert!(text.contains("task 2 panicked") && text.contains("worker panicked on purpose"), "task {i}: {text}");
    }
}

#[test]
fn a_worker_that_never_starts_times_out_registration_naming_it() {
    // Task 2 of 3 is never started; the register timeout is 3 s.
    let mut job = Job::start_some(3, vec![0, 1], |_| strings(&["wait"]));
    job.wait_exit(&[0, 1], Duration::from_secs(15));
    for i in 0..2 {
        assert_ne!(job.exit(i).0, 0);
        let text = job.stderr(i);
        assert!(text.contains("not every task registered") && text.contains("[2] did not arrive"), "task {i}: {text}");
    }
}

#[test]
fn sigterm_of_a_worker_stops_every_process_as_preempted() {
    let mut job = Job::start(3, |task| strings(&[if task == 1 { "hold" } else { "wait" }]));
    job.wait_for_line(&[0, 1, 2], "waiting", Duration::from_secs(30));
    let pid = job.procs[1].child.id().to_string();
    let status = Command::new("kill").args(["-TERM", &pid]).status().expect("run kill");
    assert!(status.success());
    let sent = Instant::now();
    job.wait_exit(&[0, 1, 2], Duration::from_secs(10));
    for i in 0..3 {
        assert_eq!(job.exit(i).0, siphon_coord::EXIT_PREEMPTED, "task {i}: {}", job.stderr(i));
        assert!(job.exit(i).1 - sent < Duration::from_secs(3), "task {i} took {:?}", job.exit(i).1 - sent);
    }
    assert!(job.stderr(1).contains("received SIGTERM: preempted"), "{}", job.stderr(1));
    for i in [0, 2] {
        let text = job.stderr(i);
        assert!(text.contains("the job stopped: preempted: task 1: received SIGTERM"), "task {i}: {text}");
    }
}

#[test]
fn sigint_of_a_worker_is_a_failure_reported_to_the_others() {
    let mut job = Job::start(2, |task| strings(&[if task == 1 { "hold" } else { "wait" }]));
    job.wait_for_line(&[0, 1], "waiting", Duration::from_secs(30));
    let pid = job.procs[1].child.id().to_string();
    assert!(Command::new("kill").args(["-INT", &pid]).status().expect("run kill").success());
    job.wait_exit(&[0, 1], Duration::from_secs(10));
    assert_eq!(job.exit(1).0, 130, "{}", job.stderr(1));
    assert_eq!(job.exit(0).0, 1, "{}", job.stderr(0));
    assert!(job.stderr(0).contains("task 1 received SIGINT"), "{}", job.stderr(0));
}
