//! Flag values past what a command can hold (counts, durations, sizes, hook ranges, rows past
//! the context or the memory) refused before work starts, naming the flag; special files a
//! flag names refused before they are opened; a launched host's own error always relayed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::repo_root;
use crate::{Setup, assert_no_crash, extract_args, run, setup, siphon};

/// Most refusals come back at once; none may take longer than this.
const QUICK: Duration = Duration::from_secs(10);

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// Runs `args` and checks it was refused quickly, without a crash, naming every one of `named`;
/// returns its stderr.
fn refused(args: &[String], named: &[&str]) -> String {
    let (output, took) = run(siphon(args), Duration::from_secs(60));
    let what = format!("{args:?}");
    assert_no_crash(&output, &what);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{what} was accepted: {stderr}");
    assert!(took < QUICK, "{what}: refused only after {took:?}");
    for name in named {
        assert!(stderr.contains(name), "{what}: the error does not name {name}: {stderr}");
    }
    stderr
}

/// Every value of `values` given to `flag` of `command` is refused, naming the flag.
fn each_refused(command: &[&str], flag: &str, values: &[&str]) {
    for value in values {
        let mut args = strings(command);
        args.push(format!("{flag}={value}"));
        refused(&args, &[flag]);
    }
}

/// A FIFO in `dir`: a read of it blocks until someone writes, so it must never be opened.
fn fifo(dir: &Path) -> PathBuf {
    let path = dir.join("fifo");
    assert!(std::process::Command::new("mkfifo").arg(&path).status().unwrap().success());
    path
}

/// Numbers no count, duration or size can hold, or that would overflow one later.
const HUGE: &[&str] = &["18446744073709551615", "4294967296", "-1", "inf", "NaN", "1e300"];

#[test]
fn launch_flags_past_their_range_start_no_host() {
    for (flag, values) in [
        ("--local-hosts", &["18446744073709551615", "99999999", "257", "0"][..]),
        ("--grace-seconds", &["inf", "1e300", "NaN", "-1"]),
        ("--cpu-devices-per-host", &["0", "1025", "18446744073709551615"]),
        ("--port", &["0", "65536"]),
    ] {
        for value in values {
            let args = strings(&["launch", &format!("{flag}={value}"), "--", "cluster", "info"]);
            let stderr = refused(&args, &[flag]);
            assert!(!stderr.contains("launching"), "{flag} {value}: hosts were started: {stderr}");
        }
    }
}

#[test]
fn a_failed_hosts_first_error_is_relayed_every_time() {
    // A host failing at once used to exit before its forwarded lines were printed, and the
    // launcher said only "host 0 failed (exit code 2)" in 5 of 8 runs.
    let args = strings(&["launch", "--local-hosts", "1", "--", "cluster", "info", "--no-such-flag"]);
    for attempt in 0..20 {
        let (output, took) = run(siphon(&args), Duration::from_secs(60));
        assert_no_crash(&output, "launch");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "attempt {attempt}: {stderr}");
        assert!(took < QUICK, "attempt {attempt}: {took:?}");
        let host = "error: unexpected argument '--no-such-flag' found";
        assert!(stderr.contains(&format!("[host 0] {host}")), "attempt {attempt}: the host's line is lost: {stderr}");
        let last = stderr.lines().last().unwrap_or_default();
        assert_eq!(last, format!("error: host 0 failed (exit code 2): {host}"), "attempt {attempt}: {stderr}");
    }
}

#[test]
fn coordinator_and_cluster_counts_past_their_range_start_nothing() {
    let coordinator = ["coordinator", "--process-id", "0", "--coordinator", "127.0.0.1:1"];
    each_refused(&coordinator, "--num-processes", &["4294967295", "1048577", "0", "-1"]);
    each_refused(&["cluster", "info"], "--total-machines", &["4294967295", "0"]);
    each_refused(&["cluster", "info"], "--machine-id", &["4294967295"]);
    each_refused(&["cluster", "info"], "--process-id", &["1048576"]);
    // From the environment as from the flag: nothing is made for a count no job has.
    let mut command = siphon(&strings(&coordinator));
    command.env("SIPHON_NUM_PROCESSES", "4294967295").env("SIPHON_JOB_TOKEN", "t");
    let (output, took) = run(command, Duration::from_secs(60));
    assert_no_crash(&output, "SIPHON_NUM_PROCESSES");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && took < QUICK, "{took:?}: {stderr}");
    assert!(stderr.contains("process count 4294967295 (from SIPHON_* environment)"), "{stderr}");

    each_refused(&["cluster", "check"], "--timeout-s", HUGE);
    each_refused(&["cluster", "check"], "--timeout-s", &["0"]);
    each_refused(&["cluster", "check"], "--rounds", &["0", "4294967295", "1000001"]);
    // Each run of the bench starts that many processes on this machine.
    each_refused(&["cluster", "bench"], "--processes", &["99999999", "2,257", "0"]);
    each_refused(&["cluster", "bench"], "--rounds", &["0", "4294967296"]);
}

#[test]
fn bench_doctor_and_plan_sizes_past_their_range_make_nothing() {
    each_refused(&["bench", "memory"], "--target-bytes", &["18446744073709551615", "1125899906842625", "0", "1e15"]);
    each_refused(&["bench", "memory"], "--cpu-devices", &["0", "1025"]);
    // In range, past this machine: refused before any buffer is made, with the figures.
    let stderr = refused(&strings(&["bench", "memory", "--target-bytes", "1000000000000000"]), &["--target-bytes"]);
    assert!(stderr.contains("available"), "{stderr}");

    each_refused(&["doctor"], "--store-timeout", HUGE);
    each_refused(&["doctor"], "--cpu-devices", &["0", "1025"]);

    let config = repo_root().join("fixtures/configs/qwen2.5-7b.json");
    let plan = ["plan", "--config", config.to_str().unwrap()];
    each_refused(&plan, "--device-memory", &["0", "inf", "NaN", "-1", "1e300"]);
    each_refused(&plan, "--headroom", &["1", "-0.5", "NaN", "inf"]);
    each_refused(&plan, "--latent-cap", &["0", "4294967296"]);
    // Each in range, their product past any machine siphon plans for.
    let mut hosts = strings(&plan);
    hosts.extend(strings(&["--hosts", "1048576", "--devices-per-host", "1048576"]));
    refused(&hosts, &["--devices-per-host", "more than the 65536 devices"]);
    let mut slices = strings(&plan);
    slices.extend(strings(&["--target", "tpu:v5e-64", "--slices", "1048576", "--batch", "8", "--seq", "8"]));
    refused(&slices, &["--slices", "more than the 65536 devices"]);
}

#[test]
fn extract_real_flags_refuse_what_no_duration_or_size_holds() {
    let s = setup();
    let base = extract_args(&s, "r", &[]);
    let base: Vec<&str> = base.iter().map(String::as_str).collect();
    for flag in ["--store-timeout", "--connect-timeout", "--register-timeout", "--stop-timeout", "--shard-size-mb"] {
        each_refused(&base, flag, &["inf", "NaN", "1e300", "-1"]);
    }
    each_refused(&base, "--shard-size-mb", &["0", "1e-9"]);
    each_refused(&base, "--store-timeout", &["0"]);
    each_refused(&base, "--latent-cap", &["0", "18446744073709551615"]);
    assert!(!s.root.join("out/r").exists(), "a run directory was made");
}

#[test]
fn hook_ranges_are_bounded_by_the_model_before_anything_is_made() {
    let s = setup();
    let model = s.root.join("model");
    for range in ["{0..999999999999}", "{0..100000000}", "{1..18446744073709551615}"] {
        let hooks = format!("blocks.{range}.hook_resid_post");
        let plan = strings(&["plan", "--model", model.to_str().unwrap(), "--hooks", &hooks]);
        let extract = extract_args(&s, "r", &["--hooks", &hooks]);
        for args in [plan, extract] {
            // Within a gigabyte of address space: nothing is made for the range's layers.
            let mut command = siphon(&args);
            limit_memory(&mut command, 1 << 30);
            let (output, took) = run(command, Duration::from_secs(60));
            assert_no_crash(&output, &hooks);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(!output.status.success() && took < QUICK, "{hooks}: {took:?} {stderr}");
            assert!(stderr.contains("is out of range (the model has 2 layers"), "{hooks}: {stderr}");
        }
    }
}

/// Caps the child's address space (`RLIMIT_AS`), so an allocation past it fails in the child.
fn limit_memory(command: &mut std::process::Command, bytes: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit is async-signal-safe and touches nothing of the parent.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
            match libc::setrlimit(libc::RLIMIT_AS, &limit) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
}

/// `siphon forward` of the tiny model with `input` and `extra` flags.
fn forward(s: &Setup, input: &[&str], extra: &[&str]) -> Vec<String> {
    let (model, out) = (s.root.join("model"), s.root.join("acts.safetensors"));
    let mut args = strings(&["forward", "--model", model.to_str().unwrap(), "--hooks", "blocks.1.hook_resid_post"]);
    args.extend(strings(input));
    args.extend(strings(&["--out", out.to_str().unwrap()]));
    args.extend(strings(extra));
    args
}

#[test]
fn forward_rows_past_the_context_or_the_memory_are_refused_before_the_weights_load() {
    let s = setup();
    // The tiny model reads the fixture tokenizer as its own.
    std::fs::copy(repo_root().join("fixtures/data/tokenizer.json"), s.root.join("model/tokenizer.json")).unwrap();
    let text = "the river ran cold under a grey sky ".repeat(40);
    let stderr = refused(&forward(&s, &["--text", &text], &[]), &["--text", "max_position_embeddings 256"]);
    assert!(stderr.contains("--allow-long-context"), "{stderr}");

    let ids = s.root.join("ids.json");
    let row = |n: usize| format!("[[{}]]", vec!["1"; n].join(","));
    std::fs::write(&ids, row(257)).unwrap();
    let input = ["--ids", ids.to_str().unwrap()];
    refused(&forward(&s, &input, &[]), &["--ids", "a sequence of 257 tokens", "max_position_embeddings 256"]);
    // Allowed past the context, two million positions' scores fit no machine: refused with the
    // figures before any weight is uploaded.
    std::fs::write(&ids, row(2_000_000)).unwrap();
    let stderr = refused(&forward(&s, &input, &["--allow-long-context"]), &["--ids", "available"]);
    assert!(stderr.contains("fewer or shorter rows"), "{stderr}");
    // Inside the context the same command runs.
    std::fs::write(&ids, row(200)).unwrap();
    let (output, _) = run(siphon(&forward(&s, &input, &[])), Duration::from_secs(120));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn forward_mesh_and_device_counts_past_their_range_are_refused() {
    let s = setup();
    let ids = s.root.join("ids.json");
    std::fs::write(&ids, "[[1,2,3]]").unwrap();
    let input = ["--ids", ids.to_str().unwrap()];
    let args = forward(&s, &input, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    each_refused(&args, "--cpu-devices", &["0", "1025", "18446744073709551615"]);
    each_refused(&args, "--latent-cap", &["0"]);
    for mesh in ["data=4294967296,model=4294967296", "data=0", "data=-1", "data=x"] {
        refused(&forward(&s, &input, &["--mesh", mesh]), &["--mesh", "is not in 1..=1048576"]);
    }
    let mesh = "data=1048576,model=1048576,fsdp=1048576,x=1048576";
    refused(&forward(&s, &input, &["--mesh", mesh]), &["--mesh", "needs more devices"]);
    refused(&forward(&s, &input, &["--mesh", "data=1048576,model=1048576"]), &["needs 1099511627776 devices"]);
}

#[test]
fn special_files_a_flag_names_are_refused_before_they_are_opened() {
    let s = setup();
    let fifo = fifo(&s.root);
    let fifo = fifo.to_str().unwrap();
    let token = s.root.join("token");
    std::fs::write(&token, "t").unwrap();
    let coordinator = ["coordinator", "--num-processes", "1", "--coordinator", "127.0.0.1:1", "--job-token-file"];
    let cases = [
        (forward(&s, &["--ids", fifo], &[]), "--ids"),
        (forward(&s, &["--ids", "/dev/zero"], &[]), "--ids"),
        (forward(&s, &["--ids", s.root.to_str().unwrap()], &[]), "--ids"),
        (strings(&["extract", "--config", fifo]), "the config file"),
        (strings(&["plan", "--config", fifo]), "the config"),
        (strings(&["cluster", "check", "--job-token-file", fifo]), "the job token file"),
        (strings(&[&coordinator[..], &[token.to_str().unwrap(), "--coordinator-ca", fifo]].concat()), "coordinator CA"),
    ];
    for (args, what) in cases {
        let stderr = refused(&args, &[what, "not a regular file"]);
        assert!(stderr.contains(fifo) || stderr.contains("/dev/zero") || stderr.contains("a directory"), "{stderr}");
    }
}
