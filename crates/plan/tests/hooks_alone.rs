//! Any hook alone. For every fixture model (each family, its GGUF files, its multimodal
//! checkpoints and, where it has quantized weights, its stored-weight form), every hook
//! requested alone builds, loads and runs, equals its value in the run that asks for every hook
//! at once (within [`ULPS`]), and the planner counts exactly the bytes the engine uploads for
//! it. Then the same on a 2 x 4 mesh for a sample of families.
//!
//! Which single hooks: a forward builds whole blocks, up to the last one its hooks need, and
//! the final norm only when a hook is after it. Two hooks of one block so share a program
//! shape (the same blocks and weights, another result), and a kind's hooks at two layers of
//! one *layer class* (the same hook kinds with the same shapes, the same windowing, the same
//! KV sharing) differ only in how many such blocks come first. So: each kind once, at the
//! first layer that has it; the first layer of every other class, by its `hook_resid_post`
//! (the whole block); the first block's `hook_resid_pre` (no block at all) and the last
//! block's `hook_resid_post` (every block, no final norm), and `ln_final.hook_out` (the final
//! norm too). These last ones, the *program shapes*, are the distinct sets of weights a
//! forward reads.
//!
//! A family's own fixture runs every one of them. Its GGUF files, its multimodal checkpoint
//! and its quantized checkpoints read dequantized give the same family's programs over
//! weights read their own way, and a quantized checkpoint's weights kept stored add their
//! dequantization to each weight the program reads, whatever the hook: for these variants,
//! every single hook's engine is built and loaded and its upload checked against the
//! planner, and the program shapes run.
//!
//! Programs compile at XLA's optimization level 0 (see [`ULPS`]), which also compiles faster.
//!
//! Needs the plugin from `SIPHON_PJRT_PLUGIN` (scripts/test.sh sets it); without that
//! variable the test prints a note and returns.

mod common;

use std::path::PathBuf;
use std::time::Instant;

use siphon_engine::{Batch, Engine, EngineOptions, ShardingPlan, WeightForm};
use siphon_models::hooks::Scope;
use siphon_models::{HookKind, HookPoint, LoadedModel, ModelConfig, hook_kinds, layer_hook_kinds};
use siphon_plan::{MeshKind, MeshRequest, Plan, PlanRequest, Topology};
use siphon_runtime::Client;

/// A fixture model and the form its weights take on the devices.
struct Case {
    name: String,
    model: LoadedModel,
    weights: WeightForm,
}

impl Case {
    fn open(name: &str, weights: WeightForm) -> Case {
        let path = common::fixtures().join(name);
        let model = LoadedModel::open(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let name = match weights {
            WeightForm::Stored => format!("{name} (stored)"),
            WeightForm::Dequantized => name.to_string(),
        };
        Case { name, model, weights }
    }

    /// A GGUF file, a multimodal checkpoint or quantized weights: its family's programs over
    /// weights read its own way (see the module docs).
    fn variant(&self) -> bool {
        let quantized = || !self.model.stored_forms(self.model.config.n_layers).unwrap().is_empty();
        self.name.ends_with(".gguf") || self.name.ends_with("-mm") || quantized()
    }
}

/// Every model under fixtures/models (HF directories and GGUF files), and again with its
/// weights kept stored where it has quantized ones.
fn cases() -> Vec<Case> {
    let root = common::fixtures();
    let mut names: Vec<String> = Vec::new();
    for dir in ["", "gguf"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.join("config.json").is_file() || path.extension().is_some_and(|e| e == "gguf") {
                let file = PathBuf::from(dir).join(path.file_name().unwrap());
                names.push(file.to_string_lossy().into_owned());
            }
        }
    }
    names.sort();
    let mut cases = Vec::new();
    for name in names {
        let case = Case::open(&name, WeightForm::Dequantized);
        if !case.model.stored_forms(case.model.config.n_layers).unwrap().is_empty() {
            cases.push(Case::open(&name, WeightForm::Stored));
        }
        cases.push(case);
    }
    assert!(cases.len() >= 40, "found only {} fixture models under {}", cases.len(), root.display());
    cases
}

/// Every hook `config`'s forward produces, at every layer.
fn every_hook(config: &ModelConfig) -> Vec<HookPoint> {
    let kinds = hook_kinds(config);
    let model = |scope| kinds.iter().filter(move |k| k.info().scope == scope).map(|&k| HookPoint::model(k));
    let blocks = (0..config.n_layers).flat_map(|l| layer_hook_kinds(config, l).into_iter().map(move |k| (l, k)));
    model(Scope::Input).chain(blocks.map(|(l, k)| HookPoint::block(l, k))).chain(model(Scope::Output)).collect()
}

/// What tells layers apart for the hooks they give: their kinds with each one's shape, whether
/// they attend in a window, and whether they read an earlier layer's keys and values.
fn layer_class(config: &ModelConfig, layer: usize) -> (Vec<(HookKind, Vec<usize>)>, bool, bool) {
    let kinds = layer_hook_kinds(config, layer);
    let shapes = kinds.into_iter().map(|k| (k, HookPoint::block(layer, k).dims(config, SEQ))).collect();
    (shapes, config.window(layer).is_some(), config.kv_source(layer).is_some())
}

/// The hooks asked for alone (see the module docs for the choice): each kind once, then the
/// program shapes.
fn single_hooks(config: &ModelConfig) -> Vec<HookPoint> {
    let n = config.n_layers;
    let first_layer = |kind| (0..n).find(|&l| layer_hook_kinds(config, l).contains(&kind));
    let mut hooks: Vec<HookPoint> = hook_kinds(config)
        .into_iter()
        .filter_map(|kind| match kind.info().scope {
            Scope::Block => first_layer(kind).map(|l| HookPoint::block(l, kind)),
            _ => Some(HookPoint::model(kind)),
        })
        .collect();
    hooks.extend(program_shapes(config).into_iter().filter(|h| !hooks.contains(h)).collect::<Vec<_>>());
    hooks
}

/// One hook for each distinct set of weights a forward reads: the first block's
/// `hook_resid_pre`, each layer class's first `hook_resid_post`, the last block's, and the
/// final norm's output.
fn program_shapes(config: &ModelConfig) -> Vec<HookPoint> {
    let n = config.n_layers;
    let classes: Vec<_> = (0..n).map(|l| layer_class(config, l)).collect();
    let first_of_class = (0..n).filter(|&l| !classes[..l].contains(&classes[l]));
    let mut layers: Vec<usize> = first_of_class.chain([n - 1]).collect();
    layers.dedup();
    let resid_post = layers.into_iter().map(|l| HookPoint::block(l, HookKind::ResidPost));
    let first = HookPoint::block(0, HookKind::ResidPre);
    [first].into_iter().chain(resid_post).chain([HookPoint::model(HookKind::LnFinalOut)]).collect()
}

const SEQ: usize = 6;

/// `rows` rows of `SEQ` tokens, the odd ones right-padded by two.
fn batch(config: &ModelConfig, rows: usize) -> Batch {
    let vocab = config.vocab_size as u32;
    let ids = (0..rows as u32).map(|r| (0..SEQ as u32).map(|t| (r * 37 + t * 11 + 3) % vocab).collect()).collect();
    let mask = (0..rows).map(|r| (0..SEQ).map(|t| u8::from(r % 2 == 0 || t < SEQ - 2)).collect()).collect();
    Batch::new(ids, Some(mask)).unwrap()
}

/// How far a hook alone may be from its value among all hooks, in ulps of the hook's scale
/// (its largest magnitude). XLA's CPU fusion choices change with a program's results and
/// reorder a few sums: at its default optimization level by up to 30 ulps six Gemma 4 blocks
/// deep. At level 0 ([`client`]) the values are bit-equal for every family but the
/// linear-attention hybrids (Qwen3.5, Qwen3-Next: up to 13 ulps from their first linear
/// attention on) and Gemma 4 on a mesh (2 ulps). A wrong weight, block or norm is off by
/// thousands.
const ULPS: f32 = 16.0;

/// A client of the CPU plugin with 8 devices whose programs compile at XLA's optimization
/// level 0 (see [`ULPS`]): `XLA_FLAGS` is read when the plugin first compiles, and every test
/// of this binary sets it here, once, before it loads the plugin.
fn client(what: &str) -> Option<Client> {
    static FLAGS: std::sync::Once = std::sync::Once::new();
    FLAGS.call_once(|| {
        let flags = std::env::var("XLA_FLAGS").unwrap_or_default();
        // SAFETY: no other thread of this binary reads the environment meanwhile: each test
        // comes here first, and the plugin, the only other reader, is not loaded yet.
        unsafe { std::env::set_var("XLA_FLAGS", format!("{flags} --xla_backend_optimization_level=0")) };
    });
    common::cpu_client(what)
}

/// The distance from `|x|` to the next larger f32.
fn ulp(x: f32) -> f32 {
    let x = x.abs();
    f32::from_bits(x.to_bits() + 1) - x
}

/// Checks every single hook of `case` on the mesh `options` hold against the all-hooks run,
/// and the planner's weight bytes (`plan` for the hook) against the engine's upload. Returns
/// how many single-hook programs ran.
fn check(
    client: &Client,
    case: &Case,
    options: &EngineOptions,
    rows: usize,
    plan: impl Fn(&[HookPoint]) -> (Plan, EngineOptions),
) -> usize {
    let config = &case.model.config;
    let batch = batch(config, rows);
    let everything = Engine::new(client, &case.model, every_hook(config), options.clone())
        .and_then(|engine| engine.run(&batch))
        .unwrap_or_else(|e| panic!("{}: every hook: {e}", case.name));
    let shapes = program_shapes(config);
    let mut ran = 0;
    for hook in single_hooks(config) {
        let (plan, options) = plan(&[hook]);
        let engine = Engine::new(client, &case.model, vec![hook], options)
            .unwrap_or_else(|e| panic!("{}: {hook} alone: {e}", case.name));
        let devices = plan.mesh.num_devices() as u64;
        let uploaded = engine.load_stats().uploaded_bytes as u64;
        assert_eq!(
            plan.memory.weights.sharded_bytes * devices,
            uploaded,
            "{}: {hook} alone: the planner counts {} bytes a device, the engine uploads {uploaded} over {devices}",
            case.name,
            plan.memory.weights.sharded_bytes
        );
        if case.variant() && !shapes.contains(&hook) {
            continue;
        }
        let alone = engine.run(&batch).unwrap_or_else(|e| panic!("{}: {hook} alone: {e}", case.name));
        ran += 1;
        let (got, want) = (alone.get(hook).unwrap(), everything.get(hook).unwrap());
        assert_eq!(got.shape(), want.shape(), "{}: {hook}", case.name);
        let (got, want) = (got.to_f32(), want.to_f32());
        // Masked attention scores (the most negative f32) do not set the scale.
        let scale = want.iter().filter(|x| **x > f32::MIN).fold(0f32, |m, x| m.max(x.abs()));
        let diff = got.iter().zip(&want).fold(0f32, |m, (x, y)| {
            // A NaN counts as infinitely far (`max` would drop it).
            let e = (x - y).abs();
            if e.is_nan() { f32::INFINITY } else { m.max(e) }
        });
        let ulps = diff / ulp(scale);
        assert!(
            ulps <= ULPS,
            "{}: {hook} alone differs from the all-hooks run by {diff:e}, {ulps} ulps of its scale {scale}",
            case.name,
        );
    }
    ran
}

/// The planner's request for `hooks` of `case` at batch `rows` x [`SEQ`] in f32.
fn request(case: &Case, hooks: &[HookPoint], rows: usize, mesh: MeshRequest) -> PlanRequest {
    let config = &case.model.config;
    let (blocks, _) = siphon_models::forward::blocks_needed(config, hooks);
    let stored = match case.weights {
        WeightForm::Stored => case.model.stored_forms(blocks).unwrap(),
        WeightForm::Dequantized => Default::default(),
    };
    PlanRequest {
        mesh,
        dtype: siphon_plan::DType::F32,
        batch: Some(rows),
        seq: Some(SEQ),
        hooks: Some(hooks.to_vec()),
        stored,
        ..PlanRequest::default()
    }
}

/// Every single hook of the cases `which` picks, on one device.
fn on_one_device(which: impl Fn(&Case) -> bool) {
    let Some(client) = client("the single-hook test") else { return };
    let one = Topology::uniform(1, 1).unwrap();
    let mut models = 0;
    for case in cases().into_iter().filter(|c| which(c)) {
        let start = Instant::now();
        let options =
            EngineOptions { weights: case.weights, plan: ShardingPlan::Replicated, ..EngineOptions::default() };
        let ran = check(&client, &case, &options, 2, |hooks| {
            let request = request(&case, hooks, 2, MeshRequest::default());
            (siphon_plan::plan(&case.model.config, &one, &request).unwrap(), options.clone())
        });
        eprintln!("{}: {ran} single-hook programs in {:.1} s", case.name, start.elapsed().as_secs_f64());
        models += 1;
    }
    assert!(models > 0, "no fixture model was picked");
}

// Tests over one device in four groups of about equal time, so that the harness spreads the
// cases over the cores.

#[test]
fn every_hook_alone_of_the_families_a_to_g() {
    on_one_device(|c| !c.variant() && c.name.as_str() < "tiny-h");
}

#[test]
fn every_hook_alone_of_the_families_h_to_z() {
    on_one_device(|c| !c.variant() && c.name.as_str() >= "tiny-h");
}

#[test]
fn every_hook_alone_of_the_gguf_multimodal_and_quantized_fixtures() {
    on_one_device(Case::variant);
}

#[test]
fn every_hook_alone_on_a_mesh() {
    let Some(client) = client("the single-hook mesh test") else { return };
    // 2 hosts x 4 devices: data=2, fsdp=2, model=2 where the heads allow it.
    let topology = Topology::uniform(2, 4).unwrap();
    let mesh = MeshRequest { kind: MeshKind::TwoD, ..MeshRequest::default() };
    // A plain decoder, per-layer inputs and KV sharing, MLA with a routed mixture.
    for name in ["tiny-llama", "tiny-gemma4", "tiny-deepseek-v3"] {
        let start = Instant::now();
        let case = Case::open(name, WeightForm::Dequantized);
        let plan_for = |hooks: &[HookPoint]| {
            let plan = siphon_plan::plan(&case.model.config, &topology, &request(&case, hooks, 4, mesh)).unwrap();
            let options = common::planned_options(&plan);
            (plan, options)
        };
        let (_, options) = plan_for(&every_hook(&case.model.config));
        let ran = check(&client, &case, &options, 4, plan_for);
        eprintln!("{name} on a mesh: {ran} single-hook programs in {:.1} s", start.elapsed().as_secs_f64());
    }
}

#[test]
fn the_choice_of_single_hooks_covers_every_kind_and_layer_class() {
    // Gemma 4's fixture: sliding layers, a global one with its own head width, and KV sharing.
    let config = Case::open("tiny-gemma4", WeightForm::Dequantized).model.config;
    let singles = single_hooks(&config);
    for kind in hook_kinds(&config) {
        assert!(singles.iter().any(|h| h.kind() == kind), "{kind:?} is not asked for alone");
    }
    let whole: Vec<usize> =
        singles.iter().filter(|h| h.kind() == HookKind::ResidPost).filter_map(|h| h.layer()).collect();
    let windowed = |l: &usize| config.window(*l).is_some();
    let shared = |l: &usize| config.kv_source(*l).is_some();
    assert!(whole.iter().any(windowed) && whole.iter().any(|l| !windowed(l)), "{whole:?}");
    assert!(whole.iter().any(shared) && whole.iter().any(|l| !shared(l)), "{whole:?}");
    assert!(whole.contains(&(config.n_layers - 1)), "{whole:?}");
}
