//! Attention-alone benchmark server, driven by `scripts/bench/bench_attention.py`, which
//! interleaves it with torch's SDPA on the same shapes: cuDNN's fused attention
//! (`siphon_models::cudnn::program`, the call siphon's programs make on a CUDA plugin), causal,
//! bf16, every row full.
//!
//! `bench_attention BATCH SEQ HEADS KV_HEADS HEAD_DIM` compiles the call alone on the located
//! PJRT plugin (CUDA's on a GPU machine), uploads random q, k, v, prints `ready compile_s=…`,
//! then answers each stdin line `run` with `ms=…`: `REPEATS` (default 10) calls in a row
//! until the last output is ready on the device, divided by `REPEATS`.

use std::io::{BufRead, Write};
use std::time::Instant;

use siphon_runtime::{Client, ClientOptions, CompileOptions, HostArray, Plugin, PluginLocator};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let usage = "usage: bench_attention BATCH SEQ HEADS KV_HEADS HEAD_DIM";
    let dims: Vec<usize> = std::env::args().skip(1).map(|a| a.parse()).collect::<Result<_, _>>().map_err(|_| usage)?;
    let &[batch, seq, heads, kv_heads, head_dim] = &dims[..] else { return Err(usage.into()) };
    let repeats: usize = std::env::var("REPEATS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);

    let plugin = Plugin::load(&PluginLocator::new().locate()?.path)?;
    let client = Client::new(&plugin, ClientOptions::new())?;
    let text = siphon_models::cudnn::program(batch, seq, heads, kv_heads, head_dim)?;
    let t0 = Instant::now();
    let exe = client.compile(&text, &CompileOptions::single_device(None))?;
    let compile_s = t0.elapsed().as_secs_f64();
    let device = exe.device_ids()[0];

    let mut state = 0x9e37_79b9u32;
    let mut random = |n: usize| -> Vec<half::bf16> {
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                half::bf16::from_f32((state % 2001) as f32 / 1000.0 - 1.0)
            })
            .collect()
    };
    let mut buffers = Vec::new();
    for h in [heads, kv_heads, kv_heads] {
        let shape = [batch, seq, h, head_dim];
        buffers.push(client.upload(&HostArray::from_slice(&shape, &random(shape.iter().product()))?, device)?);
    }
    let lengths = vec![seq as i32; batch];
    buffers.push(client.upload(&HostArray::from_slice(&[batch], &lengths)?, device)?);
    println!("ready compile_s={compile_s:.3}");
    std::io::stdout().flush()?;

    for line in std::io::stdin().lock().lines() {
        match line?.trim() {
            "run" => {
                let t = Instant::now();
                let mut last = Vec::new();
                for _ in 0..repeats {
                    last = exe.execute(&[buffers.iter().collect()])?;
                }
                for out in &last[0] {
                    out.wait_ready()?;
                }
                println!("ms={:.4}", t.elapsed().as_secs_f64() * 1e3 / repeats as f64);
            }
            "quit" | "" => break,
            other => println!("error unknown command {other}"),
        }
        std::io::stdout().flush()?;
    }
    Ok(())
}
