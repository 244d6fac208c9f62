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
//! Unless the mesh spans hosts (a model larger than one): then every step is one program over
//! every host's devices. The corpus is partitioned over readers (the processes holding the
//! same data groups read one slice together, and the lowest of them writes its rows), and
//! before each step the processes vote through the coordinator whether any reader still has
//! a batch, each vote carrying its batch's fingerprint: every host enters each step with the
//! same step index, and processes of one reader that read different batches stop the job
//! (the seeds' "collective desync", caught instead of hanging).
//!
//! Preemption: SIGTERM (or another host's preemption, learned through the coordinator) stops
//! the loop before its next batch; the writer commits the shards the pushed batches complete
//! and drops the partial one (`ShardWriter::stop`), and the host exits with
//! `siphon_coord::EXIT_PREEMPTED` ([`Preempted`]). The stop timeout bounds it all; the same
//! command resumes after the last committed shard.

mod compute;
pub(crate) mod fetch;
mod fits;
mod options;
mod output;
mod pipeline;
pub mod progress;
mod timing;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use siphon_coord::{Coordination, JoinOptions};
use siphon_data::{Corpus, PackConfig, Partition, Worker};
use siphon_store::{
    BatchActivations, DType, HostId, LatentsColumn, RunDescriptor, ShardFormat, ShardWriter, ShuffleConfig, StoreConfig,
};

pub use options::{ExtractOptions, RunSpec};
pub use timing::{HostTiming, read_timing};

use crate::outcome::Preempted;
use compute::Compute;
use progress::Progress;

/// How long hosts wait for each other at the barriers around the loop.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs the job on this host.
pub fn run(options: ExtractOptions) -> anyhow::Result<()> {
    // 1. Identity.
    let identity = options.cluster.identity()?;
    let host = HostId { machine: identity.machine_id, host: identity.process_id };
    crate::fatal::set_host(host.machine, host.host);
    let _span = tracing::info_span!("host", m = host.machine, h = host.host).entered();

    // 2. Validation and plan, before anything expensive.
    let model_spec = options.model.clone().context("missing --model (or `model` in the --config file)")?;
    let model_path = fetch::local_model_path(&model_spec)
        .with_context(|| format!("cannot fetch the model {}", model_spec.display()))?;
    let model = siphon_models::LoadedModel::open(&model_path)
        .with_context(|| format!("cannot open the model {}", model_path.display()))?;
    let mut spec = options.resolve(Some(&model.config), identity.total_machines)?;
    let dictionaries = options.dictionaries.open_capped(&model.config)?;
    let fingerprints: Vec<String> = dictionaries.iter().map(|d| dictionary_fingerprint(&d.dictionary)).collect();
    let corpus = options.corpus.open()?;
    let tokenizer = compute::tokenizer(&model, spec.tokenizer.as_deref())?;
    let text_tokenizer = model.tokenizer.as_ref();
    let chat = options.corpus.chat(
        &corpus,
        text_tokenizer.and_then(|t| t.chat_template.as_deref()),
        text_tokenizer.map_or(&[][..], |t| &t.special_tokens),
    )?;
    spec.chat_template = chat.as_ref().map(|c| c.source().to_string());
    let pack = options.corpus.pack_config(&tokenizer, siphon_data::SpecialTokens::detect(&tokenizer))?;
    let plugin = siphon_runtime::locate_plugin(options.plugin.as_deref()).context("no PJRT plugin")?;
    let compute_plan = compute::Plan::new(
        &model,
        &spec,
        identity.num_processes as usize,
        options.simulate_hosts,
        &plugin.path,
        options.pipeline_depth,
        dictionaries,
    )?;
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

    let prepared = Prepared { spec, model, compute_plan, corpus, tokenizer, pack, chat, plugin, fingerprints };
    let result = run_joined(&coord, host, prepared, &options);
    if let Err(err) = &result
        && coord.job_error().is_none()
    {
        let _ = coord.report_error(&format!(
            "host {} (machine {}): {}",
            host.host,
            host.machine,
            crate::outcome::describe(err)
        ));
    }
    match result {
        // Whatever this host was doing, the job stopped to be resumed (a barrier or get that
        // another host's preemption failed is no error of this host's).
        Err(err) if coord.preempted() && err.downcast_ref::<Preempted>().is_none() => {
            Err(anyhow::Error::new(Preempted::new(crate::outcome::describe(&err))))
        }
        other => other,
    }
}

/// Everything step 2 checked and opened, handed to the steps that need the other hosts.
struct Prepared {
    spec: RunSpec,
    model: siphon_models::LoadedModel,
    compute_plan: compute::Plan,
    corpus: Corpus,
    tokenizer: Arc<siphon_data::Tokenizer>,
    pack: PackConfig,
    chat: Option<Arc<siphon_data::ChatTemplate>>,
    plugin: siphon_runtime::LocatedPlugin,
    /// Each dictionary's [`dictionary_fingerprint`].
    fingerprints: Vec<String>,
}

/// One member's share of the loop: the stream of its reader's corpus slice (its writer, if
/// it writes, is the pipeline's [`pipeline::Sink`]).
struct Lane {
    member: compute::Member,
    stream: siphon_data::BatchStream,
    /// The first batch it runs: a stream that starts again makes no batch its consumers have.
    first: u64,
    done: bool,
}

impl Lane {
    /// The next batch from `first` on (those before are read, not run).
    fn next(&mut self) -> anyhow::Result<Option<siphon_data::Batch>> {
        loop {
            match self.stream.next().transpose()? {
                Some(batch) if batch.index < self.first => continue,
                batch => return Ok(batch),
            }
        }
    }
}

fn run_joined(coord: &Coordination, host: HostId, prepared: Prepared, options: &ExtractOptions) -> anyhow::Result<()> {
    let Prepared { spec, model, compute_plan, corpus, tokenizer, pack, chat, plugin, fingerprints } = prepared;
    let spec = &spec;
    // 4. Config broadcast: every host must run the same code on the same configuration.
    let plugin_sha256 = sha256_file(&plugin.path)?;
    let compared = json!({
        "spec": spec,
        "model_config": model.config,
        "corpus_fingerprint": format!("{:016x}", corpus.fingerprint()),
        "siphon_version": env!("CARGO_PKG_VERSION"),
        "plugin_sha256": plugin_sha256,
        // What the dictionaries' files hold, not only their paths.
        "dictionaries_sha256": fingerprints,
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
    let compute = Compute::start(&plugin, spec, compute_plan, &model, coord)?;
    drop(model);
    let partition = Partition { machines: spec.total_machines, hosts: compute.readers() };

    // 7. Output and resume point: each writing member's from its manifest, shared with the
    // other members of its reader through the key-value store.
    let descriptor = RunDescriptor {
        model: json!({ "path": spec.model, "config": compute.model_config() }),
        hooks: spec.hooks.clone(),
        hook_shapes: compute.hook_shapes(spec.corpus.seq_len),
        latents: latents_columns(compute.dictionaries(), &fingerprints),
        mesh: compute.mesh_json(),
        partition: json!({ "machines": partition.machines, "hosts": partition.hosts }),
        config: serde_json::to_value(spec)?,
    };
    let mut writers = Vec::new();
    let mut committed_tokens = 0;
    let streaming = siphon_stream::address(&spec.output).is_some();
    let producers = match streaming {
        true => stream_producers(coord, &spec.output, &run_name, host.machine, &compute)?,
        false => Vec::new(),
    };
    for member in compute.members().iter().filter(|m| m.writes) {
        let host = HostId { machine: host.machine, host: member.process };
        let store = || store_config(spec, &run_name, host, Duration::from_secs_f64(options.store_timeout));
        let stream = || {
            let bind = output::bind_address(&spec.output, member.reader)?;
            let endpoints = output::Endpoints { bind, producers: producers.clone() };
            let bounds = siphon_stream::Bounds { buffer: options.stream_buffer, keep: options.stream_keep };
            Ok((endpoints, output::serving(&options.cluster, coord.identity(), bounds)?))
        };
        let (writer, resume_at) = output::Output::open(&spec.output, &run_name, host, &descriptor, stream, store)?;
        committed_tokens += resume_at.committed_tokens;
        coord.kv_set(
            &format!("resume/{}/{}", host.machine, host.host),
            serde_json::to_string(
                &json!({ "next_shard": resume_at.next_shard, "next_sample": resume_at.next_sample }),
            )?
            .as_bytes(),
            true,
        )?;
        // Where the reader's processes start: the data position, and the first batch they run
        // (a stream that starts again skips its consumers' batches).
        let start = json!({ "position": resume_at.data_position, "first": writer.first_batch() });
        coord.kv_set(
            &format!("position/{}/{}/{}", run_name, host.machine, member.reader),
            serde_json::to_vec(&start)?.as_slice(),
            true,
        )?;
        if resume_at.data_position.is_some() {
            tracing::info!(
                host = host.host,
                next_shard = resume_at.next_shard,
                next_sample = resume_at.next_sample,
                "resuming"
            );
        }
        writers.push((member.process, writer, resume_at.committed_tokens));
    }
    coord.barrier("resume-points", BARRIER_TIMEOUT)?;
    let mut lanes = Vec::new();
    let mut sinks = Vec::new();
    for (process, member) in compute.members().iter().enumerate() {
        let key = format!("position/{}/{}/{}", run_name, host.machine, member.reader);
        let start: serde_json::Value = serde_json::from_slice(&coord.kv_get(&key, BARRIER_TIMEOUT)?)?;
        let position = start["position"].clone();
        let mut stream_config = options.corpus.stream_config(
            pack.clone(),
            partition,
            Worker { machine: host.machine, host: member.reader },
        );
        stream_config.batch_size = compute.reader_rows();
        stream_config.chat = chat.clone();
        stream_config.resume = match position {
            serde_json::Value::Null => None,
            value => Some(serde_json::from_value(value).context("the manifest's data position is unreadable")?),
        };
        let writer = writers.iter().position(|(p, ..)| *p == member.process).map(|i| {
            let (_, writer, resumed) = writers.remove(i);
            (writer, resumed)
        });
        let first = start["first"].as_u64().context("the reader's first batch is unreadable")?;
        let stream = corpus.stream(tokenizer.clone(), stream_config)?;
        lanes.push(Lane { member: *member, stream, first, done: false });
        sinks.push(pipeline::Sink { writer, process, host: HostId { machine: host.machine, host: member.process } });
    }

    // 8. The loop.
    let budget_batches = spec.max_tokens.map(|tokens| {
        let per_worker = tokens.div_ceil(partition.workers());
        per_worker.div_ceil((compute.reader_rows() * spec.corpus.seq_len) as u64)
    });
    let mut progress = Progress::new(
        host,
        budget_batches.map(|b| b.saturating_mul((compute.reader_rows() * spec.corpus.seq_len) as u64)),
    );
    progress.resumed(committed_tokens);
    // The output path: `--pipeline-depth` steps' worth of reused host buffers (pipeline.rs).
    let sizes = compute.slot_sizes(spec.corpus.seq_len);
    let slots = (0..options.pipeline_depth)
        .map(|_| pipeline::Slot::new(&sizes, |n| compute.host_buffer(n)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    tracing::info!(
        depth = slots.len(),
        bytes_per_step = sizes.iter().flatten().sum::<usize>(),
        pinned = slots.first().is_some_and(pipeline::Slot::pinned),
        "host buffers ready"
    );
    let writes = sinks.iter().any(|sink| sink.writer.is_some());
    let batches = pipeline::Batches {
        dtype: compute.output_dtype(),
        shapes: compute.hook_shapes(spec.corpus.seq_len),
        roles: spec.chat_template.is_some(),
        latents: descriptor.latents.iter().map(|c| (c.name.clone(), c.cap)).collect(),
    };
    // The writers keep rows where they lie until their shards are uploaded: the pool grows by
    // what they may hold.
    let held_steps = sinks
        .iter()
        .zip(&sizes)
        .filter_map(|(sink, member)| match &sink.writer {
            Some((output::Output::Shards(writer), _)) => {
                let (batches, bytes) = writer.holds_at_most();
                // A step of no hook rows (a dictionary's latents alone) lends the writer nothing.
                let held = match member.iter().sum::<usize>() as u64 {
                    0 => 0,
                    step => bytes.div_ceil(step) as usize,
                };
                Some(batches + held + 1)
            }
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let mut pipeline = pipeline::Pipeline::start(slots, options.pipeline_depth + held_steps, sinks, batches)?;
    let started = Instant::now();
    // Test hook: slows the loop down so that tests can kill a host mid-run.
    let slow_batch =
        std::env::var("SIPHON_TEST_SLOW_BATCH_MS").ok().and_then(|v| v.parse().ok()).map(Duration::from_millis);
    // From here SIGTERM stops the loop instead of the process (see siphon_coord::stop).
    let stop = coord.stop_signal();
    stop.arm();
    let mut preempted = false;
    for step in 0u64.. {
        crate::fatal::set_step(step);
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
        let mut batches = Vec::with_capacity(lanes.len());
        for lane in &mut lanes {
            let batch = match lane.done {
                true => None,
                false => lane.next()?,
            };
            let batch = batch.filter(|b| budget_batches.is_none_or(|limit| b.index < limit));
            lane.done = batch.is_none();
            batches.push(batch);
        }
        match step_vote(coord, &compute, &run_name, step, &lanes, &batches) {
            Ok(true) => {}
            Ok(false) => break,
            Err(_) if coord.preempted() => {
                preempted = true;
                break;
            }
            Err(err) => return Err(err),
        }
        // A slot frees up when the writers have taken an earlier step; if the output path
        // failed instead, its error is the job's.
        let more = || pipeline::Slot::new(&sizes, |n| compute.host_buffer(n)).context("host buffers for one more step");
        let slot = match pipeline.slot(more) {
            Ok(slot) => slot,
            Err(err) if pipeline.running() => return Err(err),
            Err(_) => return Err(output_path_failed(pipeline)),
        };
        let launched_at = Instant::now();
        let launched = compute.launch(&batches.iter().map(Option::as_ref).collect::<Vec<_>>())?;
        // Progress counts what this process writes, or, writing nothing, what it feeds.
        let bound = pipeline.timing().bound();
        for ((lane, batch), process) in lanes.iter().zip(&batches).zip(0..) {
            if let Some(batch) = batch
                && (lane.member.writes || (!writes && process == 0))
            {
                progress.batch((batch.len() * batch.seq_len) as u64, bound);
            }
        }
        if pipeline.send(pipeline::Step { launched, slot, batches, launched_at }).is_err() {
            return Err(output_path_failed(pipeline));
        }
    }
    // Every step in flight reaches its writers first.
    tracing::info!(slots = pipeline.slots(), "host buffers used (steps' worth)");
    let (sinks, path) = pipeline.finish()?;
    let mut writing: Vec<(HostId, ShardWriter, u64)> = Vec::new();
    for sink in sinks {
        match sink.writer {
            Some((output::Output::Shards(writer), resumed)) => writing.push((sink.host, writer, resumed)),
            // Preempted, the stream ends with an error for its consumers (the sink dropped).
            Some((output::Output::Stream(streamed), _)) if !preempted => {
                let batches = streamed.finish()?;
                tracing::info!(batches, seconds = started.elapsed().as_secs_f64(), "stream finished");
            }
            _ => {}
        }
    }
    if preempted {
        // Commit the shards the pushed batches complete; the partial one is redone on resume.
        stop.start_deadline();
        let why = coord.job_error().map_or_else(|| "received SIGTERM".to_string(), |e| e.to_string());
        tracing::warn!(reason = %why, "preempted: committing the complete shards, then exiting");
        let mut shards = 0;
        for (_, writer, _) in writing {
            let summary = writer.stop().context("preempted, and committing the complete shards failed")?;
            shards += summary.shards;
        }
        tracing::info!(shards, seconds = started.elapsed().as_secs_f64(), "host stopped (preempted)");
        return Err(anyhow::Error::new(Preempted { message: why, shards: Some(shards) }));
    }
    for (host, writer, resumed) in writing {
        let summary = writer.finish()?;
        progress.finish(&summary);
        let seconds = started.elapsed().as_secs_f64();
        tracing::info!(
            host = host.host,
            shards = summary.shards,
            tokens = summary.tokens,
            kept = summary.included_tokens,
            seconds,
            program_seconds = path.program_s,
            bound = %path.bound(),
            "host finished"
        );
        let timing = timing::HostTiming {
            host: host.dir_name(),
            tokens: summary.tokens.saturating_sub(resumed),
            seconds,
            compute_seconds: path.program_s,
            depth: options.pipeline_depth,
            path,
            writer: summary.timing,
        };
        timing::write_timing(&spec.output, &run_name, host, &timing).context("cannot write the host's timing")?;
    }

    // 9. Completion, statistics, shutdown.
    coord.barrier("complete", BARRIER_TIMEOUT)?;
    if host.host == 0 && !streaming {
        siphon_store::finalize_run(&spec.output, &[], &run_name).context("cannot merge the hosts' statistics")?;
        tracing::info!(output = %spec.output, run = %run_name, "dataset complete");
    }
    coord.shutdown(BARRIER_TIMEOUT)?;
    Ok(())
}

/// Where readers reach each reader's stream (reader `r`, served by its writing member, at index
/// `r`; a host's own when hosts are data-parallel): each writing member of this process says
/// where readers reach its own (`output::advertised`), through the coordinator.
fn stream_producers(
    coord: &Coordination,
    output: &str,
    run: &str,
    machine: u32,
    compute: &Compute,
) -> anyhow::Result<Vec<String>> {
    let key = |h: u32| format!("stream/{run}/{machine}/{h}");
    for member in compute.members().iter().filter(|m| m.writes) {
        let bind = output::bind_address(output, member.reader)?;
        coord.kv_set(&key(member.reader), output::advertised(&bind, &coord.identity().coordinator).as_bytes(), true)?;
    }
    (0..compute.readers()).map(|h| Ok(String::from_utf8(coord.kv_get(&key(h), BARRIER_TIMEOUT)?)?)).collect()
}

/// Whether any member of the job still has a batch for step `step`. Within a host (hosts
/// data-parallel, or every simulated host in this process) that is known here; on a mesh
/// spanning processes every process must enter the step or none, so each votes through the
/// coordinator with its batch's fingerprint (or none) and reads every other process's vote:
/// processes of one reader must hold the same batch. The same check runs on this process's
/// members (simulated hosts of one reader read their slice separately).
fn step_vote(
    coord: &Coordination,
    compute: &Compute,
    run: &str,
    step: u64,
    lanes: &[Lane],
    batches: &[Option<siphon_data::Batch>],
) -> anyhow::Result<bool> {
    let fingerprint =
        |b: &Option<siphon_data::Batch>| b.as_ref().map(|b| format!("{}:{:016x}", b.index, fingerprint(&b.tokens)));
    let mut votes: Vec<(u32, u32, Option<String>)> =
        lanes.iter().zip(batches).map(|(l, b)| (l.member.process, l.member.reader, fingerprint(b))).collect();
    if compute.spans_processes() {
        let me = coord.process_id();
        let machine = coord.identity().machine_id;
        let key = |step: u64, process: u32| format!("step/{run}/{machine}/{step}/{process}");
        coord.kv_set(&key(step, me), serde_json::to_vec(&votes[0].2)?.as_slice(), true)?;
        for (process, &reader) in compute.reader_of().iter().enumerate() {
            let process = process as u32;
            if process != me {
                let vote: Option<String> =
                    serde_json::from_slice(&coord.kv_get(&key(step, process), BARRIER_TIMEOUT)?)?;
                votes.push((process, reader, vote));
            }
        }
        // Every process read step - 1's votes before voting on this one.
        if step >= 2 {
            coord.kv_delete(&key(step - 2, me))?;
        }
    }
    count_votes(step, &votes)
}

/// Whether any vote `(process, reader, batch fingerprint)` of step `step` holds a batch; an
/// error when two processes of one reader hold different batches.
fn count_votes(step: u64, votes: &[(u32, u32, Option<String>)]) -> anyhow::Result<bool> {
    for (i, (process, reader, vote)) in votes.iter().enumerate() {
        if let Some((other, _, theirs)) = votes[..i].iter().find(|(_, r, v)| r == reader && v != vote) {
            anyhow::bail!(
                "collective desync at step {step}: hosts {other} and {process} read the same corpus slice but hold \
                 different batches ({theirs:?} and {vote:?})"
            );
        }
    }
    Ok(votes.iter().any(|(_, _, v)| v.is_some()))
}

/// FNV-1a over token ids: a batch's fingerprint in a step vote.
fn fingerprint(tokens: &[u32]) -> u64 {
    tokens
        .iter()
        .flat_map(|t| t.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// Why the output path stopped taking steps: the drain thread's error (a copy or a writer
/// failed).
fn output_path_failed(pipeline: pipeline::Pipeline) -> anyhow::Error {
    match pipeline.finish() {
        Err(err) => err.context("writing the activations failed"),
        Ok(_) => anyhow::anyhow!("the output path stopped taking steps"),
    }
}

/// The store's latents columns of the run's dictionaries: named as SAELens's
/// `HookedSAETransformer` names them, each described in run.json.
fn latents_columns(dictionaries: &[siphon_models::DictionaryHook], fingerprints: &[String]) -> Vec<LatentsColumn> {
    let names = siphon_models::DictionaryHook::names(dictionaries);
    dictionaries
        .iter()
        .zip(names)
        .zip(fingerprints)
        .map(|((d, name), sha256)| LatentsColumn {
            name,
            hook: d.hook.to_string(),
            width: d.dictionary.d_sae,
            cap: d.cap,
            dictionary: json!({
                "name": d.dictionary.name,
                "source": d.dictionary.source.display().to_string(),
                "d_in": d.dictionary.d_in,
                "encoder": format!("{:?}", d.dictionary.encoder),
                "normalize": format!("{:?}", d.dictionary.normalize),
                "subtract_b_dec": d.dictionary.subtract_b_dec,
                "sha256": sha256,
            }),
        })
        .collect()
}

/// The store's view of a batch: token metadata from the data path (with each token's role,
/// in a run of conversations) plus the hook outputs and the dictionaries' latents.
fn to_store_batch(
    batch: &siphon_data::Batch,
    hooks: Vec<siphon_store::HookActivations>,
    latents: Vec<siphon_store::BatchLatents>,
    roles: bool,
) -> anyhow::Result<BatchActivations> {
    let first_sample = batch.position.sequences - batch.len() as u64;
    Ok(BatchActivations {
        first_sample,
        batch: batch.len(),
        seq: batch.seq_len,
        hooks,
        latents,
        token_ids: batch.tokens.iter().map(|&t| t as i32).collect(),
        doc_index: batch.doc.clone(),
        position: batch.doc_pos.clone(),
        keep: batch.exclude.iter().map(|&e| e == 0).collect(),
        roles: roles.then(|| batch.role.clone()),
        data_position_after: serde_json::to_value(&batch.position)?,
    })
}

fn store_config(spec: &RunSpec, run: &str, host: HostId, give_up_after: Duration) -> anyhow::Result<StoreConfig> {
    let mut config = StoreConfig::new(spec.output.clone(), run, host);
    config.upload.give_up_after = give_up_after;
    config.format = ShardFormat {
        dtype: spec.dtype.parse::<DType>()?,
        target_shard_bytes: spec.shard_bytes,
        keep_excluded: spec.keep_excluded,
        shuffle: spec
            .shuffle_tokens_window
            .map(|window_batches| ShuffleConfig { seed: spec.shuffle_tokens_seed, window_batches }),
        roles: spec.chat_template.is_some(),
    };
    config.validate()?;
    Ok(config)
}

/// A dictionary's identity, which every host must share: sha256 over its encoder's description
/// and its tensors' names, shapes and f32 values, as siphon computes with them (hosts that read
/// different files under one path are caught at the configuration check).
fn dictionary_fingerprint(d: &siphon_models::dictionary::Dictionary) -> String {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(format!("{}|{}|{}|{:?}|{:?}|{}", d.hook, d.d_in, d.d_sae, d.encoder, d.normalize, d.subtract_b_dec));
    for t in &d.tensors {
        hasher.update(format!("|{}{:?}|", t.name, t.shape));
        for chunk in t.values.chunks(1 << 14) {
            hasher.update(chunk.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
        }
    }
    hex_string(&hasher.finalize())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dictionarys_fingerprint_follows_its_values_and_description() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/dictionaries/saelens-topk");
        let d = siphon_models::dictionary::Dictionary::open(&dir, None).unwrap();
        let same = siphon_models::dictionary::Dictionary::open(&dir, None).unwrap();
        assert_eq!(dictionary_fingerprint(&d), dictionary_fingerprint(&same));
        let mut value = d.clone();
        value.tensors[0].values[7] += 1e-6;
        let mut encoder = d.clone();
        encoder.subtract_b_dec = !encoder.subtract_b_dec;
        for other in [value, encoder] {
            assert_ne!(dictionary_fingerprint(&d), dictionary_fingerprint(&other));
        }
    }

    #[test]
    fn a_step_runs_while_any_reader_has_a_batch_and_a_desync_stops_it() {
        let vote = |p, r, v: Option<&str>| (p, r, v.map(str::to_string));
        // Reader 0 (hosts 0, 1) is done, reader 1 (hosts 2, 3) is not: the step runs.
        let votes = [vote(0, 0, None), vote(1, 0, None), vote(2, 1, Some("7:ab")), vote(3, 1, Some("7:ab"))];
        assert!(count_votes(7, &votes).unwrap());
        assert!(!count_votes(8, &[vote(0, 0, None), vote(1, 1, None)]).unwrap());
        // Host 3 read another batch than host 2.
        let votes = [vote(2, 1, Some("7:ab")), vote(3, 1, Some("7:cd")), vote(0, 0, Some("7:ab"))];
        let err = count_votes(7, &votes).unwrap_err().to_string();
        assert!(err.contains("collective desync at step 7: hosts 2 and 3"), "{err}");
        // One host of a reader done, the other not: a desync too.
        assert!(count_votes(9, &[vote(0, 0, Some("9:ab")), vote(1, 0, None)]).is_err());
    }
}
