//! One hook's rows in a shard being built: slices of the batches' own memory where the kept rows
//! lie contiguous in the stored dtype (no copy), else fixed-size pooled chunks the rows are copied
//! (converted, shuffled) into. Sealing reads every row once, a block at a time, for the CRC32C and
//! the statistics together.

use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::batch::DType;
use crate::moments::BLOCK;
use crate::stats::{HookStats, StatsAccumulator};

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

    /// The rows as segments, in order.
    pub fn into_segments(mut self, pool: &ColumnPool) -> Vec<Bytes> {
        self.close_chunk(pool);
        self.segments
    }

    /// The column's statistics (rows selected by `mask`) and the CRC32C of its bytes, in one
    /// pass: each block of rows is checksummed, then reduced while it is in cache. An fp8
    /// column is not stored as it is held (its rows are split into scales and values), so it
    /// has no CRC here: `None`.
    pub fn stats_and_crc(
        &mut self,
        dtype: DType,
        mask: Option<&[bool]>,
        pool: &ColumnPool,
    ) -> (HookStats, Option<u32>) {
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
        (acc.finish(), (dtype != DType::Fp8).then_some(crc))
    }
}
