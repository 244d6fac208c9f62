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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use futures::StreamExt;
use futures::stream::FuturesOrdered;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use tokio::sync::{Semaphore, mpsc};

use crate::batch::{BatchActivations, DType, check_token_shape};
use crate::column::ColumnPool;
use crate::config::{HostId, LatentsColumn, RunDescriptor, StoreConfig};
use crate::error::{Result, StoreError};
use crate::failpoint::{self, Failpoint};
use crate::location::StoreLocation;
use crate::manifest::{ManifestLine, render_manifest};
use crate::run::{ResumePoint, RunJson, claim_run, recover_host};
use crate::shard::{RESERVED_TENSOR_NAMES, SealedShard, ShardBuilder, ShardIdentity};
use crate::stats::{self, RunStats};
use crate::upload::{retried, upload_object};

/// Shards uploading at the same time (their parts share the request limit).
const CONCURRENT_SHARD_UPLOADS: usize = 2;

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

/// What one host wrote, returned by [`ShardWriter::finish`].
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
        validate_hooks(&descriptor.hooks, &descriptor.hook_shapes, !descriptor.latents.is_empty())?;
        validate_latents(&descriptor, config.format.dtype)?;
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
        let identity = ShardIdentity {
            run: config.run.clone(),
            model: model_id(&descriptor.model),
            host: config.host,
            hooks: descriptor.hooks.clone(),
            latents: descriptor.latents.clone(),
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
        batch.validate(&self.hooks, &self.latents)?;
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

fn validate_hooks(hooks: &[String], shapes: &[Vec<usize>], latents: bool) -> Result<()> {
    if hooks.is_empty() && !latents {
        return Err(StoreError::InvalidConfig("no hooks or latents to store".into()));
    }
    if !shapes.is_empty() && shapes.len() != hooks.len() {
        return Err(StoreError::InvalidConfig(format!(
            "{} hook shapes for {} hooks {hooks:?}: give one per hook, or none",
            shapes.len(),
            hooks.len()
        )));
    }
    for (hook, shape) in hooks.iter().zip(shapes) {
        check_token_shape(shape).map_err(|e| StoreError::InvalidConfig(format!("hook {hook} {e}")))?;
    }
    let mut seen = std::collections::HashSet::new();
    for hook in hooks {
        if hook.is_empty()
            || RESERVED_TENSOR_NAMES.contains(&hook.as_str())
            || hook == "__metadata__"
            || hook.ends_with(".fp8_scale")
        {
            return Err(StoreError::InvalidConfig(format!(
                "hook name {hook:?} is empty or reserved ({RESERVED_TENSOR_NAMES:?}, `*.fp8_scale`)"
            )));
        }
        if !seen.insert(hook) {
            return Err(StoreError::InvalidConfig(format!("hook {hook:?} listed twice")));
        }
    }
    Ok(())
}

/// Checks the latents columns: stored as f32, bf16 or f16; a width and a cap; names that are
/// not a hook's, a reserved one or another column's.
fn validate_latents(descriptor: &RunDescriptor, dtype: DType) -> Result<()> {
    let bad = |reason: String| Err(StoreError::InvalidConfig(reason));
    if !descriptor.latents.is_empty() && !matches!(dtype, DType::F32 | DType::Bf16 | DType::F16) {
        return bad(format!("latents are stored as f32, bf16 or f16, not {}: choose another --dtype", dtype.name()));
    }
    let mut seen: std::collections::HashSet<String> = descriptor.hooks.iter().cloned().collect();
    for column in &descriptor.latents {
        if column.width == 0 || column.cap == 0 || column.cap > column.width {
            return bad(format!(
                "latents {}: {} kept per token of {} latents (both > 0, the cap at most the width)",
                column.name, column.cap, column.width
            ));
        }
        if column.width > crate::sparse::MAX_LATENTS {
            return bad(format!(
                "latents {}: {} latents, more than the {} a column may have",
                column.name,
                column.width,
                crate::sparse::MAX_LATENTS
            ));
        }
        let names = std::iter::once(column.name.clone()).chain(column.tensor_names());
        for name in names {
            if RESERVED_TENSOR_NAMES.contains(&name.as_str()) || name.is_empty() || !seen.insert(name.clone()) {
                return bad(format!("latents name {name:?} is empty, reserved or already a hook's or a column's"));
            }
        }
    }
    Ok(())
}

/// A short model id for shard metadata: the descriptor's `id`/`name` field, or its JSON.
/// One batch as a shard of its own, in the store's format (its kept rows, or every row and its
/// mask with `keep_excluded`; no shuffle): what a live stream sends for each batch.
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
    };
    let mut builder =
        ShardBuilder::new(identity, crate::config::ShardFormat { shuffle: None, ..format.clone() }, index);
    builder.add_unit(vec![batch])?;
    Ok(builder.into_file().concat().into())
}

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

/// Shards being sealed, each on a thread of its own (at most `max` at once), handed to the
/// uploader in the order they were built, each as soon as it and those before it are sealed.
struct Sealer<'scope, 'env> {
    scope: &'scope std::thread::Scope<'scope, 'env>,
    /// Where each shard's seal will land, in build order; bounded so that at most `max` seal.
    order: Option<SyncSender<Receiver<Result<SealedShard>>>>,
    /// Takes the seals in order and hands them to the uploader.
    hand_on: Option<std::thread::ScopedJoinHandle<'scope, Result<()>>>,
}

impl<'scope, 'env> Sealer<'scope, 'env> {
    fn new(scope: &'scope std::thread::Scope<'scope, 'env>, shards: mpsc::Sender<SealedShard>, max: usize) -> Self {
        // The hand-on thread waits on one seal while `max - 1` more are queued behind it.
        let (order, seals) = sync_channel::<Receiver<Result<SealedShard>>>(max.max(1) - 1);
        let hand_on = scope.spawn(move || {
            for seal in seals {
                let shard = seal.recv().map_err(|_| StoreError::Background("a sealer panicked".into()))??;
                shards.blocking_send(shard).map_err(|_| StoreError::Background("uploader stopped".into()))?;
            }
            Ok(())
        });
        Sealer { scope, order: Some(order), hand_on: Some(hand_on) }
    }

    /// Starts sealing `builder` once fewer than `max` shards are sealing.
    fn seal(&mut self, builder: ShardBuilder, timing: &'scope Mutex<WriterTiming>) -> Result<()> {
        let (done, seal) = std::sync::mpsc::channel();
        let order = self.order.as_ref().ok_or_else(|| StoreError::Background("sealer already flushed".into()))?;
        if order.send(seal).is_err() {
            // The hand-on thread stopped: its error is the reason.
            return self.flush().and(Err(StoreError::Background("uploader stopped".into())));
        }
        self.scope.spawn(move || {
            let start = thread_cpu_seconds();
            let shard = builder.seal();
            if let (Ok(shard), Ok(mut t)) = (&shard, timing.lock()) {
                t.seal_s += thread_cpu_seconds() - start;
                t.seal_bytes += shard.bytes;
            }
            let _ = done.send(shard);
        });
        Ok(())
    }

    /// Waits until every shard started is sealed and handed on.
    fn flush(&mut self) -> Result<()> {
        drop(self.order.take());
        match self.hand_on.take() {
            Some(handle) => handle.join().map_err(|_| StoreError::Background("the hand-on thread panicked".into()))?,
            None => Ok(()),
        }
    }
}

/// The calling thread's CPU time (user and system), in seconds: a stage's cost in core-seconds,
/// however many other threads share the cores.
fn thread_cpu_seconds() -> f64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec to write; the thread CPU clock exists on Linux and macOS.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9
}

/// The assembler thread: batches → windows → shards, sealed by `sealer`.
fn assemble<'scope>(
    batches: Receiver<BatchActivations>,
    sealer: &mut Sealer<'scope, '_>,
    identity: ShardIdentity,
    format: crate::config::ShardFormat,
    mut next_shard: u64,
    drop_partial: &AtomicBool,
    timing: &'scope Mutex<WriterTiming>,
) -> Result<()> {
    let window_batches = format.shuffle.map_or(1, |s| s.window_batches);
    let target = format.target_shard_bytes;
    let mut window: Vec<BatchActivations> = Vec::with_capacity(window_batches);
    let pool = ColumnPool::default();
    let mut builder = ShardBuilder::pooled(identity.clone(), format.clone(), next_shard, pool.clone());
    let add = |builder: &mut ShardBuilder, unit: Vec<BatchActivations>| {
        let start = thread_cpu_seconds();
        let bytes: usize = unit.iter().flat_map(|b| &b.hooks).map(|h| h.data.len()).sum();
        builder.add_unit(unit)?;
        if let Ok(mut t) = timing.lock() {
            t.convert_s += thread_cpu_seconds() - start;
            t.convert_bytes += bytes as u64;
        }
        Ok::<(), StoreError>(())
    };
    for mut batch in batches.iter() {
        if window_batches > 1 {
            // A window holds its batches until it is full: keep their rows in memory of our
            // own, so that the caller's buffers are free as soon as the batch is taken.
            for hook in &mut batch.hooks {
                hook.data = bytes::Bytes::copy_from_slice(&hook.data);
            }
        }
        window.push(batch);
        if window.len() == window_batches {
            add(&mut builder, std::mem::replace(&mut window, Vec::with_capacity(window_batches)))?;
            if builder.data_bytes() >= target {
                next_shard += 1;
                let next = ShardBuilder::pooled(identity.clone(), format.clone(), next_shard, pool.clone());
                let full = std::mem::replace(&mut builder, next);
                sealer.seal(full, timing)?;
            }
        }
    }
    if drop_partial.load(Ordering::SeqCst) {
        // Stopped early: what is not a whole shard is redone by the resumed run.
        return Ok(());
    }
    // Input closed: a partial window and a partial shard are still part of the dataset.
    add(&mut builder, window)?;
    if !builder.is_empty() {
        sealer.seal(builder, timing)?;
    }
    Ok(())
}

/// Uploads sealed shards and commits them in order.
struct Committer {
    location: StoreLocation,
    run: String,
    host: HostId,
    upload: crate::config::UploadConfig,
    requests: Arc<Semaphore>,
    lines: Vec<ManifestLine>,
    stats: RunStats,
    timing: Arc<Mutex<WriterTiming>>,
}

impl Committer {
    async fn run(mut self, mut shards: mpsc::Receiver<SealedShard>) -> Result<HostSummary> {
        let mut uploads = FuturesOrdered::new();
        let mut input_open = true;
        loop {
            tokio::select! {
                shard = shards.recv(), if input_open && uploads.len() < CONCURRENT_SHARD_UPLOADS => match shard {
                    Some(shard) => uploads.push_back(self.upload_shard(shard)),
                    None => input_open = false,
                },
                Some(uploaded) = uploads.next(), if !uploads.is_empty() => {
                    let (shard, start) = uploaded?;
                    let bytes = shard.bytes;
                    self.commit(shard).await?;
                    if let Ok(mut t) = self.timing.lock() {
                        t.upload_s += start.elapsed().as_secs_f64();
                        t.upload_bytes += bytes;
                    }
                }
                else => break,
            }
            if !input_open && uploads.is_empty() {
                break;
            }
        }
        Ok(HostSummary {
            host: self.host,
            shards: self.lines.len() as u64,
            tokens: self.lines.iter().fold(0u64, |n, l| n.saturating_add(l.tokens)),
            included_tokens: self.lines.iter().fold(0u64, |n, l| n.saturating_add(l.included_tokens)),
            samples_end: self.lines.last().map_or(0, |l| l.samples[1]),
            data_position: self.lines.last().map(|l| l.data_position_after.clone()),
            bytes: self.lines.iter().fold(0u64, |n, l| n.saturating_add(l.bytes)),
            stats: self.stats,
            timing: self.timing.lock().map(|t| *t).unwrap_or_default(),
        })
    }

    fn upload_shard(
        &self,
        shard: SealedShard,
    ) -> impl Future<Output = Result<(SealedShard, std::time::Instant)>> + use<> {
        let store = Arc::clone(self.location.store());
        let path = self.location.shard(&self.run, self.host, shard.index);
        let local = self.location.local_dir().filter(|_| self.upload.fsync_local).map(|d| d.join(path.as_ref()));
        let upload = self.upload.clone();
        let requests = Arc::clone(&self.requests);
        async move {
            let start = std::time::Instant::now();
            failpoint::hit(Failpoint::BeforeUpload, shard.index);
            upload_object(&store, &path, &shard.chunks, &upload, &requests, shard.index).await?;
            if let Some(local) = local {
                sync_file(local).await?;
            }
            Ok((shard, start))
        }
    }

    async fn commit(&mut self, shard: SealedShard) -> Result<()> {
        failpoint::hit(Failpoint::AfterUploadBeforeManifest, shard.index);
        self.lines.push(ManifestLine::for_shard(&shard));
        let manifest = self.location.manifest(&self.run, self.host);
        self.put(&manifest, render_manifest(&self.lines).into_bytes()).await?;
        // Committed. Host stats are a cache of the committed shards' statistics: a crash
        // before this put is repaired on resume by recomputing from the shards.
        stats::merge_run_stats(&mut self.stats, &shard.stats)?;
        let stats_path = self.location.host_stats(&self.run, self.host);
        let body = serde_json::to_vec(&stats::to_file(&self.stats, Some(shard.index))).expect("stats serialize");
        self.put(&stats_path, body).await?;
        tracing::debug!(shard = shard.index, bytes = shard.bytes, tokens = shard.tokens, "shard committed");
        Ok(())
    }

    /// Writes a small object, retried like a shard until the store timeout (outside the
    /// request limit: a shard upload waiting here may hold every permit).
    async fn put(&self, path: &Path, body: Vec<u8>) -> Result<()> {
        let payload = PutPayload::from(body);
        let store = self.location.store();
        retried("put", path, &self.upload, || async { store.put(path, payload.clone()).await.map(drop) }).await?;
        if let Some(dir) = self.location.local_dir().filter(|_| self.upload.fsync_local) {
            sync_file(dir.join(path.as_ref())).await?;
        }
        Ok(())
    }
}

/// object_store's local backend does not fsync; a commit must survive a power loss.
async fn sync_file(path: std::path::PathBuf) -> Result<()> {
    tokio::task::spawn_blocking(move || {
        let file = std::fs::File::open(&path).map_err(|source| StoreError::Io {
            op: "open for sync",
            path: path.clone(),
            source,
        })?;
        file.sync_all().map_err(|source| StoreError::Io { op: "sync", path, source })
    })
    .await
    .map_err(|e| StoreError::Background(format!("sync task: {e}")))?
}
