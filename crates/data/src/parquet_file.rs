//! One parquet file on the object store: parquet's async reader over it (for the plan's
//! footers and the unit reader's row groups), and its footer loaded and checked.

use std::sync::Arc;

use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::async_reader::AsyncFileReader;

use crate::error::{Error, Result};
use crate::source::CorpusFile;

pub(crate) async fn load_parquet_meta(store: &Arc<dyn ObjectStore>, file: &CorpusFile) -> Result<ArrowReaderMetadata> {
    let mut reader = StoreReader::new(store.clone(), file);
    let meta = ArrowReaderMetadata::load_async(&mut reader, ArrowReaderOptions::new())
        .await
        .map_err(|source| Error::Parquet { file: file.display.clone(), row_group: None, source })?;
    // Column chunks must lie within the file: the parquet reader asserts it (a panic) when
    // it fetches them.
    for (g, row_group) in meta.metadata().row_groups().iter().enumerate() {
        for column in row_group.columns() {
            let start = column.dictionary_page_offset().unwrap_or(column.data_page_offset());
            let len = column.compressed_size();
            let end = u64::try_from(start).ok().zip(u64::try_from(len).ok()).and_then(|(s, l)| s.checked_add(l));
            if end.is_none_or(|end| end > file.size) {
                return Err(Error::Unusable {
                    file: file.display.clone(),
                    reason: format!(
                        "the footer puts row group {g}'s column {} at bytes {start}..{start}+{len}, outside the \
                         file's {} bytes",
                        column.column_path(),
                        file.size
                    ),
                });
            }
        }
    }
    Ok(meta)
}

/// Index of the text column among the top-level columns, checked to be a string column.
pub(crate) fn text_column_index(meta: &ArrowReaderMetadata, file: &CorpusFile, column: &str) -> Result<usize> {
    let schema = meta.schema();
    let Ok(index) = schema.index_of(column) else {
        let available = schema.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", ");
        return Err(Error::MissingColumn { file: file.display.clone(), column: column.to_string(), available });
    };
    use arrow_schema::DataType;
    let messages = |item: &DataType| matches!(item, DataType::Struct(_));
    match schema.field(index).data_type() {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Ok(index),
        // Conversations: a list of {role, content, ...} messages.
        DataType::List(item) | DataType::LargeList(item) if messages(item.data_type()) => Ok(index),
        other => Err(Error::ColumnType {
            file: file.display.clone(),
            column: column.to_string(),
            data_type: other.to_string(),
        }),
    }
}

/// Parquet's async reader over our object store. (parquet's own `ParquetObjectReader` is
/// deprecated and built against a different object_store release.)
pub(crate) struct StoreReader {
    store: Arc<dyn ObjectStore>,
    path: object_store::path::Path,
    size: u64,
}

impl StoreReader {
    pub fn new(store: Arc<dyn ObjectStore>, file: &CorpusFile) -> StoreReader {
        StoreReader { store, path: file.path.clone(), size: file.size }
    }
}

fn external(e: object_store::Error) -> parquet::errors::ParquetError {
    parquet::errors::ParquetError::External(Box::new(e))
}

impl AsyncFileReader for StoreReader {
    fn get_bytes(
        &mut self,
        range: std::ops::Range<u64>,
    ) -> futures::future::BoxFuture<'_, parquet::errors::Result<bytes::Bytes>> {
        Box::pin(async move { self.store.get_range(&self.path, range).await.map_err(external) })
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<std::ops::Range<u64>>,
    ) -> futures::future::BoxFuture<'_, parquet::errors::Result<Vec<bytes::Bytes>>> {
        // One call, so stores that coalesce nearby ranges (all of object_store's) can.
        Box::pin(async move { self.store.get_ranges(&self.path, &ranges).await.map_err(external) })
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a parquet::arrow::arrow_reader::ArrowReaderOptions>,
    ) -> futures::future::BoxFuture<'a, parquet::errors::Result<Arc<parquet::file::metadata::ParquetMetaData>>> {
        Box::pin(async move {
            let size = self.size;
            // 64 KiB usually holds the whole footer: one request per file.
            let meta = parquet::file::metadata::ParquetMetaDataReader::new()
                .with_prefetch_hint(Some(64 << 10))
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(meta))
        })
    }
}
