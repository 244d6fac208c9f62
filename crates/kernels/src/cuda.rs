//! [`grouped`]'s products on a CUDA plugin: each group one cuBLAS product on
//! the stream XLA runs the program on.
//!
//! The groups' sizes live on the device (the program counts them); the handler copies them to
//! the host (one small copy and a wait on the stream: the handler is not one XLA may capture
//! in a CUDA graph), turns them into [`Gemm`]s and hands them to
//! `cublasGemmGroupedBatchedEx` (cuBLAS 12.5 and later: one launch for every group, its
//! pointer arrays in memory from XLA's allocator), or to one `cublasGemmEx` per group where
//! cuBLAS lacks it or `SIPHON_CUDA_GROUPED=loop` asks for it. Products sum in f32
//! (`CUBLAS_COMPUTE_32F`, no TF32: f32 programs keep full precision).
//!
//! cuBLAS and the driver are the ones the CUDA plugin loaded (found by soname, `RTLD_NOLOAD`
//! first), never a second copy.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::{Mutex, OnceLock};

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW, Symbol};

use crate::grouped::{self, Element, Gemm, Operand};
use crate::xla_ffi::{self, CallFrame, FfiError};

/// The custom-call target on CUDA: [`grouped::TARGET`]'s name and operands.
pub const TARGET: &str = grouped::TARGET;

/// The XLA FFI handler for [`TARGET`] on a CUDA plugin.
///
/// # Safety
/// Called by XLA with a valid call frame.
pub unsafe extern "C" fn handler(frame: *mut CallFrame) -> *mut FfiError {
    // SAFETY: XLA's frame; `execute` enqueues work on its stream over its buffers only.
    unsafe { xla_ffi::handle(frame, execute) }
}

type CuResult = c_int;
type Stream = *mut c_void;
type Context = *mut c_void;
type CublasHandle = *mut c_void;

/// `CUBLAS_OP_N`, `CUBLAS_OP_T`.
const OP_N: c_int = 0;
const OP_T: c_int = 1;
/// `CUDA_R_32F`, `CUDA_R_16BF`.
const R_32F: c_int = 0;
const R_16BF: c_int = 14;
/// `CUBLAS_COMPUTE_32F`, `CUBLAS_GEMM_DEFAULT`.
const COMPUTE_32F: c_int = 68;
const GEMM_DEFAULT: c_int = -1;

type GemmEx = unsafe extern "C" fn(
    CublasHandle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    *mut c_void,
    c_int,
    c_int,
    c_int,
    c_int,
) -> c_int;

type GemmGroupedBatchedEx = unsafe extern "C" fn(
    CublasHandle,
    *const c_int,
    *const c_int,
    *const c_int,
    *const c_int,
    *const c_int,
    *const c_void,
    *const *const c_void,
    c_int,
    *const c_int,
    *const *const c_void,
    c_int,
    *const c_int,
    *const c_void,
    *const *mut c_void,
    c_int,
    *const c_int,
    c_int,
    *const c_int,
    c_int,
) -> c_int;

/// The driver's and cuBLAS's functions the handler calls.
struct Cuda {
    /// The stream's own context, pushed for the call where the driver has the function;
    /// else the thread's current one (XLA's, as jaxlib's handlers assume).
    stream_get_ctx: Option<Symbol<unsafe extern "C" fn(Stream, *mut Context) -> CuResult>>,
    ctx_get_current: Symbol<unsafe extern "C" fn(*mut Context) -> CuResult>,
    ctx_push: Symbol<unsafe extern "C" fn(Context) -> CuResult>,
    ctx_pop: Symbol<unsafe extern "C" fn(*mut Context) -> CuResult>,
    copy_to_host: Symbol<unsafe extern "C" fn(*mut c_void, u64, usize, Stream) -> CuResult>,
    copy_to_device: Symbol<unsafe extern "C" fn(u64, *const c_void, usize, Stream) -> CuResult>,
    synchronize: Symbol<unsafe extern "C" fn(Stream) -> CuResult>,
    error_string: Symbol<unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult>,
    create: Symbol<unsafe extern "C" fn(*mut CublasHandle) -> c_int>,
    set_stream: Symbol<unsafe extern "C" fn(CublasHandle, Stream) -> c_int>,
    gemm: Symbol<GemmEx>,
    grouped: Option<Symbol<GemmGroupedBatchedEx>>,
    /// One cuBLAS handle per CUDA context (device), made on first use.
    handles: Mutex<HashMap<usize, usize>>,
}

// SAFETY: the symbols are plain function pointers into libraries never unloaded; the handle
// map is behind a mutex.
unsafe impl Send for Cuda {}
unsafe impl Sync for Cuda {}

/// The first of `names` already loaded in this process, else the first that loads.
fn library(names: &[&str]) -> Result<Library, String> {
    for flags in [RTLD_NOW | RTLD_LOCAL | libc::RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL] {
        for name in names {
            // SAFETY: loading CUDA's own libraries runs only their initializers.
            if let Ok(lib) = unsafe { Library::open(Some(*name), flags) } {
                return Ok(lib);
            }
        }
    }
    Err(format!("{TARGET}: none of {names:?} could be loaded"))
}

impl Cuda {
    fn get() -> Result<&'static Cuda, String> {
        static CUDA: OnceLock<Result<Cuda, String>> = OnceLock::new();
        CUDA.get_or_init(Cuda::load).as_ref().map_err(Clone::clone)
    }

    fn load() -> Result<Cuda, String> {
        // Never unloaded: the symbols live as long as the process.
        let driver: &'static Library = Box::leak(Box::new(library(&["libcuda.so.1", "libcuda.so"])?));
        let cublas: &'static Library =
            Box::leak(Box::new(library(&["libcublas.so.13", "libcublas.so.12", "libcublas.so"])?));
        fn sym<T>(lib: &'static Library, name: &str) -> Result<Symbol<T>, String> {
            // SAFETY: each name is declared with its C signature above.
            unsafe { lib.get(name.as_bytes()) }.map_err(|e| format!("{TARGET}: {name}: {e}"))
        }
        Ok(Cuda {
            stream_get_ctx: sym(driver, "cuStreamGetCtx").ok(),
            ctx_get_current: sym(driver, "cuCtxGetCurrent")?,
            ctx_push: sym(driver, "cuCtxPushCurrent_v2")?,
            ctx_pop: sym(driver, "cuCtxPopCurrent_v2")?,
            copy_to_host: sym(driver, "cuMemcpyDtoHAsync_v2")?,
            copy_to_device: sym(driver, "cuMemcpyHtoDAsync_v2")?,
            synchronize: sym(driver, "cuStreamSynchronize")?,
            error_string: sym(driver, "cuGetErrorString")?,
            create: sym(cublas, "cublasCreate_v2")?,
            set_stream: sym(cublas, "cublasSetStream_v2")?,
            gemm: sym(cublas, "cublasGemmEx")?,
            grouped: sym(cublas, "cublasGemmGroupedBatchedEx").ok(),
            handles: Mutex::new(HashMap::new()),
        })
    }

    /// `Ok` for `CUDA_SUCCESS`, else the driver's name for the error.
    fn check(&self, what: &str, result: CuResult) -> Result<(), String> {
        if result == 0 {
            return Ok(());
        }
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: the driver's function; it points `text` at a static string or leaves it null.
        unsafe { (self.error_string)(result, &mut text) };
        let text = if text.is_null() {
            "unknown".into()
        } else {
            // SAFETY: a static C string from the driver.
            unsafe { CStr::from_ptr(text) }.to_string_lossy()
        };
        Err(format!("{TARGET}: {what} failed: CUDA error {result} ({text})"))
    }

    /// cuBLAS's handle for `ctx` (current), bound to `stream`.
    fn handle(&self, ctx: Context, stream: Stream) -> Result<CublasHandle, String> {
        let mut handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        let handle = match handles.get(&(ctx as usize)) {
            Some(&h) => h as CublasHandle,
            None => {
                let mut h = std::ptr::null_mut();
                // SAFETY: cuBLAS's function; `ctx` is current.
                cublas_check("cublasCreate", unsafe { (self.create)(&mut h) })?;
                handles.insert(ctx as usize, h as usize);
                h
            }
        };
        // SAFETY: a live handle and XLA's stream.
        cublas_check("cublasSetStream", unsafe { (self.set_stream)(handle, stream) })?;
        Ok(handle)
    }
}

fn cublas_check(what: &str, status: c_int) -> Result<(), String> {
    if status == 0 { Ok(()) } else { Err(format!("{TARGET}: {what} failed: cuBLAS status {status}")) }
}

/// Pops the context [`Cuda::enter`] pushed, if it pushed one, on every way out.
struct Entered<'a> {
    cuda: &'a Cuda,
    ctx: Context,
    pushed: bool,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if self.pushed {
            let mut ctx = std::ptr::null_mut();
            // SAFETY: pops the context pushed when this guard was made.
            unsafe { (self.cuda.ctx_pop)(&mut ctx) };
        }
    }
}

impl Cuda {
    /// Makes `stream`'s context current for the call (or takes the thread's current one).
    fn enter(&self, stream: Stream) -> Result<Entered<'_>, String> {
        let mut ctx = std::ptr::null_mut();
        if let Some(stream_get_ctx) = &self.stream_get_ctx {
            // SAFETY: XLA's stream; the driver writes its context.
            self.check("cuStreamGetCtx", unsafe { stream_get_ctx(stream, &mut ctx) })?;
            // SAFETY: the stream's own context, popped by the guard.
            self.check("cuCtxPushCurrent", unsafe { (self.ctx_push)(ctx) })?;
            return Ok(Entered { cuda: self, ctx, pushed: true });
        }
        // SAFETY: the driver writes the thread's current context.
        self.check("cuCtxGetCurrent", unsafe { (self.ctx_get_current)(&mut ctx) })?;
        if ctx.is_null() {
            return Err(format!("{TARGET}: no CUDA context is current on XLA's thread"));
        }
        Ok(Entered { cuda: self, ctx, pushed: false })
    }
}

fn execute(frame: &CallFrame) -> Result<(), String> {
    let args = xla_ffi::buffers(&frame.args)?;
    let rets = xla_ffi::buffers(&frame.rets)?;
    let shape = grouped::check(
        &args.iter().map(Operand::from).collect::<Vec<_>>(),
        &rets.iter().map(Operand::from).collect::<Vec<_>>(),
    )?;
    let cuda = Cuda::get()?;
    let stream = frame.stream()?;
    let entered = cuda.enter(stream)?;
    let mut counts = vec![0i32; shape.groups];
    // SAFETY: `counts` holds the operand's `groups` s32s (checked); the copy is waited for.
    unsafe {
        let bytes = counts.len() * 4;
        let copy = (cuda.copy_to_host)(counts.as_mut_ptr().cast(), args[1].data as u64, bytes, stream);
        cuda.check("copying the group sizes to the host", copy)?;
        cuda.check("cuStreamSynchronize", (cuda.synchronize)(stream))?;
    }
    let gemms = shape.gemms(&counts)?;
    if gemms.is_empty() {
        return Ok(());
    }
    let handle = cuda.handle(entered.ctx, stream)?;
    let operands = Operands {
        dtype: match shape.element {
            Element::F32 => R_32F,
            Element::Bf16 => R_16BF,
        },
        size: match shape.element {
            Element::F32 => 4,
            Element::Bf16 => 2,
        },
        w: args[2].data,
        lhs: args[0].data,
        out: rets[0].data,
    };
    let looped = std::env::var("SIPHON_CUDA_GROUPED").is_ok_and(|v| v == "loop");
    match &cuda.grouped {
        Some(grouped) if !looped => run_grouped(cuda, frame, stream, handle, grouped, &operands, &gemms),
        _ => run_looped(cuda, handle, &operands, &gemms),
    }
}

/// The product's device buffers and element type.
struct Operands {
    dtype: c_int,
    size: usize,
    w: *mut c_void,
    lhs: *mut c_void,
    out: *mut c_void,
}

impl Operands {
    /// `A`, `B` and `C` of `g` on the device.
    fn pointers(&self, g: &Gemm) -> [*mut c_void; 3] {
        let at = |base: *mut c_void, offset: usize| base.cast::<u8>().wrapping_add(offset * self.size).cast();
        [at(self.w, g.a), at(self.lhs, g.b), at(self.out, g.c)]
    }
}

fn run_looped(cuda: &Cuda, handle: CublasHandle, ops: &Operands, gemms: &[Gemm]) -> Result<(), String> {
    let (one, zero) = (1.0f32, 0.0f32);
    for g in gemms {
        let [a, b, c] = ops.pointers(g);
        let d = |v: usize| v as c_int;
        // SAFETY: checked dims: each group's matrices lie inside the operands' buffers.
        let status = unsafe {
            (cuda.gemm)(
                handle,
                OP_T,
                OP_N,
                d(g.m),
                d(g.n),
                d(g.k),
                (&one as *const f32).cast(),
                a,
                ops.dtype,
                d(g.lda),
                b,
                ops.dtype,
                d(g.ldb),
                (&zero as *const f32).cast(),
                c,
                ops.dtype,
                d(g.ldc),
                COMPUTE_32F,
                GEMM_DEFAULT,
            )
        };
        cublas_check("cublasGemmEx", status)?;
    }
    Ok(())
}

fn run_grouped(
    cuda: &Cuda,
    frame: &CallFrame,
    stream: Stream,
    handle: CublasHandle,
    grouped: &GemmGroupedBatchedEx,
    ops: &Operands,
    gemms: &[Gemm],
) -> Result<(), String> {
    let n = gemms.len();
    let d = |f: fn(&Gemm) -> usize| gemms.iter().map(|g| f(g) as c_int).collect::<Vec<c_int>>();
    let (m, cols, k) = (d(|g| g.m), d(|g| g.n), d(|g| g.k));
    let (lda, ldb, ldc) = (d(|g| g.lda), d(|g| g.ldb), d(|g| g.ldc));
    let (ta, tb, sizes) = (vec![OP_T; n], vec![OP_N; n], vec![1 as c_int; n]);
    let (alpha, beta) = (vec![1.0f32; n], vec![0.0f32; n]);
    // Every group's A, B and C pointers, in that order, copied to device memory.
    let mut pointers: Vec<*mut c_void> = Vec::with_capacity(3 * n);
    for part in 0..3 {
        pointers.extend(gemms.iter().map(|g| ops.pointers(g)[part]));
    }
    let bytes = pointers.len() * std::mem::size_of::<*mut c_void>();
    let device = frame.allocate(bytes)?;
    let result = (|| {
        // SAFETY: `device` holds `bytes`; pageable memory is copied before the call returns.
        let copy = unsafe { (cuda.copy_to_device)(device as u64, pointers.as_ptr().cast(), bytes, stream) };
        cuda.check("copying the groups' pointers to the device", copy)?;
        let array = |part: usize| device.cast::<*mut c_void>().wrapping_add(part * n);
        // SAFETY: host arrays of `n` each; device pointer arrays into checked buffers.
        let status = unsafe {
            grouped(
                handle,
                ta.as_ptr(),
                tb.as_ptr(),
                m.as_ptr(),
                cols.as_ptr(),
                k.as_ptr(),
                alpha.as_ptr().cast(),
                array(0) as *const *const c_void,
                ops.dtype,
                lda.as_ptr(),
                array(1) as *const *const c_void,
                ops.dtype,
                ldb.as_ptr(),
                beta.as_ptr().cast(),
                array(2) as *const *mut c_void,
                ops.dtype,
                ldc.as_ptr(),
                n as c_int,
                sizes.as_ptr(),
                COMPUTE_32F,
            )
        };
        cublas_check("cublasGemmGroupedBatchedEx", status)
    })();
    // XLA's allocator orders the memory's reuse on this stream after the product.
    frame.free(device, bytes)?;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A library already in the process is found by its soname (the plugin's copy of cuBLAS,
    /// never a second one); one nowhere is named in the error.
    #[test]
    fn libraries_are_found_loaded_first_and_missing_ones_named() {
        assert!(library(&["libsiphon-none.so.9", "libc.so.6"]).is_ok());
        let Err(err) = library(&["libsiphon-none.so.9"]) else { panic!("a library that is nowhere loaded") };
        assert!(err.contains("libsiphon-none.so.9") && err.starts_with(TARGET), "{err}");
    }
}
