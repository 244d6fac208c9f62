//! Every fixture family's program (one fixture a family), as `siphon extract` builds it for
//! GPUs, compiled by XLA's CUDA plugin for H100s on this CPU-only machine (no GPU), cuDNN
//! building and checking each fused attention's graph for the H100 and siphon's
//! grouped-product handler registered for the CUDA platform: bf16 over right-padded rows
//! (cuDNN's attention where `tests/cuda_forms.txt` says a block takes it, the grouped products
//! of every mixture) on one GPU and on four (rows over `data`, heads and experts over
//! `model`); XLA's forms of left-padded rows in f32 on one GPU. The compiled program is read
//! back: each block built with cuDNN's call keeps exactly one (found by its op name), no
//! other block has one, and where every softmax block is fused no instruction holds a
//! `[.., seq, .., seq]` score array; each mixture block keeps its three grouped products; the
//! planner's argument and output bytes are the compiler's.
//! Families compile side by side (~6 CPU-seconds a compile, a third of it cuDNN building its
//! graphs; ~6 minutes on two cores).
//!
//! Needs the pinned CUDA compiler: `scripts/test.sh` installs it into siphon's cache
//! (`scripts/setup-cuda-compiler.sh`) and names it in `SIPHON_TEST_CUDA_COMPILER`. Without it
//! the test is skipped with a note, except under CI, where it fails.

// The CPU client of `common` is for the tests that run programs; this one only compiles.
#[allow(dead_code)]
mod common;

use std::path::Path;

use siphon_engine::EngineOptions;
use siphon_engine::aot::{AotProgram, AotRequest};
use siphon_models::{AttentionForm, DType, HookKind, HookPoint, LoadedModel, ModelConfig};
use siphon_plan::{MeshKind, MeshRequest, PlanRequest};
use siphon_runtime::{GpuTargetConfig, HloInstruction, Plugin, PluginLocator, Topology, gpu_topology_options};

const BATCH: usize = 4;
/// A length no fixture's other dimensions share, so that a score array is recognisable.
const SEQ: usize = 29;

/// What one compile asks for.
#[derive(Clone, Copy, Debug)]
struct Variant {
    dtype: DType,
    right_padded: bool,
    /// Rows over `data` = 2, heads and experts over `model` = 2 (over `data` = 4 where the
    /// heads do not split in two).
    mesh: bool,
}

fn compile(topology: &Topology, config: &ModelConfig, hooks: &[HookPoint], v: Variant) -> AotProgram {
    let halves = config.attention.n_heads.is_multiple_of(2)
        && (0..config.n_layers).all(|l| config.kv_heads_at(l).is_multiple_of(2));
    let (data, model) = match (v.mesh, halves) {
        (false, _) => (1, 1),
        (true, true) => (2, 2),
        (true, false) => (4, 1),
    };
    let mesh = MeshRequest { kind: MeshKind::ThreeD, data: Some(data), fsdp: Some(1), model: Some(model) };
    let devices = if v.mesh { 4 } else { 1 };
    let request = PlanRequest {
        mesh,
        dtype: v.dtype,
        output_dtype: v.dtype,
        batch: Some(BATCH),
        seq: Some(SEQ),
        hooks: Some(hooks.to_vec()),
        layout: siphon_plan::DeviceLayout::Gpu,
        ..PlanRequest::default()
    };
    let plan = siphon_plan::plan(config, &siphon_plan::Topology::uniform(1, devices).unwrap(), &request).unwrap();
    let options = EngineOptions {
        compute_dtype: v.dtype,
        output_dtype: v.dtype,
        right_padded: v.right_padded,
        ..common::planned_options(&plan)
    };
    let request =
        AotRequest { config, hooks: hooks.to_vec(), options, stored: Default::default(), batch: BATCH, seq: SEQ };
    let aot = siphon_engine::aot::compile(topology, request).unwrap_or_else(|e| panic!("{v:?}: {e}"));
    // The planner's argument and output bytes are the compiler's, byte for byte.
    let activations = plan.memory.activations.unwrap();
    let arguments = plan.memory.weights.sharded_bytes + activations.input_bytes;
    assert_eq!(aot.memory.argument_size_in_bytes as u64, arguments, "{v:?}: arguments");
    assert_eq!(aot.memory.output_size_in_bytes as u64, activations.hook_bytes, "{v:?}: outputs");
    aot
}

/// The compiled program's cuDNN calls of block `layer`, by the op name each carries.
fn fused_calls(instructions: &[HloInstruction], layer: usize) -> usize {
    instructions
        .iter()
        .filter(|i| i.custom_call_target == siphon_models::cudnn::TARGET)
        .filter(|i| siphon_models::cudnn::call_block(&i.op_name) == Some(layer))
        .count()
}

/// Instructions with an array holding two `SEQ`-long dimensions: a block's scores or pattern.
fn score_arrays(instructions: &[HloInstruction]) -> Vec<String> {
    instructions
        .iter()
        .filter(|i| i.shapes.iter().any(|s| s.iter().filter(|&&d| d == SEQ as i64).count() >= 2))
        .map(|i| format!("{} {} {:?}", i.opcode, i.name, i.shapes))
        .collect()
}

/// One test, so that the plugin's environment is set before any other thread of this binary.
#[test]
fn every_fixture_family_compiles_for_h100s_with_cudnn_and_grouped_products() {
    let located = PluginLocator::new().explicit(std::env::var_os("SIPHON_TEST_CUDA_COMPILER")).locate_cuda_compiler();
    let path = match located {
        Ok(choice) => choice.path,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("note: skipped, no CUDA compiler ({e})");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    // SAFETY: the only test of this binary; no other thread reads the environment yet.
    unsafe { std::env::set_var("TF_CPP_MIN_LOG_LEVEL", "2") };
    let plugin = Plugin::load_for_compiling(&path).unwrap();
    let h100 = GpuTargetConfig::find(&path, siphon_plan::GpuModel::H100.device_name()).unwrap();
    let one = Topology::new(&plugin, "h100", &gpu_topology_options(&h100, 1, 1)).unwrap();
    let four = Topology::new(&plugin, "h100x4", &gpu_topology_options(&h100, 1, 4)).unwrap();
    assert!(one.cuda_kernels(), "siphon's grouped products registered for CUDA");

    // The HF fixtures of each family: the GGUF ones, the multimodal wrappers (`-mm`) and the
    // checkpoints whose weights are dequantized on load (`-fp8`, `-mxfp4`) build their text
    // family's program (`tests/cuda_forms.rs` pins their forms).
    let mut families = Vec::new();
    for entry in std::fs::read_dir(common::fixtures()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let variant = ["-mm", "-fp8", "-mxfp4"].iter().any(|s| name.ends_with(s));
        if path.join("config.json").is_file() && !variant {
            families.push(path);
        }
    }
    families.sort();
    // Families side by side: a compile is mostly one thread (ptxas runs as its own process).
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4));
    let fused: usize = std::thread::scope(|scope| {
        let parts: Vec<_> = (0..threads)
            .map(|t| {
                let (families, one, four) = (&families, &one, &four);
                scope.spawn(move || {
                    families.iter().skip(t).step_by(threads).map(|p| check_family(p, one, four)).sum::<usize>()
                })
            })
            .collect();
        parts.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert!(fused > 0, "some block compiled with cuDNN's call");
}

/// Compiles `path`'s family in every [`Variant`] and checks what the compiler kept; returns
/// how many blocks compiled with cuDNN's call.
fn check_family(path: &Path, one: &Topology, four: &Topology) -> usize {
    let mut fused = 0;
    let name = path.strip_prefix(common::fixtures()).unwrap().display().to_string();
    let config = LoadedModel::open(Path::new(path)).unwrap().config;
    let last = vec![HookPoint::block(config.n_layers - 1, HookKind::ResidPost)];
    let grouped_per_block = config.moe.as_ref().map_or(0, |_| 3);
    // XLA's forms, left-padded rows and f32, in one program: each alone holds nothing the
    // other lacks (cuDNN takes neither), and each compile costs seconds.
    let variants = [
        Variant { dtype: DType::Bf16, right_padded: true, mesh: false },
        Variant { dtype: DType::Bf16, right_padded: true, mesh: true },
        Variant { dtype: DType::F32, right_padded: false, mesh: false },
    ];
    for v in variants {
        let what = format!("{name} {v:?}");
        let topology = if v.mesh { four } else { one };
        let aot = compile(topology, &config, &last, v);
        let forms = &aot.program.attention;
        for (layer, form) in forms {
            let want = usize::from(*form == AttentionForm::Cudnn);
            assert_eq!(fused_calls(&aot.instructions, *layer), want, "{what}: block {layer} is {form:?}");
            fused += want;
        }
        let every = forms.iter().filter(|(_, f)| *f == AttentionForm::Cudnn).count();
        let all_calls =
            aot.instructions.iter().filter(|i| i.custom_call_target == siphon_models::cudnn::TARGET).count();
        assert_eq!(all_calls, every, "{what}: no call outside the cuDNN blocks");
        if v.dtype == DType::F32 || !v.right_padded {
            assert_eq!(every, 0, "{what}: XLA's form");
        }
        // Where every block is a softmax attention in cuDNN's form, no scores exist.
        if every > 0 && every == aot.program.n_blocks {
            let scores = score_arrays(&aot.instructions);
            assert!(scores.is_empty(), "{what}: score arrays in the compiled program: {scores:#?}");
        }
        let grouped =
            aot.instructions.iter().filter(|i| i.custom_call_target == siphon_kernels::grouped::TARGET).count();
        let first_dense = config.moe.as_ref().map_or(0, |m| m.first_dense);
        let mixture_blocks = aot.program.n_blocks.saturating_sub(first_dense);
        assert_eq!(grouped, grouped_per_block * mixture_blocks, "{what}: grouped products");
    }
    fused
}
