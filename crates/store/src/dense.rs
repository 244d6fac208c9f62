//! One hook's rows in a shard being built: slices of the batches' own memory where the kept rows
//! lie contiguous in the stored dtype (no copy), else fixed-size pooled chunks the rows are copied
//! (converted, shuffled) into. Sealing reads every row once, a block at a time, for the CRC32C and
//! the statistics together.

use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::batch::{BatchActivations, DType, HookActivations, fp8_scale_name};
use crate::moments::BLOCK;
use crate::stats::{HookStats, HookStatsJson, StatsAccumulator};
use crate::tensor::{Rank, Tensor, count_not_finite, decode_row, stored_dtype};

/// Rows copied into pooled chunks of about this size (whole rows; one row at least).
const CHUNK_BYTES: usize = 4 << 20;
/// Contiguous runs of kept rows at least this long are kept as slices of the batch's memory;
/// shorter ones are copied.
pub(crate) const MIN_LENT_BYTES: usize = 64 << 10;

/// Chunks handed back once a shard's upload is done, so that the next shards' copied rows land
/// in memory that is already mapped: a fresh buffer faults its pages in on first touch, which
/// made taking rows in ~8× slower than the copy itself.
#[derive(Clone, Default)]
pub(crate) struct ColumnPool(Arc<Mutex<Vec<Vec<u8>>>>);

impl ColumnPool {
    /// An empty buffer of at least `capacity` bytes: the smallest pooled one that fits, else a
    /// new one.
    pub fn take(&self, capacity: usize) -> Vec<u8> {
        let mut pool = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let fits = pool.iter().enumerate().filter(|(_, b)| b.capacity() >= capacity).min_by_key(|(_, b)| b.capacity());
        match fits.map(|(i, _)| i) {
            Some(i) => pool.swap_remove(i),
            None => Vec::with_capacity(capacity),
        }
    }

    fn give_back(&self, mut data: Vec<u8>) {
        data.clear();
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(data);
    }

    /// `data` as bytes that go back to the pool when the last reference is dropped.
    pub fn bytes(&self, data: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled { data, pool: self.clone() })
    }
}

struct Pooled {
    data: Vec<u8>,
    pool: ColumnPool,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.data));
    }
}

/// One hook's rows in shard order, in the stored dtype.
pub(crate) struct HookColumn {
    /// Per-token shape.
    pub shape: Vec<usize>,
    /// Elements per row: the product of `shape`.
    pub width: usize,
    /// Bytes of one stored row.
    row_bytes: usize,
    /// The rows, in order, each segment whole rows.
    segments: Vec<Bytes>,
    /// The chunk rows are being copied into.
    chunk: Vec<u8>,
    bytes: usize,
}

impl HookColumn {
    pub fn new(shape: Vec<usize>, dtype: DType) -> Self {
        let width = shape.iter().product();
        HookColumn {
            shape,
            width,
            row_bytes: dtype.row_bytes(width),
            segments: Vec::new(),
            chunk: Vec::new(),
            bytes: 0,
        }
    }

    /// Bytes of rows so far.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Appends `rows` (whole stored rows) without copying them.
    pub fn lend(&mut self, rows: Bytes, pool: &ColumnPool) {
        self.close_chunk(pool);
        self.bytes += rows.len();
        self.segments.push(rows);
    }

    /// Appends rows by writing them into pooled chunks: `write(chunk, n)` appends the next `n`
    /// rows (converted) to `chunk`; `rows` rows in all.
    pub fn copy(&mut self, rows: usize, pool: &ColumnPool, mut write: impl FnMut(&mut Vec<u8>, usize)) {
        let per_chunk = (CHUNK_BYTES / self.row_bytes).max(1);
        let mut done = 0;
        while done < rows {
            if self.chunk.capacity() == 0 {
                self.chunk = pool.take(per_chunk * self.row_bytes);
            }
            let room = per_chunk - self.chunk.len() / self.row_bytes;
            let n = room.min(rows - done);
            write(&mut self.chunk, n);
            done += n;
            self.bytes += n * self.row_bytes;
            if self.chunk.len() / self.row_bytes == per_chunk {
                self.close_chunk(pool);
            }
        }
    }

    fn close_chunk(&mut self, pool: &ColumnPool) {
        if !self.chunk.is_empty() {
            self.segments.push(pool.bytes(std::mem::take(&mut self.chunk)));
        } else if self.chunk.capacity() > 0 {
            pool.give_back(std::mem::take(&mut self.chunk));
        }
    }

    /// Whether `h` holds this column's rows: of its per-token shape, fp8 only into fp8 (`Err`
    /// says why not).
    pub fn check(&self, h: &HookActivations, dtype: DType) -> Result<(), String> {
        if [h.dtype, dtype].contains(&DType::Fp8) && h.dtype != dtype {
            return Err(format!(
                "hook {} is {}, the run stores {}: fp8 rows are quantized on the device, never converted by the \
                 writer",
                h.hook,
                h.dtype.name(),
                dtype.name()
            ));
        }
        if h.shape != self.shape {
            return Err(format!("hook {} changed its per-token shape from {:?} to {:?}", h.hook, self.shape, h.shape));
        }
        Ok(())
    }

    /// Appends hook `hook`'s rows of `unit` in `order` ((batch, token) pairs), in the stored
    /// `dtype`: runs of consecutive rows of one batch are taken together, kept as they lie when
    /// they are long and already in the stored dtype, else copied (and converted).
    pub fn take(
        &mut self,
        unit: &[BatchActivations],
        order: &[(u32, u32)],
        hook: usize,
        dtype: DType,
        pool: &ColumnPool,
    ) {
        let mut i = 0;
        while i < order.len() {
            let (b, t) = order[i];
            let mut end = i + 1;
            while end < order.len() && order[end] == (b, t + (end - i) as u32) {
                end += 1;
            }
            let rows = &unit[b as usize].hooks[hook];
            let row_bytes = rows.dtype.row_bytes(self.width);
            let run = t as usize * row_bytes..(t as usize + end - i) * row_bytes;
            if rows.dtype == dtype && run.len() >= MIN_LENT_BYTES {
                self.lend(rows.data.slice(run), pool);
            } else {
                let mut at = run.start;
                self.copy(end - i, pool, |chunk, n| {
                    convert_rows(rows.dtype, &rows.data[at..at + n * row_bytes], dtype, chunk);
                    at += n * row_bytes;
                });
            }
            i = end;
        }
    }

    /// The first row `mask` includes that holds a value that is NaN or ±Inf, and how many the
    /// included rows hold: a scan of its own, for a batch that is sent rather than sealed (a
    /// shard's seal finds them in its statistics' pass).
    pub fn non_finite(&self, dtype: DType, mask: Option<&[bool]>) -> Option<(usize, u64)> {
        let pieces = self.segments.iter().map(|s| &s[..]).chain([&self.chunk[..]]);
        let rows = pieces.flat_map(|piece| piece.chunks_exact(self.row_bytes));
        let mut found: Option<(usize, u64)> = None;
        for (r, row) in rows.enumerate().filter(|(r, _)| mask.is_none_or(|m| m[*r])) {
            let count = count_not_finite(dtype, row);
            if count > 0 {
                found = Some(found.map_or((r, count), |(first, total)| (first, total + count)));
            }
        }
        found
    }

    /// The column's tensors over `tokens` rows: the hook `name`'s values `[tokens, *shape]`
    /// and, for fp8 rows (`(scale, values)` each), its scales beside them.
    pub fn into_tensors(mut self, name: &str, tokens: usize, dtype: DType, pool: &ColumnPool) -> Vec<Tensor> {
        self.close_chunk(pool);
        let shape: Vec<usize> = std::iter::once(tokens).chain(self.shape.iter().copied()).collect();
        let values =
            |data| Tensor { name: name.to_string(), dtype: dtype.safetensors_name(), shape, data, rank: Rank::Hooks };
        match dtype {
            DType::Fp8 => {
                let (scales, rows) = split_fp8_rows(&self.segments, self.width, pool);
                let scales = vec![pool.bytes(scales)];
                let scales = Tensor {
                    name: fp8_scale_name(name),
                    dtype: "F32",
                    shape: vec![tokens],
                    data: scales,
                    rank: Rank::Scales,
                };
                vec![values(vec![pool.bytes(rows)]), scales]
            }
            _ => vec![values(self.segments)],
        }
    }

    /// The column's statistics (rows selected by `mask`) and the CRC32C of its bytes, in one
    /// pass: each block of rows is checksummed, then reduced while it is in cache. An fp8
    /// column is not stored as it is held (its rows are split into scales and values), so it
    /// has no CRC here: `None`. Last, the first included row holding a value that is not
    /// finite, if any.
    pub fn stats_and_crc(
        &mut self,
        dtype: DType,
        mask: Option<&[bool]>,
        pool: &ColumnPool,
    ) -> (HookStats, Option<u32>, Option<usize>) {
        self.close_chunk(pool);
        let mut acc = StatsAccumulator::new(dtype, &self.shape);
        let mut crc = 0;
        let mut block: Vec<&[u8]> = Vec::with_capacity(BLOCK);
        let mut first_row = 0;
        let mut row = 0;
        for segment in &self.segments {
            for piece in segment.chunks(BLOCK * self.row_bytes) {
                if dtype != DType::Fp8 {
                    crc = crc32c::crc32c_append(crc, piece);
                }
                for r in piece.chunks_exact(self.row_bytes) {
                    block.push(r);
                    row += 1;
                    if block.len() == BLOCK {
                        acc.reduce(&block, mask.map(|m| &m[first_row..row]));
                        block.clear();
                        first_row = row;
                    }
                }
            }
        }
        acc.reduce(&block, mask.map(|m| &m[first_row..row]));
        let first_non_finite = acc.first_non_finite();
        (acc.finish(), (dtype != DType::Fp8).then_some(crc), first_non_finite)
    }
}

/// Hook `hook`'s tensor in a shard file of `tokens` rows, checked (`[tokens, *shape]`, a stored
/// dtype, the per-token shape run.json records where it is `expected`, an fp8 tensor's scales
/// beside it): the statistics of the rows `mask` includes (all without a mask), the writer's
/// numbers. `Err` says what is wrong, naming the hook.
pub(crate) fn summarize(
    st: &safetensors::SafeTensors<'_>,
    hook: &str,
    expected: Option<&[usize]>,
    tokens: usize,
    mask: Option<&[bool]>,
) -> Result<HookStats, String> {
    let t = st.tensor(hook).map_err(|e| format!("hook {hook}: {e}"))?;
    let Some(dtype) = stored_dtype(t.dtype()) else {
        return Err(format!("hook {hook} has dtype {:?}", t.dtype()));
    };
    let Some((&rows, token_shape)) = t.shape().split_first() else {
        return Err(format!("hook {hook} is a scalar, expected [{tokens}, *per-token shape]"));
    };
    if let Err(e) = crate::batch::check_token_shape(token_shape) {
        return Err(format!("hook {hook} (tensor {:?}) {e}", t.shape()));
    }
    if rows != tokens || token_shape.is_empty() || token_shape.contains(&0) {
        return Err(format!(
            "hook {hook} has shape {:?}, expected [{tokens}, *per-token shape] with no zero dimension",
            t.shape()
        ));
    }
    if let Some(expected) = expected
        && expected != token_shape
    {
        return Err(format!(
            "hook {hook} has per-token shape {token_shape:?} (tensor {:?}), run.json records {expected:?}",
            t.shape()
        ));
    }
    let rows = match dtype {
        DType::Fp8 => {
            let name = fp8_scale_name(hook);
            let scales = st.tensor(&name).map_err(|e| format!("{name}: {e}"))?;
            if scales.dtype() != safetensors::Dtype::F32 || scales.shape() != [tokens] {
                return Err(format!("{name} is {:?}{:?}, expected F32[{tokens}]", scales.dtype(), scales.shape()));
            }
            std::borrow::Cow::Owned(join_fp8_rows(scales.data(), t.data(), token_shape.iter().product()))
        }
        _ => std::borrow::Cow::Borrowed(t.data()),
    };
    Ok(HookStats::from_rows(dtype, token_shape, &rows, mask))
}

/// fp8 rows (`[4-byte scale][width values]` each, in segments of whole rows) as the scales and
/// the values, each in row order.
fn split_fp8_rows(segments: &[Bytes], width: usize, pool: &ColumnPool) -> (Vec<u8>, Vec<u8>) {
    let n = segments.iter().map(Bytes::len).sum::<usize>() / (4 + width);
    let (mut scales, mut values) = (pool.take(4 * n), pool.take(width * n));
    for row in segments.iter().flat_map(|s| s.chunks_exact(4 + width)) {
        scales.extend_from_slice(&row[..4]);
        values.extend_from_slice(&row[4..]);
    }
    (scales, values)
}

/// [`split_fp8_rows`] undone.
fn join_fp8_rows(scales: &[u8], values: &[u8], width: usize) -> Vec<u8> {
    let mut rows = Vec::with_capacity(scales.len() + values.len());
    for (scale, row) in scales.chunks_exact(4).zip(values.chunks_exact(width.max(1))) {
        rows.extend_from_slice(scale);
        rows.extend_from_slice(row);
    }
    rows
}

/// Appends rows converted from `src_dtype` to `dst_dtype` (little-endian both sides; fp8 is
/// never converted, `ShardBuilder::add_unit` refuses it).
fn convert_rows(src_dtype: DType, src: &[u8], dst_dtype: DType, dst: &mut Vec<u8>) {
    if src_dtype == dst_dtype {
        dst.extend_from_slice(src);
        return;
    }
    let mut values = vec![0f32; src.len() / src_dtype.size()];
    decode_row(src_dtype, src, &mut values);
    match dst_dtype {
        DType::F32 => values.iter().for_each(|v| dst.extend_from_slice(&v.to_le_bytes())),
        DType::Bf16 => values.iter().for_each(|v| dst.extend_from_slice(&half::bf16::from_f32(*v).to_le_bytes())),
        DType::F16 => values.iter().for_each(|v| dst.extend_from_slice(&half::f16::from_f32(*v).to_le_bytes())),
        DType::Fp8 => unreachable!("fp8 rows are never converted (refused in add_unit)"),
        DType::U8 => unreachable!("u8 holds no activations (refused by BatchActivations::validate)"),
    }
}

/// What is wrong with `hook`'s statistics `s` in stats.json: a count other than the `included`
/// tokens, or another per-token shape than `shape` (where known).
pub(crate) fn check_stats(hook: &str, shape: Option<&[usize]>, s: &HookStatsJson, included: u64) -> Option<String> {
    if s.count != included {
        return Some(format!("hook {hook} counts {} tokens, manifests include {included}", s.count));
    }
    let shape = shape?;
    let width = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let same =
        width == Some(s.mean.len()) && width == Some(s.variance.len()) && (s.shape.is_empty() || s.shape == shape);
    (!same).then(|| {
        format!(
            "hook {hook} has statistics of per-token shape {:?} ({} means), the shards {shape:?}",
            s.shape,
            s.mean.len()
        )
    })
}
