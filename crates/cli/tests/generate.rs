//! `siphon generate` end to end: greedy completions of the tiny Qwen2's golden prompts (given
//! as `--ids`) equal HF `generate`'s (`golden-generate.safetensors`, which
//! crates/engine/tests/generate.rs holds every family to), on one device and on a 2 × 4 mesh,
//! written as JSON lines with the exact ids; sampled completions are the same whatever the
//! mesh and slots; bad flags are refused by name before any weight loads, nothing written.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;

use common::{Guard, repo_root, siphon_command, wait_with_limit};
use safetensors::SafeTensors;

fn fixture(name: &str) -> PathBuf {
    repo_root().join("fixtures/models").join(name)
}

fn run(args: &[String]) -> std::process::Output {
    let child = siphon_command(args).spawn().expect("start siphon");
    wait_with_limit(Guard(child), Duration::from_secs(300))
}

/// The golden prompts and HF's greedy completions.
fn golden(dir: &Path) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let bytes = std::fs::read(dir.join("golden-generate.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ids = |name: &str| -> Vec<u32> {
        st.tensor(name).unwrap().data().chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect()
    };
    (0..3).map(|i| (ids(&format!("prompt.{i}")), ids(&format!("completion.{i}")))).unzip()
}

fn generate(tmp: &Path, name: &str, extra: &[&str]) -> (std::process::Output, PathBuf) {
    let out = tmp.join(format!("{name}.jsonl"));
    let mut args: Vec<String> = ["generate", "--model"].map(String::from).to_vec();
    args.push(fixture("tiny-qwen2").display().to_string());
    args.extend(["--ids".into(), tmp.join("prompts.json").display().to_string()]);
    args.extend(["--out".into(), out.display().to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    (run(&args), out)
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect()
}

#[test]
fn greedy_completions_equal_hf_generate_on_one_device_and_a_mesh() {
    let tmp = tempfile::tempdir().unwrap();
    let (prompts, completions) = golden(&fixture("tiny-qwen2"));
    std::fs::write(tmp.path().join("prompts.json"), serde_json::to_string(&prompts).unwrap()).unwrap();
    let new = completions[0].len().to_string();
    for (name, extra) in [
        ("one", vec!["--max-new-tokens", &new, "--slots", "2", "--chunk", "4"]),
        ("mesh", vec!["--max-new-tokens", &new, "--cpu-devices", "8", "--mesh", "data=2,model=4", "--slots", "4"]),
    ] {
        let (output, out) = generate(tmp.path(), name, &extra);
        assert!(output.status.success(), "{name}: {}", String::from_utf8_lossy(&output.stderr));
        let got = lines(&out);
        assert_eq!(got.len(), 3);
        for (i, line) in got.iter().enumerate() {
            assert_eq!(line["record"], i as u64);
            assert_eq!(ids(&line["prompt_ids"]), prompts[i]);
            assert_eq!(ids(&line["completion_ids"]), completions[i], "{name} prompt {i}");
            assert_eq!(line["finish"], "length");
        }
    }
    // Sampled: two samples a prompt, the same on one device as on the mesh.
    let sampled = ["--max-new-tokens", "10", "--temperature", "0.8", "--top-p", "0.9", "--samples", "2", "--seed", "3"];
    let (a, one) = generate(tmp.path(), "sampled-one", &[&sampled[..], &["--slots", "3"]].concat());
    let mesh = ["--cpu-devices", "8", "--mesh", "data=2,model=4", "--slots", "2"];
    let (b, other) = generate(tmp.path(), "sampled-mesh", &[&sampled[..], &mesh[..]].concat());
    assert!(a.status.success() && b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    let (one, other) = (lines(&one), lines(&other));
    assert_eq!(one.len(), 6);
    assert_eq!(one, other);
    assert_eq!((one[0]["sample"].as_u64(), one[1]["sample"].as_u64()), (Some(0), Some(1)));
    assert_ne!(one[0]["completion_ids"], one[1]["completion_ids"]);
}

#[test]
fn bad_flags_are_refused_by_name_before_any_weight_loads() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("prompts.json"), "[[1, 2, 3], [4]]").unwrap();
    let cases: [(&[&str], &str); 7] = [
        (&["--max-new-tokens", "0"], "--max-new-tokens 0"),
        (&["--max-new-tokens", "4", "--samples", "0"], "--samples 0"),
        (&["--max-new-tokens", "4", "--stop-token", "9999"], "--stop-token 9999"),
        (&["--max-new-tokens", "4", "--temperature=-1"], "--temperature -1"),
        (&["--max-new-tokens", "4", "--top-p", "0"], "--top-p"),
        (&["--max-new-tokens", "500"], "past the model's context"),
        (&["--max-new-tokens", "4", "--cpu-devices", "2", "--mesh", "data=2", "--slots", "3"], "--slots 3"),
    ];
    for (i, (extra, want)) in cases.iter().enumerate() {
        let (output, out) = generate(tmp.path(), &format!("bad{i}"), extra);
        let err = String::from_utf8_lossy(&output.stderr);
        let code = output.status.code().unwrap_or(-1);
        assert!((1..=127).contains(&code) && err.contains(want), "{extra:?}: exit {code}, {err}");
        assert!(!err.contains("weights uploaded"), "{extra:?}: {err}");
        assert!(!out.exists() && !out.with_extension("jsonl.partial").exists(), "{extra:?} wrote {}", out.display());
    }
    // A prompt outside the vocabulary, and a family whose cache is not built.
    std::fs::write(tmp.path().join("prompts.json"), "[[1, 2, 300]]").unwrap();
    let (output, _) = generate(tmp.path(), "vocab", &["--max-new-tokens", "4"]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("token id 300"), "{output:?}");
    std::fs::write(tmp.path().join("prompts.json"), "[[1, 2, 3]]").unwrap();
    let out = tmp.path().join("next.jsonl");
    let args: Vec<String> = ["generate", "--model", &fixture("tiny-qwen3-next").display().to_string(), "--ids"]
        .into_iter()
        .map(String::from)
        .chain([tmp.path().join("prompts.json").display().to_string(), "--max-new-tokens".into(), "4".into()])
        .chain(["--out".into(), out.display().to_string()])
        .collect();
    let output = run(&args);
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && err.contains("Gated DeltaNet") && !err.contains("weights uploaded"), "{err}");
    assert!(!out.exists());
}
