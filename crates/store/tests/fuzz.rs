//! Every parser of a dataset's files, fed seeded mutations of a real run for a bounded time:
//! `run.json`, `manifest.jsonl`, `stats.json` and a shard's safetensors header, read by
//! `verify` (in this process) and by the writer resuming the run (the `siphon-store-writer`
//! binary). Each must answer with a result or an error, never a panic.
//! `SIPHON_FUZZ_SECONDS` (default 2 per file) and `SIPHON_FUZZ_SEED` widen a run.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const RUN: &str = "run-a";

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// One to four edits of `bytes`, mostly in its first `hot` bytes.
fn mutate(rng: &mut fastrand::Rng, bytes: &[u8], hot: usize) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for _ in 0..rng.usize(1..=4) {
        if out.is_empty() {
            break;
        }
        let at = rng.usize(0..hot.clamp(1, out.len()));
        match rng.u8(0..5) {
            0 => out[at] ^= 1 << rng.u8(0..8),
            1 => out[at] = [b'"', b'{', b'}', b'-', b'9', 0, 0xff][rng.usize(0..7)],
            2 => out.truncate(at),
            3 => {
                let end = (at + rng.usize(1..32)).min(out.len());
                out.drain(at..end);
            }
            _ => {
                let end = (at + rng.usize(1..32)).min(out.len());
                let span = out[at..end].to_vec();
                out.splice(at..at, span);
            }
        }
    }
    out
}

#[test]
fn dataset_files_never_panic_a_reader() {
    let seconds: u64 = std::env::var("SIPHON_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2);
    let seed: u64 = std::env::var("SIPHON_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5105);
    let writer = env!("CARGO_BIN_EXE_siphon-store-writer");
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    let write = |out: &Path| {
        Command::new(writer)
            .args(["--output", &out.display().to_string(), "--run", RUN, "--machine", "1", "--host", "2", "--finalize"])
            .output()
            .unwrap()
    };
    assert!(write(&base).status.success());
    let host = "machine_001_host_02";
    let shard = std::fs::read(base.join(RUN).join(host).join("shard_000000.safetensors")).unwrap();
    let header = 8 + u64::from_le_bytes(shard[..8].try_into().unwrap()) as usize;
    let files = [
        (format!("{RUN}/run.json"), usize::MAX),
        (format!("{RUN}/{host}/manifest.jsonl"), usize::MAX),
        (format!("{RUN}/{host}/stats.json"), usize::MAX),
        (format!("{RUN}/{host}/shard_000000.safetensors"), header),
    ];
    let mut rng = fastrand::Rng::with_seed(seed);
    for (file, hot) in files {
        let original = std::fs::read(base.join(&file)).unwrap();
        let start = Instant::now();
        let mut n = 0;
        while start.elapsed() < Duration::from_secs(seconds) {
            let work = dir.path().join(format!("w{n}"));
            copy_dir(&base, &work);
            std::fs::write(work.join(&file), mutate(&mut rng, &original, hot)).unwrap();
            let url = work.display().to_string();
            let verified = catch_unwind(AssertUnwindSafe(|| {
                let _ = siphon_store::verify_run_blocking(&url, &[], RUN);
            }));
            assert!(verified.is_ok(), "{file}: verify panicked on mutation {n} (SIPHON_FUZZ_SEED={seed})");
            // Resuming reads the same files; every few inputs, as the process would.
            if n % 4 == 0 {
                let out = write(&work);
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(
                    out.status.code() != Some(101) && !stderr.contains("panicked"),
                    "{file}: resuming panicked on mutation {n} (SIPHON_FUZZ_SEED={seed}): {stderr}"
                );
            }
            std::fs::remove_dir_all(&work).unwrap();
            n += 1;
        }
        assert!(n > 4, "{file}: only {n} inputs tried");
        eprintln!("{file}: {n} mutated inputs, no panic");
    }
}
