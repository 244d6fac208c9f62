//! Tokenization + packing throughput of the data path over a whole corpus, for several
//! tokenizer thread counts. The recorded numbers live in docs/BENCHMARKS.md.
//!
//! `cargo run --release -p siphon-data --example data_bench -- CORPUS TOKENIZER_JSON
//!  [--seq-len N] [--threads 1,2] [--repeat N] [--pad left|right]`

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use siphon_data::{Corpus, CorpusConfig, PackConfig, PackMode, PadSide, SpecialTokens, StreamConfig};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut positional = Vec::new();
    let mut seq_len = 1024;
    let mut threads = vec![1, 2];
    let mut repeat = 3;
    let mut mode = PackMode::Pack;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seq-len" => seq_len = args.next().ok_or("--seq-len needs a value")?.parse()?,
            "--repeat" => repeat = args.next().ok_or("--repeat needs a value")?.parse()?,
            "--threads" => {
                threads = args
                    .next()
                    .ok_or("--threads needs a value")?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--pad" => {
                mode = match args.next().as_deref() {
                    Some("left") => PackMode::Pad(PadSide::Left),
                    Some("right") => PackMode::Pad(PadSide::Right),
                    other => return Err(format!("--pad left|right, not {other:?}").into()),
                }
            }
            _ => positional.push(arg),
        }
    }
    let [corpus, tokenizer] = positional.as_slice() else {
        return Err(
            "usage: data_bench CORPUS TOKENIZER_JSON [--seq-len N] [--threads 1,2] [--repeat N] [--pad left|right]"
                .into(),
        );
    };
    let corpus = Corpus::open(corpus, &CorpusConfig::default())?;
    let tokenizer = Arc::new(siphon_data::load_tokenizer(tokenizer.as_ref())?);
    let special = SpecialTokens::detect(&tokenizer);
    let bytes: u64 = corpus.files().iter().map(|f| f.size).sum();
    println!(
        "corpus: {} files, {} units, {} bytes on disk; seq_len {seq_len}, {mode:?}",
        corpus.files().len(),
        corpus.units().len(),
        bytes
    );
    for &t in &threads {
        let mut best = f64::INFINITY;
        let mut stats = None;
        for _ in 0..repeat.max(1) {
            let mut config = StreamConfig::new(PackConfig::new(seq_len, mode, special.clone()), 32);
            config.threads = t;
            let start = Instant::now();
            let mut stream = corpus.stream(tokenizer.clone(), config)?;
            for batch in stream.by_ref() {
                std::hint::black_box(batch?);
            }
            let secs = start.elapsed().as_secs_f64();
            if secs < best {
                best = secs;
                stats = Some(stream.stats().clone());
            }
        }
        let s = stats.expect("at least one pass");
        println!(
            "threads {t}: {} tokens, {} documents, {} sequences in {best:.3} s (best of {repeat}) = {:.0} tokens/s",
            s.tokens,
            s.documents,
            s.sequences,
            s.tokens as f64 / best
        );
    }
    Ok(())
}
