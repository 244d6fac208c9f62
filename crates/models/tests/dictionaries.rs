//! Dictionaries' encoders on the PJRT CPU plugin against the libraries that made them: each
//! fixture under `fixtures/dictionaries/` was saved by SAELens itself (or written as Gemma
//! Scope's `params.npz` and read back by SAELens's own loader), by EleutherAI's sparsify
//! (`SparseCoder.save_to_disk`), or in Llama Scope's layout (its latents by lm-saes's encoder,
//! written out from lm-saes's source: SAELens's loader computes otherwise), with the latents the
//! library's encoder gives for TransformerLens's values of the hook on tiny-llama's golden rows
//! (`scripts/gen-sae-fixtures.sh`). siphon reads the saved files, encodes the same values in
//! a program and must give the same latents within 1e-4 of their scale, and the same firings
//! wherever a pre-activation is not within that of its threshold.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use safetensors::SafeTensors;
use siphon_models::dictionary::{Dictionary, Encoder};
use siphon_runtime::{Client, ClientOptions, CompileOptions, HostArray, Plugin};

fn client() -> Client {
    static PLUGIN: OnceLock<Arc<Plugin>> = OnceLock::new();
    let plugin = PLUGIN.get_or_init(|| {
        let path = std::env::var_os("SIPHON_PJRT_PLUGIN")
            .map(PathBuf::from)
            .unwrap_or_else(siphon_runtime::default_cpu_plugin_path);
        Plugin::load(&path).expect("load the CPU plugin")
    });
    Client::new(plugin, ClientOptions::new().cpu_device_count(8)).unwrap()
}

mod support {
    pub mod dictionary_fixtures;
}
use support::dictionary_fixtures::dictionary_fixtures as fixtures;

fn f32s(st: &SafeTensors, name: &str) -> (Vec<usize>, Vec<f32>) {
    let t = st.tensor(name).unwrap();
    (t.shape().to_vec(), t.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect())
}

/// The program's latents for `x` as (indices, values, count), `cap` per token.
fn encode(client: &Client, dict: &Dictionary, x: &[f32], tokens: usize, cap: usize) -> (Vec<i32>, Vec<f32>, Vec<i32>) {
    let text = siphon_models::dictionary::encoder::program(dict, tokens, cap).unwrap();
    let exe = client.compile(&text, &CompileOptions::single_device(None)).unwrap();
    let device = exe.device_ids()[0];
    let mut args = vec![client.upload(&HostArray::from_slice(&[tokens, dict.d_in], x).unwrap(), device).unwrap()];
    for t in &dict.tensors {
        args.push(client.upload(&HostArray::from_slice(&t.shape, &t.values).unwrap(), device).unwrap());
    }
    let out = exe.execute(&[args.iter().collect()]).unwrap();
    let host: Vec<HostArray> = out[0].iter().map(|b| b.to_host().unwrap()).collect();
    let ints = |a: &HostArray| a.to_f32().iter().map(|&v| v as i32).collect::<Vec<i32>>();
    (ints(&host[0]), host[1].to_f32(), ints(&host[2]))
}

#[test]
fn every_architecture_encodes_as_its_library_does() {
    let client = client();
    let dirs = fixtures();
    assert!(dirs.len() >= 13, "the dictionary fixtures are there");
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let dict = Dictionary::open(&dir, None).unwrap_or_else(|e| panic!("{name}: {e}"));
        let bytes = std::fs::read(dir.join("golden.safetensors")).unwrap();
        let golden = SafeTensors::deserialize(&bytes).unwrap();
        let (shape, x) = f32s(&golden, "x");
        let (_, want) = f32s(&golden, "latents");
        let (tokens, n) = (shape[0], dict.d_sae);
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let tol = 1e-4 * scale;
        // Every latent kept: the dense latents, rebuilt from the sparse rows.
        let (indices, values, count) = encode(&client, &dict, &x, tokens, n);
        let mut got = vec![0f32; tokens * n];
        for t in 0..tokens {
            let fires = want[t * n..][..n].iter().filter(|&&v| v > 0.0).count();
            assert!(
                (count[t] as usize).abs_diff(fires) <= 1,
                "{name} token {t}: {} firings, SAELens {fires}",
                count[t]
            );
            for j in 0..n {
                let (i, v) = (indices[t * n + j], values[t * n + j]);
                if i < 0 {
                    assert!(j as i32 >= count[t] && v == 0.0, "{name} token {t}: a gap before the end of the firings");
                    continue;
                }
                assert!(v > 0.0, "{name}: index {i} kept without firing");
                if j > 0 && indices[t * n + j - 1] >= 0 {
                    assert!(values[t * n + j - 1] >= v, "{name} token {t}: not largest first");
                }
                got[t * n + i as usize] = v;
            }
        }
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            let (t, latent) = (k / n, k % n);
            // A latent at its threshold may fire on one side and not the other: its value is
            // then at most the threshold's scale (JumpReLU) or near 0 (ReLU, gates).
            let near_threshold = match dict.encoder {
                Encoder::JumpRelu => dict.tensor("threshold").unwrap().values[latent].abs() + tol,
                _ => tol,
            };
            let ok = (g - w).abs() <= tol || ((*g == 0.0 || *w == 0.0) && g.max(*w) <= near_threshold);
            assert!(ok, "{name} token {t} latent {latent}: {g} vs SAELens {w} (scale {scale})");
        }
        let differ = got.iter().zip(&want).filter(|(g, w)| (**g > 0.0) != (**w > 0.0)).count();
        assert!(differ <= 1, "{name}: {differ} firings differ from SAELens's");
        if let Encoder::TopK { k } = dict.encoder {
            assert!(count.iter().all(|&c| c as usize <= k), "{name}: at most k firings");
        }

        // A cap below the firings: the largest kept, the count tells how many there were.
        let most = *count.iter().max().unwrap() as usize;
        if most > 2 {
            let cap = most - 1;
            let (small, small_values, small_count) = encode(&client, &dict, &x, tokens, cap);
            assert_eq!(small_count, count, "{name}: the count does not depend on the cap");
            for t in 0..tokens {
                assert_eq!(&small[t * cap..][..cap], &indices[t * n..][..cap], "{name} token {t}");
                assert_eq!(&small_values[t * cap..][..cap], &values[t * n..][..cap], "{name} token {t}");
            }
        }
    }
}

/// What siphon does not compute exactly is refused with an error naming it.
#[test]
fn what_is_not_computed_is_refused_by_name() {
    let source = fixtures().into_iter().find(|d| d.ends_with("saelens-topk")).unwrap();
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("cfg.json")).unwrap()).unwrap();
    let cases: [(&str, serde_json::Value); 10] = [
        ("rescale_acts_by_decoder_norm", serde_json::json!({"rescale_acts_by_decoder_norm": true})),
        ("architecture \"matryoshka_batchtopk\"", serde_json::json!({"architecture": "matryoshka_batchtopk"})),
        (
            "normalize_activations \"covariance_whitening\"",
            serde_json::json!({"normalize_activations": "covariance_whitening"}),
        ),
        ("hook_head_index 3", serde_json::json!({"hook_head_index": 3})),
        ("reshape_activations \"hook_z\"", serde_json::json!({"reshape_activations": "hook_z"})),
        ("activation_fn \"tanh-relu\"", serde_json::json!({"activation_fn": "tanh-relu"})),
        // A setting of another type is refused naming it, not read as its default.
        ("cfg.json: architecture 3 is not a string", serde_json::json!({"architecture": 3})),
        (
            "rescale_acts_by_decoder_norm \"yes\" is not true or false",
            serde_json::json!({"rescale_acts_by_decoder_norm": "yes"}),
        ),
        ("reshape_activations [\"hook_z\"] is not a string", serde_json::json!({"reshape_activations": ["hook_z"]})),
        ("d_in \"64\" is not a count", serde_json::json!({"d_in": "64"})),
    ];
    for (want, edit) in cases {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = cfg.clone();
        for (k, v) in edit.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        std::fs::write(dir.path().join("cfg.json"), cfg.to_string()).unwrap();
        std::fs::copy(source.join("sae_weights.safetensors"), dir.path().join("sae_weights.safetensors")).unwrap();
        let err = Dictionary::open(dir.path(), None).expect_err(want).to_string();
        assert!(err.contains(want), "{err:?} lacks {want:?}");
    }
    // sparsify's settings likewise (a transcoder read as an SAE would subtract b_dec).
    let sparsify = fixtures().into_iter().find(|d| d.ends_with("sparsify/layers.1")).unwrap();
    let copy = tempfile::tempdir().unwrap();
    let dir = copy.path().join("layers.1");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(sparsify.join("sae.safetensors"), dir.join("sae.safetensors")).unwrap();
    for (edit, want) in [
        (serde_json::json!({"transcode": "true"}), "transcode \"true\" is not true or false"),
        (serde_json::json!({"activation": null, "k": 6.5}), "k 6.5 is not a count"),
    ] {
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(sparsify.join("cfg.json")).unwrap()).unwrap();
        cfg.as_object_mut().unwrap().extend(edit.as_object().unwrap().clone());
        std::fs::write(dir.join("cfg.json"), cfg.to_string()).unwrap();
        let err = Dictionary::open(&dir, None).unwrap_err().to_string();
        assert!(err.contains(want), "{err:?} lacks {want:?}");
    }
    let empty = tempfile::tempdir().unwrap();
    let err = Dictionary::open(empty.path(), None).unwrap_err().to_string();
    assert!(err.contains("not a dictionary siphon reads"), "{err}");
    let err = Dictionary::open(&source, Some("blocks.0.hook_resid_post")).unwrap_err().to_string();
    assert!(err.contains("trained on blocks.1.hook_resid_post, not blocks.0.hook_resid_post"), "{err}");

    // Gemma Scope's file names no hook: outside the Hub's layout the caller names it.
    let gemma = fixtures().into_iter().find(|d| d.to_string_lossy().contains("gemma-scope")).unwrap();
    let moved = tempfile::tempdir().unwrap();
    std::fs::copy(gemma.join("params.npz"), moved.path().join("params.npz")).unwrap();
    let err = Dictionary::open(moved.path(), None).unwrap_err().to_string();
    assert!(err.contains("name the hook"), "{err}");
    let named = Dictionary::open(moved.path(), Some("blocks.1.hook_resid_post")).unwrap();
    assert_eq!(named.tensors, Dictionary::open(&gemma, None).unwrap().tensors);
}

/// The Llama Scope fixture in a temporary directory, `hyperparams.json` edited by `edit`
/// (a null removes the field).
fn llama_scope_copy(edit: &serde_json::Value) -> tempfile::TempDir {
    let source = fixtures().into_iter().find(|d| d.ends_with("llama-scope/tiny-llama-L1R")).unwrap();
    let mut hp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("hyperparams.json")).unwrap()).unwrap();
    for (k, v) in edit.as_object().unwrap() {
        if v.is_null() {
            hp.as_object_mut().unwrap().remove(k);
        } else {
            hp[k] = v.clone();
        }
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("checkpoints")).unwrap();
    std::fs::write(dir.path().join("hyperparams.json"), hp.to_string()).unwrap();
    let weights = "checkpoints/final.safetensors";
    std::fs::copy(source.join(weights), dir.path().join(weights)).unwrap();
    dir
}

/// Llama Scope: what lm-saes's loader of the release does not compute as siphon reads it is
/// refused by name, and so is lm-saes's later layout.
#[test]
fn llama_scope_refuses_what_it_does_not_read_by_name() {
    use serde_json::json;
    let cases = [
        ("act_fn \"topk\": only jumprelu", json!({"act_fn": "topk"})),
        ("act_fn \"relu\"", json!({"act_fn": null})),
        ("jump_relu_threshold -0.5", json!({"jump_relu_threshold": -0.5})),
        ("norm_activation \"token-wise\"", json!({"norm_activation": null})),
        ("norm_activation \"batch-wise\"", json!({"norm_activation": "batch-wise"})),
        ("dataset-wise without dataset_average_activation_norm.in", json!({"dataset_average_activation_norm": null})),
        (
            "dataset_average_activation_norm.out 0 is not a norm",
            json!({"dataset_average_activation_norm": {"in": 2.0, "out": 0.0}}),
        ),
        ("apply_decoder_bias_to_pre_encoder", json!({"apply_decoder_bias_to_pre_encoder": true})),
        ("apply_decoder_bias_to_pre_encoder", json!({"apply_decoder_bias_to_pre_encoder": null})),
        ("use_glu_encoder", json!({"use_glu_encoder": true})),
        ("names no hook_point_in", json!({"hook_point_in": null})),
        ("d_sae is 128", json!({"d_sae": 128})),
    ];
    for (want, edit) in cases {
        let dir = llama_scope_copy(&edit);
        let err = Dictionary::open(dir.path(), None).expect_err(want).to_string();
        assert!(err.contains("Llama Scope dictionary") && err.contains(want), "{err:?} lacks {want:?}");
    }
    // A checkpoint lm-saes's loader reads first.
    let dir = llama_scope_copy(&json!({}));
    std::fs::copy(dir.path().join("checkpoints/final.safetensors"), dir.path().join("checkpoints/pruned.safetensors"))
        .unwrap();
    let err = Dictionary::open(dir.path(), None).unwrap_err().to_string();
    assert!(err.contains("lm-saes reads checkpoints/pruned.safetensors before checkpoints/final.safetensors"), "{err}");
    // The hook it names, not another.
    let dir = llama_scope_copy(&json!({}));
    let err = Dictionary::open(dir.path(), Some("blocks.1.hook_mlp_out")).unwrap_err().to_string();
    assert!(err.contains("trained on blocks.1.hook_resid_post, not blocks.1.hook_mlp_out"), "{err}");
    // lm-saes's later layout (Llama Scope R1 Distill).
    let later = tempfile::tempdir().unwrap();
    std::fs::write(later.path().join("config.json"), r#"{"sae_type": "sae", "d_model": 64}"#).unwrap();
    let err = Dictionary::open(later.path(), None).unwrap_err().to_string();
    assert!(err.contains("lm-saes's later layout"), "{err}");
}

/// Llama Scope's fixture tells lm-saes's folds apart: leaving out the dataset-wise input scale
/// (`inference`) or the decoder's norms fires other latents than the golden's on many tokens,
/// more than `every_architecture_encodes_as_its_library_does` lets pass.
#[test]
fn llama_scope_golden_needs_the_input_scale_and_the_decoder_norms() {
    let client = client();
    let golden_dir = fixtures().into_iter().find(|d| d.ends_with("llama-scope/tiny-llama-L1R")).unwrap();
    let bytes = std::fs::read(golden_dir.join("golden.safetensors")).unwrap();
    let golden = SafeTensors::deserialize(&bytes).unwrap();
    let (shape, x) = f32s(&golden, "x");
    let (_, want) = f32s(&golden, "latents");
    let read = Dictionary::open(&golden_dir, None).unwrap();
    assert_eq!(
        (read.encoder, read.normalize, read.subtract_b_dec),
        (Encoder::JumpRelu, siphon_models::dictionary::Normalize::None, false)
    );
    for edit in [
        serde_json::json!({"norm_activation": "inference"}),
        serde_json::json!({"sparsity_include_decoder_norm": false}),
    ] {
        let dir = llama_scope_copy(&edit);
        let dict = Dictionary::open(dir.path(), None).unwrap();
        let (indices, _, count) = encode(&client, &dict, &x, shape[0], dict.d_sae);
        let mut differ = 0;
        for t in 0..shape[0] {
            let mut got: Vec<i32> = indices[t * dict.d_sae..][..count[t] as usize].to_vec();
            got.sort();
            let fired: Vec<i32> =
                (0..dict.d_sae).filter(|&i| want[t * dict.d_sae + i] > 0.0).map(|i| i as i32).collect();
            differ +=
                got.iter().filter(|i| !fired.contains(i)).count() + fired.iter().filter(|i| !got.contains(i)).count();
        }
        assert!(differ > 10, "{edit}: only {differ} firings differ from lm-saes's");
    }
    // A transcoder's output norm: the decoder is scaled by s_in / s_out = out / in before its
    // norms are taken, so an `out` twice the `in` doubles every latent's weights.
    let hp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden_dir.join("hyperparams.json")).unwrap()).unwrap();
    let norm_in = hp["dataset_average_activation_norm"]["in"].as_f64().unwrap();
    let dir = llama_scope_copy(
        &serde_json::json!({"dataset_average_activation_norm": {"in": norm_in, "out": 2.0 * norm_in}}),
    );
    let doubled = Dictionary::open(dir.path(), None).unwrap();
    for (a, b) in read.tensors.iter().zip(&doubled.tensors).filter(|(a, _)| a.name != "threshold") {
        for (v, w) in a.values.iter().zip(&b.values) {
            assert!((2.0 * v - w).abs() <= 1e-6 * v.abs().max(1.0), "{}: {w} is not twice {v}", a.name);
        }
    }
}

/// Every dictionary fixture read inside tiny-llama's forward, from the hook it names, on the
/// tokens TransformerLens ran (right-padded rows): the latents of each row's real tokens equal
/// the library's on TransformerLens's values, within 1e-4 of their scale, firings included.
#[test]
fn latents_inside_the_forward_equal_the_librarys_on_the_models_tokens() {
    use siphon_models::{DictionaryHook, ForwardSpec, HookKind, HookPoint, LoadedModel, build_forward};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/tiny-llama");
    let model = LoadedModel::open(&root).unwrap();
    let bytes = std::fs::read(root.join("golden-tl.safetensors")).unwrap();
    let tl = SafeTensors::deserialize(&bytes).unwrap();
    let ids_t = tl.tensor("input_ids").unwrap();
    let (batch, seq) = (ids_t.shape()[0], ids_t.shape()[1]);
    let ints = |name: &str| -> Vec<i32> {
        let t = tl.tensor(name).unwrap();
        match t.dtype() {
            safetensors::Dtype::I64 => {
                t.data().chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap()) as i32).collect()
            }
            _ => t.data().chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect(),
        }
    };
    let (ids, lengths) = (ints("input_ids"), ints("lengths"));
    let mask: Vec<i32> = (0..batch * seq).map(|i| i32::from(((i % seq) as i32) < lengths[i / seq])).collect();
    let positions: Vec<i32> = (0..batch * seq).map(|i| (i % seq) as i32).collect();

    let dicts: Vec<(Dictionary, Vec<f32>)> = fixtures()
        .into_iter()
        .map(|dir| {
            let golden = std::fs::read(dir.join("golden.safetensors")).unwrap();
            let latents = f32s(&SafeTensors::deserialize(&golden).unwrap(), "latents").1;
            (Dictionary::open(&dir, None).unwrap(), latents)
        })
        .collect();
    let dictionaries: Vec<DictionaryHook> = dicts
        .iter()
        .map(|(d, _)| DictionaryHook {
            hook: HookPoint::parse(&d.hook, &model.config).unwrap(),
            dictionary: Arc::new(d.clone()),
            cap: d.d_sae,
        })
        .collect();
    let client = client();
    // One device, and a 3 x 2 mesh (a row per `data` device, heads over `model`).
    let mesh = siphon_mesh::Mesh::new(&[("data", 3), ("model", 2)], (0..6).collect()).unwrap();
    for on_mesh in [false, true] {
        let mut spec = ForwardSpec::new(batch, seq, vec![HookPoint::block(1, HookKind::ResidPost)]);
        if on_mesh {
            spec = spec.with_megatron_plan(&model.config, mesh.clone());
        }
        spec.dictionaries = dictionaries.clone();
        let program = build_forward(&model.config, &spec).unwrap();
        assert_eq!(program.latents.len(), dicts.len());
        let mut arrays = Vec::new();
        for p in &program.params {
            let values = model.weights.load(p, siphon_models::DType::F32).unwrap().to_f32_vec();
            arrays.push(HostArray::from_slice(&p.shape, &values).unwrap());
        }
        for data in [&ids, &mask, &positions] {
            arrays.push(HostArray::from_slice(&[batch, seq], data).unwrap());
        }
        for (d, _) in &dicts {
            for t in &d.tensors {
                arrays.push(HostArray::from_slice(&t.shape, &t.values).unwrap());
            }
        }
        let results: Vec<Vec<f32>> = if on_mesh {
            let exe = client.compile(&program.text, &CompileOptions::spmd(&mesh)).unwrap();
            let replicated: Vec<siphon_mesh::PartitionSpec> = dicts
                .iter()
                .flat_map(|(d, _)| d.tensors.iter().map(|t| siphon_mesh::PartitionSpec::replicated(t.shape.len())))
                .collect();
            let specs = program.param_specs.iter().chain(program.inputs.iter().map(|i| &i.spec)).chain(&replicated);
            let args: Vec<_> =
                arrays.iter().zip(specs).map(|(a, s)| client.upload_sharded(a, s, &mesh).unwrap()).collect();
            let mut out_specs: Vec<_> = program.outputs.iter().map(|o| o.spec.clone()).collect();
            out_specs.extend(program.latents.iter().flat_map(siphon_models::LatentsInfo::result_specs));
            let out = exe.execute_sharded(&mesh, &args.iter().collect::<Vec<_>>(), &out_specs).unwrap();
            out.iter().map(|a| a.to_host().unwrap().to_f32()).collect()
        } else {
            let exe = client.compile(&program.text, &CompileOptions::single_device(None)).unwrap();
            let device = exe.device_ids()[0];
            let args: Vec<_> = arrays.iter().map(|a| client.upload(a, device).unwrap()).collect();
            let out = exe.execute(&[args.iter().collect()]).unwrap();
            out[0].iter().map(|b| b.to_host().unwrap().to_f32()).collect()
        };
        check_latents(&dicts, &results, &lengths, seq, on_mesh);
    }
}

fn check_latents(dicts: &[(Dictionary, Vec<f32>)], results: &[Vec<f32>], lengths: &[i32], seq: usize, on_mesh: bool) {
    assert_eq!(results.len(), 1 + 3 * dicts.len());
    for (i, (d, want)) in dicts.iter().enumerate() {
        let (indices, values, count) = (&results[1 + 3 * i], &results[2 + 3 * i], &results[3 + 3 * i]);
        let n = d.d_sae;
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let mut got = Vec::new();
        for (row, &len) in lengths.iter().enumerate() {
            for pos in 0..len as usize {
                let token = row * seq + pos;
                let mut dense = vec![0f32; n];
                for j in 0..n {
                    if indices[token * n + j] >= 0.0 {
                        dense[indices[token * n + j] as usize] = values[token * n + j];
                    }
                }
                assert_eq!(dense.iter().filter(|&&v| v > 0.0).count(), count[token] as usize, "{}", d.name);
                got.extend(dense);
            }
        }
        assert_eq!(got.len(), want.len(), "{}", d.name);
        let worst = got.iter().zip(want).fold(0f32, |m, (g, w)| {
            // A NaN counts as infinitely far (`max` would drop it).
            let e = (g - w).abs();
            if e.is_nan() { f32::INFINITY } else { m.max(e) }
        });
        assert!(
            worst <= 1e-4 * scale,
            "{} (mesh: {on_mesh}): latents {worst} from the library's (scale {scale})",
            d.name
        );
        let differ = got.iter().zip(want).filter(|(g, w)| (**g > 0.0) != (**w > 0.0)).count();
        assert_eq!(differ, 0, "{} (mesh: {on_mesh}): firings differ from the library's", d.name);
    }
}

/// Every fixture's decoder as the dashboards read it (`dictionary::decoder`): `[d_sae,
/// d_out]` with the encoder's latents, the values of the file's own `W_dec` (SAELens's and
/// sparsify's safetensors, Gemma Scope's npz); Llama Scope's, stored rescaled, refused by name.
#[test]
fn every_decoder_is_read_as_its_file_stores_it() {
    for dir in fixtures() {
        let dict = Dictionary::open(&dir, None).unwrap();
        let read = siphon_models::dictionary::decoder(&dir);
        if dir.to_string_lossy().contains("llama-scope") {
            let err = read.unwrap_err().to_string();
            assert!(err.contains("Llama Scope"), "{}: {err}", dir.display());
            continue;
        }
        let w = read.unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        assert_eq!(w.shape, [dict.d_sae, 64], "{}", dir.display());
        let file =
            ["sae_weights.safetensors", "sae.safetensors"].into_iter().map(|f| dir.join(f)).find(|p| p.is_file());
        if let Some(file) = file {
            let bytes = std::fs::read(&file).unwrap();
            let (shape, values) = f32s(&SafeTensors::deserialize(&bytes).unwrap(), "W_dec");
            assert_eq!((shape, values), (w.shape.clone(), w.values.clone()), "{}", dir.display());
        }
    }
}
