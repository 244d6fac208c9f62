//! A dictionary's latents as the store holds them: the run's column as run.json describes it
//! ([`LatentsColumn`]) and its checks before the writer opens ([`validate_columns`]); a batch's
//! rows as the devices return them ([`BatchLatents`], [`check_batch`]), each token's firings
//! under the one cap rule ([`kept_firings`]); a shard's rows being built, compacted from the
//! devices' fixed-width rows (`cap` slots, `-1` past the firings) into a CSR matrix, each
//! token's latents ascending, values in the stored dtype, with the column's statistics over the
//! included tokens counted as the rows come in ([`SparseColumn`], [`LatentStats`], which
//! `stats.json` holds); and a shard's CSR tensors read back ([`summarize`]).

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use siphon_dtype::DType;

use crate::error::{Result, StoreError};
use crate::float_text;
use crate::tensor::{RESERVED_TENSOR_NAMES, Rank, Tensor, decode_row, le_bytes, stored_dtype};

/// One dictionary's latents in the run: per shard the tensors `<name>.indptr` (i32
/// `[tokens + 1]`), `<name>.indices` (i32 `[nnz]`, each token's latents in ascending order) and
/// `<name>.values` (`[nnz]`, the stored dtype): row `t` of the shard fired latents
/// `indices[indptr[t]..indptr[t + 1]]`, a CSR matrix `[tokens, width]` over the shard's rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatentsColumn {
    /// `<hook>.hook_sae_acts_post`, with `.<dictionary>` where several dictionaries read one
    /// hook (as SAELens's `HookedSAETransformer` names them).
    pub name: String,
    /// The hook the dictionary reads.
    pub hook: String,
    /// The dictionary's latents (the matrix's columns).
    pub width: usize,
    /// Latents kept per token on the devices; a token that fires more is refused.
    pub cap: usize,
    /// What the dictionary is (its source, format, architecture): opaque to the store.
    #[serde(default)]
    pub dictionary: serde_json::Value,
}

impl LatentsColumn {
    /// What is wrong with the column's statistics `s` in stats.json: a count other than the
    /// `included` tokens, or another width.
    pub(crate) fn check_stats(&self, s: &LatentStats, included: u64) -> Option<String> {
        if s.count != included {
            return Some(format!("latents {} count {} tokens, manifests include {included}", self.name, s.count));
        }
        ([s.firings.len(), s.sums.len(), s.max.len()] != [self.width; 3]).then(|| {
            format!("latents {} has statistics of {} latents, run.json says {}", self.name, s.firings.len(), self.width)
        })
    }

    /// The names of the column's three tensors: indptr, indices, values.
    pub fn tensor_names(&self) -> [String; 3] {
        latents_tensor_names(&self.name)
    }
}

/// The names of a latents column's three tensors: `<name>.indptr`, `<name>.indices`,
/// `<name>.values`.
pub fn latents_tensor_names(name: &str) -> [String; 3] {
    [format!("{name}.indptr"), format!("{name}.indices"), format!("{name}.values")]
}

/// Checks the latents columns: stored as f32, bf16 or f16; a width and a cap; names that are
/// not a hook's, a reserved one or another column's.
pub(crate) fn validate_columns(columns: &[LatentsColumn], hooks: &[String], dtype: DType) -> Result<()> {
    let bad = |reason: String| Err(StoreError::InvalidConfig(reason));
    if !columns.is_empty() && !matches!(dtype, DType::F32 | DType::Bf16 | DType::F16) {
        return bad(format!("latents are stored as f32, bf16 or f16, not {}: choose another --dtype", dtype.name()));
    }
    let mut seen: std::collections::HashSet<String> = hooks.iter().cloned().collect();
    for column in columns {
        if column.width == 0 || column.cap == 0 || column.cap > column.width {
            return bad(format!(
                "latents {}: {} kept per token of {} latents (both > 0, the cap at most the width)",
                column.name, column.cap, column.width
            ));
        }
        if column.width > MAX_LATENTS {
            return bad(format!(
                "latents {}: {} latents, more than the {} a column may have",
                column.name, column.width, MAX_LATENTS
            ));
        }
        let names = std::iter::once(column.name.clone()).chain(column.tensor_names());
        for name in names {
            if RESERVED_TENSOR_NAMES.contains(&name.as_str()) || name.is_empty() || !seen.insert(name.clone()) {
                return bad(format!("latents name {name:?} is empty, reserved or already a hook's or a column's"));
            }
        }
    }
    Ok(())
}

/// One dictionary's latents for a whole batch, as the devices return them: per token its `cap`
/// largest latents (largest first) and its number of firings. The writer stores the firings
/// sparsely ([`crate::LatentsColumn`]); a stored token that fired more than `cap` latents is
/// refused, never truncated.
#[derive(Debug, Clone)]
pub struct BatchLatents {
    /// The column's name, one of the run's [`crate::LatentsColumn`]s.
    pub name: String,
    /// Latents kept per token.
    pub cap: usize,
    /// `[batch, seq, cap]` little-endian i32: latent indices, `-1` past the token's firings.
    pub indices: Bytes,
    /// `[batch, seq, cap]` little-endian f32: their values.
    pub values: Bytes,
    /// `[batch, seq]` little-endian i32: each token's firings (may exceed `cap`).
    pub firings: Bytes,
}

impl BatchLatents {
    /// Token `t`'s kept latents as (index, value) pairs in the order given, into `kept`
    /// (cleared first); `Err` says what is wrong (more firings than kept, an index out of range
    /// or past the firings).
    pub(crate) fn token(&self, t: usize, width: usize, kept: &mut Vec<(u32, f32)>) -> std::result::Result<(), String> {
        let firings = kept_firings(i32::from_le_bytes(word(&self.firings, t)), self.cap)?;
        kept.clear();
        for slot in t * self.cap..(t + 1) * self.cap {
            let index = i32::from_le_bytes(word(&self.indices, slot));
            if index < 0 {
                continue;
            }
            if index as usize >= width {
                return Err(format!("has latent index {index}, past the dictionary's {width} latents"));
            }
            kept.push((index as u32, f32::from_le_bytes(word(&self.values, slot))));
        }
        if kept.len() != firings {
            return Err(format!("counts {firings} firings but holds {} latent indices", kept.len()));
        }
        Ok(())
    }
}

/// Checks a batch's latents against the run's `columns` over its `tokens` (batch * seq): one
/// per column in order, each of a cap within the width and its parts' sizes; `Err` says
/// what is wrong.
pub(crate) fn check_batch(
    batch: &[BatchLatents],
    columns: &[LatentsColumn],
    tokens: usize,
) -> std::result::Result<(), String> {
    if batch.len() != columns.len() || batch.iter().zip(columns).any(|(l, c)| l.name != c.name) {
        let got: Vec<&str> = batch.iter().map(|l| l.name.as_str()).collect();
        let run: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
        return Err(format!("latents {got:?} differ from the run's latents {run:?}"));
    }
    for (l, column) in batch.iter().zip(columns) {
        if l.cap == 0 || l.cap > column.width {
            return Err(format!("latents {} keep {} per token, of {} latents", l.name, l.cap, column.width));
        }
        let slots = tokens.checked_mul(4 * l.cap).ok_or_else(|| format!("latents {} size overflows", l.name))?;
        for (part, len, expected) in [
            ("indices", l.indices.len(), slots),
            ("values", l.values.len(), slots),
            ("firings", l.firings.len(), 4 * tokens),
        ] {
            if len != expected {
                return Err(format!(
                    "latents {} has {len} bytes of {part}, expected {expected} (batch*seq = {tokens}, cap {})",
                    l.name, l.cap
                ));
            }
        }
    }
    Ok(())
}

/// A token's number of `firings` as the devices count them; `Err` when it fired more latents
/// than the `cap` kept: the one place siphon refuses such a token (never truncated), for the
/// writer and for `siphon forward` alike.
pub fn kept_firings(firings: i32, cap: usize) -> std::result::Result<usize, String> {
    match usize::try_from(firings) {
        Ok(n) if n <= cap => Ok(n),
        _ => Err(format!("fires {firings} latents, more than the {cap} kept (--latent-cap): refused, never truncated")),
    }
}

/// The `i`th little-endian 4-byte word of `b`.
fn word(b: &Bytes, i: usize) -> [u8; 4] {
    [b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]
}

/// Statistics of one latents column over the included tokens: how often each latent fired,
/// the sum of its stored values and its largest (a latent's mean activation when firing is
/// `sums[i] / firings[i]`, its firing rate `firings[i] / count`; `max` bounds the activation
/// quantiles a dashboard samples examples from, `min` and `max` its histogram as SAEDashboard
/// bins it). Sums run in f64 over the values as stored, a
/// shard at a time, shards in order: the same bits on resume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatentStats {
    /// Tokens counted.
    pub count: u64,
    /// Per latent, the tokens it fired on.
    pub firings: Vec<u64>,
    /// Per latent, the sum of its values.
    #[serde(with = "float_text::vec")]
    pub sums: Vec<f64>,
    /// Per latent, its largest value (0 for a latent that never fired).
    #[serde(with = "float_text::vec")]
    pub max: Vec<f64>,
    /// Per latent, its smallest value above 0 (0 for a latent that never fired above 0);
    /// empty in the files of runs written before it was counted.
    #[serde(default, with = "float_text::vec", skip_serializing_if = "Vec::is_empty")]
    pub min: Vec<f64>,
}

impl LatentStats {
    /// No tokens yet, over `width` latents.
    pub fn new(width: usize) -> Self {
        LatentStats {
            count: 0,
            firings: vec![0; width],
            sums: vec![0.0; width],
            max: vec![0.0; width],
            min: vec![0.0; width],
        }
    }

    /// `Err` says what is wrong where its arrays do not hold one entry each per latent (the
    /// minima may be absent: files written before they were counted), as merging indexes them.
    pub(crate) fn check_lengths(&self) -> std::result::Result<(), String> {
        let n = self.firings.len();
        if self.sums.len() != n || self.max.len() != n || !(self.min.is_empty() || self.min.len() == n) {
            return Err(format!(
                "{n} firings, {} sums, {} maxima and {} minima (one each per latent)",
                self.sums.len(),
                self.max.len(),
                self.min.len()
            ));
        }
        Ok(())
    }

    /// Counts one token's firings (latent, stored value).
    pub(crate) fn add_token(&mut self, fired: impl IntoIterator<Item = (usize, f32)>) {
        self.count += 1;
        for (latent, value) in fired {
            self.firings[latent] += 1;
            self.sums[latent] += f64::from(value);
            self.max[latent] = self.max[latent].max(f64::from(value));
            if value > 0.0 {
                self.min[latent] = smallest_above_zero(self.min[latent], f64::from(value));
            }
        }
    }

    /// Adds another set of tokens; both must have the same width.
    pub fn merge(&mut self, other: &LatentStats) -> Result<()> {
        if self.firings.len() != other.firings.len() {
            return Err(StoreError::InvalidConfig(format!(
                "cannot merge statistics of {} and {} latents",
                self.firings.len(),
                other.firings.len()
            )));
        }
        let overflow = || {
            StoreError::InvalidConfig(format!(
                "cannot merge latent statistics of {} and {} tokens: a count overflows",
                self.count, other.count
            ))
        };
        let count = self.count.checked_add(other.count).ok_or_else(overflow)?;
        let firings: Vec<u64> = self
            .firings
            .iter()
            .zip(&other.firings)
            .map(|(a, b)| a.checked_add(*b))
            .collect::<Option<_>>()
            .ok_or_else(overflow)?;
        self.count = count;
        self.firings = firings;
        self.sums.iter_mut().zip(&other.sums).for_each(|(a, b)| *a += b);
        self.max.iter_mut().zip(&other.max).for_each(|(a, b)| *a = a.max(*b));
        if self.min.len() == other.min.len() {
            self.min.iter_mut().zip(&other.min).for_each(|(a, b)| *a = smallest_above_zero(*a, *b));
        } else {
            // One side was written before minima were counted: none is known.
            self.min.clear();
        }
        Ok(())
    }
}

/// The smaller of two values above 0, where 0 stands for none.
fn smallest_above_zero(a: f64, b: f64) -> f64 {
    match (a > 0.0, b > 0.0) {
        (true, true) => a.min(b),
        (true, false) => a,
        _ => b,
    }
}

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
    decode_row(dtype, values.data(), &mut decoded);
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
