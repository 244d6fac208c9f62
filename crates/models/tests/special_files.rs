//! Every file a model or a dictionary is read from must be a regular file (or a symlink to
//! one): a FIFO, a device or a directory in its place is refused at once, naming the path and
//! what it is, never opened (opening a FIFO blocks until someone writes to it).

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use siphon_models::LoadedModel;
use siphon_models::dictionary::Dictionary;

mod support {
    pub mod copies;
}
use support::copies::{copy_dir, fixtures};

fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo").arg(path).status().expect("run mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
}

/// `open`'s error, which must come within seconds: a reader blocked on a FIFO fails the test
/// instead of hanging it (its thread is left behind).
fn refused_at_once<T: Send + 'static>(
    what: &str,
    open: impl FnOnce() -> Result<T, siphon_models::ModelError> + Send + 'static,
) -> String {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || send.send(open().err().map(|e| e.to_string())));
    match receive.recv_timeout(Duration::from_secs(10)) {
        Ok(Some(err)) => err,
        Ok(None) => panic!("{what}: accepted"),
        Err(_) => panic!("{what}: still blocked after 10 s"),
    }
}

/// Each file of `dir` in turn replaced by a FIFO: `open(dir)` refuses it, naming it.
fn every_file_as_a_fifo<T: Send + 'static>(
    dir: &Path,
    files: &[&str],
    open: impl Fn(PathBuf) -> Result<T, siphon_models::ModelError> + Send + Copy + 'static,
) {
    for file in files {
        let path = dir.join(file);
        let aside = dir.join(format!("{file}.aside"));
        std::fs::rename(&path, &aside).unwrap();
        mkfifo(&path);
        let at = dir.to_path_buf();
        let err = refused_at_once(file, move || open(at));
        assert!(err.contains(&path.display().to_string()) && err.contains("FIFO"), "{file}: {err}");
        std::fs::remove_file(&path).unwrap();
        std::fs::rename(&aside, &path).unwrap();
    }
}

#[test]
fn every_file_of_a_model_directory_must_be_a_regular_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    // A sharded checkpoint, with a tokenizer and its config and a chat template.
    copy_dir(&fixtures().join("models/tiny-qwen2"), &dir);
    std::fs::copy(fixtures().join("data/tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), "{}").unwrap();
    std::fs::write(dir.join("chat_template.jinja"), "{{ messages }}").unwrap();
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with("golden"))
        .collect();
    files.sort();
    assert!(files.len() >= 7 && files.iter().filter(|f| f.ends_with(".safetensors")).count() >= 2, "{files:?}");
    let open = |dir: PathBuf| LoadedModel::open(&dir).map(|m| m.tokenizer.is_some());
    every_file_as_a_fifo(&dir, &files.iter().map(String::as_str).collect::<Vec<_>>(), open);
    // Symlinks to regular files are read as the files.
    let config = dir.join("config.json");
    std::fs::rename(&config, dir.join("real-config.json")).unwrap();
    std::os::unix::fs::symlink(dir.join("real-config.json"), &config).unwrap();
    assert!(LoadedModel::open(&dir).unwrap().tokenizer.is_some());
}

#[test]
fn a_model_path_that_is_neither_a_directory_nor_a_file_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("model.gguf");
    mkfifo(&fifo);
    for (path, kind) in [(PathBuf::from("/dev/null"), "a character device"), (fifo, "a FIFO")] {
        let at = path.clone();
        let err = refused_at_once("model", move || LoadedModel::open(&at));
        assert!(err.contains(&path.display().to_string()) && err.contains(kind), "{err}");
        assert!(err.contains("not a model directory or a .gguf file"), "{err}");
    }
}

#[test]
fn every_file_of_a_dictionary_must_be_a_regular_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dictionaries = fixtures().join("dictionaries");
    let cases: [(&str, &[&str]); 3] = [
        ("saelens-standard", &["cfg.json", "sae_weights.safetensors"]),
        ("gemma-scope-2b-pt-res/layer_1/width_16k/average_l0_7", &["params.npz"]),
        ("llama-scope/tiny-llama-L1R", &["hyperparams.json", "checkpoints/final.safetensors"]),
    ];
    for (name, files) in cases {
        let dir = tmp.path().join(name);
        copy_dir(&dictionaries.join(name), &dir);
        Dictionary::open(&dir, None).unwrap();
        every_file_as_a_fifo(&dir, files, |dir| Dictionary::open(&dir, None));
    }
}
