//! Rotary position embeddings: the cos/sin tables of the inverse frequencies the config's
//! RoPE gives (`Rope::frequencies`, its scaling applied), built once per base and width, and
//! rotate-half applied per head.

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
        // Hugging Face switches to LongRoPE's long factors once a batch reaches past the
        // original context, whatever its rows' lengths: refuse rather than guess.
        if let (None, Some(RopeScaling::LongRope { original_max_position_embeddings: original, .. })) =
            (local, &c.rope.scaling)
            && self.spec.decode.map_or(self.spec.seq, |d| d.cache_len) > *original
        {
            return Err(ModelError::UnsupportedArch(format!(
                "longrope scaling with sequences of {} tokens, longer than original_max_position_embeddings {original} \
                 (Hugging Face then switches to long_factor depending on the batch; siphon reads up to {original})",
                self.spec.decode.map_or(self.spec.seq, |d| d.cache_len)
            )));
        }
        let (inv_freq, scale) = c.rope.frequencies(head_dim, windowed);
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
