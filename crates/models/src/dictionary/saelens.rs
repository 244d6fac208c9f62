//! SAELens's saved dictionaries: `cfg.json` and `sae_weights.safetensors`, as `SAE.save_model`
//! writes them (6.x: the hook under `metadata.hook_name`) and as older releases did (top-level
//! `hook_name`, or `hook_point`; `activation_fn` `topk` with `activation_fn_kwargs.k`), read as
//! SAELens's own `handle_pre_6_0_config` maps them.
//!
//! Architectures and what `SAE.encode` computes for each (x̃ = the input, normalised as
//! `normalize_activations` says, minus `b_dec` where `apply_b_dec_to_input`):
//! `standard` relu(x̃·W_enc + b_enc); `jumprelu` the same times (pre > `threshold`); `topk` the
//! `k` largest pre-activations, relu'd; `gated` (x̃·W_enc + `b_gate` > 0) ·
//! relu(x̃·(W_enc·exp(`r_mag`)) + `b_mag`); `transcoder`, `skip_transcoder` (relu) and
//! `jumprelu_transcoder`, `jumprelu_skip_transcoder` on their input hook, never subtracting
//! `b_dec` (it is the output's). `normalize_activations`: `none` and
//! `expected_average_only_in` (folded into the weights when training ends; `encode` leaves the
//! input as it is), `constant_norm_rescale` (x·√d_in/‖x‖) and `layer_norm` ((x − mean)/(std +
//! 1e-5), std with Bessel's correction). Refused by name: other architectures, a `topk` that
//! rescales by decoder norms, per-head hooks (`hook_head_index`, `reshape_activations`
//! `hook_z`), activation functions other than relu.

use std::path::Path;

use serde_json::Value as Json;

use crate::dictionary::files::cfg_value;
use crate::dictionary::{Dictionary, Encoder, Normalize, Tensor};
use crate::error::ModelError;
use crate::weights::{DType, Weights};

/// The weights file next to `cfg.json`.
pub const WEIGHTS: &str = "sae_weights.safetensors";

/// Reads the SAELens dictionary in `dir`, whose `cfg.json` is `cfg`.
pub fn open(dir: &Path, cfg: &Json) -> Result<Dictionary, ModelError> {
    let refuse = |what: String| ModelError::Config(format!("SAELens dictionary {}: {what}", dir.display()));
    let field = |name: &str| cfg.get("metadata").and_then(|m| m.get(name)).filter(|v| !v.is_null()).or(cfg.get(name));
    let text = |name: &str| cfg_value(dir, name, cfg.get(name), "a string", Json::as_str);
    let flag = |name: &str| cfg_value(dir, name, cfg.get(name), "true or false", Json::as_bool);
    let hook = cfg_value(dir, "hook_name", field("hook_name").or(cfg.get("hook_point")), "a string", Json::as_str)?
        .ok_or_else(|| refuse("cfg.json names no hook (metadata.hook_name, hook_name or hook_point)".into()))?
        .to_string();
    let size = |name: &str| {
        cfg_value(dir, name, cfg.get(name), "a count", Json::as_u64)?
            .map(|v| v as usize)
            .ok_or_else(|| refuse(format!("cfg.json lacks {name}")))
    };
    let (d_in, d_sae) = (size("d_in")?, size("d_sae")?);
    if let Some(head) = field("hook_head_index").filter(|v| !v.is_null()) {
        return Err(refuse(format!("hook_head_index {head}: per-head dictionaries are not read yet")));
    }
    match text("reshape_activations")? {
        None | Some("none") => {}
        Some(other) => return Err(refuse(format!("reshape_activations {other:?} is not read yet"))),
    }
    let activation_fn = cfg.get("activation_fn").or(cfg.get("activation_fn_str"));
    let activation = cfg_value(dir, "activation_fn", activation_fn, "a string", Json::as_str)?;
    let old_topk = activation == Some("topk");
    let mut architecture = text("architecture")?.unwrap_or("standard");
    if old_topk {
        architecture = "topk";
    }
    if !matches!(activation, None | Some("relu") | Some("topk")) {
        return Err(refuse(format!("activation_fn {:?}: only relu is computed", activation.unwrap_or_default())));
    }
    let transcoder = architecture.contains("transcoder");
    let encoder = match architecture {
        "standard" | "transcoder" | "skip_transcoder" => Encoder::Relu,
        "jumprelu" | "jumprelu_transcoder" | "jumprelu_skip_transcoder" => Encoder::JumpRelu,
        "gated" => Encoder::Gated,
        "topk" => {
            if flag("rescale_acts_by_decoder_norm")? == Some(true) {
                return Err(refuse("rescale_acts_by_decoder_norm: not computed".into()));
            }
            let k = cfg.get("k").or(cfg.get("activation_fn_kwargs").and_then(|kw| kw.get("k")));
            let k = cfg_value(dir, "k", k, "a count", Json::as_u64)?;
            Encoder::TopK { k: k.ok_or_else(|| refuse("a topk dictionary without k".into()))? as usize }
        }
        other => return Err(refuse(format!("architecture {other:?} is not one siphon encodes"))),
    };
    let normalize = match cfg.get("normalize_activations") {
        None | Some(Json::Null) | Some(Json::Bool(false)) => Normalize::None,
        // `SAE.encode` leaves the input as it is: training folds the estimated norm into the weights.
        Some(Json::Bool(true)) => Normalize::None,
        Some(Json::String(s)) => match s.as_str() {
            "none" | "expected_average_only_in" => Normalize::None,
            "constant_norm_rescale" => Normalize::ConstantNorm,
            "layer_norm" => Normalize::LayerNorm,
            other => return Err(refuse(format!("normalize_activations {other:?} is not computed"))),
        },
        Some(other) => return Err(refuse(format!("normalize_activations {other}"))),
    };
    // SAELens refuses b_dec on a transcoder's input; older configs lack the field (default on).
    let subtract_b_dec = !transcoder && flag("apply_b_dec_to_input")?.unwrap_or(true);

    let file = Weights::from_safetensors_file(&dir.join(WEIGHTS))?;
    let tensors = Dictionary::tensor_names(encoder, subtract_b_dec)
        .into_iter()
        .map(|name| {
            let t = file.get_if_stored(name, DType::F32)?.ok_or_else(|| refuse(format!("{WEIGHTS} lacks {name}")))?;
            Ok(Tensor { name, shape: t.shape.clone(), values: t.to_f32_vec() })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    let name = dir.file_name().map_or_else(|| "sae".into(), |n| n.to_string_lossy().into_owned());
    Ok(Dictionary {
        normalize,
        subtract_b_dec,
        transcoder,
        ..Dictionary::new(name, hook, [d_in, d_sae], encoder, tensors, dir)
    })
}
