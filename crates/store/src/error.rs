//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong while writing, resuming or verifying a dataset.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The output URL could not be parsed or names an unsupported scheme.
    #[error("invalid output location {url:?}: {reason}")]
    InvalidLocation {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration value is out of range or inconsistent.
    #[error("invalid store configuration: {0}")]
    InvalidConfig(String),
    /// A batch handed to the writer does not have the shape or dtype it must have.
    #[error("invalid batch (samples starting at {first_sample}): {reason}")]
    InvalidBatch {
        /// The first sample index of the offending batch.
        first_sample: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// A hook's values hold NaN or ±Inf where the run does not allow them
    /// ([`crate::ShardFormat::allow_non_finite`]): the shard is refused, never written.
    #[error(
        "hook {hook} computed {count} values that are NaN or ±Inf (in shard {shard} of {}): the first at step {step} \
         (host sample {sample}, document {document}, token position {position}); the model's weights or config give \
         them there, so the shard is not written (--allow-non-finite stores such values and counts them in \
         stats.json)",
        host.dir_name()
    )]
    NonFinite {
        /// The hook.
        hook: String,
        /// Its values that are not finite in the shard.
        count: u64,
        /// The writing host.
        host: crate::HostId,
        /// The shard's index.
        shard: u64,
        /// The step (the host's batch) of the first.
        step: u64,
        /// The host's sample it lies in.
        sample: u64,
        /// Its token's document.
        document: i64,
        /// Its token's position in the document.
        position: i32,
    },
    /// The output already holds a run whose `run.json` differs from this run's.
    #[error(
        "refusing to resume into {path}: its run.json holds a different configuration; differing fields: {}",
        fields.join(", ")
    )]
    RunMismatch {
        /// The run.json object.
        path: String,
        /// Dotted paths of the fields that differ, with both values.
        fields: Vec<String>,
    },
    /// The output holds a run of another dataset format than the one this crate writes
    /// (a run begun by an older siphon); shards of two formats are never mixed in one run.
    #[error(
        "refusing to resume into {path}: run.json was written by format {stored_version} ({stored:?}), this siphon writes format {} ({:?}); a run cannot mix formats: start a new run (another run name or output), or finish this one with the siphon that began it",
        crate::format::FORMAT_VERSION,
        crate::format::FORMAT_TAG
    )]
    FormatMismatch {
        /// The run.json object.
        path: String,
        /// The format tag it records.
        stored: String,
        /// Its version number.
        stored_version: u32,
    },
    /// A run.json or shard records a dataset format this crate cannot read.
    #[error("{path}: unsupported dataset format {found:?} (this siphon reads {})", crate::format::readable_formats())]
    UnsupportedFormat {
        /// The object.
        path: String,
        /// The format tag found (empty when there is none).
        found: String,
    },
    /// An object store request failed (after the client's own retries).
    #[error("object store {op} {path}: {source}")]
    ObjectStore {
        /// The operation (put, get, list, ...).
        op: &'static str,
        /// The object path.
        path: String,
        /// The underlying error.
        #[source]
        source: object_store::Error,
    },
    /// A write failed because the disk (or the user's quota, or the process's file-size
    /// limit) is full: retrying cannot help until space is freed.
    #[error(
        "out of space: {op} {path}: {source}; free space where the output lives (or raise the quota) and run the same command again: the committed shards are kept"
    )]
    OutOfSpace {
        /// The operation (put, upload).
        op: &'static str,
        /// The object path.
        path: String,
        /// The underlying error.
        #[source]
        source: object_store::Error,
    },
    /// A write kept failing with errors that may pass (the store down, throttling, stalled
    /// requests) for the whole store timeout.
    #[error(
        "the object store did not take {op} {path} for {}s (the store timeout), last error: {last_error}; run the same command again once the store answers: the committed shards are kept",
        after.as_secs_f64()
    )]
    GaveUp {
        /// The operation.
        op: &'static str,
        /// The object path.
        path: String,
        /// The store timeout.
        after: std::time::Duration,
        /// The last attempt's error.
        last_error: String,
    },
    /// A local file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A local path where a run's file must be is something else (a FIFO, a device, a
    /// directory): reading it could block forever, so it is never opened.
    #[error("{path}: {what}")]
    NotAFile {
        /// The path on disk.
        path: PathBuf,
        /// What it is instead: `a FIFO (named pipe), not a regular file`.
        what: String,
    },
    /// A manifest, run.json or stats.json object is not what this crate writes.
    #[error("corrupt {path}: {reason}")]
    Corrupt {
        /// The object.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A shard could not be read back as safetensors.
    #[error("shard {path}: {reason}")]
    BadShard {
        /// The shard object.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The background writer stopped (after an earlier error, reported here).
    #[error("background shard writer failed: {0}")]
    Background(String),
}

impl StoreError {
    pub(crate) fn store(op: &'static str, path: impl std::fmt::Display, source: object_store::Error) -> Self {
        let path = path.to_string();
        if is_out_of_space(&source) {
            StoreError::OutOfSpace { op, path, source }
        } else {
            StoreError::ObjectStore { op, path, source }
        }
    }
}

/// Whether an error was caused by a full disk, an exceeded quota or the file-size limit.
pub(crate) fn is_out_of_space(error: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind;
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && matches!(io.kind(), ErrorKind::StorageFull | ErrorKind::QuotaExceeded | ErrorKind::FileTooLarge)
        {
            return true;
        }
        next = error.source();
    }
    false
}

/// Shorthand for results with [`StoreError`].
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
