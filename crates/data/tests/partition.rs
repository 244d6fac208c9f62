//! The partition and resume contract: all workers together produce exactly the
//! single-worker stream, and resuming from any recorded position yields exactly the rest.

mod common;

use std::collections::BTreeMap;

use common::*;
use siphon_data::{Corpus, CorpusConfig, PackMode, PadSide, Partition, Position, SeqId, Shuffle, TextRecords, Worker};

/// A mixed corpus: three parquet files with several row groups, a jsonl file cut into
/// several byte units, and two whole-file text documents.
fn mixed_corpus(dir: &std::path::Path) {
    let mut n = 0;
    for (f, (rows, per_group)) in [(30usize, 6usize), (14, 5), (21, 4)].into_iter().enumerate() {
        let texts: Vec<Option<String>> = (0..rows)
            .map(|_| {
                n += 1;
                if n % 11 == 0 { None } else { Some(doc_text(n)) }
            })
            .collect();
        write_parquet(&dir.join(format!("part-{f}.parquet")), &texts, per_group);
    }
    let jsonl: String = (0..40).map(|i| format!("{{\"text\": {:?}}}\n", doc_text(1000 + i))).collect();
    std::fs::write(dir.join("web.jsonl"), jsonl).unwrap();
    std::fs::create_dir(dir.join("books")).unwrap();
    std::fs::write(dir.join("books/a.txt"), doc_text(2000).repeat(3)).unwrap();
    std::fs::write(dir.join("books/b.txt"), doc_text(2001)).unwrap();
}

fn corpus_config() -> CorpusConfig {
    let mut config = CorpusConfig::default();
    config.unit_bytes = 700;
    config
}

#[test]
fn every_partition_up_to_8x8_covers_the_corpus_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    mixed_corpus(dir.path());
    let corpus = Corpus::open(dir.path().to_str().unwrap(), &corpus_config()).unwrap();
    assert!(corpus.units().len() >= 20, "corpus has {} units", corpus.units().len());
    assert_eq!(corpus.files().len(), 6);

    for mode in [PackMode::Pack, PackMode::Pad(PadSide::Left), PackMode::Isolated] {
        let mut single = stream_config(24, mode, 5);
        single.threads = 3;
        let reference = rows(&corpus, single);
        let reference_by_id: BTreeMap<SeqId, &Row> = reference.iter().map(|r| (r.id, r)).collect();
        assert_eq!(reference_by_id.len(), reference.len(), "sequence ids are unique");
        assert!(reference.len() > 40);

        for machines in 1..=8u32 {
            for hosts in 1..=8u32 {
                let partition = Partition { machines, hosts };
                let mut union: BTreeMap<SeqId, Row> = BTreeMap::new();
                for worker in partition.all_workers() {
                    let mut config = stream_config(24, mode, 5);
                    config.threads = 1;
                    config.partition = partition;
                    config.worker = worker;
                    let got = rows(&corpus, config);
                    // Each worker's rows appear in the single stream's order.
                    let positions: Vec<usize> = got
                        .iter()
                        .map(|r| reference.iter().position(|x| x.id == r.id).expect("row exists in the single stream"))
                        .collect();
                    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{machines}x{hosts} {worker:?} out of order");
                    for row in got {
                        let id = row.id;
                        assert!(union.insert(id, row).is_none(), "{machines}x{hosts}: duplicate sequence {id:?}");
                    }
                }
                assert_eq!(union.len(), reference.len(), "{machines}x{hosts}: sequences missing");
                for (id, row) in &union {
                    assert_eq!(reference_by_id[id], row, "{machines}x{hosts}: sequence {id:?} differs");
                }
            }
        }
    }
}

fn check_resume(corpus: &Corpus, make: &dyn Fn() -> siphon_data::StreamConfig) {
    let full = batches(corpus, make());
    assert!(full.len() >= 4, "need several batches, got {}", full.len());
    for cut in 0..full.len() {
        // Positions travel through JSON (shard manifests store them as opaque JSON).
        let json = serde_json::to_string(&full[cut].position).unwrap();
        let position: Position = serde_json::from_str(&json).unwrap();
        let mut config = make();
        config.resume = Some(position);
        let rest = batches(corpus, config);
        assert_eq!(rest.len(), full.len() - cut - 1, "resume after batch {cut}");
        for (a, b) in rest.iter().zip(&full[cut + 1..]) {
            assert_eq!(a, b, "resume after batch {cut}");
        }
    }
    assert!(full.last().unwrap().position.is_end());
}

#[test]
fn resuming_from_any_recorded_position_yields_exactly_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    mixed_corpus(dir.path());
    let corpus = Corpus::open(dir.path().to_str().unwrap(), &corpus_config()).unwrap();
    for mode in [PackMode::Pack, PackMode::Pad(PadSide::Right), PackMode::Isolated] {
        // Odd sizes so that batches end mid-unit, rows mid-document and (isolated) mid-window.
        check_resume(&corpus, &|| stream_config(17, mode, 3));
        check_resume(&corpus, &|| {
            let mut c = stream_config(17, mode, 4);
            c.partition = Partition { machines: 2, hosts: 2 };
            c.worker = Worker { machine: 1, host: 0 };
            c
        });
    }
}

#[test]
fn seeded_shuffle_is_deterministic_and_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    mixed_corpus(dir.path());
    let mut config = corpus_config();
    config.shuffle = Some(Shuffle { seed: 42, within_unit: true });
    let shuffled = Corpus::open(dir.path().to_str().unwrap(), &config).unwrap();
    let again = Corpus::open(dir.path().to_str().unwrap(), &config).unwrap();
    assert_eq!(shuffled.order(), again.order());
    assert_ne!(shuffled.order(), (0..shuffled.units().len() as u32).collect::<Vec<_>>());

    let plain = Corpus::open(dir.path().to_str().unwrap(), &corpus_config()).unwrap();
    let pad = || stream_config(400, PackMode::Pad(PadSide::Right), 4);
    let mut a = doc_texts(&rows(&plain, pad()));
    let mut b = doc_texts(&rows(&shuffled, pad()));
    assert_ne!(a, b, "shuffling changes the order");
    a.sort();
    b.sort();
    assert_eq!(a, b, "shuffling keeps the documents");

    check_resume(&shuffled, &|| stream_config(19, PackMode::Pack, 3));
    let single = rows(&shuffled, stream_config(19, PackMode::Pack, 3));
    let mut union = Vec::new();
    let partition = Partition { machines: 3, hosts: 2 };
    for worker in partition.all_workers() {
        let mut c = stream_config(19, PackMode::Pack, 3);
        c.partition = partition;
        c.worker = worker;
        union.extend(rows(&shuffled, c));
    }
    union.sort_by_key(|r| r.id);
    let mut single_sorted = single.clone();
    single_sorted.sort_by_key(|r| r.id);
    assert_eq!(union, single_sorted);
}

#[test]
fn a_position_from_another_setup_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    mixed_corpus(dir.path());
    let corpus = Corpus::open(dir.path().to_str().unwrap(), &corpus_config()).unwrap();
    let first = batches(&corpus, stream_config(17, PackMode::Pack, 3)).remove(0);

    let mut other_len = stream_config(18, PackMode::Pack, 3);
    other_len.resume = Some(first.position.clone());
    let err = corpus.stream(tokenizer(), other_len).err().expect("different packing must be refused");
    assert!(err.to_string().contains("cannot resume"), "{err}");

    let mut other_partition = stream_config(17, PackMode::Pack, 3);
    other_partition.partition = Partition { machines: 1, hosts: 2 };
    other_partition.resume = Some(first.position.clone());
    assert!(corpus.stream(tokenizer(), other_partition).is_err());

    let mut text_config = corpus_config();
    text_config.text_records = TextRecords::Line;
    let other_corpus = Corpus::open(dir.path().to_str().unwrap(), &text_config).unwrap();
    let mut config = stream_config(17, PackMode::Pack, 3);
    config.resume = Some(first.position);
    assert!(other_corpus.stream(tokenizer(), config).is_err());
}

/// Short documents around one longer than a tokenizer window (256 KiB), so that it is
/// tokenized in several windows.
fn long_record_corpus(dir: &std::path::Path) -> Corpus {
    let long: String = (0..9_000).map(doc_text).collect::<Vec<_>>().join(" ");
    assert!((600 << 10..1 << 20).contains(&long.len()), "{} bytes", long.len());
    let lines = [doc_text(1), long, doc_text(2)];
    let jsonl: String = lines.iter().map(|t| format!("{}\n", serde_json::json!({ "text": t }))).collect();
    std::fs::write(dir.join("long.jsonl"), jsonl).unwrap();
    Corpus::open(dir.to_str().unwrap(), &CorpusConfig::default()).unwrap()
}

#[test]
fn resuming_inside_a_long_record_yields_exactly_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = long_record_corpus(dir.path());
    // A few batches, each ending inside the long record.
    check_resume(&corpus, &|| stream_config(4095, PackMode::Pack, 32));
    check_resume(&corpus, &|| stream_config(4095, PackMode::Isolated, 32));
}

#[test]
fn a_token_budget_stops_tokenizing_a_long_record_and_keeps_the_rows_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = long_record_corpus(dir.path());
    let full = batches(&corpus, stream_config(512, PackMode::Pack, 8));
    let mut config = stream_config(512, PackMode::Pack, 8);
    config.max_tokens = Some(3 * 8 * 512);
    let mut bounded = corpus.stream(tokenizer(), config).unwrap();
    let first: Vec<_> = bounded.by_ref().take(3).map(Result::unwrap).collect();
    assert_eq!(first, full[..3]);
    // The long record is tokenized no further than its first window (256 KiB, a token per
    // byte with the fixture): the stream's rows stop there, not at its end.
    let all = 3 + bounded.map(Result::unwrap).count();
    assert!(all <= (256 << 10) / (8 * 512) + 2 && all < full.len(), "{all} batches of {}", full.len());
}
