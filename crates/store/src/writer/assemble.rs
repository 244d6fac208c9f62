//! The assembler thread: batches → shuffle windows → shards, each full shard handed to the
//! [`Sealer`](super::seal::Sealer).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;

use super::seal::{Sealer, thread_cpu_seconds};
use super::summary::WriterTiming;
use crate::batch::BatchActivations;
use crate::dense::ColumnPool;
use crate::error::{Result, StoreError};
use crate::shard::{ShardBuilder, ShardIdentity};

/// The assembler thread: batches → windows → shards, sealed by `sealer`.
pub(super) fn assemble<'scope>(
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
