//! `siphon doctor`: with `--output`, check that the output location takes a write, a read, a
//! listing and a delete; then find and load the PJRT plugin, list its devices, and run a
//! sharded matmul over all of them on a 2-D mesh, checked against plain Rust. It also says
//! which libtpu `siphon plan --target tpu:…` and which CUDA plugin `siphon plan --target
//! gpu:…` would compile with (found, not loaded), or how to install them.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail, ensure};
use siphon_hlo::{Builder, DType, TensorType};
use siphon_mesh::{Mesh, PartitionSpec};
use siphon_runtime::{Client, ClientOptions, CompileOptions, HostArray, Plugin, PluginLocator};

use crate::args::limits;

#[derive(clap::Args)]
pub struct Args {
    /// PJRT plugin to use (default: SIPHON_PJRT_PLUGIN, then siphon's cache directory, then
    /// libtpu / jax-cuda12-pjrt Python packages).
    #[arg(long, value_name = "PATH")]
    plugin: Option<PathBuf>,
    /// Number of virtual devices for the CPU plugin (its `cpu_device_count` option).
    #[arg(long, value_name = "N", value_parser = limits::count(1, limits::MAX_CPU_DEVICES))]
    cpu_devices: Option<usize>,
    /// Also check an output location (what `extract --output` gets): write, read back, list
    /// and delete a 64 KiB object under `{output}/.siphon-probe/`.
    #[arg(long, value_name = "URL")]
    output: Option<String>,
    /// Seconds the output check may keep retrying a failing store.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0, value_parser = limits::positive_seconds)]
    store_timeout: f64,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(output) = &args.output {
        check_output(output, args.store_timeout)?;
    }
    println!("huge pages: {}", crate::huge_pages::describe());
    let choice = PluginLocator::new().explicit(args.plugin.clone()).locate().context("finding a PJRT plugin")?;
    println!("plugin:    {}", choice.path.display());
    println!("  picked:  {}", choice.reason);
    let plugin = Plugin::load(&choice.path).context("loading the PJRT plugin")?;
    let (major, minor) = plugin.api_version();
    let (ours_major, ours_minor) = siphon_runtime::PJRT_API_VERSION;
    println!(
        "  PJRT C API {major}.{minor} ({} functions; siphon's structs follow {ours_major}.{ours_minor})",
        plugin.num_functions()
    );
    for (name, value) in plugin.attributes() {
        println!("  {name} = {value}");
    }
    match PluginLocator::new().locate_libtpu() {
        Ok(libtpu) => println!(
            "tpu plans: libtpu {} ({}) compiles for TPU slices (`siphon plan --target tpu:SLICE`)",
            libtpu.path.display(),
            libtpu.reason
        ),
        Err(e) => println!("tpu plans: {e}"),
    }
    match PluginLocator::new().locate_cuda_compiler() {
        Ok(cuda) => println!(
            "gpu plans: the CUDA plugin {} ({}) compiles for GPUs (`siphon plan --target gpu:GPUS`)",
            cuda.path.display(),
            cuda.reason
        ),
        Err(e) => println!("gpu plans: {e}"),
    }

    let mut options = ClientOptions::new();
    if let Some(count) = args.cpu_devices {
        options = options.cpu_device_count(count);
    }
    let client = Client::new(&plugin, options).context("creating a PJRT client")?;
    println!("platform:  {} ({})", client.platform_name(), client.platform_version());
    println!("process:   {}", client.process_index());
    let devices = client.devices();
    println!("devices:   {}", devices.len());
    for device in &devices {
        println!(
            "  id {:>3}  kind {:<24} process {}  local hw id {:>3}  {}",
            device.id,
            device.kind,
            device.process_index,
            device.local_hardware_id,
            if device.addressable { "addressable" } else { "not addressable" }
        );
    }
    if let Some(count) = args.cpu_devices
        && client.platform_name() == "cpu"
        && devices.len() != count
    {
        bail!("asked for {count} CPU devices but the plugin created {}", devices.len());
    }

    let device_ids = client.addressable_device_ids();
    ensure!(!device_ids.is_empty(), "the plugin has no addressable devices");
    self_test(&client, &device_ids)
}

/// Writes, reads back, lists and deletes one object at `output`, printing how long each took.
fn check_output(output: &str, store_timeout: f64) -> anyhow::Result<()> {
    println!("output:    {output}");
    let timeout = std::time::Duration::from_secs_f64(store_timeout);
    let report = siphon_store::probe_blocking(output, &[], timeout)
        .with_context(|| format!("the output {output} cannot hold a dataset"))?;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    println!(
        "  wrote {} KiB in {:.1} ms, read it back in {:.1} ms, listed in {:.1} ms, deleted in {:.1} ms",
        siphon_store::PROBE_BYTES >> 10,
        ms(report.put),
        ms(report.get),
        ms(report.list),
        ms(report.delete)
    );
    Ok(())
}

/// Splits `n` devices into a 2-D mesh `(rows, cols)`: rows = smallest prime factor.
fn factor(n: usize) -> (usize, usize) {
    let rows = (2..=n).find(|d| n.is_multiple_of(*d)).unwrap_or(1);
    (rows, n / rows)
}

fn self_test(client: &Client, device_ids: &[usize]) -> anyhow::Result<()> {
    let (rows, cols) = factor(device_ids.len());
    let mesh = Mesh::new(&[("data", rows), ("model", cols)], device_ids.to_vec())?;
    let (m, k, n) = (4 * rows, 64, 8 * cols);
    let x_spec = PartitionSpec::new(&[&["data"], &[]]);
    let w_spec = PartitionSpec::new(&[&[], &["model"]]);
    let y_spec = PartitionSpec::new(&[&["data"], &["model"]]);
    let sum_spec = PartitionSpec::new(&[&["data"]]);

    // y = x @ w split over both axes; sum(y, 1) makes XLA all-reduce over "model".
    let mut builder = Builder::with_mesh("main", mesh.clone());
    let x = builder.arg(TensorType::new(DType::F32, &[m, k]), Some(x_spec.clone()))?;
    let w = builder.arg(TensorType::new(DType::F32, &[k, n]), Some(w_spec.clone()))?;
    let y = builder.matmul(x, w)?;
    let row_sums = builder.reduce_sum(y, &[1])?;
    let program = builder.finish_sharded(&[(y, Some(y_spec.clone())), (row_sums, Some(sum_spec.clone()))])?;

    println!("self-test: x[{m},{k}] @ w[{k},{n}] and its row sums on mesh {mesh} (devices {device_ids:?})");
    let start = Instant::now();
    let executable = client.compile(&program, &CompileOptions::spmd(&mesh)).context("compiling the sharded matmul")?;
    let compile_ms = start.elapsed().as_secs_f64() * 1e3;

    let x_values: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 23) as f32 - 11.0) / 8.0).collect();
    let w_values: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 17) as f32 - 8.0) / 16.0).collect();
    let start = Instant::now();
    let xs = client.upload_sharded(&HostArray::from_slice(&[m, k], &x_values)?, &x_spec, &mesh)?;
    let ws = client.upload_sharded(&HostArray::from_slice(&[k, n], &w_values)?, &w_spec, &mesh)?;
    let outputs =
        executable.execute_sharded(&mesh, &[&xs, &ws], &[y_spec, sum_spec]).context("running the sharded matmul")?;
    let y_values: Vec<f32> = outputs[0].to_host()?.to_vec()?;
    let sums: Vec<f32> = outputs[1].to_host()?.to_vec()?;
    let run_ms = start.elapsed().as_secs_f64() * 1e3;

    let mut expected = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            expected[i * n + j] = (0..k).map(|l| x_values[i * k + l] * w_values[l * n + j]).sum();
        }
    }
    let expected_sums: Vec<f32> = expected.chunks(n).map(|row| row.iter().sum()).collect();
    let max_error = |got: &[f32], want: &[f32]| {
        got.iter().zip(want).map(|(g, w)| (g - w).abs() / w.abs().max(1.0)).fold(0f32, f32::max)
    };
    let (y_error, sum_error) = (max_error(&y_values, &expected), max_error(&sums, &expected_sums));
    ensure!(y_values.len() == expected.len() && sums.len() == expected_sums.len(), "wrong output sizes");
    ensure!(y_error <= 1e-4, "sharded matmul differs from plain Rust: max relative error {y_error:e}");
    ensure!(sum_error <= 1e-4, "all-reduced row sums differ from plain Rust: max relative error {sum_error:e}");

    let stats = executable.compiled_memory_stats().ok();
    println!("  compile {compile_ms:.1} ms, upload+run+download {run_ms:.1} ms");
    if let Some(stats) = stats {
        println!(
            "  per device: arguments {} B, outputs {} B, temporaries {} B",
            stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.temp_size_in_bytes
        );
    }
    println!("  max relative error vs plain Rust: matmul {y_error:.1e}, row sums {sum_error:.1e}");
    println!("ok: the sharded matmul on {} devices matches plain Rust", device_ids.len());
    Ok(())
}
