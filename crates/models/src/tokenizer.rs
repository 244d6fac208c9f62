//! Tokenizers: `tokenizer.json` (+ `tokenizer_config.json`) from an HF directory, or one built
//! from a GGUF file's `tokenizer.ggml.*` metadata.
//!
//! The GGUF build follows what transformers does with `gguf_file=` so that siphon gets HF's
//! token ids: for `tokenizer.ggml.model = "gpt2"` a byte-level BPE over the file's tokens and
//! merges (tokens not spelled in the GPT-2 byte alphabet are re-spelled), the byte-level
//! pre-tokenizer — or, for the `pre` types transformers knows (llama3, qwen2), their split
//! regex first — the tokens marked CONTROL added as special tokens, USER_DEFINED ones as
//! plain added tokens, and BOS/EOS added when `add_bos_token`/`add_eos_token` say so. For
//! `tokenizer.ggml.model = "llama"` (SentencePiece-style) it is a byte-fallback BPE with a
//! Metaspace pre-tokenizer, merges from the file or derived from the piece scores the way
//! transformers' `generate_merges` does, and BOS added unless the file says otherwise.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde_json::{Value, json};

use crate::error::ModelError;
use crate::gguf::{GgufFile, GgufValue};

/// A ready tokenizer plus the special-token facts the data pipeline needs.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    /// Beginning-of-sequence token id, if the model has one.
    pub bos_id: Option<u32>,
    /// End-of-sequence token id, if the model has one.
    pub eos_id: Option<u32>,
    /// Padding token id, if the model names one.
    pub pad_id: Option<u32>,
    /// The chat template (`tokenizer_config.json`'s `chat_template` or a `chat_template.jinja`
    /// beside it; a GGUF's `tokenizer.chat_template`).
    pub chat_template: Option<String>,
    /// Special tokens by name, as a chat template's context holds them (`bos_token`,
    /// `eos_token`, `unk_token`, `pad_token`).
    pub special_tokens: Vec<(String, String)>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab_size", &self.inner.get_vocab_size(true))
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .field("pad_id", &self.pad_id)
            .finish()
    }
}

const GPT4_STYLE_LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

impl TextTokenizer {
    /// Wraps a `tokenizers::Tokenizer`.
    pub fn new(
        inner: tokenizers::Tokenizer,
        bos_id: Option<u32>,
        eos_id: Option<u32>,
        pad_id: Option<u32>,
    ) -> TextTokenizer {
        TextTokenizer { inner, bos_id, eos_id, pad_id, chat_template: None, special_tokens: Vec::new() }
    }

    /// The underlying tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Token ids of `text`, special tokens (BOS) added as the model's tokenizer config says,
    /// like HF's `tokenizer(text)["input_ids"]`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let enc = self.inner.encode(text, true).map_err(|e| ModelError::Tokenizer(format!("encoding text: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens left out (HF's `decode(ids, skip_special_tokens=True)`).
    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        self.inner.decode(ids, true).map_err(|e| ModelError::Tokenizer(format!("decoding ids: {e}")))
    }

    /// Reads `tokenizer.json` and, when present, `tokenizer_config.json` from an HF model
    /// directory. Returns `None` when the directory has no `tokenizer.json`.
    pub fn from_hf_dir(dir: &Path) -> Result<Option<TextTokenizer>, ModelError> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Ok(None);
        }
        let text = crate::file::read_to_string(&path)?;
        let inner = parse_tokenizer(&text).map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
        let mut tok = TextTokenizer::new(inner, None, None, None);
        let jinja = dir.join("chat_template.jinja");
        if jinja.exists() {
            tok.chat_template = Some(crate::file::read_to_string(&jinja)?);
        }
        let config_path = dir.join("tokenizer_config.json");
        if config_path.exists() {
            let text = crate::file::read_to_string(&config_path)?;
            let config: Value = serde_json::from_str(&text)
                .map_err(|e| ModelError::Corrupt { path: config_path.clone(), detail: format!("not JSON: {e}") })?;
            // Special tokens are given as a string or as {"content": ...}.
            let id_of = |key: &str| {
                let v = config.get(key)?;
                let s = v.as_str().or_else(|| v.get("content").and_then(Value::as_str))?;
                tok.inner.token_to_id(s)
            };
            tok.bos_id = id_of("bos_token");
            tok.eos_id = id_of("eos_token");
            tok.pad_id = id_of("pad_token");
            for key in ["bos_token", "eos_token", "unk_token", "pad_token"] {
                let value = config.get(key);
                if let Some(s) = value.and_then(|v| v.as_str().or_else(|| v.get("content").and_then(Value::as_str))) {
                    tok.special_tokens.push((key.to_string(), s.to_string()));
                }
            }
            // A string, or named templates (transformers 4.x): the one named "default".
            let named = |v: &Value| v.get("name").and_then(Value::as_str) == Some("default");
            let chat_template = match config.get("chat_template") {
                Some(Value::String(t)) => Some(t.clone()),
                Some(Value::Array(list)) => {
                    list.iter().find(|v| named(v)).and_then(|v| v.get("template")?.as_str().map(str::to_string))
                }
                _ => None,
            };
            tok.chat_template = tok.chat_template.take().or(chat_template);
            // transformers ≥5 rebuilds the post-processor from add_bos_token/add_eos_token
            // when the config names either, or when tokenizer.json has none; either of another
            // type is refused rather than taken as absent (it would change every sequence).
            let flag = |key: &str| match config.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Bool(on)) => Ok(Some(*on)),
                Some(other) => {
                    Err(ModelError::Tokenizer(format!("{}: {key} {other} is not true or false", config_path.display())))
                }
            };
            let (add_bos, add_eos) = (flag("add_bos_token")?, flag("add_eos_token")?);
            let explicit = add_bos.is_some() || add_eos.is_some();
            if explicit || tok.inner.get_post_processor().is_none() {
                let special = |on: Option<bool>, id: Option<u32>| match (on, id) {
                    (Some(true), Some(id)) => tok.inner.id_to_token(id).map(|t| (t, id)),
                    _ => None,
                };
                let bos = special(add_bos, tok.bos_id);
                let eos = special(add_eos, tok.eos_id);
                let post =
                    template(bos.as_ref().map(|(t, i)| (t.as_str(), *i)), eos.as_ref().map(|(t, i)| (t.as_str(), *i)));
                // Set in place, not by a round trip through the tokenizer's JSON: writing a
                // vocabulary out walks every id up to the largest, which a corrupt file can
                // put at 2^32 - 1.
                let post: tokenizers::processors::PostProcessorWrapper = serde_json::from_value(post)
                    .map_err(|e| ModelError::Tokenizer(format!("{}: the post-processor: {e}", path.display())))?;
                tok.inner.with_post_processor(Some(post));
            }
        }
        Ok(Some(tok))
    }

    /// Builds the tokenizer a GGUF file describes, as transformers does.
    pub fn from_gguf(file: &GgufFile) -> Result<TextTokenizer, ModelError> {
        let fail = |m: String| ModelError::Tokenizer(format!("{}: {m}", file.path().display()));
        let model = file
            .get("tokenizer.ggml.model")
            .and_then(GgufValue::as_str)
            .ok_or_else(|| fail("no tokenizer.ggml.model".into()))?;
        if model != "gpt2" && model != "llama" {
            return Err(fail(format!(
                "tokenizer.ggml.model {model:?} is not supported yet (supported: gpt2 byte-level BPE, llama SentencePiece BPE)"
            )));
        }
        let strings = |key: &str| -> Result<Vec<&str>, ModelError> {
            let arr = file.get(key).and_then(GgufValue::as_array).ok_or_else(|| fail(format!("no {key} array")))?;
            arr.iter().map(|v| v.as_str().ok_or_else(|| fail(format!("{key} holds a non-string")))).collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges: Option<Vec<&str>> = match file.get("tokenizer.ggml.merges") {
            Some(_) => Some(strings("tokenizer.ggml.merges")?),
            None if model == "llama" => None,
            None => return Err(fail("no tokenizer.ggml.merges array".into())),
        };
        let token_types: Vec<u64> = match file.get("tokenizer.ggml.token_type").and_then(GgufValue::as_array) {
            Some(a) => a.iter().map(|v| v.as_u64().unwrap_or(1)).collect(),
            None => Vec::new(),
        };
        let id = |key: &str| -> Result<Option<u32>, ModelError> {
            match file.get(&format!("tokenizer.ggml.{key}")).and_then(GgufValue::as_u64) {
                None => Ok(None),
                Some(i) if (i as usize) < tokens.len() => Ok(Some(i as u32)),
                Some(i) => {
                    Err(fail(format!("tokenizer.ggml.{key} {i} is outside the {}-token vocabulary", tokens.len())))
                }
            }
        };
        let flag = |key: &str| file.get(&format!("tokenizer.ggml.{key}")).and_then(GgufValue::as_bool).unwrap_or(false);
        let (bos_id, eos_id, pad_id) = (id("bos_token_id")?, id("eos_token_id")?, id("padding_token_id")?);

        let (model_json, pre_tokenizer, decoder, added) = if model == "gpt2" {
            let merges = merges.unwrap_or_default();
            byte_level_parts(file, &tokens, &merges, &token_types)
        } else {
            let scores: Vec<f64> = match file.get("tokenizer.ggml.scores").and_then(GgufValue::as_array) {
                // A NaN has no place in the merges' order (sorting by it is no order at all).
                Some(a) => a
                    .iter()
                    .enumerate()
                    .map(|(i, v)| match v.as_f64().unwrap_or(0.0) {
                        s if s.is_nan() => Err(fail(format!("tokenizer.ggml.scores[{i}] is NaN"))),
                        s => Ok(s),
                    })
                    .collect::<Result<_, _>>()?,
                None if merges.is_some() => vec![0.0; tokens.len()],
                None => return Err(fail("a llama vocabulary without merges needs tokenizer.ggml.scores".into())),
            };
            sentencepiece_parts(&tokens, merges.as_deref(), &scores, &token_types)
        };
        // llama.cpp (and transformers) add BOS to a SentencePiece vocabulary unless the file
        // says otherwise.
        let add_bos = match file.get("tokenizer.ggml.add_bos_token").and_then(GgufValue::as_bool) {
            Some(b) => b,
            None => model == "llama",
        };
        let add_eos = flag("add_eos_token");
        let bos = if add_bos { bos_id.map(|b| (tokens[b as usize], b)) } else { None };
        let eos = if add_eos { eos_id.map(|e| (tokens[e as usize], e)) } else { None };
        let post_processor = template(bos, eos);
        let spec = json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": post_processor,
            "decoder": decoder,
            "model": model_json,
        });
        let inner = parse_tokenizer(&spec.to_string()).map_err(|e| fail(format!("building the BPE tokenizer: {e}")))?;
        let mut tok = TextTokenizer::new(inner, bos_id, eos_id, pad_id);
        tok.chat_template = file.get("tokenizer.chat_template").and_then(GgufValue::as_str).map(str::to_string);
        let unk_id = id("unknown_token_id")?;
        for (key, id) in [("bos_token", bos_id), ("eos_token", eos_id), ("unk_token", unk_id), ("pad_token", pad_id)] {
            if let Some(id) = id {
                tok.special_tokens.push((key.to_string(), tokens[id as usize].to_string()));
            }
        }
        Ok(tok)
    }
}

type Parts = (Value, Value, Value, Vec<Value>);

/// A `tokenizers` tokenizer from its JSON. The JSON is checked first, so a syntax error is
/// named by line and column; the tokenizers library panics on some malformed files, which is
/// caught and reported as an error rather than taking the process down.
fn parse_tokenizer(text: &str) -> Result<tokenizers::Tokenizer, String> {
    serde_json::from_str::<Value>(text).map_err(|e| format!("not JSON: {e}"))?;
    match std::panic::catch_unwind(|| text.parse::<tokenizers::Tokenizer>()) {
        Ok(parsed) => parsed.map_err(|e| e.to_string()),
        Err(panic) => {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or(panic.downcast_ref::<&str>().copied())
                .unwrap_or("");
            Err(format!("the tokenizers library cannot read it ({why})"))
        }
    }
}

/// The TemplateProcessing transformers' `update_post_processor` builds: `[bos] $A [eos]`.
fn template(bos: Option<(&str, u32)>, eos: Option<(&str, u32)>) -> Value {
    let mut single = Vec::new();
    let mut special_tokens = BTreeMap::new();
    if let Some((t, id)) = bos {
        single.push(json!({"SpecialToken": {"id": t, "type_id": 0}}));
        special_tokens.insert(t.to_string(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    if let Some((t, id)) = eos {
        single.push(json!({"SpecialToken": {"id": t, "type_id": 0}}));
        special_tokens.insert(t.to_string(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    let mut pair = single.clone();
    pair.push(json!({"Sequence": {"id": "B", "type_id": 1}}));
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special_tokens})
}

/// The added-token entries transformers makes: CONTROL (3) tokens special, USER_DEFINED (4)
/// plain; `keep` filters CONTROL tokens (byte-level vocabularies skip mislabelled ones).
fn added_tokens(tokens: &[&str], token_types: &[u64], keep: impl Fn(&str) -> bool) -> Vec<Value> {
    let mut added = Vec::new();
    for (i, (t, ty)) in tokens.iter().zip(token_types).enumerate() {
        let special = match ty {
            3 if keep(t) => true,
            4 => false,
            _ => continue,
        };
        added.push(json!({"id": i, "content": t, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": !special, "special": special}));
    }
    added
}

/// transformers' `byte_level_tokenizer` (GPT2Tokenizer) plus its `set_split_regex`.
fn byte_level_parts(file: &GgufFile, tokens: &[&str], merges: &[&str], token_types: &[u64]) -> Parts {
    let spelling = byte_alphabet();
    let alphabet: HashSet<char> = spelling.iter().copied().collect();
    let in_alphabet = |t: &str| t.chars().all(|c| alphabet.contains(&c));
    let mut vocab = serde_json::Map::new();
    for (i, t) in tokens.iter().enumerate() {
        let s = if in_alphabet(t) { t.to_string() } else { t.bytes().map(|b| spelling[b as usize]).collect() };
        vocab.insert(s, json!(i));
    }
    let added = added_tokens(tokens, token_types, in_alphabet);
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = match file.get("tokenizer.ggml.pre").and_then(GgufValue::as_str) {
        Some("llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "smaug-bpe" | "dbrx") => Some(GPT4_STYLE_LLAMA3),
        Some("qwen2" | "deepseek-r1-qwen") => Some(QWEN2_SPLIT),
        _ => None,
    };
    let pre_tokenizer = match split {
        None => byte_level(true),
        Some(regex) => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
            byte_level(false)]}),
    };
    let model = json!({"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
        "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
        "vocab": vocab, "merges": merges});
    let decoder = json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true});
    (model, pre_tokenizer, decoder, added)
}

/// transformers' `sentencepiece_tokenizer` (LlamaTokenizer): BPE with byte fallback over the
/// file's pieces, merges from the file or derived from the scores (`generate_merges`), and a
/// Metaspace pre-tokenizer that prepends `▁` to the first section only.
fn sentencepiece_parts(tokens: &[&str], merges: Option<&[&str]>, scores: &[f64], token_types: &[u64]) -> Parts {
    let mut vocab_ids: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, t) in tokens.iter().enumerate() {
        vocab_ids.insert(t, i); // a repeated piece keeps its last id, as a Python dict does
    }
    let merges: Vec<Value> = match merges {
        Some(m) => m.iter().map(|s| json!(s)).collect(),
        None => derive_merges(tokens, scores, &vocab_ids).into_iter().map(|(l, r)| json!([l, r])).collect(),
    };
    let vocab: serde_json::Map<String, Value> =
        tokens.iter().enumerate().map(|(i, t)| (t.to_string(), json!(i))).collect();
    let added = added_tokens(tokens, token_types, |_| true);
    let model = json!({"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
        "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
        "vocab": vocab, "merges": merges});
    let pre = json!({"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "first", "split": false});
    let decoder = json!({"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]});
    (model, pre, decoder, added)
}

/// transformers' `generate_merges(vocab, scores)`: every split of a piece into two pieces of
/// the vocabulary is a merge ranked by the whole piece's score (higher first), ties by the
/// lengths of the left and right part (longer first), then by file order.
fn derive_merges<'a>(
    tokens: &[&'a str],
    scores: &[f64],
    vocab: &std::collections::HashMap<&str, usize>,
) -> Vec<(&'a str, &'a str)> {
    // dict(zip(tokens, scores)): first position of a piece, last score.
    let mut order: Vec<&str> = Vec::new();
    let mut score_of: std::collections::HashMap<&str, f64> = std::collections::HashMap::new();
    for (t, s) in tokens.iter().zip(scores) {
        if score_of.insert(t, *s).is_none() {
            order.push(t);
        }
    }
    let mut merges: Vec<(&'a str, &'a str, f64)> = Vec::new();
    for piece in order {
        let piece: &'a str = tokens[vocab[piece]];
        let mut local: Vec<(&'a str, &'a str, f64)> = piece
            .char_indices()
            .skip(1)
            .map(|(i, _)| (&piece[..i], &piece[i..]))
            .filter(|(l, r)| vocab.contains_key(l) && vocab.contains_key(r))
            .map(|(l, r)| (l, r, score_of[piece]))
            .collect();
        local.sort_by_key(|(l, r, _)| (vocab[l], vocab[r]));
        merges.extend(local);
    }
    // Python's sorted(..., reverse=True) is stable: equal keys keep their order.
    merges.sort_by(|a, b| {
        let ka = (a.2, a.0.chars().count(), a.1.chars().count());
        let kb = (b.2, b.0.chars().count(), b.1.chars().count());
        kb.partial_cmp(&ka).unwrap_or(std::cmp::Ordering::Equal)
    });
    merges.into_iter().map(|(l, r, _)| (l, r)).collect()
}

/// GPT-2's byte → printable character map (`bytes_to_unicode`): printable Latin-1 bytes map
/// to themselves, the other 68 to U+0100 onwards in byte order.
fn byte_alphabet() -> Vec<char> {
    let keep = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    let mut next = 256u32;
    (0u32..256)
        .map(|b| {
            if keep(b) {
                char::from_u32(b).unwrap()
            } else {
                let c = char::from_u32(next).unwrap();
                next += 1;
                c
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_matches_gpt2() {
        let a = byte_alphabet();
        assert_eq!(a[b' ' as usize], 'Ġ'); // U+0120
        assert_eq!(a[b'\n' as usize], 'Ċ'); // U+010A
        assert_eq!(a[b'A' as usize], 'A');
        assert_eq!(a.iter().collect::<HashSet<_>>().len(), 256);
    }
}
