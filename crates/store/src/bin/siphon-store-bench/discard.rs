//! A store that takes shards and drops their bytes (keeping everything else in memory): what the
//! writer costs on its own, up to the point where bytes are handed to a store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, Result, UploadPart,
};

#[derive(Debug, Default)]
pub struct Discard {
    inner: InMemory,
    /// Shard bytes handed in.
    pub bytes: Arc<AtomicU64>,
}

fn is_shard(location: &Path) -> bool {
    location.filename().is_some_and(|f| f.ends_with(".safetensors"))
}

impl std::fmt::Display for Discard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Discard")
    }
}

#[async_trait::async_trait]
impl ObjectStore for Discard {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        if is_shard(location) {
            self.bytes.fetch_add(payload.content_length() as u64, Ordering::Relaxed);
            return self.inner.put_opts(location, PutPayload::default(), opts).await;
        }
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        if is_shard(location) {
            let inner = self.inner.put_multipart_opts(location, opts).await?;
            return Ok(Box::new(Dropped { inner, bytes: Arc::clone(&self.bytes) }));
        }
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// A multipart upload whose parts are counted and dropped; completing it leaves an empty object.
#[derive(Debug)]
struct Dropped {
    inner: Box<dyn MultipartUpload>,
    bytes: Arc<AtomicU64>,
}

#[async_trait::async_trait]
impl MultipartUpload for Dropped {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.bytes.fetch_add(data.content_length() as u64, Ordering::Relaxed);
        Box::pin(async { Ok(()) })
    }

    async fn complete(&mut self) -> Result<PutResult> {
        self.inner.complete().await
    }

    async fn abort(&mut self) -> Result<()> {
        self.inner.abort().await
    }
}
