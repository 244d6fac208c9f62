//! A mesh spanning hosts, verified without the hosts: the CPU plugin's 8 devices stand in for
//! 2 hosts × 4 devices or 4 hosts × 2, and the engine runs every host's per-process paths side
//! by side ([`EngineOptions::processes`]): each host uploads only its partitions of the
//! planner's specs, feeds only its data groups' rows and reads back only its partitions. What
//! each host reads back must be, bit for bit, its rows of the same mesh run by one process
//! holding every device, and those within 1e-4 of scale of one unsharded device.
//!
//! Needs the plugin from `SIPHON_PJRT_PLUGIN` (scripts/test.sh sets it); without that
//! variable the test prints a note and returns.

mod common;

use siphon_engine::{Batch, Engine, EngineOptions, ShardingPlan};
use siphon_mesh::HostView;
use siphon_models::{HookPoint, LoadedModel};
use siphon_plan::{MeshKind, MeshRequest, MeshShape, PlanRequest, Topology};

/// The rows `rows` of a batch.
fn rows_of(ids: &[Vec<u32>], mask: &[Vec<u8>], rows: &[std::ops::Range<usize>]) -> Batch {
    let rows: Vec<usize> = rows.iter().cloned().flatten().collect();
    let ids = rows.iter().map(|&r| ids[r].clone()).collect();
    let mask = rows.iter().map(|&r| mask[r].clone()).collect();
    Batch::new(ids, Some(mask)).unwrap()
}

#[test]
fn hosts_of_a_spanning_mesh_together_give_the_single_process_activations() {
    let Some(client) = common::cpu_client("the spanning-mesh simulation") else { return };
    let root = common::fixtures();
    let request = |kind, data, fsdp, model| MeshRequest { kind, data, fsdp, model };
    // (hosts, devices per host), the layout, and the shape it must plan: every weight-sharding
    // group spans hosts.
    let cases = [
        // 1d: all 4 devices on `model` over 2 hosts of 2 (and 4 hosts of 1), one data group
        // fed by every host (the models with 4 KV heads; 2 cannot split 4 ways).
        ((2, 2), request(MeshKind::OneD, None, None, None), MeshShape { data: 1, fsdp: 1, model: 4 }),
        ((4, 1), request(MeshKind::OneD, None, None, None), MeshShape { data: 1, fsdp: 1, model: 4 }),
        // 2d over 4 hosts of 2: two data groups, each spanning 2 hosts.
        ((4, 2), request(MeshKind::TwoD, Some(2), Some(2), Some(2)), MeshShape { data: 2, fsdp: 2, model: 2 }),
        // 3d over 2 hosts of 4: one data group, fsdp × model spanning both hosts.
        ((2, 4), request(MeshKind::ThreeD, Some(1), Some(4), Some(2)), MeshShape { data: 1, fsdp: 4, model: 2 }),
        // 3d over 4 hosts of 2: two data groups of 2 hosts, model within a host.
        ((4, 2), request(MeshKind::ThreeD, Some(2), Some(2), Some(2)), MeshShape { data: 2, fsdp: 2, model: 2 }),
    ];
    for name in ["tiny-llama", "tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-gpt2"] {
        let model = LoadedModel::open(&root.join(name)).unwrap();
        let last = model.config.n_layers - 1;
        let hooks: Vec<HookPoint> = siphon_models::resolve_hooks(
            &format!("blocks.0.attn.hook_z,blocks.1.hook_mlp_out,blocks.{last}.hook_resid_post,ln_final.hook_out"),
            &model.config,
        )
        .unwrap();
        let vocab = model.config.vocab_size as u32;
        let ids: Vec<Vec<u32>> =
            (0..4u32).map(|r| (0..8u32).map(|t| (r * 37 + t * 11 + 3) % vocab).collect()).collect();
        // Padding on either side.
        let mask: Vec<Vec<u8>> =
            (0..4).map(|r| (0..8).map(|t| u8::from(!(r == 1 && t < 3 || r == 2 && t > 5))).collect()).collect();
        let batch = Batch::new(ids.clone(), Some(mask.clone())).unwrap();
        let single = Engine::new(
            &client,
            &model,
            hooks.clone(),
            EngineOptions { plan: ShardingPlan::Replicated, ..EngineOptions::default() },
        )
        .unwrap()
        .run(&batch)
        .unwrap();
        for ((hosts, per_host), mesh_request, want) in &cases {
            if want.model == 4 && model.config.kv_head_counts() == [2] {
                continue;
            }
            let topology = Topology::uniform(*hosts, *per_host).unwrap();
            let request = PlanRequest { mesh: *mesh_request, batch: Some(4), seq: Some(8), ..PlanRequest::default() };
            let plan = siphon_plan::plan(&model.config, &topology, &request).unwrap();
            assert_eq!(plan.shape, *want, "{name}");
            let options = common::planned_options(&plan);
            let whole = Engine::new(&client, &model, hooks.clone(), options.clone()).unwrap();
            let whole_acts = whole.run(&batch).unwrap();
            let views: Vec<HostView> =
                (0..*hosts).map(|h| HostView::contiguous(&plan.mesh, *hosts, h).unwrap()).collect();
            let spanning =
                Engine::new(&client, &model, hooks.clone(), EngineOptions { processes: views.clone(), ..options })
                    .unwrap();
            // Each host uploads its partitions only: together what one process uploads, each
            // host less than that.
            let (stats, whole_stats) = (spanning.load_stats(), whole.load_stats());
            assert_eq!(stats.process_bytes.iter().sum::<usize>(), whole_stats.uploaded_bytes, "{name} {}", plan.mesh);
            assert!(stats.process_bytes.iter().all(|&b| b < whole_stats.uploaded_bytes), "{name} {}", plan.mesh);
            let batches: Vec<Batch> = views.iter().map(|v| rows_of(&ids, &mask, &v.rows(4))).collect();
            let per_host = spanning.run_processes(&batches).unwrap();
            let mut written = [0; 4];
            for (view, acts) in views.iter().zip(&per_host) {
                let rows: Vec<usize> = view.rows(4).into_iter().flatten().collect();
                if view.writer() {
                    rows.iter().for_each(|&r| written[r] += 1);
                }
                for (hook, array) in &acts.hooks {
                    let all = whole_acts.get(*hook).unwrap();
                    let per_row = all.to_f32().len() / 4;
                    let want: Vec<f32> =
                        rows.iter().flat_map(|&r| all.to_f32()[r * per_row..(r + 1) * per_row].to_vec()).collect();
                    assert_eq!(array.to_f32(), want, "{name} {} host {}: {hook}", plan.mesh, view.process());
                }
            }
            assert_eq!(written, [1; 4], "{name} {}: every row written once", plan.mesh);
            // The mesh itself against one device, on the unmasked tokens.
            for hook in &hooks {
                let (a, b) = (single.get(*hook).unwrap().to_f32(), whole_acts.get(*hook).unwrap().to_f32());
                let per_token = a.len() / 32;
                let flat: Vec<u8> = mask.iter().flatten().copied().collect();
                let (mut diff, mut scale) = (0f32, 0f32);
                for (t, _) in flat.iter().enumerate().filter(|(_, m)| **m == 1) {
                    for i in t * per_token..(t + 1) * per_token {
                        diff = farther(diff, a[i] - b[i]);
                        scale = scale.max(a[i].abs());
                    }
                }
                assert!(
                    scale > 0.01 && diff <= 1e-4 * scale.max(1.0),
                    "{name} on {}: {hook} differs by {diff:e}",
                    plan.mesh
                );
            }
        }
    }
}

/// The larger of `worst` and `|d|`, a NaN `d` counting as infinitely far (`max` would drop it).
fn farther(worst: f32, d: f32) -> f32 {
    if d.is_nan() { f32::INFINITY } else { worst.max(d.abs()) }
}
