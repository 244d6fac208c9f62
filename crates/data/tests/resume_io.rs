//! Resuming seeks: a resumed stream reads only from the unit it resumes in onwards, never the
//! data before it. Checked with a store that logs every read.

mod common;

use std::fmt;
use std::sync::{Arc, Mutex};

use common::*;
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetRange, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, ObjectStoreExt,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use siphon_data::{Corpus, CorpusConfig, PackMode, PadSide};

/// An in-memory store that logs `(path, range)` of every read.
#[derive(Debug, Default)]
struct LoggingStore {
    inner: InMemory,
    reads: Mutex<Vec<(String, Option<GetRange>)>>,
}

impl fmt::Display for LoggingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LoggingStore")
    }
}

#[async_trait::async_trait]
impl ObjectStore for LoggingStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        if !options.head {
            self.reads.lock().unwrap().push((location.to_string(), options.range.clone()));
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

fn upload(store: &LoggingStore, name: &str, bytes: Vec<u8>) {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(store.put(&Path::from(format!("c/{name}")), bytes.into())).unwrap();
}

#[test]
fn resuming_in_a_late_parquet_file_reads_only_that_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(LoggingStore::default());
    for (f, name) in ["a.parquet", "b.parquet", "c.parquet"].into_iter().enumerate() {
        let texts: Vec<Option<String>> = (0..30).map(|i| Some(doc_text(f * 100 + i))).collect();
        let path = dir.path().join(name);
        write_parquet(&path, &texts, 10);
        upload(&store, name, std::fs::read(&path).unwrap());
    }
    let corpus = Corpus::open_store(store.clone(), "c", "mem:///", &CorpusConfig::default()).unwrap();
    let make = || stream_config(64, PackMode::Pad(PadSide::Right), 4);
    let full = batches(&corpus, make());
    // A batch boundary inside c.parquet's second row group.
    let cut = full
        .iter()
        .position(|b| {
            b.position.location.as_deref().is_some_and(|l| l.ends_with("c.parquet (row group 1)"))
                && b.position.record > 0
        })
        .expect("a position inside c.parquet");

    store.reads.lock().unwrap().clear();
    let mut config = make();
    config.resume = Some(full[cut].position.clone());
    let rest = batches(&corpus, config);
    assert_eq!(rest, full[cut + 1..].to_vec());
    let reads = store.reads.lock().unwrap().clone();
    assert!(!reads.is_empty());
    assert!(reads.iter().all(|(path, _)| path == "c/c.parquet"), "resume read other files: {reads:?}");
}

#[test]
fn resuming_in_a_late_byte_unit_reads_nothing_before_it() {
    let store = Arc::new(LoggingStore::default());
    let jsonl: String = (0..400).map(|i| format!("{{\"text\": {:?}}}\n", doc_text(i))).collect();
    upload(&store, "big.jsonl", jsonl.into_bytes());
    let mut config = CorpusConfig::default();
    config.unit_bytes = 2048;
    let corpus = Corpus::open_store(store.clone(), "c", "mem:///", &config).unwrap();
    assert!(corpus.units().len() > 10);
    let make = || stream_config(48, PackMode::Pack, 8);
    let full = batches(&corpus, make());
    let cut = full.len() * 3 / 4;
    let position = full[cut].position.clone();
    let unit = corpus.units()[position.unit.expect("not at the end") as usize];
    let siphon_data::UnitKind::Bytes { start, .. } = unit.kind else { panic!("byte unit expected") };
    assert!(start > 10_000);

    store.reads.lock().unwrap().clear();
    let mut config = make();
    config.resume = Some(position);
    let rest = batches(&corpus, config);
    assert_eq!(rest, full[cut + 1..].to_vec());
    for (_, range) in store.reads.lock().unwrap().iter() {
        match range {
            Some(GetRange::Bounded(r)) => assert!(r.start + 1 >= start, "read {r:?} before the unit at {start}"),
            other => panic!("unexpected read {other:?}"),
        }
    }
}

#[test]
fn the_reader_stays_a_bounded_distance_ahead_of_the_consumer() {
    let store = Arc::new(LoggingStore::default());
    // ~6 MiB of short documents in one unit.
    let jsonl: String = (0..200_000).map(|i| format!("{{\"text\": \"doc {i} {}\"}}\n", "x".repeat(i % 7))).collect();
    let size = jsonl.len() as u64;
    upload(&store, "long.jsonl", jsonl.into_bytes());
    let mut config = CorpusConfig::default();
    config.unit_bytes = 64 << 20;
    let corpus = Corpus::open_store(store.clone(), "c", "mem:///", &config).unwrap();
    store.reads.lock().unwrap().clear();
    let mut stream = corpus.stream(tokenizer(), stream_config(32, PackMode::Pack, 2)).unwrap();
    let first = stream.next().expect("a batch").expect("reads");
    assert_eq!(first.len(), 2);
    // Give the pipeline time to run ahead as far as its credits allow.
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let fetched: u64 = store
        .reads
        .lock()
        .unwrap()
        .iter()
        .map(|(_, r)| match r {
            Some(GetRange::Bounded(r)) => r.end - r.start,
            other => panic!("unexpected read {other:?}"),
        })
        .sum();
    // The chunks in flight (a few hundred records) lie in the first 1 MiB block.
    assert!(fetched <= 1 << 20, "read {fetched} of {size} bytes for one batch");
    drop(stream); // stops and joins the pipeline threads mid-unit
}
