//! The model's own outputs as the store holds them (`siphon extract --outputs`): per kept token,
//! a dense tensor of a fixed element type whatever the run's dtype — `output.nll` and
//! `output.entropy` (f32 `[tokens]`), `output.topk_logprobs` (f32 `[tokens, K]`),
//! `output.topk_ids` (i32 `[tokens, K]`). The run's column as run.json describes it
//! ([`OutputColumn`]), a batch's values as the devices return them ([`BatchOutput`]), a shard's
//! rows being built ([`OutputRows`]), their statistics ([`OutputStats`]: per element the finite
//! values' count, sum, minimum and maximum; `output.nll` is NaN where a token has no next token,
//! which its `defined` count leaves out) and a shard's tensor read back ([`summarize`]).

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};
use crate::float_text;
use crate::tensor::{RESERVED_TENSOR_NAMES, Rank, Tensor};

/// An output's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputDType {
    /// 32-bit IEEE float (log-probabilities, NLL, entropy).
    F32,
    /// 32-bit signed integer (token ids).
    I32,
}

impl OutputDType {
    /// Its safetensors name.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            OutputDType::F32 => "F32",
            OutputDType::I32 => "I32",
        }
    }

    fn of(dtype: safetensors::Dtype) -> Option<OutputDType> {
        match dtype {
            safetensors::Dtype::F32 => Some(OutputDType::F32),
            safetensors::Dtype::I32 => Some(OutputDType::I32),
            _ => None,
        }
    }
}

/// One output column of the run: a tensor `[tokens, *shape]` of `dtype` per shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputColumn {
    /// `output.nll`, `output.entropy`, `output.topk_logprobs`, `output.topk_ids`.
    pub name: String,
    /// Its element type.
    pub dtype: OutputDType,
    /// One token's shape: `[]` for a scalar, `[K]` for the top-k columns.
    pub shape: Vec<usize>,
}

impl OutputColumn {
    /// Values per token: the product of `shape` (1 for a scalar).
    pub fn width(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes per token.
    pub fn row_bytes(&self) -> usize {
        4 * self.width()
    }

    /// What is wrong with the column's statistics `s` in stats.json: a count other than the
    /// `included` tokens, or another width.
    pub(crate) fn check_stats(&self, s: &OutputStats, included: u64) -> Option<String> {
        if s.count != included {
            return Some(format!("output {} counts {} tokens, manifests include {included}", self.name, s.count));
        }
        let width = match self.dtype {
            OutputDType::F32 => self.width(),
            OutputDType::I32 => 0,
        };
        (s.check_lengths(width).is_err())
            .then(|| format!("output {} has statistics of {} values, run.json says {width}", self.name, s.sum.len()))
    }
}

/// Checks the output columns: a known width (at most 1024 values a token) and names that are no
/// hook's, latents column's, reserved or another output's.
pub(crate) fn validate_columns(columns: &[OutputColumn], taken: &[String]) -> Result<()> {
    let mut seen: std::collections::HashSet<&str> = taken.iter().map(String::as_str).collect();
    for column in columns {
        if column.shape.contains(&0) || column.width() > MAX_OUTPUT_WIDTH {
            return Err(StoreError::InvalidConfig(format!(
                "output {}: per-token shape {:?} (no zero dimension, at most {MAX_OUTPUT_WIDTH} values)",
                column.name, column.shape
            )));
        }
        if RESERVED_TENSOR_NAMES.contains(&column.name.as_str()) || column.name.is_empty() || !seen.insert(&column.name)
        {
            return Err(StoreError::InvalidConfig(format!(
                "output name {:?} is empty, reserved or already a hook's or a column's",
                column.name
            )));
        }
    }
    Ok(())
}

/// The most values one token's output may have.
const MAX_OUTPUT_WIDTH: usize = 1024;

/// One output's values for a whole batch: `[batch, seq, *shape]` little-endian.
#[derive(Debug, Clone)]
pub struct BatchOutput {
    /// The column's name, one of the run's [`OutputColumn`]s.
    pub name: String,
    /// The values.
    pub data: Bytes,
}

/// Checks a batch's outputs against the run's `columns` over its `tokens`: one per column in
/// order, of its size.
pub(crate) fn check_batch(
    batch: &[BatchOutput],
    columns: &[OutputColumn],
    tokens: usize,
) -> std::result::Result<(), String> {
    if batch.len() != columns.len() || batch.iter().zip(columns).any(|(o, c)| o.name != c.name) {
        let got: Vec<&str> = batch.iter().map(|o| o.name.as_str()).collect();
        let run: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
        return Err(format!("outputs {got:?} differ from the run's outputs {run:?}"));
    }
    for (o, column) in batch.iter().zip(columns) {
        let expected = tokens.checked_mul(column.row_bytes());
        if expected != Some(o.data.len()) {
            return Err(format!(
                "output {} has {} bytes, expected batch*seq*{} = {expected:?}",
                o.name,
                o.data.len(),
                column.row_bytes()
            ));
        }
    }
    Ok(())
}

/// Statistics of one output column over the included tokens, per element of a token's value:
/// how many values were finite (`output.nll` is NaN where the token has no next token), their
/// sum (a mean is `sum / defined`: the mean NLL is the cross-entropy), minimum and maximum. An
/// i32 column (ids) counts its tokens only. Sums run in f64 over the stored f32 values, a shard
/// at a time, shards in order: the same bits on resume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputStats {
    /// Tokens counted.
    pub count: u64,
    /// Per element, the finite values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub defined: Vec<u64>,
    /// Per element, the sum of the finite values.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "float_text::vec")]
    pub sum: Vec<f64>,
    /// Per element, the smallest finite value (NaN, written `null`, where there is none).
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "float_text::vec")]
    pub min: Vec<f64>,
    /// Per element, the largest finite value (NaN, written `null`, where there is none).
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "float_text::vec")]
    pub max: Vec<f64>,
}

impl OutputStats {
    /// Empty statistics of `width` values a token (0 for a column of ids).
    pub fn new(width: usize) -> Self {
        OutputStats {
            count: 0,
            defined: vec![0; width],
            sum: vec![0.0; width],
            // `f64::min` and `max` take the number over a NaN.
            min: vec![f64::NAN; width],
            max: vec![f64::NAN; width],
        }
    }

    /// The mean of each element's finite values (NaN where there were none).
    pub fn mean(&self) -> Vec<f64> {
        self.sum.iter().zip(&self.defined).map(|(s, &n)| if n == 0 { f64::NAN } else { s / n as f64 }).collect()
    }

    /// Adds one token's `row` of f32 values (none for a column of ids).
    fn add(&mut self, row: &[u8]) {
        self.count += 1;
        for (i, c) in row.chunks_exact(4).enumerate().take(self.sum.len()) {
            let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            if v.is_finite() {
                let v = f64::from(v);
                self.defined[i] += 1;
                self.sum[i] += v;
                self.min[i] = self.min[i].min(v);
                self.max[i] = self.max[i].max(v);
            }
        }
    }

    /// Merges `other`'s tokens into these.
    pub fn merge(&mut self, other: &OutputStats) -> Result<()> {
        if other.sum.len() != self.sum.len() {
            return Err(StoreError::InvalidConfig(format!(
                "cannot merge output statistics of {} values a token into {}",
                other.sum.len(),
                self.sum.len()
            )));
        }
        self.count += other.count;
        for i in 0..self.sum.len() {
            self.defined[i] += other.defined[i];
            self.sum[i] += other.sum[i];
            self.min[i] = self.min[i].min(other.min[i]);
            self.max[i] = self.max[i].max(other.max[i]);
        }
        Ok(())
    }

    /// `Err` unless every per-element list has `width` entries.
    pub(crate) fn check_lengths(&self, width: usize) -> std::result::Result<(), String> {
        let lengths = [self.defined.len(), self.sum.len(), self.min.len(), self.max.len()];
        match lengths == [width; 4] {
            true => Ok(()),
            false => Err(format!("per-element lists of {lengths:?} entries, expected {width}")),
        }
    }
}

/// One output's rows of a shard being built, in shard order, with their statistics over the
/// included tokens.
pub(crate) struct OutputRows {
    column: OutputColumn,
    rows: Vec<u8>,
    stats: OutputStats,
}

impl OutputRows {
    pub fn new(column: &OutputColumn) -> Self {
        OutputRows { column: column.clone(), rows: Vec::new(), stats: OutputStats::new(stats_width(column)) }
    }

    /// Bytes so far.
    pub fn bytes(&self) -> usize {
        self.rows.len()
    }

    /// Appends token `t` of `batch`'s values, counted in the statistics when `included`.
    pub fn push(&mut self, batch: &BatchOutput, t: usize, included: bool) {
        let n = self.column.row_bytes();
        let row = &batch.data[t * n..(t + 1) * n];
        self.rows.extend_from_slice(row);
        if included {
            self.stats.add(row);
        }
    }

    /// Its statistics so far.
    pub fn stats(&self) -> &OutputStats {
        &self.stats
    }

    /// Its tensor over the shard's `tokens` rows.
    pub fn into_tensors(self, tokens: usize) -> Vec<Tensor> {
        let shape = std::iter::once(tokens).chain(self.column.shape.iter().copied()).collect();
        vec![Tensor {
            name: self.column.name,
            dtype: self.column.dtype.safetensors_name(),
            shape,
            data: vec![Bytes::from(self.rows)],
            rank: Rank::Outputs,
        }]
    }
}

/// Elements whose statistics a column keeps: its width for f32 values, none for ids.
fn stats_width(column: &OutputColumn) -> usize {
    match column.dtype {
        OutputDType::F32 => column.width(),
        OutputDType::I32 => 0,
    }
}

/// Output `column`'s tensor in a shard file of `tokens` rows, checked (its dtype and
/// `[tokens, *shape]`): the statistics of the rows `mask` includes (all without a mask). `Err`
/// says what is wrong, naming the output.
pub(crate) fn summarize(
    st: &safetensors::SafeTensors<'_>,
    column: &OutputColumn,
    tokens: usize,
    mask: Option<&[bool]>,
) -> std::result::Result<OutputStats, String> {
    let name = &column.name;
    let t = st.tensor(name).map_err(|e| format!("output {name}: {e}"))?;
    let expected: Vec<usize> = std::iter::once(tokens).chain(column.shape.iter().copied()).collect();
    if OutputDType::of(t.dtype()) != Some(column.dtype) || t.shape() != expected {
        return Err(format!(
            "output {name} is {:?}{:?}, expected {}{expected:?}",
            t.dtype(),
            t.shape(),
            column.dtype.safetensors_name()
        ));
    }
    let mut stats = OutputStats::new(stats_width(column));
    for (r, row) in t.data().chunks_exact(column.row_bytes()).enumerate() {
        if mask.is_none_or(|m| m[r]) {
            stats.add(row);
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn statistics_count_the_finite_values_and_merge_as_one_pass() {
        let values = [2.0f32, f32::NAN, 4.0, -1.0];
        let mut whole = OutputStats::new(1);
        let (mut first, mut second) = (OutputStats::new(1), OutputStats::new(1));
        for (i, row) in f32s(&values).chunks_exact(4).enumerate() {
            whole.add(row);
            if i < 2 { first.add(row) } else { second.add(row) }
        }
        first.merge(&second).unwrap();
        assert_eq!(first, whole);
        assert_eq!((whole.count, whole.defined[0], whole.sum[0]), (4, 3, 5.0));
        assert_eq!((whole.min[0], whole.max[0]), (-1.0, 4.0));
        assert!((whole.mean()[0] - 5.0 / 3.0).abs() < 1e-12);
        assert!(OutputStats::new(1).mean()[0].is_nan(), "no finite value: no mean");
        let wrong = first.merge(&OutputStats::new(2)).unwrap_err().to_string();
        assert!(wrong.contains("2 values a token into 1"), "{wrong}");
    }

    #[test]
    fn a_batch_and_the_columns_must_agree() {
        let column = OutputColumn { name: "output.topk_ids".into(), dtype: OutputDType::I32, shape: vec![3] };
        let good = BatchOutput { name: column.name.clone(), data: Bytes::from(vec![0u8; 2 * 12]) };
        check_batch(std::slice::from_ref(&good), std::slice::from_ref(&column), 2).unwrap();
        let short = check_batch(std::slice::from_ref(&good), std::slice::from_ref(&column), 3).unwrap_err();
        assert!(short.contains("has 24 bytes, expected batch*seq*12 = Some(36)"), "{short}");
        let other = BatchOutput { name: "output.nll".into(), ..good };
        let named = check_batch(&[other], std::slice::from_ref(&column), 2).unwrap_err();
        assert!(named.contains("outputs [\"output.nll\"] differ"), "{named}");
        let clash =
            validate_columns(std::slice::from_ref(&column), &["output.topk_ids".into()]).unwrap_err().to_string();
        assert!(clash.contains("already a hook's or a column's"), "{clash}");
        let zero = OutputColumn { shape: vec![0], ..column };
        assert!(validate_columns(&[zero], &[]).unwrap_err().to_string().contains("no zero dimension"));
    }
}
