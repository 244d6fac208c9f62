//! The forward's analytic operations per token, to hold a compiler's count against.
//!
//! Per token, for the blocks the hooks need: `2 · n` for every weight matrix of `n` values
//! the token goes through (projections, dense MLPs, routers, MLA's latents, linear
//! attention's projections and its convolution); a mixture's stacked experts count
//! `top_k / n_experts` of theirs (each token visits `top_k`); embeddings are lookups (0),
//! norms, biases and scalars are left out. Softmax attention adds `2 · heads · (d_qk + d_v) · S`
//! per layer: scores and the weighted sum over all `S` positions, as the program computes
//! them (masked, not skipped; windows included); a decoding step's over what each block's
//! cache holds ([`decode_flops_per_token`]). A linear-attention layer's recurrence is left
//! out (small beside its projections). Elementwise work (norms, RoPE, softmax, activations)
//! is what a compiler's count adds: a few percent.

use siphon_models::{HookPoint, ModelConfig, ParamClass};

use crate::error::PlanError;

/// Operations per token of the forward returning `hooks`, at `seq` tokens a row.
pub fn forward_flops_per_token(config: &ModelConfig, hooks: &[HookPoint], seq: usize) -> Result<f64, PlanError> {
    forward_flops(config, hooks, |layer| attention_flops(config, layer, seq))
}

/// Operations per new token of a decoding step over caches of `step`: every block's matrices,
/// its attention over the positions its cache holds (a windowed block's ring; a latent
/// attention's scores over the latent and RoPE key and its values through the latent), and
/// the unembedding.
pub fn decode_flops_per_token(config: &ModelConfig, step: siphon_models::DecodeStep) -> Result<f64, PlanError> {
    let final_norm = [HookPoint::model(siphon_models::HookKind::LnFinalOut)];
    let heads = config.attention.n_heads as f64;
    let blocks = forward_flops(config, &final_norm, |layer| {
        let positions = step.ring(config.window(layer));
        match &config.mla {
            Some(mla) => {
                let (rank, rope) = (mla.kv_lora_rank as f64, mla.rope as f64);
                2.0 * heads * (2.0 * rank + rope) * positions as f64
            }
            None => attention_flops(config, layer, positions),
        }
    })?;
    Ok(blocks + 2.0 * (config.vocab_size * config.hidden_size) as f64)
}

/// Softmax attention's two products in block `layer` over `positions` keys, per query.
fn attention_flops(config: &ModelConfig, layer: usize, positions: usize) -> f64 {
    let (qk, v) = match &config.mla {
        Some(mla) => ((mla.nope + mla.rope) as f64, mla.v_head_dim as f64),
        None => (config.head_dim_at(layer) as f64, config.head_dim_at(layer) as f64),
    };
    2.0 * config.attention.n_heads as f64 * (qk + v) * positions as f64
}

/// The matrices' operations per token of the forward returning `hooks`, and `attention(layer)`
/// for each softmax-attention block it runs.
fn forward_flops(
    config: &ModelConfig,
    hooks: &[HookPoint],
    attention: impl Fn(usize) -> f64,
) -> Result<f64, PlanError> {
    let params = siphon_models::forward::forward_params(config, hooks)
        .map_err(|e| PlanError::Request(format!("the forward for these hooks: {e}")))?;
    let mut flops = 0.0;
    for param in &params {
        let n = param.shape.iter().product::<usize>() as f64;
        flops += match param.class {
            ParamClass::AttnQ
            | ParamClass::AttnK
            | ParamClass::AttnV
            | ParamClass::AttnO
            | ParamClass::MlpGate
            | ParamClass::MlpUp
            | ParamClass::MlpDown
            | ParamClass::Router
            | ParamClass::LinearKeys
            | ParamClass::LinearValues
            | ParamClass::LinearOut
            | ParamClass::LinearConv
            | ParamClass::Latent
            | ParamClass::PerLayerInput
                if param.shape.len() >= 2 =>
            {
                2.0 * n
            }
            ParamClass::ExpertGate | ParamClass::ExpertUp | ParamClass::ExpertDown => {
                let moe = config.moe.as_ref().expect("experts without a mixture config");
                2.0 * n * moe.top_k as f64 / moe.n_experts as f64
            }
            _ => 0.0,
        };
    }
    let (blocks, _) = siphon_models::forward::blocks_needed(config, hooks);
    for layer in 0..blocks {
        if !config.linear_attention.as_ref().is_some_and(|la| la.is_linear(layer)) {
            flops += attention(layer);
        }
    }
    Ok(flops)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Llama-shaped model by hand: q, k, v, o, gate, up, down per layer and the attention's
    /// two products over the sequence.
    #[test]
    fn a_dense_models_flops_are_its_matrices_and_attention() {
        let config = siphon_models::HfConfig::from_json(
            r#"{"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 256,
                "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2}"#,
        )
        .unwrap()
        .into_config()
        .unwrap();
        let hooks = siphon_models::resolve_hooks("blocks.1.hook_resid_post", &config).unwrap();
        let (h, i, q, kv, s) = (64.0, 256.0, 64.0, 16.0, 128.0);
        let layer = 2.0 * (h * q + 2.0 * h * kv + q * h + 3.0 * h * i) + 2.0 * 8.0 * (8.0 + 8.0) * s;
        let got = forward_flops_per_token(&config, &hooks, 128).unwrap();
        assert_eq!(got, 2.0 * layer);
    }

    /// A decoding step's token: every block, its attention over what its cache holds — a
    /// window of 16 a ring of 16 + 8 - 1 positions of the 100 — and the unembedding.
    #[test]
    fn a_decoding_steps_flops_read_each_blocks_cache() {
        let config = siphon_models::HfConfig::from_json(
            r#"{"model_type": "mistral", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 256,
                "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2, "sliding_window": 16}"#,
        )
        .unwrap()
        .into_config()
        .unwrap();
        let step = siphon_models::DecodeStep { cache_len: 100, chunk: 8 };
        let (h, i, q, kv) = (64.0, 256.0, 64.0, 16.0);
        let layer = 2.0 * (h * q + 2.0 * h * kv + q * h + 3.0 * h * i) + 2.0 * 8.0 * (8.0 + 8.0) * 23.0;
        let got = decode_flops_per_token(&config, step).unwrap();
        assert_eq!(got, 3.0 * layer + 2.0 * 1000.0 * h);
    }
}
