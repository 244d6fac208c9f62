//! `siphon export saelens`: a run as SAELens's cached-activation dataset.
//!
//! The format is HF datasets' `save_to_disk` (Arrow), which only the Python `datasets` package
//! writes faithfully, so this command hands the work to the `siphon` Python module that
//! `pip install <checkout>` installs beside the binary (`python -m siphon export-saelens`).
//! The interpreter: `--python`, `SIPHON_PYTHON`, the `python` beside this executable (a venv's
//! `bin/`), then `python3` on `PATH`.

use std::path::PathBuf;
use std::process::Command as Process;

use anyhow::{Context, bail};
use clap::{Args as ClapArgs, Subcommand};

/// Export formats.
#[derive(Subcommand)]
pub enum Command {
    /// HF datasets Arrow files as SAELens's CacheActivationsRunner writes them: one
    /// Array2D(context_size, d_in) column per hook and token_ids; train with
    /// use_cached_activations=True, cached_activations_path=OUT.
    Saelens(SaelensArgs),
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
    /// Tokens per row (default: the run's seq_len).
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
    /// Stop after this many tokens.
    #[arg(long)]
    max_tokens: Option<u64>,
    /// Python interpreter with the siphon package installed.
    #[arg(long, env = "SIPHON_PYTHON")]
    python: Option<PathBuf>,
}

/// Runs an export.
pub fn run(command: Command) -> anyhow::Result<()> {
    let Command::Saelens(args) = command;
    let python = python(args.python.clone());
    let probe = Process::new(&python)
        .args(["-c", "import siphon.saelens"])
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !probe.status.success() {
        bail!(
            "{} cannot import the siphon Python package ({}): `pip install <siphon checkout>` (with datasets: `pip install '<checkout>[saelens]'`), or name another interpreter with --python",
            python.display(),
            String::from_utf8_lossy(&probe.stderr).trim().lines().last().unwrap_or("no output")
        );
    }
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

fn python(given: Option<PathBuf>) -> PathBuf {
    if let Some(python) = given {
        return python;
    }
    let beside =
        std::env::current_exe().ok().and_then(|exe| exe.parent().map(|dir| dir.join("python"))).filter(|p| p.exists());
    beside.unwrap_or_else(|| PathBuf::from("python3"))
}
