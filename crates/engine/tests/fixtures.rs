//! The engine against HF transformers' golden activations (fixtures/models, written by
//! scripts/gen-fixtures.sh), on the pinned XLA CPU plugin.
//!
//! The plugin path comes from `SIPHON_PJRT_PLUGIN` (scripts/test.sh sets it; locally run
//! scripts/install-plugin.sh), the SmolLM2 GGUF from `SIPHON_SMOLLM2_GGUF`.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::{client, fixture};
use safetensors::SafeTensors;
use siphon_engine::{Activations, Batch, Engine, EngineOptions, ShardingPlan};
use siphon_mesh::{Mesh, PartitionSpec};
use siphon_models::{HookKind, HookPoint, LoadedModel};

struct Golden {
    ids: Vec<Vec<u32>>,
    mask: Vec<Vec<u8>>,
    positions: Vec<i32>,
    acts: Vec<(HookPoint, Vec<usize>, Vec<f32>)>,
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

fn i32s(bytes: &[u8]) -> Vec<i32> {
    bytes.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect()
}

fn golden(path: &Path) -> Golden {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ids_t = st.tensor("input_ids").unwrap();
    let (b, s) = (ids_t.shape()[0], ids_t.shape()[1]);
    let ids = i32s(ids_t.data());
    let ids: Vec<Vec<u32>> = ids.chunks(s).map(|r| r.iter().map(|&t| t as u32).collect()).collect();
    let mask: Vec<Vec<u8>> = match st.tensor("attention_mask") {
        Ok(m) => i32s(m.data()).chunks(s).map(|r| r.iter().map(|&v| v as u8).collect()).collect(),
        Err(_) => vec![vec![1; s]; b],
    };
    let positions = match st.tensor("position_ids") {
        Ok(p) => i32s(p.data()),
        Err(_) => (0..b).flat_map(|_| 0..s as i32).collect(),
    };
    let mut acts = Vec::new();
    for (name, view) in st.tensors() {
        if let Ok(hook) = name.parse::<HookPoint>() {
            acts.push((hook, view.shape().to_vec(), f32s(view.data())));
        }
    }
    acts.sort_by_key(|a| a.0);
    Golden { ids, mask, positions, acts }
}

/// Max |a - b| over positions whose mask is 1, and max |b| there.
fn masked_diff(a: &[f32], b: &[f32], mask: &[Vec<u8>], d: usize) -> (f32, f32) {
    let flat_mask: Vec<u8> = mask.iter().flatten().copied().collect();
    let (mut diff, mut scale) = (0f32, 0f32);
    for (tok, m) in flat_mask.iter().enumerate() {
        if *m == 0 {
            continue;
        }
        for i in tok * d..(tok + 1) * d {
            // A NaN is no distance `max` would keep: it counts as infinitely far.
            let e = (a[i] - b[i]).abs();
            diff = if e.is_nan() { f32::INFINITY } else { diff.max(e) };
            scale = scale.max(b[i].abs());
        }
    }
    (diff, scale)
}

fn run(model: &LoadedModel, hooks: &[HookPoint], batch: &Batch, mesh: Mesh) -> Activations {
    run_with(model, hooks, batch, EngineOptions { mesh, plan: ShardingPlan::Megatron, ..EngineOptions::default() })
}

fn run_with(model: &LoadedModel, hooks: &[HookPoint], batch: &Batch, options: EngineOptions) -> Activations {
    let engine = Engine::new(&client(), model, hooks.to_vec(), options).unwrap();
    engine.run(batch).unwrap()
}

fn check_tiny(name: &str) {
    let model = LoadedModel::open(&fixture(name)).unwrap();
    check_goldens(name, &model, &tiny_goldens(name));
}

fn tiny_goldens(name: &str) -> [(&'static str, std::path::PathBuf); 2] {
    ["right", "left"].map(|side| (side, fixture(name).join(format!("golden-{side}.safetensors"))))
}

fn check_goldens(name: &str, model: &LoadedModel, goldens: &[(&str, std::path::PathBuf)]) {
    check_goldens_with(name, model, goldens, &EngineOptions::default());
}

/// Every golden hook as HF computes it, run with `options`; on a mesh whose `data` axis
/// does not divide the golden batch, copies of the first row fill it up (not compared).
fn check_goldens_with(
    name: &str,
    model: &LoadedModel,
    goldens: &[(&str, std::path::PathBuf)],
    options: &EngineOptions,
) {
    let d = model.config.hidden_size;
    for (side, path) in goldens {
        let g = golden(path);
        let hooks: Vec<HookPoint> = g.acts.iter().map(|a| a.0).collect();
        assert_eq!(hooks.len(), 4 * model.config.n_layers + 1, "every hook point is in the fixture");
        let batch = Batch::new(g.ids.clone(), Some(g.mask.clone())).unwrap();
        assert_eq!(batch.position_ids(), &g.positions[..], "cumsum(mask)-1 positions as HF got");
        let (mut ids, mut mask) = (g.ids.clone(), g.mask.clone());
        while ids.len() % options.mesh.axis_size_or_one("data") != 0 {
            ids.push(g.ids[0].clone());
            mask.push(g.mask[0].clone());
        }
        let batch = Batch::new(ids, Some(mask)).unwrap();
        let acts = run_with(model, &hooks, &batch, options.clone());
        for (hook, shape, want) in &g.acts {
            let got = acts.get(*hook).unwrap();
            assert_eq!(got.shape()[1..], shape[1..], "{name} {side} {hook}");
            let (diff, scale) = masked_diff(&got.to_f32(), want, &g.mask, d);
            assert!(scale > 0.1, "{name} {side} {hook}: golden values are not trivially small");
            // 1e-4 of the hook's scale (absolute below 1): the hybrids' residual streams reach
            // tens after 70 tokens, where f32 summation order alone differs by that much.
            let tolerance = 1e-4 * scale.max(1.0);
            assert!(
                diff <= tolerance,
                "{name} {side} {hook}: max-abs difference {diff:e} > {tolerance:e} (scale {scale})"
            );
        }
    }
}

#[test]
fn tiny_llama_matches_hf_at_every_hook() {
    check_tiny("tiny-llama");
}

#[test]
fn tiny_qwen2_matches_hf_at_every_hook() {
    check_tiny("tiny-qwen2");
}

/// Gemma 2: hook_attn_out / hook_mlp_out after the post-norms, as TransformerLens takes them.
#[test]
fn tiny_gemma2_matches_hf_at_every_hook() {
    check_tiny("tiny-gemma2");
}

/// Gemma 3: local and global layers with their own RoPE bases.
#[test]
fn tiny_gemma3_matches_hf_at_every_hook() {
    check_tiny("tiny-gemma3");
}

/// Qwen3: q/k norms per head, head_dim 24, windows on the later layers.
#[test]
fn tiny_qwen3_matches_hf_at_every_hook() {
    check_tiny("tiny-qwen3");
}

/// Phi-3: fused qkv / gate_up cut on read, window 3, partial rotary, LongRoPE short factors.
#[test]
fn tiny_phi3_matches_hf_at_every_hook() {
    check_tiny("tiny-phi3");
}

/// OLMo 2: post-norms only, q/k norms over the whole projection, gains in f32.
#[test]
fn tiny_olmo2_matches_hf_at_every_hook() {
    check_tiny("tiny-olmo2");
}

/// Gemma 4: per-layer inputs, K == V global layers with wider and fewer heads and
/// proportional RoPE, windowed local layers, layer scalars, the last two layers attending over
/// layers 2 and 3's keys and values (double-wide MLPs there).
#[test]
fn tiny_gemma4_matches_hf_at_every_hook() {
    check_tiny("tiny-gemma4");
}

/// Gemma 4 with the mixture of experts beside every MLP.
#[test]
fn tiny_gemma4_moe_matches_hf_at_every_hook() {
    check_tiny("tiny-gemma4-moe");
}

/// OLMo 3: OLMo 2's block with a window of 3 on layers 0-1 and RoPE per layer type.
#[test]
fn tiny_olmo3_matches_hf_at_every_hook() {
    check_tiny("tiny-olmo3");
}

/// SmolLM3: Llama's block without RoPE on layers 1 and 3, which are windowed (3).
#[test]
fn tiny_smollm3_matches_hf_at_every_hook() {
    check_tiny("tiny-smollm3");
}

/// GPT-2: learned positions, LayerNorm with bias, Conv1D weights transposed on read.
#[test]
fn tiny_gpt2_matches_hf_at_every_hook() {
    check_tiny("tiny-gpt2");
}

/// Pythia (GPT-NeoX): parallel residual, partial rotary, per-head fused qkv, exact GELU.
#[test]
fn tiny_pythia_matches_hf_at_every_hook() {
    check_tiny("tiny-pythia");
}

/// Qwen3-MoE: four experts, two per token, routing weights not renormalised.
#[test]
fn tiny_qwen3_moe_matches_hf_at_every_hook() {
    check_tiny("tiny-qwen3-moe");
}

/// Mixtral: four experts, two per token, renormalised; a window of 3.
#[test]
fn tiny_mixtral_matches_hf_at_every_hook() {
    check_tiny("tiny-mixtral");
}

/// GPT-OSS: sinks, q/k/v/o biases, windows on every other layer, YaRN, and experts with
/// biases and a clamped SwiGLU (read from transformers' fused, transposed tensors).
#[test]
fn tiny_gpt_oss_matches_hf_at_every_hook() {
    check_tiny("tiny-gpt-oss");
}

/// GPT-OSS with MXFP4 experts as the hub stores them, HF's goldens from transformers loading
/// that directory.
#[test]
fn tiny_gpt_oss_mxfp4_matches_hf_at_every_hook() {
    check_tiny("tiny-gpt-oss-mxfp4");
}

/// OLMoE: Llama's block with whole-projection q/k norms and four experts, two per token.
#[test]
fn tiny_olmoe_matches_hf_at_every_hook() {
    check_tiny("tiny-olmoe");
}

/// The routed dispatch on one device through XLA's expert loop whatever its chunk — one row
/// per product (as many products as the longest queue), five — and through siphon's CPU
/// kernel (the other tests' default on the CPU), and on a 2×4 mesh (whole experts over
/// `model`, tokens over `data`), in one round or in rounds of two rows per expert: HF's values
/// each time. With them the routing's edge cases: every logit tied, so that every token
/// chooses the same two experts and no token the other two (`tiny-moe-tied`), and top-k =
/// every expert (`tiny-moe-all`).
#[test]
fn mixtures_match_hf_at_any_capacity_and_on_a_mesh() {
    let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
    for name in [
        "tiny-qwen3-moe",
        "tiny-mixtral",
        "tiny-gemma4-moe",
        "tiny-olmoe",
        "tiny-moe-tied",
        "tiny-moe-all",
        "tiny-gpt-oss",
    ] {
        let model = LoadedModel::open(&fixture(name)).unwrap();
        for capacity in [1, 5] {
            let options =
                EngineOptions { expert_capacity: Some(capacity), cpu_kernels: false, ..EngineOptions::default() };
            check_goldens_with(&format!("{name} at capacity {capacity}"), &model, &tiny_goldens(name), &options);
        }
        check_goldens_with(
            &format!("{name} on the CPU kernel"),
            &model,
            &tiny_goldens(name),
            &EngineOptions::default(),
        );
        for capacity in [None, Some(2)] {
            let options = EngineOptions { mesh: mesh.clone(), expert_capacity: capacity, ..EngineOptions::default() };
            check_goldens_with(&format!("{name} on 2x4 at {capacity:?}"), &model, &tiny_goldens(name), &options);
        }
    }
}

/// Every mixture fixture: biases and GPT-OSS's clamped SwiGLU, tied routing, top-k = every
/// expert, the hybrids' mixtures, DeepSeek-V3's shared experts and groups.
const MIXTURES: [&str; 10] = [
    "tiny-qwen3-moe",
    "tiny-mixtral",
    "tiny-gemma4-moe",
    "tiny-olmoe",
    "tiny-moe-tied",
    "tiny-moe-all",
    "tiny-gpt-oss",
    "tiny-qwen3-5-moe",
    "tiny-qwen3-next",
    "tiny-deepseek-v3",
];

/// The grouped form a CUDA plugin runs (`siphon_kernels::grouped`, cuBLAS's grouped products
/// there), on the CPU plugin's plain loop over the same product descriptors: each mixture's
/// goldens in f32 (biases and GPT-OSS's clamped SwiGLU, tied routing, top-k = every expert,
/// DeepSeek-V3's shared experts and groups) on one device, on a 2 × 4 mesh (each device its
/// tokens through the experts it holds: experts over `model`) and on 8 devices of `model`
/// alone (every device all tokens), and in bf16 within twice the distance of XLA's own bf16
/// expert loop from HF's f32 (or 2% of the hook's scale).
#[test]
fn mixtures_as_grouped_products_match_hf() {
    let grouped = EngineOptions { grouped_experts: true, ..EngineOptions::default() };
    let meshes = [
        Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap(),
        Mesh::new(&[("model", 8)], (0..8).collect()).unwrap(),
    ];
    for name in MIXTURES {
        let model = LoadedModel::open(&fixture(name)).unwrap();
        check_goldens_with(&format!("{name} as grouped products"), &model, &tiny_goldens(name), &grouped);
        for mesh in &meshes {
            let options = EngineOptions { mesh: mesh.clone(), ..grouped.clone() };
            check_goldens_with(&format!("{name} as grouped products on {mesh}"), &model, &tiny_goldens(name), &options);
        }
        let grouped = |o: EngineOptions| EngineOptions { grouped_experts: true, ..o };
        check_bf16_envelope(&format!("{name} as grouped products"), &model, grouped);
    }
}

/// The hybrids (Gated DeltaNet and gated full attention, rows past one chunk of the
/// recurrence and not a multiple of it, padded on either side), on one device and on a 2×4
/// mesh (heads over `model`, rows over `data`): HF's values.
#[test]
fn hybrids_match_hf_on_one_device_and_a_mesh() {
    let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
    for name in ["tiny-qwen3-5", "tiny-qwen3-5-moe", "tiny-qwen3-next"] {
        let model = LoadedModel::open(&fixture(name)).unwrap();
        check_goldens(name, &model, &tiny_goldens(name));
        let options = EngineOptions { mesh: mesh.clone(), ..EngineOptions::default() };
        check_goldens_with(&format!("{name} on 2x4"), &model, &tiny_goldens(name), &options);
    }
}

/// DeepSeek-V3's block (latent attention with and without q-LoRA, interleaved and
/// rotate-half RoPE, YaRN's softmax scale; a dense first block, then experts chosen within
/// groups by score plus correction bias, and shared experts), on one device and on a 2×4 mesh
/// (heads and experts over `model`): HF's values.
#[test]
fn deepseek_v3_matches_hf_on_one_device_and_a_mesh() {
    let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
    for name in ["tiny-deepseek-v3", "tiny-deepseek-v3-noqlora"] {
        let model = LoadedModel::open(&fixture(name)).unwrap();
        check_goldens(name, &model, &tiny_goldens(name));
        let options = EngineOptions { mesh: mesh.clone(), ..EngineOptions::default() };
        check_goldens_with(&format!("{name} on 2x4"), &model, &tiny_goldens(name), &options);
    }
}

/// DeepSeek-V3's projections stored FP8 as its checkpoints store them (partial blocks at the
/// edges): the HF model over transformers' dequantized values.
#[test]
fn tiny_deepseek_v3_fp8_matches_hf_at_every_hook() {
    check_tiny("tiny-deepseek-v3-fp8");
}

/// Qwen3's projections stored FP8 block-scaled (`quantization_config` `fp8`), dequantized on
/// read: transformers' values from the same checkpoint.
#[test]
fn tiny_qwen3_fp8_matches_hf_at_every_hook() {
    check_tiny("tiny-qwen3-fp8");
}

/// The text tower of a multimodal Qwen3.5 checkpoint (weights under `model.language_model.`).
#[test]
fn tiny_qwen3_5_multimodal_matches_hf_at_every_hook() {
    check_tiny("tiny-qwen3-5-mm");
}

/// The text tower of a multimodal Gemma 4 checkpoint (weights under `model.language_model.`).
#[test]
fn tiny_gemma4_multimodal_matches_hf_at_every_hook() {
    check_tiny("tiny-gemma4-mm");
}

/// The text tower of a multimodal Gemma 3 checkpoint (weights under `language_model.model.`).
#[test]
fn tiny_gemma3_multimodal_matches_hf_at_every_hook() {
    check_tiny("tiny-gemma3-mm");
}

/// Mistral with a sliding window (3) shorter than the rows: HF's windowed mask, honoured.
#[test]
fn tiny_mistral_matches_hf_at_every_hook() {
    check_tiny("tiny-mistral");
    // The fixture exercises the window: without it the activations are far from HF's.
    let mut model = LoadedModel::open(&fixture("tiny-mistral")).unwrap();
    assert_eq!(model.config.layers.windows(), vec![Some(3); 3]);
    model.config.layers = model.config.layers.with(3, |_, spec| spec.window = None);
    let g = golden(&fixture("tiny-mistral/golden-right.safetensors"));
    let hook = HookPoint::model(HookKind::LnFinalOut);
    let batch = Batch::new(g.ids.clone(), Some(g.mask.clone())).unwrap();
    let acts = run(&model, &[hook], &batch, Mesh::single_device());
    let want = &g.acts.iter().find(|a| a.0 == hook).unwrap().2;
    let (diff, _) = masked_diff(&acts.get(hook).unwrap().to_f32(), want, &g.mask, model.config.hidden_size);
    assert!(diff > 0.1, "without its window the model should differ from HF, by {diff}");
}

/// GGUF files written as llama.cpp's converter writes each architecture (by
/// scripts/fixtures/gen_fixtures.py, which checks with transformers' own GGUF reader where it
/// has one), read back and run: every golden hook as HF computes it from the same weights.
#[test]
fn gguf_of_every_family_matches_hf() {
    for arch in ["qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "olmo2", "gpt2", "gptneox", "mixtral"] {
        let dir = fixture("gguf");
        let model = LoadedModel::open(&dir.join(format!("tiny-{arch}.gguf"))).unwrap();
        let golden = dir.join(format!("tiny-{arch}.golden.safetensors"));
        check_goldens(&format!("tiny-{arch}.gguf"), &model, &[("right", golden)]);
    }
}

#[test]
fn mesh_2x4_equals_single_device() {
    let model = LoadedModel::open(&fixture("tiny-qwen2")).unwrap();
    let g = golden(&fixture("tiny-qwen2/golden-left.safetensors"));
    // 4 rows so the batch splits over data=2: the left-padded rows plus a full one.
    let mut ids = g.ids.clone();
    let mut mask = g.mask.clone();
    ids.push(g.ids[0].iter().rev().copied().collect());
    mask.push(vec![1; ids[0].len()]);
    let batch = Batch::new(ids, Some(mask.clone())).unwrap();
    let hooks = siphon_models::resolve_hooks(
        "blocks.0.hook_attn_out,blocks.1.hook_mlp_out,blocks.2.hook_resid_post,ln_final.hook_out",
        &model.config,
    )
    .unwrap();
    let single = run(&model, &hooks, &batch, Mesh::single_device());
    let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
    let sharded = run(&model, &hooks, &batch, mesh);
    for hook in &hooks {
        let (a, b) = (single.get(*hook).unwrap().to_f32(), sharded.get(*hook).unwrap().to_f32());
        let (diff, _) = masked_diff(&a, &b, &mask, model.config.hidden_size);
        assert!(diff <= 1e-5, "{hook}: 2x4 mesh differs from one device by {diff:e}");
    }
}

#[test]
fn smollm2_gguf_matches_hf() {
    let Some(path) = std::env::var_os("SIPHON_SMOLLM2_GGUF") else {
        eprintln!("note: SIPHON_SMOLLM2_GGUF unset (scripts/setup-model.sh); skipping");
        return;
    };
    let model = LoadedModel::open(Path::new(&path)).unwrap();
    let g = golden(&fixture("smollm2/golden.safetensors"));
    let hooks: Vec<HookPoint> = g.acts.iter().map(|a| a.0).collect();
    let batch = Batch::new(g.ids.clone(), None).unwrap();
    let acts = run(&model, &hooks, &batch, Mesh::single_device());
    for (hook, _, want) in &g.acts {
        let got = acts.get(*hook).unwrap().to_f32();
        let (diff, scale) = masked_diff(&got, want, &g.mask, model.config.hidden_size);
        assert!(diff <= 1e-3 * scale, "{hook}: max-abs difference {diff:e} exceeds 1e-3 of max |x| {scale:e}");
        // SmolLM2 has a few huge residual dimensions; also bound the error relative to the
        // whole activation's norm, which the ordinary dimensions dominate less.
        let err: f64 = got.iter().zip(want).map(|(a, b)| f64::from(a - b).powi(2)).sum::<f64>().sqrt();
        let norm: f64 = want.iter().map(|b| f64::from(*b).powi(2)).sum::<f64>().sqrt();
        eprintln!("{hook}: max-abs {diff:e} (max |x| {scale:e}), relative L2 {:e}", err / norm);
        assert!(err <= 1e-4 * norm, "{hook}: relative L2 error {:e} > 1e-4", err / norm);
    }
}

#[test]
fn bad_batches_are_clear_errors() {
    let err = Batch::new(vec![vec![1, 2], vec![3]], None).unwrap_err();
    assert!(err.to_string().contains("row 1 has 1 tokens"), "{err}");
    let err = Batch::new(vec![vec![1, 2]], Some(vec![vec![1]])).unwrap_err();
    assert!(err.to_string().contains("mask"), "{err}");
    let model = LoadedModel::open(&fixture("tiny-llama")).unwrap();
    let engine =
        Engine::new(&client(), &model, vec![HookPoint::block(0, HookKind::ResidPost)], EngineOptions::default())
            .unwrap();
    let err = engine.run(&Batch::new(vec![vec![1, 999]], None).unwrap()).unwrap_err();
    assert!(err.to_string().contains("999"), "{err}");
}

#[test]
fn bf16_compute_and_outputs_stay_close_and_shapes_compile_once() {
    let model = LoadedModel::open(&fixture("tiny-llama")).unwrap();
    let g = golden(&fixture("tiny-llama/golden-right.safetensors"));
    let hooks = vec![HookPoint::block(1, HookKind::ResidPost), HookPoint::model(HookKind::LnFinalOut)];
    let options = EngineOptions {
        compute_dtype: siphon_models::DType::Bf16,
        output_dtype: siphon_models::DType::Bf16,
        ..EngineOptions::default()
    };
    let engine = Engine::new(&client(), &model, hooks.clone(), options).unwrap();
    let batch = Batch::new(g.ids.clone(), Some(g.mask.clone())).unwrap();
    let acts = engine.run(&batch).unwrap();
    for hook in &hooks {
        let got = acts.get(*hook).unwrap();
        assert_eq!(got.element_type(), siphon_runtime::ElementType::BF16);
        let want = &g.acts.iter().find(|a| a.0 == *hook).unwrap().2;
        let (diff, scale) = masked_diff(&got.to_f32(), want, &g.mask, model.config.hidden_size);
        // bf16 keeps 8 significant bits; three blocks of bf16 matmuls stay within a few %.
        assert!(diff <= 0.05 * scale, "{hook}: bf16 differs by {diff:e} (scale {scale:e})");
    }
    // A second batch of the same shape reuses the compiled program and gives the same bits.
    let again = engine.run(&batch).unwrap();
    assert_eq!(
        again.get(HookPoint::model(HookKind::LnFinalOut)).unwrap(),
        acts.get(HookPoint::model(HookKind::LnFinalOut)).unwrap()
    );
    // A new shape compiles on demand.
    let short = Batch::new(vec![g.ids[0][..4].to_vec()], None).unwrap();
    assert_eq!(engine.run(&short).unwrap().get(HookPoint::model(HookKind::LnFinalOut)).unwrap().shape(), &[1, 4, 64]);
}

/// Weights kept quantized on the devices (`WeightForm::Stored`) and dequantized inside the
/// program give every hook bit for bit what dequantize-on-load gives, in f32 on one device and
/// on a 2×4 mesh: DeepSeek-V3's FP8 blocks (partial ones included), GPT-OSS's MXFP4 experts,
/// a GGUF Mixtral in Q4_1 (attention), Q4_0 (experts) and Q8_0 (the rest), its q/k rows
/// permuted on read, and a GGUF Llama in Q4_K and Q6_K; and so with the TPU's forms (FP8 by
/// conversion; mixtures as grouped products, bit for bit the same with the weights stored or
/// not).
#[test]
fn weights_kept_stored_give_dequantize_on_load_bit_for_bit() {
    use siphon_engine::WeightForm;
    let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
    for (name, path, kept) in [
        // Per block 5 attention projections and 3 MLP ones, plus 3 shared experts' after the
        // dense first block.
        ("tiny-deepseek-v3-fp8", fixture("tiny-deepseek-v3-fp8"), 8 * 3 + 3 * 2),
        // GPT-OSS's MXFP4 experts, gate and up cut from their interleaved rows, in 4 blocks.
        ("tiny-gpt-oss-mxfp4", fixture("tiny-gpt-oss-mxfp4"), 3 * 4),
        // The embedding, and per block 4 attention projections and 3 experts (the router is
        // read as a part of its stored tensor, which is dequantized on load).
        ("tiny-mixtral-q", fixture("gguf/tiny-mixtral-q.gguf"), 1 + 7 * 2),
        // Rows of 256: attention in Q4_K, the MLP in Q6_K, the embedding in Q8_0.
        ("tiny-llama-k", fixture("gguf/tiny-llama-k.gguf"), 1 + 4 + 3),
    ] {
        let model = LoadedModel::open(&path).unwrap();
        let hooks = siphon_models::resolve_hooks("hook_embed,blocks.*.*,ln_final.hook_out", &model.config).unwrap();
        let golden = golden(&fixture("tiny-deepseek-v3-fp8").join("golden-left.safetensors"));
        let ids: Vec<Vec<u32>> = golden.ids.iter().map(|r| r.iter().map(|&t| t % 256).collect()).collect();
        let ids = [ids.clone(), ids[..1].to_vec()].concat(); // 4 rows, for data = 2
        let mask = [golden.mask.clone(), golden.mask[..1].to_vec()].concat();
        let batch = Batch::new(ids, Some(mask)).unwrap();
        for mesh in [Mesh::single_device(), mesh.clone()] {
            let run = |weights, tpu_forms| {
                let options = EngineOptions { mesh: mesh.clone(), weights, tpu_forms, ..EngineOptions::default() };
                let engine = Engine::new(&client(), &model, hooks.clone(), options).unwrap();
                (engine.stored_weights().len(), engine.run(&batch).unwrap())
            };
            let (none, plain) = run(WeightForm::Dequantized, None);
            let (stored, kept_stored) = run(WeightForm::Stored, None);
            // The TPU's decode (FP8 by conversion, not by table): the same bits.
            let (_, tpu_stored) = run(WeightForm::Stored, Some(true));
            let (_, tpu_plain) = run(WeightForm::Dequantized, Some(true));
            // On the mesh the weights whose head split would cut a block (DeepSeek's q_b_proj:
            // 20 rows per head in 16-row blocks) are dequantized on load instead.
            assert_eq!(none, 0);
            assert!(stored == kept || (mesh.num_devices() > 1 && stored > 0 && stored < kept), "{name}: {stored} kept");
            for &hook in &hooks {
                let (a, b) = (plain.get(hook).unwrap(), kept_stored.get(hook).unwrap());
                assert!(a.bytes() == b.bytes(), "{name} on {:?}: {hook} differs", mesh.axes());
                let (a, b) = (tpu_plain.get(hook).unwrap(), tpu_stored.get(hook).unwrap());
                assert!(a.bytes() == b.bytes(), "{name} on {:?}, TPU forms: {hook} differs", mesh.axes());
                assert!(a.to_f32().iter().all(|v| v.is_finite()), "{name}: {hook} is not finite");
            }
        }
    }
}

/// Every family with a right-padded golden, in bf16, with `right_padded` on against off: on a
/// CUDA plugin the blocks that can take cuDNN's fused attention run it when on
/// (`scripts/bench-gpu.sh fixtures` runs this there), and the final norm's output must stay
/// within bf16's own envelope, twice what XLA's bf16 form differs from HF's f32 values (or 2%
/// of the scale); elsewhere both run XLA's form and give the same bits (checked on three
/// families, to keep the CPU suite short).
#[test]
fn bf16_right_padded_goldens_of_every_family() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| root.join(n).join("golden-right.safetensors").is_file())
        .collect();
    names.sort();
    let cuda = client().platform_name() == "cuda";
    if !cuda {
        names.retain(|n| ["tiny-llama", "tiny-gemma3", "tiny-qwen3-next"].contains(&n.as_str()));
    }
    let mut report = Vec::new();
    for name in names {
        let model = LoadedModel::open(&fixture(&name)).unwrap();
        let g = golden(&fixture(&name).join("golden-right.safetensors"));
        let hook = HookPoint::model(HookKind::LnFinalOut);
        let Some(want) = g.acts.iter().find(|a| a.0 == hook).map(|a| &a.2) else { continue };
        let batch = Batch::new(g.ids.clone(), Some(g.mask.clone())).unwrap();
        let run = |right_padded| {
            let options = EngineOptions {
                compute_dtype: siphon_models::DType::Bf16,
                output_dtype: siphon_models::DType::Bf16,
                right_padded,
                ..EngineOptions::default()
            };
            let engine = Engine::new(&client(), &model, vec![hook], options).unwrap();
            engine.run(&batch).unwrap().get(hook).unwrap().to_f32()
        };
        let (xla, fused) = (run(false), run(true));
        let d = model.config.hidden_size;
        let ((xla_diff, scale), (fused_diff, _)) =
            (masked_diff(&xla, want, &g.mask, d), masked_diff(&fused, want, &g.mask, d));
        report.push(format!("{name} {:.4}/{:.4}", xla_diff / scale, fused_diff / scale));
        if !cuda {
            assert!(xla == fused, "{name}: right_padded changed a program without cuDNN");
        }
        let envelope = (2.0 * xla_diff).max(0.02 * scale);
        assert!(
            fused_diff <= envelope,
            "{name}: {fused_diff:e} from HF, XLA's bf16 form {xla_diff:e} (scale {scale:e})"
        );
    }
    eprintln!("bf16 against HF's f32, max-abs / scale, XLA's form / right-padded: {}", report.join(", "));
}

/// The form a TPU program takes (`chlo.ragged_dot`, no loop), on the CPU plugin: each
/// mixture's goldens in f32 on one device; on a 2 × 4 mesh with the experts split whole over
/// `model` (the default rule: each device its tokens through the experts it holds) and, on a
/// 2 × 2 × 2 mesh, with every expert's width split over `model` and its hidden dimension over
/// `fsdp` (the TPU rule, `ExpertSplit::Width`: each device its share of the routed rows
/// through its columns); and in bf16 within twice the distance of XLA's own
/// bf16 expert loop from HF's f32 (or 2% of the hook's scale).
#[test]
fn mixtures_as_ragged_dots_match_hf() {
    let ragged = EngineOptions { tpu_forms: Some(true), cpu_kernels: false, ..EngineOptions::default() };
    let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
    let mesh3 = Mesh::new(&[("data", 2), ("fsdp", 2), ("model", 2)], (0..8).collect()).unwrap();
    for name in MIXTURES {
        let model = LoadedModel::open(&fixture(name)).unwrap();
        let goldens = tiny_goldens(name);
        check_goldens_with(&format!("{name} as ragged dots"), &model, &goldens, &ragged);
        let by_experts = EngineOptions { mesh: mesh.clone(), ..ragged.clone() };
        check_goldens_with(&format!("{name} as ragged dots, experts over {mesh}"), &model, &goldens, &by_experts);
        let (params, input) = width_split(&model.config, &mesh3);
        let width = ShardingPlan::Explicit { params, input: Some(input) };
        let by_width = EngineOptions { plan: width, mesh: mesh3.clone(), ..by_experts };
        check_goldens_with(&format!("{name} as ragged dots, widths over {mesh3}"), &model, &goldens, &by_width);

        let tpu = |o: EngineOptions| EngineOptions { tpu_forms: Some(true), ..o };
        check_bf16_envelope(&format!("{name} as ragged dots"), &model, tpu);
    }
}

/// A TPU program's per-head q/k norms, reduced in place over `[tokens, heads, head_dim]`
/// (`ForwardSpec::norm_heads_in_place`, one of the TPU forms): every dense family that has
/// them equals HF's goldens in f32 on one device and on a 2 × 4 mesh (heads over `model`).
/// The mixtures' are checked with their experts above.
#[test]
fn per_head_norms_in_place_match_hf() {
    let tpu = EngineOptions { tpu_forms: Some(true), ..EngineOptions::default() };
    let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
    for name in ["tiny-qwen3", "tiny-gemma3", "tiny-gemma4", "tiny-qwen3-5"] {
        let model = LoadedModel::open(&fixture(name)).unwrap();
        let attention = &model.config.attention;
        assert!(attention.qk_norm && !attention.qk_norm_whole, "{name} has no per-head norms");
        check_goldens_with(&format!("{name}, norms in place"), &model, &tiny_goldens(name), &tpu);
        let on_mesh = EngineOptions { mesh: mesh.clone(), ..tpu.clone() };
        check_goldens_with(&format!("{name}, norms in place on {mesh}"), &model, &tiny_goldens(name), &on_mesh);
    }
}

/// `model`'s final norm output in bf16 with its experts in the form `form` gives, within twice
/// the distance of XLA's own bf16 expert loop from HF's f32 goldens (or 2% of the hook's
/// scale); models without a right-padded golden of that hook are passed over.
fn check_bf16_envelope(what: &str, model: &LoadedModel, form: impl Fn(EngineOptions) -> EngineOptions) {
    let g = golden(&model.path.join("golden-right.safetensors"));
    let batch = Batch::new(g.ids.clone(), Some(g.mask.clone())).unwrap();
    let hook = HookPoint::model(HookKind::LnFinalOut);
    let Some(want) = g.acts.iter().find(|a| a.0 == hook).map(|a| a.2.clone()) else { return };
    let bf16 = |options: EngineOptions| {
        let engine = Engine::new(&client(), model, vec![hook], options).unwrap();
        engine.run(&batch).unwrap().get(hook).unwrap().to_f32()
    };
    let loop_form = EngineOptions {
        compute_dtype: siphon_models::DType::Bf16,
        output_dtype: siphon_models::DType::F32,
        cpu_kernels: false,
        ..EngineOptions::default()
    };
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let dist = |got: &[f32]| {
        got.iter().zip(&want).fold(0f32, |m, (a, b)| {
            // A NaN counts as infinitely far (`max` would drop it).
            let e = (a - b).abs();
            if e.is_nan() { f32::INFINITY } else { m.max(e) }
        })
    };
    let (xla, other) = (dist(&bf16(loop_form.clone())), dist(&bf16(form(loop_form))));
    assert!(
        other <= (2.0 * xla).max(0.02 * scale),
        "{what} in bf16: {other} from HF's f32, XLA's loop {xla} (scale {scale})"
    );
}

/// The fixed plan's specs with the weights the TPU rule splits its own way split so
/// (`siphon_models::sharding::rule_for`, `ExpertSplit::Width`): every stacked expert
/// projection's width over `model` and its hidden dimension over `fsdp`; the router and MLA's
/// latents by their outputs over `model` (where the mesh's axes divide them).
fn width_split(config: &siphon_models::ModelConfig, mesh: &Mesh) -> (HashMap<String, PartitionSpec>, PartitionSpec) {
    use siphon_models::sharding::{ExpertSplit, rule_for};
    let (mut specs, input) = siphon_models::sharding::megatron_specs(config, mesh);
    for p in config.params(config.n_layers, true) {
        let rule = rule_for(p.class, ExpertSplit::Width);
        if rule != siphon_models::sharding::rule(p.class) {
            let parts = |axes: &[&str]| axes.iter().map(|a| mesh.axis_size_or_one(a)).product::<usize>();
            let dims: Vec<&[&str]> = rule
                .iter()
                .zip(&p.shape)
                .map(|(d, &n)| if n % parts(d.planned) == 0 { d.planned } else { &[] })
                .collect();
            specs.insert(p.name, PartitionSpec::new(&dims));
        }
    }
    (specs, input)
}

/// Every family's fixture but the stored-weight variants.
const ISOLATED: &[&str] = &[
    "tiny-llama",
    "tiny-qwen2",
    "tiny-mistral",
    "tiny-gemma2",
    "tiny-gemma3",
    "tiny-gemma3-mm",
    "tiny-qwen3",
    "tiny-phi3",
    "tiny-olmo2",
    "tiny-olmo3",
    "tiny-smollm3",
    "tiny-gpt2",
    "tiny-pythia",
    "tiny-qwen3-moe",
    "tiny-mixtral",
    "tiny-olmoe",
    "tiny-gpt-oss",
    "tiny-gemma4",
    "tiny-gemma4-mm",
    "tiny-gemma4-moe",
    "tiny-deepseek-v3",
    "tiny-qwen3-5",
    "tiny-qwen3-5-moe",
    "tiny-qwen3-next",
];

/// Isolated documents: the real tokens of each row of a family's right-padded golden (HF's
/// run of that document alone) packed one after another into one row (a hybrid's four times
/// over), positions restarting
/// at each, three padding tokens after the last; every hook of every document is HF's of it
/// alone (1e-4 of the hook's scale, as the goldens). On `mesh`, the packed row fills the
/// `data` axis.
fn check_isolated(name: &str, mesh: Mesh) {
    let dir = fixture(name);
    let model = LoadedModel::open(&dir).unwrap();
    let g = golden(&dir.join("golden-right.safetensors"));
    let (mut row, mut positions, mut spans) = (Vec::new(), Vec::new(), Vec::new());
    // A hybrid's documents four times over: a row of several chunks of Gated DeltaNet's
    // recurrence, documents across their boundaries.
    let copies = if model.config.linear_attention.is_some() { 4 } else { 1 };
    for _ in 0..copies {
        for (doc, (ids, mask)) in g.ids.iter().zip(&g.mask).enumerate() {
            let n = mask.iter().filter(|&&m| m != 0).count();
            spans.push((doc, row.len(), n));
            row.extend_from_slice(&ids[..n]);
            positions.extend(0..n as i32);
        }
    }
    let real = row.len();
    row.extend([0; 3]);
    positions.extend([0; 3]);
    let mask: Vec<u8> = (0..row.len()).map(|i| u8::from(i < real)).collect();
    let rows = mesh.axis_size_or_one("data");
    let batch = Batch::new(vec![row.clone(); rows], Some(vec![mask; rows]))
        .unwrap()
        .with_position_ids(positions.repeat(rows))
        .unwrap();
    let hooks: Vec<HookPoint> = g.acts.iter().map(|a| a.0).collect();
    let options = EngineOptions { mesh, plan: ShardingPlan::Megatron, isolated: true, ..EngineOptions::default() };
    let acts = run_with(&model, &hooks, &batch, options);
    for (hook, shape, want) in &g.acts {
        let width: usize = shape[2..].iter().product();
        let got = acts.get(*hook).unwrap().to_f32();
        let (mut diff, mut scale) = (0f32, 0f32);
        for &(doc, start, n) in &spans {
            for t in 0..n {
                let (a, b) = ((start + t) * width, (doc * shape[1] + t) * width);
                for (x, y) in got[a..a + width].iter().zip(&want[b..b + width]) {
                    let e = (x - y).abs();
                    diff = if e.is_nan() { f32::INFINITY } else { diff.max(e) };
                    scale = scale.max(y.abs());
                }
            }
        }
        let tolerance = 1e-4 * scale.max(1.0);
        assert!(diff <= tolerance, "{name} isolated {hook}: max-abs difference {diff:e} > {tolerance:e}");
    }
}

#[test]
fn isolated_documents_in_one_row_equal_hf_on_each_alone() {
    for name in ISOLATED {
        check_isolated(name, Mesh::single_device());
    }
}

#[test]
fn isolated_documents_equal_hf_on_each_alone_on_a_2x4_mesh() {
    let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
    for name in
        ["tiny-llama", "tiny-gemma2", "tiny-gemma3", "tiny-gpt-oss", "tiny-deepseek-v3", "tiny-gpt2", "tiny-qwen3-next"]
    {
        check_isolated(name, mesh.clone());
    }
}

/// Chosen rows (`Batch::with_selection`): for each document packed into the row (as
/// [`check_isolated`] packs them, or one document a row, right-padded), three rows — its last token, the mean of its tokens, its middle token —
/// equal HF's values of that document alone taken or averaged in f64 (1e-5 of the hook's
/// scale), on one device and on a 2 × 4 mesh.
#[test]
fn chosen_rows_equal_hf_taken_or_averaged_in_f64() {
    for name in ISOLATED {
        check_chosen(name, Mesh::single_device(), true);
    }
    // One document a row, padded, too.
    for name in ["tiny-qwen3-next", "tiny-llama"] {
        check_chosen(name, Mesh::single_device(), false);
    }
    let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
    for name in ["tiny-llama", "tiny-gemma3", "tiny-deepseek-v3"] {
        check_chosen(name, mesh.clone(), true);
    }
    check_chosen("tiny-qwen3-next", mesh, false);
}

fn check_chosen(name: &str, mesh: Mesh, isolated: bool) {
    let dir = fixture(name);
    let model = LoadedModel::open(&dir).unwrap();
    let g = golden(&dir.join("golden-right.safetensors"));
    let lengths: Vec<usize> = g.mask.iter().map(|m| m.iter().filter(|&&m| m != 0).count()).collect();
    // Rows of the batch and, per row, its documents as (golden document, start in the row).
    type Placed = Vec<Vec<(usize, usize)>>;
    let (rows, seq, docs): (Vec<Vec<u32>>, usize, Placed) = match isolated {
        true => {
            let mut row = Vec::new();
            let mut docs = Vec::new();
            for (d, ids) in g.ids.iter().enumerate() {
                docs.push((d, row.len()));
                row.extend_from_slice(&ids[..lengths[d]]);
            }
            row.extend([0; 3]);
            (vec![row.clone()], row.len(), vec![docs])
        }
        false => (g.ids.clone(), g.ids[0].len(), (0..g.ids.len()).map(|d| vec![(d, 0)]).collect()),
    };
    let copies = mesh.axis_size_or_one("data").max(1);
    let per_row = docs.iter().map(Vec::len).max().unwrap() * 3;
    let (mut ids, mut masks, mut positions, mut weights) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut chosen = Vec::new();
    for _ in 0..copies {
        for (row, row_docs) in rows.iter().zip(&docs) {
            let mut mask = vec![0u8; seq];
            let mut position = vec![0i32; seq];
            let mut w = vec![0f32; per_row * seq];
            let mut r = 0;
            let mut row_chosen = Vec::new();
            for &(d, start) in row_docs {
                let n = lengths[d];
                for t in 0..n {
                    mask[start + t] = 1;
                    position[start + t] = t as i32;
                }
                for (which, tokens) in [("last", n - 1..n), ("mean", 0..n), ("middle", n / 2..n / 2 + 1)] {
                    for t in tokens.clone() {
                        w[r * seq + start + t] = 1.0 / tokens.len() as f32;
                    }
                    row_chosen.push((which, d, tokens));
                    r += 1;
                }
            }
            ids.push(row.clone());
            masks.push(mask);
            positions.extend(position);
            weights.extend(w);
            chosen.push(row_chosen);
        }
    }
    let mut batch = Batch::new(ids, Some(masks)).unwrap();
    if isolated {
        batch = batch.with_position_ids(positions).unwrap();
    }
    let batch = batch.with_selection(per_row, weights).unwrap();
    let hooks: Vec<HookPoint> = g.acts.iter().map(|a| a.0).collect();
    let options = EngineOptions { mesh, plan: ShardingPlan::Megatron, isolated, ..EngineOptions::default() };
    let acts = run_with(&model, &hooks, &batch, options);
    for (hook, shape, want) in &g.acts {
        let width: usize = shape[2..].iter().product();
        let array = acts.get(*hook).unwrap();
        assert_eq!(array.shape()[..2], [chosen.len(), per_row], "{name} {hook}");
        let got = array.to_f32();
        let (mut diff, mut scale) = (0f64, 0f64);
        for (row, row_chosen) in chosen.iter().enumerate() {
            for (r, (_, d, tokens)) in row_chosen.iter().enumerate() {
                for k in 0..width {
                    let values = tokens.clone().map(|t| f64::from(want[(d * shape[1] + t) * width + k]));
                    let reference = values.sum::<f64>() / tokens.len() as f64;
                    let x = f64::from(got[(row * per_row + r) * width + k]);
                    let e = (x - reference).abs();
                    diff = if e.is_nan() { f64::INFINITY } else { diff.max(e) };
                    scale = scale.max(reference.abs());
                }
            }
        }
        let tolerance = 1e-5 * scale.max(1.0);
        assert!(diff <= tolerance, "{name} chosen rows of {hook}: max-abs difference {diff:e} > {tolerance:e}");
    }
}
