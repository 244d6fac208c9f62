//! GPT-NeoX and Pythia (`model_type` `gpt_neox`): LayerNorm (gain and bias) blocks whose
//! attention and MLP both read the block's input and are added to it together (the parallel
//! residual, `use_parallel_residual`); one fused `query_key_value` projection laid out per head
//! (`[q_h; k_h; v_h]` for each head h), with biases; rotate-half RoPE over the first
//! `rotary_pct` of each head (`rotary_emb_base`); scores scaled by `head_dim^-½`; a plain MLP
//! `dense_4h_to_h(gelu(dense_h_to_4h(x)))` with biases, GELU exact by default.
//!
//! ```text
//! x = embed_in[input_ids]                            # hook_embed, blocks.0.hook_resid_pre
//! for each block i:
//!     n = input_layernorm(x)                         # ln1.*
//!     q, k, v = per-head split(query_key_value(n))   # attn.hook_q / hook_k / hook_v
//!     q, k = rope(q), rope(k) (first rotary dims)    # attn.hook_rot_q / hook_rot_k
//!     a = dense(softmax(q·kᵀ / sqrt(d)) · v)         # attn.hook_attn_scores / hook_pattern / hook_z, hook_attn_out
//!     m = mlp(post_attention_layernorm(x))           # ln2.*, mlp.hook_in, mlp.hook_pre / hook_post, hook_mlp_out
//!     x = m + a + x                                  # hook_resid_post
//! final_layer_norm(x)                                # ln_final.*
//! ```
//!
//! The parallel block has no `hook_resid_mid`. `query_key_value` is cut into per-part weights
//! of whole heads when read ([`crate::config::Slice`]), so the parts shard over heads.

use crate::arch::{Arch, Family, FinalNorm};
use crate::config::{Activation, ModelConfig, ParamClass, ParamInfo, Slice};
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec, Graph};
use crate::hf_config::{ActivationKey, Defaults, HfConfig};
use crate::hooks::{Feature, HookKind, HookPoint};

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// GPT-NeoX's weights and hooks (no resid_mid, gated-MLP or q/k-norm hooks).
pub(crate) static FAMILY: Family = Family {
    model_types: &["gpt_neox"],
    architectures: &["GPTNeoXForCausalLM"],
    from_hf,
    build,
    params,
    features: &[Feature::PreNorms, Feature::DenseMlp, Feature::Rotary],
    renames: &[],
    final_norm: FinalNorm::PLAIN,
};

/// GPTNeoXConfig: `layer_norm_eps` 1e-5, biases, exact GELU, untied; the hub's older
/// `rotary_pct` / `rotary_emb_base` (transformers 5 moves both into `rope_parameters`). Only
/// the parallel block is built.
fn from_hf(mut hf: HfConfig) -> Result<ModelConfig, ModelError> {
    if hf.key::<bool>("use_parallel_residual")? == Some(false) {
        return Err(ModelError::UnsupportedArch(
            "gpt_neox with use_parallel_residual = false (only the parallel block of Pythia and GPT-NeoX-20B)".into(),
        ));
    }
    hf.rope_theta = hf.rope_theta.or(hf.key("rotary_emb_base")?);
    hf.partial_rotary_factor = hf.partial_rotary_factor.or(hf.key("rotary_pct")?);
    hf.rms_norm_eps = hf.key("layer_norm_eps")?;
    let activation = ActivationKey { key: "hidden_act", default: "gelu", accepted: ActivationKey::GELUS };
    hf.decoder(ARCH, &Defaults { norm_eps: 1e-5, attention_bias: true, activation, ..Defaults::LLAMA })
}

fn params(c: &ModelConfig, n_layers: usize, with_lm_head: bool) -> Vec<ParamInfo> {
    use ParamClass::*;
    let (h, i, d) = (c.hidden_size, c.intermediate_size, c.attention.head_dim);
    let q = c.attention.n_heads * d;
    let mut out = vec![ParamInfo::new("gpt_neox.embed_in.weight", &[c.vocab_size, h], Embedding, None)];
    for l in 0..n_layers {
        let p = format!("gpt_neox.layers.{l}");
        let layer = Some(l);
        let mut add = |suffix: &str, shape: &[usize], class| {
            out.push(ParamInfo::new(format!("{p}.{suffix}"), shape, class, layer))
        };
        add("input_layernorm.weight", &[h], Norm);
        add("input_layernorm.bias", &[h], NormBias);
        add("post_attention_layernorm.weight", &[h], Norm);
        add("post_attention_layernorm.bias", &[h], NormBias);
        // query_key_value: rows [heads, 3, d]; part j of every head.
        for (j, part, class, bias_class) in [(0, "q", AttnQ, QBias), (1, "k", AttnK, KBias), (2, "v", AttnV, VBias)] {
            for (suffix, stored, shape, class) in
                [("weight", vec![3 * q, h], vec![q, h], class), ("bias", vec![3 * q], vec![q], bias_class)]
            {
                let tensor = format!("{p}.attention.query_key_value.{suffix}");
                let slice = Slice {
                    tensor: tensor.clone(),
                    stored,
                    transposed: false,
                    groups: c.attention.n_heads,
                    start: j * d,
                    len: d,
                };
                out.push(ParamInfo::part(format!("{tensor}[{part}]"), &shape, class, layer, slice));
            }
        }
        let mut add = |suffix: &str, shape: &[usize], class| {
            out.push(ParamInfo::new(format!("{p}.{suffix}"), shape, class, layer))
        };
        add("attention.dense.weight", &[h, q], AttnO);
        add("attention.dense.bias", &[h], OBias);
        add("mlp.dense_h_to_4h.weight", &[i, h], MlpUp);
        add("mlp.dense_h_to_4h.bias", &[i], MlpUpBias);
        add("mlp.dense_4h_to_h.weight", &[h, i], MlpDown);
        add("mlp.dense_4h_to_h.bias", &[h], MlpDownBias);
    }
    out.push(ParamInfo::new("gpt_neox.final_layer_norm.weight", &[h], Norm, None));
    out.push(ParamInfo::new("gpt_neox.final_layer_norm.bias", &[h], NormBias, None));
    if with_lm_head && !c.tie_word_embeddings {
        out.push(ParamInfo::new("embed_out.weight", &[c.vocab_size, h], LmHead, None));
    }
    out
}

/// Builds the GPT-NeoX forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != ARCH || config.attention.n_kv_heads != config.attention.n_heads || !config.attention.qkv_bias {
        return Err(ModelError::UnsupportedArch(format!(
            "gpt_neox builder given a {:?} config without attention biases",
            config.arch
        )));
    }
    if !matches!(config.activation, Activation::Gelu | Activation::GeluTanh) || !config.layers.is_empty() {
        return Err(ModelError::UnsupportedArch(format!(
            "gpt_neox with activation {:?} or layers that differ (windows, sizes, shared keys)",
            config.activation
        )));
    }
    use HookKind::*;
    let mut g = Graph::new(config, spec)?;
    let (t, d) = (g.tokens(), config.attention.head_dim);
    let x = g.embed("gpt_neox.embed_in.weight")?;
    g.hook(HookPoint::model(Embed), x);
    let x = g.blocks(x, |g, x, layer| {
        let at = |kind| HookPoint::block(layer, kind);
        let p = format!("gpt_neox.layers.{layer}");
        let (cos, sin) = g.layer_rope(layer)?;
        let mask = g.layer_mask(layer)?;
        let ln1 = g.layer_norm(x, &format!("{p}.input_layernorm.weight"), &format!("{p}.input_layernorm.bias"))?;
        g.hook_norm(&ln1, at(Ln1Scale), at(Ln1Normalized), at(Ln1Out))?;
        let [q, k, v] = g.fused_qkv(ln1.out, layer, &format!("{p}.attention.query_key_value"))?;
        let mut rotated = Vec::with_capacity(2);
        for (y, kind) in [(q, AttnRotQ), (k, AttnRotK)] {
            let heads = g.b.reshape(y, &[t, config.attention.n_heads, d])?;
            let r = g.apply_rope(heads, cos, sin)?;
            g.hook(at(kind), r);
            rotated.push(g.b.reshape(r, &[t, config.attention.n_heads * d])?);
        }
        let z = g.attend(layer, rotated[0], rotated[1], v, mask)?;
        let attn = g.linear(z, &format!("{p}.attention.dense.weight"), Some(&format!("{p}.attention.dense.bias")))?;
        g.hook(at(AttnOut), attn);
        let ln2 = g.layer_norm(
            x,
            &format!("{p}.post_attention_layernorm.weight"),
            &format!("{p}.post_attention_layernorm.bias"),
        )?;
        g.hook_norm(&ln2, at(Ln2Scale), at(Ln2Normalized), at(MlpIn))?;
        let [up, up_b, down, down_b] =
            ["dense_h_to_4h.weight", "dense_h_to_4h.bias", "dense_4h_to_h.weight", "dense_4h_to_h.bias"]
                .map(|n| format!("{p}.mlp.{n}"));
        let mlp = g.plain_mlp(ln2.out, [&up, &up_b], [&down, &down_b])?;
        g.hook_mlp(&mlp, layer, MlpOut);
        // Hugging Face: mlp_output + attn_output + hidden_states, in that order.
        let sum = g.b.add(mlp.out, attn)?;
        let out = g.b.add(sum, x)?;
        Ok(out)
    })?;
    g.end_blocks(x)?;
    if g.with_final_norm {
        let norm = g.layer_norm(x, "gpt_neox.final_layer_norm.weight", "gpt_neox.final_layer_norm.bias")?;
        g.hook_final_norm(&norm)?;
    }
    g.finish()
}
