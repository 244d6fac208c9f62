//! Reading sparse dictionaries from the files their libraries write ([`Dictionary::open`],
//! [`decoder`]: which format a directory holds, [`Format::of`]; what was read as the host
//! tensors a program takes, [`host_tensors`]), each format in its own file:
//! SAELens ([`saelens`]: `cfg.json` + `sae_weights.safetensors`), Gemma Scope
//! ([`gemma_scope`]: `params.npz`), EleutherAI sparsify ([`sparsify`]: `<hookpoint>/cfg.json` +
//! `sae.safetensors`), Llama Scope ([`llama_scope`]: lm-saes's `hyperparams.json` +
//! `checkpoints/final.safetensors`). What a format holds that siphon does not compute exactly is
//! refused by name. A format's `cfg.json` (SAELens's, sparsify's) is read here, where it tells
//! the format; safetensors files through the crate's [`Weights`].

use std::path::Path;

use super::{Dictionary, DictionaryHook, Tensor, gemma_scope, llama_scope, saelens, sparsify};
use crate::error::ModelError;
use crate::weights::{DType, HostTensor, Weights, encode_into};

/// The formats siphon reads, told apart by their files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    SaeLens,
    Sparsify,
    GemmaScope,
    LlamaScope,
}

impl Format {
    /// The format of the dictionary in `dir`, by the files it holds (by their names: one that
    /// is not a regular file is refused, naming it, when it is read).
    fn of(dir: &Path) -> Option<Format> {
        let has = |name: &str| dir.join(name).exists();
        let cfg = has("cfg.json");
        if cfg && has(saelens::WEIGHTS) {
            Some(Format::SaeLens)
        } else if cfg && has(sparsify::WEIGHTS) {
            Some(Format::Sparsify)
        } else if has(gemma_scope::PARAMS) {
            Some(Format::GemmaScope)
        } else if has(llama_scope::HYPERPARAMS) {
            Some(Format::LlamaScope)
        } else {
            None
        }
    }
}

impl Dictionary {
    /// Reads the dictionary in `dir`, whichever format its files say, on `hook` if given
    /// (else on the hook its files or path name; a given hook must match a file's).
    pub fn open(dir: &Path, hook: Option<&str>) -> Result<Dictionary, ModelError> {
        let dict = match Format::of(dir) {
            Some(Format::SaeLens) => saelens::open(dir, &read_json(&dir.join("cfg.json"))?)?,
            Some(Format::Sparsify) => sparsify::open(dir, &read_json(&dir.join("cfg.json"))?, hook)?,
            Some(Format::GemmaScope) => gemma_scope::open(dir, hook)?,
            Some(Format::LlamaScope) => llama_scope::open(dir)?,
            // lm-saes since 2025 (Llamascopium): `config.json` with `sae_type`, a threshold per
            // latent (`log_jumprelu_threshold`), as Llama Scope R1 Distill is published.
            None if read_json(&dir.join("config.json")).is_ok_and(|cfg| cfg.get("sae_type").is_some()) => {
                return Err(ModelError::Config(format!(
                    "{}: lm-saes's later layout (config.json with sae_type, as Llama Scope R1 Distill) is not read yet",
                    dir.display()
                )));
            }
            None => {
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
            }
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
    let w = decoder_tensor(dir, "W_dec")?;
    match w.shape[..] {
        [d_sae, d_out] if d_sae > 0 && d_out > 0 => Ok(w),
        _ => {
            Err(ModelError::Config(format!("dictionary {}: W_dec is {:?}, not [d_sae, d_out]", dir.display(), w.shape)))
        }
    }
}

/// The decoder's `W_dec` and `b_dec` of the dictionary in `dir`, as [`decoder`] reads them
/// (shapes unchecked).
pub(crate) fn decoder_tensors(dir: &Path) -> Result<[Tensor; 2], ModelError> {
    Ok([decoder_tensor(dir, "W_dec")?, decoder_tensor(dir, "b_dec")?])
}

/// Whether the dictionary in `dir` is a skip transcoder (SAELens's weights hold `W_skip`).
pub(crate) fn has_skip(dir: &Path) -> Result<bool, ModelError> {
    match Format::of(dir) {
        Some(Format::SaeLens) => {
            let weights = Weights::from_safetensors_file(&dir.join(saelens::WEIGHTS))?;
            Ok(weights.get_if_stored("W_skip", DType::F32)?.is_some())
        }
        _ => Ok(false),
    }
}

/// The decoder's tensor `name` (`W_dec` or `b_dec`) of the dictionary in `dir`, in f32.
fn decoder_tensor(dir: &Path, name: &'static str) -> Result<Tensor, ModelError> {
    let from = |file: &str| -> Result<Tensor, ModelError> {
        let weights = Weights::from_safetensors_file(&dir.join(file))?;
        let t = weights
            .get_if_stored(name, DType::F32)?
            .ok_or_else(|| ModelError::Config(format!("dictionary {}: {file} lacks {name}", dir.display())))?;
        Ok(Tensor { name, shape: t.shape.clone(), values: t.to_f32_vec() })
    };
    match Format::of(dir) {
        Some(Format::SaeLens) => from(saelens::WEIGHTS),
        Some(Format::Sparsify) => from(sparsify::WEIGHTS),
        Some(Format::GemmaScope) => gemma_scope::read_array(dir, name),
        Some(Format::LlamaScope) | None => Err(ModelError::Config(format!(
            "{}: no decoder siphon reads (SAELens's, sparsify's or Gemma Scope's {name}; Llama Scope's is not read yet)",
            dir.display()
        ))),
    }
}

/// The JSON file at `path`.
fn read_json(path: &Path) -> Result<serde_json::Value, ModelError> {
    let text = crate::file::read_to_string(path)?;
    serde_json::from_str(&text)
        .map_err(|e| ModelError::Corrupt { path: path.to_path_buf(), detail: format!("not JSON: {e}") })
}

/// A value of `dir`'s `cfg.json` (under `name`, for errors) as `read` reads it: absent or null
/// is `None`; another type than `what` is refused naming it, never taken as absent (a format's
/// setting read as its default would change the latents).
pub(crate) fn cfg_value<'v, T>(
    dir: &Path,
    name: &str,
    value: Option<&'v serde_json::Value>,
    what: &str,
    read: impl Fn(&'v serde_json::Value) -> Option<T>,
) -> Result<Option<T>, ModelError> {
    match value.filter(|v| !v.is_null()) {
        None => Ok(None),
        Some(v) => read(v)
            .map(Some)
            .ok_or_else(|| ModelError::Config(format!("{}: {name} {v} is not {what}", dir.join("cfg.json").display()))),
    }
}

/// Every dictionary's tensors as the program takes them (`encoder`'s arguments after its
/// inputs: f32, in [`Dictionary::program_tensors`]' order), each with what it is (for errors).
pub fn host_tensors(dictionaries: &[DictionaryHook]) -> impl Iterator<Item = (String, HostTensor<'static>)> + '_ {
    dictionaries.iter().flat_map(|d| {
        d.dictionary.program_tensors().map(move |t| {
            let mut bytes = vec![0; t.values.len() * DType::F32.size()];
            encode_into(DType::F32, &t.values, &mut bytes);
            let what = format!("dictionary {}'s {}", d.dictionary.name, t.name);
            (what, HostTensor { dtype: DType::F32, shape: t.shape.clone(), data: bytes.into() })
        })
    })
}
