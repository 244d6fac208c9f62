//! Reading sparse dictionaries from the files their libraries write ([`Dictionary::open`],
//! [`decoder`]: which format a directory holds), each format in its own file: SAELens ([`saelens`]: `cfg.json` + `sae_weights.safetensors`), Gemma Scope
//! ([`gemma_scope`]: `params.npz`), EleutherAI sparsify ([`sparsify`]: `<hookpoint>/cfg.json` +
//! `sae.safetensors`), Llama Scope ([`llama_scope`]: lm-saes's `hyperparams.json` +
//! `checkpoints/final.safetensors`). What a format holds that siphon does not compute exactly is
//! refused by name. What several formats read alike is in `read.rs`.

use std::path::Path;

use super::read::{Safetensors, read_json};
use super::{Dictionary, Tensor, gemma_scope, llama_scope, saelens, sparsify};
use crate::error::ModelError;

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
