//! The next token of each row of a decoding step, chosen on the devices: greedy (its first
//! largest logit), or drawn after Hugging Face's warpers in their order — temperature, top-k,
//! top-p, min-p, each as transformers applies it, in f32 — at the row's uniform: the first
//! token, in vocabulary order, whose cumulative probability passes it. The uniforms come with
//! the step (the engine's counter-based draws, keyed by seed, record, sample and step), so a
//! choice depends on none of the mesh, the batch or the slot.

use siphon_hlo::{Builder, CompareDir, DType, HloError, TensorType, Value};

use crate::contract::Sampling;
use crate::error::ModelError;
use crate::layers::attention::softmax_last;

/// Each row's next token, `[rows]` i32, from its logits `[rows, vocab]` f32: greedy, or drawn
/// at its uniform in `[0, 1)` (`uniforms` `[rows]` f32, given where `sampling` draws). A row
/// whose logits leave no token a probability (none finite) gets −1.
pub(crate) fn choose(
    b: &mut Builder,
    logits: Value,
    uniforms: Option<Value>,
    sampling: &Sampling,
) -> Result<Value, ModelError> {
    match uniforms {
        Some(u) if sampling.draws() => draw(b, logits, u, sampling),
        None if !sampling.draws() => Ok(first_largest(b, logits)?),
        _ => Err(ModelError::Config("a sampled step takes each row's uniform, a greedy one none".into())),
    }
}

/// A program of the draw alone: `logits` `[rows, vocab]` f32 and `uniforms` `[rows]` f32 to
/// each row's token `[rows]` i32, as a sampled decoding step chooses (for checks against
/// transformers' warpers).
pub fn program(rows: usize, vocab: usize, sampling: &Sampling) -> Result<String, ModelError> {
    sampling.check().map_err(ModelError::Config)?;
    let mut b = Builder::new("siphon_sample");
    let logits = b.arg(TensorType::new(DType::F32, &[rows, vocab]), None)?;
    let uniforms = b.arg(TensorType::new(DType::F32, &[rows]), None)?;
    let u = sampling.draws().then_some(uniforms);
    let choice = choose(&mut b, logits, u, sampling)?;
    Ok(b.finish(&[choice])?)
}

/// The warpers in transformers' order, then the draw at `u`.
fn draw(b: &mut Builder, logits: Value, u: Value, s: &Sampling) -> Result<Value, ModelError> {
    let dims = b.dims(logits)?.to_vec();
    let (rows, vocab) = (dims[0], dims[1]);
    let f32s = TensorType::new(DType::F32, &dims);
    let lowest = b.splat(f64::NEG_INFINITY, f32s.clone())?;
    let temperature = b.splat(s.temperature, f32s.clone())?;
    let mut x = b.div(logits, temperature)?;
    if s.top_k > 0 && s.top_k < vocab {
        // Below the k-th largest go (`scores < topk(scores, k)[..., -1]`).
        let (top, _) = b.top_k(x, s.top_k)?;
        let kth = b.slice_dim(top, 1, s.top_k - 1, s.top_k)?;
        let kth = b.reshape(kth, &[rows])?;
        let kth = b.broadcast_in_dim(kth, &dims, &[0])?;
        let below = b.compare(CompareDir::Lt, x, kth)?;
        x = b.select(below, lowest, x)?;
    }
    let index = b.iota(TensorType::new(DType::I32, &dims), 1)?;
    if s.top_p < 1.0 {
        // Ascending (ties in vocabulary order), the least likely whose cumulative probability
        // stays within 1 − top_p go; the likeliest always stays. Then back in vocabulary order.
        let sorted = b.sort_by_first(&[x, index], 1)?;
        let probs = softmax_last(b, sorted[0])?;
        let cumulative = cumsum(b, probs)?;
        let cut = b.splat(1.0 - s.top_p, f32s.clone())?;
        let within = b.compare(CompareDir::Le, cumulative, cut)?;
        let last = b.splat((vocab - 1) as f64, TensorType::new(DType::I32, &dims))?;
        let not_last = b.compare(CompareDir::Lt, index, last)?;
        let gone = b.and(within, not_last)?;
        let kept = b.select(gone, lowest, sorted[0])?;
        let at = b.reshape(sorted[1], &[rows, vocab, 1])?;
        x = b.put_along(x, 0, &[1], at, kept)?;
    }
    if s.min_p > 0.0 {
        // Less likely than min_p times the likeliest go.
        let probs = softmax_last(b, x)?;
        let top = b.reduce_max(probs, &[1])?;
        let top = b.broadcast_in_dim(top, &dims, &[0])?;
        let min_p = b.splat(s.min_p, f32s.clone())?;
        let floor = b.mul(min_p, top)?;
        let below = b.compare(CompareDir::Lt, probs, floor)?;
        x = b.select(below, lowest, x)?;
    }
    let probs = softmax_last(b, x)?;
    let cumulative = cumsum(b, probs)?;
    let zero = b.splat(0.0, f32s)?;
    let likely = b.compare(CompareDir::Gt, probs, zero)?;
    let u = b.broadcast_in_dim(u, &dims, &[0])?;
    let past = b.compare(CompareDir::Gt, cumulative, u)?;
    // Only a token with a probability is drawn (the sums need not rise at every token).
    let drawn = b.and(past, likely)?;
    let drawn = first_where(b, drawn)?;
    // Past every sum (rounding): the last token with a probability.
    let none = b.splat(-1.0, TensorType::new(DType::I32, &dims))?;
    let last = b.select(likely, index, none)?;
    let last = b.reduce_max(last, &[1])?;
    let beyond = b.splat(vocab as f64, TensorType::new(DType::I32, &[rows]))?;
    let missed = b.compare(CompareDir::Eq, drawn, beyond)?;
    Ok(b.select(missed, last, drawn)?)
}

/// The index of each row's first largest value of `x` `[rows, n]` f32, `[rows]` i32 — a NaN
/// never chosen.
fn first_largest(b: &mut Builder, x: Value) -> Result<Value, HloError> {
    let dims = b.dims(x)?.to_vec();
    let nan = b.compare(CompareDir::Ne, x, x)?;
    let lowest = b.splat(f64::NEG_INFINITY, TensorType::new(DType::F32, &dims))?;
    let x = b.select(nan, lowest, x)?;
    let top = b.reduce_max(x, &[1])?;
    let top = b.broadcast_in_dim(top, &dims, &[0])?;
    let at_top = b.compare(CompareDir::Eq, x, top)?;
    first_where(b, at_top)
}

/// The first index of each row of `at` `[rows, n]` (pred) that holds, `n` where none does.
fn first_where(b: &mut Builder, at: Value) -> Result<Value, HloError> {
    let dims = b.dims(at)?.to_vec();
    let index = b.iota(TensorType::new(DType::I32, &dims), 1)?;
    let past = b.splat(dims[1] as f64, TensorType::new(DType::I32, &dims))?;
    let index = b.select(at, index, past)?;
    // The smallest: minus the largest of the negatives.
    let index = b.neg(index)?;
    let first = b.reduce_max(index, &[1])?;
    b.neg(first)
}

/// Inclusive prefix sums along the last dimension of `x` `[rows, n]` f32: ⌈log₂ n⌉ steps, each
/// adding the sums so far shifted by twice the last step's (Hillis and Steele's scan).
fn cumsum(b: &mut Builder, x: Value) -> Result<Value, HloError> {
    let dims = b.dims(x)?.to_vec();
    let (rows, n) = (dims[0], dims[1]);
    let mut sums = x;
    let mut shift = 1;
    while shift < n {
        let zeros = b.splat(0.0, TensorType::new(DType::F32, &[rows, shift]))?;
        let head = b.slice_dim(sums, 1, 0, n - shift)?;
        let shifted = b.concatenate(&[zeros, head], 1)?;
        sums = b.add(sums, shifted)?;
        shift *= 2;
    }
    Ok(sums)
}
