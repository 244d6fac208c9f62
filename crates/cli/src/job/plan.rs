//! Phase 2's device side: the model checked and planned before anything expensive
//! ([`Plan`]: the mesh, the memory each device needs, the hooks and dictionaries read), and the
//! model's tokenizer. [`super::compute`] puts the planned model on the mesh.
//!
//! The mesh lies within this host (hosts data-parallel), or spans every host when its
//! weight-sharding group (`--fsdp` × `--model-parallel`) is larger than a host ([`Span`]):
//! one global device assignment that every process compiles, each process holding only its
//! partitions ([`siphon_mesh::HostView`]). `--simulate-hosts N` runs such a job's per-process
//! paths for N hosts side by side in one process on the CPU plugin's devices.

use std::sync::Arc;

use anyhow::{Context, bail};
use siphon_models::{DictionaryHook, HookKind, HookPoint, LoadedModel, ModelConfig, NextToken, Steering};
use siphon_plan::{PlanRequest, Topology};
use siphon_runtime::PluginKind;

use super::RunSpec;
use super::fits;

/// Where the job's mesh lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// This host's devices; hosts are data-parallel.
    Host,
    /// One mesh over `hosts` hosts' devices, `per_host` each (known before the plugin starts
    /// on the CPU and CUDA plugins; libtpu reports it).
    Hosts {
        /// Hosts the mesh spans.
        hosts: usize,
        /// Devices per host.
        per_host: Option<usize>,
        /// The hosts are stood in for by this one process (`--simulate-hosts`).
        simulated: bool,
    },
}

/// What the job attaches to the model's forward beside its hooks: the dictionaries (their
/// latents; spliced in where they have a decoder) and the steering vectors.
pub struct Attached {
    pub dictionaries: Vec<DictionaryHook>,
    pub steering: Vec<Steering>,
}

/// What was checked before the coordinator and the plugin: hooks, weights and mesh.
pub struct Plan {
    pub hooks: Vec<HookPoint>,
    pub dictionaries: Vec<DictionaryHook>,
    /// The model's next-token outputs each step computes.
    pub next_token: Option<NextToken>,
    /// The steering vectors each step adds.
    pub steering: Vec<Steering>,
    request: PlanRequest,
    pub span: Span,
}

impl Plan {
    /// Checks hooks against the model, every needed weight's presence and shape, and plans the
    /// mesh for the devices this host is expected to have (the CPU plugin's virtual devices,
    /// the GPUs CUDA will see; otherwise once the plugin reports them). A mesh whose
    /// weight-sharding group is larger than a host spans the `hosts` hosts: planned over all
    /// of them, and refused plainly on the CPU plugin, which cannot form a mesh across
    /// processes. `simulate` hosts stand in for them in this process instead.
    pub fn new(
        model: &LoadedModel,
        spec: &RunSpec,
        hosts: usize,
        simulate: Option<usize>,
        plugin: &std::path::Path,
        pipeline_depth: usize,
        attached: Attached,
    ) -> anyhow::Result<Plan> {
        let Attached { dictionaries, steering } = attached;
        let hooks = spec
            .hooks
            .iter()
            .map(|name| HookPoint::parse(name, &model.config))
            .collect::<Result<Vec<_>, _>>()
            .context("bad --hooks/--layers")?;
        // The next-token outputs read the final norm (and every block before it).
        let final_norm = spec.outputs.map(|_| HookPoint::model(HookKind::LnFinalOut));
        let read: Vec<HookPoint> =
            hooks.iter().copied().chain(dictionaries.iter().map(|d| d.hook)).chain(final_norm).collect();
        let (blocks, _) = siphon_models::forward::blocks_needed(&model.config, &read);
        model.check_weights(blocks).context("the model's weights do not match its config")?;
        let kind = PluginKind::of(plugin);
        let request = PlanRequest {
            mesh: spec.mesh,
            batch: Some(spec.corpus.batch_size),
            seq: Some(spec.corpus.seq_len),
            hooks: Some(hooks.clone()),
            dtype: spec.compute_dtype.parse()?,
            output_dtype: spec.dtype.parse()?,
            pipeline_depth,
            stored: match spec.weights {
                siphon_engine::WeightForm::Stored => model.stored_forms(blocks)?,
                siphon_engine::WeightForm::Dequantized => Default::default(),
            },
            dictionaries: dictionaries.iter().map(siphon_plan::DictionaryShape::of).collect(),
            next_token: spec.outputs,
            // A TPU's mixtures are grouped products over each expert's width.
            experts: match kind {
                PluginKind::Tpu => siphon_models::sharding::ExpertSplit::Width,
                _ => Default::default(),
            },
            ..PlanRequest::default()
        };
        let group = spec.mesh.fsdp.unwrap_or(1) * spec.mesh.model.unwrap_or(1);
        // This host's devices, where known before the plugin starts.
        let per_host = match kind {
            PluginKind::Cpu => Some(spec.cpu_devices.unwrap_or(1)),
            PluginKind::Cuda => Some(siphon_runtime::diagnose::Machine::probe().visible_gpus()).filter(|&n| n > 0),
            _ => None,
        };
        let span = match (simulate, per_host) {
            (Some(n), _) => simulated_span(kind, spec.cpu_devices, n, hosts)?,
            (None, Some(local)) if hosts > 1 && group > local => {
                Span::Hosts { hosts, per_host: Some(local), simulated: false }
            }
            // libtpu sees the whole slice: whether the mesh spans it is known once it reports.
            (None, None) if hosts > 1 && group > 1 => Span::Hosts { hosts, per_host: None, simulated: false },
            _ => Span::Host,
        };
        let plan = Plan { hooks, dictionaries, next_token: spec.outputs, steering, request, span };
        let window = spec.shuffle_tokens_window;
        match (span, per_host) {
            (Span::Hosts { hosts, per_host: Some(local), simulated }, _) => {
                let planned = plan.mesh_plan(&model.config, hosts, local)?;
                if kind == PluginKind::Cpu && !simulated {
                    return Err(cpu_refusal(&planned, hosts, local, plugin));
                }
                // Simulated hosts are this one process: all their devices and buffers.
                let processes = if simulated { hosts } else { 1 };
                fits::machine_memory(&planned, kind, local * processes, processes, window, fits::EXTRACT_HOST)?;
            }
            (Span::Host, Some(local)) => {
                let planned = plan.mesh_plan(&model.config, 1, local)?;
                fits::machine_memory(&planned, kind, local, 1, window, fits::EXTRACT_HOST)?;
            }
            // Planned once the plugin reports its devices.
            _ => {}
        }
        Ok(plan)
    }

    /// The planner's answer for `hosts` hosts of `per_host` devices.
    pub fn mesh_plan(&self, config: &ModelConfig, hosts: usize, per_host: usize) -> anyhow::Result<siphon_plan::Plan> {
        let topology = Topology::uniform(hosts, per_host)?;
        siphon_plan::plan(config, &topology, &self.request).map_err(|e| {
            let context = match &e {
                siphon_plan::PlanError::Uncountable { per_step: true, .. } => "--batch-size, --seq-len".to_string(),
                siphon_plan::PlanError::Uncountable { .. } => "the model's config".to_string(),
                _ if hosts == 1 => "no valid mesh for this host's devices".to_string(),
                _ => format!("no valid mesh over {hosts} hosts of {per_host} devices"),
            };
            anyhow::Error::new(e).context(context)
        })
    }
}

/// `--simulate-hosts n`: the CPU plugin's devices of this one process split over `n` hosts.
fn simulated_span(kind: PluginKind, cpu_devices: Option<usize>, n: usize, hosts: usize) -> anyhow::Result<Span> {
    if kind != PluginKind::Cpu {
        bail!("--simulate-hosts stands in for hosts with the CPU plugin's devices; the plugin here is {kind}");
    }
    if hosts > 1 {
        bail!("--simulate-hosts runs every simulated host in one process; this job has {hosts} processes");
    }
    let devices = cpu_devices.unwrap_or(1);
    if n < 2 || !devices.is_multiple_of(n) {
        bail!("--simulate-hosts {n}: the {devices} --cpu-devices must split evenly over at least 2 hosts");
    }
    Ok(Span::Hosts { hosts: n, per_host: Some(devices / n), simulated: true })
}

/// Why a job whose mesh spans hosts does not run on the CPU plugin (after planning it over
/// every host, so the flags, the model and the memory were checked).
fn cpu_refusal(planned: &siphon_plan::Plan, hosts: usize, local: usize, plugin: &std::path::Path) -> anyhow::Error {
    let group = planned.shape.weight_group();
    anyhow::anyhow!(
        "the mesh {} puts each weight over a group of {group} devices, which spans {} hosts of {local}: the CPU \
         plugin ({}) cannot form a mesh across processes (each process's devices are its own), so this job \
         cannot run here; it runs on TPU slices (libtpu) and CUDA nodes. Everything else was checked. Choose \
         --fsdp × --model-parallel ≤ {local} (this host's devices), or verify the spanning job in one process \
         with --simulate-hosts {hosts} --cpu-devices {}",
        planned.mesh,
        group.div_ceil(local),
        plugin.display(),
        hosts * local
    )
}

/// The tokenizer: `--tokenizer` if given, else the model's own; its vocabulary must fit the
/// model's embedding table (an id past it would silently read a clamped row).
pub fn tokenizer(model: &LoadedModel, path: Option<&str>) -> anyhow::Result<Arc<siphon_data::Tokenizer>> {
    let tokenizer = match path {
        Some(path) => siphon_data::load_tokenizer(path.as_ref())?,
        None => match &model.tokenizer {
            Some(t) => t.inner().clone(),
            None => bail!("the model at {} has no tokenizer; give --tokenizer tokenizer.json", model.path.display()),
        },
    };
    let vocab = tokenizer.get_vocab_size(true);
    if vocab > model.config.vocab_size {
        bail!("the tokenizer has {vocab} tokens but the model's embedding table only {} rows", model.config.vocab_size);
    }
    Ok(Arc::new(tokenizer))
}
