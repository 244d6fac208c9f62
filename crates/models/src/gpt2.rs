//! GPT-2 (`model_type` `gpt2`): learned position embeddings added to the token embeddings;
//! pre-norm blocks with LayerNorm (gain and bias); multi-head attention from one fused
//! `c_attn` projection (`[q; k; v]` columns) with biases, scores scaled by `head_dim^-½`, no
//! rotary embedding; a plain MLP `c_proj(gelu_new(c_fc(x)))` with biases. Every projection is
//! a Conv1D, stored `[in, out]`.
//!
//! ```text
//! x = wte[input_ids] + wpe[position_ids]            # hook_embed + hook_pos_embed = blocks.0.hook_resid_pre
//! for each block i:
//!     n = ln_1(x)                                    # ln1.hook_scale / hook_normalized / hook_out
//!     q, k, v = split(c_attn(n))                     # attn.hook_q / hook_k / hook_v
//!     z = softmax(q·kᵀ / sqrt(d), causal) · v        # attn.hook_attn_scores / hook_pattern / hook_z
//!     x = x + attn.c_proj(z)                         # hook_attn_out, hook_resid_mid
//!     m = mlp.c_proj(gelu_new(c_fc(ln_2(x))))        # ln2.*, mlp.hook_in, mlp.hook_pre / hook_post, hook_mlp_out
//!     x = x + m                                      # hook_resid_post
//! ln_f(x)                                            # ln_final.*
//! ```
//!
//! The Conv1D weights are transposed to `[out, in]` and `c_attn` cut into its q, k and v parts
//! when read ([`crate::config::Slice`]), so they shard like any projection. Checkpoints with or
//! without the `transformer.` prefix load alike.

use serde_json::Value;

use crate::arch::{Arch, Family, FinalNorm};
use crate::config::{Activation, ModelConfig, ParamClass, ParamInfo, Slice};
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec, Graph};
use crate::hf_config::{ActivationKey, Defaults, HfConfig, need};
use crate::hooks::{Feature, HookKind, HookPoint};

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// GPT-2's weights and hooks (no rotary, gated-MLP or q/k-norm hooks).
pub(crate) static FAMILY: Family = Family {
    model_types: &["gpt2"],
    architectures: &["GPT2LMHeadModel"],
    from_hf,
    build,
    params,
    features: &[Feature::LearnedPositions, Feature::PreNorms, Feature::ResidMid, Feature::DenseMlp],
    renames: &[("transformer.", "")],
    final_norm: FinalNorm::PLAIN,
};

/// GPT2Config: its own key names (`n_embd`, `n_layer`, `n_head`, `n_positions`, `n_inner`,
/// `layer_norm_epsilon`, `activation_function` `gelu_new`), biases everywhere, tied; the
/// attention variants siphon does not build are refused by name.
fn from_hf(mut hf: HfConfig) -> Result<ModelConfig, ModelError> {
    for (key, refused) in [
        ("scale_attn_weights", false),
        ("scale_attn_by_inverse_layer_idx", true),
        ("reorder_and_upcast_attn", true),
        ("add_cross_attention", true),
    ] {
        if hf.key::<bool>(key)? == Some(refused) {
            return Err(ModelError::UnsupportedArch(format!("gpt2 with {key} = {refused}")));
        }
    }
    hf.hidden_size = hf.hidden_size.or(hf.key("n_embd")?);
    hf.num_hidden_layers = hf.num_hidden_layers.or(hf.key("n_layer")?);
    hf.num_attention_heads = hf.num_attention_heads.or(hf.key("n_head")?);
    hf.max_position_embeddings = hf.max_position_embeddings.or(hf.key("n_positions")?);
    // `n_inner` null or absent means 4 × n_embd.
    hf.intermediate_size = Some(match hf.extra.get("n_inner") {
        None | Some(Value::Null) => 4 * need(hf.hidden_size, "hidden_size")?,
        Some(v) => v.as_u64().ok_or_else(|| ModelError::Config(format!("n_inner {v} is not a number")))? as usize,
    });
    // The shared epsilon field carries LayerNorm's.
    hf.rms_norm_eps = hf.key("layer_norm_epsilon")?;
    hf.attention_bias = Some(true);
    let activation = ActivationKey { key: "activation_function", default: "gelu_new", accepted: ActivationKey::GELUS };
    hf.decoder(ARCH, &Defaults { norm_eps: 1e-5, tie_word_embeddings: true, activation, ..Defaults::LLAMA })
}

fn params(c: &ModelConfig, n_layers: usize, with_lm_head: bool) -> Vec<ParamInfo> {
    use ParamClass::*;
    let (h, i) = (c.hidden_size, c.intermediate_size);
    let mut out = vec![
        ParamInfo::new("transformer.wte.weight", &[c.vocab_size, h], Embedding, None),
        ParamInfo::new("transformer.wpe.weight", &[c.max_position_embeddings, h], PosEmbedding, None),
    ];
    for l in 0..n_layers {
        let p = format!("transformer.h.{l}");
        let layer = Some(l);
        let norm = |name: &str| {
            [
                ParamInfo::new(format!("{p}.{name}.weight"), &[h], Norm, layer),
                ParamInfo::new(format!("{p}.{name}.bias"), &[h], NormBias, layer),
            ]
        };
        out.extend(norm("ln_1"));
        // c_attn: weight [h, 3h] (Conv1D), bias [3h]; part j is columns j*h..(j+1)*h.
        for (j, part, class, bias_class) in [(0, "q", AttnQ, QBias), (1, "k", AttnK, KBias), (2, "v", AttnV, VBias)] {
            let tensor = format!("{p}.attn.c_attn.weight");
            let slice = Slice {
                tensor: tensor.clone(),
                stored: vec![h, 3 * h],
                transposed: true,
                groups: 1,
                start: j * h,
                len: h,
            };
            out.push(ParamInfo::part(format!("{tensor}[{part}]"), &[h, h], class, layer, slice));
            let tensor = format!("{p}.attn.c_attn.bias");
            let slice = Slice {
                tensor: tensor.clone(),
                stored: vec![3 * h],
                transposed: false,
                groups: 1,
                start: j * h,
                len: h,
            };
            out.push(ParamInfo::part(format!("{tensor}[{part}]"), &[h], bias_class, layer, slice));
        }
        out.push(ParamInfo::conv1d(format!("{p}.attn.c_proj.weight"), &[h, h], AttnO, layer));
        out.push(ParamInfo::new(format!("{p}.attn.c_proj.bias"), &[h], OBias, layer));
        out.extend(norm("ln_2"));
        out.push(ParamInfo::conv1d(format!("{p}.mlp.c_fc.weight"), &[i, h], MlpUp, layer));
        out.push(ParamInfo::new(format!("{p}.mlp.c_fc.bias"), &[i], MlpUpBias, layer));
        out.push(ParamInfo::conv1d(format!("{p}.mlp.c_proj.weight"), &[h, i], MlpDown, layer));
        out.push(ParamInfo::new(format!("{p}.mlp.c_proj.bias"), &[h], MlpDownBias, layer));
    }
    out.push(ParamInfo::new("transformer.ln_f.weight", &[h], Norm, None));
    out.push(ParamInfo::new("transformer.ln_f.bias", &[h], NormBias, None));
    if with_lm_head && !c.tie_word_embeddings {
        out.push(ParamInfo::new("lm_head.weight", &[c.vocab_size, h], LmHead, None));
    }
    out
}

/// Builds the GPT-2 forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != ARCH
        || config.attention.n_kv_heads != config.attention.n_heads
        || config.rope.rotary_dim.is_some()
    {
        return Err(ModelError::UnsupportedArch(format!("gpt2 builder given a {:?} config", config.arch)));
    }
    if !matches!(config.activation, Activation::GeluTanh | Activation::Gelu) || !config.layers.is_empty() {
        return Err(ModelError::UnsupportedArch(format!(
            "gpt2 with activation {:?} or layers that differ (windows, sizes, shared keys)",
            config.activation
        )));
    }
    if spec.seq > config.max_position_embeddings {
        return Err(ModelError::Config(format!(
            "sequences of {} tokens: gpt2 has {} learned positions (n_positions)",
            spec.seq, config.max_position_embeddings
        )));
    }
    use HookKind::*;
    let mut g = Graph::new(config, spec)?;
    let tokens = g.embed("transformer.wte.weight")?;
    g.hook(HookPoint::model(Embed), tokens);
    let positions = g.embed_positions("transformer.wpe.weight")?;
    g.hook(HookPoint::model(PosEmbed), positions);
    let x = g.b.add(tokens, positions)?;
    let x = g.blocks(x, |g, x, layer| {
        let at = |kind| HookPoint::block(layer, kind);
        let p = format!("transformer.h.{layer}");
        let mask = g.layer_mask(layer)?;
        let ln1 = g.layer_norm(x, &format!("{p}.ln_1.weight"), &format!("{p}.ln_1.bias"))?;
        g.hook_norm(&ln1, at(Ln1Scale), at(Ln1Normalized), at(Ln1Out))?;
        let [q, k, v] = g.fused_qkv(ln1.out, layer, &format!("{p}.attn.c_attn"))?;
        let z = g.attend(layer, q, k, v, mask)?;
        let attn = g.linear(z, &format!("{p}.attn.c_proj.weight"), Some(&format!("{p}.attn.c_proj.bias")))?;
        g.hook(at(AttnOut), attn);
        let h = g.b.add(x, attn)?;
        g.hook(at(ResidMid), h);
        let ln2 = g.layer_norm(h, &format!("{p}.ln_2.weight"), &format!("{p}.ln_2.bias"))?;
        g.hook_norm(&ln2, at(Ln2Scale), at(Ln2Normalized), at(MlpIn))?;
        let [fc, fc_b, proj, proj_b] =
            ["c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"].map(|n| format!("{p}.mlp.{n}"));
        let mlp = g.plain_mlp(ln2.out, [&fc, &fc_b], [&proj, &proj_b])?;
        g.hook_mlp(&mlp, layer, MlpOut);
        let out = g.b.add(h, mlp.out)?;
        Ok(out)
    })?;
    g.end_blocks(x)?;
    if g.with_final_norm {
        let norm = g.layer_norm(x, "transformer.ln_f.weight", "transformer.ln_f.bias")?;
        g.hook_final_norm(&norm)?;
    }
    g.finish()
}
