//! Compiling for devices this machine does not have: a plugin's description of a topology
//! (`PJRT_TopologyDescription`) and programs compiled for it (`PJRT_Compile`, no client).
//!
//! libtpu describes any TPU slice by name (`v5e:8x8`, `v5:4x4x4`) with its create options
//! (`chip_config_name`, `chips_per_host_bounds`, `num_slices`, `wrap`) and compiles for it on a
//! machine without a TPU: the compiler's own per-device memory and cost figures for the exact
//! program, before any slice is reserved. No client is created (a libtpu client needs a TPU).

use std::ffi::c_char;
use std::sync::Arc;

use crate::client::describe;
use crate::compile::{CompiledMemoryStats, memory_stats, mlir_program};
use crate::compile_options::CompileOptions;
use crate::error::{Error, Result};
use crate::ffi::{self, slot};
use crate::named::{OptionValue, named_values};
use crate::optimized::HloInstruction;
use crate::plugin::{AttributeValue, Plugin, read_named_value, string_from};
use crate::proto;

/// libtpu's create options for a slice (what JAX's `get_topology_desc` passes): the chip
/// configuration (`default`, or `megacore` where a chip's two cores are one device), the chips
/// of a host along each axis, how many slices, and which axes wrap around.
pub fn tpu_topology_options(
    chip_config: &str,
    chips_per_host_bounds: [usize; 3],
    num_slices: usize,
    wrap: [bool; 3],
) -> Vec<(String, OptionValue)> {
    vec![
        ("chip_config_name".to_string(), OptionValue::String(chip_config.to_string())),
        (
            "chips_per_host_bounds".to_string(),
            OptionValue::Int64List(chips_per_host_bounds.iter().map(|&b| b as i64).collect()),
        ),
        ("num_slices".to_string(), OptionValue::Int64(num_slices as i64)),
        ("wrap".to_string(), OptionValue::Int64List(wrap.iter().map(|&w| i64::from(w)).collect())),
    ]
}

/// One device of a [`Topology`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyDevice {
    /// The global device id, as device assignments name it.
    pub id: usize,
    /// The host (process) the device belongs to.
    pub process_index: usize,
    /// The device's kind, e.g. `TPU v5 lite`.
    pub kind: String,
}

/// A plugin's description of a set of devices, possibly none of them on this machine. Freed
/// on drop; keeps its plugin loaded.
pub struct Topology {
    plugin: Arc<Plugin>,
    raw: *mut ffi::PJRT_TopologyDescription,
    name: String,
    platform_name: String,
    devices: Vec<TopologyDevice>,
}

// SAFETY: a topology description is immutable once created and PJRT functions may be called
// from any thread; the device list is plain data.
unsafe impl Send for Topology {}
// SAFETY: see `Send`; `&Topology` only reads.
unsafe impl Sync for Topology {}

impl Drop for Topology {
    fn drop(&mut self) {
        let mut args: ffi::PJRT_TopologyDescription_Destroy_Args = ffi::zeroed();
        args.topology = self.raw;
        // SAFETY: the topology is live and destroyed once.
        if let Err(err) = unsafe { self.plugin.call(slot::TopologyDescription_Destroy, &mut args) } {
            tracing::warn!("failed to destroy PJRT topology {}: {err}", self.name);
        }
    }
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topology")
            .field("name", &self.name)
            .field("platform", &self.platform_name)
            .field("devices", &self.devices.len())
            .finish()
    }
}

impl Topology {
    /// The topology `name` with the plugin's create `options`
    /// (`PJRT_TopologyDescription_Create`), and its devices.
    pub fn new(plugin: &Arc<Plugin>, name: &str, options: &[(String, OptionValue)]) -> Result<Topology> {
        let named = named_values(options)?;
        let mut args: ffi::PJRT_TopologyDescription_Create_Args = ffi::zeroed();
        args.topology_name = name.as_ptr() as *const c_char;
        args.topology_name_size = name.len();
        args.create_options = named.as_ptr();
        args.num_options = named.len();
        // SAFETY: the name and the options (which `named` points into) outlive the call.
        unsafe { plugin.call(slot::TopologyDescription_Create, &mut args) }?;
        if args.topology.is_null() {
            return Err(Error::Unexpected(format!("PJRT_TopologyDescription_Create returned no topology for {name}")));
        }
        let mut topology = Topology {
            plugin: plugin.clone(),
            raw: args.topology,
            name: name.to_string(),
            platform_name: String::new(),
            devices: Vec::new(),
        };
        // From here on, `topology`'s Drop destroys it on error.
        let mut platform: ffi::PJRT_TopologyDescription_PlatformName_Args = ffi::zeroed();
        platform.topology = topology.raw;
        // SAFETY: the topology is live; the name it returns lives as long as it.
        unsafe { plugin.call(slot::TopologyDescription_PlatformName, &mut platform) }?;
        // SAFETY: see above.
        topology.platform_name = unsafe { string_from(platform.platform_name, platform.platform_name_size) };
        topology.devices = topology.read_devices()?;
        Ok(topology)
    }

    fn read_devices(&self) -> Result<Vec<TopologyDevice>> {
        let plugin = &self.plugin;
        let mut args: ffi::PJRT_TopologyDescription_GetDeviceDescriptions_Args = ffi::zeroed();
        args.topology = self.raw;
        // SAFETY: the topology is live.
        unsafe { plugin.call(slot::TopologyDescription_GetDeviceDescriptions, &mut args) }?;
        if args.descriptions.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: the topology owns `num_descriptions` description pointers.
        let raws = unsafe { std::slice::from_raw_parts(args.descriptions, args.num_descriptions) };
        let mut devices = Vec::with_capacity(raws.len());
        for &description in raws {
            // SAFETY: the description belongs to the live topology.
            let (id, process_index, kind) = unsafe { describe(plugin, description) }?;
            devices.push(TopologyDevice { id, process_index, kind });
        }
        Ok(devices)
    }

    /// The name it was created with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The platform it describes (`tpu`).
    pub fn platform_name(&self) -> &str {
        &self.platform_name
    }

    /// Whether programs compiled for this topology may call siphon's CUDA kernels
    /// (`siphon-kernels`' grouped products): a CUDA topology whose plugin registered them
    /// (registering them on the first call, before any program is compiled), unless
    /// `SIPHON_CUDA_KERNELS=0` turns them off — as [`crate::Client::cuda_kernels`] decides
    /// for a client.
    pub fn cuda_kernels(&self) -> bool {
        self.platform_name.eq_ignore_ascii_case("cuda")
            && std::env::var("SIPHON_CUDA_KERNELS").map_or(true, |v| v != "0")
            && self.plugin.kernels(crate::kernels::Platform::Cuda)
    }

    /// Its devices, in the plugin's order.
    pub fn devices(&self) -> &[TopologyDevice] {
        &self.devices
    }

    /// Its devices host by host (process index, then id): the order siphon's planner numbers
    /// devices in (hosts major), so a weight-sharding group that fits a host stays in it.
    pub fn devices_by_host(&self) -> Vec<TopologyDevice> {
        let mut devices = self.devices.clone();
        devices.sort_by_key(|d| (d.process_index, d.id));
        devices
    }

    /// Compiles StableHLO for this topology (`PJRT_Compile` with no client). The options are
    /// checked against the topology's devices first, as [`crate::Client::compile`] checks
    /// them against a client's.
    pub fn compile(&self, program: &str, options: &CompileOptions) -> Result<CompiledProgram> {
        if program.trim().is_empty() {
            return Err(Error::InvalidArgument("the StableHLO program is empty".into()));
        }
        let devices: Vec<(usize, bool)> = self.devices.iter().map(|d| (d.id, true)).collect();
        let assignment = options.resolve_against(&devices, &format!("topology {}", self.name))?;
        let encoded = proto::compile_options(options, &assignment);
        let mut code = program.as_bytes().to_vec();
        let program = mlir_program(&mut code);
        let mut args: ffi::PJRT_Compile_Args = ffi::zeroed();
        args.topology = self.raw;
        args.program = &program;
        args.compile_options = encoded.as_ptr() as *const c_char;
        args.compile_options_size = encoded.len();
        // SAFETY: program, options and topology outlive the call; the options were validated
        // so that XLA's CHECKs on replica/partition counts hold.
        unsafe { self.plugin.call(slot::Compile, &mut args) }?;
        if args.executable.is_null() {
            return Err(Error::Unexpected("PJRT_Compile returned no executable".into()));
        }
        Ok(CompiledProgram { plugin: self.plugin.clone(), raw: args.executable })
    }
}

/// A program compiled for a [`Topology`] (`PJRT_Executable`): not loaded on any device, only
/// its figures read. Freed on drop.
pub struct CompiledProgram {
    plugin: Arc<Plugin>,
    raw: *mut ffi::PJRT_Executable,
}

// SAFETY: an unloaded executable is immutable; PJRT functions may be called from any thread.
unsafe impl Send for CompiledProgram {}
// SAFETY: see `Send`.
unsafe impl Sync for CompiledProgram {}

impl Drop for CompiledProgram {
    fn drop(&mut self) {
        let mut args: ffi::PJRT_Executable_Destroy_Args = ffi::zeroed();
        args.executable = self.raw as *mut _;
        // SAFETY: the executable is live and destroyed once.
        if let Err(err) = unsafe { self.plugin.call(slot::Executable_Destroy, &mut args) } {
            tracing::warn!("failed to destroy a compiled PJRT executable: {err}");
        }
    }
}

impl std::fmt::Debug for CompiledProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledProgram").finish_non_exhaustive()
    }
}

impl CompiledProgram {
    /// The compiler's memory figures for one device.
    pub fn memory_stats(&self) -> Result<CompiledMemoryStats> {
        memory_stats(&self.plugin, self.raw)
    }

    /// The compiler's cost analysis (`PJRT_Executable_GetCostAnalysis`) by property name, e.g.
    /// `flops` and `bytes accessed` per device. XLA counts a loop's body once, whatever its
    /// trip count. Empty where the plugin has no cost analysis (the CUDA plugin).
    pub fn cost_analysis(&self) -> Result<Vec<(String, AttributeValue)>> {
        let mut args: ffi::PJRT_Executable_GetCostAnalysis_Args = ffi::zeroed();
        args.executable = self.raw;
        // SAFETY: the executable is live.
        match unsafe { self.plugin.call(slot::Executable_GetCostAnalysis, &mut args) } {
            // The CUDA plugin has none ("GetCostAnalysis is not supported"): no figures.
            Err(e) if e.pjrt_code() == Some(crate::ErrorCode::Unimplemented) => return Ok(Vec::new()),
            other => other?,
        };
        if args.properties.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: the executable owns `num_properties` named values as long as it lives.
        let values = unsafe { std::slice::from_raw_parts(args.properties, args.num_properties) };
        // SAFETY: each value came from the plugin with consistent type tags and sizes.
        Ok(values.iter().map(|value| unsafe { read_named_value(value) }).collect())
    }

    /// The instructions of the program as the compiler left it (`PJRT_Executable_OptimizedProgram`):
    /// which custom calls it kept, under which op names, with which shapes.
    pub fn optimized_instructions(&self) -> Result<Vec<HloInstruction>> {
        let mut program: ffi::PJRT_Program = ffi::zeroed_plain();
        program.struct_size = std::mem::size_of::<ffi::PJRT_Program>();
        let mut args: ffi::PJRT_Executable_OptimizedProgram_Args = ffi::zeroed();
        args.executable = self.raw;
        args.program = &mut program;
        // SAFETY: the executable is live; a null `code` asks for the size and format only.
        unsafe { self.plugin.call(slot::Executable_OptimizedProgram, &mut args) }?;
        let mut code = vec![0u8; program.code_size];
        program.code = code.as_mut_ptr() as *mut c_char;
        // SAFETY: `code` holds `code_size` bytes, which the plugin fills.
        unsafe { self.plugin.call(slot::Executable_OptimizedProgram, &mut args) }?;
        // SAFETY: the format string lives as long as the executable.
        let format = unsafe { string_from(program.format, program.format_size) };
        crate::optimized::instructions(&code, &format)
    }

    /// One cost property as a number (`flops`, `bytes accessed`), if the plugin gives it.
    pub fn cost(&self, name: &str) -> Result<Option<f64>> {
        Ok(self.cost_analysis()?.into_iter().find(|(n, _)| n == name).and_then(|(_, value)| match value {
            AttributeValue::Float(v) => Some(f64::from(v)),
            AttributeValue::Int64(v) => Some(v as f64),
            _ => None,
        }))
    }
}
