//! The per-worker pipeline: a reader thread streams the worker's units, tokenizer threads
//! encode chunks of records, and the consumer (the caller's thread, in
//! [`BatchStream::next`]) puts chunks back in order, packs them and cuts batches.
//!
//! Memory is bounded by credits: the reader hands out a chunk for one credit per
//! [`CHUNK_BYTES`] of its text (one at least, all of them at most), and only while it holds
//! them, so the channels and the reorder buffer hold about `max_in_flight` chunks' worth of
//! text (or one record longer than that). A record is tokenized in bounded pieces
//! ([`crate::pieces`]) and its rows are packed as batches are made, a batch's worth at a time,
//! so neither the tokenizer's working memory nor the rows grow with a record's length: a
//! record costs its text and its token ids.

use std::collections::{BTreeMap, VecDeque};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;

use crate::chat::{ChatTemplate, Role};
use crate::error::{Error, Result};
use crate::pack::{ISOLATED_LAYOUT, PackConfig, PackMode, Packer, Row};
use crate::pieces::{Encoder, untruncated};
use crate::plan::{Corpus, Fnv, Partition, Unit, Worker};
use crate::read::{Record, UnitReader};

/// Records per chunk handed to a tokenizer thread.
const CHUNK_RECORDS: usize = 64;
/// Text bytes per chunk, whichever comes first.
const CHUNK_BYTES: usize = 1 << 20;

/// Options of one worker's stream.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StreamConfig {
    /// How the corpus is split.
    pub partition: Partition,
    /// Which worker this stream is.
    pub worker: Worker,
    /// Packing.
    pub pack: PackConfig,
    /// Sequences per batch (the last batch of a stream may be shorter).
    pub batch_size: usize,
    /// Tokenizer threads (at least 1).
    pub threads: usize,
    /// Continue from a position recorded with an earlier batch.
    pub resume: Option<Position>,
    /// Renders conversation records (a field holding a list of `{role, content}` messages);
    /// without it they are unusable records.
    pub chat: Option<Arc<ChatTemplate>>,
    /// The most tokens the consumer takes (a job's budget): no record is tokenized past it, as
    /// no more of one can be used. The rows up to it are those of an unbounded stream.
    pub max_tokens: Option<u64>,
}

impl StreamConfig {
    /// A single-worker stream with one tokenizer thread per available core.
    pub fn new(pack: PackConfig, batch_size: usize) -> StreamConfig {
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        StreamConfig {
            partition: Partition::SINGLE,
            worker: Worker { machine: 0, host: 0 },
            pack,
            batch_size,
            threads,
            resume: None,
            chat: None,
            max_tokens: None,
        }
    }
}

/// Where a worker's stream continues: stored with each batch (as opaque JSON in shard
/// manifests) and passed back in [`StreamConfig::resume`].
///
/// The next sequence starts at token `token` of record `record` of the unit at `ordinal` in
/// the global order, and is row `row_in_unit` of that unit. Resuming seeks to that unit
/// (a parquet row group, or a byte range of a jsonl/text file) and skips `record` records
/// inside it without tokenizing them; nothing before the unit is read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// Fingerprint of corpus plan, partition, packing and tokenizer; resume refuses a
    /// position from a different setup.
    pub plan: String,
    /// Ordinal of the unit in the global order (`>=` the number of units: stream finished).
    pub ordinal: u64,
    /// Id of that unit, `None` when the stream is finished.
    pub unit: Option<u32>,
    /// The unit in words (`file (row group 3)`), for people reading manifests.
    pub location: Option<String>,
    /// Record index within the unit.
    pub record: u64,
    /// Token offset within that record's document (separators included).
    pub token: u64,
    /// Index within the unit of the next row.
    pub row_in_unit: u32,
    /// Isolated packing: rows already made of the window that starts at `record` (it is
    /// packed again from there and they are dropped; see `PackMode::Isolated`).
    #[serde(default)]
    pub skip: u32,
    /// Batches this worker produced before this position.
    pub batches: u64,
    /// Sequences this worker produced before this position.
    pub sequences: u64,
}

impl Position {
    /// True when the worker has nothing left.
    pub fn is_end(&self) -> bool {
        self.unit.is_none()
    }
}

/// Stable identity of a sequence: (unit id, row index within the unit). Equal across runs,
/// resumes and partitions, so a dataset can be checked for gaps and duplicates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SeqId {
    /// Unit id.
    pub unit: u32,
    /// Row index within the unit.
    pub index: u32,
}

impl SeqId {
    /// As one integer: `unit << 32 | index`.
    pub fn as_u64(self) -> u64 {
        (u64::from(self.unit) << 32) | u64::from(self.index)
    }
}

/// `len()` sequences of `seq_len` tokens, row-major. Pad positions have attention 0,
/// exclude 1, doc and doc_pos -1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Index of this batch in the worker's stream.
    pub index: u64,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Identity of each sequence.
    pub ids: Vec<SeqId>,
    /// Token ids, `[len, seq_len]`.
    pub tokens: Vec<u32>,
    /// 1 for real tokens, 0 for padding.
    pub attention_mask: Vec<u8>,
    /// 1 where activations must not be kept: BOS, EOS, pad and the user's special tokens.
    pub exclude: Vec<u8>,
    /// Global document id per token ([`doc_id`](crate::doc_id)), -1 for pad/inserted BOS.
    pub doc: Vec<i64>,
    /// Position of the token within its document, -1 for pad/inserted BOS.
    pub doc_pos: Vec<i32>,
    /// Each token's [`Role`] as a byte (`Template` for plain documents and padding).
    pub role: Vec<u8>,
    /// Per sequence, 1 where its last document goes on past it: cut off at a padded row's
    /// end, or continued in the next row.
    pub cut: Vec<u8>,
    /// Where the stream continues after this batch.
    pub position: Position,
}

impl Batch {
    /// Number of sequences.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True for a batch without sequences (never produced by a stream).
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Tokens of sequence `i`.
    pub fn sequence(&self, i: usize) -> &[u32] {
        &self.tokens[i * self.seq_len..(i + 1) * self.seq_len]
    }
}

/// Counters of a stream.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataStats {
    /// Units finished.
    pub units: u64,
    /// Records read (documents + empty + invalid).
    pub records: u64,
    /// Documents tokenized into rows.
    pub documents: u64,
    /// Blank records (or records that tokenize to nothing), skipped.
    pub empty: u64,
    /// Unusable records, skipped.
    pub invalid: u64,
    /// Documents cut short by padding mode.
    pub truncated: u64,
    /// Long records cut where no tokenizer window could be cut exactly: their tokens past the
    /// cut are dropped (each is logged).
    pub cut: u64,
    /// Sequences produced.
    pub sequences: u64,
    /// Non-pad tokens in produced sequences.
    pub tokens: u64,
    /// Pad tokens in produced sequences.
    pub pad_tokens: u64,
    /// Tokens marked excluded (pad included).
    pub excluded_tokens: u64,
    /// Batches produced.
    pub batches: u64,
}

/// What the reader hands the tokenizers, with the credits it took.
enum Work {
    Chunk { seq: u64, credits: usize, ordinal: u64, unit: Unit, records: Vec<(u64, u64, Record)>, end_of_unit: bool },
    Failed { seq: u64, error: Error },
    End { seq: u64 },
}

enum Tok {
    /// A document's ids; each one's role for a rendered conversation (empty for text); the
    /// byte where a long record was cut, if it was.
    Doc {
        ids: Vec<u32>,
        roles: Vec<Role>,
        cut: Option<usize>,
    },
    Empty,
    /// Unusable, and why.
    Invalid(String),
}

enum Done {
    Chunk { credits: usize, ordinal: u64, unit: Unit, docs: Vec<(u64, u64, Tok)>, end_of_unit: bool },
    Failed(Error),
    End,
}

impl Done {
    /// Credits to give back to the reader once the consumer took it.
    fn credits(&self) -> usize {
        match self {
            Done::Chunk { credits, .. } => *credits,
            Done::Failed(_) | Done::End => 1,
        }
    }
}

/// What the consumer took from the tokenizers and has not packed yet: a document (from
/// token `offset` of its separated form on) or the end of a unit.
enum Pending {
    Doc { ordinal: u64, unit: Unit, order: u64, stable: u64, ids: Vec<u32>, roles: Vec<Role>, offset: u64 },
    EndOfUnit { ordinal: u64, unit: Unit },
}

/// A worker's stream of batches. Iterating yields `Result<Batch>`; after an error the
/// stream ends. Dropping it stops and joins its threads.
pub struct BatchStream {
    corpus: Corpus,
    cfg: Arc<PackConfig>,
    batch_size: usize,
    workers: u64,
    plan: String,
    resume: Option<Position>,
    done_rx: Option<Receiver<(u64, Done)>>,
    credit_tx: Option<SyncSender<()>>,
    reorder: BTreeMap<u64, Done>,
    next_seq: u64,
    /// Documents taken and not yet packed, in order: packing stops once a batch's rows are
    /// ready, so a long document's rows are made as they are used.
    pending: VecDeque<Pending>,
    packer: Option<(u64, Packer)>,
    rows: VecDeque<(u64, u32, Row)>,
    finished: bool,
    failed: bool,
    stats: DataStats,
    /// Why the first unusable record was (a stream of nothing but those is an error).
    first_invalid: Option<String>,
    position: Position,
    threads: Vec<JoinHandle<()>>,
}

impl Corpus {
    /// Starts `config.worker`'s stream of batches.
    pub fn stream(&self, tokenizer: Arc<Tokenizer>, config: StreamConfig) -> Result<BatchStream> {
        config.pack.validate()?;
        if config.batch_size == 0 {
            return Err(Error::Config("batch_size must be positive".into()));
        }
        if config.threads == 0 {
            return Err(Error::Config("at least one tokenizer thread is needed".into()));
        }
        let vocab = tokenizer.get_vocab_size(true) as u64;
        let special = &config.pack.special;
        for id in special.bos.iter().chain(&special.eos).chain([&special.pad]).chain(&special.exclude) {
            if u64::from(*id) >= vocab && tokenizer.id_to_token(*id).is_none() {
                return Err(Error::Tokenizer(format!("special token id {id} is outside the vocabulary of {vocab}")));
            }
        }
        let w = config.partition.index(config.worker)?;
        let n_workers = config.partition.workers();
        let plan = format!("{:016x}", self.stream_fingerprint(&config, vocab));
        let n_units = self.order.len() as u64;

        let start = match &config.resume {
            None => self.position_at(&plan, w, 0, 0, 0, 0, 0),
            Some(p) => {
                if p.plan != plan {
                    return Err(Error::Resume(format!(
                        "position was recorded for plan {} but this corpus, partition, packing and tokenizer give {plan}",
                        p.plan
                    )));
                }
                if p.ordinal < n_units {
                    if p.ordinal % n_workers != w {
                        return Err(Error::Resume(format!("unit ordinal {} does not belong to worker {w}", p.ordinal)));
                    }
                    if p.unit != Some(self.order[p.ordinal as usize]) {
                        return Err(Error::Resume(format!("unit at ordinal {} is not unit {:?}", p.ordinal, p.unit)));
                    }
                }
                p.clone()
            }
        };
        let ordinals: Vec<u64> = (start.ordinal.max(w)..n_units).filter(|o| o % n_workers == w).collect();

        let tokenizer = untruncated(tokenizer).map_err(Error::Tokenizer)?;
        let encoder = Arc::new(Encoder::new(tokenizer));
        // Pad mode keeps a document's first row: a long one is tokenized until that is full
        // (and one token more, so that it counts as truncated). No document needs more tokens
        // than the consumer takes in all.
        let row = match config.pack.mode {
            PackMode::Pad(_) => Some(config.pack.seq_len + 1),
            PackMode::Pack | PackMode::Isolated => None,
        };
        let budget = config.max_tokens.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        let enough = row.into_iter().chain(budget).min();
        let max_in_flight = 4 * config.threads + 4;
        let (work_tx, work_rx) = sync_channel::<Work>(max_in_flight);
        let (done_tx, done_rx) = sync_channel::<(u64, Done)>(max_in_flight);
        let (credit_tx, credit_rx) = sync_channel::<()>(max_in_flight);
        for _ in 0..max_in_flight {
            credit_tx.send(()).expect("receiver alive");
        }
        let mut threads = Vec::new();
        let corpus = self.clone();
        let skip = start.record;
        threads.push(
            std::thread::Builder::new()
                .name(format!("siphon-read-{w}"))
                .spawn(move || read_main(corpus, ordinals, skip, work_tx, credit_rx, max_in_flight))
                .map_err(Error::Runtime)?,
        );
        let work_rx = Arc::new(Mutex::new(work_rx));
        for t in 0..config.threads {
            let work_rx = work_rx.clone();
            let done_tx = done_tx.clone();
            let encoder = encoder.clone();
            let chat = config.chat.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("siphon-tok-{w}-{t}"))
                    .spawn(move || tokenize_main(&encoder, chat.as_deref(), enough, &work_rx, &done_tx))
                    .map_err(Error::Runtime)?,
            );
        }
        drop(done_tx);
        let stats = DataStats::default();
        Ok(BatchStream {
            corpus: self.clone(),
            cfg: Arc::new(config.pack),
            batch_size: config.batch_size,
            workers: n_workers,
            plan,
            resume: Some(start.clone()),
            done_rx: Some(done_rx),
            credit_tx: Some(credit_tx),
            reorder: BTreeMap::new(),
            next_seq: 0,
            pending: VecDeque::new(),
            packer: None,
            rows: VecDeque::new(),
            finished: false,
            failed: false,
            stats,
            first_invalid: None,
            position: start,
            threads,
        })
    }

    fn stream_fingerprint(&self, config: &StreamConfig, vocab: u64) -> u64 {
        let mut pack = serde_json::to_string(&config.pack).expect("PackConfig serializes");
        if config.pack.mode == PackMode::Isolated {
            pack.push_str(ISOLATED_LAYOUT);
        }
        Fnv::new()
            .u64(self.fingerprint)
            .u64(u64::from(config.partition.machines))
            .u64(u64::from(config.partition.hosts))
            .bytes(pack.as_bytes())
            .u64(vocab)
            .0
    }

    #[allow(clippy::too_many_arguments)]
    fn position_at(
        &self,
        plan: &str,
        first: u64,
        ordinal: u64,
        record: u64,
        token: u64,
        batches: u64,
        sequences: u64,
    ) -> Position {
        let ordinal = ordinal.max(first);
        let unit = self.unit_at(ordinal);
        Position {
            plan: plan.to_string(),
            ordinal: if unit.is_some() { ordinal } else { self.order.len() as u64 },
            unit: unit.map(|u| u.id),
            location: unit.map(|u| self.describe_unit(u)),
            record,
            token,
            row_in_unit: 0,
            skip: 0,
            batches,
            sequences,
        }
    }
}

impl BatchStream {
    /// Counters so far.
    pub fn stats(&self) -> &DataStats {
        &self.stats
    }

    /// Where the stream continues after the last batch returned (the start before any).
    pub fn position(&self) -> &Position {
        &self.position
    }

    /// Packs what was taken and takes chunks in order until more than `batch_size` rows are
    /// ready or the input ends (one row of look-ahead, so the last batch knows it is the last).
    fn fill(&mut self) -> Result<()> {
        while self.rows.len() <= self.batch_size {
            if let Some(pending) = self.pending.pop_front() {
                self.pack(pending);
                continue;
            }
            if self.finished {
                break;
            }
            match self.next_done()? {
                Done::Failed(e) => return Err(e),
                Done::End => self.finished = true,
                Done::Chunk { ordinal, unit, docs, end_of_unit, .. } => self.take(ordinal, unit, docs, end_of_unit),
            }
        }
        Ok(())
    }

    /// The next chunk in order from the tokenizers; its credits go back to the reader.
    fn next_done(&mut self) -> Result<Done> {
        let done = loop {
            if let Some(done) = self.reorder.remove(&self.next_seq) {
                break done;
            }
            let rx = self.done_rx.as_ref().expect("open while not finished");
            match rx.recv() {
                Ok((seq, done)) => {
                    self.reorder.insert(seq, done);
                }
                Err(_) => {
                    return Err(Error::Runtime(std::io::Error::other("a data-path thread stopped unexpectedly")));
                }
            }
        };
        self.next_seq += 1;
        if let Some(credit) = &self.credit_tx {
            for _ in 0..done.credits() {
                let _ = credit.send(());
            }
        }
        Ok(done)
    }

    /// Counts a chunk's records and queues its documents for packing.
    fn take(&mut self, ordinal: u64, unit: Unit, docs: Vec<(u64, u64, Tok)>, end_of_unit: bool) {
        let resume = self.resume.as_ref().filter(|p| p.ordinal == ordinal);
        for (order, stable, tok) in docs {
            self.stats.records += 1;
            match tok {
                Tok::Empty => self.stats.empty += 1,
                Tok::Invalid(reason) => {
                    self.stats.invalid += 1;
                    self.first_invalid.get_or_insert(reason);
                }
                Tok::Doc { ids, roles, cut } => {
                    self.stats.documents += 1;
                    if let Some(at) = cut {
                        self.stats.cut += 1;
                        tracing::warn!(
                            unit = %self.corpus.describe_unit(&unit), record = stable, byte = at, tokens = ids.len(),
                            "record cut: the tokenizer's windows did not agree near this byte, so its tokens past it \
                             are dropped (its tokens before it are exact)"
                        );
                    }
                    let offset = resume.filter(|p| p.record == order).map_or(0, |p| p.token);
                    self.pending.push_back(Pending::Doc { ordinal, unit, order, stable, ids, roles, offset });
                }
            }
        }
        if end_of_unit {
            self.pending.push_back(Pending::EndOfUnit { ordinal, unit });
        }
    }

    /// Packs one pending item into rows, up to the rows a batch still needs: a document not
    /// packed to its end goes back to the front of the queue.
    fn pack(&mut self, pending: Pending) {
        let (ordinal, unit) = match &pending {
            Pending::Doc { ordinal, unit, .. } | Pending::EndOfUnit { ordinal, unit } => (*ordinal, *unit),
        };
        if self.packer.as_ref().is_none_or(|(o, _)| *o != ordinal) {
            let (first_row, skip) = self
                .resume
                .as_ref()
                .filter(|p| p.ordinal == ordinal)
                .map_or((0, 0), |p| (p.row_in_unit.saturating_sub(p.skip), p.skip));
            self.packer = Some((ordinal, Packer::new(self.cfg.clone(), unit.id, first_row).skipping(skip)));
        }
        let (_, packer) = self.packer.as_mut().expect("just set");
        let mut out = Vec::new();
        match pending {
            Pending::Doc { ordinal, unit, order, stable, ids, roles, offset } => {
                let room = (self.batch_size + 1).saturating_sub(self.rows.len()).max(1);
                if let Some(offset) = packer.push(order, stable, &ids, &roles, offset, room, &mut out) {
                    self.pending.push_front(Pending::Doc { ordinal, unit, order, stable, ids, roles, offset });
                }
            }
            Pending::EndOfUnit { .. } => {
                packer.finish(&mut out);
                self.stats.truncated += packer.truncated_docs;
                self.stats.units += 1;
                self.packer = None;
                // Only the first unit of a resumed stream starts mid-way.
                self.resume = None;
            }
        }
        self.rows.extend(out.into_iter().map(|r| (ordinal, unit.id, r)));
    }

    fn make_batch(&mut self) -> Batch {
        let n = self.batch_size.min(self.rows.len());
        let seq_len = self.cfg.seq_len;
        let mut batch = Batch {
            index: self.position.batches,
            seq_len,
            ids: Vec::with_capacity(n),
            tokens: Vec::with_capacity(n * seq_len),
            attention_mask: Vec::with_capacity(n * seq_len),
            exclude: Vec::with_capacity(n * seq_len),
            doc: Vec::with_capacity(n * seq_len),
            doc_pos: Vec::with_capacity(n * seq_len),
            role: Vec::with_capacity(n * seq_len),
            cut: Vec::with_capacity(n),
            position: self.position.clone(),
        };
        let mut last = None;
        for (ordinal, unit, row) in self.rows.drain(..n) {
            let real = row.attention.iter().filter(|&&a| a == 1).count() as u64;
            self.stats.tokens += real;
            self.stats.pad_tokens += seq_len as u64 - real;
            self.stats.excluded_tokens += row.exclude.iter().filter(|&&e| e == 1).count() as u64;
            batch.ids.push(SeqId { unit, index: row.index_in_unit });
            batch.tokens.extend_from_slice(&row.tokens);
            batch.attention_mask.extend_from_slice(&row.attention);
            batch.exclude.extend_from_slice(&row.exclude);
            batch.doc.extend_from_slice(&row.doc);
            batch.doc_pos.extend_from_slice(&row.doc_pos);
            batch.role.extend_from_slice(&row.role);
            batch.cut.push(u8::from(row.cut));
            last = Some((ordinal, row.index_in_unit, row.next, row.skip));
        }
        self.stats.sequences += n as u64;
        self.stats.batches += 1;
        let (ordinal, index, next, skip) = last.expect("batch has rows");
        let batches = self.position.batches + 1;
        let sequences = self.position.sequences + n as u64;
        self.position = match next {
            _ if self.rows.is_empty() && self.finished => {
                self.corpus.position_at(&self.plan, 0, self.corpus.order.len() as u64, 0, 0, batches, sequences)
            }
            Some((record, token)) => {
                let mut p = self.corpus.position_at(&self.plan, 0, ordinal, record, token, batches, sequences);
                p.row_in_unit = index + 1;
                p.skip = skip;
                p
            }
            None => self.corpus.position_at(&self.plan, 0, ordinal + self.workers, 0, 0, batches, sequences),
        };
        batch.position = self.position.clone();
        batch
    }
}

impl Iterator for BatchStream {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.failed {
            return None;
        }
        if let Err(e) = self.fill() {
            self.failed = true;
            self.shutdown();
            return Some(Err(e));
        }
        if self.rows.is_empty() {
            self.shutdown();
            if self.stats.documents == 0
                && let Some(first) = self.first_invalid.take()
            {
                let DataStats { records, invalid, .. } = self.stats;
                return Some(Err(Error::NothingUsable { records, invalid, first }));
            }
            return None;
        }
        Some(Ok(self.make_batch()))
    }
}

impl BatchStream {
    fn shutdown(&mut self) {
        // Closing our ends unblocks every thread: the reader fails to get a credit, the
        // tokenizers fail to send, and each exits.
        self.credit_tx.take();
        self.done_rx.take();
        for handle in self.threads.drain(..) {
            if handle.join().is_err() {
                tracing::error!("a data-path thread panicked");
            }
        }
    }
}

impl Drop for BatchStream {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Hands out chunks in order, each for the credits its text takes.
struct ChunkSender {
    seq: u64,
    work_tx: SyncSender<Work>,
    credit_rx: Receiver<()>,
    /// Every credit there is: what the longest chunk takes.
    max_in_flight: usize,
}

impl ChunkSender {
    /// Sends a chunk of `bytes` of text, once its credits are free; false when the consumer is
    /// gone.
    fn send(&mut self, bytes: usize, make: impl FnOnce(u64, usize) -> Work) -> bool {
        let credits = bytes.div_ceil(CHUNK_BYTES).clamp(1, self.max_in_flight);
        for _ in 0..credits {
            if self.credit_rx.recv().is_err() {
                return false;
            }
        }
        let ok = self.work_tx.send(make(self.seq, credits)).is_ok();
        self.seq += 1;
        ok
    }

    /// Sends what takes one credit (an error, the end).
    fn send_one(&mut self, make: impl FnOnce(u64) -> Work) -> bool {
        self.send(0, |seq, _| make(seq))
    }
}

fn read_main(
    corpus: Corpus,
    ordinals: Vec<u64>,
    first_skip: u64,
    work_tx: SyncSender<Work>,
    credit_rx: Receiver<()>,
    max_in_flight: usize,
) {
    let mut sender = ChunkSender { seq: 0, work_tx, credit_rx, max_in_flight };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            sender.send_one(|seq| Work::Failed { seq, error: Error::Runtime(e) });
            return;
        }
    };
    rt.block_on(async {
        let mut reader = UnitReader::new(corpus.clone());
        for (i, &ordinal) in ordinals.iter().enumerate() {
            let unit = *corpus.unit_at(ordinal).expect("ordinal within the plan");
            let skip = if i == 0 { first_skip } else { 0 };
            let mut chunk: Vec<(u64, u64, Record)> = Vec::new();
            let mut bytes = 0usize;
            let mut alive = true;
            let result = {
                let mut emit = |order: u64, stable: u64, record: Record| -> Result<bool> {
                    bytes += record.text_bytes();
                    chunk.push((order, stable, record));
                    if chunk.len() >= CHUNK_RECORDS || bytes >= CHUNK_BYTES {
                        let records = std::mem::take(&mut chunk);
                        alive = sender.send(std::mem::take(&mut bytes), |seq, credits| Work::Chunk {
                            seq,
                            credits,
                            ordinal,
                            unit,
                            records,
                            end_of_unit: false,
                        });
                    }
                    Ok(alive)
                };
                reader.read(&unit, skip, &mut emit).await
            };
            if !alive {
                return;
            }
            if let Err(error) = result {
                sender.send_one(|seq| Work::Failed { seq, error });
                return;
            }
            let last = |seq, credits| Work::Chunk { seq, credits, ordinal, unit, records: chunk, end_of_unit: true };
            if !sender.send(bytes, last) {
                return;
            }
        }
        sender.send_one(|seq| Work::End { seq });
    });
}

fn tokenize_main(
    encoder: &Encoder<Arc<Tokenizer>>,
    chat: Option<&ChatTemplate>,
    enough: Option<usize>,
    work_rx: &Mutex<Receiver<Work>>,
    done_tx: &SyncSender<(u64, Done)>,
) {
    loop {
        let work = {
            let Ok(rx) = work_rx.lock() else { return };
            match rx.recv() {
                Ok(work) => work,
                Err(_) => return,
            }
        };
        let item = match work {
            Work::End { seq } => (seq, Done::End),
            Work::Failed { seq, error } => (seq, Done::Failed(error)),
            Work::Chunk { seq, credits, ordinal, unit, records, end_of_unit } => {
                let docs: Result<Vec<_>> = records
                    .into_iter()
                    .map(|(order, stable, record)| {
                        let tok = tokenize(encoder, chat, enough, record)
                            .map_err(|e| Error::Tokenizer(format!("unit {} record {stable}: {e}", unit.id)))?;
                        Ok((order, stable, tok))
                    })
                    .collect();
                match docs {
                    Ok(docs) => (seq, Done::Chunk { credits, ordinal, unit, docs, end_of_unit }),
                    Err(e) => (seq, Done::Failed(e)),
                }
            }
        };
        if done_tx.send(item).is_err() {
            return;
        }
    }
}

/// One record's tokens (the tokenizer's error on a text fails the stream; a conversation
/// that does not render or tokenize is an unusable record).
fn tokenize(
    encoder: &Encoder<Arc<Tokenizer>>,
    chat: Option<&ChatTemplate>,
    enough: Option<usize>,
    record: Record,
) -> std::result::Result<Tok, String> {
    let doc = |ids: Vec<u32>, roles, cut| if ids.is_empty() { Tok::Empty } else { Tok::Doc { ids, roles, cut } };
    Ok(match record {
        Record::Empty => Tok::Empty,
        Record::Invalid(reason) => Tok::Invalid(reason),
        Record::Conversation(messages) => match chat {
            None => Tok::Invalid(
                "the record is a conversation and there is no chat template (the model's, or --chat-template)".into(),
            ),
            Some(chat) => match chat.encode_with(encoder, &messages, enough) {
                Ok((encoded, roles)) => doc(encoded.ids, roles, encoded.cut),
                Err(reason) => Tok::Invalid(reason),
            },
        },
        Record::Text(text) => {
            let encoded = encoder.encode(text.as_str(), false, enough)?;
            doc(encoded.ids, Vec::new(), encoded.cut)
        }
        Record::Tokens { ids, roles } => doc(ids, roles, None),
    })
}
