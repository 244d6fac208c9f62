//! DeepSeek-V3 / R1 and Kimi K2 (`model_type` `deepseek_v3`, `kimi_k2`): Llama's pre-norm
//! block with multi-head latent attention ([`crate::layers::mla`]) and, after the first
//! `first_k_dense_replace` dense blocks, a fine-grained mixture with shared experts:
//!
//! ```text
//! x = embed_tokens[input_ids]
//! for each block i:
//!     n = input_layernorm(x)                                    # ln1.*
//!     x = x + o_proj(mla(n))                                    # attn.*, hook_attn_out
//!     n = post_attention_layernorm(x)                           # ln2.*, mlp.hook_in
//!     dense blocks:   m = down(silu(gate(n)) * up(n))           # mlp.hook_pre / pre_linear / post
//!     mixture blocks: s = sigmoid(n · gate.weightᵀ)            # in f32; mlp.gate.hook_out: the logits
//!                     c = s + e_score_correction_bias            # used only to choose
//!                     groups: the topk_group groups of n_group with the largest sum of their
//!                             two best c; experts outside them are not chosen
//!                     top_k by c; weights w = s at the chosen, / (Σ w + 1e-20) when
//!                     norm_topk_prob, × routed_scaling_factor    # mlp.hook_expert_weights
//!                     m = Σ_j w_j · expert_j(n) + shared_experts(n)   # mlp.shared_experts.*
//!     x = x + m                                                 # hook_mlp_out, hook_resid_post
//! norm(x)
//! ```
//!
//! Ties among groups and among experts go to the lower index (`torch.topk` leaves the order
//! of exact ties to its implementation). The multi-token-prediction layer (`model.layers.{n}`
//! for `n = num_hidden_layers`) is not part of the forward and is not read. DeepSeek-V3.2
//! (`deepseek_v32`) is refused by name in the registry; V2's routers (`topk_method` `greedy`
//! or `group_limited_greedy`, softmax scores) are refused here.

use serde::{Deserialize, Serialize};
use siphon_hlo::{DType, TensorType, Value};

use crate::arch::{Arch, Family, FinalNorm, Gain};
use crate::config::{Attention, FamilyExtra, ModelConfig, Moe, ParamClass, ParamInfo, Rope, positive};
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec, Graph, pre_norm_decoder};
use crate::hf_config::{Defaults, HfConfig, need};
use crate::hooks::{Feature, HookKind, HookPoint};
use crate::layers::mla::{self, Mla};
use crate::layers::moe::{Experts, Glu, moe_params};

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

pub(crate) static FAMILY: Family = Family {
    model_types: &["deepseek_v3", "kimi_k2"],
    architectures: &["DeepseekV3ForCausalLM"],
    from_hf,
    build,
    params,
    features: &[
        Feature::PreNorms,
        Feature::ResidMid,
        Feature::Rotary,
        Feature::Mla,
        Feature::QLora,
        Feature::DenseMlp,
        Feature::GatedMlp,
        Feature::Moe,
        Feature::SharedExpert,
    ],
    renames: &[],
    final_norm: FinalNorm::PLAIN,
};

/// DeepSeek-V3's router: sigmoid scores, chosen by score plus a correction bias within the
/// best groups of experts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Router {
    /// Groups the experts fall into, in order (`n_group`).
    pub n_group: usize,
    /// Groups each token's experts come from (`topk_group`).
    pub topk_group: usize,
    /// Multiplies the routing weights (`routed_scaling_factor`).
    pub scaling: f64,
}

impl FamilyExtra for Router {
    const KEY: &'static str = "deepseek";
}

/// DeepseekV3Config's defaults where a key is missing (eps 1e-6, base 1e4, untied).
fn from_hf(mut hf: HfConfig) -> Result<ModelConfig, ModelError> {
    let refuse = |what: String| Err(ModelError::UnsupportedArch(format!("deepseek_v3 with {what}")));
    if hf.attention_bias == Some(true) {
        return refuse("attention_bias = true".into());
    }
    if let Some(method) = hf.key::<String>("topk_method")?.filter(|m| m != "noaux_tc") {
        return refuse(format!("topk_method {method:?} (DeepSeek-V2's router; siphon builds V3's noaux_tc)"));
    }
    if let Some(scoring) = hf.key::<String>("scoring_func")?.filter(|s| s != "sigmoid") {
        return refuse(format!("scoring_func {scoring:?} (V3 scores by sigmoid)"));
    }
    let mla = Mla::from_hf(&hf)?;
    let n_heads = need(hf.num_attention_heads, "num_attention_heads")?;
    if hf.num_key_value_heads.is_some_and(|kv| kv != n_heads) {
        return refuse(format!(
            "num_key_value_heads {} != num_attention_heads {n_heads} (latent attention expands keys and values per head)",
            hf.num_key_value_heads.unwrap_or(0)
        ));
    }
    let n_experts: usize = need(hf.key("n_routed_experts")?, "n_routed_experts")?;
    let top_k = need(hf.num_experts_per_tok, "num_experts_per_tok")?;
    let n_group: usize = hf.key("n_group")?.unwrap_or(1);
    let topk_group: usize = hf.key("topk_group")?.unwrap_or(1);
    if n_group == 0 || !n_experts.is_multiple_of(n_group) || n_experts / n_group < 2 {
        return refuse(format!("{n_experts} experts in {n_group} groups (whole groups of two or more experts)"));
    }
    if topk_group == 0 || topk_group > n_group || topk_group * (n_experts / n_group) < top_k {
        return refuse(format!(
            "top {top_k} experts from {topk_group} of {n_group} groups of {} experts",
            n_experts / n_group
        ));
    }
    let expert_size = need(hf.key("moe_intermediate_size")?, "moe_intermediate_size")?;
    let n_shared: usize = hf.key("n_shared_experts")?.unwrap_or(0);
    let moe = Moe {
        n_experts,
        top_k,
        norm_topk: hf.norm_topk_prob.unwrap_or(true),
        expert_size,
        shared_expert: (n_shared > 0).then_some(expert_size * n_shared),
        first_dense: hf.key("first_k_dense_replace")?.unwrap_or(0),
    };
    if moe.shared_expert.is_none() {
        return refuse("n_shared_experts = 0".into());
    }
    let scaling = positive("routed_scaling_factor", hf.key("routed_scaling_factor")?.unwrap_or(1.0))?;
    let router = Router { n_group, topk_group, scaling };
    // RoPE turns the `qk_rope_head_dim` part only (transformers sets head_dim to it).
    hf.head_dim = Some(mla.rope);
    let c = hf.decoder(ARCH, &Defaults::LLAMA)?;
    let qk = mla.qk_head_dim();
    Ok(ModelConfig {
        attention: Attention {
            n_kv_heads: n_heads,
            head_dim: qk,
            scalar: softmax_mscale(&hf)?.map(|m| qk as f64 / m.powi(4)),
            ..c.attention
        },
        rope: Rope { rotary_dim: Some(mla.rope), ..c.rope },
        moe: Some(moe),
        mla: Some(mla),
        ..c
    }
    .with_extra(&router))
}

/// YaRN's `mscale_all_dim` factor, which multiplies the softmax scale squared
/// (transformers' `yarn_apply_mscale`, with the object's `factor`), when the config has one.
fn softmax_mscale(hf: &HfConfig) -> Result<Option<f64>, ModelError> {
    let Some(rope) = hf.rope_object()? else { return Ok(None) };
    let Some(all) = rope.number("mscale_all_dim")?.filter(|&m| m != 0.0) else { return Ok(None) };
    if rope.kind()? == "default" {
        return Ok(None);
    }
    let factor = rope.required("factor")?;
    let mscale = if factor <= 1.0 { 1.0 } else { 0.1 * all * factor.ln() + 1.0 };
    if !(mscale > 0.0 && mscale.is_finite()) {
        return Err(ModelError::Config(format!(
            "mscale_all_dim {all} with factor {factor} scales the attention by {mscale}, not a positive number"
        )));
    }
    Ok(Some(mscale))
}

/// Every weight, in Hugging Face's names: per block the norms, the latent attention, and
/// the dense MLP or the router (with its correction bias), the experts and the shared ones.
fn params(c: &ModelConfig, n_layers: usize, with_lm_head: bool) -> Vec<ParamInfo> {
    use ParamClass::*;
    let h = c.hidden_size;
    let mut out = vec![ParamInfo::new("model.embed_tokens.weight", &[c.vocab_size, h], Embedding, None)];
    for l in 0..n_layers {
        let p = |suffix: &str, shape: &[usize], class| {
            ParamInfo::new(format!("model.layers.{l}.{suffix}"), shape, class, Some(l))
        };
        out.push(p("input_layernorm.weight", &[h], Norm));
        if let Some(mla) = &c.mla {
            out.extend(mla::params(c, mla, l));
        }
        out.push(p("post_attention_layernorm.weight", &[h], Norm));
        match c.moe.as_ref().filter(|_| c.is_mixture_layer(l)) {
            None => {
                let i = c.intermediate_size;
                out.push(p("mlp.gate_proj.weight", &[i, h], MlpGate));
                out.push(p("mlp.up_proj.weight", &[i, h], MlpUp));
                out.push(p("mlp.down_proj.weight", &[h, i], MlpDown));
            }
            Some(moe) => {
                out.extend(moe_params(c, l));
                out.push(p("mlp.gate.e_score_correction_bias", &[moe.n_experts], Router));
                let s = moe.shared_expert.unwrap_or(0);
                out.push(p("mlp.shared_experts.gate_proj.weight", &[s, h], MlpGate));
                out.push(p("mlp.shared_experts.up_proj.weight", &[s, h], MlpUp));
                out.push(p("mlp.shared_experts.down_proj.weight", &[h, s], MlpDown));
            }
        }
    }
    out.push(ParamInfo::new("model.norm.weight", &[h], Norm, None));
    if with_lm_head && !c.tie_word_embeddings {
        out.push(ParamInfo::new("lm_head.weight", &[c.vocab_size, h], LmHead, None));
    }
    out
}

fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.mla.is_none() || config.extras.get::<Router>().is_none() || config.moe.is_none() {
        return Err(ModelError::UnsupportedArch(format!("the deepseek_v3 builder given a {} config", config.arch)));
    }
    let mixer = |g: &mut Graph<'_>, n: Value, layer: usize, (): ()| {
        let attn = g.mla_attention(n, layer)?;
        g.hook(HookPoint::block(layer, HookKind::AttnOut), attn);
        Ok(attn)
    };
    let mlp = |g: &mut Graph<'_>, n: Value, layer: usize| match config.is_mixture_layer(layer) {
        true => mixture(g, n, layer),
        false => g.dense_mlp(n, layer),
    };
    pre_norm_decoder(config, spec, Gain::Plain, |_, _| Ok(()), mixer, mlp)
}

/// Block `layer`'s mixture on its normed input `x`: the router (see the module docs), the
/// routed experts through the shared dispatch, and the shared experts added.
fn mixture(g: &mut Graph<'_>, x: Value, layer: usize) -> Result<Value, ModelError> {
    use HookKind::*;
    let at = |kind| HookPoint::block(layer, kind);
    let p = |name: &str| format!("model.layers.{layer}.mlp.{name}");
    let (moe, router) = match (&g.config.moe, g.config.extras.get::<Router>()) {
        (Some(moe), Some(router)) => (moe.clone(), router),
        _ => return Err(ModelError::Config("a deepseek_v3 mixture without its router".into())),
    };
    let (t, e, groups) = (g.tokens(), moe.n_experts, router.n_group);
    let te = [t, e];
    // Logits in f32 from f32 operands (transformers keeps the router in f32).
    let xf = g.b.convert(x, DType::F32)?;
    let w = g.w(&p("gate.weight"))?;
    let w = g.b.convert(w, DType::F32)?;
    let logits = g.matmul_t(xf, w)?;
    g.hook(at(MlpRouterLogits), logits);
    let scores = g.b.logistic(logits)?;
    let bias = g.w(&p("gate.e_score_correction_bias"))?;
    let bias = g.b.convert(bias, DType::F32)?;
    let bias = g.b.broadcast_in_dim(bias, &te, &[1])?;
    let choice = g.b.add(scores, bias)?;
    // Each group's score: the sum of its two best.
    let per = e / groups;
    let grouped = g.b.reshape(choice, &[t * groups, per])?;
    let (_, _, best2) = g.top_k_choice(grouped, 2)?;
    let group_scores = g.b.reduce_sum(best2, &[1])?;
    let group_scores = g.b.reshape(group_scores, &[t, groups])?;
    let (kept, _, _) = g.top_k_choice(group_scores, router.topk_group)?;
    let kept = g.b.broadcast_in_dim(kept, &[t, groups, per], &[0, 1])?;
    let kept = g.b.reshape(kept, &te)?;
    let out = g.b.splat(f64::NEG_INFINITY, TensorType::new(DType::F32, &te))?;
    let choice = g.b.select(kept, choice, out)?;
    let (chosen, indices, _) = g.top_k_choice(choice, moe.top_k)?;
    // The weights from the scores without the bias.
    let zero = g.b.splat(0.0, TensorType::new(DType::F32, &te))?;
    let mut weights = g.b.select(chosen, scores, zero)?;
    if moe.norm_topk {
        let sum = g.b.reduce_sum(weights, &[1])?;
        let tiny = g.b.splat(1e-20, TensorType::new(DType::F32, &[t]))?;
        let sum = g.b.add(sum, tiny)?;
        let sum = g.b.broadcast_in_dim(sum, &te, &[0])?;
        weights = g.b.div(weights, sum)?;
    }
    let scaling = g.b.splat(router.scaling, TensorType::new(DType::F32, &te))?;
    let weights = g.b.mul(weights, scaling)?;
    let weights = g.b.convert(weights, g.dt)?;
    g.hook(at(MlpExpertWeights), weights);
    g.hook(at(MlpExpertIndices), indices);
    let idx = g.b.convert(indices, DType::I32)?;
    let idx = g.b.reshape(idx, &[t, moe.top_k, 1])?;
    let chosen_weights = g.b.take_along(weights, 0, &[1], idx)?;
    let experts = Experts {
        weights: ["gate_proj", "up_proj", "down_proj"]
            .into_iter()
            .map(|n| g.w(&p(&format!("experts.{n}"))))
            .collect::<Result<_, _>>()?,
        biases: None,
        glu: Glu::Act(g.config.activation),
    };
    let routed = g.routed(x, &experts, chosen_weights, indices)?;
    g.hook(at(MlpExpertsOut), routed);
    let shared = g.shared_expert(x, &p("shared_experts"), layer)?;
    Ok(g.b.add(routed, shared)?)
}

#[cfg(test)]
mod tests {
    use crate::config::ModelConfig;
    use crate::error::ModelError;
    use crate::hf_config::HfConfig;

    /// DeepSeek-V3's own config.json, less the keys siphon does not read.
    const V3: &str = r#"{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_hidden_layers": 61, "num_nextn_predict_layers": 1, "num_attention_heads": 128,
        "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5,
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
        "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": true, "scoring_func": "sigmoid",
        "hidden_act": "silu", "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096, "type": "yarn"},
        "tie_word_embeddings": false, "attention_bias": false}"#;

    fn parse(json: &str) -> Result<ModelConfig, ModelError> {
        HfConfig::from_json(json).unwrap().into_config()
    }

    #[test]
    fn reads_deepseek_v3s_own_config() {
        let c = parse(V3).unwrap();
        let mla = c.mla.unwrap();
        assert_eq!((mla.q_lora_rank, mla.kv_lora_rank, mla.qk_head_dim(), mla.v_head_dim), (Some(1536), 512, 192, 128));
        assert!(mla.interleave);
        assert_eq!((c.attention.head_dim, c.rope.rotary_dim, c.attention.n_kv_heads), (192, Some(64), 128));
        let moe = c.moe.as_ref().unwrap();
        assert_eq!((moe.n_experts, moe.top_k, moe.shared_expert, moe.first_dense), (256, 8, Some(2048), 3));
        let router = c.extras.get::<super::Router>().unwrap();
        assert_eq!((router.n_group, router.topk_group, router.scaling), (8, 4, 2.5));
        // The softmax scale 192^-½ · (0.1·ln 40 + 1)².
        let m = 0.1 * 40f64.ln() + 1.0;
        assert!((c.attention.scalar.unwrap().powf(-0.5) - m * m / 192f64.sqrt()).abs() < 1e-12);
        assert!(!c.is_mixture_layer(2) && c.is_mixture_layer(3));
        // The multi-token-prediction block (layer 61) is not read.
        let names: Vec<String> = c.params(c.n_layers, true).into_iter().map(|p| p.name).collect();
        assert!(!names.iter().any(|n| n.starts_with("model.layers.61.")));
        assert!(names.contains(&"model.layers.3.mlp.gate.e_score_correction_bias".to_string()));
        assert!(names.contains(&"model.layers.2.mlp.gate_proj.weight".to_string()));
        let kimi = V3.replace("\"deepseek_v3\"", "\"kimi_k2\"");
        assert_eq!(parse(&kimi).unwrap().arch, super::ARCH);
    }

    #[test]
    fn refuses_what_it_does_not_build() {
        for (change, named) in [
            (("\"noaux_tc\"", "\"group_limited_greedy\""), "topk_method \"group_limited_greedy\""),
            (("\"scoring_func\": \"sigmoid\"", "\"scoring_func\": \"softmax\""), "scoring_func \"softmax\""),
            (("\"n_group\": 8", "\"n_group\": 3"), "256 experts in 3 groups"),
            (("\"topk_group\": 4", "\"topk_group\": 9"), "from 9 of 8 groups"),
            (("\"num_key_value_heads\": 128", "\"num_key_value_heads\": 8"), "num_key_value_heads 8"),
            (("\"model_type\": \"deepseek_v3\"", "\"model_type\": \"deepseek_v32\""), "sparse attention"),
        ] {
            let err = parse(&V3.replace(change.0, change.1)).unwrap_err().to_string();
            assert!(err.contains(named), "{err}");
        }
    }

    #[test]
    fn dense_and_mixture_blocks_have_their_own_mlp_hooks() {
        use crate::hooks::{HookKind, HookPoint, layer_hook_kinds};
        let c = parse(V3).unwrap();
        let (dense, mixture) = (layer_hook_kinds(&c, 0), layer_hook_kinds(&c, 3));
        assert!(dense.contains(&HookKind::MlpPre) && !dense.contains(&HookKind::MlpRouterLogits));
        assert!(mixture.contains(&HookKind::SharedPre) && !mixture.contains(&HookKind::MlpPreLinear));
        assert!(!mixture.contains(&HookKind::SharedGate));
        assert_eq!(HookPoint::parse("blocks.0.mlp.hook_pre", &c).unwrap().kind(), HookKind::MlpPre);
        assert_eq!(HookPoint::parse("blocks.3.mlp.hook_pre", &c).unwrap().kind(), HookKind::MlpIn);
        assert_eq!(HookPoint::parse("blocks.3.mlp.hook_post", &c).unwrap().kind(), HookKind::MlpOut);
        let err = HookPoint::parse("blocks.0.mlp.hook_expert_weights", &c).unwrap_err().to_string();
        assert!(err.contains("block 0 is a dense block (the first 3 blocks are dense)"), "{err}");
        let err = HookPoint::parse("blocks.0.mlp.shared_experts.hook_in", &c).unwrap_err().to_string();
        assert!(
            err.contains("block 0 has no mlp.shared_experts.hook_in, which this model's other blocks have"),
            "{err}"
        );
        for (name, dims) in [
            ("blocks.3.attn.hook_q", vec![128, 192]),
            ("blocks.3.attn.hook_v", vec![128, 128]),
            ("blocks.3.attn.hook_z", vec![128, 128]),
            ("blocks.3.attn.hook_rot_k", vec![1, 64]),
            ("blocks.3.attn.hook_q_latent", vec![1536]),
            ("blocks.3.attn.kv_a_proj_with_mqa.hook_out", vec![576]),
            ("blocks.3.attn.kv_b_proj.hook_out", vec![128 * 256]),
            ("blocks.3.mlp.shared_experts.hook_post", vec![2048]),
        ] {
            assert_eq!(HookPoint::parse(name, &c).unwrap().dims(&c, 7), dims, "{name}");
        }
        let no_lora = parse(&V3.replace("\"q_lora_rank\": 1536", "\"q_lora_rank\": null")).unwrap();
        assert!(HookPoint::parse("blocks.0.attn.hook_q_latent", &no_lora).is_err());
        assert_eq!(HookPoint::parse("blocks.0.attn.q_proj.hook_out", &no_lora).unwrap().kind(), HookKind::MlaQProj);
    }
}
