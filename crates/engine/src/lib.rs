//! Runs a model's forward on a device mesh: weights sharded onto devices, batches in, hook
//! activations out.
//!
//! An [`Engine`] is built once per (model, hooks, mesh, dtypes): it builds the forward with
//! `siphon-models`, reads each weight the program needs from the memory-mapped checkpoint
//! (converted to the compute dtype on the way), splits it by the program's
//! [`PartitionSpec`] and uploads to each device only its shard. [`Engine::run`] then takes a
//! [`Batch`] of token ids and an attention mask, compiles the program for that
//! `(batch, seq)` shape the first time it is seen (cached after), runs it and copies the
//! requested activations back to the host as [`Activations`].
//!
//! Designed for the extraction loop: compile once per shape, upload weights once, run many
//! batches; everything here blocks (PJRT waits on its events) and is CPU-heavy, so call it
//! from a plain thread or `spawn_blocking`, never on an async executor's worker.
//!
//! Architecture invariants: the engine never computes logits (the forward stops after the
//! last block a hook needs); weights live on the devices once, shared by every compiled
//! shape; position ids are `cumsum(mask) - 1` clamped at 0 unless the caller gives them, so
//! left- and right-padded rows give the activations of the unpadded sequence.
//!
//! ```no_run
//! use siphon_engine::{Batch, Engine, EngineOptions};
//! use siphon_models::{HookKind, HookPoint, LoadedModel};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let plugin = siphon_runtime::Plugin::load(std::path::Path::new("libpjrt_cpu.so"))?;
//! let client = siphon_runtime::Client::new(&plugin, siphon_runtime::ClientOptions::new())?;
//! let model = LoadedModel::open(std::path::Path::new("fixtures/models/tiny-llama"))?;
//! let hooks = siphon_models::resolve_hooks("blocks.1.hook_resid_post", &model.config)?;
//! let engine = Engine::new(&client, &model, hooks, EngineOptions::default())?;
//! let batch = Batch::new(vec![vec![1, 2, 3]], None)?;
//! let acts = engine.run(&batch)?;
//! println!("{:?}", acts.get(siphon_models::HookPoint::block(1, HookKind::ResidPost)).unwrap().shape());
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

pub mod aot;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use siphon_mesh::{HostView, Mesh, PartitionSpec};
use siphon_models::sharding::megatron_specs;
use siphon_models::{
    DType, DictionaryHook, ForwardProgram, ForwardSpec, HookPoint, HostTensor, LoadedModel, ParamInfo, RaggedDot,
    StoredForm, build_forward,
};
use siphon_runtime::{Client, CompileOptions, Download, ElementType, Executable, HostArray, ShardedArray};

/// What went wrong loading or running a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// Reading the checkpoint or building the forward failed.
    #[error(transparent)]
    Model(#[from] siphon_models::ModelError),
    /// PJRT failed (upload, compile, execute, download).
    #[error("{context}: {source}")]
    Runtime {
        /// What the engine was doing.
        context: String,
        /// The runtime's error (boxed: it is large, and every `Result` of the engine carries
        /// its size).
        source: Box<siphon_runtime::Error>,
    },
    /// A partition spec does not fit a tensor on the mesh.
    #[error("{context}: {source}")]
    Mesh {
        /// Which tensor.
        context: String,
        /// The mesh crate's error.
        source: siphon_mesh::MeshError,
    },
    /// The batch is malformed (ragged rows, mask of the wrong size, ...).
    #[error("invalid batch: {0}")]
    Batch(String),
    /// Options that cannot work together.
    #[error("invalid engine options: {0}")]
    Options(String),
    /// A token fired more of a dictionary's latents than the dictionary keeps: refused, never
    /// truncated.
    #[error(
        "dictionary {dictionary}: a token (row {row}, position {position}) fires {firings} latents, more than the \
         {cap} kept (raise the latent cap)"
    )]
    LatentCap {
        /// The dictionary's name.
        dictionary: String,
        /// Row of this process's batch.
        row: usize,
        /// Position in the row.
        position: usize,
        /// Its firings.
        firings: i32,
        /// Latents kept per token.
        cap: usize,
    },
}

fn rt<T>(context: impl FnOnce() -> String, r: siphon_runtime::Result<T>) -> Result<T, EngineError> {
    r.map_err(|source| EngineError::Runtime { context: context(), source: Box::new(source) })
}

/// How weights are split over the mesh.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ShardingPlan {
    /// Every weight replicated; inputs split by batch over `data` when the mesh has it.
    Replicated,
    /// The fixed Megatron-style plan of `siphon_models::sharding::megatron_specs`.
    Megatron,
    /// Explicit specs per HF weight name (missing names replicated) and for the inputs.
    Explicit {
        /// Weight specs by name.
        params: HashMap<String, PartitionSpec>,
        /// Spec of the `[batch, seq]` inputs.
        input: Option<PartitionSpec>,
    },
}

/// Dtypes, mesh and sharding of an [`Engine`].
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Weights and compute (`F32` or `Bf16`).
    pub compute_dtype: DType,
    /// Returned activations.
    pub output_dtype: DType,
    /// Devices; [`Mesh::single_device`] by default.
    pub mesh: Mesh,
    /// How weights and inputs are split over `mesh`.
    pub plan: ShardingPlan,
    /// A mixture's rows per expert in each dispatch round; `None` chooses from the mean
    /// load (`siphon_models::forward::ForwardSpec::expert_capacity`).
    pub expert_capacity: Option<usize>,
    /// How quantized weights reach the devices.
    pub weights: WeightForm,
    /// Whether programs may call siphon's CPU kernels where the client has them
    /// (`siphon_runtime::Client::cpu_kernels`); off, XLA's ops compute the same values.
    pub cpu_kernels: bool,
    /// Whether a mixture's experts on one device run as grouped products on the CPU plugin
    /// too (`siphon_kernels::grouped`'s plain loop: the CUDA form's program, checked on the
    /// CPU). A CUDA client whose plugin took siphon's CUDA kernels
    /// (`siphon_runtime::Client::cuda_kernels`) always runs them so, on cuBLAS.
    pub grouped_experts: bool,
    /// The forms a TPU program takes — a mixture's experts as XLA's `chlo.ragged_dot` (on
    /// the CPU plugin, which has no `ragged-dot`, its values by ordinary ops:
    /// `siphon_models::RaggedDot::Masked`) and FP8 weights kept stored decoded by conversion
    /// — on any client (`Some(true)`: how they are checked on the CPU), on none
    /// (`Some(false)`: a TPU program as the other clients' are, to compare), or on TPU
    /// clients only (`None`, the default).
    pub tpu_forms: Option<bool>,
    /// Whether the rows this engine runs are right-padded (real tokens first, as the
    /// extraction packs them): on a CUDA client, each block whose attention cuDNN's fused
    /// kernel takes then calls it (`siphon_models::cudnn`). Off (the default; left-padded rows,
    /// as `siphon forward` gives), XLA's form everywhere.
    pub right_padded: bool,
    /// Sparse dictionaries whose latents every run computes on the devices, each from the hook
    /// it reads (`siphon_models::DictionaryHook`), returned in [`Activations::latents`].
    pub dictionaries: Vec<DictionaryHook>,
    /// The processes whose partitions of `mesh` this engine runs. Empty: the whole mesh, in
    /// this process. In a job whose mesh spans processes, this process's [`HostView`]: it
    /// uploads only its partitions' weights, feeds only its data groups' rows and reads back
    /// only its partitions. Several views: the per-process paths of each, side by side in
    /// one process that holds every device (how a spanning job is verified without the
    /// hosts); [`Engine::run_processes`] takes and gives one batch per view.
    pub processes: Vec<HostView>,
}

/// How a checkpoint's quantized weights reach the devices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WeightForm {
    /// Dequantized on the host to the compute dtype (every weight one array).
    #[default]
    Dequantized,
    /// Kept as stored where siphon has the form ([`siphon_models::StoredForm`]: FP8 blocks,
    /// MXFP4, GGUF Q8_0/Q4_0/Q4_1/Q4_K/Q6_K) and dequantized inside the program; others as
    /// [`WeightForm::Dequantized`].
    Stored,
}

impl std::str::FromStr for WeightForm {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<WeightForm, EngineError> {
        match s {
            "dequantized" => Ok(WeightForm::Dequantized),
            "stored" => Ok(WeightForm::Stored),
            other => Err(EngineError::Options(format!("weights {other:?} (dequantized or stored)"))),
        }
    }
}

impl ShardingPlan {
    /// Each weight's spec by name and the inputs' spec, for `config` on `mesh`.
    pub fn specs(
        &self,
        config: &siphon_models::ModelConfig,
        mesh: &Mesh,
    ) -> (HashMap<String, PartitionSpec>, Option<PartitionSpec>) {
        match self {
            ShardingPlan::Replicated => {
                let data: &[&str] = if mesh.axis_size("data").is_some() { &["data"] } else { &[] };
                (HashMap::new(), Some(PartitionSpec::new(&[data, &[]])))
            }
            ShardingPlan::Megatron => {
                let (p, i) = megatron_specs(config, mesh);
                (p, Some(i))
            }
            ShardingPlan::Explicit { params, input } => (params.clone(), input.clone()),
        }
    }
}

/// What the engine's program is built from, whether it runs here ([`Engine`]) or is only
/// compiled for devices elsewhere ([`aot`]): one place, so both build the same program.
struct ProgramSpec<'a> {
    hooks: &'a [HookPoint],
    options: &'a EngineOptions,
    param_specs: &'a HashMap<String, PartitionSpec>,
    input_spec: &'a Option<PartitionSpec>,
    stored: &'a HashMap<String, StoredForm>,
    /// Whether the compiling side has siphon's CPU kernels, and its CUDA kernels.
    cpu_kernels: bool,
    cuda_kernels: bool,
    /// The compiling side's platform, lower case: `cpu`, `cuda`, `tpu`.
    platform: String,
}

impl ProgramSpec<'_> {
    /// The forward for `batch` × `seq`, reading `params` (every weight its graph reads when
    /// empty: the first build, which finds them).
    fn forward(&self, batch: usize, seq: usize, params: &[ParamInfo]) -> ForwardSpec {
        let mut spec = ForwardSpec::new(batch, seq, self.hooks.to_vec());
        spec.compute_dtype = siphon_hlo::DType::from(self.options.compute_dtype);
        spec.output_dtype = siphon_hlo::DType::from(self.options.output_dtype);
        spec.mesh = self.options.mesh.clone();
        spec.param_specs = self.param_specs.clone();
        spec.input_spec = self.input_spec.clone();
        spec.expert_capacity = self.options.expert_capacity;
        spec.stored = self.stored.clone();
        spec.cpu_kernels = self.options.cpu_kernels && self.cpu_kernels;
        spec.grouped_experts = self.cuda_kernels || (self.options.grouped_experts && self.cpu_kernels);
        let on = |platform: &str| self.platform == platform;
        let tpu_forms = self.options.tpu_forms.unwrap_or(on("tpu"));
        spec.decode_without_tables = tpu_forms;
        spec.norm_heads_in_place = tpu_forms;
        spec.ragged_experts = match (tpu_forms, on("cpu")) {
            (true, true) => Some(RaggedDot::Masked),
            (true, false) => Some(RaggedDot::Native),
            (false, _) => None,
        };
        spec.cudnn_attention = self.options.right_padded && on("cuda");
        spec.mlp_chunk = on("cuda").then_some(siphon_models::MLP_CHUNK_ELEMENTS);
        spec.dictionaries = self.options.dictionaries.clone();
        spec.weights = (!params.is_empty()).then(|| params.iter().map(|p| p.name.clone()).collect());
        spec
    }
}

/// What no engine program takes: no hooks (nor dictionaries), or f16 compute.
fn check(hooks: &[HookPoint], options: &EngineOptions) -> Result<(), EngineError> {
    if hooks.is_empty() && options.dictionaries.is_empty() {
        return Err(EngineError::Options("no hooks requested".into()));
    }
    if options.compute_dtype == DType::F16 {
        return Err(EngineError::Options("compute dtype f16 is not supported (use f32 or bf16)".into()));
    }
    Ok(())
}

/// Whether a weight stored as `form` stays so on the devices under `spec`: a split that would
/// cut the form's blocks keeps it dequantized (logged).
fn stored_on(form: StoredForm, param: &ParamInfo, spec: &PartitionSpec, mesh: &Mesh) -> bool {
    match form.part_specs(&param.name, &param.shape, spec, mesh) {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!("{e}: dequantized on load instead");
            false
        }
    }
}

impl Default for EngineOptions {
    fn default() -> EngineOptions {
        EngineOptions {
            compute_dtype: DType::F32,
            output_dtype: DType::F32,
            mesh: Mesh::single_device(),
            plan: ShardingPlan::Megatron,
            expert_capacity: None,
            weights: WeightForm::Dequantized,
            cpu_kernels: true,
            grouped_experts: false,
            tpu_forms: None,
            right_padded: false,
            dictionaries: Vec::new(),
            processes: Vec::new(),
        }
    }
}

/// A batch of equal-length token rows, its attention mask and position ids.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    batch: usize,
    seq: usize,
    input_ids: Vec<i32>,
    attention_mask: Vec<i32>,
    position_ids: Vec<i32>,
}

impl Batch {
    /// Rows of token ids (all the same length) and an optional 0/1 mask of the same shape
    /// (all ones when `None`). Position ids are `cumsum(mask) - 1`, clamped at 0.
    pub fn new(ids: Vec<Vec<u32>>, mask: Option<Vec<Vec<u8>>>) -> Result<Batch, EngineError> {
        let batch = ids.len();
        let seq = ids.first().map_or(0, Vec::len);
        if batch == 0 || seq == 0 {
            return Err(EngineError::Batch("the batch is empty".into()));
        }
        if let Some(row) = ids.iter().position(|r| r.len() != seq) {
            return Err(EngineError::Batch(format!(
                "row {row} has {} tokens, row 0 has {seq}: rows must have equal length",
                ids[row].len()
            )));
        }
        let mask = match mask {
            None => vec![1i32; batch * seq],
            Some(m) => {
                if m.len() != batch || m.iter().any(|r| r.len() != seq) {
                    return Err(EngineError::Batch(format!("the attention mask must be {batch}x{seq} like the ids")));
                }
                let mut flat = Vec::with_capacity(batch * seq);
                for (r, row) in m.iter().enumerate() {
                    for &v in row {
                        if v > 1 {
                            return Err(EngineError::Batch(format!("attention mask row {r} holds {v}; only 0 and 1")));
                        }
                        flat.push(i32::from(v));
                    }
                }
                flat
            }
        };
        let mut input_ids = Vec::with_capacity(batch * seq);
        for row in &ids {
            for &t in row {
                input_ids.push(i32::try_from(t).map_err(|_| EngineError::Batch(format!("token id {t} exceeds i32")))?);
            }
        }
        let position_ids = positions_from_mask(&mask, seq);
        Ok(Batch { batch, seq, input_ids, attention_mask: mask, position_ids })
    }

    /// Replaces the computed position ids (row-major `[batch, seq]`).
    pub fn with_position_ids(mut self, position_ids: Vec<i32>) -> Result<Batch, EngineError> {
        if position_ids.len() != self.batch * self.seq {
            return Err(EngineError::Batch(format!(
                "{} position ids for a {}x{} batch",
                position_ids.len(),
                self.batch,
                self.seq
            )));
        }
        if let Some(p) = position_ids.iter().find(|&&p| p < 0) {
            return Err(EngineError::Batch(format!("negative position id {p}")));
        }
        self.position_ids = position_ids;
        Ok(self)
    }

    /// Rows.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Tokens per row.
    pub fn seq(&self) -> usize {
        self.seq
    }

    /// Row-major `[batch, seq]` attention mask.
    pub fn attention_mask(&self) -> &[i32] {
        &self.attention_mask
    }

    /// Row-major `[batch, seq]` position ids.
    pub fn position_ids(&self) -> &[i32] {
        &self.position_ids
    }

    /// Row-major `[batch, seq]` token ids.
    pub fn input_ids(&self) -> &[i32] {
        &self.input_ids
    }
}

/// `cumsum(mask) - 1` per row, clamped at 0 (HF's convention for padded batches).
pub fn positions_from_mask(mask: &[i32], seq: usize) -> Vec<i32> {
    let mut out = Vec::with_capacity(mask.len());
    for row in mask.chunks(seq.max(1)) {
        let mut sum = 0i32;
        for &m in row {
            sum += m;
            out.push((sum - 1).max(0));
        }
    }
    out
}

/// The requested activations of one batch, in hook order, each `[batch, seq, hidden]`.
#[derive(Debug, Clone)]
pub struct Activations {
    /// (hook, array) in the order the hooks were requested.
    pub hooks: Vec<(HookPoint, HostArray)>,
    /// Each dictionary's latents, in [`EngineOptions::dictionaries`]' order.
    pub latents: Vec<Latents>,
}

/// One dictionary's latents for a batch's rows: each token's largest, sparsely.
#[derive(Debug, Clone)]
pub struct Latents {
    /// `[rows, seq, cap]` s32: latent indices, largest first, `-1` past the token's firings.
    pub indices: HostArray,
    /// `[rows, seq, cap]` f32: their values, 0 past the firings.
    pub values: HostArray,
    /// `[rows, seq]` s32: each token's firings (at most `cap`: more is an error).
    pub firings: HostArray,
}

impl Activations {
    /// The array of one hook.
    pub fn get(&self, hook: HookPoint) -> Option<&HostArray> {
        self.hooks.iter().find(|(h, _)| *h == hook).map(|(_, a)| a)
    }
}

/// Timings of the last [`Engine::new`] steps, for logs and benchmarks.
#[derive(Debug, Clone, Default)]
pub struct LoadStats {
    /// Seconds reading, converting, splitting and uploading weights.
    pub upload_s: f64,
    /// Bytes uploaded over all devices.
    pub uploaded_bytes: usize,
    /// Bytes uploaded by each process of [`EngineOptions::processes`] (one entry for the
    /// whole mesh).
    pub process_bytes: Vec<usize>,
}

struct Compiled {
    executable: Executable,
    program: ForwardProgram,
}

/// A model's weights on a mesh, and its forward compiled per batch shape.
pub struct Engine {
    client: Client,
    config: siphon_models::ModelConfig,
    hooks: Vec<HookPoint>,
    options: EngineOptions,
    param_specs: HashMap<String, PartitionSpec>,
    input_spec: Option<PartitionSpec>,
    params: Vec<ParamInfo>,
    /// The weights kept in their stored form ([`WeightForm::Stored`]).
    stored: HashMap<String, StoredForm>,
    /// Every weight argument, in the program's order (a stored weight's parts one by one).
    weights: Vec<ShardedArray>,
    /// Every dictionary's tensors, replicated, in the program's order (after the inputs).
    dictionary_args: Vec<ShardedArray>,
    /// The processes whose partitions this engine runs ([`EngineOptions::processes`], or one
    /// view of the whole mesh).
    views: Vec<HostView>,
    compiled: Mutex<HashMap<(usize, usize), Arc<Compiled>>>,
    load_stats: LoadStats,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("hooks", &self.hooks)
            .field("mesh", &self.options.mesh)
            .field("compute_dtype", &self.options.compute_dtype)
            .field("params", &self.params.len())
            .finish()
    }
}

fn element_type(dtype: DType) -> ElementType {
    match dtype {
        DType::F32 => ElementType::F32,
        DType::Bf16 => ElementType::BF16,
        DType::F16 => ElementType::F16,
        // Rows of scale and E4M3 bytes (`siphon_models::forward::FP8_MAX`).
        DType::U8 | DType::Fp8 => ElementType::U8,
    }
}

/// Uploads `tensor` split by `spec` over `view`'s mesh, each of the view's partitions
/// receiving its shard on its device; returns the view's share of the array and the bytes
/// moved.
fn upload(
    client: &Client,
    tensor: &HostTensor<'_>,
    spec: &PartitionSpec,
    view: &HostView,
    context: impl Fn() -> String + Copy,
) -> Result<(ShardedArray, usize), EngineError> {
    let mesh = view.mesh();
    let mesh_error = |source| EngineError::Mesh { context: context(), source };
    let ty = element_type(tensor.dtype);
    let shard_shape = spec.shard_shape(&tensor.shape, mesh).map_err(mesh_error)?;
    let partitions = view.partitions();
    let mut buffers = Vec::with_capacity(partitions.len());
    for &p in &partitions {
        let device = mesh.device_ids()[p];
        let buffer = if spec.is_replicated() {
            // The same bytes to every device, straight from the map when no conversion ran.
            client.upload_bytes(ty, &shard_shape, &tensor.data, device)
        } else {
            let shard = spec.shard(&tensor.data, tensor.dtype.size(), &tensor.shape, mesh, p).map_err(mesh_error)?;
            client.upload_bytes(ty, &shard_shape, &shard, device)
        };
        buffers.push(rt(context, buffer)?);
    }
    let bytes = shard_shape.iter().product::<usize>() * tensor.dtype.size() * partitions.len();
    Ok((rt(context, ShardedArray::from_local_buffers(buffers, partitions, &tensor.shape, spec, mesh))?, bytes))
}

/// One array from each view's share (the share itself for a single view).
fn merged(mut shares: Vec<ShardedArray>, context: impl Fn() -> String + Copy) -> Result<ShardedArray, EngineError> {
    if shares.len() == 1 {
        return Ok(shares.remove(0));
    }
    rt(context, ShardedArray::merge(shares))
}

impl Engine {
    /// Checks the checkpoint, builds the forward's parameter list for `hooks` and uploads the
    /// weights it needs, each device receiving only its shard.
    pub fn new(
        client: &Client,
        model: &LoadedModel,
        hooks: Vec<HookPoint>,
        options: EngineOptions,
    ) -> Result<Engine, EngineError> {
        check(&hooks, &options)?;
        let mesh = options.mesh.clone();
        let views = match options.processes.as_slice() {
            [] => vec![
                HostView::new(&mesh, vec![0; mesh.num_devices()], 0)
                    .map_err(|e| EngineError::Options(e.to_string()))?,
            ],
            views => views.to_vec(),
        };
        if let Some(v) = views.iter().find(|v| *v.mesh() != mesh) {
            return Err(EngineError::Options(format!("process {}'s view is of another mesh than {mesh}", v.process())));
        }
        let available = client.addressable_device_ids();
        let mut held: Vec<usize> = views.iter().flat_map(HostView::partitions).collect();
        held.sort_unstable();
        if held.windows(2).any(|w| w[0] == w[1]) {
            return Err(EngineError::Options("two processes' views hold the same partition".into()));
        }
        if let Some(d) = held.iter().map(|&p| mesh.device_ids()[p]).find(|d| !available.contains(d)) {
            return Err(EngineError::Options(format!(
                "mesh device {d} is not one of this client's devices {available:?}"
            )));
        }
        let (param_specs, input_spec) = options.plan.specs(&model.config, &mesh);
        let mut engine = Engine {
            client: client.clone(),
            config: model.config.clone(),
            hooks,
            options,
            param_specs,
            input_spec,
            params: Vec::new(),
            stored: HashMap::new(),
            weights: Vec::new(),
            dictionary_args: Vec::new(),
            views,
            compiled: Mutex::new(HashMap::new()),
            load_stats: LoadStats::default(),
        };
        // The parameter list does not depend on the batch shape: build a small program once
        // to learn it (the builder is pure Rust, milliseconds).
        let probe_batch = engine.input_spec.as_ref().map_or(1, |s| s.ways(0, &mesh)).max(1);
        let mut probe = build_forward(&engine.config, &engine.spec(probe_batch, 1))?;
        model.check_weights(probe.n_blocks)?;
        if engine.options.weights == WeightForm::Stored {
            for (param, spec) in probe.params.iter().zip(&probe.param_specs) {
                if let Some(form) = model.weights.stored_form(param)?
                    && stored_on(form, param, spec, &mesh)
                {
                    engine.stored.insert(param.name.clone(), form);
                }
            }
            probe = build_forward(&engine.config, &engine.spec(probe_batch, 1))?;
        }
        let start = Instant::now();
        let mut process_bytes = vec![0usize; engine.views.len()];
        let mut weights = Vec::with_capacity(probe.params.len());
        for ((param, spec), form) in probe.params.iter().zip(&probe.param_specs).zip(&probe.param_forms) {
            let context = || format!("uploading {}", param.name);
            let (tensors, specs) = match form {
                None => (vec![model.weights.load(param, engine.options.compute_dtype)?], vec![spec.clone()]),
                Some(form) => (
                    model.weights.load_stored(param, *form)?,
                    form.part_specs(&param.name, &param.shape, spec, &mesh).map_err(EngineError::Model)?,
                ),
            };
            for (tensor, spec) in tensors.iter().zip(&specs) {
                let mut shares = Vec::with_capacity(engine.views.len());
                for (view, total) in engine.views.iter().zip(&mut process_bytes) {
                    let (share, bytes) = upload(client, tensor, spec, view, context)?;
                    *total += bytes;
                    shares.push(share);
                }
                weights.push(merged(shares, context)?);
            }
        }
        let uploaded = process_bytes.iter().sum();
        engine.load_stats =
            LoadStats { upload_s: start.elapsed().as_secs_f64(), uploaded_bytes: uploaded, process_bytes };
        tracing::info!(
            arrays = weights.len(),
            stored = engine.stored.len(),
            bytes = uploaded,
            seconds = engine.load_stats.upload_s,
            "weights uploaded"
        );
        for d in &engine.options.dictionaries {
            for t in &d.dictionary.tensors {
                let context = || format!("uploading dictionary {}'s {}", d.dictionary.name, t.name);
                let bytes: Vec<u8> = t.values.iter().flat_map(|v| v.to_le_bytes()).collect();
                let tensor = HostTensor { dtype: DType::F32, shape: t.shape.clone(), data: bytes.into() };
                let spec = PartitionSpec::replicated(t.shape.len());
                let mut shares = Vec::with_capacity(engine.views.len());
                for view in &engine.views {
                    shares.push(upload(client, &tensor, &spec, view, context)?.0);
                }
                engine.dictionary_args.push(merged(shares, context)?);
            }
        }
        engine.params = probe.params;
        engine.weights = weights;
        Ok(engine)
    }

    /// The weights kept in their stored form on the devices, by name.
    pub fn stored_weights(&self) -> &HashMap<String, StoredForm> {
        &self.stored
    }

    fn spec(&self, batch: usize, seq: usize) -> ForwardSpec {
        let program = ProgramSpec {
            hooks: &self.hooks,
            options: &self.options,
            param_specs: &self.param_specs,
            input_spec: &self.input_spec,
            stored: &self.stored,
            cpu_kernels: self.client.cpu_kernels(),
            cuda_kernels: self.client.cuda_kernels(),
            platform: self.client.platform_name().to_ascii_lowercase(),
        };
        // Every shape reads the weights the first build found (none before it).
        program.forward(batch, seq, &self.params)
    }

    /// The dictionaries whose latents every run computes, in [`Activations::latents`]' order.
    pub fn dictionaries(&self) -> &[DictionaryHook] {
        &self.options.dictionaries
    }

    /// The hooks every run returns, in order.
    pub fn hooks(&self) -> &[HookPoint] {
        &self.hooks
    }

    /// The model's config.
    pub fn config(&self) -> &siphon_models::ModelConfig {
        &self.config
    }

    /// The mesh the weights live on.
    pub fn mesh(&self) -> &Mesh {
        &self.options.mesh
    }

    /// How long the weight upload took and how much it moved.
    pub fn load_stats(&self) -> LoadStats {
        self.load_stats.clone()
    }

    /// Compiles the forward for `(batch, seq)` unless already compiled. [`Engine::run`]
    /// does this on demand; calling it ahead keeps compile time out of the first batch.
    pub fn prepare(&self, batch: usize, seq: usize) -> Result<(), EngineError> {
        self.compiled_for(batch, seq).map(|_| ())
    }

    fn compiled_for(&self, batch: usize, seq: usize) -> Result<Arc<Compiled>, EngineError> {
        if let Some(c) = self.compiled.lock().expect("compile cache poisoned").get(&(batch, seq)) {
            return Ok(c.clone());
        }
        let mesh = &self.options.mesh;
        if let Some(spec) = &self.input_spec {
            let ways = spec.ways(0, mesh);
            if !batch.is_multiple_of(ways) {
                return Err(EngineError::Batch(format!(
                    "batch {batch} does not split evenly over {ways} data-parallel devices"
                )));
            }
        }
        let start = Instant::now();
        let spec = self.spec(batch, seq);
        let program = build_forward(&self.config, &spec)?;
        if program.params != self.params || program.param_forms.iter().flatten().count() != self.stored.len() {
            return Err(EngineError::Options(format!(
                "the forward for batch {batch} x seq {seq} takes different weights than the uploaded ones"
            )));
        }
        let options = if mesh.num_devices() > 1 {
            CompileOptions::spmd(mesh)
        } else {
            CompileOptions::single_device(Some(mesh.device_ids()[0]))
        };
        let executable = rt(
            || format!("compiling the forward for batch {batch} x seq {seq}"),
            self.client.compile(&program.text, &options),
        )?;
        tracing::info!(batch, seq, seconds = start.elapsed().as_secs_f64(), "forward compiled");
        if spec.cudnn_attention {
            tracing::info!(forms = %siphon_models::cudnn::summary(&program.attention), "attention");
        }
        if spec.ragged_experts.is_some() && self.config.moe.is_some() {
            tracing::info!(
                "experts: one chlo.ragged_dot per projection (XLA's grouped product), on each device's part"
            );
        } else if spec.grouped_experts && self.config.moe.is_some() {
            tracing::info!(
                "experts: one grouped product per projection (siphon_grouped_matmul), on each device's part"
            );
        }
        let compiled = Arc::new(Compiled { executable, program });
        self.compiled.lock().expect("compile cache poisoned").insert((batch, seq), compiled.clone());
        Ok(compiled)
    }

    /// Runs one batch and returns the requested activations on the host: the whole batch on
    /// a mesh this process holds, or, on a mesh spanning processes, this process's rows
    /// (its data groups', in order) in and out.
    pub fn run(&self, batch: &Batch) -> Result<Activations, EngineError> {
        let mut out = self.run_processes(std::slice::from_ref(batch))?;
        Ok(out.remove(0))
    }

    /// Runs one step for each process of [`EngineOptions::processes`]: `batches[i]` holds the
    /// rows process `i` feeds (its data groups' rows, in order), and the result `i` the
    /// activations of those rows, read back from its partitions only.
    pub fn run_processes(&self, batches: &[Batch]) -> Result<Vec<Activations>, EngineError> {
        let launched = self.launch(batches)?;
        (0..batches.len())
            .map(|process| {
                let shapes = launched.shapes(process);
                let mut arrays: Vec<Vec<u8>> = launched.sizes(process).into_iter().map(|n| vec![0; n]).collect();
                let download = launched.copy_into(process, arrays.iter_mut().map(Vec::as_mut_slice))?;
                rt(|| "copying the activations to the host".into(), download.wait())?;
                let hooks = self
                    .hooks
                    .iter()
                    .zip(shapes)
                    .zip(arrays)
                    .map(|((&hook, shape), bytes)| {
                        let array = HostArray::from_bytes(launched.element_type, &shape, bytes);
                        Ok((hook, rt(|| format!("copying {hook} to the host"), array)?))
                    })
                    .collect::<Result<_, EngineError>>()?;
                let latents = launched.latents(process)?;
                check_caps(&latents, &self.options.dictionaries)?;
                Ok(Activations { hooks, latents })
            })
            .collect()
    }

    /// Starts one step, as [`Engine::run_processes`] does, and returns once the program is
    /// launched: its outputs stay on the devices until [`Launched::copy_into`] copies each
    /// process's rows into memory the caller reuses. On a plugin that runs programs
    /// asynchronously (CUDA, TPU) the next step can be launched while this one's rows are
    /// copied.
    pub fn launch(&self, batches: &[Batch]) -> Result<Launched, EngineError> {
        if batches.len() != self.views.len() {
            return Err(EngineError::Batch(format!(
                "{} batches for the {} processes this engine runs",
                batches.len(),
                self.views.len()
            )));
        }
        let mut global = None;
        for (batch, view) in batches.iter().zip(&self.views) {
            if let Some(&t) = batch.input_ids.iter().find(|&&t| t < 0 || t as usize >= self.config.vocab_size) {
                return Err(EngineError::Batch(format!(
                    "token id {t} is outside the vocabulary (0..{})",
                    self.config.vocab_size
                )));
            }
            let rows = view.global_batch(batch.batch).map_err(|e| EngineError::Batch(e.to_string()))?;
            match global {
                None => global = Some((rows, batch.seq)),
                Some(shape) if shape != (rows, batch.seq) => {
                    return Err(EngineError::Batch(format!(
                        "process {} feeds a {}x{} batch, unlike the others (a global {}x{})",
                        view.process(),
                        batch.batch,
                        batch.seq,
                        shape.0,
                        shape.1
                    )));
                }
                Some(_) => {}
            }
        }
        let (rows, seq) = global.ok_or_else(|| EngineError::Batch("no batch".into()))?;
        let compiled = self.compiled_for(rows, seq)?;
        let mesh = &self.options.mesh;
        let program = &compiled.program;
        let mut inputs = Vec::with_capacity(3);
        for info in &program.inputs {
            let context = || format!("uploading {}", info.name);
            let mut shares = Vec::with_capacity(self.views.len());
            for (batch, view) in batches.iter().zip(&self.views) {
                let values = match info.name {
                    "input_ids" => &batch.input_ids,
                    "attention_mask" => &batch.attention_mask,
                    "position_ids" => &batch.position_ids,
                    other => return Err(EngineError::Options(format!("the forward takes an unknown input {other:?}"))),
                };
                // The process's rows in their places of the global batch; its partitions read
                // nothing else.
                let mut placed = vec![0i32; rows * seq];
                let mut local = values.chunks(seq);
                for range in view.rows(rows) {
                    for row in range {
                        let values = local.next().ok_or_else(|| EngineError::Batch("too few rows".into()))?;
                        placed[row * seq..(row + 1) * seq].copy_from_slice(values);
                    }
                }
                let array = rt(context, HostArray::from_slice(&[rows, seq], &placed))?;
                shares.push(rt(context, self.client.upload_partitions(&array, &info.spec, mesh, view.partitions()))?);
            }
            inputs.push(merged(shares, context)?);
        }
        let args: Vec<&ShardedArray> = self.weights.iter().chain(&inputs).chain(&self.dictionary_args).collect();
        let mut out_specs: Vec<PartitionSpec> = program.outputs.iter().map(|o| o.spec.clone()).collect();
        for l in &program.latents {
            let per_token = PartitionSpec::from_dims(l.spec.dims()[..2].to_vec());
            out_specs.extend([l.spec.clone(), l.spec.clone(), per_token]);
        }
        let outputs =
            rt(|| "running the forward".into(), compiled.executable.execute_sharded(mesh, &args, &out_specs))?;
        Ok(Launched {
            outputs,
            hooks: self.hooks.clone(),
            dictionaries: self.options.dictionaries.clone(),
            views: self.views.clone(),
            rows,
            element_type: element_type(self.options.output_dtype),
        })
    }
}

/// Refuses a token that fired more of a dictionary's latents than it keeps.
fn check_caps(latents: &[Latents], dictionaries: &[DictionaryHook]) -> Result<(), EngineError> {
    for (latents, d) in latents.iter().zip(dictionaries) {
        let seq = latents.firings.shape()[1];
        let firings = latents.firings.to_f32();
        if let Some(token) = firings.iter().position(|&f| f as usize > d.cap) {
            return Err(EngineError::LatentCap {
                dictionary: d.dictionary.name.clone(),
                row: token / seq,
                position: token % seq,
                firings: firings[token] as i32,
                cap: d.cap,
            });
        }
    }
    Ok(())
}

/// One step launched on the devices ([`Engine::launch`]): the program's outputs, until each
/// process's rows are copied to the host.
pub struct Launched {
    outputs: Vec<ShardedArray>,
    hooks: Vec<HookPoint>,
    dictionaries: Vec<DictionaryHook>,
    views: Vec<HostView>,
    /// Rows of the global batch.
    rows: usize,
    element_type: ElementType,
}

impl Launched {
    /// Waits until the program has computed every output (the step's device time, when
    /// called right after launching).
    pub fn wait(&self) -> Result<(), EngineError> {
        for (i, output) in self.outputs.iter().enumerate() {
            let what = || match self.hooks.get(i) {
                Some(hook) => format!("computing {hook}"),
                None => "computing the dictionaries' latents".to_string(),
            };
            for buffer in output.buffers() {
                rt(what, buffer.wait_ready())?;
            }
        }
        Ok(())
    }

    /// The element type of every output.
    pub fn element_type(&self) -> ElementType {
        self.element_type
    }

    /// Each hook's shape for process `process`'s rows: `[rows, seq, *per-token shape]`.
    pub fn shapes(&self, process: usize) -> Vec<Vec<usize>> {
        let rows: usize = self.views[process].rows(self.rows).iter().map(|r| r.len()).sum();
        self.outputs[..self.hooks.len()]
            .iter()
            .map(|o| std::iter::once(rows).chain(o.shape()[1..].iter().copied()).collect())
            .collect()
    }

    /// Each dictionary's latents for process `process`'s rows, read from its partitions only
    /// (waiting for the copies), as the devices left them: a token's firings may exceed the
    /// latents kept (see [`Latents::firings`]); [`Engine::run`] refuses those, the extraction's
    /// writer refuses those it would store.
    pub fn latents(&self, process: usize) -> Result<Vec<Latents>, EngineError> {
        let view = self.views.get(process).ok_or_else(|| EngineError::Batch(format!("no process {process}")))?;
        let (rows, from) = (view.rows(self.rows), view.partitions());
        let local: usize = rows.iter().map(|r| r.len()).sum();
        let outputs = &self.outputs[self.hooks.len()..];
        let mut all = Vec::with_capacity(self.dictionaries.len());
        for (d, parts) in self.dictionaries.iter().zip(outputs.chunks(3)) {
            let name = &d.dictionary.name;
            let read = |output: &ShardedArray, ty: ElementType| -> Result<HostArray, EngineError> {
                let context = || format!("copying dictionary {name}'s latents to the host");
                let shape: Vec<usize> = std::iter::once(local).chain(output.shape()[1..].iter().copied()).collect();
                let mut bytes = vec![0u8; shape.iter().product::<usize>() * ty.size_in_bytes()];
                rt(context, rt(context, output.rows_into(&rows, &from, &mut bytes))?.wait())?;
                rt(context, HostArray::from_bytes(ty, &shape, bytes))
            };
            all.push(Latents {
                indices: read(&parts[0], ElementType::S32)?,
                values: read(&parts[1], ElementType::F32)?,
                firings: read(&parts[2], ElementType::S32)?,
            });
        }
        Ok(all)
    }

    /// Each hook's bytes for process `process`'s rows: the destinations [`Launched::copy_into`]
    /// takes.
    pub fn sizes(&self, process: usize) -> Vec<usize> {
        let size = self.element_type.size_in_bytes();
        self.shapes(process).iter().map(|s| s.iter().product::<usize>() * size).collect()
    }

    /// Starts copying process `process`'s rows of every hook, read from its partitions only,
    /// each into its destination of `dsts` (hook order, [`Launched::sizes`] bytes each).
    pub fn copy_into<'a>(
        &self,
        process: usize,
        dsts: impl IntoIterator<Item = &'a mut [u8]>,
    ) -> Result<Download<'a>, EngineError> {
        let view = self.views.get(process).ok_or_else(|| EngineError::Batch(format!("no process {process}")))?;
        let (rows, from) = (view.rows(self.rows), view.partitions());
        let mut dsts = dsts.into_iter();
        let mut download: Option<Download<'a>> = None;
        for (hook, output) in self.hooks.iter().zip(&self.outputs) {
            let dst = dsts.next().ok_or_else(|| EngineError::Batch(format!("no destination for {hook}")))?;
            let started = rt(|| format!("copying {hook} to the host"), output.rows_into(&rows, &from, dst))?;
            download = Some(match download {
                None => started,
                Some(d) => d.join(started),
            });
        }
        Ok(download.unwrap_or_else(Download::done))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_and_batches_cross_threads() {
        // The extraction loop owns the engine on a compute thread and hands batches over
        // channels; both must be Send, and the engine Sync for a shared `Arc<Engine>`.
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Engine>();
        send_sync::<Batch>();
        send_sync::<Activations>();
    }

    #[test]
    fn positions_follow_the_mask_on_either_side() {
        assert_eq!(positions_from_mask(&[1, 1, 1, 0, 0], 5), vec![0, 1, 2, 2, 2]);
        assert_eq!(positions_from_mask(&[0, 0, 1, 1, 1], 5), vec![0, 0, 0, 1, 2]);
        assert_eq!(positions_from_mask(&[1, 1, 0, 1, 1, 1], 3), vec![0, 1, 1, 0, 1, 2]);
    }

    #[test]
    fn batch_validation_names_the_problem() {
        let err = Batch::new(vec![], None).unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
        let err = Batch::new(vec![vec![1, 2]], Some(vec![vec![1, 2]])).unwrap_err();
        assert!(err.to_string().contains("only 0 and 1"), "{err}");
        let b = Batch::new(vec![vec![1, 2]], None).unwrap();
        assert!(b.clone().with_position_ids(vec![0]).is_err());
        assert!(b.clone().with_position_ids(vec![0, -1]).is_err());
        assert_eq!(b.with_position_ids(vec![5, 6]).unwrap().position_ids(), &[5, 6]);
    }
}
