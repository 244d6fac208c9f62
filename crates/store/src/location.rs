//! Where a dataset lives: an object store plus a root prefix, and the layout inside it.
//!
//! Layout: `{root}/{run}/run.json`, `{root}/{run}/stats.json`, and per host
//! `{root}/{run}/machine_{m:03}_host_{h:02}/{manifest.jsonl, stats.json, shard_{n:06}.safetensors}`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{BackoffConfig, ObjectStore, ObjectStoreExt, RetryConfig};

use crate::config::{DEFAULT_GIVE_UP_AFTER, HostId, MAX_BACKOFF};
use crate::error::{Result, StoreError};

/// Name of the per-host manifest.
pub const MANIFEST_NAME: &str = "manifest.jsonl";
/// Name of the run description.
pub const RUN_JSON_NAME: &str = "run.json";
/// Name of the statistics files (per host and merged per run).
pub const STATS_NAME: &str = "stats.json";

/// An object store and the prefix under which runs live.
#[derive(Debug, Clone)]
pub struct StoreLocation {
    store: Arc<dyn ObjectStore>,
    root: Path,
    url: String,
    local_dir: Option<PathBuf>,
}

impl StoreLocation {
    /// Opens `url` (a local path, `file://`, `s3://`, `gs://`, `az://`, `abfs://`, `http(s)://`).
    ///
    /// Cloud credentials and endpoints come from the usual environment variables
    /// (`AWS_*`, `GOOGLE_*`, `AZURE_*`), then `options` (object_store config keys such as
    /// `aws_endpoint`, `aws_allow_http`, `google_service_account_key`) override them.
    /// Requests are retried with exponential backoff by the client for up to
    /// [`DEFAULT_GIVE_UP_AFTER`].
    pub fn open(url: &str, options: &[(String, String)]) -> Result<Self> {
        Self::open_with_timeout(url, options, DEFAULT_GIVE_UP_AFTER)
    }

    /// Like [`StoreLocation::open`], for writes that may keep failing for `give_up_after`: a
    /// request is retried for up to half of it (at most three minutes: a signed request must
    /// not outlive its credentials), so that a shard's upload sees the error and tries again
    /// within it; each try may take 30 s or half of `give_up_after`, whichever is less
    /// (object_store's `timeout` option overrides that).
    pub fn open_with_timeout(url: &str, options: &[(String, String)], give_up_after: Duration) -> Result<Self> {
        let invalid = |reason: String| StoreError::InvalidLocation { url: url.to_string(), reason };
        let retry = RetryConfig {
            backoff: BackoffConfig { init_backoff: Duration::from_millis(100), max_backoff: MAX_BACKOFF, base: 2.0 },
            // Time bounds the retries: with the backoff's cap, 100 take over 20 minutes.
            max_retries: 100,
            retry_timeout: (give_up_after / 2).min(Duration::from_secs(180)),
        };
        let request_timeout = (give_up_after / 2).min(Duration::from_secs(30));
        // First, so that an explicit `timeout` option overrides it.
        let mut timed = vec![("timeout".to_string(), format!("{}ms", request_timeout.as_millis().max(1)))];
        timed.extend_from_slice(options);
        let options = timed.as_slice();
        let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        let (store, rest): (Arc<dyn ObjectStore>, String) = match scheme.as_deref() {
            None | Some("file") => {
                let dir = url.strip_prefix("file://").unwrap_or(url);
                if dir.is_empty() {
                    return Err(invalid("empty path".into()));
                }
                std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
                    op: "create directory",
                    path: dir.into(),
                    source,
                })?;
                let dir = std::fs::canonicalize(dir).map_err(|source| StoreError::Io {
                    op: "resolve",
                    path: dir.into(),
                    source,
                })?;
                let store = LocalFileSystem::new_with_prefix(&dir).map_err(|e| invalid(e.to_string()))?;
                return Ok(StoreLocation {
                    store: Arc::new(store),
                    root: Path::default(),
                    url: url.to_string(),
                    local_dir: Some(dir),
                });
            }
            Some("s3" | "s3a") => {
                let builder = AmazonS3Builder::from_env().with_url(url).with_retry(retry);
                let builder = with_options(builder, options, |b, k, v| b.with_config(k, v)).map_err(invalid)?;
                (Arc::new(builder.build().map_err(|e| invalid(e.to_string()))?), bucket_relative(url))
            }
            Some("gs") => {
                let builder = GoogleCloudStorageBuilder::from_env().with_url(url).with_retry(retry);
                let builder = with_options(builder, options, |b, k, v| b.with_config(k, v)).map_err(invalid)?;
                (Arc::new(builder.build().map_err(|e| invalid(e.to_string()))?), bucket_relative(url))
            }
            Some("az" | "adl" | "azure" | "abfs" | "abfss") => {
                let builder = MicrosoftAzureBuilder::from_env().with_url(url).with_retry(retry);
                let builder = with_options(builder, options, |b, k, v| b.with_config(k, v)).map_err(invalid)?;
                (Arc::new(builder.build().map_err(|e| invalid(e.to_string()))?), bucket_relative(url))
            }
            Some("http" | "https") => {
                let builder = HttpBuilder::new().with_url(url).with_retry(retry);
                let builder = with_options(builder, options, |b, k, v| b.with_config(k, v)).map_err(invalid)?;
                (Arc::new(builder.build().map_err(|e| invalid(e.to_string()))?), String::new())
            }
            Some(other) => {
                return Err(invalid(format!(
                    "unsupported scheme {other:?} (use a path, file://, s3://, gs://, az://, http(s)://)"
                )));
            }
        };
        let root = Path::parse(rest.trim_matches('/')).map_err(|e| invalid(e.to_string()))?;
        Ok(StoreLocation { store, root, url: url.to_string(), local_dir: None })
    }

    /// Wraps an existing store; `root` is the prefix under which runs live.
    pub fn from_store(store: Arc<dyn ObjectStore>, root: Path, url: impl Into<String>) -> Self {
        StoreLocation { store, root, url: url.into(), local_dir: None }
    }

    /// The object store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The URL it was opened from.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// For local outputs: the directory on disk (used to remove staged multipart files that
    /// object_store's listing hides).
    pub fn local_dir(&self) -> Option<&std::path::Path> {
        self.local_dir.as_deref()
    }

    /// Reads an object; `Ok(None)` when it does not exist. On local disk a path that is not a
    /// regular file (a FIFO, a device, a directory) is refused before it is opened: reading a
    /// FIFO would block forever.
    pub async fn get_optional(&self, path: &Path) -> Result<Option<Bytes>> {
        if let Some(file) = self.local_dir.as_ref().map(|dir| dir.join(path.as_ref()))
            && let Err(e) = siphon_files::check_regular(&file)
            && e.kind() == std::io::ErrorKind::InvalidInput
        {
            return Err(StoreError::NotAFile { path: file, what: e.to_string() });
        }
        match self.store.get(path).await {
            Ok(result) => Ok(Some(result.bytes().await.map_err(|e| StoreError::store("get", path, e))?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(StoreError::store("get", path, e)),
        }
    }

    /// `{root}/{run}`.
    pub fn run_dir(&self, run: &str) -> Path {
        self.root.clone().join(run)
    }

    /// `{root}/{run}/run.json`.
    pub fn run_json(&self, run: &str) -> Path {
        self.run_dir(run).join(RUN_JSON_NAME)
    }

    /// `{root}/{run}/stats.json` (merged over hosts).
    pub fn run_stats(&self, run: &str) -> Path {
        self.run_dir(run).join(STATS_NAME)
    }

    /// `{root}/{run}/machine_{m:03}_host_{h:02}`.
    pub fn host_dir(&self, run: &str, host: HostId) -> Path {
        self.run_dir(run).join(host.dir_name())
    }

    /// The host's `manifest.jsonl`.
    pub fn manifest(&self, run: &str, host: HostId) -> Path {
        self.host_dir(run, host).join(MANIFEST_NAME)
    }

    /// The host's `stats.json` (statistics of its committed shards).
    pub fn host_stats(&self, run: &str, host: HostId) -> Path {
        self.host_dir(run, host).join(STATS_NAME)
    }

    /// The object of shard `index` of `host`.
    pub fn shard(&self, run: &str, host: HostId, index: u64) -> Path {
        self.host_dir(run, host).join(shard_name(index))
    }
}

/// Applies object_store config `options` (`aws_endpoint`, `google_service_account_key`, ...) to a
/// builder of any backend; the error names a key the backend does not know.
fn with_options<B, K>(
    mut builder: B,
    options: &[(String, String)],
    set: impl Fn(B, K, String) -> B,
) -> std::result::Result<B, String>
where
    K: std::str::FromStr<Err = object_store::Error>,
{
    for (key, value) in options {
        let key = key.parse().map_err(|e: object_store::Error| e.to_string())?;
        builder = set(builder, key, value.clone());
    }
    Ok(builder)
}

/// `shard_{n:06}.safetensors`.
pub fn shard_name(index: u64) -> String {
    format!("shard_{index:06}.safetensors")
}

/// Parses a host directory name back into a [`HostId`].
pub fn parse_host_dir(name: &str) -> Option<HostId> {
    let rest = name.strip_prefix("machine_")?;
    let (machine, host) = rest.split_once("_host_")?;
    if machine.len() != 3 || host.len() != 2 {
        return None;
    }
    Some(HostId { machine: machine.parse().ok()?, host: host.parse().ok()? })
}

/// The path after `scheme://bucket/` of a cloud URL.
fn bucket_relative(url: &str) -> String {
    let after_scheme = url.split_once("://").map(|(_, rest)| rest).unwrap_or(url);
    after_scheme.split_once('/').map(|(_, rest)| rest.to_string()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_dir_names_round_trip() {
        let host = HostId { machine: 7, host: 3 };
        assert_eq!(host.dir_name(), "machine_007_host_03");
        assert_eq!(parse_host_dir(&host.dir_name()), Some(host));
        assert_eq!(parse_host_dir("machine_7_host_3"), None);
        assert_eq!(shard_name(12), "shard_000012.safetensors");
    }

    #[test]
    fn cloud_urls_keep_their_prefix() {
        assert_eq!(bucket_relative("s3://bucket/a/b/"), "a/b/");
        assert_eq!(bucket_relative("gs://bucket"), "");
    }

    #[test]
    fn unknown_scheme_is_a_clear_error() {
        let err = StoreLocation::open("ftp://x/y", &[]).unwrap_err().to_string();
        assert!(err.contains("unsupported scheme \"ftp\""), "{err}");
    }
}
