//! The settings of the token mixers other than softmax attention, each as its family's
//! `config.json` states it: multi-head latent attention ([`Mla`], DeepSeek-V3, Kimi K2) and
//! gated DeltaNet's linear attention ([`LinearAttention`], Qwen3-Next, Qwen3.5). Their layers
//! (`layers/mla.rs`, `layers/gated_deltanet.rs`) build them.

use serde::{Deserialize, Serialize};

use crate::error::ModelError;
use crate::hf_config::{HfConfig, need};
use crate::hooks::HookKind;

/// The latent attention's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mla {
    /// Rank of the query's down projection (`q_lora_rank`); `None`: a plain `q_proj`.
    pub q_lora_rank: Option<usize>,
    /// Rank of the key/value latent (`kv_lora_rank`).
    pub kv_lora_rank: usize,
    /// Width of each query and key head's part without RoPE (`qk_nope_head_dim`).
    pub nope: usize,
    /// Width of each query and key head's rotated part (`qk_rope_head_dim`).
    pub rope: usize,
    /// Width of each value head (`v_head_dim`).
    pub v_head_dim: usize,
    /// RoPE on interleaved pairs (`rope_interleave`) rather than on halves.
    pub interleave: bool,
}

impl Mla {
    /// The sizes from a DeepSeek-style `config.json`.
    pub(crate) fn from_hf(hf: &HfConfig) -> Result<Mla, ModelError> {
        let mla = Mla {
            q_lora_rank: hf.key("q_lora_rank")?,
            kv_lora_rank: need(hf.key("kv_lora_rank")?, "kv_lora_rank")?,
            nope: need(hf.key("qk_nope_head_dim")?, "qk_nope_head_dim")?,
            rope: need(hf.key("qk_rope_head_dim")?, "qk_rope_head_dim")?,
            v_head_dim: need(hf.key("v_head_dim")?, "v_head_dim")?,
            interleave: hf.key("rope_interleave")?.unwrap_or(true),
        };
        if !mla.rope.is_multiple_of(2) || mla.rope == 0 {
            return Err(ModelError::Config(format!("qk_rope_head_dim {} is not a positive even number", mla.rope)));
        }
        Ok(mla)
    }

    /// Width of a query or key head, `nope + rope`.
    pub fn qk_head_dim(&self) -> usize {
        self.nope + self.rope
    }

    /// The per-token shape of an attention hook whose width differs under latent attention:
    /// values narrower than queries and keys, the RoPE parts, the one shared RoPE key.
    pub(crate) fn hook_dims(&self, kind: HookKind, n_heads: usize) -> Option<Vec<usize>> {
        use HookKind::*;
        Some(match kind {
            AttnV | AttnZ => vec![n_heads, self.v_head_dim],
            AttnRotQ => vec![n_heads, self.rope],
            AttnRotK => vec![1, self.rope],
            _ => return None,
        })
    }
}

/// The linear-attention layers of a hybrid decoder and their sizes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinearAttention {
    /// Query/key heads (`linear_num_key_heads`).
    pub n_key_heads: usize,
    /// Value heads (`linear_num_value_heads`), a multiple of the key heads.
    pub n_value_heads: usize,
    /// Width of a query/key head (`linear_key_head_dim`).
    pub key_head_dim: usize,
    /// Width of a value head (`linear_value_head_dim`).
    pub value_head_dim: usize,
    /// Width of the causal convolution (`linear_conv_kernel_dim`).
    pub conv_kernel: usize,
    /// Per layer, whether it is a linear-attention layer.
    pub layers: Vec<bool>,
    /// Projections stored fused and grouped by key head (Qwen3-Next's `in_proj_qkvz` and
    /// `in_proj_ba`) rather than one per part (Qwen3.5).
    pub fused: bool,
}

impl LinearAttention {
    /// Reads the `linear_*` keys and `layer_types` of a Qwen3-Next-style config (three linear
    /// layers for each full one when `layer_types` is absent, `full_attention_interval`).
    pub(crate) fn from_hf(hf: &HfConfig, n_layers: usize, fused: bool) -> Result<LinearAttention, ModelError> {
        let layers = match &hf.layer_types {
            Some(types) if types.len() != n_layers => {
                return Err(ModelError::Config(format!(
                    "layer_types lists {} layers, num_hidden_layers is {n_layers}",
                    types.len()
                )));
            }
            Some(types) => types
                .iter()
                .map(|t| match t.as_str() {
                    "linear_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(ModelError::UnsupportedArch(format!(
                        "layer type {other:?} in a hybrid decoder (supported: linear_attention, full_attention)"
                    ))),
                })
                .collect::<Result<_, _>>()?,
            None => {
                let every = hf.key::<usize>("full_attention_interval")?.unwrap_or(4);
                if every == 0 {
                    return Err(ModelError::Config("full_attention_interval 0 must be at least 1".into()));
                }
                (0..n_layers).map(|l| (l + 1) % every != 0).collect()
            }
        };
        let la = LinearAttention {
            n_key_heads: hf.key("linear_num_key_heads")?.unwrap_or(16),
            n_value_heads: hf.key("linear_num_value_heads")?.unwrap_or(32),
            key_head_dim: hf.key("linear_key_head_dim")?.unwrap_or(128),
            value_head_dim: hf.key("linear_value_head_dim")?.unwrap_or(128),
            conv_kernel: hf.key("linear_conv_kernel_dim")?.unwrap_or(4),
            layers,
            fused,
        };
        let sizes = [la.n_key_heads, la.n_value_heads, la.key_head_dim, la.value_head_dim, la.conv_kernel];
        if sizes.contains(&0) || !la.n_value_heads.is_multiple_of(la.n_key_heads) {
            return Err(ModelError::Config(format!(
                "linear attention with {} key heads of {}, {} value heads of {} and a convolution of {}: \
                 every size must be positive and the value heads a multiple of the key heads",
                la.n_key_heads, la.key_head_dim, la.n_value_heads, la.value_head_dim, la.conv_kernel
            )));
        }
        Ok(la)
    }

    /// Whether block `layer` is a linear-attention layer.
    pub fn is_linear(&self, layer: usize) -> bool {
        self.layers.get(layer).copied().unwrap_or(false)
    }

    /// `nk · dk`, the width of the queries and of the keys.
    pub fn key_dim(&self) -> usize {
        self.n_key_heads * self.key_head_dim
    }

    /// `nv · dv`, the width of the values.
    pub fn value_dim(&self) -> usize {
        self.n_value_heads * self.value_head_dim
    }
}
