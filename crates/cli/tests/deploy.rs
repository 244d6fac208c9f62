//! The recipes in deploy/, run as far as a machine without a cluster allows:
//! - the SLURM sbatch script under a stand-in `srun` (deploy/testing/fake-srun) that starts its
//!   tasks as local processes with SLURM's variables;
//! - the Cloud TPU VM script under a stand-in `gcloud` (deploy/testing/fake-gcloud) whose
//!   "workers" are local processes with the TPU worker variables;
//! - the GKE manifests against pinned Kubernetes and JobSet schemas (needs the test venv:
//!   `SIPHON_TEST_PYTHON`, set by scripts/test.sh, with PyPI kubernetes-validate);
//! - the container image's entrypoint and its CPU plugin stage (Docker itself is not needed).
//!
//! Each job extracts from a tiny random Llama with the PJRT CPU plugin on 127.0.0.1, is checked
//! with `siphon inspect`, and is run a second time to show that it resumes (nothing new is
//! written). Every process tree is killed by a guard.

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{make_corpus, make_model, plugin, repo_root};

const SIPHON: &str = env!("CARGO_BIN_EXE_siphon");
const LIMIT: Duration = Duration::from_secs(300);

/// A process group (a script and everything it started), killed if the test ends first.
struct GroupGuard(Child);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        // SAFETY: kill(2) with a negative pid signals the process group we created.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// Runs `command` in its own process group to the end (or kills the group after `limit`).
fn run(command: &mut Command, limit: Duration) -> Output {
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let mut guard = GroupGuard(command.spawn().expect("start the script"));
    let stdout = guard.0.stdout.take().unwrap();
    let stderr = guard.0.stderr.take().unwrap();
    let out = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let err = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = guard.0.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            drop(guard);
            panic!(
                "did not finish within {limit:?}\nstdout:\n{}\nstderr:\n{}",
                out.join().unwrap(),
                err.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // The script is done; kill whatever it left behind in its group.
    drop(guard);
    Output { status, stdout: out.join().unwrap().into_bytes(), stderr: err.join().unwrap().into_bytes() }
}

fn text(output: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn run_ok(command: &mut Command) -> Output {
    let output = run(command, LIMIT);
    assert!(output.status.success(), "failed ({}):\n{}", output.status, text(&output));
    output
}

/// A command with no identity of its own: no SIPHON_* identity, token, TPU or SLURM variable
/// of the environment the tests run in leaks into the job.
fn clean(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new(program);
    for (name, _) in std::env::vars() {
        let identity = ["SIPHON_PROCESS_ID", "SIPHON_NUM_PROCESSES", "SIPHON_COORDINATOR", "SIPHON_JOB_TOKEN"];
        if identity.contains(&name.as_str()) || name.starts_with("SLURM_") || name.starts_with("TPU_") {
            command.env_remove(name);
        }
    }
    command.env("SIPHON_PJRT_PLUGIN", plugin()).env("TF_CPP_MIN_LOG_LEVEL", "2");
    command
}

struct Job {
    tmp: tempfile::TempDir,
    model: PathBuf,
    corpus: PathBuf,
    output: PathBuf,
}

fn job() -> Job {
    let tmp = tempfile::tempdir().unwrap();
    let (model, corpus, output) = (tmp.path().join("model"), tmp.path().join("corpus"), tmp.path().join("out"));
    make_model(&model);
    make_corpus(&corpus, 40);
    Job { tmp, model, corpus, output }
}

impl Job {
    fn extract_args(&self, run: &str) -> Vec<String> {
        let tokenizer = repo_root().join("fixtures/data/tokenizer.json");
        let path = |p: &Path| p.to_str().unwrap().to_string();
        let mut args: Vec<String> = ["extract", "--model", &path(&self.model), "--tokenizer", &path(&tokenizer)]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(
            [
                "--corpus",
                &path(&self.corpus),
                "--text-records",
                "line",
                "--hooks",
                "blocks.0.hook_resid_pre,ln_final.hook_normalized",
                "--seq-len",
                "32",
                "--batch-size",
                "4",
                "--dtype",
                "f32",
                "--shard-size-mb",
                "0.02",
                "--output",
                &path(&self.output),
                "--run",
                run,
                "--tokenizer-threads",
                "1",
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        args
    }

    /// The host directories of a run, sorted.
    fn hosts(&self, run: &str) -> Vec<String> {
        let mut hosts: Vec<String> = std::fs::read_dir(self.output.join(run))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("machine_"))
            .collect();
        hosts.sort();
        hosts
    }

    /// Committed shards over every host of a run.
    fn shard_count(&self, run: &str) -> usize {
        self.hosts(run)
            .iter()
            .map(|h| {
                std::fs::read_to_string(self.output.join(run).join(h).join("manifest.jsonl")).unwrap().lines().count()
            })
            .sum()
    }

    fn inspect_ok(&self, run: &str) {
        let output = run_ok(clean(SIPHON).arg("inspect").arg(self.output.join(run)));
        assert!(String::from_utf8_lossy(&output.stdout).contains("ok"), "{}", text(&output));
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A directory holding `name` → `target` (a stand-in put first on PATH).
fn stand_in(dir: &Path, name: &str, target: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(target, bin.join(name)).unwrap();
    bin
}

fn path_with(dir: &Path) -> String {
    format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default())
}

#[test]
fn slurm_sbatch_runs_one_siphon_per_task_and_a_requeued_job_resumes() {
    let job = job();
    let bin = stand_in(job.tmp.path(), "srun", &repo_root().join("deploy/testing/fake-srun"));
    let port = free_port();
    let sbatch = |run: &str| {
        let mut command = clean("bash");
        command
            .arg(repo_root().join("deploy/slurm/siphon.sbatch"))
            .args(job.extract_args(run))
            .env("PATH", path_with(&bin))
            .env("SIPHON", SIPHON)
            .env("SLURM_JOB_ID", "4242")
            .env("SLURM_NTASKS", "2")
            .env("SLURM_NNODES", "1")
            .env("SLURM_JOB_NODELIST", "127.0.0.1")
            .env("SIPHON_COORDINATOR_PORT", port.to_string());
        command
    };
    let output = run_ok(&mut sbatch("slurm"));
    let all = text(&output);
    assert!(all.contains("coordinator port"), "{all}");
    for task in ["0: ", "1: "] {
        assert!(all.lines().any(|l| l.starts_with(task)), "no output from task {task}\n{all}");
    }
    assert!(all.contains("SLURM"), "identity should come from SLURM's variables\n{all}");
    assert_eq!(job.hosts("slurm"), ["machine_000_host_00", "machine_000_host_01"]);
    job.inspect_ok("slurm");
    let shards = job.shard_count("slurm");
    assert!(shards >= 2, "{shards} shards");

    // A requeued job runs the same script with the same arguments: it resumes, writing nothing new.
    run_ok(&mut sbatch("slurm"));
    assert_eq!(job.shard_count("slurm"), shards);
    job.inspect_ok("slurm");
}

#[test]
fn slurm_sbatch_requeues_a_preempted_job() {
    let job = job();
    let bin = stand_in(job.tmp.path(), "srun", &repo_root().join("deploy/testing/fake-srun"));
    let requeued = job.tmp.path().join("requeued");
    let script = |name: &str, body: &str| {
        let path = bin.join(name);
        std::fs::write(&path, format!("#!/usr/bin/env bash\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        path
    };
    script("scontrol", &format!("echo \"$@\" >> {}", requeued.display()));
    let sbatch = |code: i32| {
        let siphon = script("stand-in-siphon", &format!("exit {code}"));
        let mut command = clean("bash");
        command
            .arg(repo_root().join("deploy/slurm/siphon.sbatch"))
            .arg("extract")
            .env("PATH", path_with(&bin))
            .env("SIPHON", &siphon)
            .env("SLURM_JOB_ID", "4242")
            .env("SLURM_NTASKS", "2")
            .env("SLURM_JOB_NODELIST", "127.0.0.1");
        let output = run(&mut command, LIMIT);
        assert_eq!(output.status.code(), Some(code), "{}", text(&output));
        (text(&output), std::fs::read_to_string(&requeued).unwrap_or_default())
    };
    // Tasks that report a preemption: the job is requeued once.
    let (log, calls) = sbatch(75);
    assert_eq!(calls, "requeue 4242\n", "{log}");
    assert!(log.contains("was preempted; requeueing it"), "{log}");
    // Tasks that fail: no requeue.
    let (log, calls) = sbatch(1);
    assert_eq!(calls, "requeue 4242\n", "a failed job is not requeued: {log}");
}

#[test]
fn slurm_sbatch_fails_when_a_task_fails() {
    let job = job();
    let bin = stand_in(job.tmp.path(), "srun", &repo_root().join("deploy/testing/fake-srun"));
    let mut command = clean("bash");
    command
        .arg(repo_root().join("deploy/slurm/siphon.sbatch"))
        .args(["doctor", "--plugin", "/nonexistent/libpjrt.so"])
        .env("PATH", path_with(&bin))
        .env("SIPHON", SIPHON)
        .env("SLURM_JOB_ID", "7")
        .env("SLURM_NTASKS", "2")
        .env("SLURM_JOB_NODELIST", "127.0.0.1");
    let output = run(&mut command, LIMIT);
    assert!(!output.status.success(), "{}", text(&output));
    assert!(text(&output).contains("/nonexistent/libpjrt.so"), "{}", text(&output));
}

/// deploy/tpu-vm/siphon-tpu-vm.sh on a stand-in slice of two local workers under `workers`,
/// installing the test's siphon; `options` go before the command the caller adds.
fn tpu_vm_script(workers: &Path, port: u16, options: &[&str]) -> Command {
    let mut command = clean("bash");
    command
        .arg(repo_root().join("deploy/tpu-vm/siphon-tpu-vm.sh"))
        .args(["--tpu", "test-slice", "--zone", "nowhere1-a"])
        .args(options)
        .env("GCLOUD", repo_root().join("deploy/testing/fake-gcloud"))
        .env("FAKE_TPU_WORKERS", "2")
        .env("FAKE_TPU_ROOT", workers)
        .env("SIPHON_COORDINATOR_PORT", port.to_string())
        .env("SIPHON_INSTALL_COMMAND", format!("mkdir -p ~/.local/bin && ln -sf {SIPHON} ~/.local/bin/siphon"));
    command
}

#[test]
fn tpu_vm_script_installs_hands_out_the_token_and_starts_every_worker() {
    let job = job();
    let workers = job.tmp.path().join("workers");
    let port = free_port();
    let script = |args: &[String]| {
        let mut command = tpu_vm_script(&workers, port, &[]);
        command.args(args);
        command
    };
    let output = run_ok(&mut script(&["install".into()]));
    assert!(text(&output).contains("[worker 1] siphon "), "every worker reports its version\n{}", text(&output));

    let start = |run: &str| {
        let mut args: Vec<String> = ["--foreground", "start", "--"].iter().map(|s| s.to_string()).collect();
        args.extend(job.extract_args(run));
        script(&args)
    };
    let output = run_ok(&mut start("tpu"));
    let all = text(&output);
    assert!(all.contains("Cloud TPU VM"), "identity should come from the TPU worker variables\n{all}");
    let tokens: Vec<String> = (0..2)
        .map(|i| std::fs::read_to_string(workers.join(format!("worker-{i}/.siphon/job-token"))).unwrap())
        .collect();
    assert_eq!(tokens[0], tokens[1], "every worker must get the same token");
    assert_eq!(tokens[0].len(), 64);
    assert!(!all.contains(&tokens[0]), "the token must never be printed");
    let mode = std::fs::metadata(workers.join("worker-0/.siphon/job-token")).unwrap();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777, 0o600);
    assert_eq!(job.hosts("tpu"), ["machine_000_host_00", "machine_000_host_01"]);
    assert!(workers.join("worker-1/.siphon/logs/siphon.log").exists());
    job.inspect_ok("tpu");
    let shards = job.shard_count("tpu");

    // After a preemption the same start command resumes (with a new token).
    run_ok(&mut start("tpu"));
    assert_eq!(job.shard_count("tpu"), shards);
    let token = std::fs::read_to_string(workers.join("worker-0/.siphon/job-token")).unwrap();
    assert_ne!(token, tokens[0], "each start hands out a fresh token");
}

#[test]
fn tpu_vm_script_starts_detached_reports_status_and_stops() {
    let job = job();
    let workers = job.tmp.path().join("workers");
    let port = free_port();
    let script = |args: &[&str]| {
        let mut command = tpu_vm_script(&workers, port, &["--job", "detached"]);
        command.args(args);
        command
    };
    run_ok(&mut script(&["install"]));
    let mut start: Vec<String> = ["start", "--"].iter().map(|s| s.to_string()).collect();
    start.extend(job.extract_args("detached"));
    let output = run_ok(&mut script(&start.iter().map(String::as_str).collect::<Vec<_>>()));
    assert!(text(&output).contains("started; follow it with"), "{}", text(&output));
    let pids: Vec<i32> = (0..2)
        .map(|i| {
            std::fs::read_to_string(workers.join(format!("worker-{i}/.siphon/detached.pid")))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        })
        .collect();
    // The detached workers outlive the script; make sure they do not outlive the test.
    struct Kill(Vec<i32>);
    impl Drop for Kill {
        fn drop(&mut self) {
            for pid in &self.0 {
                // SAFETY: signalling a process this test started.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
        }
    }
    let _kill = Kill(pids);
    let deadline = Instant::now() + LIMIT;
    loop {
        let output = run_ok(&mut script(&["status"]));
        let status = text(&output);
        if status.matches("not running").count() == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the detached job did not finish:\n{status}");
        std::thread::sleep(Duration::from_millis(500));
    }
    job.inspect_ok("detached");
    assert!(
        std::fs::read_to_string(workers.join("worker-0/.siphon/logs/detached.log"))
            .unwrap()
            .contains("dataset complete")
    );
    // stop on a finished job is harmless.
    run_ok(&mut script(&["stop"]));
}

#[test]
fn tpu_vm_script_refuses_to_start_without_a_command() {
    let mut command = clean("bash");
    command
        .arg(repo_root().join("deploy/tpu-vm/siphon-tpu-vm.sh"))
        .args(["--tpu", "t", "--zone", "z", "start"])
        .env("GCLOUD", "/bin/false");
    let output = run(&mut command, LIMIT);
    assert!(!output.status.success());
    assert!(text(&output).contains("start needs the siphon command"), "{}", text(&output));
}

/// The venv of scripts/setup-python.sh, or None (then the test says it is skipped).
fn test_python() -> Option<String> {
    let python = std::env::var("SIPHON_TEST_PYTHON").ok();
    if python.is_none() {
        eprintln!("skipped: SIPHON_TEST_PYTHON is not set (scripts/test.sh sets it)");
    }
    python
}

#[test]
fn gke_manifests_pass_the_pinned_schemas_and_broken_ones_do_not() {
    let Some(python) = test_python() else { return };
    let validator = repo_root().join("deploy/testing/validate-k8s.py");
    let manifests = ["deploy/gke/jobset-tpu.yaml", "deploy/gke/indexed-job-gpu.yaml"].map(|m| repo_root().join(m));
    let output = run_ok(Command::new(&python).arg(&validator).args(&manifests));
    let all = text(&output);
    for kind in ["JobSet/siphon", "Job/siphon-gpu", "Service/siphon-gpu"] {
        assert!(all.lines().any(|l| l.starts_with("ok ") && l.contains(kind)), "{kind} not validated\n{all}");
    }

    // A misspelt field, a wrong type, a process count that disagrees with the pod count, and
    // preemptions (exit 75) that would use up the restart budget.
    let tmp = tempfile::tempdir().unwrap();
    let jobset = std::fs::read_to_string(&manifests[0])
        .unwrap()
        .replace("completionMode: Indexed", "completionsMode: Indexed")
        .replace("onJobFailureReasons: [PodFailurePolicy]", "onJobFailureReasons: [BackoffLimitExceeded]");
    let gpu = std::fs::read_to_string(&manifests[1])
        .unwrap()
        .replace("containerPort: 8476", "containerPort: \"8476\"")
        .replacen("value: \"2\"", "value: \"3\"", 1)
        .replace("values: [75]", "values: [1]");
    std::fs::write(tmp.path().join("jobset.yaml"), jobset).unwrap();
    std::fs::write(tmp.path().join("gpu.yaml"), gpu).unwrap();
    let output = run(
        Command::new(&python).arg(&validator).arg(tmp.path().join("jobset.yaml")).arg(tmp.path().join("gpu.yaml")),
        LIMIT,
    );
    let all = text(&output);
    assert!(!output.status.success(), "{all}");
    assert!(all.contains("'completionsMode' was unexpected"), "{all}");
    assert!(all.contains("is not of type 'integer'"), "{all}");
    assert!(all.contains("SIPHON_NUM_PROCESSES=3 but completions=2"), "{all}");
    assert!(all.contains("a preemption (a Job failed by PodFailurePolicy) would use up maxRestarts"), "{all}");
    assert!(all.contains("Job siphon-gpu: no podFailurePolicy rule Ignore for exit code 75"), "{all}");
}

#[test]
fn dockerfile_stages_copies_and_plugin_flavours_fit_together() {
    let dockerfile = std::fs::read_to_string(repo_root().join("deploy/container/Dockerfile")).unwrap();
    let stages: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .filter_map(|l| l.split(" AS ").nth(1))
        .map(str::trim)
        .collect();
    assert_eq!(stages, ["build", "base", "cpu", "tpu", "cuda", "all"]);
    for line in dockerfile.lines().filter(|l| l.starts_with("COPY ") && !l.contains("--from=")) {
        let words: Vec<&str> = line.split_whitespace().skip(1).collect();
        for source in &words[..words.len() - 1] {
            assert!(
                *source == "." || repo_root().join(source).exists(),
                "COPY source {source} is not in the repository"
            );
        }
    }
    for line in dockerfile.lines().filter(|l| l.contains("--from=")) {
        let from = line.split("--from=").nth(1).unwrap().split_whitespace().next().unwrap();
        assert!(stages.contains(&from), "COPY --from={from}: no such stage");
    }
    for flavour in ["cpu", "tpu", "cuda"] {
        assert!(
            dockerfile.contains(&format!("install-plugins.sh {flavour} /")),
            "stage {flavour} does not install its plugin"
        );
        assert!(
            dockerfile.contains(&format!("--target {flavour} ")),
            "the header does not show how to build {flavour}"
        );
    }
    // install-plugins.sh finds install-plugin.sh, lib.sh and the entrypoint beside itself.
    let scripts = dockerfile.lines().find(|l| l.starts_with("COPY ") && l.ends_with(" /opt/siphon/scripts/")).unwrap();
    for file in ["entrypoint.sh", "install-plugins.sh", "install-plugin.sh", "lib.sh"] {
        assert!(scripts.contains(&format!("/{file} ")), "{file} is not copied to /opt/siphon/scripts/: {scripts}");
    }
    assert!(dockerfile.contains(r#"ENTRYPOINT ["/opt/siphon/scripts/entrypoint.sh"]"#));
    let ignore = std::fs::read_to_string(repo_root().join(".dockerignore")).unwrap();
    assert!(ignore.lines().any(|l| l.trim() == "target/"), "the build context must not carry target/");
}

fn entrypoint(root: &Path, flavour: Option<&str>) -> Command {
    let mut command = clean(repo_root().join("deploy/container/entrypoint.sh"));
    command.env_remove("SIPHON_PJRT_PLUGIN").env("SIPHON_IMAGE_ROOT", root).env("SIPHON_BIN", SIPHON);
    match flavour {
        Some(flavour) => command.env("SIPHON_FLAVOUR", flavour),
        None => command.env_remove("SIPHON_FLAVOUR"),
    };
    command
}

#[test]
fn container_entrypoint_picks_the_plugin_per_flavour_and_device() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let put = |relative: &str| {
        let path = root.join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"").unwrap();
        path
    };
    let cpu = put("opt/siphon/cpu/pjrt/xla-cpu-2026.6.23/libpjrt_cpu.so");
    let tpu = put("opt/siphon/tpu/venv/lib/python3.11/site-packages/libtpu/libtpu.so");
    let pick = |flavour: Option<&str>| {
        let output = run(entrypoint(root, flavour).arg("--print-plugin"), LIMIT);
        (output.status.success(), String::from_utf8_lossy(&output.stdout).trim().to_string(), text(&output))
    };
    assert_eq!(pick(Some("cpu")).1, cpu.display().to_string());
    assert_eq!(pick(Some("tpu")).1, tpu.display().to_string());
    // No TPU device: auto takes the CPU plugin.
    assert_eq!(pick(None).1, cpu.display().to_string());
    put("dev/vfio/0");
    assert_eq!(pick(Some("auto")).1, tpu.display().to_string());
    let (ok, _, all) = pick(Some("cuda"));
    assert!(!ok && all.contains("no cuda plugin"), "{all}");
    let (ok, _, all) = pick(Some("gpu"));
    assert!(!ok && all.contains("is not cpu, tpu, cuda or auto"), "{all}");
    // The entrypoint runs siphon with the arguments.
    let output = run_ok(entrypoint(root, Some("cpu")).arg("--version"));
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("siphon "));
}

#[test]
fn container_cpu_stage_installs_a_plugin_that_siphon_doctor_runs() {
    // Downloads the pinned CPU plugin wheel (pip's cache usually has it after scripts/test.sh).
    if test_python().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut install = clean("bash");
    install.arg(repo_root().join("deploy/container/install-plugins.sh")).args(["cpu", tmp.path().to_str().unwrap()]);
    run_ok(&mut install);
    let output = run_ok(entrypoint(tmp.path(), Some("cpu")).args(["doctor", "--cpu-devices", "2"]));
    let all = text(&output);
    assert!(all.contains(&tmp.path().join("opt/siphon/cpu/pjrt").display().to_string()), "{all}");
    assert!(all.contains("ok: the sharded matmul on 2 devices matches plain Rust"), "{all}");
}
