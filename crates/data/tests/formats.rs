//! Readers: parquet row groups, jsonl, text directories, URLs and globs, in-memory stores,
//! skipped-record counting and the errors for unreadable input.

mod common;

use std::sync::Arc;

use common::*;
use object_store::ObjectStoreExt;
use siphon_data::{Corpus, CorpusConfig, Error, InvalidRecords, PackMode, PadSide, TextRecords, UnitKind};

fn pad_right() -> siphon_data::StreamConfig {
    stream_config(512, PackMode::Pad(PadSide::Right), 7)
}

#[test]
fn parquet_with_several_row_groups_reads_every_row_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let texts: Vec<Option<String>> = (0..50).map(|i| if i == 7 { None } else { Some(doc_text(i)) }).collect();
    write_parquet(&dir.path().join("a.parquet"), &texts[..33], 8);
    write_parquet(&dir.path().join("b.parquet"), &texts[33..], 5);
    let corpus = Corpus::open(dir.path().to_str().unwrap(), &CorpusConfig::default()).unwrap();
    let groups: Vec<(u32, u64)> = corpus
        .units()
        .iter()
        .map(|u| match u.kind {
            UnitKind::RowGroup { index, rows } => (index, rows),
            other => panic!("unexpected unit {other:?}"),
        })
        .collect();
    assert_eq!(groups, vec![(0, 8), (1, 8), (2, 8), (3, 8), (4, 1), (0, 5), (1, 5), (2, 5), (3, 2)]);

    let mut stream = corpus.stream(tokenizer(), pad_right()).unwrap();
    let mut got = Vec::new();
    for batch in stream.by_ref() {
        got.extend(doc_texts(&rows_of(&batch.unwrap())));
    }
    let expected: Vec<String> = texts.iter().flatten().filter(|t| !t.trim().is_empty()).cloned().collect();
    assert_eq!(got, expected);
    let stats = stream.stats();
    assert_eq!(stats.records, 50);
    assert_eq!(stats.invalid, 1, "the null row");
    assert_eq!(stats.empty, texts.iter().flatten().filter(|t| t.trim().is_empty()).count() as u64);
    assert_eq!(stats.documents, expected.len() as u64);
    assert_eq!(stats.units, 9);
}

#[test]
fn jsonl_lines_are_read_once_whatever_the_unit_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = Vec::new();
    let mut expected = Vec::new();
    for i in 0..60 {
        match i % 10 {
            3 => lines.push("{not json".to_string()),
            4 => lines.push("{\"other\": \"x\"}".to_string()),
            5 => lines.push("{\"content\": 12}".to_string()),
            6 => lines.push(String::new()),
            8 => lines.push("{\"content\": \"  \"}".to_string()),
            _ => {
                let text = doc_text(i);
                lines.push(format!("{{\"id\": {i}, \"content\": {text:?}}}"));
                if !text.trim().is_empty() {
                    expected.push(text);
                }
            }
        }
    }
    // CRLF endings and no final newline must not matter either.
    std::fs::write(dir.path().join("x.jsonl"), lines.join("\r\n")).unwrap();
    let size = std::fs::metadata(dir.path().join("x.jsonl")).unwrap().len();
    for unit_bytes in [1, 2, 3, 5, 17, 64, 255, size - 1, size, 1 << 20] {
        let mut config = CorpusConfig::default();
        config.json_field = "content".into();
        config.unit_bytes = unit_bytes;
        let corpus = Corpus::open(dir.path().join("x.jsonl").to_str().unwrap(), &config).unwrap();
        assert_eq!(corpus.units().len() as u64, size.div_ceil(unit_bytes));
        let mut stream = corpus.stream(tokenizer(), pad_right()).unwrap();
        let mut got = Vec::new();
        for batch in stream.by_ref() {
            got.extend(doc_texts(&rows_of(&batch.unwrap())));
        }
        assert_eq!(got, expected, "unit_bytes {unit_bytes}");
        assert_eq!(stream.stats().invalid, 18, "bad JSON, missing field, non-string field");
        assert_eq!(stream.stats().records, 60);
    }
}

#[test]
fn strict_mode_names_the_file_and_offset_of_a_bad_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    std::fs::write(&path, "{\"text\": \"fine\"}\n{oops\n").unwrap();
    let mut config = CorpusConfig::default();
    config.invalid = InvalidRecords::Error;
    let corpus = Corpus::open(path.to_str().unwrap(), &config).unwrap();
    let results: Vec<_> = corpus.stream(tokenizer(), pad_right()).unwrap().collect();
    let err = results.into_iter().find_map(Result::err).expect("strict mode fails");
    let msg = err.to_string();
    assert!(matches!(err, Error::InvalidRecord { .. }), "{msg}");
    assert!(msg.contains("bad.jsonl") && msg.contains("byte 17") && msg.contains("not valid JSON"), "{msg}");
}

/// A jsonl whose field holds lists (conversations read as text): no record is usable, and
/// the stream fails with the first reason instead of ending empty; one usable record is enough
/// to read the rest skipping the others.
#[test]
fn a_corpus_of_nothing_usable_fails_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chats.jsonl");
    let chat = "{\"text\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n";
    std::fs::write(&path, chat.repeat(3)).unwrap();
    let corpus = Corpus::open(path.to_str().unwrap(), &CorpusConfig::default()).unwrap();
    let results: Vec<_> = corpus.stream(tokenizer(), pad_right()).unwrap().collect();
    let err = results.into_iter().find_map(Result::err).expect("nothing usable fails");
    assert!(matches!(err, Error::NothingUsable { records: 3, invalid: 3, .. }), "{err}");
    assert!(err.to_string().contains("--json-field"), "{err}");
    std::fs::write(&path, format!("{chat}{{\"text\": \"fine\"}}\n")).unwrap();
    let corpus = Corpus::open(path.to_str().unwrap(), &CorpusConfig::default()).unwrap();
    assert_eq!(doc_texts(&rows(&corpus, pad_right())), ["fine"]);
}

/// Conversations as parquet holds them (a list of {role, content} structs, as in
/// lmsys-chat-1m) read like the same conversations in a jsonl: the same tokens and roles
/// through a chat template; a message field that is not text is refused, not dropped.
#[test]
fn parquet_conversations_read_like_jsonl_ones() {
    use arrow_array::{ArrayRef, Int32Array, ListArray, RecordBatch, StringArray, StructArray};
    use arrow_schema::{DataType, Field, Fields, Schema};
    let dir = tempfile::tempdir().unwrap();
    let chats: Vec<Vec<(&str, String)>> = (0..9)
        .map(|i| {
            let mut turns = vec![("user", doc_text(i + 1)), ("assistant", format!("answer {i}"))];
            if i % 3 == 0 {
                turns.insert(0, ("system", "Be brief.".to_string()));
            }
            turns
        })
        .collect();
    let jsonl: Vec<String> = chats
        .iter()
        .map(|c| {
            let messages: Vec<_> = c.iter().map(|(r, t)| serde_json::json!({"role": r, "content": t})).collect();
            serde_json::json!({ "messages": messages }).to_string()
        })
        .collect();
    std::fs::write(dir.path().join("chats.jsonl"), jsonl.join("\n")).unwrap();
    let fields =
        Fields::from(vec![Field::new("role", DataType::Utf8, false), Field::new("content", DataType::Utf8, true)]);
    let list = |chats: &[Vec<(&str, String)>], extra: Option<ArrayRef>| {
        let roles: Vec<&str> = chats.iter().flatten().map(|(r, _)| *r).collect();
        let texts: Vec<&str> = chats.iter().flatten().map(|(_, t)| t.as_str()).collect();
        let mut columns: Vec<ArrayRef> = vec![Arc::new(StringArray::from(roles)), Arc::new(StringArray::from(texts))];
        let mut fields = fields.clone();
        if let Some(extra) = extra {
            columns.push(extra);
            fields =
                Fields::from([fields.to_vec(), vec![Arc::new(Field::new("turn", DataType::Int32, false))]].concat());
        }
        let lengths = chats.iter().map(Vec::len);
        let structs = StructArray::new(fields.clone(), columns, None);
        let item = Arc::new(Field::new("item", DataType::Struct(fields), true));
        ListArray::new(item, arrow_buffer::OffsetBuffer::from_lengths(lengths), Arc::new(structs), None)
    };
    let write = |name: &str, array: ListArray| {
        let schema =
            Arc::new(Schema::new(vec![Field::new("messages", arrow_array::Array::data_type(&array).clone(), true)]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(array)]).unwrap();
        let file = std::fs::File::create(dir.path().join(name)).unwrap();
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, schema, None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    };
    write("chats.parquet", list(&chats, None));
    let template = Arc::new(
        siphon_data::ChatTemplate::new(
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}",
            &[],
        )
        .unwrap(),
    );
    let read = |name: &str, field: &str| {
        let mut config = CorpusConfig::default();
        (config.json_field, config.text_column) = (field.to_string(), field.to_string());
        let corpus = Corpus::open(dir.path().join(name).to_str().unwrap(), &config).unwrap();
        let mut stream = pad_right();
        stream.chat = Some(template.clone());
        batches(&corpus, stream)
            .iter()
            .flat_map(|b| rows_of(b).into_iter().zip(b.role.chunks(b.seq_len).map(<[u8]>::to_vec)))
            .map(|(row, roles)| (row.tokens, roles))
            .collect::<Vec<_>>()
    };
    let from_jsonl = read("chats.jsonl", "messages");
    assert_eq!(from_jsonl.len(), 9);
    assert!(from_jsonl[0].1.contains(&(siphon_data::Role::System as u8)));
    assert_eq!(read("chats.parquet", "messages"), from_jsonl);

    let turns: ArrayRef = Arc::new(Int32Array::from_iter_values(0..chats.iter().map(Vec::len).sum::<usize>() as i32));
    std::fs::remove_file(dir.path().join("chats.parquet")).unwrap();
    write("chats.parquet", list(&chats, Some(turns)));
    let corpus = Corpus::open(dir.path().join("chats.parquet").to_str().unwrap(), &{
        let mut c = CorpusConfig::default();
        c.text_column = "messages".into();
        c
    })
    .unwrap();
    let mut stream = pad_right();
    stream.chat = Some(template);
    let err = corpus.stream(tokenizer(), stream).unwrap().find_map(Result::err).expect("nothing usable");
    assert!(err.to_string().contains("message field \"turn\" is Int32"), "{err}");
}

#[test]
fn text_directories_one_document_per_file_or_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("texts");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("b.txt"), "second file\nline two\n").unwrap();
    std::fs::write(root.join("a.txt"), "first file").unwrap();
    std::fs::write(root.join("sub/c.text"), "\nthird\n\n").unwrap();
    std::fs::write(root.join("README.txt"), "dataset card, not data").unwrap();
    std::fs::write(root.join("empty.txt"), "  \n").unwrap();
    std::fs::write(root.join(".hidden.txt"), "hidden").unwrap();
    std::fs::write(root.join("notes.csv"), "not a corpus file").unwrap();

    let corpus = Corpus::open(root.to_str().unwrap(), &CorpusConfig::default()).unwrap();
    let names: Vec<String> = corpus.files().iter().map(|f| f.display.rsplit('/').next().unwrap().to_string()).collect();
    assert_eq!(names, ["a.txt", "b.txt", "empty.txt", "c.text"]);
    let mut stream = corpus.stream(tokenizer(), pad_right()).unwrap();
    let got: Vec<String> = stream.by_ref().flat_map(|b| doc_texts(&rows_of(&b.unwrap()))).collect();
    assert_eq!(got, ["first file", "second file\nline two\n", "\nthird\n\n"]);
    assert_eq!(stream.stats().empty, 1);

    let mut config = CorpusConfig::default();
    config.text_records = TextRecords::Line;
    config.unit_bytes = 4;
    let corpus = Corpus::open(root.to_str().unwrap(), &config).unwrap();
    let mut stream = corpus.stream(tokenizer(), pad_right()).unwrap();
    let got: Vec<String> = stream.by_ref().flat_map(|b| doc_texts(&rows_of(&b.unwrap()))).collect();
    assert_eq!(got, ["first file", "second file", "line two", "third"]);
    assert_eq!(stream.stats().empty, 3, "blank lines of c.text and empty.txt");
}

#[test]
fn file_urls_and_globs_resolve_like_local_paths() {
    let dir = tempfile::tempdir().unwrap();
    for (name, texts) in [("x-0.parquet", 0..10), ("x-1.parquet", 10..25), ("y-0.parquet", 25..30)] {
        let texts: Vec<Option<String>> = texts.map(|i| Some(doc_text(i))).collect();
        write_parquet(&dir.path().join(name), &texts, 4);
    }
    let base = dir.path().canonicalize().unwrap();
    let local = Corpus::open(&format!("{}/x-*.parquet", base.display()), &CorpusConfig::default()).unwrap();
    let url = Corpus::open(&format!("file://{}/x-*.parquet", base.display()), &CorpusConfig::default()).unwrap();
    assert_eq!(local.files().len(), 2);
    assert_eq!(local.files(), url.files());
    assert_eq!(local.fingerprint(), url.fingerprint());
    let a = rows(&local, pad_right());
    let b = rows(&url, pad_right());
    assert_eq!(a, b);
    let expected: Vec<String> = (0..25).map(doc_text).filter(|t| !t.trim().is_empty()).collect();
    assert_eq!(doc_texts(&a), expected);
    let one = Corpus::open(&format!("file://{}/y-0.parquet", base.display()), &CorpusConfig::default()).unwrap();
    assert_eq!(one.files().len(), 1);
    let all = Corpus::open(&format!("file://{}/", base.display()), &CorpusConfig::default()).unwrap();
    assert_eq!(all.files().len(), 3);
}

#[test]
fn an_in_memory_store_reads_like_a_disk() {
    let dir = tempfile::tempdir().unwrap();
    let texts: Vec<Option<String>> = (0..20).map(|i| Some(doc_text(i))).collect();
    write_parquet(&dir.path().join("p.parquet"), &texts, 6);
    std::fs::write(dir.path().join("q.jsonl"), "{\"text\": \"from jsonl\"}\n").unwrap();
    let store = Arc::new(object_store::memory::InMemory::new());
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    for name in ["p.parquet", "q.jsonl"] {
        let bytes = std::fs::read(dir.path().join(name)).unwrap();
        let path = object_store::path::Path::from(format!("corpus/{name}"));
        rt.block_on(store.put(&path, bytes.into())).unwrap();
    }
    let mem = Corpus::open_store(store, "corpus", "memory:///", &CorpusConfig::default()).unwrap();
    let disk = Corpus::open(dir.path().to_str().unwrap(), &CorpusConfig::default()).unwrap();
    assert_eq!(mem.units(), disk.units());
    assert_eq!(doc_texts(&rows(&mem, pad_right())), doc_texts(&rows(&disk, pad_right())));
}

#[test]
fn unreadable_input_is_a_clear_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    write_parquet(&dir.path().join("ok.parquet"), &[Some("a".into())], 1);
    let mut config = CorpusConfig::default();
    config.text_column = "body".into();
    let err = Corpus::open(dir.path().to_str().unwrap(), &config).unwrap_err().to_string();
    assert!(err.contains("ok.parquet") && err.contains("no column \"body\"") && err.contains("id, text"), "{err}");

    config.text_column = "id".into();
    assert!(Corpus::open(dir.path().to_str().unwrap(), &config).is_ok(), "any string column may be the text");

    std::fs::write(dir.path().join("broken.parquet"), b"PAR1 this is not parquet").unwrap();
    let err = Corpus::open(dir.path().to_str().unwrap(), &CorpusConfig::default()).unwrap_err().to_string();
    assert!(err.contains("broken.parquet"), "{err}");

    let err =
        Corpus::open(dir.path().join("missing").to_str().unwrap(), &CorpusConfig::default()).unwrap_err().to_string();
    assert!(err.contains("missing"), "{err}");

    let empty = tempfile::tempdir().unwrap();
    let err = Corpus::open(empty.path().to_str().unwrap(), &CorpusConfig::default()).unwrap_err();
    assert!(matches!(err, Error::NoFiles { .. }), "{err}");
}

#[test]
fn padding_sides_and_masks() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("d.jsonl"), "{\"text\": \"ab<|sep|>c\"}\n{\"text\": \"0123456789abcdef\"}\n")
        .unwrap();
    let corpus = Corpus::open(dir.path().to_str().unwrap(), &CorpusConfig::default()).unwrap();
    let left = rows(&corpus, stream_config(8, PackMode::Pad(PadSide::Left), 4));
    let right = rows(&corpus, stream_config(8, PackMode::Pad(PadSide::Right), 4));
    let c = u32::from(b'c');
    let (a, b) = (u32::from(b'a'), u32::from(b'b'));
    assert_eq!(left[0].tokens, vec![PAD, PAD, PAD, BOS, a, b, SEP, c]);
    assert_eq!(left[0].attention, vec![0, 0, 0, 1, 1, 1, 1, 1]);
    assert_eq!(left[0].exclude, vec![1, 1, 1, 1, 0, 0, 1, 0]);
    assert_eq!(left[0].doc_pos, vec![-1, -1, -1, 0, 1, 2, 3, 4]);
    assert_eq!(right[0].tokens, vec![BOS, a, b, SEP, c, PAD, PAD, PAD]);
    assert_eq!(right[0].attention, vec![1, 1, 1, 1, 1, 0, 0, 0]);
    assert_eq!(right[0].exclude, vec![1, 0, 0, 1, 0, 1, 1, 1]);
    // The long document is truncated, not wrapped; both sides agree when nothing is padded.
    assert_eq!(left[1], right[1]);
    assert_eq!(left[1].tokens[1..], b"0123456"[..].iter().map(|&x| u32::from(x)).collect::<Vec<_>>()[..]);
    assert_eq!(left.len(), 2);
}

#[test]
fn pack_rows_keep_document_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let texts: Vec<Option<String>> = (0..40).map(|i| Some(doc_text(i))).collect();
    write_parquet(&dir.path().join("p.parquet"), &texts, 16);
    let corpus = Corpus::open(dir.path().to_str().unwrap(), &CorpusConfig::default()).unwrap();
    let packed = rows(&corpus, stream_config(32, PackMode::Pack, 8));
    let mut rebuilt: std::collections::BTreeMap<i64, Vec<(i32, u32)>> = Default::default();
    for row in &packed {
        // Every row starts with BOS (its own or the document's).
        assert_eq!(row.tokens[0], BOS);
        for i in 0..row.tokens.len() {
            let t = row.tokens[i];
            let special = matches!(t, BOS | EOS | SEP) || row.attention[i] == 0;
            assert_eq!(row.exclude[i], u8::from(special), "exclusion mask at {i}");
            if row.doc[i] >= 0 {
                rebuilt.entry(row.doc[i]).or_default().push((row.doc_pos[i], t));
            }
            // A new document begins with its BOS at position 0.
            if i > 0 && row.doc[i] >= 0 && row.doc[i] != row.doc[i - 1] && row.doc[i - 1] >= 0 {
                assert_eq!((row.tokens[i], row.doc_pos[i]), (BOS, 0));
                assert_eq!(row.tokens[i - 1], EOS);
            }
        }
        // Padding only at the end of the last row of a unit.
        let real = row.attention.iter().filter(|&&a| a == 1).count();
        assert!(row.attention[..real].iter().all(|&a| a == 1));
    }
    // Split documents reassemble to BOS + text + EOS with contiguous positions.
    let expected: Vec<String> = texts.iter().flatten().filter(|t| !t.trim().is_empty()).cloned().collect();
    assert_eq!(rebuilt.len(), expected.len());
    for (tokens, text) in rebuilt.values().zip(&expected) {
        let positions: Vec<i32> = tokens.iter().map(|p| p.0).collect();
        assert_eq!(positions, (0..tokens.len() as i32).collect::<Vec<_>>());
        let mut want = vec![BOS];
        want.extend(text.bytes().map(u32::from));
        want.push(EOS);
        assert_eq!(tokens.iter().map(|p| p.1).collect::<Vec<_>>(), want);
    }
    // Three row groups: at most three padded rows.
    assert!(packed.iter().filter(|r| r.attention.contains(&0)).count() <= 3);
}

#[test]
fn kept_columns_are_checked_in_every_parquet_file_in_order() {
    let dir = tempfile::tempdir().unwrap();
    // More files than footers are fetched at once, so the check reads them in several waves.
    for i in 0..40 {
        write_parquet(&dir.path().join(format!("f{i:02}.parquet")), &[Some(doc_text(i))], 4);
    }
    let corpus = Corpus::open(dir.path().to_str().unwrap(), &CorpusConfig::default()).unwrap();
    assert_eq!(corpus.check_columns(&["id".to_string()]).unwrap(), vec![("id".to_string(), "string")]);

    // Two files without the column: the first of them in the corpus's order is named.
    for name in ["f33b.parquet", "f17b.parquet"] {
        let schema = Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
            "text",
            arrow_schema::DataType::Utf8,
            true,
        )]));
        let file = std::fs::File::create(dir.path().join(name)).unwrap();
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, schema.clone(), None).unwrap();
        let text: arrow_array::ArrayRef = Arc::new(arrow_array::StringArray::from(vec!["a b c"]));
        writer.write(&arrow_array::RecordBatch::try_new(schema, vec![text]).unwrap()).unwrap();
        writer.close().unwrap();
    }
    let corpus = Corpus::open(dir.path().to_str().unwrap(), &CorpusConfig::default()).unwrap();
    match corpus.check_columns(&["id".to_string()]) {
        Err(Error::MissingColumn { file, column, available }) => {
            assert!(file.ends_with("f17b.parquet"), "{file}");
            assert_eq!((column.as_str(), available.as_str()), ("id", "text"));
        }
        other => panic!("expected the missing column named, got {other:?}"),
    }
}
