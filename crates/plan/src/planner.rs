//! The planner proper: resolves the mesh, shards every parameter, estimates memory, and — when
//! the plan does not fit — searches for the smallest sharding that does.

use std::fmt;

use serde::{Deserialize, Serialize};
use siphon_mesh::{Mesh, PartitionSpec};
use siphon_models::{Arch, ModelConfig, ParamClass, ParamInfo};

use crate::error::PlanError;
use crate::memory::{self, DType, DeviceLayout, MemoryEstimate, gib};
use crate::mesh::{self, MeshKind, MeshRequest, Topology};
use crate::rules;
use crate::shape::MeshShape;

/// Everything the planner needs besides the model and the devices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanRequest {
    /// Mesh kind and fixed axis sizes.
    pub mesh: MeshRequest,
    /// Weight and activation dtype.
    pub dtype: DType,
    /// Global batch (sequences per step), for the activation estimate and the data-axis check.
    pub batch: Option<usize>,
    /// Tokens per sequence; activations are estimated when both `batch` and `seq` are given.
    pub seq: Option<usize>,
    /// The hook outputs, each counted at its own size; `None` means every hidden state
    /// (each block's `hook_resid_pre` and `ln_final.hook_out`, like `output_hidden_states`).
    pub hooks: Option<Vec<siphon_models::HookPoint>>,
    /// Memory of one device in bytes; without it the plan says nothing about fitting.
    pub device_memory_bytes: Option<u64>,
    /// Share of device memory kept free, in `[0, 1)`.
    pub headroom: f64,
    /// Plan `lm_head.weight` too (activation extraction never computes logits, so by default
    /// it is neither loaded nor counted).
    pub with_lm_head: bool,
    /// Weights kept in their stored form on the devices, by name (`--weights stored`),
    /// counted at their stored bytes.
    pub stored: std::collections::HashMap<String, siphon_models::StoredForm>,
    /// The dtype the activations are stored in (the output path's host buffers hold it).
    pub output_dtype: DType,
    /// Steps in flight on the output path (`extract --pipeline-depth`).
    pub pipeline_depth: usize,
    /// How the devices lay arrays out (a TPU pads them to its tiles).
    pub layout: DeviceLayout,
    /// Sparse dictionaries whose latents the program computes (`--sae`), counted with the
    /// activations.
    pub dictionaries: Vec<memory::DictionaryShape>,
    /// The model's next-token outputs the program computes (`--outputs`): the final norm and
    /// the unembedding among the weights, their results and one chunk's logits counted.
    #[serde(default)]
    pub next_token: Option<siphon_models::NextToken>,
    /// How a mixture's experts split over `model`: whole experts (the default), or each
    /// expert's width (what TPU programs take, their grouped products then multiplying exactly
    /// the routed rows on every device).
    #[serde(default)]
    pub experts: siphon_models::sharding::ExpertSplit,
    /// A decoding step (`siphon generate`) of `batch` slots over caches of these positions,
    /// taking at most `chunk` new tokens a step (a windowed block's ring is its window and the
    /// chunk): the caches (written in place each step), the logits and the unembedding counted.
    #[serde(default)]
    pub decode: Option<siphon_models::DecodeStep>,
    /// How a decoding step draws where it draws on the devices (`None`: it chooses greedily,
    /// or the host draws from its logits): its sampler's arrays counted ([`memory::sampler_bytes`]).
    #[serde(default)]
    pub decode_sampling: Option<siphon_models::Sampling>,
}

/// The hooks a plan counts when it names none: every hidden state (each block's input and the
/// final norm's output, as `output_hidden_states`).
pub fn every_hidden_state(config: &ModelConfig) -> Vec<siphon_models::HookPoint> {
    use siphon_models::{HookKind, HookPoint};
    (0..config.n_layers)
        .map(|l| HookPoint::block(l, HookKind::ResidPre))
        .chain([HookPoint::model(HookKind::LnFinalOut)])
        .collect()
}

impl Default for PlanRequest {
    fn default() -> PlanRequest {
        PlanRequest {
            mesh: MeshRequest::default(),
            dtype: DType::Bf16,
            batch: None,
            seq: None,
            hooks: None,
            device_memory_bytes: None,
            headroom: memory::DEFAULT_HEADROOM,
            with_lm_head: false,
            stored: Default::default(),
            output_dtype: DType::Bf16,
            pipeline_depth: 2,
            layout: DeviceLayout::Dense,
            dictionaries: Vec::new(),
            next_token: None,
            experts: Default::default(),
            decode: None,
            decode_sampling: None,
        }
    }
}

/// How one parameter class is sharded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassPlan {
    /// The class.
    pub class: ParamClass,
    /// How many tensors of this class the model has.
    pub tensors: usize,
    /// Shape of one tensor (all tensors of a class share it).
    pub shape: Vec<usize>,
    /// The spec used.
    pub spec: PartitionSpec,
    /// The spec as `P(...)` text.
    pub spec_text: String,
    /// Shape of one tensor's shard on one device.
    pub shard_shape: Vec<usize>,
    /// Bytes of all tensors of the class on one device.
    pub bytes_per_device: u64,
    /// Bytes of all tensors of the class, one copy.
    pub total_bytes: u64,
}

/// A dimension that could not be split as the class rule wanted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fallback {
    /// The class.
    pub class: ParamClass,
    /// Its tensor shape.
    pub shape: Vec<usize>,
    /// What was done instead, and why.
    pub reason: String,
}

/// A different mesh that fits when the requested one does not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Suggestion {
    /// Axis sizes.
    pub shape: MeshShape,
    /// The mesh as text.
    pub mesh: String,
    /// Whether its weight-sharding group spans hosts.
    pub spans_hosts: bool,
    /// Its predicted per-device bytes.
    pub required_bytes: u64,
    /// Flags that request it.
    pub flags: String,
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Model architecture.
    pub arch: Arch,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Weights (elements) planned.
    pub n_params: u64,
    /// Whether `lm_head.weight` is among them.
    pub lm_head_included: bool,
    /// Weight and activation dtype.
    pub dtype: DType,
    /// Hosts.
    pub hosts: usize,
    /// Devices per host.
    pub devices_per_host: usize,
    /// The kind that was asked for.
    pub kind: MeshKind,
    /// The chosen axis sizes.
    pub shape: MeshShape,
    /// The named mesh (size-1 axes left out).
    pub mesh: Mesh,
    /// Whether the weight-sharding group spans hosts.
    pub spans_hosts: bool,
    /// Spec of the `[batch, seq]` token ids.
    pub input_spec: PartitionSpec,
    /// Per parameter class.
    pub classes: Vec<ClassPlan>,
    /// Dimensions split less than their rule wanted.
    pub fallbacks: Vec<Fallback>,
    /// Memory per device.
    pub memory: MemoryEstimate,
    /// When the plan does not fit: the smallest sharding that does, if any.
    pub suggestion: Option<Suggestion>,
    /// Remarks for people (why a shape was chosen, what spans hosts, what does not fit).
    pub notes: Vec<String>,
    /// Spec of every parameter by Hugging Face name, for the forward builder and the loader.
    #[serde(skip)]
    param_specs: Vec<(String, PartitionSpec)>,
}

impl Plan {
    /// Spec of every planned parameter by its Hugging Face name, in `ModelConfig::params` order.
    pub fn param_specs(&self) -> &[(String, PartitionSpec)] {
        &self.param_specs
    }

    /// Spec of one parameter by Hugging Face name.
    pub fn spec(&self, name: &str) -> Option<&PartitionSpec> {
        self.param_specs.iter().find(|(n, _)| n == name).map(|(_, s)| s)
    }

    /// `Some(false)` when a device memory was given and the plan does not fit in it.
    pub fn fits(&self) -> Option<bool> {
        self.memory.fits
    }

    /// An error when a device memory was given and the plan does not fit in it, naming the
    /// bytes and the suggested mesh; `Ok` when it fits or no device memory was given. For
    /// commands that must refuse to start a run that would run out of memory.
    pub fn ensure_fits(&self) -> Result<(), PlanError> {
        let (Some(false), Some(budget)) = (self.memory.fits, self.memory.budget_bytes) else {
            return Ok(());
        };
        let hint = match &self.suggestion {
            Some(s) => format!(
                "; {} fits ({} per device{}): {}",
                s.mesh,
                gib(s.required_bytes),
                if s.spans_hosts { ", spanning hosts" } else { "" },
                s.flags
            ),
            None => "; no mesh over these devices fits".to_string(),
        };
        Err(PlanError::DoesNotFit(format!(
            "mesh {} needs {} per device but the budget is {} ({:.0}% headroom){hint}",
            self.mesh,
            gib(self.memory.required_bytes),
            gib(budget),
            self.memory.headroom * 100.0
        )))
    }
}

/// Plans `config` on `topology`: every check (mesh shape, whole heads on `model`, batch over
/// `data`, divisibility of each tensor) runs here, with no I/O, so a caller can refuse a bad
/// run before loading a plugin or reading weights. A plan that does not fit the device
/// memory is still returned (`plan.fits() == Some(false)`), with a suggestion when one fits.
pub fn plan(config: &ModelConfig, topology: &Topology, request: &PlanRequest) -> Result<Plan, PlanError> {
    check_request(request)?;
    let (params, _) = planned_params(config, request)?;
    let hooks = request.hooks.clone().unwrap_or_else(|| every_hidden_state(config));
    let step = request.batch.zip(request.seq);
    crate::bounds::check_countable(config, &params, &hooks, &request.dictionaries, step, request.pipeline_depth)?;
    if request.mesh.kind == MeshKind::Auto {
        return plan_auto(config, topology, request);
    }
    let shape = mesh::resolve(&request.mesh, config, topology)?;
    check_batch(shape, topology, request)?;
    let mut plan = evaluate(config, topology, shape, request)?;
    if shape.fsdp > 1 && request.mesh.fsdp.is_none() && request.mesh.kind == MeshKind::TwoD {
        plan.notes.push(format!(
            "{} heads and {} KV heads allow model={} (whole heads); the rest of each weight-sharding \
             group (×{}) shards on fsdp",
            config.attention.n_heads, config.attention.n_kv_heads, shape.model, shape.fsdp
        ));
    }
    if plan.fits() == Some(false) {
        let fitting = first_fitting(config, topology, request, None)?;
        match &fitting {
            Some(s) if s.spans_hosts => plan.notes.push(format!(
                "does not fit; no plan within a host fits, only a plan spanning hosts fits: {} ({} per device, {})",
                s.mesh,
                gib(s.required_bytes),
                s.flags
            )),
            Some(s) => plan.notes.push(format!(
                "does not fit; {} fits ({} per device, {})",
                s.mesh,
                gib(s.required_bytes),
                s.flags
            )),
            None => plan.notes.push(format!(
                "does not fit, and no mesh over these {} devices fits{}",
                topology.num_devices(),
                if request.batch.is_some() && request.seq.is_some() {
                    " at this batch and sequence length (try a smaller --batch or --seq)"
                } else {
                    ""
                }
            )),
        }
        plan.suggestion = fitting;
    }
    Ok(plan)
}

/// A note for `plan`: which form each block's attention would take on a CUDA plugin over the
/// extraction's right-padded rows (cuDNN's fused kernel where the block can take it,
/// `siphon_models::cudnn`), for a bf16 plan with a batch and sequence length, on GPUs (not a
/// TPU slice), on the plan's mesh. It builds the forward, so `siphon plan` asks for it, not
/// every caller of [`plan`].
pub fn cuda_attention(config: &ModelConfig, plan: &Plan, request: &PlanRequest) -> Option<String> {
    let (Some(batch), Some(seq)) = (request.batch, request.seq) else {
        return None;
    };
    if request.dtype != DType::Bf16 || request.layout == DeviceLayout::TpuTiled {
        return None;
    }
    let hooks = request.hooks.clone().unwrap_or_else(|| every_hidden_state(config));
    let mut spec = siphon_models::ForwardSpec::new(batch, seq, hooks);
    spec.compute_dtype = siphon_models::DType::Bf16.into();
    spec.output_dtype = spec.compute_dtype;
    spec.cudnn_attention = true;
    if plan.mesh.num_devices() > 1 {
        spec.mesh = plan.mesh.clone();
        spec.param_specs = plan.param_specs().iter().cloned().collect();
        spec.input_spec = Some(plan.input_spec.clone());
    }
    let program = siphon_models::build_forward(config, &spec).ok()?;
    (!program.attention.is_empty())
        .then(|| format!("on a CUDA plugin (right-padded rows): {}", siphon_models::cudnn::summary(&program.attention)))
}

fn check_request(request: &PlanRequest) -> Result<(), PlanError> {
    if !(0.0..1.0).contains(&request.headroom) {
        return Err(PlanError::Request(format!("headroom {} must be in [0, 1)", request.headroom)));
    }
    if request.batch == Some(0) || request.seq == Some(0) {
        return Err(PlanError::Request("batch and seq must be at least 1".into()));
    }
    if request.dtype == DType::Fp8 {
        return Err(PlanError::Request("fp8 is a stored dtype of activations, not of weights and compute".into()));
    }
    if request.pipeline_depth == 0 {
        return Err(PlanError::Request("the output path needs at least 1 step in flight".into()));
    }
    Ok(())
}

fn check_batch(shape: MeshShape, topology: &Topology, request: &PlanRequest) -> Result<(), PlanError> {
    match request.batch {
        Some(batch) if batch % shape.data != 0 => {
            Err(PlanError::BatchNotDivisible { batch, data: shape.data, mesh: shape.build(topology)?.to_string() })
        }
        _ => Ok(()),
    }
}

/// Candidate shapes by growing weight-sharding group, each with the most `model` that splits
/// whole heads; `constraints` keeps only shapes matching the request's fixed sizes.
fn candidates(
    config: &ModelConfig,
    topology: &Topology,
    constraints: Option<&MeshRequest>,
    batch: Option<usize>,
) -> Vec<MeshShape> {
    let n = topology.num_devices();
    let mut out = Vec::new();
    for group in (1..=n).filter(|g| n.is_multiple_of(*g)) {
        let model = match constraints.and_then(|c| c.model) {
            Some(m) if group % m == 0 => m,
            Some(_) => continue,
            None => match constraints.and_then(|c| c.fsdp) {
                Some(f) if group % f == 0 => group / f,
                Some(_) => continue,
                None => mesh::best_model(config, topology, group),
            },
        };
        let shape = MeshShape { data: n / group, fsdp: group / model, model };
        let matches = constraints.is_none_or(|c| {
            c.data.is_none_or(|d| d == shape.data)
                && c.fsdp.is_none_or(|f| f == shape.fsdp)
                && c.model.is_none_or(|m| m == shape.model)
        });
        if matches && shape.check(config, topology).is_none() && batch.is_none_or(|b| b % shape.data == 0) {
            out.push(shape);
        }
    }
    out
}

fn first_fitting(
    config: &ModelConfig,
    topology: &Topology,
    request: &PlanRequest,
    constraints: Option<&MeshRequest>,
) -> Result<Option<Suggestion>, PlanError> {
    for shape in candidates(config, topology, constraints, request.batch) {
        let plan = evaluate(config, topology, shape, request)?;
        if plan.fits() == Some(true) {
            return Ok(Some(Suggestion {
                shape,
                mesh: plan.mesh.to_string(),
                spans_hosts: plan.spans_hosts,
                required_bytes: plan.memory.required_bytes,
                flags: shape.flags(),
            }));
        }
    }
    Ok(None)
}

fn plan_auto(config: &ModelConfig, topology: &Topology, request: &PlanRequest) -> Result<Plan, PlanError> {
    if request.device_memory_bytes.is_none() {
        return Err(PlanError::AutoNeedsMemory);
    }
    let shapes = candidates(config, topology, Some(&request.mesh), request.batch);
    if shapes.is_empty() {
        // Say precisely why: the fixed sizes, or the batch.
        let shape = mesh::resolve(&request.mesh, config, topology)?;
        check_batch(shape, topology, request)?;
        return Err(PlanError::InvalidMesh {
            requested: request.mesh.to_string(),
            reason: "no shape matches the fixed axis sizes".into(),
            valid: mesh::valid_shapes(config, topology),
        });
    }
    let mut best: Option<Plan> = None;
    for shape in shapes {
        let plan = evaluate(config, topology, shape, request)?;
        if plan.fits() == Some(true) {
            let mut plan = plan;
            plan.notes.push(format!(
                "auto: the smallest weight-sharding group that fits with {:.0}% headroom is {} devices",
                request.headroom * 100.0,
                shape.weight_group()
            ));
            if plan.spans_hosts {
                plan.notes.push(format!(
                    "no plan within a host fits; only a plan spanning hosts fits (group of {} devices over {} hosts)",
                    shape.weight_group(),
                    shape.weight_group() / topology.devices_per_host()
                ));
            }
            return Ok(plan);
        }
        if best.as_ref().is_none_or(|b| plan.memory.required_bytes < b.memory.required_bytes) {
            best = Some(plan);
        }
    }
    let mut plan = best.expect("at least one candidate was evaluated");
    plan.notes.push(format!(
        "auto: no mesh over these {} devices fits; this is the one needing the least memory",
        topology.num_devices()
    ));
    Ok(plan)
}

/// The weights the forward for `request`'s hooks and its dictionaries' hooks reads (every
/// hidden state's when it names none), as the forward builder declares them, with the untied
/// lm_head when asked for; and the number of blocks built.
fn planned_params(config: &ModelConfig, request: &PlanRequest) -> Result<(Vec<ParamInfo>, usize), PlanError> {
    let mut hooks = request.hooks.clone().unwrap_or_else(|| every_hidden_state(config));
    for d in &request.dictionaries {
        if !hooks.contains(&d.hook) {
            hooks.push(d.hook);
        }
    }
    if hooks.is_empty() {
        hooks = every_hidden_state(config);
    }
    let final_norm = siphon_models::HookPoint::model(siphon_models::HookKind::LnFinalOut);
    if request.next_token.is_some() && !hooks.contains(&final_norm) {
        hooks.push(final_norm);
    }
    let mut params = siphon_models::forward::forward_params(config, &hooks)
        .map_err(|e| PlanError::Request(format!("the forward for these hooks: {e}")))?;
    if request.with_lm_head || request.next_token.is_some() {
        params.extend(config.params(0, true).into_iter().filter(|p| p.class == ParamClass::LmHead));
    }
    Ok((params, siphon_models::forward::blocks_needed(config, &hooks).0))
}

/// The plan for one concrete shape (already checked).
fn evaluate(
    config: &ModelConfig,
    topology: &Topology,
    shape: MeshShape,
    request: &PlanRequest,
) -> Result<Plan, PlanError> {
    let mesh = shape.build(topology)?;
    let (params, blocks) = planned_params(config, request)?;
    let mut specs = Vec::with_capacity(params.len());
    let mut classes: Vec<ClassPlan> = Vec::new();
    let mut fallbacks: Vec<Fallback> = Vec::new();
    for param in &params {
        let mut sharding = rules::param_spec(param.class, &param.shape, &mesh, request.experts);
        if let Some(form) = request.stored.get(&param.name) {
            // A weight kept stored splits on whole blocks only.
            let (spec, dropped) = form.whole_blocks(&param.shape, &sharding.spec, &mesh);
            if dropped {
                sharding.fallback = Some(format!("{spec}: kept whole where a split would cut its {form:?} blocks"));
                sharding.spec = spec;
            }
        }
        let shard_shape = sharding.spec.shard_shape(&param.shape, &mesh)?;
        let (full, shard) =
            memory::param_bytes(param, &sharding.spec, &mesh, request.dtype, &request.stored, request.layout)?;
        match classes.iter_mut().find(|c| c.class == param.class && c.shape == param.shape) {
            Some(c) => {
                c.tensors += 1;
                c.bytes_per_device += shard;
                c.total_bytes += full;
            }
            None => {
                if let Some(reason) = &sharding.fallback {
                    fallbacks.push(Fallback { class: param.class, shape: param.shape.clone(), reason: reason.clone() });
                }
                classes.push(ClassPlan {
                    class: param.class,
                    tensors: 1,
                    shape: param.shape.clone(),
                    spec_text: sharding.spec.to_string(),
                    spec: sharding.spec.clone(),
                    shard_shape,
                    bytes_per_device: shard,
                    total_bytes: full,
                });
            }
        }
        specs.push(sharding.spec);
    }
    let weights = memory::weight_memory(&params, &specs, &mesh, request.dtype, &request.stored, request.layout)?;
    let activations = match (request.batch, request.seq) {
        (Some(batch), Some(seq)) => Some(memory::activation_memory(
            config,
            &mesh,
            batch,
            seq,
            &request.hooks.clone().unwrap_or_else(|| every_hidden_state(config)),
            request.dtype,
            request.output_dtype,
            request.layout,
        )),
        _ => None,
    };
    let mut estimate = memory::estimate(weights, activations, request.device_memory_bytes, request.headroom);
    if let Some(act) = activations.filter(|_| !request.dictionaries.is_empty()) {
        let d = memory::dictionary_memory(&request.dictionaries, act.local_batch, act.seq, act.hooks, request.layout);
        estimate = estimate.with_dictionaries(d);
    }
    if let (Some(act), Some(outputs)) = (activations, &request.next_token) {
        // The unembedding's vocabulary split on this mesh (the embedding's where tied).
        let unembedding = config.unembedding().map_err(|e| PlanError::Request(e.to_string()))?.weight;
        let vocab_ways = params.iter().position(|p| p.name == unembedding).map_or(1, |i| specs[i].ways(0, &mesh));
        let results = act.hooks + 3 * request.dictionaries.len();
        let n = memory::next_token_memory(
            outputs,
            act.local_batch,
            act.seq,
            config.vocab_size,
            vocab_ways,
            results,
            request.layout,
        );
        estimate = estimate.with_next_token(n);
    }
    if let (Some(act), Some(step)) = (activations, request.decode) {
        let model = mesh.axis_size(crate::mesh::MODEL).unwrap_or(1);
        let mut d = memory::decode_memory(config, act.local_batch, step, model, request.dtype, request.layout)?;
        if let Some(sampling) = &request.decode_sampling {
            d.sampler_bytes = memory::sampler_bytes(act.local_batch, config.vocab_size, sampling, request.layout);
        }
        estimate = estimate.with_decode(d);
    }
    if let (Some(batch), Some(seq)) = (request.batch, request.seq) {
        let hooks = request.hooks.clone().unwrap_or_else(|| every_hidden_state(config));
        let hosts = topology.hosts();
        let (dtype, depth) = (request.output_dtype, request.pipeline_depth);
        estimate.host = Some(memory::host_memory(config, batch, seq, hosts, &hooks, dtype, depth));
    }
    let spans_hosts = shape.spans_hosts(topology);
    let mut notes = Vec::new();
    let with_lm_head = request.with_lm_head || request.next_token.is_some();
    if !with_lm_head && !config.tie_word_embeddings {
        notes.push("lm_head.weight is not loaded (activation extraction never computes logits)".into());
    }
    if blocks < config.n_layers {
        notes.push(format!(
            "blocks {blocks}..{} are not built (the last hook needs blocks 0..{blocks}): their weights are neither \
             loaded nor counted",
            config.n_layers
        ));
    }
    let kept = params.iter().filter(|p| request.stored.contains_key(&p.name)).count();
    if kept > 0 {
        notes.push(format!(
            "{kept} weights kept in their stored form on the devices (--weights stored: blocks and scales, \
             dequantized inside the forward), counted at their stored bytes; the others in {}",
            request.dtype
        ));
    }
    if spans_hosts {
        notes.push(format!(
            "the weight-sharding group (fsdp×model = {}) spans {} hosts: weight collectives cross hosts",
            shape.weight_group(),
            shape.weight_group() / topology.devices_per_host()
        ));
    }
    let n_params = params.iter().map(|p| p.shape.iter().map(|&d| d as u64).product::<u64>()).sum();
    Ok(Plan {
        arch: config.arch,
        n_layers: config.n_layers,
        n_params,
        lm_head_included: with_lm_head && !config.tie_word_embeddings,
        dtype: request.dtype,
        hosts: topology.hosts(),
        devices_per_host: topology.devices_per_host(),
        kind: request.mesh.kind,
        shape,
        input_spec: rules::input_spec(&mesh),
        mesh,
        spans_hosts,
        classes,
        fallbacks,
        memory: estimate,
        suggestion: None,
        notes,
        param_specs: params.into_iter().map(|p| p.name).zip(specs).collect(),
    })
}

impl fmt::Display for Plan {
    /// The human-readable report `siphon plan` prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let arch = self.arch;
        writeln!(
            f,
            "model     {arch}, {} layers, {:.2}B weights planned{}, {}",
            self.n_layers,
            self.n_params as f64 / 1e9,
            if self.lm_head_included { " (lm_head included)" } else { "" },
            self.dtype
        )?;
        writeln!(
            f,
            "devices   {} hosts × {} devices = {}",
            self.hosts,
            self.devices_per_host,
            self.hosts * self.devices_per_host
        )?;
        writeln!(
            f,
            "mesh      {} {}  (data×fsdp×model = {}; weights sharded over {} devices, {})",
            self.kind,
            self.mesh,
            self.shape,
            self.shape.weight_group(),
            if self.spans_hosts { "spanning hosts" } else { "within a host" }
        )?;
        writeln!(f, "input     {}", self.input_spec)?;
        writeln!(f, "sharding")?;
        writeln!(f, "  {:<12} {:>7}  {:<16} {:<28} {:>12}", "class", "tensors", "shape", "spec", "per device")?;
        for c in &self.classes {
            writeln!(
                f,
                "  {:<12} {:>7}  {:<16} {:<28} {:>12}",
                class_name(c.class),
                c.tensors,
                format!("{:?}", c.shape),
                c.spec_text,
                gib(c.bytes_per_device)
            )?;
        }
        for fb in &self.fallbacks {
            writeln!(f, "  fallback: {} {:?}: {}", class_name(fb.class), fb.shape, fb.reason)?;
        }
        let m = &self.memory;
        writeln!(f, "memory per device")?;
        writeln!(
            f,
            "  weights sharded   {:>12}  ({} bytes; total {} / {})",
            gib(m.weights.sharded_bytes),
            m.weights.sharded_bytes,
            gib(m.weights.total_bytes),
            self.shape.weight_group()
        )?;
        writeln!(
            f,
            "  weights gathered  {:>12}  ({} bytes; every weight replicated)",
            gib(m.weights.gathered_bytes),
            m.weights.gathered_bytes
        )?;
        writeln!(
            f,
            "  fsdp gather       {:>12}  (two blocks all-gathered over fsdp)",
            gib(m.weights.fsdp_gather_bytes)
        )?;
        match &m.activations {
            Some(a) => writeln!(
                f,
                "  activations       {:>12}  (batch {} = {} per device × seq {}, {} hooks: hooks {}, working {})",
                gib(a.total_bytes),
                a.batch,
                a.local_batch,
                a.seq,
                a.hooks,
                gib(a.hook_bytes),
                gib(a.working_bytes)
            )?,
            None => writeln!(f, "  activations       (give --batch and --seq)")?,
        }
        if let Some(d) = &m.dictionaries {
            writeln!(
                f,
                "  dictionaries      {:>12}  (tensors {}, latents {}, working {})",
                gib(d.tensor_bytes + d.output_bytes + d.working_bytes),
                gib(d.tensor_bytes),
                gib(d.output_bytes),
                gib(d.working_bytes)
            )?;
        }
        if let Some(n) = &m.next_token {
            writeln!(
                f,
                "  next-token        {:>12}  (outputs {}, a chunk of {} positions' logits {})",
                gib(n.output_bytes + n.working_bytes),
                gib(n.output_bytes),
                n.chunk,
                gib(n.working_bytes)
            )?;
        }
        if let Some(d) = &m.decode {
            writeln!(
                f,
                "  decoding          {:>12}  (caches of {} slots × {} positions, {} new tokens a step, written in \
                 place: {}; logits {}; working {}; sampler {})",
                gib(d.cache_bytes + d.logits_bytes + d.working_bytes + d.sampler_bytes),
                d.local_slots,
                d.cache_len,
                d.chunk,
                gib(d.cache_bytes),
                gib(d.logits_bytes),
                gib(d.working_bytes),
                gib(d.sampler_bytes)
            )?;
        }
        writeln!(f, "  required          {:>12}", gib(m.required_bytes))?;
        if let Some(h) = &m.host {
            writeln!(
                f,
                "host memory       {:>12}  (output path: {} steps in flight × {} of {} rows per host, pinned \
                 where the plugin allows)",
                gib(h.total_bytes),
                h.depth,
                gib(h.step_bytes),
                h.dtype
            )?;
        }
        match (m.device_memory_bytes, m.budget_bytes, m.fits) {
            (Some(device), Some(budget), Some(fits)) => {
                writeln!(
                    f,
                    "  budget            {:>12}  ({} device memory − {:.0}% headroom)",
                    gib(budget),
                    gib(device),
                    m.headroom * 100.0
                )?;
                writeln!(f, "fits      {}", if fits { "yes" } else { "no" })?;
            }
            _ => writeln!(f, "fits      unknown (give --device-memory GiB)")?,
        }
        for note in &self.notes {
            writeln!(f, "note      {note}")?;
        }
        Ok(())
    }
}

fn class_name(class: ParamClass) -> String {
    serde_json::to_value(class).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_else(|| format!("{class:?}"))
}
