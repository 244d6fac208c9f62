//! Gemma 3 (text models, `model_type` `gemma3_text`): the Gemma 2 block ([`crate::gemma2`]:
//! `(1 + w)` RMSNorms before and after attention and the MLP, embeddings × `sqrt(hidden)`,
//! GeGLU, scores × `query_pre_attn_scalar^-0.5`) with an RMSNorm, `(1 + w)` too, over
//! `head_dim` on every query and key head before RoPE; local sliding-window layers and global
//! layers as `layer_types` says (five local for each global by default), the local ones with
//! their own RoPE base (`rope_local_base_freq`, or `rope_parameters.sliding_attention`) and no
//! frequency scaling, the global ones with `rope_theta` and any RoPE scaling; no logit
//! soft-cap unless the config sets one.
//!
//! TransformerLens's hooks are Gemma 2's plus Qwen3's q/k-norm hooks. Multimodal checkpoints
//! (`model_type` `gemma3`) give their text tower: its config is `text_config` and its weights
//! sit under `model.language_model.` (or `language_model.model.`); the vision tower is not read.

use crate::family::{Arch, Family};
use crate::forward::{ForwardProgram, ForwardSpec};
use crate::gemma2::{GEMMA_ACTIVATION, gemma_config, gemma_params, gemma_windows};
use crate::hf_config::Defaults;
use crate::hooks::Feature;
use crate::{HfConfig, ModelConfig, ModelError};

/// Gemma 2's weights and hooks plus the q/k norms'.
pub(crate) const FAMILY: Family = Family {
    arch: Arch::Gemma3,
    model_types: &["gemma3_text", "gemma3"],
    architectures: &["Gemma3ForCausalLM"],
    from_hf,
    build,
    params: gemma_params,
    features: &[
        Feature::PreNorms,
        Feature::ResidMid,
        Feature::DenseMlp,
        Feature::GatedMlp,
        Feature::Rotary,
        Feature::PostNorms,
        Feature::QkNorm,
    ],
    // The text tower of multimodal checkpoints: transformers 5 and late 4.x save it under
    // `model.language_model.`, earlier ones under `language_model.model.`.
    renames: &[("model.", "model.language_model."), ("model.", "language_model.model.")],
};

/// Gemma3TextConfig's: `head_dim` 256, global layers with base 1e6, five local layers for
/// each global one (`sliding_window_pattern`).
const DEFAULTS: Defaults = Defaults {
    head_dim: Some(256),
    rope_theta: 1_000_000.0,
    activation: GEMMA_ACTIVATION,
    windows: |c, n_layers, _| gemma_windows(c, n_layers, c.key("sliding_window_pattern")?.unwrap_or(6)),
    ..Defaults::LLAMA
};

fn from_hf(mut hf: HfConfig) -> Result<ModelConfig, ModelError> {
    if hf.model_type.as_deref() == Some("gemma3") {
        // A multimodal checkpoint: its text tower is a gemma3_text model whose weights sit
        // under `language_model.` (the family's renames find them).
        let mut text = *hf
            .text_config
            .take()
            .ok_or_else(|| ModelError::Config("a gemma3 (multimodal) config.json without text_config".into()))?;
        text.model_type = Some("gemma3_text".into());
        text.tie_word_embeddings = text.tie_word_embeddings.or(hf.tie_word_embeddings);
        return from_hf(text);
    }
    // Local layers take `rope_local_base_freq` (1e4) and no scaling.
    let local = hf.key::<f64>("rope_local_base_freq")?.unwrap_or(10_000.0);
    let local_rope_theta = hf.rope_by_layer_type(Arch::Gemma3, local)?;
    let c = gemma_config(&hf, Arch::Gemma3, &DEFAULTS, None)?;
    Ok(ModelConfig { qk_norm: true, local_rope_theta: Some(local_rope_theta), ..c })
}

/// Builds the Gemma 3 forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != Arch::Gemma3 || !config.qk_norm {
        return Err(ModelError::UnsupportedArch(format!(
            "gemma3 builder given a {:?} config without q/k norms",
            config.arch
        )));
    }
    crate::gemma2::build_gemma(config, spec)
}
