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

use serde_json::Value;

use crate::arch::{Arch, Family, FinalNorm, Gain};
use crate::config::{Activation, Attention, ModelConfig, ParamInfo};
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec, Graph, decoder_params};
use crate::hf_config::{ActivationKey, Defaults, HfConfig};
use crate::hooks::{Feature, HookKind, HookPoint};
use crate::layers::attention::self_attention;

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// The Llama hooks plus the post-norms' and the projections' own outputs.
pub(crate) static FAMILY: Family = Family {
    model_types: &["gemma2"],
    architectures: &["Gemma2ForCausalLM"],
    // Gemma2Config caps attention logits at 50 and the final logits at 30 by default.
    from_hf: |hf: HfConfig| gemma_config(&hf, ARCH, &DEFAULTS, Some(50.0), Some(30.0)),
    build,
    params: gemma_params,
    features: &[
        Feature::PreNorms,
        Feature::ResidMid,
        Feature::DenseMlp,
        Feature::GatedMlp,
        Feature::Rotary,
        Feature::PostNorms,
    ],
    renames: &[],
    final_norm: FinalNorm { gain: Gain::UnitOffset, folded: true, centred: false },
};

/// Gemma2Config's: `head_dim` 256, tied, GeGLU, every other layer windowed from the first.
const DEFAULTS: Defaults = Defaults {
    head_dim: Some(256),
    tie_word_embeddings: true,
    activation: GEMMA_ACTIVATION,
    windows: |c, n_layers, _| gemma_windows(c, n_layers, 2),
    ..Defaults::LLAMA
};

/// Gemma's MLP reads `hidden_activation` (its `hidden_act` is unused).
pub(crate) const GEMMA_ACTIVATION: ActivationKey = ActivationKey {
    key: "hidden_activation",
    default: "gelu_pytorch_tanh",
    accepted: &[("gelu_pytorch_tanh", Activation::GeluTanh), ("gelu_new", Activation::GeluTanh)],
};

/// What Gemma 2 and 3 read alike: the decoder with `defaults`, scores scaled by
/// `query_pre_attn_scalar^-0.5` (256 when absent), logits soft-capped by
/// `attn_logit_softcapping` (`softcap` when absent, none when null), final logits by
/// `final_logit_softcapping` (`final_softcap` when absent); bidirectional attention
/// is refused.
pub(crate) fn gemma_config(
    hf: &HfConfig,
    arch: Arch,
    defaults: &Defaults,
    softcap: Option<f64>,
    final_softcap: Option<f64>,
) -> Result<ModelConfig, ModelError> {
    if hf.key::<bool>("use_bidirectional_attention")? == Some(true) {
        return Err(ModelError::UnsupportedArch(format!("{arch} with use_bidirectional_attention")));
    }
    let c = hf.decoder(arch, defaults)?;
    let attn_softcap = softcap_key(hf, "attn_logit_softcapping", softcap)?;
    let final_softcap = softcap_key(hf, "final_logit_softcapping", final_softcap)?;
    let attn_scalar = Some(hf.key::<f64>("query_pre_attn_scalar")?.unwrap_or(256.0));
    Ok(ModelConfig {
        attention: Attention { scalar: attn_scalar, softcap: attn_softcap, ..c.attention },
        final_softcap,
        ..c
    })
}

/// A soft-cap `key` of `config.json`: `default` when absent, none when null.
pub(crate) fn softcap_key(hf: &HfConfig, key: &str, default: Option<f64>) -> Result<Option<f64>, ModelError> {
    match hf.extra.get(key) {
        None => Ok(default),
        Some(Value::Null) => Ok(None),
        Some(v) => Ok(Some(v.as_f64().ok_or_else(|| ModelError::Config(format!("{key} {v} is not a number")))?)),
    }
}

/// Gemma's windows: on the layers `layer_types` marks, by default all but every
/// `pattern`-th layer; `sliding_window` 4096 when absent, none at all when null.
pub(crate) fn gemma_windows(c: &HfConfig, n_layers: usize, pattern: usize) -> Result<Vec<Option<usize>>, ModelError> {
    let Some(window) = c.sliding_window()?.unwrap_or(Some(4096)) else { return Ok(Vec::new()) };
    c.windows_by_types_or_every(n_layers, window, pattern)
}

/// The Llama decoder's weights with the feed-forward norms (and the q/k norms where the
/// config has them: Gemma 3).
pub(crate) fn gemma_params(c: &ModelConfig, n_layers: usize, with_lm_head: bool) -> Vec<ParamInfo> {
    decoder_params(c, n_layers, with_lm_head, &["pre_feedforward_layernorm", "post_feedforward_layernorm"])
}

/// Builds the Gemma 2 forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != ARCH || config.attention.qk_norm {
        return Err(ModelError::UnsupportedArch(format!("gemma2 builder given a {:?} config", config.arch)));
    }
    build_gemma(config, spec)
}

/// The Gemma decoder, shared with Gemma 3 (whose q/k norms, like every Gemma norm, take a
/// `(1 + w)` gain).
pub(crate) fn build_gemma(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.attention.qkv_bias || config.activation != Activation::GeluTanh {
        return Err(ModelError::UnsupportedArch(format!(
            "gemma2 builder given a {:?} config (attention_bias {}, q/k norms {}, activation {:?})",
            config.arch, config.attention.qkv_bias, config.attention.qk_norm, config.activation
        )));
    }
    use HookKind::*;
    let mut g = Graph::new(config, spec)?;
    let x = g.embed("model.embed_tokens.weight")?;
    // HF's scaled embedding multiplies by sqrt(hidden) rounded to the weights' dtype.
    let x = g.scale(x, (config.hidden_size as f64).sqrt())?;
    g.hook(HookPoint::model(Embed), x);
    let x = g.blocks(x, |g, x, layer| {
        let (cos, sin) = g.layer_rope(layer)?;
        let mask = g.layer_mask(layer)?;
        let attention = |g: &mut Graph<'_>, input| self_attention(g, input, layer, Gain::UnitOffset, cos, sin, mask);
        g.post_normed_block(x, layer, Gain::UnitOffset, true, attention, |_, _, mlp| Ok(mlp))
    })?;
    g.finish_decoder(x)
}

#[cfg(test)]
mod tests {
    use crate::config::Activation;
    use crate::hf_config::HfConfig;

    #[test]
    fn gemma2_defaults_follow_gemma2config() {
        let base = r#"{"model_type": "gemma2", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 4, "num_attention_heads": 4"#;
        let parse = |extra: &str| HfConfig::from_json(&format!("{base}{extra}}}")).unwrap().into_config();
        let c = parse("").unwrap();
        assert_eq!((c.arch, c.attention.head_dim, c.activation), (super::ARCH, 256, Activation::GeluTanh));
        assert_eq!((c.attention.scalar, c.attention.softcap, c.tie_word_embeddings), (Some(256.0), Some(50.0), true));
        assert_eq!(c.layers.windows(), vec![Some(4096), None, Some(4096), None]);
        let c = parse(
            r#", "attn_logit_softcapping": null, "sliding_window": 8, "query_pre_attn_scalar": 144,
            "layer_types": ["full_attention", "sliding_attention", "full_attention", "full_attention"]"#,
        )
        .unwrap();
        assert_eq!((c.attention.scalar, c.attention.softcap), (Some(144.0), None));
        assert_eq!(c.layers.windows(), vec![None, Some(8), None, None]);
        // Gemma's MLP reads hidden_activation; an activation siphon does not build is named.
        let err = parse(r#", "hidden_activation": "gelu""#).unwrap_err().to_string();
        assert!(err.contains("hidden_activation \"gelu\""), "{err}");
        let err = parse(r#", "use_bidirectional_attention": true"#).unwrap_err().to_string();
        assert!(err.contains("bidirectional"), "{err}");
        // The parameter inventory has the pre- and post-feedforward norms.
        let names: Vec<String> = parse("").unwrap().params(1, false).into_iter().map(|p| p.name).collect();
        assert!(names.contains(&"model.layers.0.post_feedforward_layernorm.weight".to_string()), "{names:?}");
    }
}
