//! `siphon forward`: one forward pass for inspection. Tokenizes a text (or reads token ids),
//! runs the model on a mesh and writes the requested hook activations to a safetensors file,
//! one `[batch, seq, *per-token shape]` tensor per hook, keyed by the hook's TransformerLens
//! name; with `--sae`, each dictionary's latents computed on the devices (each token's largest,
//! sparsely: `<name>.indices`, `<name>.values`, `<name>.firings`).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use siphon_engine::{Batch, Engine, EngineOptions, ShardingPlan};
use siphon_mesh::Mesh;
use siphon_models::{DType, DictionaryHook, LoadedModel};
use siphon_runtime::{Client, ClientOptions, HostArray, Plugin, PluginLocator};

use crate::args::SaeArgs;

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
    /// A JSON file holding a list of equal-length lists of token ids.
    #[arg(long, value_name = "FILE")]
    pub ids: Option<PathBuf>,
    /// Comma-separated TransformerLens hook names or patterns, e.g.
    /// blocks.3.hook_resid_post,blocks.*.attn.hook_z,blocks.{0..3}.ln2.hook_normalized.
    #[arg(long, value_name = "NAMES", required_unless_present = "sae")]
    pub hooks: Option<String>,
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
    #[arg(long, value_name = "N")]
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
    let rows = match (&args.text, &args.ids) {
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
            vec![ids]
        }
        (None, Some(path)) => read_ids(path)?,
        (None, None) => bail!("give --text or --ids"),
    };
    let batch = Batch::new(rows.clone(), None).context("the token ids")?;

    let choice = PluginLocator::new().explicit(args.plugin.clone()).locate().context("finding a PJRT plugin")?;
    let plugin = Plugin::load(&choice.path).context("loading the PJRT plugin")?;
    let mut options = ClientOptions::new();
    if let Some(n) = args.cpu_devices {
        if n == 0 {
            bail!("--cpu-devices must be at least 1");
        }
        options = options.cpu_device_count(n);
    }
    let client = Client::new(&plugin, options).context("creating a PJRT client")?;
    let devices = client.addressable_device_ids();
    let (mesh, plan) = resolve_mesh(args.mesh.as_deref(), &devices, &model, batch.batch())?;
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
        ..EngineOptions::default()
    };
    let engine = Engine::new(&client, &model, hooks, options).context("loading the weights onto the devices")?;
    let acts = engine.run(&batch).context("running the forward")?;
    crate::job::dictionary::check_caps(&dictionaries, &acts.latents)?;

    let mut tensors: Vec<(String, &HostArray)> = acts.hooks.iter().map(|(h, a)| (h.to_string(), a)).collect();
    for (name, latents) in DictionaryHook::names(&dictionaries).into_iter().zip(&acts.latents) {
        tensors.push((format!("{name}.indices"), &latents.indices));
        tensors.push((format!("{name}.values"), &latents.values));
        tensors.push((format!("{name}.firings"), &latents.firings));
    }
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

fn read_ids(path: &Path) -> anyhow::Result<Vec<Vec<u32>>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading --ids {}", path.display()))?;
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
/// `3d`/`auto` → the planner's mesh and specs over all devices; nothing → one device.
fn resolve_mesh(
    arg: Option<&str>,
    devices: &[usize],
    model: &LoadedModel,
    batch: usize,
) -> anyhow::Result<(Mesh, ShardingPlan)> {
    let Some(arg) = arg else {
        let first = *devices.first().context("the plugin has no devices")?;
        return Ok((Mesh::new(&[], vec![first])?, ShardingPlan::Megatron));
    };
    if arg.contains('=') {
        let mut axes = Vec::new();
        for part in arg.split(',') {
            let (name, size) = part
                .split_once('=')
                .with_context(|| format!("--mesh {arg:?}: expected axis=size pairs like data=2,model=4"))?;
            let size: usize = size
                .trim()
                .parse()
                .with_context(|| format!("--mesh {arg:?}: size of axis {name:?} is not a number"))?;
            axes.push((name.trim().to_string(), size));
        }
        let n: usize = axes.iter().map(|a| a.1).product();
        if n > devices.len() {
            bail!("--mesh {arg} needs {n} devices but the plugin has {} (try --cpu-devices {n})", devices.len());
        }
        let axes_ref: Vec<(&str, usize)> = axes.iter().map(|(a, s)| (a.as_str(), *s)).collect();
        let mesh = Mesh::new(&axes_ref, devices[..n].to_vec()).with_context(|| format!("--mesh {arg}"))?;
        return Ok((mesh, ShardingPlan::Megatron));
    }
    let kind: siphon_plan::MeshKind = arg.parse().map_err(|e: String| anyhow::anyhow!("--mesh: {e}"))?;
    let topology = siphon_plan::Topology::uniform(1, devices.len())?;
    let mut request = siphon_plan::PlanRequest::default();
    request.mesh.kind = kind;
    request.batch = Some(batch);
    let plan = siphon_plan::plan(&model.config, &topology, &request).context("planning the mesh")?;
    // The planner numbers devices 0..n; map them onto this client's device ids.
    let ids: Vec<usize> = plan.mesh.device_ids().iter().map(|&i| devices[i]).collect();
    let axes: Vec<(&str, usize)> = plan.mesh.axes().iter().map(|a| (a.name.as_str(), a.size)).collect();
    let mesh = Mesh::new(&axes, ids)?;
    let params = plan.param_specs().iter().cloned().collect();
    Ok((mesh, ShardingPlan::Explicit { params, input: Some(plan.input_spec.clone()) }))
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
