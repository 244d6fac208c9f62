//! The loop's output path, overlapped with the devices: while step N+1's program runs, step
//! N's activations are copied to the host, handed to the shard writers, converted into
//! shards, sealed and uploaded.
//!
//! ```text
//!  loop thread   read N+1 ─▶ take a free slot ─▶ launch N+1 ─▶ read N+2 ─▶ take a free slot …
//!                                 ▲ waits here while every slot is taken: the host is the bound
//!  drain thread  wait for N's program ─▶ copy N's rows into its slot ─▶ push to the writers
//!                   ▲ waits here while the device computes: the device is the bound
//!  writers       keep the kept rows where they lie until their shard is uploaded (copying only
//!                short runs): the slot is free again when the last shard holding its rows is
//! ```
//!
//! A slot is one step's host memory: for each member that writes, one reused
//! [`siphon_runtime::HostBuffer`] per hook (pinned for DMA where the plugin allows). `depth`
//! slots exist from the start, so at most `depth` steps are in flight on the devices; at
//! depth 1 each step is copied and taken by the writers before the next launches. The writers
//! hold slots beyond that (the rows of shards not yet uploaded), so the pool grows, one slot
//! at a time when none is free, up to `depth` plus what the writers may hold
//! ([`siphon_store::ShardWriter::holds_at_most`]): the host memory of the path is bounded by
//! that. Steps reach the writers in order at any depth, so the shards do not depend on it.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use siphon_engine::Launched;
use siphon_runtime::HostBuffer;
use siphon_store::{BatchActivations, BatchLatents, BatchOutput, DType, HookActivations};

use super::progress::Bound;

/// The default number of steps in flight.
pub const DEFAULT_DEPTH: usize = 2;

/// One step's host memory: `buffers[member][hook]`, empty for a member that writes nothing.
pub struct Slot {
    buffers: Vec<Vec<HostBuffer>>,
}

impl Slot {
    /// A slot of `sizes[member][hook]` bytes, each from `alloc`.
    pub fn new(sizes: &[Vec<usize>], alloc: impl Fn(usize) -> anyhow::Result<HostBuffer>) -> anyhow::Result<Slot> {
        let buffers = sizes.iter().map(|hooks| hooks.iter().map(|&n| alloc(n)).collect()).collect();
        Ok(Slot { buffers: buffers_of(buffers)? })
    }

    /// Whether the device writes its buffers directly (pinned for DMA).
    pub fn pinned(&self) -> bool {
        self.buffers.iter().flatten().all(HostBuffer::is_pinned)
    }
}

fn buffers_of(nested: Vec<Vec<anyhow::Result<HostBuffer>>>) -> anyhow::Result<Vec<Vec<HostBuffer>>> {
    nested.into_iter().map(|hooks| hooks.into_iter().collect()).collect()
}

/// A slot on loan to the writers; back in the pool when the last of its buffers is dropped.
struct OnLoan {
    slot: Option<Slot>,
    home: SyncSender<Slot>,
}

impl Drop for OnLoan {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            // The pool is gone when the pipeline has ended; the slot is then freed.
            let _ = self.home.send(slot);
        }
    }
}

/// One hook's rows in a slot on loan: what the writer's `Bytes` hold.
struct Rows {
    loan: Arc<OnLoan>,
    member: usize,
    hook: usize,
}

impl AsRef<[u8]> for Rows {
    fn as_ref(&self) -> &[u8] {
        self.loan.slot.as_ref().expect("a slot on loan").buffers[self.member][self.hook].as_slice()
    }
}

/// One step in flight, from the loop to the drain thread.
pub struct Step {
    /// The program's outputs on the devices.
    pub launched: Launched,
    /// Where its rows go.
    pub slot: Slot,
    /// Each member's batch (`None` once its reader's slice is done).
    pub batches: Vec<Option<siphon_data::Batch>>,
    /// Each member's chosen rows (`--positions`), which the program returned instead of
    /// every token's.
    pub chosen: Vec<Option<siphon_data::Selection>>,
    /// Each member's documents' kept columns (`--keep-columns`; empty without).
    pub documents: Vec<Vec<(i64, String)>>,
    /// When the loop launched it.
    pub launched_at: Instant,
}

/// What the writers' batches hold.
pub struct Batches {
    /// The stored dtype (the program returns it).
    pub dtype: DType,
    /// Each hook's per-token shape.
    pub shapes: Vec<Vec<usize>>,
    /// Whether each token's role is stored.
    pub roles: bool,
    /// Whether chosen rows' first positions and counts are stored (`--positions mean`).
    pub pooled: bool,
    /// Each latents column's name and latents kept per token, in the dictionaries' order.
    pub latents: Vec<(String, usize)>,
    /// The model's output columns, in the program's order.
    pub outputs: Vec<siphon_store::OutputColumn>,
    /// Whether outputs that are NaN or ±Inf are stored (else refused).
    pub allow_non_finite: bool,
}

/// Where one member's rows go: its shard writer (members that write nothing have none),
/// and what turns its batch into the store's.
pub struct Sink {
    /// The output and the tokens its host committed before this session.
    pub writer: Option<(super::output::Output, u64)>,
    /// The member's process in the engine's views (whose rows it reads back).
    pub process: usize,
    /// The host it writes as.
    pub host: siphon_store::HostId,
}

/// Seconds and bytes of the path's stages, summed over the steps.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct PathTiming {
    /// Steps run.
    pub steps: u64,
    /// The devices' time on the programs: each step from its launch (or the previous step's
    /// end, when it queued behind it) to its outputs being ready.
    pub program_s: f64,
    /// Copying the rows to the host.
    pub copy_s: f64,
    /// Bytes copied to the host.
    pub copy_bytes: u64,
    /// Handing batches to the writers (waiting while their queues are full).
    pub push_s: f64,
    /// The loop waiting for a free slot: the host side was slower than the devices.
    pub wait_host_s: f64,
    /// The drain thread waiting for programs: the devices were slower than the host side.
    pub wait_device_s: f64,
}

impl PathTiming {
    /// Which side bounds the run so far: the one the other waited for longer.
    pub fn bound(&self) -> Bound {
        if self.wait_host_s > self.wait_device_s { Bound::Host } else { Bound::Device }
    }
}

/// What the drain thread gives back: the sinks and the path's timing, or its error.
type Drained = anyhow::Result<(Vec<Sink>, PathTiming)>;

/// The drain thread and the pool of slots.
pub struct Pipeline {
    free: Receiver<Slot>,
    /// Slots that exist, and the most that may.
    slots: usize,
    capacity: usize,
    steps: Option<SyncSender<Step>>,
    drain: Option<JoinHandle<Drained>>,
    wait_host: Duration,
    timing: Arc<std::sync::Mutex<PathTiming>>,
}

impl Pipeline {
    /// Starts the drain thread over `sinks` (one per member, in member order) with `slots` (the
    /// pipeline's depth), a pool that may grow to `capacity` slots; `batches` describes what the
    /// writers take.
    pub fn start(slots: Vec<Slot>, capacity: usize, sinks: Vec<Sink>, batches: Batches) -> anyhow::Result<Pipeline> {
        let depth = slots.len().max(1);
        let capacity = capacity.max(depth);
        let (home, free) = sync_channel(capacity);
        for slot in slots {
            home.send(slot).expect("the pool holds every slot");
        }
        let (steps, queued) = sync_channel::<Step>(depth);
        let timing = Arc::new(std::sync::Mutex::new(PathTiming::default()));
        let shared = Arc::clone(&timing);
        let drain = std::thread::Builder::new()
            .name("siphon-drain".into())
            .spawn(move || drain(queued, home, sinks, &batches, &shared))
            .context("cannot start the drain thread")?;
        Ok(Pipeline {
            free,
            slots: depth,
            capacity,
            steps: Some(steps),
            drain: Some(drain),
            wait_host: Duration::ZERO,
            timing,
        })
    }

    /// A free slot: one given back, else a new one from `alloc` while the pool may grow, else
    /// waits for one. Fails when the drain thread has stopped (its error is
    /// [`Pipeline::finish`]'s).
    pub fn slot(&mut self, alloc: impl FnOnce() -> anyhow::Result<Slot>) -> anyhow::Result<Slot> {
        if let Ok(slot) = self.free.try_recv() {
            return Ok(slot);
        }
        if self.slots < self.capacity {
            self.slots += 1;
            tracing::debug!(slots = self.slots, capacity = self.capacity, "host buffers: one more step's");
            return alloc();
        }
        let start = Instant::now();
        loop {
            match self.free.recv_timeout(Duration::from_millis(100)) {
                Ok(slot) => {
                    self.wait_host += start.elapsed();
                    return Ok(slot);
                }
                Err(_) if self.drain.as_ref().is_some_and(JoinHandle::is_finished) => {
                    anyhow::bail!("the output path stopped")
                }
                Err(_) => {}
            }
        }
    }

    /// Hands a launched step to the drain thread.
    pub fn send(&mut self, step: Step) -> anyhow::Result<()> {
        let steps = self.steps.as_ref().context("the output path has ended")?;
        steps.send(step).map_err(|_| anyhow::anyhow!("the output path stopped"))
    }

    /// Whether the drain thread is still running (else the output path stopped, with its error).
    pub fn running(&self) -> bool {
        self.drain.as_ref().is_some_and(|d| !d.is_finished())
    }

    /// Slots allocated so far.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The timing so far (the loop's own wait included).
    pub fn timing(&self) -> PathTiming {
        let mut timing = self.timing.lock().map(|t| *t).unwrap_or_default();
        timing.wait_host_s = self.wait_host.as_secs_f64();
        timing
    }

    /// Waits for every step in flight to reach its writers and gives the sinks back, with the
    /// path's timing; the drain thread's error, if it failed.
    pub fn finish(mut self) -> anyhow::Result<(Vec<Sink>, PathTiming)> {
        drop(self.steps.take());
        let drain = self.drain.take().expect("finished once");
        let (sinks, mut timing) = drain.join().map_err(|_| anyhow::anyhow!("the drain thread panicked"))??;
        timing.wait_host_s = self.wait_host.as_secs_f64();
        Ok((sinks, timing))
    }
}

/// The drain thread: each step in order, its program awaited, its rows copied into its slot
/// and pushed to the writers.
fn drain(
    steps: Receiver<Step>,
    home: SyncSender<Slot>,
    mut sinks: Vec<Sink>,
    batches_are: &Batches,
    timing: &std::sync::Mutex<PathTiming>,
) -> Drained {
    let mut previous_ready: Option<Instant> = None;
    let mut total = PathTiming::default();
    for Step { launched, mut slot, batches, chosen, documents, launched_at } in steps.iter() {
        let waiting = Instant::now();
        launched.wait()?;
        let ready = Instant::now();
        let device_start = previous_ready.map_or(launched_at, |p| p.max(launched_at));
        total.program_s += ready.saturating_duration_since(device_start).as_secs_f64();
        total.wait_device_s += ready.duration_since(waiting).as_secs_f64();
        previous_ready = Some(ready);

        // Only the members that write copy their rows.
        let mut downloads = Vec::new();
        for (sink, (buffers, batch)) in sinks.iter().zip(slot.buffers.iter_mut().zip(&batches)) {
            if sink.writer.is_some() && batch.is_some() {
                // Chosen rows fill the start of each buffer (sized for every token).
                let sizes = launched.sizes(sink.process);
                total.copy_bytes += sizes.iter().sum::<usize>() as u64;
                let dsts = buffers.iter_mut().zip(sizes).map(|(b, n)| &mut b.as_mut_slice()[..n]);
                downloads.push(launched.copy_into(sink.process, dsts)?);
            }
        }
        for download in downloads {
            download.wait().context("copying activations to the host")?;
        }
        // The dictionaries' latents, a few slots a token, and the model's outputs: copied whole
        // for each writing member.
        let mut latents = Vec::with_capacity(sinks.len());
        let mut outputs = Vec::with_capacity(sinks.len());
        for (sink, batch) in sinks.iter().zip(&batches) {
            let (l, o) = match (&sink.writer, batch) {
                (Some(_), Some(_)) => (launched.latents(sink.process)?, launched.next_token(sink.process)?),
                _ => (Vec::new(), Vec::new()),
            };
            latents.push(l);
            outputs.push(o);
        }
        let copied = Instant::now();
        total.copy_s += copied.duration_since(ready).as_secs_f64();

        drop(launched);
        let loan = Arc::new(OnLoan { slot: Some(slot), home: home.clone() });
        let results = sinks.iter_mut().zip(batches.iter().zip(&chosen)).zip(latents.into_iter().zip(outputs));
        for (member, (((sink, (batch, chosen)), (latents, outputs)), documents)) in results.zip(documents).enumerate() {
            let (Some((writer, _)), Some(batch)) = (sink.writer.as_mut(), batch) else { continue };
            let rows = batch.len() * chosen.as_ref().map_or(batch.seq_len, |c| c.rows);
            let hooks = writer_hooks(writer, batches_are, rows, &loan, member);
            let latents = super::dictionary::for_writer(&batches_are.latents, rows, latents);
            let outputs =
                super::next_token::for_writer(&batches_are.outputs, batch, outputs, batches_are.allow_non_finite)?;
            let mut store_batch = match chosen {
                Some(chosen) => chosen_batch(batch, chosen, hooks, latents, batches_are)?,
                None => to_store_batch(batch, hooks, latents, outputs, batches_are.roles)?,
            };
            store_batch.documents = documents;
            writer.push(store_batch)?;
        }
        drop(loan);
        total.push_s += copied.elapsed().as_secs_f64();
        total.steps += 1;
        if let Ok(mut shared) = timing.lock() {
            *shared = total;
        }
    }
    Ok((sinks, total))
}

/// The member's `rows` rows of each hook (its batch's tokens, or its chosen rows), as slices
/// of its buffers in the slot on loan (a short last batch keeps its own rows only).
fn writer_hooks(
    writer: &super::output::Output,
    batches: &Batches,
    rows: usize,
    loan: &Arc<OnLoan>,
    member: usize,
) -> Vec<HookActivations> {
    let dtype = batches.dtype;
    writer
        .hooks()
        .iter()
        .zip(&batches.shapes)
        .enumerate()
        .map(|(hook, (name, shape))| {
            let len = rows * dtype.row_bytes(shape.iter().product());
            let rows = Rows { loan: Arc::clone(loan), member, hook };
            let data = Bytes::from_owner(rows).slice(..len);
            HookActivations { hook: name.clone(), dtype, shape: shape.clone(), data }
        })
        .collect()
}

/// The store's view of a batch: token metadata from the data path (with each token's role,
/// in a run of conversations) plus the hook outputs, the dictionaries' latents and the model's
/// next-token outputs.
fn to_store_batch(
    batch: &siphon_data::Batch,
    hooks: Vec<HookActivations>,
    latents: Vec<BatchLatents>,
    outputs: Vec<BatchOutput>,
    roles: bool,
) -> anyhow::Result<BatchActivations> {
    let first_sample = batch.position.sequences - batch.len() as u64;
    Ok(BatchActivations {
        first_sample,
        batch: batch.len(),
        seq: batch.seq_len,
        hooks,
        latents,
        outputs,
        token_ids: batch.tokens.iter().map(|&t| t as i32).collect(),
        doc_index: batch.doc.clone(),
        position: batch.doc_pos.clone(),
        keep: batch.exclude.iter().map(|&e| e == 0).collect(),
        roles: roles.then(|| batch.role.clone()),
        pooled: None,
        documents: Vec::new(),
        data_position_after: serde_json::to_value(&batch.position)?,
    })
}

/// The store's view of a batch's chosen rows: `chosen.rows` a sequence, each a "token" whose
/// id, document, position and role are those of the row's (last) token; unused rows not kept.
fn chosen_batch(
    batch: &siphon_data::Batch,
    chosen: &siphon_data::Selection,
    hooks: Vec<HookActivations>,
    latents: Vec<BatchLatents>,
    batches: &Batches,
) -> anyhow::Result<BatchActivations> {
    let first_sample = batch.position.sequences - batch.len() as u64;
    let rows = batch.len() * chosen.rows;
    Ok(BatchActivations {
        first_sample,
        batch: batch.len(),
        seq: chosen.rows,
        hooks,
        latents,
        outputs: Vec::new(),
        token_ids: chosen.tokens[..rows].iter().map(|&t| t as i32).collect(),
        doc_index: chosen.doc[..rows].to_vec(),
        position: chosen.position[..rows].to_vec(),
        keep: chosen.used[..rows].iter().map(|&u| u == 1).collect(),
        roles: batches.roles.then(|| chosen.role[..rows].to_vec()),
        pooled: batches.pooled.then(|| siphon_store::Pooled {
            first: chosen.first[..rows].to_vec(),
            count: chosen.count[..rows].to_vec(),
        }),
        documents: Vec::new(),
        data_position_after: serde_json::to_value(&batch.position)?,
    })
}
