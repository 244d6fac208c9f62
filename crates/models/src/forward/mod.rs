//! The forward pass as a StableHLO program: what goes in ([`ForwardSpec`]), what comes out
//! ([`ForwardProgram`]), the [`Graph`] a family's builder fills (`graph.rs`) and the decoder
//! loop families share (`decoder.rs`); the layers themselves are in [`crate::layers`].
//!
//! The program's arguments are, in order: every weight of [`ForwardProgram::params`] (in
//! the compute dtype, Hugging Face layout; exactly the weights its graph reads, in the
//! family's inventory order), then `input_ids`, `attention_mask` (1 = real
//! token) and `position_ids`, each `[batch, seq]` i32. Its results are the requested hooks
//! in the requested order, each `[batch, seq, *per-token shape]` in the output dtype (the
//! per-token shape is the hook's [`crate::hooks::HookShape`]: `[hidden]`, `[d_mlp]`, `[1]`,
//! `[heads, head_dim]` or `[heads, seq]`). Position ids
//! are an input so that the caller decides them: `cumsum(mask) - 1` for padded rows makes
//! left- and right-padded rows give the activations of an unpadded run.
//!
//! Numerics follow Hugging Face transformers: RMSNorm and softmax in f32, RoPE tables in
//! f32 rounded to the compute dtype, masked scores replaced by the most negative f32 (not
//! -inf, so a query row whose keys are all padding gives a uniform average, not NaN).
//!
//! Layout choices for speed: the residual stream is `[batch*seq, hidden]` so every
//! projection is one large 2-D matmul against the `[out, in]` weight (contracting the
//! weight's second dimension, no transpose op), and attention uses batched dot_generals
//! over `[batch, kv_head]` with the query heads of a group kept together (GQA without
//! materialising repeated keys).

mod decoder;
mod graph;

use std::collections::{BTreeSet, HashMap};

use siphon_hlo::{Builder, CompareDir, DType, TensorType, Value};
use siphon_mesh::{Mesh, PartitionSpec};

pub(crate) use self::decoder::{decoder_params, pre_norm_decoder, self_attention_decoder};
pub(crate) use self::graph::Graph;
use crate::config::{ModelConfig, ParamInfo};
use crate::hooks::{HookPoint, Scope};
use crate::{ModelError, StoredForm};

/// What to build: shapes, hooks, dtypes and sharding.
#[derive(Debug, Clone)]
pub struct ForwardSpec {
    /// Rows per batch.
    pub batch: usize,
    /// Tokens per row.
    pub seq: usize,
    /// The activations to return, in result order. Blocks after the last one needed are
    /// not built.
    pub hooks: Vec<HookPoint>,
    /// Dtype of the weights and of the compute (`F32` or `BF16`).
    pub compute_dtype: DType,
    /// Dtype of the returned activations (`F32`, `BF16` or `F16`), or `F8E4M3FN`: each token's
    /// row of a hook quantized with its own f32 scale, returned as bytes ([`FP8_MAX`]).
    pub output_dtype: DType,
    /// The device mesh. A mesh without axes means one device and no sharding annotations.
    pub mesh: Mesh,
    /// Partition spec per weight, by Hugging Face name; a missing name is replicated.
    pub param_specs: HashMap<String, PartitionSpec>,
    /// Partition spec of the three `[batch, seq]` inputs; `None` is replicated.
    pub input_spec: Option<PartitionSpec>,
    /// Rows per expert in each dispatch round of a mixture (see [`crate::moe`]); `None`
    /// chooses from the mean load.
    pub expert_capacity: Option<usize>,
    /// Weights taken in their stored form and dequantized in the program, by Hugging Face
    /// name (see [`crate::StoredForm`]); the others are taken in the compute dtype.
    pub stored: HashMap<String, StoredForm>,
    /// Whether the program may call siphon's CPU kernels (`siphon-kernels`, registered with
    /// the CPU plugin: `siphon_runtime::Client::cpu_kernels`) where they are faster than XLA's
    /// ops: a mixture's experts on one device in f32.
    pub cpu_kernels: bool,
    /// The weights the program declares, by Hugging Face name. `None` (the default): exactly
    /// those its graph reads, which [`build_forward`] learns by building once with every
    /// weight of the blocks it builds. Given (as an engine passes what its first build
    /// found), it must be exactly that set: a weight read but not given, or given but never
    /// read, is an error naming it.
    pub weights: Option<BTreeSet<String>>,
}

impl ForwardSpec {
    /// One device, f32 in and out, no sharding.
    pub fn new(batch: usize, seq: usize, hooks: Vec<HookPoint>) -> ForwardSpec {
        ForwardSpec {
            batch,
            seq,
            hooks,
            compute_dtype: DType::F32,
            output_dtype: DType::F32,
            mesh: Mesh::single_device(),
            param_specs: HashMap::new(),
            input_spec: None,
            expert_capacity: None,
            stored: HashMap::new(),
            cpu_kernels: false,
            weights: None,
        }
    }

    /// Uses `mesh` with the fixed Megatron-style plan of [`crate::sharding::megatron_specs`].
    pub fn with_megatron_plan(mut self, config: &ModelConfig, mesh: Mesh) -> ForwardSpec {
        let (params, input) = crate::sharding::megatron_specs(config, &mesh);
        self.param_specs = params;
        self.input_spec = Some(input);
        self.mesh = mesh;
        self
    }
}

/// One `[batch, seq]` i32 input of the program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputInfo {
    /// `input_ids`, `attention_mask` or `position_ids`.
    pub name: &'static str,
    /// `[batch, seq]`.
    pub shape: Vec<usize>,
    /// Always `I32`.
    pub dtype: DType,
    /// How it is split over the mesh.
    pub spec: PartitionSpec,
}

/// One result of the program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputInfo {
    /// Which activation.
    pub hook: HookPoint,
    /// `[batch, seq, *per-token shape]`.
    pub shape: Vec<usize>,
    /// The output dtype.
    pub dtype: DType,
    /// How it comes back split over the mesh.
    pub spec: PartitionSpec,
}

/// A built forward pass: the program text and the order and meaning of its arguments and
/// results.
#[derive(Debug, Clone)]
pub struct ForwardProgram {
    /// StableHLO module text (entry function `@main`).
    pub text: String,
    /// Weight arguments, in argument order.
    pub params: Vec<ParamInfo>,
    /// Partition spec of each weight (same order as `params`).
    pub param_specs: Vec<PartitionSpec>,
    /// Each weight's stored form when the program takes it as its parts (same order as
    /// `params`): its arguments are then [`StoredForm::parts`], split by
    /// [`StoredForm::part_specs`], instead of one array in `param_dtype`.
    pub param_forms: Vec<Option<StoredForm>>,
    /// Dtype of every weight taken whole.
    pub param_dtype: DType,
    /// The inputs that follow the weights: `input_ids`, `attention_mask`, `position_ids`.
    pub inputs: Vec<InputInfo>,
    /// The results, in order.
    pub outputs: Vec<OutputInfo>,
    /// The mesh the program is partitioned over.
    pub mesh: Mesh,
    /// Number of blocks the program runs.
    pub n_blocks: usize,
    /// Declared weights the graph never read (only where [`ForwardSpec::weights`] is `None`:
    /// [`build_forward`] then builds again without them).
    unread: Vec<String>,
}

/// Builds the forward pass of `config` as described by `spec`. Its weight arguments are
/// exactly the weights its graph reads, whatever the hooks: unless `spec` names them, a first
/// build declares every weight of the blocks the hooks need (and the model's own: embeddings,
/// a final norm, per-layer inputs) and notes which it read, and the program is built again
/// with those alone when some went unread.
pub fn build_forward(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    config.validate()?;
    let build = crate::family::family(config.arch).build;
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
    use super::*;
    use crate::config::{Arch, RopeScaling};
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
            arch: Arch::Qwen2,
            vocab_size: 32,
            hidden_size: 16,
            intermediate_size: 24,
            n_layers: 3,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 4,
            rms_norm_eps: 1e-6,
            rope_theta: 10000.0,
            max_position_embeddings: 128,
            tie_word_embeddings: true,
            qkv_bias: true,
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
        let hooks: Vec<HookPoint> = crate::hooks::hook_kinds(&ModelConfig { arch: Arch::Llama, ..tiny() })
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
    fn llama3_scaling_matches_hf_formula() {
        use crate::layers::rope::rope_inv_freq;
        let mut c = tiny();
        c.head_dim = 64;
        c.rope_theta = 500000.0;
        let plain = rope_inv_freq(&c);
        c.rope_scaling = Some(RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        });
        let scaled = rope_inv_freq(&c);
        // High frequencies (short wavelengths) untouched, the lowest divided by the factor.
        assert_eq!(scaled[0], plain[0]);
        assert!((scaled[31] - plain[31] / 8.0).abs() <= 1e-6 * plain[31]);
        // Medium band lies strictly between.
        let mid = (0..32).find(|&i| scaled[i] != plain[i] && (scaled[i] - plain[i] / 8.0).abs() > 1e-12).unwrap();
        assert!(scaled[mid] < plain[mid] && scaled[mid] > plain[mid] / 8.0);
    }
}
