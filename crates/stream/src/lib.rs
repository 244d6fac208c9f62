//! The live output (`siphon extract --output stream://HOST:PORT`): a host's batches served
//! over gRPC to the training processes that read them, with no disk between.
//!
//! Each batch travels as a shard of its own in the store's format (`siphon_store::batch_shard`),
//! so a reader parses it as it parses a shard, with the data position after it. Batch `k`
//! (numbered from 0 in the order the host makes them) goes to consumer `k mod n` of the `n`
//! consumers that pull (`proto/stream.proto`), each consumer's batches in order.
//!
//! Memory is bounded ([`Bounds`]): the host holds at most `buffer` batches that are not yet
//! sent ([`StreamSink::push`] waits while that many are, so the consumers set the pace) and
//! the last `keep` batches it sent, for a consumer that restarts from a checkpoint and pulls
//! again from an earlier batch. A producer that restarts holds nothing: it waits until every
//! consumer has pulled ([`StreamSink::start`]), each saying its next batch and the data
//! position of the batch before, and makes the batches again from the earliest one any
//! consumer needs. Consumers that outlive a producer pull again when it is back, so neither
//! side's restart loses or repeats a batch. [`StreamSink::finish`] waits until every consumer
//! has been sent its last batch.
//!
//! Each host of a job serves its own stream; a reader merges them (`siphon.stream`). Calls carry
//! the job token when the job has one, over TLS when it has the coordinator's ([`Serving`]).

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
    /// The consumers did not pull, or take the batches, in time.
    #[error("{0}")]
    Stalled(String),
    /// The gRPC server failed.
    #[error("the stream's server failed: {0}")]
    Server(String),
    /// Batches pushed before the start, or out of order.
    #[error("{0}")]
    Order(String),
}

/// The batches a host holds (see the crate's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Made and not yet sent: the producer waits while this many are.
    pub buffer: usize,
    /// Sent, kept for consumers that pull them again.
    pub keep: usize,
}

/// How a host serves its stream: what it holds, and who may read it.
#[derive(Clone, Debug)]
pub struct Serving {
    /// The batches it holds.
    pub bounds: Bounds,
    /// The job token every call must carry (in [`TOKEN_HEADER`]); `None`: any caller.
    pub token: Option<String>,
    /// Serve over TLS with this certificate and key.
    pub tls: Option<tonic::transport::ServerTlsConfig>,
}

/// The metadata key of the job token, as the coordinator's.
pub const TOKEN_HEADER: &str = "x-siphon-job-token";

/// Where a producer starts, from what its consumers said when they pulled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Start {
    /// The first batch to push: the earliest any consumer needs.
    pub first: u64,
    /// The data position a consumer gave with the batch `at` (`at <= first`) it continues:
    /// the host's data is read from there, batches before `first` are not pushed. `None`: from
    /// the start of the host's data.
    pub resume: Option<(u64, String)>,
}

/// How long consumers' streams get to end when the producer stops serving.
const GRACE: Duration = Duration::from_secs(2);

/// The most consumers a stream is read by: a pull naming more is refused before the host
/// makes room for each of them.
pub const MAX_CONSUMERS: u32 = 1 << 16;

/// The first batch index a pull may not start from (2^53, the largest integer JSON carries
/// exactly): no run makes that many batches, and the indices that follow a start stay far from
/// overflowing.
pub const MAX_START: u64 = 1 << 53;

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
    /// 0 takes a free one, [`StreamSink::addr`]), as `serving` says.
    pub fn serve(addr: &str, description: String, serving: Serving) -> Result<StreamSink, StreamError> {
        let Serving { bounds, token, tls } = serving;
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
            bounds: Bounds { buffer: bounds.buffer.max(1), keep: bounds.keep },
            description,
        });
        let (secured, checked) = (tls.is_some(), token.is_some());
        let service = pb::stream_server::StreamServer::with_interceptor(
            Service { shared: Arc::clone(&shared) },
            move |request: Request<()>| check_token(token.as_deref(), request),
        );
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).map_err(|e| StreamError::Server(format!("TLS: {e}")))?;
        }
        let (shutdown, stop) = oneshot::channel::<()>();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let server = runtime.spawn(builder.add_service(service).serve_with_incoming_shutdown(incoming, async {
            let _ = stop.await;
        }));
        tracing::info!(addr = %local, buffer = bounds.buffer, keep = bounds.keep, tls = secured, token = checked, "serving the stream");
        Ok(StreamSink { shared, addr: local, runtime, shutdown: Some(shutdown), server: Some(server) })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits (at most `patience`) until every consumer has pulled, and says where the batches
    /// start: at the earliest batch a consumer needs (0 on a first run), read from the latest
    /// data position a consumer gave at or before it.
    pub fn start(&self, patience: Duration) -> Result<Start, StreamError> {
        let deadline = Instant::now() + patience;
        let (mut state, mut in_time) = (self.shared.lock(), true);
        while !state.all_joined() {
            if !in_time {
                let who = match state.consumers {
                    None => "no consumer has pulled".to_string(),
                    Some(n) => {
                        let missing: Vec<String> =
                            (0..n as usize).filter(|&c| state.joined[c].is_none()).map(|c| c.to_string()).collect();
                        format!("consumer(s) {} of {n} have not pulled", missing.join(", "))
                    }
                };
                return Err(StreamError::Stalled(format!(
                    "the stream on {} did not start within {patience:?}: {who}",
                    self.addr
                )));
            }
            (state, in_time) = self.shared.wait(state, deadline);
        }
        let start = state.begin();
        drop(state);
        tracing::info!(first = start.first, from = ?start.resume.as_ref().map(|r| r.0), "every consumer pulls");
        Ok(start)
    }

    /// Hands on batch `index` (the one after the last pushed, the first from [`Start`]):
    /// `shard`, the batch as a shard of its own, and `position`, where the data continues
    /// after it. Waits while `buffer` batches wait for their consumers; `patience` bounds the
    /// wait.
    pub fn push(&self, index: u64, shard: Bytes, position: String, patience: Duration) -> Result<(), StreamError> {
        let deadline = Instant::now() + patience;
        let (mut state, mut in_time) = (self.shared.lock(), true);
        if !state.started || index != state.made {
            return Err(StreamError::Order(format!(
                "batch {index} pushed to the stream on {} where {} comes next",
                self.addr,
                if state.started { state.made.to_string() } else { "the start".into() }
            )));
        }
        while state.unsent() >= self.shared.bounds.buffer {
            if !in_time {
                return Err(StreamError::Stalled(format!(
                    "no consumer took a batch of the stream on {} for {patience:?} ({} batches wait; {} consumers pull)",
                    self.addr,
                    state.unsent(),
                    state.next.len()
                )));
            }
            (state, in_time) = self.shared.wait(state, deadline);
        }
        state.add(index, Held { shard, position });
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
                let n = state.next.len();
                let waiting: Vec<String> = match n {
                    0 => vec!["no consumer has pulled".into()],
                    _ => (0..n)
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
        self.stop(GRACE)?;
        Ok(made)
    }

    /// Stops serving: the consumers' streams end within `grace`, or are cut off (a consumer
    /// that stopped reading must not hold the producer).
    fn stop(&mut self, grace: Duration) -> Result<(), StreamError> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        let Some(mut server) = self.server.take() else { return Ok(()) };
        match self.runtime.block_on(async { tokio::time::timeout(grace, &mut server).await }) {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(StreamError::Server(e.to_string())),
            Ok(Err(e)) => Err(StreamError::Server(e.to_string())),
            Err(_) => {
                server.abort();
                Ok(())
            }
        }
    }
}

/// A sink dropped before [`StreamSink::finish`] (the job failed or was preempted) ends every
/// consumer's stream with an error saying so, never as if the run were complete; consumers
/// pull again if the producer comes back.
impl Drop for StreamSink {
    fn drop(&mut self) {
        if self.shutdown.is_some() {
            self.shared.lock().failed = Some(format!("the producer on {} stopped before its last batch", self.addr));
            self.shared.bump();
        }
        let _ = self.stop(GRACE);
    }
}

/// Lets a call through when it carries the job token (constant-time compare), or when there
/// is none to carry.
fn check_token(token: Option<&str>, request: Request<()>) -> Result<Request<()>, Status> {
    let Some(token) = token else { return Ok(request) };
    let given = request.metadata().get(TOKEN_HEADER).map(|v| v.as_bytes()).unwrap_or_default();
    let same = given.len() == token.len() && given.iter().zip(token.as_bytes()).fold(0, |d, (a, b)| d | (a ^ b)) == 0;
    if !same {
        tracing::warn!(peer = ?request.remote_addr(), "refused a stream call with a missing or wrong job token");
        return Err(Status::unauthenticated("missing or wrong job token"));
    }
    Ok(request)
}

/// A batch the host holds.
struct Held {
    shard: Bytes,
    position: String,
}

#[derive(Default)]
struct State {
    /// How many consumers pull, fixed by the first pull.
    consumers: Option<u32>,
    /// Per consumer, its latest pull's start and position; before the start, what the start
    /// is made from.
    joined: Vec<Option<(u64, String)>>,
    /// Whether [`StreamSink::start`] has said where the batches start.
    started: bool,
    /// The batches held, by index: not yet sent, or among the last `keep` sent.
    held: BTreeMap<u64, Held>,
    /// The index of the next batch made.
    made: u64,
    /// Per consumer, the index of the next batch it is sent.
    next: Vec<u64>,
    /// Per consumer, its earliest batch that can still be sent (those before are gone).
    kept_from: Vec<u64>,
    /// Per consumer, its pulls so far: only the latest one is served.
    pulls: Vec<u64>,
    /// Per consumer, whether its stream has ended.
    ended: Vec<bool>,
    /// No batch comes after those made.
    finished: bool,
    /// Why the producer stopped before its last batch.
    failed: Option<String>,
}

impl State {
    fn all_joined(&self) -> bool {
        self.consumers.is_some() && self.joined.iter().all(Option::is_some)
    }

    fn delivered(&self) -> bool {
        self.started && self.ended.iter().all(|e| *e)
    }

    /// The next batch sent to the consumer of batch `k`.
    fn next_of(&self, k: u64) -> u64 {
        self.next[(k % self.next.len() as u64) as usize]
    }

    fn unsent(&self) -> usize {
        self.held.keys().filter(|&&k| k >= self.next_of(k)).count()
    }

    /// Starts where the consumers' pulls say (all have pulled); see [`StreamSink::start`].
    fn begin(&mut self) -> Start {
        let n = self.joined.len() as u64;
        let pulls: Vec<(u64, String)> = self.joined.iter().map(|j| j.clone().expect("every consumer pulled")).collect();
        let first = pulls.iter().map(|(start, _)| *start).min().unwrap_or(0);
        // A consumer's position follows its batch before `start`: it is batch `start - n + 1`'s.
        let resume = pulls
            .iter()
            .filter(|(start, position)| *start >= n && !position.is_empty())
            .map(|(start, position)| (start - n + 1, position.clone()))
            .filter(|(at, _)| *at <= first)
            .max_by_key(|(at, _)| *at);
        self.next = pulls.iter().map(|(start, _)| *start).collect();
        self.kept_from = self.next.clone();
        self.made = first;
        self.started = true;
        Start { first, resume }
    }

    /// Takes batch `index`, the next one made (the producer waited for room).
    fn add(&mut self, index: u64, held: Held) {
        // A batch its consumer already has (it pulled from a later one) is not held.
        if index >= self.next_of(index) {
            self.held.insert(index, held);
        }
        self.made += 1;
    }

    /// Forgets the oldest batches sent while more than `keep` are held.
    fn trim(&mut self, keep: usize) {
        let n = self.next.len() as u64;
        let sent: Vec<u64> = self.held.keys().copied().filter(|&k| k < self.next_of(k)).collect();
        for &k in sent.iter().take(sent.len().saturating_sub(keep)) {
            self.held.remove(&k);
            let c = (k % n) as usize;
            self.kept_from[c] = self.kept_from[c].max(k + n);
        }
    }
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a consumer pulls, a batch is taken or a stream ends.
    taken: Condvar,
    /// Bumped when a batch is made or the stream finishes.
    changed: watch::Sender<u64>,
    bounds: Bounds,
    description: String,
}

/// What a consumer's stream does next.
enum Next {
    Send(Batch),
    End,
    Fail(Status),
    Wait,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits for a pull, a batch taken or a stream ended, until `deadline`; the state, and
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

    /// Counts a pull; returns its number among the consumer's pulls.
    fn join(&self, pull: &PullRequest) -> Result<u64, Status> {
        let &PullRequest { consumer, consumers, start, ref position } = pull;
        if consumers == 0 || consumer >= consumers || start % u64::from(consumers) != u64::from(consumer) {
            return Err(Status::invalid_argument(format!(
                "consumer {consumer} of {consumers} from batch {start}: not 0 <= consumer < consumers with \
                 start = consumer mod consumers"
            )));
        }
        if consumers > MAX_CONSUMERS {
            return Err(Status::invalid_argument(format!(
                "consumer {consumer} of {consumers}: a stream is read by at most {MAX_CONSUMERS} consumers"
            )));
        }
        if start >= MAX_START {
            return Err(Status::invalid_argument(format!(
                "consumer {consumer} of {consumers} pulls from batch {start}: batch indices stop below {MAX_START}"
            )));
        }
        let mut state = self.lock();
        match state.consumers {
            None => {
                state.consumers = Some(consumers);
                state.joined = vec![None; consumers as usize];
                state.pulls = vec![0; consumers as usize];
                state.ended = vec![false; consumers as usize];
            }
            Some(n) if n != consumers => {
                return Err(Status::failed_precondition(format!(
                    "this stream is read by {n} consumers; the pull says {consumers}"
                )));
            }
            Some(_) => {}
        }
        let c = consumer as usize;
        if state.started {
            if start > state.next[c] {
                return Err(Status::failed_precondition(format!(
                    "consumer {consumer} of {consumers} pulls from batch {start}, but was sent none from batch {} on: \
                     is it reading another run?",
                    state.next[c]
                )));
            }
            if start < state.kept_from[c] {
                return Err(Status::failed_precondition(format!(
                    "batch {start} (consumer {consumer} of {consumers}) is no longer held: this producer keeps the last \
                     {} batches it sent. Restart it with the same command: it makes the batches again from where its \
                     consumers stand",
                    self.bounds.keep
                )));
            }
            state.next[c] = start;
            state.ended[c] = false;
        }
        state.joined[c] = Some((start, position.clone()));
        state.pulls[c] += 1;
        let pull = state.pulls[c];
        drop(state);
        self.taken.notify_all();
        // An earlier pull of the consumer, waiting for a batch, ends.
        self.bump();
        Ok(pull)
    }

    fn next(&self, consumer: u32, pull: u64) -> Next {
        let mut state = self.lock();
        let c = consumer as usize;
        if state.pulls[c] != pull {
            // Not an end: a reader still on it (two readers said they are the same consumer)
            // must not take it for the end of its batches.
            let n = state.next.len().max(state.joined.len());
            return Next::Fail(Status::failed_precondition(format!(
                "consumer {consumer} of {n} pulled again: a later pull replaced this one"
            )));
        }
        if let Some(why) = state.failed.clone() {
            state.ended[c] = true;
            return Next::Fail(Status::aborted(why));
        }
        if !state.started {
            return Next::Wait;
        }
        let k = state.next[c];
        if let Some(held) = state.held.get(&k) {
            let batch = Batch { index: k, shard: held.shard.clone(), position: held.position.clone() };
            state.next[c] += state.next.len() as u64;
            state.trim(self.bounds.keep);
            drop(state);
            self.taken.notify_all();
            return Next::Send(batch);
        }
        if state.finished && k >= state.made {
            state.ended[c] = true;
            drop(state);
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
        let pull = request.into_inner();
        let (consumer, number) = (pull.consumer, self.shared.join(&pull)?);
        tracing::info!(consumer, consumers = pull.consumers, start = pull.start, "a consumer pulls");
        let changed = self.shared.changed.subscribe();
        let batches = futures::stream::unfold(Some((Arc::clone(&self.shared), changed)), move |state| async move {
            let (shared, mut changed) = state?;
            loop {
                // Seen before looking, so that a change after the look wakes the wait.
                changed.borrow_and_update();
                match shared.next(consumer, number) {
                    Next::Send(batch) => return Some((Ok(batch), Some((shared, changed)))),
                    Next::End => return None,
                    // One error, then the end.
                    Next::Fail(status) => return Some((Err(status), None)),
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

#[cfg(test)]
mod generated_inputs;
