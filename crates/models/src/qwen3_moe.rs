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

use crate::arch::{Arch, Family, FinalNorm};
use crate::config::{Attention, ModelConfig, Moe};
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec, decoder_params, self_attention_decoder};
use crate::hf_config::{HfConfig, need};
use crate::hooks::Feature;

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// Qwen3's weights with the experts in place of the MLP; Qwen3's hooks but the MLP's insides.
pub(crate) static FAMILY: Family = Family {
    model_types: &["qwen3_moe"],
    architectures: &["Qwen3MoeForCausalLM"],
    from_hf,
    build,
    params: |c, n, lm_head| decoder_params(c, n, lm_head, &[]),
    features: &[Feature::PreNorms, Feature::ResidMid, Feature::Rotary, Feature::QkNorm, Feature::Moe],
    renames: &[],
    final_norm: FinalNorm::PLAIN,
};

fn from_hf(mut hf: HfConfig) -> Result<ModelConfig, ModelError> {
    let refuse = |what: &str| Err(ModelError::UnsupportedArch(format!("qwen3_moe with {what}")));
    if hf.attention_bias == Some(true) {
        return refuse("attention_bias = true");
    }
    let (n_experts, top_k) = hf.experts()?;
    // Qwen3-MoE may keep dense MLPs on some layers; every released checkpoint routes every
    // layer, and siphon builds only that.
    let dense_layers = hf.key::<Vec<usize>>("mlp_only_layers")?.is_some_and(|l| !l.is_empty());
    if hf.key::<usize>("decoder_sparse_step")?.unwrap_or(1) != 1 || dense_layers {
        return refuse("dense MLP layers (decoder_sparse_step != 1 or mlp_only_layers)");
    }
    let expert_size = need(hf.key("moe_intermediate_size")?, "moe_intermediate_size")?;
    // The dense MLP's width is unused.
    hf.intermediate_size.get_or_insert(0);
    let norm_topk = hf.norm_topk_prob.unwrap_or(false);
    let c = hf.decoder(ARCH, &crate::qwen3::DEFAULTS)?;
    Ok(ModelConfig {
        attention: Attention { qk_norm: true, ..c.attention },
        moe: Some(Moe { n_experts, top_k, norm_topk, expert_size, ..Default::default() }),
        ..c
    })
}

/// Builds the Qwen3-MoE forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != ARCH || config.moe.is_none() || !config.attention.qk_norm || config.attention.qkv_bias {
        return Err(ModelError::UnsupportedArch(format!("qwen3_moe builder given a {:?} config", config.arch)));
    }
    self_attention_decoder(config, spec)
}
