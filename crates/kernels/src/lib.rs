//! CPU kernels that XLA's CPU backend lacks, run inside siphon's programs as typed XLA FFI
//! custom calls.
//!
//! A program names a kernel in `stablehlo.custom_call @name(…) {api_version = 4 : i32}`;
//! `siphon-runtime` registers every [`KERNELS`] entry with the PJRT CPU plugin's FFI extension
//! before compiling, and XLA calls the handler with the operands' and result's buffers in
//! place. Only what XLA cannot emit well lives here:
//!
//! - [`experts`]: a mixture's gated experts (SiLU, tanh GELU, or GPT-OSS's clamped SwiGLU with
//!   biases), each token through its own experts only, reading each expert's weights where
//!   they lie in the stacked `[E, …]` tensors (XLA copies a dynamically sliced operand out
//!   before every product; docs/BENCHMARKS.md).
//!
//! Each kernel checks its operands' dtypes and shapes and returns an XLA error naming what is
//! wrong rather than reading past a buffer.

pub mod experts;
mod xla_ffi;

pub use xla_ffi::{CallFrame, FfiError};

/// A typed XLA FFI handler (`XLA_FFI_Handler`).
pub type Handler = unsafe extern "C" fn(*mut CallFrame) -> *mut FfiError;

/// One kernel: the custom-call target a program names and its handler.
#[derive(Debug, Clone, Copy)]
pub struct Kernel {
    pub name: &'static str,
    pub handler: Handler,
}

/// Every kernel, for the runtime to register.
pub const KERNELS: &[Kernel] = &[
    Kernel { name: experts::TARGET, handler: experts::handler },
    Kernel { name: experts::TARGET_GELU_TANH, handler: experts::handler_gelu_tanh },
    Kernel { name: experts::TARGET_CLAMPED_SWIGLU, handler: experts::handler_clamped_swiglu },
];
