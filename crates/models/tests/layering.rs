//! The models crate's rooms and the order they stand in, read from the `crate::…` paths of
//! every source file (its tests left out: `mod tests` blocks and `tests.rs` files): a module names only modules of its own layer or
//! of a lower one, and no file is over 800 lines before its tests.
//!
//! Layers, lowest first:
//! 1. formats: the crate root (errors, re-exports), GGUF, the block encodings (fp8, MXFP4),
//!    the tokenizer;
//! 2. descriptions: the configuration, the hook kinds, `config.json`'s reader, the sharding
//!    table, the stored forms of weights;
//! 3. the program: `forward` (the contract, `Graph`, the decoder loop) and `layers`;
//! 4. families: each family's file and the registry;
//! 5. loading: weights from safetensors and GGUF, a model directory.
//!
//! [`ALLOWED`] lists the back edges still there, each with what it is for: an edge not
//! listed fails, and so does a listed one that is gone (remove it from the list).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const LAYERS: &[(&str, &[&str])] = &[
    ("formats", &["(root)", "fp8", "mxfp4", "gguf", "tokenizer"]),
    ("descriptions", &["config", "hooks", "hf_config", "sharding", "stored"]),
    ("program", &["forward", "layers"]),
    (
        "families",
        &[
            "family",
            "deepseek_v3",
            "gemma2",
            "gemma3",
            "gemma4",
            "gpt2",
            "gpt_neox",
            "gpt_oss",
            "llama",
            "mistral",
            "mixtral",
            "olmo2",
            "olmo3",
            "olmoe",
            "phi3",
            "qwen2",
            "qwen3",
            "qwen3_5",
            "qwen3_moe",
            "qwen3_next",
            "smollm3",
        ],
    ),
    ("loading", &["safetensors", "weights", "hf"]),
];

/// Back edges not yet removed: `(from, to)` modules (issue 38 leaves these for the step that
/// gives each family its own configuration).
const ALLOWED: &[(&str, &str)] = &[
    // ModelConfig holds an Arch, whose name the registry keeps, and asks the registry for its
    // family's weights and features.
    ("config", "family"),
    // A config's hook features are its family's.
    ("hooks::kinds", "family"),
    // config.json is read by the family its model_type names.
    ("hf_config", "family"),
    // build_forward dispatches to the family's builder.
    ("forward", "family"),
];

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

fn layer_of(module: &str) -> usize {
    let top = if module == "(root)" { module } else { module.split("::").next().unwrap() };
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&top))
        .unwrap_or_else(|| panic!("module {module} is in no layer of tests/layering.rs: give it one"))
}

/// The text before the file's unit tests.
fn code(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests").map_or(text, |i| &text[..i])
}

/// The modules `text` names through `crate::` paths (a name the root re-exports counts as the
/// module it comes from).
fn uses(text: &str, modules: &BTreeSet<String>, reexports: &[(String, String)]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        if text[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue; // `siphon_crate::`, not ours
        }
        let path: String =
            text[i + 7..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
        let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
        let module = (1..=parts.len()).rev().map(|n| parts[..n].join("::")).find(|m| modules.contains(m));
        let target = match module {
            Some(m) => m,
            None => match reexports.iter().find(|(name, _)| Some(name.as_str()) == parts.first().copied()) {
                Some((_, from)) => from.clone(),
                None => "(root)".into(),
            },
        };
        out.insert(target);
    }
    out
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
            if target != module && layer_of(&target) > layer_of(&module) {
                back.insert((module.clone(), target));
            }
        }
    }
    let allowed: BTreeSet<(String, String)> = ALLOWED.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    let new: Vec<_> = back.difference(&allowed).collect();
    let gone: Vec<_> = allowed.difference(&back).collect();
    let name = |m: &str| LAYERS[layer_of(m)].0;
    let new: Vec<String> = new.iter().map(|(a, b)| format!("{a} ({}) -> {b} ({})", name(a), name(b))).collect();
    assert!(new.is_empty(), "modules naming a higher layer: {new:#?}");
    assert!(gone.is_empty(), "back edges listed in ALLOWED that are gone (remove them): {gone:?}");
    assert!(long.is_empty(), "files over 800 lines: {long:?}");
}
