//! Llama Scope's dictionaries (OpenMOSS; `fnlp/Llama3_1-8B-Base-LXR-8x` and its siblings on the
//! Hub): a directory with `hyperparams.json`, lm-saes's `SAEConfig`, and
//! `checkpoints/final.safetensors` — `encoder.weight` `[d_sae, d_model]`, `encoder.bias`,
//! `decoder.weight` `[d_model, d_sae]`, `decoder.bias` — read as lm-saes's own loader of the
//! release reads them (`SparseAutoEncoder.from_pretrained` → `from_config`, `src/lm_saes/sae.py`
//! at the release, October 2024), a scalar-threshold JumpReLU on `hook_point_in` (a
//! TransformerLens name already):
//!
//! 1. `norm_activation` `dataset-wise`: training scaled the input by `s_in = √d_model /
//!    dataset_average_activation_norm.in`. The loader folds it: `encoder.bias / s_in`,
//!    `decoder.weight · s_in / s_out` (`s_out` the same of `.out`), and the input is then read as
//!    it is (`inference`) — the latents are in the activation's own scale, not the training's.
//! 2. `sparsity_include_decoder_norm`: the loader makes the decoder's columns unit-norm and
//!    multiplies each latent's encoder row and bias by its column's norm.
//! 3. `encode`: `pre = x·encoder.weightᵀ + encoder.bias`, `pre` where `pre > jump_relu_threshold`,
//!    else 0 — `relu(pre)·(pre > θ)` for a threshold ≥ 0.
//!
//! So the description here is that loaded model: `W_enc = (encoder.weight · n)ᵀ`, `b_enc =
//! encoder.bias · n / s_in` (`n` the scaled decoder's column norms, or 1), one threshold
//! repeated, no input normalisation, `b_dec` never subtracted. SAELens's `llama_scope` loader
//! differs: it ignores the decoder's norms (the same firings only where they are 1) and keeps the
//! latents in the training's scale (`s_in` times these).
//!
//! Refused by name: an `act_fn` other than `jumprelu`, a negative threshold, `norm_activation`
//! other than `dataset-wise` or `inference`, the decoder bias subtracted from the input
//! (`apply_decoder_bias_to_pre_encoder` with `use_decoder_bias`), `use_glu_encoder`, and a
//! directory holding a checkpoint lm-saes would read before `checkpoints/final.safetensors`.
//! Missing fields take lm-saes's defaults of the release.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::dictionary::{Dictionary, Encoder, Tensor};
use crate::error::ModelError;
use crate::weights::{DType, Weights};

/// The configuration's file.
pub const HYPERPARAMS: &str = "hyperparams.json";
/// The weights file lm-saes writes when training ends.
pub const WEIGHTS: &str = "checkpoints/final.safetensors";
/// The checkpoints lm-saes's loader looks for before [`WEIGHTS`], in its order.
const READ_FIRST: [&str; 4] =
    ["sae_weights.safetensors", "sae_weights.pt", "checkpoints/pruned.safetensors", "checkpoints/pruned.pt"];

/// `hyperparams.json`: the fields the encoder depends on (lm-saes's `SAEConfig`; the others are
/// training's).
#[derive(Debug, Deserialize)]
struct Hyperparams {
    hook_point_in: Option<String>,
    d_model: Option<usize>,
    d_sae: Option<usize>,
    act_fn: Option<String>,
    jump_relu_threshold: Option<f64>,
    norm_activation: Option<String>,
    dataset_average_activation_norm: Option<BTreeMap<String, f64>>,
    sparsity_include_decoder_norm: Option<bool>,
    use_decoder_bias: Option<bool>,
    apply_decoder_bias_to_pre_encoder: Option<bool>,
    use_glu_encoder: Option<bool>,
}

/// Reads the Llama Scope dictionary in `dir`.
pub fn open(dir: &Path) -> Result<Dictionary, ModelError> {
    let refuse = |what: String| ModelError::Config(format!("Llama Scope dictionary {}: {what}", dir.display()));
    let path = dir.join(HYPERPARAMS);
    let text = crate::file::read_to_string(&path)?;
    let hp: Hyperparams =
        serde_json::from_str(&text).map_err(|e| ModelError::Corrupt { path: path.clone(), detail: e.to_string() })?;

    // lm-saes's defaults at the release: act_fn relu, threshold 0, token-wise norms, the decoder
    // norm in the sparsity, a decoder bias applied to the encoder's input, no GLU.
    let hook = hp.hook_point_in.ok_or_else(|| refuse(format!("{HYPERPARAMS} names no hook_point_in")))?;
    let d_model = hp.d_model.ok_or_else(|| refuse(format!("{HYPERPARAMS} lacks d_model")))?;
    match hp.act_fn.as_deref().unwrap_or("relu") {
        "jumprelu" => {}
        other => return Err(refuse(format!("act_fn {other:?}: only jumprelu is read"))),
    }
    let threshold = hp.jump_relu_threshold.unwrap_or(0.0);
    if !(threshold >= 0.0 && threshold.is_finite()) {
        return Err(refuse(format!("jump_relu_threshold {threshold}: lm-saes keeps the negative values above it")));
    }
    if hp.use_glu_encoder == Some(true) {
        return Err(refuse("use_glu_encoder: not read yet".into()));
    }
    if hp.use_decoder_bias.unwrap_or(true) && hp.apply_decoder_bias_to_pre_encoder.unwrap_or(true) {
        return Err(refuse("apply_decoder_bias_to_pre_encoder (the decoder bias subtracted): not read yet".into()));
    }
    let (scale_in, scale_out) = match hp.norm_activation.as_deref().unwrap_or("token-wise") {
        "dataset-wise" => {
            let norms = hp.dataset_average_activation_norm.unwrap_or_default();
            let scale = |side: &str| match norms.get(side) {
                Some(&norm) if norm > 0.0 && norm.is_finite() => Ok((d_model as f64).sqrt() / norm),
                Some(norm) => Err(refuse(format!("dataset_average_activation_norm.{side} {norm} is not a norm"))),
                None => {
                    Err(refuse(format!("norm_activation dataset-wise without dataset_average_activation_norm.{side}")))
                }
            };
            (scale("in")?, scale("out")?)
        }
        "inference" => (1.0, 1.0),
        other => return Err(refuse(format!("norm_activation {other:?} is not read"))),
    };
    if let Some(first) = READ_FIRST.iter().find(|f| dir.join(f).exists()) {
        return Err(refuse(format!("lm-saes reads {first} before {WEIGHTS}; not read")));
    }

    let file = Weights::from_safetensors_file(&dir.join(WEIGHTS))?;
    let read = |name: &'static str| {
        let t = file.get_if_stored(name, DType::F32)?.ok_or_else(|| refuse(format!("{WEIGHTS} lacks {name}")))?;
        Ok::<_, ModelError>(Tensor { name, shape: t.shape.clone(), values: t.to_f32_vec() })
    };
    let weight = read("encoder.weight")?;
    let d_sae = weight.linear_latents(d_model, "d_model").map_err(refuse)?;
    if let Some(n) = hp.d_sae.filter(|&n| n != d_sae) {
        return Err(refuse(format!("encoder.weight is {:?}, d_sae is {n}", weight.shape)));
    }
    let bias = read("encoder.bias")?;
    if bias.shape != [d_sae] {
        return Err(refuse(format!("encoder.bias is {:?}, not [{d_sae}]", bias.shape)));
    }
    // Each latent's factor: its decoder column's norm once the decoder is scaled by
    // s_in / s_out, or 1.
    let norms = if hp.sparsity_include_decoder_norm.unwrap_or(true) {
        let decoder = read("decoder.weight")?;
        if decoder.shape != [d_model, d_sae] {
            return Err(refuse(format!("decoder.weight is {:?}, not [{d_model}, {d_sae}]", decoder.shape)));
        }
        let mut squares = vec![0f64; d_sae];
        for row in decoder.values.chunks_exact(d_sae) {
            for (sum, &v) in squares.iter_mut().zip(row) {
                *sum += (f64::from(v) * scale_in / scale_out).powi(2);
            }
        }
        squares.into_iter().map(f64::sqrt).collect()
    } else {
        vec![1.0; d_sae]
    };
    let w_enc = weight.linear_as_w_enc(d_sae, |latent| norms[latent]);
    let b_enc = bias.values.iter().zip(&norms).map(|(&b, n)| (f64::from(b) / scale_in * n) as f32).collect();
    let encoder = Encoder::JumpRelu;
    let tensors = vec![
        w_enc,
        Tensor { name: "b_enc", shape: vec![d_sae], values: b_enc },
        Tensor { name: "threshold", shape: vec![d_sae], values: vec![threshold as f32; d_sae] },
    ];
    let name = dir.file_name().map_or_else(|| "sae".into(), |n| n.to_string_lossy().into_owned());
    Ok(Dictionary::new(name, hook, [d_model, d_sae], encoder, tensors, dir))
}
