//! `siphon plan --target tpu:SLICE` end to end on this CPU-only machine: the program compiled
//! by libtpu for the slice, the compiler's figures under its own names beside the planner's,
//! and a program larger than a chip refused. The cases that compile need the pinned libtpu
//! (`SIPHON_TEST_LIBTPU_PLUGIN`, set by `scripts/test.sh`): skipped with a note without it,
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

fn libtpu() -> Option<PathBuf> {
    let located =
        siphon_runtime::PluginLocator::new().explicit(std::env::var_os("SIPHON_TEST_LIBTPU_PLUGIN")).locate_libtpu();
    match located {
        Ok(choice) => Some(choice.path),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("note: skipped, no libtpu ({e})");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_fixture_compiled_for_v5e_4_reports_the_compilers_figures_beside_the_planners() {
    let Some(libtpu) = libtpu() else { return };
    let plugin = libtpu.to_str().unwrap();
    let args = [
        "plan",
        "--target",
        "tpu:v5litepod-4",
        "--plugin",
        plugin,
        "--model",
        "fixtures/models/tiny-qwen3",
        "--hooks",
        "blocks.*.hook_resid_post,blocks.1.mlp.hook_post",
        "--batch",
        "8",
        "--seq",
        "32",
        "--dtype",
        "bf16",
    ];
    let out = siphon(&[&args[..], &["--json"]].concat(), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Nothing from libtpu a user could take for an error: off a TPU VM it is told what a TPU
    // VM would tell it (the demo printed `E0000 … INVALID_ARGUMENT … TPU_WORKER_HOSTNAMES`,
    // a warning about the accelerator type and a huge-page error).
    let text = stderr(&out);
    for noise in ["E0000", "INVALID_ARGUMENT", "TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE", "hugepage", "WARNING"] {
        assert!(!text.contains(noise), "{noise}: {text}");
    }
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["target"]["topology"], "v5e:2x2");
    assert_eq!((report["hosts"].as_u64(), report["devices"].as_u64()), (Some(1), Some(4)));
    let compiled = &report["compiled"];
    for key in ["argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes", "generated_code_size_in_bytes"]
    {
        assert!(compiled[key].as_i64().is_some_and(|b| b > 0), "{key}: {compiled}");
    }
    // The planner counts the weights and inputs as the TPU pads them: the compiler's bytes.
    assert_eq!(compiled["argument_size_in_bytes"].as_u64(), report["planner"]["argument_bytes"].as_u64());
    assert_eq!(compiled["output_size_in_bytes"].as_u64(), report["planner"]["output_bytes"].as_u64());
    assert_eq!(report["fits"], true);
    let (compiler, analytic) =
        (report["flops_per_token"].as_f64().unwrap(), report["analytic_flops_per_token"].as_f64().unwrap());
    // A tiny model's norms, RoPE and softmax are a larger share than a real one's.
    assert!((1.0..1.5).contains(&(compiler / analytic)), "compiler {compiler}, analytic {analytic}");
    assert!(report["roofline_tokens_per_second"].as_f64().is_some_and(|t| t > 0.0));

    // fp8 rows (a scale and the E4M3 values) out of the program: the planner counts them so.
    let out = siphon(&[&args[..], &["--output-dtype", "fp8", "--json"]].concat(), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let fp8: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(fp8["compiled"]["output_size_in_bytes"].as_u64(), fp8["planner"]["output_bytes"].as_u64());
    assert!(fp8["compiled"]["output_size_in_bytes"].as_u64() < compiled["output_size_in_bytes"].as_u64());

    // Isolated documents (`--pack isolated`): their program compiles, its inputs as the
    // planner counts them (the positions are an input of every forward).
    let out = siphon(&[&args[..], &["--pack", "isolated", "--json"]].concat(), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let isolated: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((&isolated["pack"], &isolated["fits"]), (&"isolated".into(), &true.into()));
    assert_eq!(isolated["compiled"]["argument_size_in_bytes"].as_u64(), isolated["planner"]["argument_bytes"].as_u64());
    assert!(report["pack"].is_null(), "{}", report["pack"]);

    // A dictionary's tensors and latents in the program: counted as the compiler counts them.
    let sae = ["--sae", "fixtures/dictionaries/saelens-gated", "--latent-cap", "20", "--json"];
    let out = siphon(&[&args[..], &sae].concat(), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let with: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(with["compiled"]["argument_size_in_bytes"].as_u64(), with["planner"]["argument_bytes"].as_u64());
    assert_eq!(with["compiled"]["output_size_in_bytes"].as_u64(), with["planner"]["output_bytes"].as_u64());
    assert!(with["compiled"]["output_size_in_bytes"].as_u64() > compiled["output_size_in_bytes"].as_u64());

    let out = siphon(&args, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", stderr(&out));
    for expected in ["libtpu topology v5e:2x2", "1 hosts x 4 chips", "per device:  compiler     planner", "roofline"] {
        assert!(text.contains(expected), "{expected:?} missing from:\n{text}");
    }
}

#[test]
fn a_program_larger_than_a_chip_is_refused_naming_its_largest_term() {
    let Some(libtpu) = libtpu() else { return };
    // Every attention pattern of 64 rows of 4096 tokens: outputs far beyond 16 GiB a chip.
    let args = [
        "plan",
        "--target",
        "tpu:v5e-4",
        "--plugin",
        libtpu.to_str().unwrap(),
        "--model",
        "fixtures/models/tiny-llama",
        "--hooks",
        "blocks.*.attn.hook_pattern",
        "--batch",
        "64",
        "--seq",
        "4096",
    ];
    let out = siphon(&args, &[]);
    assert!(!out.status.success());
    let text = stderr(&out);
    let suggested = "--mesh 3d --data 4 --fsdp 1 --model-parallel 1";
    for expected in [
        "mesh [fsdp=2, model=2] does not fit v5e-4",
        "libtpu's compiler ran out of a chip's memory (E1000: CompileTimeHbmOom",
        "its largest term is outputs (the hooks) (24.00 GiB)",
        &format!("mesh [data=4] should fit (the planner's estimate): {suggested}"),
    ] {
        assert!(text.contains(expected), "{expected:?} missing from:\n{text}");
    }
    // And it does.
    let suggested: Vec<&str> = suggested.split(' ').collect();
    let out = siphon(&[&args[..], &suggested].concat(), &[]);
    assert!(out.status.success(), "{}", stderr(&out));

    // Qwen2.5-7B's weights in f32 on one v5e chip: 26 GiB of arguments.
    let out = siphon(
        &[
            "plan",
            "--target",
            "tpu:v5e-1",
            "--plugin",
            libtpu.to_str().unwrap(),
            "--config",
            "fixtures/configs/qwen2.5-7b.json",
            "--hooks",
            "blocks.27.hook_resid_post",
            "--batch",
            "1",
            "--seq",
            "128",
            "--dtype",
            "f32",
        ],
        &[],
    );
    assert!(!out.status.success());
    let text = stderr(&out);
    assert!(text.contains("its largest term is arguments (weights and inputs) (26.34 GiB)"), "{text}");
}

#[test]
fn bad_targets_and_a_missing_libtpu_are_named() {
    let config = ["--config", "fixtures/configs/qwen2.5-7b.json", "--batch", "64", "--seq", "128"];
    for (target, expected) in [
        ("h100", "name a TPU slice as tpu:SLICE (tpu:v5litepod-64) or GPU nodes as gpu:GPUS"),
        ("tpu:v5e-12", "no v5e slice has 12 chips"),
        ("tpu:v9-8", "unknown generation \"v9\""),
    ] {
        let out = siphon(&[&["plan", "--target", target][..], &config].concat(), &[]);
        assert!(!out.status.success() && stderr(&out).contains(expected), "{target}: {}", stderr(&out));
    }
    let out = siphon(&["plan", "--target", "tpu:v5e-64", "--config", "fixtures/configs/qwen2.5-7b.json"], &[]);
    assert!(stderr(&out).contains("give --batch and --seq"), "{}", stderr(&out));

    // No libtpu anywhere siphon looks: the one command that installs it.
    let empty = std::env::temp_dir().join(format!("siphon-no-libtpu-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = siphon(
        &[&["plan", "--target", "tpu:v5e-64"][..], &config].concat(),
        &[("SIPHON_CACHE_DIR", empty.to_str().unwrap()), ("SIPHON_PJRT_PLUGIN", "/opt/cpu/libpjrt_cpu.so")],
    );
    std::fs::remove_dir_all(&empty).unwrap();
    let text = stderr(&out);
    // Unless this machine's Python has the libtpu package, which siphon finds last.
    if !out.status.success() {
        for expected in ["no libtpu found", "/opt/cpu/libpjrt_cpu.so (not libtpu)", "pip install libtpu==0.0.51"] {
            assert!(text.contains(expected), "{expected:?} missing from:\n{text}");
        }
    }
}

#[test]
fn the_seeds_memory_bench_compiled_for_v6e_16_matches_the_planner() {
    let Some(libtpu) = libtpu() else { return };
    // fsdp=16 over the slice, and data=4 × fsdp=4 (each host its own copy), sharded and gathered.
    for (mesh, sharded) in [(&["--fsdp", "16"][..], 4 << 20 >> 4), (&["--data", "4", "--fsdp", "4"][..], 4 << 20 >> 2)]
    {
        let args = ["bench", "memory", "--target", "tpu:v6e-16", "--plugin", libtpu.to_str().unwrap()];
        let out = siphon(&[&args[..], &["--target-bytes", "4194304", "--json"], mesh].concat(), &[]);
        assert!(out.status.success(), "{}", stderr(&out));
        let bench: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(bench["matches"], true, "{bench}");
        assert_eq!(bench["sharded_program"]["argument"].as_u64(), Some(sharded), "{bench}");
        assert_eq!(bench["gather_program"]["output"].as_u64(), Some(4 << 20), "{bench}");
    }
}

#[test]
fn two_slices_are_one_mesh_over_both() {
    let Some(libtpu) = libtpu() else { return };
    let out = siphon(
        &[
            "plan",
            "--target",
            "tpu:v5e-16",
            "--slices",
            "2",
            "--plugin",
            libtpu.to_str().unwrap(),
            "--model",
            "fixtures/models/tiny-llama",
            "--hooks",
            "blocks.2.hook_resid_post",
            "--batch",
            "32",
            "--seq",
            "64",
            "--json",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((report["hosts"].as_u64(), report["devices"].as_u64()), (Some(8), Some(32)));
    assert_eq!(report["mesh"], "[data=8, fsdp=2, model=2]");
}

/// A mixture on a v5e-4 (`data=2, model=2`): by default its experts are XLA's grouped products,
/// three `chlo.ragged_dot` a mixture block with no loop, and the experts' flops are the routed
/// ones (the compiler within 1.5× of the analytic forward, as a dense tiny model); with
/// `--tpu-forms off` the rounds loop the CPU takes, named as such.
#[test]
fn a_mixture_compiles_to_grouped_products_with_no_loop() {
    let Some(libtpu) = libtpu() else { return };
    let args = [
        "plan",
        "--target",
        "tpu:v5litepod-4",
        "--plugin",
        libtpu.to_str().unwrap(),
        "--model",
        "fixtures/models/tiny-qwen3-moe",
        "--hooks",
        "blocks.1.hook_resid_post",
        "--batch",
        "8",
        "--seq",
        "32",
        "--mesh",
        "3d",
        "--data",
        "2",
        "--fsdp",
        "1",
        "--model-parallel",
        "2",
        "--json",
    ];
    let report = |extra: &[&str]| -> serde_json::Value {
        let out = siphon(&[&args[..], extra].concat(), &[]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let grouped = report(&[]);
    assert!(grouped["experts"].as_str().unwrap().contains("chlo.ragged_dot"), "{}", grouped["experts"]);
    assert_eq!(grouped["has_loops"], false);
    assert_eq!(grouped["grouped_calls"].as_u64(), Some(6), "gate, up and down of two blocks");
    let (compiler, analytic) =
        (grouped["flops_per_token"].as_f64().unwrap(), grouped["analytic_flops_per_token"].as_f64().unwrap());
    assert!((1.0..1.5).contains(&(compiler / analytic)), "compiler {compiler}, analytic {analytic}");

    let rounds = report(&["--tpu-forms", "off"]);
    assert!(rounds["experts"].as_str().unwrap().contains("rounds"), "{}", rounds["experts"]);
    assert_eq!(rounds["has_loops"], true);
    assert!(rounds["grouped_calls"].is_null(), "{}", rounds["grouped_calls"]);
}

/// A Gemma-3-sized vocabulary's next-token outputs compiled for a v5e-16 slice: the outputs'
/// bytes are the planner's, and nothing of `[tokens, vocab]` is ever whole — the compiler's
/// temporaries are a small part of one device's `8 rows × 1024 × 262,144` f32 logits (8 GiB),
/// the planner's chunk of 32 positions (256 MiB) bounding them.
#[test]
fn a_262k_vocabularys_outputs_compile_without_a_tokens_by_vocab_temporary() {
    let Some(libtpu) = libtpu() else { return };
    let args = [
        "plan",
        "--target",
        "tpu:v5litepod-16",
        "--plugin",
        libtpu.to_str().unwrap(),
        "--config",
        "fixtures/configs/gemma-3-1b.json",
        "--hooks",
        "blocks.25.hook_resid_post",
        "--batch",
        "32",
        "--seq",
        "1024",
        "--outputs",
        "nll,topk=20",
        "--json",
    ];
    let out = siphon(&args, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (compiled, planner) = (&report["compiled"], &report["planner"]);
    assert_eq!(compiled["output_size_in_bytes"], planner["output_bytes"], "{report}");
    let next_token = &report["plan"]["memory"]["next_token"];
    assert_eq!(next_token["chunk"], 32, "{next_token}");
    let whole_logits = 8u64 * 1024 * 262_144 * 4;
    let temp = compiled["temp_size_in_bytes"].as_u64().unwrap();
    assert!(temp < whole_logits / 16, "temporaries {temp} bytes, [tokens, vocab] is {whole_logits}");
    assert!(temp <= planner["temp_bytes"].as_u64().unwrap(), "the planner bounds the compiler: {report}");
}

/// A decoding step (`--decode-cache-len`) compiled for a v5e slice, of Qwen2.5-7B and of
/// Gemma 3 1B (22 of its 26 blocks windowed: each a ring of 512 + 64 - 1 positions): the
/// planner's arguments (weights, tokens and every slot's caches) and results (the caches after
/// the step, aliased to those, and the logits) are the compiler's, and the report gives a
/// roofline in new tokens a second.
#[test]
fn a_decoding_step_compiles_for_a_slice_with_the_planners_caches() {
    let Some(libtpu) = libtpu() else { return };
    for (config, cache_len) in [("qwen2.5-7b", "1024"), ("gemma-3-1b", "8192")] {
        let config = format!("fixtures/configs/{config}.json");
        let args = [
            "plan",
            "--target",
            "tpu:v5litepod-16",
            "--plugin",
            libtpu.to_str().unwrap(),
            "--config",
            &config,
            "--batch",
            "32",
            "--decode-cache-len",
            cache_len,
            "--json",
        ];
        let out = siphon(&args, &[]);
        assert!(out.status.success(), "{config}: {}", stderr(&out));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let (compiled, planner) = (&report["compiled"], &report["planner"]);
        let close = |a: &serde_json::Value, b: &serde_json::Value| {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            (a - b).abs() <= 0.01 * a.max(b)
        };
        assert!(close(&compiled["argument_size_in_bytes"], &planner["argument_bytes"]), "{config}: {report}");
        assert!(close(&compiled["output_size_in_bytes"], &planner["output_bytes"]), "{config}: {report}");
        let aliased = close(&compiled["alias_size_in_bytes"], &planner["alias_bytes"]);
        assert!(aliased, "{config}: the caches written in place: {report}");
        let decode = &report["plan"]["memory"]["decode"];
        assert_eq!(decode["cache_len"].to_string(), cache_len, "{decode}");
        assert!(report["roofline_tokens_per_second"].as_f64().is_some_and(|t| t > 0.0), "{report}");
        let temp = compiled["temp_size_in_bytes"].as_u64().unwrap();
        let bounded = temp <= planner["temp_bytes"].as_u64().unwrap();
        assert!(bounded, "{config}: the planner bounds the compiler's transients: {report}");
    }
}
