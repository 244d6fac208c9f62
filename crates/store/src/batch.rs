//! The per-batch record the extraction loop hands to the writer.
//!
//! The store does not know about tokenizers, corpora or models: it receives, per batch, the
//! hook activations as raw little-endian host memory plus the per-token bookkeeping the data
//! crate produced, and an opaque resume position.

use bytes::Bytes;

use crate::error::{Result, StoreError};
use crate::output::{BatchOutput, OutputColumn};
use crate::sparse::{BatchLatents, LatentsColumn};

pub use siphon_dtype::DType;

/// The name of the f32 `[tokens]` tensor holding the row scales of an fp8 hook.
pub fn fp8_scale_name(hook: &str) -> String {
    format!("{hook}.fp8_scale")
}

/// One hook's activations for a whole batch: `[batch, seq, *shape]`, row-major, little-endian.
#[derive(Debug, Clone)]
pub struct HookActivations {
    /// Hook name, e.g. `blocks.3.hook_resid_post`.
    pub hook: String,
    /// Element type of `data`.
    pub dtype: DType,
    /// Shape of one token's activation: `[d_model]`, `[d_mlp]`, `[n_heads, d_head]` for
    /// per-head hooks, `[1]` for `hook_scale`, `[n_heads, seq]` for attention-pattern rows.
    /// Non-empty, no zero dimension. Shards store the hook as `[tokens, *shape]`.
    pub shape: Vec<usize>,
    /// `batch * seq * dtype.row_bytes(row_elements())` bytes. Any owner's memory (a `Vec`, or
    /// a reused host buffer through `Bytes::from_owner`): the writer keeps slices of it (long
    /// runs of kept rows already in the stored dtype) until the shard holding them is uploaded,
    /// and copies the other rows; with a shuffle it copies the whole window's at once. An
    /// owner waits for its memory until the last slice is dropped.
    pub data: Bytes,
}

impl HookActivations {
    /// Elements in one token's activation: the product of `shape`.
    pub fn row_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Checks a per-token shape: non-empty, no zero dimension, element count fits in `usize`.
/// Returns the element count; the error says what is wrong (the caller names the hook).
pub(crate) fn check_token_shape(shape: &[usize]) -> std::result::Result<usize, String> {
    if shape.is_empty() {
        return Err("has an empty per-token shape [] (a vector hook is [width])".into());
    }
    if shape.contains(&0) {
        return Err(format!("has a zero dimension in its per-token shape {shape:?}"));
    }
    match shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) {
        Some(n) if n <= MAX_TOKEN_ELEMENTS => Ok(n),
        _ => Err(format!("has per-token shape {shape:?}, more than {MAX_TOKEN_ELEMENTS} elements per token")),
    }
}

/// The most elements one token's activation of a hook may have (2^24: an attention pattern
/// over 128k keys of 64 heads has 2^23); what readers allocate statistics for is bounded by it.
pub(crate) const MAX_TOKEN_ELEMENTS: usize = 1 << 24;

/// Everything the writer needs about one batch of `batch` sequences of `seq` tokens.
///
/// Samples (sequences) are numbered per host: this batch holds samples
/// `first_sample .. first_sample + batch`, and the next batch must start where this one ends.
#[derive(Debug, Clone)]
pub struct BatchActivations {
    /// Host-local index of the batch's first sequence.
    pub first_sample: u64,
    /// Number of sequences.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Per hook activations, in the run's hook order.
    pub hooks: Vec<HookActivations>,
    /// Per latents column, in the run's order ([`crate::RunDescriptor::latents`]).
    pub latents: Vec<BatchLatents>,
    /// Per output column, in the run's order ([`crate::RunDescriptor::outputs`]).
    pub outputs: Vec<BatchOutput>,
    /// `[batch, seq]` token ids.
    pub token_ids: Vec<i32>,
    /// `[batch, seq]` index of the corpus document each token came from.
    pub doc_index: Vec<i64>,
    /// `[batch, seq]` position of each token inside its document.
    pub position: Vec<i32>,
    /// `[batch, seq]`; false marks tokens to exclude (BOS, padding, separators).
    pub keep: Vec<bool>,
    /// `[batch, seq]` role of each token (the data crate's `Role` as a byte), for runs that
    /// store roles.
    pub roles: Option<Vec<u8>>,
    /// `[batch, seq]` of a run of pooled rows ([`crate::ShardFormat::pooled`]): each row's
    /// first position (`position` is its last) and the tokens it pools.
    pub pooled: Option<Pooled>,
    /// The kept columns of the documents this batch stores rows of, for a run that keeps them
    /// ([`crate::ShardFormat::documents`]): each document's id (as `doc_index`) and its fields
    /// as a JSON object's text.
    pub documents: Vec<(i64, String)>,
    /// Opaque data-stream position after this batch (from the data crate), recorded in the
    /// manifest so that a restart resumes exactly after the last committed shard.
    pub data_position_after: serde_json::Value,
}

/// A pooled row's span: its first position and how many tokens it pools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pooled {
    /// `[batch, seq]` each row's first position.
    pub first: Vec<i32>,
    /// `[batch, seq]` the tokens each row pools.
    pub count: Vec<i32>,
}

impl BatchActivations {
    /// Number of sample indices this batch covers.
    pub fn sample_end(&self) -> u64 {
        self.first_sample + self.batch as u64
    }

    /// Per hook, the per-token shape, in hook order.
    pub fn hook_shapes(&self) -> Vec<Vec<usize>> {
        self.hooks.iter().map(|h| h.shape.clone()).collect()
    }

    /// Checks sizes against the run's hooks and each hook's own per-token shape; returns a
    /// clear error naming the first problem. (That shapes stay the same from batch to batch is
    /// the writer's check.)
    pub fn validate(&self, hooks: &[String], latents: &[LatentsColumn], outputs: &[OutputColumn]) -> Result<()> {
        let bad = |reason: String| StoreError::InvalidBatch { first_sample: self.first_sample, reason };
        let tokens = self.batch.checked_mul(self.seq).ok_or_else(|| bad("batch * seq overflows".into()))?;
        if tokens == 0 {
            return Err(bad(format!("empty batch (batch {} x seq {})", self.batch, self.seq)));
        }
        for (name, len) in [
            ("token_ids", self.token_ids.len()),
            ("doc_index", self.doc_index.len()),
            ("position", self.position.len()),
            ("keep", self.keep.len()),
            ("roles", self.roles.as_ref().map_or(tokens, Vec::len)),
            ("position_first", self.pooled.as_ref().map_or(tokens, |p| p.first.len())),
            ("count", self.pooled.as_ref().map_or(tokens, |p| p.count.len())),
        ] {
            if len != tokens {
                return Err(bad(format!("{name} has {len} entries, expected batch*seq = {tokens}")));
            }
        }
        if self.hooks.len() != hooks.len() || self.hooks.iter().zip(hooks).any(|(h, n)| &h.hook != n) {
            let got: Vec<&str> = self.hooks.iter().map(|h| h.hook.as_str()).collect();
            return Err(bad(format!("hooks {got:?} differ from the run's hooks {hooks:?}")));
        }
        crate::sparse::check_batch(&self.latents, latents, tokens).map_err(bad)?;
        crate::output::check_batch(&self.outputs, outputs, tokens).map_err(bad)?;
        for hook in &self.hooks {
            if !hook.dtype.is_activation() {
                return Err(bad(format!("hook {} is {}, which holds no activations", hook.hook, hook.dtype)));
            }
            let elements = check_token_shape(&hook.shape).map_err(|e| bad(format!("hook {} {e}", hook.hook)))?;
            let expected = tokens
                .checked_mul(hook.dtype.row_bytes(elements))
                .ok_or_else(|| bad(format!("hook {} size overflows", hook.hook)))?;
            if hook.data.len() != expected {
                let row = match hook.dtype {
                    DType::Fp8 => format!("(4 + prod(shape {:?}))", hook.shape),
                    dtype => format!("prod(shape {:?})*{}", hook.shape, dtype.size()),
                };
                return Err(bad(format!(
                    "hook {} has {} bytes, expected batch*seq*{row} = {expected}",
                    hook.hook,
                    hook.data.len(),
                )));
            }
        }
        Ok(())
    }
}
