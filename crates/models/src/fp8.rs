//! FP8 block-scaled weights, as DeepSeek-V3 and the hub's `-FP8` checkpoints (Qwen3, …) store
//! them (`quantization_config` `fp8`, `weight_block_size` `[128, 128]`): a weight `{name}` of
//! F8_E4M3 bytes `[rows, cols]` beside `{name}_scale_inv` `[rows / br, cols / bc]`, one scale
//! per block (f32 or bf16, or E8M0 exponents as U8 or F8_E8M0 bytes, `2^(b - 127)`).
//! Dequantized as transformers does: every value is `f32(w) · f32(scale)` in f32. The block is
//! the config's `weight_block_size` where the grid is that block's, rounded up (DeepSeek-V3's
//! `kv_a_proj_with_mqa`, 576 rows in 128-row blocks, has a partial last block: its value is
//! what transformers' FP8 linear and `_dequantize_fp8_weight` compute, and DeepSeek's own
//! `weight_dequant`); without one, the block is read off a grid that divides the weight
//! (`rows / scale_rows`, as `Fp8Dequantize` does), and any other grid is refused.

pub(crate) use siphon_dtype::e4m3fn_to_f32 as e4m3;

/// The value of an E8M0 scale byte, `2^(b - 127)` (transformers' reading of U8 scales).
pub(crate) fn e8m0(byte: u8) -> f32 {
    (2f64.powi(i32::from(byte) - 127)) as f32
}

/// The f32 values of `weights` (E4M3 bytes, `rows × cols` row-major) times their block's scale
/// in `scales` (`grid = [scale_rows, scale_cols]`, row-major), each product rounded once to
/// f32, in blocks of `block` (the config's) where the grid is `block`'s rounded up, else of
/// the grid's own exact division. `None` when neither fits.
pub(crate) fn dequantize(
    weights: &[u8],
    rows: usize,
    cols: usize,
    scales: &[f32],
    grid: [usize; 2],
    block: Option<[usize; 2]>,
) -> Option<Vec<f32>> {
    let [sr, sc] = grid;
    if scales.len() != sr * sc {
        return None;
    }
    let block = block_of(rows, cols, grid, block)?;
    let mut out = Vec::with_capacity(rows * cols);
    for (i, row) in weights.chunks_exact(cols).enumerate() {
        out.extend(row_values(row, i, scales, sc, block));
    }
    Some(out)
}

/// The index of the first value of a weight, as [`dequantize`] computes it with the scales of
/// `grid` in blocks of `block`, that is not finite: a NaN byte, or a scale that is not finite
/// or makes a product overflow. Under scales no larger than `f32::MAX / 448` (E4M3's largest
/// magnitude), which real checkpoints' are by far, only a NaN byte can: its bytes alone are
/// scanned then.
pub(crate) fn first_non_finite(
    weights: &[u8],
    cols: usize,
    scales: &[f32],
    grid: [usize; 2],
    block: [usize; 2],
) -> Option<usize> {
    if scales.iter().all(|s| s.abs() <= f32::MAX / 448.0) {
        return crate::finite::first_non_finite(siphon_dtype::DType::Fp8, weights);
    }
    weights.chunks_exact(cols).enumerate().find_map(|(i, row)| {
        row_values(row, i, scales, grid[1], block).position(|v| !v.is_finite()).map(|j| i * cols + j)
    })
}

/// The values of row `i` of a weight: each byte's E4M3 value times its block's scale (`sc`
/// scales per row of blocks of `[br, bc]`), rounded once to f32.
fn row_values<'a>(
    row: &'a [u8],
    i: usize,
    scales: &'a [f32],
    sc: usize,
    [br, bc]: [usize; 2],
) -> impl Iterator<Item = f32> + 'a {
    let block_row = &scales[(i / br) * sc..(i / br + 1) * sc];
    row.iter().enumerate().map(move |(j, &b)| E4M3[usize::from(b)] * block_row[j / bc])
}

/// The E4M3 value of every byte (NaN for `0x7f` and `0xff`).
static E4M3: std::sync::LazyLock<[f32; 256]> = std::sync::LazyLock::new(|| std::array::from_fn(|b| e4m3(b as u8)));

/// The block a `rows × cols` weight's `grid` of scales is in: `block` (the config's) where the
/// grid is that block's rounded up, else the grid's exact division of the weight.
pub(crate) fn block_of(rows: usize, cols: usize, grid: [usize; 2], block: Option<[usize; 2]>) -> Option<[usize; 2]> {
    let [sr, sc] = grid;
    if sr == 0 || sc == 0 {
        return None;
    }
    let configured = block.filter(|&[br, bc]| br > 0 && bc > 0 && rows.div_ceil(br) == sr && cols.div_ceil(bc) == sc);
    let exact = (rows.is_multiple_of(sr) && cols.is_multiple_of(sc)).then_some([rows / sr, cols / sc]);
    configured.or(exact)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_bytes_decode_as_powers_of_two() {
        assert_eq!([e8m0(127), e8m0(130), e8m0(0)], [1.0, 8.0, 2f32.powi(-127)]);
    }

    #[test]
    fn each_block_takes_its_own_scale_and_a_partial_grid_is_refused() {
        // 2 × 4 weights of 1.0 in 1 × 2 blocks of [2, 2].
        let v = dequantize(&[0x38; 8], 2, 4, &[0.5, 3.0], [1, 2], None).unwrap();
        assert_eq!(v, [0.5, 0.5, 3.0, 3.0, 0.5, 0.5, 3.0, 3.0]);
        assert!(dequantize(&[0x38; 6], 2, 3, &[1.0, 1.0], [1, 2], None).is_none());
        // Blocks of [2, 2] over 3 columns: the last block is one column wide.
        let v = dequantize(&[0x38; 6], 2, 3, &[0.5, 3.0], [1, 2], Some([2, 2])).unwrap();
        assert_eq!(v, [0.5, 0.5, 3.0, 0.5, 0.5, 3.0]);
        // The config's block wins over the grid's own division: 6 rows in blocks of 4 (not 3).
        let v = dequantize(&[0x38; 6], 6, 1, &[0.5, 3.0], [2, 1], Some([4, 4])).unwrap();
        assert_eq!(v, [0.5, 0.5, 0.5, 0.5, 3.0, 3.0]);
        assert!(dequantize(&[0x38; 6], 2, 3, &[1.0, 1.0], [1, 2], Some([2, 1])).is_none());
    }

    #[test]
    fn a_nan_byte_or_a_scale_that_makes_a_value_non_finite_is_found() {
        // 2 × 4 weights in 1 × 2 blocks of [2, 2]: 0x38 is 1.0, 0x7e is 448, 0x7f NaN.
        let first = |weights: &[u8], scales: &[f32]| first_non_finite(weights, 4, scales, [1, 2], [2, 2]);
        assert_eq!(first(&[0x38; 8], &[0.5, 3e38]), None);
        assert_eq!(first(&[0x38, 0x38, 0x38, 0x7f, 0x38, 0x38, 0x38, 0x38], &[0.5, 3.0]), Some(3));
        assert_eq!(first(&[0x38; 8], &[0.5, f32::NAN]), Some(2));
        assert_eq!(first(&[0x38; 8], &[f32::INFINITY, 1.0]), Some(0));
        // 448 · 1e36 overflows f32; 1.0 · 1e36 does not.
        assert_eq!(first(&[0x38, 0x38, 0x38, 0x38, 0x38, 0x7e, 0x38, 0x38], &[1e36, 1.0]), Some(5));
    }
}
