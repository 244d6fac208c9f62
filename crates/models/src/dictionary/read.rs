//! What several dictionary formats read alike: a JSON file, a safetensors file's tensors as
//! f32, a torch `Linear` encoder's weight as the `W_enc` the encoder reads.

use std::path::Path;

use super::Tensor;
use crate::error::ModelError;
use crate::weights::{DType, decode_into};

/// `dir/cfg.json` as JSON (SAELens's and sparsify's dictionaries both keep one).
pub(crate) fn read_cfg(dir: &Path) -> Result<serde_json::Value, ModelError> {
    read_json(&dir.join("cfg.json"))
}

/// The JSON file at `path`.
pub(crate) fn read_json(path: &Path) -> Result<serde_json::Value, ModelError> {
    let path = path.to_path_buf();
    let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io { path: path.clone(), source })?;
    serde_json::from_str(&text).map_err(|e| ModelError::Corrupt { path, detail: format!("not JSON: {e}") })
}

/// A safetensors file's bytes, read whole (dictionaries' files are small next to a model's).
pub(crate) struct Safetensors {
    path: std::path::PathBuf,
    bytes: Vec<u8>,
}

impl Safetensors {
    pub(crate) fn read(path: &Path) -> Result<Safetensors, ModelError> {
        let bytes = std::fs::read(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        Ok(Safetensors { path: path.to_path_buf(), bytes })
    }

    /// The tensor `name` as f32 (from f32, bf16 or f16); `Ok(None)` where the file has no such
    /// tensor.
    pub(crate) fn tensor(&self, name: &'static str) -> Result<Option<Tensor>, ModelError> {
        let corrupt = |detail: String| ModelError::Corrupt { path: self.path.clone(), detail };
        let file = safetensors::SafeTensors::deserialize(&self.bytes).map_err(|e| corrupt(e.to_string()))?;
        let Ok(t) = file.tensor(name) else { return Ok(None) };
        let dtype = match t.dtype() {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::BF16 => DType::Bf16,
            safetensors::Dtype::F16 => DType::F16,
            other => return Err(corrupt(format!("{name} is {other:?}, not a float siphon reads"))),
        };
        let mut values = vec![0.0; t.shape().iter().product()];
        decode_into(dtype, t.data(), &mut values);
        Ok(Some(Tensor { name, shape: t.shape().to_vec(), values }))
    }
}

/// The latents of a torch `Linear` encoder's `encoder.weight` `[d_sae, d_in]` (sparsify's and
/// lm-saes's layout); `Err` names a shape that is not `[d_sae, d_in]` (`d_in` as the format
/// calls it: `input`).
pub(crate) fn encoder_latents(weight: &Tensor, d_in: usize, input: &str) -> Result<usize, String> {
    let shape = &weight.shape;
    match shape[..] {
        [0, _] | [_, 0] => Err(format!("encoder.weight is {shape:?}: an empty encoder")),
        [d_sae, width] if width == d_in => Ok(d_sae),
        [_, _] => Err(format!("encoder.weight is {shape:?}, {input} is {d_in}")),
        _ => Err(format!("encoder.weight is {shape:?}, not [d_sae, {input}]")),
    }
}

/// `encoder.weight` `[d_sae, d_in]` ([`encoder_latents`] checked it) as the `W_enc`
/// `[d_in, d_sae]` the encoder reads, each latent's row times `scale(latent)` (1 leaves it
/// exact).
pub(crate) fn transposed_encoder(weight: &Tensor, d_sae: usize, scale: impl Fn(usize) -> f64) -> Vec<f32> {
    let d_in = weight.values.len() / d_sae;
    let mut w_enc = vec![0.0; d_in * d_sae];
    for (latent, row) in weight.values.chunks_exact(d_in).enumerate() {
        let factor = scale(latent);
        for (i, &v) in row.iter().enumerate() {
            w_enc[i * d_sae + latent] = (f64::from(v) * factor) as f32;
        }
    }
    w_enc
}
