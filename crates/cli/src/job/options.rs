//! The flags of `siphon extract` and their resolution, without I/O, into a [`RunSpec`]: the
//! part of the configuration that decides the dataset and must be identical on every host.

use std::path::PathBuf;

use anyhow::{Context, bail};
use serde::Serialize;

use crate::args::ClusterArgs;
use crate::args::CorpusArgs;
use crate::args::limits;
use siphon_data::Positions;

/// Every `siphon extract` option (also the keys of its TOML config file).
#[derive(clap::Args, Debug, Clone)]
pub struct ExtractOptions {
    // --- model ---
    /// Model: a Hugging Face directory (config.json + safetensors) or a .gguf file, local or
    /// `hf://org/name[@revision]`, gs://, s3://, https:// (downloaded once into siphon's cache).
    #[arg(long, help_heading = "Model")]
    pub model: Option<PathBuf>,
    /// tokenizer.json to use instead of the model's own tokenizer.
    #[arg(long, help_heading = "Model")]
    pub tokenizer: Option<PathBuf>,
    /// Hook points, comma-separated TransformerLens names (`blocks.3.hook_resid_post,...`).
    #[arg(long, help_heading = "Model")]
    pub hooks: Option<String>,
    /// Shorthand for those layers' `hook_resid_post`: `20-27`, `3,5,7` or `0-3,10`.
    #[arg(long, help_heading = "Model")]
    pub layers: Option<String>,
    /// Stored activation dtype: f32, bf16, f16 or fp8 (`float8_e4m3fn` with one f32 scale per
    /// token row, quantized on the device: about half of bf16's bytes; the Python reader
    /// returns it as the dtype asked for).
    #[arg(long, default_value = "bf16", help_heading = "Model")]
    pub dtype: String,
    /// Weights and compute dtype: f32 or bf16.
    #[arg(long, default_value = "f32", help_heading = "Model")]
    pub compute_dtype: String,
    /// How a quantized checkpoint's weights sit on the devices: `dequantized` (to the compute
    /// dtype, on load) or `stored` (FP8, MXFP4 and GGUF blocks as the checkpoint stores
    /// them, dequantized inside the forward: the same activations, less device memory).
    #[arg(long, default_value = "dequantized", help_heading = "Model")]
    pub weights: String,
    #[command(flatten, next_help_heading = "Dictionaries")]
    pub dictionaries: crate::args::SaeArgs,
    /// The model's next-token outputs, computed on the devices from its logits and stored per
    /// token beside the hooks, in f32 whatever --dtype (ids in i32): `nll,entropy,topk=K`, any
    /// subset: output.nll (−log p of the next token in the row; NaN at a row's last token),
    /// output.entropy, output.topk_logprobs and output.topk_ids.
    #[arg(long, value_name = "LIST", value_parser = crate::args::outputs::parse, help_heading = "Model")]
    pub outputs: Option<siphon_models::NextToken>,
    /// Add a steering vector to a hook for the rest of the forward, so every later hook,
    /// latent and output sees it: `HOOK=FILE[:SCALE]`, a .npy or one-tensor .safetensors vector
    /// of the hook's width; a block's hook_resid_pre or hook_resid_post. Repeatable; run.json
    /// records each file's sha256 and scale.
    #[arg(long, value_name = "HOOK=FILE[:SCALE]", help_heading = "Model")]
    pub steer: Vec<String>,

    // --- data ---
    #[command(flatten)]
    pub corpus: CorpusArgs,
    /// Complete the corpus's prompts with the model first, as `siphon generate` with these
    /// flags (quoted: `--generate '--max-new-tokens 64 --chat --temperature 0.7'`), the
    /// completions kept beside the run (`OUTPUT/RUN.completions/`), then extract over them by
    /// their exact ids, the prompt's tokens the user's and the completion's the assistant's
    /// (`--roles assistant` keeps the generated tokens). Needs --run and a local --output.
    #[arg(long, value_name = "FLAGS", allow_hyphen_values = true, help_heading = "Data")]
    pub generate: Option<String>,
    /// Carry these fields of each record into the run (comma-separated: parquet columns of
    /// integers, floats, booleans or strings; jsonl fields of any JSON value, null where absent),
    /// one row per document stored beside the rows of its shard, joined by `doc_index`:
    /// `Dataset.rows()` and `Dataset.documents()` in Python return them. Checked against the
    /// corpus before any work.
    #[arg(long, value_name = "COLUMNS", value_delimiter = ',', help_heading = "Data")]
    pub keep_columns: Vec<String>,
    /// Stop after about this many tokens in total over all hosts (whole batches).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Data")]
    pub max_tokens: Option<u64>,
    /// Allow a --seq-len longer than the model's context (`max_position_embeddings`):
    /// positions past it were never trained, so such activations are refused by default.
    #[arg(long, help_heading = "Data")]
    pub allow_long_context: bool,

    // --- output ---
    /// Where the dataset goes: a local path or gs:// s3:// az:// file:// URL; or
    /// stream://HOST:PORT to serve the batches live to training processes (siphon.stream in
    /// Python), no disk between: host h on PORT+h (readers are given each machine's address).
    #[arg(long, help_heading = "Output")]
    pub output: Option<String>,
    /// Run name (a directory under --output). Default: derived from the configuration, so the
    /// same command resumes the same run.
    #[arg(long, help_heading = "Output")]
    pub run: Option<String>,
    /// Target shard size in MB.
    #[arg(long, default_value_t = 256.0, value_parser = limits::megabytes, help_heading = "Output")]
    pub shard_size_mb: f64,
    /// Shuffle tokens across a window of this many batches before writing (deterministic, so
    /// a resumed run writes the same shards).
    #[arg(long, value_name = "BATCHES", value_parser = limits::count(1, limits::MAX_WINDOW), help_heading = "Output")]
    pub shuffle_tokens_window: Option<usize>,
    /// Seed of the token shuffle.
    #[arg(long, default_value_t = 0, help_heading = "Output")]
    pub shuffle_tokens_seed: u64,
    /// Keep excluded tokens (BOS/pad/...) in the shards, with a `mask` tensor.
    #[arg(long, help_heading = "Output")]
    pub keep_excluded: bool,
    /// Which rows of each document are stored: `all` (every kept token, the default), `first`
    /// or `last` (its first or last kept token), `last:N`, `mean` (of its kept tokens, in f32
    /// on the devices; each row's first position and count stored too) or `after:TEXT` (the
    /// token right after each occurrence of TEXT's tokens; run.json states them). With --roles,
    /// per turn of those roles. Chosen and pooled on the devices: only those rows leave them.
    /// Needs each document whole in a row (--pad, or --pack isolated); one that is not gives
    /// no row (counted, named in the log).
    #[arg(long, value_name = "WHICH", value_parser = parse_positions, help_heading = "Output")]
    pub positions: Option<Positions>,
    /// Store activations that are NaN or ±Inf, counted per hook in stats.json (whose statistics
    /// they reach are null), instead of stopping the run at the first shard that holds one.
    #[arg(long, help_heading = "Output")]
    pub allow_non_finite: bool,
    /// Steps in flight: while one step's program runs, the activations of up to this many
    /// earlier ones are copied to the host, converted and written (each step's host buffers
    /// are reused). 1 runs each step's program, copy and hand-over to the writer in turn. The
    /// shards are the same at any depth.
    #[arg(long, value_name = "STEPS", default_value_t = super::pipeline::DEFAULT_DEPTH,
          value_parser = limits::count(1, limits::MAX_SMALL_COUNT), help_heading = "Output")]
    pub pipeline_depth: usize,
    /// Seconds a write to the output may keep failing (the store down or throttling, requests
    /// stalled; retried with backoff) before the job fails; committed shards are kept. A stream
    /// waits as long for its consumers to take a batch.
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0, value_parser = limits::positive_seconds,
          help_heading = "Output")]
    pub store_timeout: f64,
    /// A stream's batches made and not yet sent, per host: while this many wait for their
    /// consumers, the host waits.
    #[arg(long, value_name = "BATCHES", default_value_t = 8, value_parser = limits::count(1, limits::MAX_SMALL_COUNT),
          help_heading = "Output")]
    pub stream_buffer: usize,
    /// A stream's batches kept after they are sent, per host, for a consumer that restarts from
    /// a checkpoint and pulls them again (one from further back needs the producer restarted:
    /// it makes them again). Memory: (--stream-buffer + --stream-keep) batches.
    #[arg(long, value_name = "BATCHES", default_value_t = 16, value_parser = limits::count(0, limits::MAX_SMALL_COUNT),
          help_heading = "Output")]
    pub stream_keep: usize,

    // --- devices and mesh ---
    /// PJRT plugin (.so). Default: SIPHON_PJRT_PLUGIN, siphon's cache, installed Python packages.
    #[arg(long, help_heading = "Devices")]
    pub plugin: Option<PathBuf>,
    /// Virtual devices of the CPU plugin.
    #[arg(long, env = "SIPHON_CPU_DEVICES", value_parser = limits::count(1, limits::MAX_CPU_DEVICES), help_heading = "Devices")]
    pub cpu_devices: Option<usize>,
    /// Mesh: 1d, 2d, 3d or auto, as in `siphon plan` (default: every device on `data`, weights
    /// replicated, hosts data-parallel). A weight-sharding group (`--fsdp` × `--model-parallel`)
    /// larger than a host makes one mesh over every host's devices (TPU slices, CUDA nodes).
    #[arg(long, value_name = "KIND", help_heading = "Devices")]
    pub mesh: Option<siphon_plan::MeshKind>,
    /// Size of the data (batch-splitting) axis.
    #[arg(long, value_name = "N", value_parser = limits::count(1, limits::MAX_AXIS), help_heading = "Devices")]
    pub data: Option<usize>,
    /// Size of the fsdp (weight-sharding) axis.
    #[arg(long, value_name = "N", value_parser = limits::count(1, limits::MAX_AXIS), help_heading = "Devices")]
    pub fsdp: Option<usize>,
    /// Size of the model (tensor-parallel) axis.
    #[arg(long, value_name = "N", value_parser = limits::count(1, limits::MAX_AXIS), help_heading = "Devices")]
    pub model_parallel: Option<usize>,
    /// Verify a job whose mesh spans N hosts without them: this one process, on the CPU
    /// plugin's --cpu-devices, runs each host's part (its weight partitions, corpus slice, rows
    /// and shards, written as that host's) and writes the dataset the N hosts would.
    #[arg(long, value_name = "N", value_parser = limits::count(1, limits::MAX_CPU_DEVICES), help_heading = "Devices")]
    pub simulate_hosts: Option<usize>,

    // --- cluster ---
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Seconds to keep trying to reach the coordinator (it may start after this host).
    #[arg(long, default_value_t = 120.0, value_parser = limits::seconds, help_heading = "Cluster")]
    pub connect_timeout: f64,
    /// Seconds to wait for every host to register.
    #[arg(long, default_value_t = 300.0, value_parser = limits::seconds, help_heading = "Cluster")]
    pub register_timeout: f64,
    /// After SIGTERM (preemption) or another host's preemption, seconds this host may take to
    /// commit its complete shards before it exits anyway (exit code 75 either way).
    #[arg(long, default_value_t = 10.0, value_parser = limits::seconds, help_heading = "Cluster")]
    pub stop_timeout: f64,
}

/// What decides the dataset: identical on every host (checked through the coordinator).
#[derive(Debug, Clone, Serialize)]
pub struct RunSpec {
    /// The model path as given (its config, not the path, is compared via `model_config`).
    pub model: String,
    /// Tokenizer override.
    pub tokenizer: Option<String>,
    /// Hook names, in output order.
    pub hooks: Vec<String>,
    /// Stored dtype.
    pub dtype: String,
    /// Compute dtype.
    pub compute_dtype: String,
    /// Sparse dictionaries as given to `--sae` (their latents are stored beside the hooks).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sae: Vec<String>,
    /// `--latent-cap`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latent_cap: Option<usize>,
    /// The dictionaries spliced in (`--splice`: `""` for every one, else their names).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub splice: Option<String>,
    /// The model's next-token outputs stored per token (`--outputs`, with the NLL where
    /// dictionaries are spliced in).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outputs: Option<siphon_models::NextToken>,
    /// The steering vectors (`--steer`), recorded by their files' sha256 and scales (set once
    /// the files are read).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steering: Vec<crate::args::steer::SteerRecord>,
    /// How quantized weights sit on the devices; not part of the dataset's identity (the
    /// activations are the same either way), so hosts may differ.
    #[serde(skip)]
    pub weights: siphon_engine::WeightForm,
    /// Corpus, tokenization and packing.
    pub corpus: CorpusArgs,
    /// Token budget over all hosts.
    pub max_tokens: Option<u64>,
    /// Output URL.
    pub output: String,
    /// Explicit run name.
    pub run: Option<String>,
    /// Target shard bytes.
    pub shard_bytes: u64,
    /// Token shuffle window in batches.
    pub shuffle_tokens_window: Option<usize>,
    /// Token shuffle seed.
    pub shuffle_tokens_seed: u64,
    /// Keep excluded tokens with a mask.
    pub keep_excluded: bool,
    /// The kept columns of each document (`--keep-columns`) and each one's kind
    /// (`siphon_data::column_kind`, `json` for a jsonl field), set once the corpus is checked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub keep_columns: Vec<(String, String)>,
    /// The rows of each document stored (`--positions`; every kept token when `None`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub positions: Option<Positions>,
    /// `--positions after:TEXT`'s marker as the tokenizer reads it: each token's id and text
    /// (set once the tokenizer is loaded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub positions_marker: Option<Vec<(u32, String)>>,
    /// Store NaN and ±Inf activations instead of stopping.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub allow_non_finite: bool,
    /// Virtual CPU devices.
    pub cpu_devices: Option<usize>,
    /// Mesh request over the host's devices.
    pub mesh: siphon_plan::MeshRequest,
    /// Machines (pods) of the run.
    pub total_machines: u32,
    /// The chat template the corpus's conversations are rendered with (the model's or
    /// --chat-template's text), when the corpus holds conversations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
}

impl ExtractOptions {
    /// Validates the options (no I/O) and returns the run spec.
    /// With the model's config, hook patterns (`blocks.*.hook_resid_post`) are expanded and
    /// aliases resolved to TransformerLens names, so every host records the same list.
    pub fn resolve(
        &self,
        model_config: Option<&siphon_models::ModelConfig>,
        total_machines: u32,
    ) -> anyhow::Result<RunSpec> {
        let need = |v: &Option<String>, name: &str| -> anyhow::Result<String> {
            v.clone().with_context(|| format!("missing --{name} (or `{name}` in the --config file)"))
        };
        let model = self
            .model
            .as_ref()
            .map(|p| p.display().to_string())
            .context("missing --model (or `model` in the --config file)")?;
        let output = need(&self.output, "output")?;
        let dictionaries = !self.dictionaries.sae.is_empty();
        let named = self.hooks.as_deref().filter(|h| !h.trim().is_empty());
        let mut hooks = match (named, self.layers.as_deref()) {
            // A dictionary's latents or the model's outputs alone: no hook stored.
            (None, None) if dictionaries || self.outputs.is_some() => Vec::new(),
            (hooks, layers) => hook_names(hooks, layers)?,
        };
        if let Some(config) = model_config
            && !self.allow_long_context
        {
            siphon_plan::check_context(config, self.corpus.seq_len)
                .with_context(|| format!("--seq-len {}", self.corpus.seq_len))?;
        }
        if let (Some(config), Some(outputs)) = (model_config, &self.outputs) {
            crate::args::outputs::check(outputs, config)?;
        }
        if let Some(config) = model_config
            && !hooks.is_empty()
        {
            hooks = siphon_models::resolve_hooks(&hooks.join(","), config)
                .context("bad --hooks/--layers")?
                .iter()
                .map(ToString::to_string)
                .collect();
        }
        for (name, value, allowed) in [
            ("dtype", &self.dtype, &["f32", "bf16", "f16", "fp8"][..]),
            ("compute-dtype", &self.compute_dtype, &["f32", "bf16"][..]),
        ] {
            if !allowed.contains(&value.as_str()) {
                bail!("--{name} {value:?} is not one of {}", allowed.join(", "));
            }
        }
        let weights = self.weights.parse().map_err(|e| anyhow::anyhow!("--weights: {e}"))?;
        super::dictionary::check_outputs(&self.dictionaries, &self.dtype, &output)?;
        // Every other count, size and duration was bounded where clap read it (`limits`).
        if self.corpus.seq_len < 2 {
            bail!("--seq-len {} is too small (at least 2)", self.corpus.seq_len);
        }
        if let Some(run) = &self.run {
            check_run_name(run)?;
        }
        if let Some(positions) = &self.positions {
            self.check_positions(positions)?;
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(bad) = self.keep_columns.iter().find(|c| c.trim().is_empty() || !seen.insert(c.as_str())) {
            bail!("--keep-columns names {bad:?} twice or empty");
        }
        Ok(RunSpec {
            model,
            tokenizer: self.tokenizer.as_ref().map(|p| p.display().to_string()),
            hooks,
            dtype: self.dtype.clone(),
            compute_dtype: self.compute_dtype.clone(),
            sae: self.dictionaries.sae.clone(),
            latent_cap: self.dictionaries.latent_cap,
            outputs: self.dictionaries.with_splice_outputs(self.outputs),
            splice: self.dictionaries.splice.clone(),
            steering: Vec::new(),
            weights,
            corpus: self.corpus.clone(),
            max_tokens: self.max_tokens,
            output,
            run: self.run.clone(),
            shard_bytes: (self.shard_size_mb * 1e6) as u64,
            shuffle_tokens_window: self.shuffle_tokens_window,
            shuffle_tokens_seed: self.shuffle_tokens_seed,
            keep_excluded: self.keep_excluded,
            positions: self.positions.clone(),
            positions_marker: None,
            keep_columns: self.keep_columns.iter().map(|c| (c.clone(), String::new())).collect(),
            allow_non_finite: self.allow_non_finite,
            cpu_devices: self.cpu_devices,
            mesh: self.mesh_request(self.cpu_devices),
            total_machines,
            chat_template: None,
        })
    }
}

/// `--positions`: `all` is none.
fn parse_positions(s: &str) -> Result<Positions, String> {
    match s {
        "all" => Err("all is the default: leave --positions out".into()),
        s => s.parse(),
    }
}

impl ExtractOptions {
    /// What `--positions` cannot go with: rows that hold pieces of documents (`--pack`, every
    /// document attending the ones before it and cut at rows' ends), per-token outputs, a mesh
    /// spanning processes (each step's chosen rows a sequence would need agreeing on).
    fn check_positions(&self, positions: &Positions) -> anyhow::Result<()> {
        let which = match positions {
            Positions::First => "first".to_string(),
            Positions::Last => "last".to_string(),
            Positions::LastN(n) => format!("last:{n}"),
            Positions::Mean => "mean".to_string(),
            Positions::After(text) => format!("after:{text}"),
        };
        let whole_documents =
            self.corpus.pad.is_some() || self.corpus.pack == Some(crate::args::corpus::PackArg::Isolated);
        if !whole_documents {
            bail!(
                "--positions {which} takes rows of whole documents: give --pad right (one a row) or --pack isolated \
                 (packed, each attending only itself); --pack lets documents see each other and cuts them at rows' ends"
            );
        }
        if self.outputs.is_some() || self.dictionaries.splice.is_some() {
            bail!(
                "--positions {which} with --outputs or --splice: the next-token outputs are per token, not built for chosen rows"
            );
        }
        Ok(())
    }

    /// The planner's mesh request; with no mesh flag at all, every device of the host on
    /// `data` (`local_devices` of them where known before the plugin starts, as the CPU
    /// plugin's are; otherwise as many as the plugin reports).
    pub fn mesh_request(&self, local_devices: Option<usize>) -> siphon_plan::MeshRequest {
        let any = self.mesh.is_some() || self.data.is_some() || self.fsdp.is_some() || self.model_parallel.is_some();
        match any {
            true => siphon_plan::MeshRequest {
                kind: self.mesh.unwrap_or(siphon_plan::MeshKind::TwoD),
                data: self.data,
                fsdp: self.fsdp,
                model: self.model_parallel,
            },
            // Unknown: fsdp = model = 1 leaves every device to data.
            false => siphon_plan::MeshRequest {
                kind: siphon_plan::MeshKind::TwoD,
                data: local_devices,
                fsdp: local_devices.is_none().then_some(1),
                model: Some(1),
            },
        }
    }
}

/// The hook list from `--hooks` and/or `--layers` (resid_post of each listed layer), names
/// and patterns as given.
pub fn hook_names(hooks: Option<&str>, layers: Option<&str>) -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> = hooks.map(|h| vec![h.trim().to_string()]).unwrap_or_default();
    names.retain(|n| !n.is_empty());
    if let Some(layers) = layers {
        for layer in parse_layers(layers)? {
            names.push(format!("blocks.{layer}.hook_resid_post"));
        }
    }
    if names.is_empty() {
        bail!("no hook points: give --hooks (e.g. blocks.3.hook_resid_post) or --layers (e.g. 20-27)");
    }
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    Ok(names)
}

/// `20-27`, `3,5,7`, `0-3,10` → layer indices in order.
pub fn parse_layers(text: &str) -> anyhow::Result<Vec<usize>> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("--layers: {part:?} is not a layer or a range like 20-27");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().with_context(bad)?, b.trim().parse().with_context(bad)?);
                if a > b {
                    bail!("--layers: range {part:?} is empty");
                }
                // Checked against the model later; bounded here, before the list is made.
                // (the models crate refuses a config with more layers than this).
                const MAX: usize = siphon_models::config::MAX_LAYERS;
                if b >= MAX {
                    bail!("--layers: range {part:?} reaches past layer {}: no model has that many", MAX - 1);
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().with_context(bad)?),
        }
    }
    if out.is_empty() {
        bail!("--layers {text:?} names no layer");
    }
    Ok(out)
}

/// Refuses a `--run` that is not a plain name (a directory under `--output`).
pub fn check_run_name(run: &str) -> anyhow::Result<()> {
    if run.is_empty() || run.contains('/') || run.starts_with('.') {
        bail!("--run {run:?} must be a plain name (no '/', not starting with '.')");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_shorthand() {
        assert_eq!(parse_layers("20-23").unwrap(), vec![20, 21, 22, 23]);
        assert_eq!(parse_layers("0-1, 5").unwrap(), vec![0, 1, 5]);
        assert!(parse_layers("3-1").is_err());
        assert!(parse_layers("x").is_err());
        assert!(parse_layers("0-4000000000").unwrap_err().to_string().contains("no model has that many"));
        assert_eq!(
            hook_names(Some("ln_final.hook_normalized"), Some("1")).unwrap(),
            vec!["ln_final.hook_normalized", "blocks.1.hook_resid_post"]
        );
        // Patterns stay whole here (commas inside braces included); the model expands them.
        assert_eq!(
            hook_names(Some("blocks.{0,2}.attn.hook_z,blocks.*.hook_mlp_out"), None).unwrap(),
            vec!["blocks.{0,2}.attn.hook_z,blocks.*.hook_mlp_out"]
        );
        assert!(hook_names(None, None).is_err());
    }
}
