//! A plugin that cannot start is a clear error from `siphon doctor` and `siphon extract`, never
//! a crash: a file that is not a shared library, a shared library that is not a PJRT plugin,
//! and libtpu on a machine without a TPU (`SIPHON_TEST_LIBTPU_PLUGIN`, set by `scripts/test.sh`,
//! which fetches the pinned PyPI libtpu).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{make_corpus, make_model, repo_root};

const SIPHON: &str = env!("CARGO_BIN_EXE_siphon");

/// A shared library loaded into this test process that is certainly not a PJRT plugin.
fn libc_path() -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| path.contains("libc.so") || path.contains("libgcc_s"))
        .map(PathBuf::from)
        .expect("a C library in /proc/self/maps")
}

fn siphon(args: &[&str]) -> Output {
    Command::new(SIPHON)
        .args(args)
        .env_remove("SIPHON_PROCESS_ID")
        .env_remove("SIPHON_NUM_PROCESSES")
        .env_remove("SIPHON_COORDINATOR")
        .env("TF_CPP_MIN_LOG_LEVEL", "2")
        .stdin(Stdio::null())
        .output()
        .expect("run siphon")
}

/// Exited with status 1 (an error, not a signal or an abort) and said `expected`.
fn assert_clear_error(output: &Output, expected: &[&str]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(1),
        "expected exit code 1 (an error, not a crash): {:?}\n{stderr}",
        output.status
    );
    for text in expected {
        assert!(stderr.contains(text), "missing {text:?} in:\n{stderr}");
    }
}

fn extract_with(plugin: &Path) -> Output {
    let tmp = tempfile::tempdir().unwrap();
    let (model, corpus) = (tmp.path().join("model"), tmp.path().join("corpus"));
    make_model(&model);
    make_corpus(&corpus, 8);
    let tokenizer = repo_root().join("fixtures/data/tokenizer.json");
    let out = tmp.path().join("out");
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let args = [
        "extract".to_string(),
        "--plugin".into(),
        path(plugin),
        "--model".into(),
        path(&model),
        "--tokenizer".into(),
        path(&tokenizer),
        "--corpus".into(),
        path(&corpus),
        "--text-records".into(),
        "line".into(),
        "--hooks".into(),
        "blocks.0.hook_resid_pre".into(),
        "--seq-len".into(),
        "32".into(),
        "--batch-size".into(),
        "4".into(),
        "--output".into(),
        path(&out),
        "--run".into(),
        "r".into(),
    ];
    siphon(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn doctor_names_a_file_that_is_not_a_plugin() {
    let tmp = tempfile::tempdir().unwrap();
    let text = tmp.path().join("libpjrt_fake.so");
    std::fs::write(&text, "not a library").unwrap();
    let output = siphon(&["doctor", "--plugin", text.to_str().unwrap()]);
    assert_clear_error(&output, &["is not a shared library", text.to_str().unwrap()]);

    let libc = libc_path();
    let output = siphon(&["doctor", "--plugin", libc.to_str().unwrap()]);
    assert_clear_error(&output, &["is not a PJRT plugin", "GetPjrtApi"]);
}

#[test]
fn extract_names_a_library_that_is_not_a_plugin() {
    let output = extract_with(&libc_path());
    assert_clear_error(&output, &["cannot load the PJRT plugin", "is not a PJRT plugin"]);
}

/// The libtpu.so of PyPI libtpu, which `scripts/test.sh` provides.
fn libtpu() -> Option<PathBuf> {
    match std::env::var_os("SIPHON_TEST_LIBTPU_PLUGIN") {
        Some(path) => Some(PathBuf::from(path)),
        None => {
            eprintln!("skipped: SIPHON_TEST_LIBTPU_PLUGIN is not set (scripts/test.sh downloads libtpu and sets it)");
            None
        }
    }
}

/// What this machine must lack for the libtpu cases to mean anything.
fn has_tpu() -> bool {
    !siphon_runtime::diagnose::Machine::probe_dev(Path::new("/dev")).tpu_devices.is_empty()
}

#[test]
fn doctor_and_extract_explain_libtpu_without_a_tpu() {
    let Some(libtpu) = libtpu() else { return };
    if has_tpu() {
        eprintln!("skipped: this machine has TPU devices");
        return;
    }
    // libtpu itself would retry the GCE metadata server for minutes; siphon refuses at once.
    let expected =
        ["TPU plugin (libtpu)", "cannot start on this machine", "this machine has no TPU", "SIPHON_SKIP_DEVICE_CHECK"];
    let output = siphon(&["doctor", "--plugin", libtpu.to_str().unwrap()]);
    assert_clear_error(&output, &expected);
    let output = extract_with(&libtpu);
    assert_clear_error(&output, &expected);

    // Past the device check, libtpu itself loads and initializes; told not to query the GCE
    // metadata server (TPU_SKIP_MDS_QUERY), its client creation fails at once ("No jellyfish
    // device found" from libtpu 0.0.51), and siphon adds the plugin and the likely cause.
    let output = Command::new("timeout")
        .args(["120", SIPHON, "doctor", "--plugin", libtpu.to_str().unwrap()])
        .env("SIPHON_SKIP_DEVICE_CHECK", "1")
        .env("TPU_SKIP_MDS_QUERY", "1")
        .env("TF_CPP_MIN_LOG_LEVEL", "2")
        .stdin(Stdio::null())
        .output()
        .expect("run siphon doctor");
    assert_clear_error(
        &output,
        &[
            "TPU plugin (libtpu)",
            "could not start",
            "PJRT_Client_Create failed",
            "likely cause: this machine has no TPU",
        ],
    );
}
