//! Loading the committed fixtures (HF directories written by transformers) and the SmolLM2
//! GGUF, and clear errors for damaged copies of them.

use std::path::PathBuf;

use siphon_models::{DType, LoadedModel, ModelError};

mod support {
    pub mod copies;
}
use support::copies::{copy_dir, fixtures};

fn fixture(name: &str) -> PathBuf {
    fixtures().join("models").join(name)
}

fn smollm2_gguf() -> Option<PathBuf> {
    match std::env::var_os("SIPHON_SMOLLM2_GGUF") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            eprintln!("note: SIPHON_SMOLLM2_GGUF unset (scripts/setup-model.sh); skipping the SmolLM2 part");
            None
        }
    }
}

#[test]
fn tiny_llama_dir_loads() {
    let m = LoadedModel::open(&fixture("tiny-llama")).unwrap();
    assert_eq!(m.config.arch.name(), "llama");
    assert!(m.config.tie_word_embeddings);
    assert!(m.config.rope.scaling.is_some(), "Llama-3 rope scaling from rope_parameters");
    m.check_weights(m.config.n_layers).unwrap();
    let t = m.weights.get("model.embed_tokens.weight", DType::F32).unwrap();
    assert!(matches!(t.data, std::borrow::Cow::Borrowed(_)), "f32 → f32 is a view of the map");
    assert_eq!(t.shape, vec![256, 64]);
    let bf = m.weights.get("model.embed_tokens.weight", DType::Bf16).unwrap();
    let (a, b) = (t.to_f32_vec(), bf.to_f32_vec());
    assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= x.abs() / 128.0));
}

#[test]
fn tiny_qwen2_sharded_index_loads() {
    let m = LoadedModel::open(&fixture("tiny-qwen2")).unwrap();
    assert_eq!(m.config.arch.name(), "qwen2");
    assert!(!m.config.tie_word_embeddings && m.config.attention.qkv_bias);
    m.check_weights(m.config.n_layers).unwrap();
    // Tensors come from both shards.
    assert!(m.weights.names().contains("lm_head.weight"));
    assert_eq!(m.weights.meta("model.layers.0.self_attn.k_proj.bias").unwrap().shape, vec![32]);
}

#[test]
fn damaged_safetensors_give_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    copy_dir(&fixture("tiny-llama"), &dir);
    let file = dir.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    // Truncated anywhere: header, data.
    for cut in [0, 5, 8, 100, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&file, &bytes[..cut]).unwrap();
        let err = LoadedModel::open(&dir).unwrap_err();
        assert!(matches!(err, ModelError::Corrupt { .. }), "cut {cut}: {err}");
        assert!(err.to_string().contains("model.safetensors"), "{err}");
    }
    // Garbage header.
    let mut bad = bytes.clone();
    bad[8] = b'!';
    std::fs::write(&file, &bad).unwrap();
    assert!(matches!(LoadedModel::open(&dir), Err(ModelError::Corrupt { .. })));
    // Missing weights file.
    std::fs::remove_file(&file).unwrap();
    let err = LoadedModel::open(&dir).unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    // Missing config.
    let err = LoadedModel::open(tmp.path()).unwrap_err();
    assert!(err.to_string().contains("config.json"), "{err}");
}

#[test]
fn damaged_sharded_index_gives_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("q");
    copy_dir(&fixture("tiny-qwen2"), &dir);
    let index = dir.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    // The index promises a tensor no shard has.
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00002.safetensors".into();
    std::fs::write(&index, json.to_string()).unwrap();
    let err = LoadedModel::open(&dir).unwrap_err();
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err}");
    assert!(err.to_string().contains("model.layers.9.mlp.up_proj.weight"), "{err}");
    // A shard is gone.
    std::fs::write(&index, &text).unwrap();
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    let err = LoadedModel::open(&dir).unwrap_err();
    assert!(matches!(err, ModelError::Io { .. }), "{err}");
    assert!(err.to_string().contains("model-00002-of-00002.safetensors"), "{err}");
    // Not JSON.
    std::fs::write(&index, "{").unwrap();
    let err = LoadedModel::open(&dir).unwrap_err();
    assert!(err.to_string().contains("index.json"), "{err}");
}

#[test]
fn config_shape_mismatch_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    copy_dir(&fixture("tiny-llama"), &dir);
    let cfg = dir.join("config.json");
    let text =
        std::fs::read_to_string(&cfg).unwrap().replace("\"intermediate_size\": 128", "\"intermediate_size\": 96");
    std::fs::write(&cfg, text).unwrap();
    let m = LoadedModel::open(&dir).unwrap();
    let err = m.check_weights(3).unwrap_err();
    assert!(matches!(err, ModelError::ShapeMismatch { .. }), "{err}");
    assert!(err.to_string().contains("mlp.gate_proj.weight") && err.to_string().contains("[96, 64]"), "{err}");
}

#[test]
fn smollm2_gguf_config_and_tokenizer_match_hf() {
    let Some(path) = smollm2_gguf() else { return };
    let m = LoadedModel::open(&path).unwrap();
    let c = &m.config;
    assert_eq!(
        (c.n_layers, c.hidden_size, c.attention.n_heads, c.attention.n_kv_heads, c.attention.head_dim),
        (30, 576, 9, 3, 64)
    );
    assert_eq!((c.vocab_size, c.intermediate_size, c.rope.theta), (49152, 1536, 100000.0));
    assert!(c.tie_word_embeddings);
    m.check_weights(c.n_layers).unwrap();
    let tok = m.tokenizer.as_ref().expect("GGUF has a tokenizer");
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("smollm2/token_ids.json")).unwrap()).unwrap();
    let texts = golden["texts"].as_array().unwrap();
    let ids = golden["ids"].as_array().unwrap();
    assert!(texts.len() >= 5);
    for (text, want) in texts.iter().zip(ids) {
        let want: Vec<u32> = want.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let text = text.as_str().unwrap();
        assert_eq!(tok.encode(text).unwrap(), want, "text {text:?}");
    }
}

#[test]
fn dequantization_matches_the_gguf_reference_on_random_blocks() {
    use siphon_models::gguf::{GgmlType, dequant};
    let bytes = std::fs::read(fixture("quant/blocks.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (name, ty) in [
        ("Q8_0", GgmlType::Q8_0),
        ("Q4_0", GgmlType::Q4_0),
        ("Q4_1", GgmlType::Q4_1),
        ("Q4_K", GgmlType::Q4K),
        ("Q6_K", GgmlType::Q6K),
    ] {
        let raw = st.tensor(&format!("{name}.raw")).unwrap();
        let want: Vec<f32> = st
            .tensor(&format!("{name}.f32"))
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let mut got = vec![f32::NAN; want.len()];
        dequant::dequantize(ty, raw.data(), &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "{name} element {i}: {g} vs reference {w}");
        }
    }
}

#[test]
fn sentencepiece_gguf_tokenizer_matches_hf() {
    // A tiny llama-vocabulary GGUF without merges (they are derived from the scores), byte
    // fallback pieces and control tokens, with transformers' ids (scripts/gen-fixtures.sh).
    let file = siphon_models::gguf::GgufFile::open(&fixture("spm/tiny-spm.gguf")).unwrap();
    let tok = siphon_models::TextTokenizer::from_gguf(&file).unwrap();
    assert_eq!((tok.bos_id, tok.eos_id), (Some(1), Some(2)));
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("spm/token_ids.json")).unwrap()).unwrap();
    for (text, want) in golden["texts"].as_array().unwrap().iter().zip(golden["ids"].as_array().unwrap()) {
        let want: Vec<u32> = want.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let text = text.as_str().unwrap();
        assert_eq!(tok.encode(text).unwrap(), want, "text {text:?}");
    }
}

#[test]
fn hf_dir_tokenizer_follows_tokenizer_config_like_transformers() {
    let file = siphon_models::gguf::GgufFile::open(&fixture("spm/tiny-spm.gguf")).unwrap();
    let built = siphon_models::TextTokenizer::from_gguf(&file).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("tokenizer.json"), built.inner().to_string(false).unwrap()).unwrap();
    // No tokenizer_config.json: tokenizer.json's own post-processor (BOS) is kept.
    let tok = siphon_models::TextTokenizer::from_hf_dir(tmp.path()).unwrap().unwrap();
    let plain = tok.encode("the dog").unwrap();
    assert_eq!(plain[0], 1);
    // Explicit flags rebuild it: no BOS, EOS appended (transformers' update_post_processor).
    std::fs::write(
        tmp.path().join("tokenizer_config.json"),
        r#"{"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": false, "add_eos_token": true}"#,
    )
    .unwrap();
    let tok = siphon_models::TextTokenizer::from_hf_dir(tmp.path()).unwrap().unwrap();
    assert_eq!((tok.bos_id, tok.eos_id), (Some(1), Some(2)));
    let ids = tok.encode("the dog").unwrap();
    assert_eq!(ids, [&plain[1..], &[2]].concat());
    // A flag of another type is refused by name, not taken as absent (which keeps the BOS).
    std::fs::write(tmp.path().join("tokenizer_config.json"), r#"{"add_bos_token": "false"}"#).unwrap();
    let err = siphon_models::TextTokenizer::from_hf_dir(tmp.path()).unwrap_err().to_string();
    assert!(err.contains("tokenizer_config.json: add_bos_token \"false\" is not true or false"), "{err}");
    // A broken tokenizer_config.json is named.
    std::fs::write(tmp.path().join("tokenizer_config.json"), "{").unwrap();
    let err = siphon_models::TextTokenizer::from_hf_dir(tmp.path()).unwrap_err();
    assert!(err.to_string().contains("tokenizer_config.json"), "{err}");
}

/// The same bits, or both NaN.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

/// GPT-OSS's experts stored as the hub stores them (MXFP4 blocks and scales): read to exactly
/// the values transformers' `convert_moe_packed_tensors` gives (its parameter layout, `x @ W`,
/// against siphon's `[out, in]` halves), in f32 and bf16 (every byte under the extreme scales:
/// `mxfp4.rs`'s tests, the overflowing ones being refused by `Weights`).
#[test]
fn mxfp4_experts_read_to_transformers_values_bit_for_bit() {
    let dir = fixture("tiny-gpt-oss-mxfp4");
    let m = LoadedModel::open(&dir).unwrap();
    assert!(m.config.extras.get::<siphon_models::GptOss>().unwrap().mxfp4);
    m.check_weights(m.config.n_layers).unwrap();
    let want = siphon_models::Weights::from_safetensors_file(&dir.join("dequantized.safetensors")).unwrap();
    let params = m.config.params(m.config.n_layers, false);
    let param = |name: &str| params.iter().find(|p| p.name == name).unwrap();
    let (e, i, h) = (4, 32, 64);
    for l in 0..m.config.n_layers {
        let p = |s: &str| format!("model.layers.{l}.mlp.experts.{s}");
        // transformers: gate_up_proj [E, H, 2I] with gate and up interleaved; down_proj [E, I, H].
        let gate_up = want.get(&p("gate_up_proj"), DType::F32).unwrap().to_f32_vec();
        let down = want.get(&p("down_proj"), DType::F32).unwrap().to_f32_vec();
        for dtype in [DType::F32, DType::Bf16] {
            for (part, start) in [("gate", 0), ("up", 1)] {
                let got = m.weights.load(param(&p(&format!("gate_up_proj[{part}]"))), dtype).unwrap().to_f32_vec();
                let theirs: Vec<f32> = (0..e * i * h)
                    .map(|n| {
                        let (x, r, c) = (n / (i * h), n / h % i, n % h);
                        gate_up[(x * h + c) * 2 * i + 2 * r + start]
                    })
                    .collect();
                assert!(same_bits(&got, &theirs), "layer {l} {part} ({dtype:?})");
            }
            let got = m.weights.load(param(&p("down_proj")), dtype).unwrap().to_f32_vec();
            let theirs: Vec<f32> = (0..e * h * i).map(|n| down[(n / (h * i) * i + n % i) * h + n / i % h]).collect();
            assert!(same_bits(&got, &theirs), "layer {l} down ({dtype:?})");
        }
    }
}

/// FP8 block-scaled projections (`quantization_config` `fp8`: F8_E4M3 beside an f32
/// `weight_scale_inv` per 16 × 16 block) read to exactly the values transformers' own
/// dequantization gives, in f32, and its bf16 rounding of them in bf16.
#[test]
fn fp8_block_scaled_weights_read_to_transformers_values_bit_for_bit() {
    let m = check_fp8_bits("tiny-qwen3-fp8");
    assert!(m.weights.meta("model.layers.0.mlp.up_proj.weight").unwrap().stored.contains("F8_E4M3"));
}

/// DeepSeek-V3's FP8 form: 16 × 16 blocks (the config's `weight_block_size`) with partial
/// blocks where a projection is not a whole number of them (its grid rounded up), every
/// expert's projections stored FP8 too: transformers' `_dequantize_fp8_weight` values.
#[test]
fn deepseek_fp8_with_partial_blocks_reads_to_transformers_values_bit_for_bit() {
    let m = check_fp8_bits("tiny-deepseek-v3-fp8");
    let meta = m.weights.meta("model.layers.0.self_attn.kv_a_proj_with_mqa.weight").unwrap();
    assert_eq!((meta.shape, meta.stored.contains("F8_E4M3")), (vec![24, 64], true));
    // Without the config's block size a grid that does not divide its weight is refused,
    // naming it (o_proj: 40 columns in 3 blocks of 16).
    let dir = fixture("tiny-deepseek-v3-fp8");
    let raw = siphon_models::Weights::from_safetensors_file(&dir.join("model.safetensors")).unwrap();
    let Err(err) = raw.get("model.layers.0.self_attn.o_proj.weight", DType::F32) else {
        panic!("a partial grid read without its block size")
    };
    let err = err.to_string();
    assert!(err.contains("o_proj") && err.contains("[4, 3] scale grid"), "{err}");
}

/// Every tensor of `name`'s `dequantized.safetensors` (transformers' values) read from its
/// FP8 checkpoint bit for bit in f32, and rounded once in bf16; returns the model.
fn check_fp8_bits(name: &str) -> LoadedModel {
    let dir = fixture(name);
    let m = LoadedModel::open(&dir).unwrap();
    m.check_weights(m.config.n_layers).unwrap();
    let want = siphon_models::Weights::from_safetensors_file(&dir.join("dequantized.safetensors")).unwrap();
    let names = want.names();
    for tensor in &names {
        let theirs = want.get(tensor, DType::F32).unwrap().to_f32_vec();
        let got = m.weights.get(tensor, DType::F32).unwrap().to_f32_vec();
        assert!(same_bits(&got, &theirs), "{tensor}");
        let bf16: Vec<f32> = theirs.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
        assert!(same_bits(&m.weights.get(tensor, DType::Bf16).unwrap().to_f32_vec(), &bf16), "{tensor} in bf16");
    }
    // Every projection the forward reads (each expert's included) is among them.
    let projections: Vec<String> = m
        .config
        .params(m.config.n_layers, false)
        .into_iter()
        .flat_map(|p| if p.stack.is_empty() { vec![p.name] } else { p.stack })
        .filter(|n| n.ends_with("proj.weight") || n.ends_with("proj_with_mqa.weight"))
        .collect();
    assert!(!projections.is_empty());
    for p in projections {
        assert!(names.contains(&p), "{p} is not stored FP8");
    }
    m
}

/// UE8M0 scales (powers of two, DeepSeek-V3.1's `scale_fmt` ue8m0): stored as F8_E8M0 (with
/// partial 16 × 16 blocks) or as U8 exponent bytes, read to transformers' values bit for bit.
#[test]
fn fp8_with_ue8m0_scales_reads_to_transformers_values_bit_for_bit() {
    let dir = fixture("quant");
    let weights = siphon_models::Weights::from_safetensors_file(&dir.join("fp8-ue8m0.safetensors"))
        .unwrap()
        .with_fp8_block(Some([16, 16]));
    let want = siphon_models::Weights::from_safetensors_file(&dir.join("fp8-ue8m0.expected.safetensors")).unwrap();
    for name in ["a.weight", "b.weight"] {
        let got = weights.get(name, DType::F32).unwrap().to_f32_vec();
        let theirs = want.get(name, DType::F32).unwrap().to_f32_vec();
        assert!(same_bits(&got, &theirs), "{name}");
        assert!(weights.meta(name).unwrap().stored.contains("F8_E4M3"), "{name}");
    }
}
