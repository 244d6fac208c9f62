//! A corpus's per-document columns kept beside the activations (`--keep-columns label,id`): a
//! unit's records' fields read on their own, by the same stable record index the documents'
//! ids hold ([`crate::doc_id`]), so whatever rows a run stores can carry their documents'
//! labels without the token stream carrying them. Parquet columns (integers, floats, booleans,
//! strings, nulls) and jsonl fields (any JSON value; absent is null); a plain text corpus has
//! none.

use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_schema::DataType;
use futures::{StreamExt, TryStreamExt};
use parquet::arrow::ProjectionMask;
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::parquet_file::{StoreReader, load_parquet_meta};
use crate::plan::{Corpus, UnitKind};
use crate::source::FileFormat;

/// One record's kept columns, by name.
pub type Fields = Map<String, Value>;

/// How a kept column is typed: a parquet column's type (`int`, `float`, `bool`, `string`), or
/// `json` for a jsonl field (each value as JSON types it).
pub fn column_kind(data_type: &DataType) -> Option<&'static str> {
    Some(match data_type {
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => "int",
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => "int",
        DataType::Float32 | DataType::Float64 => "float",
        DataType::Boolean => "bool",
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string",
        DataType::Null => "null",
        _ => return None,
    })
}

impl Corpus {
    /// Each kept column's kind ([`column_kind`]) by name, checked against the corpus before a
    /// run: every parquet file's schema holds each column in a kept type; the first jsonl
    /// record holds each field. A plain text corpus, a missing column or one of another type
    /// is an error naming it.
    pub fn check_columns(&self, names: &[String]) -> Result<Vec<(String, &'static str)>> {
        let missing = |file: &str, column: &str, available: String| Error::MissingColumn {
            file: file.to_string(),
            column: column.to_string(),
            available,
        };
        let mut kinds: Vec<(String, &'static str)> = names.iter().map(|n| (n.clone(), "json")).collect();
        // The parquet files' footers fetched concurrently, in the files' order (`buffered`),
        // checked in that order below.
        let parquet: Vec<_> = self.files.iter().filter(|f| f.format == FileFormat::Parquet).cloned().collect();
        let store = &self.store;
        let metas: Vec<Result<_>> = self.block_on(async move {
            let fetch = |file| async move { load_parquet_meta(store, &file).await };
            Ok(futures::stream::iter(parquet).map(fetch).buffered(16).collect().await)
        })?;
        let mut metas = metas.into_iter();
        for file in self.files.iter() {
            match file.format {
                FileFormat::Parquet => {
                    let meta = metas.next().expect("a footer fetched for every parquet file")?;
                    let schema = meta.schema();
                    for (name, kind) in &mut kinds {
                        let Ok(field) = schema.field_with_name(name) else {
                            let available = schema.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>();
                            return Err(missing(&file.display, name, available.join(", ")));
                        };
                        *kind = column_kind(field.data_type()).ok_or_else(|| Error::ColumnType {
                            file: file.display.clone(),
                            column: name.clone(),
                            data_type: format!(
                                "{} (kept columns are integers, floats, booleans or strings)",
                                field.data_type()
                            ),
                        })?;
                    }
                }
                FileFormat::Jsonl => {}
                _ => {
                    return Err(Error::Config(format!(
                        "--keep-columns {}: {} is plain text, whose records have no columns",
                        names.join(","),
                        file.display
                    )));
                }
            }
        }
        if self.files.iter().any(|f| f.format == FileFormat::Jsonl) {
            let first = self.first_lines(1)?;
            if let Some(line) = first.first() {
                let record: Value = serde_json::from_slice(line).unwrap_or(Value::Null);
                if let Some(name) = names.iter().find(|n| record.get(n.as_str()).is_none()) {
                    let available = record.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>().join(", "));
                    return Err(missing("the corpus's first record", name, available.unwrap_or_default()));
                }
            }
        }
        Ok(kinds)
    }

    /// The kept columns of every record of unit `unit`, by its stable index in the unit.
    pub fn unit_fields(&self, unit: u32, names: &[String]) -> Result<Vec<Fields>> {
        let unit = *self.units.get(unit as usize).ok_or_else(|| Error::Config(format!("no unit {unit}")))?;
        let file = self.files[unit.file as usize].clone();
        match unit.kind {
            UnitKind::RowGroup { index, .. } => self.block_on(async {
                let perr =
                    |source| Error::Parquet { file: file.display.clone(), row_group: Some(index as usize), source };
                let meta = load_parquet_meta(&self.store, &file).await?;
                let schema = meta.schema().clone();
                let columns: Vec<usize> =
                    names.iter().map(|n| schema.index_of(n)).collect::<std::result::Result<_, _>>().map_err(|_| {
                        Error::MissingColumn {
                            file: file.display.clone(),
                            column: names.join(","),
                            available: String::new(),
                        }
                    })?;
                let reader = StoreReader::new(self.store.clone(), &file);
                let builder = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, meta);
                let mask = ProjectionMask::roots(builder.parquet_schema(), columns);
                let mut stream =
                    builder.with_row_groups(vec![index as usize]).with_projection(mask).build().map_err(perr)?;
                let mut out = Vec::new();
                while let Some(batch) = stream.try_next().await.map_err(perr)? {
                    let values: Vec<Vec<Value>> = names
                        .iter()
                        .map(|n| {
                            let column = batch.column_by_name(n).expect("projected");
                            json_values(column.as_ref()).map_err(|data_type| Error::ColumnType {
                                file: file.display.clone(),
                                column: n.clone(),
                                data_type,
                            })
                        })
                        .collect::<Result<_>>()?;
                    for row in 0..batch.num_rows() {
                        out.push(names.iter().cloned().zip(values.iter().map(|v| v[row].clone())).collect());
                    }
                }
                Ok(out)
            }),
            UnitKind::Bytes { start, end } => {
                let lines = self.unit_lines(&file, start, end)?;
                Ok(lines
                    .iter()
                    .map(|line| {
                        let record: Value = serde_json::from_slice(line).unwrap_or(Value::Null);
                        names
                            .iter()
                            .map(|n| (n.clone(), record.get(n.as_str()).cloned().unwrap_or(Value::Null)))
                            .collect()
                    })
                    .collect())
            }
            UnitKind::WholeFile => {
                Err(Error::Config(format!("{} is plain text, whose records have no columns", file.display)))
            }
        }
    }
}

/// An arrow column's values as JSON, or its type's name where it is not kept.
fn json_values(column: &dyn Array) -> std::result::Result<Vec<Value>, String> {
    macro_rules! each {
        ($array:expr, $to:expr) => {{
            let a = $array;
            (0..a.len()).map(|i| if a.is_null(i) { Value::Null } else { $to(a.value(i)) }).collect()
        }};
    }
    let number = |v: f64| serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number);
    Ok(match column.data_type() {
        DataType::Int8 => each!(column.as_primitive::<Int8Type>(), |v: i8| Value::from(v)),
        DataType::Int16 => each!(column.as_primitive::<Int16Type>(), |v: i16| Value::from(v)),
        DataType::Int32 => each!(column.as_primitive::<Int32Type>(), |v: i32| Value::from(v)),
        DataType::Int64 => each!(column.as_primitive::<Int64Type>(), |v: i64| Value::from(v)),
        DataType::UInt8 => each!(column.as_primitive::<UInt8Type>(), |v: u8| Value::from(v)),
        DataType::UInt16 => each!(column.as_primitive::<UInt16Type>(), |v: u16| Value::from(v)),
        DataType::UInt32 => each!(column.as_primitive::<UInt32Type>(), |v: u32| Value::from(v)),
        DataType::UInt64 => each!(column.as_primitive::<UInt64Type>(), |v: u64| Value::from(v)),
        DataType::Float32 => each!(column.as_primitive::<Float32Type>(), |v: f32| number(f64::from(v))),
        DataType::Float64 => each!(column.as_primitive::<Float64Type>(), number),
        DataType::Boolean => each!(column.as_boolean(), Value::Bool),
        DataType::Utf8 => each!(column.as_string::<i32>(), |v: &str| Value::from(v)),
        DataType::LargeUtf8 => each!(column.as_string::<i64>(), |v: &str| Value::from(v)),
        DataType::Utf8View => each!(column.as_string_view(), |v: &str| Value::from(v)),
        DataType::Null => vec![Value::Null; column.len()],
        other => return Err(other.to_string()),
    })
}
