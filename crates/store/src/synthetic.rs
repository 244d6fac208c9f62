//! Deterministic synthetic batches, for the crash tests' writer process and the benchmark.
//!
//! Batch `k` holds samples `k*batch ..`; every value is a function of (sample, token, hook,
//! dimension), so a restarted process regenerates exactly the batches it lost. The first token
//! of each sequence is excluded (like a BOS), and so is the last token of every third sequence
//! (like padding).

use crate::batch::{BatchActivations, DType, HookActivations};
use crate::output::{BatchOutput, OutputColumn, OutputDType};
use crate::sparse::{BatchLatents, LatentsColumn};

/// Shape of the synthetic stream.
#[derive(Debug, Clone)]
pub struct SyntheticSpec {
    /// Hook names.
    pub hooks: Vec<String>,
    /// Per hook, the per-token shape (`[d_model]`, `[n_heads, d_head]`, `[1]`, ...).
    pub shapes: Vec<Vec<usize>>,
    /// Sequences per batch.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Latents columns: each token fires [`SyntheticSpec::firings`] of them.
    pub latents: Vec<LatentsColumn>,
    /// Output columns: f32 values of [`SyntheticSpec::value`] (NaN at each sequence's last
    /// token in `output.nll`, as the model's has no next token there), i32 ids of
    /// [`SyntheticSpec::token_id`].
    pub outputs: Vec<OutputColumn>,
}

impl SyntheticSpec {
    /// `n` hooks named `blocks.{i}.hook_resid_post`, each of per-token shape `[d_model]`.
    pub fn new(n_hooks: usize, batch: usize, seq: usize, d_model: usize) -> Self {
        SyntheticSpec {
            hooks: (0..n_hooks).map(|i| format!("blocks.{i}.hook_resid_post")).collect(),
            shapes: vec![vec![d_model]; n_hooks],
            batch,
            seq,
            latents: Vec::new(),
            outputs: Vec::new(),
        }
    }

    /// Hooks of any per-token shapes: `(name, shape)` pairs.
    pub fn with_hooks(hooks: &[(&str, &[usize])], batch: usize, seq: usize) -> Self {
        SyntheticSpec {
            hooks: hooks.iter().map(|(name, _)| name.to_string()).collect(),
            shapes: hooks.iter().map(|(_, shape)| shape.to_vec()).collect(),
            batch,
            seq,
            latents: Vec::new(),
            outputs: Vec::new(),
        }
    }

    /// Adds a latents column `name` of `width` latents, `cap` kept per token.
    pub fn with_latents(mut self, name: &str, width: usize, cap: usize) -> Self {
        let hook = name.split(".hook_sae_acts_post").next().unwrap_or(name).to_string();
        let dictionary = serde_json::json!({ "synthetic": true });
        self.latents.push(LatentsColumn { name: name.into(), hook, width, cap, dictionary });
        self
    }

    /// Adds the next-token outputs `output.nll`, `output.entropy`, `output.topk_logprobs [k]`
    /// and `output.topk_ids [k]`.
    pub fn with_next_token(mut self, k: usize) -> Self {
        let column = |name: &str, dtype, shape: Vec<usize>| OutputColumn { name: name.into(), dtype, shape };
        self.outputs.extend([
            column("output.nll", OutputDType::F32, vec![]),
            column("output.entropy", OutputDType::F32, vec![]),
            column("output.topk_logprobs", OutputDType::F32, vec![k]),
            column("output.topk_ids", OutputDType::I32, vec![k]),
        ]);
        self
    }

    /// Elements per token of hook `hook` (the product of its shape).
    pub fn width(&self, hook: usize) -> usize {
        self.shapes[hook].iter().product()
    }

    /// The activation value of `(sample, token, hook, dim)`, `dim` indexing the token's
    /// activation flattened row-major; exactly representable in bf16.
    pub fn value(sample: u64, token: usize, hook: usize, dim: usize) -> f32 {
        let h = mix(sample.wrapping_mul(0x100_0000) ^ ((token as u64) << 24) ^ ((hook as u64) << 20) ^ dim as u64);
        // 8 significant bits: survives the f32 -> bf16 conversion unchanged.
        ((h % 255) as f32 - 127.0) / 16.0
    }

    /// The latents `(sample, token)` fires in column `column`, in the devices' order (largest
    /// value first): between none and the cap, distinct, each value exactly representable in
    /// bf16 and positive.
    pub fn firings(&self, sample: u64, token: usize, column: usize) -> Vec<(i32, f32)> {
        let LatentsColumn { width, cap, .. } = self.latents[column];
        let h = mix(sample << 20 ^ (token as u64) << 4 ^ column as u64);
        let n = (h % (cap as u64 + 1)) as usize;
        let start = (h >> 16) as usize % width;
        let mut fired: Vec<(i32, f32)> = (0..n)
            .map(|j| (((start + 3 * j) % width) as i32, 1.0 + ((mix(h ^ j as u64) % 255) as f32) / 16.0))
            .collect();
        // Distinct: 3j mod width takes n ≤ width distinct values unless 3 divides the width; then
        // consecutive latents instead.
        if width.is_multiple_of(3) {
            fired.iter_mut().enumerate().for_each(|(j, f)| f.0 = ((start + j) % width) as i32);
        }
        fired.sort_by(|a, b| b.1.total_cmp(&a.1));
        fired
    }

    /// Token id of `(sample, token)`.
    pub fn token_id(sample: u64, token: usize) -> i32 {
        (mix(sample << 16 ^ token as u64) % 50_000) as i32
    }

    /// Whether `(sample, token)` is included.
    pub fn keep(&self, sample: u64, token: usize) -> bool {
        token != 0 && !(sample % 3 == 2 && token == self.seq - 1)
    }

    /// Batch number `k`.
    pub fn batch(&self, k: u64) -> BatchActivations {
        let first_sample = k * self.batch as u64;
        let tokens = self.batch * self.seq;
        let mut token_ids = Vec::with_capacity(tokens);
        let mut doc_index = Vec::with_capacity(tokens);
        let mut position = Vec::with_capacity(tokens);
        let mut keep = Vec::with_capacity(tokens);
        for b in 0..self.batch {
            let sample = first_sample + b as u64;
            for t in 0..self.seq {
                token_ids.push(Self::token_id(sample, t));
                // Two documents packed per sequence.
                doc_index.push((sample * 2 + (2 * t / self.seq) as u64) as i64);
                position.push((t % self.seq.div_ceil(2)) as i32);
                keep.push(self.keep(sample, t));
            }
        }
        let hooks = self
            .hooks
            .iter()
            .enumerate()
            .map(|(h, name)| {
                let width = self.width(h);
                let mut data = Vec::with_capacity(tokens * width * 4);
                for b in 0..self.batch {
                    for t in 0..self.seq {
                        for d in 0..width {
                            data.extend_from_slice(&Self::value(first_sample + b as u64, t, h, d).to_le_bytes());
                        }
                    }
                }
                HookActivations {
                    hook: name.clone(),
                    dtype: DType::F32,
                    shape: self.shapes[h].clone(),
                    data: data.into(),
                }
            })
            .collect();
        let latents = (0..self.latents.len()).map(|c| self.batch_latents(first_sample, c)).collect();
        let outputs = self.outputs.iter().enumerate().map(|(o, c)| self.batch_output(first_sample, o, c)).collect();
        BatchActivations {
            latents,
            outputs,
            roles: None,
            pooled: None,
            documents: Vec::new(),
            first_sample,
            batch: self.batch,
            seq: self.seq,
            hooks,
            token_ids,
            doc_index,
            position,
            keep,
            data_position_after: serde_json::json!({ "batch": k + 1 }),
        }
    }
}

impl SyntheticSpec {
    /// Output `column` (the `o`th) of the batch starting at `first_sample`.
    fn batch_output(&self, first_sample: u64, o: usize, column: &OutputColumn) -> BatchOutput {
        let mut data = Vec::with_capacity(self.batch * self.seq * column.row_bytes());
        for b in 0..self.batch {
            let sample = first_sample + b as u64;
            for t in 0..self.seq {
                for d in 0..column.width() {
                    let word = match column.dtype {
                        OutputDType::I32 => Self::token_id(sample, t + 1 + d).to_le_bytes(),
                        OutputDType::F32 if column.name == "output.nll" && t + 1 == self.seq => f32::NAN.to_le_bytes(),
                        OutputDType::F32 => Self::value(sample, t, 1000 + o, d).to_le_bytes(),
                    };
                    data.extend_from_slice(&word);
                }
            }
        }
        BatchOutput { name: column.name.clone(), data: data.into() }
    }

    /// Column `column`'s latents of the batch starting at `first_sample`, as the devices
    /// return them.
    fn batch_latents(&self, first_sample: u64, column: usize) -> BatchLatents {
        let cap = self.latents[column].cap;
        let (mut indices, mut values, mut firings) = (Vec::new(), Vec::new(), Vec::new());
        for b in 0..self.batch {
            for t in 0..self.seq {
                let fired = self.firings(first_sample + b as u64, t, column);
                firings.extend_from_slice(&(fired.len() as i32).to_le_bytes());
                for slot in 0..cap {
                    let (index, value) = fired.get(slot).copied().unwrap_or((-1, 0.0));
                    indices.extend_from_slice(&index.to_le_bytes());
                    values.extend_from_slice(&value.to_le_bytes());
                }
            }
        }
        BatchLatents {
            name: self.latents[column].name.clone(),
            cap,
            indices: indices.into(),
            values: values.into(),
            firings: firings.into(),
        }
    }
}

fn mix(mut x: u64) -> u64 {
    // splitmix64 finalizer.
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}
