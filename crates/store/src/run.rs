//! `run.json`, resuming a host from its manifest, and merging statistics at the end of a run.

use std::collections::BTreeSet;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use crate::config::{HostId, RunDescriptor, ShardFormat};
use crate::error::{Result, StoreError};
use crate::format::{FORMAT_TAG, FORMAT_VERSION};
use crate::location::{MANIFEST_NAME, STATS_NAME, StoreLocation, parse_host_dir};
use crate::manifest::{ManifestLine, parse_manifest_torn, render_manifest};
use crate::shard::{check_format, summarize_shard};
use crate::stats::{self, RunStats, StatsFile};

/// The contents of `run.json`: everything that decides the dataset's bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunJson {
    /// Format tag: `siphon-activations/2` when written by this crate, `siphon-activations/1`
    /// in older runs (see [`FORMAT_TAG`]).
    pub format: String,
    /// Run name.
    pub run: String,
    /// Model, hooks, mesh, partition and extraction config.
    #[serde(flatten)]
    pub descriptor: RunDescriptor,
    /// Shard format settings.
    pub shard_format: ShardFormat,
}

impl RunJson {
    /// The run.json a run with these settings writes.
    pub fn new(run: &str, descriptor: &RunDescriptor, format: &ShardFormat) -> Self {
        RunJson {
            format: FORMAT_TAG.into(),
            run: run.into(),
            descriptor: descriptor.clone(),
            shard_format: format.clone(),
        }
    }

    /// The format version of `format` (1 or 2); [`StoreError::UnsupportedFormat`] naming
    /// `path` (where this run.json was read) and the tag for any other.
    pub fn format_version(&self, path: &str) -> Result<u32> {
        check_format(path, &self.format)
    }

    /// What is wrong with the numbers readers take from the free-form parts of run.json (the
    /// extraction's sequence length and batch, the partition's machines and hosts): each,
    /// where present, must be a positive integer. One line per field at fault, naming it.
    pub fn check_numbers(&self) -> Vec<String> {
        let d = &self.descriptor;
        let corpus = d.config.get("corpus");
        let fields = [
            ("config.corpus.seq_len", corpus.and_then(|c| c.get("seq_len"))),
            ("config.seq_len", d.config.get("seq_len")),
            ("config.corpus.batch_size", corpus.and_then(|c| c.get("batch_size"))),
            ("partition.machines", d.partition.get("machines")),
            ("partition.hosts", d.partition.get("hosts")),
        ];
        fields
            .into_iter()
            .filter_map(|(name, value)| match value {
                None | Some(serde_json::Value::Null) => None,
                Some(v) if v.as_u64().is_some_and(|n| n > 0) => None,
                Some(v) => Some(format!("{name} is {v}, not a positive integer")),
            })
            .collect()
    }
}

/// Where a host resumes: after its last committed shard.
#[derive(Debug, Clone, PartialEq)]
pub struct ResumePoint {
    /// Index the next shard gets.
    pub next_shard: u64,
    /// Host-local sample index the next batch must start at.
    pub next_sample: u64,
    /// The data position after the last committed shard; `None` for a fresh start.
    pub data_position: Option<serde_json::Value>,
    /// Token rows already committed.
    pub committed_tokens: u64,
}

/// What a host has committed, as read back from the store.
#[derive(Debug, Clone)]
pub(crate) struct HostState {
    pub lines: Vec<ManifestLine>,
    pub stats: RunStats,
}

impl HostState {
    pub fn resume_point(&self) -> ResumePoint {
        let last = self.lines.last();
        ResumePoint {
            next_shard: self.lines.len() as u64,
            next_sample: last.map_or(0, |l| l.samples[1]),
            data_position: last.map(|l| l.data_position_after.clone()),
            committed_tokens: self.lines.iter().fold(0u64, |n, l| n.saturating_add(l.tokens)),
        }
    }
}

/// Writes `run.json` if the run is new, or checks that the stored one matches.
pub(crate) async fn claim_run(location: &StoreLocation, expected: &RunJson) -> Result<()> {
    let path = location.run_json(&expected.run);
    let body = serde_json::to_vec_pretty(expected).expect("run.json serializes");
    for _ in 0..3 {
        if let Some(stored) = location.get_optional(&path).await? {
            return compare_run_json(&path, &stored, expected);
        }
        // Create-if-absent so that two hosts racing to start a run cannot both write.
        let options = PutOptions { mode: PutMode::Create, ..Default::default() };
        match location.store().put_opts(&path, PutPayload::from(body.clone()), options).await {
            Ok(_) => return Ok(()),
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => continue,
            Err(object_store::Error::NotImplemented { .. }) => {
                location
                    .store()
                    .put(&path, PutPayload::from(body.clone()))
                    .await
                    .map_err(|e| StoreError::store("put", &path, e))?;
                return Ok(());
            }
            Err(e) => return Err(StoreError::store("put", &path, e)),
        }
    }
    Err(StoreError::Corrupt { path: path.to_string(), reason: "run.json kept changing while being claimed".into() })
}

fn compare_run_json(path: &Path, stored: &[u8], expected: &RunJson) -> Result<()> {
    let stored: serde_json::Value = serde_json::from_slice(stored)
        .map_err(|e| StoreError::Corrupt { path: path.to_string(), reason: e.to_string() })?;
    // The format first: a run of another format differs in many fields for one reason.
    let tag = stored.get("format").and_then(|f| f.as_str()).unwrap_or_default();
    let version = check_format(path.as_ref(), tag)?;
    if version != FORMAT_VERSION {
        return Err(StoreError::FormatMismatch {
            path: path.to_string(),
            stored: tag.to_string(),
            stored_version: version,
        });
    }
    let expected = serde_json::to_value(expected).expect("run.json serializes");
    let mut fields = Vec::new();
    diff_values("", &stored, &expected, &mut fields);
    if fields.is_empty() { Ok(()) } else { Err(StoreError::RunMismatch { path: path.to_string(), fields }) }
}

/// Collects `path: stored A, this run B` for every leaf that differs.
pub(crate) fn diff_values(prefix: &str, stored: &serde_json::Value, ours: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    match (stored, ours) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                diff_values(&path, a.get(key).unwrap_or(&Value::Null), b.get(key).unwrap_or(&Value::Null), out);
            }
        }
        (a, b) if a != b => out.push(format!("{prefix} (stored {a}, this run {b})")),
        _ => {}
    }
}

/// Reads a host's manifest (empty when absent) and checks it is gap-free. A torn last line
/// (see [`parse_manifest_torn`]) is an error here; [`recover_host`] repairs it.
pub(crate) async fn read_manifest(location: &StoreLocation, run: &str, host: HostId) -> Result<Vec<ManifestLine>> {
    match read_manifest_torn(location, run, host).await? {
        (lines, None) => Ok(lines),
        (_, Some(torn)) => Err(StoreError::Corrupt {
            path: location.manifest(run, host).to_string(),
            reason: format!("{torn}; resuming the run repairs it, dropping that shard"),
        }),
    }
}

/// [`read_manifest`] that hands back a torn last line's description instead of failing.
async fn read_manifest_torn(
    location: &StoreLocation,
    run: &str,
    host: HostId,
) -> Result<(Vec<ManifestLine>, Option<String>)> {
    let path = location.manifest(run, host);
    let Some(bytes) = location.get_optional(&path).await? else {
        return Ok((Vec::new(), None));
    };
    let text = std::str::from_utf8(&bytes)
        .map_err(|e| StoreError::Corrupt { path: path.to_string(), reason: e.to_string() })?;
    let (lines, torn) = parse_manifest_torn(path.as_ref(), text)?;
    let mut next_sample = 0;
    for (i, line) in lines.iter().enumerate() {
        if line.index != i as u64 || line.samples[0] != next_sample || line.samples[1] < line.samples[0] {
            return Err(StoreError::Corrupt {
                path: path.to_string(),
                reason: format!(
                    "line {} (shard {}, samples {:?}) does not follow the previous line",
                    i + 1,
                    line.index,
                    line.samples
                ),
            });
        }
        next_sample = line.samples[1];
    }
    Ok((lines, torn))
}

/// Brings a host directory back to exactly its committed state and returns that state.
///
/// Deletes every object the manifest does not name (shards uploaded but never committed,
/// staged multipart files on local disk), checks that committed shards exist with their
/// recorded size, and rebuilds the host statistics from shards when `stats.json` lags the
/// manifest (a crash between the manifest and the stats write).
pub(crate) async fn recover_host(
    location: &StoreLocation,
    run: &str,
    host: HostId,
    descriptor: &RunDescriptor,
) -> Result<HostState> {
    let (lines, torn) = read_manifest_torn(location, run, host).await?;
    if let Some(torn) = torn {
        // The shard whose line was being written is not committed: drop the line (the
        // object is deleted below as uncommitted) and write the manifest whole again.
        let path = location.manifest(run, host);
        tracing::warn!(path = %path, "{torn}; repairing the manifest (its last shard will be written again)");
        location
            .store()
            .put(&path, PutPayload::from(render_manifest(&lines)))
            .await
            .map_err(|e| StoreError::store("put", &path, e))?;
    }
    let dir = location.host_dir(run, host);
    let listed: Vec<object_store::ObjectMeta> =
        location.store().list(Some(&dir)).try_collect().await.map_err(|e| StoreError::store("list", &dir, e))?;
    let committed: std::collections::HashMap<&str, &ManifestLine> =
        lines.iter().map(|l| (l.shard.as_str(), l)).collect();
    let mut seen = BTreeSet::new();
    for meta in &listed {
        let name = meta.location.filename().unwrap_or_default();
        let top_level = meta.location.prefix_match(&dir).map(|rest| rest.count() == 1).unwrap_or(false);
        if top_level && (name == MANIFEST_NAME || name == STATS_NAME) {
            continue;
        }
        if top_level && let Some(line) = committed.get(name) {
            if meta.size != line.bytes {
                return Err(StoreError::Corrupt {
                    path: meta.location.to_string(),
                    reason: format!("committed shard has {} bytes, manifest says {}", meta.size, line.bytes),
                });
            }
            seen.insert(name.to_string());
            continue;
        }
        tracing::info!(path = %meta.location, "removing uncommitted object");
        match location.store().delete(&meta.location).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(StoreError::store("delete", &meta.location, e)),
        }
    }
    if let Some(missing) = lines.iter().find(|l| !seen.contains(&l.shard)) {
        return Err(StoreError::Corrupt {
            path: dir.clone().join(missing.shard.as_str()).to_string(),
            reason: "committed shard is missing".into(),
        });
    }
    if let Some(local) = location.local_dir() {
        remove_staged_files(&local.join(dir.as_ref()))?;
    }

    let stats_path = location.host_stats(run, host);
    let stored = match location.get_optional(&stats_path).await? {
        Some(bytes) => Some(
            serde_json::from_slice::<StatsFile>(&bytes)
                .map_err(|e| StoreError::Corrupt { path: stats_path.to_string(), reason: e.to_string() })?,
        ),
        None => None,
    };
    let last = lines.last().map(|l| l.index);
    let (mut run_stats, covered) = match stored {
        Some(file) if file.through_shard.is_some() && file.through_shard <= last => {
            let stats = stats::from_file(&file)
                .map_err(|reason| StoreError::Corrupt { path: stats_path.to_string(), reason })?;
            (stats, file.through_shard)
        }
        _ => (RunStats::new(), None),
    };
    // Committed shards are checked by their size above; the shards read here (those the
    // statistics do not cover yet, and at least the last one) by their checksum too. Earlier
    // shards are not read again on every restart (that would download the whole dataset):
    // `verify_run` checks every one.
    let rebuild_from = if covered == last { lines.len() } else { covered.map_or(0, |c| c + 1) as usize };
    for (i, line) in lines.iter().enumerate().skip(rebuild_from.min(lines.len().saturating_sub(1))) {
        let path = dir.clone().join(line.shard.as_str());
        let bytes = location.get_optional(&path).await?.ok_or_else(|| StoreError::Corrupt {
            path: path.to_string(),
            reason: "committed shard is missing".into(),
        })?;
        line.check(&bytes).map_err(|problem| StoreError::Corrupt {
            path: path.to_string(),
            reason: format!("committed shard does not match its manifest line: {problem}"),
        })?;
        if i >= rebuild_from {
            let d = descriptor;
            let summary = summarize_shard(path.as_ref(), &bytes, &d.hooks, &d.hook_shapes, &d.latents, &d.outputs)?;
            stats::merge_run_stats(&mut run_stats, &summary.stats)?;
        }
    }
    if covered != last {
        let body = serde_json::to_vec(&stats::to_file(&run_stats, last)).expect("stats serialize");
        location
            .store()
            .put(&stats_path, PutPayload::from(body))
            .await
            .map_err(|e| StoreError::store("put", &stats_path, e))?;
    }
    Ok(HostState { lines, stats: run_stats })
}

/// object_store's local backend stages multipart uploads as `name#N` files that its listing
/// hides; an upload killed midway leaves one behind.
fn remove_staged_files(dir: &std::path::Path) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(StoreError::Io { op: "read directory", path: dir.into(), source });
        }
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().contains('#') {
            let path = entry.path();
            tracing::info!(path = %path.display(), "removing staged multipart file");
            std::fs::remove_file(&path).map_err(|source| StoreError::Io { op: "remove", path, source })?;
        }
    }
    Ok(())
}

/// Host directories present in a run.
pub async fn list_hosts(location: &StoreLocation, run: &str) -> Result<Vec<HostId>> {
    let dir = location.run_dir(run);
    let listing =
        location.store().list_with_delimiter(Some(&dir)).await.map_err(|e| StoreError::store("list", &dir, e))?;
    let mut hosts: Vec<HostId> =
        listing.common_prefixes.iter().filter_map(|p| p.filename().and_then(parse_host_dir)).collect();
    hosts.sort_by_key(|h| (h.machine, h.host));
    Ok(hosts)
}

/// Merges every host's `stats.json` into the run's `stats.json` and returns it.
///
/// Call once after all hosts have finished (e.g. host 0 after the cluster's final barrier).
pub async fn merge_host_stats(location: &StoreLocation, run: &str) -> Result<StatsFile> {
    let mut merged = RunStats::new();
    for host in list_hosts(location, run).await? {
        let path = location.host_stats(run, host);
        let Some(bytes) = location.get_optional(&path).await? else {
            continue;
        };
        let file: StatsFile = serde_json::from_slice(&bytes)
            .map_err(|e| StoreError::Corrupt { path: path.to_string(), reason: e.to_string() })?;
        let host_stats =
            stats::from_file(&file).map_err(|reason| StoreError::Corrupt { path: path.to_string(), reason })?;
        stats::merge_run_stats(&mut merged, &host_stats)?;
    }
    let file = stats::to_file(&merged, None);
    let path = location.run_stats(run);
    let body = serde_json::to_vec(&file).expect("stats serialize");
    location.store().put(&path, PutPayload::from(body)).await.map_err(|e| StoreError::store("put", &path, e))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_lists_every_differing_leaf() {
        let a = serde_json::json!({"model": {"id": "a", "rev": 1}, "hooks": ["x"], "same": 3});
        let b = serde_json::json!({"model": {"id": "b", "rev": 1}, "hooks": ["y"], "same": 3, "new": true});
        let mut out = Vec::new();
        diff_values("", &a, &b, &mut out);
        assert_eq!(out.len(), 3, "{out:?}");
        assert!(out.iter().any(|f| f.starts_with("model.id (stored \"a\", this run \"b\")")), "{out:?}");
        assert!(out.iter().any(|f| f.starts_with("hooks ")));
        assert!(out.iter().any(|f| f.starts_with("new ")));
    }
}
