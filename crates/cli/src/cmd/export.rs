//! `siphon export saelens`: a run as SAELens's cached-activation dataset; `siphon export
//! delphi`: a run's dictionary latents as delphi's latent cache; `siphon export neuronpedia`
//! ([`super::dashboard::neuronpedia`]): Neuronpedia's batch files.
//!
//! SAELens's format is HF datasets' `save_to_disk` (Arrow), which only the Python `datasets`
//! package writes faithfully, and delphi's is read by its own Python loader, so these commands
//! hand the work to the `siphon` Python module that `pip install <checkout>` installs beside
//! the binary (`python -m siphon export-saelens`, `python -m siphon export-delphi`), run by
//! the interpreter [`python::checked`] finds. The Python side checks what depends on the run
//! before any work, naming the flag or the folder: each folder new or empty, `--splits` at most
//! the dictionary's latents, a row (`--ctx-len`, `--context-size`) at most the run's tokens.

use std::path::PathBuf;
use std::process::Command as Process;

use anyhow::{Context, bail};
use clap::{Args as ClapArgs, Subcommand};

use super::python;

/// Export formats.
#[derive(Subcommand)]
pub enum Command {
    /// HF datasets Arrow files as SAELens's CacheActivationsRunner writes them: one
    /// Array2D(context_size, d_in) column per hook and token_ids; train with
    /// use_cached_activations=True, cached_activations_path=OUT.
    Saelens(SaelensArgs),
    /// delphi's latent cache (EleutherAI's automated interpretability) of the run's dictionary
    /// latents: OUT/<hookpoint>/<start>_<end>.safetensors (locations, activations, tokens) and
    /// config.json, loaded by delphi's LatentDataset(raw_dir=OUT, ...).
    Delphi(DelphiArgs),
    /// Neuronpedia's batch files of a dictionary's latents, as SAEDashboard's Neuronpedia
    /// runner writes them (OUT/batch-N.json), from the stored run: no model forward.
    Neuronpedia(super::dashboard::neuronpedia::Args),
}

/// `siphon export delphi` flags (passed on to `python -m siphon export-delphi`).
#[derive(ClapArgs)]
pub struct DelphiArgs {
    /// The run directory ({output}/{run}): a path, s3:// or gs://.
    run: String,
    /// delphi's latents directory: one folder per hookpoint is added (each new or empty).
    out: PathBuf,
    /// Comma-separated latents columns (default: every one of the run).
    #[arg(long)]
    latents: Option<String>,
    /// Latent ranges per hookpoint, as delphi's n_splits (at most the dictionary's latents).
    #[arg(long, default_value_t = 5)]
    splits: u32,
    /// Tokens per row (default: the run's seq_len; exact sequences are always seq_len).
    #[arg(long)]
    ctx_len: Option<u64>,
    /// exact: the rows the model ran on (needs a run extracted with --keep-excluded); stored:
    /// the stored tokens cut into ctx-len rows, as delphi's filter_bos.
    #[arg(long, default_value = "exact", value_parser = ["exact", "stored"])]
    sequences: String,
    /// NAME=HOOKPOINT: the folder (delphi's hookpoint, the module path it hooks) of latents
    /// column NAME; repeatable. Default: from the hook and the model type (layers.N, ...).
    #[arg(long, value_name = "NAME=HOOKPOINT")]
    hookpoint: Vec<String>,
    /// config.json's model_name (delphi loads the tokenizer by it; default: the run's model).
    #[arg(long)]
    model_name: Option<String>,
    /// Keep the latents of excluded tokens (BOS, EOS, padding) in exact sequences.
    #[arg(long)]
    keep_excluded_latents: bool,
    /// Keep entries whose |value| is above this (delphi's cache: 1e-5).
    #[arg(long)]
    min_activation: Option<f64>,
    /// Skip each shard's CRC32C check.
    #[arg(long)]
    no_check: bool,
    /// Python interpreter with the siphon package installed.
    #[arg(long, env = "SIPHON_PYTHON")]
    python: Option<PathBuf>,
}

/// `siphon export saelens` flags (passed on to `python -m siphon export-saelens`).
#[derive(ClapArgs)]
pub struct SaelensArgs {
    /// The run directory ({output}/{run}): a path, s3:// or gs://.
    run: String,
    /// New or empty output directory.
    out: PathBuf,
    /// Comma-separated hooks (default: every hook of the run).
    #[arg(long)]
    hooks: Option<String>,
    /// Tokens per row (default: the run's seq_len; at most the run's tokens).
    #[arg(long)]
    context_size: Option<u64>,
    /// Stored dtype of the activations (Arrow has no bfloat16).
    #[arg(long, default_value = "float32", value_parser = ["float32", "float16"])]
    dtype: String,
    /// Keep the stored token order instead of shuffling.
    #[arg(long)]
    no_shuffle: bool,
    /// Shuffle seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Comma-separated token ids to leave out (e.g. BOS when kept).
    #[arg(long)]
    exclude_token_ids: Option<String>,
    /// Stop after this many tokens (at least a row).
    #[arg(long)]
    max_tokens: Option<u64>,
    /// Python interpreter with the siphon package installed.
    #[arg(long, env = "SIPHON_PYTHON")]
    python: Option<PathBuf>,
}

/// Runs an export.
pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Saelens(args) => saelens(args),
        Command::Delphi(args) => delphi(args),
        Command::Neuronpedia(args) => super::dashboard::neuronpedia::run(args),
    }
}

fn delphi(args: DelphiArgs) -> anyhow::Result<()> {
    let python = python::checked(args.python.clone(), "siphon.delphi", "")?;
    let mut cmd = Process::new(&python);
    cmd.args(["-m", "siphon", "export-delphi", &args.run]).arg(&args.out);
    cmd.args(["--splits", &args.splits.to_string(), "--sequences", &args.sequences]);
    if let Some(latents) = &args.latents {
        cmd.args(["--latents", latents]);
    }
    if let Some(n) = args.ctx_len {
        cmd.args(["--ctx-len", &n.to_string()]);
    }
    for hookpoint in &args.hookpoint {
        cmd.args(["--hookpoint", hookpoint]);
    }
    if let Some(name) = &args.model_name {
        cmd.args(["--model-name", name]);
    }
    if args.keep_excluded_latents {
        cmd.arg("--keep-excluded-latents");
    }
    if let Some(v) = args.min_activation {
        cmd.args(["--min-activation", &v.to_string()]);
    }
    if args.no_check {
        cmd.arg("--no-check");
    }
    let status = cmd.status().with_context(|| format!("running {} -m siphon export-delphi", python.display()))?;
    if !status.success() {
        bail!("export to {} failed ({status})", args.out.display());
    }
    Ok(())
}

fn saelens(args: SaelensArgs) -> anyhow::Result<()> {
    let python = python::checked(
        args.python.clone(),
        "siphon.saelens",
        " (with datasets: `pip install '<checkout>[saelens]'`)",
    )?;
    let mut cmd = Process::new(&python);
    cmd.args(["-m", "siphon", "export-saelens", &args.run]).arg(&args.out);
    cmd.args(["--dtype", &args.dtype, "--seed", &args.seed.to_string()]);
    if let Some(hooks) = &args.hooks {
        cmd.args(["--hooks", hooks]);
    }
    if let Some(n) = args.context_size {
        cmd.args(["--context-size", &n.to_string()]);
    }
    if args.no_shuffle {
        cmd.arg("--no-shuffle");
    }
    if let Some(ids) = &args.exclude_token_ids {
        cmd.args(["--exclude-token-ids", ids]);
    }
    if let Some(n) = args.max_tokens {
        cmd.args(["--max-tokens", &n.to_string()]);
    }
    let status = cmd.status().with_context(|| format!("running {} -m siphon export-saelens", python.display()))?;
    if !status.success() {
        bail!("export to {} failed ({status})", args.out.display());
    }
    Ok(())
}
