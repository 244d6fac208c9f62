//! EleutherAI sparsify's dictionaries: a checkpoint's `<hookpoint>/cfg.json` and
//! `<hookpoint>/sae.safetensors` (`encoder.weight` `[d_sae, d_in]`, `encoder.bias`, `W_dec`,
//! `b_dec`), as `SparseCoder.save_to_disk` writes them. `SparseCoder.encode`: the `k` largest
//! of relu((x − b_dec)·encoder.weightᵀ + encoder.bias) — a transcoder (`transcode`) never
//! subtracts `b_dec` — and a zero among them is no firing.
//!
//! The hook is the directory's name, a module path of the Hugging Face model, read as
//! sparsify hooks it: `layers.N` (its output) → `blocks.N.hook_resid_post`; `layers.N.mlp` →
//! `blocks.N.hook_mlp_out`, or for a transcoder the MLP's input, `blocks.N.mlp.hook_in`; with
//! any prefix before `layers` (`model.`, `gpt_neox.`). Other module paths need the hook named.
//! Refused by name: `groupmax` activations, skip connections' `W_skip` is not read (latents
//! do not need it).

use std::path::Path;

use serde_json::Value as Json;

use crate::dictionary::files::cfg_value;
use crate::dictionary::{Dictionary, Encoder, Tensor};
use crate::error::ModelError;
use crate::weights::{DType, Weights};

/// The weights file next to `cfg.json`.
pub const WEIGHTS: &str = "sae.safetensors";

/// Reads the sparsify dictionary in `dir`, whose `cfg.json` is `cfg`, on `hook` if given, else
/// on the hook its directory's name says.
pub fn open(dir: &Path, cfg: &Json, hook: Option<&str>) -> Result<Dictionary, ModelError> {
    let refuse = |what: String| ModelError::Config(format!("sparsify dictionary {}: {what}", dir.display()));
    match cfg_value(dir, "activation", cfg.get("activation"), "a string", Json::as_str)?.unwrap_or("topk") {
        "topk" => {}
        other => return Err(refuse(format!("activation {other:?}: only topk is computed"))),
    }
    let transcode = cfg_value(dir, "transcode", cfg.get("transcode"), "true or false", Json::as_bool)?.unwrap_or(false);
    let point = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let hook = match hook {
        Some(hook) => hook.to_string(),
        None => hook_of(&point, transcode).ok_or_else(|| {
            refuse(format!("hookpoint {point:?} is not layers.N or layers.N.mlp; name the hook (PATH@HOOK)"))
        })?,
    };
    let size = |name: &str| {
        cfg_value(dir, name, cfg.get(name), "a count", Json::as_u64)?
            .map(|v| v as usize)
            .ok_or_else(|| refuse(format!("cfg.json lacks {name}")))
    };
    let (d_in, k) = (size("d_in")?, size("k")?);

    let file = Weights::from_safetensors_file(&dir.join(WEIGHTS))?;
    let read = |name: &'static str| {
        let t = file.get_if_stored(name, DType::F32)?.ok_or_else(|| refuse(format!("{WEIGHTS} lacks {name}")))?;
        Ok::<_, ModelError>(Tensor { name, shape: t.shape.clone(), values: t.to_f32_vec() })
    };
    let weight = read("encoder.weight")?;
    let d_sae = weight.linear_latents(d_in, "d_in").map_err(refuse)?;
    let encoder = Encoder::TopK { k };
    let subtract_b_dec = !transcode;
    let mut tensors = vec![weight.linear_as_w_enc(d_sae, |_| 1.0), Tensor { name: "b_enc", ..read("encoder.bias")? }];
    if subtract_b_dec {
        tensors.push(read("b_dec")?);
    }
    let parent = dir.parent().and_then(Path::file_name).map(|n| n.to_string_lossy().into_owned());
    let name = parent.map_or(point.clone(), |p| format!("{p}_{point}"));
    let transcoder = transcode;
    Ok(Dictionary { subtract_b_dec, transcoder, ..Dictionary::new(name, hook, [d_in, d_sae], encoder, tensors, dir) })
}

/// The TransformerLens hook of sparsify's hookpoint `point`, if it is one of the usual ones.
fn hook_of(point: &str, transcode: bool) -> Option<String> {
    let at = point.find("layers.")?;
    let rest = &point[at + "layers.".len()..];
    let (layer, tail) = rest.split_once('.').map_or((rest, ""), |(l, t)| (l, t));
    let layer: usize = layer.parse().ok()?;
    match (tail, transcode) {
        ("", false) => Some(format!("blocks.{layer}.hook_resid_post")),
        ("mlp", false) => Some(format!("blocks.{layer}.hook_mlp_out")),
        ("mlp", true) => Some(format!("blocks.{layer}.mlp.hook_in")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hookpoints_name_their_hooks() {
        assert_eq!(hook_of("layers.10", false).as_deref(), Some("blocks.10.hook_resid_post"));
        assert_eq!(hook_of("model.layers.3.mlp", false).as_deref(), Some("blocks.3.hook_mlp_out"));
        assert_eq!(hook_of("gpt_neox.layers.3.mlp", true).as_deref(), Some("blocks.3.mlp.hook_in"));
        assert_eq!(hook_of("layers.3", true), None);
        assert_eq!(hook_of("layers.3.self_attn", false), None);
        assert_eq!(hook_of("embed_tokens", false), None);
    }
}
