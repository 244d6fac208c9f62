//! A record tens of megabytes long costs a worker its text and its token ids, a few bytes per
//! byte of it, not the tokenizer's working memory over the whole record (some 100 to 200 bytes
//! per byte) nor all of its rows at once: measured by this binary's allocator, whose peak of
//! live bytes is the process's (so the whole measurement is one test).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use siphon_data::{Corpus, CorpusConfig, PackMode, PadSide, doc_id};

/// The system allocator, counting live bytes and their peak.
struct Peak;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(size: usize) {
    let live = LIVE.fetch_add(size, Ordering::Relaxed) + size;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

unsafe impl GlobalAlloc for Peak {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let moved = unsafe { System.realloc(ptr, layout, new_size) };
        if !moved.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        moved
    }
}

#[global_allocator]
static ALLOC: Peak = Peak;

const MIB: usize = 1 << 20;

/// `bytes` of words, newline-free.
fn long_text(bytes: usize) -> String {
    let mut text = String::with_capacity(bytes + 16);
    let mut i = 0usize;
    while text.len() < bytes {
        text.push_str(&format!("w{} ", i % 997));
        i += 1;
    }
    text.truncate(bytes);
    text
}

/// Streams a jsonl corpus of a short record, `text` as one record and a short record, checking
/// that every byte of `text` comes out as its token at its place; the peak of live bytes above
/// what was live at the start, and the long record's tokens.
fn stream(dir: &std::path::Path, text: &str, mode: PackMode) -> (usize, u64) {
    let path = dir.join("long.jsonl");
    let line = serde_json::json!({ "text": text }).to_string();
    std::fs::write(&path, format!("{{\"text\": \"before\"}}\n{line}\n{{\"text\": \"after\"}}\n")).unwrap();
    drop(line);
    let mut config = CorpusConfig::default();
    config.max_record_bytes = 64 << 20;
    let corpus = Corpus::open(path.to_str().unwrap(), &config).unwrap();
    let start = LIVE.load(Ordering::Relaxed);
    PEAK.store(start, Ordering::Relaxed);
    let bytes = text.as_bytes();
    let long = doc_id(0, 1);
    let mut tokens = 0u64;
    for batch in corpus.stream(common::tokenizer(), common::stream_config(512, mode, 8)).unwrap() {
        let batch = batch.unwrap();
        for ((&token, &doc), &pos) in batch.tokens.iter().zip(&batch.doc).zip(&batch.doc_pos) {
            // Position 0 is the document's BOS; the fixture's token for a byte is the byte.
            if doc == long && pos > 0 && (pos as usize) <= bytes.len() {
                assert_eq!(token, u32::from(bytes[pos as usize - 1]), "token at {pos}");
                tokens += 1;
            }
        }
    }
    (PEAK.load(Ordering::Relaxed) - start, tokens)
}

#[test]
fn memory_grows_with_a_long_records_text_and_ids_not_its_tokenization() {
    let dir = tempfile::tempdir().unwrap();
    let pack = PackMode::Pack;
    let (small, large) = (MIB, 12 * MIB);
    let text = long_text(small);
    let (small_peak, tokens) = stream(dir.path(), &text, pack);
    assert_eq!(tokens, small as u64, "every byte of the small record is a token, once");
    let text = long_text(large);
    let (large_peak, tokens) = stream(dir.path(), &text, pack);
    assert_eq!(tokens, large as u64, "every byte of the large record is a token, once");
    // The fixture makes a token of every byte: a record's ids are 4 bytes per byte, its text is
    // held as it is read (the line, the JSON string), the vectors grow by doubling. Tokenized
    // whole it took over 100 bytes per byte.
    let per_byte = (large_peak - small_peak) as f64 / (large - small) as f64;
    eprintln!("peak live bytes: {small_peak} for {small}, {large_peak} for {large} ({per_byte:.1} per byte)");
    assert!(per_byte < 16.0, "{per_byte:.1} bytes per byte of record ({small_peak} then {large_peak} bytes)");
    assert!(large_peak < 24 * large, "{large_peak} bytes at the peak");

    // Pad mode keeps one row of a document: the long record is tokenized only that far.
    let (pad_peak, tokens) = stream(dir.path(), &text, PackMode::Pad(PadSide::Right));
    eprintln!("pad mode: {pad_peak} for {large}");
    assert_eq!(tokens, 511, "the row's tokens after BOS");
    assert!(pad_peak < 6 * large, "{pad_peak} bytes at the peak in pad mode");
}
