//! Dequantization of ggml blocks to f32, one row at a time.
//!
//! Block layouts follow ggml (`ggml-common.h`, `ggml-quants.c`): every block starts or ends
//! with f16 scales, and the quants of one block cover consecutive elements of a row. A row
//! (ggml's `ne[0]` elements) is always a whole number of blocks; [`super::GgufFile`] checks
//! that when it opens the file, so these functions only assert it.

use half::{bf16, f16};

use super::GgmlType;

/// Dequantizes `src` (whole blocks of `ty`) into `dst`; `dst.len()` elements are written and
/// `src` must hold exactly `dst.len() / block_size` blocks.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    let bs = ty.block_size();
    let bb = ty.block_bytes();
    assert_eq!(dst.len() % bs, 0, "row not a whole number of {ty:?} blocks");
    assert_eq!(src.len(), dst.len() / bs * bb, "{ty:?} source length");
    let blocks = src.chunks_exact(bb).zip(dst.chunks_exact_mut(bs));
    match ty {
        GgmlType::F32 => {
            for (s, d) in src.chunks_exact(4).zip(dst.iter_mut()) {
                *d = f32::from_le_bytes(s.try_into().unwrap());
            }
        }
        GgmlType::F16 => {
            for (s, d) in src.chunks_exact(2).zip(dst.iter_mut()) {
                *d = f16::from_le_bytes([s[0], s[1]]).to_f32();
            }
        }
        GgmlType::Bf16 => {
            for (s, d) in src.chunks_exact(2).zip(dst.iter_mut()) {
                *d = bf16::from_le_bytes([s[0], s[1]]).to_f32();
            }
        }
        GgmlType::Q8_0 => blocks.for_each(|(b, y)| q8_0(b, y)),
        GgmlType::Q4_0 => blocks.for_each(|(b, y)| q4_0(b, y)),
        GgmlType::Q4_1 => blocks.for_each(|(b, y)| q4_1(b, y)),
        GgmlType::Q4K => blocks.for_each(|(b, y)| q4_k(b, y)),
        GgmlType::Q6K => blocks.for_each(|(b, y)| q6_k(b, y)),
    }
}

fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `block_q8_0`: f16 d, i8 qs[32]; x = d * q.
fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..34]) {
        *y = d * f32::from(q as i8);
    }
}

/// `block_q4_0`: f16 d, u8 qs[16]; low nibbles are elements 0..16, high nibbles 16..32,
/// x = d * (q - 8).
fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let (lo, hi) = y.split_at_mut(16);
    for (j, &q) in b[2..18].iter().enumerate() {
        lo[j] = d * (f32::from(q & 0x0F) - 8.0);
        hi[j] = d * (f32::from(q >> 4) - 8.0);
    }
}

/// `block_q4_1`: f16 d, f16 m, u8 qs[16]; nibbles as Q4_0, x = d * q + m.
fn q4_1(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let m = half_at(b, 2);
    let (lo, hi) = y.split_at_mut(16);
    for (j, &q) in b[4..20].iter().enumerate() {
        lo[j] = d * f32::from(q & 0x0F) + m;
        hi[j] = d * f32::from(q >> 4) + m;
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) packed in Q4_K's 12 scale bytes
/// (ggml's `get_scale_min_k4`).
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// `block_q4_K`: f16 d, f16 dmin, u8 scales[12], u8 qs[128]; 8 sub-blocks of 32 with 6-bit
/// scale and min; each 32 bytes of qs hold two sub-blocks (low nibbles, then high nibbles);
/// x = d * sc * q - dmin * m.
fn q4_k(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let dmin = half_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (chunk, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, m1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, m2) = (d * f32::from(sc2), dmin * f32::from(m2));
        let (lo, hi) = y.split_at_mut(32);
        for l in 0..32 {
            lo[l] = d1 * f32::from(q[l] & 0x0F) - m1;
            hi[l] = d2 * f32::from(q[l] >> 4) - m2;
        }
    }
}

/// `block_q6_K`: u8 ql[128] (low 4 bits), u8 qh[64] (high 2 bits), i8 scales[16], f16 d;
/// 16 sub-blocks of 16 with an 8-bit scale; x = d * sc * (q - 32). Each half of 128
/// elements uses 64 bytes of ql, 32 of qh and 8 scales.
fn q6_k(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 208);
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let y = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let s = |k: usize| d * f32::from(sc[is + k] as i8);
            y[l] = s(0) * q1 as f32;
            y[l + 32] = s(2) * q2 as f32;
            y[l + 64] = s(4) * q3 as f32;
            y[l + 96] = s(6) * q4 as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    fn run(ty: GgmlType, block: &[u8]) -> Vec<f32> {
        let mut out = vec![f32::NAN; ty.block_size()];
        dequantize(ty, block, &mut out);
        out
    }

    #[test]
    fn plain_floats() {
        let src: Vec<u8> = [1.5f32, -2.25].iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut out = [0.0; 2];
        dequantize(GgmlType::F32, &src, &mut out);
        assert_eq!(out, [1.5, -2.25]);
        let src: Vec<u8> = [h(0.5), h(-3.0)].concat();
        dequantize(GgmlType::F16, &src, &mut out);
        assert_eq!(out, [0.5, -3.0]);
        let src: Vec<u8> = [bf16::from_f32(0.75).to_le_bytes(), bf16::from_f32(-8.0).to_le_bytes()].concat();
        dequantize(GgmlType::Bf16, &src, &mut out);
        assert_eq!(out, [0.75, -8.0]);
    }

    #[test]
    fn q8_0_block() {
        let mut b = h(0.5).to_vec();
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let y = run(GgmlType::Q8_0, &b);
        assert_eq!(y[0], -8.0); // 0.5 * -16
        assert_eq!(y[16], 0.0);
        assert_eq!(y[31], 7.5); // 0.5 * 15
    }

    #[test]
    fn q4_0_block() {
        let mut b = h(2.0).to_vec();
        // Byte j holds element j (low nibble) and element j+16 (high nibble).
        b.extend((0..16u8).map(|j| (15 - j) << 4 | j));
        let y = run(GgmlType::Q4_0, &b);
        assert_eq!(y[0], -16.0); // 2 * (0 - 8)
        assert_eq!(y[15], 14.0); // 2 * (15 - 8)
        assert_eq!(y[16], 14.0); // high nibble of byte 0 is 15
        assert_eq!(y[31], -16.0);
        assert_eq!(y[3], 2.0 * (3.0 - 8.0));
    }

    #[test]
    fn q4_1_block() {
        let mut b = [h(0.25), h(-1.0)].concat();
        b.extend((0..16u8).map(|j| (j / 2) << 4 | j));
        let y = run(GgmlType::Q4_1, &b);
        assert_eq!(y[0], -1.0);
        assert_eq!(y[15], 0.25 * 15.0 - 1.0);
        assert_eq!(y[16 + 7], 0.25 * 3.0 - 1.0);
        assert_eq!(y[31], 0.25 * 7.0 - 1.0);
    }

    #[test]
    fn q4_k_block() {
        // Sub-block scales 1..=8 and mins 10..=17 packed the way ggml's quantizer does:
        // j < 4 in the low 6 bits of bytes j and j+4; j >= 4 split over byte j+4 (low
        // nibble scale, high nibble min) and the top 2 bits of bytes j-4 and j.
        let sc: [u8; 8] = [1, 2, 3, 4, 5, 6, 7, 40];
        let mn: [u8; 8] = [10, 11, 12, 13, 14, 15, 16, 63];
        let mut s = [0u8; 12];
        for j in 0..4 {
            s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            s[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
            s[j + 8] = (sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4);
        }
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &s), (sc[j], mn[j]), "sub-block {j}");
        }
        let mut b = [h(0.5), h(0.125)].concat();
        b.extend_from_slice(&s);
        // qs byte (32*c + l): low nibble = l % 16, high nibble = 15 - l % 16.
        b.extend((0..128usize).map(|i| ((15 - i % 16) << 4 | (i % 16)) as u8));
        let y = run(GgmlType::Q4K, &b);
        // Element 64*c + l (l < 32) is sub-block 2c, low nibble of qs[32c + l].
        let expect = |sub: usize, q: usize| 0.5 * sc[sub] as f32 * q as f32 - 0.125 * mn[sub] as f32;
        assert_eq!(y[0], expect(0, 0));
        assert_eq!(y[5], expect(0, 5));
        assert_eq!(y[32 + 5], expect(1, 10));
        assert_eq!(y[64 * 3 + 1], expect(6, 1));
        assert_eq!(y[64 * 3 + 32 + 2], expect(7, 13));
        assert_eq!(y[255], expect(7, 0));
    }

    #[test]
    fn q6_k_block() {
        let mut b = vec![0u8; 210];
        // Element 0: ql[0] low = 5, qh[0] bits 0-1 = 2 → q = 5 | 32 = 37 → 37 - 32 = 5.
        b[0] = 0x05;
        b[128] = 0b10;
        // Element 64 (q3): ql[0] high nibble = 0xF, qh[0] bits 4-5 = 0 → 15 - 32 = -17.
        b[0] |= 0xF0;
        // Element 32+1 (q2 of l=1): ql[33] low = 1, qh[1] bits 2-3 = 3 → 1 | 48 = 49 → 17.
        b[33] = 0x01;
        b[129] = 0b1100;
        // Element 128 + 96 + 17 (second half, q4 of l=17): ql[64+49] high = 2, qh[128+32+17]
        // bits 6-7 = 1 → 2 | 16 = 18 → -14; scale index is = 17/16 = 1, +6 → scales[8+7].
        b[64 + 49] = 0x20;
        b[128 + 32 + 17] = 0b0100_0000;
        let scales: [i8; 16] = [3, -2, 4, 1, 7, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -5];
        for (i, s) in scales.iter().enumerate() {
            b[192 + i] = *s as u8;
        }
        b[208..210].copy_from_slice(&h(0.5));
        let y = run(GgmlType::Q6K, &b);
        assert_eq!(y[0], 0.5 * 3.0 * 5.0);
        assert_eq!(y[64], 0.5 * 7.0 * -17.0); // is = 0, scale index 4
        assert_eq!(y[33], 0.5 * 4.0 * 17.0); // is = 0, scale index 2
        assert_eq!(y[128 + 96 + 17], 0.5 * -5.0 * -14.0);
        // Untouched element 2: ql 0, qh 0 → -32 * scale 3 * d.
        assert_eq!(y[2], 0.5 * 3.0 * -32.0);
    }
}
