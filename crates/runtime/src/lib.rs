//! A thin safe wrapper over the PJRT C API: load a plugin, compile StableHLO, move buffers,
//! execute — over one device or SPMD over a [`siphon_mesh::Mesh`].
//!
//! PJRT is XLA's plugin interface: libtpu on TPU, the CUDA plugin on GPU, the CPU plugin in
//! tests. This crate loads a plugin with `libloading`, mirrors the C structs it needs by hand
//! (`ffi`), and wraps each PJRT handle in an owning Rust type:
//!
//! - [`Plugin`]: the loaded library (once per process, never unloaded), its API version and
//!   attributes. [`PluginLocator`] finds one (`--plugin`, `SIPHON_PJRT_PLUGIN`, the cache
//!   directory, Python packages) and says why.
//! - [`Client`]: devices ([`DeviceInfo`]), uploads ([`Client::upload`]), compilation
//!   ([`Client::compile`] with [`CompileOptions`], encoded as `xla.CompileOptionsProto` here).
//! - [`Executable`]: [`Executable::execute`] over N devices (`[device][arg]` lists; argument
//!   element types and per-device shapes are checked against the program's `@main` signature,
//!   since XLA itself only checks byte sizes), [`Executable::output_types`],
//!   [`Executable::compiled_memory_stats`].
//! - [`Buffer`]: one array on one device; [`Buffer::to_host`] gives a [`HostArray`].
//! - [`ShardedArray`]: one buffer per mesh partition, split and assembled by a
//!   [`siphon_mesh::PartitionSpec`] ([`Client::upload_sharded`], [`Executable::execute_sharded`],
//!   [`ShardedArray::to_host`]). In a multi-process job it holds this process's partitions only
//!   ([`ShardedArray::partitions`], [`ShardedArray::local_shards_to_host`]).
//! - [`Client::upload_many`] / [`download_many`] start every copy before waiting on any.
//! - [`HostBuffer`] ([`Client::host_buffer`]): reused, page-aligned host memory, registered
//!   with the device for DMA where the plugin can, that copies land in
//!   ([`Buffer::to_host_into`], [`ShardedArray::rows_into`], each a [`Download`] to wait on).
//! - [`diagnose`]: when a plugin cannot start ([`Error::PluginStart`]), which platform it is
//!   for ([`PluginKind`]) and what this machine lacks for it (no TPU, no GPU, no driver).
//! - [`Topology`]: devices described by a plugin that this machine may not have (libtpu
//!   describes any TPU slice on a CPU-only machine); [`Topology::compile`] compiles for them
//!   with no client, and the [`CompiledProgram`] gives the compiler's per-device memory
//!   ([`CompiledProgram::memory_stats`]) and cost analysis. [`Plugin::load_for_compiling`]
//!   loads a plugin for that without asking for its devices.
//! - [`KeyValueStore`]: the callbacks a multi-host client (libtpu, CUDA) exchanges topology
//!   through; set with [`ClientOptions::key_value_store`].
//!
//! Invariants: every PJRT call goes through one path that sets `struct_size`, refuses
//! functions the plugin's table lacks, and turns a `PJRT_Error` into [`Error::Pjrt`]; every
//! handle is freed on drop, and children (buffers, executables) keep their client alive;
//! compile options are validated before XLA sees them, since XLA aborts the process on some
//! inconsistent ones. All calls block until PJRT's events complete; call them off an async
//! runtime.
//!
//! # Example
//!
//! ```no_run
//! use siphon_mesh::{Mesh, PartitionSpec};
//! use siphon_runtime::{Client, ClientOptions, CompileOptions, HostArray, Plugin, PluginLocator};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let choice = PluginLocator::new().locate()?;
//! println!("plugin {} ({})", choice.path.display(), choice.reason);
//! let plugin = Plugin::load(&choice.path)?;
//! let client = Client::new(&plugin, ClientOptions::new().cpu_device_count(8))?;
//!
//! // x[8,4] split by rows over a 2x4 mesh ("data" x "model"), doubled on every device.
//! let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect())?;
//! let spec = PartitionSpec::new(&[&["data"], &[]]);
//! let program = r#"
//! sdy.mesh @mesh = <["data"=2, "model"=4]>
//! func.func @main(%x: tensor<8x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>})
//!     -> (tensor<8x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}) {
//!   %y = stablehlo.add %x, %x : tensor<8x4xf32>
//!   return %y : tensor<8x4xf32>
//! }"#;
//! let executable = client.compile(program, &CompileOptions::spmd(&mesh))?;
//! let x = HostArray::from_slice(&[8, 4], &(0..32).map(|i| i as f32).collect::<Vec<_>>())?;
//! let x = client.upload_sharded(&x, &spec, &mesh)?;
//! let outputs = executable.execute_sharded(&mesh, &[&x], &[spec])?;
//! let y: Vec<f32> = outputs[0].to_host()?.to_vec()?;
//! assert_eq!(y[5], 10.0);
//! # Ok(())
//! # }
//! ```
//!
//! # Compiling for devices this machine lacks, and why a plugin does not start
//!
//! `topology.rs` compiles for devices this machine lacks: a plugin's `Topology`
//! (`PJRT_TopologyDescription_Create` with named create options; `tpu_topology_options` gives
//! libtpu's for a slice) lists its devices, and `Topology::compile` runs `PJRT_Compile` with no
//! client, so a `CompiledProgram` (an unloaded `PJRT_Executable`) gives only the compiler's memory
//! figures and cost analysis. libtpu does this for any TPU slice on a CPU-only machine
//! (`Plugin::load_for_compiling` skips the device check `Plugin::load` makes; no libtpu client is
//! ever created without a TPU). `PluginLocator::locate_libtpu` finds the libtpu to compile with
//! (`--plugin`, `SIPHON_PJRT_PLUGIN` when it names libtpu, the pinned one in siphon's cache, the
//! `libtpu` Python package). The CUDA plugin does the same for GPUs given a target description:
//! `gpu.rs` reads the descriptions the plugin file embeds (`GpuTargetConfig`: XLA's own
//! `GpuTargetConfigProto` text per device, handed back unchanged), `gpu_topology_options` makes
//! `hosts × GPUs` of one, and loading the plugin to compile preloads the driver library cuDNN
//! needs to check its graphs where the machine has none (the copy `setup-cuda-compiler.sh`
//! installs); `PluginLocator::locate_cuda_compiler` finds the plugin. `CompiledProgram::
//! optimized_instructions` reads the compiled program back (`PJRT_Executable_OptimizedProgram`,
//! the HLO proto walked by `optimized.rs`): each instruction's custom-call target, op name and
//! shapes. The CUDA plugin has no cost analysis (an empty one here).
//!
//! `diagnose.rs` names the likely cause when a plugin cannot start: the platform a plugin file is
//! for (`PluginKind`) and what this host lacks for it (TPU or NVIDIA device files, the driver
//! library, `CUDA_VISIBLE_DEVICES`); load, initialize and client-create failures carry it
//! (`Error::LoadFailed`, `Error::PluginStart`).
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod buffer;
mod client;
mod compile;
mod compile_options;
pub mod diagnose;
mod error;
mod ffi;
mod gpu;
mod host;
mod kernels;
mod locate;
mod named;
mod optimized;
mod plugin;
mod proto;
mod sharded;
mod signature;
mod topology;

pub use buffer::{Buffer, Download, ElementType, HostArray, NativeType, Upload, download_many};
pub use client::{Client, ClientOptions, DeviceInfo, KeyValueStore};
pub use compile::{CPU_DEFAULTS, CompiledMemoryStats, Executable};
pub use compile_options::{CompileOptions, XlaOption};
pub use diagnose::PluginKind;
pub use error::{Error, ErrorCode, Result};
pub use gpu::{GpuTargetConfig, gpu_topology_options};
pub use host::HostBuffer;
pub use locate::{
    CPU_PLUGIN_VERSION, CUDA_COMPILER_VERSION, LIBTPU_VERSION, LocatedPlugin, PLUGIN_ENV, PluginChoice, PluginLocator,
    PluginSource, cpu_plugin_path_in, cuda_compiler_path_in, default_cpu_plugin_path, libtpu_path_in, locate_plugin,
    siphon_cache_dir,
};
pub use named::OptionValue;
pub use optimized::HloInstruction;
pub use plugin::{AttributeValue, Plugin};
pub use sharded::{HostShard, ShardedArray};
pub use topology::{CompiledProgram, Topology, TopologyDevice, tpu_topology_options};

/// The PJRT C API version this crate's structs follow: `(major, minor)`.
pub const PJRT_API_VERSION: (i32, i32) = (ffi::PJRT_API_MAJOR, ffi::PJRT_API_MINOR);
