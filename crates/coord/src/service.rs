//! The gRPC service: a thin tonic layer over the synchronous `crate::state` machines, behind a
//! cloneable [`CoordinatorHandle`].
//!
//! Every RPC passes an interceptor that checks the job token (constant-time compare; a wrong
//! token is logged with the peer address, never the token) and the caller's task id.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::error::{CoordError, Result, job_error_to_proto};
use crate::proto;
use crate::proto::coordination_server::{Coordination, CoordinationServer};
use crate::state::{self, Arrival, BarrierKey, Lookup, State};

/// Metadata key of the job token.
pub const TOKEN_HEADER: &str = "x-siphon-job-token";
/// Metadata key of the caller's task id.
pub const TASK_HEADER: &str = "x-siphon-task";
/// Metadata key of the caller's incarnation (hex).
pub const INCARNATION_HEADER: &str = "x-siphon-incarnation";

/// Timeouts beyond this are clamped (a week), so that deadline arithmetic cannot overflow.
const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// How the service is run.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// How many tasks (processes) the job has.
    pub num_tasks: u32,
    /// The shared secret every RPC must carry.
    pub job_token: String,
    /// How long a task whose heartbeat stream broke may take to come back before it is failed.
    pub grace: Duration,
    /// How long a connected task may stay silent before it is failed (hung host).
    pub heartbeat_timeout: Duration,
    /// Serve TLS with this certificate and key (clients then verify it against the CA).
    pub tls: Option<crate::tls::TlsOptions>,
}

impl ServiceConfig {
    /// Defaults: 500 ms grace after a broken stream, 10 s heartbeat timeout.
    pub fn new(num_tasks: u32, job_token: impl Into<String>) -> ServiceConfig {
        ServiceConfig {
            num_tasks,
            job_token: job_token.into(),
            grace: Duration::from_millis(500),
            heartbeat_timeout: Duration::from_secs(10),
            tls: None,
        }
    }
}

struct Shared {
    state: Mutex<State>,
    config: ServiceConfig,
    error_rx: watch::Receiver<Option<CoordError>>,
    stop_tx: watch::Sender<bool>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock would be a bug in the state machines; the state is
        // still consistent enough to report errors, so keep serving.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A cloneable handle on a running coordination service.
#[derive(Clone)]
pub struct CoordinatorHandle {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
}

/// The future that runs the service until [`CoordinatorHandle::stop`]; spawn it.
pub type ServerFuture = Pin<Box<dyn std::future::Future<Output = Result<()>> + Send>>;

impl CoordinatorHandle {
    /// The address the service listens on (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The job's first error, if it has failed.
    pub fn job_error(&self) -> Option<CoordError> {
        self.shared.lock().job_error().cloned()
    }

    /// Fails the job from the hosting process itself.
    pub fn fail(&self, error: CoordError) {
        self.shared.lock().fail(None, error);
    }

    /// Waits until no task but `except` (the hosting process's own) holds a heartbeat stream,
    /// or `timeout` passes; returns whether all are gone. The hosting process calls this before
    /// stopping, so that peers finishing their shutdown, or still to learn of the job's error,
    /// do not see the service vanish under them.
    pub async fn wait_idle(&self, except: Option<u32>, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.shared.lock().all_gone(except) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Whether every task passed the shutdown barrier.
    pub fn all_shut_down(&self) -> bool {
        self.shared.lock().all_shut_down()
    }

    /// Stops the service: heartbeat streams end and the server future returns.
    pub fn stop(&self) {
        self.shared.stop_tx.send_replace(true);
    }
}

/// Binds `addr` and builds the service. Returns the handle and the server future; the service
/// runs once the future is spawned. Bind to port 0 in tests.
pub async fn bind(config: ServiceConfig, addr: SocketAddr) -> Result<(CoordinatorHandle, ServerFuture)> {
    if config.num_tasks == 0 || config.num_tasks > crate::MAX_PROCESSES {
        return Err(CoordError::InvalidArgument(format!(
            "a job has 1..={} tasks, not {}",
            crate::MAX_PROCESSES,
            config.num_tasks
        )));
    }
    if config.job_token.is_empty() {
        return Err(CoordError::InvalidArgument("the job token must not be empty".into()));
    }
    let tls = config.tls.as_ref().map(|tls| tls.server_config()).transpose()?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CoordError::Unavailable(format!("cannot listen on {addr}: {e}")))?;
    let local_addr =
        listener.local_addr().map_err(|e| CoordError::Internal(format!("listener address of {addr}: {e}")))?;
    let (state, error_rx) = State::new(config.num_tasks);
    let (stop_tx, stop_rx) = watch::channel(false);
    let shared = Arc::new(Shared { state: Mutex::new(state), config, error_rx, stop_tx });
    let handle = CoordinatorHandle { shared: shared.clone(), local_addr };

    let interceptor = auth_interceptor(shared.config.job_token.clone(), shared.config.num_tasks);
    let service = CoordinationServer::with_interceptor(Service { shared: shared.clone() }, interceptor);
    // Barrier latency is dominated by small messages: disable Nagle on every accepted socket.
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|conn| {
        conn.inspect(|stream| {
            let _ = stream.set_nodelay(true);
        })
    });
    let mut stopped = stop_rx.clone();
    let stop_signal = async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder
            .tls_config(tls)
            .map_err(|e| CoordError::InvalidArgument(format!("the coordinator's certificate or key: {e}")))?;
    }
    let server = builder.add_service(service).serve_with_incoming_shutdown(incoming, stop_signal);
    let sweeper = sweep_loop(shared.clone(), stop_rx.clone());
    let mut stopped = stop_rx;
    let future = async move {
        tokio::spawn(sweeper);
        tokio::select! {
            result = server => result.map_err(|e| CoordError::Internal(format!("gRPC server: {e}"))),
            // Graceful shutdown waits for open calls; do not let a stuck one hold the process.
            _ = async { let _ = stopped.wait_for(|s| *s).await; tokio::time::sleep(Duration::from_secs(2)).await } => Ok(()),
        }
    };
    tracing::info!(addr = %local_addr, num_tasks = shared.config.num_tasks, tls = shared.config.tls.is_some(), "coordination service listening");
    Ok((handle, Box::pin(future)))
}

async fn sweep_loop(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let period = (shared.config.heartbeat_timeout / 4).max(Duration::from_millis(50));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = async { let _ = stop.wait_for(|s| *s).await; } => return,
        }
        shared.lock().sweep(Instant::now(), shared.config.heartbeat_timeout);
    }
}

/// The caller of an RPC, as the interceptor parsed it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller {
    pub(crate) task: u32,
    pub(crate) incarnation: u64,
}

pub(crate) fn auth_interceptor(
    token: String,
    num_tasks: u32,
) -> impl FnMut(Request<()>) -> std::result::Result<Request<()>, Status> + Clone {
    move |mut request: Request<()>| {
        let peer = request.remote_addr();
        let given = request.metadata().get(TOKEN_HEADER).map(|v| v.as_bytes().to_vec());
        if !given.is_some_and(|given| constant_time_eq(&given, token.as_bytes())) {
            tracing::warn!(peer = ?peer, "rejected an RPC with a missing or wrong job token");
            return Err(Status::unauthenticated("missing or wrong job token"));
        }
        let task =
            request.metadata().get(TASK_HEADER).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u32>().ok());
        let incarnation = request
            .metadata()
            .get(INCARNATION_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| u64::from_str_radix(v, 16).ok());
        let (Some(task), Some(incarnation)) = (task, incarnation) else {
            tracing::warn!(peer = ?peer, "rejected an RPC without a task id or incarnation");
            return Err(Status::invalid_argument("an RPC must name its task and incarnation"));
        };
        if task >= num_tasks {
            tracing::warn!(peer = ?peer, task, num_tasks, "rejected an RPC from an unknown task id");
            return Err(Status::invalid_argument(format!("unknown task {task}: this job has tasks 0..{num_tasks}")));
        }
        request.extensions_mut().insert(Caller { task, incarnation });
        Ok(request)
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

struct Service {
    shared: Arc<Shared>,
}

pub(crate) fn timeout_from_ms(ms: u64, what: &str) -> std::result::Result<Duration, Status> {
    if ms == 0 {
        return Err(CoordError::InvalidArgument(format!("{what}: the timeout must be positive")).to_status());
    }
    Ok(Duration::from_millis(ms).min(MAX_TIMEOUT))
}

impl Service {
    /// The registered caller of an RPC.
    fn caller<T>(&self, request: &Request<T>) -> std::result::Result<Caller, Status> {
        let caller =
            *request.extensions().get::<Caller>().ok_or_else(|| Status::internal("interceptor did not run"))?;
        if let Err(error) = self.shared.lock().check_caller(caller.task, caller.incarnation) {
            tracing::warn!(task = caller.task, %error, "rejected an RPC");
            return Err(error.to_status());
        }
        Ok(caller)
    }

    /// The registered caller of an RPC and its message.
    fn open<T>(&self, request: Request<T>) -> std::result::Result<(Caller, T), Status> {
        let caller = self.caller(&request)?;
        Ok((caller, request.into_inner()))
    }

    /// Answers an RPC that the state answers at once: opens `request` (the checked caller and
    /// its message) and runs `body` on them under the state's lock.
    fn answer<T, R>(
        &self,
        request: Request<T>,
        body: impl FnOnce(&mut State, Caller, T) -> Result<R>,
    ) -> std::result::Result<Response<R>, Status> {
        let (caller, request) = self.open(request)?;
        let reply = body(&mut self.shared.lock(), caller, request)?;
        Ok(Response::new(reply))
    }

    /// Enters the caller's `task` into the barrier `key` and waits for it to pass or fail (at
    /// the latest after `timeout` from its first arrival).
    async fn pass_barrier(
        &self,
        task: u32,
        key: BarrierKey,
        timeout: Duration,
        participants: &[u32],
    ) -> std::result::Result<Response<proto::Empty>, Status> {
        let arrival = self.shared.lock().barrier(task, key.clone(), timeout, participants, Instant::now());
        let outcome = match arrival {
            Arrival::Done(outcome) => outcome,
            Arrival::Wait(receiver, deadline) => {
                let shared = self.shared.clone();
                state::await_barrier(receiver, deadline, move |now| shared.lock().expire_barrier(&key, now)).await
            }
        };
        outcome.map(|()| Response::new(proto::Empty {})).map_err(Status::from)
    }
}

type EventStream = Pin<Box<dyn Stream<Item = std::result::Result<proto::Event, Status>> + Send>>;

#[tonic::async_trait]
impl Coordination for Service {
    async fn register(
        &self,
        request: Request<proto::RegisterRequest>,
    ) -> std::result::Result<Response<proto::RegisterResponse>, Status> {
        let caller = *request.extensions().get::<Caller>().ok_or_else(|| Status::internal("no caller"))?;
        let num_tasks = self.shared.lock().register(caller.task, caller.incarnation, Instant::now())?;
        tracing::debug!(task = caller.task, "task registered");
        Ok(Response::new(proto::RegisterResponse { num_tasks }))
    }

    type HeartbeatStream = EventStream;

    async fn heartbeat(
        &self,
        request: Request<tonic::Streaming<proto::Beat>>,
    ) -> std::result::Result<Response<EventStream>, Status> {
        let caller = self.caller(&request)?;
        let task = caller.task;
        let generation = self.shared.lock().connect(task, Instant::now());
        let (sender, receiver) = mpsc::channel(16);
        let mut inbound = request.into_inner();
        let shared = self.shared.clone();
        let mut errors = self.shared.error_rx.clone();
        let mut stop = self.shared.stop_tx.subscribe();
        tokio::spawn(async move {
            let initial = errors.borrow_and_update().clone();
            if let Some(error) = initial {
                let event = proto::Event { ack: 0, error: Some(job_error_to_proto(&error)) };
                let _ = sender.send(Ok(event)).await;
            }
            loop {
                tokio::select! {
                    beat = inbound.message() => match beat {
                        Ok(Some(beat)) => {
                            shared.lock().beat(task, generation, Instant::now());
                            if sender.send(Ok(proto::Event { ack: beat.sequence, error: None })).await.is_err() {
                                break;
                            }
                        }
                        Ok(None) | Err(_) => break,
                    },
                    changed = errors.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let error = errors.borrow_and_update().clone();
                        if let Some(error) = error {
                            let event = proto::Event { ack: 0, error: Some(job_error_to_proto(&error)) };
                            let _ = sender.send(Ok(event)).await;
                        }
                    }
                    _ = async { let _ = stop.wait_for(|s| *s).await; } => return,
                }
            }
            drop(sender);
            let needs_grace = shared.lock().disconnect(task, generation);
            if needs_grace {
                tracing::warn!(task, "heartbeat stream broke; waiting {:?} for it to come back", shared.config.grace);
                tokio::time::sleep(shared.config.grace).await;
                shared.lock().grace_expired(task, generation, shared.config.grace);
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn barrier(
        &self,
        request: Request<proto::BarrierRequest>,
    ) -> std::result::Result<Response<proto::Empty>, Status> {
        let (caller, request) = self.open(request)?;
        let timeout = timeout_from_ms(request.timeout_ms, &format!("barrier '{}'", request.id))?;
        self.pass_barrier(caller.task, (request.id, request.counter), timeout, &request.participants).await
    }

    async fn cancel_barrier(
        &self,
        request: Request<proto::CancelBarrierRequest>,
    ) -> std::result::Result<Response<proto::Empty>, Status> {
        self.answer(request, |state, caller, request| {
            state.cancel_barrier(caller.task, (request.id, request.counter), Instant::now())?;
            Ok(proto::Empty {})
        })
    }

    async fn kv_set(
        &self,
        request: Request<proto::KvSetRequest>,
    ) -> std::result::Result<Response<proto::Empty>, Status> {
        self.answer(request, |state, _, request| {
            state.kv_set(&request.key, request.value, request.allow_overwrite)?;
            Ok(proto::Empty {})
        })
    }

    async fn kv_get(
        &self,
        request: Request<proto::KvGetRequest>,
    ) -> std::result::Result<Response<proto::KvValue>, Status> {
        let (_, request) = self.open(request)?;
        let timeout = timeout_from_ms(request.timeout_ms, &format!("get of key '{}'", request.key))?;
        let lookup = self.shared.lock().kv_get(&request.key)?;
        let value = match lookup {
            Lookup::Found(value) => value,
            Lookup::Wait(receiver) => match tokio::time::timeout(timeout, receiver).await {
                Ok(Ok(result)) => result?,
                Ok(Err(_)) => return Err(Status::internal("key-value waiter dropped")),
                Err(_) => {
                    return Err(CoordError::DeadlineExceeded(format!(
                        "key '{}' was not set within {timeout:?}",
                        request.key
                    ))
                    .to_status());
                }
            },
        };
        Ok(Response::new(proto::KvValue { value }))
    }

    async fn kv_try_get(
        &self,
        request: Request<proto::KvKey>,
    ) -> std::result::Result<Response<proto::KvMaybeValue>, Status> {
        self.answer(request, |state, _, request| Ok(proto::KvMaybeValue { value: state.kv_try_get(&request.key)? }))
    }

    async fn kv_increment(
        &self,
        request: Request<proto::KvIncrementRequest>,
    ) -> std::result::Result<Response<proto::KvCounter>, Status> {
        self.answer(request, |state, _, request| {
            Ok(proto::KvCounter { value: state.kv_increment(&request.key, request.delta)? })
        })
    }

    async fn kv_list(&self, request: Request<proto::KvKey>) -> std::result::Result<Response<proto::KvEntries>, Status> {
        self.answer(request, |state, _, request| {
            let entries = state.kv_list(&request.key)?.into_iter().map(|(key, value)| proto::KvEntry { key, value });
            Ok(proto::KvEntries { entries: entries.collect() })
        })
    }

    async fn kv_delete(
        &self,
        request: Request<proto::KvDeleteRequest>,
    ) -> std::result::Result<Response<proto::Empty>, Status> {
        self.answer(request, |state, _, request| {
            state.kv_delete(&request.key, request.prefix)?;
            Ok(proto::Empty {})
        })
    }

    async fn report_error(
        &self,
        request: Request<proto::ReportErrorRequest>,
    ) -> std::result::Result<Response<proto::Empty>, Status> {
        self.answer(request, |state, caller, request| {
            if request.preempted {
                state.report_preemption(caller.task, &request.message);
            } else {
                state.report_error(caller.task, &request.message);
            }
            Ok(proto::Empty {})
        })
    }

    async fn get_alive_tasks(
        &self,
        request: Request<proto::AliveTasksRequest>,
    ) -> std::result::Result<Response<proto::AliveTasks>, Status> {
        self.answer(request, |state, _, request| Ok(proto::AliveTasks { alive: state.alive_tasks(&request.tasks)? }))
    }

    async fn shutdown(
        &self,
        request: Request<proto::ShutdownRequest>,
    ) -> std::result::Result<Response<proto::Empty>, Status> {
        let caller = self.caller(&request)?;
        let timeout = timeout_from_ms(request.get_ref().timeout_ms, "shutdown")?;
        self.pass_barrier(caller.task, (state::SHUTDOWN_BARRIER.to_string(), 0), timeout, &[]).await
    }
}

/// Runs the service on its own (`siphon coordinator`) until the job ends: returns Ok once every
/// task passed the shutdown barrier and closed its stream, or the job's error once it failed
/// (after giving the tasks up to a second to learn of it), or an error on SIGINT/SIGTERM
/// (SIGTERM stops the job as preempted: [`CoordError::is_preemption`]).
/// `on_listening` is called with the bound address.
pub fn run_standalone(config: ServiceConfig, addr: SocketAddr, on_listening: impl FnOnce(SocketAddr)) -> Result<()> {
    // One thread: connections, barrier wake-ups and responses never change threads.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CoordError::Internal(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(async {
        let (handle, server) = bind(config, addr).await?;
        on_listening(handle.local_addr());
        let server = tokio::spawn(server);
        let mut errors = handle.shared.error_rx.clone();
        let signal = async {
            use tokio::signal::unix::{SignalKind, signal};
            match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
                (Ok(mut term), Ok(mut int)) => tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                },
                _ => std::future::pending().await,
            }
        };
        let finished = async {
            loop {
                if handle.all_shut_down() && handle.wait_idle(None, Duration::ZERO).await {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let outcome = tokio::select! {
            _ = finished => Ok(()),
            _ = async { let _ = errors.wait_for(|e| e.is_some()).await; } => {
                handle.wait_idle(None, Duration::from_secs(1)).await;
                Err(handle.job_error().unwrap_or_else(|| CoordError::Internal("job failed".into())))
            }
            name = signal => {
                // SIGTERM is a preemption (spot VM, pod eviction): the tasks stop to be resumed.
                let error = match name {
                    "SIGTERM" => CoordError::Preempted("the coordinator received SIGTERM".into()),
                    _ => CoordError::Aborted(format!("the coordinator received {name}")),
                };
                handle.fail(error.clone());
                handle.wait_idle(None, Duration::from_secs(1)).await;
                Err(handle.job_error().unwrap_or(error))
            }
        };
        handle.stop();
        let _ = server.await;
        outcome
    })
}
