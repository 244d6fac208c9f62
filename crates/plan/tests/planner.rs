//! The planner on real published configs (fixtures/configs, no weights).

use siphon_models::{HfConfig, ModelConfig, ParamClass};
use siphon_plan::{DType, MeshKind, MeshRequest, MeshShape, PlanError, PlanRequest, Topology, plan};

const GIB: u64 = 1 << 30;

fn fixture(name: &str) -> ModelConfig {
    let path = format!("{}/../../fixtures/configs/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    HfConfig::from_json(&text).unwrap().into_config().unwrap()
}

fn request(kind: MeshKind, device_memory_gib: Option<u64>) -> PlanRequest {
    PlanRequest {
        mesh: MeshRequest { kind, ..MeshRequest::default() },
        dtype: DType::Bf16,
        device_memory_bytes: device_memory_gib.map(|g| g * GIB),
        ..PlanRequest::default()
    }
}

#[test]
fn qwen_7b_on_4x16_is_a_2d_plan_with_weights_over_16_that_fits() {
    let config = fixture("qwen2.5-7b.json");
    let topology = Topology::uniform(4, 16).unwrap();
    let plan = plan(&config, &topology, &request(MeshKind::TwoD, Some(16))).unwrap();
    assert_eq!(plan.kind, MeshKind::TwoD);
    assert_eq!(plan.shape.data, 4, "data crosses the 4 hosts");
    assert_eq!(plan.shape.weight_group(), 16);
    // 28 heads / 4 KV heads: at most model=4 splits whole heads; fsdp takes the rest.
    assert_eq!(plan.shape, MeshShape { data: 4, fsdp: 4, model: 4 });
    assert!(!plan.spans_hosts);
    let w = plan.memory.weights;
    assert_eq!(w.total_bytes, plan.n_params * 2);
    assert_eq!(w.gathered_bytes, w.total_bytes);
    // Only norms (replicated) and biases (split 4 ways) are not split 16 ways: < 0.1% off.
    let ideal = w.total_bytes / 16;
    assert!(w.sharded_bytes >= ideal && w.sharded_bytes < ideal + ideal / 1000, "{} vs {ideal}", w.sharded_bytes);
    let per_class: u64 = plan.classes.iter().map(|c| c.bytes_per_device).sum();
    assert_eq!(per_class, w.sharded_bytes);
    assert_eq!(plan.fits(), Some(true));
    assert!(plan.fallbacks.is_empty(), "{:?}", plan.fallbacks);
    let text = plan.to_string();
    assert!(text.contains("mesh      2d [data=4, fsdp=4, model=4]"), "{text}");
    assert!(text.contains("fits      yes"), "{text}");
}

#[test]
fn every_param_spec_is_valid_on_the_mesh_and_covers_every_tensor() {
    for (name, hosts, per_host) in
        [("qwen2.5-7b.json", 4, 16), ("llama-3.1-70b.json", 2, 8), ("qwen2.5-0.5b.json", 1, 2)]
    {
        let config = fixture(name);
        let topology = Topology::uniform(hosts, per_host).unwrap();
        for kind in [MeshKind::TwoD, MeshKind::ThreeD] {
            let plan = plan(&config, &topology, &request(kind, None)).unwrap();
            let params = config.params(config.n_layers, false);
            assert_eq!(plan.param_specs().len(), params.len());
            for p in &params {
                let spec = plan.spec(&p.name).unwrap();
                spec.validate(&p.shape, &plan.mesh).unwrap_or_else(|e| panic!("{name} {}: {e}", p.name));
            }
            // q/k/v split whole heads on model: the out dim of k is a multiple of head_dim per device.
            let k = plan.classes.iter().find(|c| c.class == ParamClass::AttnK).unwrap();
            assert_eq!(k.shard_shape[0] % config.attention.head_dim, 0, "{name} {kind}");
        }
    }
}

#[test]
fn llama_70b_on_4x4_fits_only_spanning_hosts() {
    let config = fixture("llama-3.1-70b.json");
    let topology = Topology::uniform(4, 4).unwrap();
    // The default 2d plan keeps weights inside a host: 4 devices hold ~130 GiB.
    let within = plan(&config, &topology, &request(MeshKind::TwoD, Some(16))).unwrap();
    assert_eq!(within.shape, MeshShape { data: 4, fsdp: 1, model: 4 });
    assert_eq!(within.fits(), Some(false));
    let suggestion = within.suggestion.clone().expect("a plan spanning hosts fits");
    assert!(suggestion.spans_hosts);
    assert_eq!(suggestion.shape.weight_group(), 16);
    assert!(within.notes.iter().any(|n| n.contains("only a plan spanning hosts fits")), "{:?}", within.notes);
    let err = within.ensure_fits().unwrap_err().to_string();
    assert!(err.contains("spanning hosts") && err.contains("--fsdp 4 --model-parallel 4"), "{err}");
    // auto picks that plan itself and says why.
    let auto = plan(&config, &topology, &request(MeshKind::Auto, Some(16))).unwrap();
    assert_eq!(auto.fits(), Some(true));
    assert_eq!(auto.ensure_fits(), Ok(()));
    assert!(auto.spans_hosts);
    assert_eq!(auto.shape, MeshShape { data: 1, fsdp: 4, model: 4 });
    assert!(auto.notes.iter().any(|n| n.contains("only a plan spanning hosts fits")), "{:?}", auto.notes);
    // Every smaller group (all inside a host or 2 hosts) was too small.
    for group_shape in [MeshShape { data: 2, fsdp: 2, model: 4 }, MeshShape { data: 4, fsdp: 1, model: 4 }] {
        let mut r = request(MeshKind::ThreeD, Some(16));
        r.mesh = MeshRequest {
            kind: MeshKind::ThreeD,
            data: Some(group_shape.data),
            fsdp: Some(group_shape.fsdp),
            model: Some(group_shape.model),
        };
        assert_eq!(plan(&config, &topology, &r).unwrap().fits(), Some(false), "{group_shape}");
    }
}

#[test]
fn auto_picks_the_smallest_group_that_fits() {
    let config = fixture("qwen2.5-7b.json");
    let topology = Topology::uniform(1, 8).unwrap();
    let mut r = request(MeshKind::Auto, Some(14));
    r.batch = Some(8);
    r.seq = Some(512);
    r.hooks = Some(siphon_models::resolve_hooks("blocks.{24..27}.hook_resid_post", &config).unwrap());
    let auto = plan(&config, &topology, &r).unwrap();
    assert_eq!(auto.fits(), Some(true));
    // 13.2 GiB of bf16 weights do not fit one device's budget (14 GiB - 10%); two devices do.
    assert_eq!(auto.shape.weight_group(), 2);
    // Hooks in the first 4 of 28 blocks need only those blocks' weights: one device holds them.
    r.hooks = Some(siphon_models::resolve_hooks("blocks.{0..3}.hook_resid_post", &config).unwrap());
    assert_eq!(plan(&config, &topology, &r).unwrap().shape.weight_group(), 1);
    r.hooks = Some(siphon_models::resolve_hooks("blocks.{24..27}.hook_resid_post", &config).unwrap());
    r.mesh = MeshRequest { kind: MeshKind::ThreeD, data: Some(8), fsdp: Some(1), model: Some(1) };
    assert_eq!(plan(&config, &topology, &r).unwrap().fits(), Some(false));
    // Without a device memory auto cannot choose.
    assert_eq!(plan(&config, &topology, &request(MeshKind::Auto, None)).unwrap_err(), PlanError::AutoNeedsMemory);
}

#[test]
fn batch_not_divisible_by_data_is_an_error() {
    let config = fixture("qwen2.5-0.5b.json");
    let topology = Topology::uniform(4, 2).unwrap();
    let mut r = request(MeshKind::TwoD, None);
    r.batch = Some(6);
    let err = plan(&config, &topology, &r).unwrap_err();
    assert!(matches!(err, PlanError::BatchNotDivisible { batch: 6, data: 4, .. }), "{err}");
    assert!(err.to_string().contains("multiple of 4"), "{err}");
    r.batch = Some(8);
    assert!(plan(&config, &topology, &r).is_ok());
    // auto only considers shapes whose data axis divides the batch.
    r.mesh.kind = MeshKind::Auto;
    r.device_memory_bytes = Some(16 * GIB);
    r.batch = Some(2);
    assert!(plan(&config, &topology, &r).unwrap().shape.data <= 2);
}

#[test]
fn heads_not_divisible_by_model_is_an_error_listing_valid_shapes() {
    // Qwen2.5-0.5B: 14 heads, 2 KV heads.
    let config = fixture("qwen2.5-0.5b.json");
    let topology = Topology::uniform(1, 8).unwrap();
    let mut r = request(MeshKind::TwoD, None);
    r.mesh.model = Some(4);
    let err = plan(&config, &topology, &r).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("does not divide num_attention_heads 14"), "{text}");
    assert!(text.contains("valid shapes") && text.contains("1×4×2"), "{text}");
    let err = plan(&config, &topology, &request(MeshKind::OneD, None)).unwrap_err();
    assert!(matches!(err, PlanError::InvalidMesh { .. }), "{err}");
}

#[test]
fn a_vocab_that_does_not_divide_falls_back_and_is_reported() {
    let text = r#"{"model_type": "llama", "vocab_size": 32001, "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4}"#;
    let config = HfConfig::from_json(text).unwrap().into_config().unwrap();
    let topology = Topology::uniform(1, 4).unwrap();
    let plan = plan(&config, &topology, &request(MeshKind::TwoD, None)).unwrap();
    assert_eq!(plan.fallbacks.len(), 1, "{:?}", plan.fallbacks);
    assert_eq!(plan.fallbacks[0].class, ParamClass::Embedding);
    assert!(plan.spec("model.embed_tokens.weight").unwrap().is_replicated());
    assert!(plan.to_string().contains("fallback: embedding"));
}

#[test]
fn json_has_mesh_axes_bytes_and_verdict() {
    let config = fixture("qwen2.5-7b.json");
    let topology = Topology::uniform(4, 16).unwrap();
    let mut r = request(MeshKind::TwoD, Some(16));
    r.batch = Some(16);
    r.seq = Some(1024);
    let plan = plan(&config, &topology, &r).unwrap();
    let json = serde_json::to_value(&plan).unwrap();
    assert_eq!(json["mesh"]["axes"][0]["name"], "data");
    assert_eq!(json["mesh"]["axes"][0]["size"], 4);
    assert_eq!(json["memory"]["weights"]["sharded_bytes"], plan.memory.weights.sharded_bytes);
    assert_eq!(json["memory"]["weights"]["gathered_bytes"], plan.memory.weights.total_bytes);
    assert_eq!(json["memory"]["activations"]["local_batch"], 4);
    assert!(json["memory"]["activations"]["total_bytes"].as_u64().unwrap() > 0);
    assert_eq!(json["memory"]["fits"], true);
    assert_eq!(json["kind"], "2d");
}

#[test]
fn the_output_path_host_memory_counts_steps_in_flight_in_the_stored_dtype() {
    let config = fixture("qwen2.5-0.5b.json");
    let hooks =
        siphon_models::resolve_hooks("blocks.{6,12,18}.hook_resid_post,ln_final.hook_normalized", &config).unwrap();
    let topology = Topology::uniform(2, 1).unwrap();
    let at = |output_dtype, pipeline_depth| {
        let request = PlanRequest {
            batch: Some(32),
            seq: Some(1024),
            hooks: Some(hooks.clone()),
            output_dtype,
            pipeline_depth,
            ..request(MeshKind::TwoD, None)
        };
        plan(&config, &topology, &request).unwrap().memory.host.unwrap()
    };
    // 16 of the 32 rows per host, 1024 tokens, 4 hooks of 896: bf16 2 bytes a value, fp8 1
    // and a 4-byte scale a row.
    let rows = 16 * 1024;
    assert_eq!(at(DType::Bf16, 2).step_bytes, rows * 4 * 896 * 2);
    assert_eq!(at(DType::Fp8, 3).step_bytes, rows * 4 * (896 + 4));
    assert_eq!(at(DType::Fp8, 3).total_bytes, 3 * rows * 4 * (896 + 4));
    let no_depth = PlanRequest { pipeline_depth: 0, ..request(MeshKind::TwoD, None) };
    assert!(matches!(plan(&config, &topology, &no_depth), Err(PlanError::Request(_))));
    let fp8_compute = PlanRequest { dtype: DType::Fp8, ..request(MeshKind::TwoD, None) };
    assert!(plan(&config, &topology, &fp8_compute).unwrap_err().to_string().contains("stored dtype of activations"));
}

/// `--outputs`: the final norm and the unembedding are among the weights, and the devices hold
/// the outputs and one chunk's logits — Llama 3's 128,256-token vocabulary at 32 × 1024 tokens
/// a chunk of positions at a time, split as the unembedding is.
#[test]
fn next_token_outputs_count_their_weights_results_and_one_chunk() {
    let config = fixture("llama-3-8b.json");
    let topology = Topology::uniform(1, 8).unwrap();
    let hooks = vec![siphon_models::HookPoint::block(3, siphon_models::HookKind::ResidPost)];
    let base = PlanRequest {
        mesh: MeshRequest { kind: MeshKind::TwoD, data: Some(2), ..MeshRequest::default() },
        batch: Some(32),
        seq: Some(1024),
        hooks: Some(hooks),
        ..request(MeshKind::TwoD, Some(80))
    };
    let without = plan(&config, &topology, &base).unwrap();
    assert!(without.memory.next_token.is_none() && !without.lm_head_included);
    let outputs = siphon_models::NextToken { nll: true, entropy: true, topk: 20, chunk: None };
    let with = plan(&config, &topology, &PlanRequest { next_token: Some(outputs), ..base }).unwrap();
    // Every block, the final norm and lm_head, not the first four blocks alone.
    assert!(with.lm_head_included && with.n_params > without.n_params);
    let n = with.memory.next_token.expect("the outputs' memory");
    // 16 rows a data group; the vocabulary as lm_head's rows are split.
    let ways = with.spec("lm_head.weight").unwrap().ways(0, &with.mesh) as u64;
    assert!(ways > 1, "the vocabulary is split");
    let (rows, local_vocab) = (16u64, (config.vocab_size as u64).div_ceil(ways));
    assert_eq!(n.chunk as u64, (1u64 << 24) / (rows * local_vocab));
    assert_eq!(n.working_bytes, 4 * rows * n.chunk as u64 * local_vocab * 4);
    assert_eq!(n.output_bytes, rows * 1024 * (2 + 2 * 20) * 4);
    assert!(n.working_bytes < rows * 1024 * local_vocab, "never [tokens, vocab]");
    let counted = with.memory.required_bytes - n.output_bytes - n.working_bytes;
    assert!(counted > without.memory.required_bytes, "the later blocks' weights");
    assert!(with.to_string().contains("next-token"), "{with}");
}

/// A decoding step that draws on the devices counts its sampler: the draw's arrays of its
/// slots' logits, more where top-p sorts them; a greedy one none.
#[test]
fn a_sampled_decoding_step_counts_its_sampler() {
    let config = fixture("llama-3-8b.json");
    let topology = Topology::uniform(1, 8).unwrap();
    let base = PlanRequest {
        mesh: MeshRequest { kind: MeshKind::TwoD, data: Some(2), ..MeshRequest::default() },
        batch: Some(64),
        seq: Some(1),
        hooks: Some(vec![siphon_models::HookPoint::model(siphon_models::HookKind::LnFinalOut)]),
        with_lm_head: true,
        decode: Some(siphon_models::DecodeStep { cache_len: 4096, chunk: 64 }),
        ..request(MeshKind::TwoD, Some(80))
    };
    let greedy = plan(&config, &topology, &base).unwrap();
    let sampled = |s: siphon_models::Sampling| {
        let p = plan(&config, &topology, &PlanRequest { decode_sampling: Some(s), ..base.clone() }).unwrap();
        let d = p.memory.decode.expect("the decoding step's memory");
        assert_eq!(p.memory.required_bytes, greedy.memory.required_bytes + d.sampler_bytes);
        d.sampler_bytes
    };
    assert_eq!(greedy.memory.decode.unwrap().sampler_bytes, 0);
    assert_eq!(sampled(siphon_models::Sampling::default()), 0, "greedy draws nothing");
    // 32 slots a data group, each row's whole vocabulary (the choice reads it whole).
    let array = 32 * config.vocab_size as u64 * 4;
    let t = siphon_models::Sampling { temperature: 0.7, ..siphon_models::Sampling::default() };
    assert_eq!(sampled(t), 4 * array);
    assert_eq!(sampled(siphon_models::Sampling { top_p: 0.9, ..t }), 8 * array);
    assert_eq!(sampled(siphon_models::Sampling { top_k: 50, top_p: 0.9, min_p: 0.05, ..t }), 10 * array);
    // A top-k as wide as the vocabulary keeps every token: the draw makes no cut to hold.
    assert_eq!(sampled(siphon_models::Sampling { top_k: 50, ..t }), 5 * array);
    assert_eq!(sampled(siphon_models::Sampling { top_k: config.vocab_size, ..t }), 4 * array);
    assert!(greedy.to_string().contains("sampler"), "{greedy}");
}
