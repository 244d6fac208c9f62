//! Element types, host arrays and device buffers.

use std::ffi::c_void;
use std::sync::Arc;

use half::{bf16, f16};

use crate::client::{Client, ClientInner};
use crate::error::{Error, Result};
use crate::ffi::{self, slot};

/// An array element type (PJRT's `PJRT_Buffer_Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ElementType {
    /// Boolean, one byte per element.
    Pred,
    /// Signed 8-bit integer.
    S8,
    /// Signed 16-bit integer.
    S16,
    /// Signed 32-bit integer.
    S32,
    /// Signed 64-bit integer.
    S64,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// IEEE half precision.
    F16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// bfloat16.
    BF16,
}

impl ElementType {
    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            ElementType::Pred | ElementType::S8 | ElementType::U8 => 1,
            ElementType::S16 | ElementType::U16 | ElementType::F16 | ElementType::BF16 => 2,
            ElementType::S32 | ElementType::U32 | ElementType::F32 => 4,
            ElementType::S64 | ElementType::U64 | ElementType::F64 => 8,
        }
    }

    /// The StableHLO spelling (`f32`, `bf16`, `i32`, `ui8`, `i1`, ...).
    pub fn stablehlo_name(self) -> &'static str {
        match self {
            ElementType::Pred => "i1",
            ElementType::S8 => "i8",
            ElementType::S16 => "i16",
            ElementType::S32 => "i32",
            ElementType::S64 => "i64",
            ElementType::U8 => "ui8",
            ElementType::U16 => "ui16",
            ElementType::U32 => "ui32",
            ElementType::U64 => "ui64",
            ElementType::F16 => "f16",
            ElementType::F32 => "f32",
            ElementType::F64 => "f64",
            ElementType::BF16 => "bf16",
        }
    }

    pub(crate) fn to_raw(self) -> i32 {
        match self {
            ElementType::Pred => 1,
            ElementType::S8 => 2,
            ElementType::S16 => 3,
            ElementType::S32 => 4,
            ElementType::S64 => 5,
            ElementType::U8 => 6,
            ElementType::U16 => 7,
            ElementType::U32 => 8,
            ElementType::U64 => 9,
            ElementType::F16 => 10,
            ElementType::F32 => 11,
            ElementType::F64 => 12,
            ElementType::BF16 => 13,
        }
    }

    pub(crate) fn from_raw(raw: i32) -> Option<ElementType> {
        Some(match raw {
            1 => ElementType::Pred,
            2 => ElementType::S8,
            3 => ElementType::S16,
            4 => ElementType::S32,
            5 => ElementType::S64,
            6 => ElementType::U8,
            7 => ElementType::U16,
            8 => ElementType::U32,
            9 => ElementType::U64,
            10 => ElementType::F16,
            11 => ElementType::F32,
            12 => ElementType::F64,
            13 => ElementType::BF16,
            _ => return None,
        })
    }
}

impl std::fmt::Display for ElementType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.stablehlo_name())
    }
}

/// Rust element types that map to a PJRT element type.
pub trait NativeType: bytemuck::Pod {
    /// The matching element type.
    const TYPE: ElementType;
}

macro_rules! native {
    ($($t:ty => $e:ident),*) => { $(impl NativeType for $t { const TYPE: ElementType = ElementType::$e; })* };
}
native!(f32 => F32, f64 => F64, bf16 => BF16, f16 => F16, i8 => S8, i16 => S16, i32 => S32,
    i64 => S64, u8 => U8, u16 => U16, u32 => U32, u64 => U64);

/// A dense row-major array in host memory: element type, shape and bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct HostArray {
    element_type: ElementType,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl HostArray {
    /// An array from raw little-endian bytes; checks the length against the shape.
    pub fn from_bytes(element_type: ElementType, shape: &[usize], bytes: Vec<u8>) -> Result<HostArray> {
        let expected = shape.iter().product::<usize>() * element_type.size_in_bytes();
        if bytes.len() != expected {
            return Err(Error::InvalidArgument(format!(
                "{} bytes do not hold a {element_type}{shape:?} array ({expected} bytes)",
                bytes.len()
            )));
        }
        Ok(HostArray { element_type, shape: shape.to_vec(), bytes })
    }

    /// An array of `T` values; checks the count against the shape.
    pub fn from_slice<T: NativeType>(shape: &[usize], values: &[T]) -> Result<HostArray> {
        HostArray::from_bytes(T::TYPE, shape, bytemuck::cast_slice(values).to_vec())
    }

    /// A scalar-free array of zeros.
    pub fn zeros(element_type: ElementType, shape: &[usize]) -> HostArray {
        let len = shape.iter().product::<usize>() * element_type.size_in_bytes();
        HostArray { element_type, shape: shape.to_vec(), bytes: vec![0; len] }
    }

    /// The element type.
    pub fn element_type(&self) -> ElementType {
        self.element_type
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The raw row-major bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Takes the raw bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as `T`, which must be the array's element type.
    pub fn to_vec<T: NativeType>(&self) -> Result<Vec<T>> {
        if T::TYPE != self.element_type {
            return Err(Error::InvalidArgument(format!("array holds {}, not {}", self.element_type, T::TYPE)));
        }
        // Copy element by element: `bytes` has no alignment guarantee for `T`.
        let mut values = vec![T::zeroed(); self.len()];
        bytemuck::cast_slice_mut::<T, u8>(&mut values).copy_from_slice(&self.bytes);
        Ok(values)
    }

    /// The values converted to f32 (from any float type; integers are cast).
    pub fn to_f32(&self) -> Vec<f32> {
        let b = &self.bytes;
        let chunks = |n: usize| b.chunks_exact(n);
        match self.element_type {
            ElementType::F32 => chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
            ElementType::F64 => chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32).collect(),
            ElementType::BF16 => chunks(2).map(|c| bf16::from_le_bytes(c.try_into().unwrap()).to_f32()).collect(),
            ElementType::F16 => chunks(2).map(|c| f16::from_le_bytes(c.try_into().unwrap()).to_f32()).collect(),
            ElementType::Pred | ElementType::U8 => b.iter().map(|&v| v as f32).collect(),
            ElementType::S8 => b.iter().map(|&v| v as i8 as f32).collect(),
            ElementType::S16 => chunks(2).map(|c| i16::from_le_bytes(c.try_into().unwrap()) as f32).collect(),
            ElementType::U16 => chunks(2).map(|c| u16::from_le_bytes(c.try_into().unwrap()) as f32).collect(),
            ElementType::S32 => chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f32).collect(),
            ElementType::U32 => chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap()) as f32).collect(),
            ElementType::S64 => chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f32).collect(),
            ElementType::U64 => chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap()) as f32).collect(),
        }
    }
}

/// An array on one device. Freed on drop; keeps its client alive.
pub struct Buffer {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) raw: *mut ffi::PJRT_Buffer,
}

// SAFETY: PJRT buffers are thread-safe (XLA's PjRtBuffer is internally synchronized and
// may be read, copied and freed from any thread); the client it points at is Send + Sync.
unsafe impl Send for Buffer {}
// SAFETY: see `Send`; shared references only issue PJRT calls that read the buffer.
unsafe impl Sync for Buffer {}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut args: ffi::PJRT_Buffer_Destroy_Args = ffi::zeroed();
        args.buffer = self.raw;
        // SAFETY: the buffer is live and destroyed once.
        if let Err(err) = unsafe { self.client.plugin.call(slot::Buffer_Destroy, &mut args) } {
            tracing::warn!("failed to destroy PJRT buffer: {err}");
        }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("element_type", &self.element_type().ok())
            .field("dims", &self.dims().ok())
            .field("device", &self.device_id().ok())
            .finish()
    }
}

impl Client {
    /// Copies `array` to device `device_id` and waits until the host memory is no longer
    /// needed.
    pub fn upload(&self, array: &HostArray, device_id: usize) -> Result<Buffer> {
        self.upload_bytes(array.element_type, &array.shape, &array.bytes, device_id)
    }

    /// Copies a row-major host array given as raw bytes to device `device_id`.
    pub fn upload_bytes(
        &self,
        element_type: ElementType,
        shape: &[usize],
        bytes: &[u8],
        device_id: usize,
    ) -> Result<Buffer> {
        let mut buffers = self.upload_many(&[Upload { element_type, shape, bytes, device_id }])?;
        Ok(buffers.remove(0))
    }

    /// Starts every transfer, then waits for all of them: on accelerators the copies overlap.
    /// Returns the buffers in the order of `uploads`.
    pub fn upload_many(&self, uploads: &[Upload<'_>]) -> Result<Vec<Buffer>> {
        // Validate everything before the first transfer starts.
        for upload in uploads {
            let expected = upload.shape.iter().product::<usize>() * upload.element_type.size_in_bytes();
            if upload.bytes.len() != expected {
                return Err(Error::InvalidArgument(format!(
                    "{} bytes do not hold a {}{:?} array ({expected} bytes)",
                    upload.bytes.len(),
                    upload.element_type,
                    upload.shape
                )));
            }
            self.inner.addressable_device(upload.device_id)?;
        }
        let mut buffers = Vec::with_capacity(uploads.len());
        let mut pending = Vec::with_capacity(uploads.len());
        let mut first_error = None;
        for upload in uploads {
            match self.start_upload(upload) {
                Ok((buffer, done)) => {
                    buffers.push(buffer);
                    pending.push(done);
                }
                Err(err) => {
                    first_error = Some(err);
                    break;
                }
            }
        }
        // Every started transfer is awaited, even after an error: the host bytes are borrowed
        // only until this function returns.
        for done in pending {
            if let Err(err) = self.inner.plugin.await_event(done, "PJRT_Client_BufferFromHostBuffer") {
                first_error.get_or_insert(err);
            }
        }
        match first_error {
            Some(err) => Err(err),
            None => Ok(buffers),
        }
    }

    /// Starts one transfer; the returned event fires when `upload.bytes` may be released.
    fn start_upload(&self, upload: &Upload<'_>) -> Result<(Buffer, *mut ffi::PJRT_Event)> {
        let inner = &self.inner;
        let device = inner.addressable_device(upload.device_id)?;
        let dims: Vec<i64> = upload.shape.iter().map(|&d| d as i64).collect();
        let mut args: ffi::PJRT_Client_BufferFromHostBuffer_Args = ffi::zeroed();
        args.client = inner.raw;
        // A zero-length array still needs a valid pointer.
        static EMPTY: [u8; 8] = [0; 8];
        let data = if upload.bytes.is_empty() { EMPTY.as_ptr() } else { upload.bytes.as_ptr() };
        args.data = data as *const c_void;
        args.type_ = upload.element_type.to_raw();
        args.dims = dims.as_ptr();
        args.num_dims = dims.len();
        args.host_buffer_semantics = ffi::HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
        args.device = device.raw;
        // SAFETY: `dims` outlives the call; `bytes` stays borrowed until the caller has waited
        // on `done_with_host_buffer` (see `upload_many`).
        unsafe { inner.plugin.call(slot::Client_BufferFromHostBuffer, &mut args) }?;
        if args.buffer.is_null() {
            inner.plugin.await_event(args.done_with_host_buffer, "PJRT_Client_BufferFromHostBuffer")?;
            return Err(Error::Unexpected("BufferFromHostBuffer returned no buffer".into()));
        }
        Ok((Buffer { client: inner.clone(), raw: args.buffer }, args.done_with_host_buffer))
    }
}

/// One host-to-device copy for [`Client::upload_many`]: row-major `bytes` of `shape`.
#[derive(Debug, Clone, Copy)]
pub struct Upload<'a> {
    /// Element type of `bytes`.
    pub element_type: ElementType,
    /// The array's shape.
    pub shape: &'a [usize],
    /// Dense row-major little-endian bytes.
    pub bytes: &'a [u8],
    /// The destination device id.
    pub device_id: usize,
}

/// Copies several buffers to the host, starting every copy before waiting on any.
pub fn download_many(buffers: &[&Buffer]) -> Result<Vec<HostArray>> {
    struct Pending {
        element_type: ElementType,
        dims: Vec<usize>,
        bytes: Vec<u8>,
        event: *mut ffi::PJRT_Event,
    }
    let mut pending: Vec<Pending> = Vec::with_capacity(buffers.len());
    let mut first_error = None;
    for buffer in buffers {
        match buffer.start_to_host() {
            Ok((element_type, dims, bytes, event)) => pending.push(Pending { element_type, dims, bytes, event }),
            Err(err) => {
                first_error = Some(err);
                break;
            }
        }
    }
    // Await every started copy before the destination vectors can be dropped.
    let mut arrays = Vec::with_capacity(pending.len());
    for (item, buffer) in pending.into_iter().zip(buffers) {
        match buffer.client.plugin.await_event(item.event, "PJRT_Buffer_ToHostBuffer") {
            Ok(()) => arrays.push(HostArray { element_type: item.element_type, shape: item.dims, bytes: item.bytes }),
            Err(err) => {
                first_error.get_or_insert(err);
            }
        }
    }
    match first_error {
        Some(err) => Err(err),
        None => Ok(arrays),
    }
}

impl Buffer {
    /// The element type.
    pub fn element_type(&self) -> Result<ElementType> {
        let mut args: ffi::PJRT_Buffer_ElementType_Args = ffi::zeroed();
        args.buffer = self.raw;
        // SAFETY: the buffer is live.
        unsafe { self.client.plugin.call(slot::Buffer_ElementType, &mut args) }?;
        ElementType::from_raw(args.type_)
            .ok_or_else(|| Error::Unexpected(format!("unsupported PJRT element type {}", args.type_)))
    }

    /// The dimensions.
    pub fn dims(&self) -> Result<Vec<usize>> {
        let mut args: ffi::PJRT_Buffer_Dimensions_Args = ffi::zeroed();
        args.buffer = self.raw;
        // SAFETY: the buffer is live.
        unsafe { self.client.plugin.call(slot::Buffer_Dimensions, &mut args) }?;
        if args.num_dims == 0 || args.dims.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: `dims` has `num_dims` entries and lives as long as the buffer.
        let dims = unsafe { std::slice::from_raw_parts(args.dims, args.num_dims) };
        Ok(dims.iter().map(|&d| d.max(0) as usize).collect())
    }

    /// The id of the device holding the buffer.
    pub fn device_id(&self) -> Result<usize> {
        let raw = self.raw_device()?;
        self.client
            .device_id_of(raw)
            .ok_or_else(|| Error::Unexpected("buffer on a device the client does not list".into()))
    }

    pub(crate) fn raw_device(&self) -> Result<*mut ffi::PJRT_Device> {
        let mut args: ffi::PJRT_Buffer_Device_Args = ffi::zeroed();
        args.buffer = self.raw;
        // SAFETY: the buffer is live.
        unsafe { self.client.plugin.call(slot::Buffer_Device, &mut args) }?;
        Ok(args.device)
    }

    /// Bytes the buffer occupies on its device (may exceed the dense size: padding, tiling).
    pub fn on_device_size_in_bytes(&self) -> Result<usize> {
        let mut args: ffi::PJRT_Buffer_OnDeviceSizeInBytes_Args = ffi::zeroed();
        args.buffer = self.raw;
        // SAFETY: the buffer is live.
        unsafe { self.client.plugin.call(slot::Buffer_OnDeviceSizeInBytes, &mut args) }?;
        Ok(args.on_device_size_in_bytes)
    }

    /// Waits until the buffer's contents are computed (or failed).
    pub fn wait_ready(&self) -> Result<()> {
        let mut args: ffi::PJRT_Buffer_ReadyEvent_Args = ffi::zeroed();
        args.buffer = self.raw;
        // SAFETY: the buffer is live.
        unsafe { self.client.plugin.call(slot::Buffer_ReadyEvent, &mut args) }?;
        self.client.plugin.await_event(args.event, "PJRT_Buffer_ReadyEvent")
    }

    /// Copies the buffer to host memory (dense, row-major).
    pub fn to_host(&self) -> Result<HostArray> {
        Ok(download_many(&[self])?.remove(0))
    }

    /// Starts a device-to-host copy into a new dense row-major vector. The caller must await
    /// the event before the vector is read or dropped.
    fn start_to_host(&self) -> Result<(ElementType, Vec<usize>, Vec<u8>, *mut ffi::PJRT_Event)> {
        let element_type = self.element_type()?;
        let dims = self.dims()?;
        let mut bytes = vec![0u8; dims.iter().product::<usize>() * element_type.size_in_bytes()];
        // SAFETY: `bytes` (whose heap block does not move when the Vec is moved) is not
        // touched until the caller awaits the event.
        let event = unsafe { self.start_copy(&dims, bytes.as_mut_ptr(), bytes.len()) }?;
        Ok((element_type, dims, bytes, event))
    }

    /// Starts copying the buffer (dense, row-major) into `dst`, which must hold exactly its
    /// bytes; the copy is done when the returned [`Download`] is waited on or dropped, and
    /// `dst` stays borrowed until then.
    pub fn to_host_into<'a>(&self, dst: &'a mut [u8]) -> Result<Download<'a>> {
        let dims = self.dims()?;
        let expected = dims.iter().product::<usize>() * self.element_type()?.size_in_bytes();
        if dst.len() != expected {
            return Err(Error::InvalidArgument(format!(
                "a {}-byte destination for a {expected}-byte buffer {dims:?}",
                dst.len()
            )));
        }
        let mut download = Download::done();
        // SAFETY: `dst` is borrowed by the download, which awaits the copy before it ends.
        let event = unsafe { self.start_copy(&dims, dst.as_mut_ptr(), dst.len()) }?;
        download.pending.push((Arc::clone(&self.client.plugin), event));
        Ok(download)
    }

    /// Starts a device-to-host copy of the whole buffer (of `dims`) into `len` bytes at `dst`.
    ///
    /// # Safety
    /// `dst` must hold `len` bytes that nothing reads, writes or frees until the returned event
    /// (null when there is nothing to copy) has been awaited.
    unsafe fn start_copy(&self, dims: &[usize], dst: *mut u8, len: usize) -> Result<*mut ffi::PJRT_Event> {
        if len == 0 {
            return Ok(std::ptr::null_mut());
        }
        // Ask for a dense row-major host layout: a device's own layout may be tiled or
        // permuted (TPU), and a null layout would copy that.
        let minor_to_major: Vec<i64> = (0..dims.len() as i64).rev().collect();
        let mut layout: ffi::PJRT_Buffer_MemoryLayout = ffi::zeroed_plain();
        layout.struct_size = std::mem::size_of::<ffi::PJRT_Buffer_MemoryLayout>();
        layout.type_ = ffi::MEMORY_LAYOUT_TILED;
        // Writing a field of the zeroed union selects its `tiled` member.
        layout.layout.tiled.struct_size = std::mem::size_of::<ffi::PJRT_Buffer_MemoryLayout_Tiled>();
        layout.layout.tiled.minor_to_major = minor_to_major.as_ptr();
        layout.layout.tiled.minor_to_major_size = minor_to_major.len();
        let mut args: ffi::PJRT_Buffer_ToHostBuffer_Args = ffi::zeroed();
        args.src = self.raw;
        args.host_layout = &mut layout;
        args.dst = dst as *mut c_void;
        args.dst_size = len;
        // SAFETY: the layout lives through the call; the caller keeps `dst` for the copy.
        unsafe { self.client.plugin.call(slot::Buffer_ToHostBuffer, &mut args) }?;
        Ok(args.event)
    }
}

/// Device-to-host copies under way into memory they borrow ([`Buffer::to_host_into`],
/// [`crate::ShardedArray::rows_into`]). [`Download::wait`] returns when every copy is done,
/// with the first error; dropping it waits too, so the memory is never reused or freed under
/// a copy.
#[must_use = "a download must be waited on before its destination is read"]
pub struct Download<'a> {
    pending: Vec<(Arc<crate::plugin::Plugin>, *mut ffi::PJRT_Event)>,
    _dst: std::marker::PhantomData<&'a mut [u8]>,
}

// SAFETY: PJRT events may be awaited and destroyed from any thread; the destination is a
// `&mut [u8]`, which is Send.
unsafe impl Send for Download<'_> {}

impl<'a> Download<'a> {
    /// A download with nothing left to wait for.
    pub fn done() -> Download<'a> {
        Download { pending: Vec::new(), _dst: std::marker::PhantomData }
    }

    /// One download of this one's copies and `other`'s.
    pub fn join(mut self, mut other: Download<'a>) -> Download<'a> {
        self.pending.append(&mut other.pending);
        self
    }

    /// Waits for every copy; the first error, after all are done.
    pub fn wait(mut self) -> Result<()> {
        let mut first_error = None;
        for (plugin, event) in self.pending.drain(..) {
            if let Err(err) = plugin.await_event(event, "PJRT_Buffer_ToHostBuffer") {
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Download<'_> {
    fn drop(&mut self) {
        for (plugin, event) in self.pending.drain(..) {
            if let Err(err) = plugin.await_event(event, "PJRT_Buffer_ToHostBuffer") {
                tracing::warn!("a device-to-host copy dropped unawaited failed: {err}");
            }
        }
    }
}
