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
//! pages show tokens rather than ids — and what each dictionary's decoder rows say: its
//! nearest latents and its logit effects through the run's model (`OUT/effects/{column}.safetensors`,
//! [`effects`]).
//!
//! Since that comes first, what the Python side would refuse is refused here before it: the
//! output folder unless new or empty ([`new_or_empty`], the rule of the Python package's
//! `_output.py`), and each count flag outside its range, where clap reads it (the pass's
//! bounds are the Python package's, which `python/tests/test_dashboard_cli.py` holds equal).

mod effects;
pub mod neuronpedia;

use std::path::{Path, PathBuf};
use std::process::Command as Process;

use anyhow::{Context, bail};
use clap::Args as ClapArgs;
use siphon_models::{DType, LoadedModel};
use siphon_runtime::{Client, ClientOptions, Plugin, PluginLocator};

use crate::args::limits::count;

/// Examples per latent of each kind (`--top`, `--per-quantile`): `siphon.examples.MAX_EXAMPLES`.
pub(crate) const MAX_EXAMPLES: u64 = 100_000;
/// Activation ranges (`--quantiles`): `siphon.examples.MAX_QUANTILES` (a range's index is an
/// int8 there).
pub(crate) const MAX_QUANTILES: u64 = 128;
/// Tokens on each side of an example (`--window`): `siphon.examples.MAX_WINDOW`.
const MAX_WINDOW: u64 = 4096;
/// Bins of a histogram (`--bins`): `siphon.dashboard._pass.MAX_BINS`.
const MAX_BINS: u64 = 10_000;
/// Rows of a latent's tables (`--neighbours`, `--logits`): what a page shows, not a dump.
const MAX_TABLE_ROWS: u64 = 1000;
/// Entries of one per-latent array of a column (latents × neighbours, logits or bins): the
/// Python pass's bound on its histograms (`MAX_HISTOGRAM_COUNTS`), which it checks after this
/// binary's effects.
const MAX_COLUMN_ENTRIES: usize = 1 << 30;

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
    #[arg(long, default_value_t = 20, value_parser = count(0, MAX_EXAMPLES))]
    top: usize,
    /// Equal-width activation ranges up to each latent's largest value.
    #[arg(long, default_value_t = 10, value_parser = count(1, MAX_QUANTILES))]
    quantiles: usize,
    /// Examples drawn per range.
    #[arg(long, default_value_t = 5, value_parser = count(0, MAX_EXAMPLES))]
    per_quantile: usize,
    /// Tokens shown on each side of an example.
    #[arg(long, default_value_t = 16, value_parser = count(0, MAX_WINDOW))]
    window: usize,
    /// Bins of each latent's activation histogram (and of its logit effects').
    #[arg(long, default_value_t = 50, value_parser = count(1, MAX_BINS))]
    bins: usize,
    /// Seed of the ranges' draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// No progress line.
    #[arg(long)]
    no_progress: bool,
    /// Nearest latents shown per latent, by decoder cosine (0: none).
    #[arg(long, default_value_t = 10, value_parser = count(0, MAX_TABLE_ROWS))]
    neighbours: usize,
    /// Tokens shown per latent whose logits its decoder direction raises most, and as many
    /// it lowers most (0: no logit effects).
    #[arg(long, default_value_t = 10, value_parser = count(0, MAX_TABLE_ROWS))]
    logits: usize,
    /// The model whose unembedding gives the logit effects: an HF model directory or a .gguf
    /// (default: the run's, where it is on this machine).
    #[arg(long)]
    model: Option<PathBuf>,
    /// PJRT plugin for the decoder products (default: SIPHON_PJRT_PLUGIN, then siphon's cache).
    #[arg(long, value_name = "PATH")]
    plugin: Option<PathBuf>,
    /// Python interpreter with the siphon package installed.
    #[arg(long, env = "SIPHON_PYTHON")]
    python: Option<PathBuf>,
}

/// Writes the dashboards.
pub fn run(args: Args) -> anyhow::Result<()> {
    new_or_empty(&args.out, "the dashboard's pages")?;
    let python = super::python::checked(args.python.clone(), "siphon.dashboard", "")?;
    let effects = args.out.join("effects");
    let request = EffectsRequest {
        run: &args.run,
        latents: args.latents.as_deref(),
        tokenizer: args.tokenizer.as_deref(),
        model: args.model.as_deref(),
        plugin: args.plugin.as_deref(),
        neighbours: args.neighbours,
        logits: args.logits,
        bins: args.bins,
        alignment: 0,
    };
    write_effects(&request, &effects)?;
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

/// Refuses `out` unless it is new or an empty directory, naming it and what goes there
/// (`holds`), before anything is computed or written: the rule and words of the Python
/// package's `check_new_or_empty`, which the passes apply again.
pub(crate) fn new_or_empty(out: &Path, holds: &str) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", out.display())),
        Ok(_) => {}
    }
    if !out.is_dir() {
        bail!("{}: not a folder ({holds} go into a new or empty folder)", out.display());
    }
    let mut entries = std::fs::read_dir(out).with_context(|| format!("reading {}", out.display()))?;
    if entries.next().is_some() {
        bail!("{}: not empty ({holds} go into a new or empty folder)", out.display());
    }
    Ok(())
}

/// What an effects directory gets (see [`write_effects`]) and where its inputs come from.
pub(crate) struct EffectsRequest<'a> {
    /// The run directory.
    pub run: &'a str,
    /// Comma-separated latents columns (`None`: every one of the run).
    pub latents: Option<&'a str>,
    /// The tokenizer naming the tokens (`None`: the run's, where it is on this machine).
    pub tokenizer: Option<&'a Path>,
    /// The model of the logit effects (`None`: the run's, where it is on this machine).
    pub model: Option<&'a Path>,
    /// The PJRT plugin of the decoder products.
    pub plugin: Option<&'a Path>,
    /// Nearest latents per latent (0: none).
    pub neighbours: usize,
    /// Tokens of largest and of most negative logit effect per latent (0: no logit effects).
    pub logits: usize,
    /// Bins of each latent's logits histogram.
    pub bins: usize,
    /// Largest decoder entries per latent ([`effects::alignment`]; 0: none).
    pub alignment: usize,
}

/// Writes the effects directory `dir`: the vocabulary as strings (`vocab.json`, each token
/// id decoded alone by the run's tokenizer) and as the tokenizer's own pieces (`pieces.json`,
/// what Neuronpedia shows), where a tokenizer is found, and each dictionary's effects file.
pub(crate) fn write_effects(request: &EffectsRequest<'_>, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tokenizer = match request.tokenizer {
        Some(path) => Some(path.to_path_buf()),
        None => run_tokenizer(request.run)?,
    };
    match tokenizer {
        Some(path) => write_vocab(&path, dir)?,
        None => {
            tracing::warn!("the run's tokenizer is not on this machine: tokens are shown as ids (give --tokenizer)")
        }
    }
    if request.neighbours > 0 || request.logits > 0 || request.alignment > 0 {
        write_all_effects(request, dir)?;
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

/// Each dictionary's effects (those of `--latents`) into `effects`: its nearest latents, its
/// decoder rows' largest entries, and its logit effects where the model is on this machine and its decoder writes to the
/// residual stream; what cannot be computed is passed over, said in the log.
fn write_all_effects(args: &EffectsRequest<'_>, effects: &Path) -> anyhow::Result<()> {
    let wanted: Option<Vec<&str>> = args.latents.map(|l| l.split(',').collect());
    let columns: Vec<_> = run_dictionaries(args.run)?
        .into_iter()
        .filter(|c| wanted.as_ref().is_none_or(|w| w.contains(&c.name.as_str())))
        .collect();
    if columns.is_empty() {
        return Ok(());
    }
    check_column_entries(&columns, args)?;
    let unembedding = if args.logits > 0 { unembedding(args)? } else { None };
    let choice =
        PluginLocator::new().explicit(args.plugin.map(Path::to_path_buf)).locate().context("finding a PJRT plugin")?;
    let plugin = Plugin::load(&choice.path).context("loading the PJRT plugin")?;
    let client = Client::new(&plugin, ClientOptions::new()).context("creating a PJRT client")?;
    for column in columns {
        let name = &column.name;
        let w_dec = match siphon_models::dictionary::decoder(&column.dictionary) {
            Ok(w_dec) => w_dec,
            Err(e) => {
                tracing::warn!("{name}: no nearest latents or logit effects ({e})");
                continue;
            }
        };
        let (unit, latents, d) = effects::unit_rows(&w_dec)?;
        let mut out = effects::ColumnEffects::default();
        effects::alignment(&mut out, &unit, (latents, d), args.alignment);
        effects::neighbours(&client, &mut out, &unit, (latents, d), args.neighbours)
            .with_context(|| format!("the nearest latents of {name}"))?;
        match &unembedding {
            Some(w_u) if !effects::writes_residual_basis(&column.hook) => tracing::warn!(
                "{name}: no logit effects: a dictionary on {} writes outside the residual stream's basis (SAEDashboard \
                 maps such rows through W_O or W_out first; siphon does not yet)",
                column.hook
            ),
            Some(w_u) if w_u.len() % d != 0 => {
                bail!(
                    "{name}: the decoder's rows have {d} values but the model's hidden size does not divide its unembedding"
                )
            }
            Some(w_u) => effects::logits(&client, &mut out, &unit, (latents, d), w_u, args.logits, args.bins)
                .with_context(|| format!("the logit effects of {name}"))?,
            None => {}
        }
        if !out.is_empty() {
            out.write(&effects.join(format!("{name}.safetensors")))?;
        }
    }
    Ok(())
}

/// Refuses a per-latent count whose array over a column's latents would pass
/// [`MAX_COLUMN_ENTRIES`], naming its flag, before the model or the plugin is loaded.
fn check_column_entries(columns: &[RunDictionary], args: &EffectsRequest<'_>) -> anyhow::Result<()> {
    for column in columns {
        for (flag, n) in [("--neighbours", args.neighbours), ("--logits", args.logits), ("--bins", args.bins)] {
            let entries = column.width.saturating_mul(n);
            if entries > MAX_COLUMN_ENTRIES {
                bail!(
                    "{flag} {n}: the {} latents of {} would make {entries} entries, more than {MAX_COLUMN_ENTRIES}: \
                     give a smaller {flag}",
                    column.width,
                    column.name
                );
            }
        }
    }
    Ok(())
}

/// The run's model's unembedding in TransformerLens's convention (`[vocab, hidden]`,
/// [`effects::folded_unembedding`]), where the model is on this machine (`--model`, else
/// run.json's `model.path`); `None`, said in the log, where it is not.
fn unembedding(args: &EffectsRequest<'_>) -> anyhow::Result<Option<Vec<f32>>> {
    let named = match args.model {
        Some(path) => Some(path.to_path_buf()),
        None => run_json(args.run)?.and_then(|j| j["model"]["path"].as_str().map(PathBuf::from)).filter(|p| p.exists()),
    };
    let Some(path) = named else {
        tracing::warn!("the run's model is not on this machine: no logit effects (give --model)");
        return Ok(None);
    };
    let model = LoadedModel::open(&path).with_context(|| format!("opening the model {}", path.display()))?;
    let names = model.config.unembedding()?;
    let read = |name: &str| -> anyhow::Result<Vec<f32>> {
        Ok(model.weights.get(name, DType::F32).with_context(|| format!("reading {name}"))?.to_f32_vec())
    };
    let unembed = read(&names.weight)?;
    let d = model.config.hidden_size;
    if d == 0 || unembed.len() % d != 0 {
        bail!("{}: {} has {} values, not [vocab, {d}]", path.display(), names.weight, unembed.len());
    }
    let gain = match &names.norm {
        Some(norm) => {
            let mut gain = read(norm)?;
            if gain.len() != d {
                bail!("{}: {norm} has {} values, not the hidden size {d}", path.display(), gain.len());
            }
            if names.unit_offset {
                gain.iter_mut().for_each(|g| *g += 1.0);
            }
            Some(gain)
        }
        None => None,
    };
    Ok(Some(effects::folded_unembedding(&unembed, gain.as_deref(), d, names.centred)))
}

/// A latents column of the run whose dictionary is on this machine.
struct RunDictionary {
    /// The column's name.
    name: String,
    /// The hook its dictionary reads.
    hook: String,
    /// Its latents (run.json's `latents[].width`).
    width: usize,
    /// The dictionary's directory (run.json's `latents[].dictionary.source`).
    dictionary: PathBuf,
}

/// Each latents column of the run whose dictionary's directory is on this machine.
fn run_dictionaries(run: &str) -> anyhow::Result<Vec<RunDictionary>> {
    let Some(json) = run_json(run)? else { return Ok(Vec::new()) };
    let latents = json["latents"].as_array().map(Vec::as_slice).unwrap_or_default();
    Ok(latents
        .iter()
        .filter_map(|l| {
            Some(RunDictionary {
                name: l["name"].as_str()?.to_string(),
                hook: l["hook"].as_str()?.to_string(),
                width: usize::try_from(l["width"].as_u64()?).ok()?,
                dictionary: PathBuf::from(l["dictionary"]["source"].as_str()?),
            })
        })
        .filter(|c| c.dictionary.is_dir())
        .collect())
}

/// The tokenizer at `path`'s vocabulary into `dir`, each a JSON list by token id: every id
/// decoded alone (`vocab.json`) and its piece as the tokenizer stores it (`pieces.json`, e.g.
/// `Ġthe`; `null` for an id without one).
fn write_vocab(path: &Path, dir: &Path) -> anyhow::Result<()> {
    let (tokenizer, _) = super::data::load_tokenizer(path)?;
    let inner = tokenizer.inner();
    let size = inner.get_vocab_size(true) as u32;
    let vocab = (0..size)
        .map(|id| inner.decode(&[id], false).map_err(|e| anyhow::anyhow!("decoding token {id}: {e}")))
        .collect::<anyhow::Result<Vec<String>>>()?;
    let pieces: Vec<Option<String>> = (0..size).map(|id| inner.id_to_token(id)).collect();
    for (name, text) in [("vocab.json", serde_json::to_string(&vocab)), ("pieces.json", serde_json::to_string(&pieces))]
    {
        let out = dir.join(name);
        let text = text.context("serializing the vocabulary")?;
        std::fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_is_taken_only_new_or_empty() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("site");
        new_or_empty(&out, "the pages").unwrap();
        std::fs::create_dir(&out).unwrap();
        new_or_empty(&out, "the pages").unwrap();
        std::fs::write(out.join("index.html"), "mine").unwrap();
        let error = new_or_empty(&out, "the pages").unwrap_err().to_string();
        assert_eq!(error, format!("{}: not empty (the pages go into a new or empty folder)", out.display()));
        let error = new_or_empty(&out.join("index.html"), "the pages").unwrap_err().to_string();
        assert!(error.ends_with("index.html: not a folder (the pages go into a new or empty folder)"), "{error}");
    }

    #[test]
    fn a_per_latent_count_past_a_columns_bound_is_refused_naming_its_flag() {
        let column = |width| RunDictionary {
            name: "c".into(),
            hook: "blocks.0.hook_resid_post".into(),
            width,
            dictionary: PathBuf::from("/d"),
        };
        let request = |neighbours, logits, bins| EffectsRequest {
            run: "r",
            latents: None,
            tokenizer: None,
            model: None,
            plugin: None,
            neighbours,
            logits,
            bins,
            alignment: 0,
        };
        // 16M latents at the defaults fit; a thousand bins of a million latents do not.
        check_column_entries(&[column(1 << 24)], &request(10, 10, 50)).unwrap();
        for (flag, args) in
            [("--bins", request(0, 0, 1025)), ("--neighbours", request(1025, 0, 1)), ("--logits", request(0, 1025, 1))]
        {
            let error = check_column_entries(&[column(1 << 20), column(1 << 20)], &args).unwrap_err().to_string();
            assert!(error.starts_with(&format!("{flag} 1025: the 1048576 latents of c")), "{error}");
            assert!(error.contains(&format!("give a smaller {flag}")), "{error}");
        }
    }
}
