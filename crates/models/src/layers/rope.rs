//! Rotary position embeddings: the inverse frequencies as Hugging Face computes them (with
//! Llama 3, linear, YaRN-style scaling where the config says), the cos/sin tables built once
//! per base and width, and rotate-half applied per head.

use siphon_hlo::{DType, TensorType, Value};

use crate::config::RopeScaling;
use crate::error::ModelError;
use crate::forward::Graph;

impl Graph<'_> {
    /// The RoPE tables of block `layer`: the model's, or the local ones (`local_rope_theta`,
    /// no scaling) on a sliding-window layer of a family that has them (Gemma 3). Built once
    /// per kind and shared by the blocks that use it.
    pub fn layer_rope(&mut self, layer: usize) -> Result<(Value, Value), ModelError> {
        let c = self.config;
        let windowed = c.window(layer).is_some();
        let local = c.rope.local_theta.filter(|_| windowed);
        let head_dim = c.head_dim_at(layer);
        if let Some(&(_, _, tables)) = self.ropes.iter().find(|(l, d, _)| *l == local && *d == head_dim) {
            return Ok(tables);
        }
        let rotated = c.rope.rotary_dim.unwrap_or(head_dim);
        let (inv_freq, scale) = match (local, &c.rope.scaling) {
            (Some(theta), _) => (inv_freq(head_dim, theta, None), 1.0),
            (
                None,
                Some(RopeScaling::LongRope { original_max_position_embeddings: original, attention_factor, .. }),
            ) => {
                // Hugging Face switches to the long factors once a batch reaches past the
                // original context, whatever its rows' lengths: refuse rather than guess.
                if self.spec.seq > *original {
                    return Err(ModelError::UnsupportedArch(format!(
                        "longrope scaling with sequences of {} tokens, longer than original_max_position_embeddings {original} \
                         (Hugging Face then switches to long_factor depending on the batch; siphon reads up to {original})",
                        self.spec.seq
                    )));
                }
                (inv_freq(rotated, c.rope.theta, c.rope.scaling.as_ref()), *attention_factor)
            }
            (None, Some(RopeScaling::Yarn { attention_factor, .. })) => {
                (inv_freq(rotated, c.rope.theta, c.rope.scaling.as_ref()), *attention_factor)
            }
            (None, _) => (inv_freq(rotated, c.rope.theta, c.rope.scaling.as_ref()), 1.0),
        };
        let tables = self.rope_tables(&inv_freq, scale)?;
        self.ropes.push((local, head_dim, tables));
        Ok(tables)
    }

    /// RoPE tables `(cos, sin)`, each `[tokens, rotary width]` in the compute dtype, from the
    /// position ids: `emb = concat(freqs, freqs)`, `freqs = pos * inv_freq`, computed in f32,
    /// cos and sin multiplied by `scale` (LongRoPE's attention factor) when it is not 1.
    fn rope_tables(&mut self, inv_freq: &[f32], scale: f64) -> Result<(Value, Value), ModelError> {
        let half = inv_freq.len();
        let t = self.tokens();
        let b = &mut self.b;
        let inv = b.constant_f32(inv_freq, &[half])?;
        let pos = b.reshape(self.position_ids, &[t])?;
        let pos = b.convert(pos, DType::F32)?;
        let pos = b.broadcast_in_dim(pos, &[t, half], &[0])?;
        let inv = b.broadcast_in_dim(inv, &[t, half], &[1])?;
        let freqs = b.mul(pos, inv)?;
        let emb = b.concatenate(&[freqs, freqs], 1)?;
        let mut cos = b.cos(emb)?;
        let mut sin = b.sin(emb)?;
        if scale != 1.0 {
            let s = b.splat(scale, TensorType::new(DType::F32, &[t, 2 * half]))?;
            cos = b.mul(cos, s)?;
            sin = b.mul(sin, s)?;
        }
        Ok((b.convert(cos, self.dt)?, b.convert(sin, self.dt)?))
    }

    /// Rotates `x` `[tokens, heads, head_dim]` with Hugging Face's rotate-half RoPE:
    /// `x·cos + rotate_half(x)·sin`, `rotate_half(x) = concat(-x₂, x₁)`, over the first
    /// `rotary_dim` dimensions of each head (all of them by default); the rest pass through.
    pub fn apply_rope(&mut self, x: Value, cos: Value, sin: Value) -> Result<Value, ModelError> {
        let dims = self.b.dims(x)?.to_vec();
        if let Some(r) = self.config.rope.rotary_dim.filter(|&r| r < dims[2]) {
            let rot = self.b.slice_dim(x, 2, 0, r)?;
            let pass = self.b.slice_dim(x, 2, r, dims[2])?;
            let rot = self.apply_rope(rot, cos, sin)?;
            return Ok(self.b.concatenate(&[rot, pass], 2)?);
        }
        let d = dims[2];
        let b = &mut self.b;
        let x1 = b.slice_dim(x, 2, 0, d / 2)?;
        let x2 = b.slice_dim(x, 2, d / 2, d)?;
        let nx2 = b.neg(x2)?;
        let rot = b.concatenate(&[nx2, x1], 2)?;
        let cos = b.broadcast_in_dim(cos, &dims, &[0, 2])?;
        let sin = b.broadcast_in_dim(sin, &dims, &[0, 2])?;
        let a = b.mul(x, cos)?;
        let r = b.mul(rot, sin)?;
        Ok(b.add(a, r)?)
    }
}

/// RoPE inverse frequencies as Hugging Face computes them (f32), for the rotated width
/// (`rotary_dim`, else `head_dim`), with the config's scaling applied.
#[cfg(test)]
pub(crate) fn rope_inv_freq(config: &crate::config::ModelConfig) -> Vec<f32> {
    inv_freq(
        config.rope.rotary_dim.unwrap_or(config.attention.head_dim),
        config.rope.theta,
        config.rope.scaling.as_ref(),
    )
}

/// Inverse frequencies of a `d`-wide head for base `theta` with `scaling`.
fn inv_freq(d: usize, theta: f64, scaling: Option<&RopeScaling>) -> Vec<f32> {
    let base = theta as f32;
    let inv: Vec<f32> = (0..d).step_by(2).map(|i| 1.0 / base.powf(i as f32 / d as f32)).collect();
    match scaling {
        None => inv,
        Some(RopeScaling::Linear { factor }) => inv.iter().map(|f| f / *factor as f32).collect(),
        // Hugging Face's _compute_proportional_rope_parameters: int(fraction * d // 2) rotated
        // frequencies, zeros for the rest, all divided by the factor.
        Some(RopeScaling::Proportional { fraction, factor }) => {
            let rotated = (fraction * d as f64 / 2.0).floor() as usize;
            inv.iter().enumerate().map(|(i, f)| if i < rotated { f / *factor as f32 } else { 0.0 }).collect()
        }
        // 1 / (factor * base^(i/d)), in f32 as Hugging Face computes it.
        Some(RopeScaling::LongRope { short_factor, .. }) => (0..d)
            .step_by(2)
            .zip(short_factor)
            .map(|(i, &f)| 1.0 / (f as f32 * base.powf(i as f32 / d as f32)))
            .collect(),
        // Hugging Face's _compute_yarn_parameters, its tensor arithmetic in f32.
        Some(RopeScaling::Yarn {
            factor, beta_fast, beta_slow, original_max_position_embeddings, truncate, ..
        }) => {
            let dim = d as f64;
            let correction = |rotations: f64| {
                let max = *original_max_position_embeddings as f64;
                dim * (max / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln())
            };
            let (mut low, mut high) = (correction(*beta_fast), correction(*beta_slow));
            if *truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
            if low == high {
                high += 0.001;
            }
            (0..d)
                .step_by(2)
                .enumerate()
                .map(|(j, i)| {
                    let pos = base.powf(i as f32 / d as f32);
                    let (extrapolated, interpolated) = (1.0 / pos, 1.0 / (*factor as f32 * pos));
                    let ramp = ((j as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
                    let keep = 1.0 - ramp;
                    interpolated * (1.0 - keep) + extrapolated * keep
                })
                .collect()
        }
        Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => {
            let (factor, low, high) = (*factor, *low_freq_factor, *high_freq_factor);
            let old = *original_max_position_embeddings as f64;
            let low_wavelen = old / low;
            let high_wavelen = old / high;
            inv.iter()
                .map(|&f| {
                    let f = f as f64;
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    let scaled = if wavelen > low_wavelen { f / factor } else { f };
                    // HF's `~(wavelen < high) * ~(wavelen > low)`; wavelengths are finite, so >= is the same.
                    let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                    if medium {
                        let smooth = (old / wavelen - low) / (high - low);
                        ((1.0 - smooth) * scaled / factor + smooth * scaled) as f32
                    } else {
                        scaled as f32
                    }
                })
                .collect()
        }
    }
}
