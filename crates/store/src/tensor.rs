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
    /// The model's outputs (`output.*`).
    Outputs,
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
pub const RESERVED_TENSOR_NAMES: [&str; 9] =
    ["token_ids", "doc_index", "position", "sample_index", "mask", "role", "position_first", "count", "documents"];

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

/// Values of one stored row that are NaN or ±Inf, as [`decode_row`] would decode them: an
/// exponent of all ones in the float types (a test on the bits, no decoding); in an fp8 row the
/// E4M3 NaN bytes, or every value where its scale is not finite.
pub(crate) fn count_not_finite(dtype: DType, bytes: &[u8]) -> u64 {
    let count = |width: usize, exponent: u32| -> u64 {
        let all_ones = |c: &[u8]| {
            let bits = match width {
                2 => u32::from(u16::from_le_bytes([c[0], c[1]])),
                _ => u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            };
            bits & exponent == exponent
        };
        bytes.chunks_exact(width).filter(|c| all_ones(c)).count() as u64
    };
    match dtype {
        DType::F32 => count(4, 0x7f80_0000),
        DType::Bf16 => count(2, 0x7f80),
        DType::F16 => count(2, 0x7c00),
        DType::U8 => unreachable!("u8 holds no activations (refused by BatchActivations::validate)"),
        DType::Fp8 => {
            let (scale, values) = bytes.split_at(4);
            match f32::from_le_bytes([scale[0], scale[1], scale[2], scale[3]]).is_finite() {
                true => values.iter().filter(|&&b| b & 0x7f == 0x7f).count() as u64,
                false => values.len() as u64,
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The test on the bits counts what decoding finds, for every bf16, f16 and fp8 value, f32
    /// values at and around the exponent's edges, and an fp8 row whose scale is not finite.
    #[test]
    fn not_finite_by_the_bits_is_what_decoding_finds() {
        let decoded = |dtype: DType, bytes: &[u8], width: usize| {
            let mut out = vec![0f32; width];
            decode_row(dtype, bytes, &mut out);
            out.iter().filter(|v| !v.is_finite()).count() as u64
        };
        let all: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
        for dtype in [DType::Bf16, DType::F16] {
            assert_eq!(count_not_finite(dtype, &all), decoded(dtype, &all, 1 << 16), "{dtype}");
        }
        let f32s: Vec<u8> = [0.0, -0.0, 1.5, f32::MAX, f32::MIN_POSITIVE, f32::INFINITY, f32::NEG_INFINITY, f32::NAN]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .chain([0xff, 0xff, 0xbf, 0x7f, 0x01, 0x00, 0x80, 0xff])
            .collect();
        assert_eq!(count_not_finite(DType::F32, &f32s), decoded(DType::F32, &f32s, 10));
        assert_eq!(count_not_finite(DType::F32, &f32s), 5);
        for scale in [1.0f32, f32::NAN, f32::INFINITY] {
            let row: Vec<u8> = scale.to_le_bytes().into_iter().chain(0..=255u8).collect();
            assert_eq!(count_not_finite(DType::Fp8, &row), decoded(DType::Fp8, &row, 256), "scale {scale}");
        }
    }
}
