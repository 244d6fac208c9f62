//! Gemma 3 (text models, `model_type` `gemma3_text`): the Gemma 2 block ([`crate::gemma2`]:
//! `(1 + w)` RMSNorms before and after attention and the MLP, embeddings × `sqrt(hidden)`,
//! GeGLU, scores × `query_pre_attn_scalar^-0.5`) with an RMSNorm, `(1 + w)` too, over
//! `head_dim` on every query and key head before RoPE; local sliding-window layers and global
//! layers as `layer_types` says (five local for each global by default), the local ones with
//! their own RoPE base (`rope_local_base_freq`, or `rope_parameters.sliding_attention`) and no
//! frequency scaling, the global ones with `rope_theta` and any RoPE scaling; no logit
//! soft-cap unless the config sets one.
//!
//! TransformerLens's hooks are Gemma 2's plus Qwen3's q/k-norm hooks. Multimodal checkpoints
//! (`model_type` `gemma3`) give their text tower: its config is `text_config` and its weights
//! sit under `model.language_model.` (or `language_model.model.`); the vision tower is not read.

use crate::arch::{Arch, Family, FinalNorm};
use crate::config::{Attention, ModelConfig, Rope};
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec};
use crate::gemma2::{GEMMA_ACTIVATION, gemma_config, gemma_params, gemma_windows};
use crate::hf_config::{Defaults, HfConfig};
use crate::hooks::Feature;

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// Gemma 2's weights and hooks plus the q/k norms'.
pub(crate) static FAMILY: Family = Family {
    model_types: &["gemma3", "gemma3_text"],
    architectures: &["Gemma3ForCausalLM"],
    from_hf,
    build,
    params: gemma_params,
    features: &[
        Feature::PreNorms,
        Feature::ResidMid,
        Feature::DenseMlp,
        Feature::GatedMlp,
        Feature::Rotary,
        Feature::PostNorms,
        Feature::QkNorm,
    ],
    // The text tower of multimodal checkpoints: transformers 5 and late 4.x save it under
    // `model.language_model.`, earlier ones under `language_model.model.`.
    renames: &[("model.", "model.language_model."), ("model.", "language_model.model.")],
    final_norm: FinalNorm::UNIT_OFFSET,
};

/// Gemma3TextConfig's: `head_dim` 256, global layers with base 1e6, five local layers for
/// each global one (`sliding_window_pattern`).
const DEFAULTS: Defaults = Defaults {
    head_dim: Some(256),
    rope_theta: 1_000_000.0,
    activation: GEMMA_ACTIVATION,
    windows: |c, n_layers, _| match c.key("sliding_window_pattern")?.unwrap_or(6) {
        0 => Err(ModelError::Config("sliding_window_pattern 0 must be at least 1".into())),
        pattern => gemma_windows(c, n_layers, pattern),
    },
    ..Defaults::LLAMA
};

fn from_hf(mut hf: HfConfig) -> Result<ModelConfig, ModelError> {
    if hf.model_type.as_deref() == Some("gemma3") {
        // A multimodal checkpoint: its text tower is a gemma3_text model whose weights sit
        // under `language_model.` (the family's renames find them).
        return from_hf(hf.text_tower("gemma3_text")?);
    }
    // Local layers take `rope_local_base_freq` (1e4) and no scaling.
    let local = hf.key::<f64>("rope_local_base_freq")?.unwrap_or(10_000.0);
    let local_rope_theta = hf.rope_by_layer_type(ARCH, local)?;
    let c = gemma_config(&hf, ARCH, &DEFAULTS, None, None)?;
    Ok(ModelConfig {
        attention: Attention { qk_norm: true, ..c.attention },
        rope: Rope { local_theta: Some(local_rope_theta), ..c.rope },
        ..c
    })
}

/// Builds the Gemma 3 forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != ARCH || !config.attention.qk_norm {
        return Err(ModelError::UnsupportedArch(format!(
            "gemma3 builder given a {:?} config without q/k norms",
            config.arch
        )));
    }
    crate::gemma2::build_gemma(config, spec)
}

#[cfg(test)]
mod tests {
    use crate::config::RopeScaling;
    use crate::hf_config::HfConfig;

    #[test]
    fn gemma3_defaults_and_rope_per_layer_type_follow_gemma3textconfig() {
        let base = r#"{"model_type": "gemma3_text", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 7, "num_attention_heads": 4"#;
        let parse = |extra: &str| HfConfig::from_json(&format!("{base}{extra}}}")).unwrap().into_config();
        let c = parse("").unwrap();
        assert_eq!(
            (c.arch, c.attention.head_dim, c.attention.qk_norm, c.attention.softcap),
            (super::ARCH, 256, true, None)
        );
        assert_eq!((c.rope.theta, c.rope.local_theta), (1_000_000.0, Some(10_000.0)));
        // Five local layers for each global one.
        let local = Some(4096);
        assert_eq!(c.layers.windows(), vec![local, local, local, local, local, None, local]);
        // transformers 4 spelling, then transformers 5's rope_parameters by layer type.
        let c = parse(r#", "rope_theta": 5e5, "rope_local_base_freq": 500.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0}"#).unwrap();
        assert_eq!((c.rope.theta, c.rope.local_theta), (5e5, Some(500.0)));
        assert_eq!(c.rope.scaling, Some(RopeScaling::Linear { factor: 8.0 }));
        let c = parse(
            r#", "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e5},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}}"#,
        )
        .unwrap();
        assert_eq!((c.rope.theta, c.rope.local_theta), (1e5, Some(1000.0)));
        assert_eq!(c.rope.scaling, Some(RopeScaling::Linear { factor: 4.0 }));
        let err =
            parse(r#", "rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0}}"#).unwrap_err();
        assert!(err.to_string().contains("sliding-window layers"), "{err}");
        // Per-layer-type RoPE elsewhere, and multimodal checkpoints, are refused by name.
        let err = HfConfig::from_json(&format!(
            "{}, \"rope_parameters\": {{\"full_attention\": {{}}}}}}",
            base.replace("gemma3_text", "llama")
        ))
        .unwrap()
        .into_config()
        .unwrap_err();
        assert!(err.to_string().contains("per layer type"), "{err}");
        let err = HfConfig::from_json(r#"{"model_type": "gemma3"}"#).unwrap().into_config().unwrap_err();
        assert!(err.to_string().contains("multimodal"), "{err}");
        // A pattern of 0 layers would divide by zero.
        let err = parse(r#", "sliding_window_pattern": 0"#).unwrap_err();
        assert!(err.to_string().contains("sliding_window_pattern 0"), "{err}");
    }
}
