//! One contract suite for the store, run against local disk and a real S3 server (moto) on
//! 127.0.0.1; GCS reads against fake-gcs-server; the Python one-liner against a written shard.

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;

use object_store::ObjectStoreExt;
use siphon_store::synthetic::SyntheticSpec;
use siphon_store::{
    DType, HostId, ManifestLine, RunDescriptor, ShardWriter, ShuffleConfig, StoreConfig, StoreError, StoreLocation,
};
use support::{Backend, Fault, MotoS3};

const RUN: &str = "run-a";
const HOST: HostId = HostId { machine: 1, host: 2 };

/// 20 batches of 4 x 64 tokens, 2 hooks of width 512 in f32: ~1 MB per batch, so 6 MiB shards
/// hold 7 batches and are uploaded as two 5 MiB multipart parts.
fn spec() -> SyntheticSpec {
    SyntheticSpec::new(2, 4, 64, 512)
}

fn descriptor(spec: &SyntheticSpec) -> RunDescriptor {
    RunDescriptor {
        model: serde_json::json!({"id": "synthetic"}),
        hooks: spec.hooks.clone(),
        hook_shapes: spec.shapes.clone(),
        latents: spec.latents.clone(),
        outputs: spec.outputs.clone(),
        mesh: serde_json::json!({"data": 1}),
        partition: serde_json::json!({"hosts": 1}),
        config: serde_json::json!({"seq": spec.seq}),
    }
}

fn config(backend: &Backend, prefix: &str) -> StoreConfig {
    let mut config = StoreConfig::new(backend.url(prefix), RUN, HOST);
    config.options = backend.options.clone();
    config.format.dtype = DType::F32;
    config.format.target_shard_bytes = 6 << 20;
    config.upload.part_bytes = 5 << 20;
    config
}

fn write_all(config: StoreConfig, spec: &SyntheticSpec, batches: u64) -> siphon_store::HostSummary {
    let mut writer = ShardWriter::open(config, descriptor(spec)).unwrap();
    assert_eq!(writer.resume_point().next_sample, 0);
    for k in 0..batches {
        writer.push(spec.batch(k)).unwrap();
    }
    writer.finish().unwrap()
}

fn location(backend: &Backend, prefix: &str) -> StoreLocation {
    StoreLocation::open(&backend.url(prefix), &backend.options).unwrap()
}

fn block_on<T>(f: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

fn read_manifest(backend: &Backend, prefix: &str) -> Vec<ManifestLine> {
    let loc = location(backend, prefix);
    block_on(async {
        let bytes = loc.store().get(&loc.manifest(RUN, HOST)).await.unwrap().bytes().await.unwrap();
        siphon_store::parse_manifest("manifest", std::str::from_utf8(&bytes).unwrap()).unwrap()
    })
}

fn read_object(backend: &Backend, prefix: &str, name: &str) -> Vec<u8> {
    let loc = location(backend, prefix);
    block_on(async {
        loc.store().get(&loc.host_dir(RUN, HOST).join(name)).await.unwrap().bytes().await.unwrap().to_vec()
    })
}

fn expected_included(spec: &SyntheticSpec, batches: u64) -> u64 {
    let samples = batches * spec.batch as u64;
    (0..samples).map(|s| (0..spec.seq).filter(|&t| spec.keep(s, t)).count() as u64).sum()
}

fn verify_ok(backend: &Backend, prefix: &str) -> siphon_store::VerifyReport {
    siphon_store::finalize_run(&backend.url(prefix), &backend.options, RUN).unwrap();
    let report = siphon_store::verify_run_blocking(&backend.url(prefix), &backend.options, RUN).unwrap();
    assert!(report.is_ok(), "{}: {:?}", backend.name, report.all_problems());
    report
}

// ---------------------------------------------------------------- the contract suite

/// Shards hold exactly the included tokens, in order, with their values; manifest, stats and
/// verify agree.
fn suite_write_read_verify(backend: &Backend) {
    let spec = spec();
    let summary = write_all(config(backend, "plain"), &spec, 20);
    let included = expected_included(&spec, 20);
    assert_eq!(summary.tokens, included);
    assert_eq!(summary.shards, 3, "7 + 7 + 6 batches");
    assert_eq!(summary.samples_end, 80);

    let report = verify_ok(backend, "plain");
    assert_eq!(report.tokens, included);
    assert!(report.hosts[0].uncommitted_objects.is_empty());

    let lines = read_manifest(backend, "plain");
    assert!(lines.iter().take(2).all(|l| l.bytes > (5 << 20)), "the first shards are multipart-sized");
    // The checksums `siphon inspect` prints, recomputed from the objects themselves: sha256
    // over the shards' CRC32Cs per host, then over `{host dir} {that}` lines.
    use sha2::{Digest, Sha256};
    let sha = |bytes: &[u8]| hex::encode(Sha256::digest(bytes));
    let shard_shas: String = lines
        .iter()
        .map(|l| format!("crc32c {:08x}\n", crc32c::crc32c(&read_object(backend, "plain", &l.shard))))
        .collect();
    let host_sha = sha(shard_shas.as_bytes());
    assert_eq!(report.hosts[0].shards_sha256, host_sha);
    assert_eq!(report.shards_sha256, sha(format!("{} {host_sha}\n", HOST.dir_name()).as_bytes()));
    let loc = location(backend, "plain");
    let stats = block_on(async { loc.store().get(&loc.run_stats(RUN)).await.unwrap().bytes().await.unwrap() });
    assert_eq!(report.stats_sha256, Some(sha(&stats)));

    let bytes = read_object(backend, "plain", &lines[1].shard);
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let meta = safetensors::SafeTensors::read_metadata(&bytes).unwrap().1;
    let meta = meta.metadata().clone().unwrap();
    assert_eq!(meta["shard_index"], "1");
    assert_eq!((meta["machine"].as_str(), meta["host"].as_str()), ("1", "2"));
    assert_eq!(meta["sample_start"], lines[1].samples[0].to_string());
    assert_eq!(meta["model"], "synthetic");
    assert_eq!(meta["format"], siphon_store::FORMAT_TAG);
    assert_eq!(siphon_store::FORMAT_TAG, "siphon-activations/2");
    // Rebuild the expected rows of shard 1 from the generator.
    let mut expected = Vec::new();
    for sample in lines[1].samples[0]..lines[1].samples[1] {
        for t in (0..spec.seq).filter(|&t| spec.keep(sample, t)) {
            expected.push((sample, t));
        }
    }
    let token_ids: Vec<i32> =
        st.tensor("token_ids").unwrap().data().chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
    let sample_index: Vec<i64> = st
        .tensor("sample_index")
        .unwrap()
        .data()
        .chunks(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(token_ids.len(), expected.len());
    let hook1 = st.tensor(&spec.hooks[1]).unwrap();
    let width = spec.width(1);
    assert_eq!(hook1.shape(), [expected.len(), width]);
    for (row, &(sample, t)) in expected.iter().enumerate() {
        assert_eq!(token_ids[row], SyntheticSpec::token_id(sample, t));
        assert_eq!(sample_index[row], sample as i64);
        for d in [0, 7, width - 1] {
            let off = (row * width + d) * 4;
            let got = f32::from_le_bytes(hook1.data()[off..off + 4].try_into().unwrap());
            assert_eq!(got, SyntheticSpec::value(sample, t, 1, d));
        }
    }
    assert!(st.tensor("mask").is_err(), "no mask unless asked");

    // Merged statistics equal a direct computation over every included token.
    let loc = location(backend, "plain");
    let stats: siphon_store::StatsFile = block_on(async {
        serde_json::from_slice(&loc.store().get(&loc.run_stats(RUN)).await.unwrap().bytes().await.unwrap()).unwrap()
    });
    let hook0 = &stats.hooks[&spec.hooks[0]];
    assert_eq!(hook0.count, included);
    let spec = &spec;
    for d in [0, 100] {
        let values: Vec<f64> = (0..80u64)
            .flat_map(|s| {
                (0..spec.seq).filter(move |&t| spec.keep(s, t)).map(move |t| SyntheticSpec::value(s, t, 0, d) as f64)
            })
            .collect();
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / values.len() as f64;
        assert!((hook0.mean[d] - mean).abs() < 1e-9, "mean {} vs {mean}", hook0.mean[d]);
        assert!((hook0.variance[d] - var).abs() < 1e-8);
    }
    assert!(hook0.mean_norm > 0.0);
}

/// Kill the writer process at `failpoint` while it writes shard 1, restart it, and compare
/// with an uninterrupted run: same shards byte for byte, no gap, no duplicate, no leftovers.
fn suite_crash_and_resume(backend: &Backend, failpoint: &str, reference_prefix: &str) {
    let writer = env!("CARGO_BIN_EXE_siphon-store-writer");
    let prefix = format!("crash-{failpoint}");
    let args = |prefix: &str| {
        let mut args = vec!["--output".to_string(), backend.url(prefix), "--run".into(), RUN.into()];
        args.extend(["--machine", "1", "--host", "2", "--finalize"].map(String::from));
        // A dictionary's latents beside the hooks: their CSR tensors and statistics resume too.
        args.extend(["--latents", "4096:2"].map(String::from));
        args.extend(backend.option_args());
        args
    };
    if read_manifest_opt(backend, reference_prefix).is_none() {
        let out = Command::new(writer).args(args(reference_prefix)).output().unwrap();
        assert!(out.status.success(), "reference run: {}", String::from_utf8_lossy(&out.stderr));
    }
    let crashed = Command::new(writer)
        .args(args(&prefix))
        .env("SIPHON_FAILPOINT", failpoint)
        .env("SIPHON_FAILPOINT_SHARD", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&crashed.stderr);
    assert!(
        !crashed.status.success() && stderr.contains(&format!("failpoint {failpoint}")),
        "{}: {stderr}",
        backend.name
    );
    let committed_before = read_manifest_opt(backend, &prefix).unwrap_or_default();
    // Shard 0 and 1 upload concurrently, so a crash before shard 1's upload may come before
    // shard 0's commit; after the upload of shard 1, shard 0 is committed (commits are ordered
    // but the crash at shard 1's commit point comes after shard 0's commit).
    assert!(committed_before.len() <= 1, "{failpoint}: shard 1 must not be committed: {committed_before:?}");
    if failpoint == "after_upload_before_manifest" {
        assert_eq!(committed_before.len(), 1, "shard 0 commits before shard 1's commit point");
    }

    let resumed = Command::new(writer).args(args(&prefix)).output().unwrap();
    assert!(resumed.status.success(), "{}: resume: {}", backend.name, String::from_utf8_lossy(&resumed.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&resumed.stdout).unwrap();
    assert_eq!(
        summary["resumed_at_batch"],
        7 * committed_before.len() as u64,
        "resumed after the last committed shard"
    );

    let reference = read_manifest(backend, reference_prefix);
    let lines = read_manifest(backend, &prefix);
    assert_eq!(lines, reference, "{}: {failpoint}: resumed dataset differs from the uninterrupted one", backend.name);
    // Statistics too, to the bit: the host's and the run's stats.json.
    let host_stats: fn(&StoreLocation) -> _ = |l| l.host_stats(RUN, HOST);
    let run_stats: fn(&StoreLocation) -> _ = |l| l.run_stats(RUN);
    for (what, path) in [("host", host_stats), ("run", run_stats)] {
        let bytes = |prefix: &str| {
            let loc = location(backend, prefix);
            block_on(async { loc.store().get(&path(&loc)).await.unwrap().bytes().await.unwrap() })
        };
        assert!(
            bytes(&prefix) == bytes(reference_prefix),
            "{}: {failpoint}: the resumed run's {what} stats.json differs from the uninterrupted run's",
            backend.name
        );
    }
    let report = verify_ok(backend, &prefix);
    assert!(report.hosts[0].uncommitted_objects.is_empty(), "{:?}", report.hosts[0].uncommitted_objects);
    assert_eq!(report.tokens, expected_included(&spec(), 20));
    if let Some(dir) = location(backend, &prefix).local_dir() {
        let host_dir = dir.join(RUN).join(HOST.dir_name());
        let staged: Vec<_> = std::fs::read_dir(host_dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains('#'))
            .collect();
        assert!(staged.is_empty(), "staged multipart files left: {staged:?}");
    }
}

fn read_manifest_opt(backend: &Backend, prefix: &str) -> Option<Vec<ManifestLine>> {
    let loc = location(backend, prefix);
    block_on(async {
        let bytes = loc.store().get(&loc.manifest(RUN, HOST)).await.ok()?.bytes().await.ok()?;
        Some(siphon_store::parse_manifest("manifest", std::str::from_utf8(&bytes).unwrap()).unwrap())
    })
}

/// Reopening with a different dtype or hooks is refused with the differing fields named.
fn suite_refuses_other_config(backend: &Backend) {
    let spec = SyntheticSpec::new(1, 2, 8, 16);
    write_all(config(backend, "mismatch"), &spec, 2);
    let mut other = config(backend, "mismatch");
    other.format.dtype = DType::Bf16;
    let mut desc = descriptor(&spec);
    desc.hooks = vec!["blocks.9.hook_resid_post".into()];
    let err = ShardWriter::open(other, desc).err().expect("must refuse");
    let message = err.to_string();
    assert!(matches!(err, StoreError::RunMismatch { .. }), "{message}");
    assert!(
        message.contains("shard_format.dtype (stored \"f32\", this run \"bf16\")") && message.contains("hooks"),
        "{message}"
    );
    // The same config resumes at the end.
    let writer = ShardWriter::open(config(backend, "mismatch"), descriptor(&spec)).unwrap();
    assert_eq!(writer.resume_point().next_sample, 4);
    assert_eq!(writer.resume_point().data_position, Some(serde_json::json!({"batch": 2})));
}

/// A shuffled, masked bf16 run holds the same tokens as the plain order, is reproducible, and
/// its mask marks exactly the excluded tokens.
fn suite_shuffle_and_mask(backend: &Backend) {
    let spec = SyntheticSpec::new(1, 4, 16, 64);
    let shuffled = |prefix: &str| {
        let mut c = config(backend, prefix);
        c.format.dtype = DType::Bf16;
        c.format.keep_excluded = true;
        c.format.shuffle = Some(ShuffleConfig { seed: 7, window_batches: 3 });
        c.format.target_shard_bytes = 40_000;
        write_all(c, &spec, 10)
    };
    let summary = shuffled("shuffle-a");
    shuffled("shuffle-b");
    assert_eq!(summary.tokens, 10 * 4 * 16, "excluded tokens are kept");
    assert_eq!(summary.included_tokens, expected_included(&spec, 10));
    verify_ok(backend, "shuffle-a");
    let (a, b) = (read_manifest(backend, "shuffle-a"), read_manifest(backend, "shuffle-b"));
    assert_eq!(a, b, "same seed, same shards");
    let mut rows = BTreeMap::new();
    let mut in_order = true;
    for line in &a {
        assert_eq!(
            (line.samples[1] - line.samples[0]) % 12,
            if line.index + 1 == a.len() as u64 { line.samples[1] % 12 } else { 0 },
            "whole windows"
        );
        let bytes = read_object(backend, "shuffle-a", &line.shard);
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let samples: Vec<i64> = st
            .tensor("sample_index")
            .unwrap()
            .data()
            .chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let tokens: Vec<i32> = st
            .tensor("token_ids")
            .unwrap()
            .data()
            .chunks(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let mask = st.tensor("mask").unwrap().data().to_vec();
        let act = st.tensor(&spec.hooks[0]).unwrap();
        assert_eq!(act.dtype(), safetensors::Dtype::BF16);
        in_order &= samples.windows(2).all(|w| w[0] <= w[1]);
        for (row, (&s, &tok)) in samples.iter().zip(&tokens).enumerate() {
            let t = (0..spec.seq)
                .find(|&t| SyntheticSpec::token_id(s as u64, t) == tok && !rows.contains_key(&(s, t)))
                .unwrap();
            assert_eq!(mask[row] == 1, spec.keep(s as u64, t), "mask of sample {s} token {t}");
            let v = half::bf16::from_le_bytes(act.data()[row * 128 + 6..row * 128 + 8].try_into().unwrap()).to_f32();
            assert_eq!(v, SyntheticSpec::value(s as u64, t, 0, 3), "bf16 holds the value exactly");
            rows.insert((s, t), ());
        }
    }
    assert_eq!(rows.len(), 10 * 4 * 16, "every token exactly once");
    assert!(!in_order, "tokens are shuffled");
}

/// A stopped writer (a preempted host) commits the shards its batches filled and drops the
/// partial one; resuming after it gives the uninterrupted run's manifest.
fn suite_stop_and_resume(backend: &Backend) {
    let spec = spec();
    write_all(config(backend, "stop-reference"), &spec, 20);
    let mut writer = ShardWriter::open(config(backend, "stop"), descriptor(&spec)).unwrap();
    // 10 batches: shard 0 (batches 0..7) is whole, batches 7..10 are not a shard yet.
    for k in 0..10 {
        writer.push(spec.batch(k)).unwrap();
    }
    let summary = writer.stop().unwrap();
    assert_eq!((summary.shards, summary.samples_end), (1, 7 * spec.batch as u64));
    assert_eq!(read_manifest(backend, "stop").len(), 1);

    let mut writer = ShardWriter::open(config(backend, "stop"), descriptor(&spec)).unwrap();
    assert_eq!(writer.resume_point().next_sample, 7 * spec.batch as u64);
    for k in 7..20 {
        writer.push(spec.batch(k)).unwrap();
    }
    writer.finish().unwrap();
    assert_eq!(read_manifest(backend, "stop"), read_manifest(backend, "stop-reference"));
}

/// A host that commits no shard (no unit of the corpus was its) still leaves an empty
/// manifest, so that its directory stands beside the others' and verify counts it.
fn suite_a_host_without_a_shard(backend: &Backend) {
    let spec = spec();
    write_all(config(backend, "idle"), &spec, 3);
    let other = HostId { machine: 1, host: 3 };
    let mut idle = config(backend, "idle");
    idle.host = other;
    let summary = write_all(idle, &spec, 0);
    assert_eq!((summary.shards, summary.tokens), (0, 0));
    let report = verify_ok(backend, "idle");
    let hosts: Vec<(HostId, u64)> = report.hosts.iter().map(|h| (h.host, h.shards)).collect();
    assert_eq!(hosts, [(HOST, 1), (other, 0)]);
}

fn run_suite(backend: &Backend) {
    suite_write_read_verify(backend);
    suite_stop_and_resume(backend);
    suite_a_host_without_a_shard(backend);
    suite_refuses_other_config(backend);
    suite_shuffle_and_mask(backend);
    for failpoint in ["before_upload", "mid_upload", "after_upload_before_manifest"] {
        suite_crash_and_resume(backend, failpoint, "reference");
    }
}

// ---------------------------------------------------------------- backends

#[test]
fn contract_local_disk() {
    let dir = tempfile::tempdir().unwrap();
    run_suite(&Backend::local(dir.path()));
}

#[test]
fn contract_s3_moto() {
    let Some(python) = support::test_python("contract_s3_moto") else {
        return;
    };
    let server = MotoS3::start(&python, "siphon-test");
    run_suite(&server.backend);
}

/// The S3 suite again, through a proxy that fails a third of the requests before they reach
/// the server: 503, 500 and 429 answers, dropped connections, stalls. Uploads retry with
/// backoff; the datasets, manifests and statistics come out as without faults, and nothing
/// uncommitted is left.
#[test]
fn contract_s3_through_faults() {
    let Some(python) = support::test_python("contract_s3_through_faults") else {
        return;
    };
    let server = MotoS3::start(&python, "siphon-faults");
    let (proxy, backend) = server.behind_proxy(|n| match n % 9 {
        1 => Fault::Status(503),
        4 => Fault::Status(500),
        5 => Fault::Status(429),
        7 => Fault::Reset,
        8 if n % 27 == 8 => Fault::Stall(std::time::Duration::from_millis(1500)),
        _ => Fault::Pass,
    });
    run_suite(&backend);
    let faults = proxy.faults.load(std::sync::atomic::Ordering::Relaxed);
    assert!(faults >= 20, "only {faults} faults injected");
}

/// What [`a_store_that_stays_down_fails_within_the_store_timeout`]'s proxy does now.
static STORE_STATE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(UP);
const UP: u8 = 0;
const DOWN: u8 = 1;
const STALLED: u8 = 2;

/// A store that answers 503 to everything, then one that accepts connections and never
/// answers: each time the writer fails within the store timeout (plus a little) with an error
/// that says so, its manifest names only complete shards, and once the store is back the same
/// writer resumes to the dataset a run without faults writes.
#[test]
fn a_store_that_stays_down_fails_within_the_store_timeout() {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};
    let Some(python) = support::test_python("a_store_that_stays_down_fails_within_the_store_timeout") else {
        return;
    };
    let server = MotoS3::start(&python, "siphon-down");
    let direct = &server.backend;
    let (_proxy, proxied) = server.behind_proxy(|_| match STORE_STATE.load(Ordering::SeqCst) {
        DOWN => Fault::Status(503),
        STALLED => Fault::Stall(Duration::from_secs(3600)),
        _ => Fault::Pass,
    });
    let spec = spec();
    write_all(config(direct, "reference"), &spec, 20);
    let give_up_after = Duration::from_secs(3);
    let job = || {
        let mut config = config(&proxied, "job");
        config.upload.give_up_after = give_up_after;
        ShardWriter::open(config, descriptor(&spec)).unwrap()
    };

    let mut committed = 0;
    for (state, why) in [(DOWN, "503 Service Unavailable"), (STALLED, "")] {
        STORE_STATE.store(UP, Ordering::SeqCst);
        let mut writer = job();
        let first = writer.resume_point().next_sample / spec.batch as u64;
        // The next shard (7 batches) commits while the store is up...
        let k = first + 7;
        for k in first..k {
            writer.push(spec.batch(k)).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while read_manifest_opt(direct, "job").map_or(0, |m| m.len()) == committed {
            assert!(Instant::now() < deadline, "the shard of batches {first}..{k} was not committed within 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        committed += 1;
        // ...then the store stops answering and the next one cannot be written.
        STORE_STATE.store(state, Ordering::SeqCst);
        let went_down = Instant::now();
        let error = (k..k + 8)
            .map(|k| writer.push(spec.batch(k)))
            .find_map(Result::err)
            .or_else(|| writer.finish().err())
            .expect("the writer succeeded with its store down")
            .to_string();
        let took = went_down.elapsed();
        assert!(
            took < give_up_after + Duration::from_secs(4),
            "failing took {took:?} with a store timeout of {give_up_after:?}: {error}"
        );
        assert!(error.contains("did not take") && error.contains("3s (the store timeout)"), "{error}");
        assert!(error.contains(why), "{error}");
        assert_eq!(read_manifest(direct, "job").len(), committed, "{error}");
    }

    // The store is back: the same writer resumes after the committed shards.
    STORE_STATE.store(UP, Ordering::SeqCst);
    let mut writer = job();
    assert_eq!(writer.resume_point().next_sample, committed as u64 * 7 * spec.batch as u64);
    for k in committed as u64 * 7..20 {
        writer.push(spec.batch(k)).unwrap();
    }
    writer.finish().unwrap();
    assert_eq!(read_manifest(direct, "job"), read_manifest(direct, "reference"));
    verify_ok(direct, "job");
}

/// `siphon doctor --output`'s probe: a usable store passes and is left as it was; a bucket that
/// does not exist fails naming the write and the store's answer.
#[test]
fn the_probe_passes_a_usable_store_and_names_what_fails() {
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("out");
    let timeout = std::time::Duration::from_secs(5);
    let report = siphon_store::probe_blocking(local.to_str().unwrap(), &[], timeout).unwrap();
    assert!(report.object.starts_with(".siphon-probe/"), "{report:?}");
    assert_eq!(std::fs::read_dir(&local).unwrap().count(), 0, "the probe left something behind");

    let Some(python) = support::test_python("the_probe_passes_a_usable_store_and_names_what_fails") else {
        return;
    };
    let server = MotoS3::start(&python, "siphon-probe");
    let backend = &server.backend;
    siphon_store::probe_blocking(&backend.url("datasets"), &backend.options, timeout).unwrap();
    let loc = location(backend, "datasets");
    let left: Vec<_> = block_on(async {
        use futures::TryStreamExt;
        loc.store().list(None).try_collect::<Vec<_>>().await.unwrap()
    });
    assert!(left.is_empty(), "the probe left {left:?}");
    let err = siphon_store::probe_blocking("s3://no-such-bucket/datasets", &backend.options, timeout)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("object store put datasets/.siphon-probe/"), "{err}");
    assert!(err.contains("no-such-bucket") && err.contains("NoSuchBucket"), "{err}");
}

// ---------------------------------------------------------------- local-only behaviour

#[test]
fn bad_batches_are_rejected_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::local(dir.path());
    let spec = SyntheticSpec::new(1, 2, 8, 16);
    let mut writer = ShardWriter::open(config(&backend, "bad"), descriptor(&spec)).unwrap();
    let mut short = spec.batch(0);
    let data = &mut short.hooks[0].data;
    data.truncate(data.len() - 1);
    assert!(writer.push(short).unwrap_err().to_string().contains("expected batch*seq*prod(shape [16])*4"));
    let err = writer.push(spec.batch(1)).unwrap_err().to_string();
    assert!(err.contains("expected the batch to start at sample 0"), "{err}");
    let mut renamed = spec.batch(0);
    renamed.hooks[0].hook = "other".into();
    assert!(writer.push(renamed).unwrap_err().to_string().contains("differ from the run's hooks"));
    writer.push(spec.batch(0)).unwrap();
    assert_eq!(writer.finish().unwrap().samples_end, 2);

    let mut bad = config(&backend, "bad2");
    bad.upload.part_bytes = 1 << 20;
    assert!(ShardWriter::open(bad, descriptor(&spec)).err().unwrap().to_string().contains("5 MiB"));
    let mut reserved = descriptor(&spec);
    reserved.hooks = vec!["token_ids".into()];
    assert!(ShardWriter::open(config(&backend, "bad3"), reserved).err().unwrap().to_string().contains("reserved"));
}

/// Hooks of different per-token shapes side by side: a `[8]` vector, a per-head `[2, 4]` and
/// a `[1]` scale. Shards hold `[tokens, *shape]`, run.json records the shapes, verify passes and
/// statistics are per flattened element (widths 8, 8, 1).
#[test]
fn hooks_of_different_shapes_are_stored_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::local(dir.path());
    let spec = mixed_spec();
    let mut c = config(&backend, "shapes");
    c.format.target_shard_bytes = 3_000;
    let summary = write_all(c, &spec, 4);
    assert!(summary.shards >= 2, "several shards: {}", summary.shards);
    let report = verify_ok(&backend, "shapes");
    assert_eq!(report.format_version, Some(2));
    let shapes: Vec<Vec<usize>> = spec.hooks.iter().map(|h| report.hook_shapes[h].clone()).collect();
    assert_eq!(shapes, vec![vec![8], vec![2, 4], vec![1]]);
    let run_json = report.run_json.as_ref().unwrap();
    assert_eq!(run_json.format, "siphon-activations/2");
    assert_eq!(run_json.descriptor.hook_shapes, shapes);
    assert_eq!(run_json.descriptor.hook_shape("blocks.0.attn.hook_z"), Some(&[2, 4][..]));

    let mut rows = 0;
    for line in read_manifest(&backend, "shapes") {
        let bytes = read_object(&backend, "shapes", &line.shard);
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let tokens = line.tokens as usize;
        assert_eq!(st.tensor("blocks.0.hook_resid_post").unwrap().shape(), [tokens, 8]);
        assert_eq!(st.tensor("blocks.0.attn.hook_z").unwrap().shape(), [tokens, 2, 4]);
        assert_eq!(st.tensor("blocks.0.ln1.hook_scale").unwrap().shape(), [tokens, 1]);
        // Row-major [tokens, heads, d_head]: head 1, element 3 of row r is flat element 7.
        let z = st.tensor("blocks.0.attn.hook_z").unwrap();
        let samples: Vec<i64> = st
            .tensor("sample_index")
            .unwrap()
            .data()
            .chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let first = samples[0] as u64;
        let t = (0..spec.seq).find(|&t| spec.keep(first, t)).unwrap();
        let off = 7 * 4;
        let got = f32::from_le_bytes(z.data()[off..off + 4].try_into().unwrap());
        assert_eq!(got, SyntheticSpec::value(first, t, 1, 7));
        rows += tokens;
    }
    assert_eq!(rows as u64, summary.tokens);

    let stats = siphon_store::finalize_run(&backend.url("shapes"), &[], RUN).unwrap();
    let widths: Vec<usize> = spec.hooks.iter().map(|h| stats.hooks[h].mean.len()).collect();
    assert_eq!(widths, vec![8, 8, 1]);
    assert_eq!(stats.hooks["blocks.0.attn.hook_z"].shape, vec![2, 4]);
    assert_eq!(stats.hooks["blocks.0.ln1.hook_scale"].variance.len(), 1);
    // Per flattened element, and the norm over the whole flattened row.
    let spec = &spec;
    let kept: Vec<(u64, usize)> = (0..4 * spec.batch as u64)
        .flat_map(|s| (0..spec.seq).filter(move |&t| spec.keep(s, t)).map(move |t| (s, t)))
        .collect();
    let z = &stats.hooks["blocks.0.attn.hook_z"];
    assert_eq!(z.count, kept.len() as u64);
    let mean7 = kept.iter().map(|&(s, t)| SyntheticSpec::value(s, t, 1, 7) as f64).sum::<f64>() / kept.len() as f64;
    assert!((z.mean[7] - mean7).abs() < 1e-9, "{} vs {mean7}", z.mean[7]);
    let norm = kept
        .iter()
        .map(|&(s, t)| (0..8).map(|d| (SyntheticSpec::value(s, t, 1, d) as f64).powi(2)).sum::<f64>().sqrt())
        .sum::<f64>()
        / kept.len() as f64;
    assert!((z.mean_norm - norm).abs() < 1e-9, "{} vs {norm}", z.mean_norm);

    // A run.json without shapes (the descriptor leaves them out): shards still hold
    // [tokens, *shape], and verify reads the shapes from the first shard.
    let mut c = config(&backend, "unrecorded");
    c.format.target_shard_bytes = 3_000;
    let mut desc = descriptor(spec);
    desc.hook_shapes.clear();
    let mut writer = ShardWriter::open(c, desc).unwrap();
    for k in 0..3 {
        writer.push(spec.batch(k)).unwrap();
    }
    writer.finish().unwrap();
    let report = verify_ok(&backend, "unrecorded");
    assert!(report.run_json.as_ref().unwrap().descriptor.hook_shapes.is_empty());
    assert_eq!(report.hook_shapes["blocks.0.attn.hook_z"], vec![2, 4]);
}

/// `[8]`, per-head `[2, 4]` and `[1]` hooks over 2 x 8 tokens.
fn mixed_spec() -> SyntheticSpec {
    SyntheticSpec::with_hooks(
        &[("blocks.0.hook_resid_post", &[8]), ("blocks.0.attn.hook_z", &[2, 4]), ("blocks.0.ln1.hook_scale", &[1])],
        2,
        8,
    )
}

/// A hook whose per-token shape changes is refused, naming the hook and both shapes, whether
/// run.json records the shapes or the first batch set them; empty and zero shapes too.
#[test]
fn a_shape_change_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::local(dir.path());
    let spec = mixed_spec();
    let reshaped = |k: u64| {
        let mut batch = spec.batch(k);
        batch.hooks[1].shape = vec![4, 2];
        batch
    };

    let mut writer = ShardWriter::open(config(&backend, "recorded"), descriptor(&spec)).unwrap();
    let err = writer.push(reshaped(0)).unwrap_err();
    assert!(matches!(err, StoreError::InvalidBatch { .. }), "{err}");
    assert!(
        err.to_string().contains("hook blocks.0.attn.hook_z has per-token shape [4, 2], run.json records [2, 4]"),
        "{err}"
    );
    writer.push(spec.batch(0)).unwrap();
    assert_eq!(writer.finish().unwrap().samples_end, 2);

    let mut desc = descriptor(&spec);
    desc.hook_shapes.clear();
    let mut writer = ShardWriter::open(config(&backend, "unrecorded"), desc).unwrap();
    writer.push(spec.batch(0)).unwrap();
    let err = writer.push(reshaped(1)).unwrap_err().to_string();
    assert!(
        err.contains("hook blocks.0.attn.hook_z changed its per-token shape from [2, 4] (earlier batches) to [4, 2]"),
        "{err}"
    );
    let mut empty = spec.batch(1);
    empty.hooks[2].shape = vec![];
    let err = writer.push(empty).unwrap_err().to_string();
    assert!(err.contains("hook blocks.0.ln1.hook_scale has an empty per-token shape"), "{err}");
    let mut zero = spec.batch(1);
    zero.hooks[1].shape = vec![2, 0];
    let err = writer.push(zero).unwrap_err().to_string();
    assert!(err.contains("hook blocks.0.attn.hook_z has a zero dimension"), "{err}");
    writer.push(spec.batch(1)).unwrap();
    assert_eq!(writer.finish().unwrap().samples_end, 4);

    let mut wrong_count = descriptor(&spec);
    wrong_count.hook_shapes.pop();
    let err = ShardWriter::open(config(&backend, "count"), wrong_count).err().unwrap();
    assert!(err.to_string().contains("2 hook shapes for 3 hooks"), "{err}");
}

/// verify compares the shards' hook shapes with run.json's and names hook, shard and shapes.
#[test]
fn verify_reports_shards_that_disagree_with_run_json_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::local(dir.path());
    let spec = mixed_spec();
    write_all(config(&backend, "disagree"), &spec, 2);
    siphon_store::finalize_run(&backend.url("disagree"), &[], RUN).unwrap();
    let path = dir.path().join("disagree").join(RUN).join("run.json");
    let mut run_json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(run_json["hook_shapes"], serde_json::json!([[8], [2, 4], [1]]));
    run_json["hook_shapes"][1] = serde_json::json!([4, 2]);
    std::fs::write(&path, serde_json::to_vec(&run_json).unwrap()).unwrap();
    let report = siphon_store::verify_run_blocking(&backend.url("disagree"), &[], RUN).unwrap();
    let problems = report.all_problems();
    assert!(
        problems.iter().any(|p| p.contains("shard_000000.safetensors")
            && p.contains("hook blocks.0.attn.hook_z has per-token shape [2, 4]")
            && p.contains("run.json records [4, 2]")),
        "{problems:?}"
    );
}

/// The shard `bytes` with its metadata's format tag replaced by `tag`, tensors unchanged.
fn with_format_tag(bytes: &[u8], tag: &str) -> Vec<u8> {
    let st = safetensors::SafeTensors::deserialize(bytes).unwrap();
    let mut metadata = safetensors::SafeTensors::read_metadata(bytes).unwrap().1.metadata().clone().unwrap();
    metadata.insert("format".into(), tag.into());
    safetensors::serialize(st.tensors(), Some(metadata)).unwrap()
}

/// Rewrites a run written by this crate as format 1 wrote it: `siphon-activations/1` in
/// run.json and every shard, no `hook_shapes` in run.json, no `shape` in stats.json (the shards
/// of `[d_model]` hooks are otherwise the same); manifests get the new sizes and hashes.
fn downgrade_to_format_1(run_dir: &std::path::Path) {
    use sha2::Digest;
    let path = run_dir.join("run.json");
    let mut run_json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    run_json["format"] = "siphon-activations/1".into();
    run_json.as_object_mut().unwrap().remove("hook_shapes");
    std::fs::write(&path, serde_json::to_vec_pretty(&run_json).unwrap()).unwrap();
    let strip_shapes = |path: &std::path::Path| {
        let mut stats: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        for hook in stats["hooks"].as_object_mut().unwrap().values_mut() {
            let hook = hook.as_object_mut().unwrap();
            assert!(hook.remove("shape").is_some());
            // Written before minima and maxima were kept (and by another summation order):
            // compared within a tolerance.
            assert!(hook.remove("min").is_some() && hook.remove("max").is_some());
        }
        std::fs::write(path, serde_json::to_vec(&stats).unwrap()).unwrap();
    };
    strip_shapes(&run_dir.join("stats.json"));
    let host_dir = run_dir.join(HOST.dir_name());
    strip_shapes(&host_dir.join("stats.json"));
    let manifest = host_dir.join("manifest.jsonl");
    let mut lines = siphon_store::parse_manifest("m", &std::fs::read_to_string(&manifest).unwrap()).unwrap();
    for line in &mut lines {
        let shard = host_dir.join(&line.shard);
        let rewritten = with_format_tag(&std::fs::read(&shard).unwrap(), "siphon-activations/1");
        line.bytes = rewritten.len() as u64;
        // Format-1 runs were checked by sha256.
        line.sha256 = Some(hex::encode(sha2::Sha256::digest(&rewritten)));
        line.crc32c = None;
        std::fs::write(&shard, rewritten).unwrap();
    }
    std::fs::write(&manifest, siphon_store::render_manifest(&lines)).unwrap();
}

/// A format-1 dataset is verified (shapes read from its shards) and reported as format 1; a
/// format-2 writer refuses to resume it, saying so; finalize still merges its statistics.
#[test]
fn format_1_runs_are_read_but_not_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::local(dir.path());
    let spec = SyntheticSpec::new(2, 2, 8, 16);
    let mut desc = descriptor(&spec);
    desc.hook_shapes.clear();
    let mut writer = ShardWriter::open(config(&backend, "v1"), desc.clone()).unwrap();
    for k in 0..3 {
        writer.push(spec.batch(k)).unwrap();
    }
    writer.finish().unwrap();
    siphon_store::finalize_run(&backend.url("v1"), &[], RUN).unwrap();
    downgrade_to_format_1(&dir.path().join("v1").join(RUN));

    let report = siphon_store::verify_run_blocking(&backend.url("v1"), &[], RUN).unwrap();
    assert!(report.is_ok(), "{:?}", report.all_problems());
    assert_eq!(report.format_version, Some(1));
    let run_json = report.run_json.as_ref().unwrap();
    assert_eq!(run_json.format, "siphon-activations/1");
    assert_eq!(run_json.format_version("run.json").unwrap(), 1);
    assert!(run_json.descriptor.hook_shapes.is_empty());
    assert_eq!(report.hook_shapes[&spec.hooks[0]], vec![16]);
    assert_eq!(report.hook_shapes[&spec.hooks[1]], vec![16]);
    let merged = siphon_store::finalize_run(&backend.url("v1"), &[], RUN).unwrap();
    assert_eq!(merged.hooks[&spec.hooks[0]].shape, vec![16]);

    let err = ShardWriter::open(config(&backend, "v1"), desc).err().unwrap();
    let message = err.to_string();
    assert!(matches!(err, StoreError::FormatMismatch { stored_version: 1, .. }), "{message}");
    assert!(
        message.contains("run.json was written by format 1 (\"siphon-activations/1\")")
            && message.contains("this siphon writes format 2"),
        "{message}"
    );
}

/// A `stats.json` whose numbers are not those of the committed shards (edited, or left over
/// from other shards) is a problem verify names, for the host's file and for the run's.
#[test]
fn statistics_that_are_not_those_of_the_shards_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::local(dir.path());
    let spec = SyntheticSpec::new(1, 2, 8, 16);
    let mut c = config(&backend, "stats");
    c.format.target_shard_bytes = 2_000;
    write_all(c, &spec, 6);
    verify_ok(&backend, "stats");
    let run_dir = dir.path().join("stats").join(RUN);
    for (file, problem) in [
        (run_dir.join("stats.json"), "run stats.json is not the statistics"),
        (run_dir.join(HOST.dir_name()).join("stats.json"), "machine_001_host_02: stats.json is not the statistics"),
    ] {
        let original = std::fs::read(&file).unwrap();
        let mut stats: serde_json::Value = serde_json::from_slice(&original).unwrap();
        let hook = stats["hooks"].as_object_mut().unwrap().values_mut().next().unwrap();
        let mean = hook["mean"][0].as_f64().unwrap();
        hook["mean"][0] = (mean + mean.abs() * 1e-12 + 1e-300).into();
        std::fs::write(&file, serde_json::to_vec(&stats).unwrap()).unwrap();
        let report = siphon_store::verify_run_blocking(&backend.url("stats"), &[], RUN).unwrap();
        let problems = report.all_problems();
        assert!(problems.iter().any(|p| p.starts_with(problem)), "{problem}: {problems:?}");
        std::fs::write(&file, original).unwrap();
    }
    let report = siphon_store::verify_run_blocking(&backend.url("stats"), &[], RUN).unwrap();
    assert!(report.is_ok(), "{:?}", report.all_problems());

    // A file written before minima and maxima were kept came from another summation order: it
    // passes within 1e-6 of each element's scale, and an edit past that is still named.
    let file = run_dir.join(HOST.dir_name()).join("stats.json");
    let mut stats: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let hook = stats["hooks"].as_object_mut().unwrap().values_mut().next().unwrap().as_object_mut().unwrap();
    assert!(hook.remove("min").is_some() && hook.remove("max").is_some());
    let mean = hook["mean"][0].as_f64().unwrap();
    let scale = hook["variance"][0].as_f64().unwrap().sqrt().max(mean.abs());
    for (shift, named) in [(1e-9 * scale, false), (1e-4 * scale, true)] {
        let mut edited = stats.clone();
        edited["hooks"].as_object_mut().unwrap().values_mut().next().unwrap()["mean"][0] = (mean + shift).into();
        std::fs::write(&file, serde_json::to_vec(&edited).unwrap()).unwrap();
        let problems = siphon_store::verify_run_blocking(&backend.url("stats"), &[], RUN).unwrap().all_problems();
        assert_eq!(
            problems.iter().any(|p| p.contains("stats.json is not the statistics")),
            named,
            "{shift}: {problems:?}"
        );
    }
}

/// A manifest whose last line was cut by a torn write (power loss on a filesystem without
/// atomic renames): verify names it, the same command repairs it, losing only that shard,
/// which it writes again; the result equals an uninterrupted run, statistics included.
#[test]
fn a_torn_manifest_is_repaired_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::local(dir.path());
    let writer = env!("CARGO_BIN_EXE_siphon-store-writer");
    let run = |prefix: &str| {
        let out = Command::new(writer)
            .args(["--output", &backend.url(prefix), "--run", RUN, "--machine", "1", "--host", "2", "--finalize"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{prefix}: {}", String::from_utf8_lossy(&out.stderr));
    };
    run("whole");
    run("torn");
    let host_dir = |prefix: &str| dir.path().join(prefix).join(RUN).join(HOST.dir_name());
    let manifest = host_dir("torn").join("manifest.jsonl");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let lines = text.lines().count();
    assert!(lines >= 2, "{text}");
    std::fs::write(&manifest, &text[..text.len() - 30]).unwrap();

    let report = siphon_store::verify_run_blocking(&backend.url("torn"), &[], RUN).unwrap();
    let problems = report.all_problems().join("\n");
    assert!(
        problems.contains(&format!("line {lines} is cut short")) && problems.contains("resuming the run repairs it"),
        "{problems}"
    );

    run("torn");
    assert_eq!(read_manifest(&backend, "torn"), read_manifest(&backend, "whole"));
    for file in ["manifest.jsonl", "stats.json"] {
        assert_eq!(
            std::fs::read(host_dir("torn").join(file)).unwrap(),
            std::fs::read(host_dir("whole").join(file)).unwrap(),
            "{file}"
        );
    }
    assert!(siphon_store::verify_run_blocking(&backend.url("torn"), &[], RUN).unwrap().is_ok());
}

/// A format this crate does not know is an error naming it, for verify and for resume.
#[test]
fn an_unknown_format_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::local(dir.path());
    let spec = SyntheticSpec::new(1, 2, 8, 16);
    write_all(config(&backend, "v3"), &spec, 1);
    let path = dir.path().join("v3").join(RUN).join("run.json");
    let mut run_json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    run_json["format"] = "siphon-activations/3".into();
    std::fs::write(&path, serde_json::to_vec(&run_json).unwrap()).unwrap();

    let err = siphon_store::verify_run_blocking(&backend.url("v3"), &[], RUN).unwrap_err();
    assert!(matches!(err, StoreError::UnsupportedFormat { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("unsupported dataset format \"siphon-activations/3\"")
            && message.contains("siphon-activations/1 and siphon-activations/2"),
        "{message}"
    );
    let err = ShardWriter::open(config(&backend, "v3"), descriptor(&spec)).err().unwrap();
    assert!(err.to_string().contains("\"siphon-activations/3\""), "{err}");
    assert_eq!(siphon_store::format_version("siphon-activations/3"), None);
    assert_eq!(siphon_store::format_version("siphon-activations/1"), Some(1));
    assert_eq!(siphon_store::format_version("other/2"), None);

    // A shard with an unknown tag is refused too (verify lists it as that shard's problem).
    let shard = dir.path().join("v3").join(RUN).join(HOST.dir_name()).join("shard_000000.safetensors");
    let rewritten = with_format_tag(&std::fs::read(&shard).unwrap(), "siphon-activations/3");
    let err = siphon_store::summarize_shard("s", &rewritten, &spec.hooks, &[], &[], &[]).unwrap_err();
    assert!(err.to_string().contains("unsupported dataset format \"siphon-activations/3\""), "{err}");
}

/// Two hosts of one run write side by side; finalize merges their statistics (Chan) into the
/// same numbers a single pass over both hosts' tokens gives.
#[test]
fn two_hosts_merge_statistics() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::local(dir.path());
    let spec = SyntheticSpec::new(1, 2, 8, 16);
    let hosts = [HostId { machine: 0, host: 0 }, HostId { machine: 0, host: 1 }];
    for (i, host) in hosts.iter().enumerate() {
        let mut c = config(&backend, "multi");
        c.host = *host;
        c.format.target_shard_bytes = 1_500;
        let mut writer = ShardWriter::open(c, descriptor(&spec)).unwrap();
        // Host 1 gets a different slice of the synthetic corpus (batches 10..), numbered from 0.
        for k in 0..(3 + i as u64) {
            let mut batch = spec.batch(k + 10 * i as u64);
            batch.first_sample = k * spec.batch as u64;
            writer.push(batch).unwrap();
        }
        writer.finish().unwrap();
    }
    let merged = siphon_store::finalize_run(&backend.url("multi"), &[], RUN).unwrap();
    let report = siphon_store::verify_run_blocking(&backend.url("multi"), &[], RUN).unwrap();
    assert!(report.is_ok(), "{:?}", report.all_problems());
    assert_eq!(report.hosts.iter().map(|h| h.host).collect::<Vec<_>>(), hosts);
    let batches: Vec<u64> = vec![0, 1, 2, 10, 11, 12, 13];
    let values: Vec<f64> = batches
        .iter()
        .flat_map(|&k| (k * 2..k * 2 + 2).collect::<Vec<_>>())
        .flat_map(|s| {
            (0..spec.seq)
                .filter(|&t| spec.keep(s, t))
                .map(|t| SyntheticSpec::value(s, t, 0, 5) as f64)
                .collect::<Vec<_>>()
        })
        .collect();
    let stats = &merged.hooks[&spec.hooks[0]];
    assert_eq!(stats.count, values.len() as u64);
    assert_eq!(report.included_tokens, values.len() as u64);
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / values.len() as f64;
    assert!(
        (stats.mean[5] - mean).abs() < 1e-9 && (stats.variance[5] - var).abs() < 1e-9,
        "{} {}",
        stats.mean[5],
        stats.variance[5]
    );
}

/// The README one-liner (`safetensors.numpy.load_file`) on shards written by the store: f32,
/// and bf16 (numpy learns bfloat16 from `ml_dtypes`).
#[test]
fn python_one_liner_loads_a_shard() {
    let Some(python) = support::test_python("python_one_liner_loads_a_shard") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::local(dir.path());
    let spec = SyntheticSpec::new(2, 2, 8, 16);
    for dtype in [DType::F32, DType::Bf16] {
        let prefix = format!("py-{dtype:?}");
        let mut c = config(&backend, &prefix);
        c.format.dtype = dtype;
        write_all(c, &spec, 3);
        let shard = dir.path().join(&prefix).join(RUN).join(HOST.dir_name()).join("shard_000000.safetensors");
        // The README one-liner, plus a print of what it loaded.
        let script = format!(
            "import ml_dtypes; from safetensors.numpy import load_file; t = load_file({:?}); import json; print(json.dumps({{k: [list(v.shape), str(v.dtype)] for k, v in t.items()}})); print(json.dumps([t['token_ids'][:3].tolist(), float(t['blocks.1.hook_resid_post'][2, 5])]))",
            shard.display().to_string()
        );
        let out = Command::new(&python).args(["-c", &script]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8(out.stdout).unwrap();
        let mut lines = stdout.lines();
        let shapes: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
        let tokens = expected_included(&spec, 3);
        let numpy_dtype = if dtype == DType::F32 { "float32" } else { "bfloat16" };
        assert_eq!(shapes["blocks.1.hook_resid_post"], serde_json::json!([[tokens, 16], numpy_dtype]));
        assert_eq!(shapes["token_ids"], serde_json::json!([[tokens], "int32"]));
        assert_eq!(shapes["doc_index"], serde_json::json!([[tokens], "int64"]));
        let values: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
        // Rows 0..3 are sample 0 tokens 1..4 (token 0 is excluded).
        let expected_ids: Vec<i32> = (1..4).map(|t| SyntheticSpec::token_id(0, t)).collect();
        assert_eq!(values[0], serde_json::json!(expected_ids));
        assert_eq!(values[1].as_f64().unwrap() as f32, SyntheticSpec::value(0, 3, 1, 5));
    }
}

/// GCS through object_store's GCS client against fake-gcs-server: listing and reads of a
/// dataset (seeded through the server's data directory), checked end to end by `verify_run`.
/// Writes are not tested here: fake-gcs-server lacks GCS's XML multipart API, which
/// object_store's GCS client uses for uploads; the S3 suite covers writes.
#[test]
fn gcs_fake_server_lists_and_reads() {
    let Some(python) = support::test_python("gcs_fake_server_lists_and_reads") else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let bucket_dir = data.path().join("siphon-gcs");
    let backend = Backend::local(&bucket_dir);
    let spec = SyntheticSpec::new(1, 2, 8, 16);
    let mut c = config(&backend, "datasets");
    c.format.target_shard_bytes = 2_000;
    let summary = write_all(c, &spec, 6);
    assert!(summary.shards >= 2);
    siphon_store::finalize_run(&backend.url("datasets"), &[], RUN).unwrap();

    let server = support::FakeGcs::start(&python, data.path());
    let url = "gs://siphon-gcs/datasets";
    let loc = StoreLocation::open(url, &server.options()).unwrap();
    let hosts = block_on(siphon_store::list_hosts(&loc, RUN)).unwrap();
    assert_eq!(hosts, vec![HOST]);
    let listed: Vec<String> = block_on(async {
        use futures::TryStreamExt;
        loc.store()
            .list(Some(&loc.host_dir(RUN, HOST)))
            .map_ok(|m| m.location.filename().unwrap().to_string())
            .try_collect()
            .await
            .unwrap()
    });
    assert_eq!(listed.len() as u64, summary.shards + 2, "shards + manifest + stats: {listed:?}");
    let report = siphon_store::verify_run_blocking(url, &server.options(), RUN).unwrap();
    assert!(report.is_ok(), "{:?}", report.all_problems());
    assert_eq!(report.tokens, summary.tokens);
    assert_eq!(report.hosts[0].shards, summary.shards);
    // The documented reason writes are tested on S3: the emulator rejects object_store's XML
    // API put and multipart requests. If this starts succeeding, run the write suite here too.
    let put = block_on(loc.store().put(&object_store::path::Path::from("probe/x"), "x".into()));
    let multipart =
        block_on(async { loc.store().put_multipart(&object_store::path::Path::from("probe/y")).await.map(|_| ()) });
    for result in [put.map(|_| ()), multipart] {
        let err = result.expect_err("fake-gcs-server accepted an XML API write").to_string();
        assert!(err.contains("invalid uploadType"), "{err}");
    }
}

/// Transient failures are retried: a store that fails the first uploads still ends with a
/// complete, verified dataset.
#[test]
fn uploads_retry_transient_failures() {
    let inner = Arc::new(object_store::memory::InMemory::new());
    let flaky = Arc::new(flaky::FlakyStore::new(inner, 3));
    let loc = StoreLocation::from_store(flaky.clone(), object_store::path::Path::from("root"), "memory://flaky");
    let spec = SyntheticSpec::new(1, 2, 8, 16);
    let mut c = StoreConfig::new("unused", RUN, HOST);
    c.format.target_shard_bytes = 2_000;
    c.upload.initial_backoff = std::time::Duration::from_millis(1);
    let mut writer = ShardWriter::open_at(loc.clone(), c, descriptor(&spec)).unwrap();
    for k in 0..6 {
        writer.push(spec.batch(k)).unwrap();
    }
    let summary = writer.finish().unwrap();
    assert!(summary.shards >= 2);
    assert_eq!(flaky.failures_left(), 0, "the injected failures happened");
    block_on(siphon_store::merge_host_stats(&loc, RUN)).unwrap();
    let report = block_on(siphon_store::verify_run(&loc, RUN)).unwrap();
    assert!(report.is_ok(), "{:?}", report.all_problems());
    assert_eq!(report.tokens, expected_included(&spec, 6));
}

mod flaky {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::stream::BoxStream;
    use object_store::path::Path;
    use object_store::{
        CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
        PutOptions, PutPayload, PutResult, Result,
    };

    /// Fails the first `n` shard puts (single or multipart) with a generic (transient) error.
    #[derive(Debug)]
    pub struct FlakyStore {
        inner: Arc<dyn ObjectStore>,
        failures: AtomicUsize,
    }

    impl FlakyStore {
        pub fn new(inner: Arc<dyn ObjectStore>, n: usize) -> Self {
            FlakyStore { inner, failures: AtomicUsize::new(n) }
        }

        pub fn failures_left(&self) -> usize {
            self.failures.load(Ordering::SeqCst)
        }

        fn maybe_fail(&self, location: &Path) -> Result<()> {
            let is_shard = location.filename().is_some_and(|f| f.ends_with(".safetensors"));
            if is_shard && self.failures.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
            {
                return Err(object_store::Error::Generic {
                    store: "flaky",
                    source: "injected transient failure".into(),
                });
            }
            Ok(())
        }
    }

    impl std::fmt::Display for FlakyStore {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "FlakyStore")
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for FlakyStore {
        async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
            self.maybe_fail(location)?;
            self.inner.put_opts(location, payload, opts).await
        }
        async fn put_multipart_opts(
            &self,
            location: &Path,
            opts: PutMultipartOptions,
        ) -> Result<Box<dyn MultipartUpload>> {
            self.maybe_fail(location)?;
            self.inner.put_multipart_opts(location, opts).await
        }
        async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
            self.inner.get_opts(location, options).await
        }
        fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
            self.inner.delete_stream(locations)
        }
        fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
            self.inner.list(prefix)
        }
        async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
            self.inner.list_with_delimiter(prefix).await
        }
        async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
            self.inner.copy_opts(from, to, options).await
        }
    }
}

/// Memory whose owner counts itself alive, as the extraction's reused host buffers do.
struct Counted(Vec<u8>, Arc<std::sync::atomic::AtomicUsize>);

impl AsRef<[u8]> for Counted {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.1.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Rows the writer keeps where they lie (bf16 batches stored as bf16: each sequence's kept run is
/// a slice of the batch) and rows it copies (f32 batches of the same, bf16-exact, values
/// converted) make the same shards byte for byte and the same statistics; every batch's memory
/// is given back by the end.
#[test]
fn rows_kept_where_they_lie_and_rows_copied_make_the_same_shards() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::local(dir.path());
    // bf16 rows of 2 KiB: a sequence's 62 or 63 kept rows are past the writer's 64 KiB minimum.
    let spec = SyntheticSpec::new(2, 4, 64, 1024);
    let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for (prefix, lend) in [("copied", false), ("lent", true)] {
        let mut c = config(&backend, prefix);
        c.format.dtype = DType::Bf16;
        c.format.target_shard_bytes = 3 << 20;
        let mut writer = ShardWriter::open(c, descriptor(&spec)).unwrap();
        for k in 0..12 {
            let mut batch = spec.batch(k);
            if lend {
                for hook in &mut batch.hooks {
                    let bf16: Vec<u8> = hook
                        .data
                        .chunks_exact(4)
                        .flat_map(|b| half::bf16::from_f32(f32::from_le_bytes(b.try_into().unwrap())).to_le_bytes())
                        .collect();
                    live.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    hook.data = bytes::Bytes::from_owner(Counted(bf16, Arc::clone(&live)));
                    hook.dtype = DType::Bf16;
                }
            }
            writer.push(batch).unwrap();
        }
        writer.finish().unwrap();
        siphon_store::finalize_run(&backend.url(prefix), &[], RUN).unwrap();
    }
    assert_eq!(live.load(std::sync::atomic::Ordering::SeqCst), 0, "every lent batch's memory is given back");
    let (copied, lent) = (read_manifest(&backend, "copied"), read_manifest(&backend, "lent"));
    assert!(copied.len() > 2, "several shards");
    assert_eq!(copied, lent, "the same manifests, checksums included");
    for line in &copied {
        assert!(
            read_object(&backend, "copied", &line.shard) == read_object(&backend, "lent", &line.shard),
            "{}",
            line.shard
        );
    }
    let stats = |prefix: &str| std::fs::read(dir.path().join(prefix).join(RUN).join("stats.json")).unwrap();
    assert_eq!(stats("copied"), stats("lent"));
    verify_ok(&backend, "lent");
}

/// Batch `k` of `spec` with hook 1's value of sample `sample`, token `token`, element `dim`
/// replaced by `value`.
fn with_value(
    spec: &SyntheticSpec,
    k: u64,
    sample: usize,
    token: usize,
    dim: usize,
    value: f32,
) -> siphon_store::BatchActivations {
    let mut batch = spec.batch(k);
    let width = spec.width(1);
    let mut data = batch.hooks[1].data.to_vec();
    let at = 4 * ((sample * spec.seq + token) * width + dim);
    data[at..at + 4].copy_from_slice(&value.to_le_bytes());
    batch.hooks[1].data = data.into();
    batch
}

/// A value that is NaN or ±Inf in a hook: the shard holding it is refused naming the hook, the
/// step, the host's sample and the token, and nothing of it is committed; a stream's batch is
/// refused the same way; with `allow_non_finite` both are written and the shard's statistics
/// count it.
#[test]
fn values_that_are_not_finite_are_refused_unless_the_format_allows_them() {
    let spec = spec();
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::local(dir.path());
    let mut writer = ShardWriter::open(config(&backend, "refused"), descriptor(&spec)).unwrap();
    writer.push(spec.batch(0)).unwrap();
    // Batch 1, its sequence 2 (host sample 6), token 5.
    writer.push(with_value(&spec, 1, 2, 5, 7, f32::NAN)).unwrap();
    let err = writer.finish().unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, StoreError::NonFinite { count: 1, step: 1, sample: 6, .. }), "{text}");
    assert!(text.contains("hook blocks.1.hook_resid_post computed 1 values") && text.contains("step 1"), "{text}");
    assert!(text.contains("host sample 6") && text.contains("--allow-non-finite"), "{text}");
    let manifest = location(&backend, "refused").manifest(RUN, HOST);
    let committed = block_on(async { location(&backend, "refused").store().get(&manifest).await.map(|_| ()) });
    assert!(committed.is_err(), "a manifest was written");

    let descriptor = descriptor(&spec);
    let format = config(&backend, "stream").format;
    let bad = || with_value(&spec, 0, 1, 3, 0, f32::INFINITY);
    let err = siphon_store::batch_shard(RUN, &descriptor, HOST, &format, 0, bad()).unwrap_err();
    assert!(matches!(err, StoreError::NonFinite { count: 1, step: 0, sample: 1, .. }), "{err}");
    let allowed = siphon_store::ShardFormat { allow_non_finite: true, ..format };
    siphon_store::batch_shard(RUN, &descriptor, HOST, &allowed, 0, bad()).unwrap();

    let mut config = config(&backend, "allowed");
    config.format.allow_non_finite = true;
    let mut writer = ShardWriter::open(config, descriptor.clone()).unwrap();
    writer.push(bad()).unwrap();
    writer.finish().unwrap();
    let stats = block_on(siphon_store::merge_host_stats(&location(&backend, "allowed"), RUN)).unwrap();
    assert_eq!(stats.hooks["blocks.1.hook_resid_post"].non_finite, 1);
    assert_eq!(stats.hooks["blocks.0.hook_resid_post"].non_finite, 0);
}
