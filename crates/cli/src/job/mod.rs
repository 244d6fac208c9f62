//! The extraction job that `siphon extract` runs on every host.
//!
//! Start-up order (each step only after the previous one succeeded, and every check that can
//! fail cheaply before anything expensive):
//! identity → validation and plan (model config, hooks, corpus listing, mesh) → coordinator
//! → config broadcast and hash check → plugin and client → model on the mesh → resume point
//! published by every host → loop → completion barrier → stats merge → shutdown barrier.
//!
//! Hosts are data-parallel: each reads its own part of the corpus and writes its own shards,
//! so the loop never waits for another host. Hosts meet only at start-up, at the end, and
//! through the coordinator's error watch, which the loop polls every batch so that one
//! failed host stops the others at once.
//!
//! Preemption: SIGTERM (or another host's preemption, learned through the coordinator) stops
//! the loop before its next batch; the writer commits the shards the pushed batches complete
//! and drops the partial one (`ShardWriter::stop`), and the host exits with
//! `siphon_coord::EXIT_PREEMPTED` ([`Preempted`]). The stop timeout bounds it all; the same
//! command resumes after the last committed shard.

mod compute;
mod fetch;
mod options;
pub mod progress;
mod timing;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use siphon_coord::{Coordination, JoinOptions};
use siphon_data::{Corpus, PackConfig, Partition, Worker};
use siphon_store::{
    ActivationDtype, BatchActivations, HostId, RunDescriptor, ShardFormat, ShardWriter, ShuffleConfig, StoreConfig,
};

pub use options::{ExtractOptions, RunSpec};
pub use timing::read_timing;

use compute::Compute;
use progress::Progress;

/// How long hosts wait for each other at the barriers around the loop.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs the job on this host.
pub fn run(options: ExtractOptions) -> anyhow::Result<()> {
    // 1. Identity.
    let identity = options.cluster.identity()?;
    let host = HostId { machine: identity.machine_id, host: identity.process_id };
    let _span = tracing::info_span!("host", m = host.machine, h = host.host).entered();

    // 2. Validation and plan, before anything expensive.
    let model_spec = options.model.clone().context("missing --model (or `model` in the --config file)")?;
    let model_path = fetch::local_model_path(&model_spec)
        .with_context(|| format!("cannot fetch the model {}", model_spec.display()))?;
    let model = siphon_models::LoadedModel::open(&model_path)
        .with_context(|| format!("cannot open the model {}", model_path.display()))?;
    let spec = options.resolve(Some(&model.config), identity.total_machines)?;
    let corpus = options.corpus.open()?;
    let tokenizer = compute::tokenizer(&model, spec.tokenizer.as_deref())?;
    let pack = options.corpus.pack_config(&tokenizer, siphon_data::SpecialTokens::detect(&tokenizer))?;
    let partition = Partition { machines: identity.total_machines, hosts: identity.num_processes };
    let plugin = siphon_runtime::locate_plugin(options.plugin.as_deref()).context("no PJRT plugin")?;
    let compute_plan = compute::Plan::new(&model, &spec, identity.num_processes as usize, &plugin.path)?;
    tracing::info!(
        model = %model_path.display(), hooks = spec.hooks.len(), units = corpus.units().len(),
        plugin = %plugin.path.display(), "configuration valid"
    );

    // 3. Coordinator.
    let (token, _) = options.cluster.job_token(&identity)?;
    let mut join = JoinOptions::new(token);
    join.client.register_timeout = Duration::from_secs_f64(options.register_timeout);
    join.client.connect_timeout = Duration::from_secs_f64(options.connect_timeout);
    join.stop_timeout = Duration::from_secs_f64(options.stop_timeout.max(0.0));
    join.bind = options.cluster.bind_addr(&identity)?;
    join.tls = options.cluster.tls()?;
    if options.cluster.external_coordinator {
        join.host_service = Some(false);
    }
    let coordinator = identity.coordinator.clone();
    let coord = Coordination::join(&identity, join).with_context(|| {
        format!(
            "cannot join the job through the coordinator at {coordinator}: check that process 0 runs the \
             same command, that the address is right (--coordinator or the detected one), and that \
             firewalls let this host reach that port"
        )
    })?;
    coord.install_failure_reporting();

    let prepared = Prepared { spec, model, compute_plan, corpus, tokenizer, pack, partition, plugin };
    let result = run_joined(&coord, host, prepared, &options);
    if let Err(err) = &result
        && coord.job_error().is_none()
    {
        let _ = coord.report_error(&format!(
            "host {} (machine {}): {}",
            host.host,
            host.machine,
            crate::cmd::describe(err)
        ));
    }
    match result {
        // Whatever this host was doing, the job stopped to be resumed (a barrier or get that
        // another host's preemption failed is no error of this host's).
        Err(err) if coord.preempted() && err.downcast_ref::<Preempted>().is_none() => {
            Err(anyhow::Error::new(Preempted::new(crate::cmd::describe(&err))))
        }
        other => other,
    }
}

/// This host stopped because the job was preempted (SIGTERM here or on another host): what was
/// complete is committed, and the same command resumes the run. `siphon` exits with
/// [`siphon_coord::EXIT_PREEMPTED`].
#[derive(Debug)]
pub struct Preempted {
    message: String,
    /// Shards committed by this host when it stopped in its loop.
    shards: Option<u64>,
}

impl Preempted {
    /// A preemption seen from outside a host (the launcher's hosts exited preempted).
    pub fn new(message: impl Into<String>) -> Preempted {
        Preempted { message: message.into(), shards: None }
    }
}

impl std::fmt::Display for Preempted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "preempted: {}", self.message)?;
        if let Some(shards) = self.shards {
            write!(f, "; {shards} shards of this host are committed")?;
        }
        write!(f, "; run the same command again to resume")
    }
}

impl std::error::Error for Preempted {}

/// Everything step 2 checked and opened, handed to the steps that need the other hosts.
struct Prepared {
    spec: RunSpec,
    model: siphon_models::LoadedModel,
    compute_plan: compute::Plan,
    corpus: Corpus,
    tokenizer: Arc<siphon_data::Tokenizer>,
    pack: PackConfig,
    partition: Partition,
    plugin: siphon_runtime::LocatedPlugin,
}

fn run_joined(coord: &Coordination, host: HostId, prepared: Prepared, options: &ExtractOptions) -> anyhow::Result<()> {
    let Prepared { spec, model, compute_plan, corpus, tokenizer, pack, partition, plugin } = prepared;
    let spec = &spec;
    // 4. Config broadcast: every host must run the same code on the same configuration.
    let plugin_sha256 = sha256_file(&plugin.path)?;
    let compared = json!({
        "spec": spec,
        "model_config": model.config,
        "corpus_fingerprint": format!("{:016x}", corpus.fingerprint()),
        "siphon_version": env!("CARGO_PKG_VERSION"),
        "plugin_sha256": plugin_sha256,
    });
    let run_info = coord
        .broadcast_config(&compared, BARRIER_TIMEOUT)
        .context("the hosts' configurations differ (the same command must run on every host)")?;
    let run_name = match &spec.run {
        Some(name) => name.clone(),
        // Derived from the configuration, so re-running the same command resumes the same run.
        None => format!("run-{}", &siphon_coord::broadcast::config_hash(&compared)[..12]),
    };
    tracing::info!(run = %run_name, started = %run_info["start_time"], "configuration agreed by every host");

    // 5–6. Plugin, client, model on the mesh.
    let mut compute = Compute::start(&plugin, spec, compute_plan, &model)?;
    drop(model);

    // 7. Output and resume point.
    let store_config = store_config(spec, &run_name, host, Duration::from_secs_f64(options.store_timeout))?;
    let descriptor = RunDescriptor {
        model: json!({ "path": spec.model, "config": compute.model_config() }),
        hooks: spec.hooks.clone(),
        hook_shapes: compute.hook_shapes(spec.corpus.seq_len),
        mesh: compute.mesh_json(),
        partition: json!({ "machines": partition.machines, "hosts": partition.hosts }),
        config: serde_json::to_value(spec)?,
    };
    let mut writer = ShardWriter::open(store_config, descriptor).context("cannot open the output")?;
    let resume_at = writer.resume_point().clone();
    let resume: Option<siphon_data::Position> = match &resume_at.data_position {
        None => None,
        Some(value) => {
            Some(serde_json::from_value(value.clone()).context("the manifest's data position is unreadable")?)
        }
    };
    coord.kv_set(
        &format!("resume/{}/{}", host.machine, host.host),
        serde_json::to_string(&json!({ "next_shard": resume_at.next_shard, "next_sample": resume_at.next_sample }))?
            .as_bytes(),
        true,
    )?;
    coord.barrier("resume-points", BARRIER_TIMEOUT)?;
    if resume.is_some() {
        tracing::info!(next_shard = resume_at.next_shard, next_sample = resume_at.next_sample, "resuming");
    }

    // 8. The loop.
    let mut stream_config =
        options.corpus.stream_config(pack, partition, Worker { machine: host.machine, host: host.host });
    stream_config.resume = resume;
    let budget_batches = spec.max_tokens.map(|tokens| {
        let per_host = tokens.div_ceil(partition.workers());
        per_host.div_ceil((spec.corpus.batch_size * spec.corpus.seq_len) as u64)
    });
    let stream = corpus.stream(tokenizer, stream_config)?;
    let mut progress =
        Progress::new(host, budget_batches.map(|b| b * (spec.corpus.batch_size * spec.corpus.seq_len) as u64));
    progress.resumed(resume_at.committed_tokens);
    let started = Instant::now();
    let mut compute_time = Duration::ZERO;
    // Test hook: slows the loop down so that tests can kill a host mid-run.
    let slow_batch =
        std::env::var("SIPHON_TEST_SLOW_BATCH_MS").ok().and_then(|v| v.parse().ok()).map(Duration::from_millis);
    // From here SIGTERM stops the loop instead of the process (see siphon_coord::stop).
    let stop = coord.stop_signal();
    stop.arm();
    let mut preempted = false;
    for batch in stream {
        if let Some(delay) = slow_batch {
            std::thread::sleep(delay);
        }
        if let Some(err) = coord.job_error()
            && !err.is_preemption()
        {
            return Err(anyhow::Error::new(err).context("another host failed"));
        }
        if stop.requested() || coord.preempted() {
            preempted = true;
            break;
        }
        let batch = batch?;
        if budget_batches.is_some_and(|limit| batch.index >= limit) {
            break;
        }
        let t = Instant::now();
        let hooks = compute.run(&batch)?;
        compute_time += t.elapsed();
        let tokens = (batch.len() * batch.seq_len) as u64;
        writer.push(to_store_batch(&batch, hooks)?)?;
        progress.batch(tokens);
    }
    if preempted {
        // Commit the shards the pushed batches complete; the partial one is redone on resume.
        stop.start_deadline();
        let why = coord.job_error().map_or_else(|| "received SIGTERM".to_string(), |e| e.to_string());
        tracing::warn!(reason = %why, "preempted: committing the complete shards, then exiting");
        let summary = writer.stop().context("preempted, and committing the complete shards failed")?;
        tracing::info!(
            shards = summary.shards,
            tokens = summary.tokens,
            seconds = started.elapsed().as_secs_f64(),
            "host stopped (preempted)"
        );
        return Err(anyhow::Error::new(Preempted { message: why, shards: Some(summary.shards) }));
    }
    let summary = writer.finish()?;
    progress.finish(&summary);
    tracing::info!(
        shards = summary.shards,
        tokens = summary.tokens,
        kept = summary.included_tokens,
        seconds = started.elapsed().as_secs_f64(),
        compute_seconds = compute_time.as_secs_f64(),
        "host finished"
    );

    let timing = timing::HostTiming {
        host: host.dir_name(),
        tokens: summary.tokens.saturating_sub(resume_at.committed_tokens),
        seconds: started.elapsed().as_secs_f64(),
        compute_seconds: compute_time.as_secs_f64(),
    };
    timing::write_timing(&spec.output, &run_name, host, &timing).context("cannot write the host's timing")?;

    // 9. Completion, statistics, shutdown.
    coord.barrier("complete", BARRIER_TIMEOUT)?;
    if host.host == 0 {
        siphon_store::finalize_run(&spec.output, &[], &run_name).context("cannot merge the hosts' statistics")?;
        tracing::info!(output = %spec.output, run = %run_name, "dataset complete");
    }
    coord.shutdown(BARRIER_TIMEOUT)?;
    Ok(())
}

/// The store's view of a batch: token metadata from the data path plus the hook outputs.
fn to_store_batch(
    batch: &siphon_data::Batch,
    hooks: Vec<siphon_store::HookActivations>,
) -> anyhow::Result<BatchActivations> {
    let first_sample = batch.position.sequences - batch.len() as u64;
    Ok(BatchActivations {
        first_sample,
        batch: batch.len(),
        seq: batch.seq_len,
        hooks,
        token_ids: batch.tokens.iter().map(|&t| t as i32).collect(),
        doc_index: batch.doc.clone(),
        position: batch.doc_pos.clone(),
        keep: batch.exclude.iter().map(|&e| e == 0).collect(),
        data_position_after: serde_json::to_value(&batch.position)?,
    })
}

fn store_config(spec: &RunSpec, run: &str, host: HostId, give_up_after: Duration) -> anyhow::Result<StoreConfig> {
    let mut config = StoreConfig::new(spec.output.clone(), run, host);
    config.upload.give_up_after = give_up_after;
    config.format = ShardFormat {
        dtype: ActivationDtype::parse(&spec.dtype)?,
        target_shard_bytes: spec.shard_bytes,
        keep_excluded: spec.keep_excluded,
        shuffle: spec
            .shuffle_tokens_window
            .map(|window_batches| ShuffleConfig { seed: spec.shuffle_tokens_seed, window_batches }),
    };
    config.validate()?;
    Ok(config)
}

fn sha256_file(path: &std::path::Path) -> anyhow::Result<String> {
    use sha2::Digest;
    let mut file = std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut file, &mut hasher).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(hex_string(&hasher.finalize()))
}

fn hex_string(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
