//! `siphon plan` end to end: the binary on committed config fixtures. Nothing here loads a
//! plugin (SIPHON_PJRT_PLUGIN is pointed at a file that does not exist to prove it).

use std::process::{Command, Output};

fn siphon(args: &[&str]) -> Output {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    Command::new(env!("CARGO_BIN_EXE_siphon"))
        .current_dir(root)
        .env("SIPHON_PJRT_PLUGIN", "/nonexistent/libpjrt.so")
        .args(args)
        .output()
        .expect("running siphon")
}

fn stdout(out: &Output) -> String {
    assert!(out.status.success(), "siphon failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn qwen_7b_on_4_hosts_of_16_is_2d_with_weights_over_16_and_fits() {
    let out = siphon(&[
        "plan",
        "--config",
        "fixtures/configs/qwen2.5-7b.json",
        "--hosts",
        "4",
        "--devices-per-host",
        "16",
        "--device-memory",
        "16",
    ]);
    let text = stdout(&out);
    assert!(text.contains("mesh      2d [data=4, fsdp=4, model=4]"), "{text}");
    assert!(text.contains("fits      yes"), "{text}");
    let out = siphon(&[
        "plan",
        "--config",
        "fixtures/configs/qwen2.5-7b.json",
        "--hosts",
        "4",
        "--devices-per-host",
        "16",
        "--device-memory",
        "16",
        "--json",
    ]);
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let axes: Vec<(String, u64)> = json["mesh"]["axes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["name"].as_str().unwrap().to_string(), a["size"].as_u64().unwrap()))
        .collect();
    assert_eq!(axes, [("data".into(), 4), ("fsdp".into(), 4), ("model".into(), 4)]);
    let total = json["memory"]["weights"]["total_bytes"].as_u64().unwrap();
    let sharded = json["memory"]["weights"]["sharded_bytes"].as_u64().unwrap();
    // Qwen2.5-7B without lm_head: 7,070,619,136 weights in bf16.
    assert_eq!(total, 7_070_619_136 * 2);
    assert_eq!(json["memory"]["weights"]["gathered_bytes"].as_u64().unwrap(), total);
    // total/16, up to the replicated norms and the biases split only over model=4.
    assert!(sharded >= total / 16 && sharded - total / 16 < total / 16 / 1000, "{sharded} vs {}", total / 16);
    assert_eq!(json["memory"]["fits"], true);
    assert_eq!(json["kind"], "2d");
}

#[test]
fn llama_70b_on_4_hosts_of_4_fits_only_spanning_hosts() {
    let base = [
        "plan",
        "--config",
        "fixtures/configs/llama-3.1-70b.json",
        "--hosts",
        "4",
        "--devices-per-host",
        "4",
        "--device-memory",
        "16",
    ];
    let text = stdout(&siphon(&base));
    assert!(text.contains("fits      no"), "{text}");
    assert!(text.contains("only a plan spanning hosts fits"), "{text}");
    let mut auto = base.to_vec();
    auto.extend(["--mesh", "auto"]);
    let text = stdout(&siphon(&auto));
    assert!(text.contains("fits      yes"), "{text}");
    assert!(text.contains("spanning hosts"), "{text}");
    assert!(text.contains("only a plan spanning hosts fits"), "{text}");
}

#[test]
fn bad_batch_or_heads_fail_before_any_plugin() {
    let out = siphon(&[
        "plan",
        "--config",
        "fixtures/configs/qwen2.5-7b.json",
        "--hosts",
        "4",
        "--devices-per-host",
        "16",
        "--batch",
        "6",
        "--seq",
        "128",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("batch 6 is not divisible by the data axis (4 ways"), "{err}");
    let out = siphon(&[
        "plan",
        "--config",
        "fixtures/configs/qwen2.5-7b.json",
        "--hosts",
        "1",
        "--devices-per-host",
        "16",
        "--model-parallel",
        "16",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("model=16 does not divide num_attention_heads 28"), "{err}");
    assert!(err.contains("valid shapes"), "{err}");
}

#[test]
fn model_dir_and_missing_paths() {
    let dir = std::env::temp_dir().join(format!("siphon-plan-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/configs/qwen2.5-0.5b.json");
    std::fs::copy(fixture, dir.join("config.json")).unwrap();
    let out = siphon(&["plan", "--model", dir.to_str().unwrap(), "--devices-per-host", "2"]);
    std::fs::remove_dir_all(&dir).unwrap();
    let text = stdout(&out);
    assert!(text.contains("qwen2, 24 layers"), "{text}");
    assert!(text.contains("[model=2]"), "{text}");
    let out = siphon(&["plan", "--model", "/nonexistent/model"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/model"));
}

/// DeepSeek-V3's own config.json (671B, FP8 in 128 × 128 blocks) on one host of 8 × 141 GiB:
/// the weights kept in their stored FP8 fit, dequantized to bf16 they do not.
#[test]
fn deepseek_v3_fits_one_8_device_host_only_with_its_weights_kept_fp8() {
    let plan = |weights: &str| {
        let out = siphon(&[
            "plan",
            "--config",
            "fixtures/configs/deepseek-v3.json",
            "--devices-per-host",
            "8",
            "--device-memory",
            "141",
            "--dtype",
            "bf16",
            "--batch",
            "8",
            "--seq",
            "1024",
            "--mesh",
            "2d",
            "--model-parallel",
            "8",
            "--weights",
            weights,
            "--json",
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_str::<serde_json::Value>(&stdout(&out)).unwrap()
    };
    let (bf16, fp8) = (plan("dequantized"), plan("stored"));
    let gib = |p: &serde_json::Value| p["memory"]["weights"]["sharded_bytes"].as_f64().unwrap() / (1u64 << 30) as f64;
    assert_eq!(bf16["memory"]["fits"], false);
    assert_eq!(fp8["memory"]["fits"], true);
    // 1.25 TiB of bf16 over 8 devices against about half of it: one byte per value and an f32
    // scale per 128 × 128 block for every projection; embeddings, routers and norms in bf16.
    assert!((157.0..158.5).contains(&gib(&bf16)), "{}", gib(&bf16));
    assert!((78.5..80.0).contains(&gib(&fp8)), "{}", gib(&fp8));
    let notes = fp8["notes"].to_string();
    assert!(notes.contains("weights kept in their stored form"), "{notes}");
}

/// GPT-OSS-120B from its config alone (`quantization_config` `mxfp4`): `--weights stored`
/// counts its 108 expert projections at MXFP4's bytes (half a byte a value and a scale byte
/// per 32), so the whole model fits one 80 GB device, where in bf16 it needs 217 GiB.
#[test]
fn plan_counts_mxfp4_experts_from_a_config() {
    let plan = |weights: &str| {
        let out = siphon(&[
            "plan",
            "--config",
            "fixtures/configs/gpt-oss-120b.json",
            "--hooks",
            "blocks.35.hook_resid_post",
            "--devices-per-host",
            "1",
            "--device-memory",
            "80",
            "--batch",
            "8",
            "--seq",
            "1024",
            "--weights",
            weights,
            "--json",
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_str::<serde_json::Value>(&stdout(&out)).unwrap()
    };
    let (bf16, mxfp4) = (plan("dequantized"), plan("stored"));
    let gib = |p: &serde_json::Value| p["memory"]["weights"]["sharded_bytes"].as_f64().unwrap() / (1u64 << 30) as f64;
    assert_eq!(bf16["memory"]["fits"], false);
    assert_eq!(mxfp4["memory"]["fits"], true);
    assert!((216.0..217.0).contains(&gib(&bf16)), "{}", gib(&bf16));
    assert!((59.0..60.5).contains(&gib(&mxfp4)), "{}", gib(&mxfp4));
    let notes = mxfp4["notes"].to_string();
    assert!(notes.contains("108 weights kept in their stored form"), "{notes}");
}

/// A hook at layer 40 of Llama-3.1-70B's 80 needs blocks 0..=40 only: the blocks after it are
/// never built, so their weights are not counted (issue 24), nor the final norm.
#[test]
fn plan_counts_only_the_blocks_the_hooks_need() {
    let plan = |hooks: Option<&str>| {
        let mut args = vec![
            "plan",
            "--config",
            "fixtures/configs/llama-3.1-70b.json",
            "--devices-per-host",
            "8",
            "--mesh",
            "2d",
            "--model-parallel",
            "8",
            "--json",
        ];
        if let Some(hooks) = hooks {
            args.extend(["--hooks", hooks]);
        }
        serde_json::from_str::<serde_json::Value>(&stdout(&siphon(&args))).unwrap()
    };
    let (all, half) = (plan(None), plan(Some("blocks.40.hook_resid_post")));
    let params = |p: &serde_json::Value| p["n_params"].as_f64().unwrap();
    let bytes = |p: &serde_json::Value| p["memory"]["weights"]["total_bytes"].as_f64().unwrap();
    // Embedding (128256 × 8192) plus 41 of 80 blocks of 856M each.
    let block = (params(&all) - 128_256.0 * 8192.0 - 8192.0) / 80.0;
    let want = 128_256.0 * 8192.0 + 41.0 * block;
    assert!((params(&half) - want).abs() < 1.0, "{} vs {want}", params(&half));
    assert!((bytes(&half) / bytes(&all) - want / params(&all)).abs() < 1e-9);
    assert!(half["notes"].to_string().contains("blocks 41..80 are not built"), "{}", half["notes"]);
}

/// `siphon plan` → `siphon extract` for Llama-3.1-70B on 4 hosts × 4 devices × 16 GiB: the
/// plan's suggestion (a weight group spanning hosts) is accepted by `extract` as it is, which
/// checks everything — the model's 80 blocks of weights (a sparse checkpoint of the real
/// shapes), the hooks, the corpus, the mesh over the 4 hosts — and then refuses plainly: the
/// CPU plugin cannot form a mesh across processes. The plugin is never loaded (the path given
/// is an empty file).
#[test]
fn plans_suggestion_spanning_hosts_is_taken_by_extract_and_refused_plainly_on_the_cpu_plugin() {
    let base = [
        "plan",
        "--config",
        "fixtures/configs/llama-3.1-70b.json",
        "--hosts",
        "4",
        "--devices-per-host",
        "4",
        "--device-memory",
        "16",
        "--dtype",
        "bf16",
        "--batch",
        "4",
        "--seq",
        "1024",
        "--hooks",
        "blocks.79.hook_resid_post",
        "--json",
    ];
    let plan: serde_json::Value = serde_json::from_str(&stdout(&siphon(&base))).unwrap();
    let suggestion = &plan["suggestion"];
    assert_eq!(suggestion["spans_hosts"], true, "{plan}");
    let flags: Vec<String> = suggestion["flags"].as_str().unwrap().split_whitespace().map(String::from).collect();
    assert!(flags.contains(&"--fsdp".to_string()), "{flags:?}");

    // The real config and every weight of its 80 blocks with their real shapes, in a sparse
    // safetensors file (nothing is read past the header).
    let tmp = tempfile::tempdir().unwrap();
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let model = tmp.path().join("llama-70b");
    std::fs::create_dir_all(&model).unwrap();
    let config_json = std::fs::read_to_string(root.join("fixtures/configs/llama-3.1-70b.json")).unwrap();
    std::fs::write(model.join("config.json"), &config_json).unwrap();
    let config = siphon_models::HfConfig::from_json(&config_json).unwrap().into_config().unwrap();
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for p in config.params(config.n_layers, false) {
        let bytes = p.shape.iter().map(|&d| d as u64).product::<u64>() * 2;
        header.insert(
            p.name,
            serde_json::json!({"dtype": "BF16", "shape": p.shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut text = serde_json::to_string(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let file = std::fs::File::create(model.join("model.safetensors")).unwrap();
    use std::io::Write;
    (&file).write_all(&(text.len() as u64).to_le_bytes()).unwrap();
    (&file).write_all(text.as_bytes()).unwrap();
    file.set_len(8 + text.len() as u64 + offset).unwrap();
    let plugin = tmp.path().join("libpjrt_cpu.so");
    std::fs::write(&plugin, b"").unwrap();

    let model_arg = model.display().to_string();
    let output = tmp.path().join("out").display().to_string();
    let mut args: Vec<&str> = vec![
        "extract",
        "--model",
        &model_arg,
        "--tokenizer",
        "fixtures/data/tokenizer.json",
        "--corpus",
        "fixtures/data/corpus",
        "--hooks",
        "blocks.79.hook_resid_post",
        "--seq-len",
        "1024",
        "--batch-size",
        "4",
        "--compute-dtype",
        "bf16",
        "--output",
        &output,
        "--cpu-devices",
        "4",
        "--num-processes",
        "4",
        "--process-id",
        "0",
        // Never contacted: the job stops before it joins.
        "--coordinator",
        "127.0.0.1:9",
    ];
    args.extend(flags.iter().map(String::as_str));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_siphon"))
        .current_dir(root)
        .env("SIPHON_PJRT_PLUGIN", &plugin)
        .args(&args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("spans 4 hosts of 4"), "{err}");
    assert!(err.contains("the CPU plugin") && err.contains("cannot form a mesh across processes"), "{err}");
    assert!(!err.contains("coordination service listening"), "stopped before the coordinator: {err}");
}

/// `--sae`: the dictionaries' f32 tensors (whole on every device), their latents (i32 indices
/// and f32 values per kept latent, i32 firings per token) and the encoders' transients are
/// counted with the activations, and the blocks a dictionary's hook needs are planned
/// (against the compiler: `plan_tpu.rs`).
#[test]
fn dictionaries_are_counted_with_the_activations() {
    let base = ["plan", "--model", "fixtures/models/tiny-llama", "--batch", "4", "--seq", "16", "--json"];
    let plan = |extra: &[&str]| -> serde_json::Value {
        serde_json::from_str(&stdout(&siphon(&[&base[..], extra].concat()))).unwrap()
    };
    let without = plan(&["--hooks", "blocks.0.hook_resid_post"]);
    assert!(without["memory"]["dictionaries"].is_null());
    // SAELens's TopK (k 6) on blocks.1.hook_resid_post: d_in 64, 96 latents.
    let with = plan(&["--hooks", "blocks.0.hook_resid_post", "--sae", "fixtures/dictionaries/saelens-topk"]);
    let d = &with["memory"]["dictionaries"];
    let (d_in, d_sae, cap, tokens) = (64u64, 96u64, 6u64, 4 * 16u64);
    assert_eq!(d["tensor_bytes"], 4 * (d_in * d_sae + d_sae + d_in), "W_enc, b_enc, b_dec: {d}");
    assert_eq!(d["output_bytes"], tokens * cap * 8 + tokens * 4, "{d}");
    assert_eq!(d["working_bytes"], 6 * 4 * tokens * d_sae, "{d}");
    let extra = d["tensor_bytes"].as_u64().unwrap()
        + d["output_bytes"].as_u64().unwrap()
        + d["working_bytes"].as_u64().unwrap();
    // The dictionary's hook needs block 1, which the hook alone does not: its weights too.
    let weights = |p: &serde_json::Value| p["memory"]["weights"]["sharded_bytes"].as_u64().unwrap();
    assert!(weights(&with) > weights(&without));
    let required = |p: &serde_json::Value| p["memory"]["required_bytes"].as_u64().unwrap();
    let activations = |p: &serde_json::Value| p["memory"]["activations"]["total_bytes"].as_u64().unwrap();
    assert_eq!(required(&with), weights(&with) + activations(&with) + extra);
    // --latent-cap keeps that many.
    let capped = plan(&[
        "--hooks",
        "blocks.0.hook_resid_post",
        "--sae",
        "fixtures/dictionaries/saelens-topk",
        "--latent-cap",
        "2",
    ]);
    assert_eq!(capped["memory"]["dictionaries"]["output_bytes"], tokens * 2 * 8 + tokens * 4);
    let text = stdout(&siphon(&[
        "plan",
        "--model",
        "fixtures/models/tiny-llama",
        "--batch",
        "4",
        "--seq",
        "16",
        "--sae",
        "fixtures/dictionaries/saelens-topk",
    ]));
    assert!(text.contains("  dictionaries "), "{text}");
    // A dictionary of another width than its hook is refused, as extract and forward refuse it.
    let gemma = "fixtures/dictionaries/gemma-scope-2b-pt-res/layer_1/width_16k/average_l0_7@blocks.1.ln1.hook_scale";
    let out = siphon(&[&base[..], &["--sae", gemma]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("reads 64 values a token, blocks.1.ln1.hook_scale has 1"), "{err}");
}

/// `--outputs` counts the next-token outputs (lm_head included, one chunk of logits; with
/// `--target` compiled too: tests/plan_tpu.rs).
#[test]
fn outputs_are_counted() {
    let args = ["plan", "--config", "fixtures/configs/llama-3-8b.json", "--devices-per-host", "8", "--batch", "8"];
    let text = stdout(&siphon(&[&args[..], &["--seq", "1024", "--outputs", "nll,topk=20"]].concat()));
    assert!(text.contains("(lm_head included)") && text.contains("next-token"), "{text}");
}
