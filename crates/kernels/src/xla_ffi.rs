//! The part of XLA's FFI C API (`xla/ffi/api/c_api.h`, API 0.1) a handler needs: the call
//! frame, buffers, the metadata query XLA sends when a handler is registered, and errors.

// These mirror C structs: every field is there for the layout, read or not.
#![allow(dead_code)]

use std::ffi::{CString, c_void};

/// `XLA_FFI_Extension_Base`.
#[repr(C)]
pub struct ExtensionBase {
    struct_size: usize,
    kind: i32,
    next: *mut ExtensionBase,
}

const EXTENSION_METADATA: i32 = 1;

/// `XLA_FFI_Api_Version`.
#[repr(C)]
struct ApiVersion {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    major: i32,
    minor: i32,
}

/// `XLA_FFI_Metadata`.
#[repr(C)]
struct Metadata {
    struct_size: usize,
    api_version: ApiVersion,
    traits: u32,
}

/// `XLA_FFI_Metadata_Extension`.
#[repr(C)]
struct MetadataExtension {
    base: ExtensionBase,
    metadata: *mut Metadata,
}

/// `XLA_FFI_Error` (opaque).
#[repr(C)]
pub struct FfiError {
    _opaque: [u8; 0],
}

/// `XLA_FFI_Error_Create_Args`.
#[repr(C)]
struct ErrorCreateArgs {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    message: *const std::ffi::c_char,
    code: i32,
}

const INVALID_ARGUMENT: i32 = 3;

/// `XLA_FFI_Api`, up to `XLA_FFI_DeviceMemory_Free` (the functions a handler calls; its
/// `struct_size` says how many the running XLA has).
#[repr(C)]
struct Api {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    api_version: ApiVersion,
    internal_api: *mut c_void,
    error_create: unsafe extern "C" fn(*mut ErrorCreateArgs) -> *mut FfiError,
    error_get_message: unsafe extern "C" fn(*mut ErrorArgs),
    error_destroy: unsafe extern "C" fn(*mut ErrorArgs),
    handler_register: *const c_void,
    stream_get: unsafe extern "C" fn(*mut StreamGetArgs) -> *mut FfiError,
    type_id_register: *const c_void,
    execution_context_get: *const c_void,
    state_set: *const c_void,
    state_get: *const c_void,
    device_memory_allocate: unsafe extern "C" fn(*mut AllocateArgs) -> *mut FfiError,
    device_memory_free: unsafe extern "C" fn(*mut FreeArgs) -> *mut FfiError,
}

/// `XLA_FFI_Error_GetMessage_Args` (its `message` written) and `XLA_FFI_Error_Destroy_Args`
/// (the same head, `message` unread).
#[repr(C)]
struct ErrorArgs {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    error: *mut FfiError,
    message: *const std::ffi::c_char,
}

/// `XLA_FFI_Stream_Get_Args`.
#[repr(C)]
struct StreamGetArgs {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    ctx: *mut c_void,
    stream: *mut c_void,
}

/// `XLA_FFI_DeviceMemory_Allocate_Args`.
#[repr(C)]
struct AllocateArgs {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    ctx: *mut c_void,
    size: usize,
    alignment: usize,
    data: *mut c_void,
}

/// `XLA_FFI_DeviceMemory_Free_Args`.
#[repr(C)]
struct FreeArgs {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    ctx: *mut c_void,
    size: usize,
    data: *mut c_void,
}

/// `XLA_FFI_Args` and `XLA_FFI_Rets` (the same layout).
#[repr(C)]
pub struct List {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    size: i64,
    types: *const i32,
    values: *const *mut c_void,
}

/// `XLA_FFI_Attrs`.
#[repr(C)]
struct Attrs {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    size: i64,
    types: *const i32,
    names: *const *const c_void,
    values: *const *mut c_void,
}

/// `XLA_FFI_CallFrame`.
#[repr(C)]
pub struct CallFrame {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    api: *const Api,
    ctx: *mut c_void,
    stage: i32,
    pub(crate) args: List,
    pub(crate) rets: List,
    attrs: Attrs,
    future: *mut c_void,
}

const STAGE_EXECUTE: i32 = 3;
const ARG_BUFFER: i32 = 1;

/// `XLA_FFI_Buffer`.
#[repr(C)]
struct RawBuffer {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    dtype: i32,
    data: *mut c_void,
    rank: i64,
    dims: *const i64,
}

/// XLA's element types (`XLA_FFI_DataType`) the kernels take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DataType {
    S32,
    F32,
    Bf16,
    Other(i32),
}

/// One operand or result: its element type, dims and data.
pub(crate) struct Buffer {
    pub dtype: DataType,
    pub dims: Vec<usize>,
    pub data: *mut c_void,
}

impl Buffer {
    /// The buffer as `len` elements of `T` if its dtype is `want` and its dims `dims`.
    ///
    /// # Safety
    /// XLA's buffer must hold `dims`' product of `T`s and outlive the slice.
    pub unsafe fn slice<'a, T>(&self, what: &str, want: DataType, dims: &[usize]) -> Result<&'a [T], String> {
        self.check(what, want, dims)?;
        // SAFETY: checked dtype and dims; XLA keeps the buffer alive during the call.
        Ok(unsafe { std::slice::from_raw_parts(self.data as *const T, dims.iter().product()) })
    }

    /// As [`Buffer::slice`], writable (a result).
    ///
    /// # Safety
    /// As [`Buffer::slice`], and nothing else may read or write the buffer meanwhile.
    pub unsafe fn slice_mut<'a, T>(&self, what: &str, want: DataType, dims: &[usize]) -> Result<&'a mut [T], String> {
        self.check(what, want, dims)?;
        // SAFETY: as above; a result buffer is this call's alone.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.data as *mut T, dims.iter().product()) })
    }

    fn check(&self, what: &str, want: DataType, dims: &[usize]) -> Result<(), String> {
        if self.dtype != want || self.dims != dims {
            return Err(format!("{what}: expected {want:?} {dims:?}, got {:?} {:?}", self.dtype, self.dims));
        }
        Ok(())
    }
}

/// What a handler does with a frame: answers XLA's metadata query (at registration), skips
/// the stages before execution, or runs `execute` and turns its error into XLA's.
///
/// # Safety
/// `frame` is the call frame XLA passed to the handler.
pub(crate) unsafe fn handle(
    frame: *mut CallFrame,
    execute: impl FnOnce(&CallFrame) -> Result<(), String>,
) -> *mut FfiError {
    // SAFETY: XLA passes a valid frame for the duration of the call.
    let frame = unsafe { &*frame };
    let ext = frame.extension_start;
    // SAFETY: a non-null extension chain holds valid extensions; a metadata one points at
    // XLA's metadata struct to fill.
    if !ext.is_null() && unsafe { (*ext).kind } == EXTENSION_METADATA {
        let metadata = unsafe { &mut *(*(ext as *mut MetadataExtension)).metadata };
        metadata.api_version.major = 0;
        metadata.api_version.minor = 1;
        metadata.traits = 0;
        return std::ptr::null_mut();
    }
    if frame.stage != STAGE_EXECUTE {
        return std::ptr::null_mut();
    }
    match execute(frame) {
        Ok(()) => std::ptr::null_mut(),
        Err(message) => {
            let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
            let mut args = ErrorCreateArgs {
                struct_size: std::mem::size_of::<ErrorCreateArgs>(),
                extension_start: std::ptr::null_mut(),
                message: message.as_ptr(),
                code: INVALID_ARGUMENT,
            };
            // SAFETY: the frame's API table is XLA's; it copies the message.
            unsafe { ((*frame.api).error_create)(&mut args) }
        }
    }
}

/// What XLA's error `error` (from `api`'s function `what`) says; destroys it.
fn take_error(api: &Api, what: &str, error: *mut FfiError) -> String {
    let mut args = ErrorArgs {
        struct_size: std::mem::size_of::<ErrorArgs>(),
        extension_start: std::ptr::null_mut(),
        error,
        message: std::ptr::null(),
    };
    // SAFETY: XLA's error and functions; the message lives until the error is destroyed.
    unsafe {
        (api.error_get_message)(&mut args);
        let message = if args.message.is_null() {
            String::new()
        } else {
            std::ffi::CStr::from_ptr(args.message).to_string_lossy().into_owned()
        };
        args.struct_size = std::mem::size_of::<ErrorArgs>() - std::mem::size_of::<*const std::ffi::c_char>();
        (api.error_destroy)(&mut args);
        format!("{what}: {message}")
    }
}

impl CallFrame {
    fn api(&self) -> Result<&Api, String> {
        // SAFETY: XLA's frame points at its API table for the call's duration.
        let api = unsafe { &*self.api };
        if api.struct_size < std::mem::size_of::<Api>() {
            return Err(format!("XLA's FFI API table is older than this handler ({} bytes)", api.struct_size));
        }
        Ok(api)
    }

    /// The platform stream the call runs on (a `CUstream` on CUDA).
    pub(crate) fn stream(&self) -> Result<*mut c_void, String> {
        let api = self.api()?;
        let mut args = StreamGetArgs {
            struct_size: std::mem::size_of::<StreamGetArgs>(),
            extension_start: std::ptr::null_mut(),
            ctx: self.ctx,
            stream: std::ptr::null_mut(),
        };
        // SAFETY: XLA's function with args of its layout.
        let err = unsafe { (api.stream_get)(&mut args) };
        if !err.is_null() {
            return Err(take_error(api, "XLA_FFI_Stream_Get", err));
        }
        Ok(args.stream)
    }

    /// `size` bytes of device memory from XLA's allocator, given back by [`CallFrame::free`].
    pub(crate) fn allocate(&self, size: usize) -> Result<*mut c_void, String> {
        let api = self.api()?;
        let mut args = AllocateArgs {
            struct_size: std::mem::size_of::<AllocateArgs>(),
            extension_start: std::ptr::null_mut(),
            ctx: self.ctx,
            size,
            alignment: 256,
            data: std::ptr::null_mut(),
        };
        // SAFETY: XLA's function with args of its layout.
        let err = unsafe { (api.device_memory_allocate)(&mut args) };
        if !err.is_null() {
            return Err(take_error(api, "XLA_FFI_DeviceMemory_Allocate", err));
        }
        Ok(args.data)
    }

    /// Gives back what [`CallFrame::allocate`] returned.
    pub(crate) fn free(&self, data: *mut c_void, size: usize) -> Result<(), String> {
        let api = self.api()?;
        let mut args = FreeArgs {
            struct_size: std::mem::size_of::<FreeArgs>(),
            extension_start: std::ptr::null_mut(),
            ctx: self.ctx,
            size,
            data,
        };
        // SAFETY: XLA's function with args of its layout; `data` came from `allocate`.
        let err = unsafe { (api.device_memory_free)(&mut args) };
        if !err.is_null() {
            return Err(take_error(api, "XLA_FFI_DeviceMemory_Free", err));
        }
        Ok(())
    }
}

/// The buffers of an argument or result list.
pub(crate) fn buffers(list: &List) -> Result<Vec<Buffer>, String> {
    (0..list.size.max(0) as usize)
        .map(|i| {
            // SAFETY: XLA's lists hold `size` types and values.
            let (kind, value) = unsafe { (*list.types.add(i), *list.values.add(i)) };
            if kind != ARG_BUFFER {
                return Err(format!("operand {i} is not a buffer (type {kind})"));
            }
            // SAFETY: a buffer operand points at an `XLA_FFI_Buffer` with `rank` dims.
            let raw = unsafe { &*(value as *const RawBuffer) };
            let dims = unsafe { std::slice::from_raw_parts(raw.dims, raw.rank.max(0) as usize) };
            let dtype = match raw.dtype {
                4 => DataType::S32,
                11 => DataType::F32,
                16 => DataType::Bf16,
                other => DataType::Other(other),
            };
            Ok(Buffer { dtype, dims: dims.iter().map(|&d| d as usize).collect(), data: raw.data })
        })
        .collect()
}

// Sizes from the header on LP64: a field out of place would call the wrong function.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<ApiVersion>() == 24);
    assert!(offset_of!(Api, error_create) == 48);
    assert!(offset_of!(Api, stream_get) == 80);
    assert!(offset_of!(Api, device_memory_allocate) == 120);
    assert!(size_of::<Api>() == 136);
    assert!(size_of::<CallFrame>() == 176);
};
