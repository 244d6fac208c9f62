//! Multi-head latent attention (MLA), the token mixer of DeepSeek-V2/V3 and Kimi K2, as
//! transformers' `DeepseekV3Attention` computes it:
//!
//! ```text
//! q      = q_b_proj(q_a_layernorm(q_a_proj(x)))      # or q_proj(x) without q-LoRA
//! q      = q per head: [q_pass (nope) | q_rot (rope)]
//! kv | k_rot = kv_a_proj_with_mqa(x)                  # the latent and one shared RoPE key
//! kv     = kv_b_proj(kv_a_layernorm(kv)) per head: [k_pass (nope) | v]
//! q_rot, k_rot = rope(q_rot), rope(k_rot)             # interleaved pairs or rotate-half
//! q, k   = [q_pass | q_rot], [k_pass | k_rot]         # k_rot shared by every head
//! z      = softmax(q·kᵀ · scale) · v                  # scale = (nope + rope)^-½ · mscale²
//! out    = o_proj(z)
//! ```
//!
//! The latent norms are RMSNorms with eps 1e-6 whatever the config says (transformers builds
//! them with the default). Interleaved RoPE (`rope_interleave`) rotates pairs `(x₀, x₁),
//! (x₂, x₃), …` and writes the halves out de-interleaved, which is rotate-half RoPE on the
//! dimensions permuted evens-first; siphon permutes and applies the shared RoPE.
//!
//! Hooks (TransformerLens's MLA bridge): the latents and their norms
//! (`attn.hook_q_latent`, `attn.hook_kv_latent`, `attn.q_a_proj.*`, `attn.kv_a_layernorm.*`),
//! the projections' outputs, `attn.hook_rot_q` / `hook_rot_k` on the RoPE parts (the key's
//! one head), and `attn.hook_q` / `hook_k` / `hook_v` as they enter attention (after RoPE).
//! On a mesh the heads split over `model` (`q_b_proj`, `kv_b_proj`, `o_proj`); the down
//! projections are replicated.
//!
//! A decoding step (`crate::decode`) caches each position's normed latent and rotated RoPE
//! key, whole on every device, and attends through `kv_b_proj`'s halves rather than expanding
//! every cached position's keys and values (`Graph::mla_cached`).

use siphon_hlo::{DotDims, TensorType, Value};

pub use crate::config::Mla;
use crate::config::{ModelConfig, ParamClass, ParamInfo};
use crate::error::ModelError;
use crate::forward::Graph;
use crate::hooks::{HookKind, HookPoint};
use crate::layers::attention::{masked_f32, softmax_last};

/// The latent norms' eps (transformers' `DeepseekV3RMSNorm` default).
const LATENT_EPS: f64 = 1e-6;

/// Block `layer`'s attention weights, in Hugging Face's names.
pub(crate) fn params(c: &ModelConfig, mla: &Mla, layer: usize) -> Vec<ParamInfo> {
    use ParamClass::*;
    let (h, heads) = (c.hidden_size, c.attention.n_heads);
    let p = |suffix: &str, shape: &[usize], class| {
        ParamInfo::new(format!("model.layers.{layer}.self_attn.{suffix}"), shape, class, Some(layer))
    };
    let q = heads * mla.qk_head_dim();
    let mut out = match mla.q_lora_rank {
        Some(r) => vec![
            p("q_a_proj.weight", &[r, h], Latent),
            p("q_a_layernorm.weight", &[r], Norm),
            p("q_b_proj.weight", &[q, r], AttnQ),
        ],
        None => vec![p("q_proj.weight", &[q, h], AttnQ)],
    };
    out.extend([
        p("kv_a_proj_with_mqa.weight", &[mla.kv_lora_rank + mla.rope, h], Latent),
        p("kv_a_layernorm.weight", &[mla.kv_lora_rank], Norm),
        // Split by heads like a key projection: each head's keys' no-RoPE part, then its values.
        p("kv_b_proj.weight", &[heads * (mla.nope + mla.v_head_dim), mla.kv_lora_rank], AttnK),
        p("o_proj.weight", &[h, heads * mla.v_head_dim], AttnO),
    ]);
    out
}

impl Graph<'_> {
    /// Latent attention of block `layer` on its normed input `x` `[tokens, hidden]`, recording
    /// its hooks; returns `o_proj`'s output.
    pub(crate) fn mla_attention(&mut self, x: Value, layer: usize) -> Result<Value, ModelError> {
        use HookKind::*;
        let mla = self.config.mla.ok_or_else(|| ModelError::Config("mla_attention without MLA sizes".into()))?;
        let at = |kind| HookPoint::block(layer, kind);
        let p = |name: &str| format!("model.layers.{layer}.self_attn.{name}");
        let (t, heads) = (self.tokens(), self.config.attention.n_heads);
        let (dn, dr, dv, kr) = (mla.nope, mla.rope, mla.v_head_dim, mla.kv_lora_rank);
        let q = match mla.q_lora_rank {
            Some(_) => {
                let qa = self.linear(x, &p("q_a_proj.weight"), None)?;
                self.hook(at(MlaQA), qa);
                let norm = self.rms_norm_eps(qa, &p("q_a_layernorm.weight"), LATENT_EPS)?;
                self.hook_norm(&norm, at(MlaQAScale), at(MlaQANormalized), at(MlaQLatent))?;
                self.linear(norm.out, &p("q_b_proj.weight"), None)?
            }
            None => self.linear(x, &p("q_proj.weight"), None)?,
        };
        self.hook(at(MlaQProj), q);
        let q = self.b.reshape(q, &[t, heads, dn + dr])?;
        let q_pass = self.b.slice_dim(q, 2, 0, dn)?;
        let q_rot = self.b.slice_dim(q, 2, dn, dn + dr)?;
        let kva = self.linear(x, &p("kv_a_proj_with_mqa.weight"), None)?;
        let kva = self.keep_outputs_split(kva, &p("kv_a_proj_with_mqa.weight"))?;
        self.hook(at(MlaKvA), kva);
        let latent = self.b.slice_dim(kva, 1, 0, kr)?;
        let k_rot = self.b.slice_dim(kva, 1, kr, kr + dr)?;
        self.hook(at(MlaKvIn), latent);
        let norm = self.rms_norm_eps(latent, &p("kv_a_layernorm.weight"), LATENT_EPS)?;
        self.hook_norm(&norm, at(MlaKvScale), at(MlaKvNormalized), at(MlaKvLatent))?;
        if self.cache.is_some() {
            // A decoding step caches the normed latent and the RoPE key, not every head's keys
            // and values, and attends through the latent.
            let (q_rot, k_rot) = self.mla_rope(layer, &mla, q_rot, k_rot)?;
            let z = self.mla_cached(layer, &mla, q_pass, q_rot, norm.out, k_rot)?;
            return self.linear(z, &p("o_proj.weight"), None);
        }
        let kv = self.linear(norm.out, &p("kv_b_proj.weight"), None)?;
        self.hook(at(MlaKvProj), kv);
        let kv = self.b.reshape(kv, &[t, heads, dn + dv])?;
        let k_pass = self.b.slice_dim(kv, 2, 0, dn)?;
        let v = self.b.slice_dim(kv, 2, dn, dn + dv)?;
        let (q_rot, k_rot) = self.mla_rope(layer, &mla, q_rot, k_rot)?;
        self.hook(at(AttnRotQ), q_rot);
        self.hook(at(AttnRotK), k_rot);
        let k_rot = self.b.broadcast_in_dim(k_rot, &[t, heads, dr], &[0, 1, 2])?;
        let q = self.b.concatenate(&[q_pass, q_rot], 2)?;
        let k = self.b.concatenate(&[k_pass, k_rot], 2)?;
        self.hook(at(AttnQ), q);
        self.hook(at(AttnK), k);
        self.hook(at(AttnV), v);
        let q = self.b.reshape(q, &[t, heads * (dn + dr)])?;
        let k = self.b.reshape(k, &[t, heads * (dn + dr)])?;
        let v = self.b.reshape(v, &[t, heads * dv])?;
        let mask = self.layer_mask(layer)?;
        let z = self.attend(layer, q, k, v, mask)?;
        self.linear(z, &p("o_proj.weight"), None)
    }

    /// The queries' RoPE parts `q_rot` `[tokens, heads, rope]` and the shared RoPE key `k_rot`
    /// `[tokens, rope]` rotated (evens first where the pairs are interleaved); the key as
    /// `[tokens, 1, rope]`.
    fn mla_rope(&mut self, layer: usize, mla: &Mla, q_rot: Value, k_rot: Value) -> Result<(Value, Value), ModelError> {
        let (t, dr) = (self.tokens(), mla.rope);
        let k_rot = self.b.reshape(k_rot, &[t, 1, dr])?;
        let (q_rot, k_rot) = match mla.interleave {
            true => (self.evens_first(q_rot)?, self.evens_first(k_rot)?),
            false => (q_rot, k_rot),
        };
        let (cos, sin) = self.layer_rope(layer)?;
        let q_rot = self.apply_rope(q_rot, cos, sin)?;
        let k_rot = self.apply_rope(k_rot, cos, sin)?;
        Ok((q_rot, k_rot))
    }

    /// A decoding step's latent attention of block `layer`: the normed latent `c` `[tokens,
    /// rank]` and the rotated key `k_rot` `[tokens, 1, rope]` written into the block's cache
    /// (`rank + rope` a position, what transformers' expanded keys and values are made from),
    /// and every head attending it through `kv_b_proj`'s halves — the no-RoPE scores as `(q_pass
    /// · W_k) · c`, the values as `(probs · c) · W_vᵀ` — rather than expanding each cached
    /// position's keys and values: the same sums grouped otherwise. Returns z `[tokens,
    /// heads·v_head_dim]`.
    fn mla_cached(
        &mut self,
        layer: usize,
        mla: &Mla,
        q_pass: Value,
        q_rot: Value,
        c: Value,
        k_rot: Value,
    ) -> Result<Value, ModelError> {
        let (bsz, s, t) = (self.spec.batch, self.spec.seq, self.tokens());
        let (heads, dn, dr, dv, kr) =
            (self.config.attention.n_heads, mla.nope, mla.rope, mla.v_head_dim, mla.kv_lora_rank);
        let scale = self.config.attention.scalar.unwrap_or((dn + dr) as f64).powf(-0.5);
        let k_rot = self.b.reshape(k_rot, &[t, dr])?;
        let latent = self.b.concatenate(&[c, k_rot], 1)?;
        let (all, mask) = self.cached_latent(layer, latent)?;
        let len = self.b.dims(all)?[1];
        let w = self.w(&format!("model.layers.{layer}.self_attn.kv_b_proj.weight"))?;
        let dt = self.dt;
        let b = &mut self.b;
        let c_all = b.slice_dim(all, 2, 0, kr)?;
        let r_all = b.slice_dim(all, 2, kr, kr + dr)?;
        let w = b.reshape(w, &[heads, dn + dv, kr])?;
        let w_k = b.slice_dim(w, 1, 0, dn)?;
        let w_v = b.slice_dim(w, 1, dn, dn + dv)?;
        // q_lat[h, t, r] = Σ_n q_pass[t, h, n] · w_k[h, n, r]
        let q_lat = b.dot_general(q_pass, w_k, &DotDims::batched(&[1], &[0], &[2], &[1]))?;
        let q_lat = b.reshape(q_lat, &[heads, bsz, s, kr])?;
        // scores[b, h, i, j] = q_lat[h, b, i, :] · c[b, j, :] + q_rot[b, i, h, :] · k_rot[b, j, :]
        let lat = b.dot_general(q_lat, c_all, &DotDims::batched(&[1], &[0], &[3], &[2]))?;
        let q_rot = b.reshape(q_rot, &[bsz, s, heads, dr])?;
        let rot = b.dot_general(q_rot, r_all, &DotDims::batched(&[0], &[0], &[3], &[2]))?;
        let rot = b.transpose(rot, &[0, 2, 1, 3])?;
        let scores = b.add(lat, rot)?;
        let sdims = [bsz, heads, s, len];
        let scale = b.splat(scale, TensorType::new(dt, &sdims))?;
        let scores = b.mul(scores, scale)?;
        let scores = masked_f32(b, scores, mask, &[0, 2, 3])?;
        let probs = softmax_last(b, scores)?;
        let probs = b.convert(probs, dt)?;
        // o_lat[b, h, i, r] = Σ_j probs[b, h, i, j] · c[b, j, r]
        let o_lat = b.dot_general(probs, c_all, &DotDims::batched(&[0], &[0], &[3], &[1]))?;
        // z[h, b, i, v] = Σ_r o_lat[b, h, i, r] · w_v[h, v, r]
        let z = b.dot_general(o_lat, w_v, &DotDims::batched(&[1], &[0], &[3], &[2]))?;
        let z = b.transpose(z, &[1, 2, 0, 3])?;
        Ok(b.reshape(z, &[t, heads * dv])?)
    }

    /// `x` `[tokens, heads, d]` with each head's dimensions reordered evens first
    /// (`x₀, x₂, …, x₁, x₃, …`).
    fn evens_first(&mut self, x: Value) -> Result<Value, ModelError> {
        let dims = self.b.dims(x)?.to_vec();
        let (t, h, d) = (dims[0], dims[1], dims[2]);
        let pairs = self.b.reshape(x, &[t, h, d / 2, 2])?;
        let halves = self.b.transpose(pairs, &[0, 1, 3, 2])?;
        Ok(self.b.reshape(halves, &[t, h, d])?)
    }
}
