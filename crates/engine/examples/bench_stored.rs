//! Weights kept in their stored form on the device against dequantized on load: two engines
//! over the same quantized model (the demo's Q4_1 GGUF by default), one with the weights
//! dequantized to f32 on the host, the other with them kept as stored blocks and dequantized
//! inside the forward (`WeightForm::Stored`), run interleaved on the same batch; each run
//! includes the copy of the last block's residual stream back to the host. Prints the weight
//! bytes each engine holds on the device, one line per round, and the medians, after checking
//! that both give the same activations bit for bit.
//!
//! `bench_stored MODEL [--batch B] [--seq S] [--rounds N]` (run through
//! `scripts/bench-stored.sh`).

use std::time::Instant;

use siphon_engine::{Batch, Engine, EngineOptions, WeightForm};
use siphon_models::LoadedModel;
use siphon_runtime::{Client, ClientOptions, Plugin, PluginLocator};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model_path = args.get(1).ok_or("usage: bench_stored MODEL [--batch B] [--seq S] [--rounds N]")?;
    let opt = |name: &str, default: usize| -> Result<usize, String> {
        match args.iter().position(|a| a == name) {
            Some(i) => args.get(i + 1).and_then(|v| v.parse().ok()).ok_or(format!("{name} needs a number")),
            None => Ok(default),
        }
    };
    let model = LoadedModel::open(std::path::Path::new(model_path))?;
    let (batch, seq, rounds) = (opt("--batch", 4)?, opt("--seq", 256)?, opt("--rounds", 7)?);

    let plugin = Plugin::load(&PluginLocator::new().locate()?.path)?;
    let client = Client::new(&plugin, ClientOptions::new().cpu_device_count(1))?;
    let last = model.config.n_layers - 1;
    let hooks = siphon_models::resolve_hooks(&format!("blocks.{last}.hook_resid_post"), &model.config)?;
    let engine = |weights| Engine::new(&client, &model, hooks.clone(), EngineOptions { weights, ..Default::default() });
    let engines = [("dequantized f32", engine(WeightForm::Dequantized)?), ("stored", engine(WeightForm::Stored)?)];
    let vocab = model.config.vocab_size as u32;
    let ids: Vec<Vec<u32>> =
        (0..batch as u32).map(|r| (0..seq as u32).map(|t| (r * 7919 + t * 104_729 + 17) % vocab).collect()).collect();
    let input = Batch::new(ids, None)?;
    let mut outputs = Vec::new();
    for (name, engine) in &engines {
        engine.prepare(batch, seq)?;
        outputs.push(engine.run(&input)?); // warm-up
        let stats = engine.load_stats();
        println!(
            "{name}: {} weights stored, {:.1} MiB of weights on the device",
            engine.stored_weights().len(),
            stats.uploaded_bytes as f64 / (1 << 20) as f64
        );
    }
    let same = outputs[0].hooks.iter().zip(&outputs[1].hooks).all(|((_, a), (_, b))| a.bytes() == b.bytes());
    println!("activations bit for bit equal: {same}");
    let tokens = (batch * seq) as f64;
    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        let mut line = format!("round {round}:");
        for (i, (name, engine)) in engines.iter().enumerate() {
            let t = Instant::now();
            std::hint::black_box(engine.run(&input)?);
            let s = t.elapsed().as_secs_f64();
            times[i].push(s);
            line += &format!(" {name} {:.1} ms ({:.0} tok/s)", s * 1e3, tokens / s);
        }
        println!("{line}");
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (a, b) = (median(&mut times[0]), median(&mut times[1]));
    println!(
        "median: dequantized f32 {:.1} ms ({:.0} tok/s), stored {:.1} ms ({:.0} tok/s); stored/dequantized time = {:.2}x",
        a * 1e3,
        tokens / a,
        b * 1e3,
        tokens / b,
        b / a
    );
    Ok(())
}
