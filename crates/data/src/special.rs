//! Finding special tokens in a tokenizer.json, and parsing user-given token names.

use tokenizers::Tokenizer;

use crate::error::{Error, Result};
use crate::pack::SpecialTokens;

/// BOS spellings, most specific first (Llama 3, Llama 2/Mistral, Gemma, GPT-NeoX-like).
const BOS_NAMES: &[&str] = &["<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "[CLS]"];
/// EOS spellings (Llama 3 base, GPT-2/Qwen base, Llama 2, Gemma).
const EOS_NAMES: &[&str] = &["<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "[SEP]"];
const PAD_NAMES: &[&str] = &["<pad>", "<|pad|>", "[PAD]", "<|finetune_right_pad_id|>"];

impl SpecialTokens {
    /// Guesses BOS/EOS/pad from well-known spellings in the tokenizer's vocabulary. Qwen-style
    /// tokenizers have no BOS; pad falls back to EOS, then BOS, then id 0 (pad ids are always
    /// masked, so any valid id works).
    pub fn detect(tokenizer: &Tokenizer) -> SpecialTokens {
        let find = |names: &[&str]| names.iter().find_map(|n| tokenizer.token_to_id(n));
        let bos = find(BOS_NAMES);
        let eos = find(EOS_NAMES);
        let pad = find(PAD_NAMES).or(eos).or(bos).unwrap_or(0);
        SpecialTokens { bos, eos, pad, exclude: Vec::new() }
    }
}

/// Parses a token given by name (`<|endoftext|>`) or by id (`151643`), checking it exists.
pub fn parse_token(tokenizer: &Tokenizer, spec: &str) -> Result<u32> {
    let vocab = tokenizer.get_vocab_size(true) as u64;
    if let Ok(id) = spec.parse::<u32>() {
        if u64::from(id) < vocab || tokenizer.id_to_token(id).is_some() {
            return Ok(id);
        }
        return Err(Error::Tokenizer(format!("token id {id} is outside the vocabulary of {vocab}")));
    }
    tokenizer.token_to_id(spec).ok_or_else(|| Error::Tokenizer(format!("no token {spec:?} in the vocabulary")))
}

/// Loads a tokenizer.json (a regular file: a FIFO is refused, not read).
///
/// The `tokenizers` library panics on some malformed files (a decoder it cannot build, for
/// one); that panic is caught and returned as the error it should have been.
pub fn load_tokenizer(path: &std::path::Path) -> Result<Tokenizer> {
    let cannot = |e: String| Error::Tokenizer(format!("cannot load {}: {e}", path.display()));
    crate::file::check_regular_file(path).map_err(|e| cannot(e.to_string()))?;
    match std::panic::catch_unwind(|| Tokenizer::from_file(path)) {
        Ok(loaded) => loaded.map_err(|e| cannot(e.to_string())),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(cannot(format!("the file is malformed (the tokenizers library failed reading it: {what})")))
        }
    }
}
