//! Uploading sealed shards and committing them in order ([`Committer`]): the manifest rewritten
//! (the commit point), then the host's stats.json.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::stream::FuturesOrdered;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::summary::{HostSummary, WriterTiming};
use crate::config::HostId;
use crate::error::{Result, StoreError};
use crate::failpoint::{self, Failpoint};
use crate::location::StoreLocation;
use crate::manifest::{ManifestLine, render_manifest};
use crate::shard::SealedShard;
use crate::stats::{self, RunStats};
use crate::upload::{retried, upload_object};

/// Shards uploading at the same time (their parts share the request limit).
pub(super) const CONCURRENT_SHARD_UPLOADS: usize = 2;

/// Uploads sealed shards and commits them in order.
pub(super) struct Committer {
    pub(super) location: StoreLocation,
    pub(super) run: String,
    pub(super) host: HostId,
    pub(super) upload: crate::config::UploadConfig,
    pub(super) requests: Arc<Semaphore>,
    pub(super) lines: Vec<ManifestLine>,
    pub(super) stats: RunStats,
    pub(super) timing: Arc<Mutex<WriterTiming>>,
    /// Whether the assembler made every batch a shard, sent as it ends.
    pub(super) assembled: Option<oneshot::Receiver<bool>>,
}

impl Committer {
    pub(super) async fn run(mut self, mut shards: mpsc::Receiver<SealedShard>) -> Result<HostSummary> {
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
        // No shard committed, and none failed (no unit of the corpus was this host's, or its
        // records gave no token): an empty manifest says so, and the host's directory stands
        // beside the others' for whoever counts them.
        if self.lines.is_empty()
            && let Some(assembled) = self.assembled.take()
            && assembled.await.unwrap_or(false)
        {
            let manifest = self.location.manifest(&self.run, self.host);
            self.put(&manifest, Vec::new()).await?;
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
