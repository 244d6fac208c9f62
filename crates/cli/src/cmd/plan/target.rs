//! `siphon plan --target tpu:SLICE`: the program `siphon extract` would run on a TPU slice,
//! compiled for it by libtpu on this machine (no TPU needed), and the compiler's figures per
//! device beside the planner's.
//!
//! The slice gives hosts × chips and each chip's HBM (`siphon_plan::TpuSlice`); the planner
//! chooses the mesh as for any run; `siphon_engine::aot` builds the engine's own program for
//! that mesh (hooks, dtypes, shardings, stored weight forms) and libtpu compiles it for the
//! slice's topology. A program whose per-device total exceeds a chip's HBM is refused, naming
//! its largest term and the mesh that would fit.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Serialize;
use siphon_engine::aot::{AotProgram, AotRequest};
use siphon_engine::{EngineOptions, ShardingPlan, WeightForm};
use siphon_models::ModelConfig;
use siphon_plan::memory::gib;
use siphon_plan::{Plan, PlanRequest, TpuSlice};
use siphon_runtime::{Plugin, PluginLocator, Topology, tpu_topology_options};

/// What to compile, and for which slice.
pub struct Compile<'a> {
    pub slice: TpuSlice,
    pub config: &'a ModelConfig,
    pub request: PlanRequest,
    pub weights: WeightForm,
    /// `--plugin`: the libtpu to compile with.
    pub plugin: Option<&'a Path>,
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
    // compiling for a slice, which touches no TPU.
    for (name, value) in
        [("TPU_SKIP_MDS_QUERY", "1"), ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"), ("TF_CPP_MIN_LOG_LEVEL", "2")]
    {
        if std::env::var_os(name).is_none() {
            // SAFETY: called before this process starts any thread (the planner is pure and
            // the plugin is not loaded yet), so nothing reads the environment concurrently.
            unsafe { std::env::set_var(name, value) };
        }
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
        Planned {
            argument_bytes: plan.memory.weights.sharded_bytes + activations.input_bytes + dictionaries.tensor_bytes,
            output_bytes: activations.hook_bytes + dictionaries.output_bytes,
            temp_bytes: activations.working_bytes + plan.memory.weights.fsdp_gather_bytes + dictionaries.working_bytes,
            total_bytes: plan.memory.required_bytes,
        }
    }

    /// The planner counts no generated code.
    fn terms(&self) -> [u64; 4] {
        [self.argument_bytes, self.output_bytes, self.temp_bytes, 0]
    }
}

/// `siphon plan --target … --json`.
#[derive(Debug, Serialize)]
struct Report<'a> {
    target: &'a TpuSlice,
    libtpu: String,
    hosts: usize,
    devices: usize,
    devices_per_host: usize,
    hbm_bytes: u64,
    mesh: String,
    mesh_flags: String,
    batch: usize,
    seq: usize,
    hooks: usize,
    compute_dtype: String,
    output_dtype: String,
    /// How a mixture's experts are computed in this program.
    experts: Option<&'static str>,
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
    plan: &'a Plan,
}

pub fn run(compile: Compile<'_>, plan: &Plan, json: bool) -> anyhow::Result<()> {
    let Compile { slice, config, request, weights, plugin, dictionaries } = compile;
    let (Some(batch), Some(seq)) = (request.batch, request.seq) else {
        bail!("--target compiles the program for one step: give --batch and --seq")
    };
    let hooks = match request.hooks.clone().filter(|h| !h.is_empty()) {
        Some(hooks) => hooks,
        None => siphon_plan::every_hidden_state(config),
    };
    let (topology, libtpu) = open_topology(&slice, plugin)?;
    let engine = EngineOptions {
        compute_dtype: request.dtype,
        output_dtype: request.output_dtype,
        mesh: plan.mesh.clone(),
        plan: ShardingPlan::Explicit {
            params: plan.param_specs().iter().cloned().collect(),
            input: Some(plan.input_spec.clone()),
        },
        weights,
        dictionaries,
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
            let needs = format!("libtpu's compiler ran out of a chip's memory ({compiler})");
            bail!("{}", refusal(&slice, plan, needs, Planned::of(plan).terms(), None));
        }
        Err(e) => return Err(e.into()),
    };
    let report = report(&slice, config, plan, &aot, &hooks, batch, seq, libtpu.display().to_string())?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report).context("serializing the report")?);
    } else {
        print!("{}", text(&report));
    }
    if !report.fits {
        let c = &report.compiled;
        let needs = format!(
            "the compiled program needs {} per device but a {} chip has {}",
            gib(c.total_bytes.max(0) as u64),
            slice.topology.split(':').next().unwrap_or_default(),
            gib(report.hbm_bytes)
        );
        // The planner's estimate scaled to this compile's total finds the mesh that fits.
        let scale = report.planner.total_bytes as f64 / c.total_bytes.max(1) as f64;
        let mut calibrated = request.clone();
        calibrated.device_memory_bytes = Some((report.hbm_bytes as f64 * scale) as u64);
        calibrated.headroom = 0.0;
        let fitting = siphon_plan::plan(config, &slice.planner_topology()?, &calibrated)?.suggestion;
        bail!("{}", refusal(&slice, plan, needs, c.terms(), Some(fitting)));
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn report<'a>(
    slice: &'a TpuSlice,
    config: &ModelConfig,
    plan: &'a Plan,
    aot: &AotProgram,
    hooks: &[siphon_models::HookPoint],
    batch: usize,
    seq: usize,
    libtpu: String,
) -> anyhow::Result<Report<'a>> {
    let m = aot.memory;
    let total =
        m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes + m.generated_code_size_in_bytes
            - m.alias_size_in_bytes;
    let planner = Planned::of(plan);
    let devices = slice.devices();
    let tokens = (batch * seq) as f64;
    let generation = slice.generation;
    let roofline = match (aot.flops, aot.bytes_accessed) {
        (Some(flops), Some(bytes)) if flops > 0.0 || bytes > 0.0 => {
            let step = (flops / generation.peak_bf16_flops()).max(bytes / generation.hbm_bytes_per_second());
            Some(tokens / step)
        }
        _ => None,
    };
    let text = &aot.program.text;
    Ok(Report {
        target: slice,
        libtpu,
        hosts: slice.hosts(),
        devices,
        devices_per_host: slice.chips_per_host(),
        hbm_bytes: generation.hbm_bytes(),
        mesh: aot.mesh.to_string(),
        mesh_flags: plan.shape.flags(),
        batch,
        seq,
        hooks: hooks.len(),
        compute_dtype: plan.dtype.to_string(),
        output_dtype: plan.memory.host.map_or_else(|| plan.dtype.to_string(), |h| h.dtype.to_string()),
        experts: config.moe.as_ref().map(|_| {
            "XLA's sorted dispatch in StableHLO (every choice, in rounds of whole experts; siphon's experts \
             kernel is the CPU's alone)"
        }),
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
        fits: total as u64 <= generation.hbm_bytes(),
        flops_per_token: aot.flops.map(|f| f * devices as f64 / tokens),
        analytic_flops_per_token: siphon_plan::forward_flops_per_token(config, hooks, seq)?,
        has_loops: text.contains("stablehlo.while"),
        roofline_tokens_per_second: roofline,
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
    line(format!(
        "target:      tpu:{}{}: libtpu topology {} ({}), {} hosts x {} chips, {} HBM a chip",
        r.target.name,
        if r.target.slices > 1 { format!(" x {} slices", r.target.slices) } else { String::new() },
        r.target.topology,
        r.target.chip_config,
        r.hosts,
        r.devices_per_host,
        gib(r.hbm_bytes)
    ));
    line(format!("libtpu:      {}", r.libtpu));
    line(format!("mesh:        {} ({})", r.mesh, r.mesh_flags));
    line(format!(
        "program:     batch {} x seq {}, {} hooks, {} compute, {} out, {} weights kept stored; compiled in {:.1} s",
        r.batch, r.seq, r.hooks, r.compute_dtype, r.output_dtype, r.stored_weights, r.compile_seconds
    ));
    if let Some(experts) = r.experts {
        line(format!("experts:     {experts}"));
    }
    line("per device:  compiler     planner".to_string());
    line(format!(
        "  arguments  {:<12} {} (weights and token inputs)",
        bytes(c.argument_size_in_bytes),
        gib(p.argument_bytes)
    ));
    line(format!("  outputs    {:<12} {} (the hooks)", bytes(c.output_size_in_bytes), gib(p.output_bytes)));
    line(format!("  temporary  {:<12} {} (working set, FSDP gathers)", bytes(c.temp_size_in_bytes), gib(p.temp_bytes)));
    line(format!("  code       {}", bytes(c.generated_code_size_in_bytes)));
    if c.alias_size_in_bytes > 0 {
        line(format!("  aliased    -{}", bytes(c.alias_size_in_bytes)));
    }
    line(format!(
        "  total      {:<12} {} — {:.0}% of a chip's {}{}",
        bytes(c.total_bytes),
        gib(p.total_bytes),
        100.0 * c.total_bytes as f64 / r.hbm_bytes as f64,
        gib(r.hbm_bytes),
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
    out
}

/// Why the program does not fit a chip (`needs`), its largest of `terms` (in [`TERMS`]' order),
/// and a mesh that fits:
/// `fitting` as the compile calibrated the planner, else the planner's own suggestion.
fn refusal(
    slice: &TpuSlice,
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
        None => {
            "; no mesh over this slice fits: use a larger slice, a smaller --batch or --seq, or fewer hooks".to_string()
        }
    };
    format!(
        "mesh {} does not fit {}: {needs}; its largest term is {largest} ({}){hint}",
        plan.mesh,
        slice.name,
        gib(bytes)
    )
}
