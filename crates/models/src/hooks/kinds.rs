//! The table of hook kinds ([`KINDS`], one row each: TransformerLens name, bridge aliases,
//! scope, per-token shape, the block [`Feature`] it needs, meaning) and which kinds a
//! configuration's blocks have ([`hook_kinds`], [`layer_hook_kinds`]).

use super::feature::Feature;
use crate::config::ModelConfig;

/// Whether a hook belongs to a block (`blocks.{i}.…`) or to the whole model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Before the first block (`hook_embed`).
    Input,
    /// Inside block `i`.
    Block,
    /// After the last block (`ln_final.…`).
    Output,
}

/// The per-token shape of a hook, in terms of the model's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookShape {
    /// `[d_model]`.
    Model,
    /// `[d_mlp]` (`intermediate_size`).
    Mlp,
    /// `[1]`: a norm's scale.
    Scale,
    /// `[n_heads, d_head]`.
    QHeads,
    /// `[n_kv_heads, d_head]` (keys and values under grouped-query attention).
    KvHeads,
    /// `[n_heads, 1]`: a per-head norm's scale on the queries.
    QHeadScale,
    /// `[n_kv_heads, 1]`: a per-head norm's scale on the keys.
    KvHeadScale,
    /// The q-norm's parts: `[n_heads, d_head]`, or `[n_heads * d_head]` where the norm is
    /// over the whole projection (OLMo 2).
    QNorm,
    /// The k-norm's parts, likewise over the key/value heads.
    KvNorm,
    /// `[n_experts]`: one value per expert of a mixture.
    Experts,
    /// `[top_k]`: one value per expert a token is routed to.
    TopK,
    /// `[n_heads, seq]`: one row of attention scores or pattern per query token, over the
    /// batch's padded sequence length.
    Pattern,
    /// `[width]`: one layer's per-layer input (`hidden_size_per_layer_input`).
    PerLayer,
    /// `q_proj`'s output per head: `[n_heads, d_head]`, or `[2 * n_heads, d_head]` where it
    /// holds each head's query and output gate side by side.
    QProj,
    /// `[n_heads * d_head]`: the attention output gate.
    QWidth,
    /// `[nk, dk]`: a linear-attention layer's queries or keys.
    LinKeyHeads,
    /// `[nv, dv]`: a linear-attention layer's values (or its output per head).
    LinValueHeads,
    /// `[nv]`: one value per linear-attention value head.
    LinHeads,
    /// `[shared expert width]`.
    SharedMlp,
    /// `[q_lora_rank]`: latent attention's query latent.
    QLatent,
    /// `[kv_lora_rank]`: latent attention's key/value latent.
    KvLatent,
    /// `[kv_lora_rank + d_rope]`: the key/value latent and the shared RoPE key.
    KvLatentRope,
    /// `[n_heads·(d_nope + d_rope)]`: latent attention's queries, flat.
    MlaQueries,
    /// `[n_heads·(d_nope + d_v)]`: latent attention's keys' no-RoPE parts and values, flat.
    MlaKeysValues,
}

impl HookShape {
    /// The per-token dimensions for `config` at sequence length `seq`, in block `layer` for a
    /// block hook (whose heads may differ by layer).
    pub fn dims(self, config: &ModelConfig, layer: Option<usize>, seq: usize) -> Vec<usize> {
        let (head_dim, kv_heads) = layer.map_or((config.attention.head_dim, config.attention.n_kv_heads), |l| {
            (config.head_dim_at(l), config.kv_heads_at(l))
        });
        match self {
            HookShape::Model => vec![config.hidden_size],
            HookShape::Mlp => vec![layer.map_or(config.intermediate_size, |l| config.intermediate_at(l))],
            HookShape::Scale => vec![1],
            HookShape::QHeads => vec![config.attention.n_heads, head_dim],
            HookShape::KvHeads => vec![kv_heads, head_dim],
            HookShape::QHeadScale | HookShape::KvHeadScale if config.attention.qk_norm_whole => vec![1],
            HookShape::QHeadScale => vec![config.attention.n_heads, 1],
            HookShape::KvHeadScale => vec![kv_heads, 1],
            HookShape::QNorm if config.attention.qk_norm_whole => vec![config.attention.n_heads * head_dim],
            HookShape::KvNorm if config.attention.qk_norm_whole => vec![kv_heads * head_dim],
            HookShape::Experts => vec![config.moe.as_ref().map_or(0, |m| m.n_experts)],
            HookShape::TopK => vec![config.moe.as_ref().map_or(0, |m| m.top_k)],
            HookShape::QNorm => vec![config.attention.n_heads, head_dim],
            HookShape::KvNorm => vec![kv_heads, head_dim],
            HookShape::Pattern => vec![config.attention.n_heads, seq],
            HookShape::PerLayer => vec![config.per_layer_input.map_or(0, |p| p.width)],
            HookShape::QProj => {
                vec![config.attention.n_heads * if config.attention.output_gate { 2 } else { 1 }, head_dim]
            }
            HookShape::QWidth => vec![config.attention.n_heads * head_dim],
            HookShape::LinKeyHeads | HookShape::LinValueHeads | HookShape::LinHeads => {
                let la = config.linear_attention.as_ref();
                let (nk, nv, dk, dv) =
                    la.map_or((0, 0, 0, 0), |l| (l.n_key_heads, l.n_value_heads, l.key_head_dim, l.value_head_dim));
                match self {
                    HookShape::LinKeyHeads => vec![nk, dk],
                    HookShape::LinValueHeads => vec![nv, dv],
                    _ => vec![nv],
                }
            }
            HookShape::SharedMlp => vec![config.moe.as_ref().and_then(|m| m.shared_expert).unwrap_or(0)],
            HookShape::QLatent
            | HookShape::KvLatent
            | HookShape::KvLatentRope
            | HookShape::MlaQueries
            | HookShape::MlaKeysValues => {
                let Some(m) = config.mla.as_ref() else { return vec![0] };
                vec![match self {
                    HookShape::QLatent => m.q_lora_rank.unwrap_or(0),
                    HookShape::KvLatent => m.kv_lora_rank,
                    HookShape::KvLatentRope => m.kv_lora_rank + m.rope,
                    HookShape::MlaQueries => config.attention.n_heads * m.qk_head_dim(),
                    _ => config.attention.n_heads * (m.nope + m.v_head_dim),
                }]
            }
        }
    }
}

/// One row of the hook table.
#[derive(Debug)]
pub struct KindInfo {
    /// The kind.
    pub kind: HookKind,
    /// TransformerLens name: the whole name for model-scope hooks, the part after
    /// `blocks.{i}.` for block hooks.
    pub name: &'static str,
    /// TransformerBridge names of the same tensor, in the same form as `name`.
    pub aliases: &'static [&'static str],
    /// Block or model.
    pub scope: Scope,
    /// Per-token shape.
    pub shape: HookShape,
    /// The feature a block needs for this kind to exist (`-` in the table: every family has
    /// it).
    pub needs: Option<Feature>,
    /// What the value is, for help texts and the README.
    pub meaning: &'static str,
}

macro_rules! kinds {
    (@needs -) => { None };
    (@needs $feature:ident) => { Some(Feature::$feature) };
    ($($kind:ident $scope:ident $shape:ident $needs:tt $name:literal [$($alias:literal),*] $meaning:literal;)*) => {
        /// A kind of activation, one row of [`KINDS`], in forward order (so a block's hooks
        /// sort the way they are computed).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(missing_docs)]
        pub enum HookKind {
            $($kind),*
        }

        /// Every hook kind siphon knows, in forward order.
        pub const KINDS: &[KindInfo] = &[$(KindInfo {
            kind: HookKind::$kind,
            name: $name,
            aliases: &[$($alias),*],
            scope: Scope::$scope,
            shape: HookShape::$shape,
            needs: kinds!(@needs $needs),
            meaning: $meaning,
        }),*];
    };
}

// kind, scope, per-token shape, the feature it needs (`-`: none), TransformerLens name,
// bridge aliases, meaning.
kinds! {
    Embed Input Model - "hook_embed" ["embed.hook_out"]
        "token embedding (times the family's embedding scale, if any)";
    PosEmbed Input Model LearnedPositions "hook_pos_embed" ["pos_embed.hook_out"]
        "learned position embedding";
    ResidPre Block Model - "hook_resid_pre" ["hook_in", "ln1.hook_in"]
        "residual stream entering the block";
    Ln1Scale Block Scale PreNorms "ln1.hook_scale" []
        "sqrt(mean(x²) + eps) of the attention norm's input (LayerNorm: sqrt(var(x) + eps))";
    Ln1Normalized Block Model PreNorms "ln1.hook_normalized" []
        "attention norm's input (centred, for LayerNorm) divided by its scale, before the gain and bias";
    Ln1Out Block Model PreNorms "ln1.hook_out" ["attn.hook_in", "attn.q.hook_in", "attn.k.hook_in", "attn.v.hook_in", "attn.q_a_proj.hook_in", "attn.q_proj.hook_in", "attn.kv_a_proj_with_mqa.hook_in"]
        "attention norm's output, after the gain (the attention's input)";
    LinQPreConv Block LinKeyHeads LinearAttention "linear_attn.hook_q_pre_conv" []
        "linear attention's queries per key head, projected, before the causal convolution (Qwen3.5, Qwen3-Next)";
    LinKPreConv Block LinKeyHeads LinearAttention "linear_attn.hook_k_pre_conv" []
        "linear attention's keys per key head, projected, before the causal convolution";
    LinVPreConv Block LinValueHeads LinearAttention "linear_attn.hook_v_pre_conv" []
        "linear attention's values per value head, projected, before the causal convolution";
    LinQ Block LinKeyHeads LinearAttention "linear_attn.hook_q" ["linear_attn.hook_ssm_C"]
        "linear attention's queries after the convolution and SiLU, before the L2 norm";
    LinK Block LinKeyHeads LinearAttention "linear_attn.hook_k" ["linear_attn.hook_ssm_B"]
        "linear attention's keys after the convolution and SiLU, before the L2 norm";
    LinV Block LinValueHeads LinearAttention "linear_attn.hook_v" []
        "linear attention's values after the convolution and SiLU";
    LinGateInput Block LinValueHeads LinearAttention "linear_attn.hook_gate_input" []
        "in_proj_z's output per value head, the output norm's gate before its SiLU";
    LinBetaLogit Block LinHeads LinearAttention "linear_attn.hook_beta_logit" []
        "in_proj_b's output per value head, before the sigmoid";
    LinBeta Block LinHeads LinearAttention "linear_attn.hook_beta" ["linear_attn.hook_ssm_write"]
        "the delta rule's write strength sigmoid(b) per value head";
    LinLogDecay Block LinHeads LinearAttention "linear_attn.hook_log_decay" ["linear_attn.hook_ssm_decay"]
        "the state's log decay g = -exp(A_log)·softplus(a + dt_bias) per value head (f32, ≤ 0)";
    LinRecurrenceOut Block LinValueHeads LinearAttention "linear_attn.hook_recurrence_out" []
        "the gated delta rule's output per value head, before the gated norm";
    LinOut Block Model LinearAttention "linear_attn.hook_out" ["linear_attn.hook_linear_attn_out", "linear_attn.hook_ssm_out"]
        "linear attention's output, out_proj(rmsnorm(o)·w·silu(z)), added to the residual stream";
    MlaQA Block QLatent QLora "attn.q_a_proj.hook_out" ["attn.q_a_layernorm.hook_in"]
        "latent attention's query down projection q_a_proj(x), before its norm (DeepSeek-V3 with q_lora_rank)";
    MlaQAScale Block Scale QLora "attn.q_a_layernorm.hook_scale" []
        "sqrt(mean(x²) + eps) of the query latent's norm input";
    MlaQANormalized Block QLatent QLora "attn.q_a_layernorm.hook_normalized" []
        "the query latent divided by its scale, before the norm's gain";
    MlaQLatent Block QLatent QLora "attn.hook_q_latent" ["attn.q_a_layernorm.hook_out", "attn.q_b_proj.hook_in"]
        "the normed query latent, q_b_proj's input";
    MlaQProj Block MlaQueries Mla "attn.q_b_proj.hook_out" ["attn.q_proj.hook_out"]
        "latent attention's queries before RoPE, each head's no-RoPE part then its RoPE part, flat";
    MlaKvA Block KvLatentRope Mla "attn.kv_a_proj_with_mqa.hook_out" []
        "kv_a_proj_with_mqa(x): the key/value latent, then the one RoPE key every head shares";
    MlaKvIn Block KvLatent Mla "attn.kv_a_layernorm.hook_in" []
        "the key/value latent before its norm";
    MlaKvScale Block Scale Mla "attn.kv_a_layernorm.hook_scale" []
        "sqrt(mean(x²) + eps) of the key/value latent";
    MlaKvNormalized Block KvLatent Mla "attn.kv_a_layernorm.hook_normalized" []
        "the key/value latent divided by its scale, before the norm's gain";
    MlaKvLatent Block KvLatent Mla "attn.hook_kv_latent" ["attn.kv_a_layernorm.hook_out", "attn.kv_b_proj.hook_in"]
        "the normed key/value latent, kv_b_proj's input";
    MlaKvProj Block MlaKeysValues Mla "attn.kv_b_proj.hook_out" []
        "kv_b_proj's output: each head's key (no-RoPE part) then its value, flat";
    AttnQ Block QProj - "attn.hook_q" ["attn.q.hook_out"]
        "queries per head, before RoPE (with a gated output, q_proj's whole output: each head's query then its gate; latent attention: as they enter attention, the RoPE part rotated)";
    AttnK Block KvHeads - "attn.hook_k" ["attn.k.hook_out"]
        "keys per key/value head, before RoPE (latent attention: as they enter attention, the RoPE part rotated)";
    AttnV Block KvHeads - "attn.hook_v" ["attn.v.hook_out"]
        "values per key/value head";
    AttnQuery Block QHeads AttnGate "attn.q_norm.hook_in" []
        "the queries per head without their gates, the q-norm's input (gated attention)";
    AttnQGate Block QWidth AttnGate "attn.hook_q_gate" []
        "the attention output gate, before its sigmoid (gated attention)";
    AttnQNormScale Block QHeadScale QkNorm "attn.q_norm.hook_scale" []
        "sqrt(mean(q²) + eps) of each query head (of the whole projection in OLMo 2)";
    AttnQNormNormalized Block QNorm QkNorm "attn.q_norm.hook_normalized" []
        "each query head divided by its scale, before the q-norm's gain";
    AttnQNormed Block QNorm QkNorm "attn.hook_q_normed" ["attn.q_norm.hook_out"]
        "queries per head after the q-norm, before RoPE";
    AttnKNormScale Block KvHeadScale QkNorm "attn.k_norm.hook_scale" []
        "sqrt(mean(k²) + eps) of each key head (of the whole projection in OLMo 2)";
    AttnKNormNormalized Block KvNorm QkNorm "attn.k_norm.hook_normalized" []
        "each key head divided by its scale, before the k-norm's gain";
    AttnKNormed Block KvNorm QkNorm "attn.hook_k_normed" ["attn.k_norm.hook_out"]
        "keys per key/value head after the k-norm, before RoPE";
    AttnVNormed Block KvHeads VNorm "attn.v_norm.hook_out" []
        "values per key/value head after the scale-free v-norm (Gemma 4)";
    AttnRotQ Block QHeads Rotary "attn.hook_rot_q" []
        "queries per head, after RoPE";
    AttnRotK Block KvHeads Rotary "attn.hook_rot_k" []
        "keys per key/value head, after RoPE";
    AttnScores Block Pattern - "attn.hook_attn_scores" []
        "scaled attention logits per head over the keys, masked keys at the dtype's lowest finite value";
    AttnPattern Block Pattern - "attn.hook_pattern" []
        "attention probabilities per head over the keys";
    AttnZ Block QHeads - "attn.hook_z" ["attn.o.hook_in"]
        "attention output per head, the input of o_proj (times sigmoid(gate) where the output is gated)";
    AttnProjOut Block Model PostNorms "attn.hook_out" ["attn.o.hook_out", "ln1_post.hook_in"]
        "o_proj's output, before the post-attention norm (Gemma, OLMo 2)";
    Ln1PostScale Block Scale PostNorms "ln1_post.hook_scale" []
        "sqrt(mean(x²) + eps) of the post-attention norm's input (Gemma, OLMo 2)";
    Ln1PostNormalized Block Model PostNorms "ln1_post.hook_normalized" []
        "post-attention norm's input divided by its scale, before the gain (Gemma, OLMo 2)";
    AttnOut Block Model - "hook_attn_out" ["attn.hook_out", "attn.o.hook_out", "ln1_post.hook_out", "attn.hook_hidden_states"]
        "attention output after o_proj (after the post-attention norm where there is one)";
    ResidMid Block Model ResidMid "hook_resid_mid" ["ln2.hook_in"]
        "residual stream after attention, before the MLP";
    Ln2Scale Block Scale PreNorms "ln2.hook_scale" []
        "sqrt(mean(x²) + eps) of the MLP norm's input (LayerNorm: sqrt(var(x) + eps))";
    Ln2Normalized Block Model PreNorms "ln2.hook_normalized" []
        "MLP norm's input (centred, for LayerNorm) divided by its scale, before the gain and bias";
    MlpIn Block Model - "mlp.hook_in" ["ln2.hook_out", "mlp.gate.hook_in", "mlp.in.hook_in", "mlp.dense_gate.hook_in", "mlp.dense_in.hook_in"]
        "MLP norm's output, after the gain (the MLP's input)";
    MlpPreLinear Block Mlp GatedMlp "mlp.hook_pre_linear" ["mlp.in.hook_out", "mlp.dense_in.hook_out"]
        "up projection (gated MLPs)";
    MlpPre Block Mlp DenseMlp "mlp.hook_pre" ["mlp.gate.hook_out", "mlp.in.hook_out", "mlp.dense_gate.hook_out"]
        "gate projection (a plain MLP's input projection, bias added), before the activation";
    MlpRouterLogits Block Experts Moe "mlp.gate.hook_out" []
        "a mixture's router logits, one per expert (Qwen3-MoE, Mixtral)";
    MlpExpertWeights Block Experts Moe "mlp.hook_expert_weights" ["mlp.gate.hook_expert_weights"]
        "routing weight of each expert (softmax, top-k kept and renormalised as the model says; 0 for the others)";
    MlpExpertIndices Block TopK Moe "mlp.hook_expert_indices" ["mlp.gate.hook_expert_indices"]
        "the experts a token is routed to, most weighted first (as floats)";
    MlpRouterScores Block TopK TopKRouter "mlp.hook_router_scores" []
        "the router's softmax over the top k logits, one per chosen expert, in hook_expert_indices' order (GPT-OSS)";
    MlpExpertsOut Block Model SharedExpert "mlp.experts.hook_out" ["mlp.experts.hook_post"]
        "the routed experts' weighted sum, before the shared expert's output joins it";
    SharedPre Block SharedMlp SharedExpert "mlp.shared_expert.hook_pre" ["mlp.shared_expert.gate.hook_out", "mlp.shared_experts.hook_pre", "mlp.shared_experts.gate.hook_out"]
        "the shared expert's gate projection, before the activation";
    SharedPreLinear Block SharedMlp SharedExpert "mlp.shared_expert.hook_pre_linear" ["mlp.shared_expert.in.hook_out", "mlp.shared_experts.hook_pre_linear", "mlp.shared_experts.in.hook_out"]
        "the shared expert's up projection";
    SharedPost Block SharedMlp SharedExpert "mlp.shared_expert.hook_post" ["mlp.shared_expert.out.hook_in", "mlp.shared_experts.hook_post", "mlp.shared_experts.out.hook_in"]
        "act(gate) * up in the shared expert, the input of its down_proj";
    SharedOut Block Model SharedExpert "mlp.shared_expert.hook_out" ["mlp.shared_expert.out.hook_out", "mlp.shared_experts.hook_out", "mlp.shared_experts.out.hook_out"]
        "the shared expert's output, before its gate (if it has one)";
    SharedGate Block Scale SharedExpertGate "mlp.shared_expert_gate.hook_out" []
        "the shared expert's gate logit; its sigmoid scales the shared expert's output";
    MlpPost Block Mlp DenseMlp "mlp.hook_post" ["mlp.out.hook_in", "mlp.dense_out.hook_in"]
        "act(gate) * up (act(pre) in a plain MLP), the input of down_proj";
    MlpProjOut Block Model PostNorms "mlp.hook_out" ["mlp.out.hook_out", "ln2_post.hook_in"]
        "down_proj's output, before the post-MLP norm (Gemma, OLMo 2)";
    FfnMlpNormed Block Model MixtureBeside "post_feedforward_layernorm_1.hook_out" []
        "the MLP's output normed before it joins the mixture's (Gemma 4 with experts)";
    FfnRouterProbs Block Experts MixtureBeside "router.hook_out" []
        "the router's softmax over every expert (Gemma 4 with experts; its input is hook_resid_mid)";
    FfnExpertsIn Block Model MixtureBeside "pre_feedforward_layernorm_2.hook_out" ["experts.hook_in"]
        "the mixture's input: hook_resid_mid normed (Gemma 4 with experts)";
    FfnExpertsOut Block Model MixtureBeside "experts.hook_out" ["post_feedforward_layernorm_2.hook_in"]
        "the routed experts' weighted sum (Gemma 4 with experts)";
    FfnExpertsNormed Block Model MixtureBeside "post_feedforward_layernorm_2.hook_out" []
        "the mixture's output normed (Gemma 4 with experts)";
    FfnSum Block Model MixtureBeside "ln2_post.hook_in" []
        "the normed MLP and mixture outputs summed, before the post-MLP norm (Gemma 4 with experts)";
    Ln2PostScale Block Scale PostNorms "ln2_post.hook_scale" []
        "sqrt(mean(x²) + eps) of the post-MLP norm's input (Gemma, OLMo 2)";
    Ln2PostNormalized Block Model PostNorms "ln2_post.hook_normalized" []
        "post-MLP norm's input divided by its scale, before the gain (Gemma, OLMo 2)";
    MlpOut Block Model - "hook_mlp_out" ["mlp.hook_out", "mlp.out.hook_out", "ln2_post.hook_out", "mlp.dense_out.hook_out"]
        "MLP output after down_proj (after the post-MLP norm where there is one)";
    PleIn Block Model PerLayerInput "per_layer_input_gate.hook_in" []
        "residual stream after the MLP, before the per-layer input is mixed in (Gemma 4)";
    PleGate Block PerLayer PerLayerInput "per_layer_input_gate.hook_out" []
        "per-layer input gate's projection, before its activation (Gemma 4)";
    PleProjIn Block PerLayer PerLayerInput "per_layer_projection.hook_in" []
        "act(gate) times the layer's per-layer input (Gemma 4)";
    PleProjOut Block Model PerLayerInput "per_layer_projection.hook_out" ["post_per_layer_input_norm.hook_in"]
        "the per-layer input projected back to d_model, before its norm (Gemma 4)";
    PleOut Block Model PerLayerInput "post_per_layer_input_norm.hook_out" []
        "the normed per-layer contribution added to the residual stream (Gemma 4)";
    ResidPost Block Model - "hook_resid_post" ["hook_out"]
        "residual stream leaving the block";
    LnFinalScale Output Scale - "ln_final.hook_scale" []
        "sqrt(mean(x²) + eps) of the final norm's input (LayerNorm: sqrt(var(x) + eps))";
    LnFinalNormalized Output Model - "ln_final.hook_normalized" []
        "final norm's input (centred, for LayerNorm) divided by its scale, before the gain and bias";
    LnFinalOut Output Model - "ln_final.hook_out" []
        "final norm's output after the gain (Hugging Face's last hidden state)";
}

/// The hook kinds `config`'s forward produces, in forward order: every kind of the table
/// whose [`Feature`] its block has ([`features`]); any other kind is refused by name.
pub fn hook_kinds(config: &ModelConfig) -> Vec<HookKind> {
    let features = features(config);
    KINDS.iter().filter(|k| k.kind.needs().is_none_or(|f| features.contains(&f))).map(|k| k.kind).collect()
}

/// The block kinds block `layer` of `config` has: its family's, less the keys' and values'
/// own hooks where the layer attends over an earlier layer's keys and values (Gemma 4's KV
/// sharing: those are the earlier layer's hooks).
pub fn layer_hook_kinds(config: &ModelConfig, layer: usize) -> Vec<HookKind> {
    hook_kinds(config).into_iter().filter(|k| k.info().scope == Scope::Block && layer_has(config, layer, *k)).collect()
}

/// Whether block `layer` computes `kind` (see [`layer_hook_kinds`]): a hybrid's
/// linear-attention layers have the `linear_attn.*` hooks and no attention's, its other
/// layers the reverse.
pub(super) fn layer_has(config: &ModelConfig, layer: usize, kind: HookKind) -> bool {
    use HookKind::*;
    let own_kv = [AttnK, AttnV, AttnKNormScale, AttnKNormNormalized, AttnKNormed, AttnVNormed, AttnRotK];
    let kv = config.kv_source(layer).is_none() || !own_kv.contains(&kind);
    let mixer = match config.linear_attention.as_ref() {
        None => true,
        Some(la) => la.is_linear(layer) == (kind.needs() == Some(Feature::LinearAttention)) || !kind.is_token_mixer(),
    };
    let mlp = kind.needs().is_none_or(|f| layer_features(config, layer).contains(&f));
    kv && mixer && mlp
}

/// The features of `config`'s block: its family's, less the optional parts the config leaves
/// out (Gemma 4 without per-layer inputs or experts).
pub fn features(config: &ModelConfig) -> Vec<Feature> {
    let family = config.arch.family().features;
    let optional = |f: &Feature| match f {
        Feature::PerLayerInput => config.per_layer_input.is_some(),
        Feature::MixtureBeside => config.moe.is_some(),
        Feature::QLora => config.mla.is_some_and(|m| m.q_lora_rank.is_some()),
        _ => true,
    };
    family.iter().copied().filter(optional).collect()
}

/// The features of block `layer`: the block's, where a family with dense blocks before its
/// mixture blocks (DeepSeek-V3's `first_k_dense_replace`) keeps each block's own MLP's, and a
/// hybrid's full-attention layers have no linear attention.
pub fn layer_features(config: &ModelConfig, layer: usize) -> Vec<Feature> {
    use Feature::*;
    let all = features(config);
    let split_mlp = all.contains(&Moe) && all.contains(&DenseMlp);
    let mixture = config.is_mixture_layer(layer);
    let full_attention = config.linear_attention.as_ref().is_some_and(|la| !la.is_linear(layer));
    let keep = |f: &Feature| match f {
        DenseMlp | GatedMlp if split_mlp => !mixture,
        Moe | SharedExpert | SharedExpertGate | TopKRouter if split_mlp => mixture,
        LinearAttention => !full_attention,
        _ => true,
    };
    all.into_iter().filter(keep).collect()
}

impl HookKind {
    /// This kind's row of [`KINDS`].
    pub fn info(self) -> &'static KindInfo {
        KINDS.iter().find(|k| k.kind == self).expect("every kind has a row")
    }

    /// Whether this kind belongs to a block's token mixer: softmax attention (its hooks and
    /// its output) or linear attention. A hybrid's layers have one or the other's.
    pub(super) fn is_token_mixer(self) -> bool {
        use HookKind::*;
        let attention = matches!(
            self,
            AttnQ
                | AttnK
                | AttnV
                | AttnQuery
                | AttnQGate
                | AttnQNormScale
                | AttnQNormNormalized
                | AttnQNormed
                | AttnKNormScale
                | AttnKNormNormalized
                | AttnKNormed
                | AttnVNormed
                | AttnRotQ
                | AttnRotK
                | AttnScores
                | AttnPattern
                | AttnZ
                | AttnProjOut
                | AttnOut
        );
        attention || self.needs() == Some(Feature::LinearAttention)
    }

    /// The feature a block needs for this kind to exist, if any (the table's column).
    pub fn needs(self) -> Option<Feature> {
        self.info().needs
    }
}
