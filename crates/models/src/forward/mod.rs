//! The forward pass as a StableHLO program: the `Graph` a family's builder fills
//! (`graph.rs`) and the decoder loop families share (`decoder.rs`), for the contract of
//! `crate::contract` (its arguments, results and numerics); the layers themselves are in
//! `crate::layers`.

mod decoder;
mod graph;
mod next_token;
mod select;
mod splice;

pub use splice::output_names as splice_output_names;

use siphon_hlo::{Builder, CompareDir, DType, TensorType, Value};

pub(crate) use self::decoder::{decoder_params, pre_norm_decoder, self_attention_decoder};
pub(crate) use self::graph::{Graph, matmul_t};
use crate::config::{ModelConfig, ParamInfo};
pub use crate::contract::{
    AttentionForm, DecodeInfo, DecodeStep, ForwardProgram, ForwardSpec, InputInfo, LOGITS_CHUNK_ELEMENTS, NextToken,
    NextTokenInfo, OutputInfo, RaggedDot, Sampling, WEIGHT_FIRST_ROWS,
};
use crate::error::ModelError;
use crate::hooks::{HookPoint, Scope};

/// Builds the forward pass of `config` as described by `spec`. Its weight arguments are
/// exactly the weights its graph reads, whatever the hooks: unless `spec` names them, a first
/// build declares every weight of the blocks the hooks need (and the model's own: embeddings,
/// a final norm, per-layer inputs) and notes which it read, and the program is built again
/// with those alone when some went unread.
pub fn build_forward(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    config.validate()?;
    let build = config.arch.family().build;
    let program = build(config, spec)?;
    if program.unread.is_empty() {
        return Ok(program);
    }
    let read = program.params.iter().map(|p| &p.name).filter(|n| !program.unread.contains(n));
    let exact = ForwardSpec { weights: Some(read.cloned().collect()), ..spec.clone() };
    build(config, &exact)
}

/// Blocks to build for `hooks`, and whether the final norm is needed.
pub(crate) fn blocks_for(config: &ModelConfig, hooks: &[HookPoint]) -> Result<(usize, bool), ModelError> {
    if hooks.is_empty() {
        return Err(ModelError::Hook("no hooks requested: the forward would return nothing".into()));
    }
    for (i, h) in hooks.iter().enumerate() {
        // Layer range, the family's kinds, and the block's own (a KV-sharing block has no keys).
        crate::hooks::check(&h.to_string(), *h, config)?;
        if hooks[..i].contains(h) {
            return Err(ModelError::Hook(format!("{h} is requested twice")));
        }
    }
    Ok(blocks_needed(config, hooks))
}

/// The blocks the forward returning `hooks` builds (those up to the last one a hook needs),
/// and whether it builds the final norm (a hook after it).
pub fn blocks_needed(config: &ModelConfig, hooks: &[HookPoint]) -> (usize, bool) {
    let n = hooks.iter().map(|h| h.blocks_needed(config.n_layers)).max().unwrap_or(0);
    (n, hooks.iter().any(|h| h.kind().info().scope == Scope::Output))
}

/// The weights the forward returning `hooks` reads (its program's arguments, found by
/// building it on one device for one token), in the family's inventory order. The planner
/// counts these.
pub fn forward_params(config: &ModelConfig, hooks: &[HookPoint]) -> Result<Vec<ParamInfo>, ModelError> {
    Ok(build_forward(config, &ForwardSpec::new(1, 1, hooks.to_vec()))?.params)
}

/// The largest finite `f8E4M3FN` value: a row's scale is its largest magnitude over this, so
/// that the row's largest value becomes ±448.
pub const FP8_MAX: f64 = 448.0;

/// Each token's row of `x` (`[batch, seq, *per-token shape]`) as `f8E4M3FN` with its own f32
/// scale, as bytes `[batch, seq, 4 + n]`: the scale (the row's largest magnitude times
/// `1 / FP8_MAX` rounded to f32 — a product, which no compiler rewrites; 1 for a row of zeros)
/// little-endian first, then the row's `n` values, each `x / scale` in f32 rounded to nearest
/// even. A value is `f8 * scale` again.
pub fn fp8_rows(b: &mut Builder, x: Value) -> Result<Value, ModelError> {
    let dims = b.dims(x)?.to_vec();
    let (rows, n): (Vec<usize>, usize) = (dims[..2].to_vec(), dims[2..].iter().product());
    let flat = [rows[0], rows[1], n];
    let x = b.convert(x, DType::F32)?;
    let x = b.reshape(x, &flat)?;
    let magnitude = b.abs(x)?;
    let amax = b.reduce_max(magnitude, &[2])?;
    let row_ty = TensorType::new(DType::F32, &rows);
    let inverse_max = b.splat(f64::from(1.0 / FP8_MAX as f32), row_ty.clone())?;
    let scale = b.mul(amax, inverse_max)?;
    let (zero, one) = (b.splat(0.0, row_ty.clone())?, b.splat(1.0, row_ty)?);
    let positive = b.compare(CompareDir::Gt, scale, zero)?;
    let scale = b.select(positive, scale, one)?;
    let spread = b.broadcast_in_dim(scale, &flat, &[0, 1])?;
    let q = b.div(x, spread)?;
    let q = b.convert(q, DType::F8E4M3FN)?;
    let q = b.bitcast_convert(q, DType::U8)?;
    let scale_bytes = b.bitcast_convert(scale, DType::U8)?;
    Ok(b.concatenate(&[scale_bytes, q], 2)?)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use siphon_mesh::{Mesh, PartitionSpec};

    use super::*;
    use crate::hooks::HookKind;
    use crate::hooks::HookKind::*;

    fn block(layer: usize, kind: HookKind) -> HookPoint {
        HookPoint::block(layer, kind)
    }

    fn ln_final() -> HookPoint {
        HookPoint::model(LnFinalOut)
    }

    fn tiny() -> ModelConfig {
        ModelConfig {
            arch: crate::qwen2::ARCH,
            vocab_size: 32,
            hidden_size: 16,
            intermediate_size: 24,
            n_layers: 3,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 128,
            tie_word_embeddings: true,
            attention: crate::config::Attention {
                n_heads: 4,
                n_kv_heads: 2,
                head_dim: 4,
                qkv_bias: true,
                ..Default::default()
            },
            rope: crate::config::Rope { theta: 10000.0, ..Default::default() },
            ..ModelConfig::default()
        }
    }

    #[test]
    fn only_needed_blocks_and_weights_are_arguments() {
        let c = tiny();
        let p = build_forward(&c, &ForwardSpec::new(2, 5, vec![block(0, AttnOut)])).unwrap();
        assert_eq!(p.n_blocks, 1);
        assert!(p.params.iter().all(|p| p.layer.is_none_or(|l| l == 0)));
        assert!(!p.params.iter().any(|p| p.name == "model.norm.weight"));
        // 1 result of [2, 5, 16].
        assert_eq!(p.outputs.len(), 1);
        assert!(p.text.contains("-> (tensor<2x5x16xf32>)"), "{}", p.text.lines().nth(1).unwrap());
        let p = build_forward(&c, &ForwardSpec::new(2, 5, vec![ln_final(), block(1, ResidPre)])).unwrap();
        assert_eq!(p.n_blocks, 3);
        assert_eq!(p.params.last().unwrap().name, "model.norm.weight");
        assert_eq!(p.outputs[0].hook, ln_final());
        let p = build_forward(&c, &ForwardSpec::new(1, 4, vec![block(0, ResidPre)])).unwrap();
        assert_eq!(p.n_blocks, 0);
        assert_eq!(p.params.len(), 1);
    }

    #[test]
    fn fp8_outputs_are_rows_of_a_scale_and_values_on_any_mesh() {
        let c = tiny();
        let mesh = Mesh::new(&[("data", 2), ("model", 2)], (0..4).collect()).unwrap();
        let hooks = vec![block(0, AttnZ), block(1, ResidPost)];
        let mut spec = ForwardSpec::new(2, 5, hooks).with_megatron_plan(&c, mesh);
        spec.output_dtype = DType::F8E4M3FN;
        let p = build_forward(&c, &spec).unwrap();
        // 4 heads of 4 flattened behind the 4 bytes of the scale; specs of the output's rank.
        let shapes: Vec<_> = p.outputs.iter().map(|o| (o.shape.clone(), o.dtype, o.spec.rank())).collect();
        assert_eq!(shapes, [(vec![2, 5, 4 + 16], DType::U8, 3), (vec![2, 5, 4 + 16], DType::U8, 3)]);
        assert!(p.text.contains("f8E4M3FN") && p.text.contains("stablehlo.bitcast_convert"));
    }

    #[test]
    fn the_weights_declared_are_the_weights_read() {
        let c = tiny();
        let hooks = vec![block(1, MlpOut)];
        let read: BTreeSet<String> = forward_params(&c, &hooks).unwrap().into_iter().map(|p| p.name).collect();
        assert!(read.contains("model.layers.1.mlp.down_proj.weight") && !read.contains("model.norm.weight"));
        // Given the same set, one build; given one more or one less, an error naming it.
        let spec =
            |weights: BTreeSet<String>| ForwardSpec { weights: Some(weights), ..ForwardSpec::new(1, 3, hooks.clone()) };
        assert_eq!(build_forward(&c, &spec(read.clone())).unwrap().params.len(), read.len());
        let mut more = read.clone();
        more.insert("model.norm.weight".into());
        let e = build_forward(&c, &spec(more)).unwrap_err().to_string();
        assert!(e.contains("never reads") && e.contains("model.norm.weight"), "{e}");
        let mut less = read.clone();
        less.remove("model.layers.0.input_layernorm.weight");
        let e = build_forward(&c, &spec(less)).unwrap_err().to_string();
        assert!(e.contains("not declared") && e.contains("model.layers.0.input_layernorm.weight"), "{e}");
        let mut beyond = read;
        beyond.insert("model.layers.2.mlp.up_proj.weight".into());
        let e = build_forward(&c, &spec(beyond)).unwrap_err().to_string();
        assert!(e.contains("model.layers.2.mlp.up_proj.weight") && e.contains("first 2 blocks"), "{e}");
    }

    #[test]
    fn every_hook_has_its_own_shape() {
        let c = tiny();
        let hooks: Vec<HookPoint> = crate::hooks::hook_kinds(&ModelConfig { arch: crate::llama::ARCH, ..tiny() })
            .iter()
            .map(|&k| match k.info().scope {
                Scope::Block => block(1, k),
                _ => HookPoint::model(k),
            })
            .collect();
        let p = build_forward(&c, &ForwardSpec::new(2, 5, hooks.clone())).unwrap();
        let shape = |kind| p.outputs.iter().find(|o| o.hook.kind() == kind).unwrap().shape.clone();
        assert_eq!(shape(Embed), [2, 5, 16]);
        assert_eq!(shape(Ln1Scale), [2, 5, 1]);
        assert_eq!(shape(AttnQ), [2, 5, 4, 4]);
        assert_eq!(shape(AttnK), [2, 5, 2, 4]);
        assert_eq!(shape(AttnPattern), [2, 5, 4, 5]);
        assert_eq!(shape(MlpPost), [2, 5, 24]);
        assert_eq!(p.outputs.iter().map(|o| o.hook).collect::<Vec<_>>(), hooks);
        // Blocks after the last needed one are not built, whatever the hook.
        let p = build_forward(&c, &ForwardSpec::new(2, 5, vec![block(1, AttnPattern)])).unwrap();
        assert_eq!(p.n_blocks, 2);
        // A norm's scale is only computed when asked for.
        let p = build_forward(&c, &ForwardSpec::new(2, 5, vec![block(1, ResidPost)])).unwrap();
        assert!(!p.text.contains("stablehlo.sqrt"));
    }

    #[test]
    fn bad_specs_are_errors() {
        let c = tiny();
        let err = build_forward(&c, &ForwardSpec::new(2, 5, vec![block(3, MlpOut)])).unwrap_err();
        assert!(err.to_string().contains("blocks.3.hook_mlp_out"), "{err}");
        let err = build_forward(&c, &ForwardSpec::new(2, 5, vec![])).unwrap_err();
        assert!(err.to_string().contains("no hooks"), "{err}");
        let mut spec = ForwardSpec::new(2, 5, vec![ln_final()]);
        spec.compute_dtype = DType::F16;
        assert!(build_forward(&c, &spec).unwrap_err().to_string().contains("compute dtype f16"));
        let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
        // 2 kv heads * 4 = 8 rows split 4 ways is fine; batch 3 over data=2 is not.
        let spec = ForwardSpec::new(3, 5, vec![ln_final()]).with_megatron_plan(&c, mesh.clone());
        let err = build_forward(&c, &spec).unwrap_err();
        assert!(err.to_string().contains("inputs"), "{err}");
        let mut spec = ForwardSpec::new(2, 5, vec![ln_final()]).with_megatron_plan(&c, mesh);
        spec.param_specs.insert("model.layers.0.mlp.gate.weight".into(), PartitionSpec::replicated(2));
        let err = build_forward(&c, &spec).unwrap_err();
        assert!(err.to_string().contains("gate.weight"), "{err}");
        // On one device: a split, or a spec of the wrong rank, is an error, not a panic.
        let mut spec = ForwardSpec::new(2, 5, vec![ln_final()]);
        spec.input_spec = Some(PartitionSpec::replicated(1));
        assert!(build_forward(&c, &spec).unwrap_err().to_string().contains("inputs"));
        let mut spec = ForwardSpec::new(2, 5, vec![ln_final()]);
        spec.param_specs.insert("model.norm.weight".into(), PartitionSpec::new(&[&["model"]]));
        assert!(build_forward(&c, &spec).unwrap_err().to_string().contains("model.norm.weight"));
    }

    #[test]
    fn sharded_program_annotates_everything() {
        let c = tiny();
        let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
        let spec = ForwardSpec::new(2, 4, vec![block(1, ResidPost)]).with_megatron_plan(&c, mesh);
        let p = build_forward(&c, &spec).unwrap();
        assert!(p.text.contains("sdy.mesh @mesh = <[\"data\"=2, \"model\"=4]>"));
        let spec_of = |name: &str| &p.param_specs[p.params.iter().position(|p| p.name == name).unwrap()];
        assert_eq!(spec_of("model.layers.0.self_attn.q_proj.weight"), &PartitionSpec::new(&[&["model"], &[]]));
        assert_eq!(spec_of("model.layers.0.self_attn.o_proj.weight"), &PartitionSpec::new(&[&[], &["model"]]));
        // 2 kv heads do not split over model=4: k/v stay whole.
        assert_eq!(spec_of("model.layers.1.self_attn.k_proj.bias"), &PartitionSpec::new(&[&[]]));
        assert_eq!(spec_of("model.layers.1.mlp.down_proj.weight"), &PartitionSpec::new(&[&[], &["model"]]));
        assert_eq!(p.outputs[0].spec, PartitionSpec::new(&[&["data"], &[], &[]]));
        assert!(p.text.contains("sdy.sharding_constraint"));
    }

    #[test]
    fn per_head_norms_in_place_keep_the_heads_on_a_mesh() {
        let mut c = tiny();
        c.arch = crate::qwen3::ARCH;
        c.attention.qk_norm = true;
        c.attention.qkv_bias = false;
        let mesh = Mesh::new(&[("data", 2), ("model", 2)], (0..4).collect()).unwrap();
        let hooks = vec![block(0, AttnQNormScale), block(0, AttnKNormed), block(0, ResidPost)];
        let build = |in_place| {
            let mut spec = ForwardSpec::new(2, 4, hooks.clone()).with_megatron_plan(&c, mesh.clone());
            spec.norm_heads_in_place = in_place;
            build_forward(&c, &spec).unwrap()
        };
        let (rows, in_place) = (build(false), build(true));
        // 8 tokens × 4 query heads of 4 as rows, reduced to 32 scales; in place, 8 × 4.
        assert!(rows.text.contains("tensor<32x4xf32>"));
        assert!(!in_place.text.contains("tensor<32x4xf32>") && !in_place.text.contains("tensor<16x4xf32>"));
        assert!(in_place.text.contains("tensor<8x4x4xf32>") && in_place.text.contains("tensor<8x4xf32>"));
        // The same results, shapes and splits.
        let outputs =
            |p: &ForwardProgram| p.outputs.iter().map(|o| format!("{:?} {:?}", o.shape, o.spec)).collect::<Vec<_>>();
        assert_eq!(outputs(&rows), outputs(&in_place));
    }
}
