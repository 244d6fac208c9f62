//! Qwen2 / Qwen2.5: the Llama decoder (RMSNorm, rotate-half RoPE with a large
//! `rope_theta`, grouped-query attention, SiLU-gated MLP) plus biases on the q, k and v
//! projections (none on o_proj). Small checkpoints tie the output head to the token
//! embedding (`tie_word_embeddings`); siphon never computes logits, so tied and untied
//! checkpoints build the same graph and `lm_head.weight` is never an argument.
//!
//! Sliding-window attention (`use_sliding_window`, off in every released Qwen2.5 config) is
//! honoured on the layers Hugging Face windows ([`crate::config::LayerSpec::window`]).

use crate::arch::{Arch, Family, FinalNorm};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec, decoder_params, self_attention_decoder};
use crate::hf_config::{Defaults, HfConfig, qwen_windows};
use crate::llama::FEATURES;

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// The Llama decoder's weights and hooks.
pub(crate) static FAMILY: Family = Family {
    model_types: &["qwen2"],
    architectures: &["Qwen2ForCausalLM"],
    // Qwen2Config: biases on q/k/v by default.
    from_hf: |hf: HfConfig| {
        hf.decoder(ARCH, &Defaults { attention_bias: true, windows: qwen_windows, ..Defaults::LLAMA })
    },
    build,
    params: |c, n, lm_head| decoder_params(c, n, lm_head, &[]),
    features: FEATURES,
    renames: &[],
    final_norm: FinalNorm::PLAIN,
};

/// Builds the Qwen2 forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != ARCH {
        return Err(ModelError::UnsupportedArch(format!("qwen2 builder given a {:?} config", config.arch)));
    }
    self_attention_decoder(config, spec)
}
