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

/// The value of `nibble` in a group whose scale is `p`: exact in f64; rounding to f32 only
/// overflows (or keeps a subnormal exactly).
fn value(nibble: u8, p: f64) -> f32 {
    (f64::from(E2M1[usize::from(nibble)]) * p) as f32
}

/// The values of `blocks` (16 bytes per group) with one `scales` byte per group.
pub(crate) fn dequantize(blocks: &[u8], scales: &[u8]) -> Vec<f32> {
    debug_assert_eq!(blocks.len(), scales.len() * 16);
    let mut out = Vec::with_capacity(blocks.len() * 2);
    for (group, &scale) in blocks.chunks_exact(16).zip(scales) {
        let p = power_of_two(scale);
        for &byte in group {
            out.push(value(byte & 0x0F, p));
            out.push(value(byte >> 4, p));
        }
    }
    out
}

/// The index of the first value [`dequantize`] gives that is infinite: only a group whose
/// scale makes its largest magnitude (6) overflow f32 can hold one.
pub(crate) fn first_infinite(blocks: &[u8], scales: &[u8]) -> Option<usize> {
    let largest = 7;
    scales.iter().enumerate().filter(|&(_, &s)| !value(largest, power_of_two(s)).is_finite()).find_map(|(g, &s)| {
        let p = power_of_two(s);
        let nibbles = blocks[g * 16..(g + 1) * 16].iter().flat_map(|&b| [b & 0x0F, b >> 4]);
        nibbles.enumerate().find(|&(_, n)| !value(n, p).is_finite()).map(|(k, _)| g * 32 + k)
    })
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

    /// Every byte under the extreme scales (0, 1, 126, 127, 128, 254, 255) as transformers
    /// dequantizes it (the fixture's `edge_*`), and the overflowing values are the ones
    /// [`first_infinite`] finds.
    #[test]
    fn extreme_scales_give_transformers_values_and_their_infinities_are_found() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/models/tiny-gpt-oss-mxfp4/dequantized.safetensors");
        let bytes = std::fs::read(path).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let (blocks, scales) = (file.tensor("edge_blocks").unwrap(), file.tensor("edge_scales").unwrap());
        let theirs: Vec<f32> = file
            .tensor("edge_dequantized")
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let ours = dequantize(blocks.data(), scales.data());
        assert_eq!(ours.len(), theirs.len());
        assert!(ours.iter().zip(&theirs).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert!(theirs.iter().any(|v| v.is_subnormal()));
        let first = theirs.iter().position(|v| v.is_infinite());
        assert!(first.is_some());
        assert_eq!(first_infinite(blocks.data(), scales.data()), first);
        // 6 · 2^125 and 3 · 2^126 are finite, 4 · 2^126 and 1 · 2^128 are not; 0.5 · 2^128 is.
        assert_eq!(first_infinite(&[0x77; 16], &[252]), None);
        assert_eq!(first_infinite(&[0x55; 16], &[253]), None);
        assert_eq!(first_infinite(&[0x11; 16], &[255]), None);
        assert_eq!(first_infinite(&[0x22; 16], &[255]), Some(0));
        let mut group = [0u8; 16];
        group[1] = 0x60;
        assert_eq!(first_infinite(&[[0x77; 16], group].concat(), &[252, 253]), Some(32 + 3));
    }
}
