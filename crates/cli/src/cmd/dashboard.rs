//! `siphon dashboard`: a run's feature dashboards as a static site that opens from `file://`
//! (no server, no network): an index of every latent of each dictionary, a page per latent
//! (its top and per-activation-range examples with each token's activation, its histogram)
//! and, for the hooks, their per-dimension statistics.
//!
//! The one pass over the shards and the pages are the `siphon` Python package's
//! (`python -m siphon dashboard`, `siphon.dashboard`), which reads the shards as the other
//! exports do; this command first writes what only the model knows beside them — the
//! vocabulary as strings (`OUT/effects/vocab.json`, each token id decoded alone by the run's
//! tokenizer: `--tokenizer`, else the one run.json names, else its model's), so that the
//! pages show tokens rather than ids.

use std::path::{Path, PathBuf};
use std::process::Command as Process;

use anyhow::{Context, bail};
use clap::Args as ClapArgs;

/// `siphon dashboard` flags (the pass's passed on to `python -m siphon dashboard`).
#[derive(ClapArgs)]
pub struct Args {
    /// The run directory ({output}/{run}): a path, s3:// or gs://.
    run: String,
    /// New or empty output directory: OUT/index.html.
    #[arg(long)]
    out: PathBuf,
    /// Comma-separated latents columns (default: every one of the run).
    #[arg(long)]
    latents: Option<String>,
    /// The tokenizer that names the tokens: a tokenizer.json, an HF model directory or a .gguf
    /// (default: the run's, where it is on this machine; without one the pages show token ids).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Largest activations shown per latent.
    #[arg(long, default_value_t = 20)]
    top: u32,
    /// Equal-width activation ranges up to each latent's largest value.
    #[arg(long, default_value_t = 10)]
    quantiles: u32,
    /// Examples drawn per range.
    #[arg(long, default_value_t = 5)]
    per_quantile: u32,
    /// Tokens shown on each side of an example.
    #[arg(long, default_value_t = 16)]
    window: u32,
    /// Bins of each latent's activation histogram.
    #[arg(long, default_value_t = 50)]
    bins: u32,
    /// Seed of the ranges' draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// No progress line.
    #[arg(long)]
    no_progress: bool,
    /// Python interpreter with the siphon package installed.
    #[arg(long, env = "SIPHON_PYTHON")]
    python: Option<PathBuf>,
}

/// Writes the dashboards.
pub fn run(args: Args) -> anyhow::Result<()> {
    let python = super::export::checked_python(args.python.clone(), "siphon.dashboard", "")?;
    let effects = args.out.join("effects");
    std::fs::create_dir_all(&effects).with_context(|| format!("creating {}", effects.display()))?;
    let tokenizer = match &args.tokenizer {
        Some(path) => Some(path.clone()),
        None => run_tokenizer(&args.run)?,
    };
    match tokenizer {
        Some(path) => write_vocab(&path, &effects.join("vocab.json"))?,
        None => {
            tracing::warn!("the run's tokenizer is not on this machine: tokens are shown as ids (give --tokenizer)")
        }
    }
    let mut cmd = Process::new(&python);
    cmd.args(["-m", "siphon", "dashboard", &args.run, "--out"]).arg(&args.out).arg("--effects").arg(&effects);
    for (flag, value) in [
        ("--top", args.top.to_string()),
        ("--quantiles", args.quantiles.to_string()),
        ("--per-quantile", args.per_quantile.to_string()),
        ("--window", args.window.to_string()),
        ("--bins", args.bins.to_string()),
        ("--seed", args.seed.to_string()),
    ] {
        cmd.args([flag, &value]);
    }
    if let Some(latents) = &args.latents {
        cmd.args(["--latents", latents]);
    }
    if args.no_progress {
        cmd.arg("--no-progress");
    }
    let status = cmd.status().with_context(|| format!("running {} -m siphon dashboard", python.display()))?;
    if !status.success() {
        bail!("dashboards into {} failed ({status})", args.out.display());
    }
    Ok(())
}

/// The run's tokenizer where the run is a local directory and it is on this machine: the one
/// its job named (run.json's `config.tokenizer`), else its model (`model.path`).
fn run_tokenizer(run: &str) -> anyhow::Result<Option<PathBuf>> {
    let path = Path::new(run).join("run.json");
    if run.contains("://") || !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let named = [&json["config"]["tokenizer"], &json["model"]["path"]];
    Ok(named.into_iter().filter_map(|v| v.as_str()).map(PathBuf::from).find(|p| p.exists()))
}

/// Every token id of the tokenizer at `path` decoded alone, as a JSON list by id.
fn write_vocab(path: &Path, out: &Path) -> anyhow::Result<()> {
    let (tokenizer, _) = super::data::load_tokenizer(path)?;
    let inner = tokenizer.inner();
    let size = inner.get_vocab_size(true) as u32;
    let vocab = (0..size)
        .map(|id| inner.decode(&[id], false).map_err(|e| anyhow::anyhow!("decoding token {id}: {e}")))
        .collect::<anyhow::Result<Vec<String>>>()?;
    let text = serde_json::to_string(&vocab).context("serializing the vocabulary")?;
    std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))
}
