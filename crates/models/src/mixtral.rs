//! Mixtral (`model_type` `mixtral`): Mistral's decoder (RMSNorm, rotate-half RoPE,
//! grouped-query attention, no biases, a sliding window when `sliding_window` is set) whose
//! MLP is a routed mixture of SiLU-gated experts: a linear router
//! (`block_sparse_moe.gate`), softmax, the `num_experts_per_tok` most probable experts
//! renormalised to sum to 1, each expert `block_sparse_moe.experts.{e}.w1` (gate), `w3` (up)
//! and `w2` (down) (see [`crate::forward::Graph::moe_mlp`]).
//!
//! Hooks: Llama's, except the MLP's insides; `hook_mlp_out` is the mixture's output.

use crate::arch::{Arch, Family, FinalNorm};
use crate::config::{ModelConfig, Moe, ParamInfo};
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec, decoder_params, self_attention_decoder};
use crate::hf_config::{Defaults, HfConfig, need, windows_on_every_layer};
use crate::hooks::Feature;

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// Llama's weights with Mixtral's experts; Llama's hooks but the MLP's insides.
pub(crate) static FAMILY: Family = Family {
    model_types: &["mixtral"],
    architectures: &["MixtralForCausalLM"],
    from_hf,
    build,
    params,
    features: &[Feature::PreNorms, Feature::ResidMid, Feature::Rotary, Feature::Moe],
    renames: &[],
    final_norm: FinalNorm::PLAIN,
};

/// MixtralConfig: no window unless set; every expert as wide as `intermediate_size`; the
/// top-k weights always renormalised.
fn from_hf(hf: HfConfig) -> Result<ModelConfig, ModelError> {
    if hf.attention_bias == Some(true) {
        return Err(ModelError::UnsupportedArch("mixtral with attention_bias = true".into()));
    }
    let (n_experts, top_k) = hf.experts()?;
    let expert_size = need(hf.intermediate_size, "intermediate_size")?;
    let c = hf.decoder(ARCH, &Defaults { windows: windows_on_every_layer, ..Defaults::LLAMA })?;
    Ok(ModelConfig { moe: Some(Moe { n_experts, top_k, norm_topk: true, expert_size, ..Default::default() }), ..c })
}

/// The decoder's weights, the experts read from Mixtral's names.
fn params(c: &ModelConfig, n_layers: usize, with_lm_head: bool) -> Vec<ParamInfo> {
    let mixtral = |stored: &mut String| {
        *stored = stored
            .replace(".mlp.gate.weight", ".block_sparse_moe.gate.weight")
            .replace(".mlp.experts.", ".block_sparse_moe.experts.")
            .replace(".gate_proj.weight", ".w1.weight")
            .replace(".up_proj.weight", ".w3.weight")
            .replace(".down_proj.weight", ".w2.weight");
    };
    let mut params = decoder_params(c, n_layers, with_lm_head, &[]);
    for p in &mut params {
        p.stack.iter_mut().for_each(mixtral);
        if let Some(slice) = &mut p.source {
            mixtral(&mut slice.tensor);
        }
    }
    params
}

/// Builds the Mixtral forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != ARCH || config.moe.is_none() || config.attention.qkv_bias || config.attention.qk_norm {
        return Err(ModelError::UnsupportedArch(format!("mixtral builder given a {:?} config", config.arch)));
    }
    self_attention_decoder(config, spec)
}
