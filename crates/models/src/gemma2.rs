//! Gemma 2: a decoder whose blocks normalise both before and after attention and the MLP,
//! each norm an RMSNorm with gain `(1 + w)` applied in f32; token embeddings scaled by
//! `sqrt(hidden_size)` in the compute dtype; grouped-query attention scaled by
//! `query_pre_attn_scalar^-0.5` with logits soft-capped as `cap * tanh(s / cap)` before the
//! mask; sliding-window attention on the layers `layer_types` marks (every other layer from
//! the first by default); a GeGLU MLP (tanh-approximated GELU); `head_dim` from the config.
//!
//! ```text
//! x = embed_tokens[input_ids] * sqrt(hidden)        # hook_embed, blocks.0.hook_resid_pre
//! for each block i:                                 # blocks.i.…
//!     n = input_layernorm(x)                        # ln1.*
//!     a = o_proj(attn(n))                           # attn.hook_out (and the attention hooks)
//!     a = post_attention_layernorm(a)               # ln1_post.hook_scale / hook_normalized, hook_attn_out
//!     x = x + a                                     # hook_resid_mid
//!     n = pre_feedforward_layernorm(x)              # ln2.*, mlp.hook_in
//!     m = down_proj(gelu(gate_proj(n)) * up_proj(n))  # mlp.hook_pre / hook_pre_linear / hook_post, mlp.hook_out
//!     m = post_feedforward_layernorm(m)             # ln2_post.hook_scale / hook_normalized, hook_mlp_out
//!     x = x + m                                     # hook_resid_post
//! norm(x)                                           # ln_final.*
//! ```
//!
//! As in TransformerLens, `hook_attn_out` and `hook_mlp_out` are taken after the post-norms;
//! the projections' own outputs are `attn.hook_out` and `mlp.hook_out`.

use siphon_hlo::TensorType;

use crate::config::ParamInfo;
use crate::family::Family;
use crate::forward::{blocks_for, ForwardProgram, ForwardSpec, Gain, Graph};
use crate::hooks::{Feature, HookKind, HookPoint};
use crate::llama::decoder_params;
use crate::{Activation, Arch, ModelConfig, ModelError};

/// The Llama hooks plus the post-norms' and the projections' own outputs.
pub(crate) const FAMILY: Family = Family {
    build,
    params: gemma_params,
    features: &[Feature::PreNorms, Feature::ResidMid, Feature::DenseMlp, Feature::GatedMlp, Feature::Rotary, Feature::PostNorms],
    renames: &[],
};

/// The Llama decoder's weights with the feed-forward norms (and the q/k norms where the
/// config has them: Gemma 3).
pub(crate) fn gemma_params(c: &ModelConfig, n_layers: usize, with_lm_head: bool) -> Vec<ParamInfo> {
    decoder_params(c, n_layers, with_lm_head, &["pre_feedforward_layernorm", "post_feedforward_layernorm"])
}

/// Builds the Gemma 2 forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != Arch::Gemma2 || config.qk_norm {
        return Err(ModelError::UnsupportedArch(format!("gemma2 builder given a {:?} config", config.arch)));
    }
    build_gemma(config, spec)
}

/// The Gemma decoder, shared with Gemma 3 (whose q/k norms, like every Gemma norm, take a
/// `(1 + w)` gain).
pub(crate) fn build_gemma(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.qkv_bias || config.activation != Activation::GeluTanh {
        return Err(ModelError::UnsupportedArch(format!(
            "gemma2 builder given a {:?} config (attention_bias {}, q/k norms {}, activation {:?})",
            config.arch, config.qkv_bias, config.qk_norm, config.activation
        )));
    }
    use HookKind::*;
    let (n_blocks, with_final_norm) = blocks_for(config, &spec.hooks)?;
    let mut g = Graph::new(config, spec, n_blocks, with_final_norm)?;
    let x = g.embed("model.embed_tokens.weight")?;
    // HF's scaled embedding multiplies by sqrt(hidden) rounded to the weights' dtype.
    let dims = g.b.dims(x)?.to_vec();
    let scale = g.b.splat((config.hidden_size as f64).sqrt(), TensorType::new(g.dt, &dims))?;
    let mut x = g.b.mul(x, scale)?;
    g.hook(HookPoint::model(Embed), x);
    for layer in 0..n_blocks {
        let at = |kind| HookPoint::block(layer, kind);
        let norm = |name: &str| format!("model.layers.{layer}.{name}.weight");
        g.hook(at(ResidPre), x);
        let (cos, sin) = g.layer_rope(layer)?;
        let mask = g.layer_mask(layer)?;
        let ln1 = g.rms_norm_with(x, &norm("input_layernorm"), Gain::UnitOffset)?;
        g.hook_norm(&ln1, at(Ln1Scale), at(Ln1Normalized), at(Ln1Out))?;
        let proj = crate::llama::self_attention(&mut g, ln1.out, layer, Gain::UnitOffset, cos, sin, mask)?;
        g.hook(at(AttnProjOut), proj);
        let h = g.add_post_normed(x, proj, &norm("post_attention_layernorm"), Gain::UnitOffset, [Ln1PostScale, Ln1PostNormalized, AttnOut].map(at))?;
        g.hook(at(ResidMid), h);
        let ln2 = g.rms_norm_with(h, &norm("pre_feedforward_layernorm"), Gain::UnitOffset)?;
        g.hook_norm(&ln2, at(Ln2Scale), at(Ln2Normalized), at(MlpIn))?;
        let mlp = g.gated_mlp(ln2.out, &format!("model.layers.{layer}.mlp"))?;
        g.hook_mlp(&mlp, layer, MlpProjOut);
        let out = g.add_post_normed(h, mlp.out, &norm("post_feedforward_layernorm"), Gain::UnitOffset, [Ln2PostScale, Ln2PostNormalized, MlpOut].map(at))?;
        x = g.constrain_tokens(out)?;
        g.hook(at(ResidPost), x);
    }
    g.finish_decoder(x, n_blocks, with_final_norm, Gain::UnitOffset)
}
