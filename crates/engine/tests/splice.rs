//! Dictionaries spliced into the forward against HF transformers with SAELens's reconstruction
//! hooked in (`fixtures/dictionaries/<name>/golden-splice*.safetensors`, written by
//! scripts/fixtures/gen_splice_fixtures.py: a forward hook on tiny-llama's block 1 replacing its
//! output — its input for `hook_resid_pre` — by `sae.decode(sae.encode(x))`, and by zeros;
//! log-softmax in f64): SAELens's standard, TopK and JumpReLU dictionaries at
//! `blocks.1.hook_resid_post`, the standard one at `blocks.1.hook_resid_pre` too, and its
//! standard and JumpReLU transcoders (reading `blocks.1.ln2.hook_normalized`, their output in
//! place of the MLP's, `blocks.1.hook_mlp_out`). Per token the
//! clean, spliced and ablated NLL and the KL divergences within 1e-5 of HF's (relative,
//! absolute below 1), on one device and on a 2 × 4 mesh; and the run's SAELens metrics
//! (`ce_loss_score`, `kl_div_score`, the mean CEs) computed from them within 1e-4 of those
//! computed from HF's.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{client, fixture};
use safetensors::SafeTensors;
use siphon_engine::{Batch, Engine, EngineOptions, ShardingPlan};
use siphon_mesh::Mesh;
use siphon_models::dictionary::{Dictionary, Encoder};
use siphon_models::{DictionaryHook, HookKind, HookPoint, LoadedModel, NextToken};

fn dictionaries() -> PathBuf {
    fixture("tiny-llama").join("../../dictionaries")
}

struct Golden {
    ids: Vec<Vec<u32>>,
    mask: Vec<Vec<u8>>,
    next_ids: Vec<i32>,
    /// By output name without the hook: `output.nll`, `output.nll.spliced`, ….
    values: Vec<(String, Vec<f32>)>,
    metrics: Vec<f64>,
}

fn golden(path: &Path) -> Golden {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let words = |name: &str| -> Vec<[u8; 4]> {
        st.tensor(name).unwrap().data().chunks_exact(4).map(|b| b.try_into().unwrap()).collect()
    };
    let i32s = |name: &str| -> Vec<i32> { words(name).into_iter().map(i32::from_le_bytes).collect() };
    let seq = st.tensor("input_ids").unwrap().shape()[1];
    let names = [
        "output.nll",
        "output.nll.spliced",
        "output.kl.spliced",
        "output.nll.ablated",
        "output.kl.ablated",
        "output.sq_error.spliced",
    ];
    let values =
        names.iter().map(|n| (n.to_string(), words(n).into_iter().map(f32::from_le_bytes).collect())).collect();
    let metrics = st
        .tensor("metrics")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    Golden {
        ids: i32s("input_ids").chunks(seq).map(|r| r.iter().map(|&t| t as u32).collect()).collect(),
        mask: i32s("attention_mask").chunks(seq).map(|r| r.iter().map(|&m| m as u8).collect()).collect(),
        next_ids: i32s("next_ids"),
        values,
        metrics,
    }
}

/// The dictionary in `dir`, read at `hook` (its own where `None`), with its decoder.
fn spliced(dir: &Path, hook: Option<&str>, model: &LoadedModel) -> DictionaryHook {
    let dictionary = Dictionary::open(dir, None).unwrap();
    let dictionary = match hook {
        Some(hook) => Dictionary { hook: hook.to_string(), ..dictionary },
        None => dictionary,
    };
    let dictionary = dictionary.with_decoder(dir).unwrap();
    let cap = match dictionary.encoder {
        Encoder::TopK { k } => k,
        _ => dictionary.d_sae,
    };
    let hook = HookPoint::parse(&dictionary.hook, &model.config).unwrap();
    DictionaryHook { hook, dictionary: Arc::new(dictionary), cap }
}

/// `got` within 1e-5 of `want` relative (absolute below 1), NaN where `want` is.
fn close(got: f32, want: f32) -> bool {
    match want.is_nan() {
        true => got.is_nan(),
        false => (got - want).abs() <= 1e-5 * want.abs().max(1.0),
    }
}

fn check(name: &str, golden_file: &str, hook: Option<&str>, options: EngineOptions) {
    let model = LoadedModel::open(&fixture("tiny-llama")).unwrap();
    let dir = dictionaries().join(name);
    let g = golden(&dir.join(golden_file));
    let d = spliced(&dir, hook, &model);
    // What the reconstruction replaces: an SAE's own hook, a transcoder's block's MLP output.
    let target = match d.dictionary.transcoder {
        true => HookPoint::block(d.hook.layer().unwrap(), HookKind::MlpOut),
        false => d.hook,
    };
    let at = target.to_string();
    let (mut ids, mut mask) = (g.ids.clone(), g.mask.clone());
    // A data axis that does not divide the golden batch gets copies of the first row (not compared).
    while ids.len() % options.mesh.axis_size_or_one("data") != 0 {
        ids.push(g.ids[0].clone());
        mask.push(g.mask[0].clone());
    }
    let batch = Batch::new(ids, Some(mask)).unwrap();
    let tokens = g.next_ids.len();
    assert_eq!(&batch.next_ids()[..tokens], &g.next_ids[..], "{name}: each token's next as the golden takes it");
    let options = EngineOptions {
        next_token: Some(NextToken { nll: true, ..NextToken::default() }),
        dictionaries: vec![d.clone()],
        ..options
    };
    let engine = Engine::new(&client(), &model, vec![target], options).unwrap();
    let acts = engine.run(&batch).unwrap();
    let names: Vec<&str> = acts.next_token.iter().map(|(n, _)| n.as_str()).collect();
    let expected = [
        "output.nll".to_string(),
        format!("output.nll.spliced.{at}"),
        format!("output.kl.spliced.{at}"),
        format!("output.nll.ablated.{at}"),
        format!("output.kl.ablated.{at}"),
        format!("output.sq_error.spliced.{at}"),
    ];
    assert_eq!(names, expected);
    let seq = g.ids[0].len();
    let real: Vec<usize> = (0..tokens).filter(|&t| g.mask[t / seq][t % seq] == 1).collect();
    let mut ours = Vec::new();
    for ((output, array), (golden_name, want)) in acts.next_token.iter().zip(&g.values) {
        let got = array.to_f32();
        for &t in &real {
            assert!(close(got[t], want[t]), "{name} {output}: token {t}: {} against HF's {}", got[t], want[t]);
        }
        // The run's means in f64 as SAELens takes them: the NLLs over the tokens with a next
        // token, the KLs over every real token.
        let nll = golden_name.starts_with("output.nll");
        assert!(nll || !got.iter().any(|v| v.is_nan()), "{name} {output}: NaN only in an NLL");
        let defined: Vec<f64> =
            real.iter().filter(|&&t| !nll || g.next_ids[t] >= 0).map(|&t| f64::from(got[t])).collect();
        ours.push((golden_name.as_str(), defined.iter().sum::<f64>() / defined.len() as f64));
    }
    let mean = |n: &str| ours.iter().find(|(k, _)| *k == n).unwrap().1;
    // The fraction of variance unexplained: the squared errors' sum over the hook's own
    // total variance, over the real tokens.
    let x = acts.get(target).unwrap().to_f32();
    let width = x.len() / (batch.batch() * seq);
    let rows: Vec<&[f32]> = real.iter().map(|&t| &x[t * width..(t + 1) * width]).collect();
    let centre: Vec<f64> =
        (0..width).map(|j| rows.iter().map(|r| f64::from(r[j])).sum::<f64>() / rows.len() as f64).collect();
    let total: f64 = rows.iter().flat_map(|r| r.iter().zip(&centre).map(|(v, c)| (f64::from(*v) - c).powi(2))).sum();
    let fvu = mean("output.sq_error.spliced") * real.len() as f64 / total;
    let (clean, spliced, ablated) = (mean("output.nll"), mean("output.nll.spliced"), mean("output.nll.ablated"));
    let (kl_spliced, kl_ablated) = (mean("output.kl.spliced"), mean("output.kl.ablated"));
    let metrics = [
        clean,
        spliced,
        ablated,
        (ablated - spliced) / (ablated - clean),
        (kl_ablated - kl_spliced) / kl_ablated,
        kl_spliced,
        fvu,
    ];
    for (i, (got, want)) in metrics.iter().zip(&g.metrics).enumerate() {
        assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0), "{name}: metric {i}: {got} against HF's {want}");
    }
    eprintln!("{name} at {at}: ce_loss_score {:.6}, kl_div_score {:.6}", metrics[3], metrics[4]);
}

fn mesh_2x4() -> EngineOptions {
    let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
    let config = LoadedModel::open(&fixture("tiny-llama")).unwrap().config;
    let (params, input) = siphon_models::sharding::megatron_specs(&config, &mesh);
    EngineOptions { mesh, plan: ShardingPlan::Explicit { params, input: Some(input) }, ..EngineOptions::default() }
}

#[test]
fn saelens_standard_spliced_at_the_blocks_output() {
    check("saelens-standard", "golden-splice.safetensors", None, EngineOptions::default());
}

#[test]
fn saelens_topk_spliced_at_the_blocks_output() {
    check("saelens-topk", "golden-splice.safetensors", None, EngineOptions::default());
}

#[test]
fn saelens_jumprelu_spliced_at_the_blocks_output() {
    check("saelens-jumprelu", "golden-splice.safetensors", None, EngineOptions::default());
}

#[test]
fn saelens_standard_spliced_at_the_blocks_input() {
    check(
        "saelens-standard",
        "golden-splice-resid-pre.safetensors",
        Some("blocks.1.hook_resid_pre"),
        EngineOptions::default(),
    );
}

#[test]
fn saelens_standard_spliced_at_the_blocks_mlp_output() {
    check(
        "saelens-standard",
        "golden-splice-mlp-out.safetensors",
        Some("blocks.1.hook_mlp_out"),
        EngineOptions::default(),
    );
}

#[test]
fn saelens_transcoder_spliced_at_the_blocks_mlp_output() {
    check("saelens-transcoder", "golden-splice.safetensors", None, EngineOptions::default());
}

#[test]
fn saelens_jumprelu_transcoder_spliced_at_the_blocks_mlp_output() {
    check("saelens-jumprelu-transcoder", "golden-splice.safetensors", None, EngineOptions::default());
}

#[test]
fn saelens_transcoder_spliced_on_a_mesh() {
    check("saelens-transcoder", "golden-splice.safetensors", None, mesh_2x4());
}

#[test]
fn saelens_topk_spliced_on_a_mesh() {
    check("saelens-topk", "golden-splice.safetensors", None, mesh_2x4());
}

#[test]
fn a_hook_off_the_residual_stream_or_a_normalising_dictionary_is_refused_by_name() {
    let model = LoadedModel::open(&fixture("tiny-llama")).unwrap();
    let dir = dictionaries().join("saelens-standard");
    let d = spliced(&dir, Some("blocks.1.hook_attn_out"), &model);
    let options = EngineOptions {
        next_token: Some(NextToken { nll: true, ..NextToken::default() }),
        dictionaries: vec![d],
        ..EngineOptions::default()
    };
    let Err(err) = Engine::new(&client(), &model, Vec::new(), options) else { panic!("a splice at mlp_out built") };
    let err = err.to_string();
    assert!(err.contains("only a block's hook_resid_pre, hook_resid_post or hook_mlp_out is spliced so far"), "{err}");
    let dir = dictionaries().join("saelens-constant-norm");
    let err = Dictionary::open(&dir, None).unwrap().with_decoder(&dir).unwrap_err().to_string();
    assert!(err.contains("normalises its input"), "{err}");
}
