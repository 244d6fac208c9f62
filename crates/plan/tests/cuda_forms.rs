//! Where programs for a CUDA plugin call cuDNN's fused attention (`__cudnn$fmhaSoftmax`) and
//! the grouped expert products (`siphon_grouped_matmul`), for every fixture family: the form
//! each block takes and the grouped calls are pinned in `tests/cuda_forms.txt`
//! (`UPDATE_EXPECT=1` rewrites it; review the diff), the program calls cuDNN exactly in the
//! blocks that say so, and left-padded rows, f32 compute or a hooked pattern keep XLA's form;
//! the experts take three grouped products per mixture block, on one device and on each
//! device's part of a mesh (a manual computation each), where cuDNN's calls are too.
//! Whether the calls run right on a GPU is for a GPU (`scripts/bench-gpu.sh kernels`); the
//! grouped products' values are checked on the CPU plugin (`crates/engine/tests/fixtures.rs`).

use std::path::{Path, PathBuf};

use siphon_models::{AttentionForm, DType, ForwardSpec, HookKind, HookPoint, LoadedModel, ModelConfig, build_forward};

fn configs() -> Vec<(String, ModelConfig)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models");
    let mut out = Vec::new();
    for dir in ["", "gguf"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path: PathBuf = entry.unwrap().path();
            if path.join("config.json").is_file() || path.extension().is_some_and(|e| e == "gguf") {
                let name = Path::new(dir).join(path.file_name().unwrap()).to_string_lossy().into_owned();
                out.push((name, LoadedModel::open(&path).unwrap().config));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn spec(hooks: Vec<HookPoint>, cudnn: bool) -> ForwardSpec {
    let mut spec = ForwardSpec::new(2, 8, hooks);
    spec.compute_dtype = DType::Bf16.into();
    spec.output_dtype = DType::Bf16.into();
    spec.cudnn_attention = cudnn;
    spec
}

fn calls(text: &str) -> usize {
    text.matches(siphon_models::cudnn::TARGET).count()
}

fn grouped_calls(text: &str) -> usize {
    text.matches(&format!("@{}(", siphon_kernels::grouped::TARGET)).count()
}

#[test]
fn every_family_calls_cudnn_exactly_where_its_blocks_can_take_it() {
    let mut table = String::new();
    let mut fused = 0;
    for (name, config) in configs() {
        let last = HookPoint::block(config.n_layers - 1, HookKind::ResidPost);
        let program = build_forward(&config, &spec(vec![last], true)).unwrap();
        let forms = &program.attention;
        let cudnn = forms.iter().filter(|(_, f)| *f == AttentionForm::Cudnn).count();
        assert_eq!(calls(&program.text), cudnn, "{name}: one call per block that takes cuDNN");
        fused += cudnn;
        assert_eq!(grouped_calls(&program.text), 0, "{name}: grouped products only when asked for");
        let mut grouped_spec = spec(vec![last], true);
        grouped_spec.grouped_experts = true;
        let grouped = grouped_calls(&build_forward(&config, &grouped_spec).unwrap().text);
        assert_eq!(grouped % 3, 0, "{name}: gate, up and down per mixture block");
        let experts = if grouped == 0 { String::new() } else { format!("; experts: {grouped} grouped products") };
        table.push_str(&format!("{name}: {}{experts}\n", siphon_models::cudnn::summary(forms)));
        if grouped > 0 {
            // f32 takes the same products; so does a mesh, each device's part in a manual
            // computation (experts split over `model`).
            grouped_spec.compute_dtype = DType::F32.into();
            assert_eq!(grouped_calls(&build_forward(&config, &grouped_spec).unwrap().text), grouped, "{name}");
            let mesh = siphon_mesh::Mesh::new(&[("data", 2), ("model", 2)], vec![0, 1, 2, 3]).unwrap();
            let mut meshed = spec(vec![last], false).with_megatron_plan(&config, mesh);
            meshed.grouped_experts = true;
            let text = build_forward(&config, &meshed).unwrap().text;
            assert_eq!(grouped_calls(&text), grouped, "{name} on a mesh");
            let manual = text.matches("sdy.manual_computation").count();
            assert_eq!(manual, grouped / 3, "{name}: one manual computation per mixture block");
            meshed.grouped_experts = false;
            assert_eq!(grouped_calls(&build_forward(&config, &meshed).unwrap().text), 0, "{name}: rounds on a mesh");
        }

        // On a mesh (rows over `data`, heads over `model`): the same forms where the heads
        // split over `model`, each block's call on each device's part.
        let mesh = siphon_mesh::Mesh::new(&[("data", 2), ("model", 2)], vec![0, 1, 2, 3]).unwrap();
        let meshed = spec(vec![last], true).with_megatron_plan(&config, mesh);
        let program = build_forward(&config, &meshed).unwrap();
        let splits = config.attention.n_heads.is_multiple_of(2)
            && (0..config.n_layers).all(|l| config.kv_heads_at(l).is_multiple_of(2));
        if splits {
            assert_eq!(program.attention, *forms, "{name} on a mesh");
        }
        let on_mesh = program.attention.iter().filter(|(_, f)| *f == AttentionForm::Cudnn).count();
        assert_eq!(calls(&program.text), on_mesh, "{name} on a mesh: one call per cuDNN block");
        assert_eq!(program.text.matches("sdy.manual_computation").count(), on_mesh, "{name}");

        // Left-padded rows (the flag off): XLA's form everywhere, the program as on the CPU.
        let left = build_forward(&config, &spec(vec![last], false)).unwrap();
        assert_eq!(calls(&left.text), 0, "{name}");
        assert!(left.attention.iter().all(|(_, f)| matches!(f, AttentionForm::Xla(_))), "{name}");
        // f32 compute: XLA's form.
        let mut f32_spec = spec(vec![last], true);
        f32_spec.compute_dtype = DType::F32.into();
        assert_eq!(calls(&build_forward(&config, &f32_spec).unwrap().text), 0, "{name}");

        // A block whose pattern is hooked keeps XLA's form (its probabilities are an output);
        // the others keep theirs.
        if let Some(&(layer, _)) = forms.iter().find(|(_, f)| *f == AttentionForm::Cudnn)
            && siphon_models::layer_hook_kinds(&config, layer).contains(&HookKind::AttnPattern)
        {
            let hooked = vec![last, HookPoint::block(layer, HookKind::AttnPattern)];
            let program = build_forward(&config, &spec(hooked, true)).unwrap();
            let form = &program.attention.iter().find(|(l, _)| *l == layer).unwrap().1;
            assert_eq!(*form, AttentionForm::Xla("its scores or pattern are hooked".into()), "{name}");
            assert_eq!(calls(&program.text), cudnn - 1, "{name}");
        }
    }
    assert!(fused > 0, "some fixture block takes cuDNN's form");
    let path = format!("{}/tests/cuda_forms.txt", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(&path, &table).unwrap();
        return;
    }
    let expected =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e} (UPDATE_EXPECT=1 creates it)"));
    assert!(expected == table, "the forms differ from {path} (UPDATE_EXPECT=1 to accept):\n{table}");
}

/// `siphon plan` says which form each block's attention takes on a CUDA plugin: for a bf16
/// batch the blocks' forms on the plan's mesh, on a TPU slice or in f32 nothing.
#[test]
fn the_plan_says_where_cudnn_attention_runs() {
    use siphon_plan::{DeviceLayout, PlanRequest, Topology};
    let config = |name: &str| configs().into_iter().find(|(n, _)| n == name).unwrap().1;
    let request = PlanRequest { batch: Some(2), seq: Some(8), ..Default::default() };
    let note = |config: &ModelConfig, devices: usize, request: &PlanRequest| {
        let plan = siphon_plan::plan(config, &Topology::uniform(1, devices).unwrap(), request).unwrap();
        assert!(!plan.notes.iter().any(|n| n.starts_with("on a CUDA plugin")), "only siphon plan asks for it");
        siphon_plan::cuda_attention(config, &plan, request)
    };
    let llama = config("tiny-llama");
    assert_eq!(
        note(&llama, 1, &request).as_deref(),
        Some("on a CUDA plugin (right-padded rows): cuDNN fused: blocks 0-2")
    );
    let gemma2 = config("tiny-gemma2");
    assert_eq!(
        note(&gemma2, 1, &request).as_deref(),
        Some("on a CUDA plugin (right-padded rows): XLA (soft-capped scores): blocks 0-2")
    );
    assert_eq!(
        note(&llama, 2, &request).as_deref(),
        Some("on a CUDA plugin (right-padded rows): cuDNN fused: blocks 0-2"),
        "on a mesh of 2 (heads over model)"
    );
    let f32_request = PlanRequest { dtype: DType::F32, ..request.clone() };
    assert_eq!(note(&llama, 1, &f32_request), None);
    let tpu = PlanRequest { layout: DeviceLayout::TpuTiled, ..request.clone() };
    assert_eq!(note(&llama, 1, &tpu), None);
    let no_shape = PlanRequest { batch: None, ..request };
    assert_eq!(note(&llama, 1, &no_shape), None);
}
