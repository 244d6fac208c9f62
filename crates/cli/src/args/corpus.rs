//! The corpus, tokenization and packing flags `siphon data`, `siphon extract` and `siphon plan`
//! flatten in ([`CorpusArgs`]).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use serde::Serialize;
use siphon_data::{
    ChatTemplate, Corpus, CorpusConfig, FileFormat, InvalidRecords, PackConfig, PackMode, PadSide, Partition, Record,
    Role, Shuffle, SpecialTokens, StreamConfig, TextRecords, Tokenizer, Worker,
};

/// Corpus, tokenization and packing flags, shared by `siphon data` and `siphon extract`.
/// (Serialize: `siphon extract` compares them across hosts.)
#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct CorpusArgs {
    /// Corpus: a parquet/jsonl/text file, a directory, a glob (quote it), a file://, s3://,
    /// gs:// URL (credentials from the usual AWS_*/GOOGLE_* variables), a Hugging Face Hub
    /// dataset's files (`hf://datasets/OWNER/NAME[@REVISION]/PATH-OR-GLOB`) or a Hub dataset
    /// by name (`OWNER/NAME`, with --hf-config and --hf-split); HF_ENDPOINT and HF_TOKEN as
    /// huggingface_hub reads them. Read in place, never downloaded whole.
    #[arg(long, value_name = "SRC")]
    pub corpus: String,
    /// The config of a Hub dataset named OWNER/NAME (default: its card's default).
    #[arg(long, value_name = "NAME")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hf_config: Option<String>,
    /// The split of a Hub dataset named OWNER/NAME (default: train).
    #[arg(long, value_name = "NAME")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hf_split: Option<String>,
    /// Jinja chat template to render conversations with (a record whose --json-field holds a
    /// list of {role, content} messages), instead of the model's own (tokenizer_config.json's
    /// `chat_template`, or a GGUF's `tokenizer.chat_template`).
    #[arg(long, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<PathBuf>,
    /// Keep only the activations of these roles' tokens in conversations (comma-separated:
    /// system, user, assistant, tool, template); the others are dropped, or masked with
    /// --keep-excluded.
    #[arg(long, value_name = "ROLES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roles: Option<String>,
    /// Force the file format instead of going by extension.
    #[arg(long, value_enum)]
    pub format: Option<FormatArg>,
    /// Parquet column holding the text.
    #[arg(long, default_value = "text")]
    pub text_column: String,
    /// JSON field holding the text (jsonl).
    #[arg(long, default_value = "text")]
    pub json_field: String,
    /// What one record of a plain-text file is.
    #[arg(long, value_enum, default_value = "file")]
    pub text_records: TextRecordsArg,
    /// Bytes per work unit of jsonl and line-text files.
    #[arg(long, default_value_t = 8 << 20, value_parser = clap::value_parser!(u64).range(1..=1 << 40))]
    pub unit_bytes: u64,
    /// Longest record (a jsonl or line-text line, a parquet value, a whole text file) in MiB,
    /// default 16: a longer one stops the run naming its file and place (a worker holds a record's
    /// text and token ids, a few times its bytes).
    #[arg(long, value_name = "MiB", value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_record_mb: Option<u64>,
    /// Shuffle the unit order (and, with --shuffle-within-unit, the records in each unit)
    /// with this seed.
    #[arg(long, value_name = "SEED")]
    pub shuffle_seed: Option<u64>,
    /// With --shuffle-seed: also shuffle records within each unit.
    #[arg(long, requires = "shuffle_seed")]
    pub shuffle_within_unit: bool,
    /// Fail on the first unusable record instead of skipping and counting it.
    #[arg(long)]
    pub strict: bool,
    /// Tokens per sequence (at most the model's context, `max_position_embeddings`, unless
    /// `extract --allow-long-context`).
    #[arg(long, value_parser = crate::args::limits::count(1, crate::args::limits::MAX_SEQ))]
    pub seq_len: usize,
    /// Pack documents into full rows (the default): `--pack` lets a document attend the ones
    /// before it in its row; `--pack isolated` packs whole documents, each attending only its
    /// own tokens with positions from 0, so each gets the activations it gets alone (as with
    /// --pad, without the padding).
    #[arg(long, value_enum, value_name = "HOW", num_args = 0..=1, default_missing_value = "joined", conflicts_with = "pad")]
    pub pack: Option<PackArg>,
    /// One document per row, truncated and padded on this side.
    #[arg(long, value_enum, value_name = "SIDE")]
    pub pad: Option<PadSideArg>,
    /// Sequences per batch: per host, or per step of the whole mesh when the mesh spans hosts
    /// (as `siphon plan --batch`; each data group then reads its share).
    #[arg(long, default_value_t = 8, value_parser = crate::args::limits::count(1, crate::args::limits::MAX_BATCH))]
    pub batch_size: usize,
    /// BOS token (name or id), or `none`; default: detected from the tokenizer.
    #[arg(long, value_name = "TOKEN")]
    pub bos_token: Option<String>,
    /// EOS token (name or id), or `none`; default: detected from the tokenizer.
    #[arg(long, value_name = "TOKEN")]
    pub eos_token: Option<String>,
    /// Pad token (name or id); default: detected, else EOS.
    #[arg(long, value_name = "TOKEN")]
    pub pad_token: Option<String>,
    /// Do not put BOS before documents.
    #[arg(long)]
    pub no_doc_bos: bool,
    /// Do not put EOS after documents (pack mode puts it by default).
    #[arg(long)]
    pub no_doc_eos: bool,
    /// Pack mode: do not start every row with BOS.
    #[arg(long)]
    pub no_row_bos: bool,
    /// More tokens (names or ids) to exclude from activations wherever they occur.
    #[arg(long, value_name = "TOKEN", value_delimiter = ',')]
    pub exclude_token: Vec<String>,
    /// Tokenizer threads (default: available cores).
    #[arg(long, value_parser = crate::args::limits::count(1, crate::args::limits::MAX_SMALL_COUNT))]
    pub tokenizer_threads: Option<usize>,
}

/// `--pack` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PackArg {
    /// Documents one after another, each attending the ones before it in its row.
    Joined,
    /// Whole documents, each attending only itself.
    Isolated,
}

/// `--format` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FormatArg {
    Parquet,
    Jsonl,
    Text,
}

/// `--text-records` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TextRecordsArg {
    /// One document per file.
    File,
    /// One document per non-blank line.
    Line,
}

/// `--pad` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PadSideArg {
    Left,
    Right,
}

impl CorpusArgs {
    /// How to read the corpus (no I/O).
    pub fn corpus_config(&self) -> CorpusConfig {
        let mut config = CorpusConfig::default();
        config.format = self.format.map(|f| match f {
            FormatArg::Parquet => FileFormat::Parquet,
            FormatArg::Jsonl => FileFormat::Jsonl,
            FormatArg::Text => FileFormat::Text,
        });
        config.text_column = self.text_column.clone();
        config.json_field = self.json_field.clone();
        config.text_records = match self.text_records {
            TextRecordsArg::File => TextRecords::File,
            TextRecordsArg::Line => TextRecords::Line,
        };
        config.unit_bytes = self.unit_bytes;
        if let Some(mb) = self.max_record_mb {
            config.max_record_bytes = mb << 20;
        }
        config.shuffle = self.shuffle_seed.map(|seed| Shuffle { seed, within_unit: self.shuffle_within_unit });
        config.invalid = if self.strict { InvalidRecords::Error } else { InvalidRecords::Skip };
        config.hub_config = self.hf_config.clone();
        config.hub_split = self.hf_split.clone();
        config
    }

    /// Opens the corpus (lists files, reads parquet footers) and reads it up to its first
    /// usable record: a corpus of nothing (every file empty, every record blank or unusable)
    /// is refused here, before any work, rather than completing a run of 0 tokens.
    pub fn open(&self) -> anyhow::Result<Corpus> {
        self.check_names()?;
        let corpus = Corpus::open(&self.corpus, &self.corpus_config())
            .with_context(|| format!("opening corpus {}", self.corpus))?;
        corpus.check_usable().with_context(|| format!("corpus {}", self.corpus))?;
        Ok(corpus)
    }

    /// The names the corpus is read by (a column, a field, a Hub config or split) are not
    /// empty: an empty one would name nothing, or (a path) the current directory.
    fn check_names(&self) -> anyhow::Result<()> {
        let names = [
            ("--corpus", Some(&self.corpus)),
            ("--text-column", Some(&self.text_column)),
            ("--json-field", Some(&self.json_field)),
            ("--hf-config", self.hf_config.as_ref()),
            ("--hf-split", self.hf_split.as_ref()),
        ];
        for (flag, value) in names {
            if value.is_some_and(|v| v.trim().is_empty()) {
                bail!("{flag} is empty");
            }
        }
        Ok(())
    }

    /// Packing options: `base` holds the special tokens the model defines (from GGUF
    /// metadata, or [`SpecialTokens::detect`] for a tokenizer.json); the flags override it.
    pub fn pack_config(&self, tokenizer: &Tokenizer, base: SpecialTokens) -> anyhow::Result<PackConfig> {
        let mut special = base;
        let token = |spec: &str| siphon_data::parse_token(tokenizer, spec).with_context(|| format!("token {spec:?}"));
        if let Some(spec) = &self.bos_token {
            special.bos = if spec == "none" { None } else { Some(token(spec)?) };
        }
        if let Some(spec) = &self.eos_token {
            special.eos = if spec == "none" { None } else { Some(token(spec)?) };
        }
        if let Some(spec) = &self.pad_token {
            special.pad = token(spec)?;
        }
        for spec in &self.exclude_token {
            special.exclude.push(token(spec)?);
        }
        let mode = match (self.pad, self.pack) {
            (Some(PadSideArg::Left), _) => PackMode::Pad(PadSide::Left),
            (Some(PadSideArg::Right), _) => PackMode::Pad(PadSide::Right),
            (None, Some(PackArg::Isolated)) => PackMode::Isolated,
            (None, _) => PackMode::Pack,
        };
        let mut config = PackConfig::new(self.seq_len, mode, special);
        config.doc_bos &= !self.no_doc_bos;
        config.doc_eos &= !self.no_doc_eos;
        config.row_bos &= !self.no_row_bos;
        config.keep_roles = self.keep_roles()?;
        Ok(config)
    }

    /// `--roles`, parsed.
    fn keep_roles(&self) -> anyhow::Result<Option<Vec<Role>>> {
        let Some(list) = &self.roles else { return Ok(None) };
        let roles = list
            .split(',')
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(|r| {
                Role::parse(r)
                    .with_context(|| format!("--roles: {r:?} is not one of system, user, assistant, tool, template"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        if roles.is_empty() {
            bail!("--roles names no role");
        }
        Ok(Some(roles))
    }

    /// The chat template the corpus's conversations are rendered with, when its first records
    /// are conversations: `--chat-template`, else the model's (`model_template`, with the
    /// model's `special` tokens in its context); checked on the first conversation. `None` for
    /// a corpus of text, where `--roles` is an error.
    pub fn chat(
        &self,
        corpus: &Corpus,
        model_template: Option<&str>,
        special: &[(String, String)],
    ) -> anyhow::Result<Option<Arc<ChatTemplate>>> {
        let records = corpus.first_records(16).context("reading the corpus's first records")?;
        let Some(first) = records.iter().find_map(|r| match r {
            Record::Conversation(messages) => Some(messages),
            _ => None,
        }) else {
            // `siphon generate`'s lines carry their roles (prompt and completion) without a template.
            let tokens = records.iter().any(|r| matches!(r, Record::Tokens { .. }));
            if self.roles.is_some() && !tokens {
                bail!(
                    "--roles keeps the tokens of some roles of conversations, and the corpus's first records are not \
                     conversations (a --json-field holding a list of {{role, content}} messages)"
                );
            }
            return Ok(None);
        };
        let source = match (&self.chat_template, model_template) {
            (Some(path), _) => siphon_data::read_text_file(path)
                .with_context(|| format!("reading --chat-template {}", path.display()))?,
            (None, Some(source)) => source.to_string(),
            (None, None) => bail!(
                "the corpus holds conversations (its --json-field {:?} is a list of messages) and the model has no \
                 chat template: give one with --chat-template FILE",
                self.json_field
            ),
        };
        let special: Vec<(&str, &str)> = special.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let template = ChatTemplate::new(&source, &special)?;
        template.render(first).map_err(|e| anyhow::anyhow!("the corpus's first conversation: {e}"))?;
        Ok(Some(Arc::new(template)))
    }

    /// Stream options for one worker.
    pub fn stream_config(&self, pack: PackConfig, partition: Partition, worker: Worker) -> StreamConfig {
        let mut config = StreamConfig::new(pack, self.batch_size);
        config.partition = partition;
        config.worker = worker;
        if let Some(threads) = self.tokenizer_threads {
            config.threads = threads;
        }
        config
    }
}
