//! Writing objects to the store. A shard goes up as a single put when small, as a multipart
//! upload when large (parts sent concurrently under a host-wide request limit); every write
//! (shards, manifests, statistics) is retried with exponential backoff while it fails with an
//! error that may be transient, until the store timeout.

use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tokio::sync::Semaphore;

use crate::config::{MAX_BACKOFF, UploadConfig};
use crate::error::{Result, StoreError};
use crate::failpoint::{self, Failpoint};

/// Uploads `chunks` (the object's bytes, in order) to `path`, replacing any object there.
pub async fn upload_object(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    chunks: &[Bytes],
    config: &UploadConfig,
    requests: &Arc<Semaphore>,
    shard_index: u64,
) -> Result<()> {
    retried("upload", path, config, || upload_once(store, path, chunks, config, requests, shard_index)).await
}

/// Runs `attempt` until it succeeds, fails with an error a retry cannot fix, or the store
/// timeout passes, sleeping with exponential backoff between tries.
pub async fn retried<F, Fut>(op: &'static str, path: &Path, config: &UploadConfig, mut attempt: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = object_store::Result<()>>,
{
    let mut last_error = None;
    let attempts = async {
        let mut backoff = config.initial_backoff;
        let mut tries = 0u64;
        loop {
            tries += 1;
            match attempt().await {
                Ok(()) => return Ok(()),
                Err(error) if is_transient(&error) => {
                    tracing::warn!(%path, tries, %error, "{op} failed; retrying after {backoff:?}");
                    last_error = Some(error.to_string());
                    tokio::time::sleep(backoff).await;
                    backoff = backoff.saturating_mul(2).min(MAX_BACKOFF);
                }
                Err(error) => return Err(StoreError::store(op, path, error)),
            }
        }
    };
    match tokio::time::timeout(config.give_up_after, attempts).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::GaveUp {
            op,
            path: path.to_string(),
            after: config.give_up_after,
            last_error: last_error.unwrap_or_else(|| "no answer (the request stalled)".into()),
        }),
    }
}

/// Errors that a retry cannot fix.
fn is_transient(error: &object_store::Error) -> bool {
    !crate::error::is_out_of_space(error)
        && !matches!(
            error,
            object_store::Error::NotFound { .. }
                | object_store::Error::InvalidPath { .. }
                | object_store::Error::NotSupported { .. }
                | object_store::Error::NotImplemented { .. }
                | object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }
                | object_store::Error::UnknownConfigurationKey { .. }
        )
}

async fn upload_once(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    chunks: &[Bytes],
    config: &UploadConfig,
    requests: &Arc<Semaphore>,
    shard_index: u64,
) -> object_store::Result<()> {
    let total: usize = chunks.iter().map(|c| c.len()).sum();
    if total <= config.part_bytes {
        let _permit = requests.acquire().await.expect("semaphore never closed");
        store.put(path, PutPayload::from_iter(chunks.iter().cloned())).await?;
        return Ok(());
    }
    let mut upload = store.put_multipart(path).await?;
    // put_part numbers parts when called, so parts may complete in any order.
    let parts: Vec<_> = split_parts(chunks, config.part_bytes).into_iter().map(|part| upload.put_part(part)).collect();
    // Each part is its own task holding one request permit while it runs; dropping the set
    // (on failure) cancels the rest.
    let mut tasks = tokio::task::JoinSet::new();
    for part in parts {
        let requests = Arc::clone(requests);
        tasks.spawn(async move {
            let _permit = requests.acquire_owned().await.expect("semaphore never closed");
            part.await
        });
    }
    let mut first = true;
    while let Some(joined) = tasks.join_next().await {
        let result =
            joined.unwrap_or_else(|e| Err(object_store::Error::Generic { store: "siphon-store", source: Box::new(e) }));
        if let Err(error) = result {
            tasks.abort_all();
            if let Err(abort_error) = upload.abort().await {
                tracing::warn!(%path, %abort_error, "aborting a failed multipart upload failed");
            }
            return Err(error);
        }
        if first {
            failpoint::hit(Failpoint::MidUpload, shard_index);
            first = false;
        }
    }
    upload.complete().await?;
    Ok(())
}

/// Regroups chunks into parts of exactly `part_bytes` (the last may be shorter), zero-copy.
fn split_parts(chunks: &[Bytes], part_bytes: usize) -> Vec<PutPayload> {
    let mut parts = Vec::new();
    let mut current: Vec<Bytes> = Vec::new();
    let mut current_len = 0;
    for chunk in chunks {
        let mut chunk = chunk.clone();
        while !chunk.is_empty() {
            let take = (part_bytes - current_len).min(chunk.len());
            current.push(chunk.split_to(take));
            current_len += take;
            if current_len == part_bytes {
                parts.push(PutPayload::from_iter(std::mem::take(&mut current)));
                current_len = 0;
            }
        }
    }
    if current_len > 0 {
        parts.push(PutPayload::from_iter(current));
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_have_the_requested_size_and_keep_the_bytes() {
        let chunks: Vec<Bytes> = vec![Bytes::from(vec![1u8; 7]), Bytes::from(vec![2u8; 3]), Bytes::from(vec![3u8; 12])];
        let parts = split_parts(&chunks, 5);
        let sizes: Vec<usize> = parts.iter().map(|p| p.content_length()).collect();
        assert_eq!(sizes, vec![5, 5, 5, 5, 2]);
        let joined: Vec<u8> =
            parts.iter().flat_map(|p| p.iter().flat_map(|b| b.to_vec()).collect::<Vec<_>>()).collect();
        let expected: Vec<u8> = chunks.iter().flat_map(|c| c.to_vec()).collect();
        assert_eq!(joined, expected);
    }
}
