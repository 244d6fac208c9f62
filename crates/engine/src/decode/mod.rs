//! Decoding: a model's own completions on the mesh, a room of its own in three parts, as
//! vLLM v1 splits them — the runner ([`Decoder`]: a decoding step's program on the engine's
//! weights, its caches kept on the devices between steps), the sampler (`sampler.rs`: each
//! row's uniform from a counter-based generator keyed by (seed, record, sample, step), drawn
//! at on the devices, `siphon_models::sample`, or on the CPU plugin by the host's f64
//! warpers: [`Decoder::draws_on_devices`]) and the scheduler (`schedule.rs`: which sequence
//! each slot holds, its prompt fed in chunks, slots refilled as sequences finish).
//!
//! The program is the family's own forward built as a decoding step
//! (`siphon_models::decode`): the same blocks, each attention block reading and writing its
//! key/value cache, ending with each row's next-token logits and its next token — greedy, or
//! drawn after the warpers at the row's uniform — so a step's logits stay on the devices but
//! where the host draws.

mod sampler;
mod schedule;

pub use sampler::{choose, probabilities, uniform};
pub use schedule::{Completion, Finish, Prompt, Settings, generate, generate_each};
pub use siphon_models::Sampling;

use siphon_models::{DecodeInfo, DecodeStep};
use siphon_runtime::{ElementType, HostArray, ShardedArray};

use crate::batch::Batch;
use crate::engine::Engine;
use crate::error::{EngineError, rt};

/// A decoding step's runner over an [`Engine`] built with `EngineOptions::decode`: `slots`
/// rows, each with its caches on the devices.
pub struct Decoder<'e> {
    engine: &'e Engine,
    slots: usize,
    cache: DecodeStep,
    /// Each cache argument, as the last step left it (zeros before the first).
    caches: Vec<ShardedArray>,
}

impl Engine {
    /// A runner of this decoding engine's steps over `slots` rows, its programs compiled and
    /// its caches zeroed on the devices. Refused on an engine built for the forward, and (for
    /// now) on a mesh spanning processes.
    pub fn decoder(&self, slots: usize) -> Result<Decoder<'_>, EngineError> {
        let Some(cache) = self.options.decode else {
            return Err(EngineError::Options("a decoder needs an engine built with EngineOptions::decode".into()));
        };
        if !self.options.processes.is_empty() {
            return Err(EngineError::Options("decoding on a mesh spanning processes is not built yet".into()));
        }
        // Both programs a run steps with, compiled before its first step: a token a row, and
        // a prompt's chunk (`schedule.rs`).
        let wide = cache.chunk.min(cache.cache_len);
        if wide > 1 {
            self.compiled_for(slots, wide, None)?;
        }
        let compiled = self.compiled_for(slots, 1, None)?;
        let info = decode_info(&compiled.program.decode)?;
        let mut caches = Vec::with_capacity(info.caches.len());
        for cache in &info.caches {
            let element = match cache.dtype {
                siphon_hlo::DType::F32 => ElementType::F32,
                siphon_hlo::DType::BF16 => ElementType::BF16,
                other => return Err(EngineError::Options(format!("a cache of {other:?} ({})", cache.name))),
            };
            let zeros = HostArray::zeros(element, &cache.shape);
            let context = || format!("uploading the cache {}", cache.name);
            caches.push(rt(context, self.client.upload_sharded(&zeros, &cache.spec, &self.options.mesh))?);
        }
        Ok(Decoder { engine: self, slots, cache, caches })
    }
}

fn decode_info(info: &Option<DecodeInfo>) -> Result<&DecodeInfo, EngineError> {
    info.as_ref().ok_or_else(|| EngineError::Options("the engine's program is not a decoding step".into()))
}

impl Decoder<'_> {
    /// The rows this decoder steps.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The positions a slot's sequence holds and the new tokens a step takes at most.
    pub fn cache(&self) -> DecodeStep {
        self.cache
    }

    /// How its steps choose each row's next token (`EngineOptions::sampling`).
    pub fn sampling(&self) -> Sampling {
        self.engine.options.sampling
    }

    /// Whether its steps draw sampled tokens themselves, at the uniforms a batch gives
    /// (`Batch::with_uniforms`); else a step chooses greedily and the host draws from its
    /// logits ([`choose`]).
    pub fn draws_on_devices(&self) -> bool {
        self.engine.options.sampling.draws() && self.engine.program().draws_on_devices()
    }

    /// Runs one step: `batch` holds `slots` rows of at most `chunk` new tokens (real tokens
    /// first, each at its position: `Batch::with_position_ids`; a row with none changes
    /// nothing; with each row's uniform where the engine's sampling draws:
    /// `Batch::with_uniforms`), written into the caches; returns each row's next token, its
    /// logits left on the devices until asked for ([`Step::logits`]). A row whose logits
    /// leave no token to draw (none finite) is an error naming it.
    pub fn step(&mut self, batch: &Batch) -> Result<Step, EngineError> {
        if batch.batch() != self.slots {
            return Err(EngineError::Batch(format!("{} rows for a decoder of {} slots", batch.batch(), self.slots)));
        }
        let engine = self.engine;
        let (compiled, inputs, _) = engine.inputs(std::slice::from_ref(batch))?;
        let info = decode_info(&compiled.program.decode)?;
        let args: Vec<&ShardedArray> = engine
            .weights
            .iter()
            .chain(&inputs)
            .chain(&engine.dictionary_args)
            .chain(&engine.steering_args)
            .chain(&self.caches)
            .collect();
        let specs: Vec<_> =
            [&info.logits, &info.choice].into_iter().chain(&info.caches).map(|o| o.spec.clone()).collect();
        let mesh = &engine.options.mesh;
        let mut out =
            rt(|| "running the decoding step".into(), compiled.executable.execute_sharded(mesh, &args, &specs))?;
        self.caches = out.split_off(2);
        let choices = out.pop().expect("the choices");
        let logits = out.pop().expect("the logits");
        let choices = rt(|| "copying the choices to the host".into(), choices.to_host())?;
        let choices: Vec<i32> = rt(|| "reading the choices".into(), choices.to_vec())?;
        if let Some(row) = choices.iter().position(|&c| c < 0) {
            return Err(EngineError::Batch(format!("row {row}: no token to draw (none of its logits is finite)")));
        }
        let choices = choices.into_iter().map(|i| i as u32).collect();
        Ok(Step { choices, logits, vocab: info.logits.shape[1] })
    }
}

/// What one decoding step gives: each row's next token, and its logits on the devices.
pub struct Step {
    choices: Vec<u32>,
    logits: ShardedArray,
    vocab: usize,
}

impl Step {
    /// Each row's next token: its first largest logit, or drawn at its uniform
    /// (`EngineOptions::sampling`).
    pub fn choices(&self) -> &[u32] {
        &self.choices
    }

    /// Each row's logits at its last real token, `[slots][vocab]`, copied from the devices.
    pub fn logits(&self) -> Result<Vec<Vec<f32>>, EngineError> {
        let logits = rt(|| "copying the logits to the host".into(), self.logits.to_host())?;
        let logits: Vec<f32> = rt(|| "reading the logits".into(), logits.to_vec())?;
        Ok(logits.chunks(self.vocab).map(<[f32]>::to_vec).collect())
    }
}
