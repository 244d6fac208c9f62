//! What a run writes (format settings, recorded in `run.json`) and how (pipeline settings).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::batch::DType;
use crate::error::{Result, StoreError};
use crate::output::OutputColumn;
use crate::sparse::LatentsColumn;

/// Default target shard size: about 256 MB.
pub const DEFAULT_TARGET_SHARD_BYTES: u64 = 256 << 20;
/// S3's minimum multipart part size (all parts but the last).
pub const MIN_PART_BYTES: usize = 5 << 20;

/// Which process of the cluster this writer is: `machine_{m:03}_host_{h:02}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HostId {
    /// Machine index.
    pub machine: u32,
    /// Host (process) index on that machine.
    pub host: u32,
}

impl HostId {
    /// The host's directory name inside the run.
    pub fn dir_name(self) -> String {
        format!("machine_{:03}_host_{:02}", self.machine, self.host)
    }
}

/// Seeded shuffle of tokens across a window of batches.
///
/// A shard always holds whole windows, so a window is shuffled exactly once and a restart
/// (which resumes at a shard boundary, hence at a window boundary) reproduces the same shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShuffleConfig {
    /// Seed; combined with the host id and the window's first sample.
    pub seed: u64,
    /// Batches per shuffle window.
    pub window_batches: usize,
}

/// Settings that decide the bytes of the dataset; recorded in `run.json` and compared on resume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardFormat {
    /// Element type activations are stored as.
    pub dtype: DType,
    /// A shard is closed at the first batch (or shuffle window) boundary at or past this size.
    pub target_shard_bytes: u64,
    /// Keep excluded tokens and add a `mask` tensor instead of dropping them.
    pub keep_excluded: bool,
    /// Optional shuffle of tokens before writing.
    pub shuffle: Option<ShuffleConfig>,
    /// Store each token's role (a `role` tensor: which message of a conversation rendered
    /// through a chat template it comes from, or template text).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub roles: bool,
    /// Rows pool several tokens of a document (`--positions mean`): each row's first position
    /// (`position_first`, I32) and the tokens it pools (`count`, I32) are stored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pooled: bool,
    /// Store the kept columns of the documents a shard holds rows of (`--keep-columns`): a
    /// `documents` (U8) tensor of JSON lines, `[doc_index, {column: value, …}]` each, one per
    /// document, in document order.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub documents: bool,
    /// Store hooks' values that are not finite (NaN, ±Inf), counted per hook in the
    /// statistics, instead of refusing the shard that holds one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_non_finite: bool,
}

impl Default for ShardFormat {
    fn default() -> Self {
        ShardFormat {
            dtype: DType::Bf16,
            target_shard_bytes: DEFAULT_TARGET_SHARD_BYTES,
            keep_excluded: false,
            shuffle: None,
            roles: false,
            pooled: false,
            documents: false,
            allow_non_finite: false,
        }
    }
}

/// Default of [`UploadConfig::give_up_after`]: five minutes.
pub const DEFAULT_GIVE_UP_AFTER: Duration = Duration::from_secs(300);
/// The longest wait between two attempts of a request or of a shard's upload.
pub const MAX_BACKOFF: Duration = Duration::from_secs(15);
/// How shards are uploaded. Does not change the dataset's bytes, so a resumed run may differ here.
#[derive(Debug, Clone, PartialEq)]
pub struct UploadConfig {
    /// Multipart part size; at least 5 MiB. Shards no larger than this are sent with one put.
    pub part_bytes: usize,
    /// Upper bound on part/put requests in flight across all shards of this host.
    pub concurrency: usize,
    /// How long a write may keep failing with errors that may pass (5xx, 429, dropped
    /// connections, stalled requests) before the host fails: requests are retried with backoff
    /// until then, a shard's whole upload too. Bounds how long a job waits on a store that is
    /// down.
    pub give_up_after: Duration,
    /// Backoff before a shard upload's second attempt; doubled each further attempt (at most
    /// [`MAX_BACKOFF`]).
    pub initial_backoff: Duration,
    /// Local disk only: fsync each shard before its manifest line and the manifest after it.
    /// Without it a process crash is still exactly-once (the page cache survives), a power
    /// loss may not be; on by default.
    pub fsync_local: bool,
}

impl Default for UploadConfig {
    fn default() -> Self {
        UploadConfig {
            part_bytes: 16 << 20,
            concurrency: 8,
            give_up_after: DEFAULT_GIVE_UP_AFTER,
            initial_backoff: Duration::from_millis(200),
            fsync_local: true,
        }
    }
}

/// Shards sealed side by side by default (fewer on a machine with fewer cores).
pub const DEFAULT_SEALERS: usize = 4;

/// Everything one host's writer needs.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Output root: a local path, `file://`, `s3://`, `gs://`, `az://`/`abfs://`, or `http(s)://`.
    pub output: String,
    /// Extra object_store options (e.g. `aws_endpoint`), on top of the environment's.
    pub options: Vec<(String, String)>,
    /// Run name: the directory under `output`.
    pub run: String,
    /// This writer's host.
    pub host: HostId,
    /// Dataset format.
    pub format: ShardFormat,
    /// Upload behaviour.
    pub upload: UploadConfig,
    /// Batches queued between the compute loop and the shard assembler (back-pressure point).
    pub queue_batches: usize,
    /// Sealed shards waiting for an upload slot; bounds memory to about
    /// `(pending_shards + sealers + concurrent shard uploads + 1) * target_shard_bytes`.
    pub pending_shards: usize,
    /// Shards sealed side by side (statistics and CRC32C of each on its own thread), handed
    /// on in order: one thread seals several GB/s, a GPU node's output path makes tens.
    pub sealers: usize,
}

impl StoreConfig {
    /// A config with default format and pipeline settings.
    pub fn new(output: impl Into<String>, run: impl Into<String>, host: HostId) -> Self {
        StoreConfig {
            output: output.into(),
            options: Vec::new(),
            run: run.into(),
            host,
            format: ShardFormat::default(),
            upload: UploadConfig::default(),
            queue_batches: 4,
            pending_shards: 1,
            sealers: DEFAULT_SEALERS,
        }
    }

    /// Checks ranges without doing any I/O.
    pub fn validate(&self) -> Result<()> {
        let bad = |s: String| Err(StoreError::InvalidConfig(s));
        if self.run.is_empty() || self.run.contains('/') || self.run.starts_with('.') {
            return bad(format!("run name {:?} must be a non-empty single path segment", self.run));
        }
        if self.format.target_shard_bytes == 0 {
            return bad("target_shard_bytes must be > 0".into());
        }
        if !self.format.dtype.is_activation() {
            return bad(format!("shards cannot hold activations as {}", self.format.dtype));
        }
        if let Some(shuffle) = self.format.shuffle
            && shuffle.window_batches == 0
        {
            return bad("shuffle window_batches must be > 0".into());
        }
        if self.upload.part_bytes < MIN_PART_BYTES {
            return bad(format!("upload part_bytes {} is below the 5 MiB multipart minimum", self.upload.part_bytes));
        }
        if self.upload.concurrency == 0 {
            return bad("upload concurrency must be > 0".into());
        }
        if self.upload.give_up_after.is_zero() {
            return bad("the store timeout (give_up_after) must be > 0".into());
        }
        if self.sealers == 0 {
            return bad("sealers must be > 0".into());
        }
        if self.queue_batches == 0 {
            return bad("queue_batches must be > 0".into());
        }
        if self.host.machine > 999 || self.host.host > 99 {
            return bad(format!("host id {:?} does not fit machine_{{:03}}_host_{{:02}}", self.host));
        }
        Ok(())
    }
}

/// What `run.json` records about the run besides the shard format; opaque to the store.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RunDescriptor {
    /// Model identity (id, revision, architecture...).
    pub model: serde_json::Value,
    /// Hook names, in tensor order.
    pub hooks: Vec<String>,
    /// Per hook (same order as `hooks`), the shape of one token's activation, e.g. `[64]`,
    /// `[4, 16]` for a per-head hook, `[1]` for `hook_scale`. Empty when not recorded (run.json
    /// files written before format 2); when non-empty, every pushed batch must match it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hook_shapes: Vec<Vec<usize>>,
    /// Sparse dictionaries' latents, each stored as a CSR matrix per shard (see
    /// [`LatentsColumn`]). Empty in runs without dictionaries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub latents: Vec<LatentsColumn>,
    /// The model's own outputs stored per token (`siphon extract --outputs`), each a dense
    /// tensor of a fixed element type (see [`OutputColumn`]). Empty in runs without them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<OutputColumn>,
    /// Device mesh.
    pub mesh: serde_json::Value,
    /// How the corpus is partitioned over hosts.
    pub partition: serde_json::Value,
    /// The extraction config (corpus, seq len, batch size...).
    pub config: serde_json::Value,
}

impl RunDescriptor {
    /// The recorded per-token shape of `hook`; `None` when shapes are not recorded or the hook
    /// is not one of the run's.
    pub fn hook_shape(&self, hook: &str) -> Option<&[usize]> {
        let i = self.hooks.iter().position(|h| h == hook)?;
        self.hook_shapes.get(i).map(Vec::as_slice)
    }
}
