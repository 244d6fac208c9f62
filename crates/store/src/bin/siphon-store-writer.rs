//! Writes a synthetic activation dataset with the store's real pipeline; the crash tests run
//! it, kill it at a failpoint (`SIPHON_FAILPOINT`, see the crate's failpoint module), and run it
//! again to check that the resumed dataset is exactly the uninterrupted one.
//!
//! Usage: `siphon-store-writer --output URL --run NAME [--batches N] [--batch B] [--seq S]
//! [--d-model D] [--hooks K] [--dtype f32|bf16|f16] [--target-bytes X] [--part-bytes P]
//! [--shuffle-window W --seed S] [--keep-excluded] [--latents WIDTH:CAP] [--machine M --host H]
//! [--finalize] [--option key=value]...`. Prints the host summary as JSON.

use std::collections::HashMap;

use anyhow::{Context, bail};
use siphon_store::synthetic::SyntheticSpec;
use siphon_store::{DType, HostId, RunDescriptor, ShardWriter, ShuffleConfig, StoreConfig};

fn main() -> anyhow::Result<()> {
    let mut values: HashMap<String, String> = HashMap::new();
    let mut options = Vec::new();
    let mut flags = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let key = arg.strip_prefix("--").with_context(|| format!("unexpected argument {arg:?}"))?.to_string();
        match key.as_str() {
            "keep-excluded" | "finalize" => flags.push(key),
            "option" => {
                let kv = args.next().context("--option needs key=value")?;
                let (k, v) = kv.split_once('=').with_context(|| format!("--option {kv:?} is not key=value"))?;
                options.push((k.to_string(), v.to_string()));
            }
            _ => {
                let value = args.next().with_context(|| format!("--{key} needs a value"))?;
                values.insert(key, value);
            }
        }
    }
    let get = |key: &str, default: u64| -> anyhow::Result<u64> {
        values.get(key).map_or(Ok(default), |v| v.parse().with_context(|| format!("--{key} {v:?} is not a number")))
    };
    let output = values.get("output").context("--output is required")?.clone();
    let run = values.get("run").context("--run is required")?.clone();
    let mut spec = SyntheticSpec::new(
        get("hooks", 2)? as usize,
        get("batch", 4)? as usize,
        get("seq", 64)? as usize,
        get("d-model", 512)? as usize,
    );
    if let Some(latents) = values.get("latents") {
        let (width, cap) = latents.split_once(':').context("--latents WIDTH:CAP")?;
        let (width, cap) = (width.parse().context("--latents WIDTH")?, cap.parse().context("--latents CAP")?);
        spec = spec.with_latents("blocks.0.hook_resid_post.hook_sae_acts_post", width, cap);
    }
    let batches = get("batches", 20)?;
    let host = HostId { machine: get("machine", 0)? as u32, host: get("host", 0)? as u32 };

    let mut config = StoreConfig::new(&output, &run, host);
    config.options = options.clone();
    config.format.dtype = (values.get("dtype").map_or("f32", String::as_str)).parse::<DType>()?;
    config.format.target_shard_bytes = get("target-bytes", 6 << 20)?;
    config.format.keep_excluded = flags.iter().any(|f| f == "keep-excluded");
    if let Some(window) = values.get("shuffle-window") {
        config.format.shuffle =
            Some(ShuffleConfig { seed: get("seed", 0)?, window_batches: window.parse().context("--shuffle-window")? });
    }
    config.upload.part_bytes = get("part-bytes", 5 << 20)? as usize;
    let descriptor = RunDescriptor {
        model: serde_json::json!({ "id": "synthetic" }),
        hooks: spec.hooks.clone(),
        hook_shapes: spec.shapes.clone(),
        latents: spec.latents.clone(),
        outputs: spec.outputs.clone(),
        mesh: serde_json::json!({ "data": 1 }),
        partition: serde_json::json!({ "hosts": 1 }),
        config: serde_json::json!({ "batch": spec.batch, "seq": spec.seq, "batches": batches }),
    };

    let mut writer = ShardWriter::open(config, descriptor).context("opening the store")?;
    let start = match &writer.resume_point().data_position {
        None => 0,
        Some(position) => position
            .get("batch")
            .and_then(|b| b.as_u64())
            .with_context(|| format!("unexpected data position {position}"))?,
    };
    if start > batches {
        bail!("resume position {start} is past the end ({batches} batches)");
    }
    eprintln!("siphon-store-writer: resuming at batch {start} of {batches}");
    for k in start..batches {
        writer.push(spec.batch(k)).with_context(|| format!("pushing batch {k}"))?;
    }
    let summary = writer.finish().context("finishing")?;
    if flags.iter().any(|f| f == "finalize") {
        siphon_store::finalize_run(&output, &options, &run).context("merging statistics")?;
    }
    println!(
        "{}",
        serde_json::json!({
            "shards": summary.shards,
            "tokens": summary.tokens,
            "included_tokens": summary.included_tokens,
            "samples_end": summary.samples_end,
            "bytes": summary.bytes,
            "resumed_at_batch": start,
        })
    );
    Ok(())
}
