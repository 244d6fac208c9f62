//! Control plane of a siphon job: the gRPC coordination service, its client, worker identity
//! detection and config broadcast.
//!
//! Every host runs the same `siphon` command. Process 0 also hosts the coordination service
//! ([`service`]); every process joins it as a client ([`Coordination::join`]). The service
//! offers what a multi-host job needs and what a multi-host PJRT client needs from its
//! key-value callbacks: registration with an all-tasks barrier, heartbeats over a long-lived
//! stream, barriers (optionally over a subset of tasks), a key-value store, error reporting and
//! GetAliveTasks, and a shutdown barrier.
//!
//! # Failure semantics
//!
//! Errors are sticky and job-wide. The first error of the job — reported by a task (including
//! from a panic hook or a SIGINT handler), or a task lost because its heartbeat stream
//! broke and did not come back within a short grace period (500 ms by default) — fails every
//! pending barrier and get at once and is pushed down every heartbeat stream; from then on
//! every call of every task returns it. A task that loses the coordinator does the same
//! locally. So one dead host stops the job in about a second instead of hanging it.
//!
//! A preemption travels the same way with its own code ([`ErrorCode::Preempted`]): SIGTERM
//! makes a task report it ([`stop`]), every task stops, commits what is complete and exits
//! with [`EXIT_PREEMPTED`], and the same command resumes the job.
//!
//! # Security
//!
//! Every RPC carries the job token (`SIPHON_JOB_TOKEN` or a token file); a wrong token or an
//! unknown task id is rejected (UNAUTHENTICATED / INVALID_ARGUMENT) and logged, never echoed.
//! The service binds the coordinator address itself unless told otherwise. With [`TlsOptions`]
//! the service serves TLS and clients verify it against a CA, so the token never crosses the
//! network in clear ([`tls`]).
//!
//! # Example
//!
//! A single process (no identity source set) hosts its own coordinator on 127.0.0.1:
//!
//! ```
//! use std::time::Duration;
//! use siphon_coord::{Coordination, JoinOptions, identity};
//!
//! let me = identity::resolve(&identity::IdentityFlags::default(), &Default::default(), None)?;
//! let job = Coordination::join(&me, JoinOptions::new("secret"))?;
//! job.barrier("ready", Duration::from_secs(5))?;
//! job.kv_set("greeting", b"hello", false)?;
//! assert_eq!(job.kv_get("greeting", Duration::from_secs(1))?, b"hello");
//! let run = job.broadcast_config(&serde_json::json!({"model": "qwen"}), Duration::from_secs(5))?;
//! assert!(run["run_name"].as_str().unwrap().starts_with("siphon-"));
//! job.shutdown(Duration::from_secs(5))?;
//! # Ok::<(), siphon_coord::CoordError>(())
//! ```

#![deny(missing_docs)]

pub mod broadcast;
pub mod check;
pub mod client;
pub mod error;
pub mod identity;
mod join;
pub mod service;
mod state;
pub mod stop;
pub mod tls;

/// Generated protobuf messages and gRPC stubs of `proto/coord.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("siphon.coord.v1");
}

#[cfg(test)]
mod generated_inputs;

pub use client::{Client, ClientOptions};
pub use error::{CoordError, ErrorCode, Result};
pub use identity::{Identity, IdentityFlags, MAX_PROCESSES, Source};
pub use join::{Coordination, JoinOptions, generate_job_token};
pub use service::{CoordinatorHandle, ServiceConfig};
pub use state::{REGISTER_BARRIER, SHUTDOWN_BARRIER};
pub use stop::{EXIT_PREEMPTED, StopSignal, exit_now};
pub use tls::TlsOptions;
