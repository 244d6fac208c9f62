//! Qwen3 (dense): the Llama decoder (RMSNorm, rotate-half RoPE, grouped-query attention,
//! SiLU-gated MLP) with an RMSNorm over `head_dim` on every query and key head, applied after
//! the projections and before RoPE (`self_attn.q_norm` / `k_norm`, one `[head_dim]` gain
//! shared by all heads). No projection biases; `head_dim` comes from the config (128 when
//! absent, as in `Qwen3Config`), so `n_heads * head_dim` may differ from `hidden_size`.
//! Sliding windows (`use_sliding_window`) follow Qwen2's rules.
//!
//! TransformerLens's `attn.hook_q` / `hook_k` are the projections before the norms;
//! `attn.hook_q_normed` / `hook_k_normed` (and `attn.q_norm.hook_scale` / `hook_normalized`)
//! are the norms' parts, and `attn.hook_rot_q` / `hook_rot_k` RoPE of the normed heads.

use crate::arch::{Arch, Family, FinalNorm};
use crate::config::{Attention, ModelConfig};
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec, decoder_params, self_attention_decoder};
use crate::hf_config::{Defaults, HfConfig, qwen_windows};
use crate::hooks::Feature;

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// The Llama decoder's weights (its q/k norms included, as `qk_norm` says) and hooks, plus the
/// q/k norms' hooks.
pub(crate) static FAMILY: Family = Family {
    model_types: &["qwen3"],
    architectures: &["Qwen3ForCausalLM"],
    from_hf,
    build,
    params: |c, n, lm_head| decoder_params(c, n, lm_head, &[]),
    features: &[
        Feature::PreNorms,
        Feature::ResidMid,
        Feature::DenseMlp,
        Feature::GatedMlp,
        Feature::Rotary,
        Feature::QkNorm,
    ],
    renames: &[],
    final_norm: FinalNorm::PLAIN,
};

/// Qwen3Config's (Qwen3-MoE's too): `head_dim` 128, Qwen2's windows.
pub(crate) const DEFAULTS: Defaults = Defaults { head_dim: Some(128), windows: qwen_windows, ..Defaults::LLAMA };

fn from_hf(hf: HfConfig) -> Result<ModelConfig, ModelError> {
    let c = hf.decoder(ARCH, &DEFAULTS)?;
    Ok(ModelConfig { attention: Attention { qk_norm: true, ..c.attention }, ..c })
}

/// Builds the Qwen3 forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != ARCH || !config.attention.qk_norm {
        return Err(ModelError::UnsupportedArch(format!(
            "qwen3 builder given a {:?} config without q/k norms",
            config.arch
        )));
    }
    if config.attention.qkv_bias {
        // HF's attention_bias also puts a bias on o_proj, which the inventory does not list.
        return Err(ModelError::UnsupportedArch("qwen3 with attention_bias = true".into()));
    }
    self_attention_decoder(config, spec)
}
