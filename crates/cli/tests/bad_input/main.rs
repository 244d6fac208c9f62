//! No input crashes siphon or is accepted silently: each bad flag, file, corpus or config ends
//! with a message naming what is wrong (exit 1–127), never a crash, a hang or a wrong result.
//! One module per class of bad input; this file holds the fixtures they share: the tiny random
//! Llama of the end-to-end tests, a generated corpus, the PJRT CPU plugin, 127.0.0.1 only.
//!
//! - `sizes`: size flags at their edges, sequences past the context, shapes nothing can count;
//! - `crashes`: a host that panics or dies of a fatal signal;
//! - `corpus`: corpora of nothing, `siphon data`'s counts, special files the data path reads;
//! - `exports`: the exports' and dashboards' folders in use and count flags out of range;
//! - `fetch`: a model's or dictionary's host that does not answer;
//! - `flags`: every command's count, duration and size flags past their range, hook ranges
//!   past the model, `forward`'s rows past the context or the memory, special files a flag
//!   names, a launched host's own error;
//! - `model`: config.json values out of range or not understood, weights and dictionaries
//!   holding NaN, special files where a model's files are read;
//! - `non_finite`: activations that are NaN or ±Inf;
//! - `runs`: a run's files replaced by FIFOs, or holding numbers of the wrong type;
//! - `signals`: SIGTERM and SIGINT at every phase of the job.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

#[path = "../common/mod.rs"]
mod common;

mod corpus;
mod crashes;
mod exports;
mod fetch;
mod flags;
mod model;
mod non_finite;
mod runs;
mod signals;
mod sizes;

use common::{Guard, make_corpus, make_model, repo_root, siphon_command, wait_with_limit};

pub(crate) fn siphon(args: &[String]) -> Command {
    let mut command = siphon_command(args);
    command.env("RUST_LOG", "warn").env_remove("SIPHON_CPU_DEVICES");
    command
}

/// Runs to its end within `limit` (else kills it and fails), and how long it took.
pub(crate) fn run(mut command: Command, limit: Duration) -> (Output, Duration) {
    let start = Instant::now();
    let output = wait_with_limit(Guard(command.spawn().expect("start siphon")), limit);
    (output, start.elapsed())
}

pub(crate) struct Setup {
    _tmp: tempfile::TempDir,
    pub(crate) root: std::path::PathBuf,
}

pub(crate) fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    make_model(&root.join("model"));
    make_corpus(&root.join("corpus"), 6);
    Setup { _tmp: tmp, root }
}

pub(crate) fn extract_args(s: &Setup, run: &str, extra: &[&str]) -> Vec<String> {
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
pub(crate) fn assert_no_crash(output: &Output, what: &str) {
    use std::os::unix::process::ExitStatusExt;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.signal().is_none(), "{what}: killed by signal {:?}: {stderr}", output.status.signal());
    let code = output.status.code().unwrap();
    assert!(code != 101 && !stderr.contains("panicked"), "{what}: panicked: {stderr}");
    if code != 0 {
        assert!(stderr.contains("error"), "{what}: exit {code} without an error message: {stderr}");
    }
}
