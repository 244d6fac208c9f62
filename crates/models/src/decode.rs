//! Decoding's part of the program: a step that reads and writes each attention block's key and
//! value cache ([`build_decode_step`]). Every family's own forward is built as for extraction
//! (its blocks, norms, RoPE, soft-caps, mixtures, steering), with two differences that live
//! here: softmax attention takes its keys and values from the cache once this step's are
//! written into it (`Graph::cached`), and the program ends with each row's next-token logits
//! and the caches after the step (`results`).
//!
//! The cache of an attention block is, per row (a slot of the decoding loop), `[positions,
//! width]` keys and as many values: a step writes each real token's keys and values at its
//! position's index (`position_ids`; padding writes nothing) and each query at position `q`
//! attends the positions `p <= q` (and `q - p < window` in a windowed block). A block without
//! a window holds every position (`cache_len`), position `p` at index `p`. A windowed block
//! holds a ring of [`DecodeStep::ring`] positions, position `p` at index `p mod ring`: the
//! ring is the window and the step's other new tokens, so the keys a step's queries read are
//! all there once its own are written. Index `j` then holds, for query `q`, position `q - d`
//! where `d = (q - j) mod ring`: attended where `d < window` and `d <= q` (a position of this
//! sequence). A row's indices past what it wrote hold whatever an earlier sequence of the slot
//! left; none is read before this sequence writes it, so a slot is refilled without clearing
//! it. A block that attends another block's keys and values (Gemma 4's shared KV layers)
//! reads that block's cache.
//!
//! A Gated DeltaNet block (Qwen3.5, Qwen3-Next) keeps, per row, its recurrence's state
//! `[heads, dk, dv]` (f32) and the last `K - 1` inputs of each of its convolutions (q, k, v;
//! the compute dtype): a step starts from them (from zeros on a row whose first token is at
//! position 0, a sequence's start) and leaves them as they stand after the row's last real
//! token (`crate::layers::gated_deltanet`).
//!
//! A latent attention (MLA: DeepSeek-V3, Kimi K2) caches, per position, its normed latent and
//! its rotated RoPE key (`kv_lora_rank + rope` values, for every head), not each head's keys
//! and values, and attends through the latent (`crate::layers::mla`).

use siphon_hlo::{CompareDir, DType, TensorType, Value};
use siphon_mesh::PartitionSpec;

use crate::config::ModelConfig;
use crate::contract::{DecodeInfo, DecodeStep, ForwardProgram, ForwardSpec, NextTokenInfo};
use crate::error::ModelError;
use crate::forward::{Graph, build_forward};
use crate::sharding::MODEL;

/// Builds the decoding step of `config` for `spec` ([`ForwardSpec::decode`] given): `batch`
/// rows (slots) of `seq` new tokens each (a prompt's chunk, or one token), every block, and
/// the logits at each row's last real token. What a step cannot take is refused by name:
/// hooks, dictionaries, next-token outputs, cuDNN's attention.
pub fn build_decode_step(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    let Some(step) = spec.decode else {
        return Err(ModelError::Config("a decoding step needs its cache's length (ForwardSpec::decode)".into()));
    };
    let refused = [
        (!spec.hooks.is_empty(), "hooks"),
        (!spec.dictionaries.is_empty(), "dictionaries"),
        (spec.next_token.is_some(), "next-token outputs"),
        (spec.cudnn_attention, "cuDNN's attention"),
        (spec.isolated, "isolated documents"),
    ];
    if let Some((_, what)) = refused.iter().find(|(on, _)| *on) {
        return Err(ModelError::Config(format!("a decoding step computes no {what}")));
    }
    if step.cache_len == 0 || step.chunk == 0 || spec.seq > step.chunk.min(step.cache_len) {
        return Err(ModelError::Config(format!(
            "a decoding step of {} tokens a row over caches of {} positions taking {} tokens a step",
            spec.seq, step.cache_len, step.chunk
        )));
    }
    let limit = config.max_position_embeddings;
    if limit > 0 && step.cache_len > limit {
        return Err(ModelError::Config(format!(
            "a cache of {} positions is past the model's context ({limit}, max_position_embeddings)",
            step.cache_len
        )));
    }
    build_forward(config, spec)
}

/// The caches a decoding step reads and writes, as the blocks are built.
pub(crate) struct Cache {
    step: DecodeStep,
    /// Every cache, in the order of its argument: its name, its argument (the value before the
    /// step, donated to the one after), its value after the step and how it lies on the mesh.
    entries: Vec<(String, Value, Value, PartitionSpec)>,
    /// Per attention block with a cache of its own: the keys and values it was given (to find
    /// a block that shares them) and its caches after the step.
    shared: Vec<((Value, Value), (Value, Value))>,
    /// The masks built so far, by window and the positions of the cache they read: `[batch,
    /// seq, positions]`.
    masks: Vec<((Option<usize>, usize), Value)>,
    /// Which rows start a sequence at this step, `[batch]` (built once).
    fresh: Option<Value>,
}

impl Cache {
    pub(crate) fn new(step: DecodeStep) -> Cache {
        Cache { step, entries: Vec::new(), shared: Vec::new(), masks: Vec::new(), fresh: None }
    }
}

impl Graph<'_> {
    /// Block `layer`'s keys `k` `[tokens, k width]` and values `v` `[tokens, v width]` (RoPE
    /// applied) written into its caches, and what its attention then reads: every cached key
    /// and value, `[batch, kv_heads, positions, head width]` each (a head's positions
    /// together, so a step's products read them where they lie), and the mask `[batch, seq,
    /// positions]`.
    pub(crate) fn cached(&mut self, layer: usize, k: Value, v: Value) -> Result<(Value, Value, Value), ModelError> {
        let cache = self.cache.as_ref().expect("cached() while decoding");
        let step = cache.step;
        let window = self.config.window(layer);
        let shared = cache.shared.iter().find(|(given, _)| *given == (k, v)).map(|(_, after)| *after);
        let (k_all, v_all) = match shared {
            Some(after) => after,
            None => {
                // Rows as the inputs', the heads over `model` where they divide, as the keys and
                // values are computed; else whole on each device of a row group.
                let heads = self.config.kv_heads_at(layer);
                let spec = self.state_spec(4, 1, heads);
                let positions = step.ring(window);
                let mut after = [k; 2];
                for (i, (x, part)) in [(k, "k"), (v, "v")].into_iter().enumerate() {
                    let row = [heads, positions, self.b.dims(x)?[1] / heads];
                    after[i] = self.written(format!("blocks.{layer}.{part}"), x, &row, &spec)?;
                }
                let cache = self.cache.as_mut().expect("cached() while decoding");
                cache.shared.push(((k, v), (after[0], after[1])));
                (after[0], after[1])
            }
        };
        // A block reading another's ring must attend no further back than the ring holds.
        let positions = self.b.dims(k_all)?[2];
        if positions < step.cache_len && step.ring(window) > positions {
            return Err(ModelError::Config(format!(
                "block {layer} attends {} positions back from another block's cache, which keeps {positions}",
                window.map_or("all".to_string(), |w| w.to_string())
            )));
        }
        let mask = self.cache_mask(window, positions)?;
        Ok((k_all, v_all, mask))
    }

    /// Block `layer`'s latent `x` `[tokens, width]` (a latent attention's: one for every head)
    /// written into its cache, whole on each device of a row group; returns the cache after
    /// the write, `[batch, positions, width]`, and the mask of its positions `[batch, seq,
    /// positions]`.
    pub(crate) fn cached_latent(&mut self, layer: usize, x: Value) -> Result<(Value, Value), ModelError> {
        let window = self.config.window(layer);
        let positions = self.cache.as_ref().expect("cached_latent() while decoding").step.ring(window);
        let spec = self.state_spec(3, 2, 1);
        let row = [positions, self.b.dims(x)?[1]];
        let after = self.written(format!("blocks.{layer}.latent"), x, &row, &spec)?;
        let mask = self.cache_mask(window, positions)?;
        Ok((after, mask))
    }

    /// A new cache `name`, `row` a row (positions next to last), lying as `spec`, with `x`
    /// `[tokens, width]` written into it ([`Graph::write`]): its value after the step, kept.
    fn written(&mut self, name: String, x: Value, row: &[usize], spec: &PartitionSpec) -> Result<Value, ModelError> {
        let dims: Vec<usize> = [self.spec.batch].iter().chain(row).copied().collect();
        let arg = self.cache_arg(&dims, self.dt, spec)?;
        let after = self.write(arg, x)?;
        self.keep_cache(name, arg, after, spec.clone());
        Ok(after)
    }

    /// How a cache of `rank` dimensions lies on the mesh: rows (its first) as the inputs', and
    /// dimension `at` over `model` where `heads` (the heads it holds) divide by it.
    pub(crate) fn state_spec(&self, rank: usize, at: usize, heads: usize) -> PartitionSpec {
        let mut dims = vec![Vec::new(); rank];
        dims[0] = self.input_spec().dims()[0].clone();
        let model = self.spec.mesh.axis_size(MODEL).unwrap_or(1);
        if model > 1 && heads.is_multiple_of(model) {
            dims[at] = vec![MODEL.to_string()];
        }
        PartitionSpec::from_dims(dims)
    }

    /// A cache argument of `dims` (rows first) and `dtype`, lying as `spec`.
    pub(crate) fn cache_arg(
        &mut self,
        dims: &[usize],
        dtype: DType,
        spec: &PartitionSpec,
    ) -> Result<Value, ModelError> {
        let sharded = self.sharded();
        Ok(self.b.arg(TensorType::new(dtype, dims), sharded.then(|| spec.clone()))?)
    }

    /// Records `after` as the cache `name` after the step, written over its argument `before`
    /// (a [`Graph::cache_arg`]; kept in argument order).
    pub(crate) fn keep_cache(&mut self, name: String, before: Value, after: Value, spec: PartitionSpec) {
        self.cache.as_mut().expect("keep_cache() while decoding").entries.push((name, before, after, spec));
    }

    /// `state` (a cache argument, rows first) where a row continues its sequence, zeros where
    /// it starts one at this step (its first token real and at position 0).
    pub(crate) fn state_or_fresh(&mut self, state: Value) -> Result<Value, ModelError> {
        let fresh = match self.cache.as_ref().and_then(|c| c.fresh) {
            Some(fresh) => fresh,
            None => {
                let bsz = self.spec.batch;
                let (positions, real) = (self.position_ids, self.attention_mask);
                let b = &mut self.b;
                let first = |b: &mut siphon_hlo::Builder, x: Value| -> Result<Value, siphon_hlo::HloError> {
                    let x = b.slice_dim(x, 1, 0, 1)?;
                    b.reshape(x, &[bsz])
                };
                let (p, r) = (first(b, positions)?, first(b, real)?);
                let zero = b.splat(0.0, TensorType::new(DType::I32, &[bsz]))?;
                let start = b.compare(CompareDir::Eq, p, zero)?;
                let real = b.compare(CompareDir::Ne, r, zero)?;
                let fresh = b.and(start, real)?;
                self.cache.as_mut().expect("state_or_fresh() while decoding").fresh = Some(fresh);
                fresh
            }
        };
        let b = &mut self.b;
        let (dims, dtype) = (b.dims(state)?.to_vec(), b.dtype(state)?);
        let fresh = b.broadcast_in_dim(fresh, &dims, &[0])?;
        let zeros = b.splat(0.0, TensorType::new(dtype, &dims))?;
        Ok(b.select(fresh, zeros, state)?)
    }

    /// `cache` `[batch, …, positions, width]` with each real token of `x` `[tokens, …·width]`
    /// at its position's index — modulo `positions` where they are a ring (fewer than the
    /// sequence's) — a scatter, each row at its own positions; padding is sent out of range,
    /// so dropped.
    fn write(&mut self, cache: Value, x: Value) -> Result<Value, ModelError> {
        let (bsz, t) = (self.spec.batch, self.spec.seq);
        let dims = self.b.dims(cache)?.to_vec();
        let at_dim = dims.len() - 2;
        let len = dims[at_dim];
        let ring = len < self.cache.as_ref().expect("write() while decoding").step.cache_len;
        let (mut positions, real) = (self.position_ids, self.attention_mask);
        let b = &mut self.b;
        let ids = TensorType::new(DType::I32, &[bsz, t]);
        if ring {
            let len = b.splat(len as f64, ids.clone())?;
            positions = b.rem(positions, len)?;
        }
        let zero = b.splat(0.0, ids.clone())?;
        let real = b.compare(CompareDir::Ne, real, zero)?;
        let beyond = b.splat(len as f64, ids)?;
        let at = b.select(real, positions, beyond)?;
        let at = b.reshape(at, &[bsz, t, 1])?;
        // A token's values in the cache's order, less its positions: `[batch, seq, …, width]`.
        let token: Vec<usize> =
            [bsz, t].into_iter().chain(dims[1..at_dim].iter().copied()).chain([dims[at_dim + 1]]).collect();
        let x = b.reshape(x, &token)?;
        Ok(b.put_along(cache, 0, &[at_dim], at, x)?)
    }

    /// The mask of a cache of `positions` read by queries at `position_ids`: `[batch, seq,
    /// positions]`, true where index `j` holds a position `p <= q` (and `q - p < window`) —
    /// `j` itself, or on a ring (fewer positions than the sequence's) `q - (q - j) mod
    /// positions`. Built once per window and cache.
    fn cache_mask(&mut self, window: Option<usize>, positions: usize) -> Result<Value, ModelError> {
        let cache = self.cache.as_ref().expect("cache_mask() while decoding");
        if let Some(&(_, mask)) = cache.masks.iter().find(|(key, _)| *key == (window, positions)) {
            return Ok(mask);
        }
        let ring = positions < cache.step.cache_len;
        let (bsz, t) = (self.spec.batch, self.spec.seq);
        let shape = [bsz, t, positions];
        let ids = TensorType::new(DType::I32, &shape);
        let b = &mut self.b;
        let j = b.iota(ids.clone(), 2)?;
        let q = b.broadcast_in_dim(self.position_ids, &shape, &[0, 1])?;
        let mask = match window {
            Some(w) if ring => {
                // d = (q - j) mod ring, from q - j + ring > 0: attended where d < w and d <= q.
                let r = b.splat(positions as f64, ids.clone())?;
                let d = b.sub(q, j)?;
                let d = b.add(d, r)?;
                let d = b.rem(d, r)?;
                let w = b.splat(w as f64, ids)?;
                let recent = b.compare(CompareDir::Lt, d, w)?;
                let ours = b.compare(CompareDir::Le, d, q)?;
                b.and(recent, ours)?
            }
            _ => {
                let mut mask = b.compare(CompareDir::Le, j, q)?;
                if let Some(w) = window {
                    // j > q - w, i.e. j + w > q.
                    let w = b.splat(w as f64, ids)?;
                    let reach = b.add(j, w)?;
                    let recent = b.compare(CompareDir::Gt, reach, q)?;
                    mask = b.and(mask, recent)?;
                }
                mask
            }
        };
        self.cache.as_mut().expect("cache_mask() while decoding").masks.push(((window, positions), mask));
        Ok(mask)
    }
}

/// What a decoding step returns, given the final norm's output `hidden` `[tokens, hidden]`
/// and the unembedding `[vocab, hidden]`.
pub(crate) struct Request<'a> {
    pub config: &'a ModelConfig,
    pub cache: &'a Cache,
    pub hidden: Value,
    pub unembedding: Value,
    pub attention_mask: Value,
    pub rows: [usize; 2],
    pub input_spec: &'a PartitionSpec,
    pub sharded: bool,
    /// The most rows the unembedding is taken weight first at
    /// ([`crate::ForwardSpec::weight_first`]).
    pub weight_first: Option<usize>,
    /// How each row's next token is chosen, and (where drawn) each row's uniform `[batch]`.
    pub sampling: crate::contract::Sampling,
    pub uniforms: Option<Value>,
    /// The index among the program's results of the first this returns.
    pub first_result: usize,
}

/// A program result and its split over the mesh (none on one device).
type Produced = (Value, Option<PartitionSpec>);

/// The logits of each row's last real token (its real tokens come first), `[batch, vocab]`
/// f32 through the family's final soft-cap, each row's next token (greedy, or drawn:
/// `sample.rs`), then every cache after the step: the results (each with its split) and their description.
pub(crate) fn results(b: &mut siphon_hlo::Builder, r: Request<'_>) -> Result<(Vec<Produced>, DecodeInfo), ModelError> {
    let [bsz, t] = r.rows;
    let vocab = r.config.vocab_size;
    // Row b's last real token is token b·t + (real tokens − 1) of the flattened rows.
    let real = b.reduce_sum(r.attention_mask, &[1])?;
    let one = b.splat(1.0, TensorType::new(DType::I32, &[bsz]))?;
    let last = b.sub(real, one)?;
    let zero = b.splat(0.0, TensorType::new(DType::I32, &[bsz]))?;
    let last = b.max(last, zero)?;
    let row = b.iota(TensorType::new(DType::I32, &[bsz]), 0)?;
    let width = b.splat(t as f64, TensorType::new(DType::I32, &[bsz]))?;
    let start = b.mul(row, width)?;
    let index = b.add(start, last)?;
    let h = b.take_rows(r.hidden, index)?;
    let mut logits = crate::forward::matmul_t(b, h, r.unembedding, r.weight_first)?;
    if let Some(cap) = r.config.final_softcap {
        logits = crate::layers::attention::soft_cap(b, logits, cap)?;
    }
    let mut logits = b.convert(logits, DType::F32)?;
    let rows = r.input_spec.dims()[0].clone();
    let logits_spec = PartitionSpec::from_dims(vec![rows.clone(), Vec::new()]);
    let choice_spec = PartitionSpec::from_dims(vec![rows.clone()]);
    if r.sharded {
        // Each row's logits whole on its devices, as the choice reads them.
        logits = b.sharding_constraint(logits, &logits_spec)?;
    }
    let choice = crate::sample::choose(b, logits, r.uniforms, &r.sampling)?;
    let mut values =
        vec![(logits, r.sharded.then(|| logits_spec.clone())), (choice, r.sharded.then(|| choice_spec.clone()))];
    let info = |name: String, shape: Vec<usize>, dtype, spec: &PartitionSpec| NextTokenInfo {
        name,
        shape,
        dtype,
        spec: spec.clone(),
    };
    let mut caches = Vec::new();
    // Each cache's buffer is handed to the step, which writes the cache after it in place.
    for (name, before, after, spec) in &r.cache.entries {
        let (shape, dtype) = (b.dims(*after)?.to_vec(), b.dtype(*after)?);
        caches.push(info(name.clone(), shape, dtype, spec));
        b.donate(*before, r.first_result + values.len())?;
        values.push((*after, r.sharded.then(|| spec.clone())));
    }
    let logits = info("logits".into(), vec![bsz, vocab], DType::F32, &logits_spec);
    let choice = info("choice".into(), vec![bsz], DType::I32, &choice_spec);
    Ok((values, DecodeInfo { logits, choice, caches }))
}
