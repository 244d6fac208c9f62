//! `siphon data`: show how a corpus is split over machines and hosts before a run (per
//! worker: units, sequences, tokens, first and last sequence), or with `--bench` the
//! tokenization + packing throughput. (The text → parquet converter for the demo corpus is
//! siphon-data's binary `make-parquet`, run by scripts/setup-corpus.sh.)
//!
//! [`CorpusArgs`] holds every corpus and packing flag so that `siphon extract` can flatten it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use serde::Serialize;
use siphon_data::{
    ChatTemplate, Corpus, DataStats, Partition, Position, Record, SeqId, SpecialTokens, UnitKind, Worker,
};

use crate::args::CorpusArgs;
use crate::args::limits::{MAX_SMALL_COUNT, count};

/// Workers (machines × hosts) a partition is shown for: each is read on its own, so the count
/// bounds how long `siphon data` runs whatever the corpus (65536 hosts is past any job's).
const MAX_WORKERS: i64 = 1 << 16;

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
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=MAX_WORKERS))]
    machines: u32,
    /// Hosts per machine.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=MAX_WORKERS))]
    hosts: u32,
    /// Only list the units per worker; do not read or tokenize the corpus.
    #[arg(long)]
    plan_only: bool,
    /// Instead of the partition, measure tokenization + packing throughput over the whole
    /// corpus with each of these tokenizer thread counts (e.g. `--bench 1,2`).
    #[arg(long, value_name = "THREADS", value_delimiter = ',', conflicts_with = "plan_only",
          value_parser = count(1, MAX_SMALL_COUNT))]
    bench: Vec<usize>,
    /// Benchmark passes per thread count (the fastest is reported).
    #[arg(long, default_value_t = 2, value_parser = count(1, MAX_SMALL_COUNT))]
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
    if partition.workers() > MAX_WORKERS as u64 {
        bail!(
            "--machines {} × --hosts {} is {} workers, more than {MAX_WORKERS}",
            args.machines,
            args.hosts,
            partition.workers()
        );
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
    let total = report.workers.iter().filter_map(|w| w.stats.as_ref()).fold(DataStats::default(), |mut a, s| {
        a.documents += s.documents;
        a.empty += s.empty;
        a.invalid += s.invalid;
        a.truncated += s.truncated;
        a.records += s.records;
        a.sequences += s.sequences;
        a.tokens += s.tokens;
        a
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_partition(&report, &total, args.plan_only);
    }
    if !args.plan_only {
        no_tokens(&report.corpus, &total)?;
    }
    Ok(())
}

/// The partition as a table, and the totals when the corpus was read.
fn print_partition(report: &ShowReport, total: &DataStats, plan_only: bool) {
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
            if plan_only { "-".to_string() } else { w.sequences.to_string() },
            if plan_only { "-".to_string() } else { w.tokens.to_string() },
            seqs(&w.first),
            seqs(&w.last)
        );
    }
    if !plan_only {
        println!(
            "total: {} sequences, {} tokens, {} documents; skipped {} empty and {} invalid records; {} documents truncated",
            total.sequences, total.tokens, total.documents, total.empty, total.invalid, total.truncated
        );
    }
}

/// A corpus read to its end that gave no token is an error: its records (the up-front check
/// found a usable one) all tokenized to nothing.
fn no_tokens(corpus: &str, total: &DataStats) -> anyhow::Result<()> {
    if total.tokens == 0 {
        bail!(
            "corpus {corpus} gave no token: of its {} records read, {} were blank or tokenized to nothing and {} were \
             unusable",
            total.records,
            total.empty,
            total.invalid
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
        for _ in 0..args.bench_repeat {
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
            no_tokens(&args.corpus.corpus, stats)?;
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
