//! Finding the values that are not finite (NaN, infinity) in a tensor's encoded bytes, so
//! that a weight holding one is refused by name before any forward runs instead of turning
//! every activation it reaches into NaN. The block formats test their own scales beside
//! their dequantization ([`crate::fp8`], [`crate::mxfp4`]).

use siphon_dtype::DType;

/// The index of the first element of `bytes` (little-endian elements of `dtype`) that is NaN
/// or infinite (its exponent bits all set; E4M3's NaN for fp8); `None` for byte values (`u8`).
/// Blocks of elements are tested without branching, so the scan runs at memory speed.
pub(crate) fn first_non_finite(dtype: DType, bytes: &[u8]) -> Option<usize> {
    match dtype {
        DType::F32 => first_where::<4>(bytes, |e| u32::from_le_bytes(e) & 0x7f80_0000 == 0x7f80_0000),
        DType::Bf16 => first_where::<2>(bytes, |e| u16::from_le_bytes(e) & 0x7f80 == 0x7f80),
        DType::F16 => first_where::<2>(bytes, |e| u16::from_le_bytes(e) & 0x7c00 == 0x7c00),
        DType::Fp8 => first_where::<1>(bytes, |[b]| b & 0x7f == 0x7f),
        DType::U8 => None,
    }
}

/// The index of the first `N`-byte element of `bytes` that is `bad`.
fn first_where<const N: usize>(bytes: &[u8], bad: impl Fn([u8; N]) -> bool) -> Option<usize> {
    const BLOCK: usize = 1024;
    let element = |e: &[u8]| bad(e.try_into().expect("N bytes"));
    bytes.chunks(BLOCK * N).enumerate().find_map(|(i, block)| {
        let any = block.chunks_exact(N).fold(false, |any, e| any | element(e));
        any.then(|| i * BLOCK + block.chunks_exact(N).position(element).expect("a bad element"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::encode_into;

    #[test]
    fn each_encoding_finds_its_first_nan_or_infinity_and_nothing_else() {
        // Each type's largest finite magnitude, a subnormal, zeros: all finite.
        for (dtype, largest) in [(DType::F32, f32::MAX), (DType::Bf16, 3.3895314e38), (DType::F16, 65504.0)] {
            let finite: Vec<f32> = (0..3001).map(|i| [largest, -largest, 1e-40, -0.0, 1.5][i % 5]).collect();
            let encode = |values: &[f32]| {
                let mut bytes = vec![0; values.len() * dtype.size()];
                encode_into(dtype, values, &mut bytes);
                bytes
            };
            assert_eq!(first_non_finite(dtype, &encode(&finite)), None, "{dtype:?}");
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                for at in [0, 1, 1023, 1024, 3000] {
                    let mut values = finite.clone();
                    values[at] = bad;
                    assert_eq!(first_non_finite(dtype, &encode(&values)), Some(at), "{dtype:?} {bad} at {at}");
                }
            }
        }
        // E4M3 has no infinity: 0x7f and 0xff are its NaNs, ±448 its largest values.
        assert_eq!(first_non_finite(DType::Fp8, &[0x7e, 0xfe, 0x00, 0x80]), None);
        assert_eq!(first_non_finite(DType::Fp8, &[0x7e, 0xff, 0x7f]), Some(1));
        assert_eq!(first_non_finite(DType::U8, &[0xff; 8]), None);
    }
}
