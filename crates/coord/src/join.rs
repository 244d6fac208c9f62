//! [`Coordination`]: one process's membership in a job, with a blocking API.
//!
//! Process 0 also hosts the service (unless told otherwise); every process then connects as a
//! client. The handle owns a small tokio runtime so that synchronous code (the extraction loop,
//! PJRT's key-value callbacks, the CLI) can call it directly.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use crate::client::{Client, ClientOptions};
use crate::error::{CoordError, Result};
use crate::identity::Identity;
use crate::service::{self, CoordinatorHandle, ServiceConfig};
use crate::stop::{EXIT_PREEMPTED, StopSignal, exit_now};
use crate::tls::TlsOptions;

/// How a process joins its job.
#[derive(Debug, Clone)]
pub struct JoinOptions {
    /// The job's shared secret.
    pub job_token: String,
    /// Address the hosted service listens on; default: the coordinator address itself (not
    /// 0.0.0.0 unless asked).
    pub bind: Option<SocketAddr>,
    /// Whether this process hosts the service; default: when it is process 0.
    pub host_service: Option<bool>,
    /// Client timeouts and backoff.
    pub client: ClientOptions,
    /// Grace period after a broken heartbeat stream, on the hosted service.
    pub grace: Duration,
    /// Heartbeat timeout on the hosted service.
    pub service_heartbeat_timeout: Duration,
    /// TLS of the service (served by the hosting process, verified by every client).
    pub tls: Option<TlsOptions>,
    /// How long a preempted process (SIGTERM) may take to commit before it exits anyway.
    pub stop_timeout: Duration,
}

impl JoinOptions {
    /// Defaults for a job secured by `job_token`.
    pub fn new(job_token: impl Into<String>) -> JoinOptions {
        let defaults = ServiceConfig::new(1, "");
        JoinOptions {
            job_token: job_token.into(),
            bind: None,
            host_service: None,
            client: ClientOptions::default(),
            grace: defaults.grace,
            service_heartbeat_timeout: defaults.heartbeat_timeout,
            tls: None,
            stop_timeout: Duration::from_secs(10),
        }
    }
}

/// One process's membership in a job. Blocking methods must not be called from inside an
/// async runtime; use [`Coordination::client`] there.
pub struct Coordination {
    // Fields drop in order: the clients before the runtimes their tasks run on.
    /// The handle the blocking methods use: its connection's tasks run on `rpc_runtime`, a
    /// current-thread runtime driven by the calling thread inside `block_on`, so an RPC needs no
    /// hand-off between threads.
    fast: Client,
    /// Owns the heartbeat and error watch, on `runtime`, which runs whatever the caller does.
    client: Client,
    hosted: Option<CoordinatorHandle>,
    rpc_runtime: tokio::runtime::Runtime,
    runtime: tokio::runtime::Runtime,
    identity: Identity,
    stop: StopSignal,
}

impl Coordination {
    /// Joins the job: hosts the service when this is process 0, connects, registers and waits
    /// until every process registered (within `options.client.register_timeout`).
    pub fn join(identity: &Identity, options: JoinOptions) -> Result<Coordination> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("siphon-coord")
            .enable_all()
            .build()
            .map_err(|e| CoordError::Internal(format!("cannot start the coordination runtime: {e}")))?;
        let rpc_runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CoordError::Internal(format!("cannot start the coordination runtime: {e}")))?;
        let hosts = options.host_service.unwrap_or(identity.process_id == 0);
        let mut identity = identity.clone();
        let hosted = if hosts {
            let bind = match options.bind {
                Some(addr) => addr,
                None => resolve(&identity.coordinator)?,
            };
            // A host name can resolve to loopback (Debian maps the own host name to 127.0.1.1),
            // which other hosts cannot reach.
            let named_loopback =
                identity.coordinator.starts_with("127.") || identity.coordinator.starts_with("localhost");
            if bind.ip().is_loopback() && !named_loopback {
                tracing::warn!(
                    coordinator = %identity.coordinator, %bind,
                    "the coordinator address resolves to a loopback address; processes on other hosts \
                     cannot reach it (pass --bind with this host's network address)"
                );
            }
            let mut config = ServiceConfig::new(identity.num_processes, options.job_token.clone());
            config.grace = options.grace;
            config.heartbeat_timeout = options.service_heartbeat_timeout;
            config.tls = options.tls.clone();
            let handle = host(config, bind)?;
            // Port 0 (tests, single-host runs) becomes the real port.
            if identity.coordinator.ends_with(":0") || options.bind.is_some_and(|b| b.port() == 0) {
                identity.coordinator = handle.local_addr().to_string();
            }
            Some(handle)
        } else {
            None
        };
        let mut client_options = options.client.clone();
        if options.tls.is_some() {
            client_options.tls = options.tls.clone();
        }
        let client = runtime.block_on(Client::connect(
            &identity.coordinator,
            identity.process_id,
            &options.job_token,
            &client_options,
        ));
        let client = match client {
            Ok(client) => client,
            Err(error) => {
                if let Some(handle) = &hosted {
                    // Let the peers get their own answer (e.g. the registration timeout) from
                    // the service before it goes away.
                    runtime.block_on(handle.wait_idle(Some(identity.process_id), Duration::from_secs(1)));
                    handle.stop();
                }
                return Err(error);
            }
        };
        if client.num_tasks() != identity.num_processes {
            return Err(CoordError::InvalidArgument(format!(
                "this process believes the job has {} processes but the coordinator at {} has {}",
                identity.num_processes,
                identity.coordinator,
                client.num_tasks()
            )));
        }
        let fast = match rpc_runtime.block_on(client.with_own_connection()) {
            Ok(fast) => fast,
            Err(error) => {
                if let Some(handle) = &hosted {
                    handle.stop();
                }
                return Err(error);
            }
        };
        let stop = StopSignal::new(options.stop_timeout);
        Ok(Coordination { fast, client, hosted, rpc_runtime, runtime, identity, stop })
    }

    /// The identity this process joined with (the coordinator address is the real one).
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// This process's id.
    pub fn process_id(&self) -> u32 {
        self.client.task()
    }

    /// The async client, for code running inside an async runtime.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The runtime the client runs on.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        self.runtime.handle()
    }

    /// The hosted service, on the process that hosts it.
    pub fn hosted_service(&self) -> Option<&CoordinatorHandle> {
        self.hosted.as_ref()
    }

    /// The job's error, if it has one.
    pub fn job_error(&self) -> Option<CoordError> {
        self.client.job_error()
    }

    /// See [`Client::barrier`].
    pub fn barrier(&self, id: &str, timeout: Duration) -> Result<()> {
        self.rpc_runtime.block_on(self.fast.barrier(id, timeout))
    }

    /// See [`Client::barrier_among`].
    pub fn barrier_among(&self, id: &str, timeout: Duration, participants: &[u32]) -> Result<()> {
        self.rpc_runtime.block_on(self.fast.barrier_among(id, timeout, participants))
    }

    /// See [`Client::kv_set`].
    pub fn kv_set(&self, key: &str, value: &[u8], allow_overwrite: bool) -> Result<()> {
        self.rpc_runtime.block_on(self.fast.kv_set(key, value, allow_overwrite))
    }

    /// See [`Client::kv_get`].
    pub fn kv_get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.rpc_runtime.block_on(self.fast.kv_get(key, timeout))
    }

    /// See [`Client::kv_try_get`].
    pub fn kv_try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.rpc_runtime.block_on(self.fast.kv_try_get(key))
    }

    /// See [`Client::kv_increment`].
    pub fn kv_increment(&self, key: &str, delta: i64) -> Result<i64> {
        self.rpc_runtime.block_on(self.fast.kv_increment(key, delta))
    }

    /// See [`Client::kv_list`].
    pub fn kv_list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        self.rpc_runtime.block_on(self.fast.kv_list(prefix))
    }

    /// See [`Client::kv_delete`].
    pub fn kv_delete(&self, key: &str) -> Result<()> {
        self.rpc_runtime.block_on(self.fast.kv_delete(key))
    }

    /// See [`Client::kv_delete_prefix`].
    pub fn kv_delete_prefix(&self, prefix: &str) -> Result<()> {
        self.rpc_runtime.block_on(self.fast.kv_delete_prefix(prefix))
    }

    /// See [`Client::report_error`].
    pub fn report_error(&self, message: &str) -> Result<()> {
        self.rpc_runtime.block_on(self.fast.report_error(message))
    }

    /// See [`Client::report_preemption`].
    pub fn report_preemption(&self, message: &str) -> Result<()> {
        self.rpc_runtime.block_on(self.fast.report_preemption(message))
    }

    /// Whether the job stopped because a process was preempted (this one or another).
    pub fn preempted(&self) -> bool {
        self.job_error().is_some_and(|e| e.is_preemption())
    }

    /// This process's stop request (SIGTERM), which a work loop arms and polls; see
    /// [`crate::stop`].
    pub fn stop_signal(&self) -> &StopSignal {
        &self.stop
    }

    /// See [`Client::alive_tasks`].
    pub fn alive_tasks(&self, subset: &[u32]) -> Result<Vec<u32>> {
        self.rpc_runtime.block_on(self.fast.alive_tasks(subset))
    }

    /// The shutdown barrier. On the hosting process, also waits (up to `timeout`) until the
    /// other processes have disconnected, so that none loses the service mid-shutdown.
    pub fn shutdown(&self, timeout: Duration) -> Result<()> {
        self.rpc_runtime.block_on(async {
            self.fast.shutdown(timeout).await?;
            if let Some(handle) = &self.hosted {
                handle.wait_idle(Some(self.client.task()), timeout).await;
            }
            Ok(())
        })
    }

    /// Installs a panic hook and SIGTERM/SIGINT handlers that report to the job before the
    /// process exits, so that the other processes stop at once instead of waiting for a
    /// heartbeat timeout. A panic or SIGINT is a failure (SIGINT exits 130). SIGTERM is a
    /// preemption (see [`crate::stop`]): reported as such, it stops the armed work loop
    /// cooperatively within the stop timeout, or exits at once with [`EXIT_PREEMPTED`]. The
    /// process ends through [`exit_now`] whatever its other threads are doing. The signal
    /// handlers are registered when this returns. Call once per process.
    pub fn install_failure_reporting(&self) {
        let client = self.client.clone();
        let handle = self.runtime.handle().clone();
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = format!("task {} panicked: {info}", client.task()).replace('\n', " ");
            let client = client.clone();
            let handle = handle.clone();
            // The hook may run on a runtime thread, where block_on is not allowed: report from
            // a fresh thread and wait for it (bounded).
            let reporter = std::thread::spawn(move || {
                handle.block_on(async {
                    let _ = tokio::time::timeout(Duration::from_secs(2), client.report_error(&message)).await;
                })
            });
            let _ = reporter.join();
            previous(info);
        }));
        let client = self.client.clone();
        let hosted = self.hosted.clone();
        let stop = self.stop.clone();
        // Registered before this returns, so that a caller's own handlers may stand down
        // once it does: no signal falls between the two.
        let signals = {
            use tokio::signal::unix::{SignalKind, signal};
            let _runtime = self.runtime.enter();
            (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
        };
        let (Ok(mut term), Ok(mut int)) = signals else {
            tracing::warn!("cannot install signal handlers; a signal will not be reported to the job");
            return;
        };
        self.runtime.spawn(async move {
            let task = client.task();
            let sigterm = tokio::select! {
                _ = term.recv() => true,
                _ = int.recv() => false,
            };
            if !sigterm {
                let message = format!("task {task} received SIGINT");
                let _ = tokio::time::timeout(Duration::from_secs(2), client.report_error(&message)).await;
                if let Some(handle) = hosted {
                    handle.wait_idle(Some(task), Duration::from_secs(1)).await;
                }
                eprintln!("error: {message}; reported to the job");
                exit_now(130);
            }
            stop.request();
            let _ = tokio::time::timeout(Duration::from_secs(2), client.report_preemption("received SIGTERM")).await;
            let preempted = client.job_error().is_none_or(|e| e.is_preemption());
            if preempted && stop.is_armed() {
                // The loop stops and commits; the deadline ends the process if it takes too long.
                stop.start_deadline();
                eprintln!(
                    "siphon: task {task} received SIGTERM: preempted; committing what is complete (at most {:?}), \
                     then exiting with {EXIT_PREEMPTED}",
                    stop.bound()
                );
                let again = tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                };
                eprintln!("siphon: task {task} received {again} while stopping; exiting now");
                exit_now(EXIT_PREEMPTED);
            }
            if let Some(handle) = hosted {
                handle.wait_idle(Some(task), Duration::from_secs(1)).await;
            }
            if preempted {
                eprintln!("siphon: task {task} received SIGTERM: preempted; reported to the job; exiting with {EXIT_PREEMPTED}");
                exit_now(EXIT_PREEMPTED);
            }
            // The job had already failed: this is part of that failure.
            eprintln!("error: task {task} received SIGTERM after the job failed");
            exit_now(143);
        });
    }
}

impl Drop for Coordination {
    fn drop(&mut self) {
        if let Some(handle) = &self.hosted {
            // Keep serving a little while peers still hold streams, so that they learn the
            // job's error (or finish their shutdown) from the service rather than by losing it.
            let me = self.client.task();
            let wait = if handle.job_error().is_some() { Duration::from_secs(1) } else { Duration::from_millis(500) };
            if tokio::runtime::Handle::try_current().is_err() {
                self.runtime.block_on(handle.wait_idle(Some(me), wait));
            }
            handle.stop();
        }
    }
}

/// Runs the service on a thread of its own with a current-thread runtime: every connection's
/// tasks and every barrier wake-up stay on one thread, which keeps barrier latency low and
/// leaves the process's other threads alone.
fn host(config: ServiceConfig, bind: SocketAddr) -> Result<CoordinatorHandle> {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("siphon-coord-service".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = sender.send(Err(CoordError::Internal(format!("cannot start the service runtime: {e}"))));
                    return;
                }
            };
            runtime.block_on(async move {
                match service::bind(config, bind).await {
                    Ok((handle, server)) => {
                        let _ = sender.send(Ok(handle));
                        if let Err(error) = server.await {
                            tracing::error!(%error, "coordination service stopped");
                        }
                    }
                    Err(error) => {
                        let _ = sender.send(Err(error));
                    }
                }
            });
        })
        .map_err(|e| CoordError::Internal(format!("cannot start the service thread: {e}")))?;
    receiver.recv().map_err(|_| CoordError::Internal("the service thread ended before binding".into()))?
}

fn resolve(address: &str) -> Result<SocketAddr> {
    address
        .to_socket_addrs()
        .map_err(|e| CoordError::InvalidArgument(format!("cannot resolve the coordinator address '{address}': {e}")))?
        .next()
        .ok_or_else(|| CoordError::InvalidArgument(format!("the coordinator address '{address}' resolves to nothing")))
}

impl Coordination {
    /// See [`crate::broadcast::broadcast_config`]; rank 0 resolves a new run name and start
    /// time ([`crate::broadcast::new_run_identity`]) and every rank returns them.
    pub fn broadcast_config(&self, compared: &serde_json::Value, timeout: Duration) -> Result<serde_json::Value> {
        self.rpc_runtime.block_on(crate::broadcast::broadcast_config(
            &self.fast,
            compared,
            crate::broadcast::new_run_identity,
            timeout,
        ))
    }
}

/// A fresh random job token (256 bits, hex), for launchers and single-process runs.
pub fn generate_job_token() -> String {
    use rand::Rng;
    let bytes: [u8; 32] = rand::rng().random();
    hex::encode(bytes)
}
