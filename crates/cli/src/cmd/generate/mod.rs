//! `siphon generate`: the model's own completions of prompts, on one device or a mesh
//! (`siphon_engine::decode`: a decoding step with each family's key/value cache, slots
//! refilled as completions end, the next token drawn greedily or from the warped distribution
//! with a draw keyed by (seed, record, sample, step), so a completion depends on none of the
//! mesh, the slots or the order). Prompts are `--text` (tokenized as `forward` does) or
//! `--ids` (a JSON list of lists of token ids, any lengths). Each completion is one line of a
//! JSON-lines file: `record`, `sample`, `seed`, `prompt_ids`, `completion_ids` (the exact ids
//! drawn, an end token included), `completion` (their text, special tokens left out, where
//! the model has a tokenizer) and `finish` (`eos`, `stop` or `length`). Lines go to
//! `OUT.partial` as completions end and the file takes its name once all are there; a run
//! stopped at any point resumes from what it wrote (`output.rs`). SIGTERM and SIGINT end the
//! process with their exit codes (75, 130), never a crash.
//!
//! The same command on several processes (`--process-id`, `--num-processes`, `--coordinator`
//! or the platform's, as `extract`) joins them as a job: each completes every
//! `processes`-th record on its own devices into its shard of the output
//! (`completions-00001-of-00002.jsonl`), and the shards take their names once all are
//! written. Since a completion depends only on the record, the sample and the seed, the
//! shards together hold what one process writes.
//!
//! Every setting is checked before the plugin loads or a weight is read: `--max-new-tokens`
//! and `--samples` of at least 1, sampling settings in range, stop tokens in the vocabulary, a
//! prompt and its completion within the model's context.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};
use siphon_engine::EngineError;
use siphon_engine::decode::{Prompt, Sampling, Settings, generate_each};
use siphon_engine::{Engine, EngineOptions, ShardingPlan};
use siphon_mesh::Mesh;
use siphon_models::{DType, LoadedModel};
use siphon_runtime::{Client, ClientOptions, Plugin, PluginKind, PluginLocator};

use crate::args::{ClusterArgs, limits, steer};
use prompts::Share;

mod output;
mod prompts;
mod then_extract;

pub use then_extract::completions_first;

/// What `generate` can change when the devices or this host cannot hold a step.
const MEMORY_REMEDY: &str = "choose fewer --slots, a smaller --max-new-tokens or shorter prompts, or a mesh that shards \
     the weights more (--mesh)";

/// `siphon generate` flags.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["text", "ids", "corpus"])))]
pub struct Args {
    /// A Hugging Face model directory or a .gguf file.
    #[arg(long, value_name = "PATH")]
    pub model: PathBuf,
    /// A prompt to tokenize with the model's tokenizer (repeatable: one record each).
    #[arg(long)]
    pub text: Vec<String>,
    /// Each `--text` is a user's message, rendered with the model's chat template and its
    /// generation prompt (`add_generation_prompt=True`): the completion is the assistant's turn.
    #[arg(long)]
    pub chat: bool,
    /// A JSON file holding a list of prompts, each a list of token ids (at most 16 MiB).
    #[arg(long, value_name = "FILE")]
    pub ids: Option<PathBuf>,
    /// Prompts from a corpus (as `extract --corpus` reads it), its records in order: texts
    /// (as `--text`, `--chat` included) and conversations (rendered with the chat template up
    /// to their last user message, with the generation prompt); blank or unusable records
    /// are skipped and counted.
    #[arg(long, value_name = "SPEC")]
    pub corpus: Option<String>,
    /// The corpus's records read at most (its first N).
    #[arg(long, value_name = "N", requires = "corpus", value_parser = limits::count(1, 1 << 32))]
    pub max_prompts: Option<usize>,
    /// A jsonl corpus's field holding the text or the conversation.
    #[arg(long, default_value = "text", value_name = "NAME")]
    pub json_field: String,
    /// A parquet corpus's column holding the text or the conversation.
    #[arg(long, default_value = "text", value_name = "NAME")]
    pub text_column: String,
    /// Tokens each completion holds at most.
    #[arg(long, value_name = "N")]
    pub max_new_tokens: usize,
    /// 0 (the default): greedy; else the logits are divided by it and the token drawn.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Draw among the K likeliest tokens only (0: all).
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub top_k: usize,
    /// Draw among the likeliest tokens whose probabilities reach P (1: all).
    #[arg(long, default_value_t = 1.0, value_name = "P")]
    pub top_p: f64,
    /// Drop tokens less likely than P times the likeliest (0: none).
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    pub min_p: f64,
    /// Completions of each prompt (each its own draws).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub samples: usize,
    /// The seed of every draw.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Token ids that end a completion besides the model's end of sequence (comma-separated).
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    pub stop_token: Vec<u32>,
    /// Text that ends a completion once its text holds it (repeatable): the completion ends
    /// with the token that completes it, kept, as transformers' `stop_strings`.
    #[arg(long, value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Do not end a completion at the model's end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Sequences decoded side by side (a multiple of the mesh's `data` axis).
    #[arg(long, default_value_t = 8, value_name = "N", value_parser = limits::count(1, 4096))]
    pub slots: usize,
    /// Prompt tokens a slot feeds in one step at most (no more than the longest prompt's).
    #[arg(long, default_value_t = 64, value_name = "N", value_parser = limits::count(1, 1 << 16))]
    pub chunk: usize,
    /// Add a steering vector to a hook during decoding: `HOOK=FILE[:SCALE]`, as `forward`.
    #[arg(long, value_name = "HOOK=FILE[:SCALE]")]
    pub steer: Vec<String>,
    /// Output JSON-lines file.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Dtype of weights and compute: f32 or bf16.
    #[arg(long, default_value = "f32")]
    pub compute_dtype: DType,
    /// Number of virtual devices of the CPU plugin.
    #[arg(long, value_name = "N", value_parser = limits::count(1, limits::MAX_CPU_DEVICES))]
    pub cpu_devices: Option<usize>,
    /// Mesh axes like `data=2,model=4` (Megatron-style plan). Default: one device.
    #[arg(long, value_name = "MESH")]
    pub mesh: Option<String>,
    /// PJRT plugin (default: SIPHON_PJRT_PLUGIN, then siphon's cache directory).
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<PathBuf>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// How long a process that has written all its completions waits for the others'.
const ALL_WRITTEN_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// One line of the output.
#[derive(serde::Serialize)]
struct Line<'a> {
    record: u64,
    sample: u32,
    seed: u64,
    prompt_ids: &'a [u32],
    completion_ids: &'a [u32],
    #[serde(skip_serializing_if = "Option::is_none")]
    completion: Option<String>,
    finish: &'static str,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    crate::interrupt::install_for_generate();
    let identity = args.cluster.identity()?;
    let share = Share { process: identity.process_id as usize, processes: identity.num_processes as usize };
    let out_path = output::shard(&args.out, share.process, share.processes);
    output::check(&out_path)?;
    if args.max_new_tokens == 0 {
        bail!("--max-new-tokens 0: a completion holds at least 1 token");
    }
    if args.samples == 0 {
        bail!("--samples 0: each prompt is completed at least once");
    }
    let sampling = Sampling { temperature: args.temperature, top_k: args.top_k, top_p: args.top_p, min_p: args.min_p };
    sampling.check().map_err(anyhow::Error::msg)?;
    let model = LoadedModel::open(&args.model).with_context(|| format!("opening model {}", args.model.display()))?;
    let vocab = model.config.vocab_size;
    if let Some(t) = args.stop_token.iter().find(|&&t| t as usize >= vocab) {
        bail!("--stop-token {t} is outside the vocabulary (0..{vocab})");
    }
    if let Some(s) = args.stop.iter().find(|s| s.is_empty()) {
        bail!("--stop {s:?}: a stop string holds at least one character");
    }
    if !args.stop.is_empty() && model.tokenizer.is_none() {
        bail!("--stop needs the model's tokenizer to read the completions' text; {} has none", args.model.display());
    }
    let prompts = prompts::read(&args, &model, share)?;
    let longest = prompts.iter().map(|(_, p)| p.len()).max().unwrap_or(0);
    let context = model.config.max_position_embeddings;
    let cache_len = longest + args.max_new_tokens;
    if context > 0 && cache_len > context {
        bail!(
            "--max-new-tokens {} after the longest prompt ({longest} tokens) reaches position {cache_len}, past the \
             model's context ({context})",
            args.max_new_tokens
        );
    }
    // A step feeds no more of a prompt than the longest holds: its program is no wider.
    let cache = siphon_models::DecodeStep { cache_len, chunk: args.chunk.min(longest.max(1)) };
    let (steering, _) = steer::open_all(&args.steer, &model.config)?;
    let eos_ids = match (args.ignore_eos, model.tokenizer.as_ref().and_then(|t| t.eos_id)) {
        (false, Some(eos)) => vec![eos],
        _ => Vec::new(),
    };

    // Every setting checked: the job's processes meet (each completes its share of the
    // records on its own devices; they wait for each other only at the end).
    let job = match share.processes > 1 {
        true => {
            let job = args.cluster.join()?;
            crate::interrupt::hand_over();
            Some(job)
        }
        false => None,
    };

    let choice = PluginLocator::new().explicit(args.plugin.clone()).locate().context("finding a PJRT plugin")?;
    let plugin = Plugin::load(&choice.path).context("loading the PJRT plugin")?;
    let mut options = ClientOptions::new();
    if let Some(n) = args.cpu_devices {
        options = options.cpu_device_count(n);
    }
    let client = Client::new(&plugin, options).context("creating a PJRT client")?;
    let mesh = mesh(args.mesh.as_deref(), &client.addressable_device_ids())?;
    let data = mesh.axis_size("data").unwrap_or(1);
    if !args.slots.is_multiple_of(data) {
        bail!("--slots {} does not split over the mesh's data axis ({data})", args.slots);
    }
    // The weights, every slot's caches and the logits, against the devices and this host
    // before any weight loads.
    let request = siphon_plan::PlanRequest {
        batch: Some(args.slots),
        seq: Some(1),
        hooks: Some(vec![siphon_models::HookPoint::model(siphon_models::HookKind::LnFinalOut)]),
        with_lm_head: true,
        dtype: args.compute_dtype,
        output_dtype: args.compute_dtype,
        pipeline_depth: 1,
        decode: Some(cache),
        // A step that draws on the devices also holds its sampler's arrays.
        decode_sampling: siphon_engine::draws_on_devices(&client.platform_name().to_ascii_lowercase(), None)
            .then_some(sampling),
        ..siphon_plan::PlanRequest::default()
    };
    let planned = super::forward::megatron_plan(&model.config, &mesh, request)?;
    let devices = mesh.device_ids().len();
    crate::job::fits::device_memory(&client, mesh.device_ids(), &planned, MEMORY_REMEDY)?;
    crate::job::fits::machine_memory(&planned, PluginKind::of(&choice.path), devices, 1, None, MEMORY_REMEDY)?;
    if let Some(d) = planned.memory.decode {
        tracing::info!(
            slots = d.local_slots,
            positions = d.cache_len,
            caches = %siphon_plan::memory::gib(d.cache_bytes),
            required = %siphon_plan::memory::gib(planned.memory.required_bytes),
            "decoding planned, per device"
        );
    }
    let options = EngineOptions {
        compute_dtype: args.compute_dtype,
        mesh,
        plan: ShardingPlan::Megatron,
        steering,
        decode: Some(cache),
        sampling,
        ..EngineOptions::default()
    };
    let engine = Engine::new(&client, &model, Vec::new(), options).context("loading the weights onto the devices")?;
    let mut decoder = engine.decoder(args.slots).context("the decoding step")?;
    let requests: Vec<Prompt> = prompts
        .iter()
        .flat_map(|(record, ids)| {
            (0..args.samples as u32).map(move |sample| Prompt { record: *record, sample, ids: ids.clone() })
        })
        .collect();
    let settings =
        Settings { max_new_tokens: args.max_new_tokens, eos_ids, stop_ids: args.stop_token.clone(), seed: args.seed };
    let (mut out, written) = output::Output::open(&out_path, &run_settings(&args, share, &prompts), &requests)?;
    let todo = &requests[written..];
    let slow = std::env::var("SIPHON_TEST_SLOW_COMPLETION_MS").ok().and_then(|v| v.parse().ok());
    let mut progress =
        crate::job::progress::Progress::completions(share.process, written as u64, requests.len() as u64);
    let start = std::time::Instant::now();
    let mut new_tokens = 0;
    let stops = |ids: &[u32]| match (&model.tokenizer, args.stop.is_empty()) {
        (Some(tok), false) => tok.decode(ids).is_ok_and(|text| args.stop.iter().any(|s| text.contains(s.as_str()))),
        _ => false,
    };
    generate_each(&mut decoder, todo, &settings, &stops, |i, completion| {
        let request = &todo[i];
        let text = match &model.tokenizer {
            Some(tok) => Some(tok.decode(&completion.ids).map_err(EngineError::Model)?),
            None => None,
        };
        let line = Line {
            record: request.record,
            sample: request.sample,
            seed: args.seed,
            prompt_ids: &request.ids,
            completion_ids: &completion.ids,
            completion: text,
            finish: completion.finish.name(),
        };
        let line = serde_json::to_string(&line).map_err(|e| EngineError::Options(e.to_string()))?;
        out.done(written + i, line).map_err(|e| EngineError::Options(format!("{e:#}")))?;
        new_tokens += completion.ids.len();
        progress.completion(completion.ids.len() as u64);
        if let Some(ms) = slow {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        Ok(())
    })
    .context("decoding")?;
    let seconds = start.elapsed().as_secs_f64();
    progress.end();
    // Each process's shard takes its name once every process has written all its lines: a
    // job stopped before that resumes from the partial files alone.
    if let Some(job) = &job {
        out.complete()?;
        job.barrier("generate: every completion written", ALL_WRITTEN_TIMEOUT)
            .context("waiting for the other processes' completions")?;
    }
    out.finish()?;
    if let Some(job) = &job {
        job.shutdown(Duration::from_secs(60)).context("leaving the job")?;
    }
    println!(
        "{} completions ({written} from an earlier run), {new_tokens} new tokens in {seconds:.2} s ({:.1} tokens/s); \
         wrote {}",
        requests.len(),
        new_tokens as f64 / seconds.max(1e-9),
        out_path.display()
    );
    Ok(())
}

/// What a run's completions depend on (the mesh, slots and chunk do not; the processes do
/// choose which records a shard holds): a partial output is resumed only by a run of the same.
fn run_settings(args: &Args, share: Share, prompts: &[(u64, Vec<u32>)]) -> serde_json::Value {
    let digest = Sha256::digest(serde_json::to_vec(prompts).unwrap_or_default());
    serde_json::json!({
        "model": args.model.display().to_string(),
        "processes": share.processes,
        "prompts_sha256": digest.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "samples": args.samples,
        "seed": args.seed,
        "stop_token": args.stop_token,
        "stop": args.stop,
        "ignore_eos": args.ignore_eos,
        "steer": args.steer,
        "compute_dtype": args.compute_dtype.to_string(),
    })
}

/// `data=2,model=4` over the first devices, or one device.
fn mesh(arg: Option<&str>, devices: &[usize]) -> anyhow::Result<Mesh> {
    let first = *devices.first().context("the plugin has no devices")?;
    match arg {
        Some(arg) => super::forward::explicit_mesh(arg, devices),
        None => Ok(Mesh::new(&[], vec![first])?),
    }
}
