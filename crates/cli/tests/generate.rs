//! `siphon generate` end to end: greedy completions of the tiny Qwen2's golden prompts (given
//! as `--ids`) equal HF `generate`'s (`golden-generate.safetensors`, which
//! crates/engine/tests/generate.rs holds every family to), on one device and on a 2 × 4 mesh,
//! written as JSON lines with the exact ids; sampled completions are the same whatever the
//! mesh and slots; a run killed (-9) or preempted (SIGTERM: exit 75) and started again writes
//! byte for byte what an uninterrupted run writes, a partial output of other settings refused by
//! name; bad flags are refused by name before any weight loads, nothing written; and
//! `siphon extract` over generate's output reads its exact ids (no tokenizing again), the
//! prompt's as the user's and the completion's as the assistant's: with `--roles assistant`
//! it keeps the completions' tokens, whose activations are `siphon forward --ids`'s over
//! prompt + completion.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;

use common::{Guard, free_port, make_model, repo_root, siphon_command, wait_with_limit};
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
    // A prompt outside the vocabulary.
    std::fs::write(tmp.path().join("prompts.json"), "[[1, 2, 300]]").unwrap();
    let (output, _) = generate(tmp.path(), "vocab", &["--max-new-tokens", "4"]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("token id 300"), "{output:?}");
}

#[test]
fn extract_reads_the_completions_by_their_ids_and_roles() {
    const SEQ: usize = 24;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let model = root.join("model");
    make_model(&model);
    let prompts: Vec<Vec<u32>> = vec![vec![5, 17, 250, 3], vec![90, 91], vec![7, 8, 9, 10, 11, 12, 13]];
    std::fs::write(root.join("prompts.json"), serde_json::to_string(&prompts).unwrap()).unwrap();
    let completions = root.join("completions.jsonl");
    let path = |p: &Path| p.display().to_string();
    let args = ["generate", "--model", &path(&model), "--ids", &path(&root.join("prompts.json"))]
        .into_iter()
        .chain(["--max-new-tokens", "9", "--ignore-eos", "--temperature", "1", "--out", &path(&completions)])
        .map(String::from)
        .collect::<Vec<_>>();
    assert!(run(&args).status.success());
    let tokenizer = repo_root().join("fixtures/data/tokenizer.json");
    let out = root.join("out");
    let args = ["extract", "--model", &path(&model), "--tokenizer", &path(&tokenizer), "--corpus", &path(&completions)]
        .into_iter()
        .chain([
            "--hooks",
            "blocks.1.hook_resid_post",
            "--seq-len",
            &SEQ.to_string(),
            "--pad",
            "right",
            "--dtype",
            "f32",
        ])
        .chain(["--roles", "assistant", "--keep-excluded", "--batch-size", "4", "--output", &path(&out)])
        .chain(["--run", "gen", "--tokenizer-threads", "1"])
        .map(String::from)
        .collect::<Vec<_>>();
    let output = run(&args);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stored = stored(&out.join("gen/machine_000_host_00"));
    let words = |name: &str| -> Vec<[u8; 4]> { stored[name].chunks_exact(4).map(|b| b.try_into().unwrap()).collect() };
    let stored_ids: Vec<u32> = words("token_ids").into_iter().map(u32::from_le_bytes).collect();
    let hook: Vec<f32> = words("blocks.1.hook_resid_post").into_iter().map(f32::from_le_bytes).collect();
    let mask = &stored["mask"];
    let width = hook.len() / stored_ids.len();
    let lines = lines(&completions);
    assert_eq!(stored_ids.len(), lines.len() * SEQ, "one padded row a completion");
    for (r, line) in lines.iter().enumerate() {
        let (prompt, completion) = (ids(&line["prompt_ids"]), ids(&line["completion_ids"]));
        let whole = [&prompt[..], &completion[..]].concat();
        let row = r * SEQ..(r + 1) * SEQ;
        assert_eq!(&stored_ids[row.start..row.start + whole.len()], &whole[..], "row {r}: the ids as generated");
        let kept: Vec<bool> = mask[row.clone()].iter().map(|&m| m != 0).collect();
        let want: Vec<bool> = (0..SEQ).map(|i| i >= prompt.len() && i < whole.len()).collect();
        assert_eq!(kept, want, "row {r}: the completion's tokens kept, the prompt's and padding not");
        // The activations are forward's over prompt + completion.
        let ids_file = root.join(format!("row{r}.json"));
        std::fs::write(&ids_file, serde_json::to_string(&[&whole]).unwrap()).unwrap();
        let st_file = root.join(format!("row{r}.safetensors"));
        let args = ["forward", "--model", &path(&model), "--ids", &path(&ids_file), "--hooks"]
            .into_iter()
            .chain(["blocks.1.hook_resid_post", "--out", &path(&st_file)])
            .map(String::from)
            .collect::<Vec<_>>();
        assert!(run(&args).status.success());
        let bytes = std::fs::read(&st_file).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let want: Vec<f32> = st
            .tensor("blocks.1.hook_resid_post")
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let got = &hook[row.start * width..(row.start + whole.len()) * width];
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst <= 1e-5, "row {r}: differs from forward by {worst}");
    }
}

/// Every stored tensor of a run's host, its shards' bytes concatenated by name.
fn stored(host: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut stored: std::collections::BTreeMap<String, Vec<u8>> = Default::default();
    for line in std::fs::read_to_string(host.join("manifest.jsonl")).unwrap().lines() {
        let shard: serde_json::Value = serde_json::from_str(line).unwrap();
        let bytes = std::fs::read(host.join(shard["shard"].as_str().unwrap())).unwrap();
        for (name, tensor) in SafeTensors::deserialize(&bytes).unwrap().tensors() {
            stored.entry(name).or_default().extend_from_slice(tensor.data());
        }
    }
    stored
}

/// `extract --generate FLAGS` in one command: the completions beside the run are byte for
/// byte `generate`'s with those flags over the same corpus, and the stored hooks byte for
/// byte those of `extract` over that file; started again it goes on (nothing generated
/// twice), other flags are refused naming the completions, and flags that are extract's own
/// are refused by name.
#[test]
fn extract_generate_is_generate_then_extract_in_one_command() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let model = root.join("model");
    make_model(&model);
    std::fs::copy(repo_root().join("fixtures/data/tokenizer.json"), model.join("tokenizer.json")).unwrap();
    let corpus = root.join("prompts.jsonl");
    std::fs::write(&corpus, "{\"text\": \"the river\"}\n{\"text\": \"\"}\n{\"text\": \"a cat sat on\"}\n").unwrap();
    let path = |p: &Path| p.display().to_string();
    let flags = "--max-new-tokens 6 --ignore-eos --temperature 0.8 --samples 2 --seed 4";
    let out = root.join("out");
    let extract = |corpus: &Path, name: &str, generate: Option<&str>| -> std::process::Output {
        let mut args: Vec<String> = ["extract", "--model", &path(&model), "--corpus", &path(corpus)]
            .into_iter()
            .chain(["--hooks", "blocks.1.hook_resid_post", "--seq-len", "24", "--pad", "right", "--dtype", "f32"])
            .chain(["--roles", "assistant", "--batch-size", "4", "--output", &path(&out), "--run", name])
            .map(String::from)
            .collect();
        if let Some(flags) = generate {
            args.extend(["--generate".to_string(), flags.to_string()]);
        }
        run(&args)
    };
    let both = extract(&corpus, "both", Some(flags));
    assert!(both.status.success(), "{}", String::from_utf8_lossy(&both.stderr));

    let separate = root.join("separate.jsonl");
    let mut args: Vec<String> = ["generate", "--model", &path(&model), "--corpus", &path(&corpus), "--out"]
        .into_iter()
        .map(String::from)
        .collect();
    args.push(path(&separate));
    args.extend(flags.split(' ').map(String::from));
    assert!(run(&args).status.success());
    let kept = out.join("both.completions/completions.jsonl");
    assert_eq!(std::fs::read(&kept).unwrap(), std::fs::read(&separate).unwrap(), "generate's completions");
    assert_eq!(lines(&kept).len(), 4, "two samples of each non-blank prompt");
    let then = extract(&separate, "then", None);
    assert!(then.status.success(), "{}", String::from_utf8_lossy(&then.stderr));
    let (a, b) = (stored(&out.join("both/machine_000_host_00")), stored(&out.join("then/machine_000_host_00")));
    assert!(
        a.contains_key("blocks.1.hook_resid_post") && a["token_ids"].len() == 4 * 6 * 4,
        "the 6 generated tokens of 4 completions"
    );
    assert_eq!(a, b, "extract over the completions");

    // Again: nothing generated again, the run complete.
    let again = extract(&corpus, "both", Some(flags));
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    assert!(!String::from_utf8_lossy(&again.stdout).contains("new tokens"));
    let other = extract(&corpus, "both", Some("--max-new-tokens 7"));
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(!other.status.success() && err.contains("both.completions") && err.contains("--max-new-tokens 6"), "{err}");
    let own = extract(&corpus, "own", Some("--max-new-tokens 7 --out x.jsonl"));
    let err = String::from_utf8_lossy(&own.stderr);
    assert!(!own.status.success() && err.contains("--out is extract's own"), "{err}");
}

/// Lines in `path`, 0 while it does not exist.
fn line_count(path: &Path) -> usize {
    std::fs::read_to_string(path).map(|t| t.lines().count()).unwrap_or(0)
}

/// Starts a slowed `generate` writing `out` and stops it with `signal` once 3 completions are
/// written; returns its exit status.
fn stopped(args: &[String], signal: libc::c_int, out: &Path) -> std::process::ExitStatus {
    let mut command = siphon_command(args);
    command.env("SIPHON_TEST_SLOW_COMPLETION_MS", "200");
    command.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    let mut guard = Guard(command.spawn().unwrap());
    let partial = PathBuf::from(format!("{}.partial", out.display()));
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while line_count(&partial) < 3 {
        assert!(std::time::Instant::now() < deadline, "no 3 completions written in 120 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(guard.0.id() as libc::pid_t, signal) };
    let status = guard.0.wait().unwrap();
    assert!(!out.exists() && partial.exists(), "stopped: the partial file kept, no output yet");
    status
}

#[test]
fn a_run_killed_or_preempted_and_started_again_writes_what_an_uninterrupted_run_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let prompts: Vec<Vec<u32>> = (0..8u32).map(|i| (0..3 + i % 4).map(|j| (i * 31 + j * 7) % 256).collect()).collect();
    std::fs::write(tmp.path().join("prompts.json"), serde_json::to_string(&prompts).unwrap()).unwrap();
    let sampled = ["--max-new-tokens", "10", "--temperature", "0.9", "--samples", "2", "--seed", "5", "--slots", "2"];
    let (done, whole) = generate(tmp.path(), "whole", &sampled);
    assert!(done.status.success());
    let whole = std::fs::read(whole).unwrap();
    for (name, signal, code) in [("killed", libc::SIGKILL, None), ("preempted", libc::SIGTERM, Some(75))] {
        let out = tmp.path().join(format!("{name}.jsonl"));
        let mut args: Vec<String> = ["generate", "--model"].map(String::from).to_vec();
        args.push(fixture("tiny-qwen2").display().to_string());
        args.extend(["--ids".into(), tmp.path().join("prompts.json").display().to_string()]);
        args.extend(["--out".into(), out.display().to_string()]);
        args.extend(sampled.iter().map(|s| s.to_string()));
        let status = stopped(&args, signal, &out);
        assert_eq!(status.code(), code, "{name}: {status:?}");
        // Another seed is refused by name; the same settings on 3 slots go on.
        let mut reseeded = args.clone();
        let at = reseeded.iter().position(|a| a == "--seed").unwrap();
        reseeded[at + 1] = "6".into();
        let refused = run(&reseeded);
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && err.contains("seed") && err.contains("remove it"), "{err}");
        let at = args.iter().position(|a| a == "--slots").unwrap();
        args[at + 1] = "3".into();
        let again = run(&args);
        assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
        assert!(String::from_utf8_lossy(&again.stdout).contains("from an earlier run"));
        assert_eq!(std::fs::read(&out).unwrap(), whole, "{name}: the output of an uninterrupted run");
        assert!(!PathBuf::from(format!("{}.partial", out.display())).exists());
    }
    // An output that exists is never overwritten.
    let (again, _) = generate(tmp.path(), "whole", &sampled);
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists"));
}

/// Process `id` of a two-process job on 127.0.0.1:`port` running `generate` with `args`.
fn host(args: &[String], id: usize, port: u16, slow: bool) -> Guard {
    let mut command = siphon_command(args);
    command
        .env("SIPHON_PROCESS_ID", id.to_string())
        .env("SIPHON_NUM_PROCESSES", "2")
        .env("SIPHON_COORDINATOR", format!("127.0.0.1:{port}"))
        .env("SIPHON_JOB_TOKEN", "test-token");
    if slow {
        command.env("SIPHON_TEST_SLOW_COMPLETION_MS", "300");
    }
    Guard(command.spawn().unwrap())
}

/// The same command on two processes: each completes every other record on its own devices
/// into its shard (`two-0000{0,1}-of-00002.jsonl`), and the shards together hold, line for
/// line, what one process writes (sampled: the draws depend on the record, the sample and the
/// seed alone). One process killed (-9) midway fails the job with no shard named yet, and the
/// same two commands started again finish it with the same lines.
#[test]
fn two_processes_write_shards_that_together_hold_one_process_s_completions() {
    let tmp = tempfile::tempdir().unwrap();
    let prompts: Vec<Vec<u32>> = (0..7u32).map(|i| (0..2 + i % 3).map(|j| (i * 37 + j * 11) % 256).collect()).collect();
    std::fs::write(tmp.path().join("prompts.json"), serde_json::to_string(&prompts).unwrap()).unwrap();
    let sampled = ["--max-new-tokens", "12", "--temperature", "0.9", "--top-k", "20", "--samples", "2", "--seed", "11"];
    let (one, whole) = generate(tmp.path(), "one", &[&sampled[..], &["--slots", "4"]].concat());
    assert!(one.status.success(), "{}", String::from_utf8_lossy(&one.stderr));
    let whole = lines(&whole);
    assert_eq!(whole.len(), 14);

    let out = tmp.path().join("two.jsonl");
    let mut args: Vec<String> = ["generate", "--model"].map(String::from).to_vec();
    args.push(fixture("tiny-qwen2").display().to_string());
    args.extend(["--ids".into(), tmp.path().join("prompts.json").display().to_string()]);
    args.extend(["--out".into(), out.display().to_string(), "--slots".into(), "2".into()]);
    args.extend(sampled.iter().map(|s| s.to_string()));
    let shards = [tmp.path().join("two-00000-of-00002.jsonl"), tmp.path().join("two-00001-of-00002.jsonl")];
    let partial = |i: usize| PathBuf::from(format!("{}.partial", shards[i].display()));

    // Killed midway: process 1 once it has written a line.
    let port = free_port();
    let mut hosts = [host(&args, 0, port, true), host(&args, 1, port, true)];
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while line_count(&partial(1)) < 1 {
        assert!(std::time::Instant::now() < deadline, "process 1 wrote no completion in 120 s");
        assert!(hosts[1].0.try_wait().unwrap().is_none(), "process 1 ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    hosts[1].0.kill().unwrap();
    let [zero, _] = hosts;
    let zero = wait_with_limit(zero, Duration::from_secs(120));
    assert!(!zero.status.success(), "process 0 ends with the job: {}", String::from_utf8_lossy(&zero.stderr));
    assert!(shards.iter().all(|s| !s.exists()), "no shard is named before every process has written its lines");

    // The same commands again.
    let port = free_port();
    let hosts = [host(&args, 0, port, false), host(&args, 1, port, false)];
    for (i, h) in hosts.into_iter().enumerate() {
        let output = wait_with_limit(h, Duration::from_secs(300));
        assert!(output.status.success(), "process {i}: {}", String::from_utf8_lossy(&output.stderr));
    }
    let mut got = Vec::new();
    for (i, shard) in shards.iter().enumerate() {
        let lines = lines(shard);
        assert!(lines.iter().all(|l| l["record"].as_u64().unwrap() % 2 == i as u64), "shard {i}: every other record");
        got.extend(lines);
    }
    got.sort_by_key(|l| (l["record"].as_u64(), l["sample"].as_u64()));
    assert_eq!(got, whole, "the shards hold one process's completions");
}

/// Progress as `siphon launch` reads it (`SIPHON_PROGRESS` lines on stderr): each report counts
/// the completions written of the host's, and the last one every completion and its new tokens.
#[test]
fn progress_counts_completions_and_their_new_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let (prompts, _) = golden(&fixture("tiny-qwen2"));
    std::fs::write(tmp.path().join("prompts.json"), serde_json::to_string(&prompts).unwrap()).unwrap();
    let out = tmp.path().join("progress.jsonl");
    let args: Vec<String> = ["generate", "--model", fixture("tiny-qwen2").to_str().unwrap(), "--ids"]
        .into_iter()
        .map(String::from)
        .chain([tmp.path().join("prompts.json").display().to_string(), "--out".into(), out.display().to_string()])
        .chain(["--max-new-tokens", "6", "--samples", "2", "--temperature", "1.0", "--slots", "2"].map(String::from))
        .collect();
    let mut command = siphon_command(&args);
    command.env("SIPHON_PROGRESS_PIPE", "1");
    let output = wait_with_limit(Guard(command.spawn().unwrap()), Duration::from_secs(300));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let reports: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stderr)
        .lines()
        .filter_map(|l| l.strip_prefix("SIPHON_PROGRESS "))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = reports.last().expect("a progress report");
    let written: u64 = lines(&out).iter().map(|l| ids(&l["completion_ids"]).len() as u64).sum();
    assert_eq!((last["completions"].clone(), last["tokens"].as_u64()), (serde_json::json!([6, 6]), Some(written)));
    for r in &reports {
        assert_eq!(r["completions"][1], 6, "{r}");
    }
}

/// `--stop TEXT` ends a completion with the token that completes the text (the demo model,
/// greedy, on a chat prompt whose answer names rivers).
#[test]
fn a_stop_string_ends_the_completion_at_the_token_completing_it() {
    let Some(gguf) = std::env::var_os("SIPHON_SMOLLM2_GGUF") else {
        eprintln!("note: SIPHON_SMOLLM2_GGUF is unset; skipping the stop string test");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let run_with = |name: &str, stop: &[&str]| -> serde_json::Value {
        let out = tmp.path().join(format!("{name}.jsonl"));
        let mut args: Vec<String> = ["generate", "--model", gguf.to_str().unwrap(), "--chat", "--text"]
            .into_iter()
            .chain(["Name three rivers.", "--max-new-tokens", "24", "--out", out.to_str().unwrap()])
            .map(String::from)
            .collect();
        args.extend(stop.iter().flat_map(|s| ["--stop".to_string(), s.to_string()]));
        let output = run(&args);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        lines(&out).remove(0)
    };
    let free = run_with("free", &[]);
    let text = free["completion"].as_str().unwrap();
    assert!(text.contains("River"), "{text}");
    let stopped = run_with("stopped", &["River", "never appears"]);
    let cut = ids(&stopped["completion_ids"]);
    assert_eq!(stopped["finish"], "stop");
    // The same tokens as the free run up to the one completing the first "River".
    assert_eq!(cut[..], ids(&free["completion_ids"])[..cut.len()]);
    let stopped_text = stopped["completion"].as_str().unwrap();
    assert!(stopped_text.ends_with("River") || stopped_text.trim_end().ends_with("River"), "{stopped_text}");
    assert_eq!(stopped_text.matches("River").count(), 1, "{stopped_text}");
}

/// Slots whose caches this host cannot hold are refused by the plan, naming the flags, before
/// any weight loads (the demo model: 4096 slots of 6,000 positions).
#[test]
fn caches_the_host_cannot_hold_are_refused_before_any_weight_loads() {
    let Some(gguf) = std::env::var_os("SIPHON_SMOLLM2_GGUF") else {
        eprintln!("note: SIPHON_SMOLLM2_GGUF is unset; skipping the memory check test");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("big.jsonl");
    let args: Vec<String> = ["generate", "--model", gguf.to_str().unwrap(), "--text", "hi", "--max-new-tokens", "6000"]
        .into_iter()
        .chain(["--slots", "4096", "--out", out.to_str().unwrap()])
        .map(String::from)
        .collect();
    let output = run(&args);
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && err.contains("--slots") && err.contains("memory"), "{err}");
    assert!(!err.contains("weights uploaded") && !out.exists(), "{err}");
}

/// `--corpus`: records in the corpus's order, a conversation rendered up to its last user
/// message with the generation prompt (transformers' ids for it: fixtures/chat/goldens.json),
/// blank and unusable records skipped and counted, each line keeping its record's index.
#[test]
fn prompts_from_a_corpus_keep_their_records_and_conversations_end_at_the_last_user_message() {
    let Some(gguf) = std::env::var_os("SIPHON_SMOLLM2_GGUF") else {
        eprintln!("note: SIPHON_SMOLLM2_GGUF is unset; skipping the corpus prompts test");
        return;
    };
    let goldens: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo_root().join("fixtures/chat/goldens.json")).unwrap())
            .unwrap();
    let prompts = goldens["templates"]["smollm2-gguf"]["prompts"].as_array().unwrap();
    let golden = prompts.iter().find(|p| p["messages"].as_array().unwrap().len() == 1).unwrap();
    let mut conversation = golden["messages"].as_array().unwrap().clone();
    conversation.push(serde_json::json!({"role": "assistant", "content": "the model's own turn, dropped"}));
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("prompts.jsonl");
    let records = [
        serde_json::json!({"text": "The capital of France is"}),
        serde_json::json!({"text": "  "}),
        serde_json::json!({"text": conversation}),
        serde_json::json!({"other": 1}),
    ];
    std::fs::write(&corpus, records.iter().map(|r| format!("{r}\n")).collect::<String>()).unwrap();
    let out = tmp.path().join("out.jsonl");
    let args: Vec<String> = ["generate", "--model", gguf.to_str().unwrap(), "--corpus", corpus.to_str().unwrap()]
        .into_iter()
        .chain(["--max-new-tokens", "3", "--out", out.to_str().unwrap()])
        .map(String::from)
        .collect();
    let output = run(&args);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("skipped 2 records") && stdout.contains("record 1: blank"), "{stdout}");
    let got = lines(&out);
    assert_eq!(got.iter().map(|l| l["record"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 2]);
    assert_eq!(got[1]["prompt_ids"], golden["ids"]);
}
