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

/// The line `doctor` prints about huge pages, run with `GLIBC_TUNABLES` as given (`None`:
/// unset); the plugin is not needed for it.
#[cfg(target_os = "linux")]
fn huge_pages_line(tunables: Option<&str>) -> String {
    let mut command = Command::new(SIPHON);
    command.args(["doctor", "--plugin", "/nonexistent/libpjrt.so"]).stdin(Stdio::null());
    match tunables {
        Some(t) => command.env("GLIBC_TUNABLES", t),
        None => command.env_remove("GLIBC_TUNABLES"),
    };
    let out = command.output().expect("run siphon");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with("huge pages: ")).unwrap_or_else(|| panic!("{stdout}"));
    line.to_string()
}

#[test]
#[cfg(target_os = "linux")]
fn malloc_is_asked_for_huge_pages_unless_the_tunable_is_named() {
    // The process re-executed itself with the tunable added, after the user's own.
    assert!(huge_pages_line(None).contains("GLIBC_TUNABLES glibc.malloc.hugetlb=1 ("));
    assert!(huge_pages_line(Some("glibc.malloc.arena_max=2")).contains("GLIBC_TUNABLES glibc.malloc.hugetlb=1 ("));
    // Named already (here to turn it off): left as the user set it.
    assert!(huge_pages_line(Some("glibc.malloc.hugetlb=0")).contains("GLIBC_TUNABLES glibc.malloc.hugetlb=0 ("));
}
