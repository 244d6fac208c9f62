//! Per-hook normalization statistics: count, per-dimension mean and variance, mean L2 norm.
//!
//! A hook's token activation may have several dimensions (`[n_heads, d_head]`); statistics see
//! it flattened row-major: mean and variance per flattened element, the norm over the whole
//! flattened row.
//!
//! Statistics are computed from the values as stored (after dtype conversion) over included
//! tokens only, one chunk per shard (two-pass mean/M2 inside the chunk), and chunks are combined
//! with Chan et al.'s parallel update. The same function runs in the writer and when stats are
//! rebuilt from shards on resume, so both give identical numbers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::batch::DType;
use crate::error::{Result, StoreError};

/// Running statistics of one hook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HookStats {
    /// Per-token shape; `mean` and `m2` hold one entry per element of it (row-major).
    #[serde(default)]
    pub shape: Vec<usize>,
    /// Number of token rows.
    pub count: u64,
    /// Per-element mean.
    pub mean: Vec<f64>,
    /// Per-element sum of squared deviations from the mean (variance = m2 / count).
    pub m2: Vec<f64>,
    /// Sum of per-token L2 norms over the flattened row (mean norm = norm_sum / count).
    pub norm_sum: f64,
}

impl HookStats {
    /// Empty statistics for token activations of per-token shape `shape`.
    pub fn new(shape: &[usize]) -> Self {
        let width = shape.iter().product();
        HookStats { shape: shape.to_vec(), count: 0, mean: vec![0.0; width], m2: vec![0.0; width], norm_sum: 0.0 }
    }

    /// Elements per token row: the product of `shape`.
    pub fn width(&self) -> usize {
        self.mean.len()
    }

    /// Statistics of the rows of `data` (`[rows, *shape]` of `dtype`) whose mask entry is true.
    pub fn from_rows(dtype: DType, shape: &[usize], data: &[u8], mask: Option<&[bool]>) -> Self {
        let mut acc = StatsAccumulator::new(dtype, shape);
        acc.add_rows(data, mask);
        acc.finish()
    }

    /// Chan et al.'s combination of two disjoint sets; both must have the same shape.
    pub fn merge(&mut self, other: &HookStats) -> Result<()> {
        if other.count == 0 {
            return Ok(());
        }
        if self.shape != other.shape || self.mean.len() != other.mean.len() {
            return Err(StoreError::InvalidConfig(format!(
                "cannot merge statistics of per-token shape {:?} and {:?}",
                self.shape, other.shape
            )));
        }
        if self.count == 0 {
            *self = other.clone();
            return Ok(());
        }
        let (na, nb) = (self.count as f64, other.count as f64);
        let n = na + nb;
        for i in 0..self.mean.len() {
            let delta = other.mean[i] - self.mean[i];
            self.mean[i] += delta * nb / n;
            self.m2[i] += other.m2[i] + delta * delta * na * nb / n;
        }
        self.count += other.count;
        self.norm_sum += other.norm_sum;
        Ok(())
    }

    /// Population variance per element.
    pub fn variance(&self) -> Vec<f64> {
        let n = self.count.max(1) as f64;
        self.m2.iter().map(|m2| m2 / n).collect()
    }

    /// Mean L2 norm of the (flattened) token rows.
    pub fn mean_norm(&self) -> f64 {
        self.norm_sum / self.count.max(1) as f64
    }
}

/// One pass over rows with sums shifted by the first included row (the "shifted data"
/// variance algorithm): as accurate as two passes for activation-like data, half the reads.
/// Rows may arrive in several slices; the result depends only on the rows, not the slicing.
pub(crate) struct StatsAccumulator {
    dtype: DType,
    shape: Vec<usize>,
    width: usize,
    row: Vec<f32>,
    shift: Option<Vec<f64>>,
    s1: Vec<f64>,
    s2: Vec<f64>,
    count: u64,
    norm_sum: f64,
}

impl StatsAccumulator {
    pub fn new(dtype: DType, shape: &[usize]) -> Self {
        let width = shape.iter().product();
        StatsAccumulator {
            dtype,
            shape: shape.to_vec(),
            width,
            row: vec![0.0; width],
            shift: None,
            s1: vec![0.0; width],
            s2: vec![0.0; width],
            count: 0,
            norm_sum: 0.0,
        }
    }

    /// Adds whole rows; `mask` (one entry per row) selects the rows to count.
    pub fn add_rows(&mut self, data: &[u8], mask: Option<&[bool]>) {
        let row_bytes = self.dtype.row_bytes(self.width);
        let rows = data.len().checked_div(row_bytes).unwrap_or(0);
        for r in (0..rows).filter(|&r| mask.is_none_or(|m| m[r])) {
            decode_row(self.dtype, &data[r * row_bytes..(r + 1) * row_bytes], &mut self.row);
            let row = &self.row;
            let shift = self.shift.get_or_insert_with(|| row.iter().map(|&x| x as f64).collect());
            let mut sq = 0f64;
            for (((a, b), &k), &x) in self.s1.iter_mut().zip(self.s2.iter_mut()).zip(shift.iter()).zip(row) {
                let x = x as f64;
                let y = x - k;
                *a += y;
                *b += y * y;
                sq += x * x;
            }
            self.norm_sum += sq.sqrt();
            self.count += 1;
        }
    }

    pub fn finish(self) -> HookStats {
        let mut stats = HookStats::new(&self.shape);
        let Some(shift) = self.shift else {
            return stats;
        };
        stats.count = self.count;
        stats.norm_sum = self.norm_sum;
        let n = self.count as f64;
        let sums = shift.iter().zip(&self.s1).zip(&self.s2);
        for ((mean, m2), ((k, s1), s2)) in stats.mean.iter_mut().zip(stats.m2.iter_mut()).zip(sums) {
            *mean = k + s1 / n;
            *m2 = (s2 - s1 * s1 / n).max(0.0);
        }
        stats
    }
}

/// Statistics of every hook, keyed by hook name; what `stats.json` holds.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StatsFile {
    /// Index of the last shard these statistics cover per host (`None` in the merged file or
    /// when no shard is covered yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub through_shard: Option<u64>,
    /// Per hook.
    pub hooks: BTreeMap<String, HookStatsJson>,
}

/// The JSON form of [`HookStats`] with the derived values spelled out for readers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HookStatsJson {
    /// Per-token shape; `mean` and `variance` are over its elements flattened row-major.
    /// Absent in format-1 files, where it is `[mean.len()]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shape: Vec<usize>,
    /// Token rows counted.
    pub count: u64,
    /// Per-element mean.
    pub mean: Vec<f64>,
    /// Per-element population variance.
    pub variance: Vec<f64>,
    /// Mean L2 norm of the flattened token rows.
    pub mean_norm: f64,
    /// The running state behind `variance` (`variance · count`) and `mean_norm`
    /// (`mean_norm · count`), exactly: statistics read back (on resume, when hosts are merged)
    /// continue bit-identically, which `variance · count` does not. Absent in files before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub m2: Option<Vec<f64>>,
    /// See `m2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm_sum: Option<f64>,
}

impl From<&HookStats> for HookStatsJson {
    fn from(s: &HookStats) -> Self {
        HookStatsJson {
            shape: s.shape.clone(),
            count: s.count,
            mean: s.mean.clone(),
            variance: s.variance(),
            mean_norm: s.mean_norm(),
            m2: Some(s.m2.clone()),
            norm_sum: Some(s.norm_sum),
        }
    }
}

impl From<&HookStatsJson> for HookStats {
    fn from(s: &HookStatsJson) -> Self {
        let n = s.count as f64;
        let shape = if s.shape.is_empty() { vec![s.mean.len()] } else { s.shape.clone() };
        HookStats {
            shape,
            count: s.count,
            mean: s.mean.clone(),
            m2: s.m2.clone().unwrap_or_else(|| s.variance.iter().map(|v| v * n).collect()),
            norm_sum: s.norm_sum.unwrap_or(s.mean_norm * n),
        }
    }
}

/// Statistics for all hooks of a run.
pub type RunStats = BTreeMap<String, HookStats>;

/// Merges `other` into `into`, hook by hook.
pub fn merge_run_stats(into: &mut RunStats, other: &RunStats) -> Result<()> {
    for (hook, stats) in other {
        match into.get_mut(hook) {
            Some(existing) => existing.merge(stats)?,
            None => {
                into.insert(hook.clone(), stats.clone());
            }
        }
    }
    Ok(())
}

/// Converts running statistics into the file form.
pub fn to_file(stats: &RunStats, through_shard: Option<u64>) -> StatsFile {
    StatsFile { through_shard, hooks: stats.iter().map(|(k, v)| (k.clone(), v.into())).collect() }
}

/// Converts the file form back into running statistics.
pub fn from_file(file: &StatsFile) -> RunStats {
    file.hooks.iter().map(|(k, v)| (k.clone(), v.into())).collect()
}

/// Decodes one row of little-endian `dtype` values into f32.
pub(crate) fn decode_row(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::Bf16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        DType::U8 => unreachable!("u8 holds no activations (refused by BatchActivations::validate)"),
        DType::Fp8 => {
            let scale = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            for (o, &b) in out.iter_mut().zip(&bytes[4..]) {
                *o = siphon_dtype::e4m3fn_to_f32(b) * scale;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// What a resumed run does: statistics written to JSON, read back, merged with more.
    /// It must give the bits an uninterrupted run gives; `variance · count` would not
    /// (7.887233511355132 / 3 · 3 is not 7.887233511355132).
    #[test]
    fn statistics_read_back_continue_bit_identically() {
        let first = HookStats {
            shape: vec![2],
            count: 3,
            mean: vec![0.25, -1.5],
            m2: vec![7.887233511355132, 0.7],
            norm_sum: 7.887233511355132,
        };
        let text = serde_json::to_vec(&to_file(&[("h".to_string(), first.clone())].into(), Some(0))).unwrap();
        let back = from_file(&serde_json::from_slice(&text).unwrap());
        assert_eq!(back["h"], first, "bit-identical after a JSON round trip");
        let more = HookStats::from_rows(DType::F32, &[2], &f32_bytes(&[0.3, 1.7, -2.2, 0.9]), None);
        let (mut straight, mut resumed) = (first, back["h"].clone());
        straight.merge(&more).unwrap();
        resumed.merge(&more).unwrap();
        assert_eq!(resumed, straight);
    }

    #[test]
    fn chunked_merge_matches_one_pass() {
        // 7 rows of width 2, split 3 + 4, with one masked row in the second chunk.
        let rows: Vec<[f32; 2]> =
            vec![[1.0, -2.0], [3.0, 0.5], [2.0, 4.0], [-1.0, 1.0], [100.0, 100.0], [0.0, 2.0], [5.0, -3.0]];
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        let mask = [true, true, true, true, false, true, true];
        let all = HookStats::from_rows(DType::F32, &[2], &f32_bytes(&flat), Some(&mask));
        let mut merged = HookStats::from_rows(DType::F32, &[2], &f32_bytes(&flat[..6]), None);
        merged.merge(&HookStats::from_rows(DType::F32, &[2], &f32_bytes(&flat[6..]), Some(&mask[3..]))).unwrap();

        let kept: Vec<[f32; 2]> = rows.iter().zip(mask).filter(|(_, m)| *m).map(|(r, _)| *r).collect();
        let n = kept.len() as f64;
        for d in 0..2 {
            let mean = kept.iter().map(|r| r[d] as f64).sum::<f64>() / n;
            let var = kept.iter().map(|r| (r[d] as f64 - mean).powi(2)).sum::<f64>() / n;
            for s in [&all, &merged] {
                assert_eq!(s.count, 6);
                assert!((s.mean[d] - mean).abs() < 1e-12, "{} vs {mean}", s.mean[d]);
                assert!((s.variance()[d] - var).abs() < 1e-9);
            }
        }
        let norm = kept.iter().map(|r| ((r[0] as f64).powi(2) + (r[1] as f64).powi(2)).sqrt()).sum::<f64>() / n;
        assert!((merged.mean_norm() - norm).abs() < 1e-12);
        // Survives the JSON form.
        let back = HookStats::from(&HookStatsJson::from(&merged));
        assert!((back.m2[1] - merged.m2[1]).abs() < 1e-9);
    }

    #[test]
    fn width_mismatch_is_an_error() {
        let mut a = HookStats::from_rows(DType::F32, &[1], &f32_bytes(&[1.0]), None);
        let b = HookStats::from_rows(DType::F32, &[2], &f32_bytes(&[1.0, 2.0]), None);
        assert!(a.merge(&b).is_err());
        // Same width, different shape: a per-head [2, 2] hook is not a [4] vector.
        let data = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
        let mut heads = HookStats::from_rows(DType::F32, &[2, 2], &data, None);
        let flat = HookStats::from_rows(DType::F32, &[4], &data, None);
        let err = heads.merge(&flat).unwrap_err().to_string();
        assert!(err.contains("[2, 2]") && err.contains("[4]"), "{err}");
    }

    #[test]
    fn multi_dimensional_rows_are_flattened() {
        // Two tokens of per-token shape [2, 2]: statistics per flattened element, the norm over
        // the whole row.
        let rows = [[1.0f32, 2.0, 3.0, 4.0], [3.0, 2.0, 1.0, 0.0]];
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        let s = HookStats::from_rows(DType::F32, &[2, 2], &f32_bytes(&flat), None);
        assert_eq!((s.count, s.width(), s.shape.as_slice()), (2, 4, &[2, 2][..]));
        assert_eq!(s.mean, vec![2.0, 2.0, 2.0, 2.0]);
        assert_eq!(s.variance(), vec![1.0, 0.0, 1.0, 4.0]);
        let norm = (30f64.sqrt() + 14f64.sqrt()) / 2.0;
        assert!((s.mean_norm() - norm).abs() < 1e-12);
        // The file form records the shape; a format-1 entry without one reads as [width].
        let json = HookStatsJson::from(&s);
        assert_eq!(json.shape, vec![2, 2]);
        assert_eq!(HookStats::from(&json).shape, vec![2, 2]);
        let old: HookStatsJson = serde_json::from_value(serde_json::json!({
            "count": 2, "mean": [1.0, 2.0, 3.0], "variance": [0.0, 0.0, 0.0], "mean_norm": 1.0
        }))
        .unwrap();
        assert_eq!(HookStats::from(&old).shape, vec![3]);
    }
}
