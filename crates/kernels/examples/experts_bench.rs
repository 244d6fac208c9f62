//! Times the experts kernel alone on random weights at a mixture's widths (default: one
//! Qwen3-30B-A3B layer, 256 tokens routed to 8 of 128 experts at random, f32, every core).
//! Prints each run's time, the weights streamed per second and the routed GFLOP/s.
//!
//! `cargo run --release -p siphon-kernels --example experts_bench` with any of `E`, `H`, `I`
//! (experts, hidden, expert width), `T` (tokens), `K` (experts per token) and `ROUND=1`
//! (every expert the same number of tokens) in the environment.

use siphon_kernels::experts::{Experts, Gating, Queues, Shape, experts};
use std::time::Instant;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() -> Result<(), String> {
    let shape = Shape { experts: env("E", 128), hidden: env("H", 2048), inner: env("I", 768) };
    let (e, h, i) = (shape.experts, shape.hidden, shape.inner);
    let (t, k) = (env("T", 256), env("K", 8).min(e));
    let mut state = 0x9e37_79b9u32;
    let mut random = || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        state as usize
    };
    // Each token's k distinct experts, the choices sorted by expert.
    let mut choices: Vec<(usize, i32)> = Vec::with_capacity(t * k);
    for token in 0..t {
        let mut picked: Vec<usize> = Vec::with_capacity(k);
        while picked.len() < k {
            let ex = if env("ROUND", 0) == 1 { (token * k + picked.len()) % e } else { random() % e };
            if !picked.contains(&ex) {
                picked.push(ex);
            }
        }
        choices.extend(picked.into_iter().map(|ex| (ex, token as i32)));
    }
    choices.sort();
    let mut counts = vec![0i32; e];
    for &(ex, _) in &choices {
        counts[ex] += 1;
    }
    let token: Vec<i32> = choices.iter().map(|c| c.1).collect();
    let slot: Vec<i32> = (0..choices.len() as i32).collect();
    let queues = Queues { token: &token, slot: &slot, counts: &counts };
    let x = vec![0.01f32; t * h];
    let weights: Vec<Vec<f32>> = (0..3).map(|_| vec![0.001f32; e * i * h]).collect();
    let w = Experts { weights: [&weights[0], &weights[1], &weights[2]], biases: None, gating: Gating::Silu };
    let mut out = vec![0f32; choices.len() * h];
    let bytes = (3 * e * i * h * 4) as f64;
    let flops = (choices.len() * 3 * i * h * 2) as f64;
    for _ in 0..7 {
        let start = Instant::now();
        experts(shape, &x, &queues, &w, &mut out)?;
        let s = start.elapsed().as_secs_f64();
        println!("{:.1} ms  {:.1} GB/s of weights  {:.1} GFLOP/s", s * 1e3, bytes / s / 1e9, flops / s / 1e9);
    }
    Ok(())
}
