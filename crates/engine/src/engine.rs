//! The [`Engine`]: the forward built once, its weights read, split and uploaded once, a
//! program compiled per `(batch, seq)` shape; runs batches, or launches them without
//! waiting ([`Launched`](crate::Launched)).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use siphon_mesh::{HostView, Mesh, PartitionSpec};
use siphon_models::{
    DType, DictionaryHook, ForwardProgram, ForwardSpec, HookPoint, HostTensor, LatentsInfo, LoadedModel, ParamInfo,
    RaggedDot, StoredForm, build_forward,
};
use siphon_runtime::{Client, CompileOptions, ElementType, Executable, HostArray, ShardedArray};

use crate::batch::{Activations, Batch};
use crate::error::{EngineError, rt};
use crate::launched::Launched;
use crate::options::{EngineOptions, WeightForm, check};

/// A compiled program's shape: rows, tokens a row and chosen rows a row (`None`: every token).
type Shape = (usize, usize, Option<usize>);

/// What the engine's program is built from, whether it runs here ([`Engine`]) or is only
/// compiled for devices elsewhere ([`aot`]): one place, so both build the same program.
pub(crate) struct ProgramSpec<'a> {
    pub(crate) hooks: &'a [HookPoint],
    pub(crate) options: &'a EngineOptions,
    pub(crate) param_specs: &'a HashMap<String, PartitionSpec>,
    pub(crate) input_spec: &'a Option<PartitionSpec>,
    pub(crate) stored: &'a HashMap<String, StoredForm>,
    /// Whether the compiling side has siphon's CPU kernels, and its CUDA kernels.
    pub(crate) cpu_kernels: bool,
    pub(crate) cuda_kernels: bool,
    /// The compiling side's platform, lower case: `cpu`, `cuda`, `tpu`.
    pub(crate) platform: String,
}

impl ProgramSpec<'_> {
    /// Whether the TPU program's forms are taken ([`EngineOptions::tpu_forms`]).
    fn tpu_forms(&self) -> bool {
        tpu_forms(&self.platform, self.options.tpu_forms)
    }

    /// Whether the CPU plugin's own forms are taken: on it, but not in the TPU's forms.
    fn cpu_forms(&self) -> bool {
        cpu_forms(&self.platform, self.options.tpu_forms)
    }

    /// Whether a sampled decoding step draws on the devices ([`draws_on_devices`]).
    pub(crate) fn draws_on_devices(&self) -> bool {
        draws_on_devices(&self.platform, self.options.tpu_forms)
    }

    /// The forward for `batch` × `seq`, reading `params` (every weight its graph reads when
    /// empty: the first build, which finds them).
    pub(crate) fn forward(&self, batch: usize, seq: usize, params: &[ParamInfo]) -> ForwardSpec {
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
        let tpu_forms = self.tpu_forms();
        spec.decode_without_tables = tpu_forms;
        spec.norm_heads_in_place = tpu_forms;
        let weight_first = self.cpu_forms() && self.options.decode.is_some();
        spec.weight_first = weight_first.then_some(siphon_models::WEIGHT_FIRST_ROWS);
        spec.ragged_experts = match (tpu_forms, on("cpu")) {
            (true, true) => Some(RaggedDot::Masked),
            (true, false) => Some(RaggedDot::Native),
            (false, _) => None,
        };
        spec.cudnn_attention = self.options.right_padded && on("cuda") && self.options.decode.is_none();
        spec.mlp_chunk = on("cuda").then_some(siphon_models::MLP_CHUNK_ELEMENTS);
        spec.dictionaries = self.options.dictionaries.clone();
        spec.next_token = self.options.next_token;
        spec.steering = self.options.steering.iter().map(|s| s.hook).collect();
        spec.weights = (!params.is_empty()).then(|| params.iter().map(|p| p.name.clone()).collect());
        spec.decode = self.options.decode;
        spec.sampling = match self.draws_on_devices() {
            true => self.options.sampling,
            false => siphon_models::Sampling::default(),
        };
        spec.isolated = self.options.isolated;
        spec
    }
}

/// Whether a sampled decoding step on `platform` (lower case: `cpu`, `cuda`, `tpu`) draws on
/// the devices (`siphon_models::sample`), with the TPU program's forms `asked` for or not
/// ([`EngineOptions::tpu_forms`]): on accelerators, where the logits would cross to the host
/// and a host's sort would hold a step back; not in the CPU plugin's own forms, where XLA's
/// sorts run slower than the host's reference sampler (docs/BENCHMARKS.md), which then draws.
pub fn draws_on_devices(platform: &str, asked: Option<bool>) -> bool {
    !cpu_forms(platform, asked)
}

/// Whether the TPU program's forms are taken on `platform`: as `asked`, else on TPUs.
fn tpu_forms(platform: &str, asked: Option<bool>) -> bool {
    asked.unwrap_or(platform == "tpu")
}

/// Whether the CPU plugin's own forms are taken on `platform`: on it, but not in the TPU's forms.
fn cpu_forms(platform: &str, asked: Option<bool>) -> bool {
    platform == "cpu" && !tpu_forms(platform, asked)
}

/// The program `spec` asks for: a decoding step where it says so, else the forward.
pub(crate) fn build(config: &siphon_models::ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, EngineError> {
    Ok(match spec.decode {
        Some(_) => siphon_models::build_decode_step(config, spec)?,
        None => build_forward(config, spec)?,
    })
}

/// Whether a weight stored as `form` stays so on the devices under `spec`: a split that would
/// cut the form's blocks keeps it dequantized (logged).
pub(crate) fn stored_on(form: StoredForm, param: &ParamInfo, spec: &PartitionSpec, mesh: &Mesh) -> bool {
    match form.part_specs(&param.name, &param.shape, spec, mesh) {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!("{e}: dequantized on load instead");
            false
        }
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

pub(crate) struct Compiled {
    pub(crate) executable: Executable,
    pub(crate) program: ForwardProgram,
}

/// A model's weights on a mesh, and its forward compiled per batch shape.
pub struct Engine {
    pub(crate) client: Client,
    pub(crate) config: siphon_models::ModelConfig,
    pub(crate) hooks: Vec<HookPoint>,
    pub(crate) options: EngineOptions,
    pub(crate) param_specs: HashMap<String, PartitionSpec>,
    pub(crate) input_spec: Option<PartitionSpec>,
    pub(crate) params: Vec<ParamInfo>,
    /// The weights kept in their stored form ([`WeightForm::Stored`]).
    pub(crate) stored: HashMap<String, StoredForm>,
    /// Every weight argument, in the program's order (a stored weight's parts one by one).
    pub(crate) weights: Vec<ShardedArray>,
    /// Every dictionary's tensors, replicated, in the program's order (after the inputs).
    pub(crate) dictionary_args: Vec<ShardedArray>,
    /// Each steering vector (`EngineOptions::steering`), after the dictionaries' tensors.
    pub(crate) steering_args: Vec<ShardedArray>,
    /// The processes whose partitions this engine runs ([`EngineOptions::processes`], or one
    /// view of the whole mesh).
    pub(crate) views: Vec<HostView>,
    /// Compiled programs by shape.
    pub(crate) compiled: Mutex<HashMap<Shape, Arc<Compiled>>>,
    pub(crate) load_stats: LoadStats,
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

pub(crate) fn element_type(dtype: DType) -> ElementType {
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
/// `tensor` whole on every device of `views` (a dictionary's tensors, a steering vector).
fn upload_replicated(
    client: &Client,
    views: &[HostView],
    tensor: &HostTensor<'_>,
    context: impl Fn() -> String + Copy,
) -> Result<ShardedArray, EngineError> {
    let spec = PartitionSpec::replicated(tensor.shape.len());
    let shares = views.iter().map(|view| Ok(upload(client, tensor, &spec, view, context)?.0));
    merged(shares.collect::<Result<Vec<_>, EngineError>>()?, context)
}

pub(crate) fn upload(
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
pub(crate) fn merged(
    mut shares: Vec<ShardedArray>,
    context: impl Fn() -> String + Copy,
) -> Result<ShardedArray, EngineError> {
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
            steering_args: Vec::new(),
            views,
            compiled: Mutex::new(HashMap::new()),
            load_stats: LoadStats::default(),
        };
        // The parameter list does not depend on the batch shape: build a small program once
        // to learn it (the builder is pure Rust, milliseconds).
        let probe_batch = engine.input_spec.as_ref().map_or(1, |s| s.ways(0, &mesh)).max(1);
        let mut probe = build(&engine.config, &engine.spec(probe_batch, 1, None))?;
        model.check_weights(probe.n_blocks)?;
        if engine.options.weights == WeightForm::Stored {
            for (param, spec) in probe.params.iter().zip(&probe.param_specs) {
                if let Some(form) = model.weights.stored_form(param)?
                    && stored_on(form, param, spec, &mesh)
                {
                    engine.stored.insert(param.name.clone(), form);
                }
            }
            probe = build(&engine.config, &engine.spec(probe_batch, 1, None))?;
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
        for (what, tensor) in siphon_models::dictionary::host_tensors(&engine.options.dictionaries) {
            let array = upload_replicated(client, &engine.views, &tensor, || format!("uploading {what}"))?;
            engine.dictionary_args.push(array);
        }
        for steering in &engine.options.steering {
            let data = steering.values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let tensor = HostTensor { dtype: DType::F32, shape: vec![steering.values.len()], data };
            let context = || format!("uploading the steering vector of {}", steering.hook);
            engine.steering_args.push(upload_replicated(client, &engine.views, &tensor, context)?);
        }
        engine.params = probe.params;
        engine.weights = weights;
        Ok(engine)
    }

    /// The weights kept in their stored form on the devices, by name.
    pub fn stored_weights(&self) -> &HashMap<String, StoredForm> {
        &self.stored
    }

    /// What this engine's programs are built from.
    pub(crate) fn program(&self) -> ProgramSpec<'_> {
        ProgramSpec {
            hooks: &self.hooks,
            options: &self.options,
            param_specs: &self.param_specs,
            input_spec: &self.input_spec,
            stored: &self.stored,
            cpu_kernels: self.client.cpu_kernels(),
            cuda_kernels: self.client.cuda_kernels(),
            platform: self.client.platform_name().to_ascii_lowercase(),
        }
    }

    fn spec(&self, batch: usize, seq: usize, select: Option<usize>) -> ForwardSpec {
        // Every shape reads the weights the first build found (none before it).
        ForwardSpec { select, ..self.program().forward(batch, seq, &self.params) }
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
        self.compiled_for(batch, seq, None).map(|_| ())
    }

    /// Compiles the forward for `(batch, seq)` returning `rows` chosen rows a sequence
    /// ([`Batch::with_selection`]) unless already compiled.
    pub fn prepare_chosen(&self, batch: usize, seq: usize, rows: usize) -> Result<(), EngineError> {
        self.compiled_for(batch, seq, Some(rows)).map(|_| ())
    }

    pub(crate) fn compiled_for(
        &self,
        batch: usize,
        seq: usize,
        select: Option<usize>,
    ) -> Result<Arc<Compiled>, EngineError> {
        let key = (batch, seq, select);
        if let Some(c) = self.compiled.lock().expect("compile cache poisoned").get(&key) {
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
        let spec = self.spec(batch, seq, select);
        let program = build(&self.config, &spec)?;
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
        tracing::info!(batch, seq, chosen_rows = select, seconds = start.elapsed().as_secs_f64(), "forward compiled");
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
        self.compiled.lock().expect("compile cache poisoned").insert(key, compiled.clone());
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
                Ok(Activations {
                    hooks,
                    latents: launched.latents(process)?,
                    next_token: launched.next_token(process)?,
                })
            })
            .collect()
    }

    /// The program for `batches` (one per process of the engine's views, alike in global
    /// shape), compiled, with its `[batch, seq]` inputs uploaded, and the global batch.
    pub(crate) fn inputs(&self, batches: &[Batch]) -> Result<(Arc<Compiled>, Vec<ShardedArray>, usize), EngineError> {
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
            if let Some(&t) = batch.next_ids.iter().find(|&&t| t < -1 || t >= 0 && t as usize >= self.config.vocab_size)
            {
                return Err(EngineError::Batch(format!(
                    "next token id {t} is outside the vocabulary (0..{}; -1 for none)",
                    self.config.vocab_size
                )));
            }
            let rows = view.global_batch(batch.batch).map_err(|e| EngineError::Batch(e.to_string()))?;
            let shape = (rows, batch.seq, batch.chosen_rows());
            match global {
                None => global = Some(shape),
                Some(global) if global != shape => {
                    return Err(EngineError::Batch(format!(
                        "process {} feeds a {}x{} batch ({:?} chosen rows), unlike the others (a global {}x{}, {:?})",
                        view.process(),
                        batch.batch,
                        batch.seq,
                        shape.2,
                        global.0,
                        global.1,
                        global.2
                    )));
                }
                Some(_) => {}
            }
        }
        let (rows, seq, select) = global.ok_or_else(|| EngineError::Batch("no batch".into()))?;
        let compiled = self.compiled_for(rows, seq, select)?;
        let mesh = &self.options.mesh;
        let program = &compiled.program;
        let mut inputs = Vec::with_capacity(3);
        for info in &program.inputs {
            let context = || format!("uploading {}", info.name);
            let mut shares = Vec::with_capacity(self.views.len());
            for (batch, view) in batches.iter().zip(&self.views) {
                let array = match info.name {
                    "input_ids" => placed(&batch.input_ids, view, &info.shape),
                    "attention_mask" => placed(&batch.attention_mask, view, &info.shape),
                    "position_ids" => placed(&batch.position_ids, view, &info.shape),
                    "next_ids" => placed(&batch.next_ids, view, &info.shape),
                    "select" => match &batch.select {
                        Some((_, weights)) => placed(weights, view, &info.shape),
                        None => return Err(EngineError::Batch("the forward chooses rows, the batch has none".into())),
                    },
                    "uniforms" => match &batch.uniforms {
                        Some(u) => placed(u, view, &info.shape),
                        None => {
                            return Err(EngineError::Batch(
                                "the step draws each row's token, the batch has no uniforms".into(),
                            ));
                        }
                    },
                    other => return Err(EngineError::Options(format!("the forward takes an unknown input {other:?}"))),
                };
                let array = array?;
                shares.push(rt(context, self.client.upload_partitions(&array, &info.spec, mesh, view.partitions()))?);
            }
            inputs.push(merged(shares, context)?);
        }
        Ok((compiled, inputs, rows))
    }

    /// Starts one step, as [`Engine::run_processes`] does, and returns once the program is
    /// launched: its outputs stay on the devices until [`Launched::copy_into`] copies each
    /// process's rows into memory the caller reuses. On a plugin that runs programs
    /// asynchronously (CUDA, TPU) the next step can be launched while this one's rows are
    /// copied.
    pub fn launch(&self, batches: &[Batch]) -> Result<Launched, EngineError> {
        if self.options.decode.is_some() {
            return Err(EngineError::Options(
                "a decoding engine's steps run through a Decoder (Engine::decoder)".into(),
            ));
        }
        let (compiled, inputs, rows) = self.inputs(batches)?;
        let mesh = &self.options.mesh;
        let program = &compiled.program;
        let args: Vec<&ShardedArray> =
            self.weights.iter().chain(&inputs).chain(&self.dictionary_args).chain(&self.steering_args).collect();
        let mut out_specs: Vec<PartitionSpec> = program.outputs.iter().map(|o| o.spec.clone()).collect();
        out_specs.extend(program.latents.iter().flat_map(LatentsInfo::result_specs));
        let latent_results = out_specs.len() - program.outputs.len();
        out_specs.extend(program.next_token.iter().map(|o| o.spec.clone()));
        let outputs =
            rt(|| "running the forward".into(), compiled.executable.execute_sharded(mesh, &args, &out_specs))?;
        Ok(Launched {
            outputs,
            hooks: self.hooks.clone(),
            latent_results,
            next_token: program.next_token.iter().map(|o| o.name.clone()).collect(),
            views: self.views.clone(),
            rows,
            element_type: element_type(self.options.output_dtype),
        })
    }
}

/// A process's rows of an input (`shape`: the global batch's, rows first) in their places of
/// the global batch, zeros elsewhere: its partitions read nothing else.
fn placed<T: siphon_runtime::NativeType + Default + Copy>(
    values: &[T],
    view: &HostView,
    shape: &[usize],
) -> Result<HostArray, EngineError> {
    let (rows, per_row) = (shape[0], shape[1..].iter().product::<usize>());
    let mut placed = vec![T::default(); rows * per_row];
    let mut local = values.chunks(per_row);
    for range in view.rows(rows) {
        for row in range {
            let values = local.next().ok_or_else(|| EngineError::Batch("too few rows".into()))?;
            placed[row * per_row..(row + 1) * per_row].copy_from_slice(values);
        }
    }
    rt(|| "placing an input's rows".into(), HostArray::from_slice(shape, &placed))
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
}
