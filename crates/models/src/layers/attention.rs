//! Softmax attention: causal and windowed masks (built once per window), grouped-query
//! attention as batched products over `[batch, kv_head]`, sinks, softcaps, and the
//! self-attention block most families share (q/k/v projections, q/k norms, RoPE, o_proj).

use siphon_hlo::{Builder, CompareDir, DType, DotDims, TensorType, Value};

use crate::arch::Gain;
use crate::error::ModelError;
use crate::forward::Graph;
use crate::hooks::{HookKind, HookPoint};
use crate::layers::norm::head_norm;

/// Attention's hookable parts (see [`Graph::attention`]).
pub(crate) struct Attention {
    /// Scaled, masked logits, f32, `[batch, kv_head, query, group, key]`.
    pub scores: Value,
    /// Probabilities in the compute dtype, same layout.
    pub pattern: Value,
    /// `[tokens, n_heads*head_dim]`, the input of `o_proj`.
    pub z: Value,
}

impl Graph<'_> {
    /// Block `layer`'s q, k and v from the parts of a fused projection with biases, cut on read
    /// (`{fused}.weight[q]`, `{fused}.bias[q]`, …: GPT-2's `c_attn`, GPT-NeoX's
    /// `query_key_value`), recording `attn.hook_q` / `hook_k` / `hook_v`.
    pub fn fused_qkv(&mut self, x: Value, layer: usize, fused: &str) -> Result<[Value; 3], ModelError> {
        let mut out = [x; 3];
        for (slot, (part, kind)) in
            out.iter_mut().zip([("q", HookKind::AttnQ), ("k", HookKind::AttnK), ("v", HookKind::AttnV)])
        {
            *slot = self.linear(x, &format!("{fused}.weight[{part}]"), Some(&format!("{fused}.bias[{part}]")))?;
            self.hook(HookPoint::block(layer, kind), *slot);
        }
        Ok(out)
    }

    /// The attention mask of block `layer` (its window from the config), built once per
    /// distinct window and shared by the blocks that have it.
    pub fn layer_mask(&mut self, layer: usize) -> Result<Value, ModelError> {
        let window = self.config.window(layer);
        if let Some(&(_, mask)) = self.masks.iter().find(|(w, _)| *w == window) {
            return Ok(mask);
        }
        let mask = self.attention_mask(window)?;
        self.masks.push((window, mask));
        Ok(mask)
    }

    /// The attention mask of the blocks with `window`: `[batch, seq_q, seq_k]` predicate,
    /// true where query `i` may attend key `j` (`j <= i`, `i - j < window` when windowed, and
    /// key `j` is a real token). Padding is contiguous at either end of a row, so index
    /// distances are position distances, as in Hugging Face's mask. In a row of isolated
    /// documents ([`crate::ForwardSpec::isolated`]), also only where `j`'s position is `i - j`
    /// before `i`'s: the same document.
    pub fn attention_mask(&mut self, window: Option<usize>) -> Result<Value, ModelError> {
        let (bsz, s) = (self.spec.batch, self.spec.seq);
        let b = &mut self.b;
        let qi = b.iota(TensorType::new(DType::I32, &[s, s]), 0)?;
        let ki = b.iota(TensorType::new(DType::I32, &[s, s]), 1)?;
        let mut causal = b.compare(CompareDir::Ge, qi, ki)?;
        if let Some(w) = window.filter(|&w| w < s) {
            // j > i - w, i.e. j + w > i.
            let w = b.splat(w as f64, TensorType::new(DType::I32, &[s, s]))?;
            let reach = b.add(ki, w)?;
            let recent = b.compare(CompareDir::Gt, reach, qi)?;
            causal = b.and(causal, recent)?;
        }
        let mut causal = b.broadcast_in_dim(causal, &[bsz, s, s], &[1, 2])?;
        if self.spec.isolated {
            let shape = [bsz, s, s];
            let pq = b.broadcast_in_dim(self.position_ids, &shape, &[0, 1])?;
            let pk = b.broadcast_in_dim(self.position_ids, &shape, &[0, 2])?;
            let apart = b.sub(pq, pk)?;
            let distance = b.sub(qi, ki)?;
            let distance = b.broadcast_in_dim(distance, &shape, &[1, 2])?;
            let same = b.compare(CompareDir::Eq, apart, distance)?;
            causal = b.and(causal, same)?;
        }
        let zero = b.splat(0.0, TensorType::new(DType::I32, &[bsz, s]))?;
        let real = b.compare(CompareDir::Ne, self.attention_mask, zero)?;
        let real = b.broadcast_in_dim(real, &[bsz, s, s], &[0, 2])?;
        Ok(b.and(causal, real)?)
    }

    /// Grouped-query attention of block `layer` (its heads). `q` is `[tokens, n_heads*head_dim]`
    /// (RoPE applied), `k` and `v` `[tokens, n_kv_heads*head_dim]`; query head `h` reads kv head
    /// `h / (n_heads/n_kv_heads)` (Hugging Face's `repeat_kv`). Returns `z`,
    /// `[tokens, n_heads*head_dim]` ready for `o_proj`, and the scores and probabilities in
    /// the internal `[batch, kv_head, query, group, key]` layout (see [`Graph::per_query`]).
    /// With `sinks` (`[n_heads]`, GPT-OSS), each head's softmax has one more logit, its sink,
    /// which takes probability and is then dropped: the pattern's rows sum to less than 1.
    pub fn attention(
        &mut self,
        layer: usize,
        q: Value,
        k: Value,
        v: Value,
        mask: Value,
        sinks: Option<Value>,
    ) -> Result<Attention, ModelError> {
        let c = self.config;
        let (bsz, s, nkv, hd) = (self.spec.batch, self.spec.seq, c.kv_heads_at(layer), c.head_dim_at(layer));
        let g = c.attention.n_heads / nkv;
        let dt = self.dt;
        let b = &mut self.b;
        // Values may be narrower than queries and keys (MLA's v_head_dim); keys are the
        // queries' tokens, or a decoding step's whole cache.
        let (sk, hv) = kv_widths(b, bsz, nkv, k, v)?;
        let q = b.reshape(q, &[bsz, s, nkv, g, hd])?;
        // A decoding step's caches are `[batch, kv, key, width]` as they come; the queries'
        // own keys and values `[batch, key, kv, width]`.
        let cached = b.dims(k)?.len() == 4;
        let (k, v) = match cached {
            true => (k, v),
            false => (b.reshape(k, &[bsz, sk, nkv, hd])?, b.reshape(v, &[bsz, sk, nkv, hv])?),
        };
        // scores[b, kv, i, g, j] = q[b, i, kv, g, :] · k[b, j, kv, :]
        let scores = match cached {
            true if self.spec.weight_first.is_some_and(|most| s * g <= most) => {
                // The cache first, as it lies (see `ForwardSpec::weight_first`).
                let q = b.transpose(q, &[0, 2, 1, 3, 4])?;
                let t = b.dot_general(k, q, &DotDims::batched(&[0, 1], &[0, 1], &[3], &[4]))?;
                let t = b.optimization_barrier(t)?;
                b.transpose(t, &[0, 1, 3, 4, 2])?
            }
            true => b.dot_general(q, k, &DotDims::batched(&[0, 2], &[0, 1], &[4], &[3]))?,
            false => b.dot_general(q, k, &DotDims::batched(&[0, 2], &[0, 2], &[4], &[3]))?,
        };
        let sdims = vec![bsz, nkv, s, g, sk];
        let scale = b.splat(c.attention.scalar.unwrap_or(hd as f64).powf(-0.5), TensorType::new(dt, &sdims))?;
        let mut scores = b.mul(scores, scale)?;
        if let Some(cap) = c.attention.softcap {
            // In the compute dtype, before the mask (Gemma 2).
            scores = soft_cap(b, scores, cap)?;
        }
        let scores = masked_f32(b, scores, mask, &[0, 2, 4])?;
        let probs = match sinks {
            None => softmax_last(b, scores)?,
            Some(sinks) => {
                // softmax over [scores, sink] with the sink's column dropped.
                let sinks = b.convert(sinks, DType::F32)?;
                let sinks = b.reshape(sinks, &[nkv, g])?;
                let col = [bsz, nkv, s, g, 1];
                let sinks = b.broadcast_in_dim(sinks, &col, &[1, 3])?;
                let all = b.concatenate(&[scores, sinks], 4)?;
                let probs = softmax_last(b, all)?;
                b.slice_dim(probs, 4, 0, sk)?
            }
        };
        let pattern = b.convert(probs, dt)?;
        // out[b, kv, i, g, :] = Σ_j probs[b, kv, i, g, j] · v[b, j, kv, :]
        let (heads, keys) = if cached { (1, 2) } else { (2, 1) };
        let out = b.dot_general(pattern, v, &DotDims::batched(&[0, 1], &[0, heads], &[4], &[keys]))?;
        let out = b.transpose(out, &[0, 2, 1, 3, 4])?;
        let z = b.reshape(out, &[bsz * s, c.attention.n_heads * hv])?;
        Ok(Attention { scores, pattern, z })
    }

    /// [`Graph::attention`] of block `layer`, recording its scores, pattern and z hooks;
    /// returns z, `[tokens, n_heads*head_dim]`.
    pub fn attend(&mut self, layer: usize, q: Value, k: Value, v: Value, mask: Value) -> Result<Value, ModelError> {
        self.attend_with_sinks(layer, q, k, v, mask, None)
    }

    /// [`Graph::attend`] with attention sinks ([`Graph::attention`]).
    pub fn attend_with_sinks(
        &mut self,
        layer: usize,
        q: Value,
        k: Value,
        v: Value,
        mask: Value,
        sinks: Option<Value>,
    ) -> Result<Value, ModelError> {
        let at = |kind| HookPoint::block(layer, kind);
        // A decoding step attends its cache, this step's keys and values written into it.
        let (k, v, mask) = match self.cache.is_some() {
            true => self.cached(layer, k, v)?,
            false => (k, v, mask),
        };
        let (_, hv) = kv_widths(&self.b, self.spec.batch, self.config.kv_heads_at(layer), k, v)?;
        // The mask cuDNN applies is the block's own causal (and window) mask with padding.
        let window = self.config.window(layer);
        let causal = !self.spec.isolated && self.masks.iter().any(|&(w, m)| w == window && m == mask);
        let form = self.attention_form(layer, hv, sinks.is_some(), causal);
        let cudnn = form == crate::forward::AttentionForm::Cudnn;
        self.attention_forms.push((layer, form));
        if cudnn {
            let z = self.cudnn_attention(layer, q, k, v)?;
            self.hook(at(HookKind::AttnZ), z);
            return Ok(z);
        }
        let Attention { scores, pattern, z } = self.attention(layer, q, k, v, mask, sinks)?;
        if self.wants(at(HookKind::AttnScores)) {
            let rows = self.per_query(scores)?;
            let rows = self.finite_in_output(rows)?;
            self.hook(at(HookKind::AttnScores), rows);
        }
        if self.wants(at(HookKind::AttnPattern)) {
            let rows = self.per_query(pattern)?;
            self.hook(at(HookKind::AttnPattern), rows);
        }
        self.hook(at(HookKind::AttnZ), z);
        Ok(z)
    }

    /// Masked scores (the most negative f32) as the lowest finite value of the output dtype,
    /// what Hugging Face's mask (`finfo(dtype).min`) gives in that dtype; converted as they
    /// are they would round to -inf in bf16 and f16.
    pub fn finite_in_output(&mut self, x: Value) -> Result<Value, ModelError> {
        let lowest = match self.spec.output_dtype {
            DType::BF16 => -3.389_531_389_251_535_5e38,
            DType::F16 => -65504.0,
            _ => return Ok(x),
        };
        let dims = self.b.dims(x)?.to_vec();
        let floor = self.b.splat(lowest, TensorType::new(DType::F32, &dims))?;
        Ok(self.b.max(x, floor)?)
    }

    /// Scores or pattern from [`Graph::attention`]'s `[batch, kv_head, query, group, key]`
    /// layout to one row per query token, `[tokens, n_heads, key]` (head `kv*group + g`).
    pub fn per_query(&mut self, x: Value) -> Result<Value, ModelError> {
        let (t, s, h) = (self.tokens(), self.spec.seq, self.config.attention.n_heads);
        let x = self.b.transpose(x, &[0, 2, 1, 3, 4])?;
        Ok(self.b.reshape(x, &[t, h, s])?)
    }
}

/// The keys' positions a row and the values' width a head, of keys and values as the
/// queries' tokens (`[tokens, heads·width]`) or a decoding step's caches (`[batch, heads,
/// positions, width]`).
fn kv_widths(b: &Builder, bsz: usize, heads: usize, k: Value, v: Value) -> Result<(usize, usize), ModelError> {
    let (kd, vd) = (b.dims(k)?, b.dims(v)?);
    Ok(match kd.len() {
        4 => (kd[2], vd[3]),
        _ => (kd[0] / bsz, vd[1] / heads),
    })
}

/// `cap · tanh(x / cap)` in `x`'s dtype, as transformers soft-caps attention scores and final
/// logits (Gemma 2/3/4).
pub(crate) fn soft_cap(b: &mut Builder, x: Value, cap: f64) -> Result<Value, siphon_hlo::HloError> {
    let ty = b.ty(x)?.clone();
    let cap = b.splat(cap, ty)?;
    let t = b.div(x, cap)?;
    let t = b.tanh(t)?;
    b.mul(t, cap)
}

/// `scores` in f32, the most negative f32 where `mask` (`[batch, query, key]`, its dimensions
/// at `mask_dims` of the scores') is false: what softmax attention takes its softmax of.
pub(crate) fn masked_f32(
    b: &mut Builder,
    scores: Value,
    mask: Value,
    mask_dims: &[usize],
) -> Result<Value, ModelError> {
    let dims = b.dims(scores)?.to_vec();
    let scores = b.convert(scores, DType::F32)?;
    let mask = b.broadcast_in_dim(mask, &dims, mask_dims)?;
    let floor = b.splat(f32::MIN as f64, TensorType::new(DType::F32, &dims))?;
    Ok(b.select(mask, scores, floor)?)
}

/// Softmax over the last dimension of an f32 tensor, max-subtracted.
pub(crate) fn softmax_last(b: &mut Builder, x: Value) -> Result<Value, ModelError> {
    let dims = b.dims(x)?.to_vec();
    let last = dims.len() - 1;
    let keep: Vec<usize> = (0..last).collect();
    let m = b.reduce_max(x, &[last])?;
    let m = b.broadcast_in_dim(m, &dims, &keep)?;
    let shifted = b.sub(x, m)?;
    let e = b.exp(shifted)?;
    let sum = b.reduce_sum(e, &[last])?;
    let sum = b.broadcast_in_dim(sum, &dims, &keep)?;
    Ok(b.div(e, sum)?)
}

/// `o_proj(attention(rope(q), rope(k), v))` of block `layer` on normed input `n`
/// `[tokens, hidden]`, recording the attention hooks on the way.
pub(crate) fn self_attention(
    g: &mut Graph<'_>,
    n: Value,
    layer: usize,
    qk_gain: Gain,
    cos: Value,
    sin: Value,
    mask: Value,
) -> Result<Value, ModelError> {
    use HookKind::*;
    let at = |kind| HookPoint::block(layer, kind);
    let c = g.config;
    let t = g.tokens();
    let p = format!("model.layers.{layer}.self_attn");
    let proj = |name: &str| (format!("{p}.{name}.weight"), format!("{p}.{name}.bias"));
    let mut qkv = Vec::with_capacity(3);
    for name in ["q_proj", "k_proj", "v_proj"] {
        let (w, b) = proj(name);
        let b = c.attention.qkv_bias.then_some(b.as_str());
        qkv.push(g.linear(n, &w, b)?);
    }
    g.hook(at(AttnQ), qkv[0]);
    g.hook(at(AttnK), qkv[1]);
    g.hook(at(AttnV), qkv[2]);
    let (mut q, mut k) = (qkv[0], qkv[1]);
    let q_hooks = [AttnQNormScale, AttnQNormNormalized, AttnQNormed].map(at);
    let k_hooks = [AttnKNormScale, AttnKNormNormalized, AttnKNormed].map(at);
    if c.attention.qk_norm && c.attention.qk_norm_whole {
        // OLMo 2: one norm over the whole projection.
        for (x, name, hooks) in [(&mut q, "q_norm", q_hooks), (&mut k, "k_norm", k_hooks)] {
            let norm = g.rms_norm_with(*x, &format!("{p}.{name}.weight"), qk_gain)?;
            g.hook_norm(&norm, hooks[0], hooks[1], hooks[2])?;
            *x = norm.out;
        }
    }
    let (head_dim, kv_heads) = (c.head_dim_at(layer), c.kv_heads_at(layer));
    let mut q = g.b.reshape(q, &[t, c.attention.n_heads, head_dim])?;
    let mut k = g.b.reshape(k, &[t, kv_heads, head_dim])?;
    if c.attention.qk_norm && !c.attention.qk_norm_whole {
        q = head_norm(g, q, &format!("{p}.q_norm.weight"), qk_gain, q_hooks)?;
        k = head_norm(g, k, &format!("{p}.k_norm.weight"), qk_gain, k_hooks)?;
    }
    let (q, k) = if c.rotates(layer) { (g.apply_rope(q, cos, sin)?, g.apply_rope(k, cos, sin)?) } else { (q, k) };
    g.hook(at(AttnRotQ), q);
    g.hook(at(AttnRotK), k);
    let q = g.b.reshape(q, &[t, c.attention.n_heads * head_dim])?;
    let k = g.b.reshape(k, &[t, kv_heads * head_dim])?;
    let z = g.attend(layer, q, k, qkv[2], mask)?;
    g.linear(z, &format!("{p}.o_proj.weight"), None)
}
