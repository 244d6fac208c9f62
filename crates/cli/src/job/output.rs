//! Where a writing member's rows go: shards in a store ([`ShardWriter`]), or, with
//! `--output stream://HOST:PORT`, a live stream to the training processes that pull them
//! ([`siphon_stream::StreamSink`]: each batch sent as a shard of its own, no disk between).
//! Reader `r` of a job (each host when hosts are data-parallel; on a mesh spanning hosts, the
//! host that writes for its data group) serves its stream on `HOST:PORT+r`, and every
//! description lists where readers reach them all ([`Endpoints`], exchanged through the
//! coordinator), so that a reader given any one reads every host.

use std::time::Duration;

use anyhow::Context;
use siphon_store::{BatchActivations, HostId, ResumePoint, RunDescriptor, ShardFormat, ShardWriter};
use siphon_stream::{Bounds, Serving, StreamSink};

use crate::args::ClusterArgs;

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

/// How a host serves its stream: holding `bounds`; to readers with the job token when one was
/// given (not one siphon made up, which no reader could know); over TLS with the coordinator's
/// certificate and key when the job has TLS (every host serves, so every host needs them).
pub fn serving(cluster: &ClusterArgs, identity: &siphon_coord::Identity, bounds: Bounds) -> anyhow::Result<Serving> {
    let (token, source) = cluster.job_token(identity)?;
    let token = ClusterArgs::token_is_shared(&source).then_some(token);
    let tls = match cluster.tls()? {
        None => None,
        Some(tls) if tls.can_serve() => Some(tls.server_config()?),
        Some(_) => anyhow::bail!(
            "a stream served with TLS needs --coordinator-cert and --coordinator-key on every host (each serves its \
             own stream)"
        ),
    };
    Ok(Serving { bounds, token, tls })
}

/// Where a host serves its stream, and where readers reach every host of the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoints {
    /// The address this host listens on: `HOST:PORT+h`.
    pub bind: String,
    /// Where readers reach each host, host `h` at index `h`.
    pub producers: Vec<String>,
}

/// Where host `h` listens: the output's `HOST:PORT+h`.
pub fn bind_address(output: &str, h: u32) -> anyhow::Result<String> {
    let addr = siphon_stream::address(output).context("not a stream")?;
    let (host, port) = addr
        .rsplit_once(':')
        .and_then(|(host, p)| Some((host, p.parse::<u16>().ok()?)))
        .with_context(|| format!("--output {output}: give stream://HOST:PORT"))?;
    let port = u16::try_from(h)
        .ok()
        .and_then(|h| port.checked_add(h))
        .with_context(|| format!("--output {output}: host {h} needs port {port}+{h}, past 65535"))?;
    Ok(format!("{host}:{port}"))
}

/// Where readers reach the stream a host listens on at `bind`: the same address, unless it
/// is a wildcard (`0.0.0.0`, `[::]`), which stands for this machine's address on the network
/// that reaches the coordinator (hosts on several VMs each advertise their own). Where that
/// network is this VM's loopback (every host here), the wildcard stays, and readers put the
/// host of the URL they were given in its place.
pub fn advertised(bind: &str, coordinator: &str) -> String {
    let Some((host, port)) = bind.rsplit_once(':') else { return bind.to_string() };
    let wildcard = host.trim_matches(['[', ']']).parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_unspecified());
    if !wildcard {
        return bind.to_string();
    }
    let outward = || -> Option<std::net::IpAddr> {
        let target = std::net::ToSocketAddrs::to_socket_addrs(coordinator).ok()?.next()?;
        let local = if target.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
        // A datagram socket "connected" sends nothing: it only picks the route's address.
        let socket = std::net::UdpSocket::bind(local).ok()?;
        socket.connect(target).ok()?;
        Some(socket.local_addr().ok()?.ip())
    };
    match outward() {
        Some(ip) if !ip.is_loopback() && !ip.is_unspecified() => {
            std::net::SocketAddr::new(ip, port.parse().unwrap_or(0)).to_string()
        }
        _ => bind.to_string(),
    }
}

impl Output {
    /// Opens the output `output` names for host `host`: a stream when it is
    /// `stream://HOST:PORT` (served where and as `stream` says), else the store (`format` and
    /// `patience` are the store's); and where it resumes. A stream starts once every consumer
    /// pulls, where they stand: at [`Output::first_batch`], its data read from the position a
    /// consumer gave.
    pub fn open(
        output: &str,
        run: &str,
        host: HostId,
        descriptor: &RunDescriptor,
        stream: impl FnOnce() -> anyhow::Result<(Endpoints, Serving)>,
        store: impl FnOnce() -> anyhow::Result<siphon_store::StoreConfig>,
    ) -> anyhow::Result<(Output, ResumePoint)> {
        let config = store()?;
        if siphon_stream::address(output).is_none() {
            let writer = ShardWriter::open(config, descriptor.clone()).context("cannot open the output")?;
            let resume_at = writer.resume_point().clone();
            return Ok((Output::Shards(writer), resume_at));
        }
        let (endpoints, serving) = stream()?;
        let Endpoints { bind, producers } = endpoints;
        // Each machine (with its own coordinator) lists its own hosts; readers are given every
        // machine's address.
        let description = serde_json::to_string(&serde_json::json!({
            "run": run,
            "machine": host.machine,
            "machines": descriptor.partition["machines"],
            "producers": producers,
            "model": descriptor.model,
            "hooks": descriptor.hooks,
            "hook_shapes": descriptor.hook_shapes,
            "outputs": descriptor.outputs,
            "format": config.format,
            "config": descriptor.config,
        }))?;
        let sink = StreamSink::serve(&bind, description, serving)?;
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
        let resume_at = ResumePoint { next_shard: 0, next_sample: 0, data_position, committed_tokens: 0 };
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
    fn each_host_serves_on_its_own_port() {
        let binds: Vec<String> = (0..3).map(|h| bind_address("stream://0.0.0.0:7070", h).unwrap()).collect();
        assert_eq!(binds, ["0.0.0.0:7070", "0.0.0.0:7071", "0.0.0.0:7072"]);
        let no_port = bind_address("stream://somewhere", 0).unwrap_err().to_string();
        assert!(no_port.contains("give stream://HOST:PORT"), "{no_port}");
        let past = bind_address("stream://h:65535", 1).unwrap_err().to_string();
        assert!(past.contains("host 1 needs port 65535+1, past 65535"), "{past}");
    }

    #[test]
    fn a_wildcard_is_advertised_as_the_address_that_reaches_the_coordinator() {
        // A named address is where readers go; a wildcard whose coordinator is on this VM's
        // loopback stays a wildcard (readers use the host of their URL).
        assert_eq!(advertised("10.1.2.3:7071", "10.1.2.9:8476"), "10.1.2.3:7071");
        assert_eq!(advertised("0.0.0.0:7071", "127.0.0.1:8476"), "0.0.0.0:7071");
        assert_eq!(advertised("[::]:7071", "localhost:8476"), "[::]:7071");
        // Toward another address, the route's own address (nothing is sent). Where this
        // machine has no route out (a sandbox), the wildcard stays too.
        let out = advertised("0.0.0.0:7071", "192.0.2.1:8476");
        let addr: std::net::SocketAddr = out.parse().unwrap();
        assert_eq!(addr.port(), 7071);
        assert!(out == "0.0.0.0:7071" || !(addr.ip().is_loopback() || addr.ip().is_unspecified()), "{out}");
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
