//! Checking a finished (or interrupted) dataset, for `siphon inspect`.

use std::collections::BTreeMap;

use futures::TryStreamExt;
use sha2::{Digest, Sha256};

use crate::column::columns;
use crate::config::HostId;
use crate::error::{Result, StoreError};
use crate::location::{MANIFEST_NAME, STATS_NAME, StoreLocation};
use crate::output::OutputColumn;
use crate::run::{RunJson, list_hosts, merge_host_stats, read_manifest};
use crate::shard::{check_format, summarize_shard};
use crate::sparse::LatentsColumn;
use crate::stats::{self, RunStats, StatsFile};

/// What [`verify_run`] found.
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    /// The run's `run.json`, when readable.
    pub run_json: Option<RunJson>,
    /// The dataset format version (1 or 2): run.json's, or the first shard's when run.json is
    /// unreadable; `None` when neither could be read.
    pub format_version: Option<u32>,
    /// Per hook, its per-token shape: as run.json records it, or (format 1, or run.json without
    /// shapes) the first shard's tensor shape without its token dimension. Hooks without a
    /// readable shard are missing.
    pub hook_shapes: BTreeMap<String, Vec<usize>>,
    /// Per host.
    pub hosts: Vec<HostReport>,
    /// Token rows over all hosts.
    pub tokens: u64,
    /// Included rows over all hosts.
    pub included_tokens: u64,
    /// Run-level problems (missing run.json, stats that do not add up, ...).
    pub problems: Vec<String>,
    /// Hex sha256 over every host's `{dir name} {shards_sha256}\n` in host order: one
    /// checksum of every committed shard, equal for datasets with the same shards.
    pub shards_sha256: String,
    /// Hex sha256 of the run's `stats.json`, when it exists.
    pub stats_sha256: Option<String>,
    /// The run's `stats.json`, when it parses.
    pub stats: Option<StatsFile>,
    /// What the run's `stats.json` says of hooks whose values are not all finite (a run
    /// written with `--allow-non-finite`, or by a siphon that did not refuse them): a problem
    /// unless the reader allows them ([`VerifyReport::problems_allowing_non_finite`]).
    pub non_finite: Vec<String>,
}

impl VerifyReport {
    /// True when neither the run nor any host has a problem, and every statistic is finite.
    pub fn is_ok(&self) -> bool {
        self.all_problems().is_empty()
    }

    /// Every problem, prefixed by its host, and the hooks whose values are not all finite.
    pub fn all_problems(&self) -> Vec<String> {
        let mut out = self.problems_allowing_non_finite();
        out.extend(self.non_finite.iter().cloned());
        out
    }

    /// Every problem, prefixed by its host, but values that are not finite.
    pub fn problems_allowing_non_finite(&self) -> Vec<String> {
        let mut out = self.problems.clone();
        for host in &self.hosts {
            out.extend(host.problems.iter().map(|p| format!("{}: {p}", host.host.dir_name())));
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
    /// Hex sha256 over the manifest's shard checksums, one line per shard in order: `crc32c {hex}`,
    /// or the bare sha256 hex of a shard written before the CRC.
    pub shards_sha256: String,
    /// Objects in the host directory that the manifest does not name.
    pub uncommitted_objects: Vec<String>,
    /// What is wrong.
    pub problems: Vec<String>,
}

/// What every shard must agree on, from run.json or learnt from the first shard read.
struct Expected {
    hooks: Vec<String>,
    /// run.json's latents columns.
    latents: Vec<LatentsColumn>,
    /// run.json's output columns.
    outputs: Vec<OutputColumn>,
    /// Format version; `None` until known.
    format: Option<u32>,
    /// Per-token shapes in hook order; empty until known.
    shapes: Vec<Vec<usize>>,
    /// `shapes` come from run.json (checked by [`summarize_shard`] itself).
    shapes_recorded: bool,
}

/// Verifies a run: every manifest line's object exists with its size and sha256, shard headers
/// agree with the manifest (tokens, sample range) and with run.json (format, per-token hook
/// shapes), sample ranges have no gap or duplicate, and `stats.json` (per host and merged)
/// counts exactly the included tokens with the hooks' widths and holds exactly the statistics
/// recomputed from the committed shards (files that keep the exact running state).
///
/// Reads datasets of format 1 and 2 ([`crate::READABLE_FORMAT_VERSIONS`]). Reads every shard
/// in full; problems are collected, not returned as errors, so one report lists them all.
/// Errors are reserved for the store being unreachable and for a run.json of a format this
/// crate cannot read ([`StoreError::UnsupportedFormat`]).
pub async fn verify_run(location: &StoreLocation, run: &str) -> Result<VerifyReport> {
    let mut report = VerifyReport::default();
    let run_json_path = location.run_json(run);
    let mut expected = Expected {
        hooks: Vec::new(),
        latents: Vec::new(),
        outputs: Vec::new(),
        format: None,
        shapes: Vec::new(),
        shapes_recorded: false,
    };
    match location.get_optional(&run_json_path).await? {
        None => report.problems.push(format!("{run_json_path} is missing")),
        Some(bytes) => match serde_json::from_slice::<RunJson>(&bytes) {
            Ok(parsed) => {
                expected.format = Some(parsed.format_version(run_json_path.as_ref())?);
                expected.hooks = parsed.descriptor.hooks.clone();
                expected.latents = parsed.descriptor.latents.clone();
                expected.outputs = parsed.descriptor.outputs.clone();
                let shapes = &parsed.descriptor.hook_shapes;
                if !shapes.is_empty() && shapes.len() != expected.hooks.len() {
                    report.problems.push(format!(
                        "{run_json_path} records {} hook shapes for {} hooks",
                        shapes.len(),
                        expected.hooks.len()
                    ));
                } else if !shapes.is_empty() {
                    expected.shapes = shapes.clone();
                    expected.shapes_recorded = true;
                }
                report.problems.extend(parsed.check_numbers().into_iter().map(|p| format!("{run_json_path}: {p}")));
                report.run_json = Some(parsed);
            }
            Err(e) => {
                // An unreadable format is an error even when the rest does not parse.
                if let Some(tag) = serde_json::from_slice::<serde_json::Value>(&bytes)
                    .ok()
                    .and_then(|v| v.get("format").and_then(|f| f.as_str()).map(String::from))
                {
                    check_format(run_json_path.as_ref(), &tag)?;
                }
                report.problems.push(format!("{run_json_path} does not parse: {e}"));
            }
        },
    }
    let mut all_stats = RunStats::new();
    let mut shards = Sha256::new();
    for host in list_hosts(location, run).await? {
        let (host_report, host_stats) = verify_host(location, run, host, &mut expected).await?;
        report.tokens = report.tokens.saturating_add(host_report.tokens);
        report.included_tokens = report.included_tokens.saturating_add(host_report.included_tokens);
        stats::merge_run_stats(&mut all_stats, &host_stats)?;
        shards.update(format!("{} {}\n", host.dir_name(), host_report.shards_sha256));
        report.hosts.push(host_report);
    }
    report.shards_sha256 = hex::encode(shards.finalize());
    if report.hosts.is_empty() {
        report.problems.push("no host directories".into());
    }
    match location.get_optional(&location.run_stats(run)).await? {
        None => report.problems.push("run stats.json is missing (run not finalized)".into()),
        Some(bytes) => {
            report.stats_sha256 = Some(hex::encode(Sha256::digest(&bytes)));
            match serde_json::from_slice::<StatsFile>(&bytes) {
                Err(e) => report.problems.push(format!("run stats.json does not parse: {e}")),
                Ok(file) => {
                    check_stats("run stats.json", &file, &expected, report.included_tokens, &mut report.problems);
                    report.non_finite = non_finite(&file);
                    let hosts_ok = report.hosts.iter().all(|h| h.problems.is_empty());
                    if hosts_ok && !stats_match(&file, &all_stats) {
                        report.problems.push(
                            "run stats.json is not the statistics of the committed shards (recomputed from them)"
                                .into(),
                        );
                    }
                    report.stats = Some(file);
                }
            }
        }
    }
    report.format_version = expected.format;
    report.hook_shapes = expected.hooks.iter().cloned().zip(expected.shapes.iter().cloned()).collect();
    Ok(report)
}

/// Blocking form of [`verify_run`] for command-line tools.
pub fn verify_run_blocking(output: &str, options: &[(String, String)], run: &str) -> Result<VerifyReport> {
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

pub(crate) fn block_on<T>(future: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| StoreError::Io { op: "start runtime", path: "siphon-store".into(), source })?
        .block_on(future)
}

async fn verify_host(
    location: &StoreLocation,
    run: &str,
    host: HostId,
    expected: &mut Expected,
) -> Result<(HostReport, RunStats)> {
    let mut report = HostReport {
        host,
        shards: 0,
        tokens: 0,
        included_tokens: 0,
        samples_end: 0,
        bytes: 0,
        shards_sha256: String::new(),
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
    let mut shards = Sha256::new();
    for line in &lines {
        // A shard checked by sha256 enters as its bare hex, as before the CRC (the same digest
        // for older runs).
        let checksum = match (&line.crc32c, &line.sha256) {
            (None, Some(sha)) => sha.clone(),
            _ => line.checksum(),
        };
        shards.update(format!("{checksum}\n"));
    }
    report.shards_sha256 = hex::encode(shards.finalize());
    let dir = location.host_dir(run, host);
    let listed: BTreeMap<String, u64> = location
        .store()
        .list(Some(&dir))
        .map_ok(|m| (m.location.filename().unwrap_or_default().to_string(), m.size))
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
        report.tokens = report.tokens.saturating_add(line.tokens);
        report.included_tokens = report.included_tokens.saturating_add(line.included_tokens);
        report.bytes = report.bytes.saturating_add(line.bytes);
        report.samples_end = line.samples[1];
        let path = dir.clone().join(line.shard.as_str());
        let Some(bytes) = location.get_optional(&path).await? else {
            report.problems.push(format!("{}: committed shard is missing", line.shard));
            continue;
        };
        if bytes.len() as u64 != line.bytes {
            report.problems.push(format!("{}: {} bytes, manifest says {}", line.shard, bytes.len(), line.bytes));
        }
        if let Err(problem) = line.check(&bytes) {
            report.problems.push(format!("{}: {problem}", line.shard));
            continue;
        }
        let recorded: &[Vec<usize>] = if expected.shapes_recorded { &expected.shapes } else { &[] };
        match summarize_shard(path.as_ref(), &bytes, &expected.hooks, recorded, &expected.latents, &expected.outputs) {
            Err(e) => report.problems.push(e.to_string()),
            Ok(summary) => {
                match expected.format {
                    None => expected.format = Some(summary.format_version),
                    Some(format) if format != summary.format_version => report.problems.push(format!(
                        "{}: shard of format {}, run.json (or the first shard) says format {format}",
                        line.shard, summary.format_version
                    )),
                    Some(_) => {}
                }
                let shapes: Vec<Vec<usize>> = expected.hooks.iter().map(|h| summary.hook_shapes[h].clone()).collect();
                if expected.shapes.is_empty() {
                    expected.shapes = shapes;
                } else if !expected.shapes_recorded {
                    for ((hook, want), got) in expected.hooks.iter().zip(&expected.shapes).zip(&shapes) {
                        if want != got {
                            report.problems.push(format!(
                                "{}: hook {hook} has per-token shape {got:?}, earlier shards have {want:?}",
                                line.shard
                            ));
                        }
                    }
                }
                if summary.tokens != line.tokens || summary.included_tokens != line.included_tokens {
                    report.problems.push(format!(
                        "{}: holds {} tokens ({} included), manifest says {} ({})",
                        line.shard, summary.tokens, summary.included_tokens, line.tokens, line.included_tokens
                    ));
                }
                let range =
                    (summary.metadata.get("sample_start").cloned(), summary.metadata.get("sample_end").cloned());
                if range != (Some(line.samples[0].to_string()), Some(line.samples[1].to_string())) {
                    report.problems.push(format!(
                        "{}: metadata sample range {range:?}, manifest says {:?}",
                        line.shard, line.samples
                    ));
                }
                stats::merge_run_stats(&mut host_stats, &summary.stats)?;
            }
        }
    }
    match location.get_optional(&location.host_stats(run, host)).await? {
        None if lines.is_empty() => {}
        None => report.problems.push("stats.json is missing".into()),
        Some(bytes) => match serde_json::from_slice::<StatsFile>(&bytes) {
            Err(e) => report.problems.push(format!("stats.json does not parse: {e}")),
            Ok(file) => {
                let last = lines.last().map(|l| l.index);
                if file.through_shard != last {
                    report.problems.push(format!(
                        "stats.json covers shards through {:?}, manifest through {last:?}",
                        file.through_shard
                    ));
                }
                check_stats("stats.json", &file, expected, report.included_tokens, &mut report.problems);
                if report.problems.is_empty() && !stats_match(&file, &host_stats) {
                    report
                        .problems
                        .push("stats.json is not the statistics of the committed shards (recomputed from them)".into());
                }
            }
        },
    }
    Ok((report, host_stats))
}

/// Whether `file` holds exactly `recomputed`, the statistics of the committed shards read back.
/// Files written before statistics kept their exact running state (no `m2`) cannot say, and pass;
/// files written before minima and maxima were kept came from an earlier summation order, and
/// must agree within 1e-6 of each element's scale.
fn stats_match(file: &StatsFile, recomputed: &RunStats) -> bool {
    // Compared in their JSON forms, where a NaN statistic (of NaN activations) equals itself.
    let same = |a: &dyn erased::Json, b: &dyn erased::Json| a.json() == b.json();
    if !same(&file.latents, &recomputed.latents) || !same(&file.outputs, &recomputed.outputs) {
        return false;
    }
    if file.hooks.values().any(|h| h.m2.is_none()) {
        return true;
    }
    let mut expected = stats::to_file(recomputed, None).hooks;
    for (hook, stats) in &mut expected {
        // Format-1 files record no per-token shape.
        if file.hooks.get(hook).is_some_and(|h| h.shape.is_empty()) {
            stats.shape.clear();
        }
    }
    if file.hooks.values().any(|h| h.min.is_none()) {
        return file.hooks.len() == expected.len()
            && file.hooks.iter().all(|(hook, f)| expected.get(hook).is_some_and(|e| close_without_extremes(f, e)));
    }
    same(&file.hooks, &expected)
}

mod erased {
    /// A value's JSON form (statistics: non-finite values as strings, comparable).
    pub trait Json {
        fn json(&self) -> serde_json::Value;
    }
    impl<T: serde::Serialize> Json for T {
        fn json(&self) -> serde_json::Value {
            serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
        }
    }
}

/// `file` and `expected` (which has minima and maxima) agree within 1e-6 of each element's
/// scale (its standard deviation or mean, whichever is larger).
fn close_without_extremes(file: &stats::HookStatsJson, expected: &stats::HookStatsJson) -> bool {
    let close = |a: f64, b: f64, scale: f64| (a - b).abs() <= 1e-6 * scale.max(f64::MIN_POSITIVE);
    file.shape == expected.shape
        && file.count == expected.count
        && file.mean.len() == expected.mean.len()
        && file.variance.len() == expected.variance.len()
        && (0..file.mean.len()).all(|i| {
            let scale = expected.variance[i].sqrt().max(expected.mean[i].abs());
            close(file.mean[i], expected.mean[i], scale) && close(file.variance[i], expected.variance[i], scale * scale)
        })
        && close(file.mean_norm, expected.mean_norm, expected.mean_norm)
}

/// Each hook of `file` whose values are not all finite, said in a line: the ones it counts, or
/// statistics that are not finite though it counts none (a file of a siphon that kept no
/// count).
fn non_finite(file: &StatsFile) -> Vec<String> {
    file.hooks
        .iter()
        .filter_map(|(hook, s)| {
            let arrays = [Some(&s.mean), Some(&s.variance), s.m2.as_ref(), s.min.as_ref(), s.max.as_ref()];
            let scalars = [Some(s.mean_norm), s.norm_sum];
            let values = arrays.into_iter().flatten().flatten().chain(scalars.iter().flatten());
            let not_finite = values.filter(|v| !v.is_finite()).count();
            match (s.non_finite, not_finite) {
                (0, 0) => None,
                (0, n) => Some(format!("run stats.json: hook {hook} has {n} statistics that are not finite")),
                (count, _) => Some(format!(
                    "run stats.json: hook {hook} holds {count} values that are NaN or ±Inf (stored as \
                     --allow-non-finite lets a run; its statistics are null where they reach)"
                )),
            }
        })
        .collect()
}

/// Pushes what is wrong with `file`'s statistics of each of the run's columns (named `what`),
/// which must count the `included` tokens.
fn check_stats(what: &str, file: &StatsFile, expected: &Expected, included: u64, problems: &mut Vec<String>) {
    for column in columns(&expected.hooks, &expected.shapes, &expected.latents, &expected.outputs) {
        problems.extend(column.check_stats(file, included).map(|problem| format!("{what}: {problem}")));
    }
}
