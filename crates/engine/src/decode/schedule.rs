//! The scheduler: which sequence each of the decoder's slots holds. Each step feeds every busy
//! slot — up to the decoder's `chunk` ([`DecodeStep`]) tokens of a prompt not yet in its cache,
//! or the one token its sequence last drew — so a long prompt or a long completion never idles
//! the other slots. A step where some slot still has prompt tokens to feed is `chunk` tokens
//! wide for every slot, and a slot drawing tokens waits it out; else a step is one token wide.
//! So a position's values come from the program its kind of token always takes, whatever the
//! other slots hold: on given slots and mesh, a completion is the same bits on any schedule
//! (slots refilled at other times, a resumed run). Freed slots take their next prompts
//! together, once half of them are free ([`refill_at`]; or none is busy, or the prompts left
//! fill them): one wide step, where refilling each as it frees would take one wide step each.

use std::collections::VecDeque;

use siphon_models::DecodeStep;

use super::Decoder;
use super::sampler::{choose, uniform};
use crate::batch::Batch;
use crate::error::EngineError;

/// A sequence to complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// The record it comes from (a key of the sampler's draws).
    pub record: u64,
    /// Which completion of the record (a key of the sampler's draws).
    pub sample: u32,
    /// Its token ids.
    pub ids: Vec<u32>,
}

/// How sequences are completed.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Tokens a completion holds at most.
    pub max_new_tokens: usize,
    /// Tokens that end a completion as the model's end of sequence (kept as its last).
    pub eos_ids: Vec<u32>,
    /// Other tokens that end a completion (kept as its last); a caller's own rule too
    /// ([`generate_each`]'s `stops`).
    pub stop_ids: Vec<u32>,
    /// The seed of every draw.
    pub seed: u64,
}

/// Why a completion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-sequence token.
    Eos,
    /// A stop token, or the caller's rule (a stop string).
    Stop,
    /// `max_new_tokens`, or the cache's last position.
    Length,
}

impl Finish {
    /// `eos`, `stop` or `length`.
    pub fn name(self) -> &'static str {
        match self {
            Finish::Eos => "eos",
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// A prompt's completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The tokens drawn, in order (an end token included).
    pub ids: Vec<u32>,
    /// Why it ended.
    pub finish: Finish,
}

/// A slot's sequence: its prompt and what it drew, and how much of it is in the cache.
struct Active {
    index: usize,
    tokens: Vec<u32>,
    prompt: usize,
    cached: usize,
}

/// Completes every prompt on `decoder`'s slots, in `prompts`' order. A prompt that is empty
/// or leaves no room in the cache for a token is refused by record before any step.
pub fn generate(decoder: &mut Decoder<'_>, prompts: &[Prompt], s: &Settings) -> Result<Vec<Completion>, EngineError> {
    let mut done: Vec<Option<Completion>> = vec![None; prompts.len()];
    generate_each(decoder, prompts, s, &|_| false, |i, completion| {
        done[i] = Some(completion);
        Ok(())
    })?;
    Ok(done.into_iter().map(|c| c.expect("every prompt was completed")).collect())
}

/// [`generate`], handing each completion to `done` with its prompt's index as soon as it
/// ends (not in order); an error from `done` stops the loop. `stops` says whether a completion's
/// ids so far end it as a stop (the caller's rule: a stop string in their text).
pub fn generate_each(
    decoder: &mut Decoder<'_>,
    prompts: &[Prompt],
    s: &Settings,
    stops: &dyn Fn(&[u32]) -> bool,
    mut done: impl FnMut(usize, Completion) -> Result<(), EngineError>,
) -> Result<(), EngineError> {
    if s.max_new_tokens == 0 {
        return Err(EngineError::Options("max_new_tokens 0: a completion takes at least 1 token".into()));
    }
    let DecodeStep { cache_len, chunk } = decoder.cache();
    if let Some(p) = prompts.iter().find(|p| p.ids.is_empty() || p.ids.len() > cache_len) {
        return Err(EngineError::Batch(format!(
            "record {}'s prompt has {} tokens: decoding takes 1 to {cache_len} (the positions a sequence holds)",
            p.record,
            p.ids.len(),
        )));
    }
    let mut pending: VecDeque<usize> = (0..prompts.len()).collect();
    let mut slots: Vec<Option<Active>> = (0..decoder.slots()).map(|_| None).collect();
    loop {
        if refills(&slots, pending.len()) {
            for slot in slots.iter_mut().filter(|s| s.is_none()) {
                let Some(index) = pending.pop_front() else { break };
                let ids = prompts[index].ids.clone();
                *slot = Some(Active { index, prompt: ids.len(), tokens: ids, cached: 0 });
            }
        }
        if slots.iter().all(Option::is_none) {
            break;
        }
        let (width, fed) = feeds(&slots, chunk.min(cache_len));
        let (mut ids, mut mask, mut positions) = (Vec::new(), Vec::new(), Vec::new());
        let mut uniforms = Vec::with_capacity(slots.len());
        for (slot, &n) in slots.iter().zip(&fed) {
            let (mut row, mut real, mut at) = (vec![0u32; width], vec![0u8; width], vec![0i32; width]);
            if let Some(a) = slot {
                for i in 0..n {
                    row[i] = a.tokens[a.cached + i];
                    real[i] = 1;
                    at[i] = (a.cached + i) as i32;
                }
            }
            // A slot whose sequence is all in the cache after this step draws its next token
            // at the uniform of (seed, record, sample, tokens drawn so far).
            let u = match slot {
                Some(a) if a.cached + n == a.tokens.len() => {
                    let prompt = &prompts[a.index];
                    let drawn = a.tokens.len() - a.prompt;
                    uniform([s.seed, prompt.record, u64::from(prompt.sample), drawn as u64])
                }
                _ => 0.0,
            };
            ids.push(row);
            mask.push(real);
            positions.extend(at);
            uniforms.push(u);
        }
        let mut batch = Batch::new(ids, Some(mask))?.with_position_ids(positions)?;
        let (sampling, on_devices) = (decoder.sampling(), decoder.draws_on_devices());
        if on_devices {
            batch = batch.with_uniforms(uniforms.clone())?;
        }
        let step = decoder.step(&batch)?;
        // Where the devices do not draw, the host does at the same uniforms.
        let logits = match sampling.draws() && !on_devices {
            true => Some(step.logits()?),
            false => None,
        };
        for (row, (slot, n)) in slots.iter_mut().zip(fed).enumerate() {
            let Some(a) = slot.as_mut() else { continue };
            a.cached += n;
            if a.cached < a.tokens.len() {
                continue;
            }
            let drawn = a.tokens.len() - a.prompt;
            let token = match &logits {
                Some(logits) => choose(&logits[row], &sampling, uniforms[row]),
                None => step.choices()[row],
            };
            a.tokens.push(token);
            let finish = if s.eos_ids.contains(&token) {
                Some(Finish::Eos)
            } else if s.stop_ids.contains(&token) || stops(&a.tokens[a.prompt..]) {
                Some(Finish::Stop)
            } else if drawn + 1 == s.max_new_tokens || a.tokens.len() > cache_len {
                Some(Finish::Length)
            } else {
                None
            };
            if let Some(finish) = finish {
                let ids = a.tokens[a.prompt..].to_vec();
                done(a.index, Completion { ids, finish })?;
                *slot = None;
            }
        }
    }
    Ok(())
}

/// Whether the free slots take their next prompts now: once half of them are free
/// ([`refill_at`]), or none is busy, or the `pending` prompts left fill them.
fn refills(slots: &[Option<Active>], pending: usize) -> bool {
    let free = slots.iter().filter(|s| s.is_none()).count();
    free == slots.len() || free >= refill_at(slots.len()).min(pending)
}

/// Free slots that take their next prompts together, of `slots`: half of them. A prompt's
/// first step is as wide as a chunk for every slot (the cost of ~`chunk` one-token steps where
/// a step is bound by its products), while a free slot waiting costs a one-token step little
/// (bound by reading the weights): completions of mixed lengths ran 4× faster so on the CPU
/// plugin (docs/BENCHMARKS.md).
fn refill_at(slots: usize) -> usize {
    slots.div_ceil(2)
}

/// A step's width and the tokens each slot feeds: where some slot has prompt tokens left, a
/// step `chunk` wide feeding each such slot up to `chunk` of them while a slot drawing tokens
/// waits; else one token each. A prompt's tokens thus always go through the wide program and
/// drawn ones through the one-token program, so a position's values are the same whatever the
/// other slots hold (with `chunk` 1 there is one program).
fn feeds(slots: &[Option<Active>], chunk: usize) -> (usize, Vec<usize>) {
    let width = match slots.iter().flatten().any(|a| a.cached < a.prompt) {
        true => chunk,
        false => 1,
    };
    let fed = slots
        .iter()
        .map(|slot| match slot {
            Some(a) if width == 1 || a.cached < a.prompt => (a.tokens.len() - a.cached).min(width),
            _ => 0,
        })
        .collect();
    (width, fed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot with a prompt of `prompt` tokens, `drawn` tokens drawn after it, `cached` in
    /// the cache.
    fn active(prompt: usize, drawn: usize, cached: usize) -> Option<Active> {
        Some(Active { index: 0, tokens: vec![1; prompt + drawn], prompt, cached })
    }

    #[test]
    fn a_drawing_slot_waits_out_a_step_that_feeds_a_prompt() {
        // One slot drawing (its last token not yet fed), one with 10 prompt tokens left, one
        // with 3, one free: a step 8 wide; the drawing slot feeds nothing.
        let slots = [active(5, 2, 6), active(12, 0, 2), active(3, 0, 0), None];
        assert_eq!(feeds(&slots, 8), (8, vec![0, 8, 3, 0]));
        // Every prompt fed: one token each.
        let slots = [active(5, 2, 6), active(12, 1, 12), None];
        assert_eq!(feeds(&slots, 8), (1, vec![1, 1, 0]));
        // Chunks of one token: one program for both kinds, every slot fed.
        let slots = [active(5, 2, 6), active(12, 0, 2)];
        assert_eq!(feeds(&slots, 1), (1, vec![1, 1]));
    }

    #[test]
    fn free_slots_are_refilled_together() {
        let busy = || active(3, 1, 3);
        // 1 of 4 free: it waits while prompts remain for 2.
        assert!(!refills(&[busy(), busy(), busy(), None], 5));
        assert!(refills(&[busy(), busy(), None, None], 5));
        // The one prompt left takes the one free slot; a batch with none busy refills at once.
        assert!(refills(&[busy(), busy(), busy(), None], 1));
        assert!(refills(&[None, None, None, None], 1));
        assert_eq!((refill_at(1), refill_at(5), refill_at(32)), (1, 3, 16));
    }
}
