//! Loading a PJRT plugin and the one path through which every PJRT function is called.

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Error, ErrorCode, Result};
use crate::ffi::{self, ArgsStruct, Slot, slot};

/// A loaded PJRT plugin: the shared library and its function table.
///
/// Plugins are loaded once per process and never unloaded (XLA plugins start threads and
/// register static state that does not survive `dlclose`): [`Plugin::load`] on the same path
/// returns the same `Arc`.
pub struct Plugin {
    path: PathBuf,
    api: *const c_void,
    /// Bytes of the function table the plugin provides (`PJRT_Api.struct_size`).
    api_size: usize,
    version: (i32, i32),
    attributes: Vec<(String, AttributeValue)>,
    /// Whether siphon's kernels are registered with the plugin (asked once: a plugin has one
    /// platform).
    pub(crate) kernels: OnceLock<bool>,
    // Kept so the library is never unloaded; the plugin lives in a static registry.
    _library: libloading::Library,
}

// SAFETY: the PJRT C API is thread-safe: `PJRT_Api` is an immutable table of function
// pointers, and every PJRT object may be used from any thread (XLA's PjRtClient, buffers and
// executables are internally synchronized). `Plugin` itself holds no interior mutability.
unsafe impl Send for Plugin {}
// SAFETY: see `Send`; `&Plugin` only reads the immutable table.
unsafe impl Sync for Plugin {}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("num_functions", &self.num_functions())
            .finish()
    }
}

/// A plugin attribute value (`PJRT_NamedValue`).
#[derive(Debug, Clone, PartialEq)]
pub enum AttributeValue {
    /// A string.
    String(String),
    /// An integer.
    Int64(i64),
    /// A list of integers.
    Int64List(Vec<i64>),
    /// A float.
    Float(f32),
    /// A bool.
    Bool(bool),
}

impl std::fmt::Display for AttributeValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttributeValue::String(s) => write!(f, "{s}"),
            AttributeValue::Int64(v) => write!(f, "{v}"),
            AttributeValue::Int64List(v) => write!(f, "{v:?}"),
            AttributeValue::Float(v) => write!(f, "{v}"),
            AttributeValue::Bool(v) => write!(f, "{v}"),
        }
    }
}

static LOADED: OnceLock<Mutex<HashMap<PathBuf, Arc<Plugin>>>> = OnceLock::new();

impl Plugin {
    /// Loads (once per process) and initializes the PJRT plugin at `path`.
    ///
    /// Checks, in order, that the file exists, that this machine has the plugin's devices (a
    /// TPU or CUDA plugin, see [`crate::diagnose::preflight`]), that it is an ELF shared library,
    /// loads, exports `GetPjrtApi`, has a supported API major version and initializes; each
    /// failure names the path.
    pub fn load(path: impl AsRef<Path>) -> Result<Arc<Plugin>> {
        Plugin::load_checked(path.as_ref(), true)
    }

    /// Loads a plugin only to compile with it for a [`crate::Topology`], on a machine that
    /// may lack its devices (libtpu compiles for a TPU slice on a CPU-only machine): as
    /// [`Plugin::load`] without the check for the plugin's devices. Never create a client on
    /// a plugin loaded this way where its devices are missing.
    pub fn load_for_compiling(path: impl AsRef<Path>) -> Result<Arc<Plugin>> {
        Plugin::load_checked(path.as_ref(), false)
    }

    fn load_checked(path: &Path, need_devices: bool) -> Result<Arc<Plugin>> {
        let canonical = std::fs::canonicalize(path).map_err(|_| Error::PluginNotFound { path: path.to_path_buf() })?;
        let registry = LOADED.get_or_init(|| Mutex::new(HashMap::new()));
        // Holding the lock across the load serializes plugin initialization, which PJRT
        // requires to happen once.
        let mut registry = registry.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(plugin) = registry.get(&canonical) {
            return Ok(plugin.clone());
        }
        if !need_devices && crate::diagnose::PluginKind::of(&canonical) == crate::diagnose::PluginKind::Cuda {
            crate::gpu::driver_for_compiling(&canonical);
        }
        if need_devices {
            crate::diagnose::preflight(&canonical).map_err(|(kind, likely_cause)| Error::DevicesMissing {
                plugin: canonical.clone(),
                kind,
                likely_cause,
            })?;
        }
        let plugin = Arc::new(Plugin::open(&canonical)?);
        registry.insert(canonical, plugin.clone());
        Ok(plugin)
    }

    fn open(path: &Path) -> Result<Plugin> {
        check_elf(path)?;
        // SAFETY: loading a library runs its initializers. We only load files the user or
        // discovery pointed at as PJRT plugins, and checked they are ELF shared objects.
        let library = unsafe { libloading::Library::new(path) }.map_err(|err| {
            let reason = err.to_string();
            Error::LoadFailed {
                path: path.to_path_buf(),
                likely_cause: crate::diagnose::load_failure_hint(path, &reason),
                reason,
            }
        })?;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin (`const PJRT_Api*
        // GetPjrtApi()`); a library without the symbol is reported, not called.
        let get_api: libloading::Symbol<'_, unsafe extern "C" fn() -> *const c_void> =
            unsafe { library.get(b"GetPjrtApi\0") }.map_err(|_| Error::NotPjrtPlugin { path: path.to_path_buf() })?;
        // SAFETY: see above; the function takes no arguments and returns a static table.
        let api = unsafe { get_api() };
        if api.is_null() {
            return Err(Error::LoadFailed {
                path: path.to_path_buf(),
                reason: "GetPjrtApi returned null".into(),
                likely_cause: None,
            });
        }
        // SAFETY: `api` points at a `PJRT_Api`, which starts with `PJRT_Api_Head`.
        let head = unsafe { std::ptr::read(api as *const ffi::PJRT_Api_Head) };
        let version = (head.pjrt_api_version.major_version, head.pjrt_api_version.minor_version);
        if version.0 != ffi::PJRT_API_MAJOR {
            return Err(Error::ApiVersion {
                path: path.to_path_buf(),
                major: version.0,
                minor: version.1,
                supported_major: ffi::PJRT_API_MAJOR,
            });
        }
        if head.struct_size < ffi::API_FIRST_SLOT_OFFSET {
            return Err(Error::LoadFailed {
                path: path.to_path_buf(),
                reason: format!("PJRT_Api struct_size {} is too small", head.struct_size),
                likely_cause: None,
            });
        }
        if version.1 > ffi::PJRT_API_MINOR {
            tracing::debug!(
                "PJRT plugin {} has API 0.{}, newer than siphon's 0.{}; newer fields stay unset",
                path.display(),
                version.1,
                ffi::PJRT_API_MINOR
            );
        }
        tracing::debug!("loaded PJRT plugin {} (API {}.{})", path.display(), version.0, version.1);
        let mut plugin = Plugin {
            path: path.to_path_buf(),
            api,
            api_size: head.struct_size,
            version,
            attributes: Vec::new(),
            kernels: OnceLock::new(),
            _library: library,
        };
        let mut init: ffi::PJRT_Plugin_Initialize_Args = ffi::zeroed();
        // SAFETY: the args struct matches `PJRT_Plugin_Initialize`.
        unsafe { plugin.call(slot::Plugin_Initialize, &mut init) }.map_err(|err| plugin.start_error(err))?;
        plugin.attributes = plugin.read_attributes().unwrap_or_else(|err| {
            tracing::debug!("PJRT plugin attributes unavailable: {err}");
            Vec::new()
        });
        Ok(plugin)
    }

    /// Turns a failed initialize or client create into [`Error::PluginStart`], naming the
    /// plugin and what this machine seems to lack for it; other errors pass through.
    pub(crate) fn start_error(&self, error: Error) -> Error {
        match error {
            Error::Pjrt { function, code, message } => Error::PluginStart {
                plugin: self.path.clone(),
                kind: crate::diagnose::PluginKind::of(&self.path),
                function,
                code,
                message,
                likely_cause: crate::diagnose::likely_cause_for(&self.path),
            },
            other => other,
        }
    }

    /// The plugin's `PJRT_Api` table.
    pub(crate) fn api(&self) -> *const c_void {
        self.api
    }

    /// The library path (canonical).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The plugin's PJRT C API version `(major, minor)`.
    pub fn api_version(&self) -> (i32, i32) {
        self.version
    }

    /// How many function slots the plugin's table has.
    pub fn num_functions(&self) -> usize {
        (self.api_size - ffi::API_FIRST_SLOT_OFFSET) / std::mem::size_of::<*const c_void>()
    }

    /// Plugin attributes, e.g. `xla_version`, `stablehlo_current_version`.
    pub fn attributes(&self) -> &[(String, AttributeValue)] {
        &self.attributes
    }

    fn read_attributes(&self) -> Result<Vec<(String, AttributeValue)>> {
        let mut args: ffi::PJRT_Plugin_Attributes_Args = ffi::zeroed();
        // SAFETY: the args struct matches `PJRT_Plugin_Attributes`.
        unsafe { self.call(slot::Plugin_Attributes, &mut args) }?;
        if args.attributes.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: the plugin returns `num_attributes` named values that live as long as the
        // process.
        let values = unsafe { std::slice::from_raw_parts(args.attributes, args.num_attributes) };
        // SAFETY: each value came from the plugin with consistent type tags and sizes.
        Ok(values.iter().map(|value| unsafe { read_named_value(value) }).collect())
    }

    /// The function pointer in `slot`, if the plugin's table covers it and it is not null.
    fn function(&self, slot: Slot) -> Result<*const c_void> {
        let offset = ffi::API_FIRST_SLOT_OFFSET + slot.index * std::mem::size_of::<*const c_void>();
        if offset + std::mem::size_of::<*const c_void>() > self.api_size {
            return Err(Error::MissingFunction { plugin: self.path.clone(), function: slot.name });
        }
        // SAFETY: the table is `api_size` bytes long and the slot lies within it.
        let pointer = unsafe { std::ptr::read((self.api as *const u8).add(offset) as *const *const c_void) };
        if pointer.is_null() {
            return Err(Error::MissingFunction { plugin: self.path.clone(), function: slot.name });
        }
        Ok(pointer)
    }

    /// Calls the PJRT function in `slot` with `args`: sets `struct_size`, checks the plugin
    /// has the function, and turns a returned `PJRT_Error` into [`Error::Pjrt`] (destroying it).
    ///
    /// # Safety
    /// `A` must be the argument struct of the function in `slot`, and every pointer in `args`
    /// must satisfy that function's contract in `pjrt_c_api.h`.
    pub(crate) unsafe fn call<A: ArgsStruct>(&self, slot: Slot, args: &mut A) -> Result<()> {
        let function = self.function(slot)?;
        // SAFETY: `ArgsStruct` types start with `usize struct_size`.
        unsafe { *(args as *mut A as *mut usize) = std::mem::size_of::<A>() };
        // SAFETY: every PJRT function in the table takes a pointer to its args struct and
        // returns `PJRT_Error*`; the caller guarantees `A` is that struct.
        let function: unsafe extern "C" fn(*mut A) -> *mut ffi::PJRT_Error = unsafe { std::mem::transmute(function) };
        // SAFETY: the caller upholds the function's contract.
        let error = unsafe { function(args) };
        if error.is_null() { Ok(()) } else { Err(self.take_error(slot.name, error)) }
    }

    /// Converts a plugin error into [`Error::Pjrt`] and destroys it.
    pub(crate) fn take_error(&self, function: &'static str, error: *mut ffi::PJRT_Error) -> Error {
        let (code, message) = self.error_code_and_message(error);
        self.destroy_error(error);
        Error::Pjrt { function, code, message }
    }

    fn error_code_and_message(&self, error: *mut ffi::PJRT_Error) -> (ErrorCode, String) {
        let mut message = String::from("(no message)");
        if let Ok(function) = self.function(slot::Error_Message) {
            let mut args: ffi::PJRT_Error_Message_Args = ffi::zeroed();
            args.struct_size = std::mem::size_of::<ffi::PJRT_Error_Message_Args>();
            args.error = error;
            // SAFETY: `PJRT_Error_Message` returns void and takes its args struct.
            let function: unsafe extern "C" fn(*mut ffi::PJRT_Error_Message_Args) =
                unsafe { std::mem::transmute(function) };
            // SAFETY: `error` is a live error from this plugin.
            unsafe { function(&mut args) };
            // SAFETY: the message lives as long as `error`, which we still hold.
            message = unsafe { string_from(args.message, args.message_size) };
        }
        let mut code = ErrorCode::Unknown;
        if let Ok(function) = self.function(slot::Error_GetCode) {
            let mut args: ffi::PJRT_Error_GetCode_Args = ffi::zeroed();
            args.struct_size = std::mem::size_of::<ffi::PJRT_Error_GetCode_Args>();
            args.error = error;
            // SAFETY: `PJRT_Error_GetCode` takes its args struct and returns `PJRT_Error*`.
            let function: unsafe extern "C" fn(*mut ffi::PJRT_Error_GetCode_Args) -> *mut ffi::PJRT_Error =
                unsafe { std::mem::transmute(function) };
            // SAFETY: `error` is a live error from this plugin.
            let nested = unsafe { function(&mut args) };
            if nested.is_null() {
                code = ErrorCode::from_raw(args.code);
            } else {
                self.destroy_error(nested);
            }
        }
        (code, message)
    }

    fn destroy_error(&self, error: *mut ffi::PJRT_Error) {
        match self.function(slot::Error_Destroy) {
            Ok(function) => {
                let mut args: ffi::PJRT_Error_Destroy_Args = ffi::zeroed();
                args.struct_size = std::mem::size_of::<ffi::PJRT_Error_Destroy_Args>();
                args.error = error;
                // SAFETY: `PJRT_Error_Destroy` returns void and takes its args struct.
                let function: unsafe extern "C" fn(*mut ffi::PJRT_Error_Destroy_Args) =
                    unsafe { std::mem::transmute(function) };
                // SAFETY: `error` is live and destroyed exactly once, here.
                unsafe { function(&mut args) };
            }
            Err(_) => tracing::warn!("cannot free a PJRT error: plugin lacks PJRT_Error_Destroy"),
        }
    }

    /// Waits for `event`, destroys it, and returns its status.
    pub(crate) fn await_event(&self, event: *mut ffi::PJRT_Event, what: &'static str) -> Result<()> {
        if event.is_null() {
            return Ok(());
        }
        let mut args: ffi::PJRT_Event_Await_Args = ffi::zeroed();
        args.event = event;
        // SAFETY: `event` is a live event from this plugin.
        let status = unsafe { self.call(slot::Event_Await, &mut args) };
        self.destroy_event(event);
        status.map_err(|err| match err {
            Error::Pjrt { code, message, .. } => Error::Pjrt { function: what, code, message },
            other => other,
        })
    }

    /// Destroys `event` (logging, never panicking, on failure).
    pub(crate) fn destroy_event(&self, event: *mut ffi::PJRT_Event) {
        if event.is_null() {
            return;
        }
        let mut args: ffi::PJRT_Event_Destroy_Args = ffi::zeroed();
        args.event = event;
        // SAFETY: `event` is live and destroyed exactly once, here.
        if let Err(err) = unsafe { self.call(slot::Event_Destroy, &mut args) } {
            tracing::warn!("failed to destroy a PJRT event: {err}");
        }
    }

    /// Builds a `PJRT_Error` through the plugin's `PJRT_CallbackError` function, for callbacks.
    ///
    /// # Safety
    /// `callback_error` must be the pointer the plugin passed to the callback.
    pub(crate) unsafe fn callback_error(
        callback_error: *const ffi::PJRT_CallbackError,
        code: ErrorCode,
        message: &str,
    ) -> *mut ffi::PJRT_Error {
        if callback_error.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: the plugin passes a valid pointer to its error-building function.
        let function = unsafe { *callback_error };
        // SAFETY: the function copies `message` (the header says it must).
        unsafe { function(code.to_raw(), message.as_ptr() as *const c_char, message.len()) }
    }
}

fn check_elf(path: &Path) -> Result<()> {
    let not_shared = |reason: String| Error::NotSharedLibrary { path: path.to_path_buf(), reason };
    let metadata = std::fs::metadata(path).map_err(|err| not_shared(err.to_string()))?;
    if !metadata.is_file() {
        return Err(not_shared("it is not a regular file".into()));
    }
    let mut magic = [0u8; 4];
    let mut file = std::fs::File::open(path).map_err(|err| not_shared(err.to_string()))?;
    match file.read_exact(&mut magic) {
        Ok(()) if magic == *b"\x7fELF" => Ok(()),
        Ok(()) => Err(not_shared("it does not start with the ELF magic bytes".into())),
        Err(_) => Err(not_shared(format!("it is only {} bytes long", metadata.len()))),
    }
}

/// Copies a (pointer, length) string from the plugin.
///
/// # Safety
/// `pointer` must be null or point at `len` readable bytes.
pub(crate) unsafe fn string_from(pointer: *const c_char, len: usize) -> String {
    if pointer.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    let bytes = unsafe { std::slice::from_raw_parts(pointer as *const u8, len) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// # Safety
/// `value` must be a well-formed named value from the plugin.
pub(crate) unsafe fn read_named_value(value: &ffi::PJRT_NamedValue) -> (String, AttributeValue) {
    // SAFETY: name and value pointers/sizes come from the plugin (caller's guarantee).
    unsafe {
        let name = string_from(value.name, value.name_size);
        let parsed = match value.type_ {
            ffi::NAMED_VALUE_STRING => AttributeValue::String(string_from(value.value.string_value, value.value_size)),
            ffi::NAMED_VALUE_INT64 => AttributeValue::Int64(value.value.int64_value),
            ffi::NAMED_VALUE_INT64_LIST => {
                let pointer = value.value.int64_array_value;
                let list = if pointer.is_null() {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(pointer, value.value_size).to_vec()
                };
                AttributeValue::Int64List(list)
            }
            ffi::NAMED_VALUE_FLOAT => AttributeValue::Float(value.value.float_value),
            ffi::NAMED_VALUE_BOOL => AttributeValue::Bool(value.value.bool_value),
            other => AttributeValue::String(format!("<unknown value type {other}>")),
        };
        (name, parsed)
    }
}
