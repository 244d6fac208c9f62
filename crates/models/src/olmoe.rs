//! OLMoE (`model_type` `olmoe`, e.g. OLMoE-1B-7B): Llama's pre-norm decoder whose queries and
//! keys are RMS-normalised over the whole projection (`q_norm` `[n_heads * head_dim]`,
//! `k_norm` `[n_kv_heads * head_dim]`, as OLMo 2's) before RoPE, and whose MLP is a routed
//! mixture of SiLU-gated experts on every layer, `intermediate_size` wide: a linear router
//! (`mlp.gate`), softmax in f32, the `num_experts_per_tok` most probable experts, renormalised
//! only when `norm_topk_prob` (not in the released checkpoints), each expert
//! `mlp.experts.{e}.{gate,up,down}_proj` (see [`crate::forward::Graph::moe_mlp`]). Norms apply
//! their gain after the cast back, as Llama's. Configs with `clip_qkv` or attention biases are
//! refused.
//!
//! Hooks: Llama's with OLMo 2's whole-projection q/k-norm hooks, except the MLP's insides;
//! `hook_mlp_out` is the mixture's output.

use crate::arch::{Arch, Family, FinalNorm};
use crate::config::{Attention, ModelConfig, Moe};
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec, decoder_params, self_attention_decoder};
use crate::hf_config::{Defaults, HfConfig, need};
use crate::hooks::Feature;

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// The decoder's weights with whole-projection q/k norms and the experts; Qwen3-MoE's hooks.
pub(crate) static FAMILY: Family = Family {
    model_types: &["olmoe"],
    architectures: &["OlmoeForCausalLM"],
    from_hf,
    build,
    params: |c, n, lm_head| decoder_params(c, n, lm_head, &[]),
    features: &[Feature::PreNorms, Feature::ResidMid, Feature::Rotary, Feature::QkNorm, Feature::Moe],
    renames: &[],
    final_norm: FinalNorm::PLAIN,
};

/// OlmoeConfig: eps 1e-5, untied, experts `intermediate_size` wide, not renormalised unless
/// `norm_topk_prob`.
fn from_hf(hf: HfConfig) -> Result<ModelConfig, ModelError> {
    let refuse = |what: &str| Err(ModelError::UnsupportedArch(format!("olmoe with {what}")));
    if hf.attention_bias == Some(true) {
        return refuse("attention_bias = true");
    }
    if let Some(clip) = hf.key::<f64>("clip_qkv")? {
        return refuse(&format!("clip_qkv = {clip}"));
    }
    let (n_experts, top_k) = hf.experts()?;
    let expert_size = need(hf.intermediate_size, "intermediate_size")?;
    let norm_topk = hf.norm_topk_prob.unwrap_or(false);
    let c = hf.decoder(ARCH, &Defaults { norm_eps: 1e-5, ..Defaults::LLAMA })?;
    // HF sizes k_norm by `hidden_size / num_attention_heads` per KV head.
    if c.attention.head_dim * c.attention.n_heads != c.hidden_size {
        return refuse(&format!("head_dim {} != hidden_size / num_attention_heads", c.attention.head_dim));
    }
    let moe = Some(Moe { n_experts, top_k, norm_topk, expert_size, ..Default::default() });
    Ok(ModelConfig { attention: Attention { qk_norm: true, qk_norm_whole: true, ..c.attention }, moe, ..c })
}

/// Builds the OLMoE forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != ARCH || config.moe.is_none() || !config.attention.qk_norm_whole || config.attention.qkv_bias {
        return Err(ModelError::UnsupportedArch(format!("olmoe builder given a {:?} config", config.arch)));
    }
    self_attention_decoder(config, spec)
}

#[cfg(test)]
mod tests {
    use crate::config::Moe;
    use crate::hf_config::HfConfig;

    const OLMOE: &str = r#"{"model_type": "olmoe", "vocab_size": 50, "hidden_size": 64, "intermediate_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 8,
        "num_experts_per_tok": 2, "clip_qkv": null}"#;

    #[test]
    fn reads_olmoe_and_refuses_what_it_does_not_build() {
        let c = HfConfig::from_json(OLMOE).unwrap().into_config().unwrap();
        assert_eq!(
            c.moe,
            Some(Moe { n_experts: 8, top_k: 2, norm_topk: false, expert_size: 32, ..Default::default() })
        );
        assert!(c.attention.qk_norm && c.attention.qk_norm_whole);
        assert_eq!((c.rms_norm_eps, c.attention.head_dim, c.tie_word_embeddings), (1e-5, 16, false));
        let params = c.arch.family().params;
        let names: Vec<(String, Vec<usize>)> = params(&c, 1, false).into_iter().map(|p| (p.name, p.shape)).collect();
        assert!(names.contains(&("model.layers.0.self_attn.q_norm.weight".into(), vec![64])));
        assert!(names.contains(&("model.layers.0.self_attn.k_norm.weight".into(), vec![32])));
        for (bad, named) in [
            (OLMOE.replace("\"clip_qkv\": null", "\"clip_qkv\": 8.0"), "clip_qkv = 8"),
            (OLMOE.replace("\"clip_qkv\": null", "\"attention_bias\": true"), "attention_bias"),
            (OLMOE.replace("\"clip_qkv\": null", "\"head_dim\": 8"), "head_dim 8"),
        ] {
            let err = HfConfig::from_json(&bad).unwrap().into_config().unwrap_err().to_string();
            assert!(err.contains(named), "{err}");
        }
    }
}
