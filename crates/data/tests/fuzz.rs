//! Every reader of corpus bytes, fed generated mutations of valid inputs ([`siphon_fuzz`]):
//! jsonl records (text and chat `messages`), line and whole-file text, a parquet file (its
//! pages and its footer), chat templates rendering a conversation, and `tokenizer.json`. Each
//! must answer with records (or a value) or an error saying what is wrong: never a panic, an
//! allocation over the bound, or a hang — a line without a newline, a huge record and a
//! NUL-filled file included. Inputs that once broke a reader are kept below as named tests.

mod common;

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::memory::InMemory;
use siphon_data::{ChatTemplate, Corpus, CorpusConfig, Record, TextRecords};
use siphon_fuzz::{Outcome, bytes, cases, check, json, quiet_panics};

#[global_allocator]
static ALLOC: siphon_fuzz::Bounded = siphon_fuzz::Bounded::new(256 << 20);

/// The record limit of the named tests.
const MAX_RECORD: u64 = 64 << 10;
/// The record limit of the generated inputs: small enough that they reach it (the fixtures'
/// longest line is ~180 bytes; four duplicated spans or a long string field pass it).
const TIGHT_RECORD: u64 = 256;

/// [`config`] with the limit the generated inputs reach.
fn tight(json_field: &str, text_records: TextRecords) -> CorpusConfig {
    let mut config = config(json_field, text_records);
    config.max_record_bytes = TIGHT_RECORD;
    config
}

fn config(json_field: &str, text_records: TextRecords) -> CorpusConfig {
    let mut config = CorpusConfig::default();
    config.json_field = json_field.into();
    config.text_records = text_records;
    // Small units: lines cross unit boundaries, as in a large file.
    config.unit_bytes = 96;
    config.max_record_bytes = MAX_RECORD;
    config
}

/// Reads every record of a one-file corpus named `name` holding `bytes`, in memory.
fn read_corpus(name: &str, bytes: &[u8], config: &CorpusConfig) -> Result<Vec<Record>, String> {
    let store = Arc::new(InMemory::new());
    let path = object_store::path::Path::from(format!("c/{name}"));
    futures::executor::block_on(object_store::ObjectStoreExt::put(&*store, &path, bytes.to_vec().into()))
        .map_err(|e| e.to_string())?;
    let store: Arc<dyn ObjectStore> = store;
    let corpus = Corpus::open_store(store, "c/", "memory://", config).map_err(|e| e.to_string())?;
    match corpus.first_records(usize::MAX) {
        Ok(records) => Ok(records),
        // The records are read on a helper thread: its panic comes back as an error.
        Err(e) if e.to_string().contains("panicked") => panic!("{e}"),
        Err(e) => Err(e.to_string()),
    }
}

fn records(name: &str, bytes: &[u8], config: &CorpusConfig) -> Outcome {
    let records = read_corpus(name, bytes, config)?;
    // No record is longer than the limit (the file may be; its lines may not).
    for record in &records {
        if let Record::Text(t) = record
            && t.len() as u64 > config.max_record_bytes
        {
            panic!("a record of {} bytes passed the limit of {}", t.len(), config.max_record_bytes);
        }
    }
    Ok(())
}

fn text_jsonl() -> String {
    (0..8).map(|i| format!("{{\"id\": {i}, \"text\": \"{}\"}}\n", common::doc_text(i).replace('"', ""))).collect()
}

/// A conversation every fixture template renders (Gemma's refuses a system message).
const TURNS: &str = r#"[{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6."}]"#;

const CONVERSATION: &str = r#"{"id": 7, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."}]}"#;

fn chat_jsonl() -> String {
    let other =
        r#"{"id": 8, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}"#;
    format!("{CONVERSATION}\n{other}\n{CONVERSATION}\n")
}

#[test]
fn jsonl_records_read_or_name_what_is_wrong() {
    quiet_panics();
    let text = text_jsonl();
    let line = text.lines().nth(2).unwrap().to_string();
    let text_config = tight("text", TextRecords::File);
    check("jsonl text record (fields)", cases(500), json::mutations(&line), |m| {
        records("data.jsonl", text.replacen(&line, &m.text, 1).as_bytes(), &text_config)
    });
    check("jsonl text (bytes)", cases(500), bytes::mutations(text.as_bytes(), text.len()), |m| {
        records("data.jsonl", m, &text_config)
    });
    let chat = chat_jsonl();
    let chat_config = tight("messages", TextRecords::File);
    check("jsonl messages record (fields)", cases(500), json::mutations(CONVERSATION), |m| {
        records("chat.jsonl", chat.replacen(CONVERSATION, &m.text, 1).as_bytes(), &chat_config)
    });
    check("jsonl messages (bytes)", cases(300), bytes::mutations(chat.as_bytes(), chat.len()), |m| {
        records("chat.jsonl", m, &chat_config)
    });
}

#[test]
fn text_records_read_or_name_what_is_wrong() {
    quiet_panics();
    let text: String = (0..12).map(|i| format!("{}\n", common::doc_text(i))).collect();
    // The lines are at most 119 bytes: a duplicated span of 10 passes the limit.
    let mut lines = tight("text", TextRecords::Line);
    lines.max_record_bytes = 128;
    check("text lines (bytes)", cases(500), bytes::mutations(text.as_bytes(), text.len()), |m| {
        records("data.txt", m, &lines)
    });
    let whole = config("text", TextRecords::File);
    check("text file (bytes)", cases(200), bytes::mutations(text.as_bytes(), text.len()), |m| {
        read_corpus("data.txt", m, &whole).map(|_| ())
    });
}

fn parquet_file() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.parquet");
    let texts: Vec<Option<String>> =
        (0..40).map(|i| if i % 9 == 4 { None } else { Some(common::doc_text(i)) }).collect();
    common::write_parquet(&path, &texts, 16);
    std::fs::read(path).unwrap()
}

#[test]
fn parquet_files_read_or_name_what_is_wrong() {
    quiet_panics();
    let file = parquet_file();
    let config = config("text", TextRecords::File);
    check("parquet (bytes, anywhere)", cases(600), bytes::mutations(&file, file.len()), |m| {
        records("data.parquet", m, &config)
    });
    // The footer (schema, row groups, page offsets) and its length: the last ~1 KB.
    let footer_len = u32::from_le_bytes(file[file.len() - 8..file.len() - 4].try_into().unwrap()) as usize + 8;
    let start = file.len() - footer_len;
    let footer = &file[start..];
    check("parquet footer (bytes)", cases(900), bytes::mutations(footer, footer.len()), |m| {
        let mut mutated = file[..start].to_vec();
        mutated.extend_from_slice(m);
        records("data.parquet", &mutated, &config)
    });
}

fn template_sources() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/chat/templates");
    let mut names: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).collect();
    names.sort();
    names.iter().map(|p| std::fs::read_to_string(p).unwrap()).collect()
}

const SPECIAL: [(&str, &str); 3] = [("bos_token", "<s>"), ("eos_token", "</s>"), ("pad_token", "<pad>")];

/// Compiles a template, renders a conversation with it and tokenizes the result.
fn render(source: &[u8], messages: &serde_json::Value, tokenizer: &siphon_data::Tokenizer) -> Outcome {
    let source = String::from_utf8_lossy(source);
    let template = ChatTemplate::new(&source, &SPECIAL).map_err(|e| e.to_string())?;
    let (ids, roles) = template.encode(tokenizer, messages)?;
    assert_eq!(ids.len(), roles.len());
    Ok(())
}

#[test]
fn chat_templates_render_or_name_what_is_wrong() {
    quiet_panics();
    let tokenizer = common::tokenizer();
    let messages: serde_json::Value = serde_json::from_str::<serde_json::Value>(TURNS).unwrap();
    for source in template_sources() {
        check("chat template (bytes)", cases(250), bytes::mutations(source.as_bytes(), source.len()), |m| {
            render(m, &messages, &tokenizer)
        });
    }
    // The conversation itself mutated, through a real template.
    let source = template_sources().into_iter().find(|s| s.contains("generation")).unwrap();
    check("chat messages (fields)", cases(300), json::mutations(&messages.to_string()), |m| {
        let messages: serde_json::Value = serde_json::from_str(&m.text).unwrap();
        render(source.as_bytes(), &messages, &tokenizer)
    });
}

fn load_tokenizer(text: &[u8]) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, text).unwrap();
    let tokenizer = siphon_data::load_tokenizer(&path).map_err(|e| e.to_string())?;
    tokenizer.encode("Document 1: héllo <s> world", false).map_err(|e| e.to_string())?;
    Ok(())
}

#[test]
fn tokenizer_files_load_or_name_what_is_wrong() {
    quiet_panics();
    let text = std::fs::read_to_string(common::fixture("tokenizer.json")).unwrap();
    check("tokenizer.json (fields)", cases(500), json::mutations(&text), |m| load_tokenizer(m.text.as_bytes()));
    check("tokenizer.json (bytes)", cases(300), bytes::mutations(text.as_bytes(), text.len()), |m| load_tokenizer(m));
}

/// A line over the limit is an error naming the file and the line, read no further than the
/// limit: a 1 MB line without a newline, in one unit or in many.
#[test]
fn a_line_longer_than_the_limit_is_an_error_naming_it() {
    let mut long = b"{\"text\": \"".to_vec();
    long.resize(1 << 20, b'a');
    for unit_bytes in [8 << 20, 4096] {
        let mut config = config("text", TextRecords::File);
        config.unit_bytes = unit_bytes;
        let mut file = b"{\"text\": \"short\"}\n".to_vec();
        file.extend_from_slice(&long);
        let err = read_corpus("long.jsonl", &file, &config).unwrap_err();
        assert!(err.contains("long.jsonl") && err.contains("byte 18") && err.contains("65536 bytes"), "{err}");
    }
    // Under the default limit (16 MiB) the same line is a record.
    let mut default = CorpusConfig::default();
    default.text_records = TextRecords::Line;
    let records = read_corpus("long.txt", &long, &default).unwrap();
    assert_eq!(records.len(), 1);
}

/// A NUL-filled file without a newline: each unit gives up after the limit, not the file's
/// size (before, every unit searched the whole rest of the file for a newline, buffering it).
#[test]
fn a_nul_filled_file_is_refused_quickly() {
    let file = vec![0u8; 8 << 20];
    let mut config = config("text", TextRecords::Line);
    config.unit_bytes = 64 << 10;
    let start = std::time::Instant::now();
    let err = read_corpus("nul.jsonl", &file, &config).unwrap_err();
    assert!(err.contains("nul.jsonl") && err.contains("longer than 65536 bytes"), "{err}");
    assert!(start.elapsed() < std::time::Duration::from_secs(5), "{:?}", start.elapsed());
}

/// A parquet text value over the limit is an error naming the row.
#[test]
fn a_parquet_value_longer_than_the_limit_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.parquet");
    common::write_parquet(&path, &[Some("short".into()), Some("x".repeat(MAX_RECORD as usize + 1))], 16);
    let err =
        read_corpus("big.parquet", &std::fs::read(path).unwrap(), &config("text", TextRecords::File)).unwrap_err();
    assert!(err.contains("big.parquet") && err.contains("row group 0, row 1"), "{err}");
}

#[test]
fn the_unmutated_inputs_are_read() {
    let text_config = config("text", TextRecords::File);
    assert_eq!(read_corpus("data.jsonl", text_jsonl().as_bytes(), &text_config).unwrap().len(), 8);
    let chat = read_corpus("chat.jsonl", chat_jsonl().as_bytes(), &config("messages", TextRecords::File)).unwrap();
    assert!(chat.iter().all(|r| matches!(r, Record::Conversation(_))), "{chat:?}");
    assert_eq!(read_corpus("data.parquet", &parquet_file(), &text_config).unwrap().len(), 40);
    let tokenizer = common::tokenizer();
    let messages = serde_json::from_str::<serde_json::Value>(TURNS).unwrap();
    for source in template_sources() {
        render(source.as_bytes(), &messages, &tokenizer).unwrap();
    }
    load_tokenizer(&std::fs::read(common::fixture("tokenizer.json")).unwrap()).unwrap();
}

// Inputs the generated cases found, kept as they broke a reader.

/// A template holding `{%}`: the `{% generation %}` rewrite took `%}` inside `{%` as its end
/// and sliced backwards (a panic); now the template's own compile error.
#[test]
fn a_template_with_an_unclosed_tag_is_a_compile_error() {
    let err = ChatTemplate::new("{% for m in messages %}{{ m.content }}{%}{% endfor %}", &SPECIAL).unwrap_err();
    assert!(err.to_string().contains("does not compile"), "{err}");
}

/// A tokenizer.json with a decoder that does not parse: the tokenizers library panics
/// (`expect("Helper")`); `load_tokenizer` returns that as an error naming the file.
#[test]
fn a_malformed_decoder_is_an_error_not_a_panic() {
    quiet_panics();
    // The input the generated cases found: a NUL written inside the decoder's JSON.
    let mut text = std::fs::read(common::fixture("tokenizer.json")).unwrap();
    text[874] = 0;
    let err = load_tokenizer(&text).unwrap_err();
    assert!(err.contains("tokenizer.json") && err.contains("malformed"), "{err}");
}

/// A parquet footer whose column chunk starts at a negative offset: the parquet reader
/// asserts (a panic in the reading thread); now an error naming the row group and column.
#[test]
fn a_column_chunk_outside_the_file_is_an_error() {
    let file = parquet_file();
    let found = (0..file.len()).find_map(|at| {
        let mut mutated = file.clone();
        mutated[at] = 0x7f;
        match read_corpus("data.parquet", &mutated, &config("text", TextRecords::File)) {
            Err(e) if e.contains("outside the file") => Some(e),
            _ => None,
        }
    });
    let err = found.expect("some byte of the footer moves a column chunk outside the file");
    assert!(err.contains("data.parquet") && err.contains("row group"), "{err}");
}

/// A conversation of 100,000 messages: each token's role was looked up by a scan over every
/// message's span (10^11 steps, a hang); now by bisection.
#[test]
fn a_long_conversation_renders_in_linear_time() {
    let tokenizer = common::tokenizer();
    let turns: Vec<serde_json::Value> = (0..100_000)
        .map(|i| serde_json::json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("m{i}")}))
        .collect();
    let source = template_sources().into_iter().find(|s| s.contains("generation")).unwrap();
    let start = std::time::Instant::now();
    let template = ChatTemplate::new(&source, &SPECIAL).unwrap();
    let (ids, roles) = template.encode(&tokenizer, &serde_json::Value::Array(turns)).unwrap();
    assert_eq!(ids.len(), roles.len());
    assert!(roles.contains(&siphon_data::Role::User) && roles.contains(&siphon_data::Role::Assistant));
    assert!(start.elapsed() < std::time::Duration::from_secs(10), "{:?}", start.elapsed());
}
