//! Gemma 4 (text models, `model_type` `gemma4_text`, and the text tower of a multimodal
//! `gemma4` checkpoint): Gemma's sandwich block (norms before and after attention and the
//! MLP, embeddings × `sqrt(hidden)`, GeGLU) with norms that multiply by `w` itself in f32
//! (no `1 + w`), per-head q/k norms and a scale-free v-norm, attention scores not scaled
//! (`scaling = 1`) nor soft-capped, local sliding-window layers and global ones (the last
//! layer always global) whose heads may be wider and fewer (`per_layer_config`, or
//! `global_head_dim` / `num_global_key_value_heads`), global layers whose values are their
//! keys' projection (`attention_k_eq_v`), RoPE per layer type (local: `default`; global:
//! `proportional`, rotating the first part of each head's pairs), every block's output
//! multiplied by its `layer_scalar`, and per-layer inputs (E2B/E4B) mixed in after the MLP.
//!
//! ```text
//! x = embed_tokens[ids] * sqrt(hidden)                    # hook_embed
//! ple = (norm(per_layer_model_projection(x) / sqrt(hidden)) + embed_tokens_per_layer[ids] * sqrt(P)) / sqrt(2)
//! for each block i:
//!     n = input_layernorm(x)                               # ln1.*
//!     q = q_norm(q_proj(n)); k = k_norm(k_proj(n))         # attn.hook_q / hook_k, q_norm.* / k_norm.*
//!     v = v_norm(v_proj(n) or, k == v layers, k_proj(n))   # attn.hook_v, attn.v_norm.hook_out
//!     a = o_proj(softmax(rope(q)·rope(k)ᵀ) · v)            # attn.hook_rot_q/k, pattern, z, attn.hook_out
//!     x = x + post_attention_layernorm(a)                  # ln1_post.*, hook_attn_out, hook_resid_mid
//!     m = mlp(pre_feedforward_layernorm(x))                # ln2.*, mlp.*
//!     x = x + post_feedforward_layernorm(m)                # ln2_post.*, hook_mlp_out, per_layer_input_gate.hook_in
//!     g = gelu(per_layer_input_gate(x)) * ple[i]           # per_layer_input_gate.hook_out, per_layer_projection.hook_in
//!     x = x + post_per_layer_input_norm(per_layer_projection(g))  # per_layer_projection.hook_out, post_per_layer_input_norm.hook_out
//!     x = x * layer_scalar                                 # hook_resid_post
//! norm(x)                                                  # ln_final.*
//! ```
//!
//! The last `num_kv_shared_layers` layers (E2B/E4B) compute no keys and values: each attends
//! over those of the last earlier layer of its type, and their MLPs may be twice as wide
//! (`use_double_wide_mlp`).
//!
//! With `enable_moe_block` (26B-A4B) a mixture of experts runs beside every MLP, on the
//! residual stream: the two outputs are normed and summed before the post-MLP norm. Refused
//! by name: bidirectional attention (`use_bidirectional_attention` `all`), biases.

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use siphon_hlo::Value;

use crate::arch::{Arch, Family, FinalNorm, Gain};
use crate::config::{
    Attention, FamilyExtra, LayerShape, ModelConfig, Moe, ParamClass, ParamInfo, PerLayerInput, Rope, Slice,
};
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec, Graph};
use crate::gemma2::GEMMA_ACTIVATION;
use crate::hf_config::{Defaults, HfConfig, need};
use crate::hooks::{Feature, HookKind, HookPoint};

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// Gemma 2's hooks with q/k norms, the v-norm and the per-layer inputs' (where the config has
/// them).
pub(crate) static FAMILY: Family = Family {
    model_types: &["gemma4", "gemma4_text"],
    architectures: &["Gemma4ForCausalLM"],
    from_hf,
    build,
    params,
    features: &[
        Feature::PreNorms,
        Feature::ResidMid,
        Feature::DenseMlp,
        Feature::GatedMlp,
        Feature::Rotary,
        Feature::PostNorms,
        Feature::QkNorm,
        Feature::VNorm,
        Feature::MixtureBeside,
        Feature::PerLayerInput,
    ],
    // The text tower of a multimodal checkpoint.
    renames: &[("model.", "model.language_model.")],
    final_norm: FinalNorm { gain: Gain::F32, folded: true, centred: false },
};

/// What only Gemma 4's block reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gemma4 {
    /// The global layers' values are their keys' projection (`attention_k_eq_v`): they have
    /// no `v_proj`.
    pub k_eq_v: bool,
}

impl FamilyExtra for Gemma4 {
    const KEY: &'static str = "gemma4";
}

/// Gemma4TextConfig's: `head_dim` 256, eps 1e-6, tied, GeGLU, a window of 512 on five of every
/// six layers.
const DEFAULTS: Defaults = Defaults {
    head_dim: Some(256),
    tie_word_embeddings: true,
    activation: GEMMA_ACTIVATION,
    windows,
    ..Defaults::LLAMA
};

/// Gemma4TextConfig's `final_logit_softcapping` when absent.
const FINAL_SOFTCAP: Option<f64> = None;

fn from_hf(mut hf: HfConfig) -> Result<ModelConfig, ModelError> {
    if hf.model_type.as_deref() == Some("gemma4") {
        // A multimodal checkpoint: its text tower is a gemma4_text model under
        // `model.language_model.` (the renames find it); the vision and audio towers are not read.
        return from_hf(hf.text_tower("gemma4_text")?);
    }
    let refuse = |what: String| Err(ModelError::UnsupportedArch(format!("gemma4_text with {what}")));
    if hf.attention_bias == Some(true) {
        return refuse("attention_bias = true".into());
    }
    // "vision" makes image tokens attend both ways; text alone stays causal.
    if let Some(mode) = hf.key::<String>("use_bidirectional_attention")?.filter(|m| m != "vision") {
        return refuse(format!("use_bidirectional_attention {mode:?}"));
    }
    // Both RoPEs by layer type; Gemma4TextConfig's defaults when absent.
    if hf.rope_parameters.is_none() {
        hf.rope_parameters = Some(serde_json::json!({
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
        }));
    }
    let local_rope_theta = hf.rope_by_layer_type(ARCH, 10_000.0)?;
    let k_eq_v = hf.key::<bool>("attention_k_eq_v")?.unwrap_or(false);
    let c = hf.decoder(ARCH, &DEFAULTS)?;
    let kv_shared_from = kv_sharing(&hf, &c)?;
    // Double-wide MLPs only on the layers that share keys and values.
    let double_wide = hf.key::<bool>("use_double_wide_mlp")?.unwrap_or(false);
    let wide = |layer: usize| double_wide && kv_shared_from.get(layer).copied().flatten().is_some();
    let layer_shapes = layer_shapes(&hf, &c, k_eq_v, wide)?;
    let moe = match hf.key::<bool>("enable_moe_block")?.unwrap_or(false) {
        false => None,
        true => {
            let (n_experts, top_k) =
                (need(hf.num_experts, "num_experts")?, need(hf.key("top_k_experts")?, "top_k_experts")?);
            if top_k == 0 || top_k > n_experts {
                return Err(ModelError::Config(format!("top_k_experts {top_k} with {n_experts} experts")));
            }
            let expert_size = need(hf.key("moe_intermediate_size")?, "moe_intermediate_size")?;
            Some(Moe { n_experts, top_k, norm_topk: true, expert_size, ..Default::default() })
        }
    };
    let per_layer_input = match hf.key::<usize>("hidden_size_per_layer_input")?.unwrap_or(256) {
        0 => None,
        width => {
            let vocab_size = hf.key::<usize>("vocab_size_per_layer_input")?.unwrap_or(262_144);
            if vocab_size < c.vocab_size {
                return Err(ModelError::Config(format!(
                    "vocab_size_per_layer_input {vocab_size} is smaller than vocab_size {}: some tokens have no per-layer input",
                    c.vocab_size
                )));
            }
            Some(PerLayerInput { width, vocab_size })
        }
    };
    let final_softcap = crate::gemma2::softcap_key(&hf, "final_logit_softcapping", FINAL_SOFTCAP)?;
    Ok(ModelConfig {
        attention: Attention { qk_norm: true, scalar: Some(1.0), ..c.attention },
        final_softcap,
        rope: Rope { local_theta: Some(local_rope_theta), ..c.rope },
        layers: c.layers.clone().with(c.n_layers, |layer, spec| {
            spec.kv_source = kv_shared_from.get(layer).copied().flatten();
            spec.shape = layer_shapes.get(layer).copied();
        }),
        per_layer_input,
        moe,
        ..c
    }
    .with_extra(&Gemma4 { k_eq_v }))
}

/// The layers that attend over an earlier layer's keys and values: the last
/// `num_kv_shared_layers`, each over the last layer of its type (local or global) before them
/// (Gemma4TextConfig.kv_sharing_modes).
fn kv_sharing(hf: &HfConfig, c: &ModelConfig) -> Result<Vec<Option<usize>>, ModelError> {
    let shared = hf.key::<usize>("num_kv_shared_layers")?.unwrap_or(0);
    if shared == 0 {
        return Ok(Vec::new());
    }
    let first = c.n_layers.checked_sub(shared).filter(|&f| f > 0).ok_or_else(|| {
        ModelError::Config(format!(
            "num_kv_shared_layers {shared} leaves none of the {} layers computing keys and values",
            c.n_layers
        ))
    })?;
    (0..c.n_layers)
        .map(|layer| match layer < first {
            true => Ok(None),
            false => (0..first).rev().find(|&s| c.window(s).is_some() == c.window(layer).is_some()).map(Some).ok_or_else(|| {
                ModelError::Config(format!("layer {layer} shares keys and values with no earlier layer of its type (num_kv_shared_layers {shared})"))
            }),
        })
        .collect()
}

/// Every layer's sizes where some differ: `per_layer_config`'s heads (by layer index:
/// `head_dim`, `num_key_value_heads`), else Gemma4TextConfig's rule, `global_head_dim` (512)
/// on the global layers with `num_global_key_value_heads` when `attention_k_eq_v`; the MLP
/// twice as wide on the layers `wide` says.
fn layer_shapes(
    hf: &HfConfig,
    c: &ModelConfig,
    k_eq_v: bool,
    wide: impl Fn(usize) -> bool,
) -> Result<Vec<LayerShape>, ModelError> {
    let plain = LayerShape {
        head_dim: c.attention.head_dim,
        n_kv_heads: c.attention.n_kv_heads,
        intermediate_size: c.intermediate_size,
    };
    let mut heads: Vec<LayerShape> = (0..c.n_layers)
        .map(|l| LayerShape { intermediate_size: c.intermediate_size * if wide(l) { 2 } else { 1 }, ..plain })
        .collect();
    match hf.extra.get("per_layer_config") {
        Some(Json::Object(entries)) => {
            for (index, entry) in entries {
                let layer = index.parse::<usize>().ok().filter(|&l| l < c.n_layers).ok_or_else(|| {
                    ModelError::Config(format!(
                        "per_layer_config key {index:?} is not a layer index below {}",
                        c.n_layers
                    ))
                })?;
                let Json::Object(fields) = entry else {
                    return Err(ModelError::Config(format!("per_layer_config[{index}] is not an object")));
                };
                for (key, value) in fields {
                    let n = value.as_u64().filter(|&n| n > 0).map(|n| n as usize).ok_or_else(|| {
                        ModelError::Config(format!("per_layer_config[{index}].{key} {value} is not a positive integer"))
                    })?;
                    match key.as_str() {
                        "head_dim" => heads[layer].head_dim = n,
                        "num_key_value_heads" => heads[layer].n_kv_heads = n,
                        other => {
                            return Err(ModelError::UnsupportedArch(format!(
                                "gemma4_text per_layer_config[{index}].{other}"
                            )));
                        }
                    }
                }
            }
        }
        Some(other) if !other.is_null() => {
            return Err(ModelError::Config(format!("per_layer_config {other} is not an object")));
        }
        _ => {
            let head_dim = hf.key("global_head_dim")?.unwrap_or(512);
            let n_kv_heads = hf.key("num_global_key_value_heads")?.filter(|_| k_eq_v).unwrap_or(c.attention.n_kv_heads);
            for layer in (0..c.n_layers).filter(|&l| c.window(l).is_none()) {
                heads[layer] = LayerShape { head_dim, n_kv_heads, ..heads[layer] };
            }
        }
    }
    Ok(if heads.iter().all(|h| *h == plain) { Vec::new() } else { heads })
}

/// Gemma 4's windows: on the layers `layer_types` marks (by default five of every six), the
/// last layer always global (Gemma4TextConfig forces it); `sliding_window` 512 when absent.
fn windows(c: &HfConfig, n_layers: usize, _: Arch) -> Result<Vec<Option<usize>>, ModelError> {
    let window = need(c.sliding_window()?.unwrap_or(Some(512)), "a sliding_window (null)")?;
    let mut windows = c.windows_by_types_or_every(n_layers, window, 6)?;
    if let Some(last) = windows.last_mut() {
        *last = None;
    }
    Ok(windows)
}

fn params(c: &ModelConfig, n_layers: usize, with_lm_head: bool) -> Vec<ParamInfo> {
    use ParamClass::*;
    let h = c.hidden_size;
    let k_eq_v = c.extras.get::<Gemma4>().is_some_and(|g| g.k_eq_v);
    let mut out = vec![ParamInfo::new("model.embed_tokens.weight", &[c.vocab_size, h], Embedding, None)];
    if let Some(ple) = c.per_layer_input {
        let all = c.n_layers * ple.width;
        out.push(ParamInfo::new("model.embed_tokens_per_layer.weight", &[ple.vocab_size, all], Embedding, None));
        out.push(ParamInfo::new("model.per_layer_model_projection.weight", &[all, h], PerLayerInput, None));
        out.push(ParamInfo::new("model.per_layer_projection_norm.weight", &[ple.width], Norm, None));
    }
    for l in 0..n_layers {
        let (d, kv, i) = (c.head_dim_at(l), c.kv_heads_at(l), c.intermediate_at(l));
        let (q, kvw) = (c.attention.n_heads * d, kv * d);
        let own_kv = c.kv_source(l).is_none();
        let mut p = |suffix: &str, shape: &[usize], class| {
            out.push(ParamInfo::new(format!("model.layers.{l}.{suffix}"), shape, class, Some(l)))
        };
        p("input_layernorm.weight", &[h], Norm);
        p("self_attn.q_proj.weight", &[q, h], AttnQ);
        p("self_attn.q_norm.weight", &[d], Norm);
        if own_kv {
            p("self_attn.k_proj.weight", &[kvw, h], AttnK);
            if !k_eq_v || c.window(l).is_some() {
                p("self_attn.v_proj.weight", &[kvw, h], AttnV);
            }
            p("self_attn.k_norm.weight", &[d], Norm);
        }
        p("self_attn.o_proj.weight", &[h, q], AttnO);
        p("post_attention_layernorm.weight", &[h], Norm);
        p("pre_feedforward_layernorm.weight", &[h], Norm);
        p("mlp.gate_proj.weight", &[i, h], MlpGate);
        p("mlp.up_proj.weight", &[i, h], MlpUp);
        p("mlp.down_proj.weight", &[h, i], MlpDown);
        p("post_feedforward_layernorm.weight", &[h], Norm);
        if let Some(moe) = &c.moe {
            let (e, x) = (moe.n_experts, moe.expert_size);
            p("router.proj.weight", &[e, h], Router);
            p("router.scale", &[h], Scalar);
            p("router.per_expert_scale", &[e], Scalar);
            p("pre_feedforward_layernorm_2.weight", &[h], Norm);
            p("post_feedforward_layernorm_1.weight", &[h], Norm);
            p("post_feedforward_layernorm_2.weight", &[h], Norm);
            // gate_up_proj `[E, 2I, H]`: each expert's gate rows, then its up rows.
            let fused = format!("model.layers.{l}.experts.gate_up_proj");
            for (part, start, class) in [("gate", 0, ExpertGate), ("up", x, ExpertUp)] {
                let slice = Slice {
                    tensor: fused.clone(),
                    stored: vec![e, 2 * x, h],
                    transposed: false,
                    groups: e,
                    start,
                    len: x,
                };
                out.push(ParamInfo::part(format!("{fused}[{part}]"), &[e, x, h], class, Some(l), slice));
            }
            out.push(ParamInfo::new(format!("model.layers.{l}.experts.down_proj"), &[e, h, x], ExpertDown, Some(l)));
        }
        let mut p = |suffix: &str, shape: &[usize], class| {
            out.push(ParamInfo::new(format!("model.layers.{l}.{suffix}"), shape, class, Some(l)))
        };
        if let Some(ple) = c.per_layer_input {
            p("per_layer_input_gate.weight", &[ple.width, h], PerLayerInput);
            p("per_layer_projection.weight", &[h, ple.width], PerLayerInput);
            p("post_per_layer_input_norm.weight", &[h], Norm);
        }
        p("layer_scalar", &[1], Scalar);
    }
    out.push(ParamInfo::new("model.norm.weight", &[h], Norm, None));
    if with_lm_head && !c.tie_word_embeddings {
        out.push(ParamInfo::new("lm_head.weight", &[c.vocab_size, h], LmHead, None));
    }
    out
}

/// Builds the Gemma 4 forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    let Some(gemma4) = config.extras.get::<Gemma4>().filter(|_| config.arch == ARCH && !config.attention.qkv_bias)
    else {
        return Err(ModelError::UnsupportedArch(format!("gemma4 builder given a {:?} config", config.arch)));
    };
    use HookKind::*;
    let mut g = Graph::new(config, spec)?;
    let x = g.embed("model.embed_tokens.weight")?;
    let x = g.scale(x, (config.hidden_size as f64).sqrt())?;
    g.hook(HookPoint::model(Embed), x);
    let per_layer = match config.per_layer_input {
        Some(ple) => Some(per_layer_inputs(&mut g, x, ple)?),
        None => None,
    };
    // Each built layer's rotated keys and normed values, for the layers that share them.
    let mut keys_values: Vec<(Value, Value)> = Vec::with_capacity(g.n_blocks);
    g.replay_refusal =
        Some("Gemma 4's later layers read earlier layers' keys and values, which a replay does not build yet");
    let x = g.blocks(x, |g, x, layer| {
        let at = |kind| HookPoint::block(layer, kind);
        let norm = |name: &str| format!("model.layers.{layer}.{name}.weight");
        let (cos, sin) = g.layer_rope(layer)?;
        let mask = g.layer_mask(layer)?;
        let kv = match config.kv_source(layer) {
            Some(source) => Kv::Shared(keys_values[source]),
            None if gemma4.k_eq_v && config.window(layer).is_none() => Kv::FromKeys,
            None => Kv::Own,
        };
        let own = |g: &mut Graph<'_>, input| {
            let (proj, kv) = attention(g, input, layer, kv, cos, sin, mask)?;
            keys_values.push(kv);
            Ok(proj)
        };
        let beside = |g: &mut Graph<'_>, h, mlp| match config.moe.as_ref() {
            Some(moe) => mixture_beside(g, layer, h, mlp, moe),
            None => Ok(mlp),
        };
        let mut out = g.post_normed_block(x, layer, Gain::F32, true, own, beside)?;
        if let (Some(inputs), Some(ple)) = (per_layer, config.per_layer_input) {
            g.hook(at(PleIn), out);
            let gate = g.linear(out, &norm("per_layer_input_gate"), None)?;
            g.hook(at(PleGate), gate);
            let gate = g.activation(gate)?;
            let input = g.b.slice_dim(inputs, 1, layer * ple.width, (layer + 1) * ple.width)?;
            let gated = g.b.mul(gate, input)?;
            g.hook(at(PleProjIn), gated);
            let projected = g.linear(gated, &norm("per_layer_projection"), None)?;
            g.hook(at(PleProjOut), projected);
            let normed = g.rms_norm_with(projected, &norm("post_per_layer_input_norm"), Gain::F32)?;
            g.hook(at(PleOut), normed.out);
            out = g.b.add(out, normed.out)?;
        }
        let scalar = g.w(&format!("model.layers.{layer}.layer_scalar"))?;
        let dims = g.b.dims(out)?.to_vec();
        let scalar = g.b.broadcast_in_dim(scalar, &dims, &[1])?;
        let out = g.b.mul(out, scalar)?;
        Ok(out)
    })?;
    g.finish_decoder(x)
}

/// Every layer's per-layer input `[tokens, layers * width]`: the per-layer table's rows
/// (× `sqrt(width)`) and the token embeddings projected (× `hidden^-½`) and normed per layer,
/// summed and × `2^-½`.
fn per_layer_inputs(g: &mut Graph<'_>, x: Value, ple: PerLayerInput) -> Result<Value, ModelError> {
    let config = g.config;
    let t = g.tokens();
    let all = config.n_layers * ple.width;
    let rows = g.embed("model.embed_tokens_per_layer.weight")?;
    let rows = g.scale(rows, (ple.width as f64).sqrt())?;
    let projected = g.linear(x, "model.per_layer_model_projection.weight", None)?;
    let projected = g.scale(projected, (config.hidden_size as f64).powf(-0.5))?;
    let per_layer = g.b.reshape(projected, &[t * config.n_layers, ple.width])?;
    let normed = g.rms_norm_with(per_layer, "model.per_layer_projection_norm.weight", Gain::F32)?;
    let normed = g.b.reshape(normed.out, &[t, all])?;
    let sum = g.b.add(normed, rows)?;
    g.scale(sum, 0.5f64.sqrt())
}

/// The MLP's output `mlp` and the mixture's on the residual stream `h`, each normed, summed
/// (Gemma4TextDecoderLayer with `enable_moe_block`): the router reads `h` normed without a
/// gain, × `scale`, × `hidden^-½`; softmax, the top k renormalised, × `per_expert_scale`; the
/// experts read `h` normed by `pre_feedforward_layernorm_2`.
fn mixture_beside(g: &mut Graph<'_>, layer: usize, h: Value, mlp: Value, moe: &Moe) -> Result<Value, ModelError> {
    use HookKind::*;
    let at = |kind| HookPoint::block(layer, kind);
    let p = |name: &str| format!("model.layers.{layer}.{name}");
    let mlp = g.rms_norm_with(mlp, &p("post_feedforward_layernorm_1.weight"), Gain::F32)?.out;
    g.hook(at(FfnMlpNormed), mlp);
    let dims = g.b.dims(h)?.to_vec();
    let routed = g.rms_norm_unscaled(h)?.out;
    let scale = g.w(&p("router.scale"))?;
    let scale = g.b.broadcast_in_dim(scale, &dims, &[1])?;
    let routed = g.b.mul(routed, scale)?;
    let routed = g.scale(routed, (g.config.hidden_size as f64).powf(-0.5))?;
    let logits = g.linear(routed, &p("router.proj.weight"), None)?;
    let logits = g.b.convert(logits, siphon_hlo::DType::F32)?;
    let probs = crate::layers::attention::softmax_last(&mut g.b, logits)?;
    let shown = g.b.convert(probs, g.dt)?;
    g.hook(at(FfnRouterProbs), shown);
    let (weights, indices) = g.top_k(probs, moe.top_k, moe.norm_topk)?;
    let per_expert = g.w(&p("router.per_expert_scale"))?;
    let per_expert = g.b.convert(per_expert, siphon_hlo::DType::F32)?;
    let per_expert = g.b.broadcast_in_dim(per_expert, &[dims[0], moe.n_experts], &[1])?;
    let weights = g.b.mul(weights, per_expert)?;
    let weights = g.b.convert(weights, g.dt)?;
    let x = g.rms_norm_with(h, &p("pre_feedforward_layernorm_2.weight"), Gain::F32)?.out;
    g.hook(at(FfnExpertsIn), x);
    let [gate, up] = ["gate", "up"].map(|part| p(&format!("experts.gate_up_proj[{part}]")));
    let experts = g.experts(x, [&gate, &up, &p("experts.down_proj")], weights, indices)?;
    g.hook(at(FfnExpertsOut), experts);
    let experts = g.rms_norm_with(experts, &p("post_feedforward_layernorm_2.weight"), Gain::F32)?.out;
    g.hook(at(FfnExpertsNormed), experts);
    let sum = g.b.add(mlp, experts)?;
    g.hook(at(FfnSum), sum);
    Ok(sum)
}

/// Where a block's keys and values come from.
#[derive(Clone, Copy)]
enum Kv {
    /// Its own `k_proj` and `v_proj`.
    Own,
    /// Its own `k_proj`, the values its projection too (`attention_k_eq_v`, global layers).
    FromKeys,
    /// An earlier layer's rotated keys and normed values (KV sharing).
    Shared((Value, Value)),
}

/// `o_proj(attention)` of block `layer` on normed input `n`, and the rotated keys and normed
/// values it attended over, recording the attention hooks: q and k normed per head, v normed
/// without a gain, q and k rotated.
fn attention(
    g: &mut Graph<'_>,
    n: Value,
    layer: usize,
    kv: Kv,
    cos: Value,
    sin: Value,
    mask: Value,
) -> Result<(Value, (Value, Value)), ModelError> {
    use HookKind::*;
    let at = |kind| HookPoint::block(layer, kind);
    let c = g.config;
    let t = g.tokens();
    let (d, n_kv) = (c.head_dim_at(layer), c.kv_heads_at(layer));
    let p = format!("model.layers.{layer}.self_attn");
    let q = g.linear(n, &format!("{p}.q_proj.weight"), None)?;
    g.hook(at(AttnQ), q);
    let q = g.b.reshape(q, &[t, c.attention.n_heads, d])?;
    let q = crate::layers::norm::head_norm(
        g,
        q,
        &format!("{p}.q_norm.weight"),
        Gain::F32,
        [AttnQNormScale, AttnQNormNormalized, AttnQNormed].map(at),
    )?;
    let (k, v) = match kv {
        Kv::Shared(shared) => shared,
        Kv::Own | Kv::FromKeys => {
            let k = g.linear(n, &format!("{p}.k_proj.weight"), None)?;
            g.hook(at(AttnK), k);
            let v = match kv {
                Kv::FromKeys => k,
                _ => g.linear(n, &format!("{p}.v_proj.weight"), None)?,
            };
            g.hook(at(AttnV), v);
            let k = g.b.reshape(k, &[t, n_kv, d])?;
            let k = crate::layers::norm::head_norm(
                g,
                k,
                &format!("{p}.k_norm.weight"),
                Gain::F32,
                [AttnKNormScale, AttnKNormNormalized, AttnKNormed].map(at),
            )?;
            let v = g.b.reshape(v, &[t * n_kv, d])?;
            let v = g.rms_norm_unscaled(v)?.out;
            let v = g.b.reshape(v, &[t, n_kv * d])?;
            g.hook(at(AttnVNormed), v);
            let k = g.apply_rope(k, cos, sin)?;
            g.hook(at(AttnRotK), k);
            (g.b.reshape(k, &[t, n_kv * d])?, v)
        }
    };
    let q = g.apply_rope(q, cos, sin)?;
    g.hook(at(AttnRotQ), q);
    let q = g.b.reshape(q, &[t, c.attention.n_heads * d])?;
    let z = g.attend(layer, q, k, v, mask)?;
    Ok((g.linear(z, &format!("{p}.o_proj.weight"), None)?, (k, v)))
}

#[cfg(test)]
mod tests {
    use crate::config::{LayerShape, ModelConfig, PerLayerInput, RopeScaling};
    use crate::hf_config::HfConfig;

    const BASE: &str = r#"{"model_type": "gemma4_text", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
        "num_hidden_layers": 7, "num_attention_heads": 4, "num_key_value_heads": 2"#;

    fn parse(extra: &str) -> Result<ModelConfig, crate::error::ModelError> {
        HfConfig::from_json(&format!("{BASE}{extra}}}")).unwrap().into_config()
    }

    #[test]
    fn defaults_follow_gemma4textconfig() {
        let c = parse(r#", "vocab_size_per_layer_input": 32"#).unwrap();
        let (local, global) = (Some(512), None);
        // Five local layers for each global one, and the last layer global.
        assert_eq!(c.layers.windows(), [local, local, local, local, local, global, global]);
        assert_eq!(
            (c.attention.head_dim, c.attention.scalar, c.attention.softcap, c.tie_word_embeddings),
            (256, Some(1.0), None, true)
        );
        assert_eq!((c.rope.theta, c.rope.local_theta), (1e6, Some(1e4)));
        assert_eq!(c.rope.scaling, Some(RopeScaling::Proportional { fraction: 0.25, factor: 1.0 }));
        assert_eq!(c.rope.rotary_dim, None, "proportional RoPE rotates over the whole head");
        // Global layers: global_head_dim 512, the same key/value heads without K == V.
        assert_eq!((c.head_dim_at(0), c.head_dim_at(5), c.kv_heads_at(5)), (256, 512, 2));
        assert_eq!(c.per_layer_input, Some(PerLayerInput { width: 256, vocab_size: 32 }));
        let c =
            parse(r#", "hidden_size_per_layer_input": 0, "attention_k_eq_v": true, "num_global_key_value_heads": 1"#)
                .unwrap();
        assert_eq!(
            (c.per_layer_input, c.kv_heads_at(6), c.extras.get::<super::Gemma4>().map(|g| g.k_eq_v)),
            (None, 1, Some(true))
        );
        // The names of the weights follow: no v_proj on K == V layers.
        let names: Vec<String> = c.params(7, false).into_iter().map(|p| p.name).collect();
        assert!(
            names.contains(&"model.layers.0.self_attn.v_proj.weight".into())
                && !names.iter().any(|n| n == "model.layers.5.self_attn.v_proj.weight")
        );
    }

    #[test]
    fn per_layer_config_gives_each_layers_heads() {
        let c = parse(r#", "hidden_size_per_layer_input": 0, "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
            "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention"], "sliding_window": 3,
            "per_layer_config": {"1": {"head_dim": 32, "num_key_value_heads": 1}}"#)
        .unwrap();
        let plain = LayerShape { head_dim: 256, n_kv_heads: 2, intermediate_size: 32 };
        assert_eq!(
            c.layers.iter().map(|l| l.shape.unwrap()).collect::<Vec<_>>()[..3],
            [plain, LayerShape { head_dim: 32, n_kv_heads: 1, ..plain }, plain]
        );
        // Hugging Face forces the last layer global.
        assert_eq!(c.layers.windows()[5..], [Some(3), None]);
        // The planner counts the per-layer table.
        let with_ple = parse(r#", "vocab_size_per_layer_input": 32, "hidden_size_per_layer_input": 4"#).unwrap();
        let without = parse(r#", "hidden_size_per_layer_input": 0"#).unwrap();
        let ple = 32 * 7 * 4 + 7 * 4 * 16 + 4 + 7 * (4 * 16 + 16 * 4 + 16);
        assert_eq!(with_ple.n_params() - without.n_params(), ple);
        // Layers that share keys and values have no k_proj, v_proj or k_norm of their own.
        let shared = parse(r#", "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 1"#).unwrap();
        assert_eq!(shared.layers.get(6).kv_source, Some(5), "the last layer reads the last global one before it");
        // Its keys are layer 5's: a forward asked for them is refused before it is built.
        let spec = crate::forward::ForwardSpec::new(
            1,
            4,
            vec![crate::hooks::HookPoint::block(6, crate::hooks::HookKind::AttnK)],
        );
        let err = crate::forward::build_forward(&shared, &spec).unwrap_err().to_string();
        assert!(err.contains("block 5's keys and values"), "{err}");
        let (d, kv) = (512, 2);
        assert_eq!(without.n_params() - shared.n_params(), 2 * kv * d * 16 + d);
    }

    #[test]
    fn what_siphon_does_not_build_is_refused_by_name() {
        for (extra, named) in [
            (r#", "num_kv_shared_layers": 7"#, "num_kv_shared_layers 7"),
            (r#", "enable_moe_block": true, "num_experts": 4"#, "top_k_experts"),
            (
                r#", "enable_moe_block": true, "num_experts": 4, "top_k_experts": 5, "moe_intermediate_size": 8"#,
                "top_k_experts 5",
            ),
            (r#", "use_bidirectional_attention": "all""#, "use_bidirectional_attention \"all\""),
            (r#", "attention_bias": true"#, "attention_bias"),
            (r#", "per_layer_config": {"x": {}}"#, "per_layer_config key \"x\""),
            (r#", "per_layer_config": {"1": {"intermediate_size": 8}}"#, "per_layer_config[1].intermediate_size"),
            (r#", "vocab_size_per_layer_input": 16"#, "vocab_size_per_layer_input 16"),
            (
                r#", "rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0}, "full_attention": {}}"#,
                "sliding-window layers",
            ),
        ] {
            let err = parse(extra).unwrap_err().to_string();
            assert!(err.contains(named), "{extra}: {err}");
        }
        // Text alone under "vision" bidirectionality is causal.
        assert!(parse(r#", "vocab_size_per_layer_input": 32, "use_bidirectional_attention": "vision""#).is_ok());
    }

    #[test]
    fn the_mixture_beside_the_mlp_is_read_with_its_weights() {
        let c = parse(
            r#", "hidden_size_per_layer_input": 0, "enable_moe_block": true, "num_experts": 4, "top_k_experts": 2,
            "moe_intermediate_size": 8"#,
        )
        .unwrap();
        assert_eq!(
            c.moe,
            Some(crate::config::Moe { n_experts: 4, top_k: 2, norm_topk: true, expert_size: 8, ..Default::default() })
        );
        let params = c.params(1, false);
        let gate = params.iter().find(|p| p.name == "model.layers.0.experts.gate_up_proj[gate]").unwrap();
        assert_eq!(
            (gate.shape.clone(), gate.source.as_ref().map(|s| s.stored.clone())),
            (vec![4, 8, 16], Some(vec![4, 16, 16]))
        );
        // The dense MLP stays, and with it its hooks; the mixture's hooks join them.
        let kinds = crate::hooks::hook_kinds(&c);
        assert!(
            kinds.contains(&crate::hooks::HookKind::MlpPost) && kinds.contains(&crate::hooks::HookKind::FfnRouterProbs)
        );
        assert!(!kinds.contains(&crate::hooks::HookKind::MlpExpertWeights));
    }

    #[test]
    fn a_multimodal_config_gives_its_text_tower() {
        let text = BASE.replace(r#""model_type": "gemma4_text", "#, "");
        let c = HfConfig::from_json(&format!(r#"{{"model_type": "gemma4", "text_config": {text}, "hidden_size_per_layer_input": 0}}, "vision_config": {{}}}}"#))
            .unwrap()
            .into_config()
            .unwrap();
        assert_eq!((c.arch, c.n_layers), (super::ARCH, 7));
    }
}
