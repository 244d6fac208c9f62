//! The blocking facade the extraction loop calls, and the pipeline behind it.
//!
//! ```text
//!  compute thread ──push──▶ [batches: bounded sync channel] ──▶ assembler thread
//!     (blocks only when the queue is full)                       (select tokens; keep long
//!                                                                 runs as they lie, copy,
//!                                                                 shuffle, convert the rest)
//!                                                                      │ full shards
//!                                            ≤ `sealers` threads, each sealing one shard
//!                                            (stats and CRC32C in one pass, header), in order
//!                     [sealed shards: bounded channel] ◀──────────────┘
//!                                   │
//!                                   ▼  tokio runtime owned by the writer
//!         uploads (≤ 2 shards at a time, ≤ `concurrency` part requests in flight)
//!                                   │  completed uploads, in shard order
//!                                   ▼
//!         commit: rewrite manifest.jsonl (the commit point), then the host's stats.json
//! ```
//! Memory is bounded by the two channels and the sealers: about `queue_batches` batches plus
//! `pending_shards + sealers + 3` shards (one being built, two uploading). Much of a shard's
//! memory is its batches' own (the rows it keeps where they lie), which their owners get back
//! once the shard is uploaded.
//!
//! One room per stage: this front ([`ShardWriter`]: open, push, finish), `validate` (the
//! descriptor checked before anything is written), `assemble` (the assembler thread), `seal`
//! (the sealers), `commit` (upload and commit), `summary` (what the writer reports).

mod assemble;
mod commit;
mod seal;
mod summary;
mod validate;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::{Semaphore, mpsc};

use crate::batch::BatchActivations;
use crate::config::{HostId, RunDescriptor, StoreConfig};
use crate::error::{Result, StoreError};
use crate::location::StoreLocation;
use crate::output::OutputColumn;
use crate::run::{ResumePoint, RunJson, claim_run, recover_host};
use crate::shard::{ShardBuilder, ShardIdentity};
use crate::sparse::{LatentsColumn, validate_columns};
use assemble::assemble;
use commit::{CONCURRENT_SHARD_UPLOADS, Committer};
use seal::Sealer;
pub use summary::{HostSummary, WriterTiming};
use validate::validate_hooks;

/// One host's shard writer: blocking API, background assembly and upload.
///
/// ```no_run
/// use siphon_store::{HostId, RunDescriptor, ShardWriter, StoreConfig};
/// # fn batches(_from: Option<serde_json::Value>) -> Vec<siphon_store::BatchActivations> { vec![] }
/// let config = StoreConfig::new("s3://bucket/activations", "run-1", HostId { machine: 0, host: 0 });
/// let descriptor = RunDescriptor { hooks: vec!["blocks.3.hook_resid_post".into()], ..Default::default() };
/// let mut writer = ShardWriter::open(config, descriptor)?;
/// // Resume the data stream after the last committed shard (None on a fresh run).
/// for batch in batches(writer.resume_point().data_position.clone()) {
///     writer.push(batch)?; // blocks only while the store is behind
/// }
/// let summary = writer.finish()?;
/// println!("{} shards, {} tokens", summary.shards, summary.tokens);
/// # Ok::<(), siphon_store::StoreError>(())
/// ```
pub struct ShardWriter {
    runtime: Option<tokio::runtime::Runtime>,
    batches: Option<SyncSender<BatchActivations>>,
    assembler: Option<JoinHandle<Result<()>>>,
    committer: Option<tokio::task::JoinHandle<Result<HostSummary>>>,
    failure: Arc<Mutex<Option<String>>>,
    resume: ResumePoint,
    hooks: Vec<String>,
    latents: Vec<LatentsColumn>,
    outputs: Vec<OutputColumn>,
    /// Per hook, the per-token shape every batch must have: run.json's, or (when it records
    /// none) the first pushed batch's.
    shapes: Vec<Vec<usize>>,
    /// Whether `shapes` come from run.json (for the error message).
    shapes_recorded: bool,
    next_sample: u64,
    /// Set by [`ShardWriter::stop`]: the assembler drops the partial window and shard.
    drop_partial: Arc<AtomicBool>,
    timing: Arc<Mutex<WriterTiming>>,
    holds: (usize, u64),
}

impl ShardWriter {
    /// Opens (or resumes) this host's part of the run.
    ///
    /// Writes `run.json` when the run is new; refuses an existing run whose `run.json` differs;
    /// deletes objects of this host that were never committed; and positions the writer after
    /// the last committed shard (see [`ShardWriter::resume_point`]).
    pub fn open(config: StoreConfig, descriptor: RunDescriptor) -> Result<Self> {
        config.validate()?;
        let location = StoreLocation::open_with_timeout(&config.output, &config.options, config.upload.give_up_after)?;
        Self::open_at(location, config, descriptor)
    }

    /// Like [`ShardWriter::open`], with an already opened location (a custom or wrapped
    /// object store); `config.output` and `config.options` are then ignored.
    pub fn open_at(location: StoreLocation, config: StoreConfig, descriptor: RunDescriptor) -> Result<Self> {
        config.validate()?;
        let other_columns = !descriptor.latents.is_empty() || !descriptor.outputs.is_empty();
        validate_hooks(&descriptor.hooks, &descriptor.hook_shapes, other_columns)?;
        validate_columns(&descriptor.latents, &descriptor.hooks, config.format.dtype)?;
        let taken: Vec<String> =
            descriptor.hooks.iter().chain(descriptor.latents.iter().map(|c| &c.name)).cloned().collect();
        crate::output::validate_columns(&descriptor.outputs, &taken)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("siphon-store")
            .enable_all()
            .build()
            .map_err(|source| StoreError::Io { op: "start runtime", path: "siphon-store".into(), source })?;
        let run_json = RunJson::new(&config.run, &descriptor, &config.format);
        let state = runtime.block_on(async {
            claim_run(&location, &run_json).await?;
            recover_host(&location, &config.run, config.host, &descriptor).await
        })?;
        let resume = state.resume_point();
        tracing::info!(host = %config.host.dir_name(), next_shard = resume.next_shard, next_sample = resume.next_sample, "store opened");

        let failure = Arc::new(Mutex::new(None));
        let timing = Arc::new(Mutex::new(WriterTiming::default()));
        let (batch_tx, batch_rx) = sync_channel(config.queue_batches);
        let (shard_tx, shard_rx) = mpsc::channel(config.pending_shards.max(1));
        // The assembler's end, success or not, for the committer of a host with no shard.
        let (assembled_tx, assembled_rx) = tokio::sync::oneshot::channel();
        let identity = ShardIdentity {
            run: config.run.clone(),
            model: model_id(&descriptor.model),
            host: config.host,
            hooks: descriptor.hooks.clone(),
            latents: descriptor.latents.clone(),
            outputs: descriptor.outputs.clone(),
        };
        let committer = Committer {
            location,
            run: config.run.clone(),
            host: config.host,
            upload: config.upload.clone(),
            requests: Arc::new(Semaphore::new(config.upload.concurrency)),
            lines: state.lines,
            stats: state.stats,
            timing: Arc::clone(&timing),
            assembled: Some(assembled_rx),
        };
        let committer_failure = Arc::clone(&failure);
        let committer = runtime.spawn(async move {
            let result = committer.run(shard_rx).await;
            if let Err(e) = &result {
                record_failure(&committer_failure, e);
            }
            result
        });
        let assembler_failure = Arc::clone(&failure);
        let format = config.format.clone();
        let next_shard = resume.next_shard;
        let sealers = config.sealers.min(std::thread::available_parallelism().map_or(1, |n| n.get()));
        let drop_partial = Arc::new(AtomicBool::new(false));
        let assembler_drop_partial = Arc::clone(&drop_partial);
        let assembler_timing = Arc::clone(&timing);
        let assembler = std::thread::Builder::new()
            .name("siphon-store-assembler".into())
            .spawn(move || {
                let result = std::thread::scope(|scope| {
                    let mut sealer = Sealer::new(scope, shard_tx, sealers);
                    let timing = &assembler_timing;
                    assemble(batch_rx, &mut sealer, identity, format, next_shard, &assembler_drop_partial, timing)?;
                    sealer.flush()
                });
                if let Err(e) = &result {
                    record_failure(&assembler_failure, e);
                }
                let _ = assembled_tx.send(result.is_ok());
                result
            })
            .map_err(|source| StoreError::Io { op: "spawn thread", path: "siphon-store-assembler".into(), source })?;
        Ok(ShardWriter {
            runtime: Some(runtime),
            batches: Some(batch_tx),
            assembler: Some(assembler),
            committer: Some(committer),
            failure,
            next_sample: resume.next_sample,
            resume,
            hooks: descriptor.hooks,
            latents: descriptor.latents,
            outputs: descriptor.outputs,
            shapes_recorded: !descriptor.hook_shapes.is_empty(),
            shapes: descriptor.hook_shapes,
            drop_partial,
            timing,
            holds: (
                // A shuffle window's batches are copied as they arrive: only the queue and the
                // batch being taken hold the caller's memory whole.
                config.queue_batches + 1,
                (config.pending_shards + sealers + CONCURRENT_SHARD_UPLOADS + 1) as u64
                    * config.format.target_shard_bytes,
            ),
        })
    }

    /// The most of the pushed batches' memory the writer holds at once: whole batches (its queue
    /// and the one it takes in) and bytes of rows kept where they lie, in shards not yet
    /// uploaded (each shard past its target by at most one unit). A caller that lends reused
    /// buffers needs that much beyond its own.
    pub fn holds_at_most(&self) -> (usize, u64) {
        self.holds
    }

    /// The run's hooks, in the order every batch must hold them.
    pub fn hooks(&self) -> &[String] {
        &self.hooks
    }

    /// The run's latents columns, in the order every batch must hold them.
    pub fn latents(&self) -> &[LatentsColumn] {
        &self.latents
    }

    /// The run's output columns, in the order every batch must hold them.
    pub fn outputs(&self) -> &[OutputColumn] {
        &self.outputs
    }

    /// Where the writer's time went so far (see [`HostSummary::timing`] for the whole run).
    pub fn timing(&self) -> WriterTiming {
        self.timing.lock().map(|t| *t).unwrap_or_default()
    }

    /// Where the data stream must resume: the first batch pushed must start at
    /// `next_sample`, from data position `data_position`.
    pub fn resume_point(&self) -> &ResumePoint {
        &self.resume
    }

    /// Queues a batch; blocks while the queue is full. Fails on a malformed batch, on a hook
    /// whose per-token shape differs from run.json's (or, when run.json records none, from the
    /// first batch's), on a batch that does not start where the previous one ended, or when
    /// the background writer failed.
    pub fn push(&mut self, batch: BatchActivations) -> Result<()> {
        batch.validate(&self.hooks, &self.latents, &self.outputs)?;
        for (hook, expected) in batch.hooks.iter().zip(&self.shapes) {
            if &hook.shape != expected {
                let reason = if self.shapes_recorded {
                    format!("hook {} has per-token shape {:?}, run.json records {expected:?}", hook.hook, hook.shape)
                } else {
                    format!(
                        "hook {} changed its per-token shape from {expected:?} (earlier batches) to {:?}",
                        hook.hook, hook.shape
                    )
                };
                return Err(StoreError::InvalidBatch { first_sample: batch.first_sample, reason });
            }
        }
        if batch.first_sample != self.next_sample {
            return Err(StoreError::InvalidBatch {
                first_sample: batch.first_sample,
                reason: format!(
                    "expected the batch to start at sample {} (samples must be contiguous per host)",
                    self.next_sample
                ),
            });
        }
        let end = batch.sample_end();
        let sender = self.batches.as_ref().ok_or_else(|| StoreError::Background("writer already finished".into()))?;
        let shapes = self.shapes.is_empty().then(|| batch.hook_shapes());
        if sender.send(batch).is_err() {
            return Err(self.root_failure());
        }
        self.next_sample = end;
        if let Some(shapes) = shapes {
            self.shapes = shapes;
        }
        Ok(())
    }

    /// Flushes the last (possibly small) shard, waits for every upload and commit, and returns
    /// the host's summary.
    pub fn finish(self) -> Result<HostSummary> {
        self.close()
    }

    /// Stops early (a preempted host): the shards that the pushed batches fill completely are
    /// sealed, uploaded and committed; the partial window and shard at the end are dropped.
    /// Shard boundaries stay those of an uninterrupted run, so a resumed run (which restarts
    /// after the last committed shard) writes exactly what that run would.
    pub fn stop(self) -> Result<HostSummary> {
        self.drop_partial.store(true, Ordering::SeqCst);
        self.close()
    }

    fn close(mut self) -> Result<HostSummary> {
        drop(self.batches.take());
        let assembled = self
            .assembler
            .take()
            .map(|h| h.join().unwrap_or_else(|_| Err(StoreError::Background("assembler panicked".into()))));
        let runtime = self.runtime.take().expect("runtime lives until finish");
        let Some(committer) = self.committer.take() else {
            // `push` already waited for it and reported its failure.
            runtime.shutdown_background();
            return Err(StoreError::Background(self.failure_message()));
        };
        let committed =
            runtime.block_on(committer).unwrap_or_else(|e| Err(StoreError::Background(format!("committer task: {e}"))));
        runtime.shutdown_background();
        // The committer's error is the root cause when both failed.
        let summary = committed?;
        assembled.unwrap_or(Ok(()))?;
        Ok(summary)
    }

    /// Why the background writer stopped taking batches: the committer's own error when it
    /// failed (the assembler stops because the uploader did, and may record that first), else
    /// the first recorded failure.
    fn root_failure(&mut self) -> StoreError {
        if let (Some(runtime), Some(committer)) = (self.runtime.as_ref(), self.committer.take())
            && let Ok(Err(e)) = runtime.block_on(committer)
        {
            return e;
        }
        StoreError::Background(self.failure_message())
    }

    fn failure_message(&self) -> String {
        self.failure.lock().map(|f| f.clone()).ok().flatten().unwrap_or_else(|| "background writer stopped".into())
    }
}

impl Drop for ShardWriter {
    fn drop(&mut self) {
        // Dropped without finish (an error upstream): stop accepting work; whatever was not
        // committed is removed by the next open of this host.
        drop(self.batches.take());
        if let Some(handle) = self.assembler.take() {
            let _ = handle.join();
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn record_failure(slot: &Mutex<Option<String>>, error: &StoreError) {
    if let Ok(mut slot) = slot.lock()
        && slot.is_none()
    {
        *slot = Some(error.to_string());
    }
}

/// One batch as a shard of its own, in the store's format (its kept rows, or every row and its
/// mask with `keep_excluded`; no shuffle): what a live stream sends for each batch. Values that
/// are NaN or ±Inf are refused as a shard's seal refuses them.
pub fn batch_shard(
    run: &str,
    descriptor: &RunDescriptor,
    host: HostId,
    format: &crate::config::ShardFormat,
    index: u64,
    batch: BatchActivations,
) -> Result<bytes::Bytes> {
    let identity = ShardIdentity {
        run: run.into(),
        model: model_id(&descriptor.model),
        host,
        hooks: descriptor.hooks.clone(),
        latents: descriptor.latents.clone(),
        outputs: descriptor.outputs.clone(),
    };
    let mut builder =
        ShardBuilder::new(identity, crate::config::ShardFormat { shuffle: None, ..format.clone() }, index);
    builder.add_unit(vec![batch])?;
    builder.check_finite()?;
    Ok(builder.into_file().concat().into())
}

/// A short model id for shard metadata: the descriptor's `id`/`name` field, or its JSON.
fn model_id(model: &serde_json::Value) -> String {
    match model {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Object(map) => match map.get("id").or_else(|| map.get("name")) {
            Some(serde_json::Value::String(s)) => s.clone(),
            _ => model.to_string(),
        },
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    }
}
