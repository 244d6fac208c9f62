//! Gated DeltaNet, the linear attention of the hybrid decoders (Qwen3.5, Qwen3-Next): on the
//! layers `layer_types` marks `linear_attention`, in place of softmax attention.
//!
//! ```text
//! x = x * attention_mask                          # padding zeroed: it never reaches the state
//! q, k, v = proj(x)                               # linear_attn.hook_{q,k,v}_pre_conv
//! q, k, v = silu(causal_conv1d(q, k, v))          # linear_attn.hook_{q,k,v} (depthwise, width K)
//! z = in_proj_z(x); b = in_proj_b(x); a = in_proj_a(x)   # hook_gate_input, hook_beta_logit
//! beta = sigmoid(b)                               # hook_beta
//! g = -exp(A_log) * softplus(a + dt_bias)         # hook_log_decay (f32)
//! q, k = l2norm(q), l2norm(k); q *= dk^-0.5       # each value head reads key head h / (nv/nk)
//! S_t = exp(g_t) S_{t-1};  S_t += k_t ⊗ beta_t (v_t - S_tᵀ k_t);  o_t = S_tᵀ q_t
//!                                                 # hook_recurrence_out
//! y = out_proj(rmsnorm(o) * w * silu(z))          # linear_attn.hook_out
//! ```
//!
//! The recurrence is computed as transformers' `torch_chunk_gated_delta_rule` computes it, in
//! f32: the sequence padded to whole chunks of 64, within each chunk the pairwise decays and
//! the UT transform (a unit lower-triangular solve), then one step per chunk carrying the
//! `[dk, dv]` state of every head (a `while` loop on the device). Any sequence length works;
//! padding before a row's first token is zeroed at the layer's input, so the state is still 0
//! when the first real token arrives and the real tokens get the values of an unpadded row
//! (padding after the last real token cannot reach them).
//!
//! Isolated documents in a row (`ForwardSpec::isolated`): each token's document is counted
//! from the position ids (a document starts at position 0); a convolution tap reads zeros
//! across a document's start, within a chunk the pairwise decays (and so the UT transform and
//! the chunk's own attention) pair tokens of one document only, a chunk's tokens read the state
//! only where their document began before the chunk, and it passes on only its last
//! document's — so each document's recurrence starts from zeros, exactly as alone.
//!
//! A decoding step (`crate::decode`) carries each row's state between steps: the recurrence
//! starts from the row's `[nv, dk, dv]` state and the convolutions from its last `K - 1`
//! inputs (zeros where a row starts a sequence), padding tokens change neither (their decay
//! and beta are zeroed), and the step's chunks are no longer than its rows, so a one-token
//! step is one step of the recurrence, as transformers' `torch_recurrent_gated_delta_rule`.
//!
//! Weights: the projections as the program takes them, one per part (`…[q]`, `…[k]`, `…[v]`,
//! `…[z]`, `…[b]`, `…[a]`), cut on read from Qwen3.5's `in_proj_qkv` / `in_proj_z` /
//! `in_proj_b` / `in_proj_a` or from Qwen3-Next's `in_proj_qkvz` / `in_proj_ba`, whose rows
//! are grouped by key head (`[q, k, v, z]` and `[b, a]` of each); `conv1d.weight`
//! `[channels, 1, K]` (channels `q | k | v`), `A_log` and `dt_bias` `[nv]`, `norm.weight`
//! `[dv]`, `out_proj.weight` `[hidden, nv·dv]`. Heads split over `model` where it divides
//! them.
//!
//! Memory per layer, beyond the projections: the chunk tensors (q, k, v and their decayed and
//! beta-scaled forms, the solve's right-hand side and result, three `[64, 64]` matrices per
//! chunk), at most `B·nv·S′·(8·dk + 6·dv + 3·64)` f32 with `S′` the padded length, and the
//! state, `B·nv·dk·dv` f32 (the planner's `memory.rs` counts these). Compute grows linearly
//! with the length: per chunk, `O(64²·(dk + dv))` per head, and the solve.

use siphon_hlo::{CompareDir, DType, DotDims, TensorType, Value};

use crate::arch::Gain;
pub use crate::config::LinearAttention;
use crate::config::{ModelConfig, ParamClass, ParamInfo, Slice};
use crate::error::ModelError;
use crate::forward::Graph;
use crate::hooks::{HookKind, HookPoint};

/// Tokens per chunk of the chunked recurrence (transformers' `chunk_size`).
pub const CHUNK: usize = 64;

impl LinearAttention {
    /// The program's name of projection part `part` (`q`, `k`, `v`, `z`, `b` or `a`) of block
    /// `layer`.
    fn proj(&self, layer: usize, part: &str) -> String {
        let stored = match (self.fused, part) {
            (false, "q" | "k" | "v") => "in_proj_qkv",
            (false, "z") => "in_proj_z",
            (false, "b") => "in_proj_b",
            (false, _) => "in_proj_a",
            (true, "q" | "k" | "v" | "z") => "in_proj_qkvz",
            (true, _) => "in_proj_ba",
        };
        format!("model.layers.{layer}.linear_attn.{stored}.weight[{part}]")
    }
}

/// Block `layer`'s linear-attention weights (see the module docs), for a hidden size `h`.
pub(crate) fn params(la: &LinearAttention, h: usize, layer: usize) -> Vec<ParamInfo> {
    use ParamClass::*;
    let (nk, nv, dk, dv) = (la.n_key_heads, la.n_value_heads, la.key_head_dim, la.value_head_dim);
    let (kd, vd, r) = (la.key_dim(), la.value_dim(), nv / nk);
    let p = |name: &str| format!("model.layers.{layer}.linear_attn.{name}");
    // (part, rows, class, stored tensor, its rows, row groups, start within a group)
    let parts: [(&str, usize, ParamClass, &str, usize, usize, usize); 6] = if la.fused {
        let group = 2 * dk + 2 * r * dv;
        [
            ("q", kd, LinearKeys, "in_proj_qkvz", nk * group, nk, 0),
            ("k", kd, LinearKeys, "in_proj_qkvz", nk * group, nk, dk),
            ("v", vd, LinearValues, "in_proj_qkvz", nk * group, nk, 2 * dk),
            ("z", vd, LinearValues, "in_proj_qkvz", nk * group, nk, 2 * dk + r * dv),
            ("b", nv, LinearValues, "in_proj_ba", 2 * nv, nk, 0),
            ("a", nv, LinearValues, "in_proj_ba", 2 * nv, nk, r),
        ]
    } else {
        [
            ("q", kd, LinearKeys, "in_proj_qkv", 2 * kd + vd, 1, 0),
            ("k", kd, LinearKeys, "in_proj_qkv", 2 * kd + vd, 1, kd),
            ("v", vd, LinearValues, "in_proj_qkv", 2 * kd + vd, 1, 2 * kd),
            ("z", vd, LinearValues, "in_proj_z", vd, 1, 0),
            ("b", nv, LinearValues, "in_proj_b", nv, 1, 0),
            ("a", nv, LinearValues, "in_proj_a", nv, 1, 0),
        ]
    };
    let mut out: Vec<ParamInfo> = parts
        .into_iter()
        .map(|(part, rows, class, stored, stored_rows, groups, start)| {
            let slice = Slice {
                tensor: p(&format!("{stored}.weight")),
                stored: vec![stored_rows, h],
                transposed: false,
                groups,
                start,
                len: rows / groups,
            };
            ParamInfo::part(la.proj(layer, part), &[rows, h], class, Some(layer), slice)
        })
        .collect();
    out.push(ParamInfo::new(p("conv1d.weight"), &[2 * kd + vd, 1, la.conv_kernel], LinearConv, Some(layer)));
    out.push(ParamInfo::new(p("A_log"), &[nv], LinearHeads, Some(layer)));
    out.push(ParamInfo::new(p("dt_bias"), &[nv], LinearHeads, Some(layer)));
    out.push(ParamInfo::new(p("norm.weight"), &[dv], Norm, Some(layer)));
    out.push(ParamInfo::new(p("out_proj.weight"), &[h, vd], LinearOut, Some(layer)));
    out
}

impl Graph<'_> {
    /// Block `layer`'s Gated DeltaNet on its normed input `x` `[tokens, hidden]`, recording
    /// the `linear_attn.*` hooks; returns `out_proj`'s output (see the module docs).
    pub fn gated_deltanet(&mut self, x: Value, layer: usize) -> Result<Value, ModelError> {
        use HookKind::*;
        let decoding = self.cache.is_some();
        // Isolated documents: each token's document within its row, so that neither the
        // convolution nor the recurrence reads across a document's start.
        let segments = match self.spec.isolated {
            true => Some(self.document_segments()?),
            false => None,
        };
        let la = self
            .config
            .linear_attention
            .clone()
            .ok_or_else(|| ModelError::Config("gated_deltanet on a model without linear attention".into()))?;
        let at = |kind| HookPoint::block(layer, kind);
        let (t, h, dt) = (self.tokens(), self.config.hidden_size, self.dt);
        let p = |name: &str| format!("model.layers.{layer}.linear_attn.{name}");
        // Padding zeroed, as transformers' apply_mask_to_padding_states.
        let mask = self.b.reshape(self.attention_mask, &[t])?;
        let mask = self.b.convert(mask, dt)?;
        let mask = self.b.broadcast_in_dim(mask, &[t, h], &[0])?;
        let x = self.b.mul(x, mask)?;
        let [q, k, v, z, beta_logit, a] =
            ["q", "k", "v", "z", "b", "a"].map(|part| self.linear(x, &la.proj(layer, part), None));
        let (q, k, v, z, beta_logit, a) = (q?, k?, v?, z?, beta_logit?, a?);
        self.hook(at(LinQPreConv), q);
        self.hook(at(LinKPreConv), k);
        self.hook(at(LinVPreConv), v);
        // The convolution's channels are q | k | v.
        let conv = self.w(&p("conv1d.weight"))?;
        let (kd, vd) = (la.key_dim(), la.value_dim());
        let conv = self.b.reshape(conv, &[2 * kd + vd, la.conv_kernel])?;
        let mut convolved = Vec::with_capacity(3);
        let (nk, nv) = (la.n_key_heads, la.n_value_heads);
        for (y, start, width, part, heads) in [(q, 0, kd, "q", nk), (k, kd, kd, "k", nk), (v, 2 * kd, vd, "v", nv)] {
            let w = self.b.slice_dim(conv, 0, start, start + width)?;
            // A decoding step's row continues from its last K - 1 inputs.
            let kept = la.conv_kernel - 1;
            let cached = match decoding && kept > 0 {
                true => {
                    let spec = self.state_spec(3, 2, heads);
                    let arg = self.cache_arg(&[self.spec.batch, kept, width], dt, &spec)?;
                    Some((arg, self.state_or_fresh(arg)?, spec))
                }
                false => None,
            };
            let (out, inputs) = self.causal_conv_silu(y, w, cached.as_ref().map(|c| c.1), segments)?;
            if let Some((arg, _, spec)) = cached {
                let after = self.last_inputs(inputs, kept)?;
                self.keep_cache(format!("blocks.{layer}.conv_{part}"), arg, after, spec);
            }
            convolved.push(out);
        }
        let [q, k, v] = [convolved[0], convolved[1], convolved[2]];
        self.hook(at(LinQ), q);
        self.hook(at(LinK), k);
        self.hook(at(LinV), v);
        self.hook(at(LinGateInput), z);
        self.hook(at(LinBetaLogit), beta_logit);
        let beta = self.b.logistic(beta_logit)?;
        self.hook(at(LinBeta), beta);
        let decay = self.log_decay(a, &p("A_log"), &p("dt_bias"))?;
        self.hook(at(LinLogDecay), decay);
        let core = match decoding {
            false => self.chunked_delta_rule(&la, q, k, v, beta, decay, None, segments)?.0,
            true => self.cached_delta_rule(&la, layer, q, k, v, beta, decay)?,
        };
        self.hook(at(LinRecurrenceOut), core);
        // rmsnorm(o) · w over each value head, times silu(z) in f32.
        let dv = la.value_head_dim;
        let rows = self.b.reshape(core, &[t * nv, dv])?;
        let normed = self.rms_norm_with(rows, &p("norm.weight"), Gain::Plain)?.out;
        let b = &mut self.b;
        let normed = b.convert(normed, DType::F32)?;
        let zf = b.reshape(z, &[t * nv, dv])?;
        let zf = b.convert(zf, DType::F32)?;
        let sig = b.logistic(zf)?;
        let silu = b.mul(zf, sig)?;
        let gated = b.mul(normed, silu)?;
        let gated = b.convert(gated, dt)?;
        let gated = b.reshape(gated, &[t, vd])?;
        let out = self.linear(gated, &p("out_proj.weight"), None)?;
        self.hook(at(LinOut), out);
        Ok(out)
    }

    /// Each token's document within its row, `[batch, seq]` f32: how many documents start at
    /// or before it (a document starts where its position id is 0: isolated documents).
    fn document_segments(&mut self) -> Result<Value, ModelError> {
        let (bsz, s) = (self.spec.batch, self.spec.seq);
        let b = &mut self.b;
        let zeros = b.splat(0.0, TensorType::new(DType::I32, &[bsz, s]))?;
        let starts = b.compare(CompareDir::Eq, self.position_ids, zeros)?;
        let (one, none) = (
            b.splat(1.0, TensorType::new(DType::F32, &[bsz, s]))?,
            b.splat(0.0, TensorType::new(DType::F32, &[bsz, s]))?,
        );
        let starts = b.select(starts, one, none)?;
        // Σ_{j ≤ i} starts[j]: a product with the lower triangle, built on the device.
        let square = TensorType::new(DType::I32, &[s, s]);
        let (ii, jj) = (b.iota(square.clone(), 0)?, b.iota(square, 1)?);
        let lower = b.compare(CompareDir::Le, jj, ii)?;
        let (one, none) =
            (b.splat(1.0, TensorType::new(DType::F32, &[s, s]))?, b.splat(0.0, TensorType::new(DType::F32, &[s, s]))?);
        let lower = b.select(lower, one, none)?;
        Ok(b.dot_general(starts, lower, &DotDims::contract(&[1], &[1]))?)
    }

    /// `silu(causal_conv1d(y))` of `y` `[tokens, channels]` with the depthwise weights `w`
    /// `[channels, K]`: each channel's output at position `t` is `Σ_j w[j] · y[t - K + 1 + j]`
    /// within its row (before the row's start: `before` `[batch, K - 1, channels]`, a decoding
    /// step's last inputs, else zeros) and, given `segments` ([`Graph::document_segments`]),
    /// within its document (inputs of another read as zeros), in f32, cast back, then SiLU.
    /// Also returns the inputs the sum read, `[batch, K - 1 + seq, channels]` f32.
    fn causal_conv_silu(
        &mut self,
        y: Value,
        w: Value,
        before: Option<Value>,
        segments: Option<Value>,
    ) -> Result<(Value, Value), ModelError> {
        let (bsz, s, dt) = (self.spec.batch, self.spec.seq, self.dt);
        let b = &mut self.b;
        let channels = b.dims(y)?[1];
        let kernel = b.dims(w)?[1];
        let y = b.reshape(y, &[bsz, s, channels])?;
        let y = b.convert(y, DType::F32)?;
        let w = b.convert(w, DType::F32)?;
        let before = match before {
            Some(before) => b.convert(before, DType::F32)?,
            None => b.splat(0.0, TensorType::new(DType::F32, &[bsz, kernel - 1, channels]))?,
        };
        let padded = b.concatenate(&[before, y], 1)?;
        // Each input's document, the K - 1 before the row none's (-1).
        let documents = match segments {
            Some(seg) => {
                let none = b.splat(-1.0, TensorType::new(DType::F32, &[bsz, kernel - 1]))?;
                Some((seg, b.concatenate(&[none, seg], 1)?))
            }
            None => None,
        };
        let mut acc: Option<Value> = None;
        for j in 0..kernel {
            let mut window = b.slice_dim(padded, 1, j, j + s)?;
            if let Some((seg, padded_seg)) = documents.filter(|_| j + 1 < kernel) {
                let read = b.slice_dim(padded_seg, 1, j, j + s)?;
                let same = b.compare(CompareDir::Eq, read, seg)?;
                let same = b.broadcast_in_dim(same, &[bsz, s, channels], &[0, 1])?;
                let zeros = b.splat(0.0, TensorType::new(DType::F32, &[bsz, s, channels]))?;
                window = b.select(same, window, zeros)?;
            }
            let wj = b.slice_dim(w, 1, j, j + 1)?;
            let wj = b.reshape(wj, &[channels])?;
            let wj = b.broadcast_in_dim(wj, &[bsz, s, channels], &[2])?;
            let term = b.mul(window, wj)?;
            acc = Some(match acc {
                None => term,
                Some(sum) => b.add(sum, term)?,
            });
        }
        let out = b.convert(acc.expect("a kernel of at least one"), dt)?;
        let out = b.reshape(out, &[bsz * s, channels])?;
        let sig = b.logistic(out)?;
        Ok((b.mul(out, sig)?, padded))
    }

    /// The last `kept` inputs of each row's convolution up to its last real token (its real
    /// tokens come first), from `inputs` `[batch, K - 1 + seq, channels]` f32 (the `K - 1`
    /// before the row, then the step's): `[batch, kept, channels]` in the compute dtype.
    fn last_inputs(&mut self, inputs: Value, kept: usize) -> Result<Value, ModelError> {
        let bsz = self.spec.batch;
        let b = &mut self.b;
        let real = b.reduce_sum(self.attention_mask, &[1])?;
        let shape = [bsz, kept, 1];
        let from = b.broadcast_in_dim(real, &shape, &[0])?;
        let offset = b.iota(TensorType::new(DType::I32, &shape), 1)?;
        let index = b.add(from, offset)?;
        let last = b.take_along(inputs, 0, &[1], index)?;
        Ok(b.convert(last, self.dt)?)
    }

    /// `-exp(A_log) · softplus(a + dt_bias)` in f32, `[tokens, nv]` (PyTorch's softplus: `x`
    /// itself above 20).
    fn log_decay(&mut self, a: Value, a_log: &str, dt_bias: &str) -> Result<Value, ModelError> {
        let (a_log, dt_bias) = (self.w(a_log)?, self.w(dt_bias)?);
        let b = &mut self.b;
        let dims = b.dims(a)?.to_vec();
        let f32t = TensorType::new(DType::F32, &dims);
        let a = b.convert(a, DType::F32)?;
        let dt_bias = b.convert(dt_bias, DType::F32)?;
        let dt_bias = b.broadcast_in_dim(dt_bias, &dims, &[1])?;
        let x = b.add(a, dt_bias)?;
        let e = b.exp(x)?;
        let soft = b.log_plus_one(e)?;
        let threshold = b.splat(20.0, f32t.clone())?;
        let above = b.compare(CompareDir::Gt, x, threshold)?;
        let soft = b.select(above, x, soft)?;
        let rate = b.convert(a_log, DType::F32)?;
        let rate = b.exp(rate)?;
        let rate = b.neg(rate)?;
        let rate = b.broadcast_in_dim(rate, &dims, &[1])?;
        Ok(b.mul(rate, soft)?)
    }

    /// A decoding step's gated delta rule: each row from its state (zeros where it starts a
    /// sequence), padding tokens leaving the state as it was (no decay, no write: `decay` and
    /// `beta` zeroed there), in chunks no longer than the row; the state after the row's last
    /// real token kept as the cache `blocks.{layer}.state`.
    #[allow(clippy::too_many_arguments)]
    fn cached_delta_rule(
        &mut self,
        la: &LinearAttention,
        layer: usize,
        q: Value,
        k: Value,
        v: Value,
        beta: Value,
        decay: Value,
    ) -> Result<Value, ModelError> {
        let (t, nv) = (self.tokens(), la.n_value_heads);
        let spec = self.state_spec(4, 1, nv);
        let dims = [self.spec.batch, nv, la.key_head_dim, la.value_head_dim];
        let arg = self.cache_arg(&dims, DType::F32, &spec)?;
        let state = self.state_or_fresh(arg)?;
        let b = &mut self.b;
        let real = b.reshape(self.attention_mask, &[t])?;
        let zero = b.splat(0.0, TensorType::new(DType::I32, &[t]))?;
        let real = b.compare(CompareDir::Ne, real, zero)?;
        let real = b.broadcast_in_dim(real, &[t, nv], &[0])?;
        let mut masked = [beta, decay];
        for x in &mut masked {
            let zeros = b.splat(0.0, TensorType::new(b.dtype(*x)?, &[t, nv]))?;
            *x = b.select(real, *x, zeros)?;
        }
        let (out, after) = self.chunked_delta_rule(la, q, k, v, masked[0], masked[1], Some(state), None)?;
        let after = after.expect("a state after the rows from a state before them");
        self.keep_cache(format!("blocks.{layer}.state"), arg, after, spec);
        Ok(out)
    }

    /// The gated delta rule over each row (see the module docs): `q`, `k` `[tokens, nk·dk]`,
    /// `v` `[tokens, nv·dv]`, `beta` `[tokens, nv]` in the compute dtype, `decay` `[tokens, nv]`
    /// f32, from the state `initial` `[batch, nv, dk, dv]` f32 (zeros when none); returns
    /// `[tokens, nv·dv]` in the compute dtype and, given `initial`, the state after the rows. A
    /// decoding step's chunks are no longer than its rows (a one-token step is one
    /// recurrence step, as transformers decodes). Given `segments` ([`Graph::document_segments`]),
    /// each document's recurrence starts from zeros at its first token: within a chunk, tokens
    /// read and solve against their own document's only; a chunk reads the state only for the
    /// tokens of the document it carries on, and passes on only its last document's.
    #[allow(clippy::too_many_arguments)]
    fn chunked_delta_rule(
        &mut self,
        la: &LinearAttention,
        q: Value,
        k: Value,
        v: Value,
        beta: Value,
        decay: Value,
        initial: Option<Value>,
        segments: Option<Value>,
    ) -> Result<(Value, Option<Value>), ModelError> {
        let (bsz, s, dt) = (self.spec.batch, self.spec.seq, self.dt);
        let (nk, nv, dk, dv) = (la.n_key_heads, la.n_value_heads, la.key_head_dim, la.value_head_dim);
        let c = match self.cache.is_some() {
            true => CHUNK.min(s),
            false => CHUNK,
        };
        let n = s.div_ceil(c);
        let (bh, groups) = (bsz * nv, n * bsz * nv);
        let b = &mut self.b;
        let f32t = |dims: &[usize]| TensorType::new(DType::F32, dims);
        // q, k: l2-normalised in f32 (q also scaled by dk^-0.5), each key head repeated for its
        // nv / nk value heads.
        let mut heads = Vec::with_capacity(2);
        for (x, scale) in [(q, Some((dk as f64).powf(-0.5))), (k, None)] {
            let x = b.reshape(x, &[bsz, s, nk, dk])?;
            let x = b.convert(x, DType::F32)?;
            let sq = b.mul(x, x)?;
            let sum = b.reduce_sum(sq, &[3])?;
            let eps = b.splat(1e-6, f32t(&[bsz, s, nk]))?;
            let inv = b.add(sum, eps)?;
            let inv = b.rsqrt(inv)?;
            let inv = b.broadcast_in_dim(inv, &[bsz, s, nk, dk], &[0, 1, 2])?;
            let mut x = b.mul(x, inv)?;
            if let Some(scale) = scale {
                let scale = b.splat(scale, f32t(&[bsz, s, nk, dk]))?;
                x = b.mul(x, scale)?;
            }
            let x = b.broadcast_in_dim(x, &[bsz, s, nk, nv / nk, dk], &[0, 1, 2, 4])?;
            heads.push(b.reshape(x, &[bsz, s, nv, dk])?);
        }
        let v = b.reshape(v, &[bsz, s, nv, dv])?;
        let v = b.convert(v, DType::F32)?;
        let beta = b.reshape(beta, &[bsz, s, nv, 1])?;
        let beta = b.convert(beta, DType::F32)?;
        let decay = b.reshape(decay, &[bsz, s, nv, 1])?;
        // Isolated documents: each token's document, and that of the token before it, per
        // value head `[B, S, nv, 1]`; chunked below to `[groups, c]` (a chunk's tail past the
        // row: document 0, no document's).
        let documents = match segments {
            Some(seg) => {
                let none = b.splat(-1.0, f32t(&[bsz, 1]))?;
                let shifted = b.slice_dim(seg, 1, 0, s - 1)?;
                let shifted = b.concatenate(&[none, shifted], 1)?;
                let seg = b.broadcast_in_dim(seg, &[bsz, s, nv, 1], &[0, 1])?;
                Some((seg, b.broadcast_in_dim(shifted, &[bsz, s, nv, 1], &[0, 1])?))
            }
            None => None,
        };
        // [B, S, nv, d] -> [N·B·nv, C, d]: padded to whole chunks, chunk-major.
        let mut chunked = |x: Value, d: usize| -> Result<Value, ModelError> {
            let x = b.transpose(x, &[1, 0, 2, 3])?;
            let x = if n * c > s {
                let zeros = b.splat(0.0, f32t(&[n * c - s, bsz, nv, d]))?;
                b.concatenate(&[x, zeros], 0)?
            } else {
                x
            };
            let x = b.reshape(x, &[n, c, bh, d])?;
            let x = b.transpose(x, &[0, 2, 1, 3])?;
            Ok(b.reshape(x, &[groups, c, d])?)
        };
        let (q, k, v) = (chunked(heads[0], dk)?, chunked(heads[1], dk)?, chunked(v, dv)?);
        let beta = chunked(beta, 1)?;
        let decay = chunked(decay, 1)?;
        let documents = match documents {
            Some((seg, before)) => Some((chunked(seg, 1)?, chunked(before, 1)?)),
            None => None,
        };
        let beta = b.reshape(beta, &[groups, c])?;
        let decay = b.reshape(decay, &[groups, c])?;
        let documents = match documents {
            Some((seg, before)) => Some((b.reshape(seg, &[groups, c])?, b.reshape(before, &[groups, c])?)),
            None => None,
        };
        // cum[i] = Σ_{j ≤ i} decay[j] within each chunk.
        let lower: Vec<f32> = (0..c * c).map(|i| if i % c <= i / c { 1.0 } else { 0.0 }).collect();
        let lower = b.constant_f32(&lower, &[c, c])?;
        let cum = b.dot_general(decay, lower, &DotDims::contract(&[1], &[1]))?;
        // pairwise[i, j] = exp(cum[i] - cum[j]) for j ≤ i, else 0.
        let sq = [groups, c, c];
        let ci = b.broadcast_in_dim(cum, &sq, &[0, 1])?;
        let cj = b.broadcast_in_dim(cum, &sq, &[0, 2])?;
        let diff = b.sub(ci, cj)?;
        let ii = b.iota(TensorType::new(DType::I32, &sq), 1)?;
        let jj = b.iota(TensorType::new(DType::I32, &sq), 2)?;
        let upper = b.compare(CompareDir::Gt, jj, ii)?;
        let ninf = b.splat(f64::NEG_INFINITY, f32t(&sq))?;
        let mut diff = b.select(upper, ninf, diff)?;
        // Per document: token i reads token j of its own only.
        let mut carried = None;
        if let Some((seg, before)) = documents {
            let si = b.broadcast_in_dim(seg, &sq, &[0, 1])?;
            let sj = b.broadcast_in_dim(seg, &sq, &[0, 2])?;
            let same = b.compare(CompareDir::Eq, si, sj)?;
            diff = b.select(same, diff, ninf)?;
            // The tokens of the document the chunk carries on (that of the token before it).
            let first = b.slice_dim(before, 1, 0, 1)?;
            let first = b.broadcast_in_dim(first, &[groups, c], &[0, 1])?;
            let on = b.compare(CompareDir::Eq, seg, first)?;
            let last = b.slice_dim(seg, 1, c - 1, c)?;
            let last = b.broadcast_in_dim(last, &[groups, c], &[0, 1])?;
            let with_last = b.compare(CompareDir::Eq, seg, last)?;
            carried = Some((on, with_last));
        }
        let pairwise = b.exp(diff)?;
        let beta_k = b.broadcast_in_dim(beta, &[groups, c, dk], &[0, 1])?;
        let beta_v = b.broadcast_in_dim(beta, &[groups, c, dv], &[0, 1])?;
        let k_beta = b.mul(k, beta_k)?;
        let v_beta = b.mul(v, beta_v)?;
        let pair = DotDims::batched(&[0], &[0], &[2], &[2]);
        let ut = b.dot_general(k_beta, k, &pair)?;
        let ut = b.mul(ut, pairwise)?;
        let intra = b.dot_general(q, k, &pair)?;
        let intra = b.mul(intra, pairwise)?;
        let ecum = b.exp(cum)?;
        let ecum_k = b.broadcast_in_dim(ecum, &[groups, c, dk], &[0, 1])?;
        let mut decayed_k_beta = b.mul(k_beta, ecum_k)?;
        // Zeros where a token does not read the state (its document starts in the chunk).
        let only = |b: &mut siphon_hlo::Builder, x: Value, keep: Value, d: usize| -> Result<Value, ModelError> {
            let keep = b.broadcast_in_dim(keep, &[groups, c, d], &[0, 1])?;
            let zeros = b.splat(0.0, f32t(&[groups, c, d]))?;
            Ok(b.select(keep, x, zeros)?)
        };
        if let Some((on, _)) = carried {
            decayed_k_beta = only(b, decayed_k_beta, on, dk)?;
        }
        // The UT transform: (I + strictly_lower(ut))⁻¹ applied to v·beta and k·beta·exp(cum).
        let rhs = b.concatenate(&[v_beta, decayed_k_beta], 2)?;
        let solved = b.solve_unit_lower(ut, rhs)?;
        let new_values = b.slice_dim(solved, 2, 0, dv)?;
        let k_cumdecay = b.slice_dim(solved, 2, dv, dv + dk)?;
        let mut q_decayed = b.mul(q, ecum_k)?;
        let last = b.slice_dim(cum, 1, c - 1, c)?;
        let last_c = b.broadcast_in_dim(last, &[groups, c], &[0, 1])?;
        let to_end = b.sub(last_c, cum)?;
        let to_end = b.exp(to_end)?;
        let to_end = b.broadcast_in_dim(to_end, &[groups, c, dk], &[0, 1])?;
        let mut k_decayed = b.mul(k, to_end)?;
        let mut chunk_decay = b.exp(last)?;
        if let Some((on, with_last)) = carried {
            // The state passes on the chunk's last document only: its tokens' writes, and the
            // state itself where that document began before the chunk.
            q_decayed = only(b, q_decayed, on, dk)?;
            k_decayed = only(b, k_decayed, with_last, dk)?;
            let through = b.slice_dim(on, 1, c - 1, c)?;
            let zeros = b.splat(0.0, f32t(&[groups, 1]))?;
            chunk_decay = b.select(through, chunk_decay, zeros)?;
        }
        let by_chunk = |b: &mut siphon_hlo::Builder, x: Value, d: usize| b.reshape(x, &[n, bh, c, d]);
        let new_values = by_chunk(b, new_values, dv)?;
        let k_cumdecay = by_chunk(b, k_cumdecay, dk)?;
        let q_decayed = by_chunk(b, q_decayed, dk)?;
        let k_decayed = by_chunk(b, k_decayed, dk)?;
        let intra = by_chunk(b, intra, c)?;
        let chunk_decay = b.reshape(chunk_decay, &[n, bh, 1, 1])?;
        // One step per chunk: the state [bh, dk, dv] read by the chunk, then updated.
        let i0 = b.scalar(0.0, DType::I32)?;
        let state0 = match initial {
            Some(state) => b.reshape(state, &[bh, dk, dv])?,
            None => b.splat(0.0, f32t(&[bh, dk, dv]))?,
        };
        let out0 = b.splat(0.0, f32t(&[n, bh, c, dv]))?;
        let n_chunks = n as f64;
        let looped = b.while_loop(
            &[i0, state0, out0, new_values, k_cumdecay, q_decayed, k_decayed, intra, chunk_decay],
            |b, st| {
                let end = b.scalar(n_chunks, DType::I32)?;
                b.compare(CompareDir::Lt, st[0], end)
            },
            |b, st| {
                let (i, state, out) = (st[0], st[1], st[2]);
                let zero = b.scalar(0.0, DType::I32)?;
                // Chunk i of x [N, bh, rows, d], as [bh, rows, d].
                let mut take = |x: Value, rows: usize, d: usize| -> Result<Value, siphon_hlo::HloError> {
                    let x = b.dynamic_slice(x, &[i, zero, zero, zero], &[1, bh, rows, d])?;
                    b.reshape(x, &[bh, rows, d])
                };
                let (nv_i, kcd_i, qd_i) = (take(st[3], c, dv)?, take(st[4], c, dk)?, take(st[5], c, dk)?);
                let (kd_i, intra_i, cd_i) = (take(st[6], c, dk)?, take(st[7], c, c)?, take(st[8], 1, 1)?);
                let read = DotDims::batched(&[0], &[0], &[2], &[1]);
                let predicted = b.dot_general(kcd_i, state, &read)?;
                let v_new = b.sub(nv_i, predicted)?;
                let inter = b.dot_general(qd_i, state, &read)?;
                let within = b.dot_general(intra_i, v_new, &read)?;
                let o = b.add(inter, within)?;
                let cd_i = b.reshape(cd_i, &[bh])?;
                let cd_i = b.broadcast_in_dim(cd_i, &[bh, dk, dv], &[0])?;
                let kept = b.mul(state, cd_i)?;
                let written = b.dot_general(kd_i, v_new, &DotDims::batched(&[0], &[0], &[1], &[1]))?;
                let state = b.add(kept, written)?;
                let o = b.reshape(o, &[1, bh, c, dv])?;
                let out = b.dynamic_update_slice(out, o, &[i, zero, zero, zero])?;
                let one = b.scalar(1.0, DType::I32)?;
                let next = b.add(i, one)?;
                let mut st = st.to_vec();
                st[..3].copy_from_slice(&[next, state, out]);
                Ok(st)
            },
        )?;
        // [N, B·nv, C, dv] -> [tokens, nv·dv], the padding dropped.
        let out = b.transpose(looped[2], &[0, 2, 1, 3])?;
        let out = b.reshape(out, &[n * c, bsz, nv, dv])?;
        let out = b.slice_dim(out, 0, 0, s)?;
        let out = b.transpose(out, &[1, 0, 2, 3])?;
        let out = b.reshape(out, &[bsz * s, nv * dv])?;
        let out = b.convert(out, dt)?;
        let state = match initial {
            Some(_) => Some(b.reshape(looped[1], &[bsz, nv, dk, dv])?),
            None => None,
        };
        Ok((out, state))
    }
}

/// Whether `config`'s block `layer` is a linear-attention layer.
pub(crate) fn is_linear(config: &ModelConfig, layer: usize) -> bool {
    config.linear_attention.as_ref().is_some_and(|la| la.is_linear(layer))
}
