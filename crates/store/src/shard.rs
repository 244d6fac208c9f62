//! Shard assembly (token selection, shuffle, dtype conversion) and the safetensors encoding.
//!
//! A shard is built column-wise ([`crate::column`]: each hook and each dictionary's latents a
//! column): each hook's kept rows, in shard order and the stored dtype, as a list of segments
//! ([`crate::dense`]): runs of rows that lie contiguous in the stored
//! dtype stay where the batch has them (a slice of its `Bytes`, held until the shard is
//! uploaded), other rows are copied (converted, shuffled) into pooled chunks. Sealing writes
//! the safetensors header and hands out the header plus each tensor's segments as separate
//! chunks, so the shard's bytes are never assembled into one file image before upload.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use rand::SeedableRng;
use rand::seq::SliceRandom;

use crate::batch::BatchActivations;
use crate::column::{Building, columns};
use crate::config::{HostId, ShardFormat};
use crate::dense::ColumnPool;
use crate::error::{Result, StoreError};
use crate::format::{FORMAT_TAG, format_version};
use crate::output::OutputColumn;
use crate::sparse::LatentsColumn;
use crate::stats::RunStats;
use crate::tensor::{Rank, Tensor, file_order, le_bytes};

/// [`format_version`], or [`StoreError::UnsupportedFormat`] naming `path` and the tag.
pub fn check_format(path: &str, tag: &str) -> Result<u32> {
    format_version(tag).ok_or_else(|| StoreError::UnsupportedFormat { path: path.to_string(), found: tag.to_string() })
}

/// Identity written into each shard's metadata.
#[derive(Debug, Clone)]
pub(crate) struct ShardIdentity {
    pub run: String,
    pub model: String,
    pub host: HostId,
    pub hooks: Vec<String>,
    pub latents: Vec<LatentsColumn>,
    pub outputs: Vec<OutputColumn>,
}

/// A shard ready to upload: its bytes in chunks, with everything the manifest needs.
#[derive(Debug, Clone)]
pub struct SealedShard {
    /// Shard index within the host.
    pub index: u64,
    /// The file's bytes, in order (header first).
    pub chunks: Vec<Bytes>,
    /// Total size.
    pub bytes: u64,
    /// CRC32C (Castagnoli) of the whole file: the checksum GCS and S3 verify, computed at
    /// memory speed.
    pub crc32c: u32,
    /// Token rows stored.
    pub tokens: u64,
    /// Rows whose mask is true (equals `tokens` unless excluded tokens are kept).
    pub included_tokens: u64,
    /// Host-local samples `[start, end)` the shard covers.
    pub samples: (u64, u64),
    /// Data position after the shard's last batch.
    pub data_position_after: serde_json::Value,
    /// Statistics of the shard's stored values.
    pub stats: RunStats,
}

/// Accumulates whole batches (or shuffle windows) into one shard.
pub(crate) struct ShardBuilder {
    identity: ShardIdentity,
    format: ShardFormat,
    pool: ColumnPool,
    index: u64,
    /// The hooks', then the latents columns'.
    columns: Vec<Building>,
    token_ids: Vec<i32>,
    doc_index: Vec<i64>,
    position: Vec<i32>,
    sample_index: Vec<i64>,
    mask: Vec<bool>,
    role: Vec<u8>,
    /// A pooled run's rows: first position and count.
    position_first: Vec<i32>,
    count: Vec<i32>,
    /// The kept columns of the documents the shard holds rows of, by document.
    documents: std::collections::BTreeMap<i64, String>,
    samples: Option<(u64, u64)>,
    /// Sequences in the host's batches (each step's).
    batch_rows: usize,
    data_position_after: serde_json::Value,
}

impl ShardBuilder {
    pub fn new(identity: ShardIdentity, format: ShardFormat, index: u64) -> Self {
        Self::pooled(identity, format, index, ColumnPool::default())
    }

    /// A builder whose columns come from, and go back to, `pool`.
    pub fn pooled(identity: ShardIdentity, format: ShardFormat, index: u64, pool: ColumnPool) -> Self {
        ShardBuilder {
            identity,
            format,
            pool,
            index,
            columns: Vec::new(),
            token_ids: Vec::new(),
            doc_index: Vec::new(),
            position: Vec::new(),
            sample_index: Vec::new(),
            mask: Vec::new(),
            role: Vec::new(),
            position_first: Vec::new(),
            count: Vec::new(),
            documents: Default::default(),
            samples: None,
            batch_rows: 0,
            data_position_after: serde_json::Value::Null,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_none()
    }

    /// Bytes of tensor data so far.
    pub fn data_bytes(&self) -> u64 {
        let meta = self.token_ids.len()
            * (4 + 8
                + 4
                + 8
                + usize::from(self.format.keep_excluded)
                + usize::from(self.format.roles)
                + 8 * usize::from(self.format.pooled))
            + self.documents.values().map(|d| d.len() + 24).sum::<usize>();
        (self.columns.iter().map(Building::bytes).sum::<usize>() + meta) as u64
    }

    /// Appends one unit (a batch, or a shuffle window of batches) whose samples are contiguous.
    pub fn add_unit(&mut self, unit: Vec<BatchActivations>) -> Result<()> {
        let Some(first) = unit.first() else {
            return Ok(());
        };
        let out_dtype = self.format.dtype;
        if self.is_empty() {
            self.columns =
                Building::all(&self.identity.hooks, &self.identity.latents, &self.identity.outputs, first, out_dtype);
            self.batch_rows = first.batch;
        }
        for batch in &unit {
            let invalid = |reason| StoreError::InvalidBatch { first_sample: batch.first_sample, reason };
            for column in &self.columns {
                column.check(batch, out_dtype).map_err(invalid)?;
            }
            if self.format.roles && batch.roles.is_none() {
                return Err(invalid("the run stores roles and the batch has none".into()));
            }
            if self.format.pooled && batch.pooled.is_none() {
                return Err(invalid("the run pools rows and the batch has no first positions and counts".into()));
            }
        }
        let first_sample = first.first_sample;
        // (batch in unit, token in batch) of every token that goes into the shard.
        let mut order: Vec<(u32, u32)> = Vec::new();
        for (b, batch) in unit.iter().enumerate() {
            for t in 0..batch.batch * batch.seq {
                if self.format.keep_excluded || batch.keep[t] {
                    order.push((b as u32, t as u32));
                }
            }
        }
        if let Some(shuffle) = self.format.shuffle {
            // Seed from the run seed, the host and the window's first sample: the same window
            // is permuted identically however often the run is restarted.
            let seed = shuffle.seed
                ^ (u64::from(self.identity.host.machine) << 48)
                ^ (u64::from(self.identity.host.host) << 40)
                ^ first_sample.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            order.shuffle(&mut rng);
        }
        for column in &mut self.columns {
            column.take(&unit, &order, out_dtype, &self.pool)?;
        }
        let unit = &unit;
        let last = unit.last().expect("non-empty");
        for &(b, t) in &order {
            let batch = &unit[b as usize];
            let t = t as usize;
            self.token_ids.push(batch.token_ids[t]);
            self.doc_index.push(batch.doc_index[t]);
            self.position.push(batch.position[t]);
            self.sample_index.push((batch.first_sample + (t / batch.seq) as u64) as i64);
            self.mask.push(batch.keep[t]);
            if self.format.roles {
                self.role.extend(batch.roles.as_ref().map(|r| r[t]));
            }
            if let (true, Some(pooled)) = (self.format.pooled, &batch.pooled) {
                self.position_first.push(pooled.first[t]);
                self.count.push(pooled.count[t]);
            }
        }
        if self.format.documents {
            for batch in unit {
                self.documents.extend(batch.documents.iter().cloned());
            }
        }
        let start = self.samples.map_or(first_sample, |(s, _)| s);
        self.samples = Some((start, last.sample_end()));
        self.data_position_after = last.data_position_after.clone();
        Ok(())
    }

    /// Encodes the shard as safetensors and computes its checksum and statistics: one pass over
    /// each hook's rows, a block at a time, the CRC and the statistics on the same cached bytes.
    pub fn seal(mut self) -> Result<SealedShard> {
        let mask = self.format.keep_excluded.then_some(&self.mask[..]);
        let mut stats = RunStats::new();
        // The CRC of each tensor that is its column as stored (fp8 columns are split first).
        let mut known = HashMap::new();
        let mut refused = None;
        for column in &mut self.columns {
            let (crc, first_non_finite) = column.seal(self.format.dtype, mask, &self.pool, &mut stats);
            if let Some(row) = first_non_finite.filter(|_| !self.format.allow_non_finite) {
                refused = Some((column.name().to_string(), row));
                break;
            }
            known.extend(crc.map(|crc| (column.name().to_string(), crc)));
        }
        if let Some((hook, row)) = refused {
            let count = stats.hooks.get(&hook).map_or(0, |s| s.non_finite);
            return Err(self.non_finite(&hook, count, row));
        }
        let (index, samples) = (self.index, self.samples.unwrap_or((0, 0)));
        let tokens = self.token_ids.len() as u64;
        let included_tokens = mask.map_or(tokens, |m| m.iter().filter(|m| **m).count() as u64);
        let data_position_after = std::mem::take(&mut self.data_position_after);
        let (head, tensors) = self.into_tensors();
        let mut crc = crc32c::crc32c(&head);
        let mut bytes = head.len() as u64;
        let mut chunks = vec![head];
        for (name, data) in tensors {
            let len = data.iter().map(Bytes::len).sum::<usize>();
            let tensor_crc = match known.get(&name) {
                Some(&crc) => crc,
                None => data.iter().fold(0, |crc, d| crc32c::crc32c_append(crc, d)),
            };
            crc = crc32c::crc32c_combine(crc, tensor_crc, len);
            bytes += len as u64;
            chunks.extend(data.into_iter().filter(|d| !d.is_empty()));
        }
        Ok(SealedShard {
            index,
            chunks,
            bytes,
            crc32c: crc,
            tokens,
            included_tokens,
            samples,
            data_position_after,
            stats,
        })
    }

    /// Refuses the rows so far where a hook holds a value that is NaN or ±Inf and the format
    /// does not allow them, as sealing would: for a batch that is sent (a stream), not sealed.
    pub fn check_finite(&self) -> Result<()> {
        if self.format.allow_non_finite {
            return Ok(());
        }
        let mask = self.format.keep_excluded.then_some(&self.mask[..]);
        for column in &self.columns {
            if let Some((row, count)) = column.non_finite(self.format.dtype, mask) {
                return Err(self.non_finite(column.name(), count, row));
            }
        }
        Ok(())
    }

    /// The refusal of a shard whose hook `hook` holds `count` values that are not finite, the
    /// first in row `row`: where they came from (the host's sample, the batch it was in, the
    /// token's document and position).
    fn non_finite(&self, hook: &str, count: u64, row: usize) -> StoreError {
        let sample = self.sample_index[row] as u64;
        StoreError::NonFinite {
            hook: hook.to_string(),
            count,
            host: self.identity.host,
            shard: self.index,
            sample,
            step: sample / self.batch_rows.max(1) as u64,
            document: self.doc_index[row],
            position: self.position[row],
        }
    }

    /// The shard's safetensors file, in order (header first), without the checksum and
    /// statistics [`ShardBuilder::seal`] adds: what a stream sends for a batch.
    pub fn into_file(self) -> Vec<Bytes> {
        let (head, tensors) = self.into_tensors();
        std::iter::once(head).chain(tensors.into_iter().flat_map(|(_, data)| data).filter(|d| !d.is_empty())).collect()
    }

    /// The header and each tensor's name and bytes, in file order.
    fn into_tensors(self) -> (Bytes, Vec<(String, Vec<Bytes>)>) {
        let ShardBuilder {
            identity,
            format,
            pool,
            index,
            columns,
            token_ids,
            doc_index,
            position,
            sample_index,
            mask,
            role,
            position_first,
            count,
            documents,
            samples,
            batch_rows: _,
            data_position_after: _,
        } = self;
        let (sample_start, sample_end) = samples.unwrap_or((0, 0));
        let tokens = token_ids.len();
        let dtype = format.dtype;

        let tensor = |name: &str, dtype, data, rank| Tensor {
            name: name.into(),
            dtype,
            shape: vec![tokens],
            data: vec![data],
            rank,
        };
        let mut tensors = vec![
            tensor("doc_index", "I64", le_bytes(&doc_index, i64::to_le_bytes), Rank::Samples),
            tensor("sample_index", "I64", le_bytes(&sample_index, i64::to_le_bytes), Rank::Samples),
            tensor("token_ids", "I32", le_bytes(&token_ids, i32::to_le_bytes), Rank::Tokens),
            tensor("position", "I32", le_bytes(&position, i32::to_le_bytes), Rank::Tokens),
        ];
        for column in columns {
            tensors.extend(column.into_tensors(tokens, dtype, &pool));
        }
        if format.roles {
            tensors.push(tensor("role", "U8", Bytes::from(role), Rank::Masks));
        }
        if format.pooled {
            tensors.push(tensor("position_first", "I32", le_bytes(&position_first, i32::to_le_bytes), Rank::Tokens));
            tensors.push(tensor("count", "I32", le_bytes(&count, i32::to_le_bytes), Rank::Tokens));
        }
        if format.documents {
            let mut lines = String::new();
            for (doc, fields) in &documents {
                lines.push_str(&format!("[{doc},{fields}]\n"));
            }
            let bytes = lines.len();
            tensors.push(Tensor {
                name: "documents".into(),
                dtype: "U8",
                shape: vec![bytes],
                data: vec![Bytes::from(lines)],
                rank: Rank::Masks,
            });
        }
        if format.keep_excluded {
            let mask = Bytes::from(mask.iter().map(|&m| u8::from(m)).collect::<Vec<u8>>());
            tensors.push(tensor("mask", "BOOL", mask, Rank::Masks));
        }
        file_order(&mut tensors);

        let mut metadata = BTreeMap::new();
        metadata.insert("format", FORMAT_TAG.to_string());
        metadata.insert("run", identity.run.clone());
        metadata.insert("model", identity.model.clone());
        metadata.insert("hooks", serde_json::to_string(&identity.hooks).expect("strings serialize"));
        metadata.insert("dtype", dtype.name().to_string());
        metadata.insert("shard_index", index.to_string());
        metadata.insert("machine", identity.host.machine.to_string());
        metadata.insert("host", identity.host.host.to_string());
        metadata.insert("sample_start", sample_start.to_string());
        metadata.insert("sample_end", sample_end.to_string());
        metadata.insert("tokens", tokens.to_string());
        metadata.insert("excluded_tokens_kept_with_mask", format.keep_excluded.to_string());

        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), serde_json::to_value(&metadata).expect("strings serialize"));
        let mut offset = 0usize;
        for t in &tensors {
            let end = offset + t.data.iter().map(Bytes::len).sum::<usize>();
            header.insert(
                t.name.clone(),
                serde_json::json!({ "dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, end] }),
            );
            offset = end;
        }
        let mut header = serde_json::to_vec(&header).expect("json serializes");
        // Pad with spaces so the data section starts 8-byte aligned, as safetensors does.
        while !(8 + header.len()).is_multiple_of(8) {
            header.push(b' ');
        }
        let mut head = Vec::with_capacity(8 + header.len());
        head.extend_from_slice(&(header.len() as u64).to_le_bytes());
        head.extend_from_slice(&header);

        (Bytes::from(head), tensors.into_iter().map(|t| (t.name, t.data)).collect())
    }
}

/// What a shard's safetensors header says, plus statistics recomputed from its data.
#[derive(Debug, Clone)]
pub struct ShardSummary {
    /// `__metadata__` entries.
    pub metadata: HashMap<String, String>,
    /// The format version in the metadata's `format` tag (1 or 2).
    pub format_version: u32,
    /// Per hook, the per-token shape: the hook tensor's shape without its first (token)
    /// dimension.
    pub hook_shapes: BTreeMap<String, Vec<usize>>,
    /// Token rows (length of `token_ids`).
    pub tokens: u64,
    /// Rows included by the mask (all rows when there is no mask).
    pub included_tokens: u64,
    /// Per hook statistics of the stored values.
    pub stats: RunStats,
}

/// Parses a shard file and checks its format tag, that every hook and bookkeeping tensor has
/// the same row count, and that each hook tensor is `[tokens, *shape]` of rank 2 or more.
///
/// `shapes` are the per-token shapes run.json records, in `hooks` order; when given (non-empty),
/// a hook whose trailing dimensions differ is an error naming the hook and both shapes.
///
/// Each of `latents` must be a well-formed CSR matrix over the shard's rows (see
/// [`LatentsColumn`]), each of `outputs` a tensor of its dtype and shape: their statistics are
/// recomputed from them.
pub fn summarize_shard(
    path: &str,
    bytes: &[u8],
    hooks: &[String],
    shapes: &[Vec<usize>],
    latents: &[LatentsColumn],
    outputs: &[OutputColumn],
) -> Result<ShardSummary> {
    let bad = |reason: String| StoreError::BadShard { path: path.to_string(), reason };
    let (_, meta) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| bad(e.to_string()))?;
    let metadata = meta.metadata().clone().unwrap_or_default();
    let format_version = check_format(path, metadata.get("format").map_or("", String::as_str))?;
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
    let tokens =
        st.tensor("token_ids").map_err(|e| bad(format!("token_ids: {e}")))?.shape().first().copied().unwrap_or(0);
    for name in ["doc_index", "position", "sample_index"] {
        let t = st.tensor(name).map_err(|e| bad(format!("{name}: {e}")))?;
        if t.shape() != [tokens] {
            return Err(bad(format!("{name} has shape {:?}, expected [{tokens}]", t.shape())));
        }
    }
    for name in ["role", "position_first", "count"] {
        if let Ok(t) = st.tensor(name)
            && t.shape() != [tokens]
        {
            return Err(bad(format!("{name} has shape {:?}, expected [{tokens}]", t.shape())));
        }
    }
    let mask: Option<Vec<bool>> = match st.tensor("mask") {
        Ok(t) if t.dtype() != safetensors::Dtype::BOOL || t.shape() != [tokens] => {
            return Err(bad(format!("mask is {:?}{:?}, expected BOOL[{tokens}]", t.dtype(), t.shape())));
        }
        Ok(t) => Some(t.data().iter().map(|&b| b != 0).collect()),
        Err(_) => None,
    };
    let included_tokens = mask.as_ref().map_or(tokens, |m| m.iter().filter(|x| **x).count()) as u64;
    let mut stats = RunStats::new();
    let mut hook_shapes = BTreeMap::new();
    for column in &columns(hooks, shapes, latents, outputs) {
        let summary = column.summarize(&st, tokens, mask.as_deref()).map_err(bad)?;
        summary.insert(column.name(), &mut stats, &mut hook_shapes);
    }
    Ok(ShardSummary { metadata, format_version, hook_shapes, tokens: tokens as u64, included_tokens, stats })
}
