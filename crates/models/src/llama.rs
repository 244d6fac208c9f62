//! Llama family (Llama 2/3, SmolLM2, Mistral-style configs without sliding window):
//! pre-norm decoder blocks with RMSNorm, rotary position embeddings (rotate-half, base
//! `rope_theta`, optional Llama-3 or linear frequency scaling), grouped-query attention
//! (`n_kv_heads` key/value heads shared by groups of query heads), no projection biases,
//! and a SiLU-gated MLP.
//!
//! ```text
//! x = embed_tokens[input_ids]                        # hook_embed, blocks.0.hook_resid_pre
//! for each block i:                                  # blocks.i.…
//!     n = input_layernorm(x)                         # ln1.hook_scale / hook_normalized / hook_out
//!     q, k, v = q_proj(n), k_proj(n), v_proj(n)      # attn.hook_q / hook_k / hook_v (per head)
//!     q, k = rope(q), rope(k)                        # attn.hook_rot_q / hook_rot_k
//!     s = q·kᵀ / sqrt(head_dim), causal + padding mask  # attn.hook_attn_scores
//!     p = softmax(s)                                 # attn.hook_pattern
//!     z = p·v                                        # attn.hook_z
//!     a = o_proj(z)                                  # hook_attn_out
//!     x = x + a                                      # hook_resid_mid
//!     n = post_attention_layernorm(x)                # ln2.hook_scale / hook_normalized, mlp.hook_in
//!     m = down_proj(silu(gate_proj(n)) * up_proj(n)) # mlp.hook_pre / hook_pre_linear / hook_post
//!                                                    # hook_mlp_out
//!     x = x + m                                      # hook_resid_post
//! norm(x)                                            # ln_final.hook_scale / hook_normalized / hook_out
//! ```
//!
//! Weights keep their Hugging Face names and `[out, in]` layout; [`crate::qwen2`] reuses
//! this block with q/k/v biases.

use siphon_hlo::Value;

use crate::forward::{Attention, ForwardProgram, ForwardSpec, Gain, Graph, blocks_for};
use crate::hooks::{Feature, HookKind, HookPoint};
use crate::{Arch, ModelConfig, ModelError};

/// A Llama-style block has every hook of the table that needs nothing beyond it.
pub(crate) const FEATURES: &[Feature] = &[];

/// Builds the Llama forward for `spec`.
pub(crate) fn build(
    config: &ModelConfig,
    spec: &ForwardSpec,
) -> Result<ForwardProgram, ModelError> {
    if config.arch != Arch::Llama {
        return Err(ModelError::UnsupportedArch(format!(
            "llama builder given a {:?} config",
            config.arch
        )));
    }
    if config.qkv_bias {
        // HF's Llama attention_bias also puts a bias on o_proj, which the parameter
        // inventory does not list; refuse rather than silently drop it.
        return Err(ModelError::UnsupportedArch(
            "llama with attention_bias = true".into(),
        ));
    }
    build_decoder(config, spec)
}

/// The decoder stack shared by Llama, Qwen2, Mistral and Qwen3; the config decides the
/// per-layer attention windows and the q/k norms.
pub(crate) fn build_decoder(
    config: &ModelConfig,
    spec: &ForwardSpec,
) -> Result<ForwardProgram, ModelError> {
    use HookKind::*;
    let (n_blocks, with_final_norm) = blocks_for(config, &spec.hooks)?;
    let mut g = Graph::new(config, spec, n_blocks, with_final_norm)?;
    let mut x = g.embed()?;
    g.hook(HookPoint::model(Embed), x);
    for layer in 0..n_blocks {
        let at = |kind| HookPoint::block(layer, kind);
        g.hook(at(ResidPre), x);
        let (cos, sin) = g.layer_rope(layer)?;
        let mask = g.layer_mask(layer)?;
        let ln1 = g.rms_norm(x, &format!("model.layers.{layer}.input_layernorm.weight"))?;
        g.hook_norm(&ln1, at(Ln1Scale), at(Ln1Normalized), at(Ln1Out))?;
        let attn = self_attention(&mut g, ln1.out, layer, Gain::Plain, cos, sin, mask)?;
        g.hook(at(AttnOut), attn);
        let h = g.b.add(x, attn)?;
        g.hook(at(ResidMid), h);
        let ln2 = g.rms_norm(
            h,
            &format!("model.layers.{layer}.post_attention_layernorm.weight"),
        )?;
        g.hook_norm(&ln2, at(Ln2Scale), at(Ln2Normalized), at(MlpIn))?;
        let mlp = g.gated_mlp(ln2.out, layer)?;
        g.hook(at(MlpPre), mlp.pre);
        g.hook(at(MlpPreLinear), mlp.pre_linear);
        g.hook(at(MlpPost), mlp.post);
        g.hook(at(MlpOut), mlp.out);
        let out = g.b.add(h, mlp.out)?;
        x = g.constrain_tokens(out)?;
        g.hook(at(ResidPost), x);
    }
    g.finish_decoder(x, n_blocks, with_final_norm, Gain::Plain)
}

/// RMSNorm over `head_dim` of every head of `x` `[tokens, heads, head_dim]` (the q/k norms of
/// Qwen3, and of Gemma 3 with its `(1 + w)` gain), recording its scale, normalized and output
/// hooks.
fn head_norm(g: &mut Graph<'_>, x: Value, weight: &str, gain: Gain, hooks: [HookPoint; 3]) -> Result<Value, ModelError> {
    let dims = g.b.dims(x)?.to_vec();
    let rows = g.b.reshape(x, &[dims[0] * dims[1], dims[2]])?;
    let norm = g.rms_norm_with(rows, weight, gain)?;
    let [scale, normalized, out] = hooks;
    g.hook_norm(&norm, scale, normalized, out)?;
    Ok(g.b.reshape(norm.out, &dims)?)
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
        let b = c.qkv_bias.then_some(b.as_str());
        qkv.push(g.linear(n, &w, b)?);
    }
    g.hook(at(AttnQ), qkv[0]);
    g.hook(at(AttnK), qkv[1]);
    g.hook(at(AttnV), qkv[2]);
    let mut q = g.b.reshape(qkv[0], &[t, c.n_heads, c.head_dim])?;
    let mut k = g.b.reshape(qkv[1], &[t, c.n_kv_heads, c.head_dim])?;
    if c.qk_norm {
        q = head_norm(g, q, &format!("{p}.q_norm.weight"), qk_gain, [AttnQNormScale, AttnQNormNormalized, AttnQNormed].map(at))?;
        k = head_norm(g, k, &format!("{p}.k_norm.weight"), qk_gain, [AttnKNormScale, AttnKNormNormalized, AttnKNormed].map(at))?;
    }
    let q = g.apply_rope(q, cos, sin)?;
    let k = g.apply_rope(k, cos, sin)?;
    g.hook(at(AttnRotQ), q);
    g.hook(at(AttnRotK), k);
    let q = g.b.reshape(q, &[t, c.n_heads * c.head_dim])?;
    let k = g.b.reshape(k, &[t, c.n_kv_heads * c.head_dim])?;
    let Attention { scores, pattern, z } = g.attention(q, k, qkv[2], mask)?;
    if g.wants(at(AttnScores)) {
        let rows = g.per_query(scores)?;
        let rows = g.finite_in_output(rows)?;
        g.hook(at(AttnScores), rows);
    }
    if g.wants(at(AttnPattern)) {
        let rows = g.per_query(pattern)?;
        g.hook(at(AttnPattern), rows);
    }
    g.hook(at(AttnZ), z);
    g.linear(z, &format!("{p}.o_proj.weight"), None)
}
