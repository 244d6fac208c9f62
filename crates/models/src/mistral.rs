//! Mistral: the Llama decoder (RMSNorm, rotate-half RoPE, grouped-query attention, SiLU-gated
//! MLP, no projection biases, `head_dim` from the config) with sliding-window attention: a
//! query attends only the `sliding_window` most recent keys, itself included (Hugging Face's
//! `kv_idx > q_idx - sliding_window`), on every layer. The window is
//! [`crate::config::LayerSpec::window`], applied by the shared attention mask; a config
//! whose window is null attends the whole context, like Hugging Face.

use crate::arch::{Arch, Family, FinalNorm};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec, decoder_params, self_attention_decoder};
use crate::hf_config::{Defaults, HfConfig};
use crate::llama::FEATURES;

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// The Llama decoder's weights and hooks.
pub(crate) static FAMILY: Family = Family {
    model_types: &["mistral"],
    architectures: &["MistralForCausalLM"],
    from_hf: |hf: HfConfig| hf.decoder(ARCH, &DEFAULTS),
    build,
    params: |c, n, lm_head| decoder_params(c, n, lm_head, &[]),
    features: FEATURES,
    renames: &[],
    final_norm: FinalNorm::PLAIN,
};

/// MistralConfig's: a window on every layer, 4096 when the key is absent, none when null.
const DEFAULTS: Defaults = Defaults {
    windows: |c, n_layers, _| Ok(vec![c.sliding_window()?.unwrap_or(Some(4096)); n_layers]),
    ..Defaults::LLAMA
};

/// Builds the Mistral forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != ARCH {
        return Err(ModelError::UnsupportedArch(format!("mistral builder given a {:?} config", config.arch)));
    }
    if config.attention.qkv_bias {
        return Err(ModelError::UnsupportedArch("mistral with attention_bias = true".into()));
    }
    self_attention_decoder(config, spec)
}
