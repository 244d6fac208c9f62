//! Compiling StableHLO into executables, running them, and their memory statistics.

use std::ffi::c_char;
use std::sync::Arc;

use crate::buffer::{Buffer, ElementType};
use crate::client::{Client, ClientInner};
use crate::compile_options::{CompileOptions, XlaOption};
use crate::error::{Error, Result};
use crate::ffi::{self, slot};
use crate::plugin::Plugin;
use crate::proto;
use crate::signature::{ParamType, parameter_types};

/// XLA options siphon sets on the CPU plugin, each kept because it measured faster with every
/// golden unchanged (docs/BENCHMARKS.md, issue 27): the fusions XLA compiles itself (norms,
/// softmax, RoPE, activations) with 512-bit vectors where the CPU has them (an AVX2 CPU keeps
/// 256). Exact: vector width changes no operation, only how many lanes run it.
pub const CPU_DEFAULTS: &[(&str, i64)] = &[("xla_cpu_prefer_vector_width", 512)];

/// Sizes XLA reports for a compiled program, per device (`PJRT_Executable_GetCompiledMemoryStats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompiledMemoryStats {
    /// Generated code.
    pub generated_code_size_in_bytes: i64,
    /// Arguments.
    pub argument_size_in_bytes: i64,
    /// Outputs.
    pub output_size_in_bytes: i64,
    /// Output bytes aliased to arguments.
    pub alias_size_in_bytes: i64,
    /// Temporaries.
    pub temp_size_in_bytes: i64,
    /// Peak device memory, when the plugin reports it (0 otherwise).
    pub peak_memory_in_bytes: i64,
    /// Host-memory arguments.
    pub host_argument_size_in_bytes: i64,
    /// Host-memory outputs.
    pub host_output_size_in_bytes: i64,
    /// Host-memory temporaries.
    pub host_temp_size_in_bytes: i64,
}

/// A compiled program loaded on its devices. Freed on drop; keeps its client alive.
pub struct Executable {
    client: Arc<ClientInner>,
    raw: *mut ffi::PJRT_LoadedExecutable,
    num_outputs: usize,
    /// Addressable devices in execution order (the order of `execute`'s argument lists).
    device_ids: Vec<usize>,
    device_raws: Vec<*mut ffi::PJRT_Device>,
    options: CompileOptions,
    /// Per-device parameter types read from the program text, checked by `execute`.
    parameters: Option<Vec<Option<ParamType>>>,
}

// SAFETY: a PJRT loaded executable is thread-safe (XLA's PjRtLoadedExecutable may be executed
// concurrently from several threads); the stored device pointers are owned by the client.
unsafe impl Send for Executable {}
// SAFETY: see `Send`.
unsafe impl Sync for Executable {}

impl Drop for Executable {
    fn drop(&mut self) {
        let mut args: ffi::PJRT_Executable_Destroy_Args = ffi::zeroed();
        args.executable = self.raw as *mut _;
        // SAFETY: the executable is live and destroyed once.
        if let Err(err) = unsafe { self.client.plugin.call(slot::LoadedExecutable_Destroy, &mut args) } {
            tracing::warn!("failed to destroy PJRT executable: {err}");
        }
    }
}

impl std::fmt::Debug for Executable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executable")
            .field("num_outputs", &self.num_outputs)
            .field("device_ids", &self.device_ids)
            .finish()
    }
}

/// A `PJRT_Executable` (the unloaded view), destroyed on drop.
struct UnloadedView<'a> {
    client: &'a ClientInner,
    raw: *mut ffi::PJRT_Executable,
}

impl Drop for UnloadedView<'_> {
    fn drop(&mut self) {
        let mut args: ffi::PJRT_Executable_Destroy_Args = ffi::zeroed();
        args.executable = self.raw as *mut _;
        // SAFETY: the view is live and destroyed once.
        if let Err(err) = unsafe { self.client.plugin.call(slot::Executable_Destroy, &mut args) } {
            tracing::warn!("failed to destroy PJRT executable view: {err}");
        }
    }
}

impl Client {
    /// Compiles StableHLO (MLIR text or bytecode) with `options`.
    ///
    /// Options are validated first ([`Error::InvalidCompileOptions`]); parse and compile
    /// failures come back as [`Error::Pjrt`] with XLA's message.
    pub fn compile(&self, program: &str, options: &CompileOptions) -> Result<Executable> {
        self.compile_bytes(program.as_bytes(), options)
    }

    /// Compiles a StableHLO program given as bytes (text or portable bytecode).
    pub fn compile_bytes(&self, program: &[u8], options: &CompileOptions) -> Result<Executable> {
        let inner = &self.inner;
        if program.iter().all(|b| b.is_ascii_whitespace()) {
            return Err(Error::InvalidArgument("the StableHLO program is empty".into()));
        }
        let assignment = options.resolve(inner)?;
        let mut options = options.clone();
        if inner.is_cpu() {
            for &(name, value) in CPU_DEFAULTS {
                if !options.xla_options.iter().any(|(set, _)| set == name) {
                    options.xla_options.push((name.to_string(), XlaOption::Int(value)));
                }
            }
        }
        let encoded = proto::compile_options(&options, &assignment);
        let mut code = program.to_vec();
        let program_struct = mlir_program(&mut code);
        let mut args: ffi::PJRT_Client_Compile_Args = ffi::zeroed();
        args.client = inner.raw;
        args.program = &program_struct;
        args.compile_options = encoded.as_ptr() as *const c_char;
        args.compile_options_size = encoded.len();
        // SAFETY: program, format and options outlive the call; the options were validated so
        // that XLA's CHECKs on replica/partition counts hold.
        unsafe { inner.plugin.call(slot::Client_Compile, &mut args) }?;
        if args.executable.is_null() {
            return Err(Error::Unexpected("PJRT_Client_Compile returned no executable".into()));
        }
        let mut executable = Executable {
            client: inner.clone(),
            raw: args.executable,
            num_outputs: 0,
            device_ids: Vec::new(),
            device_raws: Vec::new(),
            options: options.clone(),
            parameters: parameter_types(program, options.num_partitions),
        };
        // From here on, `executable`'s Drop frees it on error.
        executable.num_outputs = executable.count(slot::Executable_NumOutputs)?;
        let mut devices: ffi::PJRT_LoadedExecutable_AddressableDevices_Args = ffi::zeroed();
        devices.executable = executable.raw;
        // SAFETY: the executable is live.
        unsafe { inner.plugin.call(slot::LoadedExecutable_AddressableDevices, &mut devices) }?;
        if !devices.addressable_devices.is_null() {
            // SAFETY: the executable owns `num_addressable_devices` device pointers.
            executable.device_raws =
                unsafe { std::slice::from_raw_parts(devices.addressable_devices, devices.num_addressable_devices) }
                    .to_vec();
        }
        executable.device_ids = executable
            .device_raws
            .iter()
            .map(|&raw| {
                inner
                    .device_id_of(raw)
                    .ok_or_else(|| Error::Unexpected("executable runs on a device the client does not list".into()))
            })
            .collect::<Result<_>>()?;
        Ok(executable)
    }
}

impl Executable {
    fn view(&self) -> Result<UnloadedView<'_>> {
        let mut args: ffi::PJRT_LoadedExecutable_GetExecutable_Args = ffi::zeroed();
        args.loaded_executable = self.raw;
        // SAFETY: the executable is live.
        unsafe { self.client.plugin.call(slot::LoadedExecutable_GetExecutable, &mut args) }?;
        if args.executable.is_null() {
            return Err(Error::Unexpected("GetExecutable returned null".into()));
        }
        Ok(UnloadedView { client: &self.client, raw: args.executable })
    }

    fn count(&self, slot: ffi::Slot) -> Result<usize> {
        let view = self.view()?;
        let mut args: ffi::PJRT_Executable_Count_Args = ffi::zeroed();
        args.executable = view.raw;
        // SAFETY: NumOutputs/NumPartitions/NumReplicas share this layout; the view is live.
        unsafe { self.client.plugin.call(slot, &mut args) }?;
        Ok(args.value)
    }

    /// Outputs per device.
    pub fn num_outputs(&self) -> usize {
        self.num_outputs
    }

    /// Ids of the devices this process runs the program on, in the order `execute` takes
    /// argument lists (for SPMD: partition order of the device assignment).
    pub fn device_ids(&self) -> &[usize] {
        &self.device_ids
    }

    /// The options the program was compiled with.
    pub fn options(&self) -> &CompileOptions {
        &self.options
    }

    /// Element type and per-device dimensions of each output.
    pub fn output_types(&self) -> Result<Vec<(ElementType, Vec<usize>)>> {
        let view = self.view()?;
        let plugin = &self.client.plugin;
        let mut types: ffi::PJRT_Executable_OutputElementTypes_Args = ffi::zeroed();
        types.executable = view.raw;
        // SAFETY: the view is live.
        unsafe { plugin.call(slot::Executable_OutputElementTypes, &mut types) }?;
        let mut dims: ffi::PJRT_Executable_OutputDimensions_Args = ffi::zeroed();
        dims.executable = view.raw;
        // SAFETY: the view is live.
        unsafe { plugin.call(slot::Executable_OutputDimensions, &mut dims) }?;
        if types.num_output_types != dims.num_outputs {
            return Err(Error::Unexpected(format!(
                "{} output types but {} output shapes",
                types.num_output_types, dims.num_outputs
            )));
        }
        let count = dims.num_outputs;
        if count == 0 {
            return Ok(Vec::new());
        }
        if types.output_types.is_null() || dims.dim_sizes.is_null() {
            return Err(Error::Unexpected("null output type lists".into()));
        }
        // SAFETY: both lists have `count` entries and live as long as the view.
        let (raw_types, ranks) = unsafe {
            (std::slice::from_raw_parts(types.output_types, count), std::slice::from_raw_parts(dims.dim_sizes, count))
        };
        let total: usize = ranks.iter().sum();
        let all_dims: &[i64] = if total == 0 || dims.dims.is_null() {
            &[]
        } else {
            // SAFETY: `dims` holds the concatenation of every output's dimensions.
            unsafe { std::slice::from_raw_parts(dims.dims, total) }
        };
        let mut offset = 0;
        let mut outputs = Vec::with_capacity(count);
        for (&raw, &rank) in raw_types.iter().zip(ranks) {
            let element_type = ElementType::from_raw(raw)
                .ok_or_else(|| Error::Unexpected(format!("unsupported PJRT element type {raw}")))?;
            let shape = all_dims
                .get(offset..offset + rank)
                .ok_or_else(|| Error::Unexpected("output dimensions list too short".into()))?;
            outputs.push((element_type, shape.iter().map(|&d| d.max(0) as usize).collect()));
            offset += rank;
        }
        Ok(outputs)
    }

    /// XLA's memory estimate for one device running this program.
    pub fn compiled_memory_stats(&self) -> Result<CompiledMemoryStats> {
        let view = self.view()?;
        memory_stats(&self.client.plugin, view.raw)
    }

    /// Runs the program. `arguments[d]` are the arguments for device `device_ids()[d]`, each
    /// a buffer on that device; returns `outputs[d][o]`, and waits until all are computed.
    pub fn execute(&self, arguments: &[Vec<&Buffer>]) -> Result<Vec<Vec<Buffer>>> {
        let num_devices = self.device_ids.len();
        if arguments.len() != num_devices {
            return Err(Error::InvalidArgument(format!(
                "the program runs on {num_devices} devices {:?} but {} argument lists were given",
                self.device_ids,
                arguments.len()
            )));
        }
        let num_args = arguments.first().map_or(0, Vec::len);
        if let Some(parameters) = &self.parameters
            && parameters.len() != num_args
        {
            return Err(Error::InvalidArgument(format!(
                "the program takes {} parameters but {num_args} arguments were given",
                parameters.len()
            )));
        }
        for (position, list) in arguments.iter().enumerate() {
            if list.len() != num_args {
                return Err(Error::InvalidArgument(format!(
                    "argument list {position} has {} buffers, list 0 has {num_args}",
                    list.len()
                )));
            }
            for (index, buffer) in list.iter().enumerate() {
                if !Arc::ptr_eq(&buffer.client, &self.client) {
                    return Err(Error::InvalidArgument(format!(
                        "argument {index} for device {} belongs to another client",
                        self.device_ids[position]
                    )));
                }
                if let Some(Some(expected)) = self.parameters.as_ref().map(|p| &p[index]) {
                    let (element_type, dims) = (buffer.element_type()?, buffer.dims()?);
                    if element_type != expected.element_type || dims != expected.dims {
                        return Err(Error::InvalidArgument(format!(
                            "argument {index} for device {} is {element_type}{dims:?}; the program takes {}{:?} per device",
                            self.device_ids[position], expected.element_type, expected.dims
                        )));
                    }
                }
                if buffer.raw_device()? != self.device_raws[position] {
                    return Err(Error::InvalidArgument(format!(
                        "argument {index} for device {} is on device {}",
                        self.device_ids[position],
                        buffer.device_id()?
                    )));
                }
            }
        }
        let argument_raws: Vec<Vec<*mut ffi::PJRT_Buffer>> =
            arguments.iter().map(|list| list.iter().map(|b| b.raw).collect()).collect();
        let argument_pointers: Vec<*const *mut ffi::PJRT_Buffer> =
            argument_raws.iter().map(|list| list.as_ptr()).collect();
        let mut output_raws: Vec<Vec<*mut ffi::PJRT_Buffer>> =
            (0..num_devices).map(|_| vec![std::ptr::null_mut(); self.num_outputs]).collect();
        let output_pointers: Vec<*mut *mut ffi::PJRT_Buffer> =
            output_raws.iter_mut().map(|list| list.as_mut_ptr()).collect();
        let mut events: Vec<*mut ffi::PJRT_Event> = vec![std::ptr::null_mut(); num_devices];

        let mut options: ffi::PJRT_ExecuteOptions = ffi::zeroed_plain();
        options.struct_size = std::mem::size_of::<ffi::PJRT_ExecuteOptions>();
        let mut args: ffi::PJRT_LoadedExecutable_Execute_Args = ffi::zeroed();
        args.executable = self.raw;
        args.options = &mut options;
        args.argument_lists = argument_pointers.as_ptr();
        args.num_devices = num_devices;
        args.num_args = num_args;
        args.output_lists = output_pointers.as_ptr();
        args.device_complete_events = events.as_mut_ptr();
        // SAFETY: argument and output lists are [num_devices][..] arrays that outlive the
        // call; every argument buffer is live, on the right device, and of this client.
        unsafe { self.client.plugin.call(slot::LoadedExecutable_Execute, &mut args) }?;
        // Take ownership of every output first so they are freed whatever happens next.
        let outputs: Vec<Vec<Buffer>> = output_raws
            .into_iter()
            .map(|list| {
                list.into_iter()
                    .filter(|raw| !raw.is_null())
                    .map(|raw| Buffer { client: self.client.clone(), raw })
                    .collect()
            })
            .collect();
        let mut first_error = None;
        for event in events {
            if let Err(err) = self.client.plugin.await_event(event, "PJRT_LoadedExecutable_Execute") {
                first_error.get_or_insert(err);
            }
        }
        if let Some(err) = first_error {
            return Err(err);
        }
        if outputs.iter().any(|list| list.len() != self.num_outputs) {
            return Err(Error::Unexpected("execution returned fewer outputs than declared".into()));
        }
        Ok(outputs)
    }
}

/// `PJRT_Executable_GetCompiledMemoryStats` of a live executable.
pub(crate) fn memory_stats(plugin: &Plugin, executable: *mut ffi::PJRT_Executable) -> Result<CompiledMemoryStats> {
    let mut args: ffi::PJRT_Executable_GetCompiledMemoryStats_Args = ffi::zeroed();
    args.executable = executable;
    // SAFETY: the caller's executable is live.
    unsafe { plugin.call(slot::Executable_GetCompiledMemoryStats, &mut args) }?;
    Ok(CompiledMemoryStats {
        generated_code_size_in_bytes: args.generated_code_size_in_bytes,
        argument_size_in_bytes: args.argument_size_in_bytes,
        output_size_in_bytes: args.output_size_in_bytes,
        alias_size_in_bytes: args.alias_size_in_bytes,
        temp_size_in_bytes: args.temp_size_in_bytes,
        peak_memory_in_bytes: args.peak_memory_in_bytes,
        host_argument_size_in_bytes: args.host_argument_size_in_bytes,
        host_output_size_in_bytes: args.host_output_size_in_bytes,
        host_temp_size_in_bytes: args.host_temp_size_in_bytes,
    })
}

/// The `PJRT_Program` for `code` in format `mlir` (text or bytecode); `code` outlives it.
pub(crate) fn mlir_program(code: &mut [u8]) -> ffi::PJRT_Program {
    const FORMAT: &[u8] = b"mlir";
    let mut program: ffi::PJRT_Program = ffi::zeroed_plain();
    program.struct_size = std::mem::size_of::<ffi::PJRT_Program>();
    program.code = code.as_mut_ptr() as *mut c_char;
    program.code_size = code.len();
    program.format = FORMAT.as_ptr() as *const c_char;
    program.format_size = FORMAT.len();
    program
}
