//! No input crashes siphon: every size flag at its edges, sequences past the model's context,
//! shapes nothing can count, and a host that panics or dies of a fatal signal — each ends with
//! a message naming what is wrong, never a crash without one. The tiny random Llama of the
//! end-to-end tests, the PJRT CPU plugin, 127.0.0.1 only.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;

use common::{Guard, make_corpus, make_model, repo_root, siphon_command, wait_with_limit};

fn siphon(args: &[String]) -> Command {
    let mut command = siphon_command(args);
    command.env("RUST_LOG", "warn").env_remove("SIPHON_CPU_DEVICES");
    command
}

/// Runs to its end within `limit` (else kills it and fails), and how long it took.
fn run(mut command: Command, limit: Duration) -> (Output, Duration) {
    let start = Instant::now();
    let output = wait_with_limit(Guard(command.spawn().expect("start siphon")), limit);
    (output, start.elapsed())
}

struct Setup {
    _tmp: tempfile::TempDir,
    root: std::path::PathBuf,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    make_model(&root.join("model"));
    make_corpus(&root.join("corpus"), 6);
    Setup { _tmp: tmp, root }
}

fn extract_args(s: &Setup, run: &str, extra: &[&str]) -> Vec<String> {
    let tokenizer = repo_root().join("fixtures/data/tokenizer.json");
    let (model, corpus, out) = (s.root.join("model"), s.root.join("corpus"), s.root.join("out"));
    let mut args: Vec<String> = [
        "extract",
        "--model",
        model.to_str().unwrap(),
        "--tokenizer",
        tokenizer.to_str().unwrap(),
        "--corpus",
        corpus.to_str().unwrap(),
        "--text-records",
        "line",
        "--hooks",
        "blocks.1.hook_resid_post",
        "--seq-len",
        "16",
        "--batch-size",
        "2",
        "--max-tokens",
        "64",
        "--dtype",
        "f32",
        "--output",
        out.to_str().unwrap(),
        "--run",
        run,
        "--tokenizer-threads",
        "1",
        "--cpu-devices",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // A flag given again overrides the one above (`args_override_self`).
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Neither a panic, nor a signal, nor an abort: an exit code, and a message when it is not 0.
fn assert_no_crash(output: &Output, what: &str) {
    use std::os::unix::process::ExitStatusExt;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.signal().is_none(), "{what}: killed by signal {:?}: {stderr}", output.status.signal());
    let code = output.status.code().unwrap();
    assert!(code != 101 && !stderr.contains("panicked"), "{what}: panicked: {stderr}");
    if code != 0 {
        assert!(stderr.contains("error"), "{what}: exit {code} without an error message: {stderr}");
    }
}

#[test]
fn every_size_flag_at_its_edges_crashes_nothing() {
    let s = setup();
    let flags = [
        "--seq-len",
        "--batch-size",
        "--max-tokens",
        "--shard-size-mb",
        "--pipeline-depth",
        "--cpu-devices",
        "--data",
        "--fsdp",
        "--model-parallel",
        "--shuffle-tokens-window",
        "--stream-buffer",
        "--stream-keep",
        "--unit-bytes",
        "--tokenizer-threads",
        "--simulate-hosts",
        "--store-timeout",
        "--connect-timeout",
        "--register-timeout",
        "--stop-timeout",
    ];
    let values = ["0", "1", "2147483648", "9223372036854775808", "-1"];
    let cases: Vec<(&str, &str)> = flags.iter().flat_map(|f| values.iter().map(move |v| (*f, *v))).collect();
    // Two at a time: most are refused at once, the accepted ones run the tiny job.
    let accepted = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for (i, half) in cases.chunks(cases.len().div_ceil(2)).enumerate() {
            let (s, accepted) = (&s, &accepted);
            scope.spawn(move || {
                for (j, (flag, value)) in half.iter().enumerate() {
                    let (name, given) = (format!("r{i}-{j}"), format!("{flag}={value}"));
                    let (output, took) = run(siphon(&extract_args(s, &name, &[&given])), Duration::from_secs(120));
                    let what = format!("{given} ({took:?})");
                    assert_no_crash(&output, &what);
                    // A refused value is refused at once, naming its flag.
                    if !output.status.success() {
                        let stderr = String::from_utf8_lossy(&output.stderr);
                        let named = stderr.contains(flag) || (*flag == "--seq-len" && stderr.contains("at least 2"));
                        assert!(named, "{what}: the error does not name {flag}: {stderr}");
                        assert!(took < Duration::from_secs(5), "{what}: refused only after {took:?}");
                    } else {
                        accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let accepted = accepted.into_inner();
    // The values 1 of most flags run the job.
    assert!(accepted >= 10, "only {accepted} runs accepted");
}

#[test]
fn sequences_past_the_context_or_any_memory_are_refused_before_work_starts() {
    let s = setup();
    for (seq, allow) in
        [("1000000000", false), ("10000000", false), ("100000", false), ("100000", true), ("1000000000", true)]
    {
        let mut extra = vec!["--seq-len", seq];
        if allow {
            extra.push("--allow-long-context");
        }
        let (output, took) = run(siphon(&extract_args(&s, "r", &extra)), Duration::from_secs(30));
        let what = format!("--seq-len {seq} (allow {allow})");
        assert_no_crash(&output, &what);
        assert!(!output.status.success(), "{what}: accepted");
        assert!(took < Duration::from_secs(2), "{what}: refused only after {took:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        match allow {
            // The tiny model's context.
            false => {
                assert!(stderr.contains("--seq-len") && stderr.contains("max_position_embeddings 256"), "{stderr}")
            }
            // Past what the machine has, or what anything can count: the figures named.
            true => assert!(
                stderr.contains("--seq-len") && (stderr.contains("available") || stderr.contains("4 PiB")),
                "{stderr}"
            ),
        }
        assert!(!s.root.join("out/r").exists(), "{what}: a run directory was made");
    }
    // The 4 PiB refusal names the term.
    let (output, _) = run(
        siphon(&extract_args(&s, "r", &["--seq-len", "1000000000", "--allow-long-context"])),
        Duration::from_secs(30),
    );
    assert!(String::from_utf8_lossy(&output.stderr).contains("attention scores"));
}

#[test]
fn plan_refuses_shapes_it_cannot_count() {
    let config = repo_root().join("fixtures/configs/qwen2.5-7b.json");
    let plan = |extra: &[&str]| {
        let mut args: Vec<String> =
            ["plan", "--config", config.to_str().unwrap()].iter().map(|s| s.to_string()).collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        run(siphon(&args), Duration::from_secs(30)).0
    };
    for extra in [
        &["--batch", "99999999999", "--seq", "99999999999"][..],
        &["--batch", "4294967296", "--seq", "4294967296"],
        &["--batch", "65536", "--seq", "131072"],
    ] {
        let output = plan(extra);
        assert_no_crash(&output, &format!("{extra:?}"));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{extra:?} was planned: {}", String::from_utf8_lossy(&output.stdout));
        assert!(stderr.contains("--batch") || stderr.contains("--seq"), "{extra:?}: {stderr}");
    }
    let output = plan(&["--batch", "8", "--seq", "4096"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    // Past the context the plan is made (a plan computes nothing) and says extract refuses it.
    let output = plan(&["--batch", "1", "--seq", "200000"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && stdout.contains("max_position_embeddings 131072"), "{stdout}");
    assert!(stdout.contains("--allow-long-context"), "{stdout}");
}

/// `siphon launch` of the job on two local hosts, one failing as `crash` asks.
fn launch_failing(s: &Setup, crash: &str) -> (Output, Duration) {
    let mut args: Vec<String> =
        ["launch", "--local-hosts", "2", "--cpu-devices-per-host", "1", "--"].iter().map(|s| s.to_string()).collect();
    args.extend(extract_args(s, "c", &["--max-tokens", "100000", "--seq-len", "8", "--batch-size", "1"]));
    let mut command = siphon(&args);
    // Only host 1 fails: the launcher passes its environment to both, so the hosts check it
    // against their process id.
    command.env("SIPHON_TEST_CRASH", crash).env("SIPHON_TEST_CRASH_HOST", "1");
    run(command, Duration::from_secs(120))
}

#[test]
fn a_panicking_host_prints_one_line_and_stops_the_job() {
    let s = setup();
    let (output, _) = launch_failing(&s, "panic@2");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    let version = env!("CARGO_PKG_VERSION");
    let ours = format!("siphon {version}: internal error");
    let line = stderr.lines().find(|l| l.contains(&ours)).unwrap_or_else(|| panic!("no line: {stderr}"));
    assert!(line.contains("in host 1 (machine 0) at step 2"), "{line}");
    assert!(line.contains("SIPHON_TEST_CRASH at step 2"), "{line}");
    assert!(!stderr.contains("note: run with `RUST_BACKTRACE=1`"), "the default panic message: {stderr}");
    // The launcher names the first host it saw end: host 1, or host 0 stopped by its failure.
    assert!(stderr.contains("host 1 failed") || stderr.contains("task 1 panicked"), "{stderr}");
}

#[test]
fn a_fatal_signal_names_the_host_and_step() {
    let s = setup();
    let (output, _) = launch_failing(&s, "segv@1");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("fatal signal SIGSEGV") && stderr.contains("in host 1 (machine 0) at step 1"), "{stderr}");
    assert!(stderr.contains("host 1 failed (killed by signal 11 (SIGSEGV))"), "{stderr}");
}

#[test]
fn the_fatal_line_is_written_without_the_job_too() {
    // A single host (no launcher): its own line, and the signal's exit status.
    let s = setup();
    let mut command =
        siphon(&extract_args(&s, "x", &["--max-tokens", "100000", "--seq-len", "8", "--batch-size", "1"]));
    command.env("SIPHON_TEST_CRASH", "segv@0");
    let (output, _) = run(command, Duration::from_secs(60));
    use std::os::unix::process::ExitStatusExt;
    // SIGSEGV (11): the process still ends by the signal, for schedulers to see.
    assert_eq!(output.status.signal(), Some(11), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("fatal signal SIGSEGV") && stderr.contains("in host 0 (machine 0) at step 0"), "{stderr}");
}
