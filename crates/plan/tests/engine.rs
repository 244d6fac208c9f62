//! The planner's partition specs through the real forward: the tiny fixtures of every family
//! (fixtures/models) run on the CPU plugin's virtual devices with every weight sharded as the
//! planner says — `fsdp` on the hidden dimension, whole heads on `model`, the embedding split
//! by vocabulary over both — and must give the activations of one unsharded device.
//!
//! Needs the plugin from `SIPHON_PJRT_PLUGIN` (scripts/test.sh sets it); without that
//! variable the test prints a note and returns.

mod common;

use siphon_engine::{Batch, Engine, EngineOptions, ShardingPlan};
use siphon_models::{HookKind, HookPoint, LoadedModel};
use siphon_plan::{MeshKind, MeshRequest, MeshShape, PlanRequest, Topology};
use siphon_runtime::Client;

fn activations(
    client: &Client,
    model: &LoadedModel,
    hooks: &[HookPoint],
    batch: &Batch,
    options: EngineOptions,
) -> Vec<Vec<f32>> {
    let engine = Engine::new(client, model, hooks.to_vec(), options).unwrap();
    let acts = engine.run(batch).unwrap();
    hooks.iter().map(|h| acts.get(*h).unwrap().to_f32()).collect()
}

#[test]
fn planned_shardings_give_the_single_device_activations() {
    let Some(client) = common::cpu_client("the planner-through-engine test") else { return };
    let root = common::fixtures();
    // 2 hosts × 4 devices (2d: data=2, fsdp=2, model=2 — 2 KV heads cap model at 2), the same
    // 8 devices as 1 host (2d: fsdp=4, model=2), and 3d with model=1 (fsdp only).
    let cases = [
        (
            (2, 4),
            MeshRequest { kind: MeshKind::TwoD, ..MeshRequest::default() },
            MeshShape { data: 2, fsdp: 2, model: 2 },
        ),
        (
            (1, 8),
            MeshRequest { kind: MeshKind::TwoD, ..MeshRequest::default() },
            MeshShape { data: 1, fsdp: 4, model: 2 },
        ),
        (
            (1, 8),
            MeshRequest { kind: MeshKind::ThreeD, data: Some(2), fsdp: Some(4), model: Some(1) },
            MeshShape { data: 2, fsdp: 4, model: 1 },
        ),
    ];
    // Fused weights (Phi-3's qkv/gate_up, GPT-2's c_attn, GPT-NeoX's per-head qkv) are cut
    // into parts on read, so each part is sharded on whole heads like an unfused weight; the
    // mixtures' stacked experts are split whole over `model`.
    let names = [
        "tiny-qwen2",
        "tiny-llama",
        "tiny-mistral",
        "tiny-qwen3",
        "tiny-gemma2",
        "tiny-gemma3",
        "tiny-phi3",
        "tiny-olmo2",
        "tiny-gpt2",
        "tiny-pythia",
        "tiny-qwen3-moe",
        "tiny-mixtral",
        "tiny-olmo3",
        "tiny-smollm3",
        "tiny-gemma4",
        "tiny-gemma4-moe",
        "tiny-qwen3-5",
        "tiny-qwen3-next",
        "tiny-deepseek-v3",
        "tiny-olmoe",
        "tiny-gpt-oss",
        "tiny-qwen3-5-moe",
    ];
    for name in names {
        let model = LoadedModel::open(&root.join(name)).unwrap();
        let n_layers = model.config.n_layers;
        let kinds = siphon_models::hook_kinds(&model.config);
        // The hybrids' block 0 is linear attention, their block 1 full attention.
        let mixer = match model.config.linear_attention {
            Some(_) => {
                "blocks.0.linear_attn.hook_out,blocks.0.linear_attn.hook_recurrence_out,\
                        blocks.0.linear_attn.hook_k,blocks.1.attn.hook_z,blocks.1.attn.hook_k"
            }
            None => "blocks.0.hook_attn_out,blocks.0.attn.hook_z,blocks.0.attn.hook_k",
        };
        let hooks = siphon_models::resolve_hooks(
            &format!(
                "{mixer},blocks.1.hook_mlp_out,blocks.{}.hook_resid_post,ln_final.hook_out,\
                      blocks.1.attn.hook_pattern,blocks.1.attn.hook_attn_scores,\
                      blocks.0.{},blocks.1.{}",
                n_layers - 1,
                if kinds.contains(&HookKind::Ln2Scale) { "ln2.hook_scale" } else { "ln2_post.hook_scale" },
                if kinds.contains(&HookKind::MlpExpertWeights) { "mlp.hook_expert_weights" } else { "mlp.hook_post" }
            ),
            &model.config,
        )
        .unwrap();
        let vocab = model.config.vocab_size as u32;
        let ids: Vec<Vec<u32>> =
            (0..4u32).map(|r| (0..8u32).map(|t| (r * 37 + t * 11 + 3) % vocab).collect()).collect();
        let batch = Batch::new(ids, None).unwrap();
        let single = activations(
            &client,
            &model,
            &hooks,
            &batch,
            EngineOptions { plan: ShardingPlan::Replicated, ..EngineOptions::default() },
        );
        for ((hosts, per_host), mesh_request, want) in &cases {
            let topology = Topology::uniform(*hosts, *per_host).unwrap();
            let request = PlanRequest { mesh: *mesh_request, batch: Some(4), seq: Some(8), ..PlanRequest::default() };
            let plan = siphon_plan::plan(&model.config, &topology, &request).unwrap();
            // GPT-2 and Pythia have 4 KV heads, so the planner may split them 4 ways; Gemma 4's
            // global layers have 1, so it keeps heads whole with model=1.
            if model.config.kv_head_counts() == [2] {
                assert_eq!(plan.shape, *want, "{name}");
            }
            assert!(plan.fallbacks.is_empty(), "{name}: {:?}", plan.fallbacks);
            let options = common::planned_options(&plan);
            let sharded = activations(&client, &model, &hooks, &batch, options);
            for (hook, (a, b)) in hooks.iter().zip(single.iter().zip(&sharded)) {
                // Masked attention scores (the most negative f32) do not set the scale.
                let scale = a.iter().filter(|x| **x > f32::MIN).fold(0f32, |m, x| m.max(x.abs()));
                let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| {
                    // A NaN counts as infinitely far (`max` would drop it).
                    let e = (x - y).abs();
                    if e.is_nan() { f32::INFINITY } else { m.max(e) }
                });
                assert!(scale > 0.01, "{name} {hook}: activations are trivially small");
                assert!(diff <= 1e-4 * scale.max(1.0), "{name} on {}: {hook} differs by {diff:e}", plan.mesh);
            }
        }
    }
}
