//! Every hook against TransformerLens 4.3's `TransformerBridge` on the raw Hugging Face
//! weights (`fixtures/models/*/golden-tl.safetensors`, written by `scripts/gen-tl-fixtures.sh`).
//! TransformerLens ran each row alone, unpadded; siphon runs the rows together, padded on
//! either side, on one device, on a 2×4 mesh and in bf16. Every name in TransformerLens's
//! cache is either compared (TransformerLens's names and the bridge's aliases alike) or listed
//! below as not an activation siphon extracts.

mod common;

use std::collections::BTreeMap;

use common::{client, fixture};
use safetensors::SafeTensors;
use siphon_engine::{Activations, Batch, Engine, EngineOptions, ShardingPlan};
use siphon_mesh::Mesh;
use siphon_models::{DType, HookKind, HookPoint, LoadedModel};

/// Names in TransformerLens's cache that are not activations of the model's residual
/// computation: the token ids, RoPE's cos/sin tables and the logits (siphon never computes
/// them).
const NOT_EXTRACTED: &[&str] = &[
    "embed.hook_in",
    "rotary_emb.hook_in",
    "rotary_emb.hook_cos",
    "rotary_emb.hook_sin",
    "attn.hook_cos",
    "attn.hook_sin",
    "unembed.hook_in",
    "unembed.hook_out",
    "hook_unembed",
    // GPT-2: the position ids.
    "pos_embed.hook_in",
];

/// Names whose tensor in one family's bridge is not what the name means: Gemma 4's bridge
/// delegates attention to Hugging Face and fires the post-softmax weights at
/// `attn.hook_attn_scores` too ("no pre-softmax tensor exists"). siphon gives the scores
/// there, as for every other family; the test checks that the bridge's value is its pattern.
const BRIDGE_GIVES_PATTERN_AS_SCORES: &[&str] = &["tiny-gemma4", "tiny-gemma4-moe"];

/// Models whose bridge splits `attn.hook_z` (`o.hook_in`) into heads by the config's
/// `head_dim`, which DeepSeek-V3's configuration sets to the RoPE width rather than the value
/// heads' (`[tokens, 5, 8]` for 4 value heads of 10): the same values per token, compared flat.
const BRIDGE_SPLITS_Z_BY_ROPE_WIDTH: &[&str] = &["tiny-deepseek-v3", "tiny-deepseek-v3-noqlora"];

/// One TransformerLens tensor of one row: `[n, *per-token]`, or `[heads, n, n]` for scores
/// and patterns.
struct TlTensor {
    row: usize,
    name: String,
    shape: Vec<usize>,
    values: Vec<f32>,
}

struct TlGolden {
    rows: Vec<Vec<u32>>,
    /// The padded length of the golden's rows (its `input_ids`' second dimension).
    seq: usize,
    tensors: Vec<TlTensor>,
}

fn load(model: &str) -> TlGolden {
    let bytes = std::fs::read(fixture(model).join("golden-tl.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let i32s = |name: &str| -> Vec<i32> {
        st.tensor(name).unwrap().data().chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect()
    };
    let (ids, lengths) = (i32s("input_ids"), i32s("lengths"));
    let seq = ids.len() / lengths.len();
    let rows = lengths
        .iter()
        .enumerate()
        .map(|(r, &n)| ids[r * seq..r * seq + n as usize].iter().map(|&t| t as u32).collect())
        .collect();
    let mut tensors = Vec::new();
    for (key, view) in st.tensors() {
        let Some((row, name)) = key.strip_prefix("row").and_then(|k| k.split_once('.')) else {
            continue;
        };
        let values = view.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        tensors.push(TlTensor {
            row: row.parse().unwrap(),
            name: name.to_string(),
            shape: view.shape().to_vec(),
            values,
        });
    }
    tensors.sort_by(|a, b| (a.row, &a.name).cmp(&(b.row, &b.name)));
    TlGolden { rows, seq, tensors }
}

/// The rows padded to `seq` on `side` (plus `extra` copies of row 0, for a batch that splits
/// over a data axis), and each row's offset of its first real token.
fn padded(rows: &[Vec<u32>], seq: usize, side: &str, extra: usize) -> (Batch, Vec<usize>) {
    let rows: Vec<&Vec<u32>> = rows.iter().chain(std::iter::repeat_n(&rows[0], extra)).collect();
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    let mut offsets = Vec::new();
    for row in rows {
        let pad = seq - row.len();
        let offset = if side == "left" { pad } else { 0 };
        let mut r = vec![0u32; seq];
        let mut m = vec![0u8; seq];
        r[offset..offset + row.len()].copy_from_slice(row);
        m[offset..offset + row.len()].fill(1);
        ids.push(r);
        mask.push(m);
        offsets.push(offset);
    }
    (Batch::new(ids, Some(mask)).unwrap(), offsets)
}

fn every_hook(model: &LoadedModel) -> Vec<HookPoint> {
    let family = siphon_models::hook_kinds(&model.config);
    let inputs = if family.contains(&HookKind::PosEmbed) { "hook_embed,hook_pos_embed" } else { "hook_embed" };
    siphon_models::resolve_hooks(
        &format!("{inputs},blocks.*.*,ln_final.hook_scale,ln_final.hook_normalized,ln_final.hook_out"),
        &model.config,
    )
    .unwrap()
}

/// Max-abs difference per TransformerLens name between siphon's `acts` and the golden, over
/// real tokens (and, for scores and patterns, over each real query's keys). Also checks that
/// padding keys hold what masked keys hold: pattern 0, scores the most negative f32.
fn differences(
    name: &str,
    config: &siphon_models::ModelConfig,
    golden: &TlGolden,
    acts: &Activations,
    offsets: &[usize],
    seq: usize,
) -> BTreeMap<String, f32> {
    let mut out = BTreeMap::new();
    for t in &golden.tensors {
        let Ok(hook) = HookPoint::parse(&t.name, config) else {
            let bare =
                t.name.strip_prefix("blocks.").and_then(|r| r.split_once('.')).map_or(t.name.as_str(), |(_, s)| s);
            assert!(
                NOT_EXTRACTED.contains(&bare),
                "{name}: TransformerLens gives {:?}, which siphon neither extracts nor lists as skipped",
                t.name
            );
            continue;
        };
        if hook.kind() == HookKind::AttnScores && BRIDGE_GIVES_PATTERN_AS_SCORES.contains(&name) {
            let pattern = t.name.replace("hook_attn_scores", "hook_pattern");
            let theirs = golden.tensors.iter().find(|p| p.row == t.row && p.name == pattern).unwrap();
            assert_eq!(theirs.values, t.values, "{name}: the bridge's {} is not its pattern", t.name);
            continue;
        }
        let array = acts.get(hook).unwrap_or_else(|| panic!("{} ({hook}) was not requested", t.name));
        let got = array.to_f32();
        let shape = array.shape();
        let per_token: usize = shape[2..].iter().product();
        let n = golden.rows[t.row].len();
        let offset = offsets[t.row];
        let at = |p: usize, i: usize| got[(t.row * seq + p) * per_token + i];
        let mut worst = 0f32;
        if matches!(hook.kind(), HookKind::AttnScores | HookKind::AttnPattern) {
            // TransformerLens: [heads, query, key] over the unpadded row; siphon: per query
            // token, [heads, key] over the padded row.
            let heads = shape[2];
            assert_eq!(t.shape, [heads, n, n], "{}", t.name);
            let masked = if hook.kind() == HookKind::AttnPattern { 0.0 } else { f32::MIN };
            for q in 0..n {
                for h in 0..heads {
                    for key in 0..seq {
                        let value = at(offset + q, h * seq + key);
                        match key.checked_sub(offset).filter(|&k| k < n) {
                            Some(k) => worst = farther(worst, value - t.values[(h * n + q) * n + k]),
                            None => assert_eq!(value, masked, "{} row {} query {q}: padding key {key}", t.name, t.row),
                        }
                    }
                }
            }
        } else if head_major(&t.name, &t.shape, shape, n) {
            // TransformerLens: [heads, token, *rest]; siphon: per token [heads, *rest].
            let heads = shape[2];
            let rest = per_token / heads;
            assert_eq!(t.shape[..2], [heads, n], "{}", t.name);
            assert_eq!(&t.shape[2..], &shape[3..], "{}", t.name);
            for h in 0..heads {
                for tok in 0..n {
                    for i in 0..rest {
                        let want = t.values[(h * n + tok) * rest + i];
                        worst = farther(worst, at(offset + tok, h * rest + i) - want);
                    }
                }
            }
        } else {
            // The same per-token values; OLMo's q/k-norm inputs are the flat projections.
            let z = t.name.ends_with("attn.hook_z") || t.name.ends_with("attn.o.hook_in");
            if t.name.contains("_norm.hook_in") || (z && BRIDGE_SPLITS_Z_BY_ROPE_WIDTH.contains(&name)) {
                assert_eq!(t.shape[1..].iter().product::<usize>(), per_token, "{}: per-token size", t.name);
            } else {
                assert_eq!(&t.shape[1..], &shape[2..], "{}: per-token shape", t.name);
            }
            assert_eq!(t.shape[0], n, "{}", t.name);
            for tok in 0..n {
                for i in 0..per_token {
                    worst = farther(worst, at(offset + tok, i) - t.values[tok * per_token + i]);
                }
            }
        }
        let entry = out.entry(t.name.clone()).or_insert(0f32);
        *entry = entry.max(worst);
    }
    out
}

/// Whether TransformerLens caches this per-head hook head-major, `[heads, tokens, *rest]`, as
/// its Qwen3 and Gemma 3 bridges do their per-head norms (inputs included) and its MLA bridge
/// its q/k/v (OLMo's norms over the whole projection and Gemma 4's are token-major): told by
/// the shape, given siphon's per-token `[heads, *rest]` (`ours` is
/// `[batch, seq, heads, *rest]`) and `n` tokens.
fn head_major(name: &str, theirs: &[usize], ours: &[usize], n: usize) -> bool {
    let per_head = [".q_norm.", ".k_norm.", ".hook_q_normed", ".hook_k_normed"].iter().any(|part| name.contains(part))
        || [".attn.hook_q", ".attn.hook_k", ".attn.hook_v"].iter().any(|end| name.ends_with(end));
    if !per_head || ours.len() < 3 || theirs.len() < 2 {
        return false;
    }
    let heads = ours[2];
    assert!(heads != n || theirs[0] != theirs[1], "{name}: {heads} heads and {n} tokens, layout ambiguous");
    theirs[0] == heads && theirs[1] == n && heads != n
}

fn run(model: &LoadedModel, batch: &Batch, mesh: Mesh, compute_dtype: DType) -> Activations {
    let options = EngineOptions { mesh, plan: ShardingPlan::Megatron, compute_dtype, ..EngineOptions::default() };
    let engine = Engine::new(&client(), model, every_hook(model), options).unwrap();
    engine.run(batch).unwrap()
}

/// The largest |value| of each hook in the golden (masked scores left out).
fn scales(golden: &TlGolden) -> BTreeMap<String, f32> {
    let mut out = BTreeMap::new();
    for t in &golden.tensors {
        let m = t.values.iter().filter(|v| **v > f32::MIN).fold(0f32, |m, v| m.max(v.abs()));
        let entry = out.entry(t.name.clone()).or_insert(0f32);
        *entry = entry.max(m);
    }
    out
}

/// Every difference within `tolerance` of its hook's scale (absolute below a scale of 1).
fn assert_within(what: &str, diffs: &BTreeMap<String, f32>, golden: &TlGolden, tolerance: f32) {
    let scales = scales(golden);
    let bad: Vec<String> = diffs
        .iter()
        .filter(|(n, d)| d.is_nan() || **d > tolerance * scales[*n].max(1.0))
        .map(|(n, d)| format!("{n}: {d:e} (scale {})", scales[n]))
        .collect();
    assert!(bad.is_empty(), "{what}: max-abs difference above {tolerance:e} of the scale:\n{}", bad.join("\n"));
}

fn check_model(name: &str) {
    let model = LoadedModel::open(&fixture(name)).unwrap();
    let golden = load(name);
    let seq = golden.seq;
    // Every block hook of each layer, the embedding and the three final-norm hooks, and every
    // TransformerLens name among them compared (aliases map to the same tensors).
    let family = siphon_models::hook_kinds(&model.config);
    let block_kinds = family.iter().filter(|k| k.info().scope == siphon_models::hooks::Scope::Block).count();
    let n_layers = model.config.n_layers;
    let in_blocks: usize = (0..n_layers).map(|l| siphon_models::layer_hook_kinds(&model.config, l).len()).sum();
    assert_eq!(every_hook(&model).len(), in_blocks + family.len() - block_kinds, "{name}");
    for side in ["right", "left"] {
        let (batch, offsets) = padded(&golden.rows, seq, side, 0);
        let diffs = differences(
            name,
            &model.config,
            &golden,
            &run(&model, &batch, Mesh::single_device(), DType::F32),
            &offsets,
            seq,
        );
        assert!(diffs.len() >= n_layers * 35, "{name}: only {} TransformerLens names compared", diffs.len());
        assert_within(&format!("{name} {side}-padded, one device"), &diffs, &golden, 1e-4);
    }
    // Megatron on data=2 × model=4: query heads split over model, every per-head hook whole.
    let (batch, offsets) = padded(&golden.rows, seq, "right", 1);
    let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
    let diffs = differences(name, &model.config, &golden, &run(&model, &batch, mesh, DType::F32), &offsets, seq);
    assert_within(&format!("{name} on a 2x4 mesh"), &diffs, &golden, 1e-4);
}

#[test]
fn tiny_phi3_every_hook_matches_transformer_lens() {
    check_model("tiny-phi3");
}

#[test]
fn tiny_olmo2_every_hook_matches_transformer_lens() {
    check_model("tiny-olmo2");
}

/// Per-layer inputs (width 8), global layers with K == V, head_dim 32, one key/value head
/// and proportional RoPE (half the pairs), local layers windowed (3, base 100), random layer
/// scalars; layers 4 and 5 attend over layers 2 and 3's keys and values (TransformerLens has
/// no key/value hooks there, nor does siphon), with double-wide MLPs.
#[test]
fn tiny_gemma4_every_hook_matches_transformer_lens() {
    check_model("tiny-gemma4");
}

/// The mixture beside every MLP: router (norm, scale, softmax, top 2 renormalised, per-expert
/// scale), fused gate_up experts, the two outputs normed and summed.
#[test]
fn tiny_gemma4_moe_every_hook_matches_transformer_lens() {
    check_model("tiny-gemma4-moe");
}

/// OLMo 2's block with windows (3) on layers 0-1 and RoPE per layer type (sliding: base
/// 1000; full: base 1e5, linear scaling 4).
#[test]
fn tiny_olmo3_every_hook_matches_transformer_lens() {
    check_model("tiny-olmo3");
}

/// Llama's block without RoPE on layers 1 and 3 (hook_rot_q/k are the unrotated q/k there),
/// which are windowed (3).
#[test]
fn tiny_smollm3_every_hook_matches_transformer_lens() {
    check_model("tiny-smollm3");
}

#[test]
fn tiny_gpt2_every_hook_matches_transformer_lens() {
    check_model("tiny-gpt2");
}

#[test]
fn tiny_pythia_every_hook_matches_transformer_lens() {
    check_model("tiny-pythia");
}

#[test]
fn tiny_qwen3_moe_every_hook_matches_transformer_lens() {
    check_model("tiny-qwen3-moe");
}

/// OLMoE: whole-projection q/k norms, four experts, two per token, not renormalised.
#[test]
fn tiny_olmoe_every_hook_matches_transformer_lens() {
    check_model("tiny-olmoe");
}

#[test]
fn tiny_mixtral_every_hook_matches_transformer_lens() {
    check_model("tiny-mixtral");
}

#[test]
fn tiny_llama_every_hook_matches_transformer_lens() {
    check_model("tiny-llama");
}

#[test]
fn tiny_qwen2_every_hook_matches_transformer_lens() {
    check_model("tiny-qwen2");
}

/// Pre- and post-norms with (1 + w) gains, scaled embeddings, soft-capped logits scaled by
/// query_pre_attn_scalar, GeGLU, a window of 3 on layers 0 and 2, head_dim 24.
#[test]
fn tiny_gemma2_every_hook_matches_transformer_lens() {
    check_model("tiny-gemma2");
}

/// Gemma 2's block with (1 + w) q/k norms, local layers (window 3, RoPE base 1000) around a
/// global one (base 1e5, linear scaling 4), no soft-cap.
#[test]
fn tiny_gemma3_every_hook_matches_transformer_lens() {
    check_model("tiny-gemma3");
}

/// q/k RMSNorm per head, head_dim 24, and a window of 4 on layers 1 and 2 only.
#[test]
fn tiny_qwen3_every_hook_matches_transformer_lens() {
    check_model("tiny-qwen3");
}

/// Sliding window 3 on rows of up to 8 tokens, head_dim 24 (not 64 / 4 heads).
#[test]
fn tiny_mistral_every_hook_matches_transformer_lens() {
    check_model("tiny-mistral");
}

/// bf16 weights and compute of `name` against TransformerLens in f32: each hook within
/// `tolerance` of its largest golden magnitude.
fn check_bf16(name: &str, tolerance: f32) -> LoadedModel {
    check_bf16_where(name, tolerance, |_| true)
}

/// [`check_bf16`] over the TransformerLens names whose hook `keep` accepts.
fn check_bf16_where(name: &str, tolerance: f32, keep: impl Fn(HookPoint) -> bool) -> LoadedModel {
    let model = LoadedModel::open(&fixture(name)).unwrap();
    let golden = load(name);
    let (batch, offsets) = padded(&golden.rows, golden.seq, "right", 0);
    let acts = run(&model, &batch, Mesh::single_device(), DType::Bf16);
    let diffs = differences(name, &model.config, &golden, &acts, &offsets, golden.seq);
    let scales = scales(&golden);
    let mut worst = 0f32;
    let kept = diffs.iter().filter(|(hook, _)| HookPoint::parse(hook, &model.config).is_ok_and(&keep));
    for (hook, diff) in kept {
        let relative = diff / scales[hook].max(1e-3);
        worst = worst.max(relative);
        assert!(
            relative <= tolerance,
            "{name} {hook}: bf16 differs by {diff:e} = {:.2}% of max |value| {:e}",
            100.0 * relative,
            scales[hook]
        );
    }
    eprintln!("{name} bf16: worst hook differs by {:.2}% of its max |value|", 100.0 * worst);
    model
}

/// bf16 weights and compute against TransformerLens in f32: each hook within 4% of its
/// largest golden magnitude (bf16 keeps 8 bits of mantissa; errors grow through three
/// blocks and are largest in the residual stream).
#[test]
fn bf16_every_hook_tracks_transformer_lens() {
    let name = "tiny-qwen2";
    let model = check_bf16(name, 0.04);
    let golden = load(name);
    let (batch, _) = padded(&golden.rows, 8, "right", 0);
    // Stored as bf16, masked scores are bf16's lowest finite value (what Hugging Face's mask
    // gives in bf16), never -inf, so statistics over them stay finite.
    let hooks = siphon_models::resolve_hooks("blocks.*.attn.hook_attn_scores", &model.config).unwrap();
    let options = EngineOptions { output_dtype: DType::Bf16, ..EngineOptions::default() };
    let acts = Engine::new(&client(), &model, hooks, options).unwrap().run(&batch).unwrap();
    for (hook, array) in &acts.hooks {
        let values = array.to_f32();
        assert!(values.iter().all(|v| v.is_finite()), "{hook}: non-finite values");
        assert!(values.contains(&half::bf16::MIN.to_f32()), "{hook}: no masked key at bf16's lowest value");
    }
}

/// The hybrids in bf16 (weights and compute; the gated delta rule runs in f32, as in
/// transformers). Dense: each hook within 15% of its largest magnitude; rows of 70 tokens
/// through order-1 random weights amplify bf16's rounding (transformers' own bf16 run of this
/// model differs from its f32 run by 8.7% of the scale at the final norm; siphon's by 9.9%).
/// Mixtures: bf16 rounding flips some tokens' expert choices, which changes everything after
/// them (transformers' own bf16 Qwen3-Next differs from its f32 by 24% at the final norm), so
/// only what precedes the routing is compared: block 0's hooks, less the routed experts'
/// choices, weights and outputs and what sums them, within 5%.
#[test]
fn bf16_hybrids_track_transformer_lens() {
    check_bf16("tiny-qwen3-5", 0.15);
    let before_routing = |hook: HookPoint| {
        use HookKind::*;
        let routed = matches!(hook.kind(), MlpExpertIndices | MlpExpertWeights | MlpExpertsOut | MlpOut | ResidPost);
        hook.layer() == Some(0) && !routed
    };
    for name in ["tiny-qwen3-5-moe", "tiny-qwen3-next"] {
        check_bf16_where(name, 0.05, before_routing);
    }
}

/// The hybrids: Gated DeltaNet layers (rows of 70 and 65 tokens, past one chunk of 64, and of
/// 9) around a gated full-attention layer; dense (Qwen3.5), with routed and shared experts
/// (Qwen3.5-MoE), and with the fused projections of Qwen3-Next.
#[test]
fn tiny_qwen3_5_every_hook_matches_transformer_lens() {
    check_model("tiny-qwen3-5");
}

#[test]
fn tiny_qwen3_5_moe_every_hook_matches_transformer_lens() {
    check_model("tiny-qwen3-5-moe");
}

#[test]
fn tiny_qwen3_next_every_hook_matches_transformer_lens() {
    check_model("tiny-qwen3-next");
}

/// GPT-OSS: sinks, biases, windows, YaRN, the biased router and clamped SwiGLU experts.
/// DeepSeek-V3 in bf16: the dense first block and the mixture block up to its routing within
/// 5% of each hook's scale (what follows a routing choice bf16 flips is not comparable).
#[test]
fn bf16_deepseek_v3_tracks_transformer_lens() {
    let before_routing = |hook: HookPoint| {
        use HookKind::*;
        let routed = matches!(hook.kind(), MlpExpertIndices | MlpExpertWeights | MlpExpertsOut | MlpOut | ResidPost);
        hook.layer() == Some(0) || (hook.layer() == Some(1) && !routed)
    };
    for name in ["tiny-deepseek-v3", "tiny-deepseek-v3-noqlora"] {
        check_bf16_where(name, 0.05, before_routing);
    }
}

#[test]
fn tiny_deepseek_v3_every_hook_matches_transformer_lens() {
    check_model("tiny-deepseek-v3");
}

#[test]
fn tiny_deepseek_v3_without_q_lora_every_hook_matches_transformer_lens() {
    check_model("tiny-deepseek-v3-noqlora");
}

#[test]
fn tiny_gpt_oss_every_hook_matches_transformer_lens() {
    check_model("tiny-gpt-oss");
}

/// The larger of `worst` and `|d|`, a NaN `d` counting as infinitely far (`max` would drop it).
fn farther(worst: f32, d: f32) -> f32 {
    if d.is_nan() { f32::INFINITY } else { worst.max(d.abs()) }
}
