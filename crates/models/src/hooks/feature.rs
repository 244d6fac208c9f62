//! The block features a family has ([`Feature`]): what its configuration says a block holds,
//! and so which kinds of hook exist in it.

/// What a family's block must have for a kind of hook to exist; kinds that need none exist
/// in every family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// Learned position embeddings (`hook_pos_embed`).
    LearnedPositions,
    /// RMSNorm on every query and key head (Qwen3's `q_norm` / `k_norm`).
    QkNorm,
    /// Norms after attention and after the MLP (Gemma's `ln1_post` / `ln2_post`).
    PostNorms,
    /// A gated MLP (`mlp.hook_pre_linear`, the up projection beside the gate).
    GatedMlp,
    /// One MLP per block, not a mixture of experts (`mlp.hook_pre`, `mlp.hook_post`).
    DenseMlp,
    /// A routed mixture of experts (the router's logits, weights and choices).
    Moe,
    /// Rotary position embeddings (`attn.hook_rot_q` / `hook_rot_k`).
    Rotary,
    /// Norms before attention and the MLP (`ln1.*`, `ln2.hook_scale` / `hook_normalized`);
    /// OLMo 2 has only norms after them.
    PreNorms,
    /// A residual stream between attention and the MLP (`hook_resid_mid`); GPT-NeoX's
    /// parallel block adds both to the block's input.
    ResidMid,
    /// A scale-free RMSNorm on every value head (Gemma 4's `v_norm`).
    VNorm,
    /// A mixture of experts beside the MLP, each normed before their sum (Gemma 4's 26B-A4B:
    /// `router`, `experts`, `post_feedforward_layernorm_1`/`_2`, `pre_feedforward_layernorm_2`),
    /// where the config has it.
    MixtureBeside,
    /// A router taking the top k logits and a softmax over just those, its hooks named
    /// after it (GPT-OSS's `mlp.router.*`, `mlp.hook_router_scores`).
    TopKRouter,
    /// Gated DeltaNet linear attention on the layers the config marks (`linear_attn.*`).
    LinearAttention,
    /// A sigmoid gate on the attention output, computed beside the queries
    /// (`attn.hook_q_gate`; `attn.hook_q` is then the whole projection).
    AttnGate,
    /// A shared expert beside the routed ones (`mlp.shared_expert.*`, `mlp.experts.hook_out`).
    SharedExpert,
    /// The sigmoid gate on the shared expert's output (`mlp.shared_expert_gate`: Qwen3-Next,
    /// Qwen3.5-MoE; DeepSeek-V3 adds its shared experts ungated).
    SharedExpertGate,
    /// Multi-head latent attention (`attn.hook_kv_latent`, `attn.kv_a_layernorm.*`, …).
    Mla,
    /// Latent attention's compressed queries (`attn.hook_q_latent`, `attn.q_a_layernorm.*`),
    /// where the config has them (`q_lora_rank`).
    QLora,
    /// Per-layer inputs mixed in after the MLP (Gemma 4's E2B/E4B: `per_layer_input_gate`,
    /// `per_layer_projection`, `post_per_layer_input_norm`), where the config has them.
    PerLayerInput,
}
