//! `siphon doctor --output`: the output location is checked (write, read back, list, delete)
//! before anything else, and what fails is named.

mod common;

use std::process::{Command, Output, Stdio};

use common::plugin;

const SIPHON: &str = env!("CARGO_BIN_EXE_siphon");

fn doctor(args: &[&str]) -> Output {
    Command::new(SIPHON)
        .arg("doctor")
        .args(args)
        .env("SIPHON_PJRT_PLUGIN", plugin())
        .env("TF_CPP_MIN_LOG_LEVEL", "2")
        .stdin(Stdio::null())
        .output()
        .expect("run siphon")
}

#[test]
fn a_writable_output_is_checked_and_left_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let output = tmp.path().join("out");
    let out = doctor(&["--output", output.to_str().unwrap(), "--cpu-devices", "2"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("wrote 64 KiB in") && stdout.contains("deleted in"), "{stdout}");
    assert!(stdout.contains("devices:   2"), "the plugin is checked after the output: {stdout}");
    // Where `siphon plan --target tpu:…` finds libtpu, or how to install it.
    assert!(stdout.contains("tpu plans: libtpu ") || stdout.contains("tpu plans: no libtpu found"), "{stdout}");
    // And where `siphon plan --target gpu:…` finds the CUDA plugin, or how to install it.
    let gpu = stdout.lines().find(|l| l.starts_with("gpu plans: ")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(gpu.contains("compiles for GPUs") || gpu.contains("scripts/setup-cuda-compiler.sh"), "{gpu}");
    assert_eq!(std::fs::read_dir(&output).unwrap().count(), 0, "the probe left something behind");
}

#[test]
fn an_unusable_output_is_named_before_the_plugin_is_loaded() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let output = file.join("out");
    let out = doctor(&["--output", output.to_str().unwrap(), "--plugin", "/nonexistent/libpjrt.so"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("the output {} cannot hold a dataset", output.display())), "{stderr}");
    assert!(stderr.contains("Not a directory"), "{stderr}");
    assert!(!stderr.contains("libpjrt"), "the output is checked first: {stderr}");
}
