//! Compiling for a TPU slice on this CPU-only machine: libtpu's topology description and
//! `PJRT_Compile` without a client (deviceless AOT). Needs libtpu: `scripts/test.sh` fetches
//! the pinned one into siphon's cache (`scripts/setup-libtpu.sh`) and names it in
//! `SIPHON_TEST_LIBTPU_PLUGIN`; without it this test fails, naming the command.

use siphon_mesh::Mesh;
use siphon_runtime::{CompileOptions, Error, OptionValue, Plugin, PluginLocator, Topology};

fn libtpu() -> std::path::PathBuf {
    let locator = PluginLocator::new().explicit(std::env::var_os("SIPHON_TEST_LIBTPU_PLUGIN"));
    match locator.locate_libtpu() {
        Ok(choice) => choice.path,
        Err(e) => panic!("{e} (scripts/setup-libtpu.sh fetches it; scripts/test.sh runs it)"),
    }
}

fn v5e_options() -> Vec<(String, OptionValue)> {
    siphon_runtime::tpu_topology_options("default", [2, 2, 1], 1, [false; 3])
}

/// One test, so that the environment is set before any other thread of this binary runs.
#[test]
fn libtpu_compiles_for_a_slice_without_a_tpu() {
    // SAFETY: the only test of this binary; no other thread reads the environment yet.
    unsafe {
        std::env::set_var("TPU_SKIP_MDS_QUERY", "1");
        // Other test binaries may hold libtpu's machine-wide lock; no TPU is used here.
        std::env::set_var("ALLOW_MULTIPLE_LIBTPU_LOAD", "1");
    }
    let plugin = Plugin::load_for_compiling(libtpu()).unwrap();

    // v5e-16: 4 hosts of 4 chips.
    let topology = Topology::new(&plugin, "v5e:4x4", &v5e_options()).unwrap();
    assert_eq!(topology.platform_name(), "tpu");
    let devices = topology.devices_by_host();
    assert_eq!(devices.len(), 16);
    for host in 0..4 {
        assert_eq!(devices[host * 4..host * 4 + 4].iter().filter(|d| d.process_index == host).count(), 4);
    }
    assert!(devices[0].kind.contains("TPU"), "{}", devices[0].kind);

    // x[64, 256] split by rows over data, w[256, 512] by columns over model: per device
    // 16 × 256 + 256 × 128 f32 arguments, and 16 × 128 f32 out.
    let mesh = Mesh::new(&[("data", 4), ("model", 4)], devices.iter().map(|d| d.id).collect()).unwrap();
    let program = r#"
sdy.mesh @mesh = <["data"=4, "model"=4]>
func.func @main(%x: tensor<64x256xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>},
                %w: tensor<256x512xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}]>})
    -> (tensor<64x512xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {"model"}]>}) {
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<64x256xf32>, tensor<256x512xf32>) -> tensor<64x512xf32>
  return %y : tensor<64x512xf32>
}"#;
    let compiled = topology.compile(program, &CompileOptions::spmd(&mesh)).unwrap();
    let stats = compiled.memory_stats().unwrap();
    assert_eq!(stats.argument_size_in_bytes, (16 * 256 + 256 * 128) * 4);
    assert_eq!(stats.output_size_in_bytes, 16 * 128 * 4);
    assert!(stats.generated_code_size_in_bytes > 0);
    let flops = compiled.cost("flops").unwrap().expect("libtpu reports flops");
    // One device's product: 2 · 16 · 256 · 128.
    let expected = 2.0 * 16.0 * 256.0 * 128.0;
    assert!((flops - expected).abs() / expected < 0.05, "flops {flops}, expected {expected}");

    // Options naming a device the topology lacks are refused before XLA sees them.
    let mut wrong = CompileOptions::spmd(&mesh);
    wrong.device_assignment = Some(vec![(100..116).collect()]);
    let err = topology.compile(program, &wrong).unwrap_err();
    assert!(matches!(err, Error::InvalidCompileOptions(_)), "{err}");
    assert!(err.to_string().contains("topology v5e:4x4"), "{err}");

    // libtpu's own refusals come back as errors naming the call.
    let err = Topology::new(&plugin, "v5e:3x3", &v5e_options()).unwrap_err();
    assert!(err.to_string().contains("PJRT_TopologyDescription_Create"), "{err}");
    let err = topology.compile("func.func @main(%x: tensor<2xf32>) -> tensor<3xf32> {", &CompileOptions::spmd(&mesh));
    assert!(err.is_err());
}
