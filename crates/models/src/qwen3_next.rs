//! Qwen3-Next (`model_type` `qwen3_next`, Qwen3-Next-80B-A3B): the hybrid decoder Qwen3.5
//! ([`crate::qwen3_5`]) also has. Its layers are Gated DeltaNet linear attention
//! ([`crate::layers::gated_deltanet`]) or gated full attention as `layer_types` says (three linear
//! for each full one by default); every norm is `(1 + w)`; every MLP a routed mixture with a
//! gated shared expert.
//!
//! ```text
//! x = embed_tokens[input_ids]
//! for each block i:
//!     n = input_layernorm(x)                                 # (1 + w)
//!     linear layers:  a = linear_attn(n)                     # linear_attn.*
//!     full layers:    q | gate = q_proj(n) per head           # attn.hook_q: both, attn.hook_q_gate
//!                     q, k = q_norm(q), k_norm(k_proj(n))     # (1 + w), per head
//!                     q, k = rope(q), rope(k)                 # partial rotary (0.25 by default)
//!                     z = attention(q, k, v) · sigmoid(gate)  # attn.hook_z
//!                     a = o_proj(z)                           # hook_attn_out
//!     x = x + a                                              # hook_resid_mid
//!     n = post_attention_layernorm(x)                        # mlp.hook_in
//!     m = Σ_j w_j · expert_j(n)                              # mlp.gate.*, mlp.experts.hook_out
//!       + sigmoid(shared_expert_gate(n)) · shared_expert(n)  # mlp.shared_expert.*
//!     x = x + m                                              # hook_mlp_out, hook_resid_post
//! norm(x)                                                    # (1 + w)
//! ```
//!
//! Weights as transformers and the hub store them: the routed experts per expert
//! (`mlp.experts.{e}.{gate,up,down}_proj`), the linear attention's fused `in_proj_qkvz` and
//! `in_proj_ba` (cut into their parts on read). Configs with dense MLP layers
//! (`decoder_sparse_step` ≠ 1, `mlp_only_layers`) are refused, as are attention biases;
//! the multi-token-prediction weights (`mtp.*`) are not read.

use siphon_hlo::Value;

use crate::arch::{Arch, Family, FinalNorm, Gain};
use crate::config::{Attention, ModelConfig, Moe, ParamClass, ParamInfo};
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec, Graph, pre_norm_decoder};
use crate::hf_config::{Defaults, HfConfig, need};
use crate::hooks::{Feature, HookKind, HookPoint};
use crate::layers::gated_deltanet::{self, LinearAttention};
use crate::layers::moe::moe_params;
use crate::layers::norm::head_norm;

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// The hybrid decoder with the mixture and its shared expert.
pub(crate) static FAMILY: Family = Family {
    model_types: &["qwen3_next"],
    architectures: &["Qwen3NextForCausalLM"],
    from_hf,
    build: build_hybrid,
    params: hybrid_params,
    features: MIXTURE_FEATURES,
    renames: &[],
    final_norm: FinalNorm::UNIT_OFFSET,
};

/// The hooks of the hybrid decoder with a mixture (Qwen3-Next, Qwen3.5-MoE).
pub(crate) const MIXTURE_FEATURES: &[Feature] = &[
    Feature::PreNorms,
    Feature::ResidMid,
    Feature::Rotary,
    Feature::QkNorm,
    Feature::AttnGate,
    Feature::LinearAttention,
    Feature::Moe,
    Feature::SharedExpert,
    Feature::SharedExpertGate,
];

/// Qwen3NextConfig's (Qwen3.5's too): head_dim 256, eps 1e-6, base 1e4, untied.
pub(crate) const DEFAULTS: Defaults = Defaults { head_dim: Some(256), ..Defaults::LLAMA };

fn from_hf(hf: HfConfig) -> Result<ModelConfig, ModelError> {
    let refuse = |what: &str| Err(ModelError::UnsupportedArch(format!("qwen3_next with {what}")));
    let dense_layers = hf.key::<Vec<usize>>("mlp_only_layers")?.is_some_and(|l| !l.is_empty());
    if hf.key::<usize>("decoder_sparse_step")?.unwrap_or(1) != 1 || dense_layers {
        return refuse("dense MLP layers (decoder_sparse_step != 1 or mlp_only_layers)");
    }
    let moe = Some(mixture(&hf, hf.norm_topk_prob.unwrap_or(true))?);
    hybrid(hf, ARCH, &DEFAULTS, true, moe)
}

/// The routed experts and the shared expert of a Qwen3-Next-style config.
pub(crate) fn mixture(hf: &HfConfig, norm_topk: bool) -> Result<Moe, ModelError> {
    let (n_experts, top_k) = hf.experts()?;
    Ok(Moe {
        n_experts,
        top_k,
        norm_topk,
        expert_size: need(hf.key("moe_intermediate_size")?, "moe_intermediate_size")?,
        shared_expert: Some(need(hf.key("shared_expert_intermediate_size")?, "shared_expert_intermediate_size")?),
        ..Default::default()
    })
}

/// The hybrid decoder's configuration (Qwen3-Next, Qwen3.5): the decoder's sizes with
/// `defaults` and partial rotary 0.25 by default, gated attention with q/k norms, the
/// linear-attention layers (their projections `fused` as Qwen3-Next stores them) and the
/// mixture, if any.
pub(crate) fn hybrid(
    mut hf: HfConfig,
    arch: Arch,
    defaults: &Defaults,
    fused: bool,
    moe: Option<Moe>,
) -> Result<ModelConfig, ModelError> {
    if hf.attention_bias == Some(true) {
        return Err(ModelError::UnsupportedArch(format!("{arch} with attention_bias = true")));
    }
    let in_parameters = hf.rope_parameters.as_ref().and_then(|p| p.get("partial_rotary_factor")).is_some();
    if !in_parameters {
        hf.partial_rotary_factor.get_or_insert(0.25);
    }
    if moe.is_some() {
        // The dense MLP's width is unused.
        hf.intermediate_size.get_or_insert(0);
    }
    let c = hf.decoder(arch, defaults)?;
    let linear_attention = Some(LinearAttention::from_hf(&hf, c.n_layers, fused)?);
    Ok(ModelConfig {
        attention: Attention { qk_norm: true, output_gate: true, ..c.attention },
        linear_attention,
        moe,
        ..c
    })
}

/// Every weight of the hybrid decoder, in Hugging Face's names.
pub(crate) fn hybrid_params(c: &ModelConfig, n_layers: usize, with_lm_head: bool) -> Vec<ParamInfo> {
    use ParamClass::*;
    let (h, d) = (c.hidden_size, c.attention.head_dim);
    let (q, kv, i) = (c.attention.n_heads * d, c.attention.n_kv_heads * d, c.intermediate_size);
    let mut out = vec![ParamInfo::new("model.embed_tokens.weight", &[c.vocab_size, h], Embedding, None)];
    for l in 0..n_layers {
        let p = |out: &mut Vec<ParamInfo>, suffix: &str, shape: &[usize], class| {
            out.push(ParamInfo::new(format!("model.layers.{l}.{suffix}"), shape, class, Some(l)))
        };
        p(&mut out, "input_layernorm.weight", &[h], Norm);
        match c.linear_attention.as_ref().filter(|la| la.is_linear(l)) {
            Some(la) => out.extend(gated_deltanet::params(la, h, l)),
            None => {
                // q_proj: each head's query, then its gate.
                p(&mut out, "self_attn.q_proj.weight", &[2 * q, h], AttnQ);
                p(&mut out, "self_attn.k_proj.weight", &[kv, h], AttnK);
                p(&mut out, "self_attn.v_proj.weight", &[kv, h], AttnV);
                p(&mut out, "self_attn.q_norm.weight", &[d], Norm);
                p(&mut out, "self_attn.k_norm.weight", &[d], Norm);
                p(&mut out, "self_attn.o_proj.weight", &[h, q], AttnO);
            }
        }
        p(&mut out, "post_attention_layernorm.weight", &[h], Norm);
        match c.moe.as_ref().map(|m| m.shared_expert.unwrap_or(0)) {
            None => {
                p(&mut out, "mlp.gate_proj.weight", &[i, h], MlpGate);
                p(&mut out, "mlp.up_proj.weight", &[i, h], MlpUp);
                p(&mut out, "mlp.down_proj.weight", &[h, i], MlpDown);
            }
            Some(s) => {
                // The router and the routed experts as Qwen3-MoE's, then the shared expert.
                out.extend(moe_params(c, l));
                p(&mut out, "mlp.shared_expert.gate_proj.weight", &[s, h], MlpGate);
                p(&mut out, "mlp.shared_expert.up_proj.weight", &[s, h], MlpUp);
                p(&mut out, "mlp.shared_expert.down_proj.weight", &[h, s], MlpDown);
                p(&mut out, "mlp.shared_expert_gate.weight", &[1, h], Router);
            }
        }
    }
    out.push(ParamInfo::new("model.norm.weight", &[h], Norm, None));
    if with_lm_head && !c.tie_word_embeddings {
        out.push(ParamInfo::new("lm_head.weight", &[c.vocab_size, h], LmHead, None));
    }
    out
}

/// Builds the hybrid decoder's forward for `spec` (Qwen3-Next, Qwen3.5, Qwen3.5-MoE).
pub(crate) fn build_hybrid(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.linear_attention.is_none()
        || !config.attention.output_gate
        || !config.attention.qk_norm
        || config.attention.qkv_bias
    {
        return Err(ModelError::UnsupportedArch(format!("the hybrid builder given a {} config", config.arch)));
    }
    let mixer = |g: &mut Graph<'_>, n: Value, layer: usize, (): ()| {
        if gated_deltanet::is_linear(config, layer) {
            return g.gated_deltanet(n, layer);
        }
        let attn = gated_attention(g, n, layer)?;
        g.hook(HookPoint::block(layer, HookKind::AttnOut), attn);
        Ok(attn)
    };
    let mlp = |g: &mut Graph<'_>, n: Value, layer: usize| match config.moe {
        Some(_) => shared_mixture(g, n, layer),
        None => g.dense_mlp(n, layer),
    };
    pre_norm_decoder(config, spec, Gain::UnitOffset, |_, _| Ok(()), mixer, mlp)
}

/// Gated full attention of block `layer` on its normed input `n` (Qwen3NextAttention):
/// `q_proj` gives each head's query and gate side by side, `(1 + w)` q/k norms per head,
/// partial RoPE, and `o_proj(z · sigmoid(gate))`.
fn gated_attention(g: &mut Graph<'_>, n: Value, layer: usize) -> Result<Value, ModelError> {
    use HookKind::*;
    let at = |kind| HookPoint::block(layer, kind);
    let c = g.config;
    let (t, heads, d, kv) = (g.tokens(), c.attention.n_heads, c.attention.head_dim, c.attention.n_kv_heads);
    let p = |name: &str| format!("model.layers.{layer}.self_attn.{name}");
    let both = g.linear(n, &p("q_proj.weight"), None)?;
    let k = g.linear(n, &p("k_proj.weight"), None)?;
    let v = g.linear(n, &p("v_proj.weight"), None)?;
    g.hook(at(AttnQ), both);
    g.hook(at(AttnK), k);
    g.hook(at(AttnV), v);
    let both = g.b.reshape(both, &[t, heads, 2 * d])?;
    let q = g.b.slice_dim(both, 2, 0, d)?;
    let gate = g.b.slice_dim(both, 2, d, 2 * d)?;
    let gate = g.b.reshape(gate, &[t, heads * d])?;
    g.hook(at(AttnQuery), q);
    g.hook(at(AttnQGate), gate);
    let k = g.b.reshape(k, &[t, kv, d])?;
    let q_hooks = [AttnQNormScale, AttnQNormNormalized, AttnQNormed].map(at);
    let k_hooks = [AttnKNormScale, AttnKNormNormalized, AttnKNormed].map(at);
    let q = head_norm(g, q, &p("q_norm.weight"), Gain::UnitOffset, q_hooks)?;
    let k = head_norm(g, k, &p("k_norm.weight"), Gain::UnitOffset, k_hooks)?;
    let (cos, sin) = g.layer_rope(layer)?;
    let (q, k) = (g.apply_rope(q, cos, sin)?, g.apply_rope(k, cos, sin)?);
    g.hook(at(AttnRotQ), q);
    g.hook(at(AttnRotK), k);
    let q = g.b.reshape(q, &[t, heads * d])?;
    let k = g.b.reshape(k, &[t, kv * d])?;
    let mask = g.layer_mask(layer)?;
    let z = g.attend(layer, q, k, v, mask)?;
    let sig = g.b.logistic(gate)?;
    let z = g.b.mul(z, sig)?;
    // The gate applies before o_proj: o_proj's input, hook_z, is the gated output.
    g.hook(at(AttnZ), z);
    g.linear(z, &p("o_proj.weight"), None)
}

/// The routed mixture of block `layer` ([`Graph::moe_mlp`]) plus its gated shared expert:
/// `routed + sigmoid(shared_expert_gate(x)) · shared_expert(x)` (Qwen2MoeSparseMoeBlock).
fn shared_mixture(g: &mut Graph<'_>, x: Value, layer: usize) -> Result<Value, ModelError> {
    use HookKind::*;
    let at = |kind| HookPoint::block(layer, kind);
    let p = |name: &str| format!("model.layers.{layer}.mlp.{name}");
    let routed = g.moe_mlp(x, layer)?;
    g.hook(at(MlpExpertsOut), routed);
    let shared = g.shared_expert(x, &p("shared_expert"), layer)?;
    let gate = g.linear(x, &p("shared_expert_gate.weight"), None)?;
    g.hook(at(SharedGate), gate);
    let gate = g.b.logistic(gate)?;
    let dims = g.b.dims(shared)?.to_vec();
    let gate = g.b.reshape(gate, &[dims[0]])?;
    let gate = g.b.broadcast_in_dim(gate, &dims, &[0])?;
    let shared = g.b.mul(gate, shared)?;
    Ok(g.b.add(routed, shared)?)
}

#[cfg(test)]
mod tests {
    use crate::config::ModelConfig;
    use crate::error::ModelError;
    use crate::hf_config::HfConfig;

    fn parse(extra: &str) -> Result<ModelConfig, ModelError> {
        let base = r#"{"model_type": "qwen3_next", "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 8,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 8, "shared_expert_intermediate_size": 12, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8"#;
        HfConfig::from_json(&format!("{base}{extra}}}")).unwrap().into_config()
    }

    #[test]
    fn reads_qwen3_next_as_qwen3nextconfig_does() {
        let c = parse("").unwrap();
        let la = c.linear_attention.as_ref().unwrap();
        assert_eq!(la.layers, [true, true, true, false, true, true, true, false]);
        assert!(la.fused && c.attention.output_gate && c.attention.qk_norm);
        assert_eq!((c.attention.head_dim, c.rope.rotary_dim, la.conv_kernel), (256, Some(64), 4));
        let moe = c.moe.as_ref().unwrap();
        assert_eq!((moe.shared_expert, moe.norm_topk), (Some(12), true));
        let c = parse(r#", "full_attention_interval": 2, "partial_rotary_factor": 0.5, "head_dim": 16"#).unwrap();
        assert_eq!(c.linear_attention.unwrap().layers, [true, false, true, false, true, false, true, false]);
        assert_eq!(c.rope.rotary_dim, Some(8));
        let err = parse(r#", "mlp_only_layers": [0]"#).unwrap_err().to_string();
        assert!(err.contains("qwen3_next with dense MLP layers"), "{err}");
        let err = parse(
            r#", "layer_types": ["linear_attention", "sliding_attention", "full_attention",
            "full_attention", "full_attention", "full_attention", "full_attention", "full_attention"]"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("layer type \"sliding_attention\" in a hybrid decoder"), "{err}");
        let err = parse(r#", "linear_num_value_heads": 3"#).unwrap_err().to_string();
        assert!(err.contains("value heads a multiple of the key heads"), "{err}");
        // Not taken as 1 (Hugging Face's modulo would divide by zero).
        let err = parse(r#", "full_attention_interval": 0"#).unwrap_err().to_string();
        assert!(err.contains("full_attention_interval 0"), "{err}");
    }

    #[test]
    fn each_layer_has_its_token_mixers_hooks() {
        use crate::hooks::{HookKind, HookPoint, layer_hook_kinds, resolve_hooks};
        let c = parse("").unwrap();
        let (linear, full) = (layer_hook_kinds(&c, 0), layer_hook_kinds(&c, 3));
        assert!(linear.contains(&HookKind::LinOut) && !linear.contains(&HookKind::AttnOut));
        assert!(full.contains(&HookKind::AttnQGate) && !full.contains(&HookKind::LinBeta));
        assert!(linear.contains(&HookKind::SharedGate) && full.contains(&HookKind::MlpExpertsOut));
        assert_eq!(HookPoint::parse("blocks.3.attn.hook_q", &c).unwrap().dims(&c, 5), [8, 256]);
        assert_eq!(HookPoint::parse("blocks.0.linear_attn.hook_v", &c).unwrap().dims(&c, 5), [4, 8]);
        let q_in = HookPoint::parse("blocks.3.attn.q_norm.hook_in", &c).unwrap();
        assert_eq!(q_in.kind(), HookKind::AttnQuery);
        let err = resolve_hooks("blocks.*.hook_attn_out", &c).unwrap_err().to_string();
        assert!(err.contains("block 0 is a linear-attention (Gated DeltaNet) layer"), "{err}");
        assert!(err.contains("blocks.0.linear_attn.hook_out"), "{err}");
        let err = HookPoint::parse("blocks.3.linear_attn.hook_beta", &c).unwrap_err().to_string();
        assert!(err.contains("block 3 is a full-attention layer"), "{err}");
        // The linear attention's input is the attention norm's output, on its own layers only.
        assert_eq!(HookPoint::parse("blocks.0.linear_attn.hook_in", &c).unwrap().kind(), HookKind::Ln1Out);
        let err = HookPoint::parse("blocks.3.linear_attn.hook_in", &c).unwrap_err().to_string();
        assert!(err.contains("block 3 has no linear_attn.hook_in"), "{err}");
        let err = resolve_hooks("blocks.*.linear_attn.hook_linear_attn_in", &c).unwrap_err().to_string();
        assert!(err.contains("block 3 has no linear_attn.hook_linear_attn_in"), "{err}");
        let err = HookPoint::parse("blocks.0.linear_attn.hook_ssm_state", &c).unwrap_err().to_string();
        assert!(err.contains("recurrent state"), "{err}");
        assert_eq!(resolve_hooks("blocks.{0,4}.linear_attn.hook_ssm_write", &c).unwrap().len(), 2);
    }
}
