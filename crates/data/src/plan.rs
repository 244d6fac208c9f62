//! The unit plan: a corpus cut into *units* in a global order, and the partition of that
//! order over (machine, host) workers.
//!
//! A unit is a parquet row group, a fixed byte range of a jsonl/text file, or a whole text
//! file. The unit list is computed from file listings, sizes and parquet footers only, so
//! every host computes the same list without reading the corpus.

use std::sync::Arc;

use futures::StreamExt;
use object_store::ObjectStore;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::parquet_file::{load_parquet_meta, text_column_index};
use crate::source::{self, CorpusFile, FileFormat};

/// What one record of a plain-text file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum TextRecords {
    /// Each non-blank line is a document (large files are split into byte-range units).
    Line,
    /// Each file is one document (the file is one unit, and one record: see
    /// [`CorpusConfig::max_record_bytes`]).
    #[default]
    File,
}

/// What to do with a record that cannot be used (bad JSON, missing field, null, not UTF-8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum InvalidRecords {
    /// Skip it, count it in [`DataStats::invalid`](crate::DataStats), log the first few.
    #[default]
    Skip,
    /// Fail with an error naming the file and where in it.
    Error,
}

/// Seeded shuffling. The unit order is permuted before the partition (so each host gets a
/// random sample of files and row groups); optionally the records inside each unit are
/// permuted too (the "window" is one unit). Both are pure functions of the seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shuffle {
    /// The seed.
    pub seed: u64,
    /// Also permute records within each unit (costs reading a whole unit before the first
    /// record of it is handed out).
    pub within_unit: bool,
}

/// How to read a corpus. `Default` gives the Hugging Face datasets conventions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct CorpusConfig {
    /// Force a format instead of detecting it from extensions.
    pub format: Option<FileFormat>,
    /// Parquet column holding the text.
    pub text_column: String,
    /// JSON field holding the text (top level).
    pub json_field: String,
    /// What a plain-text record is.
    pub text_records: TextRecords,
    /// Size of a byte-range unit of jsonl and line-text files.
    pub unit_bytes: u64,
    /// Longest record accepted (a line of a jsonl or line-text file, a parquet text value, a
    /// whole text file with [`TextRecords::File`]): a longer one is an
    /// [`Error::RecordTooLarge`] naming the file and where in it (a whole file's when the
    /// corpus is opened). A line is never buffered past this, so a file without newlines costs
    /// this much memory, not its size; a record is held as text and as token ids while it is
    /// used, and tokenized in bounded pieces, so a worker's memory is a fixed amount plus a
    /// few times this. Default 16 MiB.
    pub max_record_bytes: u64,
    /// Optional seeded shuffling.
    pub shuffle: Option<Shuffle>,
    /// Policy for unusable records.
    pub invalid: InvalidRecords,
    /// For a Hugging Face Hub dataset named `OWNER/NAME`: its config (default: the card's
    /// default) and split (default: `train`).
    pub hub_config: Option<String>,
    /// See `hub_config`.
    pub hub_split: Option<String>,
}

impl Default for CorpusConfig {
    fn default() -> Self {
        CorpusConfig {
            format: None,
            text_column: "text".into(),
            json_field: "text".into(),
            text_records: TextRecords::File,
            unit_bytes: 8 << 20,
            max_record_bytes: 16 << 20,
            shuffle: None,
            invalid: InvalidRecords::Skip,
            hub_config: None,
            hub_split: None,
        }
    }
}

/// What a unit covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum UnitKind {
    /// One parquet row group.
    RowGroup {
        /// Row group index within the file.
        index: u32,
        /// Rows in it.
        rows: u64,
    },
    /// The lines of a jsonl/text file that *start* in `[start, end)`.
    Bytes {
        /// First byte (inclusive).
        start: u64,
        /// Last byte (exclusive).
        end: u64,
    },
    /// A whole text file as one record.
    WholeFile,
}

/// One unit of work: the granule of the partition, of packing and of resume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unit {
    /// Stable id: the index in the unshuffled unit list (files sorted, then in-file order).
    pub id: u32,
    /// Index of the file in [`Corpus::files`].
    pub file: u32,
    /// What part of the file.
    #[serde(flatten)]
    pub kind: UnitKind,
}

/// The set of workers a corpus is split over: `machines × hosts`, flattened as
/// `machine * hosts + host`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Partition {
    /// Number of machines (slices, pods).
    pub machines: u32,
    /// Hosts per machine.
    pub hosts: u32,
}

/// One worker of a [`Partition`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Worker {
    /// Machine index, `< machines`.
    pub machine: u32,
    /// Host index within the machine, `< hosts`.
    pub host: u32,
}

impl Partition {
    /// A single worker that sees the whole corpus.
    pub const SINGLE: Partition = Partition { machines: 1, hosts: 1 };

    /// Number of workers.
    pub fn workers(self) -> u64 {
        u64::from(self.machines) * u64::from(self.hosts)
    }

    /// The flattened index of `worker`, checked against the partition.
    pub fn index(self, worker: Worker) -> Result<u64> {
        if self.machines == 0 || self.hosts == 0 {
            return Err(Error::Config(format!("partition {}x{} has no worker", self.machines, self.hosts)));
        }
        if worker.machine >= self.machines || worker.host >= self.hosts {
            return Err(Error::Config(format!(
                "worker (machine {}, host {}) is outside the partition of {} machines x {} hosts",
                worker.machine, worker.host, self.machines, self.hosts
            )));
        }
        Ok(u64::from(worker.machine) * u64::from(self.hosts) + u64::from(worker.host))
    }

    /// Every worker, in flattened order.
    pub fn all_workers(self) -> impl Iterator<Item = Worker> {
        (0..self.machines).flat_map(move |machine| (0..self.hosts).map(move |host| Worker { machine, host }))
    }
}

/// An opened corpus: its files, units and global order. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Corpus {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) files: Arc<Vec<CorpusFile>>,
    pub(crate) units: Arc<Vec<Unit>>,
    /// Unit ids in global order (a permutation of `0..units.len()`).
    pub(crate) order: Arc<Vec<u32>>,
    pub(crate) config: CorpusConfig,
    pub(crate) fingerprint: u64,
}

impl Corpus {
    /// Resolves `spec` (path, directory, glob or URL), reads parquet footers and builds the
    /// unit plan. Runs its own small async runtime on a helper thread, so it may be called
    /// from anywhere, async contexts included.
    ///
    /// A Hugging Face Hub dataset is `hf://datasets/OWNER/NAME[@REVISION]/PATH`, or `OWNER/NAME`
    /// (when no such local path exists, or with `hub_config`/`hub_split`): the split's files
    /// as `datasets.load_dataset` finds them.
    pub fn open(spec: &str, config: &CorpusConfig) -> Result<Corpus> {
        let by_name = config.hub_config.is_some()
            || config.hub_split.is_some()
            || (!spec.contains("://") && !std::path::Path::new(spec).exists() && crate::hub::is_repo_name(spec));
        let located = if by_name { None } else { Some(source::locate(spec)?) };
        let spec = spec.to_string();
        let config = config.clone();
        run_blocking(async move {
            let resolved = match located {
                Some(located) => source::resolve(&spec, located, config.format).await?,
                None => {
                    let split = config.hub_split.as_deref().unwrap_or("train");
                    source::resolve_hub_split(&spec, config.hub_config.as_deref(), split, config.format).await?
                }
            };
            Corpus::build(resolved.store, resolved.files, config).await
        })
    }

    /// Like [`Corpus::open`] for files already on a given store (e.g. an in-memory store in
    /// tests, or a store built with custom options). `prefix` is listed recursively.
    pub fn open_store(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        display_root: &str,
        config: &CorpusConfig,
    ) -> Result<Corpus> {
        let located = source::Located {
            store,
            display_root: display_root.to_string(),
            path: prefix.trim_start_matches('/').to_string(),
            local: false,
            hub: None,
        };
        let spec = format!("{display_root}{prefix}");
        let config = config.clone();
        run_blocking(async move {
            let resolved = source::resolve(&spec, located, config.format).await?;
            Corpus::build(resolved.store, resolved.files, config).await
        })
    }

    async fn build(store: Arc<dyn ObjectStore>, files: Vec<CorpusFile>, config: CorpusConfig) -> Result<Corpus> {
        if config.unit_bytes == 0 {
            return Err(Error::Config("unit_bytes must be positive".into()));
        }
        // Footers are fetched concurrently (one or two small reads per file); `buffered`
        // keeps the file order.
        let footers: Vec<Result<Option<Vec<u64>>>> = futures::stream::iter(files.iter().cloned())
            .map(|file| {
                let store = store.clone();
                let column = config.text_column.clone();
                async move {
                    if file.format != FileFormat::Parquet {
                        return Ok(None);
                    }
                    let meta = load_parquet_meta(&store, &file).await?;
                    text_column_index(&meta, &file, &column)?;
                    Ok(Some(meta.metadata().row_groups().iter().map(|rg| rg.num_rows().max(0) as u64).collect()))
                }
            })
            .buffered(16)
            .collect()
            .await;
        let mut units = Vec::new();
        for (file_idx, (file, footer)) in files.iter().zip(footers).enumerate() {
            let file_idx = u32::try_from(file_idx).map_err(|_| Error::Config("more than 2^32 corpus files".into()))?;
            let mut push = |kind| {
                let id = units.len() as u32;
                units.push(Unit { id, file: file_idx, kind });
            };
            match file.format {
                FileFormat::Parquet => {
                    for (index, rows) in footer?.unwrap_or_default().into_iter().enumerate() {
                        push(UnitKind::RowGroup { index: index as u32, rows });
                    }
                }
                FileFormat::Text if config.text_records == TextRecords::File => {
                    if file.size > config.max_record_bytes {
                        return Err(Error::RecordTooLarge {
                            file: file.display.clone(),
                            location: format!(
                                "the whole file ({} bytes), one record with --text-records file (--text-records line \
                                 makes each line one)",
                                file.size
                            ),
                            limit: config.max_record_bytes,
                        });
                    }
                    push(UnitKind::WholeFile);
                }
                FileFormat::Jsonl | FileFormat::Text => {
                    let mut start = 0;
                    while start < file.size {
                        let end = (start + config.unit_bytes).min(file.size);
                        push(UnitKind::Bytes { start, end });
                        start = end;
                    }
                }
            }
        }
        check_not_empty(&files, &units)?;
        if units.len() > u32::MAX as usize {
            return Err(Error::Config("more than 2^32 units; raise unit_bytes".into()));
        }
        let mut order: Vec<u32> = (0..units.len() as u32).collect();
        if let Some(shuffle) = config.shuffle {
            permute(&mut order, shuffle.seed);
        }
        let fingerprint = fingerprint_plan(&files, &units, &config);
        Ok(Corpus {
            store,
            files: Arc::new(files),
            units: Arc::new(units),
            order: Arc::new(order),
            config,
            fingerprint,
        })
    }

    /// The corpus files, sorted.
    pub fn files(&self) -> &[CorpusFile] {
        &self.files
    }

    /// All units by id.
    pub fn units(&self) -> &[Unit] {
        &self.units
    }

    /// Unit ids in the global order.
    pub fn order(&self) -> &[u32] {
        &self.order
    }

    /// The configuration the corpus was opened with.
    pub fn config(&self) -> &CorpusConfig {
        &self.config
    }

    /// A hash of files, sizes, units and reading options: two hosts with equal fingerprints
    /// compute the same unit plan.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Ordinals (positions in [`Corpus::order`]) assigned to `worker`: round-robin,
    /// ordinal `k` goes to worker `k mod (machines × hosts)`.
    pub fn worker_ordinals(&self, partition: Partition, worker: Worker) -> Result<impl Iterator<Item = u64> + use<>> {
        let w = partition.index(worker)?;
        let n = self.order.len() as u64;
        Ok((w..n).step_by(partition.workers() as usize))
    }

    /// The unit at a global ordinal.
    pub fn unit_at(&self, ordinal: u64) -> Option<&Unit> {
        self.order.get(ordinal as usize).map(|&id| &self.units[id as usize])
    }

    /// Human-readable description of a unit (`file (row group 3)`, `file [bytes 0..8388608)`).
    pub fn describe_unit(&self, unit: &Unit) -> String {
        let file = &self.files[unit.file as usize].display;
        match unit.kind {
            UnitKind::RowGroup { index, .. } => format!("{file} (row group {index})"),
            UnitKind::Bytes { start, end } => format!("{file} [bytes {start}..{end})"),
            UnitKind::WholeFile => file.clone(),
        }
    }
}

/// Refuses a corpus whose every file is empty (0 bytes, or a parquet file of no rows), naming
/// them, before anything reads it; an empty file among others is a warning naming it. Not an
/// error then: it changes nothing the others give (an empty file has no record to lose), and
/// large datasets hold empty shards (a split's last parquet file, a crawl's empty part) that
/// should not stop a run of thousands of files.
fn check_not_empty(files: &[CorpusFile], units: &[Unit]) -> Result<()> {
    // Each file's rows (parquet) or bytes (text) over its units.
    let mut held = vec![0u64; files.len()];
    for unit in units {
        held[unit.file as usize] += match unit.kind {
            UnitKind::RowGroup { rows, .. } => rows,
            UnitKind::Bytes { start, end } => end - start,
            UnitKind::WholeFile => files[unit.file as usize].size,
        };
    }
    let empty: Vec<(&CorpusFile, &str)> = files
        .iter()
        .zip(&held)
        .filter(|(_, held)| **held == 0)
        .map(|(file, _)| (file, if file.format == FileFormat::Parquet { "has no rows" } else { "is empty (0 bytes)" }))
        .collect();
    if empty.len() == files.len()
        && let Some((file, why)) = empty.first()
    {
        let others = match empty.len() {
            1 => String::new(),
            n => format!(", and so are the {} other files", n - 1),
        };
        return Err(Error::Unusable {
            file: file.display.clone(),
            reason: format!("it {why}{others}: the corpus holds no record"),
        });
    }
    for (file, why) in empty {
        tracing::warn!(file = %file.display, "corpus file skipped: it {why}");
    }
    Ok(())
}

/// Runs a future to completion on a fresh current-thread runtime on a helper thread, so
/// callers inside or outside a tokio runtime can both use the sync API.
pub(crate) fn run_blocking<T: Send + 'static>(fut: impl Future<Output = Result<T>> + Send + 'static) -> Result<T> {
    let handle = std::thread::Builder::new()
        .name("siphon-data-plan".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(Error::Runtime)?;
            rt.block_on(fut)
        })
        .map_err(Error::Runtime)?;
    handle.join().unwrap_or_else(|_| Err(Error::Runtime(std::io::Error::other("planning thread panicked"))))
}

/// Fisher-Yates with ChaCha8: written out (rather than `SliceRandom::shuffle`) so the
/// permutation for a seed can never change with a `rand` upgrade.
pub(crate) fn permute<T>(items: &mut [T], seed: u64) {
    use rand::{RngCore, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    for i in (1..items.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

/// FNV-1a, 64 bit: a stable hash for fingerprints (std's hasher is not stable across releases).
#[derive(Clone, Copy)]
pub(crate) struct Fnv(pub u64);

impl Fnv {
    pub fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    pub fn bytes(mut self, data: &[u8]) -> Fnv {
        for &b in data {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // A separator so ("ab","c") and ("a","bc") differ.
        self.0 ^= 0xff;
        self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        self
    }

    pub fn u64(self, v: u64) -> Fnv {
        self.bytes(&v.to_le_bytes())
    }
}

fn fingerprint_plan(files: &[CorpusFile], units: &[Unit], config: &CorpusConfig) -> u64 {
    let mut h = Fnv::new();
    for f in files {
        h = h.bytes(f.display.as_bytes()).u64(f.size).bytes(f.format.name().as_bytes());
    }
    h = h.u64(units.len() as u64);
    for u in units {
        if let UnitKind::RowGroup { rows, .. } = u.kind {
            h = h.u64(rows);
        }
    }
    h = h
        .bytes(config.text_column.as_bytes())
        .bytes(config.json_field.as_bytes())
        .u64(config.text_records as u64)
        .u64(config.unit_bytes);
    match config.shuffle {
        Some(s) => h.u64(1).u64(s.seed).u64(s.within_unit as u64).0,
        None => h.u64(0).0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_is_a_stable_permutation() {
        let mut a: Vec<u32> = (0..100).collect();
        let mut b = a.clone();
        permute(&mut a, 7);
        permute(&mut b, 7);
        assert_eq!(a, b);
        assert_ne!(a, (0..100).collect::<Vec<_>>());
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        let mut c: Vec<u32> = (0..100).collect();
        permute(&mut c, 8);
        assert_ne!(a, c);
    }

    fn open(dir: &std::path::Path, config: &CorpusConfig) -> Result<Corpus> {
        Corpus::open(dir.to_str().unwrap(), config)
    }

    /// Writes a parquet file with a string `text` column and these rows.
    fn parquet(path: &std::path::Path, texts: &[&str]) {
        use arrow_array::{ArrayRef, RecordBatch, StringArray};
        let schema = Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
            "text",
            arrow_schema::DataType::Utf8,
            true,
        )]));
        let file = std::fs::File::create(path).unwrap();
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, schema.clone(), None).unwrap();
        if !texts.is_empty() {
            let column: ArrayRef = Arc::new(StringArray::from(texts.to_vec()));
            writer.write(&RecordBatch::try_new(schema, vec![column]).unwrap()).unwrap();
        }
        writer.close().unwrap();
    }

    #[test]
    fn a_corpus_of_empty_files_is_refused_naming_them_and_an_empty_file_among_others_skipped() {
        for (name, why) in
            [("a.jsonl", "is empty (0 bytes)"), ("a.txt", "is empty (0 bytes)"), ("a.parquet", "has no rows")]
        {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(name);
            match name.ends_with(".parquet") {
                true => parquet(&path, &[]),
                false => std::fs::write(&path, "").unwrap(),
            }
            let err = open(dir.path(), &CorpusConfig::default()).unwrap_err().to_string();
            assert!(err.contains(name) && err.contains(why) && err.contains("holds no record"), "{err}");
            std::fs::write(dir.path().join("b.jsonl"), "{\"text\": \"a document\"}\n").unwrap();
            let corpus = open(dir.path(), &CorpusConfig::default()).expect("an empty file among others is skipped");
            assert_eq!(corpus.files().len(), 2);
        }
        let dir = tempfile::tempdir().unwrap();
        for name in ["a.jsonl", "b.jsonl"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let err = open(dir.path(), &CorpusConfig::default()).unwrap_err().to_string();
        assert!(err.contains("a.jsonl") && err.contains("so are the 1 other files"), "{err}");
    }

    #[test]
    fn a_whole_file_past_the_record_limit_is_refused_when_opened() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("book.txt"), "word ".repeat(100)).unwrap();
        let mut config = CorpusConfig { max_record_bytes: 499, ..CorpusConfig::default() };
        let err = open(dir.path(), &config).unwrap_err().to_string();
        assert!(err.contains("book.txt") && err.contains("whole file (500 bytes)"), "{err}");
        assert!(err.contains("--max-record-mb") && err.contains("--text-records line"), "{err}");
        config.max_record_bytes = 500;
        open(dir.path(), &config).expect("a file at the limit is one record");
        config.text_records = TextRecords::Line;
        config.max_record_bytes = 499;
        open(dir.path(), &config).expect("with line records the file is not one record");
    }

    #[test]
    fn partition_checks_workers() {
        let p = Partition { machines: 2, hosts: 3 };
        assert_eq!(p.index(Worker { machine: 1, host: 2 }).unwrap(), 5);
        assert!(p.index(Worker { machine: 2, host: 0 }).is_err());
        assert_eq!(p.all_workers().count(), 6);
        assert!(Partition { machines: 0, hosts: 1 }.index(Worker { machine: 0, host: 0 }).is_err());
    }
}
