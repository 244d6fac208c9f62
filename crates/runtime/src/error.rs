//! The runtime's error type.

use std::path::PathBuf;

/// A status code from PJRT (abseil's status codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The operation was cancelled.
    Cancelled,
    /// Unknown error.
    Unknown,
    /// The caller gave an invalid argument (bad program text, wrong shapes, ...).
    InvalidArgument,
    /// A deadline expired.
    DeadlineExceeded,
    /// Something requested was not found.
    NotFound,
    /// Something to be created already exists.
    AlreadyExists,
    /// Permission denied.
    PermissionDenied,
    /// Out of memory or another resource.
    ResourceExhausted,
    /// The system is not in a state required for the operation.
    FailedPrecondition,
    /// The operation was aborted.
    Aborted,
    /// Out of range.
    OutOfRange,
    /// The plugin does not implement the operation.
    Unimplemented,
    /// An internal invariant of the plugin broke.
    Internal,
    /// The service is unavailable (often transient).
    Unavailable,
    /// Unrecoverable data loss.
    DataLoss,
    /// Not authenticated.
    Unauthenticated,
    /// A code this crate does not know.
    Other(i32),
}

impl ErrorCode {
    pub(crate) fn from_raw(code: i32) -> ErrorCode {
        match code {
            1 => ErrorCode::Cancelled,
            2 => ErrorCode::Unknown,
            3 => ErrorCode::InvalidArgument,
            4 => ErrorCode::DeadlineExceeded,
            5 => ErrorCode::NotFound,
            6 => ErrorCode::AlreadyExists,
            7 => ErrorCode::PermissionDenied,
            8 => ErrorCode::ResourceExhausted,
            9 => ErrorCode::FailedPrecondition,
            10 => ErrorCode::Aborted,
            11 => ErrorCode::OutOfRange,
            12 => ErrorCode::Unimplemented,
            13 => ErrorCode::Internal,
            14 => ErrorCode::Unavailable,
            15 => ErrorCode::DataLoss,
            16 => ErrorCode::Unauthenticated,
            other => ErrorCode::Other(other),
        }
    }

    /// The raw PJRT code, for building errors handed back to the plugin.
    pub(crate) fn to_raw(self) -> i32 {
        match self {
            ErrorCode::Cancelled => 1,
            ErrorCode::Unknown => 2,
            ErrorCode::InvalidArgument => 3,
            ErrorCode::DeadlineExceeded => 4,
            ErrorCode::NotFound => 5,
            ErrorCode::AlreadyExists => 6,
            ErrorCode::PermissionDenied => 7,
            ErrorCode::ResourceExhausted => 8,
            ErrorCode::FailedPrecondition => 9,
            ErrorCode::Aborted => 10,
            ErrorCode::OutOfRange => 11,
            ErrorCode::Unimplemented => 12,
            ErrorCode::Internal => 13,
            ErrorCode::Unavailable => 14,
            ErrorCode::DataLoss => 15,
            ErrorCode::Unauthenticated => 16,
            ErrorCode::Other(code) => code,
        }
    }
}

/// Everything that can go wrong in the runtime. Plugin-side failures keep PJRT's code and
/// message; checks siphon makes before calling into XLA say what was wrong with the input.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No plugin file at the path.
    #[error("PJRT plugin {path} does not exist")]
    PluginNotFound {
        /// The path looked at.
        path: PathBuf,
    },
    /// `--plugin` or `SIPHON_PJRT_PLUGIN` names a file that does not exist.
    #[error("PJRT plugin {path} (from {from}) does not exist")]
    ConfiguredPluginMissing {
        /// The path.
        path: PathBuf,
        /// Where the path came from: `--plugin` or `SIPHON_PJRT_PLUGIN`.
        from: &'static str,
    },
    /// The file is not an ELF shared library (or could not be read).
    #[error("PJRT plugin {path} is not a shared library: {reason}")]
    NotSharedLibrary {
        /// The path.
        path: PathBuf,
        /// What was found instead.
        reason: String,
    },
    /// The dynamic loader refused the library.
    #[error("could not load PJRT plugin {path}: {reason}{}", cause_suffix(likely_cause))]
    LoadFailed {
        /// The path.
        path: PathBuf,
        /// The loader's message.
        reason: String,
        /// What this machine seems to lack for the plugin (see [`crate::diagnose`]).
        likely_cause: Option<String>,
    },
    /// A TPU or CUDA plugin refused before loading it, on a machine that has none of its
    /// devices (see [`crate::diagnose::preflight`]).
    #[error(
        "{kind} at {plugin} cannot start on this machine: {likely_cause} (to load it anyway, set SIPHON_SKIP_DEVICE_CHECK=1)"
    )]
    DevicesMissing {
        /// The plugin path.
        plugin: PathBuf,
        /// Which platform the plugin is for.
        kind: crate::diagnose::PluginKind,
        /// What is missing.
        likely_cause: String,
    },
    /// The plugin loaded but could not start: `PJRT_Plugin_Initialize` or
    /// `PJRT_Client_Create` failed, typically on a machine without the plugin's devices or
    /// drivers (libtpu without a TPU, the CUDA plugin without a GPU).
    #[error(
        "{kind} at {plugin} could not start: {function} failed ({code:?}): {message}{}",
        cause_suffix(likely_cause)
    )]
    PluginStart {
        /// The plugin path.
        plugin: PathBuf,
        /// Which platform the plugin is for.
        kind: crate::diagnose::PluginKind,
        /// The C function that failed.
        function: &'static str,
        /// PJRT's status code.
        code: ErrorCode,
        /// PJRT's message.
        message: String,
        /// What this machine seems to lack for the plugin (see [`crate::diagnose`]).
        likely_cause: Option<String>,
    },
    /// The library has no `GetPjrtApi` symbol: it is not a PJRT plugin.
    #[error("{path} is not a PJRT plugin: it exports no GetPjrtApi symbol")]
    NotPjrtPlugin {
        /// The path.
        path: PathBuf,
    },
    /// The plugin's API major version differs from the one siphon's structs follow.
    #[error("PJRT plugin {path} has API version {major}.{minor}; siphon supports major version {supported_major}")]
    ApiVersion {
        /// The path.
        path: PathBuf,
        /// Plugin major.
        major: i32,
        /// Plugin minor.
        minor: i32,
        /// The major siphon supports.
        supported_major: i32,
    },
    /// The plugin's function table does not have the function (older plugin), or the slot is null.
    #[error("PJRT plugin {plugin} does not provide {function}")]
    MissingFunction {
        /// The plugin path.
        plugin: PathBuf,
        /// The C function name.
        function: &'static str,
    },
    /// A PJRT call returned an error.
    #[error("{function} failed ({code:?}): {message}")]
    Pjrt {
        /// The C function that failed.
        function: &'static str,
        /// PJRT's status code.
        code: ErrorCode,
        /// PJRT's message.
        message: String,
    },
    /// No plugin was found by any discovery step.
    #[error(
        "no PJRT plugin found; looked at: {tried}. Run scripts/install-plugin.sh or pass --plugin PATH / set SIPHON_PJRT_PLUGIN"
    )]
    NoPluginFound {
        /// What was tried, in order.
        tried: String,
    },
    /// No libtpu to compile for a TPU topology with.
    #[error(
        "no libtpu found to compile for a TPU slice; looked at: {tried}. Install the pinned one with \
         `pip install libtpu=={version}` (or scripts/setup-libtpu.sh in a siphon checkout, into siphon's cache), \
         or pass --plugin PATH"
    )]
    NoLibtpuFound {
        /// What was tried, in order.
        tried: String,
        /// The pinned libtpu version.
        version: &'static str,
    },
    /// No CUDA plugin to compile for a GPU topology with.
    #[error(
        "no CUDA plugin found to compile for GPUs; looked at: {tried}. Install the pinned one with \
         scripts/setup-cuda-compiler.sh in a siphon checkout (into siphon's cache, with cuDNN and ptxas), or \
         `pip install jax-cuda12-pjrt=={version} 'jax-cuda12-plugin[with-cuda]=={version}'`, or pass --plugin PATH"
    )]
    NoCudaCompilerFound {
        /// What was tried, in order.
        tried: String,
        /// The pinned plugin version.
        version: &'static str,
    },
    /// Compile options siphon refuses before they reach XLA (XLA would abort the process).
    #[error("invalid compile options: {0}")]
    InvalidCompileOptions(String),
    /// A device id that the client does not have, or cannot address.
    #[error("device {id}: {reason}")]
    BadDevice {
        /// The device id.
        id: usize,
        /// Why it cannot be used.
        reason: String,
    },
    /// Invalid client create options.
    #[error("invalid client option {name:?}: {reason}")]
    InvalidOption {
        /// The option name.
        name: String,
        /// Why.
        reason: String,
    },
    /// Arguments to a transfer or execution do not fit (counts, sizes, devices, dtypes).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A shape/spec/mesh mismatch in a sharded helper.
    #[error(transparent)]
    Mesh(#[from] siphon_mesh::MeshError),
    /// The plugin returned something this crate cannot interpret (e.g. an unknown dtype).
    #[error("unexpected answer from PJRT: {0}")]
    Unexpected(String),
}

impl Error {
    /// PJRT's status code when the error came from the plugin.
    pub fn pjrt_code(&self) -> Option<ErrorCode> {
        match self {
            Error::Pjrt { code, .. } | Error::PluginStart { code, .. } => Some(*code),
            _ => None,
        }
    }
}

fn cause_suffix(likely_cause: &Option<String>) -> String {
    match likely_cause {
        Some(cause) => format!(" (likely cause: {cause})"),
        None => String::new(),
    }
}

/// The runtime's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
