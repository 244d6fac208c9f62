//! `siphon data` end to end on the committed fixture corpus (fixtures/data/corpus) with the
//! byte-level fixture tokenizer.

use std::process::{Command, Output};

fn siphon(args: &[&str]) -> Output {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    Command::new(env!("CARGO_BIN_EXE_siphon")).current_dir(root).args(args).output().expect("running siphon")
}

fn json(args: &[&str]) -> serde_json::Value {
    let mut all =
        vec!["data", "--corpus", "fixtures/data/corpus", "--tokenizer", "fixtures/data/tokenizer.json", "--json"];
    all.extend_from_slice(args);
    let out = siphon(&all);
    assert!(out.status.success(), "siphon data failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

fn total(report: &serde_json::Value, key: &str) -> u64 {
    report["workers"].as_array().unwrap().iter().map(|w| w[key].as_u64().unwrap()).sum()
}

#[test]
fn workers_split_the_corpus_without_losing_or_repeating_sequences() {
    let single = json(&["--seq-len", "32", "--unit-bytes", "300"]);
    assert_eq!(single["files"], 4, "three books and web.jsonl: {single}");
    let w = &single["workers"][0];
    assert_eq!(w["stats"]["documents"], 24, "22 jsonl documents and 2 sonnets");
    assert_eq!(w["stats"]["invalid"], 1);
    assert_eq!(w["stats"]["empty"], 2, "the blank line and the blank file");
    let sequences = w["sequences"].as_u64().unwrap();
    assert!(sequences > 10);

    let split = json(&["--seq-len", "32", "--unit-bytes", "300", "--machines", "2", "--hosts", "3"]);
    let workers = split["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 6);
    assert_eq!(total(&split, "sequences"), sequences);
    assert_eq!(total(&split, "tokens"), w["tokens"].as_u64().unwrap());
    assert_eq!(total(&split, "units"), single["units"].as_u64().unwrap());
    // Worker (m, h) starts at unit ordinal m*3+h of the global order.
    assert_eq!(workers[4]["machine"], 1);
    assert_eq!(workers[4]["host"], 1);
    assert!(workers.iter().all(|w| w["end"]["unit"].is_null()), "every worker reports a finished position");
}

#[test]
fn padding_mode_gives_one_sequence_per_document() {
    for side in ["left", "right"] {
        let report = json(&["--seq-len", "64", "--pad", side, "--machines", "2"]);
        assert_eq!(total(&report, "sequences"), 24);
    }
}

#[test]
fn table_and_errors() {
    let out = siphon(&[
        "data",
        "--corpus",
        "fixtures/data/corpus",
        "--tokenizer",
        "fixtures/data/tokenizer.json",
        "--seq-len",
        "16",
        "--hosts",
        "2",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success() && text.contains("1 machines x 2 hosts") && text.contains("skipped 2 empty and 1 invalid"),
        "{text}"
    );

    let out = siphon(&[
        "data",
        "--corpus",
        "fixtures/data/corpus",
        "--tokenizer",
        "fixtures/data/tokenizer.json",
        "--seq-len",
        "16",
        "--strict",
    ]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success() && err.contains("web.jsonl") && err.contains("no field \"text\""), "{err}");

    let out = siphon(&[
        "data",
        "--corpus",
        "fixtures/data/nowhere",
        "--tokenizer",
        "fixtures/data/tokenizer.json",
        "--seq-len",
        "16",
    ]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success() && err.contains("fixtures/data/nowhere"), "{err}");

    let out = siphon(&[
        "data",
        "--corpus",
        "fixtures/data/corpus",
        "--tokenizer",
        "fixtures/data/tokenizer.json",
        "--seq-len",
        "16",
        "--bos-token",
        "<nope>",
    ]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success() && err.contains("<nope>"), "{err}");
}

#[test]
fn a_gguf_model_file_serves_as_the_tokenizer() {
    let Ok(gguf) = std::env::var("SIPHON_SMOLLM2_GGUF") else {
        eprintln!("note: SIPHON_SMOLLM2_GGUF is not set (scripts/test.sh sets it); skipping");
        return;
    };
    let out = siphon(&[
        "data",
        "--corpus",
        "fixtures/data/corpus",
        "--tokenizer",
        &gguf,
        "--seq-len",
        "64",
        "--pad",
        "right",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(total(&report, "sequences"), 24, "one padded row per document");
    // A BPE vocabulary needs fewer tokens than the byte-level fixture tokenizer.
    let bytes = json(&["--seq-len", "64", "--pad", "right"]);
    assert!(total(&report, "tokens") < total(&bytes, "tokens"));
}
