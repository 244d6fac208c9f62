//! Reading sparse dictionaries from the files their libraries write, each format in its own
//! file: SAELens ([`saelens`]: `cfg.json` + `sae_weights.safetensors`), Gemma Scope
//! ([`gemma_scope`]: `params.npz`), EleutherAI sparsify ([`sparsify`]: `<hookpoint>/cfg.json` +
//! `sae.safetensors`), Llama Scope ([`llama_scope`]: lm-saes's `hyperparams.json` +
//! `checkpoints/final.safetensors`). What a format holds that siphon does not compute exactly is
//! refused by name.

use std::path::Path;

use super::{Dictionary, Tensor, gemma_scope, llama_scope, saelens, sparsify};
use crate::error::ModelError;
use crate::weights::{DType, decode_into};

/// `dir/cfg.json` as JSON (SAELens's and sparsify's dictionaries both keep one).
pub(crate) fn read_cfg(dir: &Path) -> Result<serde_json::Value, ModelError> {
    read_json(&dir.join("cfg.json"))
}

/// The JSON file at `path`.
fn read_json(path: &Path) -> Result<serde_json::Value, ModelError> {
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

impl Dictionary {
    /// Reads the dictionary in `dir`, whichever format its files say, on `hook` if given
    /// (else on the hook its files or path name; a given hook must match a file's).
    pub fn open(dir: &Path, hook: Option<&str>) -> Result<Dictionary, ModelError> {
        let dict = if dir.join("cfg.json").is_file() && dir.join(saelens::WEIGHTS).is_file() {
            saelens::open(dir)?
        } else if dir.join("cfg.json").is_file() && dir.join(sparsify::WEIGHTS).is_file() {
            sparsify::open(dir, hook)?
        } else if dir.join(gemma_scope::PARAMS).is_file() {
            gemma_scope::open(dir, hook)?
        } else if dir.join(llama_scope::HYPERPARAMS).is_file() {
            llama_scope::open(dir)?
        } else if read_json(&dir.join("config.json")).is_ok_and(|cfg| cfg.get("sae_type").is_some()) {
            // lm-saes since 2025 (Llamascopium): `config.json` with `sae_type`, a threshold per
            // latent (`log_jumprelu_threshold`), as Llama Scope R1 Distill is published.
            return Err(ModelError::Config(format!(
                "{}: lm-saes's later layout (config.json with sae_type, as Llama Scope R1 Distill) is not read yet",
                dir.display()
            )));
        } else {
            return Err(ModelError::Config(format!(
                "{}: not a dictionary siphon reads (SAELens: cfg.json and {}; sparsify: cfg.json and {}; \
                 Gemma Scope: {}; Llama Scope: {} and {})",
                dir.display(),
                saelens::WEIGHTS,
                sparsify::WEIGHTS,
                gemma_scope::PARAMS,
                llama_scope::HYPERPARAMS,
                llama_scope::WEIGHTS
            )));
        };
        dict.check()?;
        if let Some(hook) = hook.filter(|h| *h != dict.hook) {
            return Err(ModelError::Config(format!(
                "dictionary {} was trained on {}, not {hook}",
                dir.display(),
                dict.hook
            )));
        }
        Ok(dict)
    }
}

/// The decoder of the dictionary in `dir`, `W_dec` `[d_sae, d_out]` in f32: each latent's
/// direction in the hook it writes (the hook it reads for an SAE, its output hook for a
/// transcoder), from the files [`Dictionary::open`] reads — SAELens's and sparsify's `W_dec`,
/// Gemma Scope's. Llama Scope's decoder, stored rescaled by its dataset-wise norms, is refused
/// by name (not read yet).
pub fn decoder(dir: &Path) -> Result<Tensor, ModelError> {
    let from = |file: &str| -> Result<Tensor, ModelError> {
        let path = dir.join(file);
        Safetensors::read(&path)?
            .tensor("W_dec")?
            .ok_or_else(|| ModelError::Config(format!("dictionary {}: {file} lacks W_dec", dir.display())))
    };
    let w = if dir.join("cfg.json").is_file() && dir.join(saelens::WEIGHTS).is_file() {
        from(saelens::WEIGHTS)?
    } else if dir.join("cfg.json").is_file() && dir.join(sparsify::WEIGHTS).is_file() {
        from(sparsify::WEIGHTS)?
    } else if dir.join(gemma_scope::PARAMS).is_file() {
        gemma_scope::read_array(dir, "W_dec")?
    } else {
        return Err(ModelError::Config(format!(
            "{}: no decoder siphon reads (SAELens's, sparsify's or Gemma Scope's W_dec; Llama Scope's is not read yet)",
            dir.display()
        )));
    };
    match w.shape[..] {
        [d_sae, d_out] if d_sae > 0 && d_out > 0 => Ok(w),
        _ => {
            Err(ModelError::Config(format!("dictionary {}: W_dec is {:?}, not [d_sae, d_out]", dir.display(), w.shape)))
        }
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
