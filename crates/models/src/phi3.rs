//! Phi-3 (and Phi-3.5 / Phi-4-mini, `model_type` `phi3`): the Llama decoder (RMSNorm,
//! rotate-half RoPE, grouped-query attention, SiLU-gated MLP, no biases) whose checkpoints fuse
//! q/k/v into `self_attn.qkv_proj` (`[q; k; v]` rows) and gate/up into `mlp.gate_up_proj`
//! (`[gate; up]` rows), with a sliding window on every layer when `sliding_window` is set,
//! RoPE over the first `partial_rotary_factor` of each head, and LongRoPE scaling (the short
//! factors and the attention factor; sequences past `original_max_position_embeddings`,
//! where Hugging Face switches to the long factors, are refused).
//!
//! The fused tensors are cut into Llama's `q_proj` / `k_proj` / `v_proj` / `gate_proj` /
//! `up_proj` when they are read ([`crate::config::Slice`]), so the forward is Llama's and every part
//! shards on whole heads; the hooks are Llama's.

use crate::arch::{Arch, Family, FinalNorm};
use crate::config::{ModelConfig, ParamClass, ParamInfo, Slice};
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec, self_attention_decoder};
use crate::hf_config::{Defaults, HfConfig, windows_on_every_layer};
use crate::llama::FEATURES;

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// Llama's forward and hooks over the fused checkpoint.
pub(crate) static FAMILY: Family = Family {
    model_types: &["phi3"],
    architectures: &["Phi3ForCausalLM"],
    from_hf,
    build,
    params,
    features: FEATURES,
    renames: &[],
    final_norm: FinalNorm::PLAIN,
};

/// Phi3Config: eps 1e-5; a window on every layer when `sliding_window` is set (Phi-3-mini:
/// 2047).
fn from_hf(hf: HfConfig) -> Result<ModelConfig, ModelError> {
    if hf.attention_bias == Some(true) {
        return Err(ModelError::UnsupportedArch("phi3 with attention_bias = true".into()));
    }
    hf.decoder(ARCH, &Defaults { norm_eps: 1e-5, windows: windows_on_every_layer, ..Defaults::LLAMA })
}

fn params(c: &ModelConfig, n_layers: usize, with_lm_head: bool) -> Vec<ParamInfo> {
    use ParamClass::*;
    let h = c.hidden_size;
    let (q, kv, i) = (
        c.attention.n_heads * c.attention.head_dim,
        c.attention.n_kv_heads * c.attention.head_dim,
        c.intermediate_size,
    );
    let mut out = vec![ParamInfo::new("model.embed_tokens.weight", &[c.vocab_size, h], Embedding, None)];
    for l in 0..n_layers {
        let p = format!("model.layers.{l}");
        let part = |tensor: &str, stored: usize, name: &str, start: usize, len: usize, class| {
            let slice = Slice {
                tensor: format!("{p}.{tensor}"),
                stored: vec![stored, h],
                transposed: false,
                groups: 1,
                start,
                len,
            };
            ParamInfo::part(format!("{p}.{name}"), &[len, h], class, Some(l), slice)
        };
        out.push(ParamInfo::new(format!("{p}.input_layernorm.weight"), &[h], Norm, Some(l)));
        let qkv = q + 2 * kv;
        out.push(part("self_attn.qkv_proj.weight", qkv, "self_attn.q_proj.weight", 0, q, AttnQ));
        out.push(part("self_attn.qkv_proj.weight", qkv, "self_attn.k_proj.weight", q, kv, AttnK));
        out.push(part("self_attn.qkv_proj.weight", qkv, "self_attn.v_proj.weight", q + kv, kv, AttnV));
        out.push(ParamInfo::new(format!("{p}.self_attn.o_proj.weight"), &[h, q], AttnO, Some(l)));
        out.push(ParamInfo::new(format!("{p}.post_attention_layernorm.weight"), &[h], Norm, Some(l)));
        out.push(part("mlp.gate_up_proj.weight", 2 * i, "mlp.gate_proj.weight", 0, i, MlpGate));
        out.push(part("mlp.gate_up_proj.weight", 2 * i, "mlp.up_proj.weight", i, i, MlpUp));
        out.push(ParamInfo::new(format!("{p}.mlp.down_proj.weight"), &[h, i], MlpDown, Some(l)));
    }
    out.push(ParamInfo::new("model.norm.weight", &[h], Norm, None));
    if with_lm_head && !c.tie_word_embeddings {
        out.push(ParamInfo::new("lm_head.weight", &[c.vocab_size, h], LmHead, None));
    }
    out
}

/// Builds the Phi-3 forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != ARCH || config.attention.qkv_bias || config.attention.qk_norm {
        return Err(ModelError::UnsupportedArch(format!("phi3 builder given a {:?} config", config.arch)));
    }
    self_attention_decoder(config, spec)
}
