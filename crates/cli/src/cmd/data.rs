//! `siphon data`: show how a corpus is split over machines and hosts before a run (per
//! worker: units, sequences, tokens, first and last sequence), or with `--bench` the
//! tokenization + packing throughput. (The text → parquet converter for the demo corpus is
//! the siphon-data example `make_parquet`, run by scripts/setup-corpus.sh.)
//!
//! [`CorpusArgs`] holds every corpus and packing flag so that `siphon extract` can flatten it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use serde::Serialize;
use siphon_data::{
    ChatTemplate, Corpus, CorpusConfig, DataStats, FileFormat, InvalidRecords, PackConfig, PackMode, PadSide,
    Partition, Position, Record, Role, SeqId, Shuffle, SpecialTokens, StreamConfig, TextRecords, Tokenizer, UnitKind,
    Worker,
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
    /// Longest record (a jsonl or line-text line, a parquet value) in MiB, default 16: a longer
    /// one stops the run naming its file and place (tokenizing a record takes ~100× its bytes).
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
    #[arg(long, value_parser = crate::cmd::limits::count(1, crate::cmd::limits::MAX_SEQ))]
    pub seq_len: usize,
    /// Pack documents into full rows (the default).
    #[arg(long, conflicts_with = "pad")]
    pub pack: bool,
    /// One document per row, truncated and padded on this side.
    #[arg(long, value_enum, value_name = "SIDE")]
    pub pad: Option<PadSideArg>,
    /// Sequences per batch: per host, or per step of the whole mesh when the mesh spans hosts
    /// (as `siphon plan --batch`; each data group then reads its share).
    #[arg(long, default_value_t = 8, value_parser = crate::cmd::limits::count(1, crate::cmd::limits::MAX_BATCH))]
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
    #[arg(long, value_parser = crate::cmd::limits::count(1, crate::cmd::limits::MAX_SMALL_COUNT))]
    pub tokenizer_threads: Option<usize>,
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

    /// Opens the corpus (lists files, reads parquet footers).
    pub fn open(&self) -> anyhow::Result<Corpus> {
        Corpus::open(&self.corpus, &self.corpus_config()).with_context(|| format!("opening corpus {}", self.corpus))
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
        let mode = match self.pad {
            None => PackMode::Pack,
            Some(PadSideArg::Left) => PackMode::Pad(PadSide::Left),
            Some(PadSideArg::Right) => PackMode::Pad(PadSide::Right),
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
            if self.roles.is_some() {
                bail!(
                    "--roles keeps the tokens of some roles of conversations, and the corpus's first records are not \
                     conversations (a --json-field holding a list of {{role, content}} messages)"
                );
            }
            return Ok(None);
        };
        let source = match (&self.chat_template, model_template) {
            (Some(path), _) => {
                std::fs::read_to_string(path).with_context(|| format!("reading --chat-template {}", path.display()))?
            }
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

/// Loads a tokenizer and the special tokens it implies: a tokenizer.json, an HF model
/// directory (tokenizer.json + tokenizer_config.json) or a .gguf file (its `tokenizer.ggml.*`
/// metadata, built by siphon-models), with the chat template the latter two carry. Special
/// tokens are detected on the resulting tokenizer exactly as `siphon extract` does, so the
/// partition shown here is the one a run gets.
pub fn load_tokenizer(path: &Path) -> anyhow::Result<(siphon_models::TextTokenizer, SpecialTokens)> {
    let tokenizer = if path.extension().is_some_and(|e| e == "gguf") {
        let file = siphon_models::gguf::GgufFile::open(path).with_context(|| format!("opening {}", path.display()))?;
        siphon_models::TextTokenizer::from_gguf(&file)
            .with_context(|| format!("building the tokenizer of {}", path.display()))?
    } else if path.is_dir() {
        match siphon_models::TextTokenizer::from_hf_dir(path).with_context(|| format!("reading {}", path.display()))? {
            Some(t) => t,
            None => bail!("{} has no tokenizer.json", path.display()),
        }
    } else {
        siphon_models::TextTokenizer::new(siphon_data::load_tokenizer(path)?, None, None, None)
    };
    let special = SpecialTokens::detect(tokenizer.inner());
    Ok((tokenizer, special))
}

/// The model's chat template and special tokens from a loaded tokenizer, for [`CorpusArgs::chat`].
fn chat_of(
    args: &CorpusArgs,
    corpus: &Corpus,
    tokenizer: &siphon_models::TextTokenizer,
) -> anyhow::Result<Option<Arc<ChatTemplate>>> {
    args.chat(corpus, tokenizer.chat_template.as_deref(), &tokenizer.special_tokens)
}

/// The first conversation of the corpus rendered with `chat`, each message's text marked
/// with its role: `[assistant]Hello![/assistant]`.
fn rendered_example(corpus: &Corpus, chat: &ChatTemplate) -> anyhow::Result<Option<String>> {
    let records = corpus.first_records(16)?;
    let Some(messages) = records.iter().find_map(|r| match r {
        Record::Conversation(m) => Some(m),
        _ => None,
    }) else {
        return Ok(None);
    };
    let rendered = chat.render(messages).map_err(|e| anyhow::anyhow!(e))?;
    let mut out = String::new();
    let mut at = 0;
    for (span, role) in &rendered.spans {
        out.push_str(&rendered.text[at..span.start]);
        out.push_str(&format!("[{0}]{1}[/{0}]", role.name(), &rendered.text[span.clone()]));
        at = span.end;
    }
    out.push_str(&rendered.text[at..]);
    Ok(Some(out))
}

/// `siphon data`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    corpus: CorpusArgs,
    /// tokenizer.json, an HF model directory, or a .gguf model file.
    #[arg(long)]
    tokenizer: PathBuf,
    /// Number of machines.
    #[arg(long, default_value_t = 1)]
    machines: u32,
    /// Hosts per machine.
    #[arg(long, default_value_t = 1)]
    hosts: u32,
    /// Only list the units per worker; do not read or tokenize the corpus.
    #[arg(long)]
    plan_only: bool,
    /// Instead of the partition, measure tokenization + packing throughput over the whole
    /// corpus with each of these tokenizer thread counts (e.g. `--bench 1,2`).
    #[arg(long, value_name = "THREADS", value_delimiter = ',', conflicts_with = "plan_only")]
    bench: Vec<usize>,
    /// Benchmark passes per thread count (the fastest is reported).
    #[arg(long, default_value_t = 2)]
    bench_repeat: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.bench.is_empty() { show_partition(args) } else { bench(args) }
}

/// What one worker would get.
#[derive(Serialize)]
struct WorkerReport {
    machine: u32,
    host: u32,
    units: usize,
    /// Parquet rows in the worker's row-group units.
    rows: u64,
    /// Bytes of the worker's byte-range and whole-file units.
    bytes: u64,
    sequences: u64,
    tokens: u64,
    batches: u64,
    first: Option<SeqReport>,
    last: Option<SeqReport>,
    end: Option<Position>,
    stats: Option<DataStats>,
}

#[derive(Serialize)]
struct SeqReport {
    id: SeqId,
    location: String,
}

#[derive(Serialize)]
struct ShowReport {
    corpus: String,
    files: usize,
    units: usize,
    fingerprint: String,
    machines: u32,
    hosts: u32,
    seq_len: usize,
    /// The corpus's first conversation through the chat template, roles marked.
    #[serde(skip_serializing_if = "Option::is_none")]
    example: Option<String>,
    workers: Vec<WorkerReport>,
}

fn show_partition(args: Args) -> anyhow::Result<()> {
    let partition = Partition { machines: args.machines, hosts: args.hosts };
    if partition.workers() == 0 {
        bail!("--machines and --hosts must be at least 1");
    }
    let corpus = args.corpus.open()?;
    let (text_tokenizer, special) = load_tokenizer(&args.tokenizer)?;
    let pack = args.corpus.pack_config(text_tokenizer.inner(), special)?;
    let chat = chat_of(&args.corpus, &corpus, &text_tokenizer)?;
    let example = match &chat {
        Some(chat) if !args.plan_only => rendered_example(&corpus, chat)?,
        _ => None,
    };
    let tokenizer = Arc::new(text_tokenizer.inner().clone());
    let mut workers = Vec::new();
    for worker in partition.all_workers() {
        let ordinals: Vec<u64> = corpus.worker_ordinals(partition, worker)?.collect();
        let (mut rows, mut bytes) = (0, 0);
        for &o in &ordinals {
            let unit = corpus.unit_at(o).expect("ordinal in plan");
            match unit.kind {
                UnitKind::RowGroup { rows: r, .. } => rows += r,
                UnitKind::Bytes { start, end } => bytes += end - start,
                UnitKind::WholeFile => bytes += corpus.files()[unit.file as usize].size,
            }
        }
        let mut report = WorkerReport {
            machine: worker.machine,
            host: worker.host,
            units: ordinals.len(),
            rows,
            bytes,
            sequences: 0,
            tokens: 0,
            batches: 0,
            first: None,
            last: None,
            end: None,
            stats: None,
        };
        if !args.plan_only {
            let mut config = args.corpus.stream_config(pack.clone(), partition, worker);
            config.chat = chat.clone();
            let mut stream = corpus.stream(tokenizer.clone(), config)?;
            let describe =
                |id: SeqId| SeqReport { id, location: corpus.describe_unit(&corpus.units()[id.unit as usize]) };
            for batch in stream.by_ref() {
                let batch = batch.with_context(|| {
                    format!("reading the corpus for machine {} host {}", worker.machine, worker.host)
                })?;
                if report.first.is_none() {
                    report.first = batch.ids.first().map(|&id| describe(id));
                }
                report.last = batch.ids.last().map(|&id| describe(id));
            }
            let stats = stream.stats().clone();
            report.sequences = stats.sequences;
            report.tokens = stats.tokens;
            report.batches = stats.batches;
            report.end = Some(stream.position().clone());
            report.stats = Some(stats);
        }
        workers.push(report);
    }
    let report = ShowReport {
        corpus: args.corpus.corpus.clone(),
        files: corpus.files().len(),
        units: corpus.units().len(),
        fingerprint: format!("{:016x}", corpus.fingerprint()),
        machines: args.machines,
        hosts: args.hosts,
        seq_len: pack.seq_len,
        example,
        workers,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "corpus {}: {} files, {} units, plan {}; {} machines x {} hosts, seq_len {}",
        report.corpus, report.files, report.units, report.fingerprint, report.machines, report.hosts, report.seq_len
    );
    if let Some(example) = &report.example {
        println!(
            "first conversation through the chat template (each message's text marked with its role):\n{example}\n"
        );
    }
    println!(
        "{:>7} {:>4} {:>6} {:>10} {:>12} {:>14} {:>8}  first .. last",
        "machine", "host", "units", "rows", "bytes", "sequences", "tokens"
    );
    for w in &report.workers {
        let seqs = |s: &Option<SeqReport>| {
            s.as_ref().map_or("-".to_string(), |s| format!("{}#{} {}", s.id.unit, s.id.index, s.location))
        };
        println!(
            "{:>7} {:>4} {:>6} {:>10} {:>12} {:>14} {:>8}  {} .. {}",
            w.machine,
            w.host,
            w.units,
            w.rows,
            w.bytes,
            if args.plan_only { "-".to_string() } else { w.sequences.to_string() },
            if args.plan_only { "-".to_string() } else { w.tokens.to_string() },
            seqs(&w.first),
            seqs(&w.last)
        );
    }
    if !args.plan_only {
        let total = report.workers.iter().filter_map(|w| w.stats.as_ref()).fold(DataStats::default(), |mut a, s| {
            a.documents += s.documents;
            a.empty += s.empty;
            a.invalid += s.invalid;
            a.truncated += s.truncated;
            a.sequences += s.sequences;
            a.tokens += s.tokens;
            a
        });
        println!(
            "total: {} sequences, {} tokens, {} documents; skipped {} empty and {} invalid records; {} documents truncated",
            total.sequences, total.tokens, total.documents, total.empty, total.invalid, total.truncated
        );
    }
    Ok(())
}

#[derive(Serialize)]
struct BenchRow {
    threads: usize,
    seconds: f64,
    tokens: u64,
    documents: u64,
    sequences: u64,
    tokens_per_second: f64,
}

fn bench(args: Args) -> anyhow::Result<()> {
    let corpus = args.corpus.open()?;
    let (text_tokenizer, special) = load_tokenizer(&args.tokenizer)?;
    let pack = args.corpus.pack_config(text_tokenizer.inner(), special)?;
    let chat = chat_of(&args.corpus, &corpus, &text_tokenizer)?;
    let tokenizer = Arc::new(text_tokenizer.inner().clone());
    let mut rows = Vec::new();
    for &threads in &args.bench {
        let mut best: Option<BenchRow> = None;
        for _ in 0..args.bench_repeat.max(1) {
            let mut config = args.corpus.stream_config(pack.clone(), Partition::SINGLE, Worker { machine: 0, host: 0 });
            config.threads = threads;
            config.chat = chat.clone();
            let start = Instant::now();
            let mut stream = corpus.stream(tokenizer.clone(), config)?;
            for batch in stream.by_ref() {
                std::hint::black_box(batch?);
            }
            let seconds = start.elapsed().as_secs_f64();
            let stats = stream.stats();
            let row = BenchRow {
                threads,
                seconds,
                tokens: stats.tokens,
                documents: stats.documents,
                sequences: stats.sequences,
                tokens_per_second: stats.tokens as f64 / seconds,
            };
            if best.as_ref().is_none_or(|b| row.seconds < b.seconds) {
                best = Some(row);
            }
        }
        rows.push(best.expect("at least one pass"));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        for r in &rows {
            println!(
                "threads {}: {} tokens ({} documents, {} sequences) in {:.3} s = {:.0} tokens/s",
                r.threads, r.tokens, r.documents, r.sequences, r.seconds, r.tokens_per_second
            );
        }
    }
    Ok(())
}
