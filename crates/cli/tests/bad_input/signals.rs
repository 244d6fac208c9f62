//! SIGTERM and SIGINT at every phase of the job (loading, upload, compile, the first step,
//! the commit) end in their documented exit codes, 75 and 130, never in a crash, and leave a
//! run that the same command completes into the dataset an uninterrupted run writes.
//!
//! The job sends itself the signal as it enters the phase (`SIPHON_TEST_SIGNAL`) and goes on
//! with it while the signal is handled, the race a scheduler's signal wins or loses.
//! `SIPHON_SIGNAL_REPEATS` sets how often each phase and signal are tried (3 by default, the
//! first try of each then resumed; the stress command of the README's failure table runs 40)
//! and `SIPHON_SIGNAL_PHASES` which phases (comma-separated; default all).

use std::path::Path;
use std::time::Duration;

use crate::{Setup, extract_args, run, setup, siphon};

const PHASES: [&str; 5] = ["load", "upload", "compile", "step", "commit"];

fn repeats() -> usize {
    std::env::var("SIPHON_SIGNAL_REPEATS").ok().and_then(|v| v.parse().ok()).unwrap_or(3)
}

fn phases() -> Vec<&'static str> {
    let asked = std::env::var("SIPHON_SIGNAL_PHASES").unwrap_or_default();
    PHASES.into_iter().filter(|p| asked.is_empty() || asked.split(',').any(|a| a == *p)).collect()
}

/// The job of `run`, with enough steps that the first step and the commit are distinct.
fn job(s: &Setup, run_name: &str) -> Vec<String> {
    extract_args(s, run_name, &["--max-tokens", "96", "--shard-size-mb", "0.001"])
}

/// Each shard of a run, by file name: its metadata but the run's name, and its tensors.
type Dataset = Vec<(String, Vec<(String, String)>, Vec<(String, Vec<u8>)>)>;

fn dataset(dir: &Path) -> Dataset {
    let mut shards: Dataset = walk(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .map(|path| {
            let bytes = std::fs::read(&path).unwrap();
            let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
            let mut metadata: Vec<(String, String)> =
                header.metadata().clone().unwrap_or_default().into_iter().filter(|(k, _)| k != "run").collect();
            metadata.sort();
            let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            let mut tensors: Vec<(String, Vec<u8>)> =
                tensors.tensors().into_iter().map(|(name, view)| (name, view.data().to_vec())).collect();
            tensors.sort();
            (path.strip_prefix(dir).unwrap().display().to_string(), metadata, tensors)
        })
        .collect();
    shards.sort();
    shards
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() { out.extend(walk(&path)) } else { out.push(path) }
    }
    out
}

#[test]
fn a_signal_at_every_phase_ends_in_its_code_and_the_run_completes_after() {
    let s = setup();
    let (reference, _) = run(siphon(&job(&s, "reference")), Duration::from_secs(120));
    assert!(reference.status.success(), "{}", String::from_utf8_lossy(&reference.stderr));
    let expected = dataset(&s.root.join("out/reference"));
    assert!(expected.len() > 1, "the job writes several shards");
    let cases: Vec<(&str, &str, i32, usize)> = phases()
        .into_iter()
        .flat_map(|phase| [("SIGTERM", 75), ("SIGINT", 130)].map(|(signal, code)| (phase, signal, code)))
        .flat_map(|(phase, signal, code)| (0..repeats()).map(move |i| (phase, signal, code, i)))
        .collect();
    std::thread::scope(|scope| {
        for half in cases.chunks(cases.len().div_ceil(2)) {
            let (s, expected) = (&s, &expected);
            scope.spawn(move || {
                for &(phase, signal, code, i) in half {
                    let name = format!("{phase}-{signal}-{i}");
                    let mut command = siphon(&job(s, &name));
                    command.env("SIPHON_TEST_SIGNAL", format!("{phase}:{signal}"));
                    let (output, took) = run(command, Duration::from_secs(120));
                    let what = format!("{signal} while {phase} ({took:?})");
                    let stderr = String::from_utf8_lossy(&output.stderr);
                    assert_eq!(output.status.code(), Some(code), "{what}: {stderr}");
                    assert!(!stderr.contains("fatal signal") && !stderr.contains("Pure virtual"), "{what}: {stderr}");
                    if i > 0 {
                        continue;
                    }
                    // The same command completes the run, into the uninterrupted run's shards.
                    let (resumed, _) = run(siphon(&job(s, &name)), Duration::from_secs(120));
                    let again = String::from_utf8_lossy(&resumed.stderr);
                    assert!(resumed.status.success(), "{what}, then resumed: {again}");
                    let got = dataset(&s.root.join("out").join(&name));
                    let names = |d: &Dataset| d.iter().map(|(name, _, _)| name.clone()).collect::<Vec<_>>();
                    assert!(
                        got == *expected,
                        "{what}: shards {:?}, not the uninterrupted run's {:?}",
                        names(&got),
                        names(expected)
                    );
                }
            });
        }
    });
}
