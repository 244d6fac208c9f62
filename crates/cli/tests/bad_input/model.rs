//! Bad model inputs: a config.json value out of its range or of the wrong type, a RoPE
//! setting siphon does not read, a weight or a dictionary holding NaN, a FIFO or a device
//! where a model's file is read. Each is refused within seconds, naming the field, the
//! tensor or the file, and leaves no run directory behind.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::repo_root;
use crate::{Setup, assert_no_crash, extract_args, run, setup, siphon};

/// Runs `args`, which must be refused within `seconds` naming each of `named`, leaving no
/// run directory `run` behind.
fn refused(s: &Setup, run_name: &str, args: &[String], seconds: u64, named: &[&str]) {
    let (output, took) = run(siphon(args), Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let what = format!("{named:?} ({took:?})");
    assert_no_crash(&output, &what);
    assert!(!output.status.success(), "{what}: accepted: {stderr}");
    for name in named {
        assert!(stderr.contains(name), "{what}: the error does not name {name}: {stderr}");
    }
    assert!(took < Duration::from_secs(seconds), "{what}: refused only after {took:?}");
    assert!(!s.root.join("out").join(run_name).exists(), "{what}: a run directory was made");
}

/// Rewrites the safetensors file `path` with `edit` applied to each tensor's bytes.
fn rewrite_tensors(path: &Path, edit: impl Fn(&str, &mut Vec<u8>)) {
    let bytes = std::fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .map(|(name, t)| {
            let mut data = t.data().to_vec();
            edit(&name, &mut data);
            (name, t.dtype(), t.shape().to_vec(), data)
        })
        .collect();
    let views = tensors.iter().map(|(name, dtype, shape, data)| {
        (name.clone(), safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap())
    });
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// The test model's config.json with `edit`'s keys set.
fn edit_config(s: &Setup, original: &Value, edit: &Value) {
    let mut config = original.clone();
    config.as_object_mut().unwrap().extend(edit.as_object().unwrap().clone());
    std::fs::write(s.root.join("model/config.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
}

#[test]
fn config_values_out_of_range_or_not_understood_are_refused_by_name() {
    let s = setup();
    let original: Value = serde_json::from_slice(&std::fs::read(s.root.join("model/config.json")).unwrap()).unwrap();
    let llama3 = |factor: f64| {
        json!({"rope_scaling": {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})
    };
    let cases = [
        (json!({"rope_theta": -1}), "rope_theta (the RoPE base) -1"),
        (json!({"rms_norm_eps": -1}), "rms_norm_eps (the norms' epsilon"),
        (llama3(0.0), "RoPE scaling (llama3) factor 0"),
        (json!({"rope_parameters": "garbage"}), "rope_parameters \"garbage\" is not an object"),
        (json!({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "mystery": 1}}), "rope_scaling.mystery"),
        (json!({"rope_theta": "10000"}), "config.json rope_theta: invalid type"),
    ];
    for (i, (edit, named)) in cases.iter().enumerate() {
        edit_config(&s, &original, edit);
        let run_name = format!("c{i}");
        refused(&s, &run_name, &extract_args(&s, &run_name, &[]), 10, &[named]);
    }
    // The same model with a valid llama3 scaling runs.
    edit_config(&s, &original, &llama3(8.0));
    let (output, _) = run(siphon(&extract_args(&s, "ok", &[])), Duration::from_secs(120));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn a_weight_holding_nan_is_refused_naming_it_and_its_file() {
    let s = setup();
    let file = s.root.join("model/model.safetensors");
    let name = "model.layers.1.mlp.down_proj.weight";
    rewrite_tensors(&file, |tensor, data| {
        if tensor == name {
            data.chunks_exact_mut(4).for_each(|c| c.copy_from_slice(&f32::NAN.to_le_bytes()));
        }
    });
    // Read while the weights are uploaded, before any step: the plugin is loaded first.
    let args = extract_args(&s, "w", &[]);
    refused(&s, "w", &args, 30, &[name, &file.display().to_string(), "NaN"]);
}

#[test]
fn a_fifo_or_a_device_where_a_models_file_is_read_is_refused_naming_it() {
    let s = setup();
    let config = s.root.join("model/config.json");
    std::fs::rename(&config, s.root.join("config.json.aside")).unwrap();
    let status = std::process::Command::new("mkfifo").arg(&config).status().unwrap();
    assert!(status.success());
    let args = extract_args(&s, "f", &[]);
    refused(&s, "f", &args, 10, &[&config.display().to_string(), "FIFO"]);
    let args = extract_args(&s, "d", &["--model", "/dev/null"]);
    refused(&s, "d", &args, 10, &["/dev/null", "a character device, not a model directory or a .gguf file"]);
}

#[test]
fn a_dictionary_holding_nan_is_refused_naming_the_tensor_and_file() {
    let s = setup();
    let dictionary = s.root.join("sae");
    std::fs::create_dir_all(&dictionary).unwrap();
    let fixture = repo_root().join("fixtures/dictionaries/saelens-standard");
    for file in ["cfg.json", "sae_weights.safetensors"] {
        std::fs::copy(fixture.join(file), dictionary.join(file)).unwrap();
    }
    let weights = dictionary.join("sae_weights.safetensors");
    rewrite_tensors(&weights, |tensor, data| {
        if tensor == "b_enc" {
            data[..4].copy_from_slice(&f32::INFINITY.to_le_bytes());
        }
    });
    let model = repo_root().join("fixtures/models/tiny-llama");
    let ids = s.root.join("ids.json");
    std::fs::write(&ids, "[[1, 2, 3, 4]]").unwrap();
    let out = s.root.join("latents.safetensors");
    let args: Vec<String> = [
        "forward",
        "--model",
        model.to_str().unwrap(),
        "--ids",
        ids.to_str().unwrap(),
        "--sae",
        dictionary.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    refused(&s, "none", &args, 10, &["\"b_enc\"", &weights.display().to_string(), "inf"]);
    assert!(!Path::new(&out).exists(), "latents were written");
}
