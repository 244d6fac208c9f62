//! Where a writing member's rows go: shards in a store ([`ShardWriter`]), or, with
//! `--output stream://HOST:PORT`, a live stream to the training processes that pull them
//! ([`siphon_stream::StreamSink`]: each batch sent as a shard of its own, no disk between).
//! Host `h` of a job serves its stream on `HOST:PORT+h`, and every host's description lists
//! them all, so that a reader given any one reads every host.

use std::time::Duration;

use anyhow::Context;
use siphon_store::{BatchActivations, HostId, ResumePoint, RunDescriptor, ShardFormat, ShardWriter};
use siphon_stream::{Bounds, StreamSink};

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
    /// The index of the next batch.
    next: u64,
}

/// Refuses what a stream does not serve yet: hosts on several machines (each machine would
/// have to advertise its own address) and a mesh spanning hosts, simulated ones included (hosts
/// that do not each write their own rows, so host `h` is not the `h`th writer).
pub fn check_stream(output: &str, machines: u32, spans_hosts: bool) -> anyhow::Result<()> {
    if siphon_stream::address(output).is_none() {
        return Ok(());
    }
    if machines > 1 {
        anyhow::bail!(
            "--output {output}: a stream is served from one machine for now (this job has {machines}); \
             write shards to a store instead"
        );
    }
    if spans_hosts {
        anyhow::bail!(
            "--output {output}: a stream needs hosts that each write their own rows; this job's mesh spans \
             hosts: write shards to a store instead"
        );
    }
    Ok(())
}

/// Where each of `hosts` hosts serves the stream `output` names: `HOST:PORT+h`.
fn stream_addresses(output: &str, hosts: u32) -> anyhow::Result<Vec<String>> {
    let addr = siphon_stream::address(output).context("not a stream")?;
    let (host, port) = addr
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
        .with_context(|| format!("--output {output}: give stream://HOST:PORT"))?;
    (0..hosts)
        .map(|h| {
            let port = port.checked_add(u16::try_from(h).ok()?)?;
            Some(format!("{host}:{port}"))
        })
        .collect::<Option<Vec<_>>>()
        .with_context(|| format!("--output {output}: {hosts} hosts need ports {port}..{port}+{hosts}"))
}

impl Output {
    /// Opens the output `output` names for host `host` of `hosts`: a stream when it is
    /// `stream://HOST:PORT` (holding at most `bounds` batches), else the store (`format` and
    /// `patience` are the store's); and where it resumes. A stream starts once every consumer
    /// pulls, where they stand: at [`Output::first_batch`], its data read from the position a
    /// consumer gave.
    pub fn open(
        output: &str,
        run: &str,
        (host, hosts): (HostId, u32),
        descriptor: &RunDescriptor,
        bounds: Bounds,
        store: impl FnOnce() -> anyhow::Result<siphon_store::StoreConfig>,
    ) -> anyhow::Result<(Output, ResumePoint)> {
        let config = store()?;
        if siphon_stream::address(output).is_none() {
            let writer = ShardWriter::open(config, descriptor.clone()).context("cannot open the output")?;
            let resume_at = writer.resume_point().clone();
            return Ok((Output::Shards(writer), resume_at));
        }
        let producers = stream_addresses(output, hosts)?;
        let description = serde_json::to_string(&serde_json::json!({
            "run": run,
            "producers": producers,
            "model": descriptor.model,
            "hooks": descriptor.hooks,
            "hook_shapes": descriptor.hook_shapes,
            "format": config.format,
            "config": descriptor.config,
        }))?;
        let addr = producers.get(host.host as usize).with_context(|| format!("host {host:?} of {hosts}"))?;
        let sink = StreamSink::serve(addr, description, bounds)?;
        let patience = config.upload.give_up_after;
        tracing::info!(addr = %sink.addr(), "waiting for every consumer of the stream to pull");
        let start = sink.start(patience)?;
        let data_position = match start.resume {
            None => None,
            Some((at, position)) => Some(consumer_position(at, &position)?),
        };
        let streamed = Streamed {
            sink,
            run: run.to_string(),
            descriptor: descriptor.clone(),
            host,
            format: config.format,
            patience,
            next: start.first,
        };
        let resume_at = ResumePoint { next_shard: start.first, next_sample: 0, data_position, committed_tokens: 0 };
        Ok((Output::Stream(streamed), resume_at))
    }

    /// The first batch of the host's data it takes: a stream's start; 0 for shards (which
    /// resume from their data position alone).
    pub fn first_batch(&self) -> u64 {
        match self {
            Output::Shards(_) => 0,
            Output::Stream(streamed) => streamed.next,
        }
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
                let position = batch.data_position_after.to_string();
                let shard = siphon_store::batch_shard(&s.run, &s.descriptor, s.host, &s.format, s.next, batch)?;
                s.sink.push(s.next, shard, position, s.patience)?;
                s.next += 1;
                Ok(())
            }
        }
    }
}

/// The data position a consumer gave for batch `at` (the one after its batch that carried
/// it), checked to be that batch's.
fn consumer_position(at: u64, position: &str) -> anyhow::Result<serde_json::Value> {
    let value: serde_json::Value = serde_json::from_str(position).with_context(|| {
        format!("a consumer of the stream gave an unreadable data position for batch {at}: {position}")
    })?;
    let batches = value.get("batches").and_then(serde_json::Value::as_u64);
    anyhow::ensure!(
        batches == Some(at),
        "a consumer of the stream gave a data position for batch {batches:?} as batch {at}'s: is it reading another run?"
    );
    Ok(value)
}

impl Streamed {
    /// Ends the stream once every consumer has been sent its last batch; the batches made.
    pub fn finish(self) -> anyhow::Result<u64> {
        Ok(self.sink.finish(self.patience)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_host_serves_on_its_own_port_and_what_a_stream_lacks_is_refused_by_name() {
        assert_eq!(
            stream_addresses("stream://0.0.0.0:7070", 3).unwrap(),
            ["0.0.0.0:7070", "0.0.0.0:7071", "0.0.0.0:7072"]
        );
        let no_port = stream_addresses("stream://somewhere", 1).unwrap_err().to_string();
        assert!(no_port.contains("give stream://HOST:PORT"), "{no_port}");
        let past = stream_addresses("stream://h:65535", 2).unwrap_err().to_string();
        assert!(past.contains("2 hosts need ports 65535"), "{past}");
        check_stream("gs://bucket/out", 4, true).unwrap();
        check_stream("stream://h:1", 1, false).unwrap();
        let machines = check_stream("stream://h:1", 2, false).unwrap_err().to_string();
        assert!(machines.contains("from one machine for now (this job has 2)"), "{machines}");
        let spans = check_stream("stream://h:1", 1, true).unwrap_err().to_string();
        assert!(spans.contains("mesh spans hosts"), "{spans}");
    }

    #[test]
    fn a_consumers_data_position_must_be_that_of_the_batch_it_continues() {
        let position = r#"{"plan": "p", "batches": 7, "sequences": 56}"#;
        assert_eq!(consumer_position(7, position).unwrap()["sequences"], 56);
        let other = consumer_position(6, position).unwrap_err().to_string();
        assert!(other.contains("a data position for batch Some(7) as batch 6's"), "{other}");
        let garbled = consumer_position(7, "{plan").unwrap_err().to_string();
        assert!(garbled.contains("unreadable data position for batch 7"), "{garbled}");
    }
}
