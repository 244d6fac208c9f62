//! What the planner can count, checked before it counts.
//!
//! The planner counts bytes in `u64`, XLA sizes arrays in `i64` and the host buffers in
//! `usize`: a batch, sequence or model dimension large enough to overflow them would wrap into
//! a small number (a plan that "fits") or a crash. So before any count, every term of the plan
//! — each weight, each hook's output, the attention scores, a mixture's routing, a dictionary's
//! latents, the host's buffers — is sized in `f64` (which does not overflow) at 8 bytes a
//! value, and a plan with any term past [`COUNTABLE_BYTES`] (4 PiB, far past any device's or
//! host's memory and far below `i64::MAX` even summed) is refused, naming the term. Below it
//! the exact `u64` counts of [`crate::memory`] cannot overflow.
//!
//! A sequence longer than the model's context ([`check_context`]) is a separate question: it
//! can be counted, but positions past `max_position_embeddings` were never trained.

use siphon_models::{HookPoint, ModelConfig, ParamInfo};

use crate::error::PlanError;
use crate::memory::DictionaryShape;

/// The largest term, in bytes at 8 bytes a value, the planner counts (2^52, 4 PiB).
pub const COUNTABLE_BYTES: f64 = (1u64 << 52) as f64;

/// Refuses a sequence longer than the model's context (`max_position_embeddings`, which a
/// RoPE-scaled model's config sets to its scaled limit), unless the caller allows it.
pub fn check_context(config: &ModelConfig, seq: usize) -> Result<(), PlanError> {
    if seq > config.max_position_embeddings {
        return Err(PlanError::LongContext { seq, limit: config.max_position_embeddings });
    }
    Ok(())
}

/// Sizes every term of a plan of `params` returning `hooks` (with `dictionaries`' latents)
/// for a `step` of batch × seq with `depth` steps in flight on the host; refuses the first
/// term past [`COUNTABLE_BYTES`].
pub(crate) fn check_countable(
    config: &ModelConfig,
    params: &[ParamInfo],
    hooks: &[HookPoint],
    dictionaries: &[DictionaryShape],
    step: Option<(usize, usize)>,
    depth: usize,
) -> Result<(), PlanError> {
    let product = |dims: &[usize]| dims.iter().map(|&d| d as f64).product::<f64>();
    let mut all = 0.0;
    for param in params {
        let bytes = 8.0 * product(&param.shape);
        all += bytes;
        countable(bytes, || format!("the weight {} {:?}", param.name, param.shape))?;
    }
    countable(all, || format!("the model's {} weights together", params.len()))?;
    let Some((batch, seq)) = step else { return Ok(()) };
    let step = format!("a step of batch {batch} × seq {seq}");
    let tokens = batch as f64 * seq as f64;
    for hook in hooks {
        let bytes = 8.0 * tokens * product(&hook.dims(config, seq));
        countable_step(bytes, || format!("{hook}'s output of {step}"))?;
    }
    let rows: f64 = hooks.iter().map(|h| 8.0 * product(&h.dims(config, seq))).sum();
    countable_step(rows * tokens * depth as f64, || {
        format!("the output path's host buffers of {depth} steps in flight of {step}")
    })?;
    let heads = config.attention.n_heads as f64;
    countable_step(8.0 * batch as f64 * heads * seq as f64 * seq as f64, || format!("the attention scores of {step}"))?;
    let widest = (0..config.n_layers)
        .map(|l| {
            let q = config.attention.n_heads * config.head_dim_at(l);
            let kv = config.kv_heads_at(l) * config.head_dim_at(l);
            config.hidden_size.max(config.intermediate_at(l)).max(q).max(kv) as f64
        })
        .fold(0.0, f64::max);
    countable_step(8.0 * tokens * widest, || format!("a block's projections of {step}"))?;
    if let Some(m) = &config.moe {
        let routed = tokens * m.top_k as f64;
        let width = (m.n_experts.max(config.hidden_size).max(m.expert_size)) as f64;
        countable_step(8.0 * routed * width, || format!("the mixture's routed rows of {step}"))?;
    }
    if let Some(la) = &config.linear_attention {
        let state = (la.n_value_heads * la.key_head_dim.max(la.value_head_dim)) as f64;
        countable_step(8.0 * tokens * state.max((la.key_dim() + la.value_dim()) as f64), || {
            format!("the linear attention's buffers of {step}")
        })?;
    }
    for d in dictionaries {
        for shape in &d.tensors {
            countable(8.0 * product(shape), || format!("the dictionary {}'s tensor {shape:?}", d.name))?;
        }
        countable_step(8.0 * tokens * d.d_sae.max(d.cap) as f64, || {
            format!("the dictionary {}'s latents of {step}", d.name)
        })?;
    }
    Ok(())
}

/// A term of the model alone (its weights, a dictionary's tensors).
fn countable(bytes: f64, what: impl FnOnce() -> String) -> Result<(), PlanError> {
    check(bytes, false, what)
}

/// A term that grows with the step's batch and sequence.
fn countable_step(bytes: f64, what: impl FnOnce() -> String) -> Result<(), PlanError> {
    check(bytes, true, what)
}

fn check(bytes: f64, per_step: bool, what: impl FnOnce() -> String) -> Result<(), PlanError> {
    if bytes.is_nan() || bytes > COUNTABLE_BYTES {
        return Err(PlanError::Uncountable { what: what(), bytes, per_step });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ModelConfig {
        siphon_models::HfConfig::from_json(
            r#"{"model_type": "llama", "vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1024,
                "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4,
                "max_position_embeddings": 4096}"#,
        )
        .unwrap()
        .into_config()
        .unwrap()
    }

    #[test]
    fn a_step_past_what_can_be_counted_is_refused_naming_its_term() {
        let config = config();
        let params = config.params(2, false);
        let hooks = [HookPoint::parse("blocks.1.hook_resid_post", &config).unwrap()];
        let check = |batch, seq| check_countable(&config, &params, &hooks, &[], Some((batch, seq)), 2);
        check(4, 4096).unwrap();
        // 4 × 10^9 tokens' scores: 8 heads × (10^9)² values.
        let err = check(4, 1_000_000_000).unwrap_err();
        assert!(err.to_string().contains("attention scores"), "{err}");
        // The products that wrap u64 are sized without wrapping.
        let err = check(1 << 32, 1 << 32).unwrap_err();
        assert!(err.to_string().contains("batch 4294967296 × seq 4294967296"), "{err}");
    }

    #[test]
    fn a_sequence_past_the_context_names_the_limit() {
        let err = check_context(&config(), 4097).unwrap_err();
        assert!(err.to_string().contains("max_position_embeddings 4096"), "{err}");
        check_context(&config(), 4096).unwrap();
    }
}
