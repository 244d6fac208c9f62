//! A shard file's tensors ([`Tensor`]), the order the file holds them in ([`file_order`]), the
//! names the shard's own tensors keep ([`RESERVED_TENSOR_NAMES`]) and their bytes
//! ([`le_bytes`], [`stored_dtype`], [`decode_row`]).

use bytes::Bytes;
use siphon_dtype::DType;

/// A tensor of a shard file: name, safetensors dtype, shape, bytes (in segments), and where it
/// stands among the tensors of its alignment.
pub(crate) struct Tensor {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<usize>,
    pub data: Vec<Bytes>,
    pub rank: Rank,
}

/// Within one alignment, the file's tensors stand in this order (each kind in column order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Rank {
    /// `doc_index`, `sample_index`.
    Samples,
    /// Hooks' values.
    Hooks,
    /// `token_ids`, `position`.
    Tokens,
    /// fp8 hooks' scales.
    Scales,
    /// Latents columns' CSR parts.
    Latents,
    /// `role`, `mask`.
    Masks,
}

/// Orders a shard's tensors as its file holds them: by element alignment (8, 4, 2, 1 bytes),
/// so that every tensor of a mapped file starts aligned for its dtype, then by [`Rank`]; the
/// sort is stable, so columns keep their order.
pub(crate) fn file_order(tensors: &mut [Tensor]) {
    let alignment = |dtype: &str| match dtype {
        "I64" | "F64" | "U64" => 8,
        "I32" | "F32" | "U32" => 4,
        "BF16" | "F16" | "I16" | "U16" => 2,
        _ => 1,
    };
    tensors.sort_by_key(|t| (std::cmp::Reverse(alignment(t.dtype)), t.rank));
}

/// Tensor names that hooks may not use.
pub const RESERVED_TENSOR_NAMES: [&str; 6] = ["token_ids", "doc_index", "position", "sample_index", "mask", "role"];

/// The element type of a stored activation tensor; `None` for a dtype siphon never stores.
pub(crate) fn stored_dtype(dtype: safetensors::Dtype) -> Option<DType> {
    match dtype {
        safetensors::Dtype::F32 => Some(DType::F32),
        safetensors::Dtype::BF16 => Some(DType::Bf16),
        safetensors::Dtype::F16 => Some(DType::F16),
        safetensors::Dtype::F8_E4M3 => Some(DType::Fp8),
        _ => None,
    }
}

/// `values` as little-endian bytes, `f` giving each one's.
pub(crate) fn le_bytes<T: Copy, const N: usize>(values: &[T], f: impl Fn(T) -> [u8; N]) -> Bytes {
    let mut out = Vec::with_capacity(values.len() * N);
    for &v in values {
        out.extend_from_slice(&f(v));
    }
    Bytes::from(out)
}

/// Decodes one row of little-endian `dtype` values into f32.
pub(crate) fn decode_row(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::Bf16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        DType::U8 => unreachable!("u8 holds no activations (refused by BatchActivations::validate)"),
        DType::Fp8 => {
            let scale = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            for (o, &b) in out.iter_mut().zip(&bytes[4..]) {
                *o = siphon_dtype::e4m3fn_to_f32(b) * scale;
            }
        }
    }
}
