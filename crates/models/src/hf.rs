//! Opening a model: a Hugging Face directory (`config.json`, `model.safetensors` or
//! `model.safetensors.index.json`, `tokenizer.json`, `tokenizer_config.json`) or a GGUF file.
//! Either way the result is the same [`LoadedModel`]: a validated config, weights by HF name
//! and, when the files have one, a tokenizer.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::gguf::{GgufFile, convert};
use crate::hf_config::HfConfig;
use crate::tokenizer::TextTokenizer;
use crate::weights::Weights;

/// A model's config, weights and tokenizer, files mapped but no tensor read yet.
#[derive(Debug)]
pub struct LoadedModel {
    /// Where it was opened from.
    pub path: PathBuf,
    /// Validated configuration.
    pub config: ModelConfig,
    /// Weight tensors by Hugging Face name.
    pub weights: Weights,
    /// The tokenizer, when the directory or file carries one.
    pub tokenizer: Option<TextTokenizer>,
}

impl LoadedModel {
    /// Opens an HF model directory or a `.gguf` file.
    pub fn open(path: &Path) -> Result<LoadedModel, ModelError> {
        let meta = std::fs::metadata(path).map_err(|e| ModelError::io(path, e))?;
        match meta.file_type() {
            t if t.is_dir() => Self::open_hf_dir(path),
            t if t.is_file() => Self::open_gguf(path),
            t => Err(crate::file::not_a(path, &t, "a model directory or a .gguf file")),
        }
    }

    /// Opens an HF model directory.
    pub fn open_hf_dir(dir: &Path) -> Result<LoadedModel, ModelError> {
        let config_path = dir.join("config.json");
        let text = crate::file::read_to_string(&config_path)?;
        let hf = HfConfig::from_json(&text)?;
        let fp8_block = hf.fp8_block_size()?;
        let config = hf.into_config()?;
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let weights = if index.exists() {
            Weights::from_safetensors_index(&index)?
        } else if single.exists() {
            Weights::from_safetensors_file(&single)?
        } else {
            return Err(ModelError::io(
                &single,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "neither model.safetensors nor model.safetensors.index.json exists",
                ),
            ));
        };
        let weights = weights.with_renames(config.arch.family().renames).with_fp8_block(fp8_block);
        let tokenizer = TextTokenizer::from_hf_dir(dir)?;
        Ok(LoadedModel { path: dir.to_path_buf(), config, weights, tokenizer })
    }

    /// Opens a GGUF file (llama or qwen2 architecture).
    pub fn open_gguf(path: &Path) -> Result<LoadedModel, ModelError> {
        let file = GgufFile::open(path)?;
        let config = convert::hf_config(&file)?.into_config()?;
        let tokenizer = match file.get("tokenizer.ggml.model") {
            None => None,
            Some(_) => Some(TextTokenizer::from_gguf(&file)?),
        };
        let n_experts = config.moe.as_ref().map_or(0, |m| m.n_experts);
        let weights = Weights::from_gguf(file, config.attention.n_heads, config.attention.n_kv_heads, n_experts)?;
        Ok(LoadedModel { path: path.to_path_buf(), config, weights, tokenizer })
    }

    /// The weights of the first `n_layers` blocks that can stay in their stored form on the
    /// devices ([`crate::weights::Weights::stored_form`]), by name.
    pub fn stored_forms(&self, n_layers: usize) -> Result<HashMap<String, crate::stored::StoredForm>, ModelError> {
        let mut out = HashMap::new();
        for p in self.config.params(n_layers, false) {
            if let Some(form) = self.weights.stored_form(&p)? {
                out.insert(p.name, form);
            }
        }
        Ok(out)
    }

    /// Checks that every tensor the forward of the first `n_layers` blocks needs is present
    /// with the shape the config implies, so a bad checkpoint fails before any upload.
    pub fn check_weights(&self, n_layers: usize) -> Result<(), ModelError> {
        self.config.params(n_layers, false).iter().try_for_each(|p| self.weights.check(p))
    }
}
