//! Phases 5–6, the device side of the job: the planned model ([`super::plan::Plan`]) put on
//! the job's mesh and run step by step ([`Compute`]), each process running its [`Member`]s'
//! partitions.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use siphon_mesh::HostView;
use siphon_models::{DictionaryHook, LoadedModel, ModelConfig};
use siphon_runtime::PluginKind;
use siphon_store::DType;

use super::plan::{Plan, Span};
use super::{RunSpec, fits};

/// One process's part in the job's steps: the processes whose partitions this process runs
/// (itself; every simulated host under `--simulate-hosts`), each with the corpus slice it
/// reads and whether it writes what its rows give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// The process (host) id.
    pub process: u32,
    /// Its reader: the slice of the corpus it reads, shared by the processes holding the
    /// same data groups.
    pub reader: u32,
    /// Whether it writes its rows' activations (the lowest process of its reader does).
    pub writes: bool,
}

/// The model on the job's mesh.
pub struct Compute {
    engine: siphon_engine::Engine,
    mesh: siphon_mesh::Mesh,
    span: Span,
    members: Vec<Member>,
    readers: u32,
    /// Each process's reader (a spanning job's step vote compares readers' batches).
    reader_of: Vec<u32>,
    output_dtype: DType,
    /// Rows each member feeds per step: its reader's share of `--batch-size`.
    reader_rows: usize,
    /// Whether rows hold isolated documents (`--pack isolated`): positions restart at each.
    isolated: bool,
    /// The rows of each document stored (`--positions`), chosen on the devices.
    chooser: Option<Chooser>,
    // Keeps the plugin's client alive as long as the engine's buffers; makes host buffers.
    client: siphon_runtime::Client,
}

/// How each batch's rows are chosen (`--positions`): the choice, `after:`'s marker as token
/// ids, and whether each turn of the kept roles is a unit (`--roles`).
struct Chooser {
    positions: siphon_data::Positions,
    marker: Vec<u32>,
    per_turn: bool,
}

/// The coordinator's key-value store as the PJRT client's (the CUDA plugin exchanges its
/// topology and NCCL ids through it).
struct CoordinatorKv {
    client: siphon_coord::Client,
    runtime: tokio::runtime::Handle,
}

impl siphon_runtime::KeyValueStore for CoordinatorKv {
    fn get(&self, key: &str, timeout: Duration) -> Result<Option<Vec<u8>>, String> {
        match self.runtime.block_on(self.client.kv_get(key, timeout)) {
            Ok(value) => Ok(Some(value)),
            Err(siphon_coord::CoordError::DeadlineExceeded(_)) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        self.runtime.block_on(self.client.kv_try_get(key)).map_err(|e| e.to_string())
    }
    fn put(&self, key: &str, value: &[u8]) -> Result<(), String> {
        self.runtime.block_on(self.client.kv_set(key, value, true)).map_err(|e| e.to_string())
    }
}

impl Compute {
    /// Loads the plugin, creates the client (on CUDA nodes of a spanning job, one client over
    /// every node: `num_nodes`, `node_id` and the coordinator's key-value store), plans the
    /// mesh on the devices it reports and uploads this process's partitions of the weights.
    pub fn start(
        plugin: &siphon_runtime::LocatedPlugin,
        spec: &RunSpec,
        plan: Plan,
        model: &LoadedModel,
        coord: &siphon_coord::Coordination,
    ) -> anyhow::Result<Compute> {
        crate::fatal::enter(crate::fatal::Phase::Upload);
        let kind = PluginKind::of(&plugin.path);
        let loaded = siphon_runtime::Plugin::load(&plugin.path)
            .with_context(|| format!("cannot load the PJRT plugin {}", plugin.path.display()))?;
        let mut options = siphon_runtime::ClientOptions::new();
        if let Some(devices) = spec.cpu_devices {
            options = options.cpu_device_count(devices);
        }
        let identity = coord.identity();
        let spans_processes = matches!(plan.span, Span::Hosts { simulated: false, .. });
        // SIPHON_CUDA_KEY_VALUE=1 takes that path on one process too (`num_nodes` 1), so that
        // one GPU checks the client's key-value exchange.
        let key_value = spans_processes || std::env::var_os("SIPHON_CUDA_KEY_VALUE").is_some_and(|v| v == "1");
        if key_value && kind == PluginKind::Cuda {
            use siphon_runtime::OptionValue::Int64;
            options = options
                .option("num_nodes", Int64(i64::from(identity.num_processes)))
                .option("node_id", Int64(i64::from(identity.process_id)))
                .key_value_store(Arc::new(CoordinatorKv {
                    client: coord.client().clone(),
                    runtime: coord.runtime().clone(),
                }));
        }
        let client = siphon_runtime::Client::new(&loaded, options).context("cannot create the PJRT client")?;
        let local = client.addressable_device_ids();
        let group = spec.mesh.fsdp.unwrap_or(1) * spec.mesh.model.unwrap_or(1);
        let span = match plan.span {
            // libtpu reports the slice: the mesh spans hosts when a group is larger than one.
            Span::Hosts { hosts, per_host: None, simulated } => match group > local.len() {
                true => Span::Hosts { hosts, per_host: Some(local.len()), simulated },
                false => Span::Host,
            },
            span => span,
        };
        let (planned, mesh, views) = match span {
            Span::Host => {
                let planned = plan.mesh_plan(&model.config, 1, local.len())?;
                // The planner numbers this host's devices 0..n; the client's ids may differ.
                let mesh = planned.mesh.renumbered(&local)?;
                (planned, mesh, Vec::new())
            }
            Span::Hosts { hosts, per_host: Some(per_host), simulated } => {
                let planned = plan.mesh_plan(&model.config, hosts, per_host)?;
                let (mesh, views) = spanning_views(&client, &planned.mesh, hosts, per_host, simulated)?;
                (planned, mesh, views)
            }
            Span::Hosts { per_host: None, .. } => unreachable!("resolved above"),
        };
        fits::device_memory(&client, &local, &planned, fits::EXTRACT_DEVICE)?;
        // Planned only now (libtpu reports its devices): the host's buffers checked here.
        if !matches!(kind, PluginKind::Cpu | PluginKind::Cuda) {
            fits::machine_memory(&planned, kind, local.len(), 1, spec.shuffle_tokens_window, fits::EXTRACT_HOST)?;
        }
        let (members, readers, reader_of) = members(&views, identity.process_id, identity.num_processes)?;
        tracing::info!(
            platform = client.platform_name(), devices = local.len(), mesh = %mesh,
            weights_per_device = planned.memory.weights.sharded_bytes, processes = views.len().max(1),
            "devices ready"
        );
        let params = planned.param_specs().iter().cloned().collect();
        let isolated = spec.corpus.pack == Some(crate::args::corpus::PackArg::Isolated);
        let options = siphon_engine::EngineOptions {
            compute_dtype: spec.compute_dtype.parse()?,
            // The stored dtype: the program returns it (fp8 rows quantized on the device).
            output_dtype: spec.dtype.parse()?,
            mesh: mesh.clone(),
            plan: siphon_engine::ShardingPlan::Explicit { params, input: Some(planned.input_spec.clone()) },
            weights: spec.weights,
            processes: views.clone(),
            // Packed rows and `--pad right` put real tokens first: cuDNN's fused attention
            // takes them on a CUDA plugin.
            right_padded: !matches!(spec.corpus.pad, Some(crate::args::corpus::PadSideArg::Left)),
            dictionaries: plan.dictionaries.clone(),
            next_token: plan.next_token,
            steering: plan.steering.clone(),
            isolated,
            ..Default::default()
        };
        let engine = siphon_engine::Engine::new(&client, model, plan.hooks.clone(), options)
            .context("cannot put the model on the devices")?;
        // --batch-size is the mesh's batch (sequences per step, as `siphon plan --batch`); on a
        // spanning mesh each reader feeds its share.
        let reader_rows = match views.first() {
            Some(view) => {
                let rows = spec.corpus.batch_size / readers as usize;
                if view.global_batch(rows)? != spec.corpus.batch_size {
                    bail!(
                        "--batch-size {} does not split evenly over the {readers} readers of the mesh {mesh}",
                        spec.corpus.batch_size
                    );
                }
                rows
            }
            None => spec.corpus.batch_size,
        };
        let chooser = spec.positions.clone().map(|positions| Chooser {
            positions,
            marker: spec.positions_marker.iter().flatten().map(|(id, _)| *id).collect(),
            per_turn: spec.corpus.roles.is_some(),
        });
        if chooser.is_some() && matches!(span, Span::Hosts { simulated: false, .. }) {
            bail!(
                "--positions on a mesh spanning processes: each step's chosen rows a sequence would need agreeing on \
                 (not built); run the model on each host's devices"
            );
        }
        crate::fatal::enter(crate::fatal::Phase::Compile);
        let (batch, seq) = (spec.corpus.batch_size, spec.corpus.seq_len);
        match chooser {
            // A row a sequence is what one document a row gives; other counts compile as met.
            Some(_) => engine.prepare_chosen(batch, seq, 1),
            None => engine.prepare(batch, seq),
        }
        .context("cannot compile the forward pass")?;
        let stats = engine.load_stats();
        tracing::info!(seconds = stats.upload_s, bytes = stats.uploaded_bytes, "weights uploaded, forward compiled");
        Ok(Compute {
            engine,
            mesh,
            span,
            members,
            readers,
            reader_of,
            output_dtype: spec.dtype.parse()?,
            reader_rows,
            isolated,
            chooser,
            client,
        })
    }

    /// The processes whose steps this process runs.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// How many readers the corpus is partitioned over (this job's processes when hosts are
    /// data-parallel).
    pub fn readers(&self) -> u32 {
        self.readers
    }

    /// Each process's reader, by process (empty when hosts are data-parallel).
    pub fn reader_of(&self) -> &[u32] {
        &self.reader_of
    }

    /// Rows each reader's batch holds: `--batch-size` over the readers of a spanning mesh.
    pub fn reader_rows(&self) -> usize {
        self.reader_rows
    }

    /// Whether the mesh spans processes (every process must then enter every step).
    pub fn spans_processes(&self) -> bool {
        matches!(self.span, Span::Hosts { simulated: false, .. })
    }

    /// The model's configuration (for run.json).
    pub fn model_config(&self) -> &ModelConfig {
        self.engine.config()
    }

    /// Each hook's per-token shape at sequence length `seq` (for run.json).
    pub fn hook_shapes(&self, seq: usize) -> Vec<Vec<usize>> {
        self.engine.hooks().iter().map(|h| h.dims(self.engine.config(), seq)).collect()
    }

    /// The dictionaries whose latents each step computes, in output order.
    pub fn dictionaries(&self) -> &[DictionaryHook] {
        self.engine.dictionaries()
    }

    /// The mesh as JSON (for run.json).
    pub fn mesh_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.mesh).unwrap_or(serde_json::Value::Null)
    }

    /// Each member's chosen rows (`--positions`; none without it), a sequence's count the
    /// same for every member of the step.
    pub fn choose(&self, batches: &[Option<&siphon_data::Batch>]) -> Vec<Option<siphon_data::Selection>> {
        match &self.chooser {
            Some(c) => siphon_data::choose_together(batches, &c.positions, &c.marker, c.per_turn),
            None => vec![None; batches.len()],
        }
    }

    /// Launches one step: `batches[i]` is member `i`'s batch (`None` once its reader's slice
    /// is done: fully masked rows, whose outputs are never read), `chosen[i]` its chosen
    /// rows ([`Compute::choose`]). Returns once the program is launched
    /// ([`siphon_engine::Engine::launch`]); member `i`'s rows are read back as the engine's
    /// process `i`.
    ///
    /// A stream's last batch may be short: it is filled up with fully masked rows to the
    /// compiled batch size (one compiled shape, a batch the data axis always splits), and
    /// their outputs are dropped.
    pub fn launch(
        &self,
        batches: &[Option<&siphon_data::Batch>],
        chosen: &[Option<siphon_data::Selection>],
    ) -> anyhow::Result<siphon_engine::Launched> {
        let seq = batches.iter().flatten().map(|b| b.seq_len).next().context("a step without any batch")?;
        let chosen_rows = chosen.iter().flatten().map(|s| s.rows).max();
        let inputs = batches
            .iter()
            .zip(chosen)
            .map(|(batch, chosen)| {
                let (mut ids, mut mask): (Vec<Vec<u32>>, Vec<Vec<u8>>) = match batch {
                    Some(b) => (
                        (0..b.len()).map(|i| b.sequence(i).to_vec()).collect(),
                        b.attention_mask.chunks(seq).map(<[u8]>::to_vec).collect(),
                    ),
                    None => (Vec::new(), Vec::new()),
                };
                ids.resize(self.reader_rows, vec![0; seq]);
                mask.resize(self.reader_rows, vec![0; seq]);
                let mut rows = siphon_engine::Batch::new(ids, Some(mask))?;
                if let (true, Some(b)) = (self.isolated, batch) {
                    let mut positions = document_positions(&b.doc, seq);
                    positions.resize(self.reader_rows * seq, 0);
                    rows = rows.with_position_ids(positions)?;
                }
                if let Some(per_sequence) = chosen_rows {
                    let mut weights = chosen.as_ref().map_or_else(Vec::new, |c| c.weights.clone());
                    weights.resize(self.reader_rows * per_sequence * seq, 0.0);
                    rows = rows.with_selection(per_sequence, weights)?;
                }
                Ok::<_, siphon_engine::EngineError>(rows)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(self.engine.launch(&inputs)?)
    }

    /// One step's host buffers, `[member][hook]` bytes at `seq` tokens a row: a member that
    /// writes reads back its reader's rows of every hook, one that does not reads nothing.
    pub fn slot_sizes(&self, seq: usize) -> Vec<Vec<usize>> {
        let dtype = self.output_dtype;
        let per_row: Vec<usize> =
            self.hook_shapes(seq).iter().map(|s| dtype.row_bytes(s.iter().product()) * seq).collect();
        self.members
            .iter()
            .map(|m| match m.writes {
                true => per_row.iter().map(|n| n * self.reader_rows).collect(),
                false => Vec::new(),
            })
            .collect()
    }

    /// Host memory for copies from the devices, pinned for DMA where the plugin can.
    pub fn host_buffer(&self, len: usize) -> anyhow::Result<siphon_runtime::HostBuffer> {
        self.client.host_buffer(len).context("cannot allocate a host buffer for the activations")
    }

    /// The stored dtype the program returns.
    pub fn output_dtype(&self) -> DType {
        self.output_dtype
    }
}

/// The spanning mesh on the client's devices, host by host (each process's devices in id
/// order, processes in order, as the planner numbers hosts), and the processes' views of it:
/// this process's, or every simulated host's.
fn spanning_views(
    client: &siphon_runtime::Client,
    planned: &siphon_mesh::Mesh,
    hosts: usize,
    per_host: usize,
    simulated: bool,
) -> anyhow::Result<(siphon_mesh::Mesh, Vec<HostView>)> {
    let mut devices = client.devices();
    devices.sort_by_key(|d| (d.process_index, d.id));
    if devices.len() != hosts * per_host {
        bail!(
            "the mesh spans {hosts} hosts of {per_host} devices, but the {} client reports {} devices in all",
            client.platform_name(),
            devices.len()
        );
    }
    let ids: Vec<usize> = devices.iter().map(|d| d.id).collect();
    let mesh = planned.renumbered(&ids)?;
    let views = if simulated {
        (0..hosts).map(|h| HostView::contiguous(&mesh, hosts, h)).collect::<Result<Vec<_>, _>>()?
    } else {
        let process_of = |id: usize| devices.iter().find(|d| d.id == id).map_or(usize::MAX, |d| d.process_index);
        let owners = mesh.device_ids().iter().map(|&id| process_of(id)).collect();
        vec![HostView::new(&mesh, owners, client.process_index())?]
    };
    Ok((mesh, views))
}

/// The members this process runs, the number of readers and each process's reader; with no
/// views (hosts data-parallel), this process alone, reading its own slice of `processes`.
fn members(views: &[HostView], process: u32, processes: u32) -> anyhow::Result<(Vec<Member>, u32, Vec<u32>)> {
    let Some(first) = views.first() else {
        return Ok((vec![Member { process, reader: process, writes: true }], processes, Vec::new()));
    };
    if let [view] = views
        && view.process() != process as usize
    {
        bail!("the PJRT client counts this process as {}, the job as {process}", view.process());
    }
    let reader_of: Vec<u32> = first.readers()?.into_iter().map(|r| r as u32).collect();
    let readers = reader_of.iter().max().map_or(0, |&r| r + 1);
    let members = views
        .iter()
        .map(|v| Member { process: v.process() as u32, reader: reader_of[v.process()], writes: v.writer() })
        .collect();
    Ok((members, readers, reader_of))
}

/// Each token's position within its run of one document in its row (`doc`, row-major rows of
/// `seq`): 0 where a row starts or the document changes. A document cut by a row's end starts
/// again at 0 in the next: each piece is a document of its own.
fn document_positions(doc: &[i64], seq: usize) -> Vec<i32> {
    let mut positions = Vec::with_capacity(doc.len());
    for (i, &d) in doc.iter().enumerate() {
        let position = match i % seq != 0 && doc[i - 1] == d {
            true => positions[i - 1] + 1,
            false => 0,
        };
        positions.push(position);
    }
    positions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_restart_at_each_document_and_each_row() {
        let doc = [7, 7, 7, 9, 9, -1, 9, 9, 4, 4];
        assert_eq!(document_positions(&doc, 5), vec![0, 1, 2, 0, 1, 0, 0, 1, 0, 1]);
    }
}
