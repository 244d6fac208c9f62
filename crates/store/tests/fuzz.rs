//! Every reader of a run directory, fed generated mutations of a real run (written by the
//! `siphon-store-writer` binary, with a sparse latents column and a mask): `run.json`, each
//! `manifest.jsonl` line, `stats.json` and a shard's safetensors header and latents tensors,
//! through their parsers directly (thousands of cases), through `verify_run` on whole
//! directories and through the writer resuming the run (`ShardWriter::open`, which reads the
//! manifest, the statistics and the last shard to find the next shard). Each must answer with a
//! value or an error that says what is wrong: never a panic, an allocation over the bound or a
//! hang ([`siphon_fuzz::check`]). `SIPHON_FUZZ_CASES` multiplies the case counts and
//! `SIPHON_FUZZ_SEED` changes the seed. Inputs that once broke a reader are kept below as
//! named tests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use siphon_fuzz::{Outcome, bytes, cases, check, json, outcome, quiet_panics};
use siphon_store::{
    HostId, ManifestLine, RunJson, RunStats, ShardWriter, StatsFile, StoreConfig, merge_run_stats, parse_manifest,
    parse_manifest_torn, summarize_shard,
};

#[global_allocator]
static ALLOC: siphon_fuzz::Bounded = siphon_fuzz::Bounded::new(512 << 20);

const RUN: &str = "run-a";
const HOST: HostId = HostId { machine: 1, host: 2 };

/// The valid run every input is made from, written once per test binary.
struct Base {
    /// The output root holding `{RUN}/...`.
    root: PathBuf,
    run_json: String,
    manifest: String,
    host_stats: String,
    run_stats: String,
    shards: Vec<Vec<u8>>,
}

impl Base {
    fn parsed_run_json(&self) -> RunJson {
        serde_json::from_str(&self.run_json).unwrap()
    }

    /// The header's length (8 + its JSON) of the first shard.
    fn header_len(&self) -> usize {
        8 + u64::from_le_bytes(self.shards[0][..8].try_into().unwrap()) as usize
    }
}

fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("store-fuzz-base-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let out = Command::new(env!("CARGO_BIN_EXE_siphon-store-writer"))
            .args(["--output", root.to_str().unwrap(), "--run", RUN, "--machine", "1", "--host", "2", "--finalize"])
            .args(["--batches", "6", "--batch", "2", "--seq", "16", "--d-model", "8", "--hooks", "2"])
            .args(["--latents", "24:4", "--keep-excluded", "--target-bytes", "3000"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let host = root.join(RUN).join(HOST.dir_name());
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap();
        let manifest = read(host.join("manifest.jsonl"));
        let lines = parse_manifest("m", &manifest).unwrap();
        assert!(lines.len() >= 3, "several shards: {}", lines.len());
        let base = Base {
            run_json: read(root.join(RUN).join("run.json")),
            host_stats: read(host.join("stats.json")),
            run_stats: read(root.join(RUN).join("stats.json")),
            shards: lines.iter().map(|l| std::fs::read(host.join(&l.shard)).unwrap()).collect(),
            manifest,
            root,
        };
        let report = siphon_store::verify_run_blocking(base.root.to_str().unwrap(), &[], RUN).unwrap();
        assert!(report.is_ok(), "{:?}", report.all_problems());
        base
    })
}

/// A copy of the base run in a fresh directory, with `file` (relative to the run directory)
/// replaced by `bytes`.
fn mutated_copy(file: &str, bytes: &[u8]) -> tempfile::TempDir {
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
    let work = tempfile::tempdir().unwrap();
    copy_dir(&base().root.join(RUN), &work.path().join(RUN));
    std::fs::write(work.path().join(RUN).join(file), bytes).unwrap();
    work
}

/// A reader's result with its error as text.
fn msg<T, E: std::fmt::Display>(result: Result<T, E>) -> Result<T, String> {
    result.map_err(|e| e.to_string())
}

fn host_file(name: &str) -> String {
    format!("{}/{name}", HOST.dir_name())
}

/// `verify_run` on a whole directory: `Ok` for a clean report, else its problems.
fn verify(root: &Path) -> Outcome {
    let report = msg(siphon_store::verify_run_blocking(root.to_str().unwrap(), &[], RUN))?;
    if report.is_ok() { Ok(()) } else { Err(report.all_problems().join("; ")) }
}

/// The writer resuming the run, as the same command run again would: it reads run.json, the
/// manifest, the statistics and the last committed shard, and says where it would continue.
fn resume(root: &Path) -> Outcome {
    let run_json = base().parsed_run_json();
    let mut config = StoreConfig::new(root.to_str().unwrap(), RUN, HOST);
    config.format = run_json.shard_format.clone();
    let writer = msg(ShardWriter::open(config, run_json.descriptor.clone()))?;
    let point = writer.resume_point().clone();
    outcome(writer.stop())?;
    if point.next_shard > base().shards.len() as u64 {
        return Err(format!("resumes at shard {} of {}", point.next_shard, base().shards.len()));
    }
    Ok(())
}

/// Reads `run.json` as verify and resume do: the document, its format tag, one shape per hook.
fn read_run_json(text: &[u8]) -> Outcome {
    let parsed: RunJson = msg(serde_json::from_slice(text))?;
    outcome(parsed.format_version("run.json"))?;
    let (hooks, shapes) = (&parsed.descriptor.hooks, &parsed.descriptor.hook_shapes);
    if !shapes.is_empty() && shapes.len() != hooks.len() {
        return Err(format!("{} shapes for {} hooks", shapes.len(), hooks.len()));
    }
    Ok(())
}

#[test]
fn run_json_parses_or_names_what_is_wrong() {
    quiet_panics();
    let base = base();
    check("run.json (fields)", cases(1500), json::mutations(&base.run_json), |m| read_run_json(m.text.as_bytes()));
    check("run.json (bytes)", cases(500), bytes::mutations(base.run_json.as_bytes(), 256), |m| read_run_json(m));
}

/// The manifest with line `line` replaced (each line is read on its own).
fn with_line(manifest: &str, line: usize, text: &str) -> String {
    manifest.lines().enumerate().map(|(i, l)| format!("{}\n", if i == line { text } else { l })).collect()
}

fn read_manifest(text: &[u8]) -> Outcome {
    let text = msg(std::str::from_utf8(text))?;
    let (lines, _torn) = msg(parse_manifest_torn("manifest.jsonl", text))?;
    for line in &lines {
        // What verify and resume do with each line: its checksum against a shard's bytes.
        let _ = line.checksum();
        let _ = line.check(&base().shards[0]);
    }
    Ok(())
}

#[test]
fn manifest_lines_parse_or_name_what_is_wrong() {
    quiet_panics();
    let base = base();
    let lines: Vec<&str> = base.manifest.lines().collect();
    for (i, name) in [(0, "manifest.jsonl line 1 (fields)"), (lines.len() - 1, "manifest.jsonl last line (fields)")] {
        check(name, cases(700), json::mutations(lines[i]), |m| {
            read_manifest(with_line(&base.manifest, i, &m.text).as_bytes())
        });
    }
    check("manifest.jsonl (bytes)", cases(600), bytes::mutations(base.manifest.as_bytes(), base.manifest.len()), |m| {
        read_manifest(m)
    });
}

/// Reads `stats.json` as resume and finalize do: the file, its running state (arrays of
/// matching lengths), merged with the statistics of the run and with itself.
fn read_stats(text: &[u8]) -> Outcome {
    let file: StatsFile = msg(serde_json::from_slice(text))?;
    let stats = file.to_run_stats()?;
    let base: StatsFile = serde_json::from_str(&base().host_stats).unwrap();
    let mut merged: RunStats = base.to_run_stats().unwrap();
    outcome(merge_run_stats(&mut merged, &stats))?;
    let mut doubled = stats.clone();
    outcome(merge_run_stats(&mut doubled, &stats))?;
    Ok(())
}

#[test]
fn stats_json_parses_or_names_what_is_wrong() {
    quiet_panics();
    let base = base();
    check("host stats.json (fields)", cases(1200), json::mutations(&base.host_stats), |m| {
        read_stats(m.text.as_bytes())
    });
    check("run stats.json (fields)", cases(400), json::mutations(&base.run_stats), |m| read_stats(m.text.as_bytes()));
    check("stats.json (bytes)", cases(400), bytes::mutations(base.host_stats.as_bytes(), 512), |m| read_stats(m));
}

fn read_shard(bytes: &[u8]) -> Outcome {
    let run = base().parsed_run_json();
    let d = &run.descriptor;
    outcome(summarize_shard("shard_000000.safetensors", bytes, &d.hooks, &d.hook_shapes, &d.latents, &d.outputs))
}

#[test]
fn shard_headers_parse_or_name_what_is_wrong() {
    quiet_panics();
    let base = base();
    let shard = &base.shards[0];
    check("shard header (bytes)", cases(2000), bytes::mutations(shard, base.header_len()), |m| read_shard(m));
    // The header's JSON, fields removed and numbers changed, with its length prefix fixed up.
    let header = std::str::from_utf8(&shard[8..base.header_len()]).unwrap().trim_end();
    let data = &shard[base.header_len()..];
    check("shard header (fields)", cases(1200), json::mutations(header), |m| {
        let mut file = (m.text.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(m.text.as_bytes());
        file.extend_from_slice(data);
        read_shard(&file)
    });
}

#[test]
fn sparse_latents_columns_read_or_name_what_is_wrong() {
    quiet_panics();
    let base = base();
    let shard = &base.shards[0];
    let st = safetensors::SafeTensors::deserialize(shard).unwrap();
    let column = &base.parsed_run_json().descriptor.latents[0];
    // The CSR tensors' bytes (offsets, latent indices, values), mutated in place.
    let spans: Vec<(usize, usize)> = column
        .tensor_names()
        .iter()
        .map(|name| {
            let data = st.tensor(name).unwrap().data();
            let start = data.as_ptr() as usize - shard.as_ptr() as usize;
            (start, start + data.len())
        })
        .collect();
    let (start, end) = (spans.iter().map(|s| s.0).min().unwrap(), spans.iter().map(|s| s.1).max().unwrap());
    let region = &shard[start..end];
    check("latents column (bytes)", cases(1000), bytes::mutations(region, region.len()), |m| {
        let mut file = shard[..start].to_vec();
        file.extend_from_slice(m);
        file.extend_from_slice(&shard[end..]);
        read_shard(&file)
    });
}

#[test]
fn run_directories_verify_or_report_their_problems() {
    quiet_panics();
    let base = base();
    let files: [(String, Vec<u8>, usize); 4] = [
        ("run.json".into(), base.run_json.clone().into_bytes(), 256),
        (host_file("manifest.jsonl"), base.manifest.clone().into_bytes(), usize::MAX),
        (host_file("stats.json"), base.host_stats.clone().into_bytes(), 512),
        (host_file("shard_000000.safetensors"), base.shards[0].clone(), base.header_len()),
    ];
    for (file, valid, hot) in &files {
        check(&format!("verify, {file} (bytes)"), cases(40), bytes::mutations(valid, *hot), |m| {
            verify(mutated_copy(file, m).path())
        });
    }
    for (file, valid, _) in &files[..3] {
        let text = std::str::from_utf8(valid).unwrap();
        let text = if file.ends_with(".jsonl") { text.lines().last().unwrap() } else { text };
        check(&format!("verify, {file} (fields)"), cases(30), json::mutations(text), |m| {
            let whole = if file.ends_with(".jsonl") {
                with_line(&base.manifest, base.manifest.lines().count() - 1, &m.text)
            } else {
                m.text.clone()
            };
            verify(mutated_copy(file, whole.as_bytes()).path())
        });
    }
}

#[test]
fn resuming_reads_the_run_or_refuses_it() {
    quiet_panics();
    let base = base();
    let last = base.shards.len() - 1;
    let last_shard = host_file(&siphon_store::shard_name(last as u64));
    let files: [(String, Vec<u8>, usize); 3] = [
        (host_file("manifest.jsonl"), base.manifest.clone().into_bytes(), usize::MAX),
        (host_file("stats.json"), base.host_stats.clone().into_bytes(), 512),
        (last_shard, base.shards[last].clone(), usize::MAX),
    ];
    for (file, valid, hot) in &files {
        check(&format!("resume, {file} (bytes)"), cases(40), bytes::mutations(valid, *hot), |m| {
            resume(mutated_copy(file, m).path())
        });
    }
    let stats = &files[1].0;
    check("resume, stats.json (fields)", cases(40), json::mutations(&base.host_stats), |m| {
        resume(mutated_copy(stats, m.text.as_bytes()).path())
    });
    let line = base.manifest.lines().count() - 1;
    check(
        "resume, manifest.jsonl last line (fields)",
        cases(40),
        json::mutations(base.manifest.lines().last().unwrap()),
        |m| {
            resume(
                mutated_copy(&host_file("manifest.jsonl"), with_line(&base.manifest, line, &m.text).as_bytes()).path(),
            )
        },
    );
}

#[test]
fn the_unmutated_run_is_read_by_every_reader() {
    let base = base();
    read_run_json(base.run_json.as_bytes()).unwrap();
    read_manifest(base.manifest.as_bytes()).unwrap();
    read_stats(base.host_stats.as_bytes()).unwrap();
    read_stats(base.run_stats.as_bytes()).unwrap();
    for shard in &base.shards {
        read_shard(shard).unwrap();
    }
    let copy = mutated_copy("run.json", base.run_json.as_bytes());
    verify(copy.path()).unwrap();
    resume(copy.path()).unwrap();
    let _: Vec<ManifestLine> = parse_manifest("m", &base.manifest).unwrap();
}

// Inputs the generated cases found (or that were reported), kept as they broke a reader.

/// `stats.json` with a hook's count at 2^63: merging it with more statistics overflowed the
/// count (a panic); now an error naming both counts.
#[test]
fn a_count_that_overflows_when_merged_is_an_error() {
    let mut doc: serde_json::Value = serde_json::from_str(&base().host_stats).unwrap();
    doc["hooks"]["blocks.1.hook_resid_post"]["count"] = serde_json::json!(9223372036854775808u64);
    let err = read_stats(doc.to_string().as_bytes()).unwrap_err();
    assert!(err.contains("overflows"), "{err}");
}

/// `stats.json` whose `m2` is shorter than its `mean`: merging indexed past its end (a panic
/// on resume); now an error naming the hook and both lengths.
#[test]
fn statistics_arrays_of_different_lengths_are_an_error() {
    let mut doc: serde_json::Value = serde_json::from_str(&base().host_stats).unwrap();
    doc["hooks"]["blocks.0.hook_resid_post"]["m2"] = serde_json::json!([0.0]);
    let err = read_stats(doc.to_string().as_bytes()).unwrap_err();
    assert!(err.contains("blocks.0.hook_resid_post") && err.contains("m2"), "{err}");
    let dir = mutated_copy(&host_file("stats.json"), doc.to_string().as_bytes());
    let err = resume(dir.path()).unwrap_err();
    assert!(err.contains("stats.json") && err.contains("m2"), "{err}");
}

/// A manifest line whose `bytes` is u64::MAX: verify's byte total overflowed (a panic).
#[test]
fn a_manifest_size_of_u64_max_is_reported_not_added() {
    let last = base().manifest.lines().count() - 1;
    let mut line: serde_json::Value = serde_json::from_str(base().manifest.lines().last().unwrap()).unwrap();
    line["bytes"] = serde_json::json!(u64::MAX);
    let dir =
        mutated_copy(&host_file("manifest.jsonl"), with_line(&base().manifest, last, &line.to_string()).as_bytes());
    let err = verify(dir.path()).unwrap_err();
    assert!(err.contains("manifest says 18446744073709551615"), "{err}");
}

/// run.json giving a latents column 2^32 latents: verify allocated statistics for all of them
/// (32 GiB, an abort); now a problem naming the limit.
#[test]
fn a_latents_width_past_the_limit_is_a_problem() {
    let mut doc: serde_json::Value = serde_json::from_str(&base().run_json).unwrap();
    doc["latents"][0]["width"] = serde_json::json!(1u64 << 32);
    let dir = mutated_copy("run.json", doc.to_string().as_bytes());
    let err = verify(dir.path()).unwrap_err();
    assert!(err.contains("more than the 67108864"), "{err}");
}

/// run.json's cap lowered below what its shards' tokens fire: verified clean before (found by a
/// property "a run.json describing another run does not verify"; the cap was never checked).
#[test]
fn a_cap_below_the_shards_firings_is_a_problem() {
    let mut doc: serde_json::Value = serde_json::from_str(&base().run_json).unwrap();
    doc["latents"][0]["cap"] = serde_json::json!(0);
    let dir = mutated_copy("run.json", doc.to_string().as_bytes());
    let err = verify(dir.path()).unwrap_err();
    assert!(err.contains("more than the run's cap of 0"), "{err}");
}

/// A shard whose mask is shorter than its rows: the statistics indexed past it (a panic).
#[test]
fn a_mask_of_the_wrong_length_is_an_error() {
    let shard = &base().shards[0];
    let header_len = base().header_len();
    let mut header: serde_json::Value = serde_json::from_slice(&shard[8..header_len]).unwrap();
    let tokens = header["token_ids"]["shape"][0].as_u64().unwrap();
    let [start, end] = [0, 1].map(|i| header["mask"]["data_offsets"][i].as_u64().unwrap());
    assert_eq!(end - start, tokens);
    // The mask claims one row fewer; the byte it gave up becomes padding of the data section.
    header["mask"]["shape"] = serde_json::json!([tokens - 1]);
    header["mask"]["data_offsets"] = serde_json::json!([start, end - 1]);
    let text = header.to_string();
    let mut file = (text.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(text.as_bytes());
    file.extend_from_slice(&shard[header_len..shard.len() - 1]);
    let err = read_shard(&file).unwrap_err();
    assert!(err.contains("mask") || err.contains("Metadata"), "{err}");
}

/// Reported: a committed shard with bytes flipped (same size) was accepted on resume, which
/// checked only its size. The last committed shard (and every shard whose statistics are
/// rebuilt) is now checked against its manifest CRC.
#[test]
fn resuming_refuses_a_committed_shard_with_flipped_bytes() {
    let last = base().shards.len() - 1;
    let mut shard = base().shards[last].clone();
    let at = shard.len() - 3;
    shard[at] ^= 0x10;
    let dir = mutated_copy(&host_file(&siphon_store::shard_name(last as u64)), &shard);
    let err = resume(dir.path()).unwrap_err();
    assert!(err.contains("crc32c") && err.contains("the manifest says"), "{err}");
}

/// Reported twice: statistics of NaN or infinite activations were first written as `null`,
/// which did not read back (the same command never resumed), then as the strings `"NaN"`,
/// `"Infinity"`, which JSON readers take as text. They are `null` now, read back as NaN, with
/// the hook's count of such values; the strings of files written in between still read.
#[test]
fn non_finite_statistics_are_null_read_back_and_old_strings_read() {
    let mut doc: serde_json::Value = serde_json::from_str(&base().host_stats).unwrap();
    let hook = &mut doc["hooks"]["blocks.0.hook_resid_post"];
    hook["mean"][0] = serde_json::json!("NaN");
    hook["max"][1] = serde_json::json!("Infinity");
    hook["min"][1] = serde_json::json!("-Infinity");
    hook["mean_norm"] = serde_json::Value::Null;
    hook["non_finite"] = serde_json::json!(3);
    let file: StatsFile = serde_json::from_value(doc).unwrap();
    let h = &file.hooks["blocks.0.hook_resid_post"];
    assert!(
        h.mean[0].is_nan()
            && h.max.as_ref().unwrap()[1] == f64::INFINITY
            && h.min.as_ref().unwrap()[1] == f64::NEG_INFINITY
            && h.mean_norm.is_nan()
            && h.non_finite == 3
    );
    let text = serde_json::to_string(&file).unwrap();
    let written: serde_json::Value = serde_json::from_str(&text).unwrap();
    let hook = &written["hooks"]["blocks.0.hook_resid_post"];
    assert!(hook["mean"][0].is_null() && hook["max"][1].is_null() && hook["min"][1].is_null(), "{text}");
    assert!(hook["mean_norm"].is_null() && hook["non_finite"] == 3, "{text}");
    assert!(!text.contains("NaN") && !text.contains("Infinity"), "{text}");
    let back: StatsFile = serde_json::from_str(&text).unwrap();
    assert_eq!(serde_json::to_string(&back).unwrap(), text);
    read_stats(text.as_bytes()).unwrap();
}
