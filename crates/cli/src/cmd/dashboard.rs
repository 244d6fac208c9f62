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
//! pages show tokens rather than ids — and each dictionary's nearest latents by the cosine of
//! their decoder rows (`OUT/effects/{column}.safetensors`: `neighbours_ids` i32 and
//! `neighbours_cosine` f32 `[d_sae, n]`, largest first, the latent itself left out), computed
//! by XLA on the CPU plugin in chunks of rows.

use std::path::{Path, PathBuf};
use std::process::Command as Process;

use anyhow::{Context, bail};
use clap::Args as ClapArgs;
use siphon_hlo::{Builder, DType, TensorType};
use siphon_models::dictionary::Tensor;
use siphon_runtime::{Client, ClientOptions, CompileOptions, HostArray, Plugin, PluginLocator};

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
    /// Nearest latents shown per latent, by decoder cosine (0: none).
    #[arg(long, default_value_t = 10)]
    neighbours: usize,
    /// PJRT plugin for the decoder products (default: SIPHON_PJRT_PLUGIN, then siphon's cache).
    #[arg(long, value_name = "PATH")]
    plugin: Option<PathBuf>,
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
    if args.neighbours > 0 {
        write_all_neighbours(&args, &effects)?;
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

/// The run's run.json where the run is a local directory (`None` for an object store's: what
/// it names is not on this machine either).
fn run_json(run: &str) -> anyhow::Result<Option<serde_json::Value>> {
    let path = Path::new(run).join("run.json");
    if run.contains("://") || !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Some(serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?))
}

/// The run's tokenizer where it is on this machine: the one its job named (run.json's
/// `config.tokenizer`), else its model (`model.path`).
fn run_tokenizer(run: &str) -> anyhow::Result<Option<PathBuf>> {
    let Some(json) = run_json(run)? else { return Ok(None) };
    let named = [&json["config"]["tokenizer"], &json["model"]["path"]];
    Ok(named.into_iter().filter_map(|v| v.as_str()).map(PathBuf::from).find(|p| p.exists()))
}

/// Each dictionary's nearest latents (those of `--latents`) into `effects`; a dictionary whose
/// decoder siphon does not read is passed over, said in the log.
fn write_all_neighbours(args: &Args, effects: &Path) -> anyhow::Result<()> {
    let wanted: Option<Vec<&str>> = args.latents.as_deref().map(|l| l.split(',').collect());
    let columns: Vec<_> = run_dictionaries(&args.run)?
        .into_iter()
        .filter(|(name, _)| wanted.as_ref().is_none_or(|w| w.contains(&name.as_str())))
        .collect();
    if columns.is_empty() {
        return Ok(());
    }
    let choice = PluginLocator::new().explicit(args.plugin.clone()).locate().context("finding a PJRT plugin")?;
    let plugin = Plugin::load(&choice.path).context("loading the PJRT plugin")?;
    let client = Client::new(&plugin, ClientOptions::new()).context("creating a PJRT client")?;
    for (name, dictionary) in columns {
        match siphon_models::dictionary_files::decoder(&dictionary) {
            Ok(w_dec) => {
                let (ids, cosine) = neighbours(&client, &w_dec, args.neighbours)
                    .with_context(|| format!("the nearest latents of {name}"))?;
                write_neighbours(&effects.join(format!("{name}.safetensors")), &ids, &cosine, w_dec.shape[0])?;
            }
            Err(e) => tracing::warn!("{name}: no nearest latents ({e})"),
        }
    }
    Ok(())
}

/// Each latents column of the run with its dictionary's directory, where that is on this
/// machine (run.json's `latents[].dictionary.source`).
fn run_dictionaries(run: &str) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let Some(json) = run_json(run)? else { return Ok(Vec::new()) };
    let latents = json["latents"].as_array().map(Vec::as_slice).unwrap_or_default();
    Ok(latents
        .iter()
        .filter_map(|l| Some((l["name"].as_str()?.to_string(), PathBuf::from(l["dictionary"]["source"].as_str()?))))
        .filter(|(_, dir)| dir.is_dir())
        .collect())
}

/// Rows of the decoder multiplied at once.
const CHUNK: usize = 1024;

/// Each latent's `n` nearest others by the cosine of its decoder row `w_dec` `[d_sae, d]`
/// (a zero row's cosines are 0), largest first: `[d_sae, n]` ids and cosines, by
/// `normalized · normalizedᵀ` and top-k on `client` in chunks of [`CHUNK`] rows.
fn neighbours(client: &Client, w_dec: &Tensor, n: usize) -> anyhow::Result<(Vec<i32>, Vec<f32>)> {
    let [latents, d] = w_dec.shape[..] else { bail!("W_dec is {:?}, not [d_sae, d]", w_dec.shape) };
    let n = n.min(latents.saturating_sub(1));
    if n == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    let mut unit = w_dec.values.clone();
    for row in unit.chunks_exact_mut(d) {
        let norm = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt();
        row.iter_mut().for_each(|v| *v = if norm > 0.0 { (f64::from(*v) / norm) as f32 } else { 0.0 });
    }
    let chunk = CHUNK.min(latents);
    let mut b = Builder::new("neighbours");
    let rows = b.arg(TensorType::new(DType::F32, &[chunk, d]), None)?;
    let all = b.arg(TensorType::new(DType::F32, &[latents, d]), None)?;
    let cosine = b.matmul_t(rows, all)?;
    let (values, indices) = b.top_k(cosine, n + 1)?;
    let exe = client.compile(&b.finish(&[values, indices])?, &CompileOptions::single_device(None))?;
    let device = exe.device_ids()[0];
    let all = client.upload(&HostArray::from_slice(&[latents, d], &unit)?, device)?;
    let (mut ids, mut cosines) = (Vec::with_capacity(latents * n), Vec::with_capacity(latents * n));
    for start in (0..latents).step_by(chunk) {
        let end = (start + chunk).min(latents);
        let mut block = vec![0f32; chunk * d];
        block[..(end - start) * d].copy_from_slice(&unit[start * d..end * d]);
        let block = client.upload(&HostArray::from_slice(&[chunk, d], &block)?, device)?;
        let out = exe.execute(&[vec![&block, &all]])?;
        let values = out[0][0].to_host()?.to_f32();
        let found = out[0][1].to_host()?;
        let found: Vec<i32> =
            found.bytes().chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        for r in 0..end - start {
            // The latent itself (cosine 1) is left out, wherever the top-k put it.
            let latent = (start + r) as i32;
            for i in (r * (n + 1)..(r + 1) * (n + 1)).filter(|&i| found[i] != latent).take(n) {
                ids.push(found[i]);
                cosines.push(values[i]);
            }
        }
    }
    Ok((ids, cosines))
}

/// The nearest latents of `latents` latents as the effects file `siphon.dashboard` reads.
fn write_neighbours(path: &Path, ids: &[i32], cosine: &[f32], latents: usize) -> anyhow::Result<()> {
    use safetensors::{Dtype, tensor::TensorView};
    let n = ids.len() / latents.max(1);
    let id_bytes: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
    let cos_bytes: Vec<u8> = cosine.iter().flat_map(|v| v.to_le_bytes()).collect();
    let tensors = [
        ("neighbours_ids", TensorView::new(Dtype::I32, vec![latents, n], &id_bytes)?),
        ("neighbours_cosine", TensorView::new(Dtype::F32, vec![latents, n], &cos_bytes)?),
    ];
    safetensors::serialize_to_file(tensors, None, path).with_context(|| format!("writing {}", path.display()))
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
