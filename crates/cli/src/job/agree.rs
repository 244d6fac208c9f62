//! Phase 4, the configuration check: every host must run the same code on the same
//! configuration, so rank 0's is broadcast and each host's compared with it — the resolved
//! run spec, the model's config, the corpus listing's fingerprint, siphon's version, the
//! plugin's sha256 and each dictionary's ([`super::dictionary::fingerprint`]). The run's name
//! comes from it when `--run` gives none, so the same command resumes the same run.

use std::path::Path;

use anyhow::Context;
use serde_json::json;
use siphon_coord::Coordination;

use super::{BARRIER_TIMEOUT, RunSpec};

/// Agrees the configuration with every host; the run's name.
pub fn run_name(
    coord: &Coordination,
    spec: &RunSpec,
    model: &siphon_models::ModelConfig,
    corpus: &siphon_data::Corpus,
    plugin: &Path,
    fingerprints: &[String],
) -> anyhow::Result<String> {
    let compared = json!({
        "spec": spec,
        "model_config": model,
        "corpus_fingerprint": format!("{:016x}", corpus.fingerprint()),
        "siphon_version": env!("CARGO_PKG_VERSION"),
        "plugin_sha256": sha256_file(plugin)?,
        // What the dictionaries' files hold, not only their paths.
        "dictionaries_sha256": fingerprints,
    });
    let run_info = coord
        .broadcast_config(&compared, BARRIER_TIMEOUT)
        .context("the hosts' configurations differ (the same command must run on every host)")?;
    let run_name = match &spec.run {
        Some(name) => name.clone(),
        // Derived from the configuration, so re-running the same command resumes the same run.
        None => format!("run-{}", &siphon_coord::broadcast::config_hash(&compared)[..12]),
    };
    tracing::info!(run = %run_name, started = %run_info["start_time"], "configuration agreed by every host");
    Ok(run_name)
}

fn sha256_file(path: &Path) -> anyhow::Result<String> {
    use sha2::Digest;
    let mut file = std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut file, &mut hasher).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(format!("{:x}", hasher.finalize()))
}
