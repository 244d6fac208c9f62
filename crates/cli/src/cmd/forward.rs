//! `siphon forward`: one forward pass for inspection. Tokenizes a text (or reads token ids),
//! runs the model on a mesh and writes the requested hook activations to a safetensors file,
//! one `[batch, seq, *per-token shape]` tensor per hook, keyed by the hook's TransformerLens
//! name; with `--sae`, each dictionary's latents computed on the devices (each token's largest,
//! sparsely: `<name>.indices`, `<name>.values`, `<name>.firings`); with `--outputs`, the
//! model's next-token outputs computed on the devices from its logits (`output.nll`,
//! `output.entropy`, `output.topk_logprobs`, `output.topk_ids`; a token's next is the next
//! one in its row, the row's last has none: its `output.nll` is NaN).
//!
//! Its rows meet `extract`'s rules before any weight reaches a device: no longer than the
//! model's context unless `--allow-long-context`, and the plan of their batch on the mesh
//! within what the devices and this host's memory hold (`job::fits`). The `--ids` file is a
//! regular file of a bounded size, read whole; a `--text` is bounded by the system's limit on
//! one argument (128 KiB on Linux), so it is tokenized whole and its tokens checked.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use siphon_engine::{Batch, Engine, EngineOptions, ShardingPlan};
use siphon_mesh::Mesh;
use siphon_models::{DType, DictionaryHook, HookPoint, LoadedModel};
use siphon_plan::{MeshRequest, PlanRequest};
use siphon_runtime::{Client, ClientOptions, HostArray, Plugin, PluginKind, PluginLocator};

use crate::args::{SaeArgs, files, limits, outputs, steer};
use crate::job::fits;

/// What `forward` can change when a device cannot hold its rows.
const DEVICE_REMEDY: &str =
    "give fewer or shorter rows (--ids, --text), fewer hooks, or a mesh that shards the weights more (--mesh)";
/// What `forward` can change when this host cannot hold its rows.
const HOST_REMEDY: &str = "give fewer or shorter rows (--ids, --text) or fewer hooks";

/// `siphon forward` flags.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["text", "ids"])))]
pub struct Args {
    /// A Hugging Face model directory or a .gguf file.
    #[arg(long, value_name = "PATH")]
    pub model: PathBuf,
    /// Text to tokenize with the model's tokenizer (one row).
    #[arg(long)]
    pub text: Option<String>,
    /// A JSON file holding a list of equal-length lists of token ids (at most 16 MiB).
    #[arg(long, value_name = "FILE")]
    pub ids: Option<PathBuf>,
    /// Allow rows longer than the model's context (`max_position_embeddings`), as `extract
    /// --allow-long-context`: positions past it were never trained, so they are refused by
    /// default.
    #[arg(long)]
    pub allow_long_context: bool,
    /// Write hook values that are NaN or ±Inf (counted on stderr) instead of refusing them,
    /// as `extract --allow-non-finite`.
    #[arg(long)]
    pub allow_non_finite: bool,
    /// Comma-separated TransformerLens hook names or patterns, e.g.
    /// blocks.3.hook_resid_post,blocks.*.attn.hook_z,blocks.{0..3}.ln2.hook_normalized.
    #[arg(long, value_name = "NAMES", required_unless_present_any = ["sae", "outputs"])]
    pub hooks: Option<String>,
    /// The model's next-token outputs, computed on the devices from its logits and written
    /// in f32: any of `nll` (−log p of the next token in the row; NaN for a row's last token),
    /// `entropy`, `topk=K` (the K likeliest tokens' log-probabilities and ids), as
    /// `nll,entropy,topk=5`.
    #[arg(long, value_name = "LIST", value_parser = outputs::parse)]
    pub outputs: Option<siphon_models::NextToken>,
    /// Add a steering vector to a hook for the rest of the forward: `HOOK=FILE[:SCALE]`, the
    /// vector a `.npy` (float32/float64) or one-tensor `.safetensors` of the hidden size, times
    /// SCALE (1 by default); HOOK a block's `hook_resid_pre` or `hook_resid_post`. Repeatable.
    #[arg(long, value_name = "HOOK=FILE[:SCALE]")]
    pub steer: Vec<String>,
    #[command(flatten)]
    pub dictionaries: SaeArgs,
    /// Output safetensors file.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Dtype of the stored activations: f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    pub dtype: DType,
    /// Dtype of weights and compute: f32 or bf16.
    #[arg(long, default_value = "f32")]
    pub compute_dtype: DType,
    /// Quantized weights `dequantized` on load or kept `stored` on the devices (see `extract`).
    #[arg(long, default_value = "dequantized")]
    pub weights: siphon_engine::WeightForm,
    /// Number of virtual devices of the CPU plugin.
    #[arg(long, value_name = "N", value_parser = limits::count(1, limits::MAX_CPU_DEVICES))]
    pub cpu_devices: Option<usize>,
    /// Mesh: explicit axes like `data=2,model=4` (Megatron-style plan), or a planner kind
    /// (1d, 2d, 3d, auto) over all devices. Default: one device.
    #[arg(long, value_name = "MESH")]
    pub mesh: Option<String>,
    /// PJRT plugin (default: SIPHON_PJRT_PLUGIN, then siphon's cache directory).
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // Cheap checks first: dtypes, model files, hooks, input.
    if args.dtype == DType::Fp8 {
        bail!(
            "--dtype fp8 is a stored dtype of `siphon extract` (rows with a scale each); forward writes f32, bf16 or f16"
        );
    }
    let model = LoadedModel::open(&args.model).with_context(|| format!("opening model {}", args.model.display()))?;
    let hooks = match &args.hooks {
        Some(list) => siphon_models::resolve_hooks(list, &model.config).context("--hooks")?,
        None => Vec::new(),
    };
    let dictionaries = crate::job::dictionary::open(&args.dictionaries, &model.config)?;
    let (steering, _) = steer::open_all(&args.steer, &model.config)?;
    let (rows, input) = read_rows(&args, &model)?;
    let batch = Batch::new(rows.clone(), None).context("the token ids")?;
    let request = plan_request(&args, &model, &hooks, &dictionaries, &batch)?;

    let choice = PluginLocator::new().explicit(args.plugin.clone()).locate().context("finding a PJRT plugin")?;
    let plugin = Plugin::load(&choice.path).context("loading the PJRT plugin")?;
    let mut options = ClientOptions::new();
    if let Some(n) = args.cpu_devices {
        options = options.cpu_device_count(n);
    }
    let client = Client::new(&plugin, options).context("creating a PJRT client")?;
    let devices = client.addressable_device_ids();
    let (mesh, plan, planned) = resolve_mesh(args.mesh.as_deref(), &devices, &model, request)?;
    check_memory(&client, &mesh, &planned, PluginKind::of(&choice.path)).with_context(|| input)?;
    println!(
        "model:  {} ({:?}, {} layers, d_model {})",
        args.model.display(),
        model.config.arch,
        model.config.n_layers,
        model.config.hidden_size
    );
    if mesh.axes().is_empty() {
        println!("mesh:   one device ({})", mesh.device_ids()[0]);
    } else {
        println!("mesh:   {mesh} on devices {:?}", mesh.device_ids());
    }
    let options = EngineOptions {
        compute_dtype: args.compute_dtype,
        output_dtype: args.dtype,
        mesh,
        plan,
        weights: args.weights,
        dictionaries: dictionaries.clone(),
        next_token: args.dictionaries.with_splice_outputs(args.outputs),
        steering,
        ..EngineOptions::default()
    };
    let engine = Engine::new(&client, &model, hooks, options).context("loading the weights onto the devices")?;
    let acts = engine.run(&batch).context("running the forward")?;
    crate::job::dictionary::check_caps(&dictionaries, &acts.latents)?;
    check_finite(&acts.hooks, batch.seq(), args.allow_non_finite)?;
    check_outputs(&acts.next_token, batch.next_ids(), args.allow_non_finite)?;

    let mut tensors: Vec<(String, &HostArray)> = acts.hooks.iter().map(|(h, a)| (h.to_string(), a)).collect();
    for (name, latents) in DictionaryHook::names(&dictionaries).into_iter().zip(&acts.latents) {
        tensors.push((format!("{name}.indices"), &latents.indices));
        tensors.push((format!("{name}.values"), &latents.values));
        tensors.push((format!("{name}.firings"), &latents.firings));
    }
    tensors.extend(acts.next_token.iter().map(|(name, array)| (name.clone(), array)));
    let mut metadata = HashMap::new();
    metadata.insert("model".to_string(), args.model.display().to_string());
    metadata.insert("token_ids".to_string(), serde_json::to_string(&rows)?);
    write_safetensors(&args.out, &tensors, &metadata)?;
    println!("tokens: {:?}", rows.iter().map(|r| r.len()).collect::<Vec<_>>());
    for (name, array) in &tensors {
        let values = array.to_f32();
        let integer = array.element_type() == siphon_runtime::ElementType::S32;
        let head: Vec<String> =
            values.iter().take(4).map(|v| if integer { format!("{v}") } else { format!("{v:.5}") }).collect();
        println!("{name}: {}{:?} [{} ...]", array.element_type(), array.shape(), head.join(", "));
    }
    println!("wrote {}", args.out.display());
    Ok(())
}

/// The rows `--text` or `--ids` give, and the flag that gave them (for errors), each within
/// the model's context unless `--allow-long-context`.
fn read_rows(args: &Args, model: &LoadedModel) -> anyhow::Result<(Vec<Vec<u32>>, String)> {
    let (rows, input) = match (&args.text, &args.ids) {
        (Some(text), _) => {
            let tok = model.tokenizer.as_ref().with_context(|| {
                format!(
                    "{} has no tokenizer (tokenizer.json or GGUF vocabulary); pass --ids instead",
                    args.model.display()
                )
            })?;
            let ids = tok.encode(text).context("tokenizing --text")?;
            if ids.is_empty() {
                bail!("--text gives no tokens");
            }
            (vec![ids], "--text".to_string())
        }
        (None, Some(path)) => (read_ids(path)?, format!("--ids {}", path.display())),
        (None, None) => bail!("give --text or --ids"),
    };
    if !args.allow_long_context {
        siphon_plan::check_context(&model.config, rows[0].len()).with_context(|| input.clone())?;
    }
    Ok((rows, input))
}

/// Stops, before any weight is uploaded or buffer made for the rows, a plan that a device
/// (its plugin's limit) or this host's memory (the CPU plugin's devices, the rows' copy back)
/// cannot hold.
fn check_memory(client: &Client, mesh: &Mesh, planned: &siphon_plan::Plan, kind: PluginKind) -> anyhow::Result<()> {
    fits::device_memory(client, mesh.device_ids(), planned, DEVICE_REMEDY)?;
    fits::machine_memory(planned, kind, mesh.device_ids().len(), 1, None, HOST_REMEDY)
}

/// The planner's request for `batch` (its mesh set by [`resolve_mesh`]): the hooks and
/// dictionaries in their dtypes, the rows' copy on the host, the weights as `--weights` keeps
/// them.
fn plan_request(
    args: &Args,
    model: &LoadedModel,
    hooks: &[HookPoint],
    dictionaries: &[DictionaryHook],
    batch: &Batch,
) -> anyhow::Result<PlanRequest> {
    // The next-token outputs read the final norm and the unembedding.
    let outputs = args.dictionaries.with_splice_outputs(args.outputs);
    let final_norm = outputs.map(|_| HookPoint::model(siphon_models::HookKind::LnFinalOut));
    let read: Vec<HookPoint> =
        hooks.iter().copied().chain(dictionaries.iter().map(|d| d.hook)).chain(final_norm).collect();
    let stored = match args.weights {
        siphon_engine::WeightForm::Stored => {
            model.stored_forms(siphon_models::forward::blocks_needed(&model.config, &read).0)?
        }
        siphon_engine::WeightForm::Dequantized => Default::default(),
    };
    Ok(PlanRequest {
        batch: Some(batch.batch()),
        seq: Some(batch.seq()),
        hooks: Some(hooks.to_vec()),
        next_token: outputs,
        dtype: args.compute_dtype,
        output_dtype: args.dtype,
        pipeline_depth: 1,
        stored,
        dictionaries: dictionaries.iter().map(siphon_plan::DictionaryShape::of).collect(),
        ..PlanRequest::default()
    })
}

/// Refuses hook values that are NaN or ±Inf, naming the hook, its count and the first one's
/// row and token, unless `allow` (then each such hook is counted on stderr).
fn check_finite(hooks: &[(HookPoint, HostArray)], seq: usize, allow: bool) -> anyhow::Result<()> {
    for (hook, array) in hooks {
        let values = array.to_f32();
        let Some(first) = values.iter().position(|v| !v.is_finite()) else { continue };
        let count = values.iter().filter(|v| !v.is_finite()).count();
        // `[batch, seq, *per-token shape]`.
        let per_token: usize = array.shape().get(2..).map_or(1, |dims| dims.iter().product());
        let token = first / per_token.max(1);
        let (row, position) = (token / seq.max(1), token % seq.max(1));
        let what =
            format!("hook {hook} holds {count} values that are NaN or ±Inf, the first at row {row}, token {position}");
        if !allow {
            bail!("{what}: the model's weights or config give them there (--allow-non-finite writes them)");
        }
        eprintln!("warning: {what}");
    }
    Ok(())
}

/// Refuses next-token outputs holding NaN or ±Inf, naming the output and the first one's
/// index, unless `allow`; `output.nll` is NaN by definition where a token has no next one
/// (`next_ids` −1).
fn check_outputs(outputs: &[(String, HostArray)], next_ids: &[i32], allow: bool) -> anyhow::Result<()> {
    for (name, array) in outputs {
        let values = array.to_f32();
        let expected_nan = |i: usize| outputs::is_nll(name) && next_ids[i] == -1;
        let bad: Vec<usize> = (0..values.len()).filter(|&i| !values[i].is_finite() && !expected_nan(i)).collect();
        let Some(&first) = bad.first() else { continue };
        let what = format!("{name} holds {} values that are NaN or ±Inf, the first at index {first}", bad.len());
        if !allow {
            bail!("{what}: the model's weights or config give them there (--allow-non-finite writes them)");
        }
        eprintln!("warning: {what}");
    }
    Ok(())
}

fn read_ids(path: &Path) -> anyhow::Result<Vec<Vec<u32>>> {
    let text = files::read_text(path, "--ids", files::MAX_TEXT_BYTES)?;
    let rows: Vec<Vec<u32>> = serde_json::from_str(&text)
        .with_context(|| format!("--ids {}: expected a JSON list of lists of token ids", path.display()))?;
    if rows.is_empty() || rows[0].is_empty() {
        bail!("--ids {}: no token ids", path.display());
    }
    if let Some(i) = rows.iter().position(|r| r.len() != rows[0].len()) {
        bail!(
            "--ids {}: row {i} has {} ids, row 0 has {}; rows must have equal length",
            path.display(),
            rows[i].len(),
            rows[0].len()
        );
    }
    Ok(rows)
}

/// `data=2,model=4` → that mesh over the first devices with the Megatron plan; `1d`/`2d`/
/// `3d`/`auto` → the planner's mesh and specs over all devices; nothing → one device. Each with
/// the planner's plan of `request` on it, whose memory is checked before anything is uploaded.
fn resolve_mesh(
    arg: Option<&str>,
    devices: &[usize],
    model: &LoadedModel,
    mut request: PlanRequest,
) -> anyhow::Result<(Mesh, ShardingPlan, siphon_plan::Plan)> {
    let Some(arg) = arg else {
        let first = *devices.first().context("the plugin has no devices")?;
        let mesh = Mesh::new(&[], vec![first])?;
        let planned = megatron_plan(&model.config, &mesh, request)?;
        return Ok((mesh, ShardingPlan::Megatron, planned));
    };
    if arg.contains('=') {
        let mesh = explicit_mesh(arg, devices)?;
        let planned = megatron_plan(&model.config, &mesh, request)?;
        return Ok((mesh, ShardingPlan::Megatron, planned));
    }
    let kind: siphon_plan::MeshKind = arg.parse().map_err(|e: String| anyhow::anyhow!("--mesh: {e}"))?;
    let topology = siphon_plan::Topology::uniform(1, devices.len())?;
    request.mesh.kind = kind;
    let plan = siphon_plan::plan(&model.config, &topology, &request).context("planning the mesh")?;
    // The planner numbers devices 0..n; map them onto this client's device ids.
    let ids: Vec<usize> = plan.mesh.device_ids().iter().map(|&i| devices[i]).collect();
    let axes: Vec<(&str, usize)> = plan.mesh.axes().iter().map(|a| (a.name.as_str(), a.size)).collect();
    let mesh = Mesh::new(&axes, ids)?;
    let params = plan.param_specs().iter().cloned().collect();
    let sharding = ShardingPlan::Explicit { params, input: Some(plan.input_spec.clone()) };
    Ok((mesh, sharding, plan))
}

/// `data=2,model=4` as (axis, size) pairs, each size a count of devices (`1..=MAX_AXIS`).
/// `--mesh data=2,model=4`: those axes over the first of `devices`.
pub(crate) fn explicit_mesh(arg: &str, devices: &[usize]) -> anyhow::Result<Mesh> {
    let axes = parse_axes(arg)?;
    let n = axes.iter().try_fold(1usize, |n, (_, size)| n.checked_mul(*size));
    let n = match n {
        Some(n) if n <= devices.len() => n,
        _ => bail!(
            "--mesh {arg} needs {} devices but the plugin has {} (try --cpu-devices N)",
            n.map_or("more".to_string(), |n| n.to_string()),
            devices.len()
        ),
    };
    let axes: Vec<(&str, usize)> = axes.iter().map(|(a, s)| (a.as_str(), *s)).collect();
    Mesh::new(&axes, devices[..n].to_vec()).with_context(|| format!("--mesh {arg}"))
}

fn parse_axes(arg: &str) -> anyhow::Result<Vec<(String, usize)>> {
    arg.split(',')
        .map(|part| {
            let (name, size) = part
                .split_once('=')
                .with_context(|| format!("--mesh {arg:?}: expected axis=size pairs like data=2,model=4"))?;
            let size = size
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|size| (1..=limits::MAX_AXIS as usize).contains(size))
                .with_context(|| {
                    format!("--mesh {arg:?}: the size of axis {name:?} is not in 1..={}", limits::MAX_AXIS)
                })?;
            Ok((name.trim().to_string(), size))
        })
        .collect()
}

/// The plan a Megatron mesh is checked against: the batch over `data`, the weights over
/// `model` where the planner splits them so (else whole: more than the Megatron plan keeps),
/// every other axis holding copies, which the same plan per device counts.
pub(crate) fn megatron_plan(
    config: &siphon_models::ModelConfig,
    mesh: &Mesh,
    mut request: PlanRequest,
) -> anyhow::Result<siphon_plan::Plan> {
    let data = mesh.axis_size("data").unwrap_or(1);
    let mut plan = |model: usize| {
        request.mesh = MeshRequest { data: Some(data), fsdp: Some(1), model: Some(model), ..MeshRequest::default() };
        siphon_plan::plan(config, &siphon_plan::Topology::uniform(1, data * model)?, &request)
    };
    let model = mesh.axis_size("model").unwrap_or(1);
    let planned = match plan(model) {
        Err(siphon_plan::PlanError::InvalidMesh { .. }) if model > 1 => plan(1),
        planned => planned,
    };
    planned.context("planning the rows on the mesh")
}

/// Writes a safetensors file: 8-byte header length, JSON header, data. Written to a
/// temporary name and renamed, so a failed run leaves no half-written file.
fn write_safetensors(
    path: &Path,
    tensors: &[(String, &HostArray)],
    metadata: &HashMap<String, String>,
) -> anyhow::Result<()> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::to_value(metadata)?);
    let mut offset = 0usize;
    for (name, array) in tensors {
        let dtype = match array.element_type() {
            siphon_runtime::ElementType::F32 => "F32",
            siphon_runtime::ElementType::BF16 => "BF16",
            siphon_runtime::ElementType::F16 => "F16",
            siphon_runtime::ElementType::S32 => "I32",
            other => bail!("cannot store a {other} activation"),
        };
        let len = array.bytes().len();
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": array.shape(), "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let mut json = serde_json::to_vec(&serde_json::Value::Object(header))?;
    // Pad the header so the data starts 8-byte aligned (what the safetensors writers do).
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp =
        dir.join(format!(".{}.tmp-{}", path.file_name().and_then(|n| n.to_str()).unwrap_or("out"), std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        f.write_all(&(json.len() as u64).to_le_bytes())?;
        f.write_all(&json)?;
        for (_, array) in tensors {
            f.write_all(array.bytes())?;
        }
        f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    Ok(())
}
