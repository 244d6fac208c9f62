//! The models crate's rooms and the order they stand in, read from the `crate::…` paths of
//! every source file (its tests left out: `mod tests` blocks and `tests.rs` files): a module names only modules of its own layer or
//! of a lower one, and no file is over 800 lines before its tests.
//!
//! Layers, lowest first:
//! 1. formats: the crate root (re-exports), the error, opening files, finding non-finite
//!    values, GGUF, the block encodings (fp8, MXFP4), the tokenizer;
//! 2. descriptions: the configuration, the hook kinds, `config.json`'s reader and GGUF's
//!    metadata read as one (`gguf::convert`), the sharding table, the stored forms of weights,
//!    a steering vector (its hook and its file);
//! 3. the program: `forward` (the contract, `Graph`, the decoder loop), `decode` (a decoding
//!    step's caches and logits), `sample` (its next token), `layers`, the unembedding and a
//!    dictionary's encoder;
//! 4. families: each family's file and the registry;
//! 5. loading: weights from safetensors and GGUF, a model directory, a dictionary's files.
//!
//! A lower layer reaches a family only through the handle its configuration keeps
//! ([`Arch`](siphon_models::Arch), a `&'static Family`); the registry implements reading an
//! architecture back from its name.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The layers by their modules (a submodule named stands apart from its parent's layer); the
/// families' layer also holds every module the registry (`family.rs`) lists.
const LAYERS: &[(&str, &[&str])] = &[
    ("formats", &["(root)", "error", "file", "finite", "fp8", "mxfp4", "gguf", "tokenizer"]),
    (
        "descriptions",
        &[
            "arch",
            "config",
            "contract",
            "dictionary",
            "gguf::convert",
            "hooks",
            "hf_config",
            "sharding",
            "steering",
            "stored",
        ],
    ),
    ("program", &["forward", "decode", "sample", "layers", "unembedding", "dictionary::encoder"]),
    ("families", &["family"]),
    (
        "loading",
        &[
            "safetensors",
            "weights",
            "hf",
            "dictionary::files",
            "dictionary::gemma_scope",
            "dictionary::llama_scope",
            "dictionary::saelens",
            "dictionary::sparsify",
        ],
    ),
];

/// The modules of the families the registry lists (`&crate::<module>::<FAMILY>,` lines).
fn registered() -> Vec<String> {
    let registry = std::fs::read_to_string(src().join("family.rs")).unwrap();
    let mut out: Vec<String> = registry
        .lines()
        .filter_map(|l| l.trim().strip_prefix("&crate::"))
        .filter_map(|l| l.split_once("::").map(|(module, _)| module.to_string()))
        .collect();
    out.dedup();
    assert!(out.len() >= 20, "the registry's lines were not found in family.rs: {out:?}");
    out
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("tests.rs") {
            out.push(path);
        }
    }
}

/// `a/b.rs` and `a/b/mod.rs` are `a::b`; `lib.rs` is `(root)`.
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(src()).unwrap().with_extension("");
    let parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).filter(|p| *p != "mod").collect();
    if parts == ["lib"] { "(root)".into() } else { parts.join("::") }
}

fn layer_of(module: &str, families: &[String]) -> usize {
    let top = if module == "(root)" { module } else { module.split("::").next().unwrap() };
    let families_layer = LAYERS.iter().position(|(name, _)| *name == "families").unwrap();
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&module))
        .or_else(|| LAYERS.iter().position(|(_, modules)| modules.contains(&top)))
        .or_else(|| families.iter().any(|f| f == top).then_some(families_layer))
        .unwrap_or_else(|| panic!("module {module} is in no layer of tests/layering.rs: give it one"))
}

/// The text before the file's unit tests.
fn code(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests").map_or(text, |i| &text[..i])
}

/// The modules `text` names through `crate::` paths, a grouped import `crate::{a::X, b}` as
/// each of its paths (a name the root re-exports counts as the module it comes from).
fn uses(text: &str, modules: &BTreeSet<String>, reexports: &[(String, String)]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        if text[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue; // `siphon_crate::`, not ours
        }
        for path in paths_at(&text[i + 7..]) {
            out.insert(target(&path, modules, reexports));
        }
    }
    out
}

/// The paths a `crate::` prefix leads to: one, or each of a `{…}` group's (nested groups
/// expanded), each as `a::b::C`.
fn paths_at(rest: &str) -> Vec<String> {
    let head: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
    let after = &rest[head.len()..];
    if !head.is_empty() && !head.ends_with("::") || !after.starts_with('{') {
        return vec![head];
    }
    // The group's text up to its matching brace, split at its own top-level commas.
    let mut depth = 0;
    let mut end = after.len();
    for (i, c) in after.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    end = i;
                    break;
                }
            }
            _ => {}
        }
    }
    let inner = &after[1..end];
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .map(str::trim)
        .filter(|item| !item.is_empty() && *item != "self")
        .flat_map(|item| paths_at(item).into_iter().map(|p| format!("{head}{p}")).collect::<Vec<_>>())
        .collect()
}

/// The module a `crate::` path names: its longest prefix that is a module, else the module a
/// root re-export of its first name comes from, else the root.
fn target(path: &str, modules: &BTreeSet<String>, reexports: &[(String, String)]) -> String {
    let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
    if let Some(m) = (1..=parts.len()).rev().map(|n| parts[..n].join("::")).find(|m| modules.contains(m)) {
        return m;
    }
    match reexports.iter().find(|(name, _)| Some(name.as_str()) == parts.first().copied()) {
        Some((_, from)) => from.clone(),
        None => "(root)".into(),
    }
}

/// `pub use a::b::{X, Y as Z};` lines of lib.rs: each name and the module it comes from.
fn reexports(lib: &str, modules: &BTreeSet<String>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for stmt in lib.split(';').map(str::trim).filter(|s| s.starts_with("pub use ")) {
        let body = stmt.trim_start_matches("pub use ").replace(['\n', ' '], "");
        let (prefix, names) = match body.split_once("::{") {
            Some((p, n)) => (p.to_string(), n.trim_end_matches('}').split(',').map(String::from).collect()),
            None => {
                let (p, n) = body.rsplit_once("::").unwrap();
                (p.to_string(), vec![n.to_string()])
            }
        };
        for name in names.into_iter().filter(|n| !n.is_empty()) {
            let (orig, alias) =
                name.split_once("as").map_or((name.clone(), name.clone()), |(o, a)| (o.into(), a.into()));
            let full = format!("{prefix}::{orig}");
            let from = if modules.contains(&full) { full } else { prefix.clone() };
            out.push((alias, from));
        }
    }
    out
}

#[test]
fn no_module_names_a_higher_layer_and_no_file_is_too_long() {
    let mut paths = Vec::new();
    files(&src(), &mut paths);
    paths.sort();
    let modules: BTreeSet<String> = paths.iter().map(|p| module_of(p)).collect();
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let reexports = reexports(&lib, &modules);
    let families = registered();
    let mut back = BTreeSet::new();
    let mut long = Vec::new();
    for path in &paths {
        let module = module_of(path);
        let text = std::fs::read_to_string(path).unwrap();
        let code = code(&text);
        let lines = code.lines().count();
        if lines > 800 {
            long.push(format!("{} ({lines} lines before its tests)", path.display()));
        }
        for target in uses(code, &modules, &reexports) {
            if target != module && layer_of(&target, &families) > layer_of(&module, &families) {
                back.insert((module.clone(), target));
            }
        }
    }
    let name = |m: &str| LAYERS[layer_of(m, &families)].0;
    let back: Vec<String> = back.iter().map(|(a, b)| format!("{a} ({}) -> {b} ({})", name(a), name(b))).collect();
    assert!(back.is_empty(), "modules naming a higher layer: {back:#?}");
    assert!(long.is_empty(), "files over 800 lines: {long:?}");
}

#[test]
fn grouped_imports_count_each_path_and_a_back_arrow_in_one_is_found() {
    let group = "{config::ModelConfig, layers::{norm, moe::Router}, Weights, self};";
    assert_eq!(paths_at(group), ["config::ModelConfig", "layers::norm", "layers::moe::Router", "Weights"]);
    let modules: BTreeSet<String> =
        ["config", "fp8", "layers", "layers::norm", "layers::moe", "weights"].map(String::from).into();
    let reexports = vec![("Weights".to_string(), "weights".to_string())];
    let named = uses(&format!("use crate::{group}"), &modules, &reexports);
    assert_eq!(named, ["config", "layers::moe", "layers::norm", "weights"].map(String::from).into());
    // `fp8` (formats) naming `Weights` through the group names the loading layer: a back arrow.
    assert!(named.iter().any(|m| layer_of(m, &[]) > layer_of("fp8", &[])));
}
