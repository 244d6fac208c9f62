//! `generate`'s prompts: `--text` (tokenized as `forward` does, or with `--chat` rendered as a
//! user's message through the model's chat template with its generation prompt), `--ids` (a
//! JSON list of prompts' ids), or `--corpus` (any corpus siphon reads, its records in the
//! corpus's order: a text as `--text` takes it, a conversation rendered through the chat
//! template up to its last user message with the generation prompt — the turns after it are
//! the ones the model writes — and blank or unusable records skipped, counted and named). In
//! a job of several processes each reads its share ([`Share`]: every `processes`-th record).

use anyhow::{Context, bail};
use siphon_data::{ChatTemplate, Corpus, CorpusConfig, Record};
use siphon_models::{LoadedModel, TextTokenizer};

use super::Args;
use crate::args::files;

/// Prompts, each with the record it is.
pub type Prompts = Vec<(u64, Vec<u32>)>;

/// Which records this process completes: of a job of `processes`, record `i` is process
/// `i % processes`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub process: usize,
    pub processes: usize,
}

impl Share {
    /// Whether record `record` is this process's.
    pub fn holds(self, record: usize) -> bool {
        record % self.processes == self.process
    }
}

/// This process's share of the prompts, each with the record it is (its index in `--text`,
/// `--ids` or the corpus); only those are tokenized and checked.
pub fn read(args: &Args, model: &LoadedModel, share: Share) -> anyhow::Result<Prompts> {
    let (records, prompts): (usize, Prompts) = match (&args.ids, &args.corpus) {
        (Some(path), _) => {
            let text = files::read_text(path, "--ids", files::MAX_TEXT_BYTES)?;
            let ids: Vec<Vec<u32>> = serde_json::from_str(&text)
                .with_context(|| format!("--ids {}: expected a JSON list of lists of token ids", path.display()))?;
            let records = ids.len();
            (
                records,
                ids.into_iter().enumerate().filter(|(i, _)| share.holds(*i)).map(|(i, p)| (i as u64, p)).collect(),
            )
        }
        (None, Some(spec)) => corpus(args, spec, tokenizer(args, model)?, share)?,
        (None, None) => {
            let tok = tokenizer(args, model)?;
            let chat = args.chat.then(|| template(tok)).transpose()?;
            let mut out = Vec::new();
            for (i, text) in args.text.iter().enumerate().filter(|(i, _)| share.holds(*i)) {
                let ids = match &chat {
                    Some(chat) => rendered(chat, tok, &serde_json::json!([{ "role": "user", "content": text }]))?,
                    None => tok.encode(text).context("tokenizing --text")?,
                };
                out.push((i as u64, ids));
            }
            (args.text.len(), out)
        }
    };
    if records == 0 {
        bail!("no prompts given");
    }
    if let Some((i, _)) = prompts.iter().find(|(_, p)| p.is_empty()) {
        bail!("prompt {i} has no tokens");
    }
    let vocab = model.config.vocab_size;
    let outside = prompts.iter().find_map(|(i, p)| p.iter().find(|&&t| t as usize >= vocab).map(|t| (i, t)));
    if let Some((i, t)) = outside {
        bail!("prompt {i} holds token id {t}, outside the vocabulary (0..{vocab})");
    }
    Ok(prompts)
}

fn tokenizer<'m>(args: &Args, model: &'m LoadedModel) -> anyhow::Result<&'m TextTokenizer> {
    model.tokenizer.as_ref().with_context(|| format!("{} has no tokenizer; pass --ids instead", args.model.display()))
}

fn template(tok: &TextTokenizer) -> anyhow::Result<ChatTemplate> {
    let source = tok.chat_template.as_deref().context("the model has no chat template")?;
    let special: Vec<(&str, &str)> = tok.special_tokens.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Ok(ChatTemplate::new(source, &special)?)
}

/// `messages` rendered with the generation prompt, tokenized without special tokens added (the
/// template writes them), as transformers' `apply_chat_template(..., add_generation_prompt=True,
/// tokenize=True)`.
fn rendered(chat: &ChatTemplate, tok: &TextTokenizer, messages: &serde_json::Value) -> anyhow::Result<Vec<u32>> {
    let text = chat.render_prompt(messages).map_err(anyhow::Error::msg)?;
    let encoded = tok.inner().encode(text.as_str(), false).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(encoded.get_ids().to_vec())
}

/// The corpus's records (how many, at most `--max-prompts`) and this process's share of them
/// as prompts, each keeping its index in the corpus's order; the records of the share skipped
/// are counted and the first named.
fn corpus(args: &Args, spec: &str, tok: &TextTokenizer, share: Share) -> anyhow::Result<(usize, Prompts)> {
    let mut config = CorpusConfig::default();
    config.json_field = args.json_field.clone();
    config.text_column = args.text_column.clone();
    let corpus = Corpus::open(spec, &config).with_context(|| format!("opening corpus {spec}"))?;
    let records = corpus.first_records(args.max_prompts.unwrap_or(usize::MAX)).context("reading the corpus")?;
    let mut chat = None;
    let count = records.len();
    let (mut prompts, mut skipped, mut first) = (Vec::new(), 0usize, None);
    for (i, record) in records.into_iter().enumerate().filter(|(i, _)| share.holds(*i)) {
        let prompt = match record {
            Record::Text(text) if args.chat => {
                let chat = match &mut chat {
                    Some(chat) => chat,
                    None => chat.insert(template(tok)?),
                };
                rendered(chat, tok, &serde_json::json!([{ "role": "user", "content": text }]))
            }
            Record::Text(text) => tok.encode(&text).map_err(anyhow::Error::from),
            Record::Conversation(messages) => {
                let chat = match &mut chat {
                    Some(chat) => chat,
                    None => chat.insert(template(tok).context("the corpus holds conversations")?),
                };
                let list = messages.as_array().cloned().unwrap_or_default();
                match list.iter().rposition(|m| m.get("role").and_then(|r| r.as_str()) == Some("user")) {
                    Some(last) => rendered(chat, tok, &serde_json::Value::Array(list[..=last].to_vec())),
                    None => Err(anyhow::anyhow!("the conversation has no user message")),
                }
            }
            Record::Tokens { .. } => Err(anyhow::anyhow!("a line of generate's output is not a prompt")),
            Record::Empty => Err(anyhow::anyhow!("blank")),
            Record::Invalid(reason) => Err(anyhow::anyhow!(reason)),
        };
        match prompt {
            Ok(ids) if !ids.is_empty() => prompts.push((i as u64, ids)),
            Ok(_) => {
                skipped += 1;
                first.get_or_insert(format!("record {i}: no tokens"));
            }
            Err(e) => {
                skipped += 1;
                first.get_or_insert(format!("record {i}: {e:#}"));
            }
        }
    }
    if let Some(first) = first {
        tracing::warn!(skipped, first = %first, "corpus records skipped");
        println!("skipped {skipped} records of the corpus (the first: {first})");
    }
    Ok((count, prompts))
}
