//! RoPE's settings: its base, the frequency scaling of long-context checkpoints, the base of
//! sliding-window layers, and the width it rotates.

use serde::{Deserialize, Serialize};

/// RoPE's settings; serialized flat in the configuration, under the names `run.json` has
/// always held.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Rope {
    /// The base.
    #[serde(rename = "rope_theta")]
    pub theta: f64,
    /// Frequency scaling, if any.
    #[serde(rename = "rope_scaling")]
    pub scaling: Option<RopeScaling>,
    /// The base of the sliding-window layers, which take no frequency scaling (Gemma 3);
    /// `None`: every layer uses `theta` and `scaling`.
    #[serde(rename = "local_rope_theta", default, skip_serializing_if = "Option::is_none")]
    pub local_theta: Option<f64>,
    /// Leading dimensions of each head that RoPE rotates (GPT-NeoX's `rotary_pct`, Phi-3's
    /// `partial_rotary_factor`); `None`: all of `head_dim`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotary_dim: Option<usize>,
}

/// RoPE frequency scaling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RopeScaling {
    /// Llama 3's piecewise scaling of long wavelengths.
    Llama3 {
        /// Overall scale factor.
        factor: f64,
        /// Wavelengths shorter than `original_max / high_freq_factor` are kept.
        low_freq_factor: f64,
        /// Wavelengths longer than `original_max / low_freq_factor` are divided by `factor`.
        high_freq_factor: f64,
        /// Context length the model was pre-trained with.
        original_max_position_embeddings: usize,
    },
    /// Plain linear position interpolation: positions divided by `factor`.
    Linear {
        /// Scale factor.
        factor: f64,
    },
    /// Gemma 4's proportional RoPE: rotate-half over the whole head, the first
    /// `int(fraction * head_dim / 2)` frequencies `theta^(-2i / head_dim)` and the others 0
    /// (those pairs pass unrotated), every frequency divided by `factor`.
    Proportional {
        /// `partial_rotary_factor`.
        fraction: f64,
        /// `factor` (1 when absent).
        factor: f64,
    },
    /// YaRN (GPT-OSS; DeepSeek-V3's and Qwen's long contexts): each frequency blended
    /// between itself and itself / `factor` by a linear ramp over the frequencies that turn
    /// `beta_fast` … `beta_slow` times in `original_max_position_embeddings` positions (the
    /// ramp's ends rounded outward when `truncate`); cos and sin multiplied by
    /// `attention_factor`.
    Yarn {
        /// Context extension factor.
        factor: f64,
        /// Rotations marking the ramp's fast end (32 by default).
        beta_fast: f64,
        /// Rotations marking the ramp's slow end (1 by default).
        beta_slow: f64,
        /// Context length the model was pre-trained with.
        original_max_position_embeddings: usize,
        /// Whether the ramp's ends are rounded to whole frequencies.
        truncate: bool,
        /// Multiplies cos and sin.
        attention_factor: f64,
    },
    /// Phi-3's LongRoPE with the short factors (the ones Hugging Face uses while the batch
    /// is no longer than `original_max_position_embeddings`, which siphon requires): each
    /// frequency divided by its factor, cos and sin multiplied by `attention_factor`.
    LongRope {
        /// One factor per frequency (`rotary_dim / 2`).
        short_factor: Vec<f64>,
        /// Context length the factors were fitted for; longer sequences are refused.
        original_max_position_embeddings: usize,
        /// Multiplies cos and sin.
        attention_factor: f64,
    },
}
