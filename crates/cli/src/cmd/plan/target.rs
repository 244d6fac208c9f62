//! `siphon plan --target tpu:SLICE | gpu:GPUS`: the program `siphon extract` would run on a
//! TPU slice or on GPU nodes, compiled for them on this machine (no TPU or GPU needed) — by
//! libtpu, or by XLA's CUDA plugin from its own description of the GPU — and the compiler's
//! figures per device beside the planner's.
//!
//! The target gives hosts × devices and each device's memory (`siphon_plan::TpuSlice`,
//! `siphon_plan::GpuTarget`); the planner chooses the mesh as for any run;
//! `siphon_engine::aot` builds the engine's own program for that mesh (hooks, dtypes,
//! shardings, stored weight forms; on GPUs cuDNN's attention over right-padded rows and the
//! grouped expert products, as a CUDA client runs them) and the compiler compiles it for the
//! target's topology. On GPUs the compiled program is read back: which blocks kept cuDNN's
//! fused call, how many grouped products it holds. A program whose per-device total exceeds a
//! device's memory is refused, naming its largest term and the mesh that would fit.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Serialize;
use siphon_engine::aot::{AotProgram, AotRequest};
use siphon_engine::{EngineOptions, ShardingPlan, WeightForm};
use siphon_models::AttentionForm;
use siphon_models::ModelConfig;
use siphon_plan::memory::gib;
use siphon_plan::{GpuTarget, Plan, PlanRequest, TpuSlice};
use siphon_runtime::{
    GpuTargetConfig, HloInstruction, Plugin, PluginLocator, Topology, gpu_topology_options, tpu_topology_options,
};

/// The devices `--target` names.
#[derive(Debug, Clone)]
pub enum Target {
    /// A TPU slice (`tpu:v5litepod-64`), `--slices` times over.
    Tpu(TpuSlice),
    /// GPU nodes (`gpu:h100x8`), `--hosts` of them.
    Gpu(GpuTarget),
}

impl Target {
    /// The target `--target` names: `tpu:SLICE` (`slices` of them) or `gpu:GPUS` (on `hosts`
    /// nodes; a TPU slice's hosts come from its name).
    pub fn parse(target: &str, slices: usize, hosts: usize) -> anyhow::Result<Target> {
        if let Some(name) = target.strip_prefix("gpu:") {
            if slices != 1 {
                bail!("--slices joins TPU slices; GPU nodes are counted with --hosts");
            }
            return Ok(Target::Gpu(GpuTarget::parse(name, hosts).context("--target")?));
        }
        if !target.starts_with("tpu:") {
            bail!(
                "--target {target}: name a TPU slice as tpu:SLICE (tpu:v5litepod-64) or GPU nodes as gpu:GPUS \
                 (gpu:h100x8): what siphon compiles for without their devices"
            );
        }
        if hosts != 1 {
            bail!("--hosts counts GPU nodes; a TPU slice's hosts follow from its name (--slices joins slices)");
        }
        Ok(Target::Tpu(slice(target, slices)?))
    }

    /// The planner's hosts × devices per host.
    pub fn planner_topology(&self) -> anyhow::Result<siphon_plan::Topology> {
        Ok(match self {
            Target::Tpu(slice) => slice.planner_topology()?,
            Target::Gpu(gpus) => gpus.planner_topology()?,
        })
    }

    /// What a job may use of one device: a TPU chip's HBM, a GPU's allocator share.
    pub fn usable_bytes(&self) -> u64 {
        match self {
            Target::Tpu(slice) => slice.generation.hbm_bytes(),
            Target::Gpu(gpus) => gpus.model.usable_bytes(),
        }
    }

    /// How the devices lay arrays out (a TPU pads them to its tiles; a GPU adds a table of a
    /// program's results).
    pub fn layout(&self) -> siphon_plan::DeviceLayout {
        match self {
            Target::Tpu(_) => siphon_plan::DeviceLayout::TpuTiled,
            Target::Gpu(_) => siphon_plan::DeviceLayout::Gpu,
        }
    }

    /// How a mixture's experts split over `model` there: each expert's width on a TPU (its
    /// programs' `chlo.ragged_dot` then multiplies only the routed rows on each chip), whole
    /// experts on GPUs (siphon's grouped products, expert parallelism).
    pub fn expert_split(&self) -> siphon_models::sharding::ExpertSplit {
        match self {
            Target::Tpu(_) => siphon_models::sharding::ExpertSplit::Width,
            Target::Gpu(_) => siphon_models::sharding::ExpertSplit::Experts,
        }
    }

    fn devices(&self) -> usize {
        match self {
            Target::Tpu(slice) => slice.devices(),
            Target::Gpu(gpus) => gpus.devices(),
        }
    }

    /// A device's peak bf16 flops and memory bytes per second.
    fn peaks(&self) -> (f64, f64) {
        match self {
            Target::Tpu(slice) => (slice.generation.peak_bf16_flops(), slice.generation.hbm_bytes_per_second()),
            Target::Gpu(gpus) => (gpus.model.peak_bf16_flops(), gpus.model.memory_bytes_per_second()),
        }
    }

    /// What a device is called in messages: `v5e chip`, `H100`.
    fn device_word(&self) -> String {
        match self {
            Target::Tpu(slice) => format!("{} chip", slice.topology.split(':').next().unwrap_or_default()),
            Target::Gpu(gpus) => gpus.model.device_name().to_string(),
        }
    }

    fn name(&self) -> String {
        match self {
            Target::Tpu(slice) => slice.name.clone(),
            Target::Gpu(gpus) => gpus.name.clone(),
        }
    }
}

/// What to compile, and for which devices.
pub struct Compile<'a> {
    pub target: Target,
    pub config: &'a ModelConfig,
    pub request: PlanRequest,
    pub weights: WeightForm,
    /// `--plugin`: the libtpu or CUDA plugin to compile with.
    pub plugin: Option<&'a Path>,
    /// Whether the rows are right-padded (`extract`'s default `--pad right`): on GPUs, the
    /// blocks cuDNN's fused attention can take then take it.
    pub right_padded: bool,
    /// `--pack isolated`: each document of a row attends only itself.
    pub isolated: bool,
    /// `--tpu-forms`: whether a TPU program takes its own forms (the default) or the CPU's.
    pub tpu_forms: bool,
    /// `--sae`: dictionaries whose latents the program computes.
    pub dictionaries: Vec<siphon_models::DictionaryHook>,
}

/// The slice `--target` names (`tpu:v5litepod-64`), `slices` times over.
pub fn slice(target: &str, slices: usize) -> anyhow::Result<TpuSlice> {
    let Some(name) = target.strip_prefix("tpu:") else {
        bail!(
            "--target {target}: name a TPU slice as tpu:SLICE, e.g. tpu:v5litepod-64 \
             (TPU slices are what siphon compiles for without their devices)"
        )
    };
    TpuSlice::parse(name, slices).context("--target")
}

/// libtpu's description of `slice` (compiled for on this machine: no TPU), and the libtpu's
/// path: `plugin`, else where [`PluginLocator::locate_libtpu`] finds it.
pub fn open_topology(slice: &TpuSlice, plugin: Option<&Path>) -> anyhow::Result<(Topology, PathBuf)> {
    // libtpu asks the GCE metadata server about the TPU it runs on unless told not to (for
    // minutes where there is none), takes a machine-wide lock (/tmp/libtpu_lockfile) that
    // makes a second process fail while the first runs, and logs at length; none of it helps
    // compiling for a slice, which touches no TPU. Off a TPU VM it also logs, as errors a user
    // would take for failures, that it cannot tell the accelerator type and the worker
    // hostnames a TPU VM sets, and that it cannot move its code to huge pages: it is told the
    // slice's type and a one-host worker list, as a TPU VM would tell it, and not to try the
    // huge pages (a load-time speed-up of its own code). Its real errors still show.
    let accelerator = slice.accelerator_type();
    for (name, value) in [
        ("TPU_SKIP_MDS_QUERY", "1"),
        ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"),
        ("TF_CPP_MIN_LOG_LEVEL", "2"),
        ("TPU_ACCELERATOR_TYPE", accelerator.as_str()),
        ("TPU_WORKER_HOSTNAMES", "localhost"),
        ("TPU_WORKER_ID", "0"),
    ] {
        if std::env::var_os(name).is_none() {
            // SAFETY: called before this process starts any thread (the planner is pure and
            // the plugin is not loaded yet), so nothing reads the environment concurrently.
            unsafe { std::env::set_var(name, value) };
        }
    }
    let init_args = std::env::var("LIBTPU_INIT_ARGS").unwrap_or_default();
    if !init_args.contains("hugepage_text") {
        // SAFETY: as above.
        unsafe { std::env::set_var("LIBTPU_INIT_ARGS", format!("{init_args} --hugepage_text=false").trim_start()) };
    }
    let choice = PluginLocator::new().explicit(plugin).locate_libtpu()?;
    let libtpu = Plugin::load_for_compiling(&choice.path)
        .with_context(|| format!("loading libtpu {} ({})", choice.path.display(), choice.reason))?;
    let options = tpu_topology_options(slice.chip_config, slice.chips_per_host_bounds, slice.slices, slice.wrap);
    let topology = Topology::new(&libtpu, &slice.topology, &options)
        .with_context(|| format!("libtpu's topology {} for {}", slice.topology, slice.name))?;
    if topology.devices().len() != slice.devices() {
        bail!(
            "libtpu's topology {} has {} devices; {} x {} should have {}",
            slice.topology,
            topology.devices().len(),
            slice.slices,
            slice.name,
            slice.devices()
        );
    }
    Ok((topology, choice.path))
}

/// The CUDA plugin's description of `gpus`' device and a topology of them (compiled for on
/// this machine: no GPU), the plugin's path and the description: `plugin`, else where
/// [`PluginLocator::locate_cuda_compiler`] finds it.
pub fn open_gpu_topology(gpus: &GpuTarget, plugin: Option<&Path>) -> anyhow::Result<(Topology, PathBuf)> {
    if std::env::var_os("TF_CPP_MIN_LOG_LEVEL").is_none() {
        // SAFETY: called before this process starts any thread (the planner is pure and the
        // plugin is not loaded yet), so nothing reads the environment concurrently.
        unsafe { std::env::set_var("TF_CPP_MIN_LOG_LEVEL", "2") };
    }
    let choice = PluginLocator::new().explicit(plugin).locate_cuda_compiler()?;
    let cuda = Plugin::load_for_compiling(&choice.path)
        .with_context(|| format!("loading the CUDA plugin {} ({})", choice.path.display(), choice.reason))?;
    let device = gpus.model.device_name();
    let description = GpuTargetConfig::find(&choice.path, device)?;
    let options = gpu_topology_options(&description, gpus.hosts, gpus.gpus_per_host);
    let topology = Topology::new(&cuda, &gpus.name, &options)
        .with_context(|| format!("the CUDA plugin's topology of {} x {} {device}", gpus.hosts, gpus.gpus_per_host))?;
    if topology.devices().len() != gpus.devices() || topology.devices().iter().any(|d| d.kind != device) {
        bail!(
            "the CUDA plugin's topology for {} has devices {:?}; {} x {} {device} expected",
            gpus.name,
            topology.devices().iter().map(|d| d.kind.as_str()).collect::<Vec<_>>(),
            gpus.hosts,
            gpus.gpus_per_host
        );
    }
    Ok((topology, choice.path))
}

/// The compiler's figures for one device, under its own names.
#[derive(Debug, Serialize)]
struct Compiled {
    argument_size_in_bytes: i64,
    output_size_in_bytes: i64,
    temp_size_in_bytes: i64,
    generated_code_size_in_bytes: i64,
    alias_size_in_bytes: i64,
    /// Arguments + outputs + temporaries + code − aliased outputs.
    total_bytes: i64,
    /// The compiler's flops per device (a loop's body counted once).
    flops: Option<f64>,
    /// The compiler's bytes accessed per device.
    bytes_accessed: Option<f64>,
}

/// The planner's estimate for the same terms, per device.
#[derive(Debug, Serialize)]
struct Planned {
    /// Weights (sharded), the token inputs and the dictionaries' tensors: the compiler's
    /// arguments.
    argument_bytes: u64,
    /// The hooks' outputs and the dictionaries' latents.
    output_bytes: u64,
    /// One block's working set and the FSDP gathers.
    temp_bytes: u64,
    /// Outputs written into their arguments' buffers (a decoding step's caches).
    alias_bytes: u64,
    total_bytes: u64,
}

/// The per-device terms a refusal weighs, as the compiler and the planner name them.
const TERMS: [&str; 4] = ["arguments (weights and inputs)", "outputs (the hooks)", "temporaries", "generated code"];

impl Compiled {
    fn terms(&self) -> [u64; 4] {
        [
            self.argument_size_in_bytes,
            self.output_size_in_bytes,
            self.temp_size_in_bytes,
            self.generated_code_size_in_bytes,
        ]
        .map(|b| b.max(0) as u64)
    }
}

impl Planned {
    /// The planner's terms for `plan` (which has a batch and a sequence).
    fn of(plan: &Plan) -> Planned {
        let activations = plan.memory.activations.unwrap_or_default();
        let dictionaries = plan.memory.dictionaries.unwrap_or_default();
        let next_token = plan.memory.next_token.unwrap_or_default();
        // A decoding step's caches are arguments and results alike, aliased; its logits a result.
        let decode = plan.memory.decode.unwrap_or_default();
        Planned {
            argument_bytes: plan.memory.weights.sharded_bytes
                + activations.input_bytes
                + dictionaries.tensor_bytes
                + decode.cache_bytes,
            output_bytes: activations.hook_bytes
                + dictionaries.output_bytes
                + next_token.output_bytes
                + decode.cache_bytes
                + decode.logits_bytes,
            alias_bytes: decode.cache_bytes,
            temp_bytes: activations.working_bytes
                + plan.memory.weights.fsdp_gather_bytes
                + dictionaries.working_bytes
                + next_token.working_bytes
                + decode.working_bytes,
            total_bytes: plan.memory.required_bytes,
        }
    }

    /// The planner counts no generated code.
    fn terms(&self) -> [u64; 4] {
        [self.argument_bytes, self.output_bytes, self.temp_bytes, 0]
    }
}

/// The target as the report names it: a TPU slice's or GPU nodes' own fields.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum TargetFields<'a> {
    Tpu(&'a TpuSlice),
    Gpu(&'a GpuTarget),
}

/// One block's attention on a GPU: the form the program chose for it, and whether the
/// compiled program kept its fused call.
#[derive(Debug, Serialize)]
struct BlockAttention {
    block: usize,
    /// `cudnn` (cuDNN's fused flash attention) or `xla` (XLA's ops: the scores materialized).
    form: &'static str,
    /// Why the block keeps XLA's form.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// The block's `__cudnn$fmhaSoftmax` calls in the compiled program.
    compiled_fused_calls: usize,
}

/// `siphon plan --target … --json`.
#[derive(Debug, Serialize)]
struct Report<'a> {
    target: TargetFields<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    libtpu: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cuda_plugin: Option<String>,
    hosts: usize,
    devices: usize,
    devices_per_host: usize,
    /// A device's memory.
    hbm_bytes: u64,
    /// What a job may use of it: a TPU chip's HBM, the CUDA plugin's allocator share of a GPU.
    usable_bytes: u64,
    mesh: String,
    mesh_flags: String,
    batch: usize,
    seq: usize,
    hooks: usize,
    compute_dtype: String,
    output_dtype: String,
    /// On GPUs: how the rows are padded (`right`, as `extract` packs them, or `left`).
    #[serde(skip_serializing_if = "Option::is_none")]
    padding: Option<&'static str>,
    /// `isolated` where the rows hold isolated documents (`--pack isolated`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pack: Option<&'static str>,
    /// On GPUs: each softmax attention block's form, as built and as compiled.
    #[serde(skip_serializing_if = "Option::is_none")]
    attention: Option<Vec<BlockAttention>>,
    /// How a mixture's experts are computed in this program.
    experts: Option<&'static str>,
    /// The grouped expert products: on GPUs the `siphon_grouped_matmul` calls in the compiled
    /// program, on a TPU the program's `chlo.ragged_dot`s (libtpu rewrites each into its own
    /// kernels).
    #[serde(skip_serializing_if = "Option::is_none")]
    grouped_calls: Option<usize>,
    /// Weights kept in their stored (quantized) form on the devices.
    stored_weights: usize,
    compile_seconds: f64,
    compiled: Compiled,
    planner: Planned,
    fits: bool,
    /// The compiler's flops over all devices per token of a step.
    flops_per_token: Option<f64>,
    /// The forward's analytic flops per token (`siphon_plan::forward_flops_per_token`).
    analytic_flops_per_token: f64,
    /// Whether the program has loops, whose bodies the compiler's cost analysis counts once.
    has_loops: bool,
    /// Tokens per second the compiler's flops and bytes allow at the chip's bf16 and HBM
    /// peaks: an estimate, not a measurement.
    roofline_tokens_per_second: Option<f64>,
    /// On GPUs (whose plugin counts no flops): tokens per second the analytic forward's flops
    /// allow at the GPUs' dense bf16 peak, memory traffic not counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    flops_bound_tokens_per_second: Option<f64>,
    plan: &'a Plan,
}

pub fn run(compile: Compile<'_>, plan: &Plan, json: bool) -> anyhow::Result<()> {
    let Compile { target, config, request, weights, plugin, right_padded, isolated, tpu_forms, dictionaries } = compile;
    let (Some(batch), Some(seq)) = (request.batch, request.seq) else {
        bail!("--target compiles the program for one step: give --batch and --seq")
    };
    let hooks = match (request.hooks.clone().filter(|h| !h.is_empty()), request.decode) {
        // A decoding step returns logits and caches, no hooks.
        (_, Some(_)) => Vec::new(),
        (Some(hooks), None) => hooks,
        (None, None) => siphon_plan::every_hidden_state(config),
    };
    let (topology, compiler) = match &target {
        Target::Tpu(slice) => open_topology(slice, plugin)?,
        Target::Gpu(gpus) => open_gpu_topology(gpus, plugin)?,
    };
    let engine = EngineOptions {
        compute_dtype: request.dtype,
        output_dtype: request.output_dtype,
        mesh: plan.mesh.clone(),
        plan: ShardingPlan::Explicit {
            params: plan.param_specs().iter().cloned().collect(),
            input: Some(plan.input_spec.clone()),
        },
        weights,
        right_padded,
        isolated,
        dictionaries,
        next_token: request.next_token,
        decode: request.decode,
        tpu_forms: (!tpu_forms).then_some(false),
        ..Default::default()
    };
    let aot = match siphon_engine::aot::compile(
        &topology,
        AotRequest { config, hooks: hooks.clone(), options: engine, stored: request.stored.clone(), batch, seq },
    ) {
        Ok(aot) => aot,
        // libtpu refuses a program larger than a chip itself, before any figure exists.
        Err(siphon_engine::EngineError::Runtime { source, .. })
            if source.pjrt_code() == Some(siphon_runtime::ErrorCode::ResourceExhausted) =>
        {
            let compiler = match source.as_ref() {
                siphon_runtime::Error::Pjrt { message, .. } => message.lines().next().unwrap_or_default().to_string(),
                other => other.to_string(),
            };
            let needs = match &target {
                Target::Tpu(_) => format!("libtpu's compiler ran out of a chip's memory ({compiler})"),
                Target::Gpu(_) => format!("the CUDA compiler ran out of a GPU's memory ({compiler})"),
            };
            bail!("{}", refusal(&target, plan, needs, Planned::of(plan).terms(), None));
        }
        Err(e) => return Err(e.into()),
    };
    let mut report =
        report(&target, config, plan, &aot, &hooks, batch, seq, right_padded, compiler.display().to_string())?;
    report.pack = isolated.then_some("isolated");
    if json {
        println!("{}", serde_json::to_string_pretty(&report).context("serializing the report")?);
    } else {
        print!("{}", text(&report));
    }
    if let Some(missing) = report.attention.iter().flatten().find(|b| b.form == "cudnn" && b.compiled_fused_calls != 1)
    {
        bail!(
            "block {}'s attention was built as cuDNN's fused call, but the compiled program holds {} of them: \
             the compiler rewrote it (report this with the command above)",
            missing.block,
            missing.compiled_fused_calls
        );
    }
    if !report.fits {
        let c = &report.compiled;
        let needs = format!(
            "the compiled program needs {} per device but {}",
            gib(c.total_bytes.max(0) as u64),
            memory_phrase(&target, report.hbm_bytes, report.usable_bytes)
        );
        // The planner's estimate scaled to this compile's total finds the mesh that fits.
        let scale = report.planner.total_bytes as f64 / c.total_bytes.max(1) as f64;
        let mut calibrated = request.clone();
        calibrated.device_memory_bytes = Some((report.usable_bytes as f64 * scale) as u64);
        calibrated.headroom = 0.0;
        let fitting = siphon_plan::plan(config, &target.planner_topology()?, &calibrated)?.suggestion;
        bail!("{}", refusal(&target, plan, needs, c.terms(), Some(fitting)));
    }
    Ok(())
}

/// A device's memory as a refusal states it.
fn memory_phrase(target: &Target, memory: u64, usable: u64) -> String {
    match target {
        Target::Tpu(_) => format!("a {} has {}", target.device_word(), gib(memory)),
        Target::Gpu(_) => format!(
            "one {} gives a job {} ({:.0}% of its {}, the CUDA plugin's allocator share)",
            target.device_word(),
            gib(usable),
            100.0 * siphon_plan::gpu::CUDA_ALLOCATOR_FRACTION,
            gib(memory)
        ),
    }
}

/// Each softmax attention block's form as built, and its fused calls in the compiled
/// program (`instructions`), found by the op name each call carries.
fn block_attention(forms: &[(usize, AttentionForm)], instructions: &[HloInstruction]) -> Vec<BlockAttention> {
    let fused: Vec<Option<usize>> = instructions
        .iter()
        .filter(|i| i.custom_call_target == siphon_models::cudnn::TARGET)
        .map(|i| siphon_models::cudnn::call_block(&i.op_name))
        .collect();
    forms
        .iter()
        .map(|(layer, form)| {
            let calls = fused.iter().filter(|block| **block == Some(*layer)).count();
            match form {
                AttentionForm::Cudnn => {
                    BlockAttention { block: *layer, form: "cudnn", reason: None, compiled_fused_calls: calls }
                }
                AttentionForm::Xla(why) => BlockAttention {
                    block: *layer,
                    form: "xla",
                    reason: Some(why.clone()),
                    compiled_fused_calls: calls,
                },
            }
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn report<'a>(
    target: &'a Target,
    config: &ModelConfig,
    plan: &'a Plan,
    aot: &AotProgram,
    hooks: &[siphon_models::HookPoint],
    batch: usize,
    seq: usize,
    right_padded: bool,
    compiler: String,
) -> anyhow::Result<Report<'a>> {
    // A decoding step (a cache of this many positions a slot) or the forward.
    let decode = plan.memory.decode.map(|d| siphon_models::DecodeStep { cache_len: d.cache_len, chunk: d.chunk });
    let m = aot.memory;
    let total =
        m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes + m.generated_code_size_in_bytes
            - m.alias_size_in_bytes;
    let planner = Planned::of(plan);
    let devices = target.devices();
    let tokens = (batch * seq) as f64;
    let (peak_flops, peak_bytes) = target.peaks();
    let roofline = match (aot.flops, aot.bytes_accessed) {
        (Some(flops), Some(bytes)) if flops > 0.0 || bytes > 0.0 => {
            let step = (flops / peak_flops).max(bytes / peak_bytes);
            Some(tokens / step)
        }
        _ => None,
    };
    let analytic = match decode {
        Some(step) => siphon_plan::decode_flops_per_token(config, step)?,
        None => siphon_plan::forward_flops_per_token(config, hooks, seq)?,
    };
    let text = &aot.program.text;
    let usable = target.usable_bytes();
    let (target_fields, devices_per_host, memory, gpu) = match target {
        Target::Tpu(slice) => (TargetFields::Tpu(slice), slice.chips_per_host(), slice.generation.hbm_bytes(), false),
        Target::Gpu(gpus) => (TargetFields::Gpu(gpus), gpus.gpus_per_host, gpus.model.memory_bytes(), true),
    };
    let grouped = aot.instructions.iter().filter(|i| i.custom_call_target == siphon_kernels::grouped::TARGET).count();
    let ragged = text.matches("\"chlo.ragged_dot\"(").count();
    let experts = config.moe.as_ref().map(|_| match (gpu, grouped > 0) {
        (false, _) if ragged > 0 => {
            "XLA's grouped products (chlo.ragged_dot: every routed row once, no loop; each device its columns of \
             every expert, as the weights are split by width)"
        }
        (false, _) => {
            "XLA's sorted dispatch in StableHLO (every choice, in rounds of whole experts; siphon's experts \
             kernel is the CPU's alone)"
        }
        (true, true) => {
            "siphon's grouped products on cuBLAS (siphon_grouped_matmul: each projection of every expert in one call)"
        }
        (true, false) => {
            "XLA's sorted dispatch in StableHLO (every choice, in rounds of whole experts: the experts are split \
             over the mesh)"
        }
    });
    Ok(Report {
        target: target_fields,
        libtpu: (!gpu).then(|| compiler.clone()),
        cuda_plugin: gpu.then_some(compiler),
        hosts: match target {
            Target::Tpu(slice) => slice.hosts(),
            Target::Gpu(gpus) => gpus.hosts,
        },
        devices,
        devices_per_host,
        hbm_bytes: memory,
        usable_bytes: usable,
        mesh: aot.mesh.to_string(),
        mesh_flags: plan.shape.flags(),
        batch,
        seq,
        hooks: hooks.len(),
        compute_dtype: plan.dtype.to_string(),
        output_dtype: plan.memory.host.map_or_else(|| plan.dtype.to_string(), |h| h.dtype.to_string()),
        padding: gpu.then_some(if right_padded { "right" } else { "left" }),
        pack: None,
        attention: gpu.then(|| block_attention(&aot.program.attention, &aot.instructions)),
        experts,
        grouped_calls: if gpu { Some(grouped) } else { Some(ragged).filter(|&n| n > 0) },
        stored_weights: aot.stored.len(),
        compile_seconds: aot.compile_seconds,
        compiled: Compiled {
            argument_size_in_bytes: m.argument_size_in_bytes,
            output_size_in_bytes: m.output_size_in_bytes,
            temp_size_in_bytes: m.temp_size_in_bytes,
            generated_code_size_in_bytes: m.generated_code_size_in_bytes,
            alias_size_in_bytes: m.alias_size_in_bytes,
            total_bytes: total,
            flops: aot.flops,
            bytes_accessed: aot.bytes_accessed,
        },
        planner,
        fits: total as u64 <= usable,
        flops_per_token: aot.flops.map(|f| f * devices as f64 / tokens),
        analytic_flops_per_token: analytic,
        has_loops: if gpu {
            aot.instructions.iter().any(|i| i.opcode == "while")
        } else {
            text.contains("stablehlo.while")
        },
        roofline_tokens_per_second: roofline,
        flops_bound_tokens_per_second: gpu.then(|| devices as f64 * peak_flops / analytic),
        plan,
    })
}

fn text(r: &Report<'_>) -> String {
    let bytes = |b: i64| gib(b.max(0) as u64);
    let c = &r.compiled;
    let p = &r.planner;
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    match r.target {
        TargetFields::Tpu(slice) => {
            line(format!(
                "target:      tpu:{}{}: libtpu topology {} ({}), {} hosts x {} chips, {} HBM a chip",
                slice.name,
                if slice.slices > 1 { format!(" x {} slices", slice.slices) } else { String::new() },
                slice.topology,
                slice.chip_config,
                r.hosts,
                r.devices_per_host,
                gib(r.hbm_bytes)
            ));
            line(format!("libtpu:      {}", r.libtpu.as_deref().unwrap_or_default()));
        }
        TargetFields::Gpu(gpus) => {
            line(format!(
                "target:      gpu:{}: {} hosts x {} {}, {} a GPU ({:.0}% for a job, the CUDA plugin's allocator share: {})",
                gpus.name,
                r.hosts,
                r.devices_per_host,
                gpus.model.device_name(),
                gib(r.hbm_bytes),
                100.0 * siphon_plan::gpu::CUDA_ALLOCATOR_FRACTION,
                gib(r.usable_bytes)
            ));
            line(format!(
                "cuda plugin: {} (described by the plugin itself; no GPU used)",
                r.cuda_plugin.as_deref().unwrap_or_default()
            ));
        }
    }
    line(format!("mesh:        {} ({})", r.mesh, r.mesh_flags));
    line(format!(
        "program:     batch {} x seq {}, {} hooks, {} compute, {} out, {}{} weights kept stored; compiled in {:.1} s",
        r.batch,
        r.seq,
        r.hooks,
        r.compute_dtype,
        r.output_dtype,
        r.padding.map_or_else(String::new, |p| format!("{p}-padded rows, "))
            + r.pack.map_or("", |_| "isolated documents, "),
        r.stored_weights,
        r.compile_seconds
    ));
    if let Some(blocks) = &r.attention {
        line(format!("attention:   {}", attention_line(blocks)));
    }
    if let Some(experts) = r.experts {
        let calls = r.grouped_calls.filter(|&n| n > 0).map_or_else(String::new, |n| format!("; {n} grouped products"));
        line(format!("experts:     {experts}{calls}"));
    }
    line("per device:  compiler     planner".to_string());
    line(format!(
        "  arguments  {:<12} {} (weights and token inputs)",
        bytes(c.argument_size_in_bytes),
        gib(p.argument_bytes)
    ));
    line(format!(
        "  outputs    {:<12} {} (the hooks, latents and outputs)",
        bytes(c.output_size_in_bytes),
        gib(p.output_bytes)
    ));
    line(format!("  temporary  {:<12} {} (working set, FSDP gathers)", bytes(c.temp_size_in_bytes), gib(p.temp_bytes)));
    line(format!("  code       {}", bytes(c.generated_code_size_in_bytes)));
    if c.alias_size_in_bytes > 0 || p.alias_bytes > 0 {
        line(format!("  aliased    -{:<11} -{}", bytes(c.alias_size_in_bytes), gib(p.alias_bytes)));
    }
    let of = match r.target {
        TargetFields::Tpu(_) => format!("a chip's {}", gib(r.hbm_bytes)),
        TargetFields::Gpu(_) => format!("a GPU's {} for a job", gib(r.usable_bytes)),
    };
    line(format!(
        "  total      {:<12} {} — {:.0}% of {of}{}",
        bytes(c.total_bytes),
        gib(p.total_bytes),
        100.0 * c.total_bytes as f64 / r.usable_bytes as f64,
        if r.fits { "" } else { ": DOES NOT FIT" }
    ));
    if let Some(per_token) = r.flops_per_token {
        line(format!(
            "flops:       {:.3e} a device a step ({:.3e} bytes accessed); {:.2} GFLOP a token over {} devices, analytic \
             forward {:.2} GFLOP (x{:.3}){}",
            c.flops.unwrap_or(0.0),
            c.bytes_accessed.unwrap_or(0.0),
            per_token / 1e9,
            r.devices,
            r.analytic_flops_per_token / 1e9,
            per_token / r.analytic_flops_per_token,
            if r.has_loops { "; the program's loops are counted once" } else { "" }
        ));
    }
    if let Some(tokens) = r.roofline_tokens_per_second {
        line(format!(
            "roofline:    at most {:.0} tokens/s for the slice at a chip's bf16 and HBM peaks (an estimate from the \
             compiler's counts, not a measurement)",
            tokens
        ));
    }
    if let Some(tokens) = r.flops_bound_tokens_per_second {
        line(format!(
            "flops:       analytic forward {:.2} GFLOP a token (the CUDA plugin counts none){}",
            r.analytic_flops_per_token / 1e9,
            if r.has_loops { "; the compiled program has loops" } else { "" }
        ));
        line(format!(
            "roofline:    at most {:.0} tokens/s over {} GPUs at their dense bf16 peak (the analytic flops alone, \
             memory traffic not counted: an estimate, not a measurement)",
            tokens, r.devices
        ));
    }
    out
}

/// The attention line of a GPU report: each form's blocks, and whether the compiled program
/// kept every cuDNN block's fused call.
fn attention_line(blocks: &[BlockAttention]) -> String {
    let forms: Vec<(usize, AttentionForm)> = blocks
        .iter()
        .map(|b| {
            let form = match &b.reason {
                None => AttentionForm::Cudnn,
                Some(why) => AttentionForm::Xla(why.clone()),
            };
            (b.block, form)
        })
        .collect();
    let summary = siphon_models::cudnn::summary(&forms);
    let fused: Vec<&BlockAttention> = blocks.iter().filter(|b| b.form == "cudnn").collect();
    if fused.is_empty() {
        return summary;
    }
    let kept = fused.iter().filter(|b| b.compiled_fused_calls == 1).count();
    if kept == fused.len() {
        format!("{summary} (compiled: each cuDNN block's {} call kept)", siphon_models::cudnn::TARGET)
    } else {
        format!("{summary} (compiled: only {kept} of {} cuDNN blocks kept their call)", fused.len())
    }
}

/// Why the program does not fit a device (`needs`), its largest of `terms` (in [`TERMS`]'
/// order), and a mesh that fits: `fitting` as the compile calibrated the planner, else the
/// planner's own suggestion.
fn refusal(
    target: &Target,
    plan: &Plan,
    needs: String,
    terms: [u64; 4],
    fitting: Option<Option<siphon_plan::Suggestion>>,
) -> String {
    let (largest, bytes) = TERMS.into_iter().zip(terms).max_by_key(|(_, b)| *b).unwrap_or((TERMS[0], 0));
    let (fitting, whose) = match fitting {
        Some(fitting) => (fitting, "the planner's estimate scaled to this compile"),
        None => (plan.suggestion.clone(), "the planner's estimate"),
    };
    let hint = match fitting {
        Some(s) => format!("; mesh {} should fit ({whose}): {}", s.mesh, s.flags),
        None if plan.fits() == Some(true) => format!(
            "; the planner's estimate ({} per device) fits where the compiler's does not: try a larger \
             weight-sharding group (--fsdp, --model-parallel), a smaller --batch or --seq, or fewer hooks",
            gib(plan.memory.required_bytes)
        ),
        None => match target {
            Target::Tpu(_) => {
                "; no mesh over this slice fits: use a larger slice, a smaller --batch or --seq, or fewer hooks".into()
            }
            Target::Gpu(_) => {
                "; no mesh over these GPUs fits: use more GPUs or nodes, a smaller --batch or --seq, or fewer hooks"
                    .into()
            }
        },
    };
    format!(
        "mesh {} does not fit {}: {needs}; its largest term is {largest} ({}){hint}",
        plan.mesh,
        target.name(),
        gib(bytes)
    )
}
