//! The exports and the dashboards: what the binary refuses before the Python side runs (a
//! folder in use, a count flag outside its range), named, at once, with nothing written. What
//! only the run tells (more splits than latents, rows longer than the run) the Python side
//! refuses, in `python/tests`.

use std::path::Path;
use std::time::Duration;

use crate::{assert_no_crash, run, siphon};

/// `siphon ARGS…`'s refusal: not a success, within a few seconds, its message naming `named`.
fn assert_refused(args: &[&str], named: &str) -> String {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let (output, took) = run(siphon(&args), Duration::from_secs(60));
    let what = args.join(" ");
    assert_no_crash(&output, &what);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{what}: accepted");
    assert!(stderr.contains(named), "{what}: the error does not name {named}: {stderr}");
    assert!(took < Duration::from_secs(5), "{what}: refused only after {took:?}");
    stderr
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

#[test]
fn a_folder_in_use_is_refused_before_any_work_and_left_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let used = tmp.path().join("site");
    std::fs::create_dir(&used).unwrap();
    std::fs::write(used.join("index.html"), "mine").unwrap();
    let file = tmp.path().join("file");
    std::fs::write(&file, "").unwrap();
    // The run need not exist: the folder is checked first.
    let run_dir = tmp.path().join("no-run");
    let run_dir = run_dir.to_str().unwrap();
    for out in [&used, &file] {
        let out = out.to_str().unwrap();
        let dashboard = assert_refused(&["dashboard", run_dir, "--out", out], out);
        let neuronpedia = assert_refused(&["export", "neuronpedia", run_dir, out, "--sae-set", "s"], out);
        for (stderr, holds) in [(dashboard, "the dashboard's pages"), (neuronpedia, "the batch files")] {
            let rule = format!("({holds} go into a new or empty folder)");
            assert!(
                stderr.contains(&rule) && (stderr.contains("not empty") || stderr.contains("not a folder")),
                "{stderr}"
            );
        }
    }
    // The user's page is untouched and nothing was added (no effects directory).
    assert_eq!(entries(&used), ["index.html"]);
    assert_eq!(std::fs::read_to_string(used.join("index.html")).unwrap(), "mine");
}

#[test]
fn every_count_flag_outside_its_range_is_refused_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let out = out.to_str().unwrap();
    let dashboard = ["dashboard", "no-run", "--out", out];
    let neuronpedia = ["export", "neuronpedia", "no-run", out, "--sae-set", "s"];
    let delphi = ["export", "delphi", "no-run", out];
    let saelens = ["export", "saelens", "no-run", out];
    let huge = "18446744073709551616";
    let cases: [(&[&str], &str, &[&str]); 18] = [
        (&dashboard, "--top", &["-1", "100001", huge]),
        (&dashboard, "--quantiles", &["0", "129", huge]),
        (&dashboard, "--per-quantile", &["-1", "100001"]),
        (&dashboard, "--window", &["-1", "4097", huge]),
        (&dashboard, "--bins", &["0", "10001", huge]),
        (&dashboard, "--neighbours", &["-1", "1001", huge]),
        (&dashboard, "--logits", &["-1", "1001", huge]),
        (&dashboard, "--seed", &["-1", huge]),
        (&neuronpedia, "--batch-size", &["0", "65537", huge]),
        (&neuronpedia, "--top", &["-1", "100001"]),
        (&neuronpedia, "--quantiles", &["0", "129"]),
        (&neuronpedia, "--per-quantile", &["100001"]),
        (&neuronpedia, "--layer", &["-1", huge]),
        (&delphi, "--splits", &["-1", "4294967296"]),
        (&delphi, "--ctx-len", &["-1", huge]),
        (&saelens, "--context-size", &["-1", huge]),
        (&saelens, "--max-tokens", &["-1", huge]),
        (&saelens, "--seed", &["-1", huge]),
    ];
    for (command, flag, values) in cases {
        for value in values {
            let given = format!("{flag}={value}");
            let mut args = command.to_vec();
            args.push(&given);
            assert_refused(&args, flag);
        }
    }
    assert!(!Path::new(out).exists(), "an output folder was made");
}
