//! `siphon bench ...`: benchmarks that run on the real runtime.
//!
//! `siphon bench memory` is the seed scripts' memory experiment, measured through PJRT: one
//! f32 weight buffer of about `--target-bytes`, split by the planner's rule for a
//! `[hidden, in]` weight (`P(fsdp, model)`) versus replicated, with per-device bytes read
//! from PJRT (each buffer's on-device size; the compiled memory stats of a program that
//! consumes the sharded buffer and of one that all-gathers it) beside the planner's
//! prediction for the same spec.

use anyhow::Context;
use serde::Serialize;
use siphon_hlo::{Builder, TensorType};
use siphon_mesh::{Mesh, PartitionSpec};
use siphon_models::{ParamClass, ParamInfo};
use siphon_plan::{MeshKind, MeshShape, Topology};
use siphon_runtime::{
    Client, ClientOptions, CompileOptions, CompiledMemoryStats, HostArray, Plugin, PluginKind, PluginLocator,
};

use super::plan::MeshArgs;
use crate::args::limits;

#[derive(clap::Subcommand)]
pub enum Command {
    /// A weight buffer sharded on fsdp vs replicated: per-device bytes measured from PJRT
    /// beside the planner's prediction.
    Memory(MemoryArgs),
}

/// `siphon bench memory` flags.
#[derive(clap::Args, Debug)]
pub struct MemoryArgs {
    /// Approximate size of the weight buffer in bytes (rounded down to whole rows). Its
    /// copies must fit this host's memory (on the CPU plugin one per device).
    #[arg(long, default_value_t = 64 << 20, value_parser = limits::count_of::<u64>(1, limits::MAX_BYTES))]
    pub target_bytes: u64,
    /// Virtual devices of the CPU plugin (default 8 when no --plugin is given).
    #[arg(long, value_name = "N", value_parser = limits::count(1, limits::MAX_CPU_DEVICES))]
    pub cpu_devices: Option<usize>,
    /// PJRT plugin library (default: SIPHON_PJRT_PLUGIN, then siphon's cache; with --target,
    /// the libtpu to compile with).
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<std::path::PathBuf>,
    /// Compile the bench's two programs for a TPU slice (`tpu:v6e-16`) with libtpu on this
    /// machine instead of running them: the compiler's per-device argument and output bytes
    /// against the planner's (no buffers, no TPU).
    #[arg(long, value_name = "tpu:SLICE", conflicts_with = "cpu_devices")]
    pub target: Option<String>,
    /// Mesh flags; with none, every device is on fsdp (the seed's fsdp=N experiment). 1d puts
    /// every device on model; 2d/3d/auto put data across hosts and the rest on fsdp (3d: model
    /// takes what --model-parallel says).
    #[command(flatten)]
    pub mesh: MeshArgs,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Memory(args) => run_memory(args),
    }
}

/// Per-device sizes: the smallest and largest over devices.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Spread {
    /// Smallest over devices.
    pub min: u64,
    /// Largest over devices.
    pub max: u64,
}

impl Spread {
    fn of(sizes: impl IntoIterator<Item = u64>) -> Spread {
        let sizes: Vec<u64> = sizes.into_iter().collect();
        Spread { min: sizes.iter().copied().min().unwrap_or(0), max: sizes.iter().copied().max().unwrap_or(0) }
    }
}

/// XLA's compiled memory stats, per device.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ProgramBytes {
    /// Arguments.
    pub argument: i64,
    /// Outputs.
    pub output: i64,
    /// Temporaries.
    pub temp: i64,
    /// Peak, when the plugin reports it (0 on CPU).
    pub peak: i64,
}

impl From<CompiledMemoryStats> for ProgramBytes {
    fn from(s: CompiledMemoryStats) -> ProgramBytes {
        ProgramBytes {
            argument: s.argument_size_in_bytes,
            output: s.output_size_in_bytes,
            temp: s.temp_size_in_bytes,
            peak: s.peak_memory_in_bytes,
        }
    }
}

/// The bench's weight on its mesh and the planner's bytes for it (both forms of the bench).
#[derive(Debug, Serialize)]
pub struct BenchWeight {
    /// Devices used.
    pub devices: usize,
    /// Axis sizes.
    pub shape: MeshShape,
    /// The mesh as text.
    pub mesh: String,
    /// Weight shape `[rows, cols]`, f32.
    pub weight_shape: [usize; 2],
    /// Spec of the sharded weight.
    pub spec: String,
    /// Bytes of the whole weight.
    pub total_bytes: u64,
    /// Planner: per-device bytes sharded.
    pub predicted_sharded_bytes: u64,
    /// Planner: per-device bytes gathered (replicated).
    pub predicted_gathered_bytes: u64,
}

/// The bench's result.
#[derive(Debug, Serialize)]
pub struct MemoryBench {
    /// PJRT platform name.
    pub platform: String,
    /// The weight, its mesh and the planner's bytes.
    #[serde(flatten)]
    pub weight: BenchWeight,
    /// PJRT: on-device size of each device's shard after a sharded upload.
    pub sharded_on_device: Spread,
    /// PJRT: on-device size of each device's copy after a replicated upload.
    pub replicated_on_device: Spread,
    /// PJRT: on-device size of each device's output of the all-gather program.
    pub gathered_on_device: Spread,
    /// Compiled memory stats of `w + w` on the sharded weight.
    pub sharded_program: ProgramBytes,
    /// Compiled memory stats of the program that all-gathers the sharded weight.
    pub gather_program: ProgramBytes,
    /// Whether every measurement equals the prediction.
    pub matches: bool,
}

fn run_memory(args: MemoryArgs) -> anyhow::Result<()> {
    if let Some(target) = &args.target {
        let bench = compiled_memory_bench(&args, target)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&bench).context("serializing the result")?);
        } else {
            print_compiled(&bench);
        }
        anyhow::ensure!(bench.matches, "the compiler's per-device bytes differ from the planner's prediction");
        return Ok(());
    }
    let bench = memory_bench(&args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&bench).context("serializing the result")?);
    } else {
        print_memory(&bench);
    }
    if !bench.matches {
        anyhow::bail!("measured per-device bytes differ from the planner's prediction");
    }
    Ok(())
}

/// The bench's mesh shape (no model config here, so no head constraint).
fn bench_shape(mesh: &MeshArgs, topology: &Topology) -> anyhow::Result<MeshShape> {
    let n = topology.num_devices();
    let fixed = mesh.data.is_some() || mesh.fsdp.is_some() || mesh.model_parallel.is_some();
    let shape = if fixed {
        let model = mesh.model_parallel.unwrap_or(1);
        match (mesh.data, mesh.fsdp) {
            (Some(d), Some(f)) => MeshShape { data: d, fsdp: f, model },
            (Some(d), None) => MeshShape { data: d, fsdp: n / d.saturating_mul(model).max(1), model },
            (None, Some(f)) => MeshShape { data: n / f.saturating_mul(model).max(1), fsdp: f, model },
            (None, None) => MeshShape { data: 1, fsdp: n / model.max(1), model },
        }
    } else {
        match mesh.kind {
            MeshKind::OneD => MeshShape { data: 1, fsdp: 1, model: n },
            MeshKind::TwoD | MeshKind::ThreeD | MeshKind::Auto => {
                MeshShape { data: topology.hosts(), fsdp: topology.devices_per_host(), model: 1 }
            }
        }
    };
    anyhow::ensure!(
        shape.data >= 1 && shape.fsdp >= 1 && shape.model >= 1 && shape.num_devices() == n,
        "mesh data×fsdp×model = {shape} does not hold the {n} devices"
    );
    Ok(shape)
}

/// Runs the experiment (used by the CLI and its tests).
pub fn memory_bench(args: &MemoryArgs) -> anyhow::Result<MemoryBench> {
    let choice = PluginLocator::new().explicit(args.plugin.clone()).locate().context("finding a PJRT plugin")?;
    let plugin = Plugin::load(&choice.path).with_context(|| format!("loading {}", choice.path.display()))?;
    let mut options = ClientOptions::new();
    match (args.cpu_devices, &args.plugin) {
        (Some(n), _) => options = options.cpu_device_count(n),
        (None, None) => options = options.cpu_device_count(8),
        (None, Some(_)) => {}
    }
    let client = Client::new(&plugin, options).context("creating the PJRT client")?;
    let devices: Vec<siphon_plan::DeviceInfo> = client
        .devices()
        .into_iter()
        .filter(|d| d.addressable)
        .map(|d| siphon_plan::DeviceInfo { id: d.id, process_index: d.process_index })
        .collect();
    let topology = Topology::from_devices(&devices)?;
    let (weight, mesh, spec) = bench_weight(args, &topology, siphon_plan::DeviceLayout::Dense)?;
    check_host_memory(weight.total_bytes, weight.devices, PluginKind::of(&choice.path))?;
    let weight_shape = weight.weight_shape;
    let [rows, cols] = weight_shape;
    let values: Vec<f32> = (0..rows * cols).map(|i| (i % 251) as f32).collect();
    let host = HostArray::from_slice(&weight_shape, &values)?;
    drop(values);

    let sharded = client.upload_sharded(&host, &spec, &mesh).context("sharded upload")?;
    let sharded_on_device = Spread::of(sizes(sharded.buffers())?);

    let replicated_spec = PartitionSpec::replicated(2);
    let replicated = client.upload_sharded(&host, &replicated_spec, &mesh).context("replicated upload")?;
    let replicated_on_device = Spread::of(sizes(replicated.buffers())?);
    drop(replicated);
    drop(host);

    let (consume, gather) = bench_programs(weight_shape, &spec, &mesh)?;
    let options = CompileOptions::spmd(&mesh);
    let consume = client.compile(&consume, &options).context("compiling the sharded program")?;
    let gather = client.compile(&gather, &options).context("compiling the all-gather program")?;
    let sharded_program = ProgramBytes::from(consume.compiled_memory_stats()?);
    let gather_program = ProgramBytes::from(gather.compiled_memory_stats()?);
    let gathered = gather.execute_sharded(&mesh, &[&sharded], &[replicated_spec]).context("running the all-gather")?;
    let gathered_on_device = Spread::of(sizes(gathered[0].buffers())?);
    // The gather really gathered: every device holds the whole weight.
    let check = gathered[0].buffers()[gathered[0].buffers().len() - 1].to_host()?.to_vec::<f32>()?;
    anyhow::ensure!(
        check.len() == rows * cols && check.iter().enumerate().all(|(i, &v)| v == (i % 251) as f32),
        "the all-gathered weight on the last device differs from the uploaded one"
    );

    let (sharded_bytes, gathered_bytes) = (weight.predicted_sharded_bytes, weight.predicted_gathered_bytes);
    let matches = sharded_on_device.min == sharded_bytes
        && sharded_on_device.max == sharded_bytes
        && replicated_on_device.min == gathered_bytes
        && gathered_on_device.min == gathered_bytes
        && gathered_on_device.max == gathered_bytes
        && sharded_program.argument as u64 == sharded_bytes
        && gather_program.output as u64 == gathered_bytes;
    Ok(MemoryBench {
        platform: client.platform_name().to_string(),
        weight,
        sharded_on_device,
        replicated_on_device,
        gathered_on_device,
        sharded_program,
        gather_program,
        matches,
    })
}

/// Refuses, before any buffer is made, a weight of `total` bytes whose copies this host's
/// memory cannot hold: the values and their host array, and on the CPU plugin, whose devices
/// are this host's memory, a whole copy on each of the `devices` (replicated, then gathered).
fn check_host_memory(total: u64, devices: usize, kind: PluginKind) -> anyhow::Result<()> {
    let Some(available) = siphon_runtime::diagnose::available_memory() else { return Ok(()) };
    let copies = match kind {
        PluginKind::Cpu => devices as u64 + 2,
        _ => 2,
    };
    let need = total.saturating_mul(copies);
    if need > available {
        use siphon_plan::memory::gib;
        anyhow::bail!(
            "--target-bytes: the bench needs {} of this host's memory ({copies} copies of its {} weight) but the \
             machine reports {} available (MemAvailable, within the cgroup's limit): choose a smaller --target-bytes",
            gib(need),
            gib(total),
            gib(available)
        );
    }
    Ok(())
}

/// The bench's `[rows, 1024]` f32 weight of about `target_bytes` (whole rows over fsdp) on the
/// mesh `args` asks of `topology`, its spec (the planner's rule for a `[hidden, in]` weight,
/// rows over fsdp and columns over model), and the planner's bytes for it laid out by `layout`.
fn bench_weight(
    args: &MemoryArgs,
    topology: &Topology,
    layout: siphon_plan::DeviceLayout,
) -> anyhow::Result<(BenchWeight, Mesh, PartitionSpec)> {
    let shape = bench_shape(&args.mesh, topology)?;
    let mesh = shape.build(topology)?;
    let cols = 1024usize;
    anyhow::ensure!(
        cols.is_multiple_of(shape.model),
        "--model-parallel {} does not divide {cols} columns",
        shape.model
    );
    let row_bytes = (cols * 4) as u64;
    let rows = ((args.target_bytes / row_bytes) as usize / shape.fsdp * shape.fsdp).max(shape.fsdp);
    let param = ParamInfo::new("bench.weight", &[rows, cols], ParamClass::MlpDown, None);
    let spec = siphon_plan::param_spec(param.class, &param.shape, &mesh, Default::default()).spec;
    let predicted = siphon_plan::memory::weight_memory(
        std::slice::from_ref(&param),
        std::slice::from_ref(&spec),
        &mesh,
        siphon_plan::DType::F32,
        &Default::default(),
        layout,
    )?;
    let weight = BenchWeight {
        devices: topology.num_devices(),
        shape,
        mesh: mesh.to_string(),
        weight_shape: [rows, cols],
        spec: spec.to_string(),
        total_bytes: predicted.total_bytes,
        predicted_sharded_bytes: predicted.sharded_bytes,
        predicted_gathered_bytes: predicted.gathered_bytes,
    };
    Ok((weight, mesh, spec))
}

/// The bench's programs: `w + w` on the sharded weight, and the weight all-gathered.
fn bench_programs(weight_shape: [usize; 2], spec: &PartitionSpec, mesh: &Mesh) -> anyhow::Result<(String, String)> {
    let ty = TensorType::new(siphon_hlo::DType::F32, &weight_shape);
    let consume = {
        let mut b = Builder::with_mesh("bench_sharded", mesh.clone());
        let w = b.arg(ty.clone(), Some(spec.clone()))?;
        let y = b.add(w, w)?;
        b.finish_sharded(&[(y, Some(spec.clone()))])?
    };
    let gather = {
        let mut b = Builder::with_mesh("bench_gather", mesh.clone());
        let w = b.arg(ty.clone(), Some(spec.clone()))?;
        b.finish_sharded(&[(w, Some(PartitionSpec::replicated(2)))])?
    };
    Ok((consume, gather))
}

/// `siphon bench memory --target`: the bench's programs compiled for a TPU slice.
#[derive(Debug, Serialize)]
pub struct CompiledMemoryBench {
    /// The slice, e.g. `v6e-16`, and libtpu's topology.
    pub target: String,
    /// The weight, its mesh and the planner's bytes as the TPU lays them out.
    #[serde(flatten)]
    pub weight: BenchWeight,
    /// Compiled memory stats of `w + w` on the sharded weight.
    pub sharded_program: ProgramBytes,
    /// Compiled memory stats of the program that all-gathers the sharded weight.
    pub gather_program: ProgramBytes,
    /// Whether the compiler's argument and output bytes equal the planner's.
    pub matches: bool,
}

/// Compiles the bench's programs for `target` with libtpu (no TPU touched).
pub fn compiled_memory_bench(args: &MemoryArgs, target: &str) -> anyhow::Result<CompiledMemoryBench> {
    let slice = crate::cmd::plan::target::slice(target, 1)?;
    let (weight, mesh, spec) = bench_weight(args, &slice.planner_topology()?, siphon_plan::DeviceLayout::TpuTiled)?;
    let (consume, gather) = bench_programs(weight.weight_shape, &spec, &mesh)?;
    let (libtpu, _) = crate::cmd::plan::target::open_topology(&slice, args.plugin.as_deref())?;
    let ids: Vec<usize> = libtpu.devices_by_host().iter().map(|d| d.id).collect();
    let options = CompileOptions::spmd(&mesh.renumbered(&ids)?);
    let compile = |text: &str, what: &str| -> anyhow::Result<ProgramBytes> {
        let program = libtpu.compile(text, &options).with_context(|| format!("compiling the {what} program"))?;
        Ok(ProgramBytes::from(program.memory_stats()?))
    };
    let sharded_program = compile(&consume, "sharded")?;
    let gather_program = compile(&gather, "all-gather")?;
    Ok(CompiledMemoryBench {
        target: format!("{} ({})", slice.name, slice.topology),
        matches: sharded_program.argument as u64 == weight.predicted_sharded_bytes
            && gather_program.output as u64 == weight.predicted_gathered_bytes,
        weight,
        sharded_program,
        gather_program,
    })
}

fn print_compiled(b: &CompiledMemoryBench) {
    let w = &b.weight;
    let gib = |x: i64| siphon_plan::memory::gib(x.max(0) as u64);
    println!("target     {} · {} devices · mesh {} (data×fsdp×model = {})", b.target, w.devices, w.mesh, w.shape);
    println!("weight     f32 {:?} = {} · sharded as {}", w.weight_shape, gib(w.total_bytes as i64), w.spec);
    println!("{:<34} {:>14} {:>14}", "per device", "compiler", "planner");
    let row = |what: &str, compiler: i64, planner: u64| {
        println!("{what:<34} {:>14} {:>14}", gib(compiler), gib(planner as i64));
    };
    row("sharded (program argument)", b.sharded_program.argument, w.predicted_sharded_bytes);
    row("all-gathered (program output)", b.gather_program.output, w.predicted_gathered_bytes);
    println!("all-gather program temp {}", gib(b.gather_program.temp));
    println!("matches    {}", if b.matches { "yes" } else { "no" });
}

fn sizes(buffers: &[siphon_runtime::Buffer]) -> anyhow::Result<Vec<u64>> {
    buffers.iter().map(|b| Ok(b.on_device_size_in_bytes()? as u64)).collect()
}

fn print_memory(b: &MemoryBench) {
    let w = &b.weight;
    let mib = |x: u64| format!("{:.2} MiB", x as f64 / (1u64 << 20) as f64);
    let spread = |s: Spread| if s.min == s.max { mib(s.max) } else { format!("{} – {}", mib(s.min), mib(s.max)) };
    println!("platform   {} · {} devices · mesh {} (data×fsdp×model = {})", b.platform, w.devices, w.mesh, w.shape);
    println!("weight     f32 {:?} = {} · sharded as {}", w.weight_shape, mib(w.total_bytes), w.spec);
    println!("{:<34} {:>14} {:>14}", "per device", "measured", "planner");
    println!(
        "{:<34} {:>14} {:>14}",
        "sharded (buffer on device)",
        spread(b.sharded_on_device),
        mib(w.predicted_sharded_bytes)
    );
    println!(
        "{:<34} {:>14} {:>14}",
        "sharded (program argument)",
        mib(b.sharded_program.argument as u64),
        mib(w.predicted_sharded_bytes)
    );
    println!(
        "{:<34} {:>14} {:>14}",
        "replicated (buffer on device)",
        spread(b.replicated_on_device),
        mib(w.predicted_gathered_bytes)
    );
    println!(
        "{:<34} {:>14} {:>14}",
        "all-gathered (buffer on device)",
        spread(b.gathered_on_device),
        mib(w.predicted_gathered_bytes)
    );
    println!(
        "{:<34} {:>14} {:>14}",
        "all-gathered (program output)",
        mib(b.gather_program.output as u64),
        mib(w.predicted_gathered_bytes)
    );
    println!(
        "all-gather program temp {} · peak {}",
        mib(b.gather_program.temp as u64),
        mib(b.gather_program.peak as u64)
    );
    println!("matches    {}", if b.matches { "yes" } else { "no" });
}
