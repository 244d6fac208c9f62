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

use crate::config::{ParamClass, ParamInfo, Slice};
use crate::family::{Arch, Family};
use crate::forward::{ForwardProgram, ForwardSpec, Gain, Graph, blocks_for};
use crate::hf_config::Defaults;
use crate::hooks::{Feature, HookKind, HookPoint};
use crate::{HfConfig, ModelConfig, ModelError};

/// A Llama-style block has every hook of the table that needs nothing beyond it.
pub(crate) const FAMILY: Family = Family {
    arch: Arch::Llama,
    model_types: &["llama"],
    architectures: &["LlamaForCausalLM"],
    from_hf: |hf: HfConfig| hf.decoder(Arch::Llama, &Defaults::LLAMA),
    build,
    params,
    features: FEATURES,
    renames: &[],
};

/// The hook features of the decoder without q/k norms or post-norms (Llama, Qwen2, Mistral).
pub(crate) const FEATURES: &[Feature] =
    &[Feature::PreNorms, Feature::ResidMid, Feature::DenseMlp, Feature::GatedMlp, Feature::Rotary];

fn params(c: &ModelConfig, n_layers: usize, with_lm_head: bool) -> Vec<ParamInfo> {
    decoder_params(c, n_layers, with_lm_head, &[])
}

/// The routed experts of block `l` as the forward takes them (see
/// [`crate::forward::Graph::moe_mlp`]), none without a mixture: the router, and each
/// projection of every expert stacked, read from Qwen3-MoE's names (`mlp.gate`,
/// `mlp.experts.{e}.{gate,up,down}_proj`; Mixtral renames the stored tensors).
pub(crate) fn moe_params(c: &ModelConfig, l: usize) -> Vec<ParamInfo> {
    use ParamClass::*;
    let Some(moe) = &c.moe else { return Vec::new() };
    let (h, e, i) = (c.hidden_size, moe.n_experts, moe.expert_size);
    let p = format!("model.layers.{l}.mlp");
    // The router as stored, named for the program by the same name.
    let whole = Slice {
        tensor: format!("{p}.gate.weight"),
        stored: vec![e, h],
        transposed: false,
        groups: 1,
        start: 0,
        len: e,
    };
    let mut out = vec![ParamInfo::part(format!("{p}.gate.weight"), &[e, h], Router, Some(l), whole)];
    for (proj, shape, class) in
        [("gate_proj", [e, i, h], ExpertGate), ("up_proj", [e, i, h], ExpertUp), ("down_proj", [e, h, i], ExpertDown)]
    {
        let stack = (0..e).map(|x| format!("{p}.experts.{x}.{proj}.weight")).collect();
        out.push(ParamInfo::stacked(format!("{p}.experts.{proj}"), &shape, class, Some(l), stack));
    }
    out
}

/// The weights of the decoder Llama, Qwen2, Mistral, Qwen3 and Gemma share, in Hugging Face's
/// names: the q/k/v biases when `qkv_bias`, the q/k norms when `qk_norm`, and
/// `extra_norms` after `post_attention_layernorm` in each block (Gemma's feed-forward norms).
pub(crate) fn decoder_params(
    c: &ModelConfig,
    n_layers: usize,
    with_lm_head: bool,
    extra_norms: &[&str],
) -> Vec<ParamInfo> {
    use ParamClass::*;
    let h = c.hidden_size;
    let q = c.n_heads * c.head_dim;
    let kv = c.n_kv_heads * c.head_dim;
    let i = c.intermediate_size;
    let mut out = vec![ParamInfo::new("model.embed_tokens.weight", &[c.vocab_size, h], Embedding, None)];
    for l in 0..n_layers {
        let mut block = Vec::new();
        let mut p = |suffix: &str, shape: &[usize], class| {
            block.push(ParamInfo::new(format!("model.layers.{l}.{suffix}"), shape, class, Some(l)));
        };
        p("input_layernorm.weight", &[h], Norm);
        p("self_attn.q_proj.weight", &[q, h], AttnQ);
        p("self_attn.k_proj.weight", &[kv, h], AttnK);
        p("self_attn.v_proj.weight", &[kv, h], AttnV);
        if c.qkv_bias {
            p("self_attn.q_proj.bias", &[q], QBias);
            p("self_attn.k_proj.bias", &[kv], KBias);
            p("self_attn.v_proj.bias", &[kv], VBias);
        }
        if c.qk_norm {
            // Per head, or over the whole projection (OLMoE).
            let (qn, kn) = if c.qk_norm_whole { (q, kv) } else { (c.head_dim, c.head_dim) };
            p("self_attn.q_norm.weight", &[qn], Norm);
            p("self_attn.k_norm.weight", &[kn], Norm);
        }
        p("self_attn.o_proj.weight", &[h, q], AttnO);
        p("post_attention_layernorm.weight", &[h], Norm);
        for norm in extra_norms {
            p(&format!("{norm}.weight"), &[h], Norm);
        }
        if c.moe.is_none() {
            p("mlp.gate_proj.weight", &[i, h], MlpGate);
            p("mlp.up_proj.weight", &[i, h], MlpUp);
            p("mlp.down_proj.weight", &[h, i], MlpDown);
        }
        out.append(&mut block);
        out.extend(moe_params(c, l));
    }
    out.push(ParamInfo::new("model.norm.weight", &[h], Norm, None));
    if with_lm_head && !c.tie_word_embeddings {
        out.push(ParamInfo::new("lm_head.weight", &[c.vocab_size, h], LmHead, None));
    }
    out
}

/// Builds the Llama forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != Arch::Llama {
        return Err(ModelError::UnsupportedArch(format!("llama builder given a {:?} config", config.arch)));
    }
    if config.qkv_bias {
        // HF's Llama attention_bias also puts a bias on o_proj, which the parameter
        // inventory does not list; refuse rather than silently drop it.
        return Err(ModelError::UnsupportedArch("llama with attention_bias = true".into()));
    }
    build_decoder(config, spec)
}

/// The decoder stack shared by Llama, Qwen2, Mistral and Qwen3; the config decides the
/// per-layer attention windows and the q/k norms.
pub(crate) fn build_decoder(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    use HookKind::*;
    let (n_blocks, with_final_norm) = blocks_for(config, &spec.hooks)?;
    let mut g = Graph::new(config, spec, n_blocks)?;
    let mut x = g.embed("model.embed_tokens.weight")?;
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
        let ln2 = g.rms_norm(h, &format!("model.layers.{layer}.post_attention_layernorm.weight"))?;
        g.hook_norm(&ln2, at(Ln2Scale), at(Ln2Normalized), at(MlpIn))?;
        let mlp_out = if config.moe.is_some() { g.moe_mlp(ln2.out, layer)? } else { g.dense_mlp(ln2.out, layer)? };
        g.hook(at(MlpOut), mlp_out);
        let out = g.b.add(h, mlp_out)?;
        x = g.constrain_tokens(out)?;
        g.hook(at(ResidPost), x);
    }
    g.finish_decoder(x, n_blocks, with_final_norm, Gain::Plain)
}

/// RMSNorm over `head_dim` of every head of `x` `[tokens, heads, head_dim]` (the q/k norms of
/// Qwen3, and of Gemma 3 with its `(1 + w)` gain), recording its scale, normalized and output
/// hooks.
pub(crate) fn head_norm(
    g: &mut Graph<'_>,
    x: Value,
    weight: &str,
    gain: Gain,
    hooks: [HookPoint; 3],
) -> Result<Value, ModelError> {
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
    let (mut q, mut k) = (qkv[0], qkv[1]);
    let q_hooks = [AttnQNormScale, AttnQNormNormalized, AttnQNormed].map(at);
    let k_hooks = [AttnKNormScale, AttnKNormNormalized, AttnKNormed].map(at);
    if c.qk_norm && c.qk_norm_whole {
        // OLMo 2: one norm over the whole projection.
        for (x, name, hooks) in [(&mut q, "q_norm", q_hooks), (&mut k, "k_norm", k_hooks)] {
            let norm = g.rms_norm_with(*x, &format!("{p}.{name}.weight"), qk_gain)?;
            g.hook_norm(&norm, hooks[0], hooks[1], hooks[2])?;
            *x = norm.out;
        }
    }
    let (head_dim, kv_heads) = (c.head_dim_at(layer), c.kv_heads_at(layer));
    let mut q = g.b.reshape(q, &[t, c.n_heads, head_dim])?;
    let mut k = g.b.reshape(k, &[t, kv_heads, head_dim])?;
    if c.qk_norm && !c.qk_norm_whole {
        q = head_norm(g, q, &format!("{p}.q_norm.weight"), qk_gain, q_hooks)?;
        k = head_norm(g, k, &format!("{p}.k_norm.weight"), qk_gain, k_hooks)?;
    }
    let (q, k) = if c.rotates(layer) { (g.apply_rope(q, cos, sin)?, g.apply_rope(k, cos, sin)?) } else { (q, k) };
    g.hook(at(AttnRotQ), q);
    g.hook(at(AttnRotK), k);
    let q = g.b.reshape(q, &[t, c.n_heads * head_dim])?;
    let k = g.b.reshape(k, &[t, kv_heads * head_dim])?;
    let z = g.attend(layer, q, k, qkv[2], mask)?;
    g.linear(z, &format!("{p}.o_proj.weight"), None)
}
