//! Checking a finished (or interrupted) dataset, for `siphon inspect`.

use std::collections::BTreeMap;

use futures::TryStreamExt;
use sha2::{Digest, Sha256};

use crate::config::HostId;
use crate::error::{Result, StoreError};
use crate::location::{MANIFEST_NAME, STATS_NAME, StoreLocation};
use crate::run::{RunJson, get_optional, list_hosts, merge_host_stats, read_manifest};
use crate::shard::summarize_shard;
use crate::stats::{self, RunStats, StatsFile};

/// What [`verify_run`] found.
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    /// The run's `run.json`, when readable.
    pub run_json: Option<RunJson>,
    /// Per host.
    pub hosts: Vec<HostReport>,
    /// Token rows over all hosts.
    pub tokens: u64,
    /// Included rows over all hosts.
    pub included_tokens: u64,
    /// Run-level problems (missing run.json, stats that do not add up, ...).
    pub problems: Vec<String>,
}

impl VerifyReport {
    /// True when neither the run nor any host has a problem.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty() && self.hosts.iter().all(|h| h.problems.is_empty())
    }

    /// Every problem, prefixed by its host.
    pub fn all_problems(&self) -> Vec<String> {
        let mut out = self.problems.clone();
        for host in &self.hosts {
            out.extend(
                host.problems
                    .iter()
                    .map(|p| format!("{}: {p}", host.host.dir_name())),
            );
        }
        out
    }
}

/// One host's part of a [`VerifyReport`].
#[derive(Debug, Clone)]
pub struct HostReport {
    /// The host.
    pub host: HostId,
    /// Committed shards.
    pub shards: u64,
    /// Token rows in the manifest.
    pub tokens: u64,
    /// Included rows in the manifest.
    pub included_tokens: u64,
    /// Samples covered: `0 .. samples_end`.
    pub samples_end: u64,
    /// Bytes committed.
    pub bytes: u64,
    /// Objects in the host directory that the manifest does not name.
    pub uncommitted_objects: Vec<String>,
    /// What is wrong.
    pub problems: Vec<String>,
}

/// Verifies a run: every manifest line's object exists with its size and sha256, shard headers
/// agree with the manifest (tokens, sample range), sample ranges have no gap or duplicate, and
/// `stats.json` (per host and merged) counts exactly the included tokens.
///
/// Reads every shard in full; problems are collected, not returned as errors, so one report
/// lists them all. Errors are reserved for the store being unreachable.
pub async fn verify_run(location: &StoreLocation, run: &str) -> Result<VerifyReport> {
    let mut report = VerifyReport::default();
    let run_json_path = location.run_json(run);
    let hooks = match get_optional(location, &run_json_path).await? {
        None => {
            report.problems.push(format!("{run_json_path} is missing"));
            Vec::new()
        }
        Some(bytes) => match serde_json::from_slice::<RunJson>(&bytes) {
            Ok(parsed) => {
                let hooks = parsed.descriptor.hooks.clone();
                report.run_json = Some(parsed);
                hooks
            }
            Err(e) => {
                report
                    .problems
                    .push(format!("{run_json_path} does not parse: {e}"));
                Vec::new()
            }
        },
    };
    let mut all_stats = RunStats::new();
    for host in list_hosts(location, run).await? {
        let (host_report, host_stats) = verify_host(location, run, host, &hooks).await?;
        report.tokens += host_report.tokens;
        report.included_tokens += host_report.included_tokens;
        stats::merge_run_stats(&mut all_stats, &host_stats)?;
        report.hosts.push(host_report);
    }
    if report.hosts.is_empty() {
        report.problems.push("no host directories".into());
    }
    match get_optional(location, &location.run_stats(run)).await? {
        None => report
            .problems
            .push("run stats.json is missing (run not finalized)".into()),
        Some(bytes) => match serde_json::from_slice::<StatsFile>(&bytes) {
            Err(e) => report
                .problems
                .push(format!("run stats.json does not parse: {e}")),
            Ok(file) => check_stats(
                "run stats.json",
                &file,
                &hooks,
                report.included_tokens,
                &mut report.problems,
            ),
        },
    }
    let _ = all_stats;
    Ok(report)
}

/// Blocking form of [`verify_run`] for command-line tools.
pub fn verify_run_blocking(
    output: &str,
    options: &[(String, String)],
    run: &str,
) -> Result<VerifyReport> {
    block_on(async {
        let location = StoreLocation::open(output, options)?;
        verify_run(&location, run).await
    })
}

/// Merges all hosts' statistics into `{run}/stats.json` (blocking); call once after every host
/// has finished.
pub fn finalize_run(output: &str, options: &[(String, String)], run: &str) -> Result<StatsFile> {
    block_on(async {
        let location = StoreLocation::open(output, options)?;
        merge_host_stats(&location, run).await
    })
}

fn block_on<T>(future: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| StoreError::Io {
            op: "start runtime",
            path: "siphon-store".into(),
            source,
        })?
        .block_on(future)
}

async fn verify_host(
    location: &StoreLocation,
    run: &str,
    host: HostId,
    hooks: &[String],
) -> Result<(HostReport, RunStats)> {
    let mut report = HostReport {
        host,
        shards: 0,
        tokens: 0,
        included_tokens: 0,
        samples_end: 0,
        bytes: 0,
        uncommitted_objects: Vec::new(),
        problems: Vec::new(),
    };
    let mut host_stats = RunStats::new();
    let lines = match read_manifest(location, run, host).await {
        Ok(lines) => lines,
        Err(StoreError::Corrupt { path, reason }) => {
            report.problems.push(format!("{path}: {reason}"));
            return Ok((report, host_stats));
        }
        Err(e) => return Err(e),
    };
    let dir = location.host_dir(run, host);
    let listed: BTreeMap<String, u64> = location
        .store()
        .list(Some(&dir))
        .map_ok(|m| {
            (
                m.location.filename().unwrap_or_default().to_string(),
                m.size,
            )
        })
        .try_collect()
        .await
        .map_err(|e| StoreError::store("list", &dir, e))?;
    for name in listed.keys() {
        if name != MANIFEST_NAME && name != STATS_NAME && !lines.iter().any(|l| &l.shard == name) {
            report.uncommitted_objects.push(name.clone());
        }
    }
    for line in &lines {
        report.shards += 1;
        report.tokens += line.tokens;
        report.included_tokens += line.included_tokens;
        report.bytes += line.bytes;
        report.samples_end = line.samples[1];
        let path = dir.clone().join(line.shard.as_str());
        let Some(bytes) = get_optional(location, &path).await? else {
            report
                .problems
                .push(format!("{}: committed shard is missing", line.shard));
            continue;
        };
        if bytes.len() as u64 != line.bytes {
            report.problems.push(format!(
                "{}: {} bytes, manifest says {}",
                line.shard,
                bytes.len(),
                line.bytes
            ));
        }
        let sha = hex::encode(Sha256::digest(&bytes));
        if sha != line.sha256 {
            report.problems.push(format!(
                "{}: sha256 {sha}, manifest says {}",
                line.shard, line.sha256
            ));
            continue;
        }
        match summarize_shard(path.as_ref(), &bytes, hooks) {
            Err(e) => report.problems.push(e.to_string()),
            Ok(summary) => {
                if summary.tokens != line.tokens || summary.included_tokens != line.included_tokens
                {
                    report.problems.push(format!(
                        "{}: holds {} tokens ({} included), manifest says {} ({})",
                        line.shard,
                        summary.tokens,
                        summary.included_tokens,
                        line.tokens,
                        line.included_tokens
                    ));
                }
                let range = (
                    summary.metadata.get("sample_start").cloned(),
                    summary.metadata.get("sample_end").cloned(),
                );
                if range
                    != (
                        Some(line.samples[0].to_string()),
                        Some(line.samples[1].to_string()),
                    )
                {
                    report.problems.push(format!(
                        "{}: metadata sample range {range:?}, manifest says {:?}",
                        line.shard, line.samples
                    ));
                }
                stats::merge_run_stats(&mut host_stats, &summary.stats)?;
            }
        }
    }
    match get_optional(location, &location.host_stats(run, host)).await? {
        None if lines.is_empty() => {}
        None => report.problems.push("stats.json is missing".into()),
        Some(bytes) => match serde_json::from_slice::<StatsFile>(&bytes) {
            Err(e) => report
                .problems
                .push(format!("stats.json does not parse: {e}")),
            Ok(file) => {
                let last = lines.last().map(|l| l.index);
                if file.through_shard != last {
                    report.problems.push(format!(
                        "stats.json covers shards through {:?}, manifest through {last:?}",
                        file.through_shard
                    ));
                }
                check_stats(
                    "stats.json",
                    &file,
                    hooks,
                    report.included_tokens,
                    &mut report.problems,
                );
            }
        },
    }
    Ok((report, host_stats))
}

fn check_stats(
    what: &str,
    file: &StatsFile,
    hooks: &[String],
    included: u64,
    problems: &mut Vec<String>,
) {
    for hook in hooks {
        match file.hooks.get(hook) {
            None if included == 0 => {}
            None => problems.push(format!("{what}: no statistics for hook {hook}")),
            Some(s) if s.count != included => problems.push(format!(
                "{what}: hook {hook} counts {} tokens, manifests include {included}",
                s.count
            )),
            Some(_) => {}
        }
    }
}
