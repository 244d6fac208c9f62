//! Corpora of nothing, `siphon data`'s counts at their edges, and special files where the data
//! path reads a file: each refused within seconds naming the file or flag and why, before a run
//! starts (no run directory left).

use std::path::Path;
use std::time::Duration;

use crate::common::repo_root;
use crate::{Setup, assert_no_crash, extract_args, run, setup, siphon};

/// Runs `args`, which must be refused within `within` with every one of `words` in its error.
fn refused(args: &[String], words: &[&str], within: Duration) {
    let (output, took) = run(siphon(args), Duration::from_secs(60));
    let what = args.join(" ");
    assert_no_crash(&output, &what);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{what}: accepted: {stderr}");
    for word in words {
        assert!(stderr.contains(word), "{what}: the error does not say {word:?}: {stderr}");
    }
    assert!(took < within, "{what}: refused only after {took:?}");
}

fn data_args(corpus: &Path, extra: &[&str]) -> Vec<String> {
    data_args_with(&repo_root().join("fixtures/data/tokenizer.json"), corpus, extra)
}

fn data_args_with(tokenizer: &Path, corpus: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> =
        ["data", "--corpus", corpus.to_str().unwrap(), "--tokenizer", tokenizer.to_str().unwrap()]
            .iter()
            .map(|s| s.to_string())
            .collect();
    args.extend(["--seq-len", "16"].iter().chain(extra).map(|s| s.to_string()));
    args
}

/// A parquet file of no row: the second of two files the converter makes of one document.
fn empty_parquet(path: &Path) {
    let (from, to) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(from.path().join("a.txt"), "a document").unwrap();
    let mut options = siphon_data::ConvertOptions::default();
    options.files = 2;
    let report = siphon_data::text_dir_to_parquet(from.path(), to.path(), &options).unwrap();
    std::fs::rename(&report.outputs[1], path).unwrap();
}

fn mkfifo(path: &Path) {
    assert!(std::process::Command::new("mkfifo").arg(path).status().unwrap().success());
}

/// A corpus directory holding only `name` (written by `write`).
fn corpus_of(s: &Setup, dir: &str, name: &str, write: impl FnOnce(&Path)) -> std::path::PathBuf {
    let dir = s.root.join(dir);
    std::fs::create_dir_all(&dir).unwrap();
    write(&dir.join(name));
    dir
}

#[test]
fn a_corpus_of_nothing_is_refused_naming_the_file_before_a_run_starts() {
    let s = setup();
    let text = |body: &'static str| move |path: &Path| std::fs::write(path, body).unwrap();
    let cases: Vec<(std::path::PathBuf, &[&str])> = vec![
        (corpus_of(&s, "c0", "rows.parquet", empty_parquet), &["rows.parquet", "has no rows"]),
        (corpus_of(&s, "c1", "empty.jsonl", text("")), &["empty.jsonl", "is empty (0 bytes)"]),
        (corpus_of(&s, "c2", "blank.jsonl", text("\n\n  \n")), &["blank.jsonl", "holds no text", "blank"]),
        (corpus_of(&s, "c3", "empty.txt", text("")), &["empty.txt", "is empty (0 bytes)"]),
        (corpus_of(&s, "c4", "space.txt", text(" \n\t ")), &["space.txt", "holds no text"]),
        (corpus_of(&s, "c5", "field.jsonl", text("{\"body\": \"x\"}\n")), &["none of the 1 records", "no field"]),
    ];
    for (corpus, words) in &cases {
        let corpus = corpus.to_str().unwrap();
        refused(&data_args(Path::new(corpus), &[]), words, Duration::from_secs(10));
        let run_name = "garbage";
        refused(
            &extract_args(&s, run_name, &["--corpus", corpus, "--text-records", "file"]),
            words,
            Duration::from_secs(10),
        );
        assert!(!s.root.join("out").join(run_name).exists(), "{corpus}: a run directory was left");
    }
    refused(&data_args(Path::new(""), &[]), &["--corpus is empty"], Duration::from_secs(5));
    refused(&extract_args(&s, "r", &["--corpus", ""]), &["--corpus is empty"], Duration::from_secs(10));
    refused(
        &data_args(&s.root.join("corpus"), &["--json-field", ""]),
        &["--json-field is empty"],
        Duration::from_secs(5),
    );
}

#[test]
fn data_counts_are_checked_before_any_work_naming_the_flag() {
    let s = setup();
    let corpus = s.root.join("corpus");
    let cases: [(&[&str], &str); 7] = [
        (&["--hosts", "1000000"], "--hosts"),
        (&["--hosts", "0"], "--hosts"),
        (&["--machines", "4294967296"], "--machines"),
        (&["--machines", "65536", "--hosts", "65536"], "--machines 65536 × --hosts 65536"),
        (&["--bench", "1,0"], "--bench"),
        (&["--bench", "1", "--bench-repeat", "0"], "--bench-repeat"),
        (&["--unit-bytes", "0"], "--unit-bytes"),
    ];
    for (extra, flag) in cases {
        refused(&data_args(&corpus, extra), &[flag], Duration::from_secs(5));
    }
}

#[test]
fn special_files_the_data_path_reads_are_refused_naming_them() {
    let s = setup();
    let fifo = s.root.join("fifo.json");
    mkfifo(&fifo);
    let corpus = s.root.join("corpus");
    refused(&data_args_with(&fifo, &corpus, &[]), &["fifo.json", "FIFO"], Duration::from_secs(5));
    // The chat template is read when the corpus holds conversations.
    let chats = corpus_of(&s, "chats", "c.jsonl", |path| {
        std::fs::write(path, "{\"text\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n").unwrap()
    });
    refused(
        &data_args(&chats, &["--chat-template", fifo.to_str().unwrap()]),
        &["--chat-template", "fifo.json", "FIFO"],
        Duration::from_secs(5),
    );
    // A FIFO among a directory's corpus files, reached through the directory or a glob.
    let dir = corpus_of(&s, "with-fifo", "part-9.txt", mkfifo);
    std::fs::write(dir.join("part-0.txt"), "a document\n").unwrap();
    for spec in [dir.clone(), dir.join("*.txt")] {
        refused(&data_args(&spec, &[]), &["part-9.txt", "FIFO"], Duration::from_secs(5));
        refused(
            &extract_args(&s, "fifo", &["--corpus", spec.to_str().unwrap()]),
            &["part-9.txt", "FIFO"],
            Duration::from_secs(10),
        );
    }
}

/// `--positions` and `--keep-columns` out of what they take: refused within seconds naming the
/// flag and why, no run directory left.
#[test]
fn rows_and_kept_columns_out_of_range_are_refused_by_name() {
    let s = setup();
    let jsonl = corpus_of(&s, "labeled", "docs.jsonl", |path| {
        std::fs::write(path, "{\"text\": \"the river\", \"label\": 1}\n{\"text\": \"a grey sky\", \"label\": 0}\n")
            .unwrap()
    });
    let jsonl = jsonl.to_str().unwrap();
    let cases: &[(&[&str], &[&str])] = &[
        (&["--positions", "last"], &["--positions last", "--pad right", "--pack isolated"]),
        (&["--pad", "right", "--positions", "last:0"], &["last:0"]),
        (&["--pad", "right", "--positions", "after:"], &["after:", "marker"]),
        (&["--pad", "right", "--positions", "middle"], &["middle", "last:N"]),
        (&["--pad", "right", "--positions", "last", "--outputs", "nll"], &["--positions last", "--outputs"]),
        (&["--keep-columns", "label"], &["--keep-columns", "plain text"]),
        (&["--corpus", jsonl, "--keep-columns", "label,lable"], &["lable", "label"]),
        (&["--corpus", jsonl, "--keep-columns", "label,label"], &["--keep-columns", "label"]),
    ];
    for (i, (extra, words)) in cases.iter().enumerate() {
        let run = format!("rows{i}");
        refused(&extract_args(&s, &run, extra), words, Duration::from_secs(30));
        assert!(!s.root.join("out").join(&run).exists(), "{extra:?}: a run directory was left");
    }
}
