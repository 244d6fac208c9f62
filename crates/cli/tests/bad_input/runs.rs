//! `siphon inspect` of a run whose files are not what they must be: a FIFO (or a directory)
//! where run.json, stats.json, a manifest or a shard is (reading one would block forever) and
//! run.json numbers of the wrong type. Each is named, within seconds.

use std::path::Path;
use std::time::Duration;

use crate::{extract_args, run, setup, siphon};

fn inspect(dir: &Path) -> (std::process::Output, Duration) {
    run(siphon(&["inspect".to_string(), dir.display().to_string()]), Duration::from_secs(30))
}

fn mkfifo(path: &Path) {
    std::fs::remove_file(path).unwrap();
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", path.display());
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() { copy_dir(&path, &target) } else { _ = std::fs::copy(&path, &target).unwrap() }
    }
}

#[test]
fn inspect_names_special_files_and_numbers_of_the_wrong_type() {
    let s = setup();
    let (output, _) = run(siphon(&extract_args(&s, "r", &[])), Duration::from_secs(120));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let good = s.root.join("out/r");
    let (output, _) = inspect(&good);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let host = "machine_000_host_00";
    for (i, file) in
        ["run.json", "stats.json", &format!("{host}/manifest.jsonl"), &format!("{host}/shard_000000.safetensors")]
            .into_iter()
            .enumerate()
    {
        let dir = s.root.join(format!("fifo-{i}/r"));
        copy_dir(&good, &dir);
        mkfifo(&dir.join(file));
        let (output, took) = inspect(&dir);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && took < Duration::from_secs(10), "{file} ({took:?}): {stderr}");
        assert!(
            stderr.contains(file) && stderr.contains("a FIFO (named pipe), not a regular file"),
            "{file}: {stderr}"
        );
    }
    let dir = s.root.join("numbers/r");
    copy_dir(&good, &dir);
    let mut run_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("run.json")).unwrap()).unwrap();
    run_json["config"]["corpus"]["seq_len"] = serde_json::json!("16");
    run_json["partition"]["hosts"] = serde_json::json!(-1);
    std::fs::write(dir.join("run.json"), serde_json::to_vec(&run_json).unwrap()).unwrap();
    let (output, _) = inspect(&dir);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("config.corpus.seq_len is \"16\", not a positive integer"), "{stderr}");
    assert!(stderr.contains("partition.hosts is -1, not a positive integer"), "{stderr}");
}
