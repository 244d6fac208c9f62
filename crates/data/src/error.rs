//! The crate's error type. Every variant names what was being read, so a message on a host
//! among hundreds says which file (and where in it) is at fault.

/// Errors of the data path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The `--corpus` value could not be understood (bad URL, unsupported scheme, bad glob).
    #[error("invalid corpus source {spec:?}: {reason}")]
    BadSource {
        /// The source as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The source resolved to no readable corpus file.
    #[error("no corpus files found at {spec:?} (looked for {looked_for})")]
    NoFiles {
        /// The source as given.
        spec: String,
        /// Which file kinds were searched for.
        looked_for: String,
    },
    /// Listing, reading or probing an object failed.
    #[error("cannot read {location}: {source}")]
    Store {
        /// The file or prefix being read.
        location: String,
        /// The object_store error.
        #[source]
        source: object_store::Error,
    },
    /// A local path could not be accessed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path being accessed.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A path read as a file is something else (a FIFO would block the read forever).
    #[error("{path} is {what}, not a regular file")]
    NotAFile {
        /// The path.
        path: String,
        /// What it is.
        what: String,
    },
    /// A parquet file could not be decoded.
    #[error("parquet file {file}{}: {source}", row_group.map(|g| format!(" (row group {g})")).unwrap_or_default())]
    Parquet {
        /// The file.
        file: String,
        /// The row group being decoded, if known.
        row_group: Option<usize>,
        /// The parquet error.
        #[source]
        source: parquet::errors::ParquetError,
    },
    /// A parquet file lacks the text column.
    #[error("corpus file {file} has no column {column:?} (columns: {available})")]
    MissingColumn {
        /// The file.
        file: String,
        /// The requested column.
        column: String,
        /// The columns it does have, comma-separated.
        available: String,
    },
    /// The text column is not a string column.
    #[error("corpus file {file}: column {column:?} has type {data_type}, expected a string column")]
    ColumnType {
        /// The file.
        file: String,
        /// The column.
        column: String,
        /// Its arrow data type.
        data_type: String,
    },
    /// A record could not be used and the reader runs in strict mode.
    #[error("{file}: {location}: {reason}")]
    InvalidRecord {
        /// The file.
        file: String,
        /// Where in the file (byte offset, row group and row).
        location: String,
        /// What is wrong with the record.
        reason: String,
    },
    /// A record (a line of a jsonl or line-text file, a parquet value) is longer than
    /// [`CorpusConfig::max_record_bytes`](crate::CorpusConfig::max_record_bytes): tokenizing it
    /// would take far more memory than its size, so it is refused whatever the invalid-record
    /// policy.
    #[error(
        "{file}: {location}: a record longer than {limit} bytes, the most one record may have \
         (split the document, or raise the limit: extract --max-record-mb)"
    )]
    RecordTooLarge {
        /// The file.
        file: String,
        /// Where in the file (the line's byte offset, or row group and row).
        location: String,
        /// The limit.
        limit: u64,
    },
    /// A file cannot be used as a corpus file at all (e.g. too large for whole-file records).
    #[error("corpus file {file}: {reason}")]
    Unusable {
        /// The file.
        file: String,
        /// Why.
        reason: String,
    },
    /// A worker read records and none was usable: the corpus, or the field it is read from,
    /// is not what the options say (a run of 0 tokens is refused, not called complete).
    #[error(
        "none of the {records} records read was usable ({invalid} unusable, the first because {first}); \
         check --json-field, --text-column and --format"
    )]
    NothingUsable {
        /// Records read.
        records: u64,
        /// Of them, unusable ones (the others blank).
        invalid: u64,
        /// Why the first unusable record was.
        first: String,
    },
    /// Every record of the corpus is blank: a run would complete with 0 tokens.
    #[error("the corpus holds no text: all {records} records of {files} are blank")]
    NoText {
        /// The corpus's files, named.
        files: String,
        /// Records read.
        records: u64,
    },
    /// The tokenizer failed or lacks a token that was asked for.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Invalid options (sequence length, worker index, ...).
    #[error("invalid data configuration: {0}")]
    Config(String),
    /// A resume position does not belong to this corpus, configuration or worker.
    #[error("cannot resume: {0}")]
    Resume(String),
    /// Building the async runtime or a worker thread failed.
    #[error("cannot start data-path threads: {0}")]
    Runtime(#[source] std::io::Error),
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
