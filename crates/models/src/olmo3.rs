//! OLMo 3 (`model_type` `olmo3`): OLMo 2's post-norm block ([`crate::olmo2`]: norms after
//! attention and the MLP only, q/k RMS-normalised over the whole projection, gains applied
//! in f32) with sliding-window attention on the layers `layer_types` marks (by default three
//! of every four, the fourth full), RoPE given per layer type: the sliding layers with their
//! own base and no frequency scaling, the full ones with the model's RoPE.
//!
//! Hooks: OLMo 2's (TransformerLens's OLMo 3 adapter is OLMo 2's).

use crate::arch::{Arch, Family, FinalNorm, Gain};
use crate::config::{Attention, ModelConfig, Rope};
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec};
use crate::hf_config::{Defaults, HfConfig};

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// OLMo 2's weights and hooks.
pub(crate) static FAMILY: Family = Family {
    model_types: &["olmo3"],
    architectures: &["Olmo3ForCausalLM"],
    from_hf,
    build,
    params: crate::olmo2::params,
    features: crate::olmo2::FAMILY.features,
    renames: &[],
    final_norm: FinalNorm { gain: Gain::F32, folded: false, centred: true },
};

/// Olmo3Config's: eps 1e-5, RoPE base 5e5 on both kinds of layer, a window of 4096 on all
/// but every fourth layer.
const DEFAULTS: Defaults = Defaults { norm_eps: 1e-5, rope_theta: 500_000.0, windows, ..Defaults::LLAMA };

fn from_hf(mut hf: HfConfig) -> Result<ModelConfig, ModelError> {
    if hf.attention_bias == Some(true) {
        return Err(ModelError::UnsupportedArch("olmo3 with attention_bias = true".into()));
    }
    // Without `rope_parameters` by layer type, both kinds take `rope_theta` and only the
    // full layers `rope_scaling` (Olmo3Config.convert_rope_params_to_dict).
    let local = hf.rope_theta.unwrap_or(DEFAULTS.rope_theta);
    let local_rope_theta = hf.rope_by_layer_type(ARCH, local)?;
    let c = hf.decoder(ARCH, &DEFAULTS)?;
    Ok(ModelConfig {
        attention: Attention { qk_norm: true, qk_norm_whole: true, ..c.attention },
        rope: Rope { local_theta: Some(local_rope_theta), ..c.rope },
        ..c
    })
}

/// The windows `layer_types` gives, by default `sliding_attention` on all but every fourth
/// layer; `sliding_window` 4096 when absent. Hugging Face builds every sliding layer's mask
/// from the window, so sliding layers with a null window are refused.
fn windows(c: &HfConfig, n_layers: usize, _: Arch) -> Result<Vec<Option<usize>>, ModelError> {
    let Some(window) = c.sliding_window()?.unwrap_or(Some(4096)) else {
        if c.layer_types.as_ref().is_none_or(|types| types.iter().any(|t| t == "sliding_attention")) {
            return Err(ModelError::Config("olmo3 config with sliding layers and sliding_window null".into()));
        }
        return Ok(Vec::new());
    };
    c.windows_by_types_or_every(n_layers, window, 4)
}

/// Builds the OLMo 3 forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != ARCH {
        return Err(ModelError::UnsupportedArch(format!("olmo3 builder given a {:?} config", config.arch)));
    }
    crate::olmo2::build_post_norm(config, spec)
}

#[cfg(test)]
mod tests {
    use crate::config::{ModelConfig, RopeScaling};
    use crate::hf_config::HfConfig;

    fn parse(extra: &str) -> Result<ModelConfig, crate::error::ModelError> {
        let base = r#"{"model_type": "olmo3", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 4, "num_attention_heads": 4"#;
        HfConfig::from_json(&format!("{base}{extra}}}")).unwrap().into_config()
    }

    #[test]
    fn defaults_follow_olmo3config() {
        let c = parse("").unwrap();
        assert_eq!(c.layers.windows(), vec![Some(4096), Some(4096), Some(4096), None]);
        assert_eq!((c.rope.theta, c.rope.local_theta, c.rms_norm_eps), (500_000.0, Some(500_000.0), 1e-5));
        assert!(c.attention.qk_norm && c.attention.qk_norm_whole && !c.tie_word_embeddings);
        // Old-style keys: rope_theta on both kinds of layer, rope_scaling on the full ones only.
        let c = parse(
            r#", "rope_theta": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "sliding_window": 8"#,
        )
        .unwrap();
        assert_eq!((c.rope.theta, c.rope.local_theta), (1e4, Some(1e4)));
        assert_eq!(c.rope.scaling, Some(RopeScaling::Linear { factor: 2.0 }));
        assert_eq!(c.layers.windows()[0], Some(8));
    }

    #[test]
    fn what_siphon_does_not_build_is_refused_by_name() {
        let err = parse(r#", "sliding_window": null"#).unwrap_err().to_string();
        assert!(err.contains("sliding_window null"), "{err}");
        let err = parse(r#", "attention_bias": true"#).unwrap_err().to_string();
        assert!(err.contains("olmo3 with attention_bias"), "{err}");
        let err = parse(r#", "rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0}, "full_attention": {}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("olmo3's sliding-window layers"), "{err}");
        // A config whose every layer is full attends without windows even with a null window.
        let full = r#", "sliding_window": null, "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention"]"#;
        assert!(parse(full).unwrap().layers.windows().is_empty());
    }
}
