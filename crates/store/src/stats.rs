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
//!
//! Values that are not finite are counted per hook (`non_finite`); the writer refuses a shard
//! holding one unless the run allows them (`ShardFormat::allow_non_finite`), whose statistics
//! then hold NaN or ±Inf where those values reach them, written to `stats.json` as `null`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use siphon_dtype::DType;

use crate::error::{Result, StoreError};
use crate::float_text;
use crate::moments::{self, BLOCK, Moments};
use crate::output::OutputStats;
use crate::sparse::LatentStats;
use crate::tensor::decode_row;

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
    /// Per-element minimum and maximum; empty when unknown (statistics written before they
    /// were kept, and anything merged with those).
    #[serde(default)]
    pub min: Vec<f64>,
    /// See `min`.
    #[serde(default)]
    pub max: Vec<f64>,
    /// Elements that are NaN or ±Inf (counted, and reaching the other statistics as they do).
    #[serde(default)]
    pub non_finite: u64,
}

impl HookStats {
    /// Empty statistics for token activations of per-token shape `shape`.
    pub fn new(shape: &[usize]) -> Self {
        let width = shape.iter().product();
        HookStats {
            shape: shape.to_vec(),
            count: 0,
            mean: vec![0.0; width],
            m2: vec![0.0; width],
            norm_sum: 0.0,
            min: Vec::new(),
            max: Vec::new(),
            non_finite: 0,
        }
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
        let count = self.count.checked_add(other.count).ok_or_else(|| {
            StoreError::InvalidConfig(format!(
                "cannot merge statistics of {} and {} tokens: the count overflows",
                self.count, other.count
            ))
        })?;
        let (na, nb) = (self.count as f64, other.count as f64);
        let n = na + nb;
        for i in 0..self.mean.len() {
            let delta = other.mean[i] - self.mean[i];
            self.mean[i] += delta * nb / n;
            self.m2[i] += other.m2[i] + delta * delta * na * nb / n;
        }
        self.count = count;
        self.norm_sum += other.norm_sum;
        self.non_finite += other.non_finite;
        if self.min.is_empty() || other.min.is_empty() {
            (self.min, self.max) = (Vec::new(), Vec::new());
        } else {
            // NaN wins: a ±Inf read back from stats.json's `null` is NaN, and must merge as the
            // ±Inf it was (stays not finite) for a resumed run's statistics to equal the run's.
            let pick = |a: f64, b: f64, first: fn(f64, f64) -> f64| {
                if a.is_nan() || b.is_nan() { f64::NAN } else { first(a, b) }
            };
            self.min.iter_mut().zip(&other.min).for_each(|(a, b)| *a = pick(*a, *b, f64::min));
            self.max.iter_mut().zip(&other.max).for_each(|(a, b)| *a = pick(*a, *b, f64::max));
        }
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

/// Statistics over rows handed in any slicing: one pass, sums shifted by the first included
/// row (the "shifted data" variance algorithm: as accurate as two passes for activation-like
/// data, half the reads), reduced in blocks of [`BLOCK`] stored rows counted from the first
/// row ([`crate::moments`]). The result depends only on the rows and the mask, never on how
/// they were sliced: a shard's statistics recomputed from its file equal the writer's bits.
pub(crate) struct StatsAccumulator {
    dtype: DType,
    shape: Vec<usize>,
    width: usize,
    row_bytes: usize,
    moments: Option<Moments>,
    /// Stored rows of the block in progress (fewer than [`BLOCK`]) and their mask entries.
    pending: Vec<u8>,
    pending_mask: Vec<bool>,
    /// Rows handed in so far (included or not).
    rows: usize,
    /// The first included row holding a value that is not finite, counted as `rows` is.
    first_non_finite: Option<usize>,
}

impl StatsAccumulator {
    pub fn new(dtype: DType, shape: &[usize]) -> Self {
        let width = shape.iter().product();
        StatsAccumulator {
            dtype,
            shape: shape.to_vec(),
            width,
            row_bytes: dtype.row_bytes(width),
            moments: None,
            pending: Vec::new(),
            pending_mask: Vec::new(),
            rows: 0,
            first_non_finite: None,
        }
    }

    /// Adds whole stored rows; `mask` (one entry per row) selects the rows to count. Rows that
    /// complete blocks are reduced where they lie; only a block's unfinished rest is copied.
    pub fn add_rows(&mut self, data: &[u8], mask: Option<&[bool]>) {
        let rows = data.len().checked_div(self.row_bytes).unwrap_or(0);
        let mask_of = |r: std::ops::Range<usize>| mask.map(|m| &m[r]);
        let mut r = 0;
        if !self.pending_mask.is_empty() {
            r = (BLOCK - self.pending_mask.len()).min(rows);
            self.pending.extend_from_slice(&data[..r * self.row_bytes]);
            self.pending_mask.extend(mask_of(0..r).map_or(vec![true; r], <[bool]>::to_vec));
            if self.pending_mask.len() < BLOCK {
                return;
            }
            self.reduce_pending();
        }
        while r + BLOCK <= rows {
            let block: Vec<&[u8]> =
                data[r * self.row_bytes..(r + BLOCK) * self.row_bytes].chunks_exact(self.row_bytes).collect();
            self.reduce(&block, mask_of(r..r + BLOCK));
            r += BLOCK;
        }
        if r < rows {
            self.pending.extend_from_slice(&data[r * self.row_bytes..rows * self.row_bytes]);
            self.pending_mask.extend(mask_of(r..rows).map_or(vec![true; rows - r], <[bool]>::to_vec));
        }
    }

    fn reduce_pending(&mut self) {
        let (pending, mask) = (std::mem::take(&mut self.pending), std::mem::take(&mut self.pending_mask));
        let block: Vec<&[u8]> = pending.chunks_exact(self.row_bytes).collect();
        self.reduce(&block, Some(&mask));
    }

    /// Reduces one block: `rows` are at most [`BLOCK`] stored rows, the block that starts at a
    /// multiple of [`BLOCK`] rows from the first (or the last, shorter one); `mask` selects the
    /// included ones. [`StatsAccumulator::add_rows`] cuts blocks so; a caller that holds the
    /// rows in pieces (a shard's column) cuts them so itself.
    pub fn reduce(&mut self, rows: &[&[u8]], mask: Option<&[bool]>) {
        let start = self.rows;
        self.rows += rows.len();
        let (at, included): (Vec<usize>, Vec<&[u8]>) =
            rows.iter().enumerate().filter(|(r, _)| mask.is_none_or(|m| m[*r])).map(|(r, row)| (r, *row)).unzip();
        let Some(first) = included.first() else {
            return;
        };
        let (dtype, width) = (self.dtype, self.width);
        let moments = self.moments.get_or_insert_with(|| {
            let mut shift = vec![0f32; width];
            decode_row(dtype, first, &mut shift);
            Moments::new(shift)
        });
        if let Some(k) = moments::reduce_block(self.dtype, &included, moments) {
            self.first_non_finite = self.first_non_finite.or(Some(start + at[k]));
        }
    }

    /// The first included row (counted over every row handed in) holding a value that is not
    /// finite, once the rows are reduced ([`StatsAccumulator::finish`] reduces the last ones).
    pub fn first_non_finite(&self) -> Option<usize> {
        self.first_non_finite
    }

    pub fn finish(mut self) -> HookStats {
        if !self.pending_mask.is_empty() {
            self.reduce_pending();
        }
        let mut stats = HookStats::new(&self.shape);
        let Some(m) = self.moments else {
            return stats;
        };
        stats.count = m.count;
        stats.norm_sum = m.norm_sum;
        stats.non_finite = m.non_finite;
        let n = m.count as f64;
        let sums = m.shift.iter().zip(&m.s1).zip(&m.s2);
        for ((mean, m2), ((&k, s1), s2)) in stats.mean.iter_mut().zip(stats.m2.iter_mut()).zip(sums) {
            *mean = f64::from(k) + s1 / n;
            // Rounding may leave a hair below zero; a NaN (of values that are not finite) stays.
            let deviations = s2 - s1 * s1 / n;
            *m2 = if deviations.is_nan() { deviations } else { deviations.max(0.0) };
        }
        stats.min = m.min.iter().map(|&v| f64::from(v)).collect();
        stats.max = m.max.iter().map(|&v| f64::from(v)).collect();
        stats
    }
}

/// Statistics of every hook and latents column, keyed by name; what `stats.json` holds.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StatsFile {
    /// Index of the last shard these statistics cover per host (`None` in the merged file or
    /// when no shard is covered yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub through_shard: Option<u64>,
    /// Per hook.
    pub hooks: BTreeMap<String, HookStatsJson>,
    /// Per latents column. Absent in runs without dictionaries.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub latents: BTreeMap<String, LatentStats>,
    /// Per output column (`siphon extract --outputs`). Absent in runs without them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outputs: BTreeMap<String, OutputStats>,
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
    #[serde(with = "float_text::vec")]
    pub mean: Vec<f64>,
    /// Per-element population variance.
    #[serde(with = "float_text::vec")]
    pub variance: Vec<f64>,
    /// Mean L2 norm of the flattened token rows.
    #[serde(with = "float_text::one")]
    pub mean_norm: f64,
    /// The running state behind `variance` (`variance · count`) and `mean_norm`
    /// (`mean_norm · count`), exactly: statistics read back (on resume, when hosts are merged)
    /// continue bit-identically, which `variance · count` does not. Absent in files before it.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "float_text::opt_vec")]
    pub m2: Option<Vec<f64>>,
    /// See `m2`.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "float_text::opt_one")]
    pub norm_sum: Option<f64>,
    /// Per-element minimum of the stored values. Absent in files before it.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "float_text::opt_vec")]
    pub min: Option<Vec<f64>>,
    /// Per-element maximum of the stored values. Absent in files before it.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "float_text::opt_vec")]
    pub max: Option<Vec<f64>>,
    /// Elements that are NaN or ±Inf (a run written with `--allow-non-finite`); the statistics
    /// they reach are `null`. Absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub non_finite: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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
            min: (!s.min.is_empty()).then(|| s.min.clone()),
            max: (!s.max.is_empty()).then(|| s.max.clone()),
            non_finite: s.non_finite,
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
            min: s.min.clone().unwrap_or_default(),
            max: s.max.clone().unwrap_or_default(),
            non_finite: s.non_finite,
        }
    }
}

/// Statistics of a run's (or a shard's) hooks and latents columns.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunStats {
    /// Per hook.
    pub hooks: BTreeMap<String, HookStats>,
    /// Per latents column.
    pub latents: BTreeMap<String, LatentStats>,
    /// Per output column.
    pub outputs: BTreeMap<String, OutputStats>,
}

impl RunStats {
    /// No statistics yet.
    pub fn new() -> Self {
        RunStats::default()
    }
}

/// Merges `other` into `into`, hook by hook and column by column.
pub fn merge_run_stats(into: &mut RunStats, other: &RunStats) -> Result<()> {
    for (hook, stats) in &other.hooks {
        match into.hooks.get_mut(hook) {
            Some(existing) => existing.merge(stats)?,
            None => _ = into.hooks.insert(hook.clone(), stats.clone()),
        }
    }
    for (name, stats) in &other.latents {
        match into.latents.get_mut(name) {
            Some(existing) => existing.merge(stats)?,
            None => _ = into.latents.insert(name.clone(), stats.clone()),
        }
    }
    for (name, stats) in &other.outputs {
        match into.outputs.get_mut(name) {
            Some(existing) => existing.merge(stats)?,
            None => _ = into.outputs.insert(name.clone(), stats.clone()),
        }
    }
    Ok(())
}

/// Converts running statistics into the file form.
pub fn to_file(stats: &RunStats, through_shard: Option<u64>) -> StatsFile {
    StatsFile {
        through_shard,
        hooks: stats.hooks.iter().map(|(k, v)| (k.clone(), v.into())).collect(),
        latents: stats.latents.clone(),
        outputs: stats.outputs.clone(),
    }
}

/// Converts the file form back into running statistics, checking that every hook's arrays have
/// one entry per element of its shape and every latents column's one per latent (what merging
/// them with more statistics indexes by).
pub fn from_file(file: &StatsFile) -> std::result::Result<RunStats, String> {
    for (hook, s) in &file.hooks {
        let width = s.mean.len();
        if !s.shape.is_empty() && s.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) != Some(width) {
            return Err(format!("hook {hook}: {width} means for per-token shape {:?}", s.shape));
        }
        let lengths = [
            ("variance", Some(s.variance.len())),
            ("m2", s.m2.as_ref().map(Vec::len)),
            ("min", s.min.as_ref().map(Vec::len)),
            ("max", s.max.as_ref().map(Vec::len)),
        ];
        for (name, len) in lengths {
            if let Some(len) = len.filter(|&len| len != width) {
                return Err(format!("hook {hook}: {len} entries in {name}, {width} means"));
            }
        }
        if s.min.is_some() != s.max.is_some() {
            return Err(format!("hook {hook}: min and max must be both present or both absent"));
        }
    }
    for (name, s) in &file.latents {
        s.check_lengths().map_err(|e| format!("latents {name}: {e}"))?;
    }
    for (name, s) in &file.outputs {
        s.check_lengths(s.sum.len()).map_err(|e| format!("output {name}: {e}"))?;
    }
    Ok(RunStats {
        hooks: file.hooks.iter().map(|(k, v)| (k.clone(), v.into())).collect(),
        latents: file.latents.clone(),
        outputs: file.outputs.clone(),
    })
}

impl StatsFile {
    /// The running statistics the file holds; `Err` says which hook or latents column has
    /// arrays of the wrong lengths.
    pub fn to_run_stats(&self) -> std::result::Result<RunStats, String> {
        from_file(self)
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
            min: vec![-1.0, -3.0],
            max: vec![1.5, 0.1],
            non_finite: 0,
        };
        let mut latents = LatentStats::new(3);
        latents.add_token([(0, 0.1), (2, 7.887_233_5)]);
        latents.add_token([(2, 1e-7)]);
        let stats = RunStats {
            hooks: [("h".to_string(), first.clone())].into(),
            latents: [("l".into(), latents)].into(),
            ..RunStats::new()
        };
        let text = serde_json::to_vec(&to_file(&stats, Some(0))).unwrap();
        let back = from_file(&serde_json::from_slice(&text).unwrap()).unwrap();
        assert_eq!(back, stats, "bit-identical after a JSON round trip");
        let back = back.hooks;
        let more = HookStats::from_rows(DType::F32, &[2], &f32_bytes(&[0.3, 1.7, -2.2, 0.9]), None);
        let (mut straight, mut resumed) = (first, back["h"].clone());
        straight.merge(&more).unwrap();
        resumed.merge(&more).unwrap();
        assert_eq!(resumed, straight);
    }

    /// A run that allows values that are not finite: they are counted, their statistics are
    /// `null` in the file, and a resumed run (the file read back, merged with more) writes the
    /// file the uninterrupted run writes, though `null` reads back as NaN where it was ±Inf.
    #[test]
    fn statistics_of_values_that_are_not_finite_are_null_and_resume_to_the_same_file() {
        let rows = |v: &[f32]| HookStats::from_rows(DType::F32, &[3], &f32_bytes(v), None);
        let first = rows(&[1.0, f32::INFINITY, 2.0, 3.0, f32::NEG_INFINITY, f32::NAN]);
        assert_eq!(first.non_finite, 3);
        let (max, min) = (first.max[1], first.min[1]);
        assert!(max == f64::INFINITY && min == f64::NEG_INFINITY && first.mean[0] == 2.0, "{first:?}");
        assert!(first.mean[1].is_nan() && first.m2[1].is_nan() && first.m2[2].is_nan(), "{first:?}");
        let file = |s: &HookStats| {
            let stats = RunStats { hooks: [("h".to_string(), s.clone())].into(), ..RunStats::new() };
            serde_json::to_string(&to_file(&stats, None)).unwrap()
        };
        let text = file(&first);
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let hook = &json["hooks"]["h"];
        assert!(hook["max"][1].is_null() && hook["mean"][1].is_null() && hook["variance"][2].is_null(), "{text}");
        assert!(hook["mean_norm"].is_null() && hook["norm_sum"].is_null() && hook["non_finite"] == 3, "{text}");
        assert_eq!(hook["mean"][0], 2.0, "{text}");
        let back = from_file(&serde_json::from_str(&text).unwrap()).unwrap().hooks["h"].clone();
        let more = rows(&[5.0, 6.0, 7.0]);
        let (mut straight, mut resumed) = (first, back);
        straight.merge(&more).unwrap();
        resumed.merge(&more).unwrap();
        assert_eq!(straight.non_finite, 3);
        assert_eq!(file(&resumed), file(&straight));
    }

    /// A latent's smallest value above 0 over any split of its tokens, 0 where it never fired
    /// above 0; a file without minima merges into none known.
    #[test]
    fn latent_minima_are_the_smallest_above_zero_and_merge() {
        let mut a = LatentStats::new(3);
        a.add_token([(0, 0.5), (1, 0.0)]);
        a.add_token([(0, 0.25)]);
        let mut b = LatentStats::new(3);
        b.add_token([(0, 0.75), (2, 2.0)]);
        assert_eq!((a.min.clone(), b.min.clone()), (vec![0.25, 0.0, 0.0], vec![0.75, 0.0, 2.0]));
        let mut both = a.clone();
        both.merge(&b).unwrap();
        assert_eq!(both.min, vec![0.25, 0.0, 2.0]);
        let old = LatentStats { min: Vec::new(), ..b };
        a.merge(&old).unwrap();
        assert!(a.min.is_empty());
    }

    /// A stats.json whose latents column lacks an entry of one of its per-latent arrays is
    /// refused naming the column and the lengths; one written before the minima were kept reads.
    #[test]
    fn a_latents_columns_arrays_hold_one_entry_per_latent() {
        let mut s = LatentStats::new(3);
        s.add_token([(1, 0.5)]);
        let file = |s: &LatentStats| {
            to_file(&RunStats { latents: [("l".to_string(), s.clone())].into(), ..RunStats::new() }, None)
        };
        assert_eq!(from_file(&file(&s)).unwrap().latents["l"], s);
        assert!(from_file(&file(&LatentStats { min: Vec::new(), ..s.clone() })).is_ok());
        let short = LatentStats { sums: vec![0.5, 0.0], ..s.clone() };
        assert_eq!(
            from_file(&file(&short)).unwrap_err(),
            "latents l: 3 firings, 2 sums, 3 maxima and 3 minima (one each per latent)"
        );
        assert!(from_file(&file(&LatentStats { min: vec![0.0], ..s })).is_err());
    }

    /// Rows like a residual stream's: per element a mean far from zero (up to ±300) next to a
    /// small spread, some huge outliers, bf16 and f32; against sums in f64 of the same stored
    /// values. Mean, variance, min and max within 1e-5 relative (of the spread for the mean),
    /// and the same bits however the rows are sliced.
    #[test]
    fn statistics_match_an_f64_reference_in_any_slicing() {
        let (rows, width) = (1000, 200); // a width that is not a multiple of the tile
        let mut rng = fastrand::Rng::with_seed(7);
        let offsets: Vec<f32> = (0..width).map(|_| (rng.f32() - 0.5) * 600.0).collect();
        let values: Vec<f32> = (0..rows * width)
            .map(|i| {
                let spike = if rng.u32(0..500) == 0 { 1e4 } else { 0.0 };
                offsets[i % width] + (rng.f32() - 0.5) * 2.0 + spike
            })
            .collect();
        let mask: Vec<bool> = (0..rows).map(|r| r % 7 != 3).collect();
        for dtype in [DType::F32, DType::Bf16] {
            let data: Vec<u8> = match dtype {
                DType::F32 => f32_bytes(&values),
                _ => values.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
            };
            let stored: Vec<f64> = match dtype {
                DType::F32 => values.iter().map(|&v| f64::from(v)).collect(),
                _ => values.iter().map(|&v| f64::from(half::bf16::from_f32(v).to_f32())).collect(),
            };
            let s = HookStats::from_rows(dtype, &[width], &data, Some(&mask));
            let kept: Vec<usize> = (0..rows).filter(|&r| mask[r]).collect();
            let n = kept.len() as f64;
            assert_eq!(s.count, kept.len() as u64);
            for d in 0..width {
                let column: Vec<f64> = kept.iter().map(|&r| stored[r * width + d]).collect();
                let mean = column.iter().sum::<f64>() / n;
                let var = column.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
                let close = |a: f64, b: f64, scale: f64| (a - b).abs() <= 1e-5 * scale;
                assert!(
                    close(s.mean[d], mean, var.sqrt().max(mean.abs())),
                    "{dtype} mean {d}: {} vs {mean}",
                    s.mean[d]
                );
                assert!(close(s.variance()[d], var, var), "{dtype} variance {d}: {} vs {var}", s.variance()[d]);
                assert_eq!(s.min[d], column.iter().copied().fold(f64::INFINITY, f64::min));
                assert_eq!(s.max[d], column.iter().copied().fold(f64::NEG_INFINITY, f64::max));
            }
            let norm: f64 = kept
                .iter()
                .map(|&r| stored[r * width..(r + 1) * width].iter().map(|v| v * v).sum::<f64>().sqrt())
                .sum();
            assert!((s.norm_sum - norm).abs() <= 1e-5 * norm, "{dtype} norms {} vs {norm}", s.norm_sum);

            // Any slicing, the same bits: cut at 1, 63, 64, 65 rows and at random points.
            let row_bytes = dtype.row_bytes(width);
            for cuts in [vec![1, 64, 65, 129, 700], vec![63], (1..rows).step_by(37).collect::<Vec<_>>()] {
                let mut acc = StatsAccumulator::new(dtype, &[width]);
                let mut start = 0;
                for end in cuts.into_iter().chain([rows]) {
                    acc.add_rows(&data[start * row_bytes..end * row_bytes], Some(&mask[start..end]));
                    start = end;
                }
                assert_eq!(acc.finish(), s, "{dtype}: sliced differently, other bits");
            }
        }
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
