//! `siphon extract --outputs` and `--steer` end to end, on the tiny Llama: the stored
//! next-token outputs are the model's over each stored row (`siphon forward --ids` over the
//! same rows, whose outputs crates/engine/tests/next_token.rs checks against HF transformers),
//! f32 in an fp8 run byte for byte as in an f32 run, NaN NLL exactly at a row's last token;
//! a steering vector reaches the stored outputs as forward's does, run.json records its file's
//! sha256 and scale, and a resume with another scale is refused; bad flags are refused before
//! any weight loads, nothing written.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

mod common;

use common::{Guard, make_corpus, make_model, repo_root, siphon_command, wait_with_limit};

const SEQ: usize = 32;
const TOPK: usize = 3;

struct Setup {
    _tmp: tempfile::TempDir,
    root: std::path::PathBuf,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    make_model(&root.join("model"));
    make_corpus(&root.join("corpus"), 12);
    Setup { _tmp: tmp, root }
}

fn run(args: &[String]) -> std::process::Output {
    let child = siphon_command(args).spawn().expect("start siphon");
    wait_with_limit(Guard(child), Duration::from_secs(300))
}

fn run_ok(args: &[String]) -> std::process::Output {
    let output = run(args);
    let (out, err) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "siphon {args:?} failed:\n{out}\n{err}");
    output
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// `siphon extract` of the corpus into `output/run`, every token stored (with its mask), in
/// order, with `extra` flags.
fn extract(s: &Setup, run_name: &str, dtype: &str, extra: &[&str]) -> Vec<String> {
    let tokenizer = repo_root().join("fixtures/data/tokenizer.json");
    let (model, corpus, output) = (s.root.join("model"), s.root.join("corpus"), s.root.join("out"));
    let mut args = strings(&[
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
        &SEQ.to_string(),
        "--batch-size",
        "4",
        "--dtype",
        dtype,
        "--keep-excluded",
        "--shard-size-mb",
        "0.02",
        "--output",
        output.to_str().unwrap(),
        "--run",
        run_name,
        "--tokenizer-threads",
        "1",
    ]);
    args.extend(strings(extra));
    args
}

/// A run's shards in manifest order, each tensor's bytes concatenated over them.
fn columns(run_dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let host = run_dir.join("machine_000_host_00");
    let manifest = std::fs::read_to_string(host.join("manifest.jsonl")).unwrap();
    let mut out: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for line in manifest.lines() {
        let shard: serde_json::Value = serde_json::from_str(line).unwrap();
        let bytes = std::fs::read(host.join(shard["shard"].as_str().unwrap())).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (name, tensor) in st.tensors() {
            out.entry(name).or_default().extend_from_slice(tensor.data());
        }
    }
    out
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn i32s(bytes: &[u8]) -> Vec<i32> {
    bytes.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// The stored rows (every token stored, in order): each row's token ids, and which rows end in
/// a kept token (no padding after the row's text, so forward over its ids sees what the
/// extraction's program saw).
fn rows(stored: &BTreeMap<String, Vec<u8>>) -> (Vec<Vec<u32>>, Vec<bool>) {
    let ids = i32s(&stored["token_ids"]);
    let samples: Vec<i64> =
        stored["sample_index"].chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
    let mask = &stored["mask"];
    assert_eq!(ids.len() % SEQ, 0, "every token of every row stored");
    for (r, row) in samples.chunks(SEQ).enumerate() {
        assert!(row.iter().all(|&s| s == r as i64), "rows stored in order, whole");
    }
    let full = mask.chunks(SEQ).map(|m| m[SEQ - 1] != 0).collect();
    (ids.chunks(SEQ).map(|r| r.iter().map(|&t| t as u32).collect()).collect(), full)
}

/// `siphon forward --ids` over `rows` with `extra` flags: its tensors.
fn forward(s: &Setup, rows: &[Vec<u32>], name: &str, extra: &[&str]) -> BTreeMap<String, Vec<u8>> {
    let ids = s.root.join(format!("{name}.json"));
    std::fs::write(&ids, serde_json::to_vec(rows).unwrap()).unwrap();
    let out = s.root.join(format!("{name}.safetensors"));
    let model = s.root.join("model");
    let mut args = strings(&[
        "forward",
        "--model",
        model.to_str().unwrap(),
        "--ids",
        ids.to_str().unwrap(),
        "--outputs",
        &format!("nll,entropy,topk={TOPK}"),
        "--dtype",
        "f32",
        "--out",
        out.to_str().unwrap(),
    ]);
    args.extend(strings(extra));
    run_ok(&args);
    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors().into_iter().map(|(name, t)| (name, t.data().to_vec())).collect()
}

/// The stored outputs of the `full` rows equal forward's over the same rows: f32 values within
/// 1e-5 (relative, and absolute below 1: the two programs' batches differ), NaN NLL at the
/// same tokens (each row's last), ids equal but where two log-probabilities tie within 1e-5.
fn assert_outputs_match(stored: &BTreeMap<String, Vec<u8>>, forward: &BTreeMap<String, Vec<u8>>, full: &[bool]) {
    let row_values =
        |values: &[f32], r: usize, per_token: usize| values[r * SEQ * per_token..(r + 1) * SEQ * per_token].to_vec();
    let compared = full.iter().filter(|f| **f).count();
    assert!(compared * 2 >= full.len(), "most rows are full: {compared} of {}", full.len());
    for (name, per_token) in [("output.nll", 1), ("output.entropy", 1), ("output.topk_logprobs", TOPK)] {
        let (ours, theirs) = (f32s(&stored[name]), f32s(&forward[name]));
        let mut checked = 0;
        for (r, _) in full.iter().enumerate().filter(|(_, f)| **f) {
            for (t, (a, b)) in row_values(&ours, r, per_token).iter().zip(row_values(&theirs, r, per_token)).enumerate()
            {
                if name == "output.nll" && t / per_token == SEQ - 1 {
                    assert!(a.is_nan() && b.is_nan(), "row {r}'s last token has no next token: {a} {b}");
                    continue;
                }
                assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{name} row {r} element {t}: {a} vs forward's {b}");
                checked += 1;
            }
        }
        assert!(checked > 0);
    }
    let (ids, theirs) = (i32s(&stored["output.topk_ids"]), i32s(&forward["output.topk_ids"]));
    let logprobs = f32s(&forward["output.topk_logprobs"]);
    for (r, _) in full.iter().enumerate().filter(|(_, f)| **f) {
        for i in r * SEQ * TOPK..(r + 1) * SEQ * TOPK {
            if ids[i] != theirs[i] {
                let k = i % TOPK;
                let neighbours = [k.checked_sub(1), (k + 1 < TOPK).then_some(k + 1)];
                let tied = neighbours.iter().flatten().any(|&j| (logprobs[i] - logprobs[i - k + j]).abs() <= 1e-5);
                assert!(tied, "output.topk_ids row {r} slot {i}: {} vs forward's {}", ids[i], theirs[i]);
            }
        }
    }
}

#[test]
fn stored_outputs_are_the_models_over_each_row_in_every_stored_dtype() {
    let s = setup();
    let outputs = format!("nll,entropy,topk={TOPK}");
    run_ok(&extract(&s, "f32", "f32", &["--outputs", &outputs]));
    run_ok(&extract(&s, "fp8", "fp8", &["--outputs", &outputs, "--shuffle-tokens-window", "1"]));
    let f32_run = columns(&s.root.join("out/f32"));
    let (rows, full) = rows(&f32_run);
    let forward = forward(&s, &rows, "rows", &[]);
    assert_outputs_match(&f32_run, &forward, &full);

    // An fp8 run stores the same f32 outputs (the forward is computed alike whatever the
    // stored dtype): the same bytes for each token, found by its row and id (its shuffled
    // window reorders the tokens of each batch).
    let fp8 = columns(&s.root.join("out/fp8"));
    assert_eq!(fp8["output.topk_ids"].len(), f32_run["output.topk_ids"].len());
    for name in ["output.nll", "output.entropy", "output.topk_logprobs", "output.topk_ids"] {
        let width = if name.starts_with("output.topk") { TOPK * 4 } else { 4 };
        let rows_of = |run: &BTreeMap<String, Vec<u8>>| -> Vec<(Vec<u8>, i32)> {
            let ids = i32s(&run["token_ids"]);
            let samples: Vec<i64> =
                run["sample_index"].chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
            let mut out: Vec<(i64, i32, Vec<u8>)> =
                run[name].chunks_exact(width).enumerate().map(|(i, v)| (samples[i], ids[i], v.to_vec())).collect();
            out.sort_by(|a, b| (a.0, a.1, &a.2).cmp(&(b.0, b.1, &b.2)));
            out.into_iter().map(|(_, id, v)| (v, id)).collect()
        };
        assert_eq!(rows_of(&fp8), rows_of(&f32_run), "{name}: the fp8 run's values are the f32 run's");
    }

    // inspect reads them back: every shard verified, each output's mean.
    let inspect = run_ok(&strings(&["inspect", s.root.join("out/f32").to_str().unwrap()]));
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(text.contains("OK:") && text.contains("output.nll f32 [] mean"), "{text}");
    assert!(text.contains(&format!("output.topk_ids i32 [{TOPK}]")), "{text}");
}

/// A steering vector file: `values` as one F32 tensor.
fn vector_file(path: &Path, values: &[f32]) {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![values.len()], &bytes).unwrap();
    safetensors::serialize_to_file([("v", view)], None, path).unwrap();
}

#[test]
fn steering_reaches_the_stored_outputs_and_a_resume_with_another_scale_is_refused() {
    let s = setup();
    let vector = s.root.join("v.safetensors");
    let values: Vec<f32> = (0..common::HIDDEN).map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0).collect();
    vector_file(&vector, &values);
    let steer = format!("blocks.0.hook_resid_post={}:2.5", vector.display());
    run_ok(&extract(&s, "steered", "f32", &["--outputs", "nll,entropy,topk=3", "--steer", &steer]));
    let stored = columns(&s.root.join("out/steered"));
    let (rows, full) = rows(&stored);
    let plain = forward(&s, &rows, "plain", &[]);
    let steered = forward(&s, &rows, "steered", &["--steer", &steer]);
    assert_outputs_match(&stored, &steered, &full);
    let (a, b) = (f32s(&stored["output.entropy"]), f32s(&plain["output.entropy"]));
    assert!(a.iter().zip(&b).any(|(x, y)| (x - y).abs() > 1e-3), "the vector changes the outputs");

    let run_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(s.root.join("out/steered/run.json")).unwrap()).unwrap();
    let recorded = &run_json["config"]["steering"][0];
    use sha2::Digest;
    let digest: String =
        sha2::Sha256::digest(std::fs::read(&vector).unwrap()).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(recorded["hook"], "blocks.0.hook_resid_post");
    assert_eq!(recorded["sha256"], digest.as_str());
    assert_eq!(recorded["scale"], 2.5);

    // The same run with another scale is another dataset: refused, naming the steering.
    let other = format!("blocks.0.hook_resid_post={}:3", vector.display());
    let refused = run(&extract(&s, "steered", "f32", &["--outputs", "nll,entropy,topk=3", "--steer", &other]));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("steering"), "{err}");
}

#[test]
fn bad_outputs_and_vectors_are_refused_by_name_before_anything_is_written() {
    let s = setup();
    let matrix = s.root.join("m.safetensors");
    let bytes = vec![0u8; 4 * 2 * common::HIDDEN];
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, common::HIDDEN], &bytes).unwrap();
    safetensors::serialize_to_file([("m", view)], None, &matrix).unwrap();
    let wide = format!("blocks.0.hook_resid_post={}", matrix.display());
    let attn = format!("blocks.0.attn.hook_z={}", matrix.display());
    for (extra, named) in [
        (vec!["--outputs", "topk=0"], "topk=0 is not a count"),
        (vec!["--outputs", "topk=300"], "topk=300: more than the model's vocabulary of 264 tokens"),
        (vec!["--outputs", "nll,logits"], "\"logits\" is not an output"),
        (vec!["--steer", wide.as_str()], "shape [2, 32]"),
        (
            vec!["--steer", attn.as_str()],
            "only a block's hook_resid_pre, hook_resid_post, hook_attn_out or hook_mlp_out is steered",
        ),
        (vec!["--steer", "blocks.0.hook_resid_post"], "expected HOOK=FILE[:SCALE]"),
    ] {
        let output = run(&extract(&s, "bad", "f32", &extra));
        let err = String::from_utf8_lossy(&output.stderr);
        let code = output.status.code().unwrap_or(-1);
        assert!((1..=127).contains(&code), "{extra:?}: exit {code}\n{err}");
        assert!(err.contains(named), "{extra:?}: {err}");
        assert!(!s.root.join("out/bad").exists(), "{extra:?}: nothing written");
    }
}

/// A random SAELens TopK dictionary (k 4 of 48 latents) of the tiny model's residual stream after
/// block 0, as SAELens saves one: cfg.json and sae_weights.safetensors.
fn topk_dictionary(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let (d_in, d_sae) = (common::HIDDEN, 48);
    let cfg = serde_json::json!({
        "d_in": d_in, "d_sae": d_sae, "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": true,
        "normalize_activations": "none", "k": 4, "architecture": "topk",
        "metadata": {"hook_name": "blocks.0.hook_resid_post"}
    });
    std::fs::write(dir.join("cfg.json"), cfg.to_string()).unwrap();
    let mut seed = 0x2545f4914f6cdd1du64;
    let mut values = |n: usize, scale: f32| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (scale * ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5)).to_le_bytes()
            })
            .collect()
    };
    let tensors = [
        ("W_enc", vec![d_in, d_sae], values(d_in * d_sae, 1.0)),
        ("b_enc", vec![d_sae], values(d_sae, 0.1)),
        ("W_dec", vec![d_sae, d_in], values(d_sae * d_in, 1.0)),
        ("b_dec", vec![d_in], values(d_in, 0.1)),
    ];
    let views: Vec<(&str, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, shape, b)| {
            (*n, safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), b).unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("sae_weights.safetensors")).unwrap();
}

#[test]
fn a_spliced_dictionarys_losses_are_stored_per_token_and_inspect_scores_them() {
    let s = setup();
    let sae = s.root.join("sae");
    topk_dictionary(&sae);
    let sae_flag = sae.display().to_string();
    run_ok(&extract(&s, "spliced", "f32", &["--sae", &sae_flag, "--splice"]));
    let run_dir = s.root.join("out/spliced");
    let run_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("run.json")).unwrap()).unwrap();
    let names: Vec<&str> =
        run_json["outputs"].as_array().unwrap().iter().map(|o| o["name"].as_str().unwrap()).collect();
    let hook = "blocks.0.hook_resid_post";
    let expected = [
        "output.nll".to_string(),
        format!("output.nll.spliced.{hook}"),
        format!("output.kl.spliced.{hook}"),
        format!("output.nll.ablated.{hook}"),
        format!("output.kl.ablated.{hook}"),
        format!("output.sq_error.spliced.{hook}"),
    ];
    assert_eq!(names, expected);

    // The stored losses are forward's over the same rows.
    let stored = columns(&run_dir);
    let (rows, full) = rows(&stored);
    let ids = s.root.join("rows.json");
    std::fs::write(&ids, serde_json::to_vec(&rows).unwrap()).unwrap();
    let out = s.root.join("spliced.safetensors");
    let model = s.root.join("model");
    let args = [
        "forward",
        "--model",
        model.to_str().unwrap(),
        "--ids",
        ids.to_str().unwrap(),
        "--sae",
        &sae_flag,
        "--splice",
        "--out",
        out.to_str().unwrap(),
    ];
    run_ok(&strings(&args));
    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for name in &expected {
        let (ours, theirs) = (f32s(&stored[name.as_str()]), f32s(st.tensor(name).unwrap().data()));
        for (r, _) in full.iter().enumerate().filter(|(_, f)| **f) {
            for t in r * SEQ..(r + 1) * SEQ {
                let (a, b) = (ours[t], theirs[t]);
                let same = (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-5 * b.abs().max(1.0);
                assert!(same, "{name} row {r} token {t}: {a} vs forward's {b}");
            }
        }
    }
    let inspect = run_ok(&strings(&["inspect", run_dir.to_str().unwrap()]));
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(text.contains(&format!("spliced {hook}: CE clean")) && text.contains("ce_loss_score"), "{text}");
    assert!(text.contains("kl_div_score") && text.contains("OK:"), "{text}");
    // The hook is not stored: the variance the FVU divides by is not known.
    assert!(text.contains(&format!("FVU: store {hook} too")) && text.contains("L0 "), "{text}");

    for (extra, named) in [
        (vec!["--splice"], "--splice splices the --sae dictionaries into the forward: give --sae"),
        (vec!["--sae", sae_flag.as_str(), "--splice", "other"], "no --sae dictionary is named \"other\""),
    ] {
        let output = run(&extract(&s, "bad-splice", "f32", &extra));
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && err.contains(named), "{extra:?}: {err}");
        assert!(!s.root.join("out/bad-splice").exists());
    }
}
