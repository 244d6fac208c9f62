//! Runtime micro-benchmarks on whatever plugin discovery finds (the CPU plugin here):
//! plugin load, client creation, compile, transfers, dispatch latency and matmul throughput.
//!
//! `cargo run --release -p siphon-runtime --example runtime_bench [-- --devices 8 --reps 7]`
//! Prints medians; results go into docs/BENCHMARKS.md (runtime section).

use std::time::Instant;

use siphon_mesh::{Mesh, PartitionSpec};
use siphon_runtime::{Client, ClientOptions, CompileOptions, HostArray, Plugin, PluginLocator};

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn time<T>(reps: usize, mut f: impl FnMut() -> T) -> f64 {
    median(
        (0..reps)
            .map(|_| {
                let start = Instant::now();
                std::hint::black_box(f());
                start.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let devices = flag("--devices", 8);
    let reps = flag("--reps", 7);

    let choice = PluginLocator::new().locate()?;
    let start = Instant::now();
    let plugin = Plugin::load(&choice.path)?;
    println!("plugin load+init: {:.1} ms ({})", start.elapsed().as_secs_f64() * 1e3, choice.path.display());
    let create = time(reps, || Client::new(&plugin, ClientOptions::new().cpu_device_count(devices)).unwrap());
    println!("client create ({devices} devices): {:.1} ms", create * 1e3);
    let client = Client::new(&plugin, ClientOptions::new().cpu_device_count(devices))?;
    println!("platform {} {}", client.platform_name(), client.platform_version());

    // Dispatch latency: a 4-element add, upload excluded.
    let add = "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = stablehlo.add %x, %x : tensor<4xf32>
  return %y : tensor<4xf32>
}";
    let compile_small = time(reps, || client.compile(add, &CompileOptions::default()).unwrap());
    println!("compile 4-element add: {:.1} ms", compile_small * 1e3);
    let executable = client.compile(add, &CompileOptions::default())?;
    let x = client.upload(&HostArray::from_slice(&[4], &[1f32, 2.0, 3.0, 4.0])?, 0)?;
    let dispatch = time(reps * 50, || executable.execute(&[vec![&x]]).unwrap());
    println!("execute 4-element add (dispatch + wait): {:.1} us", dispatch * 1e6);

    // Transfers: 64 MiB of f32.
    let n = 16 << 20;
    let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let host = HostArray::from_slice(&[n / 1024, 1024], &values)?;
    let mib = (n * 4) as f64 / (1 << 20) as f64;
    let up = time(reps, || client.upload(&host, 0).unwrap());
    println!("upload 64 MiB to one device: {:.1} ms ({:.0} MiB/s)", up * 1e3, mib / up);
    let buffer = client.upload(&host, 0)?;
    let down = time(reps, || buffer.to_host().unwrap());
    println!("download 64 MiB from one device: {:.1} ms ({:.0} MiB/s)", down * 1e3, mib / down);
    let mesh = Mesh::new(&[("data", devices)], (0..devices).collect())?;
    let spec = PartitionSpec::new(&[&["data"], &[]]);
    let up_sharded = time(reps, || client.upload_sharded(&host, &spec, &mesh).unwrap());
    println!(
        "sharded upload 64 MiB over {devices} devices (split + copy): {:.1} ms ({:.0} MiB/s)",
        up_sharded * 1e3,
        mib / up_sharded
    );
    let sharded = client.upload_sharded(&host, &spec, &mesh)?;
    let down_sharded = time(reps, || sharded.to_host().unwrap());
    println!(
        "sharded download 64 MiB from {devices} devices (copy + assemble): {:.1} ms ({:.0} MiB/s)",
        down_sharded * 1e3,
        mib / down_sharded
    );

    // Matmul throughput on one device.
    let size = 2048;
    let matmul = format!(
        "func.func @main(%a: tensor<{size}x{size}xf32>, %b: tensor<{size}x{size}xf32>) -> tensor<{size}x{size}xf32> {{
  %c = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<{size}x{size}xf32>, tensor<{size}x{size}xf32>) -> tensor<{size}x{size}xf32>
  return %c : tensor<{size}x{size}xf32>
}}"
    );
    let start = Instant::now();
    let executable = client.compile(&matmul, &CompileOptions::default())?;
    println!("compile {size}^3 matmul: {:.1} ms", start.elapsed().as_secs_f64() * 1e3);
    let square = HostArray::from_slice(&[size, size], &values[..size * size])?;
    let a = client.upload(&square, 0)?;
    let seconds = time(reps, || executable.execute(&[vec![&a, &a]]).unwrap());
    let gflops = 2.0 * (size as f64).powi(3) / seconds / 1e9;
    println!("execute {size}^3 f32 matmul: {:.1} ms ({gflops:.0} GFLOP/s)", seconds * 1e3);
    Ok(())
}
