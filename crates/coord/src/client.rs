//! The async client of the coordination service.
//!
//! [`Client::connect`] retries with jittered exponential backoff (each step capped) within an
//! overall timeout, registers, opens the heartbeat stream and passes the all-tasks registration
//! barrier. A background task keeps the heartbeat going and watches for the job's error; once
//! the job has an error (pushed by the service, or the coordinator lost), every call returns it
//! at once, including calls already blocked in a barrier or a get.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::error::{CoordError, Result, job_error_from_proto};
use crate::proto;
use crate::proto::coordination_client::CoordinationClient;
use crate::service::{INCARNATION_HEADER, TASK_HEADER, TOKEN_HEADER};
use crate::state::REGISTER_BARRIER;

/// How a client connects and watches the service.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Overall time allowed to reach the coordinator (it may start after the workers).
    pub connect_timeout: Duration,
    /// First backoff step between connection attempts.
    pub backoff_initial: Duration,
    /// Cap of one backoff step.
    pub backoff_max: Duration,
    /// How long every task may take to register (the registration barrier's timeout).
    pub register_timeout: Duration,
    /// Interval between heartbeats.
    pub heartbeat_interval: Duration,
    /// The coordinator is considered lost after this long without an answer.
    pub heartbeat_timeout: Duration,
    /// Connect over TLS, verifying the service against this CA.
    pub tls: Option<crate::tls::TlsOptions>,
}

impl Default for ClientOptions {
    fn default() -> ClientOptions {
        ClientOptions {
            connect_timeout: Duration::from_secs(120),
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_secs(5),
            register_timeout: Duration::from_secs(300),
            heartbeat_interval: Duration::from_secs(1),
            heartbeat_timeout: Duration::from_secs(10),
            tls: None,
        }
    }
}

type Rpc = CoordinationClient<InterceptedService<Channel, Auth>>;

/// Adds the job token, task id and incarnation to every RPC.
#[derive(Clone)]
struct Auth {
    token: MetadataValue<tonic::metadata::Ascii>,
    task: MetadataValue<tonic::metadata::Ascii>,
    incarnation: MetadataValue<tonic::metadata::Ascii>,
}

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut request: tonic::Request<()>) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        let metadata = request.metadata_mut();
        metadata.insert(TOKEN_HEADER, self.token.clone());
        metadata.insert(TASK_HEADER, self.task.clone());
        metadata.insert(INCARNATION_HEADER, self.incarnation.clone());
        Ok(request)
    }
}

/// A connected, registered task of a job. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    // Per handle: see [`Client::with_own_connection`].
    rpc: Rpc,
}

struct Inner {
    endpoint: Endpoint,
    auth: Auth,
    task: u32,
    num_tasks: u32,
    address: String,
    error_tx: watch::Sender<Option<CoordError>>,
    shutting_down: AtomicBool,
    counters: Mutex<HashMap<String, u64>>,
    heartbeat: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.heartbeat.lock().unwrap_or_else(|p| p.into_inner()).take() {
            task.abort();
        }
    }
}

impl Client {
    /// Connects to the coordinator at `address` (HOST:PORT) as `task`, registers, starts the
    /// heartbeat and waits for every task to register.
    pub async fn connect(address: &str, task: u32, job_token: &str, options: &ClientOptions) -> Result<Client> {
        let client = Client::connect_only(address, task, job_token, options).await?;
        client.barrier_with(REGISTER_BARRIER, 0, options.register_timeout, &[]).await.map_err(|error| match error {
            CoordError::DeadlineExceeded(message) => {
                CoordError::DeadlineExceeded(format!("not every task registered in time: {message}"))
            }
            other => other,
        })?;
        Ok(client)
    }

    /// Connects and registers, with the heartbeat running, without the registration barrier.
    pub async fn connect_only(address: &str, task: u32, job_token: &str, options: &ClientOptions) -> Result<Client> {
        let incarnation: u64 = rand::rng().random();
        let ascii = |text: String, what: &str| {
            MetadataValue::try_from(text)
                .map_err(|_| CoordError::InvalidArgument(format!("the {what} must be printable ASCII")))
        };
        let auth = Auth {
            token: ascii(job_token.to_string(), "job token")?,
            task: ascii(task.to_string(), "task id")?,
            incarnation: ascii(format!("{incarnation:x}"), "incarnation")?,
        };
        let scheme = if options.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|e| CoordError::InvalidArgument(format!("coordinator address '{address}': {e}")))?;
        if let Some(tls) = &options.tls {
            endpoint = endpoint
                .tls_config(tls.client_config())
                .map_err(|e| CoordError::InvalidArgument(format!("coordinator TLS: {e}: {}", source_chain(&e))))?;
        }
        let endpoint = endpoint
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(20));

        let started = Instant::now();
        let mut step = options.backoff_initial;
        let (mut rpc, num_tasks) = loop {
            let remaining = options.connect_timeout.saturating_sub(started.elapsed());
            let attempt = async {
                let channel = endpoint
                    .clone()
                    .connect_timeout(remaining.min(options.backoff_max).max(Duration::from_millis(10)))
                    .connect()
                    .await
                    .map_err(|e| connect_error(&e, address, options.tls.is_some()))?;
                let mut rpc = CoordinationClient::with_interceptor(channel, auth.clone());
                let reply =
                    rpc.register(proto::RegisterRequest {}).await.map_err(|status| CoordError::from_status(&status))?;
                Ok::<_, CoordError>((rpc, reply.into_inner().num_tasks))
            };
            match attempt.await {
                Ok(connected) => break connected,
                Err(CoordError::Unavailable(message)) => {
                    if started.elapsed() + step >= options.connect_timeout {
                        return Err(CoordError::Unavailable(format!(
                            "could not reach the coordinator at {address} within {:?}: {message}",
                            options.connect_timeout
                        )));
                    }
                    tracing::debug!(%address, %message, "coordinator not reachable yet; retrying");
                    // Full jitter keeps hundreds of hosts from retrying in lockstep.
                    let sleep = step.mul_f64(rand::rng().random_range(0.5..1.0));
                    tokio::time::sleep(sleep).await;
                    step = (step * 2).min(options.backoff_max);
                }
                Err(other) => return Err(other),
            }
        };

        let (error_tx, _) = watch::channel(None);
        let inner = Arc::new(Inner {
            endpoint: endpoint.clone(),
            auth: auth.clone(),
            task,
            num_tasks,
            address: address.to_string(),
            error_tx,
            shutting_down: AtomicBool::new(false),
            counters: Mutex::new(HashMap::new()),
            heartbeat: Mutex::new(None),
        });
        let (beat_tx, beat_rx) = mpsc::channel(4);
        beat_tx
            .send(proto::Beat { sequence: 1 })
            .await
            .map_err(|_| CoordError::Internal("heartbeat channel closed".into()))?;
        let events = rpc
            .heartbeat(ReceiverStream::new(beat_rx))
            .await
            .map_err(|status| CoordError::from_status(&status))?
            .into_inner();
        let watcher = tokio::spawn(heartbeat_loop(Arc::downgrade(&inner), beat_tx, events, options.clone()));
        *inner.heartbeat.lock().unwrap_or_else(|p| p.into_inner()) = Some(watcher);
        tracing::debug!(task, num_tasks, %address, "registered with the coordinator");
        Ok(Client { inner, rpc })
    }

    /// A handle on the same registration (task, heartbeat, job error) whose RPCs go over a new
    /// connection whose tasks run on the calling runtime. A blocking API that drives a
    /// current-thread runtime from the caller's thread uses it, so that an RPC involves no
    /// hand-off between threads (the biggest part of barrier latency on a busy host).
    pub async fn with_own_connection(&self) -> Result<Client> {
        let channel =
            self.inner.endpoint.clone().connect_timeout(Duration::from_secs(10)).connect().await.map_err(|e| {
                connect_error(&e, &self.inner.address, self.inner.endpoint.uri().scheme_str() == Some("https"))
            })?;
        let rpc = CoordinationClient::with_interceptor(channel, self.inner.auth.clone());
        Ok(Client { inner: self.inner.clone(), rpc })
    }

    /// This task's id.
    pub fn task(&self) -> u32 {
        self.inner.task
    }

    /// How many tasks the job has.
    pub fn num_tasks(&self) -> u32 {
        self.inner.num_tasks
    }

    /// The job's error, if it has one (reported by a task, a lost task, or the coordinator lost).
    pub fn job_error(&self) -> Option<CoordError> {
        self.inner.error_tx.borrow().clone()
    }

    /// Waits until the job has an error and returns it.
    pub async fn wait_for_error(&self) -> CoordError {
        let mut receiver = self.inner.error_tx.subscribe();
        match receiver.wait_for(|e| e.is_some()).await {
            Ok(error) => error.clone().unwrap_or_else(|| CoordError::Internal("no error".into())),
            Err(_) => CoordError::Internal("client dropped".into()),
        }
    }

    fn set_error(&self, error: CoordError) {
        set_error(&self.inner, error);
    }

    /// Runs one RPC, returning the job's error instead as soon as there is one.
    async fn call<T, F>(&self, rpc: F) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        if let Some(error) = self.job_error() {
            return Err(error);
        }
        let mut errors = self.inner.error_tx.subscribe();
        tokio::select! {
            biased;
            failed = errors.wait_for(|e| e.is_some()) => {
                Err(failed.map(|e| e.clone()).ok().flatten().unwrap_or_else(|| CoordError::Internal("client dropped".into())))
            }
            reply = rpc => match reply {
                Ok(response) => Ok(response.into_inner()),
                Err(status) => {
                    let error = CoordError::from_status(&status);
                    match &error {
                        // The job failed, or the coordinator is gone: both are final.
                        CoordError::JobFailed { .. } => self.set_error(error.clone()),
                        CoordError::Unavailable(_) if !self.inner.shutting_down.load(Ordering::SeqCst) => {
                            self.set_error(lost_coordinator(&self.inner.address, &error.to_string()));
                        }
                        _ => {}
                    }
                    Err(self.job_error().unwrap_or(error))
                }
            },
        }
    }

    fn rpc(&self) -> Rpc {
        self.rpc.clone()
    }

    /// Waits until every task reaches barrier `id`. Each process calls the same barriers in
    /// the same order; the n-th use of `id` is its own barrier instance.
    pub async fn barrier(&self, id: &str, timeout: Duration) -> Result<()> {
        let counter = self.next_counter(id);
        self.barrier_with(id, counter, timeout, &[]).await
    }

    /// Like [`Client::barrier`] among `participants` only (which must include this task).
    pub async fn barrier_among(&self, id: &str, timeout: Duration, participants: &[u32]) -> Result<()> {
        let counter = self.next_counter(id);
        self.barrier_with(id, counter, timeout, participants).await
    }

    fn next_counter(&self, id: &str) -> u64 {
        let mut counters = self.inner.counters.lock().unwrap_or_else(|p| p.into_inner());
        let counter = counters.entry(id.to_string()).or_insert(0);
        *counter += 1;
        *counter
    }

    /// The barrier RPC with an explicit counter and participant subset (empty: all tasks).
    pub async fn barrier_with(&self, id: &str, counter: u64, timeout: Duration, participants: &[u32]) -> Result<()> {
        let request = proto::BarrierRequest {
            id: id.to_string(),
            counter,
            timeout_ms: duration_ms(timeout),
            participants: participants.to_vec(),
        };
        let mut rpc = self.rpc();
        self.call(rpc.barrier(request)).await.map(|_| ())
    }

    /// Cancels instance `counter` of barrier `id` for everyone.
    pub async fn cancel_barrier(&self, id: &str, counter: u64) -> Result<()> {
        let mut rpc = self.rpc();
        self.call(rpc.cancel_barrier(proto::CancelBarrierRequest { id: id.to_string(), counter })).await.map(|_| ())
    }

    /// Sets `key` once (AlreadyExists if set), or overwrites when `allow_overwrite`.
    pub async fn kv_set(&self, key: &str, value: &[u8], allow_overwrite: bool) -> Result<()> {
        let request = proto::KvSetRequest { key: key.to_string(), value: value.to_vec(), allow_overwrite };
        let mut rpc = self.rpc();
        self.call(rpc.kv_set(request)).await.map(|_| ())
    }

    /// Waits until `key` is set and returns its value (DeadlineExceeded after `timeout`).
    pub async fn kv_get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let request = proto::KvGetRequest { key: key.to_string(), timeout_ms: duration_ms(timeout) };
        let mut rpc = self.rpc();
        self.call(rpc.kv_get(request)).await.map(|v| v.value)
    }

    /// The value of `key` if it is set.
    pub async fn kv_try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let mut rpc = self.rpc();
        self.call(rpc.kv_try_get(proto::KvKey { key: key.to_string() })).await.map(|v| v.value)
    }

    /// Adds `delta` to the counter at `key` (absent: 0) and returns the new value.
    pub async fn kv_increment(&self, key: &str, delta: i64) -> Result<i64> {
        let mut rpc = self.rpc();
        self.call(rpc.kv_increment(proto::KvIncrementRequest { key: key.to_string(), delta })).await.map(|c| c.value)
    }

    /// Every entry whose key starts with `prefix`, in key order.
    pub async fn kv_list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let mut rpc = self.rpc();
        let entries = self.call(rpc.kv_list(proto::KvKey { key: prefix.to_string() })).await?;
        Ok(entries.entries.into_iter().map(|e| (e.key, e.value)).collect())
    }

    /// Deletes `key`.
    pub async fn kv_delete(&self, key: &str) -> Result<()> {
        let mut rpc = self.rpc();
        self.call(rpc.kv_delete(proto::KvDeleteRequest { key: key.to_string(), prefix: false })).await.map(|_| ())
    }

    /// Deletes every key starting with `prefix`.
    pub async fn kv_delete_prefix(&self, prefix: &str) -> Result<()> {
        let mut rpc = self.rpc();
        self.call(rpc.kv_delete(proto::KvDeleteRequest { key: prefix.to_string(), prefix: true })).await.map(|_| ())
    }

    /// Reports an error of this task: it becomes the job's error (if the job has none yet) and
    /// reaches every task. Succeeds also when the job already failed.
    pub async fn report_error(&self, message: &str) -> Result<()> {
        let mut rpc = self.rpc();
        let reply =
            rpc.report_error(proto::ReportErrorRequest { message: message.to_string(), preempted: false }).await;
        let local = CoordError::Internal(format!("task {} reported an error: {message}", self.task()))
            .into_job_failure(Some(self.task()));
        self.set_error(local);
        match reply {
            Ok(_) => Ok(()),
            Err(status) => match CoordError::from_status(&status) {
                CoordError::JobFailed { .. } => Ok(()),
                other => Err(other),
            },
        }
    }

    /// Reports that this task was preempted (it received SIGTERM): unless the job already
    /// failed, every task learns that the job stops as preempted ([`CoordError::is_preemption`])
    /// rather than failed. This task's own view of the job becomes that at once, even when the
    /// coordinator cannot be reached.
    pub async fn report_preemption(&self, message: &str) -> Result<()> {
        let mut rpc = self.rpc();
        let request = proto::ReportErrorRequest { message: message.to_string(), preempted: true };
        let reply = rpc.report_error(request).await;
        let local =
            CoordError::Preempted(format!("task {}: {message}", self.task())).into_job_failure(Some(self.task()));
        match reply {
            Ok(_) => {
                self.set_error(local);
                Ok(())
            }
            Err(status) => match CoordError::from_status(&status) {
                // The job had already failed or stopped: that stays its error.
                failed @ CoordError::JobFailed { .. } => {
                    self.set_error(failed);
                    Ok(())
                }
                other => {
                    self.set_error(local);
                    Err(other)
                }
            },
        }
    }

    /// The tasks (of `subset`, or all when empty) that are registered and not failed.
    pub async fn alive_tasks(&self, subset: &[u32]) -> Result<Vec<u32>> {
        let mut rpc = self.rpc();
        self.call(rpc.get_alive_tasks(proto::AliveTasksRequest { tasks: subset.to_vec() })).await.map(|a| a.alive)
    }

    /// The shutdown barrier: waits until every task shuts down; afterwards losing the
    /// connection is expected and no longer an error.
    pub async fn shutdown(&self, timeout: Duration) -> Result<()> {
        let mut rpc = self.rpc();
        let result = self.call(rpc.shutdown(proto::ShutdownRequest { timeout_ms: duration_ms(timeout) })).await;
        if result.is_ok() {
            self.inner.shutting_down.store(true, Ordering::SeqCst);
            // Close the heartbeat stream now: the hosting process waits for it before it stops.
            if let Some(task) = self.inner.heartbeat.lock().unwrap_or_else(|p| p.into_inner()).take() {
                task.abort();
            }
        }
        result.map(|_| ())
    }
}

fn set_error(inner: &Inner, error: CoordError) {
    inner.error_tx.send_if_modified(|current| {
        if current.is_none() {
            tracing::debug!(%error, "job error received");
            *current = Some(error);
            true
        } else {
            false
        }
    });
}

fn lost_coordinator(address: &str, why: &str) -> CoordError {
    CoordError::Unavailable(format!("lost the coordinator at {address}: {why}")).into_job_failure(None)
}

async fn heartbeat_loop(
    inner: std::sync::Weak<Inner>,
    beats: mpsc::Sender<proto::Beat>,
    mut events: tonic::Streaming<proto::Event>,
    options: ClientOptions,
) {
    let mut sequence = 1u64;
    let mut ticker = tokio::time::interval(options.heartbeat_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let mut last_answer = Instant::now();
    loop {
        let deadline = last_answer + options.heartbeat_timeout;
        let failure = tokio::select! {
            _ = ticker.tick() => {
                sequence += 1;
                if beats.send(proto::Beat { sequence }).await.is_err() {
                    Some("heartbeat stream closed".to_string())
                } else {
                    None
                }
            }
            event = events.message() => match event {
                Ok(Some(event)) => {
                    last_answer = Instant::now();
                    if let (Some(job), Some(inner)) = (event.error, inner.upgrade()) {
                        set_error(&inner, job_error_from_proto(&job));
                    }
                    None
                }
                Ok(None) => Some("the coordinator closed the heartbeat stream".to_string()),
                Err(status) => Some(format!("heartbeat stream broke: {}", status.message())),
            },
            _ = tokio::time::sleep_until(deadline.into()) => {
                Some(format!("no answer from the coordinator for {:?}", options.heartbeat_timeout))
            }
        };
        if let Some(why) = failure {
            if let Some(inner) = inner.upgrade()
                && !inner.shutting_down.load(Ordering::SeqCst)
            {
                set_error(&inner, lost_coordinator(&inner.address, &why));
            }
            return;
        }
    }
}

/// A failed connection attempt: a TLS failure is final (it does not go away by retrying);
/// anything else is [`CoordError::Unavailable`], retried until the connect timeout.
fn connect_error(error: &tonic::transport::Error, address: &str, tls: bool) -> CoordError {
    match crate::tls::tls_failure(error) {
        Some(why) if tls => CoordError::Unauthenticated(format!(
            "TLS with the coordinator at {address} failed: {why} (the coordinator's certificate must be signed by \
             --coordinator-ca and name the host in the coordinator address, or --coordinator-tls-name; every \
             host needs the same --coordinator-* flags)"
        )),
        _ => CoordError::Unavailable(format!("{error}: {}", source_chain(error))),
    }
}

fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn source_chain(error: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut source = error.source();
    while let Some(s) = source {
        parts.push(s.to_string());
        source = s.source();
    }
    parts.join(": ")
}
