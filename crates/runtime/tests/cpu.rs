//! The runtime against the pinned XLA CPU plugin with 8 virtual devices.
//!
//! The plugin path comes from `SIPHON_PJRT_PLUGIN` (set by scripts/test.sh), else siphon's
//! cache directory; run `scripts/install-plugin.sh` first when neither has it.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use half::{bf16, f16};
use siphon_mesh::{Mesh, PartitionSpec};
use siphon_runtime::{
    Buffer, Client, ClientOptions, CompileOptions, ElementType, Error, Executable, HostArray, KeyValueStore, Plugin,
    PluginLocator, ShardedArray, XlaOption,
};

fn plugin() -> Arc<Plugin> {
    static PLUGIN: OnceLock<Arc<Plugin>> = OnceLock::new();
    PLUGIN
        .get_or_init(|| {
            let path = std::env::var_os("SIPHON_PJRT_PLUGIN")
                .map(std::path::PathBuf::from)
                .unwrap_or_else(siphon_runtime::default_cpu_plugin_path);
            assert!(
                path.is_file(),
                "no PJRT CPU plugin at {}: run scripts/install-plugin.sh (or set SIPHON_PJRT_PLUGIN)",
                path.display()
            );
            Plugin::load(&path).expect("load the CPU plugin")
        })
        .clone()
}

/// An 8-device client per test: a client kept in a static until the process exits races
/// XLA's own static destructors (seen once as an abort at exit), and one costs a few ms.
fn client() -> Client {
    Client::new(&plugin(), ClientOptions::new().cpu_device_count(8)).unwrap()
}

fn iota(n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) * scale).collect()
}

fn rust_matmul(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|l| x[i * k + l] * w[l * n + j]).sum();
        }
    }
    out
}

fn spec_text(spec: &PartitionSpec) -> String {
    let dims: Vec<String> = spec
        .dims()
        .iter()
        .map(|axes| {
            let names: Vec<String> = axes.iter().map(|a| format!("\"{a}\"")).collect();
            format!("{{{}}}", names.join(", "))
        })
        .collect();
    format!("#sdy.sharding<@mesh, [{}]>", dims.join(", "))
}

/// `x[m,k] @ w[k,n]`, with Shardy annotations when a mesh is given.
fn matmul_program(
    m: usize,
    k: usize,
    n: usize,
    sharding: Option<(&Mesh, &PartitionSpec, &PartitionSpec, &PartitionSpec)>,
) -> String {
    let (header, xs, ws, os) = match sharding {
        Some((mesh, x, w, out)) => {
            let axes: Vec<String> = mesh.axes().iter().map(|a| format!("\"{}\"={}", a.name, a.size)).collect();
            (
                format!("sdy.mesh @mesh = <[{}]>\n", axes.join(", ")),
                format!(" {{sdy.sharding = {}}}", spec_text(x)),
                format!(" {{sdy.sharding = {}}}", spec_text(w)),
                format!(" {{sdy.sharding = {}}}", spec_text(out)),
            )
        }
        None => Default::default(),
    };
    format!(
        "{header}func.func @main(%x: tensor<{m}x{k}xf32>{xs}, %w: tensor<{k}x{n}xf32>{ws}) -> (tensor<{m}x{n}xf32>{os}) {{
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<{m}x{k}xf32>, tensor<{k}x{n}xf32>) -> tensor<{m}x{n}xf32>
  return %y : tensor<{m}x{n}xf32>
}}\n"
    )
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{what}: element {i}: {g} vs {w}");
    }
}

/// Runs `x @ w` sharded over `mesh` with the given specs, and checks it against the same
/// program on one device and against plain Rust.
fn check_sharded_matmul(mesh: &Mesh, x_spec: PartitionSpec, w_spec: PartitionSpec, out_spec: PartitionSpec) {
    let (m, k, n) = (8, 16, 8);
    let client = client();
    let x = iota(m * k, 0.25);
    let w = iota(k * n, 0.5);
    let expected = rust_matmul(&x, &w, m, k, n);

    let x_host = HostArray::from_slice(&[m, k], &x).unwrap();
    let w_host = HostArray::from_slice(&[k, n], &w).unwrap();

    let program = matmul_program(m, k, n, Some((mesh, &x_spec, &w_spec, &out_spec)));
    let executable = client.compile(&program, &CompileOptions::spmd(mesh)).unwrap();
    assert_eq!(executable.device_ids().len(), mesh.num_devices());
    let xs = client.upload_sharded(&x_host, &x_spec, mesh).unwrap();
    let ws = client.upload_sharded(&w_host, &w_spec, mesh).unwrap();
    let outputs = executable.execute_sharded(mesh, &[&xs, &ws], std::slice::from_ref(&out_spec)).unwrap();
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0].shape(), &[m, n]);
    let sharded = outputs[0].to_host().unwrap().to_vec::<f32>().unwrap();

    let single = client.compile(&matmul_program(m, k, n, None), &CompileOptions::single_device(Some(0))).unwrap();
    let x0 = client.upload(&x_host, 0).unwrap();
    let w0 = client.upload(&w_host, 0).unwrap();
    let replicated = single.execute(&[vec![&x0, &w0]]).unwrap();
    let replicated = replicated[0][0].to_host().unwrap().to_vec::<f32>().unwrap();

    assert_close(&replicated, &expected, "single device vs Rust");
    assert_close(&sharded, &expected, "sharded vs Rust");
    assert_close(&sharded, &replicated, "sharded vs single device");
}

fn mesh_1d(axis: &str) -> Mesh {
    Mesh::new(&[(axis, 8)], (0..8).collect()).unwrap()
}

#[test]
fn batch_sharded_input_matches_replicated_and_rust() {
    let mesh = mesh_1d("data");
    check_sharded_matmul(
        &mesh,
        PartitionSpec::new(&[&["data"], &[]]),
        PartitionSpec::replicated(2),
        PartitionSpec::new(&[&["data"], &[]]),
    );
}

#[test]
fn column_sharded_weights_match_replicated_and_rust() {
    let mesh = mesh_1d("model");
    check_sharded_matmul(
        &mesh,
        PartitionSpec::replicated(2),
        PartitionSpec::new(&[&[], &["model"]]),
        PartitionSpec::new(&[&[], &["model"]]),
    );
}

#[test]
fn contracting_dimension_sharding_all_reduces() {
    let mesh = mesh_1d("model");
    check_sharded_matmul(
        &mesh,
        PartitionSpec::new(&[&[], &["model"]]),
        PartitionSpec::new(&[&["model"], &[]]),
        PartitionSpec::replicated(2),
    );
}

#[test]
fn two_by_four_mesh_matches_replicated_and_rust() {
    // Devices in a non-trivial order: partition p runs on device 7 - p.
    let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).rev().collect()).unwrap();
    check_sharded_matmul(
        &mesh,
        PartitionSpec::new(&[&["data"], &[]]),
        PartitionSpec::new(&[&[], &["model"]]),
        PartitionSpec::new(&[&["data"], &["model"]]),
    );
}

#[test]
fn devices_are_listed_with_ids_kinds_and_addressability() {
    let client = client();
    assert_eq!(client.platform_name(), "cpu");
    let devices = client.devices();
    assert_eq!(devices.len(), 8);
    let ids: Vec<usize> = devices.iter().map(|d| d.id).collect();
    assert_eq!(ids, (0..8).collect::<Vec<_>>());
    assert!(devices.iter().all(|d| d.addressable && d.process_index == 0 && !d.kind.is_empty()));
    assert_eq!(client.addressable_device_ids(), ids);
    assert!(client.device(99).is_err());
    let (major, minor) = client.plugin().api_version();
    assert_eq!(major, 0);
    assert!(minor >= 106, "pinned plugin has API 0.106, got 0.{minor}");
    assert!(client.plugin().attributes().iter().any(|(name, _)| name == "xla_version"));
}

fn round_trip(array: HostArray, device: usize) {
    let client = client();
    let buffer = client.upload(&array, device).unwrap();
    assert_eq!(buffer.device_id().unwrap(), device);
    assert_eq!(buffer.element_type().unwrap(), array.element_type());
    assert_eq!(buffer.dims().unwrap(), array.shape());
    assert!(buffer.on_device_size_in_bytes().unwrap() >= array.bytes().len());
    buffer.wait_ready().unwrap();
    assert_eq!(buffer.to_host().unwrap(), array);
}

#[test]
fn buffers_of_every_supported_type_round_trip() {
    let bf: Vec<bf16> = iota(24, 0.37).into_iter().map(bf16::from_f32).collect();
    round_trip(HostArray::from_slice(&[2, 3, 4], &bf).unwrap(), 3);
    let hf: Vec<f16> = iota(24, 0.37).into_iter().map(f16::from_f32).collect();
    round_trip(HostArray::from_slice(&[4, 6], &hf).unwrap(), 5);
    round_trip(HostArray::from_slice(&[5], &iota(5, 1.5)).unwrap(), 0);
    round_trip(HostArray::from_slice(&[3, 2], &[1i32, -2, 3, i32::MAX, i32::MIN, 0]).unwrap(), 1);
    round_trip(HostArray::from_slice(&[2], &[i64::MIN, 1 << 40]).unwrap(), 2);
    round_trip(HostArray::from_slice(&[4], &[0u8, 1, 254, 255]).unwrap(), 7);
    round_trip(HostArray::from_bytes(ElementType::Pred, &[3], vec![1, 0, 1]).unwrap(), 6);
    round_trip(HostArray::from_slice::<f32>(&[0, 4], &[]).unwrap(), 4);
}

#[test]
fn bf16_compute_matches_rust() {
    let client = client();
    let program = "func.func @main(%x: tensor<4xbf16>) -> tensor<4xf32> {
  %y = stablehlo.multiply %x, %x : tensor<4xbf16>
  %z = stablehlo.convert %y : (tensor<4xbf16>) -> tensor<4xf32>
  return %z : tensor<4xf32>
}";
    let executable = client.compile(program, &CompileOptions::default()).unwrap();
    let x: Vec<bf16> = [1.5f32, -2.0, 3.25, 0.5].into_iter().map(bf16::from_f32).collect();
    let buffer = client.upload(&HostArray::from_slice(&[4], &x).unwrap(), 0).unwrap();
    let out = executable.execute(&[vec![&buffer]]).unwrap();
    let got = out[0][0].to_host().unwrap().to_vec::<f32>().unwrap();
    let want: Vec<f32> = x.iter().map(|v| bf16::from_f32(v.to_f32() * v.to_f32()).to_f32()).collect();
    assert_eq!(got, want);
}

#[test]
fn malformed_stablehlo_is_an_error_not_a_crash() {
    let client = client();
    let err = client.compile("func.func @main( this is not mlir", &CompileOptions::default()).unwrap_err();
    match &err {
        Error::Pjrt { function, message, .. } => {
            assert_eq!(*function, "PJRT_Client_Compile");
            assert!(!message.is_empty());
        }
        other => panic!("expected a PJRT error, got {other:?}"),
    }
    // A type error inside a well-formed module.
    let err = client
        .compile(
            "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = stablehlo.add %x, %x : tensor<5xf32>
  return %y : tensor<4xf32>
}",
            &CompileOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(err, Error::Pjrt { .. }), "{err:?}");
    assert!(matches!(client.compile("  \n", &CompileOptions::default()), Err(Error::InvalidArgument(_))));
    // Shardy annotations without the Shardy flag: a clean compile error.
    let mesh = mesh_1d("data");
    let spec = PartitionSpec::new(&[&["data"], &[]]);
    let program = matmul_program(8, 16, 8, Some((&mesh, &spec, &PartitionSpec::replicated(2), &spec)));
    let mut options = CompileOptions::spmd(&mesh);
    options.use_shardy_partitioner = false;
    assert!(matches!(client.compile(&program, &options), Err(Error::Pjrt { .. })));
}

#[test]
fn bad_compile_options_are_rejected_before_xla() {
    let client = client();
    let program = matmul_program(8, 16, 8, None);
    let bad = |options: CompileOptions| {
        let err = client.compile(&program, &options).unwrap_err();
        assert!(matches!(err, Error::InvalidCompileOptions(_)), "{options:?}: {err:?}");
        err.to_string()
    };
    let base = CompileOptions::default();
    assert!(bad(CompileOptions { num_partitions: 0, ..base.clone() }).contains("num_partitions"));
    assert!(bad(CompileOptions { num_replicas: 0, ..base.clone() }).contains("num_replicas"));
    let spmd = CompileOptions {
        num_partitions: 2,
        use_spmd_partitioning: true,
        device_assignment: Some(vec![vec![0, 99]]),
        ..base.clone()
    };
    assert!(bad(spmd.clone()).contains("99"));
    bad(CompileOptions { device_assignment: Some(vec![vec![3, 3]]), ..spmd.clone() });
    bad(CompileOptions { device_assignment: Some(vec![vec![0, 1, 2]]), ..spmd.clone() });
    bad(CompileOptions { device_assignment: Some(vec![]), ..spmd.clone() });
    bad(CompileOptions { use_spmd_partitioning: false, device_assignment: None, ..spmd.clone() });
    bad(CompileOptions { num_partitions: 9, device_assignment: None, ..spmd.clone() });
    bad(CompileOptions { use_shardy_partitioner: true, ..base.clone() });
}

/// XLA options travel to the compiler by name: one XLA does not know is refused by name, and
/// valid ones compile (siphon's CPU defaults among them).
#[test]
fn xla_options_reach_the_compiler() {
    let client = client();
    let program = matmul_program(8, 16, 8, None);
    let mut options = CompileOptions {
        xla_options: vec![("xla_cpu_no_such_option".into(), XlaOption::Bool(true))],
        ..CompileOptions::default()
    };
    let err = client.compile(&program, &options).unwrap_err().to_string();
    assert!(err.contains("xla_cpu_no_such_option"), "{err}");
    options.xla_options = vec![
        ("xla_cpu_prefer_vector_width".into(), XlaOption::Int(256)),
        ("xla_cpu_enable_fast_math".into(), XlaOption::Bool(false)),
    ];
    client.compile(&program, &options).unwrap();
}

#[test]
fn execute_checks_argument_lists_and_devices() {
    let client = client();
    let program = matmul_program(2, 2, 2, None);
    let executable = client.compile(&program, &CompileOptions::single_device(Some(2))).unwrap();
    assert_eq!(executable.device_ids(), &[2]);
    let a = HostArray::from_slice(&[2, 2], &[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let on2 = client.upload(&a, 2).unwrap();
    let on3 = client.upload(&a, 3).unwrap();
    assert!(matches!(executable.execute(&[vec![&on2, &on3]]), Err(Error::InvalidArgument(_))));
    assert!(matches!(executable.execute(&[]), Err(Error::InvalidArgument(_))));
    assert!(matches!(executable.execute(&[vec![&on2]]), Err(Error::InvalidArgument(_))));
    // Same byte size, other shape or element type: XLA alone would reinterpret the bytes.
    for wrong in [
        HostArray::from_slice(&[4], &[1.0f32; 4]).unwrap(),
        HostArray::from_slice(&[2, 2], &[1i32; 4]).unwrap(),
        HostArray::from_slice(&[3], &[1.0f32; 3]).unwrap(),
    ] {
        let wrong = client.upload(&wrong, 2).unwrap();
        let err = executable.execute(&[vec![&on2, &wrong]]).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    }
    // A parameter the signature reader leaves unchecked (a GSPMD string) still gets XLA's own
    // count and byte-size checks, as errors.
    let gspmd = program.replace("%w: tensor<2x2xf32>", "%w: tensor<2x2xf32> {mhlo.sharding = \"{replicated}\"}");
    assert_ne!(gspmd, program);
    let unchecked = client.compile(&gspmd, &CompileOptions::single_device(Some(2))).unwrap();
    let wrong = client.upload(&HostArray::from_slice(&[3], &[1.0f32; 3]).unwrap(), 2).unwrap();
    let err = unchecked.execute(&[vec![&on2, &wrong]]).unwrap_err();
    assert!(matches!(err, Error::Pjrt { .. }), "{err:?}");
    let out = executable.execute(&[vec![&on2, &on2]]).unwrap();
    assert_eq!(out[0][0].device_id().unwrap(), 2);
    assert_eq!(out[0][0].to_host().unwrap().to_vec::<f32>().unwrap(), vec![7.0, 10.0, 15.0, 22.0]);
    // Uploads validate sizes and devices.
    assert!(matches!(client.upload_bytes(ElementType::F32, &[3], &[0u8; 8], 0), Err(Error::InvalidArgument(_))));
    assert!(matches!(client.upload(&a, 8), Err(Error::BadDevice { id: 8, .. })));
}

#[test]
fn compiled_memory_stats_and_device_sizes() {
    let client = client();
    let mesh = mesh_1d("data");
    let spec = PartitionSpec::new(&[&["data"], &[]]);
    let program = matmul_program(8, 16, 8, Some((&mesh, &spec, &PartitionSpec::replicated(2), &spec)));
    let executable: Executable = client.compile(&program, &CompileOptions::spmd(&mesh)).unwrap();
    // Output types are per device: the [8, 8] result split 8 ways by rows.
    assert_eq!(executable.output_types().unwrap(), vec![(ElementType::F32, vec![1, 8])]);
    let stats = executable.compiled_memory_stats().unwrap();
    // Per device: x shard 1x16 f32 + w 16x8 f32; output 1x8 f32.
    assert_eq!(stats.argument_size_in_bytes, (16 + 16 * 8) * 4);
    assert_eq!(stats.output_size_in_bytes, 8 * 4);
    let x = HostArray::from_slice(&[8, 16], &iota(128, 1.0)).unwrap();
    let sharded: ShardedArray = client.upload_sharded(&x, &spec, &mesh).unwrap();
    assert_eq!(sharded.on_device_size_in_bytes().unwrap(), 8 * 16 * 4);
    assert_eq!(sharded.to_host().unwrap(), x);
}

/// Two processes' shares of a 2×4 mesh (partitions 0..4 and 4..8): each uploads only its
/// partitions, the merged array is the whole, and each reads back the rows of its data
/// group from its own partitions only.
#[test]
fn per_process_shares_upload_merge_and_read_back_their_rows() {
    let client = client();
    let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
    let spec = PartitionSpec::new(&[&["data"], &["model"]]);
    let x = HostArray::from_slice(&[4, 8], &iota(32, 1.0)).unwrap();
    let halves: Vec<ShardedArray> =
        [0..4, 4..8].into_iter().map(|p| client.upload_partitions(&x, &spec, &mesh, p.collect()).unwrap()).collect();
    assert_eq!(halves[1].partitions(), [4, 5, 6, 7]);
    assert_eq!(halves[1].buffers()[0].device_id().unwrap(), 4);
    // Process 1 holds rows 2..4 only.
    let rows = halves[1].rows_to_host(std::slice::from_ref(&(2..4)), &[4, 5, 6, 7]).unwrap();
    assert_eq!(rows.shape(), [2, 8]);
    assert_eq!(rows.to_vec::<f32>().unwrap(), iota(32, 1.0)[16..].to_vec());
    let err = halves[1].rows_to_host(std::slice::from_ref(&(1..3)), &[4, 5, 6, 7]).unwrap_err();
    assert!(err.to_string().contains("of partitions [4, 5, 6, 7]"), "{err}");
    assert!(halves[1].rows_to_host(std::slice::from_ref(&(2..4)), &[3]).is_err());
    assert!(halves[0].to_host().is_err());
    let whole = ShardedArray::merge(halves).unwrap();
    assert!(whole.is_complete());
    assert_eq!(whole.to_host().unwrap(), x);
    assert_eq!(
        whole.rows_to_host(&[0..1, 3..4], &(0..8).collect::<Vec<_>>()).unwrap().to_vec::<f32>().unwrap()[8..],
        iota(32, 1.0)[24..]
    );
    assert!(client.upload_partitions(&x, &spec, &mesh, vec![3, 2]).is_err());
}

/// Copies into reused host buffers: rows split over `data` land straight in their places,
/// replicated and column-split arrays through the assembling path, a wrong size is refused.
#[test]
fn rows_copy_into_reused_host_buffers() {
    let client = client();
    let mesh = Mesh::new(&[("data", 4), ("model", 2)], (0..8).collect()).unwrap();
    let x = HostArray::from_slice(&[8, 6], &iota(48, 1.0)).unwrap();
    let all: Vec<usize> = (0..8).collect();
    let mut buffer = client.host_buffer(48 * 4).unwrap();
    // The CPU plugin has no DMA mapping: plain memory.
    assert!(!buffer.is_pinned());
    assert_eq!(buffer.len(), 192);
    for spec in [
        PartitionSpec::new(&[&["data"], &[]]),
        PartitionSpec::replicated(2),
        PartitionSpec::new(&[&["data"], &["model"]]),
    ] {
        let sharded = client.upload_sharded(&x, &spec, &mesh).unwrap();
        buffer.as_mut_slice().fill(0xff);
        sharded.rows_into(std::slice::from_ref(&(0..8)), &all, buffer.as_mut_slice()).unwrap().wait().unwrap();
        assert_eq!(buffer.as_slice(), x.bytes(), "{spec}");
        // Some rows, in the order asked, into a smaller buffer (reused twice).
        let mut part = client.host_buffer(3 * 6 * 4).unwrap();
        for _ in 0..2 {
            part.as_mut_slice().fill(0);
            sharded.rows_into(&[6..8, 2..3], &all, part.as_mut_slice()).unwrap().wait().unwrap();
            let want: Vec<u8> = [&x.bytes()[6 * 24..8 * 24], &x.bytes()[2 * 24..3 * 24]].concat();
            assert_eq!(part.as_slice(), want, "{spec}");
        }
        let err = sharded.rows_into(std::slice::from_ref(&(0..8)), &all, part.as_mut_slice()).err().unwrap();
        assert!(err.to_string().contains("72-byte destination for 8 rows of 24 bytes"), "{err}");
    }
    // One buffer, straight.
    let one = client.upload(&x, 3).unwrap();
    buffer.as_mut_slice().fill(0);
    one.to_host_into(buffer.as_mut_slice()).unwrap().wait().unwrap();
    assert_eq!(buffer.as_slice(), x.bytes());
    assert!(one.to_host_into(&mut [0u8; 4]).is_err());
}

#[test]
fn sharded_helpers_reject_mismatches() {
    let client = client();
    let mesh = mesh_1d("data");
    let x = HostArray::from_slice(&[6, 2], &[0.0f32; 12]).unwrap();
    // 6 rows do not split 8 ways.
    assert!(matches!(client.upload_sharded(&x, &PartitionSpec::new(&[&["data"], &[]]), &mesh), Err(Error::Mesh(_))));
    let buffers: Vec<Buffer> = (0..7).map(|d| client.upload(&x, d).unwrap()).collect();
    assert!(ShardedArray::from_buffers(buffers, &[6, 2], &PartitionSpec::replicated(2), &mesh).is_err());
}

struct MemoryStore(Mutex<std::collections::HashMap<String, Vec<u8>>>);

impl KeyValueStore for MemoryStore {
    fn get(&self, key: &str, _timeout: Duration) -> Result<Option<Vec<u8>>, String> {
        Ok(self.0.lock().unwrap().get(key).cloned())
    }
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        Ok(self.0.lock().unwrap().get(key).cloned())
    }
    fn put(&self, key: &str, value: &[u8]) -> Result<(), String> {
        self.0.lock().unwrap().insert(key.to_string(), value.to_vec());
        Ok(())
    }
}

#[test]
fn client_with_key_value_store_and_options() {
    let store = Arc::new(MemoryStore(Mutex::new(Default::default())));
    let options = ClientOptions::new().cpu_device_count(2).key_value_store(store);
    let client = Client::new(&plugin(), options).unwrap();
    assert_eq!(client.devices().len(), 2);
    let err = Client::new(&plugin(), ClientOptions::new().cpu_device_count(0)).unwrap_err();
    assert!(matches!(err, Error::InvalidOption { .. }), "{err:?}");
}

#[test]
fn missing_or_non_pjrt_plugin_paths_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.so");
    let err = Plugin::load(&missing).unwrap_err();
    assert!(matches!(err, Error::PluginNotFound { .. }));
    assert!(err.to_string().contains("nope.so"), "{err}");

    let text = dir.path().join("text.so");
    std::fs::write(&text, "not a library").unwrap();
    let err = Plugin::load(&text).unwrap_err();
    assert!(matches!(err, Error::NotSharedLibrary { .. }), "{err:?}");
    assert!(err.to_string().contains("text.so"));
    assert!(matches!(Plugin::load(dir.path()), Err(Error::NotSharedLibrary { .. })));

    // A real shared library that is not a PJRT plugin: one this process already loaded.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let libc = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| path.contains("libc.so") || path.contains("libgcc_s"))
        .expect("a system shared library in /proc/self/maps");
    let err = Plugin::load(libc).unwrap_err();
    assert!(matches!(err, Error::NotPjrtPlugin { .. }), "{err:?}");
    assert!(err.to_string().contains("GetPjrtApi"));

    let err = PluginLocator::new().explicit(Some(&missing)).locate().unwrap_err();
    assert!(matches!(err, Error::ConfiguredPluginMissing { from: "--plugin", .. }), "{err:?}");
}

#[test]
fn same_plugin_path_loads_once() {
    let a = plugin();
    let b = Plugin::load(a.path()).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
}

#[test]
fn handles_are_send_and_sync() {
    fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<Plugin>();
    is_send_sync::<Client>();
    is_send_sync::<Buffer>();
    is_send_sync::<Executable>();
    is_send_sync::<ShardedArray>();
    is_send_sync::<Error>();
    // And they really work from other threads.
    let client = client();
    let buffer = client.upload(&HostArray::from_slice(&[2], &[1.0f32, 2.0]).unwrap(), 1).unwrap();
    let handle = std::thread::spawn(move || buffer.to_host().unwrap().to_vec::<f32>().unwrap());
    assert_eq!(handle.join().unwrap(), vec![1.0, 2.0]);
    // One executable run from several threads at once (PJRT executables are thread-safe).
    let executable =
        Arc::new(client.compile(&matmul_program(2, 2, 2, None), &CompileOptions::single_device(Some(0))).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (client, executable) = (client.clone(), executable.clone());
            std::thread::spawn(move || {
                let v = t as f32;
                let a = client.upload(&HostArray::from_slice(&[2, 2], &[v, 0.0, 0.0, v]).unwrap(), 0).unwrap();
                let out = executable.execute(&[vec![&a, &a]]).unwrap();
                out[0][0].to_host().unwrap().to_vec::<f32>().unwrap()
            })
        })
        .collect();
    for (t, thread) in threads.into_iter().enumerate() {
        let v = t as f32;
        assert_eq!(thread.join().unwrap(), vec![v * v, 0.0, 0.0, v * v]);
    }
}

#[test]
fn partial_sharded_arrays_assemble_what_they_hold() {
    let client = client();
    let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
    let values = iota(4 * 8, 1.0);
    let full = HostArray::from_slice(&[4, 8], &values).unwrap();
    // Columns split over "model", replicated over "data": partitions 0..4 (data=0) hold it all.
    let spec = PartitionSpec::new(&[&[], &["model"]]);
    let shards = spec.split(full.bytes(), 4, &[4, 8], &mesh).unwrap();
    let upload = |partitions: &[usize]| -> Vec<Buffer> {
        partitions.iter().map(|&p| client.upload_bytes(ElementType::F32, &[4, 2], &shards[p], p).unwrap()).collect()
    };
    let first_half =
        ShardedArray::from_local_buffers(upload(&[0, 1, 2, 3]), vec![0, 1, 2, 3], &[4, 8], &spec, &mesh).unwrap();
    assert!(!first_half.is_complete());
    assert_eq!(first_half.to_host().unwrap(), full);
    // Partitions 0, 1, 5: column blocks 0, 1 (twice); blocks 2 and 3 live elsewhere.
    let partial = ShardedArray::from_local_buffers(upload(&[0, 1, 5]), vec![0, 1, 5], &[4, 8], &spec, &mesh).unwrap();
    assert!(matches!(partial.to_host(), Err(Error::InvalidArgument(_))));
    let local = partial.local_shards_to_host().unwrap();
    assert_eq!(local.iter().map(|s| s.partition).collect::<Vec<_>>(), vec![0, 1, 5]);
    assert_eq!(local[2].ranges, vec![0..4, 2..4]);
    let block: Vec<f32> = (0..4).flat_map(|r| values[r * 8 + 2..r * 8 + 4].to_vec()).collect();
    assert_eq!(local[2].array.to_vec::<f32>().unwrap(), block);
    // Partitions must be ascending and match the buffers.
    assert!(ShardedArray::from_local_buffers(upload(&[1, 0]), vec![1, 0], &[4, 8], &spec, &mesh).is_err());
    assert!(ShardedArray::from_local_buffers(upload(&[0]), vec![1], &[4, 8], &spec, &mesh).is_err());
}

/// Exact GELU (GPT-NeoX/Pythia's `gelu`) needs `erf`, which StableHLO lacks; `chlo.erf` is
/// what JAX emits for it, and the plugin lowers it.
#[test]
fn chlo_erf_compiles_and_matches_libm() {
    let client = client();
    let program = "func.func @main(%x: tensor<5xf32>) -> tensor<5xf32> {
  %y = chlo.erf %x : tensor<5xf32> -> tensor<5xf32>
  return %y : tensor<5xf32>
}";
    let executable = client.compile(program, &CompileOptions::default()).unwrap();
    let x = [-3.0f32, -0.5, 0.0, 0.25, 1.5];
    let buffer = client.upload(&HostArray::from_slice(&[5], &x).unwrap(), 0).unwrap();
    let out = executable.execute(&[vec![&buffer]]).unwrap();
    let got = out[0][0].to_host().unwrap().to_vec::<f32>().unwrap();
    // erf to 10 digits (DLMF 7.2 tables).
    let want = [-0.999_977_9f32, -0.520_499_9, 0.0, 0.276_326_4, 0.966_105_1];
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 2e-7, "erf: got {got:?}, want {want:?}");
    }
}

#[test]
fn device_memory_limits_are_asked_without_error() {
    // The CPU plugin's devices are the host's memory: it reports no limit (a GPU's plugin
    // reports its allocator's); asking must not fail either way.
    let client = client();
    for id in client.addressable_device_ids() {
        let limit = client.device_memory_limit(id).unwrap();
        assert!(limit.is_none_or(|bytes| bytes > 1 << 20), "{limit:?}");
    }
}
