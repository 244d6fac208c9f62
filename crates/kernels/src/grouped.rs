//! Grouped matrix products: rows sorted by group (a mixture's routed choices sorted by expert),
//! each group's rows times its own matrix of a stack, `out[r] = lhs[r] · W[g]ᵀ` for the rows
//! `r` of group `g` — one projection of every expert at once, each expert's weights read
//! where they lie.
//!
//! Operands: `lhs` `[A, K]`, the groups' sizes `counts` `[G]` (s32, in the rows' order,
//! summing to at most `A`), the stacked matrices `w` `[G, N, K]` (as a mixture stores `gate`,
//! `up` and `down`); result `[A, N]`. `lhs`, `w` and the result are all f32 or all bf16
//! (products summed in f32, rounded once to the result's type). Rows past the groups' total
//! belong to no group and are not written: a caller masks them (a device of a mesh holding
//! some of the experts gives the rows routed elsewhere to no group).
//!
//! Each group is one product in cuBLAS's terms ([`Gemm`], column-major): on CUDA
//! ([`crate::cuda`]) the groups go to cuBLAS; on the CPU ([`handler`]) the same descriptors run
//! through a plain loop that reads them as cuBLAS does — so a program of this form runs on
//! the CPU plugin too, and its tests check the descriptors against HF's values.

use crate::xla_ffi::{self, Buffer, CallFrame, DataType, FfiError};

/// The custom-call target of a grouped product.
pub const TARGET: &str = "siphon_grouped_matmul";

/// The element type of a grouped product's `lhs`, `w` and result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Element {
    F32,
    Bf16,
}

/// A checked grouped product: `rows` (`A`) rows of `k` in `groups` groups, `n` outputs each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grouped {
    pub rows: usize,
    pub groups: usize,
    pub k: usize,
    pub n: usize,
    pub element: Element,
}

/// An operand's or result's element type and dims, as XLA hands them over.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Operand {
    pub dtype: DataType,
    pub dims: Vec<usize>,
}

impl From<&Buffer> for Operand {
    fn from(b: &Buffer) -> Operand {
        Operand { dtype: b.dtype, dims: b.dims.clone() }
    }
}

/// The product `args` (`lhs, counts, w`) and `rets` (`out`) describe, or an error naming the
/// operand that does not fit.
pub(crate) fn check(args: &[Operand], rets: &[Operand]) -> Result<Grouped, String> {
    let ([lhs, counts, w], [out]) = (args, rets) else {
        return Err(format!(
            "{TARGET}: expected 3 operands (lhs, counts, w) and 1 result, got {} and {}",
            args.len(),
            rets.len()
        ));
    };
    let element = match lhs.dtype {
        DataType::F32 => Element::F32,
        DataType::Bf16 => Element::Bf16,
        other => return Err(format!("{TARGET}: lhs is {other:?}; expected F32 or Bf16")),
    };
    let (&[rows, k], &[groups], &[wg, n, wk]) = (&lhs.dims[..], &counts.dims[..], &w.dims[..]) else {
        return Err(format!(
            "{TARGET}: lhs {:?}, counts {:?} or w {:?} of the wrong rank (expected [A, K], [G], [G, N, K])",
            lhs.dims, counts.dims, w.dims
        ));
    };
    if counts.dtype != DataType::S32 {
        return Err(format!("{TARGET}: counts is {:?}; expected S32", counts.dtype));
    }
    if w.dtype != lhs.dtype || (wg, wk) != (groups, k) {
        return Err(format!(
            "{TARGET}: w is {:?} {:?}; expected {:?} [{groups}, N, {k}] (counts' groups, lhs' width)",
            w.dtype, w.dims, lhs.dtype
        ));
    }
    if out.dtype != lhs.dtype || out.dims != [rows, n] {
        return Err(format!(
            "{TARGET}: result is {:?} {:?}; expected {:?} [{rows}, {n}]",
            out.dtype, out.dims, lhs.dtype
        ));
    }
    if [rows, k, n, groups].iter().any(|&d| d > i32::MAX as usize) {
        return Err(format!("{TARGET}: dims past i32 (lhs {:?}, w {:?})", lhs.dims, w.dims));
    }
    Ok(Grouped { rows, groups, k, n, element })
}

/// One group's product in cuBLAS's column-major terms, `C = op(A)·B` with `op(A) = Aᵀ`:
/// `A` is the group's matrix (`W[g]`, `[N, K]` row-major, i.e. `K × N` column-major), `B` its
/// rows of `lhs` (`K × m` column-major), `C` its rows of the result (`N × m`). Offsets count
/// elements from each buffer's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    pub group: usize,
    /// Rows of `op(A)` and `C`: the outputs per row, `N`.
    pub m: usize,
    /// Columns of `B` and `C`: the group's rows.
    pub n: usize,
    /// The contracted width, `K`.
    pub k: usize,
    pub a: usize,
    pub lda: usize,
    pub b: usize,
    pub ldb: usize,
    pub c: usize,
    pub ldc: usize,
}

impl Grouped {
    /// One [`Gemm`] per group that has rows, in order, for the groups' sizes `counts` (read
    /// from the device); refuses sizes that are negative, of another number of groups, or sum
    /// to more than the rows.
    pub fn gemms(&self, counts: &[i32]) -> Result<Vec<Gemm>, String> {
        let Grouped { rows, groups, k, n, .. } = *self;
        let total: i64 = counts.iter().map(|&c| c as i64).sum();
        if counts.len() != groups || counts.iter().any(|&c| c < 0) || total > rows as i64 {
            return Err(format!("{TARGET}: the {groups} groups' sizes {counts:?} do not fit in the {rows} rows"));
        }
        let mut start = 0;
        let mut gemms = Vec::new();
        for (group, &count) in counts.iter().enumerate() {
            let count = count as usize;
            if count > 0 {
                gemms.push(Gemm {
                    group,
                    m: n,
                    n: count,
                    k,
                    a: group * n * k,
                    lda: k,
                    b: start * k,
                    ldb: k,
                    c: start * n,
                    ldc: n,
                });
            }
            start += count;
        }
        Ok(gemms)
    }
}

/// Runs `gemms` as cuBLAS reads them (`C[i + j·ldc] = Σ_p A[p + i·lda] · B[p + j·ldb]`,
/// `transa = T`, `transb = N`), summing in f32 in order over `p`.
pub fn run_gemms<T: Copy>(
    gemms: &[Gemm],
    w: &[T],
    lhs: &[T],
    out: &mut [T],
    load: impl Fn(T) -> f32,
    store: impl Fn(f32) -> T,
) {
    for g in gemms {
        for j in 0..g.n {
            for i in 0..g.m {
                let a = &w[g.a + i * g.lda..][..g.k];
                let b = &lhs[g.b + j * g.ldb..][..g.k];
                let sum = a.iter().zip(b).fold(0.0f32, |s, (&a, &b)| s + load(a) * load(b));
                out[g.c + i + j * g.ldc] = store(sum);
            }
        }
    }
}

/// bf16's bits widened to f32.
pub fn bf16_to_f32(v: u16) -> f32 {
    f32::from_bits((v as u32) << 16)
}

/// f32 rounded to the nearest bf16, ties to even (NaN kept a NaN).
pub fn f32_to_bf16(v: f32) -> u16 {
    let bits = v.to_bits();
    if v.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// The XLA FFI handler for [`TARGET`] on the CPU plugin.
///
/// # Safety
/// Called by XLA with a valid call frame.
pub unsafe extern "C" fn handler(frame: *mut CallFrame) -> *mut FfiError {
    // SAFETY: XLA's frame; `execute` reads its operands and writes its result only.
    unsafe { xla_ffi::handle(frame, execute) }
}

fn execute(frame: &CallFrame) -> Result<(), String> {
    let args = xla_ffi::buffers(&frame.args)?;
    let rets = xla_ffi::buffers(&frame.rets)?;
    let shape = check(
        &args.iter().map(Operand::from).collect::<Vec<_>>(),
        &rets.iter().map(Operand::from).collect::<Vec<_>>(),
    )?;
    let Grouped { rows, groups, k, n, element } = shape;
    let (lhs, counts, w, out) = (&args[0], &args[1], &args[2], &rets[0]);
    // SAFETY: `check` matched every buffer's dtype and dims; XLA keeps the operands alive and
    // the result to this call for its duration.
    unsafe {
        let counts = counts.slice::<i32>("counts", DataType::S32, &[groups])?;
        let gemms = shape.gemms(counts)?;
        // The rows past the groups' total belong to no group: NaN here, so that a caller that
        // forgets to mask them sees it (a GPU leaves them as they were).
        let grouped = counts.iter().map(|&c| c as usize).sum::<usize>() * n;
        let dt = lhs.dtype;
        match element {
            Element::F32 => {
                let out = out.slice_mut::<f32>("out", dt, &[rows, n])?;
                run_gemms(
                    &gemms,
                    w.slice::<f32>("w", dt, &[groups, n, k])?,
                    lhs.slice::<f32>("lhs", dt, &[rows, k])?,
                    out,
                    |v| v,
                    |v| v,
                );
                out[grouped..].fill(f32::NAN);
            }
            Element::Bf16 => {
                let out = out.slice_mut::<u16>("out", dt, &[rows, n])?;
                let (w, lhs) = (w.slice::<u16>("w", dt, &[groups, n, k])?, lhs.slice::<u16>("lhs", dt, &[rows, k])?);
                run_gemms(&gemms, w, lhs, out, bf16_to_f32, f32_to_bf16);
                out[grouped..].fill(f32_to_bf16(f32::NAN));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::tests::values;

    fn op(dtype: DataType, dims: &[usize]) -> Operand {
        Operand { dtype, dims: dims.to_vec() }
    }

    fn good() -> (Vec<Operand>, Vec<Operand>) {
        let f = DataType::Bf16;
        (vec![op(f, &[10, 4]), op(DataType::S32, &[3]), op(f, &[3, 6, 4])], vec![op(f, &[10, 6])])
    }

    #[test]
    fn a_well_formed_call_is_described() {
        let (args, rets) = good();
        assert_eq!(check(&args, &rets), Ok(Grouped { rows: 10, groups: 3, k: 4, n: 6, element: Element::Bf16 }));
    }

    /// Each operand that does not fit is refused with an error naming it.
    #[test]
    fn bad_operands_are_refused_by_name() {
        type Edit = Box<dyn Fn(&mut Vec<Operand>, &mut Vec<Operand>)>;
        let cases: Vec<(&str, Edit)> = vec![
            ("expected 3 operands", Box::new(|a, _| drop(a.pop()))),
            ("and 1 result, got 3 and 2", Box::new(|_, r| r.push(r[0].clone()))),
            ("lhs is Other(10)", Box::new(|a, _| a[0].dtype = DataType::Other(10))),
            ("of the wrong rank", Box::new(|a, _| a[2].dims = vec![3, 24])),
            ("counts is F32", Box::new(|a, _| a[1].dtype = DataType::F32)),
            ("w is Bf16 [4, 6, 4]", Box::new(|a, _| a[2].dims = vec![4, 6, 4])),
            ("w is Bf16 [3, 6, 5]", Box::new(|a, _| a[2].dims = vec![3, 6, 5])),
            ("w is F32", Box::new(|a, _| a[2].dtype = DataType::F32)),
            ("result is Bf16 [10, 7]", Box::new(|_, r| r[0].dims = vec![10, 7])),
            ("result is F32", Box::new(|_, r| r[0].dtype = DataType::F32)),
        ];
        for (want, edit) in cases {
            let (mut args, mut rets) = good();
            edit(&mut args, &mut rets);
            let err = check(&args, &rets).expect_err(want);
            assert!(err.starts_with(TARGET) && err.contains(want), "{err:?} lacks {want:?}");
        }
    }

    #[test]
    fn group_sizes_that_do_not_fit_the_rows_are_refused() {
        let shape = Grouped { rows: 10, groups: 3, k: 4, n: 6, element: Element::F32 };
        for counts in [&[5, 6, -1][..], &[10, 0], &[4, 4, 3], &[0, 0, 11]] {
            let err = shape.gemms(counts).expect_err("bad sizes");
            assert!(err.contains("do not fit in the 10 rows"), "{err}");
        }
        assert_eq!(shape.gemms(&[0, 10, 0]).unwrap().len(), 1);
        // Fewer rows than the lhs has: the rest belong to no group and get no product.
        let gemms = shape.gemms(&[3, 0, 4]).unwrap();
        assert_eq!(gemms.iter().map(|g| (g.group, g.b, g.n)).collect::<Vec<_>>(), [(0, 0, 3), (2, 3 * 4, 4)]);
    }

    /// The descriptors, read as cuBLAS reads them, give every row its own group's product
    /// (an f64 reference in row-major terms), empty groups included; bf16 rounds each sum once.
    #[test]
    fn the_descriptors_compute_each_rows_own_groups_product() {
        let (k, n) = (7, 5);
        let counts = [3, 0, 1, 0, 4, 2];
        let (rows, groups) = (10, counts.len());
        let shape = Grouped { rows, groups, k, n, element: Element::F32 };
        let (lhs, w) = (values(rows * k, 1), values(groups * n * k, 2));
        let gemms = shape.gemms(&counts).unwrap();
        assert_eq!(gemms.iter().map(|g| g.group).collect::<Vec<_>>(), [0, 2, 4, 5]);
        let mut out = vec![f32::NAN; rows * n];
        run_gemms(&gemms, &w, &lhs, &mut out, |v| v, |v| v);
        let group_of: Vec<usize> =
            counts.iter().enumerate().flat_map(|(g, &c)| std::iter::repeat_n(g, c as usize)).collect();
        for (r, &g) in group_of.iter().enumerate() {
            for o in 0..n {
                let want: f64 = (0..k).map(|p| lhs[r * k + p] as f64 * w[(g * n + o) * k + p] as f64).sum();
                let got = out[r * n + o] as f64;
                assert!((got - want).abs() < 1e-5, "row {r} output {o}: {got} vs {want}");
            }
        }
        let (lhs16, w16): (Vec<u16>, Vec<u16>) =
            (lhs.iter().map(|&v| f32_to_bf16(v)).collect(), w.iter().map(|&v| f32_to_bf16(v)).collect());
        let mut out16 = vec![0u16; rows * n];
        run_gemms(&gemms, &w16, &lhs16, &mut out16, bf16_to_f32, f32_to_bf16);
        let mut wide = vec![0.0; rows * n];
        let (lhs_r, w_r): (Vec<f32>, Vec<f32>) =
            (lhs16.iter().map(|&v| bf16_to_f32(v)).collect(), w16.iter().map(|&v| bf16_to_f32(v)).collect());
        run_gemms(&gemms, &w_r, &lhs_r, &mut wide, |v| v, |v| v);
        assert_eq!(out16, wide.iter().map(|&v| f32_to_bf16(v)).collect::<Vec<_>>());
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // Halfway between 0x3f80 and 0x3f81: to the even one; just above: up.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
    }
}
