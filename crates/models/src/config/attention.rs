//! The attention's heads and the settings of the shared attention that families choose
//! between (biases, q/k norms, score scale and soft-cap, an output gate).

use serde::{Deserialize, Serialize};

use super::positive;
use crate::error::ModelError;

/// The attention's heads and settings; serialized flat in the configuration, under the names
/// `run.json` has always held.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Attention {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (GQA when fewer than `n_heads`).
    pub n_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Whether q/k/v projections have biases (Qwen2 yes, Llama no).
    pub qkv_bias: bool,
    /// RMSNorm over `head_dim` on every query and key head before RoPE (Qwen3, Gemma 3).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm: bool,
    /// The q/k norms normalise the whole projection (`n_heads * head_dim`, OLMo 2) rather
    /// than each head.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm_whole: bool,
    /// Scores are scaled by `scalar^-0.5` (Gemma's `query_pre_attn_scalar`); `None` means
    /// `head_dim`.
    #[serde(rename = "attn_scalar", default, skip_serializing_if = "Option::is_none")]
    pub scalar: Option<f64>,
    /// Logits soft-capped as `cap * tanh(s / cap)` before the mask (Gemma 2).
    #[serde(rename = "attn_softcap", default, skip_serializing_if = "Option::is_none")]
    pub softcap: Option<f64>,
    /// The output is gated: `q_proj` gives each head's query and a gate beside it, and
    /// `o_proj` reads `z · sigmoid(gate)` (Qwen3.5, Qwen3-Next).
    #[serde(rename = "attn_output_gate", default, skip_serializing_if = "std::ops::Not::not")]
    pub output_gate: bool,
}

impl Attention {
    /// Checks the scores' scale and soft-cap: positive finite numbers where given.
    pub(crate) fn check(&self) -> Result<(), ModelError> {
        if let Some(scalar) = self.scalar {
            positive("query_pre_attn_scalar (the scores' scale)", scalar)?;
        }
        if let Some(cap) = self.softcap {
            positive("attn_logit_softcapping", cap)?;
        }
        Ok(())
    }
}
