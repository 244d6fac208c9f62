//! `siphon plan`: the mesh, each parameter class's sharding and the per-device memory a model
//! would use on a given number of hosts and devices — without loading any plugin or weights.
//! With `--target tpu:SLICE` the slice gives the hosts and devices, and the program `siphon
//! extract` would run there is compiled for it by libtpu on this machine ([`target`]): the
//! compiler's own per-device figures beside the planner's.
//!
//! [`MeshArgs`] holds the mesh flags so that `siphon extract` and `siphon forward` can flatten
//! the same flags; they then call [`siphon_plan::plan`] (pure, no I/O) for the same checks
//! before anything expensive.

use std::path::{Path, PathBuf};

use anyhow::Context;
use siphon_models::{HfConfig, ModelConfig};
use siphon_plan::{DType, MeshKind, MeshRequest, PlanRequest, Topology};

use crate::args::{files, limits};

pub(crate) mod target;

/// Mesh flags shared by every command that builds a mesh.
#[derive(clap::Args, Debug, Clone)]
pub struct MeshArgs {
    /// Mesh layout: 1d (every device on model), 2d (data across hosts × weight sharding within
    /// a host), 3d (data × fsdp × model), auto (smallest weight sharding that fits
    /// --device-memory).
    #[arg(long = "mesh", value_name = "KIND", default_value = "2d")]
    pub kind: MeshKind,
    /// Size of the data (batch-splitting) axis.
    #[arg(long, value_name = "N", value_parser = limits::count(1, limits::MAX_AXIS))]
    pub data: Option<usize>,
    /// Size of the fsdp (weight-sharding on the hidden dimension) axis.
    #[arg(long, value_name = "N", value_parser = limits::count(1, limits::MAX_AXIS))]
    pub fsdp: Option<usize>,
    /// Size of the model (tensor-parallel, whole heads) axis.
    #[arg(long = "model-parallel", value_name = "N", value_parser = limits::count(1, limits::MAX_AXIS))]
    pub model_parallel: Option<usize>,
}

impl MeshArgs {
    /// The planner's request for these flags.
    pub fn request(&self) -> MeshRequest {
        MeshRequest { kind: self.kind, data: self.data, fsdp: self.fsdp, model: self.model_parallel }
    }
}

/// `--tpu-forms`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum TpuForms {
    On,
    Off,
}

/// `siphon plan` flags.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["model", "config"])))]
pub struct Args {
    /// A Hugging Face model directory (its config.json is read) or a .gguf file.
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// A config.json file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Number of hosts (with --target gpu:…, GPU nodes).
    #[arg(long, default_value_t = 1, value_parser = limits::count(1, limits::MAX_AXIS))]
    pub hosts: usize,
    /// Accelerator devices on each host.
    #[arg(long, default_value_t = 1, conflicts_with = "target", value_parser = limits::count(1, limits::MAX_AXIS))]
    pub devices_per_host: usize,
    /// Memory of one device, in GiB (with --target: the chip's HBM unless given).
    #[arg(long, value_name = "GiB", value_parser = limits::gib)]
    pub device_memory: Option<f64>,
    /// Plan for a TPU slice by its Cloud TPU name (`tpu:v5litepod-64`, `tpu:v5e-64`,
    /// `tpu:v6e-16`, `tpu:v4-32`, `tpu:v5p-128`) or for GPU nodes (`gpu:h100`, `gpu:h100x8`,
    /// `gpu:h200x8`, `gpu:a100-80x8`, `gpu:b200x8`; --hosts nodes) and compile the program
    /// `siphon extract` would run there — with libtpu, or XLA's CUDA plugin — on this machine
    /// (no TPU or GPU needed): the compiler's memory per device (and on a TPU its flops); on
    /// GPUs which attention each block compiled to. Needs --batch and --seq.
    #[arg(long, value_name = "tpu:SLICE|gpu:GPUS")]
    pub target: Option<String>,
    /// With --target: this many slices joined into one job (multi-slice).
    #[arg(long, default_value_t = 1, requires = "target", value_parser = limits::count(1, limits::MAX_AXIS))]
    pub slices: usize,
    /// With --target: the libtpu or CUDA plugin to compile with (default: `SIPHON_PJRT_PLUGIN`
    /// when it is one, the pinned one in siphon's cache, the libtpu or jax-cuda12-pjrt Python
    /// package).
    #[arg(long, value_name = "PATH", requires = "target")]
    pub plugin: Option<PathBuf>,
    /// With --target gpu:…: how `extract` pads the rows (`--pad`): right (its default), where
    /// each block cuDNN's fused attention can take takes it, or left (XLA's form everywhere).
    #[arg(long, value_enum, requires = "target")]
    pub pad: Option<crate::args::corpus::PadSideArg>,
    /// With --target: how `extract` packs the rows (`--pack`): `isolated` compiles its program,
    /// each document attending only itself (positions restarting at each; on GPUs XLA's
    /// attention form, which cuDNN's causal mask cannot take).
    #[arg(long, value_enum, requires = "target")]
    pub pack: Option<crate::args::corpus::PackArg>,
    /// With --target tpu:…: `off` compiles the program as the CPU and GPUs would take it — a
    /// mixture's experts in rounds of whole experts (a loop), FP8 decoded by a byte table —
    /// instead of a TPU's own forms (`chlo.ragged_dot` over each expert's width, FP8 by
    /// conversion), to compare the two.
    #[arg(long, value_enum, default_value = "on", requires = "target")]
    pub tpu_forms: TpuForms,
    #[command(flatten)]
    pub mesh: MeshArgs,
    /// Global batch (sequences per step); must divide over the data axis.
    #[arg(long, value_parser = limits::count(1, limits::MAX_BATCH))]
    pub batch: Option<usize>,
    /// Tokens per sequence (with --batch: the activation estimate); past the model's context
    /// the plan says `extract` refuses it without --allow-long-context.
    #[arg(long, value_parser = limits::count(1, limits::MAX_SEQ))]
    pub seq: Option<usize>,
    /// Hook names or patterns, as `extract --hooks` takes them, each counted at its own size
    /// (default: every hidden state, layers + 1).
    #[arg(long)]
    pub hooks: Option<String>,
    /// Weight and activation dtype: f32, bf16, f16 (default: the config's torch_dtype, else bf16).
    #[arg(long)]
    pub dtype: Option<DType>,
    /// Share of device memory kept free.
    #[arg(long, default_value_t = siphon_plan::memory::DEFAULT_HEADROOM, value_parser = limits::share)]
    pub headroom: f64,
    /// The stored activation dtype (`extract --dtype`): f32, bf16, f16 or fp8; with --batch
    /// and --seq, the hooks' outputs on the devices and the output path's host memory are
    /// counted in it.
    #[arg(long, default_value = "bf16")]
    pub output_dtype: DType,
    /// Steps in flight on the output path (`extract --pipeline-depth`).
    #[arg(long, default_value_t = 2, value_parser = limits::count(1, limits::MAX_SMALL_COUNT))]
    pub pipeline_depth: usize,
    /// Also plan lm_head.weight (extraction never computes logits, so it is skipped by default).
    #[arg(long)]
    pub lm_head: bool,
    /// Count quantized weights `dequantized` to --dtype or kept `stored` (as `extract
    /// --weights stored` keeps them: a GGUF's or an FP8 checkpoint's blocks; from a config.json
    /// alone, the projections its `quantization_config` `fp8` stores FP8).
    #[arg(long, default_value = "dequantized")]
    pub weights: siphon_engine::WeightForm,
    /// Count sparse dictionaries' tensors and latents (as `forward --sae` and, later, `extract`
    /// compute them) and the blocks their hooks need.
    #[command(flatten)]
    pub dictionaries: crate::args::SaeArgs,
    /// Count the model's next-token outputs (as `forward --outputs` computes them): every
    /// block, the final norm and the unembedding, the outputs and one chunk's logits; with
    /// --target, the program computes them too.
    #[arg(long, value_name = "LIST", value_parser = crate::args::outputs::parse)]
    pub outputs: Option<siphon_models::NextToken>,
    /// Plan a decoding step (`siphon generate`) of --batch slots whose key/value caches hold N
    /// positions each (the longest prompt plus --max-new-tokens): every block, the unembedding,
    /// the caches (written in place each step) and the logits counted, greedy (`generate` adds
    /// a sampled step's sampler where the devices draw).
    #[arg(long, value_name = "N", requires = "batch", conflicts_with_all = ["outputs", "seq"])]
    pub decode_cache_len: Option<usize>,
    /// With --decode-cache-len: new tokens a slot takes in one step at most (`generate
    /// --chunk`), which a sliding-window block's ring of keys and values holds beside its
    /// window.
    #[arg(long, default_value_t = 64, value_name = "N", value_parser = crate::args::limits::count(1, 1 << 16))]
    pub decode_chunk: usize,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let (config, config_dtype, fp8_block) = load_config(args.model.as_deref(), args.config.as_deref())?;
    let stored = match args.weights {
        siphon_engine::WeightForm::Dequantized => Default::default(),
        siphon_engine::WeightForm::Stored => stored_forms(&config, args.model.as_deref(), fp8_block)?,
    };
    let target = args.target.as_deref().map(|t| target::Target::parse(t, args.slices, args.hosts)).transpose()?;
    let topology = match &target {
        Some(target) => target.planner_topology().context("--target, --slices, --hosts")?,
        None => Topology::uniform(args.hosts, args.devices_per_host).context("--hosts, --devices-per-host")?,
    };
    let device_memory_bytes = match args.device_memory {
        Some(gib) => Some((gib * (1u64 << 30) as f64) as u64),
        None => target.as_ref().map(target::Target::usable_bytes),
    };
    let dictionaries = crate::job::dictionary::open(&args.dictionaries, &config)?;
    let request = PlanRequest {
        mesh: args.mesh.request(),
        dtype: args.dtype.or(config_dtype).unwrap_or(DType::Bf16),
        batch: args.batch,
        // A decoding step feeds one token a slot, through every block to the final norm.
        seq: args.seq.or(args.decode_cache_len.map(|_| 1)),
        hooks: match args.decode_cache_len {
            Some(_) => Some(vec![siphon_models::HookPoint::model(siphon_models::HookKind::LnFinalOut)]),
            None => args
                .hooks
                .as_deref()
                .map(|h| siphon_models::resolve_hooks(h, &config))
                .transpose()
                .context("--hooks")?,
        },
        device_memory_bytes,
        headroom: args.headroom,
        with_lm_head: args.lm_head || args.decode_cache_len.is_some(),
        stored,
        output_dtype: args.output_dtype,
        pipeline_depth: args.pipeline_depth,
        // A TPU pads every array to its tiles; the planner counts the padded bytes.
        layout: target.as_ref().map_or(siphon_plan::DeviceLayout::Dense, target::Target::layout),
        dictionaries: dictionaries.iter().map(siphon_plan::DictionaryShape::of).collect(),
        next_token: args.outputs,
        decode: args
            .decode_cache_len
            .map(|cache_len| siphon_models::DecodeStep { cache_len, chunk: args.decode_chunk }),
        // A greedy step: `generate` counts a sampled step's sampler where the devices draw.
        decode_sampling: None,
        experts: match (&target, args.tpu_forms) {
            (Some(target), TpuForms::On) => target.expert_split(),
            _ => Default::default(),
        },
    };
    let mut plan = siphon_plan::plan(&config, &topology, &request).map_err(|e| match &e {
        siphon_plan::PlanError::Uncountable { per_step: true, .. } => anyhow::Error::new(e).context("--batch, --seq"),
        _ => e.into(),
    })?;
    let isolated = args.pack == Some(crate::args::corpus::PackArg::Isolated);
    // Isolated documents take XLA's attention form on GPUs, whatever the blocks.
    if !isolated {
        plan.notes.extend(siphon_plan::cuda_attention(&config, &plan, &request));
    }
    // The rule extract applies, as a note: a plan computes nothing.
    if let Some(Err(err)) = args.seq.map(|seq| siphon_plan::check_context(&config, seq)) {
        plan.notes.push(format!("--seq: {err}; `siphon extract` refuses it otherwise"));
    }
    if let Some(target) = target {
        let compile = target::Compile {
            target,
            config: &config,
            request,
            weights: args.weights,
            plugin: args.plugin.as_deref(),
            right_padded: !matches!(args.pad, Some(crate::args::corpus::PadSideArg::Left)),
            isolated,
            tpu_forms: args.tpu_forms == TpuForms::On,
            dictionaries,
        };
        return target::run(compile, &plan, args.json);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&plan).context("serializing the plan")?);
    } else {
        print!("{plan}");
    }
    Ok(())
}

/// The weights kept stored under `--weights stored`: a model's own (its GGUF, FP8 or MXFP4
/// tensors) when `--model` has weights, else those a `quantization_config` stores FP8 or MXFP4.
fn stored_forms(
    config: &ModelConfig,
    model: Option<&Path>,
    fp8_block: Option<[usize; 2]>,
) -> anyhow::Result<std::collections::HashMap<String, siphon_models::StoredForm>> {
    let has_weights = model.is_some_and(|p| {
        p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
            || p.join("model.safetensors").exists()
            || p.join("model.safetensors.index.json").exists()
    });
    if let (true, Some(path)) = (has_weights, model) {
        let loaded = siphon_models::LoadedModel::open(path).with_context(|| format!("opening {}", path.display()))?;
        return Ok(loaded.stored_forms(config.n_layers)?);
    }
    if let Some(block) = fp8_block {
        return Ok(siphon_models::fp8_forms(config, config.n_layers, block));
    }
    let mxfp4 = siphon_models::mxfp4_forms(config, config.n_layers);
    anyhow::ensure!(
        !mxfp4.is_empty(),
        "--weights stored without weights to read: the config has no quantization_config fp8 with a \
         weight_block_size, nor mxfp4"
    );
    Ok(mxfp4)
}

/// Reads a model's config from `--model` (HF directory, config.json or .gguf) or `--config`,
/// with the dtype its `torch_dtype` names, if any, and an FP8 checkpoint's block size.
pub fn load_config(
    model: Option<&Path>,
    config: Option<&Path>,
) -> anyhow::Result<(ModelConfig, Option<DType>, Option<[usize; 2]>)> {
    let hf = match (model, config) {
        (_, Some(path)) => read_config_json(path)?,
        (Some(path), None) if path.is_dir() => read_config_json(&path.join("config.json"))?,
        (Some(path), None) if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) => {
            let file = siphon_models::gguf::GgufFile::open(path)
                .with_context(|| format!("reading GGUF {}", path.display()))?;
            siphon_models::gguf::convert::hf_config(&file)
                .with_context(|| format!("GGUF metadata of {}", path.display()))?
        }
        (Some(path), None) if path.is_file() => read_config_json(path)?,
        (Some(path), None) => anyhow::bail!(
            "--model {}: no such directory or file (give an HF model directory, a config.json or a .gguf; \
             or use --config)",
            path.display()
        ),
        (None, None) => anyhow::bail!("give --model PATH or --config config.json"),
    };
    let dtype = hf.torch_dtype.as_deref().and_then(|d| d.parse::<DType>().ok());
    let fp8_block = hf.fp8_block_size()?;
    let config = hf.into_config().context("model config")?;
    Ok((config, dtype, fp8_block))
}

fn read_config_json(path: &Path) -> anyhow::Result<HfConfig> {
    let text = files::read_text(path, "the config", files::MAX_TEXT_BYTES)?;
    HfConfig::from_json(&text).with_context(|| format!("parsing {}", path.display()))
}
