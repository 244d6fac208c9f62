//! A dictionary's encoder as program ops: the latents of `[tokens, d_in]` hook values, each
//! token's active latents as a fixed-width sparse row.
//!
//! In f32 (products at `HIGHEST` precision, as every f32 product siphon emits). The dense
//! latents `[tokens, d_sae]` are computed as SAELens computes them, then each token's `cap`
//! largest are kept by XLA's TopK (`chlo.top_k`: the lower latent first among ties): indices
//! where a value is a firing (> 0), `-1` elsewhere, and each token's number of firings — more
//! than `cap` is for the caller to refuse, never to truncate silently. For a TopK encoder the
//! `k` largest of the pre-activations are the `k` largest after the `relu`, the same firings.

use std::collections::BTreeMap;

use siphon_hlo::{Builder, CompareDir, DType, HloError, TensorType, Value};
use siphon_mesh::PartitionSpec;

use super::{Dictionary, DictionaryHook, Encoder, Latents, LatentsInfo, Normalize};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::hooks::HookPoint;

/// Declares every dictionary's tensors as the program's arguments, after its inputs: f32, in
/// [`Dictionary::program_tensors`]' order, replicated where the program is `sharded`.
pub(crate) fn args(
    b: &mut Builder,
    dictionaries: &[DictionaryHook],
    sharded: bool,
) -> Result<Vec<Vec<Value>>, HloError> {
    let mut all = Vec::with_capacity(dictionaries.len());
    for d in dictionaries {
        let mut args = Vec::new();
        for t in d.dictionary.program_tensors() {
            let ty = TensorType::new(DType::F32, &t.shape);
            args.push(b.arg(ty, sharded.then(|| PartitionSpec::replicated(t.shape.len())))?);
        }
        all.push(args);
    }
    Ok(all)
}

/// The dictionaries' part of a program's results ([`results`]).
pub(crate) struct Results {
    /// Each result, after the hooks', with its partitioning.
    pub values: Vec<(Value, PartitionSpec)>,
    /// What each dictionary's three results are.
    pub latents: Vec<LatentsInfo>,
}

/// Each dictionary's latents of the hook it reads (`hooks`: the program's hook values of
/// `config`, over `[batch, seq]` tokens), as the program's results after the hooks', each with
/// its partitioning: indices and values `[batch, seq, cap]`, split as the tokens are
/// (`tokens`, the inputs' partitioning), then the firings `[batch, seq]`; and what each
/// dictionary's three results are.
pub(crate) fn results(
    b: &mut Builder,
    dictionaries: &[DictionaryHook],
    args: &[Vec<Value>],
    hooks: &BTreeMap<HookPoint, Value>,
    config: &ModelConfig,
    tokens: &PartitionSpec,
    [batch, seq]: [usize; 2],
) -> Result<Results, ModelError> {
    let (mut values, mut latents) = (Vec::new(), Vec::new());
    for (i, (d, tensors)) in dictionaries.iter().zip(args).enumerate() {
        let x = *hooks.get(&d.hook).ok_or_else(|| {
            ModelError::Hook(format!("{} reads {}, which the graph did not produce", d.dictionary.name, d.hook))
        })?;
        let width = d.width(config, seq)?;
        let x = b.reshape(x, &[batch * seq, width])?;
        let l = encode(b, x, &d.dictionary, &tensors[..d.dictionary.tensors.len()], d.cap)?;
        let mut dims = tokens.dims()[..2].to_vec();
        dims.push(Vec::new());
        let info = LatentsInfo { dictionary: i, shape: vec![batch, seq, d.cap], spec: PartitionSpec::from_dims(dims) };
        let shapes = [vec![batch, seq, d.cap], vec![batch, seq, d.cap], vec![batch, seq]];
        for ((v, shape), spec) in l.into_results().into_iter().zip(shapes).zip(info.result_specs()) {
            values.push((b.reshape(v, &shape)?, spec));
        }
        latents.push(info);
    }
    Ok(Results { values, latents })
}

/// The latents of `x` `[tokens, d_in]` (any float dtype, encoded in f32) under `dict`, whose
/// tensors the program holds as `tensors` (in [`Dictionary::tensors`]' order), `cap` per token.
pub fn encode(
    b: &mut Builder,
    x: Value,
    dict: &Dictionary,
    tensors: &[Value],
    cap: usize,
) -> Result<Latents<Value>, HloError> {
    let [_, d] = b.dims(x)?.try_into().map_err(|_| HloError::Shape {
        op: "dictionary",
        detail: format!("input {:?} is not [tokens, d_in]", b.dims(x).unwrap_or(&[])),
    })?;
    if d != dict.d_in || tensors.len() != dict.tensors.len() || cap == 0 || cap > dict.d_sae {
        return Err(HloError::Shape {
            op: "dictionary",
            detail: format!(
                "{}: input width {d} (d_in {}), {} tensors for {}, cap {cap} of {} latents",
                dict.name,
                dict.d_in,
                tensors.len(),
                dict.tensors.len(),
                dict.d_sae
            ),
        });
    }
    let acts = activations(b, x, dict, tensors)?;
    latents(b, acts, dict, cap)
}

/// The dense latents `[tokens, d_sae]` f32 of `x` `[tokens, d_in]` under `dict` as SAELens
/// computes them before a TopK's selection (every latent's `relu`, for a TopK encoder too).
fn activations(b: &mut Builder, x: Value, dict: &Dictionary, tensors: &[Value]) -> Result<Value, HloError> {
    let [t, d] = b.dims(x)?.try_into().expect("checked [tokens, d_in]");
    let n = dict.d_sae;
    let tensor = |name: &str| tensors[dict.tensors.iter().position(|t| t.name == name).expect("checked names")];
    let row = |b: &mut Builder, v: Value, width: usize| b.broadcast_in_dim(v, &[t, width], &[1]);
    let mut x = b.convert(x, DType::F32)?;
    if dict.normalize != Normalize::None {
        x = normalize(b, x, dict.normalize)?;
    }
    if dict.subtract_b_dec {
        let b_dec = row(b, tensor("b_dec"), d)?;
        x = b.sub(x, b_dec)?;
    }
    let dense = TensorType::new(DType::F32, &[t, n]);
    let zero = b.splat(0.0, dense.clone())?;
    let affine = |b: &mut Builder, w: Value, bias: Value| -> Result<Value, HloError> {
        let y = b.matmul(x, w)?;
        let bias = row(b, bias, n)?;
        b.add(y, bias)
    };
    let acts = match dict.encoder {
        Encoder::Relu | Encoder::TopK { .. } => {
            let pre = affine(b, tensor("W_enc"), tensor("b_enc"))?;
            b.max(pre, zero)?
        }
        Encoder::JumpRelu => {
            let pre = affine(b, tensor("W_enc"), tensor("b_enc"))?;
            let threshold = row(b, tensor("threshold"), n)?;
            let above = b.compare(CompareDir::Gt, pre, threshold)?;
            let relu = b.max(pre, zero)?;
            b.select(above, relu, zero)?
        }
        Encoder::Gated => {
            let w = tensor("W_enc");
            let gate = affine(b, w, tensor("b_gate"))?;
            let open = b.compare(CompareDir::Gt, gate, zero)?;
            let scale = b.exp(tensor("r_mag"))?;
            let scale = b.broadcast_in_dim(scale, &[d, n], &[1])?;
            let w_mag = b.mul(w, scale)?;
            let mag = affine(b, w_mag, tensor("b_mag"))?;
            let mag = b.max(mag, zero)?;
            b.select(open, mag, zero)?
        }
    };
    Ok(acts)
}

/// The reconstruction of `x` `[tokens, d_in]` under `dict`, whose encoder's tensors the
/// program holds as `tensors` and its decoder's as `[w_dec, b_dec]`: `latents · W_dec + b_dec`
/// in f32 (SAELens's `decode`). A TopK encoder's `k` largest latents (XLA's TopK, as SAELens's
/// `torch.topk`) are decoded sparsely: the sum of their values times their decoder rows.
pub fn reconstruct(
    b: &mut Builder,
    x: Value,
    dict: &Dictionary,
    tensors: &[Value],
    [w_dec, b_dec]: [Value; 2],
) -> Result<Value, HloError> {
    let acts = activations(b, x, dict, tensors)?;
    let [t, _] = b.dims(acts)?.try_into().expect("[tokens, d_sae]");
    let d = dict.d_out().unwrap_or(dict.d_in);
    let y = match dict.encoder {
        Encoder::TopK { k } => {
            let (values, ids) = b.top_k(acts, k)?;
            let rows = b.take_rows(w_dec, ids)?;
            let values = b.broadcast_in_dim(values, &[t, k, d], &[0, 1])?;
            let weighted = b.mul(values, rows)?;
            b.reduce_sum(weighted, &[1])?
        }
        _ => b.matmul(acts, w_dec)?,
    };
    let bias = b.broadcast_in_dim(b_dec, &[t, d], &[1])?;
    b.add(y, bias)
}

/// Each token's `cap` largest of the dense `acts` `[tokens, d_sae]` as [`Latents`].
fn latents(b: &mut Builder, acts: Value, dict: &Dictionary, cap: usize) -> Result<Latents<Value>, HloError> {
    let [t, n] = b.dims(acts)?.try_into().expect("[tokens, d_sae]");
    // A TopK encoder's latents are its `k` largest only; the others' firings, none.
    let candidates = match dict.encoder {
        Encoder::TopK { k } => k,
        _ => n,
    };
    let positive = |b: &mut Builder, v: Value, width: usize| -> Result<Value, HloError> {
        let none = b.splat(0.0, TensorType::new(DType::F32, &[t, width]))?;
        b.compare(CompareDir::Gt, v, none)
    };
    let (top, top_ids) = b.top_k(acts, cap)?;
    let firings = match dict.encoder {
        Encoder::TopK { k } if k != cap => {
            let (largest, _) = b.top_k(acts, k)?;
            positive(b, largest, k)?
        }
        Encoder::TopK { .. } => positive(b, top, cap)?,
        _ => positive(b, acts, n)?,
    };
    let firings = b.convert(firings, DType::I32)?;
    let firings = b.reduce_sum(firings, &[1])?;
    let mut kept = positive(b, top, cap)?;
    if cap > candidates {
        let position = b.iota(TensorType::new(DType::I32, &[t, cap]), 1)?;
        let limit = b.splat(candidates as f64, TensorType::new(DType::I32, &[t, cap]))?;
        let candidate = b.compare(CompareDir::Lt, position, limit)?;
        kept = b.and(kept, candidate)?;
    }
    let none = b.splat(0.0, TensorType::new(DType::F32, &[t, cap]))?;
    let values = b.select(kept, top, none)?;
    let no_latent = b.splat(-1.0, TensorType::new(DType::I32, &[t, cap]))?;
    let indices = b.select(kept, top_ids, no_latent)?;
    Ok(Latents { indices, values, firings })
}

/// `x` `[tokens, d]` (f32) normalised per token as `how` says.
fn normalize(b: &mut Builder, x: Value, how: Normalize) -> Result<Value, HloError> {
    let [t, d] = b.dims(x)?.try_into().expect("checked [tokens, d_in]");
    let per_token = |b: &mut Builder, v: Value| b.broadcast_in_dim(v, &[t, d], &[0]);
    let sum = |b: &mut Builder, v: Value| b.reduce_sum(v, &[1]);
    let scalar = |b: &mut Builder, v: f64| b.splat(v, TensorType::new(DType::F32, &[t]));
    match how {
        Normalize::None => Ok(x),
        Normalize::ConstantNorm => {
            let squares = b.mul(x, x)?;
            let norm = sum(b, squares)?;
            let norm = b.sqrt(norm)?;
            let root = scalar(b, (d as f64).sqrt())?;
            let coeff = b.div(root, norm)?;
            let coeff = per_token(b, coeff)?;
            b.mul(x, coeff)
        }
        Normalize::LayerNorm => {
            let mean = sum(b, x)?;
            let width = scalar(b, d as f64)?;
            let mean = b.div(mean, width)?;
            let mean = per_token(b, mean)?;
            let centred = b.sub(x, mean)?;
            let squares = b.mul(centred, centred)?;
            let var = sum(b, squares)?;
            let bessel = scalar(b, (d - 1).max(1) as f64)?;
            let var = b.div(var, bessel)?;
            let std = b.sqrt(var)?;
            let eps = scalar(b, 1e-5)?;
            let std = b.add(std, eps)?;
            let std = per_token(b, std)?;
            b.div(centred, std)
        }
    }
}

/// `dict`'s encoder alone as a whole program (for its tests and for timing it): arguments the
/// hook values `[tokens, d_in]` (f32) then the dictionary's tensors; results its [`Latents`].
pub fn program(dict: &Dictionary, tokens: usize, cap: usize) -> Result<String, HloError> {
    let mut b = Builder::new("dictionary");
    let x = b.arg(TensorType::new(DType::F32, &[tokens, dict.d_in]), None)?;
    let tensors = dict
        .tensors
        .iter()
        .map(|t| b.arg(TensorType::new(DType::F32, &t.shape), None))
        .collect::<Result<Vec<_>, _>>()?;
    let latents = encode(&mut b, x, dict, &tensors, cap)?;
    b.finish(&latents.into_results())
}
