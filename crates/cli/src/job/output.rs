//! Where a writing member's rows go: shards in a store ([`ShardWriter`]), or, with
//! `--output stream://HOST:PORT`, a live stream to the training processes that pull them
//! ([`siphon_stream::StreamSink`]: each batch sent as a shard of its own, no disk between).

use std::time::Duration;

use anyhow::Context;
use siphon_store::{BatchActivations, HostId, ResumePoint, RunDescriptor, ShardFormat, ShardWriter};
use siphon_stream::StreamSink;

/// A member's output.
pub enum Output {
    /// Shards in a store.
    Shards(ShardWriter),
    /// A live stream.
    Stream(Streamed),
}

/// A live stream and what turns a batch into its message.
pub struct Streamed {
    sink: StreamSink,
    run: String,
    descriptor: RunDescriptor,
    host: HostId,
    format: ShardFormat,
    /// How long a push or the end waits for the consumers (the store timeout).
    patience: Duration,
    batches: u64,
}

/// Refuses a stream written by several processes or members (`writers`): one host serves it
/// for now.
pub fn one_streaming_host(output: &str, writers: usize) -> anyhow::Result<()> {
    if siphon_stream::address(output).is_some() && writers > 1 {
        anyhow::bail!(
            "--output {output}: a stream is served by one host writing alone for now (this job has {writers} \
             writing processes); write shards to a store instead, or run one host"
        );
    }
    Ok(())
}

/// Batches a stream keeps for consumers that have not pulled them yet.
const STREAM_CAPACITY: usize = 8;

impl Output {
    /// Opens the output `output` names: a stream when it is `stream://HOST:PORT`, else the
    /// store (`format` and `patience` are the store's), and where it resumes.
    pub fn open(
        output: &str,
        run: &str,
        host: HostId,
        descriptor: &RunDescriptor,
        store: impl FnOnce() -> anyhow::Result<siphon_store::StoreConfig>,
    ) -> anyhow::Result<(Output, ResumePoint)> {
        let config = store()?;
        let Some(addr) = siphon_stream::address(output) else {
            let writer = ShardWriter::open(config, descriptor.clone()).context("cannot open the output")?;
            let resume_at = writer.resume_point().clone();
            return Ok((Output::Shards(writer), resume_at));
        };
        let description = serde_json::to_string(&serde_json::json!({
            "run": run,
            "model": descriptor.model,
            "hooks": descriptor.hooks,
            "hook_shapes": descriptor.hook_shapes,
            "format": config.format,
            "config": descriptor.config,
        }))?;
        let sink = StreamSink::serve(addr, description, STREAM_CAPACITY)?;
        let streamed = Streamed {
            sink,
            run: run.to_string(),
            descriptor: descriptor.clone(),
            host,
            format: config.format,
            patience: config.upload.give_up_after,
            batches: 0,
        };
        let start = ResumePoint { next_shard: 0, next_sample: 0, data_position: None, committed_tokens: 0 };
        Ok((Output::Stream(streamed), start))
    }

    /// The hooks it takes, in order.
    pub fn hooks(&self) -> &[String] {
        match self {
            Output::Shards(writer) => writer.hooks(),
            Output::Stream(streamed) => &streamed.descriptor.hooks,
        }
    }

    /// Takes the next batch.
    pub fn push(&mut self, batch: BatchActivations) -> anyhow::Result<()> {
        match self {
            Output::Shards(writer) => Ok(writer.push(batch)?),
            Output::Stream(s) => {
                let shard = siphon_store::batch_shard(&s.run, &s.descriptor, s.host, &s.format, s.batches, batch)?;
                s.sink.push(shard, s.patience)?;
                s.batches += 1;
                Ok(())
            }
        }
    }
}

impl Streamed {
    /// Ends the stream once every consumer has been sent its last batch; the batches sent.
    pub fn finish(self) -> anyhow::Result<u64> {
        Ok(self.sink.finish(self.patience)?)
    }
}
