//! A host that panics or dies of a fatal signal: one line naming it, and the job stops.

use std::process::Output;
use std::time::Duration;

use crate::{Setup, extract_args, run, setup, siphon};

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
