//! Activation shards (safetensors), manifests, statistics and exactly-once uploads to object stores.
//!
//! Each host of an extraction run owns a [`ShardWriter`]. The compute loop pushes one
//! [`BatchActivations`] per batch; a background pipeline selects the included tokens,
//! optionally shuffles them across a window of batches, converts to the stored dtype, seals
//! ~256 MB safetensors shards, uploads them through object_store (local disk, `s3://`, `gs://`,
//! `az://`) and commits each shard by rewriting the host's `manifest.jsonl`.
//!
//! Dataset layout:
//! ```text
//! {output}/{run}/run.json                       format, config, model, hooks and their per-token
//!                                               shapes, mesh, partition
//! {output}/{run}/stats.json                     per hook count/mean/variance/mean norm, per latent
//!                                               firings/sum/max (all hosts)
//! {output}/{run}/machine_{m:03}_host_{h:02}/
//!     shard_{n:06}.safetensors                  per hook [tokens, *shape] (e.g. [tokens, d_model],
//!                                               [tokens, n_heads, d_head]); token_ids, doc_index,
//!                                               position, sample_index [tokens]; mask (optional);
//!                                               per dictionary's latents a CSR matrix over the
//!                                               rows: {name}.indptr, .indices, .values
//!                                               ([`LatentsColumn`])
//!     manifest.jsonl                            one line per committed shard
//!     stats.json                                this host's statistics
//! ```
//!
//! Format: [`FORMAT_TAG`] (`siphon-activations/2`) in run.json and every shard. Format 1 stored
//! only `[tokens, d_model]` hooks and gave `ln_final.hook_normalized` another meaning (see
//! [`FORMAT_TAG`]); format-1 runs are still verified and inspected, never resumed.
//!
//! Exactly-once: a shard belongs to the dataset only once its manifest line is written, which
//! happens after its upload completed. Reopening a host deletes everything its manifest does not
//! name and resumes after the last committed shard ([`ShardWriter::resume_point`]); shard
//! contents are a pure function of the input batches, so a restarted run writes the same bytes.
//!
//! Reading a shard in Python (`pip install numpy safetensors ml_dtypes`; `ml_dtypes` teaches
//! numpy the bfloat16 of bf16 shards):
//! ```text
//! import ml_dtypes; from safetensors.numpy import load_file; t = load_file("shard_000000.safetensors"); t["token_ids"], t["blocks.3.hook_resid_post"]
//! ```
//!
//! Backends: local disk (shards and manifests are fsync-ed before a commit counts), S3, GCS,
//! Azure and HTTP through object_store, with client retries plus whole-shard retries with
//! backoff. A shard upload killed midway leaves an incomplete multipart upload on S3 that no
//! listing shows: give the bucket an `AbortIncompleteMultipartUpload` lifecycle rule. GCS is
//! tested for listing and reads against fake-gcs-server only, because the emulator lacks the
//! XML multipart API that object_store's GCS client writes with; writes are tested on S3 (moto).
//!
//! # Failures, stopping, latents, roles and fp8
//!
//! Failing writes end in one of two ways: errors that may pass (5xx, 429, resets, stalled
//! requests) are retried, requests by object_store and whole shard uploads by `upload_object`, until
//! `UploadConfig::give_up_after` (`--store-timeout`), then `StoreError::GaveUp` with the last
//! error; a full disk, quota or file-size limit is `StoreError::OutOfSpace` at once.
//!
//! `ShardWriter::finish` commits everything pushed, the last shard possibly short;
//! `ShardWriter::stop` (a preempted host) commits only the shards the pushed batches complete and
//! drops the partial one, so shard boundaries stay those of an uninterrupted run.
//!
//! A run with sparse dictionaries (`RunDescriptor::latents`, a `LatentsColumn` each) takes each
//! batch's `BatchLatents` as the devices return them (per token its `cap` largest latents, `-1`
//! past its firings, and its firings); like a hook's rows (`dense.rs`) they are a column of the
//! shard (`column.rs`); `sparse.rs`, which holds these types and their checks, compacts the
//! stored tokens' rows into a CSR
//! matrix per shard (`{name}.indptr`, `.indices` as i32, each row's latents ascending, `.values`
//! in the stored dtype, never fp8) and counts each latent's firings, sum and largest value over
//! the included tokens (`LatentStats`, in `stats.json` beside the hooks'), which a resume and
//! `verify_run` recompute from the CSR read back. A stored token that fired more than the cap is
//! refused, naming the column, sequence and position (`kept_firings`, the one place
//! siphon refuses it: `siphon forward` uses it too).
//!
//! A run of conversations (`ShardFormat::roles`) stores each token's role as a `role` (U8) tensor.
//! A run of pooled rows (`ShardFormat::pooled`, `--positions mean`: each row the mean of a
//! document's tokens) stores each row's first position and count as `position_first` and
//! `count` (I32); its `position` is the row's last.
//! An fp8 run (`DType::Fp8`) takes rows quantized by the program (each row's f32 scale,
//! then its `float8_e4m3fn` values) and stores the values as `F8_E4M3` with `{hook}.fp8_scale`
//! beside them; its statistics are over the dequantized values, and the writer never converts to
//! or from fp8. `WriterTiming` sums the CPU seconds (the conversion's and the sealers' threads)
//! and bytes of the conversion and sealing stages, and the upload stage's seconds and bytes
//! (`HostSummary::timing`); `siphon-store-bench host` reads them to give each stage's
//! core-seconds per GB.
#![deny(missing_docs)]

mod batch;
mod column;
mod config;
mod dense;
mod error;
mod failpoint;
mod float_text;
mod format;
mod location;
mod manifest;
mod moments;
mod output;
mod probe;
mod run;
mod shard;
mod sparse;
mod stats;
pub mod synthetic;
mod tensor;
mod upload;
mod verify;
mod writer;

pub use batch::{BatchActivations, DType, HookActivations, Pooled, fp8_scale_name};
pub use config::{
    DEFAULT_GIVE_UP_AFTER, DEFAULT_SEALERS, DEFAULT_TARGET_SHARD_BYTES, HostId, MAX_BACKOFF, MIN_PART_BYTES,
    RunDescriptor, ShardFormat, ShuffleConfig, StoreConfig, UploadConfig,
};
pub use error::{Result, StoreError};
pub use format::{FORMAT_TAG, FORMAT_VERSION, READABLE_FORMAT_VERSIONS, format_version};
pub use location::{MANIFEST_NAME, RUN_JSON_NAME, STATS_NAME, StoreLocation, parse_host_dir, shard_name};
pub use manifest::{ManifestLine, parse_manifest, parse_manifest_torn, render_manifest};
pub use output::{BatchOutput, OutputColumn, OutputDType, OutputStats};
pub use probe::{PROBE_BYTES, ProbeReport, probe, probe_blocking};
pub use run::{ResumePoint, RunJson, list_hosts, merge_host_stats};
pub use shard::{SealedShard, ShardSummary, check_format, summarize_shard};
pub use sparse::{BatchLatents, LatentStats, LatentsColumn, kept_firings};
pub use stats::{HookStats, HookStatsJson, RunStats, StatsFile, merge_run_stats};
pub use tensor::RESERVED_TENSOR_NAMES;
pub use upload::upload_object;
pub use verify::{HostReport, VerifyReport, finalize_run, verify_run, verify_run_blocking};
pub use writer::{HostSummary, ShardWriter, WriterTiming, batch_shard};
