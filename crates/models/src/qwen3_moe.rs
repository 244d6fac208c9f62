//! Qwen3-MoE (`model_type` `qwen3_moe`, e.g. Qwen3-30B-A3B): Qwen3's decoder (per-head q/k
//! RMSNorm, explicit `head_dim`, no biases) whose MLP is a routed mixture of SiLU-gated
//! experts on every layer: a linear router (`mlp.gate`), softmax, the `num_experts_per_tok`
//! most probable experts, renormalised when `norm_topk_prob`, each expert
//! `mlp.experts.{e}.{gate,up,down}_proj` (see [`crate::forward::Graph::moe_mlp`]). Configs
//! with dense layers (`decoder_sparse_step` ≠ 1, `mlp_only_layers`) are refused.
//!
//! Hooks: Qwen3's, except the MLP's insides (`mlp.hook_pre`, `hook_pre_linear`, `hook_post`),
//! which a mixture does not have per token; `mlp.hook_in` is the mixture's input and
//! `hook_mlp_out` its output (the routed experts' weighted sum).

use crate::family::Family;
use crate::forward::{ForwardProgram, ForwardSpec};
use crate::hooks::Feature;
use crate::llama::{build_decoder, decoder_params};
use crate::{Arch, ModelConfig, ModelError};

/// Qwen3's weights with the experts in place of the MLP; Qwen3's hooks but the MLP's insides.
pub(crate) const FAMILY: Family = Family {
    build,
    params: |c, n, lm_head| decoder_params(c, n, lm_head, &[]),
    features: &[Feature::PreNorms, Feature::ResidMid, Feature::Rotary, Feature::QkNorm, Feature::Moe],
    renames: &[],
};

/// Builds the Qwen3-MoE forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != Arch::Qwen3Moe || config.moe.is_none() || !config.qk_norm || config.qkv_bias {
        return Err(ModelError::UnsupportedArch(format!("qwen3_moe builder given a {:?} config", config.arch)));
    }
    build_decoder(config, spec)
}
