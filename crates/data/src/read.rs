//! Reading the records of one unit, streaming, from the object store (and so a corpus's
//! first records).

use std::sync::Arc;

use arrow_array::{Array, LargeStringArray, StringArray, StringViewArray};
use futures::TryStreamExt;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, RowSelection, RowSelector};
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;

use crate::error::{Error, Result};
use crate::parquet_file::{StoreReader, load_parquet_meta, text_column_index};
use crate::plan::{Corpus, InvalidRecords, Unit, UnitKind, permute};
use crate::source::{CorpusFile, FileFormat};

/// One record as read, before tokenization.
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    /// A document.
    Text(String),
    /// Present but blank.
    Empty,
    /// Unusable (reason).
    Invalid(String),
    /// A list of `{role, content}` messages, to be rendered with a chat template.
    Conversation(serde_json::Value),
    /// Token ids as given, not tokenized again, and each one's role: a line of `siphon
    /// generate`'s output (its `prompt_ids` as the user's, its `completion_ids` as the
    /// assistant's), read where the line has no `--json-field`.
    Tokens {
        /// The ids, prompt then completion.
        ids: Vec<u32>,
        /// Each id's role.
        roles: Vec<crate::chat::Role>,
    },
}

impl Record {
    /// The bytes of text it holds (a conversation's strings), which its tokens take memory in
    /// proportion to.
    pub(crate) fn text_bytes(&self) -> usize {
        fn strings(value: &serde_json::Value) -> usize {
            match value {
                serde_json::Value::String(s) => s.len(),
                serde_json::Value::Array(items) => items.iter().map(strings).sum(),
                serde_json::Value::Object(fields) => fields.iter().map(|(k, v)| k.len() + strings(v)).sum(),
                _ => 0,
            }
        }
        match self {
            Record::Text(text) => text.len(),
            Record::Conversation(messages) => strings(messages),
            Record::Tokens { ids, .. } => ids.len() * 4,
            Record::Empty | Record::Invalid(_) => 0,
        }
    }
}

/// Receives `(index in emitted order, stable record index, record)`; returns `false` to stop.
pub(crate) type Emit<'a> = dyn FnMut(u64, u64, Record) -> Result<bool> + 'a;

/// Like [`Emit`], plus a closure that says where the record is (for messages).
type EmitAt<'a> = dyn FnMut(u64, u64, Record, &dyn Fn() -> String) -> Result<bool> + 'a;

/// Bytes fetched per request when scanning byte-range units.
const BLOCK: u64 = 1 << 20;
/// Bytes of parquet rows decoded at once, about.
const BATCH_BYTES: u64 = 8 << 20;
/// Invalid records logged per reader before going quiet.
const LOGGED_INVALID: u32 = 5;

/// Reads units of one corpus; caches the parquet footer of the last file it read.
pub(crate) struct UnitReader {
    corpus: Corpus,
    meta_cache: Option<(u32, ArrowReaderMetadata)>,
    logged_invalid: Arc<std::sync::atomic::AtomicU32>,
}

impl UnitReader {
    pub fn new(corpus: Corpus) -> UnitReader {
        UnitReader { corpus, meta_cache: None, logged_invalid: Arc::default() }
    }

    /// Streams the records of `unit`, starting at emitted index `skip`.
    pub async fn read(&mut self, unit: &Unit, skip: u64, emit: &mut Emit<'_>) -> Result<()> {
        let file = self.corpus.files[unit.file as usize].clone();
        let shuffle_seed =
            self.corpus.config.shuffle.filter(|s| s.within_unit).map(|s| s.seed ^ (u64::from(unit.id) << 20) ^ 0x5eed);
        let strict = self.corpus.config.invalid == InvalidRecords::Error;
        let logged = self.logged_invalid.clone();
        // Wraps `emit` with the invalid-record policy; `loc` says where the record is.
        let mut checked = |order: u64, stable: u64, record: Record, loc: &dyn Fn() -> String| -> Result<bool> {
            if let Record::Invalid(reason) = &record {
                if strict {
                    return Err(Error::InvalidRecord {
                        file: file.display.clone(),
                        location: loc(),
                        reason: reason.clone(),
                    });
                }
                if logged.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < LOGGED_INVALID {
                    tracing::warn!(file = %file.display, location = %loc(), %reason, "skipping invalid record");
                }
            }
            emit(order, stable, record)
        };
        if let Some(seed) = shuffle_seed {
            // Within-unit shuffle: gather the unit, permute, hand out from `skip`.
            let mut all: Vec<(u64, Record, String)> = Vec::new();
            let mut gather = |_: u64, stable: u64, record: Record, loc: &dyn Fn() -> String| -> Result<bool> {
                all.push((stable, record, loc()));
                Ok(true)
            };
            self.read_raw(unit, &file, 0, &mut gather).await?;
            permute(&mut all, seed);
            for (order, (stable, record, loc)) in all.into_iter().enumerate().skip(skip as usize) {
                if !checked(order as u64, stable, record, &|| loc.clone())? {
                    break;
                }
            }
            return Ok(());
        }
        let mut pass =
            |order: u64, stable: u64, record: Record, loc: &dyn Fn() -> String| checked(order, stable, record, loc);
        self.read_raw(unit, &file, skip, &mut pass).await
    }

    async fn read_raw(&mut self, unit: &Unit, file: &CorpusFile, skip: u64, emit: &mut EmitAt<'_>) -> Result<()> {
        let store = self.corpus.store.clone();
        match (unit.kind, file.format) {
            (UnitKind::RowGroup { index, rows }, _) => {
                let meta = match &self.meta_cache {
                    Some((f, meta)) if *f == unit.file => meta.clone(),
                    _ => {
                        let meta = load_parquet_meta(&store, file).await?;
                        self.meta_cache = Some((unit.file, meta.clone()));
                        meta
                    }
                };
                let (column, max) = (&self.corpus.config.text_column, self.corpus.config.max_record_bytes);
                read_row_group(store, file, meta, column, max, index as usize, rows, skip, emit).await
            }
            (UnitKind::WholeFile, _) => {
                if skip > 0 {
                    return Ok(());
                }
                let bytes = store
                    .get(&file.path)
                    .await
                    .map_err(|source| Error::Store { location: file.display.clone(), source })?
                    .bytes()
                    .await
                    .map_err(|source| Error::Store { location: file.display.clone(), source })?;
                let record = match String::from_utf8(Vec::from(bytes)) {
                    Ok(text) if text.trim().is_empty() => Record::Empty,
                    Ok(text) => Record::Text(text),
                    Err(e) => Record::Invalid(format!("not UTF-8 text ({e})")),
                };
                emit(0, 0, record, &|| "whole file".to_string())?;
                Ok(())
            }
            (UnitKind::Bytes { start, end }, format) => {
                let json_field = self.corpus.config.json_field.clone();
                let max = self.corpus.config.max_record_bytes;
                let mut lines = LineReader::new(store, file, start, max).await?;
                let mut index = 0u64;
                while let Some((offset, line)) = lines.next_line(end).await? {
                    if index >= skip {
                        let record = match format {
                            FileFormat::Jsonl => json_record(&line, &json_field),
                            _ => text_record(line),
                        };
                        if !emit(index, index, record, &|| format!("byte {offset}"))? {
                            break;
                        }
                    }
                    index += 1;
                }
                Ok(())
            }
        }
    }
}

impl Corpus {
    /// The first `n` records of the corpus in its global order (fewer if it has fewer):
    /// what a run will read first, as read (a conversation not yet rendered), for checks and
    /// examples before a run.
    pub fn first_records(&self, n: usize) -> Result<Vec<Record>> {
        let mut records = Vec::new();
        self.scan(|record| {
            records.push(record);
            records.len() < n
        })?;
        Ok(records)
    }

    /// Reads the corpus in its global order up to its first usable record (a text or a
    /// conversation; usually the first record), so that a corpus of nothing is refused before
    /// a run starts, not completed with 0 tokens: records all blank are [`Error::NoText`],
    /// some unusable [`Error::NothingUsable`] (as the run would find).
    pub fn check_usable(&self) -> Result<()> {
        let (mut records, mut invalid, mut first) = (0u64, 0u64, None);
        let mut usable = false;
        self.scan(|record| {
            records += 1;
            match record {
                Record::Text(_) | Record::Conversation(_) | Record::Tokens { .. } => usable = true,
                Record::Empty => {}
                Record::Invalid(reason) => {
                    invalid += 1;
                    first.get_or_insert(reason);
                }
            }
            !usable
        })?;
        match (usable, first) {
            (true, _) => Ok(()),
            (false, Some(first)) => Err(Error::NothingUsable { records, invalid, first }),
            (false, None) => Err(Error::NoText {
                files: match self.files.as_slice() {
                    [one] => one.display.clone(),
                    [first, rest @ ..] => format!("{} and {} more files", first.display, rest.len()),
                    [] => "no file".into(),
                },
                records,
            }),
        }
    }

    /// Hands `visit` the corpus's records in its global order until it returns false or the
    /// corpus ends; on a helper thread, so that callers inside a tokio runtime may call it too.
    fn scan(&self, mut visit: impl FnMut(Record) -> bool + Send) -> Result<()> {
        let corpus = self.clone();
        let read = move || -> Result<()> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(Error::Runtime)?;
            rt.block_on(async {
                let mut reader = UnitReader::new(corpus.clone());
                let mut more = true;
                for &unit in corpus.order.iter() {
                    let unit = corpus.units[unit as usize];
                    let mut emit = |_: u64, _: u64, record: Record| -> Result<bool> {
                        more = visit(record);
                        Ok(more)
                    };
                    reader.read(&unit, 0, &mut emit).await?;
                    if !more {
                        break;
                    }
                }
                Ok(())
            })
        };
        std::thread::scope(|scope| scope.spawn(read).join())
            .map_err(|_| Error::Runtime(std::io::Error::other("the thread reading the first records panicked")))?
    }
}

impl Corpus {
    /// Runs `future` to its end on a helper thread's runtime, so that callers inside a tokio
    /// runtime may call it too.
    pub(crate) fn block_on<T: Send>(&self, future: impl std::future::Future<Output = Result<T>> + Send) -> Result<T> {
        let run = move || -> Result<T> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(Error::Runtime)?;
            rt.block_on(future)
        };
        std::thread::scope(|scope| scope.spawn(run).join())
            .map_err(|_| Error::Runtime(std::io::Error::other("the thread reading the corpus panicked")))?
    }

    /// Every line of a byte-range unit (`start..end` of `file`), as [`UnitReader`] reads
    /// them: line `i` is the unit's record `i`.
    pub(crate) fn unit_lines(&self, file: &CorpusFile, start: u64, end: u64) -> Result<Vec<Vec<u8>>> {
        let (store, max) = (self.store.clone(), self.config.max_record_bytes);
        self.block_on(async move {
            let mut lines = LineReader::new(store, file, start, max).await?;
            let mut out = Vec::new();
            while let Some((_, line)) = lines.next_line(end).await? {
                out.push(line);
            }
            Ok(out)
        })
    }

    /// The first `n` lines of the first jsonl unit in the corpus's order.
    pub(crate) fn first_lines(&self, n: usize) -> Result<Vec<Vec<u8>>> {
        for &unit in self.order.iter() {
            let unit = self.units[unit as usize];
            let file = &self.files[unit.file as usize];
            if let (UnitKind::Bytes { start, end }, FileFormat::Jsonl) = (unit.kind, file.format) {
                let mut lines = self.unit_lines(file, start, end)?;
                lines.retain(|l| !l.iter().all(u8::is_ascii_whitespace));
                if !lines.is_empty() {
                    lines.truncate(n);
                    return Ok(lines);
                }
            }
        }
        Ok(Vec::new())
    }
}

#[allow(clippy::too_many_arguments)]
async fn read_row_group(
    store: Arc<dyn ObjectStore>,
    file: &CorpusFile,
    meta: ArrowReaderMetadata,
    column: &str,
    max_record_bytes: u64,
    row_group: usize,
    rows: u64,
    skip: u64,
    emit: &mut EmitAt<'_>,
) -> Result<()> {
    if skip >= rows {
        return Ok(());
    }
    let perr = |source| Error::Parquet { file: file.display.clone(), row_group: Some(row_group), source };
    let col = text_column_index(&meta, file, column)?;
    let reader = StoreReader::new(store, file);
    let builder = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, meta);
    let mask = ProjectionMask::roots(builder.parquet_schema(), [col]);
    // Rows decoded at once: 1024, fewer when the row group's rows are large (a batch of huge
    // values would hold them all at once).
    let group = builder.metadata().row_group(row_group);
    let row_bytes = u64::try_from(group.total_byte_size()).unwrap_or(0) / rows.max(1);
    let batch_rows = (BATCH_BYTES / row_bytes.max(1)).clamp(1, 1024) as usize;
    let mut builder = builder.with_row_groups(vec![row_group]).with_projection(mask).with_batch_size(batch_rows);
    if skip > 0 {
        // Resume inside a row group: skipped pages are not decoded.
        builder = builder.with_row_selection(RowSelection::from(vec![
            RowSelector::skip(skip as usize),
            RowSelector::select((rows - skip) as usize),
        ]));
    }
    let mut stream = builder.build().map_err(perr)?;
    let mut row = skip;
    while let Some(batch) = stream.try_next().await.map_err(perr)? {
        let array = batch.column(0);
        let mut each = |value: Option<&str>| -> Result<bool> {
            if value.is_some_and(|t| t.len() as u64 > max_record_bytes) {
                return Err(Error::RecordTooLarge {
                    file: file.display.clone(),
                    location: format!("row group {row_group}, row {row}"),
                    limit: max_record_bytes,
                });
            }
            let record = match value {
                None => Record::Invalid("null text".into()),
                Some(t) if t.trim().is_empty() => Record::Empty,
                Some(t) => Record::Text(t.to_string()),
            };
            let r = row;
            row += 1;
            emit(r, r, record, &|| format!("row group {row_group}, row {r}"))
        };
        macro_rules! walk {
            ($ty:ty) => {{
                let a = array.as_any().downcast_ref::<$ty>().expect("type checked against the schema");
                for i in 0..a.len() {
                    if !each(if a.is_null(i) { None } else { Some(a.value(i)) })? {
                        return Ok(());
                    }
                }
            }};
        }
        match array.data_type() {
            arrow_schema::DataType::List(_) | arrow_schema::DataType::LargeList(_) => {
                for i in 0..array.len() {
                    let record = match conversation(array.as_ref(), i) {
                        Ok(messages) if messages.as_array().is_some_and(Vec::is_empty) => Record::Empty,
                        Ok(messages) => Record::Conversation(messages),
                        Err(reason) => Record::Invalid(reason),
                    };
                    let r = row;
                    row += 1;
                    if !emit(r, r, record, &|| format!("row group {row_group}, row {r}"))? {
                        return Ok(());
                    }
                }
            }
            arrow_schema::DataType::Utf8 => walk!(StringArray),
            arrow_schema::DataType::LargeUtf8 => walk!(LargeStringArray),
            arrow_schema::DataType::Utf8View => walk!(StringViewArray),
            other => {
                return Err(Error::ColumnType {
                    file: file.display.clone(),
                    column: column.to_string(),
                    data_type: other.to_string(),
                });
            }
        }
    }
    Ok(())
}

/// Row `i` of a list-of-struct column as a JSON list of messages (string and null fields;
/// a field of another type is named in the error, not dropped).
fn conversation(array: &dyn Array, i: usize) -> std::result::Result<serde_json::Value, String> {
    use arrow_array::cast::AsArray;
    if array.is_null(i) {
        return Err("null conversation".into());
    }
    let items = match array.data_type() {
        arrow_schema::DataType::List(_) => array.as_list::<i32>().value(i),
        _ => array.as_list::<i64>().value(i),
    };
    let structs = items.as_struct_opt().ok_or("the list's items are not messages (structs)")?;
    let mut messages = Vec::with_capacity(structs.len());
    for m in 0..structs.len() {
        let mut message = serde_json::Map::new();
        for (field, column) in structs.fields().iter().zip(structs.columns()) {
            let value = if column.is_null(m) {
                serde_json::Value::Null
            } else {
                match column.data_type() {
                    arrow_schema::DataType::Utf8 => column.as_string::<i32>().value(m).into(),
                    arrow_schema::DataType::LargeUtf8 => column.as_string::<i64>().value(m).into(),
                    arrow_schema::DataType::Utf8View => column.as_string_view().value(m).into(),
                    other => return Err(format!("message field {:?} is {other}, which is not read", field.name())),
                }
            };
            message.insert(field.name().clone(), value);
        }
        messages.push(serde_json::Value::Object(message));
    }
    Ok(serde_json::Value::Array(messages))
}

fn text_record(line: Vec<u8>) -> Record {
    match String::from_utf8(line) {
        Ok(t) if t.trim().is_empty() => Record::Empty,
        Ok(t) => Record::Text(t),
        Err(e) => Record::Invalid(format!("line is not UTF-8 ({e})")),
    }
}

fn json_record(line: &[u8], field: &str) -> Record {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Record::Empty;
    }
    let mut value: serde_json::Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => return Record::Invalid(format!("line is not valid JSON ({e})")),
    };
    // Taken out of the object rather than copied: a record's text is held once.
    match value.get_mut(field).map(serde_json::Value::take) {
        None if value.get("completion_ids").is_some() => generated(&value),
        None => Record::Invalid(format!("no field {field:?}")),
        Some(serde_json::Value::String(s)) if s.trim().is_empty() => Record::Empty,
        Some(serde_json::Value::String(s)) => Record::Text(s),
        Some(serde_json::Value::Null) => Record::Invalid(format!("field {field:?} is null")),
        Some(serde_json::Value::Array(messages)) if messages.is_empty() => Record::Empty,
        Some(messages @ serde_json::Value::Array(_)) => Record::Conversation(messages),
        Some(_) => Record::Invalid(format!("field {field:?} is not a string or a list of messages")),
    }
}

/// A line of `siphon generate`'s output: its prompt's and completion's ids, the prompt's as the
/// user's and the completion's as the assistant's.
fn generated(line: &serde_json::Value) -> Record {
    use crate::chat::Role;
    let ids = |name: &str| -> std::result::Result<Vec<u32>, String> {
        let list = line.get(name).and_then(serde_json::Value::as_array).ok_or(format!("no list {name:?}"))?;
        list.iter()
            .map(|v| v.as_u64().and_then(|t| u32::try_from(t).ok()).ok_or(format!("{name} holds {v}, not a token id")))
            .collect()
    };
    match (ids("prompt_ids"), ids("completion_ids")) {
        (Ok(prompt), Ok(completion)) => {
            let roles = [(Role::User, prompt.len()), (Role::Assistant, completion.len())]
                .into_iter()
                .flat_map(|(role, n)| std::iter::repeat_n(role, n))
                .collect();
            match prompt.len() + completion.len() {
                0 => Record::Empty,
                _ => Record::Tokens { ids: [prompt, completion].concat(), roles },
            }
        }
        (Err(e), _) | (_, Err(e)) => Record::Invalid(e),
    }
}

/// Yields the lines that start in `[start, end)` of a file, fetching blocks on demand. A line
/// that starts before `start` belongs to the previous unit and is skipped; the last line may
/// run past `end` and is read to its end.
struct LineReader {
    store: Arc<dyn ObjectStore>,
    file: CorpusFile,
    buf: Vec<u8>,
    /// File offset of `buf[0]`.
    buf_start: u64,
    /// File offset of the next line.
    pos: u64,
    /// The longest line read ([`crate::CorpusConfig::max_record_bytes`]).
    max: u64,
}

impl LineReader {
    async fn new(store: Arc<dyn ObjectStore>, file: &CorpusFile, start: u64, max: u64) -> Result<LineReader> {
        let mut reader = LineReader {
            store,
            file: file.clone(),
            buf: Vec::new(),
            buf_start: start.saturating_sub(1),
            pos: start,
            max,
        };
        if start > 0 {
            // Does a line start exactly at `start`? Only if the byte before is a newline.
            reader.fill_to(start + 1).await?;
            if reader.buf.first() != Some(&b'\n') {
                reader.pos = start - 1;
                match reader.find_newline().await? {
                    Some(nl) => reader.pos = nl + 1,
                    None => reader.pos = reader.file.size,
                }
            }
        }
        Ok(reader)
    }

    /// Makes `buf` cover the file up to `upto` (or its end).
    async fn fill_to(&mut self, upto: u64) -> Result<()> {
        let have = self.buf_start + self.buf.len() as u64;
        let upto = upto.min(self.file.size);
        if upto <= have {
            return Ok(());
        }
        let want_end = (have + BLOCK).max(upto).min(self.file.size);
        let bytes = self.store.get_range(&self.file.path, have..want_end).await.map_err(|source| Error::Store {
            location: format!("{} (bytes {have}..{want_end})", self.file.display),
            source,
        })?;
        self.buf.extend_from_slice(&bytes);
        Ok(())
    }

    /// Offset of the first newline at or after `pos`, or None at end of file; an error when
    /// there is none within `max` bytes (the line is too long to be a record).
    async fn find_newline(&mut self) -> Result<Option<u64>> {
        let too_large = |reader: &LineReader| Error::RecordTooLarge {
            file: reader.file.display.clone(),
            location: format!("the line at byte {}", reader.pos),
            limit: reader.max,
        };
        let mut from = self.pos;
        loop {
            let have = self.buf_start + self.buf.len() as u64;
            if from > self.pos && from - self.pos > self.max {
                return Err(too_large(self));
            }
            if from < have {
                let rel = (from - self.buf_start) as usize;
                if let Some(i) = self.buf[rel..].iter().position(|&b| b == b'\n') {
                    // Found in what was already read: the line may still be past the limit.
                    let newline = from + i as u64;
                    if newline - self.pos > self.max {
                        return Err(too_large(self));
                    }
                    return Ok(Some(newline));
                }
                from = have;
            }
            if have >= self.file.size {
                if self.file.size - self.pos > self.max {
                    return Err(too_large(self));
                }
                return Ok(None);
            }
            self.fill_to(have + BLOCK.min(self.max.saturating_add(1))).await?;
        }
    }

    async fn next_line(&mut self, end: u64) -> Result<Option<(u64, Vec<u8>)>> {
        if self.pos >= end || self.pos >= self.file.size {
            return Ok(None);
        }
        // Drop consumed bytes so memory stays at about two blocks plus one line; only once a
        // block's worth is consumed, so the copy is amortized rather than per line.
        let consumed = (self.pos - self.buf_start) as usize;
        if consumed as u64 >= BLOCK && consumed <= self.buf.len() {
            self.buf.drain(..consumed);
            self.buf_start = self.pos;
        }
        let line_start = self.pos;
        let line_end = self.find_newline().await?;
        let stop = line_end.unwrap_or(self.file.size);
        self.fill_to(stop).await?;
        let rel = (line_start - self.buf_start) as usize..(stop - self.buf_start) as usize;
        let mut line = self.buf[rel].to_vec();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        self.pos = stop + 1;
        Ok(Some((line_start, line)))
    }
}

#[cfg(test)]
mod tests {
    use crate::{Corpus, CorpusConfig, Error};

    fn check(files: &[(&str, &str)]) -> crate::Result<()> {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        Corpus::open(dir.path().to_str().unwrap(), &CorpusConfig::default())?.check_usable()
    }

    #[test]
    fn a_corpus_with_no_text_is_refused_naming_it_and_why() {
        for files in [&[("a.jsonl", "\n\n  \n")][..], &[("a.txt", " \n\t\n")], &[("a.jsonl", "{\"text\": \"  \"}\n")]] {
            match check(files) {
                Err(err @ Error::NoText { .. }) => {
                    let text = err.to_string();
                    assert!(text.contains("a.") && text.contains("blank"), "{text}");
                }
                other => panic!("{files:?}: {other:?}"),
            }
        }
        let err = check(&[("a.jsonl", "{\"body\": \"x\"}\n\n")]).unwrap_err().to_string();
        assert!(err.contains("none of the 2 records") && err.contains("no field \"text\""), "{err}");
        // Blank records first, text later: usable.
        check(&[("a.jsonl", "\n\n"), ("b.jsonl", "{\"text\": \"a document\"}\n")]).expect("usable");
    }
}
