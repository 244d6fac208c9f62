//! The Shakespeare demo corpus built by scripts/setup-corpus.sh (path in SIPHON_DEMO_CORPUS,
//! set by scripts/test.sh) reads as a multi-file, multi-row-group parquet corpus.

mod common;

use common::*;
use siphon_data::{Corpus, CorpusConfig, PackMode, Partition, UnitKind};

#[test]
fn the_shakespeare_demo_corpus_reads_and_partitions() {
    let Ok(path) = std::env::var("SIPHON_DEMO_CORPUS") else {
        eprintln!("note: SIPHON_DEMO_CORPUS is not set (scripts/test.sh sets it); skipping the demo corpus test");
        return;
    };
    let corpus = Corpus::open(&path, &CorpusConfig::default()).unwrap();
    assert_eq!(corpus.files().len(), 4, "{:?}", corpus.files());
    let rows: u64 = corpus
        .units()
        .iter()
        .map(|u| match u.kind {
            UnitKind::RowGroup { rows, .. } => rows,
            other => panic!("unexpected unit {other:?}"),
        })
        .sum();
    assert!(corpus.units().len() >= 8 && rows > 4000, "{} units, {rows} rows", corpus.units().len());

    // Every row is a non-empty chunk of a work: all of them become documents.
    let mut stream = corpus.stream(tokenizer(), stream_config(1024, PackMode::Pack, 16)).unwrap();
    let mut first_text = None;
    for batch in stream.by_ref() {
        let batch = batch.unwrap();
        if first_text.is_none() {
            let bytes: Vec<u8> = batch.sequence(0).iter().filter(|&&t| t < 256).map(|&t| t as u8).collect();
            first_text = Some(String::from_utf8_lossy(&bytes).into_owned());
        }
    }
    let stats = stream.stats().clone();
    assert_eq!(stats.documents, rows);
    assert_eq!((stats.invalid, stats.empty), (0, 0));
    // Files are sorted: the first work alphabetically opens the stream.
    assert!(first_text.unwrap().to_lowercase().contains("all's well"), "first sequence is not from All's Well");

    // Sequence counts add up over a 2 x 3 partition.
    let partition = Partition { machines: 2, hosts: 3 };
    let mut sequences = 0;
    for worker in partition.all_workers() {
        let mut config = stream_config(1024, PackMode::Pack, 16);
        config.partition = partition;
        config.worker = worker;
        let mut s = corpus.stream(tokenizer(), config).unwrap();
        s.by_ref().for_each(|b| drop(b.unwrap()));
        sequences += s.stats().sequences;
    }
    assert_eq!(sequences, stats.sequences);
}
