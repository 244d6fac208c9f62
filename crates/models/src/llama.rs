//! Llama family (Llama 2/3, SmolLM2, Mistral-style configs without sliding window):
//! pre-norm decoder blocks with RMSNorm, rotary position embeddings (rotate-half, base
//! `rope_theta`, optional Llama-3 or linear frequency scaling), grouped-query attention
//! (`n_kv_heads` key/value heads shared by groups of query heads), no projection biases,
//! and a SiLU-gated MLP.
//!
//! ```text
//! x = embed_tokens[input_ids]                        # hook_embed, blocks.0.hook_resid_pre
//! for each block i:                                  # blocks.i.…
//!     n = input_layernorm(x)                         # ln1.hook_scale / hook_normalized / hook_out
//!     q, k, v = q_proj(n), k_proj(n), v_proj(n)      # attn.hook_q / hook_k / hook_v (per head)
//!     q, k = rope(q), rope(k)                        # attn.hook_rot_q / hook_rot_k
//!     s = q·kᵀ / sqrt(head_dim), causal + padding mask  # attn.hook_attn_scores
//!     p = softmax(s)                                 # attn.hook_pattern
//!     z = p·v                                        # attn.hook_z
//!     a = o_proj(z)                                  # hook_attn_out
//!     x = x + a                                      # hook_resid_mid
//!     n = post_attention_layernorm(x)                # ln2.hook_scale / hook_normalized, mlp.hook_in
//!     m = down_proj(silu(gate_proj(n)) * up_proj(n)) # mlp.hook_pre / hook_pre_linear / hook_post
//!                                                    # hook_mlp_out
//!     x = x + m                                      # hook_resid_post
//! norm(x)                                            # ln_final.hook_scale / hook_normalized / hook_out
//! ```
//!
//! Weights keep their Hugging Face names and `[out, in]` layout; [`crate::qwen2`] reuses
//! this block with q/k/v biases.

use crate::arch::{Arch, Family, FinalNorm};
use crate::config::{ModelConfig, ParamInfo};
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec, decoder_params, self_attention_decoder};
use crate::hf_config::{Defaults, HfConfig};
use crate::hooks::Feature;

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// A Llama-style block has every hook of the table that needs nothing beyond it.
pub(crate) static FAMILY: Family = Family {
    model_types: &["llama"],
    architectures: &["LlamaForCausalLM"],
    from_hf: |hf: HfConfig| hf.decoder(ARCH, &Defaults::LLAMA),
    build,
    params,
    features: FEATURES,
    renames: &[],
    final_norm: FinalNorm::PLAIN,
};

/// The hook features of the decoder without q/k norms or post-norms (Llama, Qwen2, Mistral).
pub(crate) const FEATURES: &[Feature] =
    &[Feature::PreNorms, Feature::ResidMid, Feature::DenseMlp, Feature::GatedMlp, Feature::Rotary];

fn params(c: &ModelConfig, n_layers: usize, with_lm_head: bool) -> Vec<ParamInfo> {
    decoder_params(c, n_layers, with_lm_head, &[])
}

/// Builds the Llama forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != ARCH {
        return Err(ModelError::UnsupportedArch(format!("llama builder given a {:?} config", config.arch)));
    }
    if config.attention.qkv_bias {
        // HF's Llama attention_bias also puts a bias on o_proj, which the parameter
        // inventory does not list; refuse rather than silently drop it.
        return Err(ModelError::UnsupportedArch("llama with attention_bias = true".into()));
    }
    self_attention_decoder(config, spec)
}
