//! f32 matrix products alone on the located plugin (the CPU plugin here): the projection
//! shapes of the forward benchmarks at 1024 tokens, with the weight as siphon passes it
//! (`W[n,k]`, contracted on its last dimension) and transposed (`W[k,n]`); best of 5, the
//! product downloaded each time. XLA's CPU library choices can be compared through
//! `XLA_FLAGS`. Results: docs/BENCHMARKS.md (issue 27).
//!
//! `cargo run --release -p siphon-runtime --example dot_bench`

use std::time::Instant;

use siphon_runtime::{Client, ClientOptions, CompileOptions, HostArray, Plugin, PluginLocator};
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let plugin = Plugin::load(&PluginLocator::new().locate()?.path)?;
    let client = Client::new(&plugin, ClientOptions::new().cpu_device_count(1))?;
    for (m, k, n) in [
        (1024usize, 2304usize, 9216usize),
        (1024, 9216, 2304),
        (1024, 896, 4864),
        (1024, 768, 3072),
        (1024, 2304, 18432),
    ] {
        let mut line = format!("{m}x{k}x{n}:");
        for wt in [false, true] {
            let (wshape, dims) = if wt { (format!("{n}x{k}"), "[1] x [1]") } else { (format!("{k}x{n}"), "[1] x [0]") };
            let prog = format!("func.func @main(%x: tensor<{m}x{k}xf32>, %w: tensor<{wshape}xf32>) -> tensor<{m}x{n}xf32> {{
  %y = stablehlo.dot_general %x, %w, contracting_dims = {dims}, precision = [HIGHEST, HIGHEST] : (tensor<{m}x{k}xf32>, tensor<{wshape}xf32>) -> tensor<{m}x{n}xf32>
  return %y : tensor<{m}x{n}xf32>
}}");
            let exe = client.compile(&prog, &CompileOptions::default())?;
            let x = client.upload(&HostArray::from_slice(&[m, k], &vec![0.5f32; m * k])?, 0)?;
            let ws: Vec<usize> = if wt { vec![n, k] } else { vec![k, n] };
            let w = client.upload(&HostArray::from_slice(&ws, &vec![0.25f32; k * n])?, 0)?;
            for _ in 0..2 {
                exe.execute(&[vec![&x, &w]])?[0][0].to_host()?;
            }
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = Instant::now();
                exe.execute(&[vec![&x, &w]])?[0][0].to_host()?;
                best = best.min(t.elapsed().as_secs_f64());
            }
            line += &format!(
                "  {} {:.0} GFLOP/s",
                if wt { "W[n,k]" } else { "W[k,n]" },
                2.0 * (m * k * n) as f64 / best / 1e9
            );
        }
        println!("{line}");
    }
    Ok(())
}
