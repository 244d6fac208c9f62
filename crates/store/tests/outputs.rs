//! The model's outputs in the store (`extract --outputs`): each stored token's values as the
//! batch gave them, f32 and i32 whatever the run's dtype, in the order the shard's other tensors
//! give the tokens (shuffled or not, with or without a mask); statistics over the included
//! tokens' finite values (`output.nll` is NaN where a token has no next token), the same after
//! a resume as in one go; verify reading them back and naming wrong ones; a batch without them
//! refused.

use siphon_store::synthetic::SyntheticSpec;
use siphon_store::{DType, HostId, OutputDType, RunDescriptor, ShardWriter, ShuffleConfig, StoreConfig};

const RUN: &str = "run-o";
const HOST: HostId = HostId { machine: 0, host: 0 };

fn spec() -> SyntheticSpec {
    SyntheticSpec::new(1, 3, 16, 8).with_next_token(5)
}

fn descriptor(spec: &SyntheticSpec) -> RunDescriptor {
    RunDescriptor {
        hooks: spec.hooks.clone(),
        hook_shapes: spec.shapes.clone(),
        outputs: spec.outputs.clone(),
        ..Default::default()
    }
}

fn config(dir: &std::path::Path, configure: &impl Fn(&mut StoreConfig)) -> StoreConfig {
    let mut config = StoreConfig::new(dir.to_str().unwrap(), RUN, HOST);
    config.format.target_shard_bytes = 6000;
    configure(&mut config);
    config
}

/// Writes batches `0..batches` in sessions that end after the batches `stops` name (a resume
/// after each), then finalizes the run.
fn write(
    dir: &std::path::Path,
    spec: &SyntheticSpec,
    configure: impl Fn(&mut StoreConfig),
    batches: u64,
    stops: &[u64],
) {
    let mut next = 0;
    for end in stops.iter().copied().chain([batches]) {
        let mut writer = ShardWriter::open(config(dir, &configure), descriptor(spec)).unwrap();
        let start = writer.resume_point().next_sample / spec.batch as u64;
        assert!(start <= next, "resumes at batch {start}, at most {next}");
        for k in start..end {
            writer.push(spec.batch(k)).unwrap();
        }
        writer.finish().unwrap();
        next = end;
    }
    siphon_store::finalize_run(dir.to_str().unwrap(), &[], RUN).unwrap();
}

/// Every shard's outputs, read back, equal the batch's values of the token each row holds (found
/// from the hook's value); the statistics equal counts and f64 sums of the finite values taken
/// here over the included tokens; verify passes.
fn check_run(dir: &std::path::Path, spec: &SyntheticSpec, dtype: DType, batches: u64, keep_excluded: bool) {
    let host_dir = dir.join(RUN).join(HOST.dir_name());
    let manifest = std::fs::read_to_string(host_dir.join("manifest.jsonl")).unwrap();
    let lines = siphon_store::parse_manifest("m", &manifest).unwrap();
    assert!(lines.len() > 2, "several shards: {}", lines.len());
    let all: Vec<_> = (0..batches).map(|k| spec.batch(k)).collect();
    let (mut defined, mut sums) = (vec![0u64; spec.outputs.len()], vec![0f64; spec.outputs.len()]);
    let mut included = 0;
    for line in &lines {
        let bytes = std::fs::read(host_dir.join(&line.shard)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let samples: Vec<u64> = st
            .tensor("sample_index")
            .unwrap()
            .data()
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
            .collect();
        let hook = st.tensor(&spec.hooks[0]).unwrap();
        let row_bytes = 8 * dtype.size();
        let mask: Option<Vec<bool>> = st.tensor("mask").ok().map(|m| m.data().iter().map(|&b| b != 0).collect());
        assert_eq!(mask.is_some(), keep_excluded);
        for (row, &sample) in samples.iter().enumerate() {
            let batch = &all[(sample / spec.batch as u64) as usize];
            let b = (sample % spec.batch as u64) as usize;
            let hook_row = &hook.data()[row * row_bytes..(row + 1) * row_bytes];
            let token = (0..spec.seq)
                .find(|&t| {
                    let at = (b * spec.seq + t) * 8 * 4;
                    let values = &batch.hooks[0].data[at..at + 32];
                    let stored: Vec<u8> = values
                        .chunks_exact(4)
                        .flat_map(|w| {
                            let v = f32::from_le_bytes(w.try_into().unwrap());
                            match dtype {
                                DType::Bf16 => half::bf16::from_f32(v).to_le_bytes().to_vec(),
                                _ => v.to_le_bytes().to_vec(),
                            }
                        })
                        .collect();
                    stored == hook_row
                })
                .expect("the row's token");
            let t = b * spec.seq + token;
            let counted = mask.as_ref().is_none_or(|m| m[row]);
            included += u64::from(counted);
            for (o, column) in spec.outputs.iter().enumerate() {
                let tensor = st.tensor(&column.name).unwrap();
                let expected_shape: Vec<usize> = std::iter::once(samples.len()).chain(column.shape.clone()).collect();
                assert_eq!(tensor.shape(), expected_shape, "{}", column.name);
                let n = column.row_bytes();
                let got = &tensor.data()[row * n..(row + 1) * n];
                assert_eq!(
                    got,
                    &batch.outputs[o].data[t * n..(t + 1) * n],
                    "{} of sample {sample} token {token}",
                    column.name
                );
                if counted && column.dtype == OutputDType::F32 {
                    let v = f32::from_le_bytes(got[..4].try_into().unwrap());
                    if v.is_finite() {
                        defined[o] += 1;
                        sums[o] += f64::from(v);
                    }
                }
            }
        }
    }
    let stats: siphon_store::StatsFile =
        serde_json::from_slice(&std::fs::read(dir.join(RUN).join("stats.json")).unwrap()).unwrap();
    for (o, column) in spec.outputs.iter().enumerate() {
        let s = &stats.outputs[&column.name];
        assert_eq!(s.count, included, "{}", column.name);
        if column.dtype == OutputDType::I32 {
            assert!(s.sum.is_empty() && s.defined.is_empty(), "ids have no sums: {s:?}");
            continue;
        }
        assert_eq!(s.defined[0], defined[o], "{}", column.name);
        assert!(
            (s.sum[0] - sums[o]).abs() <= 1e-9 * sums[o].abs().max(1.0),
            "{}: {} vs {}",
            column.name,
            s.sum[0],
            sums[o]
        );
    }
    let nll = &stats.outputs["output.nll"];
    assert!(nll.defined[0] < nll.count, "the sequences' last tokens have no next token: {nll:?}");
    let report = siphon_store::verify_run_blocking(dir.to_str().unwrap(), &[], RUN).unwrap();
    assert!(report.is_ok(), "{:?}", report.all_problems());
}

#[test]
fn outputs_are_stored_per_token_in_their_own_dtype() {
    let spec = spec();
    for (dtype, shuffle, keep_excluded) in
        [(DType::F32, false, false), (DType::Bf16, true, false), (DType::Bf16, false, true)]
    {
        let dir = tempfile::tempdir().unwrap();
        let configure = |c: &mut StoreConfig| {
            c.format.dtype = dtype;
            c.format.keep_excluded = keep_excluded;
            c.format.shuffle = shuffle.then_some(ShuffleConfig { seed: 5, window_batches: 2 });
        };
        write(dir.path(), &spec, configure, 6, &[]);
        check_run(dir.path(), &spec, dtype, 6, keep_excluded);
    }
}

#[test]
fn a_resumed_run_holds_the_same_outputs_and_statistics() {
    let spec = spec();
    let (once, resumed) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(once.path(), &spec, |_| {}, 8, &[]);
    write(resumed.path(), &spec, |_| {}, 8, &[3, 5]);
    check_run(resumed.path(), &spec, DType::Bf16, 8, false);
    // The sessions' last shards end early, so the hooks' moments are merged in other groups
    // (equal to rounding); the outputs' sums here are of values exact in f64: equal.
    let outputs = |dir: &std::path::Path| {
        let stats: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join(RUN).join("stats.json")).unwrap()).unwrap();
        stats["outputs"].clone()
    };
    assert_eq!(outputs(once.path()), outputs(resumed.path()));
}

#[test]
fn verify_names_wrong_outputs_and_a_batch_without_them_is_refused() {
    let spec = spec();
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &spec, |c: &mut StoreConfig| c.format.dtype = DType::F32, 2, &[]);
    let path = dir.path().join(RUN).join(HOST.dir_name()).join("stats.json");
    let mut stats: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    stats["outputs"]["output.entropy"]["sum"][0] = 1.5.into();
    stats["outputs"]["output.topk_logprobs"]["sum"].as_array_mut().unwrap().pop();
    std::fs::write(&path, serde_json::to_vec(&stats).unwrap()).unwrap();
    let report = siphon_store::verify_run_blocking(dir.path().to_str().unwrap(), &[], RUN).unwrap();
    let problems = report.all_problems().join("\n");
    assert!(problems.contains("output.topk_logprobs"), "{problems}");
    assert!(problems.contains("statistics"), "{problems}");

    // Resuming over those statistics is refused, naming them.
    let f32_run = |c: &mut StoreConfig| c.format.dtype = DType::F32;
    let err = ShardWriter::open(config(dir.path(), &f32_run), descriptor(&spec)).err().expect("refused").to_string();
    assert!(err.contains("output output.topk_logprobs: per-element lists of [5, 4, 5, 5] entries"), "{err}");

    let fresh = tempfile::tempdir().unwrap();
    let mut writer = ShardWriter::open(config(fresh.path(), &f32_run), descriptor(&spec)).unwrap();
    let mut batch = spec.batch(2);
    batch.outputs.pop();
    let err = writer.push(batch).unwrap_err().to_string();
    assert!(err.contains("differ from the run's outputs"), "{err}");
    let mut batch = spec.batch(2);
    batch.outputs[0].data = batch.outputs[0].data.slice(4..);
    let err = writer.push(batch).unwrap_err().to_string();
    assert!(err.contains("output output.nll has"), "{err}");
}
