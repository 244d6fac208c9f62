//! The dictionary fixtures, shared by the test binaries that check latents against them (the
//! models crate's encoder, the engine's forward): included by path, as test binaries share no
//! crate of their own.

use std::path::{Path, PathBuf};

/// Every directory under `fixtures/dictionaries` that holds a golden (Gemma Scope's under the
/// Hub's layout, several levels down), sorted.
pub fn dictionary_fixtures() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        if dir.join("golden.safetensors").is_file() {
            out.push(dir.to_path_buf());
        }
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            }
        }
    }
    let mut dirs = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/dictionaries"), &mut dirs);
    dirs.sort();
    dirs
}
