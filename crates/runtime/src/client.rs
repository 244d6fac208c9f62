//! PJRT clients, their devices, create options and key-value store callbacks.

use std::ffi::{c_char, c_void};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, ErrorCode, Result};
use crate::ffi::{self, slot};
use crate::kernels::Platform;
use crate::named::{OptionValue, named_values};
use crate::plugin::{Plugin, string_from};

/// A key-value store shared by all processes of a multi-host job, through which a PJRT client
/// exchanges topology and collective ids (libtpu, the CUDA plugin). The CPU plugin ignores it.
///
/// Implementations must be thread-safe and may block (the plugin calls them from its own
/// threads during client creation and later). Keys do not collide between plugins because
/// a job runs one plugin.
pub trait KeyValueStore: Send + Sync {
    /// The value of `key`, waiting up to `timeout` for another process to put it;
    /// `Ok(None)` when it did not appear in time.
    fn get(&self, key: &str, timeout: Duration) -> Result<Option<Vec<u8>>, String>;
    /// The value of `key` if it is present now.
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, String>;
    /// Stores `value` under `key`.
    fn put(&self, key: &str, value: &[u8]) -> Result<(), String>;
}

/// How to create a [`Client`]: named plugin options and an optional key-value store.
#[derive(Clone, Default)]
pub struct ClientOptions {
    options: Vec<(String, OptionValue)>,
    key_value_store: Option<Arc<dyn KeyValueStore>>,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("options", &self.options)
            .field("key_value_store", &self.key_value_store.is_some())
            .finish()
    }
}

impl ClientOptions {
    /// No options: the plugin's defaults (4 virtual devices on the CPU plugin).
    pub fn new() -> ClientOptions {
        ClientOptions::default()
    }

    /// Sets a named option, replacing an earlier one of the same name.
    pub fn option(mut self, name: impl Into<String>, value: OptionValue) -> ClientOptions {
        let name = name.into();
        self.options.retain(|(existing, _)| *existing != name);
        self.options.push((name, value));
        self
    }

    /// The CPU plugin's `cpu_device_count`: how many virtual devices to create.
    pub fn cpu_device_count(self, count: usize) -> ClientOptions {
        self.option("cpu_device_count", OptionValue::Int64(count as i64))
    }

    /// The key-value store for multi-process clients; kept alive as long as the client.
    pub fn key_value_store(mut self, store: Arc<dyn KeyValueStore>) -> ClientOptions {
        self.key_value_store = Some(store);
        self
    }

    /// The named options set so far.
    pub fn options(&self) -> &[(String, OptionValue)] {
        &self.options
    }
}

/// What PJRT says about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The global device id (unique over all processes); device assignments use it.
    pub id: usize,
    /// Vendor kind string, e.g. `cpu`, `NVIDIA H100 80GB HBM3`, `TPU v5 lite`.
    pub kind: String,
    /// The process that can address this device.
    pub process_index: usize,
    /// Hardware id on its host (e.g. CUDA ordinal); -1 when undefined.
    pub local_hardware_id: i32,
    /// Whether this process can issue work to the device.
    pub addressable: bool,
}

pub(crate) struct DeviceEntry {
    pub(crate) info: DeviceInfo,
    pub(crate) raw: *mut ffi::PJRT_Device,
}

pub(crate) struct ClientInner {
    pub(crate) plugin: Arc<Plugin>,
    pub(crate) raw: *mut ffi::PJRT_Client,
    pub(crate) platform_name: String,
    pub(crate) platform_version: String,
    pub(crate) process_index: usize,
    pub(crate) devices: Vec<DeviceEntry>,
    // Dropped after the client is destroyed (fields drop after `Drop::drop`), so the plugin
    // never calls into a freed store.
    _key_value_store: Option<Box<Arc<dyn KeyValueStore>>>,
}

impl ClientInner {
    /// Whether this is the CPU plugin's client (platform `cpu`).
    pub(crate) fn is_cpu(&self) -> bool {
        self.platform_name == "cpu"
    }

    /// The platform of siphon's kernels this client's programs may call, if any.
    fn kernel_platform(&self) -> Option<Platform> {
        match self.platform_name.as_str() {
            "cpu" => Some(Platform::Host),
            "cuda" => Some(Platform::Cuda),
            _ => None,
        }
    }
}

// SAFETY: a PJRT client is thread-safe (XLA's PjRtClient is internally synchronized and the
// C API may be called from any thread). Device pointers are owned by the client and
// immutable. The key-value store is `Send + Sync` by its trait bound.
unsafe impl Send for ClientInner {}
// SAFETY: see `Send`.
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut args: ffi::PJRT_Client_Destroy_Args = ffi::zeroed();
        args.client = self.raw;
        // SAFETY: the client is live and destroyed once; every buffer and executable holds
        // an Arc to this inner value, so none outlives it.
        if let Err(err) = unsafe { self.plugin.call(slot::Client_Destroy, &mut args) } {
            tracing::warn!("failed to destroy PJRT client: {err}");
        }
    }
}

impl ClientInner {
    pub(crate) fn device(&self, id: usize) -> Result<&DeviceEntry> {
        self.devices
            .iter()
            .find(|device| device.info.id == id)
            .ok_or_else(|| Error::BadDevice { id, reason: "no such device".into() })
    }

    pub(crate) fn addressable_device(&self, id: usize) -> Result<&DeviceEntry> {
        let device = self.device(id)?;
        if !device.info.addressable {
            return Err(Error::BadDevice {
                id,
                reason: format!(
                    "not addressable from process {} (it belongs to process {})",
                    self.process_index, device.info.process_index
                ),
            });
        }
        Ok(device)
    }

    pub(crate) fn device_id_of(&self, raw: *mut ffi::PJRT_Device) -> Option<usize> {
        self.devices.iter().find(|device| device.raw == raw).map(|device| device.info.id)
    }
}

/// A PJRT client: one process's view of the devices of a plugin. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("platform", &self.inner.platform_name)
            .field("devices", &self.inner.devices.len())
            .finish()
    }
}

impl Client {
    /// Creates a client on `plugin` with `options`.
    ///
    /// `cpu_device_count` is the CPU plugin's option: it is left out for the CUDA and TPU
    /// plugins, which refuse option names they do not know (tests and benches that ask for
    /// virtual CPU devices then run on the accelerator's own devices).
    pub fn new(plugin: &Arc<Plugin>, mut options: ClientOptions) -> Result<Client> {
        if matches!(crate::PluginKind::of(plugin.path()), crate::PluginKind::Cuda | crate::PluginKind::Tpu) {
            options.options.retain(|(name, _)| name != "cpu_device_count");
        }
        for (name, value) in &options.options {
            if let OptionValue::Int64(count) = value
                && name == "cpu_device_count"
                && *count < 1
            {
                return Err(Error::InvalidOption {
                    name: name.clone(),
                    reason: format!("must be at least 1, got {count}"),
                });
            }
        }
        let named_values = named_values(&options.options)?;

        let key_value_store = options.key_value_store.clone().map(Box::new);
        let mut args: ffi::PJRT_Client_Create_Args = ffi::zeroed();
        args.create_options = named_values.as_ptr();
        args.num_options = named_values.len();
        if let Some(store) = &key_value_store {
            // The boxed Arc has a stable address for the client's whole life.
            let user_arg = &**store as *const Arc<dyn KeyValueStore> as *mut c_void;
            args.kv_get_callback = Some(kv_get);
            args.kv_get_user_arg = user_arg;
            args.kv_try_get_callback = Some(kv_try_get);
            args.kv_try_get_user_arg = user_arg;
            args.kv_put_callback = Some(kv_put);
            args.kv_put_user_arg = user_arg;
        }
        // SAFETY: the options and strings outlive the call; the store outlives the client.
        unsafe { plugin.call(slot::Client_Create, &mut args) }.map_err(|err| plugin.start_error(err))?;
        if args.client.is_null() {
            return Err(Error::Unexpected("PJRT_Client_Create returned no client".into()));
        }
        let mut inner = ClientInner {
            plugin: plugin.clone(),
            raw: args.client,
            platform_name: String::new(),
            platform_version: String::new(),
            process_index: 0,
            devices: Vec::new(),
            _key_value_store: key_value_store,
        };
        // From here on, `inner`'s Drop destroys the client on any error.
        inner.platform_name = client_string(&inner, slot::Client_PlatformName)?;
        inner.platform_version = client_string(&inner, slot::Client_PlatformVersion)?;
        let mut process: ffi::PJRT_Client_ProcessIndex_Args = ffi::zeroed();
        process.client = inner.raw;
        // SAFETY: the client is live.
        unsafe { plugin.call(slot::Client_ProcessIndex, &mut process) }?;
        inner.process_index = process.process_index.max(0) as usize;
        inner.devices = list_devices(&inner)?;
        // siphon's kernels are registered before any program is compiled, so that a program
        // naming one compiles whoever built it.
        if let Some(platform) = inner.kernel_platform() {
            plugin.kernels(platform);
        }
        tracing::debug!(
            "PJRT client on {} ({}) with {} devices",
            inner.platform_name,
            inner.platform_version,
            inner.devices.len()
        );
        Ok(Client { inner: Arc::new(inner) })
    }

    /// The plugin this client runs on.
    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.inner.plugin
    }

    /// Platform name, e.g. `cpu`, `cuda`, `tpu`.
    pub fn platform_name(&self) -> &str {
        &self.inner.platform_name
    }

    /// Whether programs for this client may call siphon's CPU kernels (`siphon-kernels`): a
    /// CPU client whose plugin registered them, unless `SIPHON_CPU_KERNELS=0` turns them off
    /// (XLA's own ops then compute the same values).
    pub fn cpu_kernels(&self) -> bool {
        self.inner.is_cpu()
            && std::env::var("SIPHON_CPU_KERNELS").map_or(true, |v| v != "0")
            && self.inner.plugin.kernels(Platform::Host)
    }

    /// Whether programs for this client may call siphon's CUDA kernels (`siphon-kernels`'
    /// grouped products on cuBLAS): a CUDA client whose plugin registered them, unless
    /// `SIPHON_CUDA_KERNELS=0` turns them off (XLA's own ops then compute the same values).
    pub fn cuda_kernels(&self) -> bool {
        self.inner.platform_name == "cuda"
            && std::env::var("SIPHON_CUDA_KERNELS").map_or(true, |v| v != "0")
            && self.inner.plugin.kernels(Platform::Cuda)
    }

    /// Platform version text (CUDA or libtpu version, ...).
    pub fn platform_version(&self) -> &str {
        &self.inner.platform_version
    }

    /// This process's index in a multi-process job (0 when single-process).
    pub fn process_index(&self) -> usize {
        self.inner.process_index
    }

    /// All devices, addressable or not, in PJRT's order.
    pub fn devices(&self) -> Vec<DeviceInfo> {
        self.inner.devices.iter().map(|device| device.info.clone()).collect()
    }

    /// The ids of the devices this process can use, in PJRT's order.
    pub fn addressable_device_ids(&self) -> Vec<usize> {
        self.inner.devices.iter().filter(|device| device.info.addressable).map(|device| device.info.id).collect()
    }

    /// The device with `id`.
    pub fn device(&self, id: usize) -> Result<DeviceInfo> {
        Ok(self.inner.device(id)?.info.clone())
    }

    /// The memory a program may use on device `id`, as its plugin reports it
    /// (`PJRT_Device_MemoryStats`' `bytes_limit`: on a GPU what its allocator was given); `None`
    /// where the plugin does not report it (the CPU plugin's devices are the host's memory).
    pub fn device_memory_limit(&self, id: usize) -> Result<Option<u64>> {
        let device = self.inner.device(id)?;
        let mut stats: ffi::PJRT_Device_MemoryStats_Args = ffi::zeroed();
        stats.device = device.raw;
        // SAFETY: `device.raw` is a live device of this client; the struct is the header's.
        match unsafe { self.inner.plugin.call(slot::Device_MemoryStats, &mut stats) } {
            Ok(()) if stats.bytes_limit_is_set && stats.bytes_limit > 0 => Ok(Some(stats.bytes_limit as u64)),
            Ok(()) => Ok(None),
            Err(Error::Pjrt { code: ErrorCode::Unimplemented, .. }) => Ok(None),
            Err(err) => Err(err),
        }
    }
}

fn client_string(inner: &ClientInner, slot: ffi::Slot) -> Result<String> {
    let mut args: ffi::PJRT_Client_String_Args = ffi::zeroed();
    args.client = inner.raw;
    // SAFETY: PlatformName and PlatformVersion share this args layout; the client is live.
    unsafe { inner.plugin.call(slot, &mut args) }?;
    // SAFETY: the string is owned by the client, which is live.
    Ok(unsafe { string_from(args.value, args.value_size) })
}

fn list_devices(inner: &ClientInner) -> Result<Vec<DeviceEntry>> {
    let plugin = &inner.plugin;
    let mut args: ffi::PJRT_Client_Devices_Args = ffi::zeroed();
    args.client = inner.raw;
    // SAFETY: the client is live.
    unsafe { plugin.call(slot::Client_Devices, &mut args) }?;
    let raws: Vec<*mut ffi::PJRT_Device> = if args.devices.is_null() {
        Vec::new()
    } else {
        // SAFETY: the client owns `num_devices` device pointers.
        unsafe { std::slice::from_raw_parts(args.devices, args.num_devices) }.to_vec()
    };
    let mut devices = Vec::with_capacity(raws.len());
    for raw in raws {
        let mut description: ffi::PJRT_Device_GetDescription_Args = ffi::zeroed();
        description.device = raw;
        // SAFETY: `raw` is a device of the live client.
        unsafe { plugin.call(slot::Device_GetDescription, &mut description) }?;
        let description = description.device_description;

        // SAFETY: the description belongs to a live device of the live client.
        let (id, process_index, kind) = unsafe { describe(plugin, description) }?;

        let mut addressable: ffi::PJRT_Device_IsAddressable_Args = ffi::zeroed();
        addressable.device = raw;
        // SAFETY: as above.
        unsafe { plugin.call(slot::Device_IsAddressable, &mut addressable) }?;
        let mut hardware: ffi::PJRT_Device_LocalHardwareId_Args = ffi::zeroed();
        hardware.device = raw;
        hardware.local_hardware_id = -1;
        // SAFETY: as above. Optional in older plugins: -1 ("undefined") when absent.
        let local_hardware_id = match unsafe { plugin.call(slot::Device_LocalHardwareId, &mut hardware) } {
            Ok(()) => hardware.local_hardware_id,
            Err(_) => -1,
        };
        devices.push(DeviceEntry {
            info: DeviceInfo { id, kind, process_index, local_hardware_id, addressable: addressable.is_addressable },
            raw,
        });
    }
    Ok(devices)
}

/// A device description's global id, process index and kind.
///
/// # Safety
/// `description` must be a live device description of `plugin` (of a client's device or a
/// topology's).
pub(crate) unsafe fn describe(
    plugin: &Plugin,
    description: *mut ffi::PJRT_DeviceDescription,
) -> Result<(usize, usize, String)> {
    let mut id: ffi::PJRT_DeviceDescription_Int_Args = ffi::zeroed();
    id.device_description = description;
    // SAFETY: the caller's description is live.
    unsafe { plugin.call(slot::DeviceDescription_Id, &mut id) }?;
    let mut process: ffi::PJRT_DeviceDescription_Int_Args = ffi::zeroed();
    process.device_description = description;
    // SAFETY: as above.
    unsafe { plugin.call(slot::DeviceDescription_ProcessIndex, &mut process) }?;
    let mut kind: ffi::PJRT_DeviceDescription_Kind_Args = ffi::zeroed();
    kind.device_description = description;
    // SAFETY: as above.
    unsafe { plugin.call(slot::DeviceDescription_Kind, &mut kind) }?;
    if id.value < 0 {
        return Err(Error::Unexpected(format!("device with negative id {}", id.value)));
    }
    // SAFETY: the kind string lives as long as the description.
    let kind = unsafe { string_from(kind.device_kind, kind.device_kind_size) };
    Ok((id.value as usize, process.value.max(0) as usize, kind))
}

// ------------------------------------------------------------ key-value callbacks

/// # Safety
/// `user_arg` must be the `Arc<dyn KeyValueStore>` pointer installed by `Client::new`.
unsafe fn store_from<'a>(user_arg: *mut c_void) -> &'a dyn KeyValueStore {
    // SAFETY: guaranteed by the caller; the box outlives the client.
    unsafe { &**(user_arg as *const Arc<dyn KeyValueStore>) }
}

/// Copies `value` into memory the plugin frees through `free_value`.
fn malloc_copy(value: &[u8]) -> *mut c_char {
    unsafe extern "C" {
        fn malloc(size: usize) -> *mut c_void;
    }
    // SAFETY: plain libc allocation; at least one byte so an empty value is not null.
    let pointer = unsafe { malloc(value.len().max(1)) } as *mut u8;
    if !pointer.is_null() {
        // SAFETY: `pointer` has room for `value.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), pointer, value.len()) };
    }
    pointer as *mut c_char
}

unsafe extern "C" fn free_value(value: *mut c_char) {
    unsafe extern "C" {
        fn free(pointer: *mut c_void);
    }
    // SAFETY: `value` came from `malloc_copy`.
    unsafe { free(value as *mut c_void) }
}

/// Runs a callback body, turning panics into errors (unwinding into C is not allowed).
fn guarded<T>(body: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(body))
        .unwrap_or_else(|_| Err("key-value store callback panicked".into()))
}

/// The body of [`kv_get`] and [`kv_try_get`], whose args differ only in `kv_get`'s timeout:
/// looks `key` up with `lookup` (a panic is an error) and hands a found value to `deliver`: a
/// pointer and size in memory the plugin frees with the deleter, [`free_value`]. Otherwise it
/// returns the plugin's error: `missing`'s for a key without a value, `Unavailable` naming
/// `operation` for a failed store, `ResourceExhausted` when the copy cannot be allocated.
///
/// # Safety
/// `callback_error` must be the pointer the plugin passed to the callback.
unsafe fn answer_get(
    key: &str,
    operation: &str,
    lookup: impl FnOnce() -> Result<Option<Vec<u8>>, String>,
    missing: impl FnOnce() -> (ErrorCode, String),
    callback_error: *const ffi::PJRT_CallbackError,
    deliver: impl FnOnce(*mut c_char, usize, ffi::PJRT_KeyValueGetCallback_ValueDeleter),
) -> *mut ffi::PJRT_Error {
    let (code, message) = match guarded(lookup) {
        Ok(Some(value)) => {
            let pointer = malloc_copy(&value);
            if !pointer.is_null() {
                deliver(pointer, value.len(), free_value);
                return std::ptr::null_mut();
            }
            (ErrorCode::ResourceExhausted, format!("out of memory copying value of {key}"))
        }
        Ok(None) => missing(),
        Err(err) => (ErrorCode::Unavailable, format!("key-value {operation} {key}: {err}")),
    };
    // SAFETY: guaranteed by the caller.
    unsafe { Plugin::callback_error(callback_error, code, &message) }
}

unsafe extern "C" fn kv_get(args: *mut ffi::PJRT_KeyValueGetCallback_Args) -> *mut ffi::PJRT_Error {
    // SAFETY: the plugin passes a valid args struct for the duration of the call.
    let args = unsafe { &mut *args };
    // SAFETY: key/size come from the plugin; `user_arg` is ours.
    let (key, store) = unsafe { (string_from(args.key, args.key_size), store_from(args.user_arg)) };
    let timeout = Duration::from_millis(args.timeout_in_ms.max(0) as u64);
    let lookup = || store.get(&key, timeout);
    let missing = || (ErrorCode::DeadlineExceeded, format!("key {key} not set within {timeout:?}"));
    // SAFETY: `callback_error` is the plugin's.
    unsafe {
        answer_get(&key, "get", lookup, missing, args.callback_error, |value, size, deleter| {
            (args.value, args.value_size, args.value_deleter_callback) = (value, size, Some(deleter))
        })
    }
}

unsafe extern "C" fn kv_try_get(args: *mut ffi::PJRT_KeyValueTryGetCallback_Args) -> *mut ffi::PJRT_Error {
    // SAFETY: the plugin passes a valid args struct for the duration of the call.
    let args = unsafe { &mut *args };
    // SAFETY: key/size come from the plugin; `user_arg` is ours.
    let (key, store) = unsafe { (string_from(args.key, args.key_size), store_from(args.user_arg)) };
    let lookup = || store.try_get(&key);
    let missing = || (ErrorCode::NotFound, format!("key {key} not found"));
    // SAFETY: `callback_error` is the plugin's.
    unsafe {
        answer_get(&key, "try_get", lookup, missing, args.callback_error, |value, size, deleter| {
            (args.value, args.value_size, args.value_deleter_callback) = (value, size, Some(deleter))
        })
    }
}

unsafe extern "C" fn kv_put(args: *mut ffi::PJRT_KeyValuePutCallback_Args) -> *mut ffi::PJRT_Error {
    // SAFETY: the plugin passes a valid args struct for the duration of the call.
    let args = unsafe { &mut *args };
    // SAFETY: key/value/sizes come from the plugin; `user_arg` is ours.
    let (key, value, store) = unsafe {
        let value = if args.value.is_null() || args.value_size == 0 {
            &[][..]
        } else {
            std::slice::from_raw_parts(args.value as *const u8, args.value_size)
        };
        (string_from(args.key, args.key_size), value, store_from(args.user_arg))
    };
    match guarded(|| store.put(&key, value)) {
        Ok(()) => std::ptr::null_mut(),
        // SAFETY: `callback_error` is the plugin's.
        Err(err) => unsafe {
            Plugin::callback_error(args.callback_error, ErrorCode::Unavailable, &format!("key-value put {key}: {err}"))
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// Stands in for the plugin's `PJRT_CallbackError`: records what it was given and returns
    /// a marker pointer (never dereferenced).
    static LAST_ERROR: Mutex<Option<(i32, String)>> = Mutex::new(None);
    unsafe extern "C" fn record_error(code: i32, message: *const c_char, size: usize) -> *mut ffi::PJRT_Error {
        // SAFETY: `message` points at `size` bytes for the duration of the call.
        let message = unsafe { string_from(message, size) };
        *LAST_ERROR.lock().unwrap() = Some((code, message));
        std::ptr::NonNull::dangling().as_ptr()
    }
    const RECORD_ERROR: ffi::PJRT_CallbackError = record_error;

    struct Store(Mutex<HashMap<String, Vec<u8>>>);
    impl KeyValueStore for Store {
        fn get(&self, key: &str, _timeout: Duration) -> Result<Option<Vec<u8>>, String> {
            if key == "boom" {
                panic!("store bug");
            }
            Ok(self.0.lock().unwrap().get(key).cloned())
        }
        fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
            Ok(self.0.lock().unwrap().get(key).cloned())
        }
        fn put(&self, key: &str, value: &[u8]) -> Result<(), String> {
            if key.is_empty() {
                return Err("empty key".into());
            }
            self.0.lock().unwrap().insert(key.into(), value.into());
            Ok(())
        }
    }

    // The callbacks run in the plugin's threads in a multi-host job; here they are called
    // the way the plugin calls them, since the CPU plugin never does.
    #[test]
    fn key_value_callbacks_put_get_and_report_errors() {
        let store: Box<Arc<dyn KeyValueStore>> = Box::new(Arc::new(Store(Mutex::new(HashMap::new()))));
        let user_arg = &*store as *const Arc<dyn KeyValueStore> as *mut c_void;
        let (key, value) = ("topology/0", b"\x00\x01payload");

        let mut put: ffi::PJRT_KeyValuePutCallback_Args = ffi::zeroed();
        put.key = key.as_ptr() as *const c_char;
        put.key_size = key.len();
        put.value = value.as_ptr() as *const c_char;
        put.value_size = value.len();
        put.callback_error = &RECORD_ERROR;
        put.user_arg = user_arg;
        // SAFETY: a well-formed args struct, as the plugin would pass.
        assert!(unsafe { kv_put(&mut put) }.is_null());

        let mut get: ffi::PJRT_KeyValueGetCallback_Args = ffi::zeroed();
        get.key = key.as_ptr() as *const c_char;
        get.key_size = key.len();
        get.timeout_in_ms = 10;
        get.callback_error = &RECORD_ERROR;
        get.user_arg = user_arg;
        // SAFETY: as above.
        assert!(unsafe { kv_get(&mut get) }.is_null());
        // SAFETY: the callback returned `value_size` bytes at `value`.
        let got = unsafe { std::slice::from_raw_parts(get.value as *const u8, get.value_size) }.to_vec();
        assert_eq!(got, value);
        // SAFETY: the plugin frees the value with the deleter we set.
        unsafe { (get.value_deleter_callback.unwrap())(get.value) };

        let missing = "absent";
        let mut try_get: ffi::PJRT_KeyValueTryGetCallback_Args = ffi::zeroed();
        try_get.key = missing.as_ptr() as *const c_char;
        try_get.key_size = missing.len();
        try_get.callback_error = &RECORD_ERROR;
        try_get.user_arg = user_arg;
        // SAFETY: as above.
        assert!(!unsafe { kv_try_get(&mut try_get) }.is_null());
        let (code, message) = LAST_ERROR.lock().unwrap().take().unwrap();
        assert_eq!(code, ErrorCode::NotFound.to_raw());
        assert!(message.contains("absent"));

        get.key = missing.as_ptr() as *const c_char;
        get.key_size = missing.len();
        // SAFETY: as above.
        assert!(!unsafe { kv_get(&mut get) }.is_null());
        assert_eq!(LAST_ERROR.lock().unwrap().take().unwrap().0, ErrorCode::DeadlineExceeded.to_raw());

        // A panicking store is an error for the plugin, not an unwind into C.
        let boom = "boom";
        get.key = boom.as_ptr() as *const c_char;
        get.key_size = boom.len();
        // SAFETY: as above.
        assert!(!unsafe { kv_get(&mut get) }.is_null());
        assert!(LAST_ERROR.lock().unwrap().take().unwrap().1.contains("panicked"));

        put.key_size = 0;
        // SAFETY: as above.
        assert!(!unsafe { kv_put(&mut put) }.is_null());
        assert!(LAST_ERROR.lock().unwrap().take().unwrap().1.contains("empty key"));
    }
}
