//! `siphon plan --target gpu:GPUS` end to end on this CPU-only machine: the program compiled
//! by XLA's CUDA plugin for H100s from the plugin's own description of them, the compiler's
//! memory beside the planner's, each block's attention as compiled (cuDNN's fused call kept,
//! or XLA's form, as isolated documents take it), the grouped expert products of a mixture on
//! eight GPUs, a program larger than a GPU's share refused with a mesh that fits, and bad
//! targets named. The cases that compile need the pinned CUDA compiler
//! (`SIPHON_TEST_CUDA_COMPILER`, set by `scripts/test.sh`): skipped with a note without it,
//! except under CI, where they fail.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn siphon(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let mut command = Command::new(env!("CARGO_BIN_EXE_siphon"));
    command.current_dir(root).args(args).stdin(Stdio::null());
    for (name, value) in envs {
        command.env(name, value);
    }
    command.output().expect("running siphon")
}

fn cuda() -> Option<PathBuf> {
    let located = siphon_runtime::PluginLocator::new()
        .explicit(std::env::var_os("SIPHON_TEST_CUDA_COMPILER"))
        .locate_cuda_compiler();
    match located {
        Ok(choice) => Some(choice.path),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("note: skipped, no CUDA compiler ({e})");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", stderr(out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Llama-3-8B's widths, two blocks, 32 x 1024 tokens, on one H100: every block's cuDNN call is
/// in the compiled program and the temporaries are at least 3 GiB below those of the same plan
/// with left-padded rows (XLA's form: a block's bf16 scores, 2 GiB, materialized twice), the
/// MLP running over the sequence in chunks; the planner's argument and output bytes are the
/// compiler's.
#[test]
fn llama_on_an_h100_compiles_each_blocks_attention_with_cudnn() {
    let Some(cuda) = cuda() else { return };
    let args = [
        "plan",
        "--target",
        "gpu:h100",
        "--plugin",
        cuda.to_str().unwrap(),
        "--config",
        "fixtures/configs/llama-3-8b.json",
        "--hooks",
        "blocks.{0..1}.hook_resid_post",
        "--batch",
        "32",
        "--seq",
        "1024",
    ];
    let right = json(&siphon(&[&args[..], &["--json"]].concat(), &[]));
    assert_eq!(right["target"]["model"], "h100");
    assert_eq!((right["hosts"].as_u64(), right["devices"].as_u64()), (Some(1), Some(1)));
    assert_eq!(right["padding"], "right");
    let blocks = right["attention"].as_array().unwrap();
    assert_eq!(blocks.len(), 2);
    for block in blocks {
        assert_eq!((&block["form"], block["compiled_fused_calls"].as_u64()), (&"cudnn".into(), Some(1)), "{block}");
    }
    let (compiled, planner) = (&right["compiled"], &right["planner"]);
    assert_eq!(compiled["argument_size_in_bytes"].as_u64(), planner["argument_bytes"].as_u64());
    assert_eq!(compiled["output_size_in_bytes"].as_u64(), planner["output_bytes"].as_u64());
    assert_eq!(right["fits"], true);
    assert_eq!(right["usable_bytes"].as_u64(), Some((84_942_979_072f64 * 0.75) as u64));
    assert!(right["flops_bound_tokens_per_second"].as_f64().is_some_and(|t| t > 0.0));

    let left = json(&siphon(&[&args[..], &["--pad", "left", "--json"]].concat(), &[]));
    assert!(left["attention"].as_array().unwrap().iter().all(|b| b["form"] == "xla" && b["compiled_fused_calls"] == 0));
    let temp = |r: &serde_json::Value| r["compiled"]["temp_size_in_bytes"].as_u64().unwrap();
    // XLA's form keeps a block's scores, 32 rows x 32 heads x 1024 x 1024 in bf16 (2 GiB),
    // twice; cuDNN's keeps none, and its peak is one chunk of the MLP (issue 53: 3 GiB less).
    assert!(temp(&left) >= temp(&right) + (3 << 30), "XLA's form {} against cuDNN's {}", temp(&left), temp(&right));
    assert!(temp(&right) < 1 << 30, "cuDNN's form keeps {} bytes of temporaries", temp(&right));
    // Isolated documents (`--pack isolated`): each attends only itself, a mask cuDNN's causal
    // one is not, so every block takes XLA's form and its scores.
    let isolated = json(&siphon(&[&args[..], &["--pack", "isolated", "--json"]].concat(), &[]));
    assert_eq!((&isolated["pack"], &isolated["padding"]), (&"isolated".into(), &"right".into()));
    assert!(
        isolated["attention"].as_array().unwrap().iter().all(|b| b["form"] == "xla" && b["compiled_fused_calls"] == 0)
    );
    assert!(
        temp(&isolated) >= temp(&right) + (3 << 30),
        "isolated {} against cuDNN's {}",
        temp(&isolated),
        temp(&right)
    );

    let out = siphon(&args, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "1 hosts x 1 NVIDIA H100 80GB HBM3",
        "right-padded rows",
        "attention:   cuDNN fused: blocks 0-1 (compiled: each cuDNN block's __cudnn$fmhaSoftmax call kept)",
        "per device:  compiler     planner",
        "of a GPU's 59.33 GiB for a job",
    ] {
        assert!(text.contains(expected), "{expected:?} missing from:\n{text}");
    }
}

/// Qwen3-30B-A3B's widths, two blocks, on eight H100s as the planner meshes them (`2d`: heads
/// and experts over `model`): three grouped products a mixture block in the compiled program,
/// no loop, and cuDNN's call in each block on each device's part.
#[test]
fn a_mixture_on_eight_h100s_compiles_its_grouped_products() {
    let Some(cuda) = cuda() else { return };
    let args = [
        "plan",
        "--target",
        "gpu:h100x8",
        "--plugin",
        cuda.to_str().unwrap(),
        "--config",
        "fixtures/configs/qwen3-30b-a3b.json",
        "--hooks",
        "blocks.1.hook_resid_post",
        "--batch",
        "8",
        "--seq",
        "256",
        "--json",
    ];
    let report = json(&siphon(&args, &[]));
    assert_eq!(report["devices"].as_u64(), Some(8));
    assert!(report["mesh"].as_str().unwrap().contains("model=4"), "{}", report["mesh"]);
    assert_eq!(report["grouped_calls"].as_u64(), Some(6), "gate, up and down of two blocks");
    assert!(report["experts"].as_str().unwrap().starts_with("siphon's grouped products"), "{}", report["experts"]);
    assert_eq!(report["has_loops"], false);
    for block in report["attention"].as_array().unwrap() {
        assert_eq!(block["compiled_fused_calls"].as_u64(), Some(1), "{block}");
    }
}

/// Every attention pattern of tiny-llama at 64 x 8192 with the weights split over all eight
/// GPUs (each GPU every row): 96 GiB of outputs a GPU, refused naming them and the mesh that
/// fits — every GPU its own rows — which then fits.
#[test]
fn a_program_larger_than_a_gpus_share_is_refused_with_a_mesh_that_fits() {
    let Some(cuda) = cuda() else { return };
    let args = [
        "plan",
        "--target",
        "gpu:h100x8",
        "--plugin",
        cuda.to_str().unwrap(),
        "--model",
        "fixtures/models/tiny-llama",
        "--hooks",
        "blocks.*.attn.hook_pattern",
        "--batch",
        "64",
        "--seq",
        "8192",
    ];
    let out =
        siphon(&[&args[..], &["--mesh", "3d", "--data", "1", "--fsdp", "8", "--model-parallel", "1"]].concat(), &[]);
    assert!(!out.status.success());
    let text = stderr(&out);
    for expected in [
        "mesh [fsdp=8] does not fit h100x8",
        "one NVIDIA H100 80GB HBM3 gives a job 59.33 GiB (75% of its 79.11 GiB",
        "its largest term is outputs (the hooks)",
        "--mesh 3d --data 8 --fsdp 1 --model-parallel 1",
    ] {
        assert!(text.contains(expected), "{expected:?} missing from:\n{text}");
    }
    let out =
        siphon(&[&args[..], &["--mesh", "3d", "--data", "8", "--fsdp", "1", "--model-parallel", "1"]].concat(), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn bad_gpu_targets_and_a_missing_cuda_plugin_are_named() {
    let config = ["--config", "fixtures/configs/qwen2.5-7b.json", "--batch", "64", "--seq", "128"];
    for (target, extra, expected) in [
        ("gpu:h100x0", &[][..], "a node has 1 to 16 GPUs"),
        ("gpu:v100x8", &[], "unknown GPU \"v100\""),
        ("gpu:h100x8", &["--slices", "2"], "--slices joins TPU slices"),
        ("tpu:v5e-4", &["--hosts", "2"], "--hosts counts GPU nodes"),
    ] {
        let out = siphon(&[&["plan", "--target", target][..], &config, extra].concat(), &[]);
        assert!(!out.status.success() && stderr(&out).contains(expected), "{target}: {}", stderr(&out));
    }
    // No CUDA plugin anywhere siphon looks: how to install one.
    let empty = std::env::temp_dir().join(format!("siphon-no-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = siphon(
        &[&["plan", "--target", "gpu:h100"][..], &config].concat(),
        &[("SIPHON_CACHE_DIR", empty.to_str().unwrap()), ("SIPHON_PJRT_PLUGIN", "/opt/cpu/libpjrt_cpu.so")],
    );
    std::fs::remove_dir_all(&empty).unwrap();
    // Unless this machine's Python has the jax-cuda12-pjrt package, which siphon finds last.
    if !out.status.success() {
        let text = stderr(&out);
        for expected in [
            "no CUDA plugin found",
            "/opt/cpu/libpjrt_cpu.so (not a CUDA plugin)",
            "scripts/setup-cuda-compiler.sh",
            "jax-cuda12-pjrt==0.12.0.1",
        ] {
            assert!(text.contains(expected), "{expected:?} missing from:\n{text}");
        }
    }
}
