//! A dictionary's latents in the store: each stored token's firings as a CSR row, in the order
//! the shard's other tensors give the tokens (shuffled or not, with or without a mask), values
//! rounded to the stored dtype; statistics per latent over the included tokens; verify reading
//! them back; a token with more firings than the cap refused by name.

use siphon_store::synthetic::SyntheticSpec;
use siphon_store::{DType, HostId, RunDescriptor, ShardWriter, ShuffleConfig, StoreConfig};

const RUN: &str = "run-l";
const HOST: HostId = HostId { machine: 0, host: 1 };
const NAME: &str = "blocks.0.hook_resid_post.hook_sae_acts_post";

fn spec() -> SyntheticSpec {
    SyntheticSpec::new(1, 3, 16, 8).with_latents(NAME, 50, 6).with_latents(&format!("{NAME}.second"), 9, 9)
}

fn descriptor(spec: &SyntheticSpec) -> RunDescriptor {
    RunDescriptor {
        hooks: spec.hooks.clone(),
        hook_shapes: spec.shapes.clone(),
        latents: spec.latents.clone(),
        outputs: spec.outputs.clone(),
        ..Default::default()
    }
}

fn write(dir: &std::path::Path, spec: &SyntheticSpec, configure: impl Fn(&mut StoreConfig), batches: u64) {
    let mut config = StoreConfig::new(dir.to_str().unwrap(), RUN, HOST);
    config.format.target_shard_bytes = 6000;
    configure(&mut config);
    let mut writer = ShardWriter::open(config, descriptor(spec)).unwrap();
    for k in 0..batches {
        writer.push(spec.batch(k)).unwrap();
    }
    writer.finish().unwrap();
    siphon_store::finalize_run(dir.to_str().unwrap(), &[], RUN).unwrap();
}

fn i32s(t: &safetensors::tensor::TensorView<'_>) -> Vec<i32> {
    t.data().chunks_exact(4).map(|w| i32::from_le_bytes(w.try_into().unwrap())).collect()
}

fn i64s(t: &safetensors::tensor::TensorView<'_>) -> Vec<i64> {
    t.data().chunks_exact(8).map(|w| i64::from_le_bytes(w.try_into().unwrap())).collect()
}

fn stored(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::Bf16 => half::bf16::from_f32(v).to_f32(),
        DType::F16 => half::f16::from_f32(v).to_f32(),
        _ => v,
    }
}

fn decode(dtype: DType, t: &safetensors::tensor::TensorView<'_>) -> Vec<f32> {
    let d = t.data();
    match dtype {
        DType::F32 => d.chunks_exact(4).map(|w| f32::from_le_bytes(w.try_into().unwrap())).collect(),
        DType::Bf16 => d.chunks_exact(2).map(|w| half::bf16::from_le_bytes([w[0], w[1]]).to_f32()).collect(),
        _ => d.chunks_exact(2).map(|w| half::f16::from_le_bytes([w[0], w[1]]).to_f32()).collect(),
    }
}

/// Every shard's rows, read back: each latents column's firings per (sample, position) equal the
/// generator's, sorted by latent, in the stored dtype; the statistics equal counts and f64 sums
/// taken here over the included tokens.
fn check_run(dir: &std::path::Path, spec: &SyntheticSpec, dtype: DType, batches: u64, keep_excluded: bool) {
    let host_dir = dir.join(RUN).join(HOST.dir_name());
    let manifest = std::fs::read_to_string(host_dir.join("manifest.jsonl")).unwrap();
    let lines = siphon_store::parse_manifest("m", &manifest).unwrap();
    assert!(lines.len() > 2, "several shards: {}", lines.len());
    let mut seen = 0;
    let mut firings: Vec<Vec<u64>> = spec.latents.iter().map(|c| vec![0; c.width]).collect();
    let mut sums: Vec<Vec<f64>> = spec.latents.iter().map(|c| vec![0.0; c.width]).collect();
    let mut max: Vec<Vec<f64>> = spec.latents.iter().map(|c| vec![0.0; c.width]).collect();
    for line in &lines {
        let bytes = std::fs::read(host_dir.join(&line.shard)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let samples = i64s(&st.tensor("sample_index").unwrap());
        // The synthetic position is per document (two per sequence); the token's place in its
        // sequence is found from the hook's value.
        let hook =
            decode(dtype, &st.tensor(&spec.hooks[0]).unwrap()).chunks(8).map(<[f32]>::to_vec).collect::<Vec<_>>();
        let mask: Option<Vec<bool>> = st.tensor("mask").ok().map(|m| m.data().iter().map(|&b| b != 0).collect());
        assert_eq!(mask.is_some(), keep_excluded);
        for (c, column) in spec.latents.iter().enumerate() {
            let [indptr, indices, values] = column.tensor_names();
            let indptr = i32s(&st.tensor(&indptr).unwrap());
            let indices = i32s(&st.tensor(&indices).unwrap());
            let values = decode(dtype, &st.tensor(&values).unwrap());
            assert_eq!(indptr.len(), samples.len() + 1);
            assert_eq!((indptr[0], *indptr.last().unwrap() as usize), (0, indices.len()));
            for (row, &sample) in samples.iter().enumerate() {
                let token = (0..spec.seq)
                    .find(|&t| (0..8).all(|d| SyntheticSpec::value(sample as u64, t, 0, d) == hook[row][d]))
                    .expect("the row's token");
                let mut want = spec.firings(sample as u64, token, c);
                want.sort_by_key(|&(l, _)| l);
                let span = indptr[row] as usize..indptr[row + 1] as usize;
                let got: Vec<(i32, f32)> =
                    indices[span.clone()].iter().copied().zip(values[span].iter().copied()).collect();
                let want: Vec<(i32, f32)> = want.into_iter().map(|(l, v)| (l, stored(dtype, v))).collect();
                assert_eq!(got, want, "{}: sample {sample} token {token}", column.name);
                if mask.as_ref().is_none_or(|m| m[row]) {
                    for (l, v) in got {
                        firings[c][l as usize] += 1;
                        sums[c][l as usize] += f64::from(v);
                        max[c][l as usize] = max[c][l as usize].max(f64::from(v));
                    }
                }
            }
        }
        seen += samples.len();
    }
    let included: u64 =
        (0..batches * spec.batch as u64).map(|s| (0..spec.seq).filter(|&t| spec.keep(s, t)).count() as u64).sum();
    let all = batches as usize * spec.batch * spec.seq;
    assert_eq!(seen, if keep_excluded { all } else { included as usize });
    let stats: siphon_store::StatsFile =
        serde_json::from_slice(&std::fs::read(dir.join(RUN).join("stats.json")).unwrap()).unwrap();
    for (c, column) in spec.latents.iter().enumerate() {
        let s = &stats.latents[&column.name];
        assert_eq!((s.count, &s.firings, &s.max), (included, &firings[c], &max[c]), "{}", column.name);
        for (a, b) in s.sums.iter().zip(&sums[c]) {
            assert!((a - b).abs() <= 1e-12 * b.abs(), "{}: sum {a} vs {b}", column.name);
        }
    }
    let report = siphon_store::verify_run_blocking(dir.to_str().unwrap(), &[], RUN).unwrap();
    assert!(report.is_ok(), "{:?}", report.all_problems());
}

#[test]
fn latents_are_stored_as_csr_rows_of_the_stored_tokens() {
    let spec = spec();
    for (dtype, shuffle, keep_excluded) in
        [(DType::F32, false, false), (DType::Bf16, true, false), (DType::F16, false, true), (DType::Bf16, true, true)]
    {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            &spec,
            |c| {
                c.format.dtype = dtype;
                c.format.keep_excluded = keep_excluded;
                c.format.shuffle = shuffle.then_some(ShuffleConfig { seed: 5, window_batches: 2 });
            },
            6,
        );
        check_run(dir.path(), &spec, dtype, 6, keep_excluded);
    }
}

#[test]
fn latents_alone_need_no_hook() {
    let mut spec = spec();
    spec.hooks.clear();
    spec.shapes.clear();
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &spec, |_| {}, 2);
    let report = siphon_store::verify_run_blocking(dir.path().to_str().unwrap(), &[], RUN).unwrap();
    assert!(report.is_ok(), "{:?}", report.all_problems());
    assert!(report.tokens > 0);
}

#[test]
fn a_token_over_the_cap_and_bad_columns_are_refused_by_name() {
    let spec = spec();
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig::new(dir.path().to_str().unwrap(), RUN, HOST);
    let mut writer = ShardWriter::open(config.clone(), descriptor(&spec)).unwrap();
    let mut batch = spec.batch(0);
    // Token 5 of the first sequence fires 7 of the first column's latents, one past its cap.
    let mut firings = batch.latents[0].firings.to_vec();
    firings[20..24].copy_from_slice(&7i32.to_le_bytes());
    batch.latents[0].firings = firings.into();
    writer.push(batch).unwrap();
    let err = writer.finish().unwrap_err().to_string();
    assert!(
        err.contains(NAME)
            && err.contains("sequence 0 position 5")
            && err.contains("fires 7 latents, more than the 6 kept"),
        "{err}"
    );

    let refused = |descriptor: RunDescriptor, dtype: DType| {
        let dir = tempfile::tempdir().unwrap();
        let mut config = StoreConfig::new(dir.path().to_str().unwrap(), RUN, HOST);
        config.format.dtype = dtype;
        ShardWriter::open(config, descriptor).err().expect("refused").to_string()
    };
    let err = refused(descriptor(&spec), DType::Fp8);
    assert!(err.contains("latents are stored as f32, bf16 or f16, not fp8"), "{err}");
    let mut clash = descriptor(&spec);
    clash.latents[1].name = clash.hooks[0].clone();
    assert!(refused(clash, DType::F32).contains("already a hook's"));
    let mut wide = descriptor(&spec);
    wide.latents[0].cap = 51;
    let err = refused(wide, DType::F32);
    assert!(err.contains(&format!("latents {NAME}: 51 kept per token of 50 latents")), "{err}");

    // A batch whose latents do not match the run's, or whose parts have the wrong size.
    let mut writer = ShardWriter::open(config, descriptor(&spec)).unwrap();
    let mut batch = spec.batch(0);
    batch.latents.pop();
    assert!(writer.push(batch).unwrap_err().to_string().contains("differ from the run's latents"));
    let mut batch = spec.batch(0);
    batch.latents[0].values = batch.latents[0].values.slice(4..);
    let err = writer.push(batch).unwrap_err().to_string();
    assert!(err.contains("bytes of values"), "{err}");
}

#[test]
fn verify_names_a_csr_row_that_is_out_of_order() {
    let spec = spec();
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &spec, |c| c.format.dtype = DType::F32, 2);
    let shard = dir.path().join(RUN).join(HOST.dir_name()).join("shard_000000.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let [indptr, indices, _] = spec.latents[0].tensor_names();
    let offsets = i32s(&st.tensor(&indptr).unwrap());
    let row = offsets.windows(2).position(|w| w[1] - w[0] >= 2).expect("a row of two firings");
    let (header_len, metadata) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let start = 8 + header_len + metadata.info(&indices).unwrap().data_offsets.0 + 4 * offsets[row] as usize;
    // Swap the row's first two latents.
    let (a, b) = (bytes[start..start + 4].to_vec(), bytes[start + 4..start + 8].to_vec());
    bytes[start..start + 4].copy_from_slice(&b);
    bytes[start + 4..start + 8].copy_from_slice(&a);
    std::fs::write(&shard, &bytes).unwrap();
    let report = siphon_store::verify_run_blocking(dir.path().to_str().unwrap(), &[], RUN).unwrap();
    let problems = report.all_problems().join("\n");
    // The CRC names the change first; the summary names the row when the checksum is not asked.
    assert!(problems.contains("shard_000000") && problems.contains("crc32c"), "{problems}");
    let summary = siphon_store::summarize_shard("s", &bytes, &spec.hooks, &spec.shapes, &spec.latents, &spec.outputs)
        .unwrap_err();
    assert!(summary.to_string().contains(&format!("latents {NAME}: row {row}'s latents")), "{summary}");
}

#[test]
fn verify_names_each_column_whose_statistics_are_wrong() {
    let spec = spec();
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &spec, |c| c.format.dtype = DType::F32, 2);
    let path = dir.path().join(RUN).join(HOST.dir_name()).join("stats.json");
    let mut stats: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let hook = &spec.hooks[0];
    stats["hooks"][hook]["count"] = (stats["hooks"][hook]["count"].as_u64().unwrap() + 1).into();
    stats["latents"][NAME]["firings"].as_array_mut().unwrap().pop();
    std::fs::write(&path, serde_json::to_vec(&stats).unwrap()).unwrap();
    let report = siphon_store::verify_run_blocking(dir.path().to_str().unwrap(), &[], RUN).unwrap();
    let problems = report.all_problems().join("\n");
    assert!(problems.contains(&format!("stats.json: hook {hook} counts")), "{problems}");
    assert!(
        problems.contains(&format!("stats.json: latents {NAME} has statistics of 49 latents, run.json says 50")),
        "{problems}"
    );
    assert!(!problems.contains(&format!("latents {NAME}.second")), "{problems}");
}
