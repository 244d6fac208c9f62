//! Gemma Scope's dictionaries: `params.npz` (numpy's archive) with `W_enc` `[d_model, d_sae]`,
//! `b_enc`, `threshold` `[d_sae]`, `W_dec`, `b_dec`; JumpReLU, `b_dec` never subtracted from the
//! input (SAELens's `gemma_2` loader and delphi's `JumpReluSae` read it so).
//!
//! The file does not name its hook: the Hub's layout does
//! (`google/gemma-scope-2b-pt-res/layer_20/width_16k/average_l0_71`), read as SAELens reads it
//! — `res` → `blocks.{layer}.hook_resid_post`, `mlp` → `blocks.{layer}.hook_mlp_out` — from the
//! directory's path, unless the caller names the hook. Per-head (`att`: `hook_z`) and embedding
//! dictionaries are refused by name.

use std::path::Path;

use npyz::npz::{array_name_from_file_name, file_name_from_array_name};
use zip::result::ZipError;

use crate::dictionary::{Dictionary, Encoder, Tensor};
use crate::error::ModelError;

/// The archive's name.
pub const PARAMS: &str = "params.npz";

/// The array `name` of the `params.npz` in `dir`, as f32 (older archives spell the weights
/// `w_enc`; SAELens maps `w_` to `W_`).
pub(crate) fn read_array(dir: &Path, name: &'static str) -> Result<Tensor, ModelError> {
    let path = dir.join(PARAMS);
    let corrupt = |detail: String| ModelError::Corrupt { path: path.clone(), detail };
    let mut archive = zip::ZipArchive::new(crate::file::open(&path)?).map_err(|e| corrupt(e.to_string()))?;
    let lower = name.replacen('W', "w", 1);
    let spelled_lower =
        name.starts_with("W_") && archive.file_names().any(|f| array_name_from_file_name(f) == Some(&lower));
    let stored = if spelled_lower { lower } else { name.to_string() };
    let entry = match archive.by_name(&file_name_from_array_name(&stored)) {
        Ok(entry) => entry,
        Err(ZipError::FileNotFound) => {
            return Err(ModelError::Config(format!("Gemma Scope dictionary {}: {PARAMS} lacks {name}", dir.display())));
        }
        Err(e) => return Err(corrupt(e.to_string())),
    };
    let npy = npyz::NpyFile::new(entry).map_err(|e| corrupt(format!("{name}: {e}")))?;
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let values = npy.into_vec::<f32>().map_err(|e| corrupt(format!("{name}: {e} (float32 expected)")))?;
    Ok(Tensor { name, shape, values })
}

/// Reads the Gemma Scope dictionary in `dir`, on `hook` if given, else on the hook its path names.
pub fn open(dir: &Path, hook: Option<&str>) -> Result<Dictionary, ModelError> {
    let refuse = |what: String| ModelError::Config(format!("Gemma Scope dictionary {}: {what}", dir.display()));
    let hook = match hook {
        Some(hook) => hook.to_string(),
        None => hook_from_path(dir).map_err(refuse)?,
    };
    let encoder = Encoder::JumpRelu;
    let tensors = Dictionary::tensor_names(encoder, false)
        .into_iter()
        .map(|name| read_array(dir, name))
        .collect::<Result<Vec<_>, _>>()?;
    let [d_in, d_sae] = tensors[0].shape[..] else {
        return Err(refuse(format!("W_enc is {:?}, not [d_model, d_sae]", tensors[0].shape)));
    };
    let name = dir.iter().rev().take(3).collect::<Vec<_>>().into_iter().rev().collect::<std::path::PathBuf>();
    Ok(Dictionary::new(name.to_string_lossy().replace('/', "_"), hook, [d_in, d_sae], encoder, tensors, dir))
}

/// The hook the Hub's layout names: `…/<repo with res|mlp>/layer_<n>/…`.
fn hook_from_path(dir: &Path) -> Result<String, String> {
    let parts: Vec<String> = dir.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let layer = parts.iter().position(|p| p.starts_with("layer_"));
    let (Some(at), true) = (layer, layer.is_some_and(|i| i > 0)) else {
        return Err(
            "no hook: the path has no `<repo>/layer_<n>/` as the Hub's layout does; name the hook (PATH@HOOK)".into()
        );
    };
    let layer: usize = parts[at]["layer_".len()..].parse().map_err(|_| format!("{:?} is not layer_<n>", parts[at]))?;
    let repo = &parts[at - 1];
    if repo.contains("att") {
        return Err(format!("{repo}: per-head dictionaries (attn.hook_z) are not read yet"));
    }
    if parts.iter().any(|p| p.contains("embedding")) {
        return Err("embedding dictionaries are not read yet".into());
    }
    if repo.contains("res") {
        Ok(format!("blocks.{layer}.hook_resid_post"))
    } else if repo.contains("mlp") {
        Ok(format!("blocks.{layer}.hook_mlp_out"))
    } else {
        Err(format!("{repo}: neither a residual (res) nor an MLP (mlp) release; name the hook (PATH@HOOK)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hub_layout_names_the_hook() {
        let hook = |p: &str| hook_from_path(Path::new(p));
        assert_eq!(
            hook("/x/gemma-scope-2b-pt-res/layer_20/width_16k/average_l0_71").unwrap(),
            "blocks.20.hook_resid_post"
        );
        assert_eq!(hook("gemma-scope-9b-pt-mlp/layer_3/width_131k/average_l0_9").unwrap(), "blocks.3.hook_mlp_out");
        assert!(hook("gemma-scope-2b-pt-att/layer_1/width_16k/x").unwrap_err().contains("per-head"));
        assert!(hook("/tmp/my-sae").unwrap_err().contains("name the hook"));
        assert!(hook("gemma-scope-2b-pt-transcoders/layer_1/w").unwrap_err().contains("name the hook"));
    }
}
