//! A run's stored columns: a hook's dense rows ([`crate::dense`]), a dictionary's sparse
//! latents ([`crate::sparse`]) and the model's outputs ([`crate::output`]) are each a [`Column`] — described by run.json, built from the
//! batches ([`Building`]), written as tensors in the file's order ([`crate::tensor`]) and
//! summarised back from a file ([`Column::summarize`]). The shard's builder, its file, its
//! reader and the run's checks each loop over a run's columns once; what differs between the
//! kinds is here and in their own files.

use std::collections::BTreeMap;

use crate::batch::{BatchActivations, DType};
use crate::dense::{ColumnPool, HookColumn};
use crate::error::{Result, StoreError};
use crate::output::{OutputColumn, OutputRows, OutputStats};
use crate::sparse::{LatentStats, LatentsColumn, SparseColumn};
use crate::stats::{HookStats, RunStats, StatsFile};
use crate::tensor::Tensor;

/// One stored column as run.json describes it.
pub(crate) enum Column<'a> {
    /// A hook: its tensor, `[tokens, *shape]`, with the per-token shape run.json records (if it
    /// records shapes).
    Hook { name: &'a str, shape: Option<&'a [usize]> },
    /// A dictionary's latents: a CSR matrix over the shard's rows.
    Latents(&'a LatentsColumn),
    /// One of the model's outputs: a dense tensor of its own element type.
    Output(&'a OutputColumn),
}

/// A run's columns, hooks first: `hooks` with their recorded `shapes` (empty when not
/// recorded), then `latents`, then `outputs`.
pub(crate) fn columns<'a>(
    hooks: &'a [String],
    shapes: &'a [Vec<usize>],
    latents: &'a [LatentsColumn],
    outputs: &'a [OutputColumn],
) -> Vec<Column<'a>> {
    let hooks =
        hooks.iter().enumerate().map(|(i, name)| Column::Hook { name, shape: shapes.get(i).map(Vec::as_slice) });
    hooks.chain(latents.iter().map(Column::Latents)).chain(outputs.iter().map(Column::Output)).collect()
}

/// A column's statistics, recomputed from a file or counted as it was built.
pub(crate) enum ColumnStats {
    Hook(HookStats),
    Latents(LatentStats),
    Output(OutputStats),
}

impl ColumnStats {
    /// Files the statistics under `name` (a hook's with its per-token shape).
    pub fn insert(self, name: &str, stats: &mut RunStats, hook_shapes: &mut BTreeMap<String, Vec<usize>>) {
        match self {
            ColumnStats::Hook(s) => {
                hook_shapes.insert(name.to_string(), s.shape.clone());
                stats.hooks.insert(name.to_string(), s);
            }
            ColumnStats::Latents(s) => _ = stats.latents.insert(name.to_string(), s),
            ColumnStats::Output(s) => _ = stats.outputs.insert(name.to_string(), s),
        }
    }
}

impl Column<'_> {
    /// Its name: the hook's, or the latents column's.
    pub fn name(&self) -> &str {
        match self {
            Column::Hook { name, .. } => name,
            Column::Latents(c) => &c.name,
            Column::Output(c) => &c.name,
        }
    }

    /// What is wrong with `file`'s statistics of this column, which must count the `included`
    /// tokens (a file of no included token may lack them); `None` when nothing is.
    pub fn check_stats(&self, file: &StatsFile, included: u64) -> Option<String> {
        match self {
            Column::Hook { name, shape } => match file.hooks.get(*name) {
                None if included == 0 => None,
                None => Some(format!("no statistics for hook {name}")),
                Some(s) => crate::dense::check_stats(name, *shape, s, included),
            },
            Column::Latents(c) => match file.latents.get(&c.name) {
                None if included == 0 => None,
                None => Some(format!("no statistics for latents {}", c.name)),
                Some(s) => c.check_stats(s, included),
            },
            Column::Output(c) => match file.outputs.get(&c.name) {
                None if included == 0 => None,
                None => Some(format!("no statistics for output {}", c.name)),
                Some(s) => c.check_stats(s, included),
            },
        }
    }

    /// Its tensors in a shard file of `tokens` rows, checked, and the statistics of the rows
    /// `mask` includes (all without a mask); `Err` says what is wrong, naming the column.
    pub fn summarize(
        &self,
        st: &safetensors::SafeTensors<'_>,
        tokens: usize,
        mask: Option<&[bool]>,
    ) -> std::result::Result<ColumnStats, String> {
        match self {
            Column::Hook { name, shape } => {
                crate::dense::summarize(st, name, *shape, tokens, mask).map(ColumnStats::Hook)
            }
            Column::Latents(c) => crate::sparse::summarize(st, c, tokens, mask)
                .map(ColumnStats::Latents)
                .map_err(|e| format!("latents {}: {e}", c.name)),
            Column::Output(c) => crate::output::summarize(st, c, tokens, mask).map(ColumnStats::Output),
        }
    }
}

/// One column of a shard being built: the `at`th hook, latents or output column of every batch.
pub(crate) enum Building {
    Hook { name: String, at: usize, rows: HookColumn },
    Latents { name: String, at: usize, rows: SparseColumn },
    Output { name: String, at: usize, rows: OutputRows },
}

impl Building {
    /// The columns of a shard whose first batch is `first`: its hooks (their shapes), then
    /// `latents`, then `outputs`.
    pub fn all(
        hooks: &[String],
        latents: &[LatentsColumn],
        outputs: &[OutputColumn],
        first: &BatchActivations,
        dtype: DType,
    ) -> Vec<Building> {
        let hooks = hooks.iter().zip(&first.hooks).enumerate().map(|(at, (name, h))| Building::Hook {
            name: name.clone(),
            at,
            rows: HookColumn::new(h.shape.clone(), dtype),
        });
        let latents = latents.iter().enumerate().map(|(at, c)| Building::Latents {
            name: c.name.clone(),
            at,
            rows: SparseColumn::new(c.width),
        });
        let outputs = outputs.iter().enumerate().map(|(at, c)| Building::Output {
            name: c.name.clone(),
            at,
            rows: OutputRows::new(c),
        });
        hooks.chain(latents).chain(outputs).collect()
    }

    /// Bytes of its tensors so far.
    pub fn bytes(&self) -> usize {
        match self {
            Building::Hook { rows, .. } => rows.len(),
            Building::Latents { rows, .. } => rows.bytes(),
            Building::Output { rows, .. } => rows.bytes(),
        }
    }

    /// Whether `batch` holds this column's rows as the shard stores them (`Err` says why not):
    /// a hook's of the shard's per-token shape, and fp8 rows only in an fp8 run (they are
    /// quantized on the device, never converted by the writer).
    pub fn check(&self, batch: &BatchActivations, dtype: DType) -> std::result::Result<(), String> {
        match self {
            Building::Hook { at, rows, .. } => rows.check(&batch.hooks[*at], dtype),
            Building::Latents { .. } | Building::Output { .. } => Ok(()),
        }
    }

    /// Appends the rows of `unit` in `order` ((batch, token) pairs), in the stored `dtype`.
    pub fn take(
        &mut self,
        unit: &[BatchActivations],
        order: &[(u32, u32)],
        dtype: DType,
        pool: &ColumnPool,
    ) -> Result<()> {
        match self {
            Building::Hook { at, rows, .. } => rows.take(unit, order, *at, dtype, pool),
            Building::Latents { name, at, rows } => {
                for &(b, t) in order {
                    let batch = &unit[b as usize];
                    let t = t as usize;
                    rows.push(&batch.latents[*at], t, batch.keep[t], dtype).map_err(|e| StoreError::InvalidBatch {
                        first_sample: batch.first_sample,
                        reason: format!(
                            "latents {name}: the token at sequence {} position {} {e}",
                            t / batch.seq,
                            t % batch.seq
                        ),
                    })?;
                }
            }
            Building::Output { at, rows, .. } => {
                for &(b, t) in order {
                    let batch = &unit[b as usize];
                    rows.push(&batch.outputs[*at], t as usize, batch.keep[t as usize]);
                }
            }
        }
        Ok(())
    }

    /// Its statistics (over the rows `mask` includes) into `stats`; for a column stored as it
    /// is held, its tensor's CRC32C (computed in the same pass over a hook's rows); and the
    /// first included row of a hook holding a value that is not finite.
    pub fn seal(
        &mut self,
        dtype: DType,
        mask: Option<&[bool]>,
        pool: &ColumnPool,
        stats: &mut RunStats,
    ) -> (Option<u32>, Option<usize>) {
        match self {
            Building::Hook { name, rows, .. } => {
                let (column_stats, crc, first_non_finite) = rows.stats_and_crc(dtype, mask, pool);
                stats.hooks.insert(name.clone(), column_stats);
                (crc, first_non_finite)
            }
            Building::Latents { name, rows, .. } => {
                stats.latents.insert(name.clone(), rows.stats().clone());
                (None, None)
            }
            Building::Output { name, rows, .. } => {
                stats.outputs.insert(name.clone(), rows.stats().clone());
                (None, None)
            }
        }
    }

    /// For a hook, the first included row holding a value that is NaN or ±Inf and how many
    /// the included rows hold ([`HookColumn::non_finite`]); a dictionary's latents hold none to
    /// look for, and an output's are what the model gives (`output.nll` is NaN where a token has
    /// no next token; the job checks the others before they reach the store).
    pub fn non_finite(&self, dtype: DType, mask: Option<&[bool]>) -> Option<(usize, u64)> {
        match self {
            Building::Hook { rows, .. } => rows.non_finite(dtype, mask),
            Building::Latents { .. } | Building::Output { .. } => None,
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        match self {
            Building::Hook { name, .. } | Building::Latents { name, .. } | Building::Output { name, .. } => name,
        }
    }

    /// Its tensors over the shard's `tokens` rows.
    pub fn into_tensors(self, tokens: usize, dtype: DType, pool: &ColumnPool) -> Vec<Tensor> {
        match self {
            Building::Hook { name, rows, .. } => rows.into_tensors(&name, tokens, dtype, pool),
            Building::Latents { name, rows, .. } => rows.into_tensors(&name, tokens, dtype),
            Building::Output { rows, .. } => rows.into_tensors(tokens),
        }
    }
}
