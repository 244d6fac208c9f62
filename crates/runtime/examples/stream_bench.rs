//! f32 products of a few rows by many weights in one program, each weight read once (streamed
//! from memory, as a decoding step reads a model's weights) against one weight read as many
//! times (cache-resident): how much of a small-row product's time is memory's. Three forms
//! as in `dot_bench`; best of 6. Results: docs/BENCHMARKS.md (issue 69).
//!
//! `cargo run --release -p siphon-runtime --example stream_bench [MxKxN [COUNT]]` (default
//! 32x576x1536, 60 weights)

use std::time::Instant;

use siphon_runtime::{Client, ClientOptions, CompileOptions, HostArray, Plugin, PluginLocator};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let plugin = Plugin::load(&PluginLocator::new().locate()?.path)?;
    let client = Client::new(&plugin, ClientOptions::new().cpu_device_count(1))?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let shape = args.first().map_or("32x576x1536", String::as_str);
    let dims: Vec<usize> = shape.split('x').map(str::parse).collect::<Result<_, _>>()?;
    let [m, k, n]: [usize; 3] = dims.try_into().map_err(|_| format!("a shape is MxKxN, not {shape}"))?;
    let count: usize = args.get(1).map_or(Ok(60), |c| c.parse())?;
    for (name, dot, w_dims, out_dims) in [
        ("W[n,k]·xᵀ", "%w{i}, %x, contracting_dims = [1] x [1]", [n, k], [n, m]),
        ("x·W[n,k]ᵀ", "%x, %w{i}, contracting_dims = [1] x [1]", [n, k], [m, n]),
        ("x·W[k,n]", "%x, %w{i}, contracting_dims = [1] x [0]", [k, n], [m, n]),
    ] {
        let tensor = |[a, b]: [usize; 2]| format!("tensor<{a}x{b}xf32>");
        let (xt, wt, ot) = (tensor([m, k]), tensor(w_dims), tensor(out_dims));
        let (lt, rt) = if dot.starts_with("%x") { (&xt, &wt) } else { (&wt, &xt) };
        // Every product summed into the result, so that none is dropped.
        let mut params = format!("%x: {xt}");
        let mut body = String::new();
        for i in 0..count {
            params += &format!(", %w{i}: {wt}");
            let operands = dot.replace("{i}", &i.to_string());
            body += &format!(
                "  %y{i} = stablehlo.dot_general {operands}, precision = [HIGHEST, HIGHEST] : ({lt}, {rt}) -> {ot}\n"
            );
            body += &match i {
                0 => format!("  %s0 = stablehlo.add %y0, %y0 : {ot}\n"),
                _ => format!("  %s{i} = stablehlo.add %s{}, %y{i} : {ot}\n", i - 1),
            };
        }
        let program = format!("func.func @main({params}) -> {ot} {{\n{body}  return %s{} : {ot}\n}}", count - 1);
        let exe = client.compile(&program, &CompileOptions::default())?;
        let x = client.upload(&HostArray::from_slice(&[m, k], &vec![0.5f32; m * k])?, 0)?;
        let weights = (0..count)
            .map(|i| client.upload(&HostArray::from_slice(&w_dims, &vec![0.25 + i as f32; k * n])?, 0))
            .collect::<Result<Vec<_>, _>>()?;
        let mut line = format!("{shape} × {count} {name}:");
        for (label, distinct) in [("distinct weights", true), ("one weight", false)] {
            let args: Vec<_> =
                std::iter::once(&x).chain((0..count).map(|i| &weights[if distinct { i } else { 0 }])).collect();
            let mut best = f64::MAX;
            for _ in 0..6 {
                let t = Instant::now();
                exe.execute(std::slice::from_ref(&args))?[0][0].to_host()?;
                best = best.min(t.elapsed().as_secs_f64());
            }
            line += &format!("  {label} {:.0} GFLOP/s", 2.0 * (m * k * n * count) as f64 / best / 1e9);
        }
        println!("{line}");
    }
    Ok(())
}
