//! Sealing shards: each full shard's statistics, CRC32C and header on a thread of its own
//! (at most `sealers` at once), handed to the uploader in build order ([`Sealer`]).

use std::sync::Mutex;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use tokio::sync::mpsc;

use super::summary::WriterTiming;
use crate::error::{Result, StoreError};
use crate::shard::{SealedShard, ShardBuilder};

/// Shards being sealed, each on a thread of its own (at most `max` at once), handed to the
/// uploader in the order they were built, each as soon as it and those before it are sealed.
pub(super) struct Sealer<'scope, 'env> {
    scope: &'scope std::thread::Scope<'scope, 'env>,
    /// Where each shard's seal will land, in build order; bounded so that at most `max` seal.
    order: Option<SyncSender<Receiver<Result<SealedShard>>>>,
    /// Takes the seals in order and hands them to the uploader.
    hand_on: Option<std::thread::ScopedJoinHandle<'scope, Result<()>>>,
}

impl<'scope, 'env> Sealer<'scope, 'env> {
    pub(super) fn new(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        shards: mpsc::Sender<SealedShard>,
        max: usize,
    ) -> Self {
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
    pub(super) fn seal(&mut self, builder: ShardBuilder, timing: &'scope Mutex<WriterTiming>) -> Result<()> {
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
    pub(super) fn flush(&mut self) -> Result<()> {
        drop(self.order.take());
        match self.hand_on.take() {
            Some(handle) => handle.join().map_err(|_| StoreError::Background("the hand-on thread panicked".into()))?,
            None => Ok(()),
        }
    }
}

/// The calling thread's CPU time (user and system), in seconds: a stage's cost in core-seconds,
/// however many other threads share the cores.
pub(super) fn thread_cpu_seconds() -> f64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec to write; the thread CPU clock exists on Linux and macOS.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9
}
