//! A weight or a dictionary tensor holding a NaN or an infinity — stored so, or made so by its
//! scales — is refused naming the tensor and its file, before any forward runs, in every form
//! it can be read in: f32, bf16 and f16 tensors, FP8 bytes and their scales, MXFP4 groups and
//! their exponents, dequantized on load or kept stored on the devices. (GGUF blocks' scales:
//! `gguf/tests.rs`.)

use std::path::Path;

use safetensors::{Dtype, SafeTensors};
use siphon_models::dictionary::Dictionary;
use siphon_models::{DType, LoadedModel, ModelError};

mod support {
    pub mod copies;
}
use support::copies::{copy_dir, fixtures};

/// Rewrites the safetensors file `path` with `edit` applied to each tensor's dtype and bytes.
fn rewrite(path: &Path, edit: impl Fn(&str, &mut Dtype, &mut Vec<u8>)) {
    let bytes = std::fs::read(path).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .map(|(name, t)| {
            let (mut dtype, mut data) = (t.dtype(), t.data().to_vec());
            edit(&name, &mut dtype, &mut data);
            (name, dtype, t.shape().to_vec(), data)
        })
        .collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            (name.clone(), safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// The error of reading `name` as the forward does (in `dtype`, or in its stored form).
fn load_error(model: &LoadedModel, name: &str, dtype: DType, stored: bool) -> ModelError {
    let params = model.config.params(model.config.n_layers, false);
    let param = params.iter().find(|p| p.name == name).unwrap_or_else(|| panic!("no parameter {name}"));
    let result = match stored {
        false => model.weights.load(param, dtype).map(drop),
        true => model
            .weights
            .stored_form(param)
            .and_then(|form| model.weights.load_stored(param, form.expect("a stored form")).map(drop)),
    };
    result.unwrap_err()
}

fn assert_names(err: &ModelError, tensor: &str, file: &Path) {
    assert!(matches!(err, ModelError::NonFinite { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains(tensor) && text.contains(&file.display().to_string()), "{text}");
}

#[test]
fn a_float_weight_holding_nan_or_infinity_is_refused_in_every_stored_type() {
    let tmp = tempfile::tempdir().unwrap();
    let name = "model.layers.1.mlp.up_proj.weight";
    for (stored, bad) in [
        (Dtype::F32, f32::NAN),
        (Dtype::F32, f32::INFINITY),
        (Dtype::BF16, f32::NAN),
        (Dtype::BF16, f32::NEG_INFINITY),
        (Dtype::F16, f32::NAN),
        (Dtype::F16, f32::INFINITY),
    ] {
        let dir = tmp.path().join(format!("{stored:?}-{bad}"));
        copy_dir(&fixtures().join("models/tiny-llama"), &dir);
        let file = dir.join("model.safetensors");
        rewrite(&file, |tensor, dtype, data| {
            let mut values: Vec<f32> =
                data.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
            if tensor == name {
                values[77] = bad;
            }
            *dtype = stored;
            *data = match stored {
                Dtype::BF16 => values.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
                Dtype::F16 => values.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect(),
                _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            };
        });
        let model = LoadedModel::open(&dir).unwrap();
        model.check_weights(model.config.n_layers).unwrap();
        for dtype in [DType::F32, DType::Bf16] {
            let err = load_error(&model, name, dtype, false);
            assert_names(&err, name, &file);
            assert!(err.to_string().contains("(element 77 of"), "{err}");
        }
        let other = model.config.params(1, false).into_iter().next().unwrap();
        model.weights.load(&other, DType::F32).unwrap();
    }
}

#[test]
fn an_fp8_weight_holding_nan_or_a_scale_that_makes_one_is_refused_read_or_kept_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let name = "model.layers.0.mlp.up_proj.weight";
    let scale = format!("{name}_scale_inv");
    // Which tensor's bytes are overwritten, where, with what.
    let cases = [
        ("a NaN byte", name, 100, vec![0x7f]),
        ("a NaN scale", scale.as_str(), 4, f32::NAN.to_le_bytes().to_vec()),
        ("an overflowing scale", scale.as_str(), 0, 1e38f32.to_le_bytes().to_vec()),
    ];
    for (i, (what, tensor, at, bytes)) in cases.iter().enumerate() {
        let dir = tmp.path().join(i.to_string());
        copy_dir(&fixtures().join("models/tiny-qwen3-fp8"), &dir);
        let file = dir.join("model.safetensors");
        rewrite(&file, |this, _, data| {
            if this == *tensor {
                data[*at..at + bytes.len()].copy_from_slice(bytes);
            }
        });
        let model = LoadedModel::open(&dir).unwrap();
        for stored in [false, true] {
            let err = load_error(&model, name, DType::F32, stored);
            assert_names(&err, name, &file);
            assert!(!stored || err.to_string().contains("times its block's scale"), "{what}: {err}");
        }
    }
}

#[test]
fn an_mxfp4_group_whose_exponent_overflows_is_refused_read_or_kept_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    copy_dir(&fixtures().join("models/tiny-gpt-oss-mxfp4"), &dir);
    let file = dir.join("model.safetensors");
    let blocks = "model.layers.0.mlp.experts.down_proj_blocks";
    // Group 5's exponent 255 (2^128) with a nibble of magnitude 1 in it.
    rewrite(&file, |tensor, _, data| match tensor {
        t if t == blocks => data[5 * 16] = 0x22,
        "model.layers.0.mlp.experts.down_proj_scales" => data[5] = 255,
        _ => {}
    });
    let model = LoadedModel::open(&dir).unwrap();
    let name = "model.layers.0.mlp.experts.down_proj";
    for stored in [false, true] {
        let err = load_error(&model, name, DType::Bf16, stored);
        assert_names(&err, name, &file);
    }
}

#[test]
fn a_dictionary_tensor_holding_nan_or_infinity_is_refused_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    for (tensor, bad) in [("W_enc", f32::NAN), ("b_enc", f32::INFINITY), ("threshold", f32::NAN)] {
        let dir = tmp.path().join(tensor);
        copy_dir(&fixtures().join("dictionaries/saelens-jumprelu"), &dir);
        let file = dir.join("sae_weights.safetensors");
        rewrite(&file, |name, dtype, data| {
            if name == tensor {
                assert_eq!(*dtype, Dtype::F32);
                data[8..12].copy_from_slice(&bad.to_le_bytes());
            }
        });
        let err = Dictionary::open(&dir, None).unwrap_err();
        assert_names(&err, tensor, &file);
    }
}
