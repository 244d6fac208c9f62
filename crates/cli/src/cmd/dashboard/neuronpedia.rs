//! `siphon export neuronpedia`: a dictionary's latents as the batch files SAEDashboard's
//! Neuronpedia runner writes (`OUT/batch-N.json`, uploaded to Neuronpedia as they are), from the
//! stored run — no model forward. The decoder's effects (logit effects, neuron alignment) and
//! the tokenizer's pieces are written here into a scratch effects directory
//! ([`super::write_effects`]); the passes over the shards and the files are the `siphon` Python
//! package's (`python -m siphon export-neuronpedia`, `siphon.dashboard.neuronpedia`).

use std::path::PathBuf;
use std::process::Command as Process;

use anyhow::{Context, bail};
use clap::Args as ClapArgs;

use super::{EffectsRequest, MAX_EXAMPLES, MAX_QUANTILES, new_or_empty, write_effects};
use crate::args::limits::count;

/// `siphon export neuronpedia` flags (the passes' passed on to `python -m siphon
/// export-neuronpedia`).
#[derive(ClapArgs)]
pub struct Args {
    /// The run directory ({output}/{run}): a path, s3:// or gs://.
    run: String,
    /// New or empty output directory: OUT/batch-N.json.
    out: PathBuf,
    /// The latents column (default: the run's only one).
    #[arg(long)]
    latents: Option<String>,
    /// Neuronpedia's model id, e.g. gpt2-small (default: the run's model directory's name).
    #[arg(long)]
    model_id: Option<String>,
    /// The layer (default: N of the dictionary's hook blocks.N.…).
    #[arg(long)]
    layer: Option<u32>,
    /// Neuronpedia's SAE set, e.g. res-jb.
    #[arg(long)]
    sae_set: String,
    /// Neuronpedia's suffix of the SAE id (…__SUFFIX).
    #[arg(long)]
    sae_id_suffix: Option<String>,
    /// The dataset the examples come from, as Neuronpedia names it (default: the run's corpus).
    #[arg(long)]
    dataset: Option<String>,
    /// Latents per batch file (SAEDashboard's n_features_at_a_time: its correlated features
    /// are those of the same batch).
    #[arg(long, default_value_t = 128, value_parser = count(1, MAX_BATCH_SIZE))]
    batch_size: usize,
    /// Largest activations per latent.
    #[arg(long, default_value_t = 20, value_parser = count(0, MAX_EXAMPLES))]
    top: usize,
    /// Equal-width activation intervals up to each latent's largest value.
    #[arg(long, default_value_t = 5, value_parser = count(1, MAX_QUANTILES))]
    quantiles: usize,
    /// Examples drawn per interval.
    #[arg(long, default_value_t = 5, value_parser = count(0, MAX_EXAMPLES))]
    per_quantile: usize,
    /// Seed of the intervals' draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The tokenizer naming the tokens: a tokenizer.json, an HF model directory or a .gguf
    /// (default: the run's, where it is on this machine).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// The model whose unembedding gives the logit effects: an HF model directory or a .gguf
    /// (default: the run's, where it is on this machine).
    #[arg(long)]
    model: Option<PathBuf>,
    /// PJRT plugin for the decoder products (default: SIPHON_PJRT_PLUGIN, then siphon's cache).
    #[arg(long, value_name = "PATH")]
    plugin: Option<PathBuf>,
    /// No progress line.
    #[arg(long)]
    no_progress: bool,
    /// Skip each shard's CRC32C check.
    #[arg(long)]
    no_check: bool,
    /// Python interpreter with the siphon package installed.
    #[arg(long, env = "SIPHON_PYTHON")]
    python: Option<PathBuf>,
}

/// SAEDashboard's Neuronpedia layout: 10 tokens each way of the logit table, 50 bins of the
/// histograms, 3 rows of each feature table.
const LOGITS: usize = 10;
const BINS: usize = 50;
const TABLE_ROWS: usize = 3;
/// Latents per batch file (`--batch-size`): each latent's correlations with the others of its
/// batch are summed (width × batch size float64; the Python side bounds that product).
const MAX_BATCH_SIZE: u64 = 1 << 16;

/// Writes the batch files.
pub fn run(args: Args) -> anyhow::Result<()> {
    // What the Python side refuses, refused before the decoder's products.
    new_or_empty(&args.out, "the batch files")?;
    let python = super::super::python::checked(args.python.clone(), "siphon.dashboard.neuronpedia", "")?;
    if args.latents.is_none() {
        let columns = super::run_json(&args.run)?
            .and_then(|j| {
                j["latents"]
                    .as_array()
                    .map(|l| l.iter().filter_map(|c| c["name"].as_str().map(String::from)).collect::<Vec<_>>())
            })
            .unwrap_or_default();
        if columns.len() > 1 {
            bail!(
                "{} has {} latents columns: name one with --latents ({})",
                args.run,
                columns.len(),
                columns.join(", ")
            );
        }
    }
    let scratch = tempfile::tempdir().context("creating a scratch directory for the decoder's effects")?;
    let effects = scratch.path().join("effects");
    let request = EffectsRequest {
        run: &args.run,
        latents: args.latents.as_deref(),
        tokenizer: args.tokenizer.as_deref(),
        model: args.model.as_deref(),
        plugin: args.plugin.as_deref(),
        neighbours: 0,
        logits: LOGITS,
        bins: BINS,
        alignment: TABLE_ROWS,
    };
    write_effects(&request, &effects)?;
    let mut cmd = Process::new(&python);
    cmd.args(["-m", "siphon", "export-neuronpedia", &args.run]).arg(&args.out).arg("--effects").arg(&effects);
    for (flag, value) in [
        ("--sae-set", Some(args.sae_set.clone())),
        ("--latents", args.latents.clone()),
        ("--model-id", args.model_id.clone()),
        ("--layer", args.layer.map(|l| l.to_string())),
        ("--sae-id-suffix", args.sae_id_suffix.clone()),
        ("--dataset", args.dataset.clone()),
        ("--batch-size", Some(args.batch_size.to_string())),
        ("--top", Some(args.top.to_string())),
        ("--quantiles", Some(args.quantiles.to_string())),
        ("--per-quantile", Some(args.per_quantile.to_string())),
        ("--seed", Some(args.seed.to_string())),
    ] {
        if let Some(value) = value {
            cmd.args([flag, &value]);
        }
    }
    if args.no_progress {
        cmd.arg("--no-progress");
    }
    if args.no_check {
        cmd.arg("--no-check");
    }
    let status = cmd.status().with_context(|| format!("running {} -m siphon export-neuronpedia", python.display()))?;
    if !status.success() {
        bail!("the Neuronpedia export into {} failed ({status})", args.out.display());
    }
    Ok(())
}
