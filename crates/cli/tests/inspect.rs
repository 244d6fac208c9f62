//! `siphon inspect` end to end on datasets written by the store's own writer (no model, no
//! plugin): format 2 with hooks of several per-token shapes, a format-1 dataset (rewritten by
//! hand as format 1 wrote it) with its `ln_final.hook_normalized` note, and an unknown format.

use std::path::Path;
use std::process::{Command, Output};

use sha2::Digest;
use siphon_store::synthetic::SyntheticSpec;
use siphon_store::{DType, HostId, RunDescriptor, ShardWriter, StoreConfig};

const RUN: &str = "r";
const HOST: HostId = HostId { machine: 0, host: 0 };

fn siphon(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_siphon"))
        .env("SIPHON_PJRT_PLUGIN", "/nonexistent/libpjrt.so")
        .args(args)
        .output()
        .expect("running siphon")
}

fn stdout(out: &Output) -> String {
    assert!(out.status.success(), "siphon failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// Writes and finalizes a run of `spec` under `output`, recording the shapes in run.json or not.
fn write_run(output: &Path, spec: &SyntheticSpec, record_shapes: bool) {
    let mut config = StoreConfig::new(output.display().to_string(), RUN, HOST);
    config.format.dtype = DType::F32;
    let descriptor = RunDescriptor {
        model: serde_json::json!({"id": "synthetic"}),
        hooks: spec.hooks.clone(),
        hook_shapes: if record_shapes { spec.shapes.clone() } else { Vec::new() },
        partition: serde_json::json!({"machines": 1, "hosts": 1}),
        ..Default::default()
    };
    let mut writer = ShardWriter::open(config, descriptor).unwrap();
    for k in 0..2 {
        writer.push(spec.batch(k)).unwrap();
    }
    writer.finish().unwrap();
    siphon_store::finalize_run(&output.display().to_string(), &[], RUN).unwrap();
}

/// Sets the format tag of run.json and of every shard (fixing the manifest's sizes and hashes).
fn set_format(run_dir: &Path, tag: &str) {
    let path = run_dir.join("run.json");
    let mut run_json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    run_json["format"] = tag.into();
    std::fs::write(&path, serde_json::to_vec_pretty(&run_json).unwrap()).unwrap();
    let host_dir = run_dir.join(HOST.dir_name());
    let manifest = host_dir.join("manifest.jsonl");
    let mut lines = siphon_store::parse_manifest("m", &std::fs::read_to_string(&manifest).unwrap()).unwrap();
    for line in &mut lines {
        let shard = host_dir.join(&line.shard);
        let bytes = std::fs::read(&shard).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut metadata = safetensors::SafeTensors::read_metadata(&bytes).unwrap().1.metadata().clone().unwrap();
        metadata.insert("format".into(), tag.into());
        let rewritten = safetensors::serialize(st.tensors(), Some(metadata)).unwrap();
        line.bytes = rewritten.len() as u64;
        // Format-1 runs were checked by sha256.
        line.sha256 = Some(sha2::Sha256::digest(&rewritten).iter().map(|b| format!("{b:02x}")).collect());
        line.crc32c = None;
        std::fs::write(&shard, rewritten).unwrap();
    }
    std::fs::write(&manifest, siphon_store::render_manifest(&lines)).unwrap();
}

#[test]
fn format_2_lists_each_hook_with_its_per_token_shape() {
    let dir = tempfile::tempdir().unwrap();
    let spec = SyntheticSpec::with_hooks(
        &[("blocks.0.hook_resid_post", &[8]), ("blocks.0.attn.hook_z", &[2, 4]), ("blocks.0.ln1.hook_scale", &[1])],
        2,
        8,
    );
    write_run(dir.path(), &spec, true);
    let url = dir.path().join(RUN).display().to_string();
    let text = stdout(&siphon(&["inspect", &url]));
    assert!(text.contains("  format siphon-activations/2\n"), "{text}");
    assert!(text.contains("hooks (3), per-token shape from run.json:"), "{text}");
    for line in
        ["    blocks.0.hook_resid_post [8]\n", "    blocks.0.attn.hook_z [2, 4]\n", "    blocks.0.ln1.hook_scale [1]\n"]
    {
        assert!(text.contains(line), "{line:?} in {text}");
    }
    assert!(!text.contains("note:"), "{text}");
    assert!(text.contains("OK:"), "{text}");

    let json: serde_json::Value = serde_json::from_str(&stdout(&siphon(&["inspect", &url, "--json"]))).unwrap();
    assert_eq!(json["ok"], true);
    assert_eq!(json["format"], "siphon-activations/2");
    assert_eq!(json["format_version"], 2);
    assert_eq!(json["hook_shapes_from"], "run.json");
    assert_eq!(
        json["hook_shapes"],
        serde_json::json!({"blocks.0.hook_resid_post": [8], "blocks.0.attn.hook_z": [2, 4], "blocks.0.ln1.hook_scale": [1]})
    );
    assert_eq!(json["notes"], serde_json::json!([]));
}

#[test]
fn format_1_says_what_ln_final_hook_normalized_holds() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = SyntheticSpec::new(2, 2, 8, 16);
    spec.hooks[1] = "ln_final.hook_normalized".into();
    write_run(dir.path(), &spec, false);
    let run_dir = dir.path().join(RUN);
    set_format(&run_dir, "siphon-activations/1");
    let url = run_dir.display().to_string();
    let text = stdout(&siphon(&["inspect", &url]));
    assert!(text.contains("  format siphon-activations/1\n"), "{text}");
    assert!(text.contains("hooks (2), per-token shape from shards:"), "{text}");
    assert!(text.contains("    ln_final.hook_normalized [16]\n"), "{text}");
    assert!(
        text.contains("  note: format 1: in this dataset ln_final.hook_normalized is the final norm's output after its gain (what format 2 calls ln_final.hook_out), not TransformerLens's x/RMS(x)"),
        "{text}"
    );
    assert!(text.contains("OK:"), "{text}");

    let json: serde_json::Value = serde_json::from_str(&stdout(&siphon(&["inspect", &url, "--json"]))).unwrap();
    assert_eq!(json["ok"], true);
    assert_eq!(json["format_version"], 1);
    assert_eq!(json["hook_shapes"]["ln_final.hook_normalized"], serde_json::json!([16]));
    assert_eq!(json["notes"].as_array().unwrap().len(), 1);
}

#[test]
fn an_unknown_format_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path(), &SyntheticSpec::new(1, 2, 8, 16), true);
    let run_dir = dir.path().join(RUN);
    set_format(&run_dir, "siphon-activations/3");
    let out = siphon(&["inspect", &run_dir.display().to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("unsupported dataset format \"siphon-activations/3\""), "{stderr}");
}
