//! Compiling the engine's program for devices this process does not hold: a TPU slice that
//! libtpu describes, or GPUs the CUDA plugin describes from a target description, on a
//! CPU-only machine ([`siphon_runtime::Topology`]), with no weights and no client.
//!
//! The program is the one [`crate::Engine`] would compile on those devices: the same
//! [`ForwardSpec`](siphon_models::ForwardSpec) (hooks, dtypes, shardings, stored weight forms, the weights its graph
//! reads), built by the same code, on the mesh's devices taken host by host from the
//! topology — so the compiler's per-device memory and cost are those of the run. Programs for
//! a TPU never call siphon's kernels: a mixture's experts take XLA's sorted dispatch in
//! StableHLO, exact as on the CPU. Programs for CUDA take what a CUDA client takes: cuDNN's
//! fused attention over right-padded rows (`EngineOptions::right_padded`) and siphon's grouped
//! expert products, whose handlers are registered for the compile; cuDNN builds and checks
//! each attention's graph for the target ([`CUDNN_DEVICELESS`]), and the compiled program's
//! instructions come back ([`AotProgram::instructions`]) to say which calls it kept.

use std::collections::HashMap;
use std::time::Instant;

use siphon_mesh::Mesh;
use siphon_models::{ForwardProgram, HookPoint, ModelConfig, StoredForm};
use siphon_runtime::{CompileOptions, CompiledMemoryStats, HloInstruction, Topology, XlaOption};

use crate::engine::{ProgramSpec, build, stored_on};
use crate::error::{EngineError, rt};
use crate::options::{EngineOptions, check};

/// What to compile: the engine's options with the mesh numbered as the planner numbers
/// devices (`0..n`, hosts major), the weights a checkpoint stores quantized (kept so where
/// `options.weights` is stored and the split keeps their blocks whole), and the batch shape.
#[derive(Debug, Clone)]
pub struct AotRequest<'a> {
    /// The model.
    pub config: &'a ModelConfig,
    /// The hooks the program returns.
    pub hooks: Vec<HookPoint>,
    /// Dtypes, mesh (planner's numbering) and sharding, as `siphon extract` sets them.
    pub options: EngineOptions,
    /// The stored forms a checkpoint of this model has, by weight name.
    pub stored: HashMap<String, StoredForm>,
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
}

/// A program compiled for a topology, with the compiler's figures for one device.
#[derive(Debug)]
pub struct AotProgram {
    /// The program as built (text, weights, shardings).
    pub program: ForwardProgram,
    /// The mesh on the topology's device ids.
    pub mesh: Mesh,
    /// The weights kept in their stored form on the devices.
    pub stored: HashMap<String, StoredForm>,
    /// The compiler's memory figures per device.
    pub memory: CompiledMemoryStats,
    /// The compiler's flops per device (`flops` of its cost analysis), if it gives them.
    pub flops: Option<f64>,
    /// The compiler's bytes accessed per device, if it gives them.
    pub bytes_accessed: Option<f64>,
    /// Seconds the compiler took.
    pub compile_seconds: f64,
    /// For a CUDA topology, the compiled program's instructions (which library and custom
    /// calls it kept, under which op names); empty elsewhere.
    pub instructions: Vec<HloInstruction>,
}

/// The XLA option that makes a compile without a GPU ask cuDNN to build and check each fused
/// attention's graph for the target (`xla_gpu_cudnn_deviceless_compilation_mode`: by default
/// such a compile keeps the call unchecked, and an executable without its graph).
pub const CUDNN_DEVICELESS: (&str, &str) =
    ("xla_gpu_cudnn_deviceless_compilation_mode", "CUDNN_DEVICELESS_COMPILATION_AUTO");

/// Builds the engine's program for `request` and compiles it for `topology`: the planner's
/// device `i` is the topology's `i`-th device host by host
/// ([`Topology::devices_by_host`]).
pub fn compile(topology: &Topology, request: AotRequest<'_>) -> Result<AotProgram, EngineError> {
    check(&request.hooks, &request.options)?;
    let ids: Vec<usize> = topology.devices_by_host().iter().map(|d| d.id).collect();
    let planned = &request.options.mesh;
    let mesh = planned.renumbered(&ids).map_err(|source| EngineError::Mesh {
        context: format!("the mesh {planned} on topology {}", topology.name()),
        source,
    })?;
    let mut options = request.options.clone();
    options.mesh = mesh.clone();
    let cuda = topology.platform_name().eq_ignore_ascii_case("cuda");
    let cuda_kernels = cuda && topology.cuda_kernels();
    let (param_specs, input_spec) = options.plan.specs(request.config, &mesh);
    let mut stored = HashMap::new();
    let spec = |stored: &HashMap<String, StoredForm>, batch, seq, params: &[_]| {
        ProgramSpec {
            hooks: &request.hooks,
            options: &options,
            param_specs: &param_specs,
            input_spec: &input_spec,
            stored,
            cpu_kernels: false,
            cuda_kernels,
            platform: topology.platform_name().to_ascii_lowercase(),
        }
        .forward(batch, seq, params)
    };
    // As `Engine::new`: a small build finds the weights the graph reads and which stored
    // forms the mesh keeps whole; the program for the batch shape then reads exactly those.
    let probe_batch = input_spec.as_ref().map_or(1, |s| s.ways(0, &mesh)).max(1);
    let mut probe = build(request.config, &spec(&stored, probe_batch, 1, &[]))?;
    if options.weights == crate::WeightForm::Stored {
        for (param, param_spec) in probe.params.iter().zip(&probe.param_specs) {
            if let Some(&form) = request.stored.get(&param.name)
                && stored_on(form, param, param_spec, &mesh)
            {
                stored.insert(param.name.clone(), form);
            }
        }
        probe = build(request.config, &spec(&stored, probe_batch, 1, &[]))?;
    }
    let program = build(request.config, &spec(&stored, request.batch, request.seq, &probe.params))?;
    let mut compile_options = if mesh.num_devices() > 1 {
        CompileOptions::spmd(&mesh)
    } else {
        CompileOptions::single_device(Some(mesh.device_ids()[0]))
    };
    if cuda {
        let (name, value) = CUDNN_DEVICELESS;
        compile_options.xla_options.push((name.into(), XlaOption::Str(value.into())));
    }
    let start = Instant::now();
    let context = || format!("compiling the forward for {}", topology.name());
    let compiled = rt(context, topology.compile(&program.text, &compile_options))?;
    let compile_seconds = start.elapsed().as_secs_f64();
    let memory = rt(context, compiled.memory_stats())?;
    let flops = rt(context, compiled.cost("flops"))?;
    let bytes_accessed = rt(context, compiled.cost("bytes accessed"))?;
    let instructions = if cuda { rt(context, compiled.optimized_instructions())? } else { Vec::new() };
    Ok(AotProgram { program, mesh, stored, memory, flops, bytes_accessed, compile_seconds, instructions })
}
