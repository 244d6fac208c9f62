//! The statistics' inner loop: one block of up to [`BLOCK`] stored rows reduced into per-element
//! sums, minima and maxima and per-row squared norms, at close to memory speed.
//!
//! Within a block every sum runs in f32 (vector lanes), and the block's sums are then added to
//! the f64 totals: 64 rows per f32 sum keep its rounding within ~64 ulp of the block, far below
//! the 1e-5 relative the statistics promise, while the loop stays a handful of vector
//! instructions per element. Values that are not finite (NaN, ±Inf) are found for nothing more
//! than a look at each row's sum of squares, which any of them makes non-finite: only such a
//! row is read again, to count them exactly ([`Moments::non_finite`]). Every operation is elementwise IEEE arithmetic in a fixed order
//! (no fused multiply-add, explicit lanes for the row norms), so the result is the same bits on
//! any x86 or ARM machine, whichever vector width runs it: a shard's statistics recomputed on
//! another machine (resume, `siphon inspect`) equal the writer's exactly.

use siphon_dtype::DType;

/// Stored rows per f32 block. Blocks are counted from a shard's first row, so the sums depend
/// on the rows only, never on how they were handed in.
pub(crate) const BLOCK: usize = 64;
/// Elements per tile: the unit the per-element sums stay in registers for over a block.
const TILE: usize = 64;
/// Lanes of a row's sum of squares.
const LANES: usize = 16;

/// Per-element running state of one hook: what [`reduce_block`] adds to.
pub(crate) struct Moments {
    /// The shift (the first included row): sums are of `x - shift`, which keeps the variance
    /// exact for activations whose mean is far from zero.
    pub shift: Vec<f32>,
    pub s1: Vec<f64>,
    pub s2: Vec<f64>,
    pub min: Vec<f32>,
    pub max: Vec<f32>,
    pub norm_sum: f64,
    pub count: u64,
    /// Elements that are NaN or ±Inf.
    pub non_finite: u64,
}

impl Moments {
    pub fn new(shift: Vec<f32>) -> Self {
        let width = shift.len();
        Moments {
            shift,
            s1: vec![0.0; width],
            s2: vec![0.0; width],
            min: vec![f32::INFINITY; width],
            max: vec![f32::NEG_INFINITY; width],
            norm_sum: 0.0,
            count: 0,
            non_finite: 0,
        }
    }
}

/// Adds `rows` (each one stored row of `dtype`, all included) to `m`; at most [`BLOCK`] rows.
/// Returns the first of them holding a value that is not finite, if any.
pub(crate) fn reduce_block(dtype: DType, rows: &[&[u8]], m: &mut Moments) -> Option<usize> {
    assert!(rows.len() <= BLOCK, "a block holds at most {BLOCK} rows");
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw") {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { reduce_avx512(dtype, rows, m) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: as above.
            return unsafe { reduce_avx2(dtype, rows, m) };
        }
    }
    reduce_any(dtype, rows, m)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn reduce_avx512(dtype: DType, rows: &[&[u8]], m: &mut Moments) -> Option<usize> {
    reduce_any(dtype, rows, m)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn reduce_avx2(dtype: DType, rows: &[&[u8]], m: &mut Moments) -> Option<usize> {
    reduce_any(dtype, rows, m)
}

#[inline(always)]
fn reduce_any(dtype: DType, rows: &[&[u8]], m: &mut Moments) -> Option<usize> {
    match dtype {
        DType::Bf16 => reduce::<Bf16>(rows, m),
        DType::F32 => reduce::<F32>(rows, m),
        DType::F16 => reduce::<F16>(rows, m),
        DType::Fp8 => reduce::<Fp8>(rows, m),
        DType::U8 => unreachable!("u8 holds no activations (refused by BatchActivations::validate)"),
    }
}

/// How a stored row's elements read as f32: a tile at a time (fixed-size arrays, so the loop
/// vectorizes), or one.
trait Element {
    fn tile(row: &[u8], d0: usize) -> [f32; TILE];
    fn one(row: &[u8], d: usize) -> f32;
}

struct Bf16;
impl Element for Bf16 {
    #[inline(always)]
    fn tile(row: &[u8], d0: usize) -> [f32; TILE] {
        let bytes: &[u8; 2 * TILE] = row[2 * d0..2 * (d0 + TILE)].try_into().expect("tile");
        std::array::from_fn(|j| f32::from_bits(u32::from(u16::from_le_bytes([bytes[2 * j], bytes[2 * j + 1]])) << 16))
    }
    #[inline(always)]
    fn one(row: &[u8], d: usize) -> f32 {
        f32::from_bits(u32::from(u16::from_le_bytes([row[2 * d], row[2 * d + 1]])) << 16)
    }
}

struct F32;
impl Element for F32 {
    #[inline(always)]
    fn tile(row: &[u8], d0: usize) -> [f32; TILE] {
        let bytes: &[u8; 4 * TILE] = row[4 * d0..4 * (d0 + TILE)].try_into().expect("tile");
        std::array::from_fn(|j| {
            f32::from_le_bytes([bytes[4 * j], bytes[4 * j + 1], bytes[4 * j + 2], bytes[4 * j + 3]])
        })
    }
    #[inline(always)]
    fn one(row: &[u8], d: usize) -> f32 {
        f32::from_le_bytes([row[4 * d], row[4 * d + 1], row[4 * d + 2], row[4 * d + 3]])
    }
}

struct F16;
impl Element for F16 {
    #[inline(always)]
    fn tile(row: &[u8], d0: usize) -> [f32; TILE] {
        std::array::from_fn(|j| Self::one(row, d0 + j))
    }
    #[inline(always)]
    fn one(row: &[u8], d: usize) -> f32 {
        half::f16::from_le_bytes([row[2 * d], row[2 * d + 1]]).to_f32()
    }
}

/// An fp8 row is its f32 scale, then one e4m3 byte per element.
struct Fp8;
impl Element for Fp8 {
    #[inline(always)]
    fn tile(row: &[u8], d0: usize) -> [f32; TILE] {
        let scale = f32::from_le_bytes([row[0], row[1], row[2], row[3]]);
        let bytes: &[u8; TILE] = row[4 + d0..4 + d0 + TILE].try_into().expect("tile");
        std::array::from_fn(|j| e4m3(bytes[j]) * scale)
    }
    #[inline(always)]
    fn one(row: &[u8], d: usize) -> f32 {
        e4m3(row[4 + d]) * f32::from_le_bytes([row[0], row[1], row[2], row[3]])
    }
}

/// An e4m3fn byte's value, with selects only (so a tile of them vectorizes): normal numbers by
/// their bits, subnormals as `m · 2⁻⁹`, 0x7f/0xff NaN; equal to `siphon_dtype::e4m3fn_to_f32`.
#[inline(always)]
fn e4m3(byte: u8) -> f32 {
    let b = u32::from(byte);
    let (sign, exp, man) = ((b & 0x80) << 24, (b >> 3) & 0x0f, b & 0x07);
    let normal = f32::from_bits(sign | ((exp + 120) << 23) | (man << 20));
    let subnormal = f32::from_bits(sign | (man as f32 * (1.0 / 512.0)).to_bits());
    let value = if exp == 0 { subnormal } else { normal };
    if b & 0x7f == 0x7f { f32::NAN } else { value }
}

/// The block loop: tiles of [`TILE`] elements, each kept in registers across the block's rows.
#[inline(always)]
fn reduce<E: Element>(rows: &[&[u8]], m: &mut Moments) -> Option<usize> {
    let width = m.shift.len();
    let mut squares = [[0f32; LANES]; BLOCK];
    let tiles = width / TILE;
    for tile in 0..tiles {
        let d0 = tile * TILE;
        let shift: [f32; TILE] = m.shift[d0..d0 + TILE].try_into().expect("tile");
        let mut lo: [f32; TILE] = m.min[d0..d0 + TILE].try_into().expect("tile");
        let mut hi: [f32; TILE] = m.max[d0..d0 + TILE].try_into().expect("tile");
        let (mut s1, mut s2) = ([0f32; TILE], [0f32; TILE]);
        for (row, lanes) in rows.iter().zip(squares.iter_mut()) {
            let v = E::tile(row, d0);
            let mut sq = [0f32; TILE];
            for j in 0..TILE {
                let y = v[j] - shift[j];
                s1[j] += y;
                s2[j] += y * y;
                lo[j] = if v[j] < lo[j] { v[j] } else { lo[j] };
                hi[j] = if v[j] > hi[j] { v[j] } else { hi[j] };
                sq[j] = v[j] * v[j];
            }
            for l in 0..LANES {
                lanes[l] += (sq[l] + sq[l + LANES]) + (sq[l + 2 * LANES] + sq[l + 3 * LANES]);
            }
        }
        fold(m, d0, &s1, &s2, &lo, &hi);
    }
    // The last elements of a width that is not a multiple of the tile, one at a time with the
    // same arithmetic.
    for d in tiles * TILE..width {
        let (mut s1, mut s2, mut lo, mut hi) = (0f32, 0f32, m.min[d], m.max[d]);
        for (row, lanes) in rows.iter().zip(squares.iter_mut()) {
            let v = E::one(row, d);
            let y = v - m.shift[d];
            s1 += y;
            s2 += y * y;
            lo = if v < lo { v } else { lo };
            hi = if v > hi { v } else { hi };
            lanes[d % LANES] += v * v;
        }
        fold(m, d, &[s1], &[s2], &[lo], &[hi]);
    }
    let mut first_non_finite = None;
    for (r, lanes) in squares[..rows.len()].iter().enumerate() {
        let squares = lanes.iter().map(|&s| f64::from(s)).sum::<f64>();
        // A NaN or ±Inf element makes the row's sum of squares non-finite (squares are never
        // negative, so nothing cancels an Inf); so do squares past f32's range, which the exact
        // count below tells apart.
        if !squares.is_finite() {
            let count = (0..width).filter(|&d| !E::one(rows[r], d).is_finite()).count() as u64;
            if count > 0 {
                m.non_finite += count;
                first_non_finite = first_non_finite.or(Some(r));
            }
        }
        m.norm_sum += squares.sqrt();
    }
    m.count += rows.len() as u64;
    first_non_finite
}

#[inline(always)]
fn fold(m: &mut Moments, d0: usize, s1: &[f32], s2: &[f32], lo: &[f32], hi: &[f32]) {
    let n = s1.len();
    for (t, s) in m.s1[d0..d0 + n].iter_mut().zip(s1) {
        *t += f64::from(*s);
    }
    for (t, s) in m.s2[d0..d0 + n].iter_mut().zip(s2) {
        *t += f64::from(*s);
    }
    m.min[d0..d0 + n].copy_from_slice(lo);
    m.max[d0..d0 + n].copy_from_slice(hi);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(m: &Moments) -> (Vec<u64>, Vec<u64>, Vec<u32>, Vec<u32>, u64, u64) {
        let bits64 = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect();
        let bits32 = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect();
        (bits64(&m.s1), bits64(&m.s2), bits32(&m.min), bits32(&m.max), m.norm_sum.to_bits(), m.count)
    }

    #[test]
    fn e4m3_decodes_as_the_dtype_crate_does() {
        for byte in 0..=255u8 {
            let (ours, theirs) = (e4m3(byte), siphon_dtype::e4m3fn_to_f32(byte));
            assert!(ours.to_bits() == theirs.to_bits() || (ours.is_nan() && theirs.is_nan()), "{byte:#04x}");
        }
    }

    /// Every value that is not finite is counted, in any dtype, whatever its place in a row
    /// (a tile, or the rest past the last tile), and the first row holding one is named; finite
    /// values whose squares leave f32's range count nothing.
    #[test]
    fn values_that_are_not_finite_are_counted_exactly() {
        let width = 70; // a tile and a rest
        for dtype in [DType::F32, DType::Bf16, DType::F16, DType::Fp8] {
            let encode = |v: f32| -> Vec<u8> {
                match dtype {
                    DType::F32 => v.to_le_bytes().to_vec(),
                    DType::Bf16 => half::bf16::from_f32(v).to_le_bytes().to_vec(),
                    DType::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
                    _ => vec![if v.is_nan() { 0x7f } else { 0x38 }],
                }
            };
            let row = |bad: &[(usize, f32)]| -> Vec<u8> {
                let mut row = if dtype == DType::Fp8 { 1f32.to_le_bytes().to_vec() } else { Vec::new() };
                for d in 0..width {
                    row.extend(encode(bad.iter().find(|(at, _)| *at == d).map_or(0.5, |(_, v)| *v)));
                }
                row
            };
            let (big, inf) = match dtype {
                // Finite values whose squares overflow f32 (fp8 and f16 cannot hold one).
                DType::F32 | DType::Bf16 => (3e30f32, f32::INFINITY),
                _ => (0.5, f32::NAN),
            };
            let rows = [row(&[]), row(&[(3, big)]), row(&[(5, f32::NAN), (69, inf)]), row(&[(64, f32::NAN)])];
            let rows: Vec<&[u8]> = rows.iter().map(Vec::as_slice).collect();
            let mut m = Moments::new(vec![0.0; width]);
            assert_eq!(reduce_block(dtype, &rows, &mut m), Some(2), "{dtype}");
            assert_eq!(m.non_finite, 3, "{dtype}");
            let mut clean = Moments::new(vec![0.0; width]);
            assert_eq!(reduce_block(dtype, &rows[..2], &mut clean), None, "{dtype}");
            assert_eq!(clean.non_finite, 0, "{dtype}");
        }
    }

    /// Whichever vector width runs the loop, the same bits: what lets a shard's statistics be
    /// recomputed on another machine and compared exactly.
    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        let width = 200; // three tiles and a rest
        let mut rng = fastrand::Rng::with_seed(3);
        for dtype in [DType::Bf16, DType::F32, DType::F16, DType::Fp8] {
            let row_bytes = dtype.row_bytes(width);
            let data: Vec<u8> = (0..BLOCK * row_bytes)
                .map(|i| match dtype {
                    // A sane scale and no NaN bytes for fp8.
                    DType::Fp8 if i % row_bytes < 4 => [0, 0, 0x80, 0x3c][i % row_bytes],
                    DType::Fp8 => rng.u8(0..0x7f) | (rng.u8(..) & 0x80),
                    // Exponents that stay finite for the 2-byte types.
                    _ if i % 2 == 1 => rng.u8(0x30..0x48) | (rng.u8(..) & 0x80),
                    _ => rng.u8(..),
                })
                .collect();
            let rows: Vec<&[u8]> = data.chunks_exact(row_bytes).collect();
            let shift = vec![0.25f32; width];
            let mut plain = Moments::new(shift.clone());
            reduce_any(dtype, &rows, &mut plain);
            let mut dispatched = Moments::new(shift.clone());
            reduce_block(dtype, &rows, &mut dispatched);
            assert_eq!(snapshot(&plain), snapshot(&dispatched), "{dtype}");
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                let mut avx2 = Moments::new(shift);
                // SAFETY: the CPU has AVX2.
                unsafe { reduce_avx2(dtype, &rows, &mut avx2) };
                assert_eq!(snapshot(&plain), snapshot(&avx2), "{dtype}");
            }
            assert!(plain.s1.iter().all(|s| s.is_finite()), "{dtype}");
        }
    }
}
