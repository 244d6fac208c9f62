//! Qwen3.5 (`model_type` `qwen3_5_text`, dense, and `qwen3_5_moe_text`, a mixture): Qwen3-Next's
//! hybrid decoder ([`crate::qwen3_next`]) with the linear attention's projections stored one
//! per part (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`); the dense model has a
//! SiLU-gated MLP on every layer, the mixture Qwen3-Next's routed experts (always
//! renormalised) and gated shared expert.
//!
//! Multimodal checkpoints (`model_type` `qwen3_5` / `qwen3_5_moe`) give their text tower: its
//! config is `text_config`, its weights sit under `model.language_model.`; the vision tower
//! is not read. Their RoPE is multimodal (`mrope_section`): for text, whose three position
//! ids are equal, it is the plain rotary of the first `partial_rotary_factor` of each head.

use crate::arch::{Arch, Family, FinalNorm};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::hf_config::{Defaults, HfConfig};
use crate::hooks::Feature;
use crate::qwen3_next::{self, MIXTURE_FEATURES, build_hybrid, hybrid, hybrid_params, mixture};

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// The hybrid decoder with a dense MLP.
pub(crate) static FAMILY: Family = Family {
    model_types: &["qwen3_5", "qwen3_5_text"],
    architectures: &["Qwen3_5ForCausalLM"],
    from_hf: |hf| from_hf(hf, "qwen3_5", "qwen3_5_text", false),
    build: build_hybrid,
    params: hybrid_params,
    features: &[
        Feature::PreNorms,
        Feature::ResidMid,
        Feature::DenseMlp,
        Feature::GatedMlp,
        Feature::Rotary,
        Feature::QkNorm,
        Feature::AttnGate,
        Feature::LinearAttention,
    ],
    renames: TEXT_TOWER,
    final_norm: FinalNorm::UNIT_OFFSET,
};

/// The mixture family's handle.
pub(crate) const MOE_ARCH: Arch = Arch::of(&MOE_FAMILY);

/// The hybrid decoder with the mixture.
pub(crate) static MOE_FAMILY: Family = Family {
    model_types: &["qwen3_5_moe", "qwen3_5_moe_text"],
    architectures: &["Qwen3_5MoeForCausalLM"],
    from_hf: |hf| from_hf(hf, "qwen3_5_moe", "qwen3_5_moe_text", true),
    build: build_hybrid,
    params: hybrid_params,
    features: MIXTURE_FEATURES,
    renames: TEXT_TOWER,
    final_norm: FinalNorm::UNIT_OFFSET,
};

/// Where a multimodal checkpoint keeps its text tower's weights.
const TEXT_TOWER: &[(&str, &str)] = &[("model.", "model.language_model.")];

fn from_hf(hf: HfConfig, multimodal: &str, text: &str, experts: bool) -> Result<ModelConfig, ModelError> {
    if hf.model_type.as_deref() == Some(multimodal) {
        return from_hf(hf.text_tower(text)?, multimodal, text, experts);
    }
    let (arch, moe) = match experts {
        true => (MOE_ARCH, Some(mixture(&hf, true)?)),
        false => (ARCH, None),
    };
    hybrid(hf, arch, &DEFAULTS, false, moe)
}

/// Qwen3-Next's, with the multimodal RoPE's sections read to no effect.
const DEFAULTS: Defaults = Defaults { rope_no_effect: &["mrope_section", "mrope_interleaved"], ..qwen3_next::DEFAULTS };

#[cfg(test)]
mod tests {
    use crate::hf_config::HfConfig;

    #[test]
    fn reads_qwen3_5_and_its_multimodal_text_tower() {
        let text = r#"{"vocab_size": 32, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10], "mrope_interleaved": true}}"#;
        let dense = HfConfig::from_json(&text.replacen('{', r#"{"model_type": "qwen3_5_text", "#, 1)).unwrap();
        let dense = dense.into_config().unwrap();
        let mm = format!(r#"{{"model_type": "qwen3_5", "text_config": {text}, "vision_config": {{}}}}"#);
        let mm = HfConfig::from_json(&mm).unwrap().into_config().unwrap();
        assert_eq!(dense, mm);
        assert_eq!((dense.rope.rotary_dim, dense.rope.theta, dense.moe.is_none()), (Some(2), 1e7, true));
        assert!(!dense.linear_attention.as_ref().unwrap().fused);
        let moe = text.replacen(
            '{',
            r#"{"model_type": "qwen3_5_moe_text", "num_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 8, "shared_expert_intermediate_size": 12, "#,
            1,
        );
        let moe = HfConfig::from_json(&moe).unwrap().into_config().unwrap();
        assert!(moe.moe.as_ref().unwrap().norm_topk);
    }
}
