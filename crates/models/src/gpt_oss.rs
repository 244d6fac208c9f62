//! GPT-OSS (`model_type` `gpt_oss`, gpt-oss-20b and -120b): a pre-norm decoder (RMSNorm with
//! its gain applied in f32) whose attention has q/k/v/o biases and a learned sink per head
//! (a logit each head's softmax includes and then drops), layers alternating between a
//! sliding window (128) and full attention (`layer_types`), YaRN RoPE; every MLP is a routed
//! mixture: a router with a bias, the `num_experts_per_tok` largest logits and a softmax over
//! just those, experts with biases and a clamped SwiGLU, `(clamp(up, ±limit) + 1) · g ·
//! σ(alpha · g)` with `g = min(gate, limit)`.
//!
//! ```text
//! x = embed_tokens[input_ids]
//! for each block i:
//!     n = input_layernorm(x)
//!     q, k, v = q_proj(n) + b, k_proj(n) + b, v_proj(n) + b
//!     x = x + o_proj(attn(rope(q), rope(k), v; sinks)) + b   # hook_attn_out, hook_resid_mid
//!     n = post_attention_layernorm(x)
//!     logits = router(n) + b; top k logits -> softmax        # mlp.router.*
//!     x = x + Σ_j w_j · expert_j(n)                          # hook_mlp_out, hook_resid_post
//! norm(x)
//! ```
//!
//! Weights: the experts as transformers stores them (`mlp.experts.gate_up_proj`
//! `[E, hidden, 2·I]` with gate and up columns interleaved, `mlp.experts.down_proj`
//! `[E, I, hidden]`, and their biases), cut and transposed per expert on read; or as the
//! hub's checkpoints store them, MXFP4 (`quantization_config` `mxfp4`), dequantized on read
//! to exactly transformers' values ([`crate::mxfp4`]).

use serde::{Deserialize, Serialize};
use siphon_hlo::{CompareDir, DType, TensorType, Value};

use crate::arch::{Arch, Family, FinalNorm, Gain};
use crate::config::{Attention, FamilyExtra, ModelConfig, Moe, ParamClass, ParamInfo, Slice, positive};
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec, Graph, pre_norm_decoder};
use crate::hf_config::{Defaults, HfConfig, need};
use crate::hooks::{Feature, HookKind, HookPoint};
use crate::layers::attention::softmax_last;
use crate::layers::moe::{Experts, Glu};

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// The decoder with sinks and biased attention, and the biased mixture.
pub(crate) static FAMILY: Family = Family {
    model_types: &["gpt_oss"],
    architectures: &["GptOssForCausalLM"],
    from_hf,
    build,
    params,
    features: &[Feature::PreNorms, Feature::ResidMid, Feature::Rotary, Feature::Moe, Feature::TopKRouter],
    renames: &[],
    final_norm: FinalNorm::F32,
};

/// What only GPT-OSS's experts read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct GptOss {
    /// The SwiGLU's `alpha` (1.702).
    pub swiglu_alpha: f64,
    /// Where gate and up are clamped (7).
    pub swiglu_limit: f64,
    /// The experts are stored as the hub's checkpoints store them, MXFP4
    /// (`quantization_config` `mxfp4`: `…_blocks` and `…_scales`, `crate::mxfp4`).
    pub mxfp4: bool,
}

impl FamilyExtra for GptOss {
    const KEY: &'static str = "gpt_oss";
}

/// GptOssConfig's: head_dim 64, eps 1e-5, untied, biases, a window of 128 on every other
/// layer (the first sliding), RoPE base 150000.
const DEFAULTS: Defaults = Defaults {
    head_dim: Some(64),
    norm_eps: 1e-5,
    rope_theta: 150_000.0,
    attention_bias: true,
    windows,
    ..Defaults::LLAMA
};

fn windows(c: &HfConfig, n_layers: usize, _: Arch) -> Result<Vec<Option<usize>>, ModelError> {
    let Some(window) = c.sliding_window()?.unwrap_or(Some(128)) else {
        return Err(ModelError::Config("gpt_oss config with sliding_window null".into()));
    };
    c.windows_by_types_or_every(n_layers, window, 2)
}

fn from_hf(hf: HfConfig) -> Result<ModelConfig, ModelError> {
    let refuse = |what: &str| Err(ModelError::UnsupportedArch(format!("gpt_oss with {what}")));
    if hf.attention_bias == Some(false) {
        return refuse("attention_bias = false");
    }
    let quantization = hf.key::<serde_json::Value>("quantization_config")?;
    let mxfp4 = match quantization.as_ref().map(|q| q.get("quant_method").and_then(|m| m.as_str())) {
        None => false,
        Some(Some("mxfp4")) => true,
        Some(method) => return refuse(&format!("quantization_config {}", method.unwrap_or("without quant_method"))),
    };
    let (n_experts, top_k) = hf.experts()?;
    let expert_size = need(hf.intermediate_size, "intermediate_size")?;
    let gpt_oss = GptOss {
        swiglu_alpha: positive("swiglu_alpha", hf.key("swiglu_alpha")?.unwrap_or(1.702))?,
        swiglu_limit: positive("swiglu_limit", hf.key("swiglu_limit")?.unwrap_or(7.0))?,
        mxfp4,
    };
    let c = hf.decoder(ARCH, &DEFAULTS)?;
    if c.rope.scaling.is_none() {
        // GptOssConfig's default rope_parameters.
        return refuse("no rope_parameters (its default YaRN is not read from an absent key)");
    }
    let moe = Some(Moe { n_experts, top_k, norm_topk: false, expert_size, ..Default::default() });
    let mut config = ModelConfig { moe, attention: Attention { qkv_bias: true, ..c.attention }, ..c };
    config.extras.set(&gpt_oss);
    Ok(config)
}

/// Every weight, in Hugging Face's names; the experts cut from transformers' fused tensors.
fn params(c: &ModelConfig, n_layers: usize, with_lm_head: bool) -> Vec<ParamInfo> {
    use ParamClass::*;
    let (h, q, kv) =
        (c.hidden_size, c.attention.n_heads * c.attention.head_dim, c.attention.n_kv_heads * c.attention.head_dim);
    let moe = c.moe.as_ref().expect("gpt_oss configs have experts");
    let (e, i) = (moe.n_experts, moe.expert_size);
    let mut out = vec![ParamInfo::new("model.embed_tokens.weight", &[c.vocab_size, h], Embedding, None)];
    for l in 0..n_layers {
        let name = |suffix: &str| format!("model.layers.{l}.{suffix}");
        let mut p =
            |suffix: &str, shape: &[usize], class| out.push(ParamInfo::new(name(suffix), shape, class, Some(l)));
        p("input_layernorm.weight", &[h], Norm);
        p("self_attn.q_proj.weight", &[q, h], AttnQ);
        p("self_attn.q_proj.bias", &[q], QBias);
        p("self_attn.k_proj.weight", &[kv, h], AttnK);
        p("self_attn.k_proj.bias", &[kv], KBias);
        p("self_attn.v_proj.weight", &[kv, h], AttnV);
        p("self_attn.v_proj.bias", &[kv], VBias);
        p("self_attn.o_proj.weight", &[h, q], AttnO);
        p("self_attn.o_proj.bias", &[h], OBias);
        p("self_attn.sinks", &[c.attention.n_heads], AttnSinks);
        p("post_attention_layernorm.weight", &[h], Norm);
        p("mlp.router.weight", &[e, h], Router);
        p("mlp.router.bias", &[e], Router);
        p("mlp.experts.gate_up_proj_bias", &[e, 2 * i], ExpertBias);
        p("mlp.experts.down_proj_bias", &[e, h], ExpertBias);
        // gate_up_proj: transformers' `[E, H, 2I]` (transposed per expert) or MXFP4's `[E, 2I, H]`,
        // the gate in the even rows, the up in the odd; down_proj `[E, I, H]` or `[E, H, I]`.
        let mxfp4 = c.extras.get::<GptOss>().is_some_and(|g| g.mxfp4);
        let stored = |base: &str, rows: usize, cols: usize| match mxfp4 {
            true => (format!("{base}_blocks"), vec![e, rows, cols], false),
            false => (base.to_string(), vec![e, cols, rows], true),
        };
        let fused = name("mlp.experts.gate_up_proj");
        for (part, start, class) in [("gate", 0, ExpertGate), ("up", 1, ExpertUp)] {
            let (tensor, stored, transposed) = stored(&fused, 2 * i, h);
            let slice = Slice { tensor, stored, transposed, groups: e * i, start, len: 1 };
            out.push(ParamInfo::part(format!("{fused}[{part}]"), &[e, i, h], class, Some(l), slice));
        }
        let down = name("mlp.experts.down_proj");
        let (tensor, stored, transposed) = stored(&down, h, i);
        let slice = Slice { tensor, stored, transposed, groups: 1, start: 0, len: e * h };
        out.push(ParamInfo::part(down, &[e, h, i], ExpertDown, Some(l), slice));
    }
    out.push(ParamInfo::new("model.norm.weight", &[h], Norm, None));
    if with_lm_head && !c.tie_word_embeddings {
        out.push(ParamInfo::new("lm_head.weight", &[c.vocab_size, h], LmHead, None));
    }
    out
}

/// Builds the GPT-OSS forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    let (true, Some(moe), Some(gpt_oss)) = (config.arch == ARCH, &config.moe, config.extras.get::<GptOss>()) else {
        return Err(ModelError::UnsupportedArch(format!("gpt_oss builder given a {:?} config", config.arch)));
    };
    let mixer = |g: &mut Graph<'_>, n: Value, layer: usize, (): ()| {
        let attn = attention(g, n, layer)?;
        g.hook(HookPoint::block(layer, HookKind::AttnOut), attn);
        Ok(attn)
    };
    let mlp = |g: &mut Graph<'_>, n: Value, layer: usize| mixture(g, n, layer, moe, gpt_oss);
    pre_norm_decoder(config, spec, Gain::F32, |_, _| Ok(()), mixer, mlp)
}

/// `o_proj(attention(rope(q), rope(k), v; sinks)) + b` of block `layer` on its normed input.
fn attention(g: &mut Graph<'_>, n: Value, layer: usize) -> Result<Value, ModelError> {
    use HookKind::*;
    let at = |kind| HookPoint::block(layer, kind);
    let c = g.config;
    let t = g.tokens();
    let p = |name: &str| format!("model.layers.{layer}.self_attn.{name}");
    let mut qkv = Vec::with_capacity(3);
    for (name, kind) in [("q_proj", AttnQ), ("k_proj", AttnK), ("v_proj", AttnV)] {
        let y = g.linear(n, &p(&format!("{name}.weight")), Some(&p(&format!("{name}.bias"))))?;
        g.hook(at(kind), y);
        qkv.push(y);
    }
    let (cos, sin) = g.layer_rope(layer)?;
    let mask = g.layer_mask(layer)?;
    let q = g.b.reshape(qkv[0], &[t, c.attention.n_heads, c.attention.head_dim])?;
    let k = g.b.reshape(qkv[1], &[t, c.attention.n_kv_heads, c.attention.head_dim])?;
    let (q, k) = (g.apply_rope(q, cos, sin)?, g.apply_rope(k, cos, sin)?);
    g.hook(at(AttnRotQ), q);
    g.hook(at(AttnRotK), k);
    let q = g.b.reshape(q, &[t, c.attention.n_heads * c.attention.head_dim])?;
    let k = g.b.reshape(k, &[t, c.attention.n_kv_heads * c.attention.head_dim])?;
    let sinks = g.w(&p("sinks"))?;
    let z = g.attend_with_sinks(layer, q, k, qkv[2], mask, Some(sinks))?;
    g.linear(z, &p("o_proj.weight"), Some(&p("o_proj.bias")))
}

/// The routed mixture of block `layer` (GptOssMLP): router logits `x·Wᵀ + b`, the top k
/// logits, softmax over them, the chosen experts with their biases and clamped SwiGLU.
fn mixture(g: &mut Graph<'_>, x: Value, layer: usize, moe: &Moe, gpt_oss: GptOss) -> Result<Value, ModelError> {
    use HookKind::*;
    let at = |kind| HookPoint::block(layer, kind);
    let p = |name: &str| format!("model.layers.{layer}.mlp.{name}");
    let logits = g.linear(x, &p("router.weight"), Some(&p("router.bias")))?;
    g.hook(at(MlpRouterLogits), logits);
    let logits32 = g.b.convert(logits, DType::F32)?;
    let (_, indices, values) = g.top_k_values(logits32, moe.top_k, false)?;
    let chosen = softmax_last(&mut g.b, values)?;
    let chosen = g.b.convert(chosen, g.dt)?;
    g.hook(at(MlpRouterScores), chosen);
    g.hook(at(MlpExpertIndices), indices);
    if g.wants(at(MlpExpertWeights)) {
        // The scores at their experts' places, 0 elsewhere.
        let (t, k, e) = (g.tokens(), moe.top_k, moe.n_experts);
        let b = &mut g.b;
        let each = b.broadcast_in_dim(indices, &[t, k, e], &[0, 1])?;
        let ids = b.iota(TensorType::new(DType::F32, &[t, k, e]), 2)?;
        let here = b.compare(CompareDir::Eq, each, ids)?;
        let scores = b.broadcast_in_dim(chosen, &[t, k, e], &[0, 1])?;
        let zero = b.splat(0.0, TensorType::new(g.dt, &[t, k, e]))?;
        let placed = b.select(here, scores, zero)?;
        let weights = b.reduce_sum(placed, &[1])?;
        g.hook(at(MlpExpertWeights), weights);
    }
    // The fused bias `[E, 2I]`: gate and up interleaved.
    let (e, i) = (moe.n_experts, moe.expert_size);
    let fused = g.w(&p("experts.gate_up_proj_bias"))?;
    let fused = g.b.reshape(fused, &[e, i, 2])?;
    let [gate_b, up_b] =
        [0, 1].map(|part| g.b.slice_dim(fused, 2, part, part + 1).and_then(|b| g.b.reshape(b, &[e, i])));
    let biases = Some([gate_b?, up_b?, g.w(&p("experts.down_proj_bias"))?]);
    let weights = ["experts.gate_up_proj[gate]", "experts.gate_up_proj[up]", "experts.down_proj"]
        .map(|n| g.w(&p(n)))
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let glu = Glu::Clamped { alpha: gpt_oss.swiglu_alpha, limit: gpt_oss.swiglu_limit };
    g.routed(x, &Experts { weights, biases, glu }, chosen, indices)
}

#[cfg(test)]
mod tests {
    use crate::config::{ModelConfig, RopeScaling};
    use crate::error::ModelError;
    use crate::hf_config::HfConfig;

    fn parse(extra: &str) -> Result<ModelConfig, ModelError> {
        let base = r#"{"model_type": "gpt_oss", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 8,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
            "num_experts_per_tok": 2, "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
            "beta_fast": 32.0, "beta_slow": 1.0, "truncate": false, "original_max_position_embeddings": 4096}"#;
        HfConfig::from_json(&format!("{base}{extra}}}")).unwrap().into_config()
    }

    #[test]
    fn reads_gpt_oss_as_gptossconfig_does() {
        let c = parse("").unwrap();
        assert_eq!(c.layers.windows(), vec![Some(128), None, Some(128), None]);
        assert_eq!((c.attention.head_dim, c.rms_norm_eps, c.rope.theta), (64, 1e-5, 150_000.0));
        assert!(c.attention.qkv_bias && !c.tie_word_embeddings);
        let gpt_oss = c.extras.get::<super::GptOss>().unwrap();
        assert_eq!((gpt_oss.swiglu_alpha, gpt_oss.swiglu_limit), (1.702, 7.0));
        let Some(RopeScaling::Yarn { factor, truncate, attention_factor, .. }) = c.rope.scaling else {
            panic!("{:?}", c.rope.scaling)
        };
        assert_eq!((factor, truncate), (32.0, false));
        assert!((attention_factor - (0.1 * 32f64.ln() + 1.0)).abs() < 1e-12);
        assert!(
            parse(r#", "quantization_config": {"quant_method": "mxfp4"}"#)
                .unwrap()
                .extras
                .get::<super::GptOss>()
                .unwrap()
                .mxfp4
        );
        let err = parse(r#", "quantization_config": {"quant_method": "fp8"}"#).unwrap_err().to_string();
        assert!(err.contains("gpt_oss with quantization_config fp8"), "{err}");
        let err = parse(r#", "attention_bias": false"#).unwrap_err().to_string();
        assert!(err.contains("attention_bias = false"), "{err}");
    }
}
