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
use siphon_mesh::PartitionSpec;
use siphon_models::{ParamClass, ParamInfo};
use siphon_plan::{MeshKind, MeshShape, Topology};
use siphon_runtime::{Client, ClientOptions, CompileOptions, CompiledMemoryStats, HostArray, Plugin, PluginLocator};

use super::plan::MeshArgs;

#[derive(clap::Subcommand)]
pub enum Command {
    /// A weight buffer sharded on fsdp vs replicated: per-device bytes measured from PJRT
    /// beside the planner's prediction.
    Memory(MemoryArgs),
}

/// `siphon bench memory` flags.
#[derive(clap::Args, Debug)]
pub struct MemoryArgs {
    /// Approximate size of the weight buffer in bytes (rounded down to whole rows).
    #[arg(long, default_value_t = 64 << 20)]
    pub target_bytes: u64,
    /// Virtual devices of the CPU plugin (default 8 when no --plugin is given).
    #[arg(long, value_name = "N")]
    pub cpu_devices: Option<usize>,
    /// PJRT plugin library (default: SIPHON_PJRT_PLUGIN, then siphon's cache).
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<std::path::PathBuf>,
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

/// The bench's result.
#[derive(Debug, Serialize)]
pub struct MemoryBench {
    /// PJRT platform name.
    pub platform: String,
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
    let shape = bench_shape(&args.mesh, &topology)?;
    let mesh = shape.build(&topology)?;

    // A [hidden, in] weight: rows over fsdp, columns over model (the planner's rule).
    let cols = 1024usize;
    anyhow::ensure!(
        cols.is_multiple_of(shape.model),
        "--model-parallel {} does not divide {cols} columns",
        shape.model
    );
    let row_bytes = (cols * 4) as u64;
    let rows = ((args.target_bytes / row_bytes) as usize / shape.fsdp * shape.fsdp).max(shape.fsdp);
    let weight_shape = [rows, cols];
    let param = ParamInfo::new("bench.weight", &weight_shape, ParamClass::MlpDown, None);
    let spec = siphon_plan::param_spec(param.class, &param.shape, &mesh).spec;
    let predicted = siphon_plan::memory::weight_memory(
        std::slice::from_ref(&param),
        std::slice::from_ref(&spec),
        &mesh,
        siphon_plan::DType::F32,
        &Default::default(),
        siphon_plan::DeviceLayout::Dense,
    )?;
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
        b.finish_sharded(&[(w, Some(replicated_spec.clone()))])?
    };
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

    let total = predicted.total_bytes;
    let matches = sharded_on_device.min == predicted.sharded_bytes
        && sharded_on_device.max == predicted.sharded_bytes
        && replicated_on_device.min == predicted.gathered_bytes
        && gathered_on_device.min == predicted.gathered_bytes
        && gathered_on_device.max == predicted.gathered_bytes
        && sharded_program.argument as u64 == predicted.sharded_bytes
        && gather_program.output as u64 == predicted.gathered_bytes;
    Ok(MemoryBench {
        platform: client.platform_name().to_string(),
        devices: topology.num_devices(),
        shape,
        mesh: mesh.to_string(),
        weight_shape,
        spec: spec.to_string(),
        total_bytes: total,
        predicted_sharded_bytes: predicted.sharded_bytes,
        predicted_gathered_bytes: predicted.gathered_bytes,
        sharded_on_device,
        replicated_on_device,
        gathered_on_device,
        sharded_program,
        gather_program,
        matches,
    })
}

fn sizes(buffers: &[siphon_runtime::Buffer]) -> anyhow::Result<Vec<u64>> {
    buffers.iter().map(|b| Ok(b.on_device_size_in_bytes()? as u64)).collect()
}

fn print_memory(b: &MemoryBench) {
    let mib = |x: u64| format!("{:.2} MiB", x as f64 / (1u64 << 20) as f64);
    let spread = |s: Spread| if s.min == s.max { mib(s.max) } else { format!("{} – {}", mib(s.min), mib(s.max)) };
    println!("platform   {} · {} devices · mesh {} (data×fsdp×model = {})", b.platform, b.devices, b.mesh, b.shape);
    println!("weight     f32 {:?} = {} · sharded as {}", b.weight_shape, mib(b.total_bytes), b.spec);
    println!("{:<34} {:>14} {:>14}", "per device", "measured", "planner");
    println!(
        "{:<34} {:>14} {:>14}",
        "sharded (buffer on device)",
        spread(b.sharded_on_device),
        mib(b.predicted_sharded_bytes)
    );
    println!(
        "{:<34} {:>14} {:>14}",
        "sharded (program argument)",
        mib(b.sharded_program.argument as u64),
        mib(b.predicted_sharded_bytes)
    );
    println!(
        "{:<34} {:>14} {:>14}",
        "replicated (buffer on device)",
        spread(b.replicated_on_device),
        mib(b.predicted_gathered_bytes)
    );
    println!(
        "{:<34} {:>14} {:>14}",
        "all-gathered (buffer on device)",
        spread(b.gathered_on_device),
        mib(b.predicted_gathered_bytes)
    );
    println!(
        "{:<34} {:>14} {:>14}",
        "all-gathered (program output)",
        mib(b.gather_program.output as u64),
        mib(b.predicted_gathered_bytes)
    );
    println!(
        "all-gather program temp {} · peak {}",
        mib(b.gather_program.temp as u64),
        mib(b.gather_program.peak as u64)
    );
    println!("matches    {}", if b.matches { "yes" } else { "no" });
}
