//! Reading sparse dictionaries from the files their libraries write, each format in its own
//! file: SAELens ([`saelens`]: `cfg.json` + `sae_weights.safetensors`), Gemma Scope
//! ([`gemma_scope`]: `params.npz`), EleutherAI sparsify ([`sparsify`]: `<hookpoint>/cfg.json` +
//! `sae.safetensors`). What a format holds that siphon does not compute exactly is refused by
//! name.

pub mod gemma_scope;
pub mod saelens;
pub mod sparsify;

use std::path::Path;

use crate::ModelError;
use crate::dictionary::Dictionary;

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
        } else {
            return Err(ModelError::Config(format!(
                "{}: not a dictionary siphon reads (SAELens: cfg.json and {}; sparsify: cfg.json and {}; \
                 Gemma Scope: {})",
                dir.display(),
                saelens::WEIGHTS,
                sparsify::WEIGHTS,
                gemma_scope::PARAMS
            )));
        };
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
