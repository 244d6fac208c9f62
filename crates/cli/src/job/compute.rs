//! The device side of the job: the model checked and planned before anything expensive
//! ([`Plan`]), then put on this host's mesh and run batch by batch ([`Compute`]).

use std::sync::Arc;

use anyhow::{Context, bail};
use siphon_models::{HookPoint, LoadedModel, ModelConfig};
use siphon_plan::{PlanRequest, Topology};
use siphon_store::{ActivationDtype, HookActivations};

use super::RunSpec;

/// What was checked before the coordinator and the plugin: hooks, weights and mesh.
pub struct Plan {
    hooks: Vec<HookPoint>,
    request: PlanRequest,
}

impl Plan {
    /// Checks hooks against the model, every needed weight's presence and shape, and plans the
    /// mesh for the devices this host is expected to have (the CPU plugin's virtual devices;
    /// otherwise planned again once the plugin reports its devices). A mesh whose
    /// weight-sharding group (`--fsdp` × `--model-parallel`) is larger than a host is planned
    /// over all `hosts` and then refused: with `plugin` the CPU plugin, which cannot form a
    /// mesh across processes, plainly; elsewhere as not built yet.
    pub fn new(model: &LoadedModel, spec: &RunSpec, hosts: usize, plugin: &std::path::Path) -> anyhow::Result<Plan> {
        let hooks = spec
            .hooks
            .iter()
            .map(|name| HookPoint::parse(name, &model.config))
            .collect::<Result<Vec<_>, _>>()
            .context("bad --hooks/--layers")?;
        let (blocks, _) = siphon_models::forward::blocks_needed(&model.config, &hooks);
        model.check_weights(blocks).context("the model's weights do not match its config")?;
        let request = PlanRequest {
            mesh: spec.mesh,
            batch: Some(spec.corpus.batch_size),
            seq: Some(spec.corpus.seq_len),
            hooks: Some(hooks.clone()),
            dtype: match spec.compute_dtype.as_str() {
                "bf16" => siphon_plan::DType::BF16,
                _ => siphon_plan::DType::F32,
            },
            stored: match spec.weights {
                siphon_engine::WeightForm::Stored => model.stored_forms(blocks)?,
                siphon_engine::WeightForm::Dequantized => Default::default(),
            },
            ..PlanRequest::default()
        };
        let plan = Plan { hooks, request };
        let local = spec.cpu_devices.unwrap_or(1);
        let group = spec.mesh.fsdp.unwrap_or(1) * spec.mesh.model.unwrap_or(1);
        if group > local && hosts > 1 {
            return Err(spanning_refusal(&model.config, &plan.request, hosts, local, plugin));
        }
        plan.mesh_plan(&model.config, local)?;
        Ok(plan)
    }

    /// The planner's answer for `local_devices` devices on this host.
    fn mesh_plan(&self, config: &ModelConfig, local_devices: usize) -> anyhow::Result<siphon_plan::Plan> {
        let topology = Topology::uniform(1, local_devices)?;
        siphon_plan::plan(config, &topology, &self.request).context("no valid mesh for this host's devices")
    }
}

/// Why a job whose weight-sharding group spans hosts does not start: after planning it over
/// every host (so the flags, the model and the memory are checked), the CPU plugin's plain
/// refusal, or, on other plugins, that siphon does not yet run a mesh across processes.
fn spanning_refusal(
    config: &ModelConfig,
    request: &PlanRequest,
    hosts: usize,
    local: usize,
    plugin: &std::path::Path,
) -> anyhow::Error {
    let planned = Topology::uniform(hosts, local)
        .map_err(anyhow::Error::from)
        .and_then(|t| siphon_plan::plan(config, &t, request).map_err(anyhow::Error::from));
    let planned = match planned {
        Ok(p) => p,
        Err(e) => return e.context(format!("no valid mesh over {hosts} hosts of {local} devices")),
    };
    let group = planned.shape.weight_group();
    let what = format!(
        "the mesh {} puts each weight over a group of {group} devices, which spans {} hosts of {local}",
        planned.mesh,
        group.div_ceil(local)
    );
    match siphon_runtime::PluginKind::of(plugin) {
        siphon_runtime::PluginKind::Cpu => anyhow::anyhow!(
            "{what}: the CPU plugin ({}) cannot form a mesh across processes (each process's devices are its \
             own), so this job cannot run here (nor, yet, on TPU or CUDA hosts: siphon does not run one mesh \
             over several hosts, issue 24). Everything else was checked. Choose --fsdp × --model-parallel ≤ \
             {local} (this host's devices)",
            plugin.display()
        ),
        kind => anyhow::anyhow!(
            "{what}: siphon does not yet run one mesh across hosts (issue 24), on the {kind} plugin either; \
             choose --fsdp × --model-parallel ≤ this host's devices"
        ),
    }
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

fn activation_dtype(name: &str) -> anyhow::Result<ActivationDtype> {
    Ok(ActivationDtype::parse(name)?)
}

/// The model on this host's mesh.
pub struct Compute {
    engine: siphon_engine::Engine,
    mesh: siphon_mesh::Mesh,
    output_dtype: ActivationDtype,
    batch_size: usize,
    // Keeps the plugin's client alive as long as the engine's buffers.
    _client: siphon_runtime::Client,
}

impl Compute {
    /// Loads the plugin, creates the client, plans the mesh on the devices it reports and
    /// uploads the weights (each device gets its shard).
    pub fn start(
        plugin: &siphon_runtime::LocatedPlugin,
        spec: &RunSpec,
        plan: Plan,
        model: &LoadedModel,
    ) -> anyhow::Result<Compute> {
        let loaded = siphon_runtime::Plugin::load(&plugin.path)
            .with_context(|| format!("cannot load the PJRT plugin {}", plugin.path.display()))?;
        let mut options = siphon_runtime::ClientOptions::new();
        if let Some(devices) = spec.cpu_devices {
            options = options.cpu_device_count(devices);
        }
        let client = siphon_runtime::Client::new(&loaded, options).context("cannot create the PJRT client")?;
        let device_ids = client.addressable_device_ids();
        let planned = plan.mesh_plan(&model.config, device_ids.len())?;
        // The planner numbers this host's devices 0..n; the client's ids may differ.
        let axes: Vec<(&str, usize)> = planned.mesh.axes().iter().map(|a| (a.name.as_str(), a.size)).collect();
        let ids = planned.mesh.device_ids().iter().map(|&i| device_ids[i]).collect();
        let mesh = siphon_mesh::Mesh::new(&axes, ids)?;
        tracing::info!(
            platform = client.platform_name(), devices = device_ids.len(), mesh = %mesh,
            weights_per_device = planned.memory.weights.sharded_bytes, "devices ready"
        );
        let params = planned.param_specs().iter().cloned().collect();
        let dtype = |name: &str| match name {
            "bf16" => siphon_models::DType::Bf16,
            "f16" => siphon_models::DType::F16,
            _ => siphon_models::DType::F32,
        };
        let options = siphon_engine::EngineOptions {
            compute_dtype: dtype(&spec.compute_dtype),
            output_dtype: dtype(&spec.dtype),
            mesh: mesh.clone(),
            plan: siphon_engine::ShardingPlan::Explicit { params, input: Some(planned.input_spec.clone()) },
            expert_capacity: None,
            weights: spec.weights,
        };
        let engine = siphon_engine::Engine::new(&client, model, plan.hooks.clone(), options)
            .context("cannot put the model on the devices")?;
        engine.prepare(spec.corpus.batch_size, spec.corpus.seq_len).context("cannot compile the forward pass")?;
        let stats = engine.load_stats();
        tracing::info!(seconds = stats.upload_s, bytes = stats.uploaded_bytes, "weights uploaded, forward compiled");
        Ok(Compute {
            engine,
            mesh,
            output_dtype: activation_dtype(&spec.dtype)?,
            batch_size: spec.corpus.batch_size,
            _client: client,
        })
    }

    /// The model's configuration (for run.json).
    pub fn model_config(&self) -> &ModelConfig {
        self.engine.config()
    }

    /// Each hook's per-token shape at sequence length `seq` (for run.json).
    pub fn hook_shapes(&self, seq: usize) -> Vec<Vec<usize>> {
        self.engine.hooks().iter().map(|h| h.dims(self.engine.config(), seq)).collect()
    }

    /// The mesh as JSON (for run.json).
    pub fn mesh_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.mesh).unwrap_or(serde_json::Value::Null)
    }

    /// Runs one batch: its hook activations, `[batch*seq, *per-token shape]` each, in hook
    /// order.
    ///
    /// A stream's last batch may be short: it is filled up with fully masked rows to the
    /// compiled batch size (one compiled shape, a batch the data axis always splits), and
    /// their outputs are dropped.
    pub fn run(&mut self, batch: &siphon_data::Batch) -> anyhow::Result<Vec<HookActivations>> {
        let rows = batch.len();
        let seq = batch.seq_len;
        let mut ids: Vec<Vec<u32>> = (0..rows).map(|i| batch.sequence(i).to_vec()).collect();
        let mut mask: Vec<Vec<u8>> = batch.attention_mask.chunks(seq).map(<[u8]>::to_vec).collect();
        if rows < self.batch_size {
            ids.resize(self.batch_size, vec![0; seq]);
            mask.resize(self.batch_size, vec![0; seq]);
        }
        let input = siphon_engine::Batch::new(ids, Some(mask))?;
        let activations = self.engine.run(&input)?;
        activations
            .hooks
            .into_iter()
            .map(|(hook, array)| {
                let shape = array.shape().get(2..).context("hook output without per-token dimensions")?.to_vec();
                let mut data = array.into_bytes();
                data.truncate(rows * seq * shape.iter().product::<usize>() * self.output_dtype.size());
                Ok(HookActivations { hook: hook.to_string(), dtype: self.output_dtype, shape, data })
            })
            .collect()
    }
}
