//! MXFP4 (the OCP microscaling format) as GPT-OSS checkpoints store their experts: a tensor
//! `{name}_blocks` `[…, rows, groups, 16]` of bytes, each holding two 4-bit E2M1 values (low
//! nibble first), and `{name}_scales` `[…, rows, groups]`, one E8M0 exponent (biased by 127)
//! per 32 values. Dequantized as transformers' `convert_moe_packed_tensors` does, to
//! `[…, rows, groups · 32]` (before its transpose): every value is `ldexp(e2m1, scale - 127)`,
//! exact in f32 and bf16 where it fits and infinite where it overflows (`torch.ldexp` scales
//! exactly, so zeros stay zero and 0.5 · 2^128 is 2^127).

/// The E2M1 values of the 16 nibbles.
pub(crate) const E2M1: [f32; 16] =
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// `2^(scale - 127)`, exact in f64.
fn power_of_two(scale: u8) -> f64 {
    2f64.powi(i32::from(scale) - 127)
}

/// The values of `blocks` (16 bytes per group) with one `scales` byte per group.
pub(crate) fn dequantize(blocks: &[u8], scales: &[u8]) -> Vec<f32> {
    debug_assert_eq!(blocks.len(), scales.len() * 16);
    let mut out = Vec::with_capacity(blocks.len() * 2);
    for (group, &scale) in blocks.chunks_exact(16).zip(scales) {
        let p = power_of_two(scale);
        for &byte in group {
            // Exact in f64; rounding to f32 only overflows (or keeps a subnormal exactly).
            out.push((f64::from(E2M1[usize::from(byte & 0x0F)]) * p) as f32);
            out.push((f64::from(E2M1[usize::from(byte >> 4)]) * p) as f32);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_exact_ldexps() {
        // Low nibble first.
        let v = dequantize(&[0x2F; 16], &[126]);
        assert_eq!(&v[..2], &[-3.0, 0.5]);
        // The extreme exponents: subnormal, and overflow only past f32's range.
        assert_eq!(dequantize(&[0x21; 16], &[0])[..2], [2f32.powi(-126) / 4.0, 2f32.powi(-126) / 2.0]);
        let top = dequantize(&[0x21; 16], &[255]);
        assert_eq!(top[..2], [2f32.powi(127), f32::INFINITY]);
        assert_eq!(dequantize(&[0x80; 16], &[255])[..2], [0.0, 0.0]);
    }
}
