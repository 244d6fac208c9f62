//! Conversations through chat templates against HF transformers' `apply_chat_template`
//! (fixtures/chat/goldens.json, written by scripts/fixtures/gen_chat_fixtures.py): the demo
//! model's own template, read from its GGUF, and the Qwen2.5, Llama 3, Gemma 2 and a
//! `{% generation %}`-marked template, all with the GGUF's tokenizer. The text, the token ids
//! and each token's role must equal transformers' for every conversation, rendered alone and
//! read from a jsonl through the data path; a conversation a template refuses is refused.
//!
//! Needs the SmolLM2 GGUF (`SIPHON_SMOLLM2_GGUF`, set by scripts/test.sh); without it the test
//! prints a note and returns.

use std::sync::Arc;

use siphon_data::{
    ChatTemplate, Corpus, CorpusConfig, PackConfig, PackMode, PadSide, Role, SpecialTokens, StreamConfig,
};

mod common;

#[test]
fn chat_templates_render_and_tokenize_as_transformers_does() {
    let Some(gguf) = std::env::var_os("SIPHON_SMOLLM2_GGUF") else {
        eprintln!("note: SIPHON_SMOLLM2_GGUF is unset; skipping the chat template goldens");
        return;
    };
    let model = siphon_models::LoadedModel::open(std::path::Path::new(&gguf)).unwrap();
    let tokenizer = model.tokenizer.as_ref().expect("the GGUF has a tokenizer");
    let goldens: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(common::repo_root().join("fixtures/chat/goldens.json")).unwrap())
            .unwrap();
    // The special tokens a template sees are transformers'.
    for (name, value) in &tokenizer.special_tokens {
        assert_eq!(goldens["special"][name].as_str(), Some(value.as_str()), "{name}");
    }
    let special: Vec<(&str, &str)> = tokenizer.special_tokens.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut checked = 0;
    for (name, golden) in goldens["templates"].as_object().unwrap() {
        let source = golden["source"].as_str().unwrap();
        if name == "smollm2-gguf" {
            assert_eq!(tokenizer.chat_template.as_deref(), Some(source), "the GGUF's template as siphon reads it");
        }
        let template = Arc::new(ChatTemplate::new(source, &special).unwrap());
        let mut jsonl = String::new();
        let mut expected = Vec::new();
        for case in golden["cases"].as_array().unwrap() {
            let messages = &case["messages"];
            if let Some(error) = case["error"].as_str() {
                let err = template.render(messages).unwrap_err();
                assert!(err.contains(error), "{name}: {err} (transformers: {error})");
                continue;
            }
            let rendered = template.render(messages).unwrap();
            assert_eq!(rendered.text, case["text"].as_str().unwrap(), "{name}");
            let (ids, roles) = template.encode(tokenizer.inner(), messages).unwrap();
            let want: Vec<u32> = case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            assert_eq!(ids, want, "{name}: token ids");
            let want_roles: Vec<&str> = case["roles"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
            assert_eq!(roles.iter().map(|r| r.name()).collect::<Vec<_>>(), want_roles, "{name}: roles");
            jsonl.push_str(&serde_json::json!({ "messages": messages }).to_string());
            jsonl.push('\n');
            expected.push((want, roles));
            checked += 1;
        }
        // The same conversations as records of a jsonl, one per padded row.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chats.jsonl");
        std::fs::write(&path, jsonl).unwrap();
        let mut config = CorpusConfig::default();
        config.json_field = "messages".into();
        let corpus = Corpus::open(path.to_str().unwrap(), &config).unwrap();
        let special_ids = SpecialTokens { bos: tokenizer.bos_id, eos: tokenizer.eos_id, pad: 0, exclude: Vec::new() };
        let mut stream = StreamConfig::new(PackConfig::new(256, PackMode::Pad(PadSide::Right), special_ids), 8);
        stream.chat = Some(template.clone());
        let batches: Vec<siphon_data::Batch> =
            corpus.stream(Arc::new(tokenizer.inner().clone()), stream).unwrap().collect::<Result<_, _>>().unwrap();
        let rows: Vec<(Vec<u32>, Vec<u8>)> = batches
            .iter()
            .flat_map(|b| {
                (0..b.len()).map(move |i| {
                    let row = i * b.seq_len..(i + 1) * b.seq_len;
                    let real = b.attention_mask[row.clone()].iter().filter(|&&a| a == 1).count();
                    (b.tokens[row.start..row.start + real].to_vec(), b.role[row.start..row.start + real].to_vec())
                })
            })
            .collect();
        assert_eq!(rows.len(), expected.len(), "{name}");
        for ((ids, roles), (want_ids, want_roles)) in rows.iter().zip(&expected) {
            assert_eq!(ids, want_ids, "{name}: the data path's ids");
            assert_eq!(
                roles,
                &want_roles.iter().map(|r| *r as u8).collect::<Vec<_>>(),
                "{name}: the data path's roles"
            );
        }
    }
    assert!(checked >= 12, "only {checked} conversations checked");
    assert_eq!(Role::parse("assistant"), Some(Role::Assistant));
}

/// Each template's generation prompt (`add_generation_prompt=True`, the conversation up to
/// its first user message) renders to transformers' text, and `siphon generate --chat` feeds
/// the demo model transformers' ids for it.
#[test]
fn generation_prompts_render_as_transformers_does_and_generate_feeds_them() {
    let Some(gguf) = std::env::var_os("SIPHON_SMOLLM2_GGUF") else {
        eprintln!("note: SIPHON_SMOLLM2_GGUF is unset; skipping the generation prompt goldens");
        return;
    };
    let model = siphon_models::LoadedModel::open(std::path::Path::new(&gguf)).unwrap();
    let tokenizer = model.tokenizer.as_ref().expect("the GGUF has a tokenizer");
    let goldens: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(common::repo_root().join("fixtures/chat/goldens.json")).unwrap())
            .unwrap();
    let special: Vec<(&str, &str)> = tokenizer.special_tokens.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut checked = 0;
    for (name, golden) in goldens["templates"].as_object().unwrap() {
        let template = ChatTemplate::new(golden["source"].as_str().unwrap(), &special).unwrap();
        for prompt in golden["prompts"].as_array().unwrap() {
            let got = template.render_prompt(&prompt["messages"]);
            match prompt["error"].as_str() {
                Some(error) => assert!(got.unwrap_err().contains(error), "{name}"),
                None => {
                    assert_eq!(got.unwrap(), prompt["text"].as_str().unwrap(), "{name}");
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 14, "{checked} prompts checked");
    // The demo model's own template through `siphon generate --chat`: a user's message alone.
    let prompts = goldens["templates"]["smollm2-gguf"]["prompts"].as_array().unwrap();
    let demo = prompts.iter().find(|p| p["messages"].as_array().unwrap().len() == 1).expect("a user's message alone");
    let message = &demo["messages"][0];
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("chat.jsonl");
    let args: Vec<String> = [
        "generate",
        "--model",
        gguf.to_str().unwrap(),
        "--chat",
        "--text",
        message["content"].as_str().unwrap(),
        "--max-new-tokens",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    let status = common::siphon_command(&args).status().unwrap();
    assert!(status.success());
    let line: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&out).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(line["prompt_ids"], demo["ids"]);
}
