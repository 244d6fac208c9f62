//! One latents column's rows in a shard being built: each stored token's firings compacted
//! from the devices' fixed-width rows (`cap` slots, `-1` past the firings) into a CSR matrix,
//! each token's latents in ascending order, values in the stored dtype; and the column's
//! statistics over the included tokens, counted as the rows come in.

use bytes::Bytes;

use crate::batch::{BatchLatents, DType, le_bytes, stored_dtype};
use crate::config::{LatentsColumn, latents_tensor_names};
use crate::stats::LatentStats;
use crate::tensor::{Rank, Tensor};

/// The most latents a column may have (2^26, twice the largest dictionaries trained): their
/// statistics are three arrays of that length.
pub(crate) const MAX_LATENTS: usize = 1 << 26;

/// A latents column's rows so far.
pub(crate) struct SparseColumn {
    width: usize,
    /// `[rows + 1]`: row `t`'s entries are `indptr[t]..indptr[t + 1]`.
    indptr: Vec<i32>,
    indices: Vec<i32>,
    /// The values, little-endian in the stored dtype.
    values: Vec<u8>,
    stats: LatentStats,
    /// One token's firings, reused.
    fired: Vec<(u32, f32)>,
}

impl SparseColumn {
    pub fn new(width: usize) -> Self {
        SparseColumn {
            width,
            indptr: vec![0],
            indices: Vec::new(),
            values: Vec::new(),
            stats: LatentStats::new(width),
            fired: Vec::new(),
        }
    }

    /// Bytes of the column's tensors so far.
    pub fn bytes(&self) -> usize {
        4 * (self.indptr.len() + self.indices.len()) + self.values.len()
    }

    /// Appends token `t` of `latents` as the next row, its values stored as `dtype`; counts it
    /// in the statistics when `included`. `Err` says what is wrong with the token (the caller
    /// names the column and the token).
    pub fn push(&mut self, latents: &BatchLatents, t: usize, included: bool, dtype: DType) -> Result<(), String> {
        let mut fired = std::mem::take(&mut self.fired);
        latents.token(t, self.width, &mut fired)?;
        fired.sort_unstable_by_key(|&(latent, _)| latent);
        if let Some(pair) = fired.windows(2).find(|p| p[0].0 == p[1].0) {
            return Err(format!("holds latent {} twice", pair[0].0));
        }
        let nnz = i32::try_from(self.indices.len() + fired.len())
            .map_err(|_| "overflows the shard's i32 latent offsets: choose a smaller --shard-size-mb".to_string())?;
        for (latent, value) in &mut fired {
            self.indices.push(*latent as i32);
            *value = store_value(*value, dtype, &mut self.values);
        }
        self.indptr.push(nnz);
        if included {
            self.stats.add_token(fired.iter().map(|&(latent, value)| (latent as usize, value)));
        }
        self.fired = fired;
        Ok(())
    }

    /// The statistics of the included tokens so far.
    pub fn stats(&self) -> &LatentStats {
        &self.stats
    }

    /// The column `name`'s tensors over `tokens` rows: `<name>.indptr` `[tokens + 1]`,
    /// `<name>.indices` and `<name>.values` `[nnz]`, the values in the stored `dtype`.
    pub fn into_tensors(self, name: &str, tokens: usize, dtype: DType) -> Vec<Tensor> {
        let [indptr, indices, values] = latents_tensor_names(name);
        let nnz = self.indices.len();
        let tensor = |name, dtype, shape, data| Tensor { name, dtype, shape, data: vec![data], rank: Rank::Latents };
        vec![
            tensor(indptr, "I32", vec![tokens + 1], le_bytes(&self.indptr, i32::to_le_bytes)),
            tensor(indices, "I32", vec![nnz], le_bytes(&self.indices, i32::to_le_bytes)),
            tensor(values, dtype.safetensors_name(), vec![nnz], Bytes::from(self.values)),
        ]
    }
}

/// Appends `value` in `dtype` (f32, bf16 or f16: latents are never stored as fp8); returns the
/// value as stored.
fn store_value(value: f32, dtype: DType, out: &mut Vec<u8>) -> f32 {
    match dtype {
        DType::F32 => {
            out.extend_from_slice(&value.to_le_bytes());
            value
        }
        DType::Bf16 => {
            let stored = half::bf16::from_f32(value);
            out.extend_from_slice(&stored.to_le_bytes());
            stored.to_f32()
        }
        DType::F16 => {
            let stored = half::f16::from_f32(value);
            out.extend_from_slice(&stored.to_le_bytes());
            stored.to_f32()
        }
        DType::Fp8 | DType::U8 => {
            unreachable!("latents are stored as f32, bf16 or f16 (checked when the writer opens)")
        }
    }
}

/// Reads a shard's CSR tensors of `column` back: checks their dtypes and shapes, that the
/// offsets run from 0 to the entries without going back, that each row's latents ascend, lie
/// within the width and number at most the cap; returns the statistics of the rows `mask` includes (all without a mask),
/// the writer's numbers.
pub(crate) fn summarize(
    st: &safetensors::SafeTensors<'_>,
    column: &LatentsColumn,
    tokens: usize,
    mask: Option<&[bool]>,
) -> Result<LatentStats, String> {
    if column.width > MAX_LATENTS {
        return Err(format!("run.json gives {} latents, more than the {MAX_LATENTS} this crate reads", column.width));
    }
    let [indptr_name, indices_name, values_name] = column.tensor_names();
    let tensor = |name: &str| st.tensor(name).map_err(|e| format!("{name}: {e}"));
    let (indptr, indices, values) = (tensor(&indptr_name)?, tensor(&indices_name)?, tensor(&values_name)?);
    let dtype = match stored_dtype(values.dtype()) {
        Some(dtype @ (DType::F32 | DType::Bf16 | DType::F16)) => dtype,
        _ => return Err(format!("{values_name} is {:?}, expected F32, BF16 or F16", values.dtype())),
    };
    let words = |t: &safetensors::tensor::TensorView<'_>| -> Vec<i32> {
        t.data().chunks_exact(4).map(|w| i32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect()
    };
    if indptr.dtype() != safetensors::Dtype::I32 || indptr.shape() != [tokens + 1] {
        return Err(format!("{indptr_name} is {:?}{:?}, expected I32[{}]", indptr.dtype(), indptr.shape(), tokens + 1));
    }
    let offsets = words(&indptr);
    let nnz = *offsets.last().expect("tokens + 1 offsets") as usize;
    for (name, t, dtype_ok) in
        [(&indices_name, &indices, indices.dtype() == safetensors::Dtype::I32), (&values_name, &values, true)]
    {
        if t.shape() != [nnz] || !dtype_ok {
            return Err(format!("{name} is {:?}{:?}, the offsets count {nnz} entries", t.dtype(), t.shape()));
        }
    }
    if offsets[0] != 0 || offsets.windows(2).any(|w| w[1] < w[0]) {
        return Err(format!("{indptr_name} does not run from 0 upwards"));
    }
    let latents = words(&indices);
    let mut decoded = vec![0f32; nnz];
    crate::stats::decode_row(dtype, values.data(), &mut decoded);
    let mut stats = LatentStats::new(column.width);
    for (row, span) in offsets.windows(2).enumerate() {
        let (start, end) = (span[0] as usize, span[1] as usize);
        let fired = &latents[start..end];
        if fired.iter().any(|&l| l < 0 || l as usize >= column.width) || fired.windows(2).any(|w| w[1] <= w[0]) {
            return Err(format!("row {row}'s latents {fired:?} do not ascend within 0..{}", column.width));
        }
        // The writer refuses a token firing more than the cap: a row with more was not written
        // under this run.json.
        if fired.len() > column.cap {
            return Err(format!("row {row} fires {} latents, more than the run's cap of {}", fired.len(), column.cap));
        }
        if mask.is_none_or(|m| m[row]) {
            stats.add_token(fired.iter().map(|&l| l as usize).zip(decoded[start..end].iter().copied()));
        }
    }
    Ok(stats)
}
