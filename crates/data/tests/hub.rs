//! Corpora on the Hugging Face Hub, through a stand-in Hub on 127.0.0.1
//! (scripts/testing/stand_in_hub.py: the tree API paginated two entries a page, parquet files
//! redirected to a "CDN" path, ranged reads, a bearer token required): `hf://datasets/...`
//! paths, globs and directories, and splits by name from the dataset card's configs or the
//! Hub's parquet conversion, each read like the same files on disk.
//!
//! One test function: it sets `HF_ENDPOINT` and `HF_TOKEN` for this process.

mod common;

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{doc_text, doc_texts, rows, stream_config, write_parquet};
use siphon_data::{Corpus, CorpusConfig, PackMode};

/// Kills the stand-in Hub when the test ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn parquet(path: &Path, docs: std::ops::Range<usize>) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let texts: Vec<Option<String>> = docs.map(|i| Some(doc_text(i))).collect();
    write_parquet(path, &texts, 4);
}

fn texts(corpus: &Corpus) -> Vec<String> {
    doc_texts(&rows(corpus, stream_config(64, PackMode::Pad(siphon_data::PadSide::Right), 4)))
}

/// How many of documents `docs` are not blank (blank ones are skipped).
fn kept(docs: std::ops::Range<usize>) -> usize {
    docs.filter(|&i| !doc_text(i).trim().is_empty()).count()
}

#[test]
fn hub_datasets_read_like_their_files_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // org/set@main: a card with configs; org/plain: no card, the Hub's parquet conversion;
    // org/big: a conversion of only the start of its split.
    let set = root.join("org/set/main");
    parquet(&set.join("data/train-00000-of-00002.parquet"), 0..10);
    parquet(&set.join("data/train-00001-of-00002.parquet"), 10..25);
    parquet(&set.join("data/test-00000-of-00001.parquet"), 25..30);
    parquet(&set.join("extra/other.parquet"), 30..33);
    std::fs::write(set.join("README.md"), "# a dataset card\n").unwrap();
    std::fs::write(
        root.join("org/set/main.card.json"),
        r#"{"configs": [{"config_name": "default", "data_files": [
              {"split": "train", "path": "data/train-*"}, {"split": "test", "path": "data/test-*"}]},
           {"config_name": "extra", "data_files": "extra/*.parquet"}]}"#,
    )
    .unwrap();
    std::fs::create_dir_all(root.join("org/plain/main")).unwrap();
    parquet(&root.join("org/plain/refs/convert/parquet/default/train/0000.parquet"), 40..47);
    std::fs::create_dir_all(root.join("org/big/main")).unwrap();
    parquet(&root.join("org/big/refs/convert/parquet/default/partial-train/0000.parquet"), 50..52);

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/testing/stand_in_hub.py");
    let _server = Server(
        Command::new("python3")
            .arg(&script)
            .arg(root)
            .arg(port.to_string())
            .args(["--token", "hf_test"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 scripts/testing/stand_in_hub.py"),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the stand-in Hub did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: this test binary runs this one test; no other thread reads the environment.
    unsafe {
        std::env::set_var("HF_ENDPOINT", format!("http://127.0.0.1:{port}"));
        std::env::set_var("HF_TOKEN", "hf_test");
    }
    let config = CorpusConfig::default();
    let open = |spec: &str| Corpus::open(spec, &config).unwrap_or_else(|e| panic!("{spec}: {e}"));
    let train_on_disk = open(&format!("{}/data/train-*", set.display()));
    let train = texts(&train_on_disk);
    assert_eq!(train.len(), kept(0..25));

    // A glob (listed over several pages), a directory, a single file, all read through ranged
    // requests behind the redirect.
    let glob = open("hf://datasets/org/set/data/train-*.parquet");
    assert_eq!(glob.files().len(), 2);
    assert_eq!(glob.files()[0].display, "hf://datasets/org/set@main/data/train-00000-of-00002.parquet");
    assert_eq!(glob.units(), train_on_disk.units());
    assert_eq!(texts(&glob), train);
    assert_eq!(open("hf://datasets/org/set@main/data").files().len(), 3);
    // The repository's root: every parquet file, not the README.
    assert_eq!(open("hf://datasets/org/set").files().len(), 4);
    let one = open("hf://datasets/org/set/data/test-00000-of-00001.parquet");
    assert_eq!(texts(&one), texts(&open(&format!("{}/data/test-00000-of-00001.parquet", set.display()))));

    // Splits by name: the card's configs, then the Hub's parquet conversion.
    assert_eq!(texts(&open("org/set")), train);
    let split = |repo: &str, config_name: Option<&str>, split: Option<&str>| {
        let mut config = CorpusConfig::default();
        config.hub_config = config_name.map(str::to_string);
        config.hub_split = split.map(str::to_string);
        Corpus::open(repo, &config)
    };
    assert_eq!(split("org/set", None, Some("test")).unwrap().files().len(), 1);
    assert_eq!(texts(&split("org/set", Some("extra"), None).unwrap()).len(), kept(30..33));
    let err = split("org/set", None, Some("validation")).unwrap_err().to_string();
    assert!(err.contains("has splits [\"train\", \"test\"], not \"validation\""), "{err}");
    let err = split("org/set", Some("nope"), None).unwrap_err().to_string();
    assert!(err.contains("no config \"nope\""), "{err}");
    let plain = split("org/plain", None, None).unwrap();
    assert_eq!(plain.files()[0].display, "hf://datasets/org/plain@refs/convert/parquet/default/train/0000.parquet");
    assert_eq!(texts(&plain).len(), kept(40..47));
    let err = split("org/big", None, None).unwrap_err().to_string();
    assert!(err.contains("converted only the start of split \"train\""), "{err}");

    // Errors name the cause: no such dataset, no token.
    let err = Corpus::open("hf://datasets/org/missing/x", &config).unwrap_err().to_string();
    assert!(err.contains("404") && err.contains("no such dataset"), "{err}");
    // SAFETY: as above.
    unsafe { std::env::remove_var("HF_TOKEN") };
    let err = Corpus::open("hf://datasets/org/set/data", &config).unwrap_err().to_string();
    assert!(err.contains("401") && err.contains("HF_TOKEN"), "{err}");
}
