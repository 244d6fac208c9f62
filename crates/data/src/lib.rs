//! siphon-data: the corpus side of activation extraction. A corpus (parquet, jsonl or plain
//! text; local paths, globs, `file://`, `s3://`, `gs://` URLs, Hugging Face Hub datasets as
//! `hf://datasets/...` or `OWNER/NAME`) becomes a stream of tokenized, packed or padded
//! batches for one worker of a `machines × hosts` job, such that all workers together cover
//! the corpus exactly once and any worker can resume from the position recorded with its last
//! batch. Records holding conversations are rendered through a [`ChatTemplate`] as
//! transformers renders them, each token carrying its [`Role`].
//!
//! # Design: units
//!
//! The corpus is cut into *units*: a parquet row group, a fixed byte range of a jsonl or
//! line-text file (a line belongs to the unit its first byte falls in), or a whole text
//! file. The unit list comes from listings, file sizes and parquet footers only, so every
//! host computes it cheaply and identically. Units are put in a global order (files sorted,
//! in-file order; optionally a seeded permutation) and unit at ordinal `k` goes to worker
//! `k mod (machines × hosts)` (worker index `machine × hosts + host`).
//!
//! Packing restarts at every unit: the last partial row of a unit is padded and masked. So
//! the single-worker stream is exactly the concatenation of the units' rows in order, and
//! the union of the workers' streams equals it with nothing duplicated or lost, whatever
//! the partition. The price is at most one padded row per unit (row groups hold thousands
//! of documents, so this is well under 1% of tokens at usual sizes).
//!
//! A [`Position`] says where a worker continues: (unit ordinal, record within unit, token
//! offset within that document, row within unit). Resuming seeks straight to the unit (a
//! row group, or a byte offset) and skips the records before, untokenized.
//!
//! Every token carries its id, a global document id ([`doc_id`]: unit and record), its
//! position in the document, an attention mask (0 = pad) and an exclusion mask (BOS, EOS,
//! pad and user-listed ids) that the writer honours; every sequence a stable [`SeqId`].
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use siphon_data::{Corpus, CorpusConfig, PackConfig, PackMode, SpecialTokens, StreamConfig, Partition, Worker};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let corpus = Corpus::open("s3://bucket/fineweb-edu/sample/10BT/*.parquet", &CorpusConfig::default())?;
//! let tokenizer = Arc::new(siphon_data::load_tokenizer("tokenizer.json".as_ref())?);
//! let special = SpecialTokens::detect(&tokenizer);
//! let mut config = StreamConfig::new(PackConfig::new(1024, PackMode::Pack, special), 32);
//! config.partition = Partition { machines: 2, hosts: 4 };
//! config.worker = Worker { machine: 1, host: 3 };
//! for batch in corpus.stream(tokenizer, config)? {
//!     let batch = batch?;
//!     // feed batch.tokens to the model; store batch.position with the shard
//!     let _resume_json = serde_json::to_string(&batch.position)?;
//! }
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod chat;
mod columns;
mod convert;
mod error;
mod file;
mod hub;
mod pack;
mod parquet_file;
mod percent;
mod pieces;
mod plan;
mod read;
mod select;
mod source;
mod special;
mod stream;

pub use chat::{ChatTemplate, Rendered, Role};
pub use columns::{Fields, column_kind};
pub use convert::{ConvertOptions, ConvertReport, text_dir_to_parquet};
pub use error::{Error, Result};
pub use file::{check_regular_file, read_text_file};
pub use pack::{NO_DOC, PackConfig, PackMode, PadSide, SpecialTokens, doc_id};
pub use plan::{Corpus, CorpusConfig, InvalidRecords, Partition, Shuffle, TextRecords, Unit, UnitKind, Worker};
pub use read::Record;
pub use select::{Positions, Selection, choose, choose_together};
pub use source::{CorpusFile, FileFormat};
pub use special::{load_tokenizer, parse_token};
pub use stream::{Batch, BatchStream, DataStats, Position, SeqId, StreamConfig};

/// The tokenizer type the data path consumes (re-exported so callers need not depend on
/// `tokenizers` directly). The models crate builds one from GGUF metadata.
pub use tokenizers::Tokenizer;
