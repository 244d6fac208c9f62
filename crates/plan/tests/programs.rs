//! Every program siphon emits for the fixture models, pinned by its sha256: one device and the
//! planner's 2 × 4 mesh and the fixed plan on `data=2,model=4`, f32 and bf16, four hook sets (every hook, the first block's input,
//! one block's residual and attention pattern, the final norm). A change to the models crate
//! that is meant to leave the programs alone (a refactor) must leave this file's hashes
//! unchanged; one that changes programs on purpose regenerates them and says why:
//!
//! ```text
//! SIPHON_WRITE_PROGRAM_HASHES=1 cargo test -p siphon-plan --test programs
//! ```
//!
//! The hashes are of the StableHLO text, so they cover every op, shape, sharding annotation
//! and argument order. Building needs no plugin (the builder is pure Rust). Each fixture's
//! config as run.json serializes it is pinned beside its programs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use siphon_mesh::Mesh;
use siphon_models::hooks::Scope;
use siphon_models::{DType, ForwardSpec, HookKind, HookPoint, LoadedModel, ModelConfig, build_forward};
use siphon_plan::{MeshKind, MeshRequest, PlanRequest, Topology};

const HASHES: &str = "tests/programs.sha256";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models")
}

/// Every fixture model's config: the HF directories and the GGUF files.
fn configs() -> Vec<(String, ModelConfig)> {
    let root = fixtures();
    let mut out = Vec::new();
    for dir in ["", "gguf"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.join("config.json").is_file() || path.extension().is_some_and(|e| e == "gguf") {
                let name = Path::new(dir).join(path.file_name().unwrap()).to_string_lossy().into_owned();
                out.push((name, LoadedModel::open(&path).unwrap().config));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The hook sets: every hook of every layer, and three small ones.
fn hook_sets(config: &ModelConfig) -> Vec<(&'static str, Vec<HookPoint>)> {
    let n = config.n_layers;
    let kinds = siphon_models::hook_kinds(config);
    let model = |scope| kinds.iter().filter(move |k| k.info().scope == scope).map(|&k| HookPoint::model(k));
    let blocks = (0..n).flat_map(|l| siphon_models::layer_hook_kinds(config, l).into_iter().map(move |k| (l, k)));
    let all = model(Scope::Input).chain(blocks.map(|(l, k)| HookPoint::block(l, k))).chain(model(Scope::Output));
    let last = n - 1;
    let mut middle = vec![HookPoint::block(last, HookKind::ResidPost)];
    if siphon_models::layer_hook_kinds(config, last).contains(&HookKind::AttnPattern) {
        middle.push(HookPoint::block(last, HookKind::AttnPattern));
    }
    vec![
        ("all", all.collect()),
        ("first", vec![HookPoint::block(0, HookKind::ResidPre)]),
        ("middle", middle),
        ("final", vec![HookPoint::model(HookKind::LnFinalOut)]),
    ]
}

/// Each program's name and the sha256 of its text.
fn program_hashes() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let topology = Topology::uniform(2, 4).unwrap();
    for (name, config) in configs() {
        // The config as run.json holds it: a resumed run compares it with the stored one, so a
        // reshaped ModelConfig must serialize the same.
        // Keys sorted (as run.json is compared: by value, not by text).
        let value = serde_json::to_value(&config).unwrap();
        let read: ModelConfig = serde_json::from_value(value.clone()).unwrap();
        assert_eq!(read, config, "{name}: the config does not read back as it was written");
        let json = value.to_string();
        out.insert(format!("{name} run.json config"), sha256(&json));
        for (set, hooks) in hook_sets(&config) {
            for dtype in [DType::F32, DType::Bf16] {
                let mut spec = ForwardSpec::new(4, 8, hooks.clone());
                spec.compute_dtype = dtype.into();
                spec.output_dtype = dtype.into();
                let one = build_forward(&config, &spec).unwrap_or_else(|e| panic!("{name} {set}: {e}"));
                out.insert(format!("{name} one {dtype} {set}"), sha256(&one.text));
                let request = PlanRequest {
                    mesh: MeshRequest { kind: MeshKind::TwoD, ..MeshRequest::default() },
                    batch: Some(4),
                    seq: Some(8),
                    hooks: Some(hooks.clone()),
                    ..PlanRequest::default()
                };
                let plan = siphon_plan::plan(&config, &topology, &request).unwrap();
                spec.mesh = plan.mesh.clone();
                spec.param_specs = plan.param_specs().iter().cloned().collect();
                spec.input_spec = Some(plan.input_spec.clone());
                let mesh = build_forward(&config, &spec).unwrap_or_else(|e| panic!("{name} {set} mesh: {e}"));
                out.insert(format!("{name} 2x4 {dtype} {set}"), sha256(&mesh.text));
                // The fixed Megatron-style plan of an explicit `--mesh data=2,model=4`.
                let axes = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
                let mut fixed = ForwardSpec::new(4, 8, hooks.clone()).with_megatron_plan(&config, axes);
                fixed.compute_dtype = dtype.into();
                fixed.output_dtype = dtype.into();
                let fixed = build_forward(&config, &fixed).unwrap_or_else(|e| panic!("{name} {set} fixed: {e}"));
                out.insert(format!("{name} data=2,model=4 {dtype} {set}"), sha256(&fixed.text));
            }
        }
    }
    out
}

fn sha256(text: &str) -> String {
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn every_program_is_the_one_pinned() {
    let got = program_hashes();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(HASHES);
    if std::env::var_os("SIPHON_WRITE_PROGRAM_HASHES").is_some() {
        let text: String = got.iter().map(|(name, hash)| format!("{hash}  {name}\n")).collect();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let want: BTreeMap<String, String> = text
        .lines()
        .map(|line| {
            let (hash, name) = line.split_once("  ").unwrap();
            (name.to_string(), hash.to_string())
        })
        .collect();
    assert!(want.len() > 1000, "only {} pinned programs", want.len());
    let changed: Vec<&String> = want.keys().filter(|name| got.get(*name) != want.get(*name)).collect();
    let new: Vec<&String> = got.keys().filter(|name| !want.contains_key(*name)).collect();
    assert!(
        changed.is_empty() && new.is_empty(),
        "{} programs differ from the pinned ones (first: {:?}), {} are new (first: {:?})",
        changed.len(),
        changed.first(),
        new.len(),
        new.first()
    );
}

/// Weight names are written twice in a family's file: in its inventory (`params`, what the
/// loaders read and the planner counts) and where its builder reads them (`Graph::w`). They
/// agree for every fixture: the forward of every hook reads every weight of the inventory,
/// and nothing else (an extra read fails the build; an unread one would be dropped silently).
#[test]
fn every_fixture_reads_its_whole_inventory() {
    let mut wrong = Vec::new();
    for (name, config) in configs() {
        let (_, all) = hook_sets(&config).swap_remove(0);
        let read: Vec<String> = siphon_models::forward::forward_params(&config, &all)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .into_iter()
            .map(|p| p.name)
            .collect();
        let listed: Vec<String> = config.params(config.n_layers, false).into_iter().map(|p| p.name).collect();
        if read != listed {
            let unread: Vec<&String> = listed.iter().filter(|n| !read.contains(n)).collect();
            wrong.push(format!("{name}: listed but never read: {unread:?}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
