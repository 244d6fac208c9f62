//! The live output (`siphon extract --output stream://HOST:PORT`): a host's batches served
//! over gRPC to the training processes that read them, with no disk between.
//!
//! Each batch travels as a shard of its own in the store's format (`siphon_store::batch_shard`),
//! so a reader parses it as it parses a shard. Batch `k` (numbered from 0 in the order the
//! host makes them) goes to consumer `k mod n` of the `n` consumers that pull
//! (`proto/stream.proto`), each consumer's batches in order, each sent once. The host keeps at
//! most `capacity` batches that no consumer has been sent: [`StreamSink::push`] waits while
//! that many do, so the consumers set the pace and memory stays bounded.
//! [`StreamSink::finish`] waits until every consumer has been sent its last batch.
//!
//! Each host of a job serves its own stream; a reader merges them (`siphon.stream`). Not yet
//! built: a consumer or a producer that restarts (a batch sent is gone), TLS.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{oneshot, watch};
use tonic::{Request, Response, Status};

#[allow(missing_docs)]
mod pb {
    tonic::include_proto!("siphon.stream");
}

pub use pb::stream_client::StreamClient;
pub use pb::{Batch, DescribeRequest, Description, PullRequest};

/// The scheme of a stream output: `stream://HOST:PORT`.
pub const SCHEME: &str = "stream://";

/// The `HOST:PORT` a stream output is served on, when `output` is one.
pub fn address(output: &str) -> Option<&str> {
    output.strip_prefix(SCHEME)
}

/// What can go wrong serving a stream.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The address cannot be listened on.
    #[error("cannot serve the stream on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The consumers did not take the batches in time.
    #[error("{0}")]
    Stalled(String),
    /// The gRPC server failed.
    #[error("the stream's server failed: {0}")]
    Server(String),
}

/// Serves a host's batches to the consumers that pull them; see the crate's documentation.
pub struct StreamSink {
    shared: Arc<Shared>,
    addr: SocketAddr,
    runtime: tokio::runtime::Runtime,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl StreamSink {
    /// Serves the run `description` (run.json's fields, as JSON) on `addr` (`HOST:PORT`; port
    /// 0 takes a free one, [`StreamSink::addr`]), keeping at most `capacity` batches unsent.
    pub fn serve(addr: &str, description: String, capacity: usize) -> Result<StreamSink, StreamError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("siphon-stream")
            .enable_all()
            .build()
            .map_err(|e| StreamError::Server(e.to_string()))?;
        let bind = |source| StreamError::Bind { addr: addr.to_string(), source };
        let listener = runtime.block_on(tokio::net::TcpListener::bind(addr)).map_err(bind)?;
        let local = listener.local_addr().map_err(bind)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            taken: Condvar::new(),
            changed: watch::Sender::new(0),
            capacity: capacity.max(1),
            description,
        });
        let service = pb::stream_server::StreamServer::new(Service { shared: Arc::clone(&shared) });
        let (shutdown, stop) = oneshot::channel::<()>();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let server = runtime.spawn(
            tonic::transport::Server::builder().add_service(service).serve_with_incoming_shutdown(incoming, async {
                let _ = stop.await;
            }),
        );
        tracing::info!(addr = %local, capacity, "serving the stream");
        Ok(StreamSink { shared, addr: local, runtime, shutdown: Some(shutdown), server: Some(server) })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Hands on the next batch (`shard`: the batch as a shard of its own), waiting while
    /// `capacity` batches wait for their consumers; `patience` bounds the wait.
    pub fn push(&self, shard: Bytes, patience: Duration) -> Result<(), StreamError> {
        let deadline = Instant::now() + patience;
        let (mut state, mut in_time) = (self.shared.lock(), true);
        while state.pending.len() >= self.shared.capacity {
            if !in_time {
                let who = match state.consumers {
                    Some(n) => format!("{n} consumers pull"),
                    None => "no consumer has connected".into(),
                };
                return Err(StreamError::Stalled(format!(
                    "no consumer took a batch of the stream on {} for {patience:?} ({} batches wait; {who})",
                    self.addr,
                    state.pending.len()
                )));
            }
            (state, in_time) = self.shared.wait(state, deadline);
        }
        let index = state.made;
        state.pending.insert(index, shard);
        state.made += 1;
        drop(state);
        self.shared.bump();
        Ok(())
    }

    /// Ends the stream after the batches pushed: waits (at most `patience`) until every
    /// consumer has been sent its last batch, then stops serving. Returns the batches made.
    pub fn finish(mut self, patience: Duration) -> Result<u64, StreamError> {
        self.shared.lock().finished = true;
        self.shared.bump();
        let deadline = Instant::now() + patience;
        let (mut state, mut in_time) = (self.shared.lock(), true);
        while !state.delivered() {
            if !in_time {
                let waiting: Vec<String> = match state.consumers {
                    None => vec!["no consumer has connected".into()],
                    Some(n) => (0..n as usize)
                        .filter(|&c| !state.ended[c])
                        .map(|c| format!("consumer {c} of {n} has not taken its last batches"))
                        .collect(),
                };
                return Err(StreamError::Stalled(format!(
                    "the stream on {} did not end within {patience:?}: {}",
                    self.addr,
                    waiting.join("; ")
                )));
            }
            (state, in_time) = self.shared.wait(state, deadline);
        }
        let made = state.made;
        drop(state);
        self.stop()?;
        Ok(made)
    }

    fn stop(&mut self) -> Result<(), StreamError> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        match self.server.take() {
            Some(server) => match self.runtime.block_on(server) {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(StreamError::Server(e.to_string())),
                Err(e) => Err(StreamError::Server(e.to_string())),
            },
            None => Ok(()),
        }
    }
}

/// A sink dropped before [`StreamSink::finish`] (the job failed or was preempted) ends every
/// consumer's stream with an error saying so, never as if the run were complete.
impl Drop for StreamSink {
    fn drop(&mut self) {
        if self.shutdown.is_some() {
            self.shared.lock().failed = Some(format!("the producer on {} stopped before its last batch", self.addr));
            self.shared.bump();
        }
        let _ = self.stop();
    }
}

#[derive(Default)]
struct State {
    /// How many consumers pull, fixed by the first pull.
    consumers: Option<u32>,
    /// Batches made and not yet sent, by index.
    pending: BTreeMap<u64, Bytes>,
    /// Batches made.
    made: u64,
    /// Per consumer, the index of the next batch it is sent.
    next: Vec<u64>,
    /// Per consumer, whether its stream has ended.
    ended: Vec<bool>,
    /// No batch comes after those made.
    finished: bool,
    /// Why the producer stopped before its last batch.
    failed: Option<String>,
}

impl State {
    fn delivered(&self) -> bool {
        self.consumers.is_some() && self.ended.iter().all(|e| *e)
    }
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a batch is taken or a stream ends.
    taken: Condvar,
    /// Bumped when a batch is made or the stream finishes.
    changed: watch::Sender<u64>,
    capacity: usize,
    description: String,
}

/// What a consumer's stream does next.
enum Next {
    Send(u64, Bytes),
    End,
    Fail(String),
    Wait,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits for a batch to be taken or a stream to end, until `deadline`; the state, and
    /// whether the deadline is still ahead (the caller looks at the state once more either way).
    fn wait<'g>(&self, state: MutexGuard<'g, State>, deadline: Instant) -> (MutexGuard<'g, State>, bool) {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else { return (state, false) };
        let (state, timeout) = self.taken.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner());
        (state, !timeout.timed_out())
    }

    /// Wakes the consumers' streams: a batch was made, or the stream finished or failed.
    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    fn join(&self, consumer: u32, consumers: u32) -> Result<(), Status> {
        if consumers == 0 || consumer >= consumers {
            return Err(Status::invalid_argument(format!(
                "consumer {consumer} of {consumers}: not 0 <= consumer < consumers"
            )));
        }
        let mut state = self.lock();
        match state.consumers {
            None => {
                state.consumers = Some(consumers);
                state.next = (0..u64::from(consumers)).collect();
                state.ended = vec![false; consumers as usize];
            }
            Some(n) if n != consumers => {
                return Err(Status::failed_precondition(format!(
                    "this stream is read by {n} consumers; the pull says {consumers}"
                )));
            }
            Some(_) => {}
        }
        Ok(())
    }

    fn next(&self, consumer: u32) -> Next {
        let mut state = self.lock();
        let n = u64::from(state.consumers.expect("joined before pulling"));
        let c = consumer as usize;
        let k = state.next[c];
        if let Some(why) = state.failed.clone() {
            state.ended[c] = true;
            return Next::Fail(why);
        }
        if let Some(shard) = state.pending.remove(&k) {
            state.next[c] += n;
            self.taken.notify_all();
            return Next::Send(k, shard);
        }
        if state.finished && k >= state.made {
            state.ended[c] = true;
            self.taken.notify_all();
            return Next::End;
        }
        Next::Wait
    }
}

struct Service {
    shared: Arc<Shared>,
}

type PullStream = Pin<Box<dyn futures::Stream<Item = Result<Batch, Status>> + Send>>;

#[tonic::async_trait]
impl pb::stream_server::Stream for Service {
    async fn describe(&self, _: Request<DescribeRequest>) -> Result<Response<Description>, Status> {
        Ok(Response::new(Description { run_json: self.shared.description.clone() }))
    }

    type PullStream = PullStream;

    async fn pull(&self, request: Request<PullRequest>) -> Result<Response<PullStream>, Status> {
        let PullRequest { consumer, consumers } = request.into_inner();
        self.shared.join(consumer, consumers)?;
        tracing::info!(consumer, consumers, "a consumer pulls");
        let changed = self.shared.changed.subscribe();
        let batches = futures::stream::unfold(Some((Arc::clone(&self.shared), changed)), move |state| async move {
            let (shared, mut changed) = state?;
            loop {
                // Seen before looking, so that a change after the look wakes the wait.
                changed.borrow_and_update();
                match shared.next(consumer) {
                    Next::Send(index, shard) => return Some((Ok(Batch { index, shard }), Some((shared, changed)))),
                    Next::End => return None,
                    // One error, then the end.
                    Next::Fail(why) => return Some((Err(Status::aborted(why)), None)),
                    Next::Wait => {
                        if changed.changed().await.is_err() {
                            return None;
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(batches)))
    }
}
