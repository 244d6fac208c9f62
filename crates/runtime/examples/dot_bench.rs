//! f32 matrix products alone on the located plugin (the CPU plugin here): the projection
//! shapes of the forward benchmarks at 1024 tokens, in three forms — `x·Wᵀ` with the weight
//! as siphon passes it (`W[n,k]`), `x·W` with it transposed (`W[k,n]`), and `W·xᵀ` (weights
//! on the left, the output transposed); best of 5, the product downloaded each time. XLA's
//! CPU library choices can be compared through `XLA_FLAGS`. Results: docs/BENCHMARKS.md
//! (issue 27).
//!
//! `cargo run --release -p siphon-runtime --example dot_bench [MxKxN ...]` (shapes given replace
//! the defaults)

use std::time::Instant;

use siphon_runtime::{Client, ClientOptions, CompileOptions, HostArray, Plugin, PluginLocator};

/// `(name, weight shape, output shape, dot_general operands and dimensions)` of each form.
fn forms(m: usize, k: usize, n: usize) -> [(&'static str, [usize; 2], [usize; 2], &'static str); 3] {
    [
        ("x·W[n,k]ᵀ", [n, k], [m, n], "%x, %w, contracting_dims = [1] x [1]"),
        ("x·W[k,n]", [k, n], [m, n], "%x, %w, contracting_dims = [1] x [0]"),
        ("W[n,k]·xᵀ", [n, k], [n, m], "%w, %x, contracting_dims = [1] x [1]"),
    ]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let plugin = Plugin::load(&PluginLocator::new().locate()?.path)?;
    let client = Client::new(&plugin, ClientOptions::new().cpu_device_count(1))?;
    let given: Vec<[usize; 3]> = std::env::args()
        .skip(1)
        .map(|a| {
            let d: Vec<usize> = a.split('x').map(|d| d.parse()).collect::<Result<_, _>>()?;
            d.try_into().map_err(|_| format!("a shape is MxKxN, not {a}").into())
        })
        .collect::<Result<_, Box<dyn std::error::Error>>>()?;
    let shapes = if given.is_empty() {
        vec![[1024, 2304, 9216], [1024, 9216, 2304], [1024, 896, 4864], [1024, 768, 3072], [1024, 2304, 18432]]
    } else {
        given
    };
    for [m, k, n] in shapes {
        let mut line = format!("{m}x{k}x{n}:");
        for (name, [w0, w1], [o0, o1], operands) in forms(m, k, n) {
            let (xt, wt, ot) =
                (format!("tensor<{m}x{k}xf32>"), format!("tensor<{w0}x{w1}xf32>"), format!("tensor<{o0}x{o1}xf32>"));
            let (lt, rt) = if operands.starts_with("%x") { (&xt, &wt) } else { (&wt, &xt) };
            let program = format!(
                "func.func @main(%x: {xt}, %w: {wt}) -> {ot} {{
  %y = stablehlo.dot_general {operands}, precision = [HIGHEST, HIGHEST] : ({lt}, {rt}) -> {ot}
  return %y : {ot}
}}"
            );
            let exe = client.compile(&program, &CompileOptions::default())?;
            let x = client.upload(&HostArray::from_slice(&[m, k], &vec![0.5f32; m * k])?, 0)?;
            let w = client.upload(&HostArray::from_slice(&[w0, w1], &vec![0.25f32; k * n])?, 0)?;
            let mut best = f64::MAX;
            for rep in 0..7 {
                let t = Instant::now();
                exe.execute(&[vec![&x, &w]])?[0][0].to_host()?;
                if rep >= 2 {
                    best = best.min(t.elapsed().as_secs_f64());
                }
            }
            line += &format!("  {name} {:.0} GFLOP/s", 2.0 * (m * k * n) as f64 / best / 1e9);
        }
        println!("{line}");
    }
    Ok(())
}
