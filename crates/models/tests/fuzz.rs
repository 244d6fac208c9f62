//! Every parser of a user's model files, fed seeded mutations of valid files for a bounded
//! time: GGUF (header, metadata, tensor directory, data), safetensors (header), config.json,
//! tokenizer.json / tokenizer_config.json. Each must answer with a value or an error, never
//! a panic. `SIPHON_FUZZ_SECONDS` (default 2 per target) and `SIPHON_FUZZ_SEED` widen a run;
//! a failure names the seed and iteration that reproduce it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use siphon_models::{DType, HfConfig, LoadedModel, TextTokenizer};

fn fixture(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(path)
}

/// One mutation of `bytes`, mostly within the first `hot` bytes (headers live there):
/// flipped bits, overwritten runs with edge values, truncation, a duplicated or deleted span.
fn mutate(rng: &mut fastrand::Rng, bytes: &[u8], hot: usize) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let len = out.len().max(1);
    let hot = hot.clamp(1, len);
    for _ in 0..rng.usize(1..=4) {
        let at = if rng.bool() { rng.usize(0..hot) } else { rng.usize(0..len) }.min(out.len().saturating_sub(1));
        match rng.u8(0..6) {
            0 if !out.is_empty() => out[at] ^= 1 << rng.u8(0..8),
            1 => {
                let edge = [0u8, 0xff, 0x7f, 0x80, b'"', b'{', b'9'][rng.usize(0..7)];
                let end = (at + rng.usize(1..9)).min(out.len());
                out[at..end].fill(edge);
            }
            2 => out.truncate(at),
            3 => {
                let end = (at + rng.usize(1..64)).min(out.len());
                let span = out[at..end].to_vec();
                out.splice(at..at, span);
            }
            4 => {
                let end = (at + rng.usize(1..64)).min(out.len());
                out.drain(at..end);
            }
            _ if !out.is_empty() => out[at] = rng.u8(..),
            _ => {}
        }
    }
    out
}

/// Runs `target` on mutations of `seed_input` until the time budget is spent; panics (with
/// the seed) if any call panics.
fn fuzz(name: &str, seed_input: &[u8], hot: usize, mut target: impl FnMut(&[u8])) {
    let seconds: u64 = std::env::var("SIPHON_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2);
    let seed: u64 = std::env::var("SIPHON_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5105);
    let mut rng = fastrand::Rng::with_seed(seed);
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < Duration::from_secs(seconds) {
        let input = mutate(&mut rng, seed_input, hot);
        if catch_unwind(AssertUnwindSafe(|| target(&input))).is_err() {
            panic!("{name}: a parser panicked on mutation {n} (SIPHON_FUZZ_SEED={seed})");
        }
        n += 1;
    }
    assert!(n > 10, "{name}: only {n} inputs tried");
    eprintln!("{name}: {n} mutated inputs, no panic");
}

/// Opens a model and reads every weight the config implies, as extraction would.
fn open_and_read(path: &Path) {
    let Ok(model) = LoadedModel::open(path) else { return };
    if model.check_weights(model.config.n_layers).is_err() {
        return;
    }
    for p in model.config.params(model.config.n_layers, false) {
        let _ = model.weights.load(&p, DType::F32);
    }
    if let Some(tok) = &model.tokenizer {
        let _ = tok.encode("the quick brown fox");
    }
}

#[test]
fn gguf_files_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    for file in ["models/gguf/tiny-gpt2.gguf", "models/gguf/tiny-qwen3moe.gguf", "models/spm/tiny-spm.gguf"] {
        let bytes = std::fs::read(fixture(file)).unwrap();
        let path = dir.path().join("m.gguf");
        fuzz(file, &bytes, 16 << 10, |input| {
            std::fs::write(&path, input).unwrap();
            open_and_read(&path);
        });
    }
}

#[test]
fn safetensors_headers_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("models/tiny-gpt2");
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    fuzz("model.safetensors", &bytes, header, |input| {
        std::fs::write(dir.path().join("model.safetensors"), input).unwrap();
        open_and_read(dir.path());
    });
}

#[test]
fn config_json_never_panics() {
    for model in ["tiny-phi3", "tiny-gemma3-mm", "tiny-qwen3-moe", "tiny-pythia"] {
        let text = std::fs::read(fixture(&format!("models/{model}/config.json"))).unwrap();
        fuzz(model, &text, text.len(), |input| {
            let Ok(text) = std::str::from_utf8(input) else { return };
            if let Ok(config) = HfConfig::from_json(text).and_then(HfConfig::into_config) {
                let _ = config.params(config.n_layers.min(4), true);
                let _ = siphon_models::hook_kinds(&config);
            }
        });
    }
}

#[test]
fn tokenizer_files_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = std::fs::read(fixture("data/tokenizer.json")).unwrap();
    let config = br#"{"add_bos_token": true, "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}"#;
    fuzz("tokenizer.json", &tokenizer, tokenizer.len(), |input| {
        std::fs::write(dir.path().join("tokenizer.json"), input).unwrap();
        std::fs::write(dir.path().join("tokenizer_config.json"), config).unwrap();
        if let Ok(Some(tok)) = TextTokenizer::from_hf_dir(dir.path()) {
            let _ = tok.encode("Hello world, 12345 ü");
        }
    });
    std::fs::write(dir.path().join("tokenizer.json"), &tokenizer).unwrap();
    fuzz("tokenizer_config.json", config, config.len(), |input| {
        std::fs::write(dir.path().join("tokenizer_config.json"), input).unwrap();
        if let Ok(Some(tok)) = TextTokenizer::from_hf_dir(dir.path()) {
            let _ = tok.encode("Hello world");
        }
    });
}
