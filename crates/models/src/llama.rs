//! Llama family (Llama 2/3, SmolLM2, Mistral-style configs without sliding window):
//! pre-norm decoder blocks with RMSNorm, rotary position embeddings (rotate-half, base
//! `rope_theta`, optional Llama-3 or linear frequency scaling), grouped-query attention
//! (`n_kv_heads` key/value heads shared by groups of query heads), no projection biases,
//! and a SiLU-gated MLP.
//!
//! ```text
//! x = embed_tokens[input_ids]                                  # blocks.0.hook_resid_pre
//! for each block i:
//!     a = o_proj(attn(rope(q_proj(n)), rope(k_proj(n)), v_proj(n)))   n = input_layernorm(x)
//!                                                              # blocks.i.hook_attn_out
//!     x = x + a
//!     m = down_proj(silu(gate_proj(n)) * up_proj(n))           n = post_attention_layernorm(x)
//!                                                              # blocks.i.hook_mlp_out
//!     x = x + m                                                # blocks.i.hook_resid_post
//! norm(x)                                                      # ln_final.hook_normalized
//! ```
//!
//! Weights keep their Hugging Face names and `[out, in]` layout; [`crate::qwen2`] reuses
//! this block with q/k/v biases.

use crate::forward::{blocks_for, ForwardProgram, ForwardSpec, Graph};
use crate::hooks::HookPoint;
use crate::{Arch, ModelConfig, ModelError};

/// Whether the attention's q/k/v projections carry biases (Qwen2) or not (Llama).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QkvBias {
    No,
    Yes,
}

/// Builds the Llama forward for `spec`.
pub(crate) fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != Arch::Llama {
        return Err(ModelError::UnsupportedArch(format!("llama builder given a {:?} config", config.arch)));
    }
    if config.qkv_bias {
        // HF's Llama attention_bias also puts a bias on o_proj, which the parameter
        // inventory does not list; refuse rather than silently drop it.
        return Err(ModelError::UnsupportedArch("llama with attention_bias = true".into()));
    }
    build_decoder(config, spec, QkvBias::No)
}

/// The decoder stack shared by Llama and Qwen2.
pub(crate) fn build_decoder(config: &ModelConfig, spec: &ForwardSpec, bias: QkvBias) -> Result<ForwardProgram, ModelError> {
    let (n_blocks, with_final_norm) = blocks_for(config, &spec.hooks)?;
    let mut g = Graph::new(config, spec, n_blocks, with_final_norm)?;
    let mut x = g.embed()?;
    // Per-batch tables, built once and shared by every block.
    let tables = if n_blocks > 0 { Some((g.rope_tables()?, g.attention_mask()?)) } else { None };
    for layer in 0..n_blocks {
        g.hook(HookPoint::ResidPre(layer), x)?;
        let ((cos, sin), mask) = tables.expect("tables exist when blocks are built");
        let n = g.rms_norm(x, &format!("model.layers.{layer}.input_layernorm.weight"))?;
        let attn = self_attention(&mut g, n, layer, bias, cos, sin, mask)?;
        g.hook(HookPoint::AttnOut(layer), attn)?;
        let h = g.b.add(x, attn)?;
        let n = g.rms_norm(h, &format!("model.layers.{layer}.post_attention_layernorm.weight"))?;
        let mlp = g.gated_mlp(n, layer)?;
        g.hook(HookPoint::MlpOut(layer), mlp)?;
        let out = g.b.add(h, mlp)?;
        x = g.constrain_tokens(out)?;
        g.hook(HookPoint::ResidPost(layer), x)?;
    }
    if n_blocks < config.n_layers {
        g.hook(HookPoint::ResidPre(n_blocks), x)?;
    }
    if with_final_norm {
        let normed = g.rms_norm(x, "model.norm.weight")?;
        g.hook(HookPoint::LnFinal, normed)?;
    }
    g.finish(n_blocks)
}

/// `o_proj(attention(rope(q), rope(k), v))` of block `layer` on normed input `n`
/// `[tokens, hidden]`.
fn self_attention(
    g: &mut Graph<'_>,
    n: siphon_hlo::Value,
    layer: usize,
    bias: QkvBias,
    cos: siphon_hlo::Value,
    sin: siphon_hlo::Value,
    mask: siphon_hlo::Value,
) -> Result<siphon_hlo::Value, ModelError> {
    let c = g.config;
    let t = g.tokens();
    let p = format!("model.layers.{layer}.self_attn");
    let proj = |name: &str| (format!("{p}.{name}.weight"), format!("{p}.{name}.bias"));
    let mut qkv = Vec::with_capacity(3);
    for name in ["q_proj", "k_proj", "v_proj"] {
        let (w, b) = proj(name);
        let b = (bias == QkvBias::Yes).then_some(b.as_str());
        qkv.push(g.linear(n, &w, b)?);
    }
    let q = g.b.reshape(qkv[0], &[t, c.n_heads, c.head_dim])?;
    let k = g.b.reshape(qkv[1], &[t, c.n_kv_heads, c.head_dim])?;
    let q = g.apply_rope(q, cos, sin)?;
    let k = g.apply_rope(k, cos, sin)?;
    let q = g.b.reshape(q, &[t, c.n_heads * c.head_dim])?;
    let k = g.b.reshape(k, &[t, c.n_kv_heads * c.head_dim])?;
    let out = g.attention(q, k, qkv[2], mask)?;
    g.linear(out, &format!("{p}.o_proj.weight"), None)
}
