//! What extracting every hook of one layer costs against its residual stream alone: two
//! engines over the same model, one returning `blocks.L.hook_resid_post`, the other every hook
//! of block `L` (`blocks.L.*`: residuals, norms, q/k/v/z, scores and patterns, MLP neurons),
//! run interleaved on the same batch; each run includes the copies back to the host.
//!
//! `bench_hooks MODEL [--layer L] [--batch B] [--seq S] [--rounds N] [--devices D]`
//! (run through `scripts/bench-hooks.sh`). Prints one line per round and the medians.

use std::time::Instant;

use siphon_engine::{Batch, Engine, EngineOptions};
use siphon_models::LoadedModel;
use siphon_runtime::{Client, ClientOptions, Plugin, PluginLocator};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model_path = args.get(1).ok_or("usage: bench_hooks MODEL [--layer L] [--batch B] [--seq S] [--rounds N]")?;
    let opt = |name: &str, default: usize| -> Result<usize, String> {
        match args.iter().position(|a| a == name) {
            Some(i) => args.get(i + 1).and_then(|v| v.parse().ok()).ok_or(format!("{name} needs a number")),
            None => Ok(default),
        }
    };
    let model = LoadedModel::open(std::path::Path::new(model_path))?;
    let layer = opt("--layer", model.config.n_layers / 2)?;
    let (batch, seq, rounds) = (opt("--batch", 4)?, opt("--seq", 256)?, opt("--rounds", 7)?);

    let plugin = Plugin::load(&PluginLocator::new().locate()?.path)?;
    let client = Client::new(&plugin, ClientOptions::new().cpu_device_count(1))?;
    let resid = siphon_models::resolve_hooks(&format!("blocks.{layer}.hook_resid_post"), &model.config)?;
    let all = siphon_models::resolve_hooks(&format!("blocks.{layer}.*"), &model.config)?;
    let engines = [
        ("resid_post", Engine::new(&client, &model, resid, EngineOptions::default())?),
        ("all", Engine::new(&client, &model, all.clone(), EngineOptions::default())?),
    ];
    let vocab = model.config.vocab_size as u32;
    let ids: Vec<Vec<u32>> =
        (0..batch as u32).map(|r| (0..seq as u32).map(|t| (r * 7919 + t * 104_729 + 17) % vocab).collect()).collect();
    let input = Batch::new(ids, None)?;
    let mut widths = 0usize;
    for (name, engine) in &engines {
        engine.prepare(batch, seq)?;
        let acts = engine.run(&input)?; // warm-up
        let per_token: usize = acts.hooks.iter().map(|(_, a)| a.bytes().len() / (batch * seq)).sum();
        if *name == "all" {
            widths = per_token;
        }
        println!("{name}: {} hooks, {per_token} bytes per token", acts.hooks.len());
    }
    let tokens = (batch * seq) as f64;
    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        let mut line = format!("round {round}:");
        for (i, (name, engine)) in engines.iter().enumerate() {
            let t = Instant::now();
            let acts = engine.run(&input)?;
            let s = t.elapsed().as_secs_f64();
            std::hint::black_box(acts);
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
        "median: resid_post {:.1} ms ({:.0} tok/s), all {} hooks of block {layer} {:.1} ms ({:.0} tok/s, {widths} bytes/token); all/resid = {:.2}x",
        a * 1e3,
        tokens / a,
        all.len(),
        b * 1e3,
        tokens / b,
        b / a
    );
    Ok(())
}
