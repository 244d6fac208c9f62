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

use crate::family::Family;
use crate::forward::{ForwardProgram, ForwardSpec};
use crate::gemma2::gemma_params;
use crate::hooks::Feature;
use crate::{Arch, ModelConfig, ModelError};

/// Gemma 2's weights and hooks plus the q/k norms'.
pub(crate) const FAMILY: Family = Family {
    build,
    params: gemma_params,
    features: &[Feature::PreNorms, Feature::ResidMid, Feature::DenseMlp, Feature::GatedMlp, Feature::Rotary, Feature::PostNorms, Feature::QkNorm],
    // The text tower of multimodal checkpoints: transformers 5 and late 4.x save it under
    // `model.language_model.`, earlier ones under `language_model.model.`.
    renames: &[("model.", "model.language_model."), ("model.", "language_model.model.")],
};

/// Builds the Gemma 3 forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != Arch::Gemma3 || !config.qk_norm {
        return Err(ModelError::UnsupportedArch(format!("gemma3 builder given a {:?} config without q/k norms", config.arch)));
    }
    crate::gemma2::build_gemma(config, spec)
}
