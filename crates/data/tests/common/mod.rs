//! Helpers shared by the data-path tests: the byte-level fixture tokenizer, corpus writers
//! and stream collectors.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use siphon_data::{Batch, Corpus, PackConfig, PackMode, SpecialTokens, StreamConfig, Tokenizer};

pub const BOS: u32 = 256;
pub const EOS: u32 = 257;
pub const PAD: u32 = 258;
pub const SEP: u32 = 259;

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/data").join(name)
}

/// One token per UTF-8 byte (id = byte value) plus `<s>`, `</s>`, `<pad>`, `<|sep|>`.
pub fn tokenizer() -> Arc<Tokenizer> {
    Arc::new(siphon_data::load_tokenizer(&fixture("tokenizer.json")).expect("fixture tokenizer loads"))
}

pub fn special() -> SpecialTokens {
    SpecialTokens { bos: Some(BOS), eos: Some(EOS), pad: PAD, exclude: vec![SEP] }
}

/// A deterministic document: `i`-dependent words, 0..~90 bytes; every 13th is blank.
pub fn doc_text(i: usize) -> String {
    if i % 13 == 5 {
        return "   ".into();
    }
    let words = (i * 7919) % 17 + 1;
    (0..words).map(|w| format!("d{i}w{}", (i + w * 31) % 97)).collect::<Vec<_>>().join(" ")
}

/// Writes a parquet file with `id` and `text` columns (`None` = null text).
pub fn write_parquet(path: &Path, texts: &[Option<String>], rows_per_group: usize) {
    let schema =
        Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, false), Field::new("text", DataType::Utf8, true)]));
    let file = std::fs::File::create(path).unwrap();
    let props = WriterProperties::builder().set_max_row_group_row_count(Some(rows_per_group)).build();
    let mut writer = ArrowWriter::try_new(file, schema.clone(), Some(props)).unwrap();
    for (g, chunk) in texts.chunks(rows_per_group).enumerate() {
        let ids: Vec<String> = (0..chunk.len()).map(|i| format!("{}-{g}-{i}", path.display())).collect();
        let columns: Vec<ArrayRef> =
            vec![Arc::new(StringArray::from_iter_values(ids)), Arc::new(StringArray::from(chunk.to_vec()))];
        writer.write(&RecordBatch::try_new(schema.clone(), columns).unwrap()).unwrap();
        writer.flush().unwrap();
    }
    writer.close().unwrap();
}

/// One row of a stream, flattened for comparison.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub id: siphon_data::SeqId,
    pub tokens: Vec<u32>,
    pub attention: Vec<u8>,
    pub exclude: Vec<u8>,
    pub doc: Vec<i64>,
    pub doc_pos: Vec<i32>,
}

pub fn rows_of(batch: &Batch) -> Vec<Row> {
    let n = batch.seq_len;
    (0..batch.len())
        .map(|i| Row {
            id: batch.ids[i],
            tokens: batch.tokens[i * n..(i + 1) * n].to_vec(),
            attention: batch.attention_mask[i * n..(i + 1) * n].to_vec(),
            exclude: batch.exclude[i * n..(i + 1) * n].to_vec(),
            doc: batch.doc[i * n..(i + 1) * n].to_vec(),
            doc_pos: batch.doc_pos[i * n..(i + 1) * n].to_vec(),
        })
        .collect()
}

pub fn batches(corpus: &Corpus, config: StreamConfig) -> Vec<Batch> {
    corpus.stream(tokenizer(), config).expect("stream starts").collect::<Result<Vec<_>, _>>().expect("stream reads")
}

pub fn rows(corpus: &Corpus, config: StreamConfig) -> Vec<Row> {
    batches(corpus, config).iter().flat_map(rows_of).collect()
}

pub fn stream_config(seq_len: usize, mode: PackMode, batch_size: usize) -> StreamConfig {
    let mut config = StreamConfig::new(PackConfig::new(seq_len, mode, special()), batch_size);
    config.threads = 2;
    config
}

/// Texts of the documents in pad-mode rows (BOS + bytes), in stream order.
pub fn doc_texts(rows: &[Row]) -> Vec<String> {
    rows.iter()
        .map(|r| {
            let bytes: Vec<u8> = r
                .tokens
                .iter()
                .zip(&r.attention)
                .filter(|&(&t, &a)| a == 1 && t < 256)
                .map(|(&t, _)| t as u8)
                .collect();
            String::from_utf8(bytes).unwrap()
        })
        .collect()
}
