//! Every reader of a user's model and dictionary files, fed generated mutations of valid
//! files (`siphon-fuzz`): GGUF (header, metadata, tensor directory, data, the conversion to a
//! Hugging Face config, the vocabulary), safetensors (header, a sharded index), config.json,
//! the dictionaries' files (SAELens, sparsify, Llama Scope, Gemma Scope), tokenizer.json and
//! tokenizer_config.json. Each input must give a value or an error with a message — never a
//! panic, an allocation over the bound below, or a hang. `SIPHON_FUZZ_CASES` multiplies the
//! case counts, `SIPHON_FUZZ_SEED` changes the seed; a failure prints its shrunk input, kept
//! then as a regular test at the end of this file (a seed that found a bug).

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use proptest::prelude::*;
use siphon_fuzz::{Outcome, bytes, cases, check, json, outcome};
use siphon_models::dictionary::Dictionary;
use siphon_models::gguf::{GgufFile, convert};
use siphon_models::{DType, HfConfig, LoadedModel, TextTokenizer};

/// No input here is over a few MiB: a reader asking for more was misled by a size it read.
#[global_allocator]
static ALLOC: siphon_fuzz::Bounded = siphon_fuzz::Bounded::new(256 << 20);

/// The allocation bound, the hang watchdog and the quiet panics are the process's: one target
/// at a time.
fn serial() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    siphon_fuzz::quiet_panics();
    ONE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn fixture(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(path)
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn text(path: &Path) -> String {
    String::from_utf8(read(path)).unwrap()
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// Copies the directory `src` into `dst` (files and folders).
fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let to = dst.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &to);
        } else {
            std::fs::copy(&path, &to).unwrap();
        }
    }
}

/// The first error of several reads, or `Ok`: every read is tried.
#[derive(Default)]
struct First(Option<String>);

impl First {
    fn note<T, E: std::fmt::Display>(&mut self, result: Result<T, E>) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(e) => {
                self.0.get_or_insert_with(|| e.to_string());
                None
            }
        }
    }

    fn outcome(self) -> Outcome {
        self.0.map_or(Ok(()), Err)
    }
}

/// Opens a model and reads every weight the config implies, as extraction would: checked,
/// converted to f32, and in its stored form where it can stay so on the devices; then the
/// tokenizer, if any.
fn open_and_read(path: &Path) -> Outcome {
    let model = LoadedModel::open(path).map_err(|e| e.to_string())?;
    let n_layers = model.config.n_layers;
    let mut first = First::default();
    first.note(model.check_weights(n_layers));
    for p in model.config.params(n_layers, false) {
        first.note(model.weights.load(&p, DType::F32));
        if let Some(Some(form)) = first.note(model.weights.stored_form(&p)) {
            first.note(model.weights.load_stored(&p, form));
        }
    }
    if let Some(tok) = &model.tokenizer {
        first.note(tok.encode("the quick brown fox"));
    }
    first.outcome()
}

/// A GGUF read as a model (directory, data, the conversion to a Hugging Face config, every
/// weight), and its vocabulary, if any, as a tokenizer.
fn read_gguf(path: &Path) -> Outcome {
    let file = GgufFile::open(path).map_err(|e| e.to_string())?;
    let mut first = First::default();
    if file.get("tokenizer.ggml.model").is_some()
        && let Some(tok) = first.note(TextTokenizer::from_gguf(&file))
    {
        first.note(tok.encode("Hello world, 12345 ü"));
    }
    // The conversion to a Hugging Face config, also of a file with only a vocabulary (whose
    // error then is no fault).
    let config = convert::hf_config(&file).and_then(HfConfig::into_config);
    if let Ok(config) = &config {
        config.params(config.n_layers, true);
        siphon_models::hook_kinds(config);
    }
    if !file.tensors().is_empty() {
        first.note(config);
        first.note(open_and_read(path));
    }
    first.outcome()
}

/// The GGUF fixtures: byte-level BPE and SentencePiece vocabularies, every ggml block type
/// siphon reads (F32/F16, Q4_0, Q8_0, Q4_K, Q6_K), stacked experts, transposed (GPT-2),
/// permuted (llama) and per-head fused (GPT-NeoX) rows.
const GGUFS: [&str; 6] = [
    "models/gguf/tiny-gpt2.gguf",
    "models/gguf/tiny-qwen3moe.gguf",
    "models/gguf/tiny-llama-k.gguf",
    "models/gguf/tiny-mixtral-q.gguf",
    "models/gguf/tiny-gptneox.gguf",
    "models/spm/tiny-spm.gguf",
];

/// Where a GGUF's header ends (its tensor data is aligned after it), read from a valid file.
fn gguf_header_len(path: &Path) -> usize {
    let file = GgufFile::open(path).unwrap();
    file.tensors().iter().map(|t| t.range.start).min().unwrap_or(read(path).len())
}

#[test]
fn gguf_files() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    for name in GGUFS {
        let valid = read(&fixture(name));
        assert_eq!(read_gguf(&fixture(name)), Ok(()), "{name} reads whole");
        let hot = gguf_header_len(&fixture(name));
        check(name, cases(300), bytes::mutations(&valid, hot), |input| {
            write(&path, input);
            read_gguf(&path)
        });
    }
}

#[test]
fn safetensors_headers() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    for model in ["tiny-gpt2", "tiny-qwen3-fp8", "tiny-gpt-oss-mxfp4"] {
        let src = fixture(&format!("models/{model}"));
        std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
        let valid = read(&src.join("model.safetensors"));
        let st = dir.path().join("model.safetensors");
        write(&st, &valid);
        assert_eq!(open_and_read(dir.path()), Ok(()), "{model} reads whole");
        let header = 8 + u64::from_le_bytes(valid[..8].try_into().unwrap()) as usize;
        check(model, cases(300), bytes::mutations(&valid, header), |input| {
            write(&st, input);
            open_and_read(dir.path())
        });
    }
}

#[test]
fn safetensors_index() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture("models/tiny-qwen2"), dir.path());
    let index = dir.path().join("model.safetensors.index.json");
    let valid = text(&index);
    assert_eq!(open_and_read(dir.path()), Ok(()), "tiny-qwen2 reads whole");
    check("model.safetensors.index.json", cases(300), json::mutations(&valid), |input| {
        write(&index, input.text.as_bytes());
        open_and_read(dir.path())
    });
    check("model.safetensors.index.json (bytes)", cases(150), bytes::mutations(valid.as_bytes(), 512), |input| {
        write(&index, input);
        open_and_read(dir.path())
    });
}

/// A config.json read as opening a model reads it, then its parameters and hooks.
fn read_config(text: &str) -> Outcome {
    let hf = HfConfig::from_json(text).map_err(|e| e.to_string())?;
    let mut first = First::default();
    first.note(hf.fp8_block_size());
    let config = hf.into_config().map_err(|e| e.to_string())?;
    // Every layer's parameters, as a check of the weights lists them.
    config.params(config.n_layers, true);
    siphon_models::hook_kinds(&config);
    first.outcome()
}

#[test]
fn config_json() {
    let _one = serial();
    // Dense, mixtures, multimodal, hybrid (linear attention), MLA, FP8 and MXFP4 checkpoints.
    for model in [
        "tiny-llama",
        "tiny-phi3",
        "tiny-pythia",
        "tiny-gpt2",
        "tiny-gemma2",
        "tiny-qwen3-moe",
        "tiny-gpt-oss-mxfp4",
        "tiny-deepseek-v3-fp8",
        "tiny-gemma3-mm",
        "tiny-gemma4-mm",
        "tiny-qwen3-5-mm",
        "tiny-qwen3-next",
        "tiny-qwen3-5-moe",
    ] {
        let valid = text(&fixture(&format!("models/{model}/config.json")));
        assert_eq!(read_config(&valid), Ok(()), "{model} reads whole");
        check(model, cases(150), json::mutations(&valid), |input| read_config(&input.text));
    }
    // With the weights: the sizes the config names against the tensors the files hold, FP8's
    // block size, GPT-OSS's cut rows.
    let dir = tempfile::tempdir().unwrap();
    for model in ["tiny-qwen3-fp8", "tiny-gpt-oss-mxfp4", "tiny-gpt2"] {
        copy_dir(&fixture(&format!("models/{model}")), dir.path());
        let config = dir.path().join("config.json");
        let valid = text(&config);
        assert_eq!(open_and_read(dir.path()), Ok(()), "{model} reads whole");
        check(&format!("{model} with its weights"), cases(150), json::mutations(&valid), |input| {
            write(&config, input.text.as_bytes());
            open_and_read(dir.path())
        });
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
    }
    let valid = text(&fixture("models/tiny-llama/config.json"));
    check("tiny-llama (bytes)", cases(300), bytes::mutations(valid.as_bytes(), valid.len()), |input| {
        let text = std::str::from_utf8(input).map_err(|e| format!("not UTF-8: {e}"))?;
        read_config(text)
    });
}

/// A copy of one dictionary fixture, at the same path below a temporary directory (Gemma
/// Scope's hook is read from the Hub's layout).
struct DictionaryCopy {
    _root: tempfile::TempDir,
    dir: PathBuf,
}

impl DictionaryCopy {
    fn new(fixture_dir: &str) -> DictionaryCopy {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join(fixture_dir);
        copy_dir(&fixture(&format!("dictionaries/{fixture_dir}")), &dir);
        DictionaryCopy { _root: root, dir }
    }

    fn open(&self) -> Outcome {
        outcome(Dictionary::open(&self.dir, None))
    }

    /// Mutations of the JSON file `file`, then of the binary `weights` (most within its first
    /// `hot` bytes).
    fn check(&self, config: &str, weights: &str, hot: usize, n: u32) {
        assert_eq!(self.open(), Ok(()), "{} reads whole", self.dir.display());
        let (config, weights) = (self.dir.join(config), self.dir.join(weights));
        if config.is_file() {
            let valid = text(&config);
            let name = config.display().to_string();
            check(&name, cases(n), json::mutations(&valid), |input| {
                write(&config, input.text.as_bytes());
                self.open()
            });
            write(&config, valid.as_bytes());
        }
        let valid = read(&weights);
        let hot = if hot == 0 { 8 + u64::from_le_bytes(valid[..8].try_into().unwrap()) as usize } else { hot };
        check(&weights.display().to_string(), cases(n), bytes::mutations(&valid, hot), |input| {
            write(&weights, input);
            self.open()
        });
        write(&weights, &valid);
    }
}

#[test]
fn saelens_dictionaries() {
    let _one = serial();
    for name in
        ["saelens-topk", "saelens-v5-topk", "saelens-gated", "saelens-jumprelu-transcoder", "saelens-layer-norm"]
    {
        DictionaryCopy::new(name).check("cfg.json", "sae_weights.safetensors", 0, 100);
    }
}

#[test]
fn sparsify_dictionaries() {
    let _one = serial();
    for name in ["sparsify/layers.1", "sparsify-transcoder/layers.1.mlp"] {
        DictionaryCopy::new(name).check("cfg.json", "sae.safetensors", 0, 200);
    }
}

#[test]
fn llama_scope_dictionaries() {
    let _one = serial();
    DictionaryCopy::new("llama-scope/tiny-llama-L1R").check(
        "hyperparams.json",
        "checkpoints/final.safetensors",
        0,
        300,
    );
}

/// An input made from a valid one by mutations within one of its regions.
#[derive(Clone)]
struct InRegion {
    /// Where the region starts.
    at: usize,
    /// The region, mutated.
    mutated: bytes::Mutated,
    /// The whole input.
    bytes: Vec<u8>,
}

impl std::fmt::Debug for InRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes, the region at {}: {:?}", self.bytes.len(), self.at, self.mutated)
    }
}

/// Mutations of `valid[range]` (offsets within it, most in its first `hot` bytes), the rest
/// kept.
fn mutations_in(valid: &[u8], range: std::ops::Range<usize>, hot: usize) -> BoxedStrategy<InRegion> {
    let (head, tail) = (valid[..range.start].to_vec(), valid[range.end..].to_vec());
    bytes::mutations(&valid[range.clone()], hot)
        .prop_map(move |mutated| {
            let bytes = [&head[..], &mutated.bytes, &tail].concat();
            InRegion { at: range.start, mutated, bytes }
        })
        .boxed()
}

#[test]
fn gemma_scope_dictionaries() {
    let _one = serial();
    let copy = DictionaryCopy::new("gemma-scope-2b-pt-res/layer_1/width_16k/average_l0_7");
    assert_eq!(copy.open(), Ok(()));
    let path = copy.dir.join("params.npz");
    let valid = read(&path);
    // The archive's headers are spread over it: each member's local zip header and npy header
    // (the first two at the start, the last two, 512 bytes each, before the central directory
    // at the end), the central directory.
    let len = valid.len();
    let tail = len.saturating_sub(1536);
    let strategy = prop_oneof![
        mutations_in(&valid, 0..len, 1024),
        mutations_in(&valid, tail..len, 1536),
        mutations_in(&valid, 0..len, len),
    ];
    check("params.npz", cases(400), strategy, |input| {
        write(&path, &input.bytes);
        copy.open()
    });
}

/// A tokenizer_config.json with every field the reader uses: special tokens as strings and as
/// `{"content": …}`, the flags that rebuild the post-processor, a chat template.
const TOKENIZER_CONFIG: &str = r#"{
  "add_bos_token": true,
  "add_eos_token": false,
  "bos_token": "<|endoftext|>",
  "eos_token": {"content": "<|endoftext|>", "lstrip": false},
  "pad_token": "<|endoftext|>",
  "unk_token": null,
  "chat_template": "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
}"#;

/// The same with named chat templates (transformers 4.x).
const TOKENIZER_CONFIG_NAMED: &str = r#"{
  "bos_token": "<|endoftext|>",
  "chat_template": [
    {"name": "default", "template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"},
    {"name": "tool_use", "template": "{{ tools }}"}
  ]
}"#;

fn read_tokenizer(dir: &Path) -> Outcome {
    let tok = TextTokenizer::from_hf_dir(dir).map_err(|e| e.to_string())?.ok_or("no tokenizer.json")?;
    tok.encode("Hello world, 12345 ü").map_err(|e| e.to_string())?;
    if tok.chat_template.as_deref().is_some_and(str::is_empty) {
        return Err("an empty chat template".into());
    }
    Ok(())
}

#[test]
fn tokenizer_files() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let (tokenizer_path, config_path) = (dir.path().join("tokenizer.json"), dir.path().join("tokenizer_config.json"));
    let tokenizer = text(&fixture("data/tokenizer.json"));
    write(&tokenizer_path, tokenizer.as_bytes());
    write(&config_path, TOKENIZER_CONFIG.as_bytes());
    assert_eq!(read_tokenizer(dir.path()), Ok(()));
    check("tokenizer.json", cases(200), json::mutations(&tokenizer), |input| {
        write(&tokenizer_path, input.text.as_bytes());
        read_tokenizer(dir.path())
    });
    check("tokenizer.json (bytes)", cases(200), bytes::mutations(tokenizer.as_bytes(), tokenizer.len()), |input| {
        write(&tokenizer_path, input);
        read_tokenizer(dir.path())
    });
    write(&tokenizer_path, tokenizer.as_bytes());
    for (name, valid) in [
        ("tokenizer_config.json", TOKENIZER_CONFIG),
        ("tokenizer_config.json (named templates)", TOKENIZER_CONFIG_NAMED),
    ] {
        write(&config_path, valid.as_bytes());
        assert_eq!(read_tokenizer(dir.path()), Ok(()), "{name}");
        check(name, cases(300), json::mutations(valid), |input| {
            write(&config_path, input.text.as_bytes());
            read_tokenizer(dir.path())
        });
    }
    check("tokenizer_config.json (bytes)", cases(200), bytes::mutations(TOKENIZER_CONFIG.as_bytes(), 512), |input| {
        write(&config_path, input);
        read_tokenizer(dir.path())
    });
}

// Seeds that found bugs: the shrunk inputs the targets above printed, kept as they were.

/// Runs `read` once, under the same checks as a generated input (no panic, the allocation
/// bound, the watchdog).
fn seed(name: &str, mut read: impl FnMut() -> Outcome) {
    let _one = serial();
    check(name, 1, Just(()), |()| read());
}

/// A copy of `bytes` with the little-endian `value` written over `width` bytes at `at`.
fn set_int(bytes: &[u8], at: usize, width: usize, value: u64) -> Vec<u8> {
    let mut out = bytes.to_vec();
    out[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
    out
}

#[test]
fn seed_gguf_llama_k_dimension_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let bytes = set_int(&read(&fixture("models/gguf/tiny-llama-k.gguf")), 853, 4, 0);
    write(&path, &bytes);
    let _ = std::panic::catch_unwind(|| read_gguf(&path));
    seed("tiny-llama-k.gguf, SetInt { at: 853, width: 4, value: 0 }", || read_gguf(&path));
}

#[test]
fn seed_config_head_dim_huge() {
    let mut config: serde_json::Value = serde_json::from_str(&text(&fixture("models/tiny-llama/config.json"))).unwrap();
    config["head_dim"] = serde_json::json!(9223372036854775808u64);
    let text = config.to_string();
    let _ = std::panic::catch_unwind(|| read_config(&text));
    seed("tiny-llama config.json, head_dim 2^63", || read_config(&text));
}

#[test]
fn seed_config_gpt2_n_embd_huge() {
    let mut config: serde_json::Value = serde_json::from_str(&text(&fixture("models/tiny-gpt2/config.json"))).unwrap();
    config["n_inner"] = serde_json::Value::Null;
    config["n_embd"] = serde_json::json!(9223372036854775807u64);
    let text = config.to_string();
    seed("tiny-gpt2 config.json, n_inner null, n_embd 2^63 - 1", || read_config(&text));
}

#[test]
fn seed_gguf_spm_score_nan() {
    // A piece's score (f32) overwritten with all ones: a NaN, which the merges derived from
    // the scores were sorted by.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    write(&path, &set_int(&read(&fixture("models/spm/tiny-spm.gguf")), 7715, 4, u64::MAX));
    seed("tiny-spm.gguf, SetInt { at: 7715, width: 4, value: u64::MAX }", || read_gguf(&path));
    let err = read_gguf(&path).unwrap_err();
    assert!(err.contains("tokenizer.ggml.scores[") && err.contains("NaN"), "{err}");
}

#[test]
fn seed_tokenizer_vocabulary_id_huge() {
    // A vocabulary id of 2^31: rebuilding the post-processor (add_bos_token) wrote the
    // tokenizer out to JSON, which lists every id up to the largest.
    let dir = tempfile::tempdir().unwrap();
    let mut tokenizer: serde_json::Value = serde_json::from_str(&text(&fixture("data/tokenizer.json"))).unwrap();
    tokenizer["model"]["vocab"]["Ā"] = serde_json::json!(2147483648u64);
    write(&dir.path().join("tokenizer.json"), tokenizer.to_string().as_bytes());
    write(&dir.path().join("tokenizer_config.json"), TOKENIZER_CONFIG.as_bytes());
    seed("tokenizer.json, .model.vocab.Ā → 2^31", || read_tokenizer(dir.path()));
}

#[test]
fn seed_sparsify_empty_encoder() {
    // encoder.weight [0, d_in]: no latents, whose count the transposed encoder divided by.
    let copy = DictionaryCopy::new("sparsify/layers.1");
    let weights = copy.dir.join("sae.safetensors");
    let bytes = read(&weights);
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::tensor::TensorView)> =
        file.tensors().into_iter().filter(|(name, _)| name != "encoder.weight").collect();
    tensors.push((
        "encoder.weight".into(),
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![0, 64], &[]).unwrap(),
    ));
    write(&weights, &safetensors::serialize(tensors, None).unwrap());
    seed("sparsify sae.safetensors, encoder.weight [0, 64]", || copy.open());
    let err = copy.open().unwrap_err();
    assert!(err.contains("encoder.weight is [0, 64]"), "{err}");
}
