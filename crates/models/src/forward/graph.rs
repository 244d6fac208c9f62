//! [`Graph`]: the builder, the weights by name (each noted when read), the inputs, the hooks
//! recorded so far and the per-batch tables the layers build once; the program it finishes
//! into ([`Graph::finish`]).

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};

use siphon_hlo::{Builder, DType, TensorType, Value};
use siphon_mesh::PartitionSpec;

use super::{ForwardProgram, ForwardSpec, InputInfo, OutputInfo, fp8_rows};
use crate::config::{ModelConfig, ParamInfo};
use crate::error::ModelError;
use crate::hooks::{HookKind, HookPoint};
use crate::stored::StoredForm;

/// Graph state shared by the architecture files: the builder, the weights by name, the
/// shapes, and the per-batch tables (RoPE, mask) built once for all blocks.
pub(crate) struct Graph<'a> {
    pub b: Builder,
    pub config: &'a ModelConfig,
    pub spec: &'a ForwardSpec,
    pub dt: DType,
    /// The blocks built: those up to the last one a requested hook needs.
    pub n_blocks: usize,
    /// Whether a requested hook is at or after the final norm.
    pub with_final_norm: bool,
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
    /// Each token's next token (−1: none), where the program computes `output.nll`.
    next_ids: Option<Value>,
    /// The chosen rows' weights `[batch, rows, seq]` ([`ForwardSpec::select`]).
    select: Option<Value>,
    /// Each row's uniform `[batch]`, where a decoding step draws ([`ForwardSpec::sampling`]).
    uniforms: Option<Value>,
    pub(crate) hooks: BTreeMap<HookPoint, Value>,
    /// Each dictionary's tensors (arguments after the inputs).
    pub(crate) dictionary_args: Vec<Vec<Value>>,
    /// Each steered hook's vector `[hidden]` f32 (arguments after the dictionaries').
    steering_args: Vec<(HookPoint, Value)>,
    /// The steered hooks whose vector the graph added somewhere (a family that never adds
    /// one it was given is refused: [`Graph::finish`]).
    steered: Vec<HookPoint>,
    /// Attention masks built so far, by window.
    pub(crate) masks: Vec<(Option<usize>, Value)>,
    /// RoPE tables built so far, by local base (`None`: the model's) and head width.
    pub(crate) ropes: Vec<(Option<f64>, usize, (Value, Value))>,
    /// The form each softmax attention took, by block.
    pub(crate) attention_forms: Vec<(usize, crate::forward::AttentionForm)>,
    /// Each row's real tokens (cuDNN's per-row lengths), once built.
    pub(crate) row_lengths: Option<Value>,
    /// Whether [`Graph::hook`] records (not while the blocks are replayed for a splice).
    pub(crate) recording: bool,
    /// Why this family's blocks cannot be built a second time from a hook on, where that is
    /// so (`super::splice`).
    pub(crate) replay_refusal: Option<&'static str>,
    /// Whether the family's blocks end with `hook_resid_mid + hook_mlp_out` as they are (a
    /// transcoder's reconstruction of the MLP's output is spliced there: `super::splice`).
    pub(crate) mlp_joins_resid_mid: bool,
    /// Each splice's residual stream after the last block, then its final norm's output
    /// (`super::splice`).
    pub(crate) splices: Vec<super::splice::Replayed>,
    /// A decoding step's caches, as the blocks are built (`crate::decode`).
    pub(crate) cache: Option<crate::decode::Cache>,
}

impl<'a> Graph<'a> {
    /// Validates `spec` and its hooks, declares the weight arguments (those of
    /// `spec.weights`, else every weight of the blocks the hooks need and the model's own),
    /// then the three inputs.
    pub fn new(config: &'a ModelConfig, spec: &'a ForwardSpec) -> Result<Graph<'a>, ModelError> {
        let (n_blocks, with_final_norm) = super::blocks_for(config, &spec.read_hooks())?;
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
        if let Some(outputs) = &spec.next_token {
            super::next_token::check(outputs, config)?;
        }
        // The untied unembedding only where the logits are computed.
        let mut params = config.params(n_blocks, spec.computes_logits());
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
                        let ty = TensorType::new(siphon_hlo::DType::from(part.dtype), &part.shape);
                        parts.push(b.arg(ty, sharded.then_some(pspec))?);
                    }
                    form.dequantize(&mut b, &parts, &p.shape, dt, spec.decode_without_tables)?
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
        let position_ids = b.arg(ids_ty.clone(), in_spec.clone())?;
        let next_ids = match spec.next_token.is_some_and(|o| o.nll) {
            true => Some(b.arg(ids_ty, in_spec)?),
            false => None,
        };
        super::select::check(spec)?;
        let select = match spec.select {
            Some(rows) => {
                let ty = TensorType::new(DType::F32, &[spec.batch, rows, spec.seq]);
                Some(b.arg(ty, sharded.then(|| super::select::input_spec(&input_spec)))?)
            }
            None => None,
        };
        let uniforms = match spec.decode.is_some() && spec.sampling.draws() {
            true => {
                let ty = TensorType::new(DType::F32, &[spec.batch]);
                Some(b.arg(ty, sharded.then(|| uniforms_spec(&input_spec)))?)
            }
            false => None,
        };
        let dictionary_args = crate::dictionary::encoder::args(&mut b, &spec.dictionaries, sharded)?;
        super::splice::check(spec, config)?;
        crate::steering::check_all(&spec.steering, config)?;
        // Past the blocks built, a vector changes nothing the program returns (but the next
        // block's input, where that is asked for): say so rather than take it silently.
        let stop = HookPoint::block(n_blocks, HookKind::ResidPre);
        let read = spec.read_hooks();
        let past = |h: &HookPoint| h.layer().is_some_and(|l| l >= n_blocks) && !(*h == stop && read.contains(h));
        if let Some(hook) = spec.steering.iter().find(|h| past(h)) {
            return Err(ModelError::Hook(format!(
                "steering at {hook}, after every hook and output asked for (the forward stops at block \
                 {n_blocks}): it would change nothing returned"
            )));
        }
        let mut steering_args = Vec::new();
        for &hook in &spec.steering {
            let vector = TensorType::new(DType::F32, &[config.hidden_size]);
            steering_args.push((hook, b.arg(vector, sharded.then(|| PartitionSpec::replicated(1)))?));
        }
        let token_axes = input_spec.dims().concat();
        Ok(Graph {
            b,
            config,
            spec,
            dt,
            n_blocks,
            with_final_norm,
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
            next_ids,
            select,
            uniforms,
            hooks: BTreeMap::new(),
            dictionary_args,
            steering_args,
            steered: Vec::new(),
            masks: Vec::new(),
            attention_forms: Vec::new(),
            row_lengths: None,
            ropes: Vec::new(),
            recording: true,
            replay_refusal: None,
            mlp_joins_resid_mid: false,
            splices: Vec::new(),
            cache: spec.decode.map(crate::decode::Cache::new),
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

    /// The mesh axes the flattened token dimension `batch*seq` is split over.
    pub fn token_axes(&self) -> &[String] {
        &self.token_axes
    }

    /// How the inputs `[batch, seq]` are split over the mesh.
    pub fn input_spec(&self) -> &PartitionSpec {
        &self.input_spec
    }

    /// How the weight whose value is `v` is split over the mesh (`None` for a value that is
    /// no weight).
    pub fn weight_spec(&self, v: Value) -> Option<&PartitionSpec> {
        let i = self.params.iter().position(|p| self.weights.get(&p.name).is_some_and(|(w, _)| *w == v))?;
        self.param_specs.get(i)
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

    /// Whether `hook` was requested, or a dictionary, a splice or the next-token outputs read it.
    pub fn wants(&self, hook: HookPoint) -> bool {
        self.spec.hooks.contains(&hook)
            || self.spec.dictionaries.iter().any(|d| d.hook == hook)
            || self.spec.computes_logits() && hook == HookPoint::model(HookKind::LnFinalOut)
            || super::splice::reads(self.spec).any(|h| h == hook)
    }

    /// Records `x` as `hook` if it was requested. `x` holds the hook's values token-major
    /// (`[tokens, …]` with the per-token elements in the hook's shape order); [`Graph::finish`]
    /// reshapes it to `[batch, seq, *shape]`.
    pub fn hook(&mut self, hook: HookPoint, x: Value) {
        if self.recording && self.wants(hook) {
            self.hooks.insert(hook, x);
        }
    }

    /// `x` `[tokens, hidden]` plus the steering vector of `hook`, rounded to the compute dtype,
    /// where one is given; else `x`.
    pub fn steer(&mut self, hook: HookPoint, x: Value) -> Result<Value, ModelError> {
        let Some(&(_, vector)) = self.steering_args.iter().find(|(h, _)| *h == hook) else { return Ok(x) };
        if !self.steered.contains(&hook) {
            self.steered.push(hook);
        }
        let dims = self.b.dims(x)?.to_vec();
        let vector = self.b.convert(vector, self.dt)?;
        let vector = self.b.broadcast_in_dim(vector, &dims, &[dims.len() - 1])?;
        Ok(self.b.add(x, vector)?)
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

    /// Pins a projection's output `x` `[tokens, out]` to the token split and to its weight's
    /// split of `out` over `model`, where the weight `[out, in]` is split so (the TPU rule's
    /// MLA latents): each chip multiplies by its rows of the weight and what follows gathers
    /// the narrow result, where propagation would gather the weight instead and every chip
    /// repeat the whole product (it does for `kv_a_proj_with_mqa`, whose output is sliced at
    /// a boundary its split does not respect). Unchanged where the weight's `out` is whole.
    pub fn keep_outputs_split(&mut self, x: Value, weight: &str) -> Result<Value, ModelError> {
        let w = self.w(weight)?;
        let split = self.weight_spec(w).and_then(|spec| spec.dims().first()).cloned().unwrap_or_default();
        if split.is_empty() || split.iter().any(|a| self.token_axes.contains(a)) {
            return Ok(x);
        }
        let tokens: Vec<&str> = self.token_axes.iter().map(String::as_str).collect();
        let out: Vec<&str> = split.iter().map(String::as_str).collect();
        Ok(self.b.sharding_constraint(x, &PartitionSpec::new(&[&tokens, &out]))?)
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

    /// `x · Wᵀ (+ bias)` for a Hugging Face `[out, in]` weight.
    pub fn linear(&mut self, x: Value, weight: &str, bias: Option<&str>) -> Result<Value, ModelError> {
        let w = self.w(weight)?;
        let y = self.matmul_t(x, w)?;
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

    /// `x · wᵀ`, weight first where the spec asks ([`ForwardSpec::weight_first`]).
    pub fn matmul_t(&mut self, x: Value, w: Value) -> Result<Value, ModelError> {
        Ok(matmul_t(&mut self.b, x, w, self.spec.weight_first)?)
    }

    /// Records `x`, what the built blocks left, as the next block's `hook_resid_pre` when
    /// that block is not built (steered there, where a vector is given).
    pub fn end_blocks(&mut self, x: Value) -> Result<(), ModelError> {
        if self.n_blocks < self.config.n_layers {
            let hook = HookPoint::block(self.n_blocks, HookKind::ResidPre);
            let x = self.steer(hook, x)?;
            self.hook(hook, x);
        }
        Ok(())
    }

    /// Returns the requested hooks, each reshaped to `[batch, seq, *per-token shape]`, and
    /// prints the program.
    pub fn finish(self) -> Result<ForwardProgram, ModelError> {
        let (bsz, s) = (self.spec.batch, self.spec.seq);
        if let Some(hook) = self.spec.steering.iter().find(|h| !self.steered.contains(h)) {
            return Err(ModelError::Hook(format!(
                "steering at {hook}: {:?}'s blocks do not add a vector there yet",
                self.config.arch
            )));
        }
        let variants = super::splice::variants(&self)?;
        let unembedding = match self.spec.computes_logits() {
            true => {
                let w = self.w(&self.config.unembedding()?.weight)?;
                Some((w, self.weight_spec(w).cloned()))
            }
            false => None,
        };
        let mut b = self.b;
        let mut results = Vec::new();
        let mut outputs = Vec::new();
        // With chosen rows, each hook (and each dictionary's input) is its rows.
        let (hooks, rows) = match (self.select, self.spec.select) {
            (Some(select), Some(rows)) => {
                let read = super::select::read_tokens(&mut b, select)?;
                let mut chosen = BTreeMap::new();
                let dictionaries = self.spec.dictionaries.iter().map(|d| d.hook);
                for hook in self.spec.hooks.iter().copied().chain(dictionaries) {
                    if let (Some(&x), false) = (self.hooks.get(&hook), chosen.contains_key(&hook)) {
                        let width = hook.dims(self.config, s).iter().product();
                        chosen.insert(hook, super::select::rows(&mut b, select, read, x, [bsz, s], width)?);
                    }
                }
                (chosen, rows)
            }
            _ => (self.hooks.clone(), s),
        };
        for &hook in &self.spec.hooks {
            let x = *hooks
                .get(&hook)
                .ok_or_else(|| ModelError::Hook(format!("{hook} was requested but the graph did not produce it")))?;
            let shape: Vec<usize> = [bsz, rows].into_iter().chain(hook.dims(self.config, s)).collect();
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
            let out_spec = match self.select {
                Some(_) => super::select::output_spec(&self.input_spec, shape.len()),
                None => {
                    let mut dims = self.input_spec.dims()[..2].to_vec();
                    dims.resize(shape.len(), Vec::new());
                    PartitionSpec::from_dims(dims)
                }
            };
            results.push((x, self.sharded.then(|| out_spec.clone())));
            outputs.push(OutputInfo { hook, shape, dtype, spec: out_spec });
        }
        let dictionaries = crate::dictionary::encoder::results(
            &mut b,
            &self.spec.dictionaries,
            &self.dictionary_args,
            &hooks,
            self.config,
            &self.input_spec,
            [bsz, rows],
        )?;
        results.extend(dictionaries.values.into_iter().map(|(v, spec)| (v, self.sharded.then_some(spec))));
        let mut next_token = Vec::new();
        if let (Some(outputs), Some((unembedding, unembedding_spec))) = (self.spec.next_token, &unembedding) {
            let hidden = *self.hooks.get(&HookPoint::model(HookKind::LnFinalOut)).ok_or_else(|| {
                ModelError::Hook("the next-token outputs read the final norm, which the graph did not produce".into())
            })?;
            let request = super::next_token::Request {
                outputs,
                config: self.config,
                rows: [bsz, s],
                dtype: self.dt,
                mesh: &self.spec.mesh,
                sharded: self.sharded,
                input_spec: &self.input_spec,
                hidden,
                unembedding: *unembedding,
                unembedding_spec: unembedding_spec.as_ref(),
                next_ids: self.next_ids,
                variants: variants.streams,
                per_token: variants.per_token,
            };
            let outputs = super::next_token::results(&mut b, request)?;
            results.extend(outputs.values);
            next_token = outputs.infos;
        }
        let decode = match (&self.cache, &unembedding) {
            (Some(cache), Some((unembedding, _))) => {
                let hidden = *self.hooks.get(&HookPoint::model(HookKind::LnFinalOut)).ok_or_else(|| {
                    ModelError::Hook("a decoding step reads the final norm, which the graph did not produce".into())
                })?;
                let request = crate::decode::Request {
                    config: self.config,
                    cache,
                    hidden,
                    unembedding: *unembedding,
                    attention_mask: self.attention_mask,
                    rows: [bsz, s],
                    input_spec: &self.input_spec,
                    sharded: self.sharded,
                    weight_first: self.spec.weight_first,
                    sampling: self.spec.sampling,
                    uniforms: self.uniforms,
                    first_result: results.len(),
                };
                let (values, info) = crate::decode::results(&mut b, request)?;
                results.extend(values);
                Some(info)
            }
            _ => None,
        };
        let unread: Vec<String> =
            self.params.iter().map(|p| &p.name).filter(|n| !self.weights[*n].1.get()).cloned().collect();
        if self.spec.weights.is_some() && !unread.is_empty() {
            return Err(ModelError::Config(format!("the forward declares weights its graph never reads: {unread:?}")));
        }
        let text = b.finish_sharded(&results)?;
        let next_ids = self.next_ids.map(|_| "next_ids");
        let mut inputs: Vec<InputInfo> = ["input_ids", "attention_mask", "position_ids"]
            .into_iter()
            .chain(next_ids)
            .map(|name| InputInfo { name, shape: vec![bsz, s], dtype: DType::I32, spec: self.input_spec.clone() })
            .collect();
        if let Some(rows) = self.spec.select {
            let spec = super::select::input_spec(&self.input_spec);
            inputs.push(InputInfo { name: "select", shape: vec![bsz, rows, s], dtype: DType::F32, spec });
        }
        if self.uniforms.is_some() {
            let spec = uniforms_spec(&self.input_spec);
            inputs.push(InputInfo { name: "uniforms", shape: vec![bsz], dtype: DType::F32, spec });
        }
        Ok(ForwardProgram {
            text,
            params: self.params,
            param_specs: self.param_specs,
            param_forms: self.param_forms,
            param_dtype: self.dt,
            inputs,
            outputs,
            latents: dictionaries.latents,
            next_token,
            mesh: self.spec.mesh.clone(),
            n_blocks: self.n_blocks,
            attention: self.attention_forms,
            decode,
            unread,
        })
    }
}

/// `x · wᵀ`, weight first where `x` has at most `weight_first` rows
/// ([`ForwardSpec::weight_first`]).
pub(crate) fn matmul_t(
    b: &mut siphon_hlo::Builder,
    x: Value,
    w: Value,
    weight_first: Option<usize>,
) -> Result<Value, siphon_hlo::HloError> {
    let dims = b.dims(x)?;
    let rows: usize = dims[..dims.len().saturating_sub(1)].iter().product();
    match weight_first {
        Some(most) if rows <= most => b.matmul_t_weight_first(x, w),
        _ => b.matmul_t(x, w),
    }
}

/// A decoding step's uniforms `[batch]`: split over the rows as the tokens are.
fn uniforms_spec(tokens: &PartitionSpec) -> PartitionSpec {
    PartitionSpec::from_dims(vec![tokens.dims()[0].clone()])
}
