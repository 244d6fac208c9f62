//! The crate's error type and its mapping to and from gRPC statuses.

use std::fmt;

use prost::Message;

use crate::proto;

/// What went wrong in the control plane. Cloneable: the job's first error is handed to every
/// waiting call of every task.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CoordError {
    /// A key, barrier or task that does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// An insert-once key that is already set.
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// A barrier, registration or blocking get that did not complete in time.
    #[error("deadline exceeded: {0}")]
    DeadlineExceeded(String),
    /// A cancelled barrier.
    #[error("cancelled: {0}")]
    Cancelled(String),
    /// An operation refused because of a conflicting state (e.g. a restarted task).
    #[error("aborted: {0}")]
    Aborted(String),
    /// The coordinator cannot be reached, or the connection to it was lost.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A bug or an unexpected answer.
    #[error("internal error: {0}")]
    Internal(String),
    /// A malformed request (unknown task id, bad barrier participants, bad identity input).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The job token was missing or wrong, or the coordinator's TLS certificate was refused.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// A task was preempted (SIGTERM from a spot VM or a pod eviction): the job stops to be
    /// resumed by running the same command again. Every task exits with
    /// [`crate::EXIT_PREEMPTED`].
    #[error("preempted: {0}")]
    Preempted(String),
    /// The job has failed (or was preempted: code [`ErrorCode::Preempted`]); this is its first
    /// error, sticky for every later call of every task.
    #[error("{}", job_failed_message(*code, message))]
    JobFailed {
        /// The task that reported the error or was lost, when known.
        task: Option<u32>,
        /// The code of the original error.
        code: ErrorCode,
        /// What happened, naming the task.
        message: String,
    },
    /// The processes of a job were started with different configurations.
    #[error("{}", config_mismatch_message(*task, fields))]
    ConfigMismatch {
        /// The task whose configuration differs from rank 0's.
        task: u32,
        /// The differing fields as dotted paths, with both values.
        fields: Vec<FieldDiff>,
    },
}

fn job_failed_message(code: ErrorCode, message: &str) -> String {
    if code == ErrorCode::Preempted {
        format!("the job stopped: {message}")
    } else {
        format!("the job failed: {message}")
    }
}

fn config_mismatch_message(task: u32, fields: &[FieldDiff]) -> String {
    let listed: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
    format!(
        "task {task} was started with a configuration that differs from task 0's in {} field(s): {}",
        fields.len(),
        listed.join("; ")
    )
}

/// The code an error carries over the wire (mirrors `siphon.coord.v1.ErrorCode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCode {
    /// See [`CoordError::NotFound`].
    NotFound,
    /// See [`CoordError::AlreadyExists`].
    AlreadyExists,
    /// See [`CoordError::DeadlineExceeded`].
    DeadlineExceeded,
    /// See [`CoordError::Cancelled`].
    Cancelled,
    /// See [`CoordError::Aborted`].
    Aborted,
    /// See [`CoordError::Unavailable`].
    Unavailable,
    /// See [`CoordError::Internal`].
    Internal,
    /// See [`CoordError::InvalidArgument`].
    InvalidArgument,
    /// See [`CoordError::Preempted`].
    Preempted,
}

/// Result alias of this crate.
pub type Result<T, E = CoordError> = std::result::Result<T, E>;

impl CoordError {
    /// The code of this error (a job failure carries its original code).
    pub fn code(&self) -> ErrorCode {
        match self {
            CoordError::NotFound(_) => ErrorCode::NotFound,
            CoordError::AlreadyExists(_) => ErrorCode::AlreadyExists,
            CoordError::DeadlineExceeded(_) => ErrorCode::DeadlineExceeded,
            CoordError::Cancelled(_) => ErrorCode::Cancelled,
            CoordError::Aborted(_) => ErrorCode::Aborted,
            CoordError::Unavailable(_) => ErrorCode::Unavailable,
            CoordError::Internal(_) => ErrorCode::Internal,
            CoordError::InvalidArgument(_) | CoordError::Unauthenticated(_) => ErrorCode::InvalidArgument,
            CoordError::JobFailed { code, .. } => *code,
            CoordError::ConfigMismatch { .. } => ErrorCode::InvalidArgument,
            CoordError::Preempted(_) => ErrorCode::Preempted,
        }
    }

    /// Whether this is (or the job failed with) a preemption: stop, commit, exit with
    /// [`crate::EXIT_PREEMPTED`] and be resumed.
    pub fn is_preemption(&self) -> bool {
        self.code() == ErrorCode::Preempted
    }

    /// Turns this error into the job's failure, as every task will see it.
    pub fn into_job_failure(self, task: Option<u32>) -> CoordError {
        match self {
            CoordError::JobFailed { .. } => self,
            other => CoordError::JobFailed { task, code: other.code(), message: other.to_string() },
        }
    }

    pub(crate) fn to_status(&self) -> tonic::Status {
        let message = self.to_string();
        match self {
            CoordError::NotFound(_) => tonic::Status::not_found(message),
            CoordError::AlreadyExists(_) => tonic::Status::already_exists(message),
            CoordError::DeadlineExceeded(_) => tonic::Status::deadline_exceeded(message),
            CoordError::Cancelled(_) => tonic::Status::cancelled(message),
            CoordError::Aborted(_) | CoordError::Preempted(_) => tonic::Status::aborted(message),
            CoordError::Unavailable(_) => tonic::Status::unavailable(message),
            CoordError::Internal(_) => tonic::Status::internal(message),
            CoordError::InvalidArgument(_) | CoordError::ConfigMismatch { .. } => {
                tonic::Status::invalid_argument(message)
            }
            CoordError::Unauthenticated(_) => tonic::Status::unauthenticated(message),
            CoordError::JobFailed { task, code, message } => {
                let details =
                    proto::JobError { code: code_to_proto(*code) as i32, message: message.clone(), task: *task };
                tonic::Status::with_details(
                    tonic::Code::Aborted,
                    format!("the job failed: {message}"),
                    details.encode_to_vec().into(),
                )
            }
        }
    }

    pub(crate) fn from_status(status: &tonic::Status) -> CoordError {
        if status.code() == tonic::Code::Aborted
            && !status.details().is_empty()
            && let Ok(job) = proto::JobError::decode(status.details())
        {
            return job_error_from_proto(&job);
        }
        // The server's message already starts with the kind ("not found: ..."); strip it so
        // that Display does not repeat it.
        let message = status.message();
        let strip = |prefix: &str| message.strip_prefix(prefix).unwrap_or(message).to_string();
        match status.code() {
            tonic::Code::NotFound => CoordError::NotFound(strip("not found: ")),
            tonic::Code::AlreadyExists => CoordError::AlreadyExists(strip("already exists: ")),
            tonic::Code::DeadlineExceeded => CoordError::DeadlineExceeded(strip("deadline exceeded: ")),
            tonic::Code::Cancelled => CoordError::Cancelled(strip("cancelled: ")),
            tonic::Code::Aborted => CoordError::Aborted(strip("aborted: ")),
            tonic::Code::Unavailable => {
                CoordError::Unavailable(format!("the coordinator is unreachable or went away: {message}"))
            }
            tonic::Code::InvalidArgument => CoordError::InvalidArgument(strip("invalid argument: ")),
            tonic::Code::Unauthenticated => CoordError::Unauthenticated(strip("unauthenticated: ")),
            tonic::Code::Unknown if message.contains("transport") || message.contains("connect") => {
                CoordError::Unavailable(format!("lost the coordinator: {message}"))
            }
            _ => CoordError::Internal(format!("{:?}: {message}", status.code())),
        }
    }
}

pub(crate) fn code_to_proto(code: ErrorCode) -> proto::ErrorCode {
    match code {
        ErrorCode::NotFound => proto::ErrorCode::NotFound,
        ErrorCode::AlreadyExists => proto::ErrorCode::AlreadyExists,
        ErrorCode::DeadlineExceeded => proto::ErrorCode::DeadlineExceeded,
        ErrorCode::Cancelled => proto::ErrorCode::Cancelled,
        ErrorCode::Aborted => proto::ErrorCode::Aborted,
        ErrorCode::Unavailable => proto::ErrorCode::Unavailable,
        ErrorCode::Internal => proto::ErrorCode::Internal,
        ErrorCode::InvalidArgument => proto::ErrorCode::InvalidArgument,
        ErrorCode::Preempted => proto::ErrorCode::Preempted,
    }
}

fn code_from_proto(code: i32) -> ErrorCode {
    match proto::ErrorCode::try_from(code).unwrap_or(proto::ErrorCode::Unspecified) {
        proto::ErrorCode::NotFound => ErrorCode::NotFound,
        proto::ErrorCode::AlreadyExists => ErrorCode::AlreadyExists,
        proto::ErrorCode::DeadlineExceeded => ErrorCode::DeadlineExceeded,
        proto::ErrorCode::Cancelled => ErrorCode::Cancelled,
        proto::ErrorCode::Aborted => ErrorCode::Aborted,
        proto::ErrorCode::Unavailable => ErrorCode::Unavailable,
        proto::ErrorCode::InvalidArgument => ErrorCode::InvalidArgument,
        proto::ErrorCode::Preempted => ErrorCode::Preempted,
        proto::ErrorCode::Internal | proto::ErrorCode::Unspecified => ErrorCode::Internal,
    }
}

pub(crate) fn job_error_from_proto(job: &proto::JobError) -> CoordError {
    CoordError::JobFailed { task: job.task, code: code_from_proto(job.code), message: job.message.clone() }
}

pub(crate) fn job_error_to_proto(error: &CoordError) -> proto::JobError {
    match error {
        CoordError::JobFailed { task, code, message } => {
            proto::JobError { code: code_to_proto(*code) as i32, message: message.clone(), task: *task }
        }
        other => proto::JobError { code: code_to_proto(other.code()) as i32, message: other.to_string(), task: None },
    }
}

impl From<CoordError> for tonic::Status {
    /// The status an RPC answers with (`CoordError::to_status`), so handlers can use `?`.
    fn from(error: CoordError) -> tonic::Status {
        error.to_status()
    }
}

/// One field that differs between rank 0's config and another rank's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldDiff {
    /// Dotted path of the field (`model.layers`, `hooks[2]`).
    pub path: String,
    /// Rank 0's value as JSON, `None` when rank 0 lacks the field.
    pub rank0: Option<String>,
    /// This rank's value as JSON, `None` when this rank lacks the field.
    pub ours: Option<String>,
}

impl fmt::Display for FieldDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<String>| match v {
            None => "(absent)".to_string(),
            Some(text) if text.chars().count() > 80 => format!("{}…", text.chars().take(80).collect::<String>()),
            Some(text) => text.clone(),
        };
        write!(f, "{} (task 0: {}, here: {})", self.path, show(&self.rank0), show(&self.ours))
    }
}
