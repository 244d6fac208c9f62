//! Every fixture family's program, as `siphon extract` builds it for a TPU slice, compiled by
//! libtpu for a 4-chip v5e (`v5e:2x2`) on this CPU-only machine (no TPU): every hook in bf16
//! on the planner's mesh; 1d, 2d and 3d meshes, f32 and a one-hook set on a dense and a
//! mixture family; and the planner's per-device weight bytes against the compiler's argument
//! bytes. A mixture's experts are `chlo.ragged_dot`s (no loop), each expert's width over
//! `model`, as `extract` plans them for libtpu.
//!
//! Needs the pinned libtpu: `scripts/test.sh` fetches it into siphon's cache
//! (`scripts/setup-libtpu.sh`) and names it in `SIPHON_TEST_LIBTPU_PLUGIN`. Without it the
//! test is skipped with a note, except under CI, where it fails.

// The CPU client of `common` is for the tests that run programs; this one only compiles.
#[allow(dead_code)]
mod common;

use std::path::Path;

use siphon_engine::EngineOptions;
use siphon_engine::aot::{AotProgram, AotRequest};
use siphon_models::{DType, HookPoint, LoadedModel, ModelConfig};
use siphon_plan::{MeshKind, MeshRequest, Plan, PlanRequest, TpuSlice};
use siphon_runtime::{Plugin, PluginLocator, Topology, tpu_topology_options};

const BATCH: usize = 4;
const SEQ: usize = 16;

fn v5e_4(plugin: &std::sync::Arc<Plugin>) -> (TpuSlice, Topology) {
    let slice = TpuSlice::parse("v5e-4", 1).unwrap();
    let options = tpu_topology_options(slice.chip_config, slice.chips_per_host_bounds, slice.slices, slice.wrap);
    let topology = Topology::new(plugin, &slice.topology, &options).unwrap();
    (slice, topology)
}

/// The planner's plan and the compiled program for `hooks` on `mesh` in `dtype`.
fn compile(
    topology: &Topology,
    slice: &TpuSlice,
    config: &ModelConfig,
    hooks: &[HookPoint],
    mesh: MeshRequest,
    dtype: DType,
) -> (Plan, AotProgram) {
    compile_with(topology, slice, config, hooks, mesh, dtype, &[])
}

/// [`compile`], with sparse dictionaries' latents in the program.
fn compile_with(
    topology: &Topology,
    slice: &TpuSlice,
    config: &ModelConfig,
    hooks: &[HookPoint],
    mesh: MeshRequest,
    dtype: DType,
    dictionaries: &[siphon_models::DictionaryHook],
) -> (Plan, AotProgram) {
    let request = PlanRequest {
        dictionaries: dictionaries.iter().map(siphon_plan::DictionaryShape::of).collect(),
        mesh,
        dtype,
        output_dtype: dtype,
        batch: Some(BATCH),
        seq: Some(SEQ),
        hooks: Some(hooks.to_vec()),
        device_memory_bytes: Some(slice.generation.hbm_bytes()),
        layout: siphon_plan::DeviceLayout::TpuTiled,
        // As `extract` plans for libtpu: each expert's width over `model`.
        experts: siphon_models::sharding::ExpertSplit::Width,
        ..PlanRequest::default()
    };
    let plan = siphon_plan::plan(config, &slice.planner_topology().unwrap(), &request).unwrap();
    let options = EngineOptions {
        compute_dtype: dtype,
        output_dtype: dtype,
        dictionaries: dictionaries.to_vec(),
        ..common::planned_options(&plan)
    };
    let request =
        AotRequest { config, hooks: hooks.to_vec(), options, stored: Default::default(), batch: BATCH, seq: SEQ };
    let aot = siphon_engine::aot::compile(topology, request).unwrap_or_else(|e| panic!("{e}"));
    (plan, aot)
}

fn every_hook(config: &ModelConfig) -> Vec<HookPoint> {
    siphon_models::resolve_hooks("*", config).or_else(|_| siphon_models::resolve_hooks("blocks.*.*", config)).unwrap()
}

/// One test, so that libtpu's environment is set before any other thread of this binary runs.
#[test]
fn every_fixture_family_compiles_for_a_v5e_slice() {
    let located = PluginLocator::new().explicit(std::env::var_os("SIPHON_TEST_LIBTPU_PLUGIN")).locate_libtpu();
    let libtpu = match located {
        Ok(choice) => choice.path,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("note: skipped, no libtpu ({e})");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    // SAFETY: the only test of this binary; no other thread reads the environment yet.
    unsafe {
        std::env::set_var("TPU_SKIP_MDS_QUERY", "1");
        // Other test binaries may hold libtpu's machine-wide lock; no TPU is used here.
        std::env::set_var("ALLOW_MULTIPLE_LIBTPU_LOAD", "1");
    }
    let plugin = Plugin::load_for_compiling(libtpu).unwrap();
    let (slice, topology) = v5e_4(&plugin);
    let two_d = MeshRequest { kind: MeshKind::TwoD, ..MeshRequest::default() };

    let mut families = Vec::new();
    for entry in std::fs::read_dir(common::fixtures()).unwrap() {
        let path = entry.unwrap().path();
        if path.join("config.json").is_file() {
            families.push(path);
        }
    }
    families.sort();
    let mut wrong = Vec::new();
    for path in &families {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let config = LoadedModel::open(Path::new(path)).unwrap().config;
        let hooks = every_hook(&config);
        let (plan, aot) = compile(&topology, &slice, &config, &hooks, two_d, DType::Bf16);
        assert_eq!(aot.mesh.num_devices(), 4, "{name}");
        // Arguments are the weights and the token inputs, each padded to its tiles: the
        // planner's count is the compiler's, byte for byte; so are the hooks' outputs.
        let activations = plan.memory.activations.unwrap();
        let planned = plan.memory.weights.sharded_bytes + activations.input_bytes;
        if aot.memory.argument_size_in_bytes as u64 != planned {
            wrong.push(format!("{name} {}: arguments {:?}, planner {planned}", plan.mesh, aot.memory));
        }
        if aot.memory.output_size_in_bytes as u64 != activations.hook_bytes {
            wrong.push(format!(
                "{name} {} {} hooks: outputs {}, planner {}",
                plan.mesh,
                hooks.len(),
                aot.memory.output_size_in_bytes,
                activations.hook_bytes
            ));
        }
        assert!(aot.flops.is_some_and(|f| f > 0.0), "{name}: no flops");
        // A mixture's experts as XLA's grouped products, three a mixture block, with no loop
        // (the hybrids' linear attention keeps its own chunk loop).
        if config.moe.is_some() {
            let ragged = aot.program.text.matches("\"chlo.ragged_dot\"(").count();
            let mixtures = (0..config.n_layers).filter(|&l| config.is_mixture_layer(l)).count();
            let looped = config.linear_attention.is_none() && aot.program.text.contains("stablehlo.while");
            if ragged != 3 * mixtures || looped {
                wrong.push(format!("{name}: {ragged} chlo.ragged_dot for {mixtures} mixture blocks, a loop: {looped}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");

    // A dense and a mixture family on every kind of mesh, in f32, and with one hook alone.
    for family in ["tiny-pythia", "tiny-deepseek-v3"] {
        let config = LoadedModel::open(&common::fixtures().join(family)).unwrap().config;
        let all = every_hook(&config);
        let one = siphon_models::resolve_hooks("blocks.1.hook_resid_post", &config).unwrap();
        let meshes = [
            MeshRequest { kind: MeshKind::OneD, ..MeshRequest::default() },
            two_d,
            MeshRequest { kind: MeshKind::ThreeD, data: Some(1), fsdp: Some(2), model: Some(2) },
            MeshRequest { kind: MeshKind::ThreeD, data: Some(2), fsdp: Some(1), model: Some(2) },
        ];
        for mesh in meshes {
            for (dtype, hooks) in [(DType::F32, &all), (DType::Bf16, &one)] {
                let (plan, aot) = compile(&topology, &slice, &config, hooks, mesh, dtype);
                let what = format!("{family} {} {dtype} {} hooks", plan.mesh, hooks.len());
                let activations = plan.memory.activations.unwrap();
                assert_eq!(
                    aot.memory.argument_size_in_bytes as u64,
                    plan.memory.weights.sharded_bytes + activations.input_bytes,
                    "{what}"
                );
                assert_eq!(aot.memory.output_size_in_bytes as u64, activations.hook_bytes, "{what}");
                // One hook alone builds two blocks and reads their weights only.
                assert_eq!(aot.program.n_blocks, if hooks.len() == 1 { 2 } else { config.n_layers }, "{what}");
            }
        }
    }

    // Sparse dictionaries' tensors and latents, as `siphon plan --sae` counts them: the
    // compiler's argument and output bytes, byte for byte, with and without hooks of its own.
    let config = LoadedModel::open(&common::fixtures().join("tiny-llama")).unwrap().config;
    let dictionaries: Vec<siphon_models::DictionaryHook> = ["saelens-topk", "saelens-gated", "saelens-transcoder"]
        .iter()
        .map(|name| {
            let dir = common::fixtures().join("../dictionaries").join(name);
            let dictionary = siphon_models::dictionary::Dictionary::open(&dir, None).unwrap();
            let hook = HookPoint::parse(&dictionary.hook, &config).unwrap();
            siphon_models::DictionaryHook { hook, dictionary: std::sync::Arc::new(dictionary), cap: 24 }
        })
        .collect();
    let one = siphon_models::resolve_hooks("blocks.0.hook_resid_post", &config).unwrap();
    let three_d = MeshRequest { kind: MeshKind::ThreeD, data: Some(2), fsdp: Some(1), model: Some(2) };
    for (mesh, hooks) in [(two_d, &one), (three_d, &vec![])] {
        let (plan, aot) = compile_with(&topology, &slice, &config, hooks, mesh, DType::Bf16, &dictionaries);
        let what = format!("tiny-llama {} with dictionaries, {} hooks", plan.mesh, hooks.len());
        let (act, dict) = (plan.memory.activations.unwrap(), plan.memory.dictionaries.unwrap());
        assert_eq!(
            aot.memory.argument_size_in_bytes as u64,
            plan.memory.weights.sharded_bytes + act.input_bytes + dict.tensor_bytes,
            "{what}"
        );
        assert_eq!(aot.memory.output_size_in_bytes as u64, act.hook_bytes + dict.output_bytes, "{what}");
        assert!(plan.memory.required_bytes > plan.memory.weights.sharded_bytes + act.total_bytes + dict.working_bytes);
    }
}
