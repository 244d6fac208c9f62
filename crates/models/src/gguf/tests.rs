//! Crafted GGUF files: a tiny valid llama file and corruptions of it.

use super::*;
use crate::error::ModelError;
use crate::hf::LoadedModel;
use crate::tokenizer::TextTokenizer;
use crate::weights::DType;

/// A minimal GGUF writer for tests.
pub(crate) struct Writer {
    kv: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

fn gstr(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

impl Writer {
    pub(crate) fn new() -> Writer {
        Writer { kv: Vec::new(), tensors: Vec::new() }
    }
    pub(crate) fn u32(mut self, k: &str, v: u32) -> Self {
        self.kv.push((k.into(), 4, v.to_le_bytes().to_vec()));
        self
    }
    pub(crate) fn f32(mut self, k: &str, v: f32) -> Self {
        self.kv.push((k.into(), 6, v.to_le_bytes().to_vec()));
        self
    }
    pub(crate) fn bool(mut self, k: &str, v: bool) -> Self {
        self.kv.push((k.into(), 7, vec![v as u8]));
        self
    }
    pub(crate) fn str(mut self, k: &str, v: &str) -> Self {
        self.kv.push((k.into(), 8, gstr(v)));
        self
    }
    pub(crate) fn strs(mut self, k: &str, v: &[&str]) -> Self {
        let mut b = 8u32.to_le_bytes().to_vec();
        b.extend((v.len() as u64).to_le_bytes());
        for s in v {
            b.extend(gstr(s));
        }
        self.kv.push((k.into(), 9, b));
        self
    }
    pub(crate) fn i32s(mut self, k: &str, v: &[i32]) -> Self {
        let mut b = 5u32.to_le_bytes().to_vec();
        b.extend((v.len() as u64).to_le_bytes());
        for x in v {
            b.extend(x.to_le_bytes());
        }
        self.kv.push((k.into(), 9, b));
        self
    }
    /// A tensor with ggml dims (fastest first) and raw data.
    pub(crate) fn tensor(mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> Self {
        self.tensors.push((name.into(), dims.to_vec(), ty, data));
        self
    }
    pub(crate) fn f32_tensor(self, name: &str, dims: &[u64], values: &[f32]) -> Self {
        let data = values.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.tensor(name, dims, 0, data)
    }
    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kv.len() as u64).to_le_bytes());
        for (k, ty, v) in &self.kv {
            out.extend(gstr(k));
            out.extend(ty.to_le_bytes());
            out.extend(v);
        }
        let mut offset = 0u64;
        for (name, dims, ty, data) in &self.tensors {
            out.extend(gstr(name));
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += (data.len() as u64).div_ceil(32) * 32;
        }
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        for (_, _, _, data) in &self.tensors {
            out.extend(data);
            while !out.len().is_multiple_of(32) {
                out.push(0);
            }
        }
        out
    }
}

/// A 1-layer llama: hidden 4, 2 heads of 2, 1 kv head, ffn 8, vocab 6, tied embeddings.
/// Values are `base + index` so rows can be told apart.
pub(crate) fn tiny_llama() -> Writer {
    let vals = |base: f32, n: usize| (0..n).map(|i| base + i as f32).collect::<Vec<_>>();
    Writer::new()
        .str("general.architecture", "llama")
        .u32("llama.block_count", 1)
        .u32("llama.context_length", 64)
        .u32("llama.embedding_length", 4)
        .u32("llama.feed_forward_length", 8)
        .u32("llama.attention.head_count", 2)
        .u32("llama.attention.head_count_kv", 1)
        .f32("llama.rope.freq_base", 10000.0)
        .f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .str("tokenizer.ggml.model", "gpt2")
        .str("tokenizer.ggml.pre", "default")
        .strs("tokenizer.ggml.tokens", &["<s>", "a", "b", "ab", "Ġ", "Ġab"])
        .i32s("tokenizer.ggml.token_type", &[3, 1, 1, 1, 1, 1])
        .strs("tokenizer.ggml.merges", &["a b", "Ġ ab"])
        .u32("tokenizer.ggml.bos_token_id", 0)
        .bool("tokenizer.ggml.add_bos_token", true)
        .f32_tensor("token_embd.weight", &[4, 6], &vals(0.0, 24))
        .f32_tensor("blk.0.attn_norm.weight", &[4], &vals(1.0, 4))
        .f32_tensor("blk.0.attn_q.weight", &[4, 4], &vals(100.0, 16))
        .f32_tensor("blk.0.attn_k.weight", &[4, 2], &vals(200.0, 8))
        .f32_tensor("blk.0.attn_v.weight", &[4, 2], &vals(300.0, 8))
        .f32_tensor("blk.0.attn_output.weight", &[4, 4], &vals(400.0, 16))
        .f32_tensor("blk.0.ffn_norm.weight", &[4], &vals(2.0, 4))
        .f32_tensor("blk.0.ffn_gate.weight", &[4, 8], &vals(500.0, 32))
        .f32_tensor("blk.0.ffn_up.weight", &[4, 8], &vals(600.0, 32))
        .f32_tensor("blk.0.ffn_down.weight", &[8, 4], &vals(700.0, 32))
        .f32_tensor("output_norm.weight", &[4], &vals(3.0, 4))
}

fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn tiny_llama_loads_with_hf_names_config_and_permutation() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "tiny.gguf", &tiny_llama().bytes());
    let model = LoadedModel::open(&path).unwrap();
    let c = &model.config;
    assert_eq!(
        (c.hidden_size, c.n_layers, c.attention.n_heads, c.attention.n_kv_heads, c.attention.head_dim),
        (4, 1, 2, 1, 2)
    );
    assert_eq!((c.vocab_size, c.intermediate_size, c.max_position_embeddings), (6, 8, 64));
    assert!(c.tie_word_embeddings && !c.attention.qkv_bias);
    assert_eq!(c.rms_norm_eps, 1e-5f32 as f64);
    model.check_weights(1).unwrap();
    let w = &model.weights;
    let emb = w.get("model.embed_tokens.weight", DType::F32).unwrap();
    assert_eq!(emb.shape, vec![6, 4]);
    assert_eq!(emb.to_f32_vec()[5], 5.0);
    // q: 2 heads of head_dim 2 → half = 1: GGUF rows [r0, r1 | r2, r3] with rows (j=0,p=0),
    // (j=0,p=1) per head; the HF row p*half + j of head h comes from GGUF row h*2 + j*2 + p,
    // which for half = 1 is the identity. Use k with head_dim 2 as well: identity too. So
    // check v (never permuted) and the permutation itself on a wider head in convert.rs;
    // here check that values and shapes come through.
    let q = w.get("model.layers.0.self_attn.q_proj.weight", DType::F32).unwrap();
    assert_eq!(q.shape, vec![4, 4]);
    assert_eq!(q.to_f32_vec()[..4], [100.0, 101.0, 102.0, 103.0]);
    let down = w.get("model.layers.0.mlp.down_proj.weight", DType::Bf16).unwrap();
    assert_eq!(down.shape, vec![4, 8]);
    assert_eq!(down.to_f32_vec()[9], half::bf16::from_f32(709.0).to_f32());
    let tok = model.tokenizer.as_ref().unwrap();
    // BOS added (add_bos_token), "ab" merged, " ab" merged to "Ġab", "<s>" kept whole.
    assert_eq!(tok.encode("ab ab").unwrap(), vec![0, 3, 5]);
    assert_eq!(tok.encode("<s>b").unwrap(), vec![0, 0, 2]);
}

#[test]
fn wide_head_q_rows_are_unpermuted() {
    // One layer with head_dim 4 (half 2): q rows of head h come from GGUF rows
    // h*4 + [0, 2, 1, 3].
    let vals = |base: f32, n: usize| (0..n).map(|i| base + i as f32).collect::<Vec<_>>();
    let w = tiny_llama().u32("llama.embedding_length", 8).f32_tensor("blk.0.attn_q.weight", &[1, 8], &vals(0.0, 8));
    // Re-declaring keys is fine for the parser (last wins); only the q tensor matters here,
    // so read it directly through Weights with 2 heads.
    let mut w2 = Writer::new().str("general.architecture", "llama");
    w2.tensors = w.tensors.into_iter().filter(|t| t.0 == "blk.0.attn_q.weight" && t.1 == [1, 8]).collect();
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "q.gguf", &w2.bytes());
    let weights = crate::weights::Weights::from_gguf(GgufFile::open(&path).unwrap(), 2, 1, 0).unwrap();
    let q = weights.get("model.layers.0.self_attn.q_proj.weight", DType::F32).unwrap();
    assert_eq!(q.to_f32_vec(), vec![0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]);
}

#[test]
fn truncated_file_is_a_clear_error_at_every_length() {
    let bytes = tiny_llama().bytes();
    let dir = tempfile::tempdir().unwrap();
    // Every cut of the header and a few inside the data must fail cleanly, never panic. The
    // writer pads the last tensor (16 bytes) to 32, so cutting 17 bytes removes data.
    let header_end = bytes.len() - 200;
    for cut in (0..header_end).step_by(7).chain([bytes.len() - 17, bytes.len() - 40]) {
        let path = write(&dir, "cut.gguf", &bytes[..cut]);
        let err = GgufFile::open(&path).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ModelError::Corrupt { .. }), "cut {cut}: {msg}");
        assert!(msg.contains("cut.gguf"), "{msg}");
    }
    let path = write(&dir, "cut.gguf", &bytes[..bytes.len() - 40]);
    let msg = GgufFile::open(&path).unwrap_err().to_string();
    assert!(msg.contains("truncated"), "{msg}");
}

#[test]
fn corrupt_headers_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = tiny_llama().bytes();
    bytes[0] = b'X';
    let msg = GgufFile::open(&write(&dir, "a.gguf", &bytes)).unwrap_err().to_string();
    assert!(msg.contains("not a GGUF file"), "{msg}");
    // A huge string length in the first key.
    let mut bytes = tiny_llama().bytes();
    bytes[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    let msg = GgufFile::open(&write(&dir, "b.gguf", &bytes)).unwrap_err().to_string();
    assert!(msg.contains("exceeds the file"), "{msg}");
    // A huge tensor count.
    let mut bytes = tiny_llama().bytes();
    bytes[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(GgufFile::open(&write(&dir, "c.gguf", &bytes)), Err(ModelError::Corrupt { .. })));
    // Random garbage after a valid magic.
    let mut bytes = b"GGUF\x03\0\0\0".to_vec();
    bytes.extend((0..500u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8));
    assert!(GgufFile::open(&write(&dir, "d.gguf", &bytes)).is_err());
}

#[test]
fn unsupported_quant_and_arch_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = tiny_llama().tensor("blk.0.extra.weight", &[32], 13, vec![0; 176]).bytes();
    let err = GgufFile::open(&write(&dir, "q5k.gguf", &bytes)).unwrap_err();
    assert!(matches!(err, ModelError::UnsupportedQuant(_)), "{err}");
    assert!(err.to_string().contains("Q5_K"), "{err}");
    let bytes = tiny_llama().str("general.architecture", "bert").bytes();
    let err = LoadedModel::open(&write(&dir, "arch.gguf", &bytes)).unwrap_err();
    assert!(matches!(err, ModelError::UnsupportedArch(_)), "{err}");
    assert!(err.to_string().contains("\"bert\""), "{err}");
    // llama.cpp's SmolLM3, Gemma 4, the hybrids (Qwen3.5, Qwen3.5-MoE, Qwen3-Next) and OLMo 3
    // (an olmo2 file with a window) are refused by name.
    for arch in ["smollm3", "gemma4", "qwen35", "qwen35moe", "qwen3next"] {
        let bytes = tiny_llama().str("general.architecture", arch).bytes();
        let err = LoadedModel::open(&write(&dir, &format!("{arch}.gguf"), &bytes)).unwrap_err();
        assert!(err.to_string().contains(&format!("{arch:?}")), "{err}");
    }
    let bytes = tiny_llama().str("general.architecture", "olmo2").u32("olmo2.attention.sliding_window", 4096).bytes();
    let err = LoadedModel::open(&write(&dir, "olmo3.gguf", &bytes)).unwrap_err();
    assert!(err.to_string().contains("OLMo 3"), "{err}");
}

#[test]
fn missing_tensor_and_bad_shape_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = tiny_llama();
    w.tensors.retain(|t| t.0 != "blk.0.ffn_up.weight");
    let model = LoadedModel::open(&write(&dir, "miss.gguf", &w.bytes())).unwrap();
    let err = model.check_weights(1).unwrap_err();
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err}");
    assert!(err.to_string().contains("model.layers.0.mlp.up_proj.weight"), "{err}");
    let mut w = tiny_llama();
    for t in &mut w.tensors {
        if t.0 == "blk.0.ffn_up.weight" {
            t.1 = vec![8, 4];
        }
    }
    let model = LoadedModel::open(&write(&dir, "shape.gguf", &w.bytes())).unwrap();
    let err = model.check_weights(1).unwrap_err();
    assert!(matches!(err, ModelError::ShapeMismatch { .. }), "{err}");
    assert!(err.to_string().contains("[4, 8]"), "{err}");
}

#[test]
fn tokenizer_without_gpt2_model_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = tiny_llama().str("tokenizer.ggml.model", "bert").bytes();
    let file = GgufFile::open(&write(&dir, "tok.gguf", &bytes)).unwrap();
    let err = TextTokenizer::from_gguf(&file).unwrap_err();
    assert!(err.to_string().contains("\"bert\""), "{err}");
}

#[test]
fn metadata_of_another_type_or_out_of_its_range_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            tiny_llama().f32("llama.rope.freq_base", f32::NAN),
            "llama.rope.freq_base is F32(NaN), expected a finite number",
        ),
        (tiny_llama().f32("llama.rope.freq_base", f32::INFINITY), "llama.rope.freq_base is F32(inf)"),
        (tiny_llama().f32("llama.rope.freq_base", -1.0), "rope_theta (the RoPE base) -1"),
        (tiny_llama().f32("llama.attention.layer_norm_rms_epsilon", 0.0), "rms_norm_eps"),
        (tiny_llama().str("llama.attention.layer_norm_rms_epsilon", "1e-5"), "layer_norm_rms_epsilon is Str"),
        (tiny_llama().u32("llama.rope.scaling.type", 3), "llama.rope.scaling.type is U32(3), expected a string"),
        (tiny_llama().str("llama.rope.scaling.type", "linear"), "rope_scaling lacks factor"),
        (
            tiny_llama().str("llama.rope.scaling.type", "linear").f32("llama.rope.scaling.factor", 0.0),
            "(linear) factor 0",
        ),
    ];
    for (i, (writer, named)) in cases.into_iter().enumerate() {
        let err = LoadedModel::open(&write(&dir, &format!("{i}.gguf"), &writer.bytes())).unwrap_err().to_string();
        assert!(err.contains(named), "{named}: {err}");
    }
    let linear = tiny_llama().str("llama.rope.scaling.type", "linear").f32("llama.rope.scaling.factor", 2.0);
    let model = LoadedModel::open(&write(&dir, "linear.gguf", &linear.bytes())).unwrap();
    assert_eq!(model.config.rope.scaling, Some(crate::RopeScaling::Linear { factor: 2.0 }));
}

/// A 1-layer llama 32 wide (2 heads of 16, one KV head, ffn 32, vocab 6) whose projections are
/// Q8_0 blocks of scale `d`, every quant 1.
fn q8_llama(d: half::f16) -> Writer {
    let blocks =
        |rows: u64| -> Vec<u8> { (0..rows).flat_map(|_| d.to_le_bytes().into_iter().chain([1u8; 32])).collect() };
    let mut w = tiny_llama().u32("llama.embedding_length", 32).u32("llama.feed_forward_length", 32);
    w.tensors.clear();
    let (q8, ones) = (8, [1.0; 32]);
    w.f32_tensor("token_embd.weight", &[32, 6], &[0.1; 192])
        .f32_tensor("blk.0.attn_norm.weight", &[32], &ones)
        .tensor("blk.0.attn_q.weight", &[32, 32], q8, blocks(32))
        .tensor("blk.0.attn_k.weight", &[32, 16], q8, blocks(16))
        .tensor("blk.0.attn_v.weight", &[32, 16], q8, blocks(16))
        .tensor("blk.0.attn_output.weight", &[32, 32], q8, blocks(32))
        .f32_tensor("blk.0.ffn_norm.weight", &[32], &ones)
        .tensor("blk.0.ffn_gate.weight", &[32, 32], q8, blocks(32))
        .tensor("blk.0.ffn_up.weight", &[32, 32], q8, blocks(32))
        .tensor("blk.0.ffn_down.weight", &[32, 32], q8, blocks(32))
        .f32_tensor("output_norm.weight", &[32], &ones)
}

/// A block scale that is NaN or infinite is refused naming the tensor and the file, both
/// where the weight is dequantized on load and where it stays stored on the devices.
#[test]
fn a_non_finite_block_scale_is_refused_read_or_kept_stored() {
    let dir = tempfile::tempdir().unwrap();
    let good = LoadedModel::open(&write(&dir, "good.gguf", &q8_llama(half::f16::from_f32(0.5)).bytes())).unwrap();
    good.check_weights(1).unwrap();
    assert_eq!(good.stored_forms(1).unwrap().len(), 7);
    for p in good.config.params(1, false) {
        assert!(good.weights.load(&p, DType::F32).unwrap().to_f32_vec().iter().all(|v| v.is_finite()));
    }
    for (i, d) in [half::f16::NAN, half::f16::INFINITY, half::f16::NEG_INFINITY].into_iter().enumerate() {
        let path = write(&dir, &format!("bad{i}.gguf"), &q8_llama(d).bytes());
        let model = LoadedModel::open(&path).unwrap();
        let q = model.config.params(1, false).into_iter().find(|p| p.name.ends_with("q_proj.weight")).unwrap();
        for err in [model.weights.load(&q, DType::F32).unwrap_err(), model.stored_forms(1).unwrap_err()] {
            assert!(matches!(err, ModelError::NonFinite { .. }), "{err}");
            let err = err.to_string();
            assert!(
                err.contains("model.layers.0.self_attn.q_proj.weight") && err.contains(&path.display().to_string()),
                "{err}"
            );
        }
    }
}
