//! The model's next-token outputs against HF transformers' logits (log-softmax in f64;
//! `<fixture>/golden-next-token.safetensors`, written by scripts/fixtures/gen_next_token_fixtures.py),
//! for every family's fixture and the SmolLM2 GGUF: on one device with chunks of 3 positions
//! (rows of 8 and 70: chunks that do not divide them), and on a 2 × 4 mesh whose `model` axis
//! splits the vocabulary, in the chunks the engine chooses. With steering vectors at a block's
//! `hook_resid_pre` and the last block's `hook_resid_post` (`golden-steered.safetensors`: HF with a
//! forward pre-hook and a forward hook adding them), the final norm's output and the outputs
//! equal HF's too (every family on one device, three on the mesh).
//!
//! Each value is within 1e-5 of HF's, relative (absolute below 1), beyond what the final
//! hidden state's own difference from HF's accounts for: the same run returns
//! `ln_final.hook_out`, compared with HF's of the forward that gave its logits; that difference `Δh` moves each logit
//! by `W_U[v]·Δh`, at most `δ` over the vocabulary, so each log-probability by at most `2δ`
//! and the entropy by at most `2δ·H` (to first order). The families whose
//! hidden states equal HF's to f32 rounding get nothing from it; the hybrids' recurrences over
//! 70 tokens and SmolLM2's 30 blocks differ from HF's at ~1e-5 there (their hook goldens'
//! own tolerance is 1e-4 of scale), and their outputs by what that gives.

mod common;

use std::path::Path;

use common::{client, fixture};
use safetensors::SafeTensors;
use siphon_engine::{Activations, Batch, Engine, EngineOptions, ShardingPlan};
use siphon_mesh::{Mesh, PartitionSpec};
use siphon_models::{DType, HookKind, HookPoint, LoadedModel, NextToken, Steering};

const TOPK: usize = 5;

struct Golden {
    ids: Vec<Vec<u32>>,
    mask: Vec<Vec<u8>>,
    next_ids: Vec<i32>,
    nll: Vec<f32>,
    entropy: Vec<f32>,
    /// `[tokens, 8]` each (empty in a steered golden).
    topk_logprobs: Vec<f32>,
    topk_ids: Vec<i32>,
}

fn golden(path: &Path) -> Golden {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes).unwrap();
    // The steered goldens have no top-k: empty.
    let bytes_of = |name: &str| st.tensor(name).map(|t| t.data().to_vec()).unwrap_or_default();
    let f32s = |name: &str| -> Vec<f32> {
        bytes_of(name).chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
    };
    let i32s = |name: &str| -> Vec<i32> {
        bytes_of(name).chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect()
    };
    let seq = st.tensor("input_ids").unwrap().shape()[1];
    let rows = |v: Vec<i32>| -> Vec<Vec<i32>> { v.chunks(seq).map(<[i32]>::to_vec).collect() };
    Golden {
        ids: rows(i32s("input_ids")).into_iter().map(|r| r.into_iter().map(|t| t as u32).collect()).collect(),
        mask: rows(i32s("attention_mask")).into_iter().map(|r| r.into_iter().map(|m| m as u8).collect()).collect(),
        next_ids: i32s("next_ids"),
        nll: f32s("output.nll"),
        entropy: f32s("output.entropy"),
        topk_logprobs: f32s("output.topk_logprobs"),
        topk_ids: i32s("output.topk_ids"),
    }
}

fn ln_final() -> HookPoint {
    HookPoint::model(HookKind::LnFinalOut)
}

fn run(model: &LoadedModel, batch: &Batch, options: EngineOptions) -> Activations {
    let engine = Engine::new(&client(), model, vec![ln_final()], options).unwrap();
    engine.run(batch).unwrap()
}

/// `got` within 1e-5 of `want` relative (absolute below 1) plus `slack`, NaN where `want` is.
fn close(got: f32, want: f32, slack: f32) -> bool {
    match want.is_nan() {
        true => got.is_nan(),
        false => (got - want).abs() <= 1e-5 * want.abs().max(1.0) + slack,
    }
}

/// Per token, the most any logit moves by the difference between `got`'s final hidden state
/// and HF's of the same forward in `golden_path`: `max_v |W_U[v] · (h − h_HF)|`, in f64.
fn logit_slack(model: &LoadedModel, got: &[f32], golden_path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(golden_path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let want: Vec<f32> = st
        .tensor("ln_final.hook_out")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let d = model.config.hidden_size;
    let name = model.config.unembedding().unwrap().weight;
    let w = model.weights.get(&name, DType::F32).unwrap().to_f32_vec();
    want.chunks(d)
        .zip(got.chunks(d))
        .map(|(a, b)| {
            let diff: Vec<f64> = a.iter().zip(b).map(|(x, y)| f64::from(y - x)).collect();
            let shift = |row: &[f32]| row.iter().zip(&diff).map(|(w, e)| f64::from(*w) * e).sum::<f64>().abs();
            w.chunks(d).map(shift).fold(0f64, f64::max) as f32
        })
        .collect()
}

/// The outputs of `model` (a fixture's directory, a GGUF file) on the golden's rows against it.
fn check(name: &str, model: &Path, golden_path: &Path, options: EngineOptions) {
    let model = LoadedModel::open(model).unwrap();
    let g = golden(golden_path);
    let (mut ids, mut mask) = (g.ids.clone(), g.mask.clone());
    // A data axis that does not divide the golden batch gets copies of the first row (not compared).
    while ids.len() % options.mesh.axis_size_or_one("data") != 0 {
        ids.push(g.ids[0].clone());
        mask.push(g.mask[0].clone());
    }
    let batch = Batch::new(ids, Some(mask)).unwrap();
    let tokens = g.nll.len();
    assert_eq!(&batch.next_ids()[..tokens], &g.next_ids[..], "{name}: each token's next as the golden takes it");
    let seq = g.ids[0].len();
    let acts = run(&model, &batch, options);
    let hidden = acts.get(ln_final()).unwrap().to_f32();
    let slack = logit_slack(&model, &hidden[..tokens * model.config.hidden_size], golden_path);
    let largest = (0..tokens).filter(|&t| g.mask[t / seq][t % seq] == 1).map(|t| slack[t]).fold(0f32, f32::max);
    eprintln!("{name}: the final hidden state moves a logit by at most {largest:e} against HF's");
    let names: Vec<&str> = acts.next_token.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["output.nll", "output.entropy", "output.topk_logprobs", "output.topk_ids"]);
    let output = |i: usize| &acts.next_token[i].1;
    let (nll, entropy, logprobs) = (output(0).to_f32(), output(1).to_f32(), output(2).to_f32());
    let ids: Vec<i32> = output(3).to_vec().unwrap();
    assert_eq!(output(2).shape(), [batch.batch(), seq, TOPK]);
    let mut compared = 0;
    for t in (0..tokens).filter(|&t| g.mask[t / seq][t % seq] == 1) {
        let at = format!("{name}: token {t} (row {}, position {}, logits within {:e})", t / seq, t % seq, slack[t]);
        let (logp_slack, entropy_slack) = (2.0 * slack[t], 2.0 * slack[t] * g.entropy[t]);
        assert!(close(nll[t], g.nll[t], logp_slack), "{at}: nll {} against HF's {}", nll[t], g.nll[t]);
        assert!(
            close(entropy[t], g.entropy[t], entropy_slack),
            "{at}: entropy {} against HF's {}",
            entropy[t],
            g.entropy[t]
        );
        let want = |j: usize| g.topk_logprobs[t * 8 + j];
        for j in 0..TOPK {
            let got = logprobs[t * TOPK + j];
            assert!(close(got, want(j), logp_slack), "{at}: top-{j} log-prob {got} against HF's {}", want(j));
            let (got_id, want_id) = (ids[t * TOPK + j], g.topk_ids[t * 8 + j]);
            // Ids may differ only where HF's log-probs tie around this rank (within 1e-6 and
            // what the hidden state's difference moves them by).
            let tie = 1e-6 + 2.0 * logp_slack;
            let tied = (j > 0 && (want(j - 1) - want(j)).abs() <= tie) || (want(j) - want(j + 1)).abs() <= tie;
            assert!(got_id == want_id || tied, "{at}: top-{j} id {got_id} against HF's {want_id}");
        }
        compared += usize::from(!g.nll[t].is_nan());
    }
    assert!(compared >= 3, "{name}: at least a few tokens with a next one ({compared})");
}

fn outputs(chunk: Option<usize>) -> NextToken {
    NextToken { nll: true, entropy: true, topk: TOPK, chunk }
}

fn one_device(name: &str) {
    let options = EngineOptions { next_token: Some(outputs(Some(3))), ..EngineOptions::default() };
    check_fixture(name, options);
}

/// Megatron's plan with the unembedding's vocabulary over `model` (the embedding's too where
/// it is the unembedding: tied), so each device computes a quarter of every chunk's logits.
fn mesh_2x4(name: &str) {
    let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
    let config = LoadedModel::open(&fixture(name)).unwrap().config;
    let (mut params, input) = siphon_models::sharding::megatron_specs(&config, &mesh);
    params.insert(config.unembedding().unwrap().weight, PartitionSpec::new(&[&["model"], &[]]));
    let plan = ShardingPlan::Explicit { params, input: Some(input) };
    let options = EngineOptions { mesh, plan, next_token: Some(outputs(None)), ..EngineOptions::default() };
    check_fixture(name, options);
}

fn check_fixture(name: &str, options: EngineOptions) {
    check(name, &fixture(name), &fixture(name).join("golden-next-token.safetensors"), options);
}

/// Steered by HF's forward hooks: the final norm's output within 1e-4 of its scale (the hook
/// goldens' tolerance) and the NLL and entropy as above, on `options`' mesh; and the vectors
/// changed them.
fn steered(name: &str, options: EngineOptions) {
    steered_by(name, "golden-steered.safetensors", 2, options)
}

/// As [`steered`], the `vectors` of the golden `file`.
fn steered_by(name: &str, file: &str, vectors: usize, options: EngineOptions) {
    let dir = fixture(name);
    let path = dir.join(file);
    let model = LoadedModel::open(&dir).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let f32s = |name: &str| -> Vec<f32> {
        st.tensor(name).unwrap().data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
    };
    let mut steering: Vec<Steering> = st
        .names()
        .into_iter()
        .filter_map(|n| n.strip_prefix("steer.").map(|hook| (n, hook)))
        .map(|(n, hook)| Steering { hook: hook.parse().unwrap(), values: f32s(n), scale: 1.0, source: path.clone() })
        .collect();
    steering.sort_by_key(|s| s.hook);
    assert_eq!(steering.len(), vectors, "{name}: {vectors} vectors");
    let g = golden(&path);
    let seq = g.ids[0].len();
    let (mut ids, mut mask) = (g.ids.clone(), g.mask.clone());
    while ids.len() % options.mesh.axis_size_or_one("data") != 0 {
        ids.push(g.ids[0].clone());
        mask.push(g.mask[0].clone());
    }
    let batch = Batch::new(ids, Some(mask)).unwrap();
    let outputs = NextToken { nll: true, entropy: true, topk: 0, chunk: None };
    let options = EngineOptions { next_token: Some(outputs), steering, ..options };
    let acts = run(&model, &batch, options);
    let tokens = g.nll.len();
    let d = model.config.hidden_size;
    let hidden = acts.get(ln_final()).unwrap().to_f32();
    let want = f32s("ln_final.hook_out");
    let real = |t: &usize| g.mask[t / seq][t % seq] == 1;
    let scale = (0..tokens).filter(real).flat_map(|t| &want[t * d..(t + 1) * d]).fold(0f32, |m, v| m.max(v.abs()));
    for t in (0..tokens).filter(real) {
        for i in t * d..(t + 1) * d {
            let e = (hidden[i] - want[i]).abs();
            assert!(
                e <= 1e-4 * scale.max(1.0),
                "{name}: token {t} ln_final.hook_out[{}] {} against HF's {}",
                i % d,
                hidden[i],
                want[i]
            );
        }
    }
    let slack = logit_slack(&model, &hidden[..tokens * d], &path);
    let (nll, entropy) = (acts.next_token[0].1.to_f32(), acts.next_token[1].1.to_f32());
    let plain = golden(&fixture(name).join("golden-next-token.safetensors"));
    let mut moved = 0f32;
    for t in (0..tokens).filter(real) {
        let at = format!("{name} steered: token {t} (logits within {:e})", slack[t]);
        assert!(close(nll[t], g.nll[t], 2.0 * slack[t]), "{at}: nll {} against HF's {}", nll[t], g.nll[t]);
        let entropy_slack = 2.0 * slack[t] * g.entropy[t];
        assert!(
            close(entropy[t], g.entropy[t], entropy_slack),
            "{at}: entropy {} against {}",
            entropy[t],
            g.entropy[t]
        );
        if !g.nll[t].is_nan() {
            moved = moved.max((g.nll[t] - plain.nll[t]).abs());
        }
    }
    assert!(moved > 1e-3, "{name}: the vectors changed the NLL by at most {moved}");
}

macro_rules! families {
    ($($test:ident: $name:literal,)*) => {
        mod one_device {
            $(#[test] fn $test() { super::one_device($name) })*
        }
        mod mesh_2x4 {
            $(#[test] fn $test() { super::mesh_2x4($name) })*
        }
        mod steered_one_device {
            $(#[test] fn $test() { super::steered($name, siphon_engine::EngineOptions::default()) })*
        }
    };
}

/// Steered on a 2 × 4 mesh: a dense family, Gemma 4 (per-layer inputs, shared KV) and a hybrid
/// (the steering is the decoder loop's, shared by every family; CI's time is not).
mod steered_mesh_2x4 {
    fn steered_on_the_mesh(name: &str) {
        let mesh = siphon_mesh::Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
        super::steered(name, siphon_engine::EngineOptions { mesh, ..Default::default() })
    }

    #[test]
    fn llama() {
        steered_on_the_mesh("tiny-llama")
    }

    #[test]
    fn gemma4() {
        steered_on_the_mesh("tiny-gemma4")
    }

    #[test]
    fn qwen3_next() {
        steered_on_the_mesh("tiny-qwen3-next")
    }
}

families! {
    llama: "tiny-llama",
    qwen2: "tiny-qwen2",
    mistral: "tiny-mistral",
    gemma2: "tiny-gemma2",
    gemma3: "tiny-gemma3",
    qwen3: "tiny-qwen3",
    phi3: "tiny-phi3",
    olmo2: "tiny-olmo2",
    gpt2: "tiny-gpt2",
    pythia: "tiny-pythia",
    qwen3_moe: "tiny-qwen3-moe",
    mixtral: "tiny-mixtral",
    gpt_oss: "tiny-gpt-oss",
    olmoe: "tiny-olmoe",
    olmo3: "tiny-olmo3",
    smollm3: "tiny-smollm3",
    gemma4: "tiny-gemma4",
    gemma4_mm: "tiny-gemma4-mm",
    qwen3_5: "tiny-qwen3-5",
    qwen3_5_moe: "tiny-qwen3-5-moe",
    qwen3_next: "tiny-qwen3-next",
    deepseek_v3: "tiny-deepseek-v3",
}

/// The real SmolLM2-135M (a 49,152-token vocabulary, tied) from its GGUF, as transformers
/// dequantizes it.
#[test]
fn smollm2_gguf_matches_hf() {
    let gguf = std::env::var_os("SIPHON_SMOLLM2_GGUF").expect("SIPHON_SMOLLM2_GGUF (scripts/setup-model.sh)");
    let options = EngineOptions { next_token: Some(outputs(Some(5))), ..EngineOptions::default() };
    check("smollm2", Path::new(&gguf), &fixture("smollm2").join("golden-next-token.safetensors"), options);
}

/// A vector added to block 1's `hook_mlp_out` or `hook_attn_out`
/// (`golden-steered-{mlp,attn}.safetensors`: HF with a forward hook on the module that gives what
/// joins the residual stream: the block's MLP or attention, or in a post-normed block its
/// post-norm), in pre-norm (Llama, Qwen3, Mixtral) and post-normed blocks (Gemma 2/3/4, OLMo 2); a
/// family whose blocks do not add it is refused when its program is built.
mod steered_sublayer {
    fn steered(name: &str, kind: &str) {
        let file = format!("golden-steered-{kind}.safetensors");
        super::steered_by(name, &file, 1, siphon_engine::EngineOptions::default())
    }

    macro_rules! sublayers {
        ($($test:ident: $name:literal $kind:literal,)*) => {
            $(#[test] fn $test() { steered($name, $kind) })*
        };
    }

    sublayers! {
        llama_mlp_out: "tiny-llama" "mlp",
        llama_attn_out: "tiny-llama" "attn",
        qwen3_mlp_out: "tiny-qwen3" "mlp",
        qwen3_attn_out: "tiny-qwen3" "attn",
        mixtral_mlp_out: "tiny-mixtral" "mlp",
        mixtral_attn_out: "tiny-mixtral" "attn",
        gemma2_mlp_out: "tiny-gemma2" "mlp",
        gemma2_attn_out: "tiny-gemma2" "attn",
        gemma4_mlp_out: "tiny-gemma4" "mlp",
        gemma4_attn_out: "tiny-gemma4" "attn",
        gemma3_mlp_out: "tiny-gemma3" "mlp",
        gemma3_attn_out: "tiny-gemma3" "attn",
        olmo2_mlp_out: "tiny-olmo2" "mlp",
        olmo2_attn_out: "tiny-olmo2" "attn",
    }

    #[test]
    fn a_family_whose_blocks_do_not_add_it_is_refused() {
        use siphon_models::{HookKind, HookPoint, LoadedModel, Steering};
        let model = LoadedModel::open(&super::fixture("tiny-gpt2")).unwrap();
        let hook = HookPoint::block(0, HookKind::MlpOut);
        let values = vec![1.0; model.config.hidden_size];
        let steering = vec![Steering { hook, values, scale: 1.0, source: "v.npy".into() }];
        let options = siphon_engine::EngineOptions { steering, ..Default::default() };
        let Err(err) = siphon_engine::Engine::new(&super::client(), &model, vec![super::ln_final()], options) else {
            panic!("a vector at gpt2's hook_mlp_out built")
        };
        assert!(err.to_string().contains("steering at blocks.0.hook_mlp_out"), "{err}");
        assert!(err.to_string().contains("do not add a vector there yet"), "{err}");
    }
}
