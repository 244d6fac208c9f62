//! Kernels XLA lacks or emits poorly, run inside siphon's programs as typed XLA FFI custom
//! calls, on the CPU plugin and on a CUDA plugin.
//!
//! A program names a kernel in `stablehlo.custom_call @name(…) {api_version = 4 : i32}`;
//! `siphon-runtime` registers every [`KERNELS`] entry of its plugin's [`Platform`] with the
//! plugin's FFI extension before compiling, and XLA calls the handler with the operands' and
//! result's buffers in place (host memory on the CPU, device memory and a stream on CUDA).
//! Only what XLA cannot emit well lives here:
//!
//! - [`experts`] (CPU): a mixture's gated experts (SiLU, tanh GELU, or GPT-OSS's clamped
//!   SwiGLU with biases), each token through its own experts only, reading each expert's
//!   weights where they lie in the stacked `[E, …]` tensors (XLA copies a dynamically sliced
//!   operand out before every product; docs/BENCHMARKS.md).
//! - [`grouped`]: one projection of every expert at once, each group of rows (an expert's
//!   queue) times its own matrix of a stack — cuBLAS's grouped products on CUDA ([`cuda`]), a
//!   plain loop reading the same descriptors on the CPU (for tests of the program's form).
//!
//! Each kernel checks its operands' dtypes and shapes and returns an XLA error naming what is
//! wrong rather than reading past a buffer.

pub mod cuda;
pub mod experts;
pub mod grouped;
mod xla_ffi;

pub use xla_ffi::{CallFrame, FfiError};

/// A typed XLA FFI handler (`XLA_FFI_Handler`).
pub type Handler = unsafe extern "C" fn(*mut CallFrame) -> *mut FfiError;

/// The platform a handler runs on, as XLA's FFI registry names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    Host,
    Cuda,
}

impl Platform {
    /// XLA's name for it in its FFI registry.
    pub fn name(self) -> &'static str {
        match self {
            Platform::Host => "Host",
            Platform::Cuda => "CUDA",
        }
    }
}

/// One kernel: the custom-call target a program names, its handler and the platform it runs on.
#[derive(Debug, Clone, Copy)]
pub struct Kernel {
    pub name: &'static str,
    pub handler: Handler,
    pub platform: Platform,
}

/// Every kernel, for the runtime to register those of its plugin's platform.
pub const KERNELS: &[Kernel] = &[
    Kernel { name: experts::TARGET, handler: experts::handler, platform: Platform::Host },
    Kernel { name: experts::TARGET_GELU_TANH, handler: experts::handler_gelu_tanh, platform: Platform::Host },
    Kernel { name: experts::TARGET_CLAMPED_SWIGLU, handler: experts::handler_clamped_swiglu, platform: Platform::Host },
    Kernel { name: grouped::TARGET, handler: grouped::handler, platform: Platform::Host },
    Kernel { name: cuda::TARGET, handler: cuda::handler, platform: Platform::Cuda },
];
