//! A routed mixture of experts' settings: its experts, their routing and widths, a shared
//! expert, dense first blocks. The mixture itself is `layers/moe/`.

use serde::{Deserialize, Serialize};

/// A routed mixture of experts in place of every block's MLP. `Default` (no experts) is a
/// start for literals that set the sizes and leave the optional parts out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moe {
    /// Experts per block.
    pub n_experts: usize,
    /// Experts each token is routed to.
    pub top_k: usize,
    /// Whether the top-k routing weights are divided by their sum (Mixtral always;
    /// Qwen3-MoE as `norm_topk_prob` says).
    pub norm_topk: bool,
    /// Width of one expert's gate/up projections.
    pub expert_size: usize,
    /// Width of a shared expert every token goes through beside the routed ones, its output
    /// scaled by `sigmoid(shared_expert_gate(x))` (Qwen3-Next, Qwen3.5-MoE) or added as it is
    /// (DeepSeek-V3's `shared_experts`), as the family's features say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_expert: Option<usize>,
    /// The first blocks, whose MLP is a dense gated MLP `intermediate_size` wide instead of
    /// the mixture (DeepSeek-V3's `first_k_dense_replace`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub first_dense: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}
