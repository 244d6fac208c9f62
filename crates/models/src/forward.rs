//! The forward pass as a StableHLO program: what goes in ([`ForwardSpec`]), what comes out
//! ([`ForwardProgram`]), and the graph pieces every architecture shares (RMSNorm, RoPE,
//! grouped-query attention, the SiLU-gated MLP, hook collection).
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

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use siphon_hlo::{Builder, CompareDir, DType, DotDims, HloError, TensorType, Value};
use siphon_mesh::{Mesh, PartitionSpec};

use crate::config::{Activation, ModelConfig, ParamInfo, RopeScaling};
use crate::hooks::{HookKind, HookPoint, Scope};
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

/// Graph state shared by the architecture files: the builder, the weights by name, the
/// shapes, and the per-batch tables (RoPE, mask) built once for all blocks.
pub(crate) struct Graph<'a> {
    pub b: Builder,
    pub config: &'a ModelConfig,
    pub spec: &'a ForwardSpec,
    pub dt: DType,
    /// Each declared weight's value and whether the graph read it.
    weights: HashMap<String, (Value, Cell<bool>)>,
    params: Vec<ParamInfo>,
    param_specs: Vec<PartitionSpec>,
    param_forms: Vec<Option<StoredForm>>,
    /// Mesh axes the flattened token dimension `batch*seq` is split over.
    token_axes: Vec<String>,
    input_spec: PartitionSpec,
    sharded: bool,
    pub input_ids: Value,
    pub attention_mask: Value,
    pub position_ids: Value,
    hooks: BTreeMap<HookPoint, Value>,
    /// Attention masks built so far, by window.
    masks: Vec<(Option<usize>, Value)>,
    /// RoPE tables built so far, by local base (`None`: the model's) and head width.
    ropes: Vec<(Option<f64>, usize, (Value, Value))>,
}

impl<'a> Graph<'a> {
    /// Validates `spec`, declares the weight arguments (those of `spec.weights`, else every
    /// weight of `n_blocks` blocks and the model's own), then the three inputs.
    pub fn new(config: &'a ModelConfig, spec: &'a ForwardSpec, n_blocks: usize) -> Result<Graph<'a>, ModelError> {
        if spec.batch == 0 || spec.seq == 0 {
            return Err(ModelError::Config(format!("batch {} x seq {} has no tokens", spec.batch, spec.seq)));
        }
        if !matches!(spec.compute_dtype, DType::F32 | DType::BF16) {
            return Err(ModelError::Config(format!("compute dtype {} (supported: f32, bf16)", spec.compute_dtype)));
        }
        if !matches!(spec.output_dtype, DType::F32 | DType::BF16 | DType::F16 | DType::F8E4M3FN) {
            return Err(ModelError::Config(format!(
                "output dtype {} (supported: f32, bf16, f16, f8E4M3FN)",
                spec.output_dtype
            )));
        }
        let all: Vec<String> = config.params(config.n_layers, true).into_iter().map(|p| p.name).collect();
        if let Some(unknown) = spec.param_specs.keys().find(|k| !all.contains(k)) {
            return Err(ModelError::Sharding(format!(
                "partition spec given for {unknown:?}, which is not a weight of this model"
            )));
        }
        let sharded = !spec.mesh.axes().is_empty();
        let mut b = if sharded {
            Builder::with_mesh("siphon_forward", spec.mesh.clone())
        } else {
            Builder::new("siphon_forward")
        };
        let dt = spec.compute_dtype;
        let mut params = config.params(n_blocks, false);
        if let Some(names) = &spec.weights {
            if let Some(name) = names.iter().find(|n| !params.iter().any(|p| &p.name == *n)) {
                return Err(ModelError::Config(format!(
                    "weight {name:?} is not a weight of this model's first {n_blocks} blocks or of the model itself"
                )));
            }
            params.retain(|p| names.contains(&p.name));
        }
        let mut weights = HashMap::new();
        let mut param_specs = Vec::new();
        let mut param_forms = Vec::new();
        for p in &params {
            let pspec =
                spec.param_specs.get(&p.name).cloned().unwrap_or_else(|| PartitionSpec::replicated(p.shape.len()));
            // Validated on every mesh: on one without axes this rejects any split and a
            // wrong rank, so the specs handed back are always usable.
            pspec.validate(&p.shape, &spec.mesh).map_err(|e| ModelError::Sharding(format!("{}: {e}", p.name)))?;
            let form = spec.stored.get(&p.name).copied();
            let v = match form {
                None => b.arg(TensorType::new(dt, &p.shape), sharded.then(|| pspec.clone()))?,
                Some(form) => {
                    let specs = form.part_specs(&p.name, &p.shape, &pspec, &spec.mesh)?;
                    let mut parts = Vec::new();
                    for (part, pspec) in form.parts(&p.shape).into_iter().zip(specs) {
                        let ty = TensorType::new(part.dtype.hlo(), &part.shape);
                        parts.push(b.arg(ty, sharded.then_some(pspec))?);
                    }
                    form.dequantize(&mut b, &parts, &p.shape, dt)?
                }
            };
            weights.insert(p.name.clone(), (v, Cell::new(false)));
            param_specs.push(pspec);
            param_forms.push(form);
        }
        let input_spec = spec.input_spec.clone().unwrap_or_else(|| PartitionSpec::replicated(2));
        input_spec
            .validate(&[spec.batch, spec.seq], &spec.mesh)
            .map_err(|e| ModelError::Sharding(format!("inputs [batch, seq]: {e}")))?;
        let ids_ty = TensorType::new(DType::I32, &[spec.batch, spec.seq]);
        let in_spec = sharded.then(|| input_spec.clone());
        let input_ids = b.arg(ids_ty.clone(), in_spec.clone())?;
        let attention_mask = b.arg(ids_ty.clone(), in_spec.clone())?;
        let position_ids = b.arg(ids_ty, in_spec)?;
        let token_axes = input_spec.dims().concat();
        Ok(Graph {
            b,
            config,
            spec,
            dt,
            weights,
            params,
            param_specs,
            param_forms,
            token_axes,
            input_spec,
            sharded,
            input_ids,
            attention_mask,
            position_ids,
            hooks: BTreeMap::new(),
            masks: Vec::new(),
            ropes: Vec::new(),
        })
    }

    /// Number of tokens in the batch.
    pub fn tokens(&self) -> usize {
        self.spec.batch * self.spec.seq
    }

    /// How many parts the token dimension is split into over the mesh (1 on one device):
    /// token-local work such as a mixture's dispatch runs per part.
    pub fn token_groups(&self) -> usize {
        self.token_axes.iter().map(|a| self.spec.mesh.axis_size(a).unwrap_or(1)).product()
    }

    /// Whether the program is partitioned over a mesh.
    pub fn sharded(&self) -> bool {
        self.sharded
    }

    /// The weight argument named `name`, noted as read.
    pub fn w(&self, name: &str) -> Result<Value, ModelError> {
        let (value, read) = self
            .weights
            .get(name)
            .ok_or_else(|| ModelError::Config(format!("the forward needs weight {name:?}, which was not declared")))?;
        read.set(true);
        Ok(*value)
    }

    /// Whether `hook` was requested.
    pub fn wants(&self, hook: HookPoint) -> bool {
        self.spec.hooks.contains(&hook)
    }

    /// Records `x` as `hook` if it was requested. `x` holds the hook's values token-major
    /// (`[tokens, …]` with the per-token elements in the hook's shape order); [`Graph::finish`]
    /// reshapes it to `[batch, seq, *shape]`.
    pub fn hook(&mut self, hook: HookPoint, x: Value) {
        if self.wants(hook) {
            self.hooks.insert(hook, x);
        }
    }

    /// Pins the residual stream `[tokens, hidden]` to the input's token split, so every
    /// block starts from the same layout whatever propagation chose inside.
    pub fn constrain_tokens(&mut self, x: Value) -> Result<Value, ModelError> {
        if !self.sharded {
            return Ok(x);
        }
        let axes: Vec<&str> = self.token_axes.iter().map(String::as_str).collect();
        Ok(self.b.sharding_constraint(x, &PartitionSpec::new(&[&axes, &[]]))?)
    }

    /// Token embeddings `[tokens, hidden]` from the table `table`.
    pub fn embed(&mut self, table: &str) -> Result<Value, ModelError> {
        let ids = self.input_ids;
        self.rows_of(table, ids)
    }

    /// `x * factor`, the factor rounded to the compute dtype first, as Hugging Face's scaled
    /// embeddings and scalar multiplies round it.
    pub fn scale(&mut self, x: Value, factor: f64) -> Result<Value, ModelError> {
        let dims = self.b.dims(x)?.to_vec();
        let factor = self.b.splat(factor, TensorType::new(self.dt, &dims))?;
        Ok(self.b.mul(x, factor)?)
    }

    /// Learned position embeddings `[tokens, hidden]` (GPT-2's `wpe`), by position id.
    pub fn embed_positions(&mut self, table: &str) -> Result<Value, ModelError> {
        let positions = self.position_ids;
        self.rows_of(table, positions)
    }

    fn rows_of(&mut self, table: &str, ids: Value) -> Result<Value, ModelError> {
        let table = self.w(table)?;
        let ids = self.b.reshape(ids, &[self.tokens()])?;
        let x = self.b.take_rows(table, ids)?;
        self.constrain_tokens(x)
    }

    /// Hugging Face's RMSNorm: `w * (x / sqrt(mean(x²) + eps))`, the normalisation in f32,
    /// cast back to the compute dtype before the weight multiply. Hands back the parts that
    /// TransformerLens hooks (see [`Graph::hook_norm`]).
    pub fn rms_norm(&mut self, x: Value, weight: &str) -> Result<Norm, ModelError> {
        self.rms_norm_with(x, weight, Gain::Plain)
    }

    /// RMSNorm with the gain applied as `gain` says: [`Gain::Plain`] is [`Graph::rms_norm`];
    /// [`Gain::UnitOffset`] is Gemma's `(x / rms(x)) * (1 + w)`, the multiply in f32 before
    /// the cast back.
    pub fn rms_norm_with(&mut self, x: Value, weight: &str, gain: Gain) -> Result<Norm, ModelError> {
        self.rms_norm_gain_eps(x, weight, gain, self.config.rms_norm_eps)
    }

    /// [`Graph::rms_norm`] with its own `eps` (MLA's latent norms).
    pub fn rms_norm_eps(&mut self, x: Value, weight: &str, eps: f64) -> Result<Norm, ModelError> {
        self.rms_norm_gain_eps(x, weight, Gain::Plain, eps)
    }

    fn rms_norm_gain_eps(&mut self, x: Value, weight: &str, gain: Gain, eps: f64) -> Result<Norm, ModelError> {
        let w = self.w(weight)?;
        let (var, normed, normalized) = self.rms_normalize(x, eps)?;
        let dims = self.b.dims(x)?.to_vec();
        let (rows, hidden) = (dims[0], dims[1]);
        let b = &mut self.b;
        let w = b.broadcast_in_dim(w, &[rows, hidden], &[1])?;
        let out = match gain {
            Gain::Plain => b.mul(normalized, w)?,
            Gain::F32 => {
                let wf = b.convert(w, DType::F32)?;
                let out = b.mul(normed, wf)?;
                b.convert(out, self.dt)?
            }
            Gain::UnitOffset => {
                let wf = b.convert(w, DType::F32)?;
                let one = b.splat(1.0, TensorType::new(DType::F32, &[rows, hidden]))?;
                let wf = b.add(wf, one)?;
                let out = b.mul(normed, wf)?;
                b.convert(out, self.dt)?
            }
        };
        Ok(Norm { var, normalized, out })
    }

    /// RMSNorm without a gain (Gemma 4's `v_norm` and router norm): its output is the
    /// normalized input.
    pub fn rms_norm_unscaled(&mut self, x: Value) -> Result<Norm, ModelError> {
        let (var, _, normalized) = self.rms_normalize(x, self.config.rms_norm_eps)?;
        Ok(Norm { var, normalized, out: normalized })
    }

    /// `x / sqrt(mean(x²) + eps)` of every row of `x` `[rows, hidden]`, in f32: the variance
    /// plus eps, the f32 result, and the result in the compute dtype.
    fn rms_normalize(&mut self, x: Value, eps: f64) -> Result<(Value, Value, Value), ModelError> {
        let dims = self.b.dims(x)?.to_vec();
        let (rows, hidden) = (dims[0], dims[1]);
        let b = &mut self.b;
        let xf = b.convert(x, DType::F32)?;
        let sq = b.mul(xf, xf)?;
        let sum = b.reduce_sum(sq, &[1])?;
        let n = b.splat(hidden as f64, TensorType::new(DType::F32, &[rows]))?;
        let mean = b.div(sum, n)?;
        let eps = b.splat(eps, TensorType::new(DType::F32, &[rows]))?;
        let var = b.add(mean, eps)?;
        let inv = b.rsqrt(var)?;
        let inv = b.broadcast_in_dim(inv, &[rows, hidden], &[0])?;
        let normed = b.mul(xf, inv)?;
        let normalized = b.convert(normed, self.dt)?;
        Ok((var, normed, normalized))
    }

    /// `x + norm(y)` for a sublayer's output `y` normalised before it joins the residual
    /// stream `x` (Gemma's and OLMo 2's post-norms), recording the norm's scale, normalized
    /// and output hooks.
    pub fn add_post_normed(
        &mut self,
        x: Value,
        y: Value,
        weight: &str,
        gain: Gain,
        hooks: [HookPoint; 3],
    ) -> Result<Value, ModelError> {
        let post = self.rms_norm_with(y, weight, gain)?;
        self.hook_norm(&post, hooks[0], hooks[1], hooks[2])?;
        Ok(self.b.add(x, post.out)?)
    }

    /// PyTorch's LayerNorm: `(x - mean(x)) / sqrt(var(x) + eps) * w + bias`, all in f32, cast
    /// back to the compute dtype (the scale hook is `sqrt(var(x) + eps)`, the normalized one
    /// the centred input divided by it, as TransformerLens has them for LayerNorm).
    pub fn layer_norm(&mut self, x: Value, weight: &str, bias: &str) -> Result<Norm, ModelError> {
        let w = self.w(weight)?;
        let bias = self.w(bias)?;
        let dims = self.b.dims(x)?.to_vec();
        let (rows, hidden) = (dims[0], dims[1]);
        let b = &mut self.b;
        let row = TensorType::new(DType::F32, &[rows]);
        let xf = b.convert(x, DType::F32)?;
        let n = b.splat(hidden as f64, row.clone())?;
        let sum = b.reduce_sum(xf, &[1])?;
        let mean = b.div(sum, n)?;
        let mean = b.broadcast_in_dim(mean, &[rows, hidden], &[0])?;
        let centred = b.sub(xf, mean)?;
        let sq = b.mul(centred, centred)?;
        let sum = b.reduce_sum(sq, &[1])?;
        let var = b.div(sum, n)?;
        let eps = b.splat(self.config.rms_norm_eps, row)?;
        let var = b.add(var, eps)?;
        let inv = b.rsqrt(var)?;
        let inv = b.broadcast_in_dim(inv, &[rows, hidden], &[0])?;
        let normed = b.mul(centred, inv)?;
        let normalized = b.convert(normed, self.dt)?;
        let wf = b.convert(w, DType::F32)?;
        let wf = b.broadcast_in_dim(wf, &[rows, hidden], &[1])?;
        let bf = b.convert(bias, DType::F32)?;
        let bf = b.broadcast_in_dim(bf, &[rows, hidden], &[1])?;
        let out = b.mul(normed, wf)?;
        let out = b.add(out, bf)?;
        let out = b.convert(out, self.dt)?;
        Ok(Norm { var, normalized, out })
    }

    /// Records a norm's three hooks: its scale `sqrt(mean(x²) + eps)` (built only when
    /// requested), its normalized input and its output.
    pub fn hook_norm(
        &mut self,
        norm: &Norm,
        scale: HookPoint,
        normalized: HookPoint,
        out: HookPoint,
    ) -> Result<(), ModelError> {
        if self.wants(scale) {
            let s = self.b.sqrt(norm.var)?;
            self.hook(scale, s);
        }
        self.hook(normalized, norm.normalized);
        self.hook(out, norm.out);
        Ok(())
    }

    /// `x · Wᵀ (+ bias)` for a Hugging Face `[out, in]` weight.
    pub fn linear(&mut self, x: Value, weight: &str, bias: Option<&str>) -> Result<Value, ModelError> {
        let w = self.w(weight)?;
        let y = self.b.matmul_t(x, w)?;
        match bias {
            None => Ok(y),
            Some(bias) => {
                let bv = self.w(bias)?;
                let dims = self.b.dims(y)?.to_vec();
                let bv = self.b.broadcast_in_dim(bv, &dims, &[dims.len() - 1])?;
                Ok(self.b.add(y, bv)?)
            }
        }
    }

    /// Block `layer`'s q, k and v from the parts of a fused projection with biases, cut on read
    /// (`{fused}.weight[q]`, `{fused}.bias[q]`, …: GPT-2's `c_attn`, GPT-NeoX's
    /// `query_key_value`), recording `attn.hook_q` / `hook_k` / `hook_v`.
    pub fn fused_qkv(&mut self, x: Value, layer: usize, fused: &str) -> Result<[Value; 3], ModelError> {
        let mut out = [x; 3];
        for (slot, (part, kind)) in
            out.iter_mut().zip([("q", HookKind::AttnQ), ("k", HookKind::AttnK), ("v", HookKind::AttnV)])
        {
            *slot = self.linear(x, &format!("{fused}.weight[{part}]"), Some(&format!("{fused}.bias[{part}]")))?;
            self.hook(HookPoint::block(layer, kind), *slot);
        }
        Ok(out)
    }

    /// The RoPE tables of block `layer`: the model's, or the local ones (`local_rope_theta`,
    /// no scaling) on a sliding-window layer of a family that has them (Gemma 3). Built once
    /// per kind and shared by the blocks that use it.
    pub fn layer_rope(&mut self, layer: usize) -> Result<(Value, Value), ModelError> {
        let c = self.config;
        let windowed = c.window(layer).is_some();
        let local = c.local_rope_theta.filter(|_| windowed);
        let head_dim = c.head_dim_at(layer);
        if let Some(&(_, _, tables)) = self.ropes.iter().find(|(l, d, _)| *l == local && *d == head_dim) {
            return Ok(tables);
        }
        let rotated = c.rotary_dim.unwrap_or(head_dim);
        let (inv_freq, scale) = match (local, &c.rope_scaling) {
            (Some(theta), _) => (inv_freq(head_dim, theta, None), 1.0),
            (
                None,
                Some(RopeScaling::LongRope { original_max_position_embeddings: original, attention_factor, .. }),
            ) => {
                // Hugging Face switches to the long factors once a batch reaches past the
                // original context, whatever its rows' lengths: refuse rather than guess.
                if self.spec.seq > *original {
                    return Err(ModelError::UnsupportedArch(format!(
                        "longrope scaling with sequences of {} tokens, longer than original_max_position_embeddings {original} \
                         (Hugging Face then switches to long_factor depending on the batch; siphon reads up to {original})",
                        self.spec.seq
                    )));
                }
                (inv_freq(rotated, c.rope_theta, c.rope_scaling.as_ref()), *attention_factor)
            }
            (None, Some(RopeScaling::Yarn { attention_factor, .. })) => {
                (inv_freq(rotated, c.rope_theta, c.rope_scaling.as_ref()), *attention_factor)
            }
            (None, _) => (inv_freq(rotated, c.rope_theta, c.rope_scaling.as_ref()), 1.0),
        };
        let tables = self.rope_tables(&inv_freq, scale)?;
        self.ropes.push((local, head_dim, tables));
        Ok(tables)
    }

    /// RoPE tables `(cos, sin)`, each `[tokens, rotary width]` in the compute dtype, from the
    /// position ids: `emb = concat(freqs, freqs)`, `freqs = pos * inv_freq`, computed in f32,
    /// cos and sin multiplied by `scale` (LongRoPE's attention factor) when it is not 1.
    fn rope_tables(&mut self, inv_freq: &[f32], scale: f64) -> Result<(Value, Value), ModelError> {
        let half = inv_freq.len();
        let t = self.tokens();
        let b = &mut self.b;
        let inv = b.constant_f32(inv_freq, &[half])?;
        let pos = b.reshape(self.position_ids, &[t])?;
        let pos = b.convert(pos, DType::F32)?;
        let pos = b.broadcast_in_dim(pos, &[t, half], &[0])?;
        let inv = b.broadcast_in_dim(inv, &[t, half], &[1])?;
        let freqs = b.mul(pos, inv)?;
        let emb = b.concatenate(&[freqs, freqs], 1)?;
        let mut cos = b.cos(emb)?;
        let mut sin = b.sin(emb)?;
        if scale != 1.0 {
            let s = b.splat(scale, TensorType::new(DType::F32, &[t, 2 * half]))?;
            cos = b.mul(cos, s)?;
            sin = b.mul(sin, s)?;
        }
        Ok((b.convert(cos, self.dt)?, b.convert(sin, self.dt)?))
    }

    /// Rotates `x` `[tokens, heads, head_dim]` with Hugging Face's rotate-half RoPE:
    /// `x·cos + rotate_half(x)·sin`, `rotate_half(x) = concat(-x₂, x₁)`, over the first
    /// `rotary_dim` dimensions of each head (all of them by default); the rest pass through.
    pub fn apply_rope(&mut self, x: Value, cos: Value, sin: Value) -> Result<Value, ModelError> {
        let dims = self.b.dims(x)?.to_vec();
        if let Some(r) = self.config.rotary_dim.filter(|&r| r < dims[2]) {
            let rot = self.b.slice_dim(x, 2, 0, r)?;
            let pass = self.b.slice_dim(x, 2, r, dims[2])?;
            let rot = self.apply_rope(rot, cos, sin)?;
            return Ok(self.b.concatenate(&[rot, pass], 2)?);
        }
        let d = dims[2];
        let b = &mut self.b;
        let x1 = b.slice_dim(x, 2, 0, d / 2)?;
        let x2 = b.slice_dim(x, 2, d / 2, d)?;
        let nx2 = b.neg(x2)?;
        let rot = b.concatenate(&[nx2, x1], 2)?;
        let cos = b.broadcast_in_dim(cos, &dims, &[0, 2])?;
        let sin = b.broadcast_in_dim(sin, &dims, &[0, 2])?;
        let a = b.mul(x, cos)?;
        let r = b.mul(rot, sin)?;
        Ok(b.add(a, r)?)
    }

    /// The attention mask of block `layer` (its window from the config), built once per
    /// distinct window and shared by the blocks that have it.
    pub fn layer_mask(&mut self, layer: usize) -> Result<Value, ModelError> {
        let window = self.config.window(layer);
        if let Some(&(_, mask)) = self.masks.iter().find(|(w, _)| *w == window) {
            return Ok(mask);
        }
        let mask = self.attention_mask(window)?;
        self.masks.push((window, mask));
        Ok(mask)
    }

    /// The attention mask of the blocks with `window`: `[batch, seq_q, seq_k]` predicate,
    /// true where query `i` may attend key `j` (`j <= i`, `i - j < window` when windowed, and
    /// key `j` is a real token). Padding is contiguous at either end of a row, so index
    /// distances are position distances, as in Hugging Face's mask.
    pub fn attention_mask(&mut self, window: Option<usize>) -> Result<Value, ModelError> {
        let (bsz, s) = (self.spec.batch, self.spec.seq);
        let b = &mut self.b;
        let qi = b.iota(TensorType::new(DType::I32, &[s, s]), 0)?;
        let ki = b.iota(TensorType::new(DType::I32, &[s, s]), 1)?;
        let mut causal = b.compare(CompareDir::Ge, qi, ki)?;
        if let Some(w) = window.filter(|&w| w < s) {
            // j > i - w, i.e. j + w > i.
            let w = b.splat(w as f64, TensorType::new(DType::I32, &[s, s]))?;
            let reach = b.add(ki, w)?;
            let recent = b.compare(CompareDir::Gt, reach, qi)?;
            causal = b.and(causal, recent)?;
        }
        let causal = b.broadcast_in_dim(causal, &[bsz, s, s], &[1, 2])?;
        let zero = b.splat(0.0, TensorType::new(DType::I32, &[bsz, s]))?;
        let real = b.compare(CompareDir::Ne, self.attention_mask, zero)?;
        let real = b.broadcast_in_dim(real, &[bsz, s, s], &[0, 2])?;
        Ok(b.and(causal, real)?)
    }

    /// Grouped-query attention of block `layer` (its heads). `q` is `[tokens, n_heads*head_dim]`
    /// (RoPE applied), `k` and `v` `[tokens, n_kv_heads*head_dim]`; query head `h` reads kv head
    /// `h / (n_heads/n_kv_heads)` (Hugging Face's `repeat_kv`). Returns `z`,
    /// `[tokens, n_heads*head_dim]` ready for `o_proj`, and the scores and probabilities in
    /// the internal `[batch, kv_head, query, group, key]` layout (see [`Graph::per_query`]).
    /// With `sinks` (`[n_heads]`, GPT-OSS), each head's softmax has one more logit, its sink,
    /// which takes probability and is then dropped: the pattern's rows sum to less than 1.
    pub fn attention(
        &mut self,
        layer: usize,
        q: Value,
        k: Value,
        v: Value,
        mask: Value,
        sinks: Option<Value>,
    ) -> Result<Attention, ModelError> {
        let c = self.config;
        let (bsz, s, nkv, hd) = (self.spec.batch, self.spec.seq, c.kv_heads_at(layer), c.head_dim_at(layer));
        let g = c.n_heads / nkv;
        let dt = self.dt;
        let b = &mut self.b;
        // Values may be narrower than queries and keys (MLA's v_head_dim).
        let hv = b.dims(v)?[1] / nkv;
        let q = b.reshape(q, &[bsz, s, nkv, g, hd])?;
        let k = b.reshape(k, &[bsz, s, nkv, hd])?;
        let v = b.reshape(v, &[bsz, s, nkv, hv])?;
        // scores[b, kv, i, g, j] = q[b, i, kv, g, :] · k[b, j, kv, :]
        let scores = b.dot_general(q, k, &DotDims::batched(&[0, 2], &[0, 2], &[4], &[3]))?;
        let sdims = vec![bsz, nkv, s, g, s];
        let scale = b.splat(c.attn_scalar.unwrap_or(hd as f64).powf(-0.5), TensorType::new(dt, &sdims))?;
        let mut scores = b.mul(scores, scale)?;
        if let Some(cap) = c.attn_softcap {
            // cap * tanh(s / cap), in the compute dtype, before the mask (Gemma 2).
            let cap = b.splat(cap, TensorType::new(dt, &sdims))?;
            let t = b.div(scores, cap)?;
            let t = b.tanh(t)?;
            scores = b.mul(t, cap)?;
        }
        let scores = b.convert(scores, DType::F32)?;
        let mask = b.broadcast_in_dim(mask, &sdims, &[0, 2, 4])?;
        let floor = b.splat(f32::MIN as f64, TensorType::new(DType::F32, &sdims))?;
        let scores = b.select(mask, scores, floor)?;
        let probs = match sinks {
            None => softmax_last(b, scores)?,
            Some(sinks) => {
                // softmax over [scores, sink] with the sink's column dropped.
                let sinks = b.convert(sinks, DType::F32)?;
                let sinks = b.reshape(sinks, &[nkv, g])?;
                let col = [bsz, nkv, s, g, 1];
                let sinks = b.broadcast_in_dim(sinks, &col, &[1, 3])?;
                let all = b.concatenate(&[scores, sinks], 4)?;
                let probs = softmax_last(b, all)?;
                b.slice_dim(probs, 4, 0, s)?
            }
        };
        let pattern = b.convert(probs, dt)?;
        // out[b, kv, i, g, :] = Σ_j probs[b, kv, i, g, j] · v[b, j, kv, :]
        let out = b.dot_general(pattern, v, &DotDims::batched(&[0, 1], &[0, 2], &[4], &[1]))?;
        let out = b.transpose(out, &[0, 2, 1, 3, 4])?;
        let z = b.reshape(out, &[bsz * s, c.n_heads * hv])?;
        Ok(Attention { scores, pattern, z })
    }

    /// [`Graph::attention`] of block `layer`, recording its scores, pattern and z hooks;
    /// returns z, `[tokens, n_heads*head_dim]`.
    pub fn attend(&mut self, layer: usize, q: Value, k: Value, v: Value, mask: Value) -> Result<Value, ModelError> {
        self.attend_with_sinks(layer, q, k, v, mask, None)
    }

    /// [`Graph::attend`] with attention sinks ([`Graph::attention`]).
    pub fn attend_with_sinks(
        &mut self,
        layer: usize,
        q: Value,
        k: Value,
        v: Value,
        mask: Value,
        sinks: Option<Value>,
    ) -> Result<Value, ModelError> {
        let at = |kind| HookPoint::block(layer, kind);
        let Attention { scores, pattern, z } = self.attention(layer, q, k, v, mask, sinks)?;
        if self.wants(at(HookKind::AttnScores)) {
            let rows = self.per_query(scores)?;
            let rows = self.finite_in_output(rows)?;
            self.hook(at(HookKind::AttnScores), rows);
        }
        if self.wants(at(HookKind::AttnPattern)) {
            let rows = self.per_query(pattern)?;
            self.hook(at(HookKind::AttnPattern), rows);
        }
        self.hook(at(HookKind::AttnZ), z);
        Ok(z)
    }

    /// Masked scores (the most negative f32) as the lowest finite value of the output dtype,
    /// what Hugging Face's mask (`finfo(dtype).min`) gives in that dtype; converted as they
    /// are they would round to -inf in bf16 and f16.
    pub fn finite_in_output(&mut self, x: Value) -> Result<Value, ModelError> {
        let lowest = match self.spec.output_dtype {
            DType::BF16 => -3.389_531_389_251_535_5e38,
            DType::F16 => -65504.0,
            _ => return Ok(x),
        };
        let dims = self.b.dims(x)?.to_vec();
        let floor = self.b.splat(lowest, TensorType::new(DType::F32, &dims))?;
        Ok(self.b.max(x, floor)?)
    }

    /// Scores or pattern from [`Graph::attention`]'s `[batch, kv_head, query, group, key]`
    /// layout to one row per query token, `[tokens, n_heads, key]` (head `kv*group + g`).
    pub fn per_query(&mut self, x: Value) -> Result<Value, ModelError> {
        let (t, s, h) = (self.tokens(), self.spec.seq, self.config.n_heads);
        let x = self.b.transpose(x, &[0, 2, 1, 3, 4])?;
        Ok(self.b.reshape(x, &[t, h, s])?)
    }

    /// The gated MLP: `down(act(gate(x)) * up(x))` with the config's activation (SiLU, or
    /// Gemma's tanh-approximated GELU), with its parts; the weights are
    /// `{prefix}.gate_proj.weight` and so on (`prefix` e.g. `model.layers.3.mlp`).
    pub fn gated_mlp(&mut self, x: Value, prefix: &str) -> Result<Mlp, ModelError> {
        let pre = self.linear(x, &format!("{prefix}.gate_proj.weight"), None)?;
        let up = self.linear(x, &format!("{prefix}.up_proj.weight"), None)?;
        let act = self.activation(pre)?;
        let post = self.b.mul(act, up)?;
        let out = self.linear(post, &format!("{prefix}.down_proj.weight"), None)?;
        Ok(Mlp { pre, pre_linear: Some(up), post, out })
    }

    /// Block `layer`'s dense gated MLP (`model.layers.{layer}.mlp.*`) with its hooks; returns
    /// its output.
    pub fn dense_mlp(&mut self, x: Value, layer: usize) -> Result<Value, ModelError> {
        let mlp = self.gated_mlp(x, &format!("model.layers.{layer}.mlp"))?;
        self.hook_mlp(&mlp, layer, HookKind::MlpOut);
        Ok(mlp.out)
    }

    /// Block `layer`'s shared expert, the gated MLP `prefix` beside a mixture's routed
    /// experts, with its `mlp.shared_expert.*` hooks; returns its output.
    pub fn shared_expert(&mut self, x: Value, prefix: &str, layer: usize) -> Result<Value, ModelError> {
        let at = |kind| HookPoint::block(layer, kind);
        let shared = self.gated_mlp(x, prefix)?;
        self.hook(at(HookKind::SharedPre), shared.pre);
        if let Some(up) = shared.pre_linear {
            self.hook(at(HookKind::SharedPreLinear), up);
        }
        self.hook(at(HookKind::SharedPost), shared.post);
        self.hook(at(HookKind::SharedOut), shared.out);
        Ok(shared.out)
    }

    /// The plain MLP `down(act(up(x) + b) + b)` of GPT-2 and GPT-NeoX, with its parts: `up`
    /// and `down` name each projection's weight and bias.
    pub fn plain_mlp(&mut self, x: Value, up: [&str; 2], down: [&str; 2]) -> Result<Mlp, ModelError> {
        let pre = self.linear(x, up[0], Some(up[1]))?;
        let post = self.activation(pre)?;
        let out = self.linear(post, down[0], Some(down[1]))?;
        Ok(Mlp { pre, pre_linear: None, post, out })
    }

    /// The config's activation applied to `x`.
    pub fn activation(&mut self, x: Value) -> Result<Value, ModelError> {
        Ok(activate(&mut self.b, self.config.activation, x, self.dt)?)
    }

    /// Records an MLP's hooks in block `layer`, its output as `out` (`hook_mlp_out`, or
    /// `mlp.hook_out` where a post-norm follows).
    pub fn hook_mlp(&mut self, mlp: &Mlp, layer: usize, out: HookKind) {
        let at = |kind| HookPoint::block(layer, kind);
        self.hook(at(HookKind::MlpPre), mlp.pre);
        if let Some(up) = mlp.pre_linear {
            self.hook(at(HookKind::MlpPreLinear), up);
        }
        self.hook(at(HookKind::MlpPost), mlp.post);
        self.hook(at(out), mlp.out);
    }

    /// Ends a decoder after its `n_blocks` blocks left the residual stream `x`: `x` is the
    /// next block's `hook_resid_pre` when that block is not built, then the final norm
    /// (`model.norm.weight`, its gain applied as `gain` says) and its hooks when asked for,
    /// then the program ([`Graph::finish`]).
    pub fn finish_decoder(
        mut self,
        x: Value,
        n_blocks: usize,
        with_final_norm: bool,
        gain: Gain,
    ) -> Result<ForwardProgram, ModelError> {
        self.end_blocks(x, n_blocks);
        if with_final_norm {
            let norm = self.rms_norm_with(x, "model.norm.weight", gain)?;
            self.hook_final_norm(&norm)?;
        }
        self.finish(n_blocks)
    }

    /// Records `x`, what the `n_blocks` built blocks left, as the next block's
    /// `hook_resid_pre` when that block is not built.
    pub fn end_blocks(&mut self, x: Value, n_blocks: usize) {
        if n_blocks < self.config.n_layers {
            self.hook(HookPoint::block(n_blocks, HookKind::ResidPre), x);
        }
    }

    /// Records the final norm's hooks.
    pub fn hook_final_norm(&mut self, norm: &Norm) -> Result<(), ModelError> {
        use HookKind::*;
        self.hook_norm(
            norm,
            HookPoint::model(LnFinalScale),
            HookPoint::model(LnFinalNormalized),
            HookPoint::model(LnFinalOut),
        )
    }

    /// Returns the requested hooks, each reshaped to `[batch, seq, *per-token shape]`, and
    /// prints the program.
    pub fn finish(self, n_blocks: usize) -> Result<ForwardProgram, ModelError> {
        let (bsz, s) = (self.spec.batch, self.spec.seq);
        let mut b = self.b;
        let mut results = Vec::new();
        let mut outputs = Vec::new();
        for &hook in &self.spec.hooks {
            let x = *self
                .hooks
                .get(&hook)
                .ok_or_else(|| ModelError::Hook(format!("{hook} was requested but the graph did not produce it")))?;
            let shape: Vec<usize> = [bsz, s].into_iter().chain(hook.dims(self.config, s)).collect();
            let x = b.reshape(x, &shape)?;
            let (x, shape, dtype) = match self.spec.output_dtype {
                // Each token's row flattened to its scale and values: `[batch, seq, 4 + n]`.
                DType::F8E4M3FN => {
                    let x = fp8_rows(&mut b, x)?;
                    let shape = b.dims(x)?.to_vec();
                    (x, shape, DType::U8)
                }
                dtype => (b.convert(x, dtype)?, shape, dtype),
            };
            let mut dims = self.input_spec.dims()[..2].to_vec();
            dims.resize(shape.len(), Vec::new());
            let out_spec = PartitionSpec::from_dims(dims);
            results.push((x, self.sharded.then(|| out_spec.clone())));
            outputs.push(OutputInfo { hook, shape, dtype, spec: out_spec });
        }
        let unread: Vec<String> =
            self.params.iter().map(|p| &p.name).filter(|n| !self.weights[*n].1.get()).cloned().collect();
        if self.spec.weights.is_some() && !unread.is_empty() {
            return Err(ModelError::Config(format!("the forward declares weights its graph never reads: {unread:?}")));
        }
        let text = b.finish_sharded(&results)?;
        let inputs = ["input_ids", "attention_mask", "position_ids"]
            .into_iter()
            .map(|name| InputInfo { name, shape: vec![bsz, s], dtype: DType::I32, spec: self.input_spec.clone() })
            .collect();
        Ok(ForwardProgram {
            text,
            params: self.params,
            param_specs: self.param_specs,
            param_forms: self.param_forms,
            param_dtype: self.dt,
            inputs,
            outputs,
            mesh: self.spec.mesh.clone(),
            n_blocks,
            unread,
        })
    }
}

/// The pre-norm decoder several families share around their own token mixer and MLP:
/// embeddings, then per block `x += mixer(norm(x))`, `x += mlp(norm(x))` with every
/// residual and norm hook, then the final norm. `mixer` records its own hooks and
/// `hook_attn_out` where it is attention; `mlp` records its insides; the loop records
/// `hook_mlp_out`. Norms apply their gain as `gain` says.
pub(crate) fn pre_norm_decoder(
    config: &ModelConfig,
    spec: &ForwardSpec,
    gain: Gain,
    mixer: impl Fn(&mut Graph<'_>, Value, usize) -> Result<Value, ModelError>,
    mlp: impl Fn(&mut Graph<'_>, Value, usize) -> Result<Value, ModelError>,
) -> Result<ForwardProgram, ModelError> {
    use HookKind::*;
    let (n_blocks, with_final_norm) = blocks_for(config, &spec.hooks)?;
    let mut g = Graph::new(config, spec, n_blocks)?;
    let mut x = g.embed("model.embed_tokens.weight")?;
    g.hook(HookPoint::model(Embed), x);
    for layer in 0..n_blocks {
        let at = |kind| HookPoint::block(layer, kind);
        let p = |name: &str| format!("model.layers.{layer}.{name}");
        g.hook(at(ResidPre), x);
        let ln1 = g.rms_norm_with(x, &p("input_layernorm.weight"), gain)?;
        g.hook_norm(&ln1, at(Ln1Scale), at(Ln1Normalized), at(Ln1Out))?;
        let mixed = mixer(&mut g, ln1.out, layer)?;
        let h = g.b.add(x, mixed)?;
        g.hook(at(ResidMid), h);
        let ln2 = g.rms_norm_with(h, &p("post_attention_layernorm.weight"), gain)?;
        g.hook_norm(&ln2, at(Ln2Scale), at(Ln2Normalized), at(MlpIn))?;
        let m = mlp(&mut g, ln2.out, layer)?;
        g.hook(at(MlpOut), m);
        let out = g.b.add(h, m)?;
        x = g.constrain_tokens(out)?;
        g.hook(at(ResidPost), x);
    }
    g.finish_decoder(x, n_blocks, with_final_norm, gain)
}

/// How a norm applies its gain `w`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gain {
    /// `w * x` (Llama and most families).
    Plain,
    /// `(1 + w) * x` in f32 (Gemma).
    UnitOffset,
    /// `w * x` in f32 before the cast back (OLMo 2).
    F32,
}

/// PyTorch's exact `gelu`, `x/2 * (1 + erf(x/√2))`, computed in f32 and cast back to `dt`.
/// `activation(x)` in the compute dtype `dt`.
pub(crate) fn activate(b: &mut Builder, activation: Activation, x: Value, dt: DType) -> Result<Value, HloError> {
    match activation {
        Activation::Silu => {
            let sig = b.logistic(x)?;
            b.mul(x, sig)
        }
        Activation::GeluTanh => gelu_tanh(b, x),
        Activation::Gelu => gelu_erf(b, x, dt),
    }
}

fn gelu_erf(b: &mut Builder, x: Value, dt: DType) -> Result<Value, HloError> {
    let xf = b.convert(x, DType::F32)?;
    let ty = b.ty(xf)?.clone();
    let r = b.splat(std::f64::consts::FRAC_1_SQRT_2, ty.clone())?;
    let e = b.mul(xf, r)?;
    let e = b.erf(e)?;
    let one = b.splat(1.0, ty.clone())?;
    let e = b.add(e, one)?;
    let half = b.splat(0.5, ty)?;
    let hx = b.mul(xf, half)?;
    let y = b.mul(hx, e)?;
    b.convert(y, dt)
}

/// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`, PyTorch's `gelu(approximate="tanh")`, in
/// `x`'s dtype.
fn gelu_tanh(b: &mut Builder, x: Value) -> Result<Value, HloError> {
    let ty = b.ty(x)?.clone();
    let c = |b: &mut Builder, v: f64| b.splat(v, ty.clone());
    let x3 = b.mul(x, x)?;
    let x3 = b.mul(x3, x)?;
    let k = c(b, 0.044715)?;
    let inner = b.mul(x3, k)?;
    let inner = b.add(x, inner)?;
    let s = c(b, (2.0 / std::f64::consts::PI).sqrt())?;
    let inner = b.mul(inner, s)?;
    let t = b.tanh(inner)?;
    let one = c(b, 1.0)?;
    let t = b.add(t, one)?;
    let half = c(b, 0.5)?;
    let hx = b.mul(x, half)?;
    b.mul(hx, t)
}

/// A norm's hookable parts (see [`Graph::rms_norm`]).
pub(crate) struct Norm {
    /// `mean(x²) + eps`, `[rows]`, f32.
    pub var: Value,
    /// `[rows, hidden]`, before the gain.
    pub normalized: Value,
    /// `[rows, hidden]`, after the gain.
    pub out: Value,
}

/// Attention's hookable parts (see [`Graph::attention`]).
pub(crate) struct Attention {
    /// Scaled, masked logits, f32, `[batch, kv_head, query, group, key]`.
    pub scores: Value,
    /// Probabilities in the compute dtype, same layout.
    pub pattern: Value,
    /// `[tokens, n_heads*head_dim]`, the input of `o_proj`.
    pub z: Value,
}

/// An MLP's hookable parts (see [`Graph::gated_mlp`], [`Graph::plain_mlp`]), each
/// `[tokens, width]`.
pub(crate) struct Mlp {
    /// Gate projection (a plain MLP's input projection).
    pub pre: Value,
    /// Up projection beside the gate (gated MLPs only).
    pub pre_linear: Option<Value>,
    /// `act(pre) * pre_linear` (`act(pre)` in a plain MLP).
    pub post: Value,
    /// Down projection.
    pub out: Value,
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

/// Softmax over the last dimension of an f32 tensor, max-subtracted.
pub(crate) fn softmax_last(b: &mut Builder, x: Value) -> Result<Value, ModelError> {
    let dims = b.dims(x)?.to_vec();
    let last = dims.len() - 1;
    let keep: Vec<usize> = (0..last).collect();
    let m = b.reduce_max(x, &[last])?;
    let m = b.broadcast_in_dim(m, &dims, &keep)?;
    let shifted = b.sub(x, m)?;
    let e = b.exp(shifted)?;
    let sum = b.reduce_sum(e, &[last])?;
    let sum = b.broadcast_in_dim(sum, &dims, &keep)?;
    Ok(b.div(e, sum)?)
}

/// RoPE inverse frequencies as Hugging Face computes them (f32), for the rotated width
/// (`rotary_dim`, else `head_dim`), with the config's scaling applied.
pub fn rope_inv_freq(config: &ModelConfig) -> Vec<f32> {
    inv_freq(config.rotary_dim.unwrap_or(config.head_dim), config.rope_theta, config.rope_scaling.as_ref())
}

/// Inverse frequencies of a `d`-wide head for base `theta` with `scaling`.
fn inv_freq(d: usize, theta: f64, scaling: Option<&RopeScaling>) -> Vec<f32> {
    let base = theta as f32;
    let inv: Vec<f32> = (0..d).step_by(2).map(|i| 1.0 / base.powf(i as f32 / d as f32)).collect();
    match scaling {
        None => inv,
        Some(RopeScaling::Linear { factor }) => inv.iter().map(|f| f / *factor as f32).collect(),
        // Hugging Face's _compute_proportional_rope_parameters: int(fraction * d // 2) rotated
        // frequencies, zeros for the rest, all divided by the factor.
        Some(RopeScaling::Proportional { fraction, factor }) => {
            let rotated = (fraction * d as f64 / 2.0).floor() as usize;
            inv.iter().enumerate().map(|(i, f)| if i < rotated { f / *factor as f32 } else { 0.0 }).collect()
        }
        // 1 / (factor * base^(i/d)), in f32 as Hugging Face computes it.
        Some(RopeScaling::LongRope { short_factor, .. }) => (0..d)
            .step_by(2)
            .zip(short_factor)
            .map(|(i, &f)| 1.0 / (f as f32 * base.powf(i as f32 / d as f32)))
            .collect(),
        // Hugging Face's _compute_yarn_parameters, its tensor arithmetic in f32.
        Some(RopeScaling::Yarn {
            factor, beta_fast, beta_slow, original_max_position_embeddings, truncate, ..
        }) => {
            let dim = d as f64;
            let correction = |rotations: f64| {
                let max = *original_max_position_embeddings as f64;
                dim * (max / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln())
            };
            let (mut low, mut high) = (correction(*beta_fast), correction(*beta_slow));
            if *truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
            if low == high {
                high += 0.001;
            }
            (0..d)
                .step_by(2)
                .enumerate()
                .map(|(j, i)| {
                    let pos = base.powf(i as f32 / d as f32);
                    let (extrapolated, interpolated) = (1.0 / pos, 1.0 / (*factor as f32 * pos));
                    let ramp = ((j as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
                    let keep = 1.0 - ramp;
                    interpolated * (1.0 - keep) + extrapolated * keep
                })
                .collect()
        }
        Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => {
            let (factor, low, high) = (*factor, *low_freq_factor, *high_freq_factor);
            let old = *original_max_position_embeddings as f64;
            let low_wavelen = old / low;
            let high_wavelen = old / high;
            inv.iter()
                .map(|&f| {
                    let f = f as f64;
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    let scaled = if wavelen > low_wavelen { f / factor } else { f };
                    // HF's `~(wavelen < high) * ~(wavelen > low)`; wavelengths are finite, so >= is the same.
                    let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                    if medium {
                        let smooth = (old / wavelen - low) / (high - low);
                        ((1.0 - smooth) * scaled / factor + smooth * scaled) as f32
                    } else {
                        scaled as f32
                    }
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Arch;
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
