//! Phase 7, outputs and resume points: each writing member opens its output (shards or a
//! stream) and reads where its manifest stopped; the data position and first batch of each
//! reader go through the key-value store to the reader's other members, and after a barrier
//! every member's [`Lane`] (its corpus slice's batch stream) starts there.

use std::time::Duration;

use anyhow::Context;
use serde_json::json;
use siphon_coord::Coordination;
use siphon_data::{Partition, Positions, Worker};
use siphon_store::{DType, HostId, RunDescriptor, ShardFormat, ShuffleConfig, StoreConfig};

use super::compute::{Compute, Member};
use super::{BARRIER_TIMEOUT, Job, RunSpec, output, pipeline};

/// How every member reads its corpus slice: checked and opened at phase 2.
pub struct Reading {
    pub corpus: siphon_data::Corpus,
    pub tokenizer: std::sync::Arc<siphon_data::Tokenizer>,
    pub pack: siphon_data::PackConfig,
    pub chat: Option<std::sync::Arc<siphon_data::ChatTemplate>>,
}

/// One member's share of the loop: the stream of its reader's corpus slice (its writer, if
/// it writes, is the pipeline's [`pipeline::Sink`]).
pub struct Lane {
    pub member: Member,
    stream: siphon_data::BatchStream,
    /// The first batch it runs: a stream that starts again makes no batch its consumers have.
    first: u64,
    pub done: bool,
}

impl Lane {
    /// The next batch from `first` on (those before are read, not run).
    pub fn next(&mut self) -> anyhow::Result<Option<siphon_data::Batch>> {
        loop {
            match self.stream.next().transpose()? {
                Some(batch) if batch.index < self.first => continue,
                batch => return Ok(batch),
            }
        }
    }
}

/// What the loop starts from: each member's lane and sink, in member order.
pub struct Resumed {
    pub lanes: Vec<Lane>,
    pub sinks: Vec<pipeline::Sink>,
    /// Tokens the writing members' manifests already hold.
    pub committed_tokens: u64,
    /// Each latents column's name and cap, as run.json describes them.
    pub latents: Vec<(String, usize)>,
    /// Whether the output is a live stream (no shards).
    pub streaming: bool,
    pub partition: Partition,
}

/// Opens every writing member's output at its resume point and every member's lane.
pub fn open(job: &Job, compute: &Compute, reading: &Reading, fingerprints: &[String]) -> anyhow::Result<Resumed> {
    let Job { coord, host, spec, run: run_name, options } = *job;
    let partition = Partition { machines: spec.total_machines, hosts: compute.readers() };
    let descriptor = RunDescriptor {
        model: json!({ "path": spec.model, "config": compute.model_config() }),
        hooks: spec.hooks.clone(),
        hook_shapes: compute.hook_shapes(spec.corpus.seq_len),
        latents: super::dictionary::columns(compute.dictionaries(), fingerprints),
        outputs: super::next_token::columns(spec.outputs, compute.dictionaries()),
        mesh: compute.mesh_json(),
        partition: json!({ "machines": partition.machines, "hosts": partition.hosts }),
        config: serde_json::to_value(spec)?,
    };
    let mut writers = Vec::new();
    let mut committed_tokens = 0;
    let streaming = siphon_stream::address(&spec.output).is_some();
    let producers = match streaming {
        true => stream_producers(coord, &spec.output, run_name, host.machine, compute)?,
        false => Vec::new(),
    };
    for member in compute.members().iter().filter(|m| m.writes) {
        let host = HostId { machine: host.machine, host: member.process };
        let store = || store_config(spec, run_name, host, Duration::from_secs_f64(options.store_timeout));
        let stream = || {
            let bind = output::bind_address(&spec.output, member.reader)?;
            let endpoints = output::Endpoints { bind, producers: producers.clone() };
            let bounds = siphon_stream::Bounds { buffer: options.stream_buffer, keep: options.stream_keep };
            Ok((endpoints, output::serving(&options.cluster, coord.identity(), bounds)?))
        };
        let (writer, resume_at) = output::Output::open(&spec.output, run_name, host, &descriptor, stream, store)?;
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
            reading.pack.clone(),
            partition,
            Worker { machine: host.machine, host: member.reader },
        );
        stream_config.batch_size = compute.reader_rows();
        stream_config.chat = reading.chat.clone();
        // A long record is tokenized no further than the budget's tokens.
        stream_config.max_tokens = super::steps::budget_batches(spec, partition, compute.reader_rows())
            .map(|batches| batches.saturating_mul((compute.reader_rows() * spec.corpus.seq_len) as u64));
        stream_config.resume = match position {
            serde_json::Value::Null => None,
            value => Some(serde_json::from_value(value).context("the manifest's data position is unreadable")?),
        };
        let writer = writers.iter().position(|(p, ..)| *p == member.process).map(|i| {
            let (_, writer, resumed) = writers.remove(i);
            (writer, resumed)
        });
        let first = start["first"].as_u64().context("the reader's first batch is unreadable")?;
        let stream = reading.corpus.stream(reading.tokenizer.clone(), stream_config)?;
        lanes.push(Lane { member: *member, stream, first, done: false });
        sinks.push(pipeline::Sink { writer, process, host: HostId { machine: host.machine, host: member.process } });
    }
    let latents = descriptor.latents.iter().map(|c| (c.name.clone(), c.cap)).collect();
    Ok(Resumed { lanes, sinks, committed_tokens, latents, streaming, partition })
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

/// The shard writer's configuration for one writing member.
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
        pooled: spec.positions.as_ref().is_some_and(Positions::pools),
        documents: !spec.keep_columns.is_empty(),
        allow_non_finite: spec.allow_non_finite,
    };
    config.validate()?;
    Ok(config)
}
