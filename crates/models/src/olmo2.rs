//! OLMo 2 (`model_type` `olmo2`): a decoder without norms before attention and the MLP; each
//! sublayer's output is normalised instead (`post_attention_layernorm`,
//! `post_feedforward_layernorm`) before it joins the residual stream. The queries and keys
//! are RMS-normalised over the whole projection (`q_norm` `[n_heads * head_dim]`, `k_norm`
//! `[n_kv_heads * head_dim]`) before RoPE. Every norm applies its gain in f32 before the cast
//! back (`Olmo2RMSNorm`). Rotate-half RoPE, grouped-query attention, SiLU-gated MLP, no biases.
//!
//! ```text
//! x = embed_tokens[input_ids]                        # hook_embed, blocks.0.hook_resid_pre
//! for each block i:
//!     q, k = q_norm(q_proj(x)), k_norm(k_proj(x))    # attn.hook_q / hook_k, attn.q_norm.*, attn.hook_q_normed, …
//!     a = o_proj(attn(rope(q), rope(k), v_proj(x)))  # attn.hook_out
//!     x = x + post_attention_layernorm(a)            # ln1_post.*, hook_attn_out, hook_resid_mid (= mlp.hook_in)
//!     m = mlp(x)                                     # mlp.hook_pre / hook_pre_linear / hook_post, mlp.hook_out
//!     x = x + post_feedforward_layernorm(m)          # ln2_post.*, hook_mlp_out, hook_resid_post
//! norm(x)                                            # ln_final.*
//! ```
//!
//! As TransformerLens has them, the q/k-norm hooks are per token over the whole projection
//! (`[n_heads * head_dim]`, one scale per token), and there are no `ln1` / `ln2` hooks.

use crate::arch::{Arch, Family, FinalNorm, Gain};
use crate::config::{Attention, ModelConfig, ParamClass, ParamInfo};
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec, Graph};
use crate::hf_config::{Defaults, HfConfig};
use crate::hooks::{Feature, HookKind, HookPoint};
use crate::layers::attention::self_attention;

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// The post-norm decoder's weights and hooks.
pub(crate) static FAMILY: Family = Family {
    model_types: &["olmo2"],
    architectures: &["Olmo2ForCausalLM"],
    from_hf,
    build,
    params,
    features: &[
        Feature::ResidMid,
        Feature::DenseMlp,
        Feature::GatedMlp,
        Feature::Rotary,
        Feature::PostNorms,
        Feature::QkNorm,
    ],
    renames: &[],
    final_norm: FinalNorm { gain: Gain::F32, folded: false, centred: true },
};

/// Olmo2Config: eps 1e-5, q/k norms over the whole projection, no biases, no windows.
fn from_hf(hf: HfConfig) -> Result<ModelConfig, ModelError> {
    if hf.attention_bias == Some(true) {
        return Err(ModelError::UnsupportedArch("olmo2 with attention_bias = true".into()));
    }
    let c = hf.decoder(ARCH, &Defaults { norm_eps: 1e-5, ..Defaults::LLAMA })?;
    Ok(ModelConfig { attention: Attention { qk_norm: true, qk_norm_whole: true, ..c.attention }, ..c })
}

/// The post-norm decoder's weights (OLMo 3's too).
pub(crate) fn params(c: &ModelConfig, n_layers: usize, with_lm_head: bool) -> Vec<ParamInfo> {
    use ParamClass::*;
    let h = c.hidden_size;
    let (q, kv, i) = (
        c.attention.n_heads * c.attention.head_dim,
        c.attention.n_kv_heads * c.attention.head_dim,
        c.intermediate_size,
    );
    let mut out = vec![ParamInfo::new("model.embed_tokens.weight", &[c.vocab_size, h], Embedding, None)];
    for l in 0..n_layers {
        let mut p = |suffix: &str, shape: &[usize], class| {
            out.push(ParamInfo::new(format!("model.layers.{l}.{suffix}"), shape, class, Some(l)));
        };
        p("self_attn.q_proj.weight", &[q, h], AttnQ);
        p("self_attn.k_proj.weight", &[kv, h], AttnK);
        p("self_attn.v_proj.weight", &[kv, h], AttnV);
        p("self_attn.q_norm.weight", &[q], Norm);
        p("self_attn.k_norm.weight", &[kv], Norm);
        p("self_attn.o_proj.weight", &[h, q], AttnO);
        p("post_attention_layernorm.weight", &[h], Norm);
        p("mlp.gate_proj.weight", &[i, h], MlpGate);
        p("mlp.up_proj.weight", &[i, h], MlpUp);
        p("mlp.down_proj.weight", &[h, i], MlpDown);
        p("post_feedforward_layernorm.weight", &[h], Norm);
    }
    out.push(ParamInfo::new("model.norm.weight", &[h], Norm, None));
    if with_lm_head && !c.tie_word_embeddings {
        out.push(ParamInfo::new("lm_head.weight", &[c.vocab_size, h], LmHead, None));
    }
    out
}

/// Builds the OLMo 2 forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != ARCH {
        return Err(ModelError::UnsupportedArch(format!("olmo2 builder given a {:?} config", config.arch)));
    }
    build_post_norm(config, spec)
}

/// The post-norm decoder, shared with OLMo 3 (whose windows the config carries).
pub(crate) fn build_post_norm(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.attention.qkv_bias || !config.attention.qk_norm_whole {
        return Err(ModelError::UnsupportedArch(format!(
            "{} without whole-projection q/k norms or with biases",
            config.arch
        )));
    }
    use HookKind::*;
    let mut g = Graph::new(config, spec)?;
    let x = g.embed("model.embed_tokens.weight")?;
    g.hook(HookPoint::model(Embed), x);
    let x = g.blocks(x, |g, x, layer| {
        let (cos, sin) = g.layer_rope(layer)?;
        let mask = g.layer_mask(layer)?;
        let attention = |g: &mut Graph<'_>, input| self_attention(g, input, layer, Gain::F32, cos, sin, mask);
        g.post_normed_block(x, layer, Gain::F32, false, attention, |_, _, mlp| Ok(mlp))
    })?;
    g.finish_decoder(x)
}
