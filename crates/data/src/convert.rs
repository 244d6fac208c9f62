//! Turning a directory of plain-text works into a small parquet dataset in the Hugging Face
//! datasets layout (columns `id` and `text`, several files, several row groups). Used to
//! build the Shakespeare demo corpus without Python.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

use crate::error::{Error, Result};

/// Options of [`text_dir_to_parquet`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ConvertOptions {
    /// Paragraphs (blank-line separated) are joined into rows of at most this many bytes
    /// (a longer paragraph is its own row).
    pub max_row_bytes: usize,
    /// Rows per parquet row group.
    pub rows_per_group: usize,
    /// Number of output files.
    pub files: usize,
    /// File names to leave out (e.g. `metadata.txt`).
    pub exclude: Vec<String>,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions { max_row_bytes: 2000, rows_per_group: 256, files: 4, exclude: Vec::new() }
    }
}

/// What was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvertReport {
    /// Input text files read.
    pub works: usize,
    /// Rows written.
    pub rows: usize,
    /// Parquet files written, in order.
    pub outputs: Vec<PathBuf>,
}

/// Reads every `*.txt` under `from` (sorted, recursively), splits it into paragraph chunks
/// and writes `train-0000i-of-0000n.parquet` files into `out`. Each file is written under a
/// temporary name and renamed, so an interrupted run leaves no half-written parquet file.
pub fn text_dir_to_parquet(from: &Path, out: &Path, options: &ConvertOptions) -> Result<ConvertReport> {
    if options.files == 0 || options.rows_per_group == 0 || options.max_row_bytes == 0 {
        return Err(Error::Config("files, rows_per_group and max_row_bytes must be positive".into()));
    }
    let mut inputs = Vec::new();
    collect_txt(from, &mut inputs)?;
    inputs.retain(|p| !options.exclude.iter().any(|x| p.file_name().is_some_and(|n| n == x.as_str())));
    inputs.sort();
    if inputs.is_empty() {
        return Err(Error::NoFiles { spec: from.display().to_string(), looked_for: "*.txt".into() });
    }
    let mut ids = Vec::new();
    let mut texts = Vec::new();
    for path in &inputs {
        let raw = std::fs::read(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
        // Old Gutenberg texts are mostly ASCII with the odd Latin-1 byte.
        let text = String::from_utf8(raw).unwrap_or_else(|e| e.into_bytes().iter().map(|&b| b as char).collect());
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        for (i, chunk) in paragraph_chunks(&text, options.max_row_bytes).into_iter().enumerate() {
            ids.push(format!("{stem}/{i:05}"));
            texts.push(chunk);
        }
    }
    std::fs::create_dir_all(out).map_err(|source| Error::Io { path: out.display().to_string(), source })?;
    let schema =
        Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, false), Field::new("text", DataType::Utf8, false)]));
    let per_file = ids.len().div_ceil(options.files);
    let mut outputs = Vec::new();
    for f in 0..options.files {
        let lo = (f * per_file).min(ids.len());
        let hi = ((f + 1) * per_file).min(ids.len());
        let name = format!("train-{f:05}-of-{:05}.parquet", options.files);
        let final_path = out.join(&name);
        let tmp_path = out.join(format!(".{name}.tmp"));
        let io = |source| Error::Io { path: tmp_path.display().to_string(), source };
        let perr = |source| Error::Parquet { file: tmp_path.display().to_string(), row_group: None, source };
        let file = std::fs::File::create(&tmp_path).map_err(io)?;
        let props = WriterProperties::builder().set_max_row_group_row_count(Some(options.rows_per_group)).build();
        let mut writer = ArrowWriter::try_new(file, schema.clone(), Some(props)).map_err(perr)?;
        for start in (lo..hi).step_by(options.rows_per_group) {
            let end = (start + options.rows_per_group).min(hi);
            let columns: Vec<ArrayRef> = vec![
                Arc::new(StringArray::from_iter_values(&ids[start..end])),
                Arc::new(StringArray::from_iter_values(&texts[start..end])),
            ];
            let batch = RecordBatch::try_new(schema.clone(), columns).map_err(|e| Error::Config(e.to_string()))?;
            writer.write(&batch).map_err(perr)?;
            writer.flush().map_err(perr)?;
        }
        writer.close().map_err(perr)?;
        std::fs::rename(&tmp_path, &final_path).map_err(io)?;
        outputs.push(final_path);
    }
    Ok(ConvertReport { works: inputs.len(), rows: ids.len(), outputs })
}

fn collect_txt(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Io { path: dir.display().to_string(), source })?;
    for entry in entries {
        let entry = entry.map_err(|source| Error::Io { path: dir.display().to_string(), source })?;
        let path = entry.path();
        if path.is_dir() {
            collect_txt(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "txt") {
            out.push(path);
        }
    }
    Ok(())
}

/// Splits on blank lines, trims, and greedily joins paragraphs up to `max_bytes`.
fn paragraph_chunks(text: &str, max_bytes: usize) -> Vec<String> {
    let text = text.replace("\r\n", "\n");
    let mut chunks = Vec::new();
    let mut cur = String::new();
    for para in text.split("\n\n").map(str::trim).filter(|p| !p.is_empty()) {
        if !cur.is_empty() && cur.len() + 2 + para.len() > max_bytes {
            chunks.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push_str("\n\n");
        }
        cur.push_str(para);
    }
    if !cur.is_empty() {
        chunks.push(cur);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paragraphs_are_grouped_without_loss() {
        let text = "a b\nc\n\n\n  d  \n\ne f g\n\nh";
        let chunks = paragraph_chunks(text, 8);
        assert_eq!(chunks, vec!["a b\nc\n\nd", "e f g\n\nh"]);
        assert_eq!(paragraph_chunks(text, 1).len(), 4);
    }
}
