//! What the writer reports: its stages' CPU seconds and bytes ([`WriterTiming`]) and what one
//! host wrote ([`HostSummary`]).

use crate::config::HostId;
use crate::stats::RunStats;

/// CPU seconds and bytes of the writer's stages, summed over what it took so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WriterTiming {
    /// Taking batches in: the kept rows selected (shuffled) and converted into the shard (CPU
    /// seconds of the thread doing it).
    pub convert_s: f64,
    /// Bytes of activations taken in.
    pub convert_bytes: u64,
    /// Sealing shards: statistics, header and CRC32C (CPU seconds, summed over the sealers).
    pub seal_s: f64,
    /// Bytes of shards sealed.
    pub seal_bytes: u64,
    /// Uploading shards and committing them (manifest and statistics), each shard's time from
    /// its upload's start to its commit (shards upload side by side, so this may exceed the
    /// wall-clock time).
    pub upload_s: f64,
    /// Bytes of shards committed.
    pub upload_bytes: u64,
}

/// What one host wrote, returned by [`ShardWriter::finish`](crate::ShardWriter::finish).
#[derive(Debug, Clone)]
pub struct HostSummary {
    /// The host.
    pub host: HostId,
    /// Committed shards (including those from before a restart).
    pub shards: u64,
    /// Token rows committed.
    pub tokens: u64,
    /// Rows included by the mask.
    pub included_tokens: u64,
    /// Samples committed: `0 .. samples_end`.
    pub samples_end: u64,
    /// Data position after the last committed shard.
    pub data_position: Option<serde_json::Value>,
    /// Statistics of all committed shards of this host.
    pub stats: RunStats,
    /// Bytes committed.
    pub bytes: u64,
    /// Where the writer's time went this session.
    pub timing: WriterTiming,
}
