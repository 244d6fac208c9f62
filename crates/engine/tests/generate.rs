//! Decoding against HF transformers' `generate` (`fixtures/models/<family>/golden-generate.safetensors`,
//! written by scripts/fixtures/gen_generate_fixtures.py: three prompts of 3, 9 and 6 random
//! tokens, each completed alone by greedy decoding at f32 with no end token, and the logits
//! each token was chosen from). For every family: the completions token for token (up to a
//! step whose two largest logits are within 1e-6, where either choice is right), the prompts
//! fed 4 tokens a step beside slots already decoding; and each decoding step's logits, the
//! golden tokens fed one by one, within 1e-5 of HF's (relative to the row's largest
//! magnitude, absolute below 1); on one device and on a 2 × 4 mesh (the caches split by heads
//! over `model` where their KV heads divide: DeepSeek's, GPT-2's; Qwen3-Next's Gated DeltaNet
//! state by its value heads). Phi-3's LongRoPE past its original context is refused.

mod common;

use std::path::Path;

use common::{client, fixture};
use safetensors::SafeTensors;
use siphon_engine::decode::{Finish, Prompt, Sampling, Settings, Step, choose, generate, probabilities, uniform};
use siphon_engine::{Batch, Engine, EngineOptions, ShardingPlan};
use siphon_mesh::Mesh;
use siphon_models::{DecodeStep, LoadedModel};

const DECODED: &[&str] = &[
    "tiny-llama",
    "tiny-qwen2",
    "tiny-mistral",
    "tiny-gemma2",
    "tiny-gemma3",
    "tiny-qwen3",
    "tiny-phi3",
    "tiny-olmo2",
    "tiny-gpt2",
    "tiny-pythia",
    "tiny-qwen3-moe",
    "tiny-mixtral",
    "tiny-gpt-oss",
    "tiny-olmoe",
    "tiny-olmo3",
    "tiny-smollm3",
    "tiny-gemma4",
    "tiny-gemma4-mm",
    "tiny-deepseek-v3",
    "tiny-qwen3-5",
    "tiny-qwen3-5-moe",
    "tiny-qwen3-next",
];

struct Golden {
    prompts: Vec<Vec<u32>>,
    completions: Vec<Vec<u32>>,
    /// Per prompt, per step, the logits.
    scores: Vec<Vec<Vec<f32>>>,
}

fn golden(dir: &Path) -> Golden {
    let path = dir.join("golden-generate.safetensors");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let words = |name: &str| -> Vec<[u8; 4]> {
        st.tensor(name).unwrap().data().chunks_exact(4).map(|b| b.try_into().unwrap()).collect()
    };
    let ids = |name: &str| -> Vec<u32> { words(name).into_iter().map(u32::from_le_bytes).collect() };
    let (mut prompts, mut completions, mut scores) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..3 {
        prompts.push(ids(&format!("prompt.{i}")));
        completions.push(ids(&format!("completion.{i}")));
        let vocab = st.tensor(&format!("scores.{i}")).unwrap().shape()[1];
        let values: Vec<f32> = words(&format!("scores.{i}")).into_iter().map(f32::from_le_bytes).collect();
        scores.push(values.chunks(vocab).map(<[f32]>::to_vec).collect());
    }
    Golden { prompts, completions, scores }
}

/// Greedy decoding of `new_tokens` with no end token.
fn greedy(new_tokens: usize) -> Settings {
    Settings { max_new_tokens: new_tokens, eos_ids: Vec::new(), stop_ids: Vec::new(), seed: 0 }
}

/// Sequences of `cache_len` positions fed `chunk` tokens a step at most.
fn cache(cache_len: usize, chunk: usize) -> Option<DecodeStep> {
    Some(DecodeStep { cache_len, chunk })
}

/// A decoding engine; `tpu_forms` as [`EngineOptions::tpu_forms`] (`Some(true)`: the TPU
/// program's forms, which take no product weight or cache first, on this CPU).
fn engine(
    client: &siphon_runtime::Client,
    model: &LoadedModel,
    mesh: Mesh,
    decode: Option<DecodeStep>,
    tpu_forms: Option<bool>,
) -> Engine {
    let options = EngineOptions { mesh, plan: ShardingPlan::Megatron, decode, tpu_forms, ..Default::default() };
    Engine::new(client, model, Vec::new(), options).unwrap()
}

/// Whether the two largest of `scores` are within 1e-6 (either is HF's choice).
fn near_tie(scores: &[f32]) -> bool {
    let mut sorted = scores.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    sorted[0] - sorted[1] <= 1e-6
}

fn check_family(name: &str, mesh: Mesh, slots: usize, tpu_forms: Option<bool>) {
    let dir = fixture(name);
    let model = LoadedModel::open(&dir).unwrap();
    let g = golden(&dir);
    let longest = g.prompts.iter().map(Vec::len).max().unwrap();
    // Phi-3's LongRoPE: HF switches factors once a sequence passes 32 positions (keeping the
    // keys cached before), which siphon refuses; its completions are held up to there.
    let cache_len = match name {
        "tiny-phi3" => 32,
        _ => longest + g.completions[0].len(),
    };
    let new_tokens = cache_len - longest;
    let client = client();

    // Greedy completions, the prompts fed 4 tokens a step (a windowed block's ring: its
    // window of 3 or 4 and 3 more positions).
    let engine4 = engine(&client, &model, mesh.clone(), cache(cache_len, 4), tpu_forms);
    let mut decoder = engine4.decoder(slots).unwrap();
    let prompts: Vec<Prompt> =
        g.prompts.iter().enumerate().map(|(i, ids)| Prompt { record: i as u64, sample: 0, ids: ids.clone() }).collect();
    let settings = greedy(new_tokens);
    let got = generate(&mut decoder, &prompts, &settings).unwrap();
    for (i, completion) in got.iter().enumerate() {
        assert_eq!(completion.finish, Finish::Length, "{name} prompt {i}");
        let want = &g.completions[i][..new_tokens];
        let same = completion.ids.iter().zip(want).take_while(|(a, b)| a == b).count();
        if same < want.len() {
            assert!(
                near_tie(&g.scores[i][same]),
                "{name} prompt {i}: step {same} drew {} where HF drew {} (got {:?}, HF {want:?})",
                completion.ids[same],
                want[same],
                completion.ids
            );
        }
        assert_eq!(completion.ids.len(), want.len(), "{name} prompt {i}");
    }

    // Each step's logits, HF's tokens fed one a step after the whole prompt (all prompts
    // together).
    let engine = engine(&client, &model, mesh, cache(cache_len, longest), tpu_forms);
    let mut decoder = engine.decoder(slots).unwrap();
    let sequences: Vec<Vec<u32>> =
        g.prompts.iter().zip(&g.completions).map(|(p, c)| [&p[..], &c[..]].concat()).collect();
    let mut fed = [0usize; 3];
    for i in 0..3 {
        let prompt = &g.prompts[i];
        let mut ids = vec![vec![0u32; prompt.len()]; slots];
        let mut mask = vec![vec![0u8; prompt.len()]; slots];
        ids[i] = prompt.clone();
        mask[i] = vec![1; prompt.len()];
        let positions: Vec<i32> = (0..slots).flat_map(|_| 0..prompt.len() as i32).collect();
        let step = decoder.step(&Batch::new(ids, Some(mask)).unwrap().with_position_ids(positions).unwrap()).unwrap();
        compare(name, i, 0, &step, i, &g.scores[i][0]);
        fed[i] = prompt.len();
    }
    for step in 1..new_tokens {
        let mut ids = vec![vec![0u32]; slots];
        let mut positions = vec![0i32; slots];
        let mut mask = vec![vec![0u8]; slots];
        for i in 0..3 {
            ids[i] = vec![sequences[i][fed[i]]];
            positions[i] = fed[i] as i32;
            mask[i] = vec![1];
        }
        let out = decoder.step(&Batch::new(ids, Some(mask)).unwrap().with_position_ids(positions).unwrap()).unwrap();
        for (i, fed) in fed.iter_mut().enumerate() {
            compare(name, i, step, &out, i, &g.scores[i][step]);
            *fed += 1;
        }
    }
}

/// Row `row`'s logits of `out` against HF's `want`, and the step's greedy choice (the
/// devices') against the host's first largest of those logits.
fn compare(name: &str, prompt: usize, step: usize, out: &Step, row: usize, want: &[f32]) {
    let got = &out.logits().unwrap()[row];
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= 1e-5 * scale, "{name} prompt {prompt} step {step}: logits differ by {worst} (scale {scale})");
    let host = choose(got, &Sampling::default(), 0.0);
    assert_eq!(out.choices()[row], host, "{name} prompt {prompt} step {step}: the devices' greedy choice");
}

#[test]
fn greedy_decoding_equals_hf_generate_for_every_family() {
    for name in DECODED {
        check_family(name, Mesh::single_device(), 3, None);
    }
}

/// The TPU program's forms of a decoding step (its products as they are written, the keys
/// cache second; a mixture's experts masked), on this CPU: every kind of attention cache.
#[test]
fn greedy_decoding_equals_hf_generate_in_the_tpu_forms() {
    for name in ["tiny-llama", "tiny-gemma2", "tiny-gemma4", "tiny-gpt-oss", "tiny-qwen3-moe", "tiny-qwen3-next"] {
        check_family(name, Mesh::single_device(), 3, Some(true));
    }
}

#[test]
fn greedy_decoding_equals_hf_generate_on_a_2x4_mesh() {
    let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
    for name in DECODED {
        check_family(name, mesh.clone(), 4, None);
    }
}

#[test]
fn bad_settings_are_refused_naming_them() {
    let model = LoadedModel::open(&fixture("tiny-llama")).unwrap();
    let client = client();
    let engine = engine(&client, &model, Mesh::single_device(), cache(8, 4), None);
    let mut decoder = engine.decoder(1).unwrap();
    let settings = greedy(4);
    let long = [Prompt { record: 7, sample: 0, ids: vec![1; 9] }];
    let e = generate(&mut decoder, &long, &settings).unwrap_err().to_string();
    assert!(e.contains("record 7") && e.contains("9 tokens"), "{e}");
    let hot = Sampling { temperature: -1.0, ..Sampling::default() };
    let options = EngineOptions { decode: cache(8, 4), sampling: hot, ..Default::default() };
    let e = Engine::new(&client, &model, Vec::new(), options).unwrap_err().to_string();
    assert!(e.contains("--temperature"), "{e}");
    let none = Settings { max_new_tokens: 0, ..settings };
    assert!(generate(&mut decoder, &long[..0], &none).unwrap_err().to_string().contains("max_new_tokens 0"));
    // Past LongRoPE's original context (HF switches factors mid-sequence).
    let phi3 = LoadedModel::open(&fixture("tiny-phi3")).unwrap();
    let options = EngineOptions { decode: cache(33, 4), ..Default::default() };
    let e = Engine::new(&client, &phi3, Vec::new(), options).unwrap_err().to_string();
    assert!(e.contains("longrope") && e.contains("33"), "{e}");
    // A cache past the model's context.
    let options = EngineOptions { decode: cache(100_000, 4), ..Default::default() };
    let e = Engine::new(&client, &model, Vec::new(), options).unwrap_err().to_string();
    assert!(e.contains("past the model's context"), "{e}");
}

/// transformers' warpers on fixed rows (`fixtures/sampling/golden-warpers.safetensors`): the
/// host's reference keeps the same tokens with the same probabilities; 20,000 draws on the
/// devices (a sampled step's own program, one record each) fall on them as those
/// probabilities say (chi-square, p > 0.01), never on a dropped token, and each is the host's
/// (f64) draw at the same uniform.
#[test]
fn the_sampler_draws_from_hf_s_warped_distribution() {
    let client = client();
    let path = fixture("../sampling/golden-warpers.safetensors");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let f32s = |name: &str| -> Vec<f32> {
        st.tensor(name).unwrap().data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
    };
    let settings: Vec<f64> = st
        .tensor("settings")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let vocab = st.tensor("logits").unwrap().shape()[1];
    let (logits, probs) = (f32s("logits"), f32s("probs"));
    for (row, s) in settings.chunks(4).enumerate() {
        let sampling = Sampling { temperature: s[0], top_k: s[1] as usize, top_p: s[2], min_p: s[3] };
        let logits = &logits[row * vocab..(row + 1) * vocab];
        let want = &probs[row * vocab..(row + 1) * vocab];
        let got = probabilities(&sampling, logits);
        for (v, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g > 0.0, w > 0.0, "row {row} token {v}: kept {} where HF kept {}", g > 0.0, w > 0.0);
            assert!((g - f64::from(w)).abs() < 1e-6, "row {row} token {v}: {g} where HF has {w}");
        }
        let n = 20_000;
        let drawn = device_draws(&client, logits, &sampling, n);
        let mut counts = vec![0usize; vocab];
        let mut apart = 0;
        for (record, &token) in drawn.iter().enumerate() {
            counts[token as usize] += 1;
            apart += usize::from(token != choose(logits, &sampling, uniform([5, record as u64, 0, 0])));
        }
        assert_eq!(apart, 0, "row {row}: {apart} of {n} device draws differ from the host's");
        let kept: Vec<usize> = (0..vocab).filter(|&v| want[v] > 0.0).collect();
        assert!(counts.iter().enumerate().all(|(v, &c)| c == 0 || want[v] > 0.0), "row {row}: a dropped token drawn");
        let chi2: f64 = kept
            .iter()
            .map(|&v| {
                let expected = f64::from(want[v]) * n as f64;
                (counts[v] as f64 - expected).powi(2) / expected
            })
            .sum();
        // The 1% critical value of chi-square with df degrees (Wilson–Hilferty).
        let df = (kept.len() - 1).max(1) as f64;
        let z = 2.326_348;
        let critical = df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3);
        assert!(chi2 < critical, "row {row}: chi-square {chi2:.2} over {df} degrees past {critical:.2}: {counts:?}");
    }
}

/// The devices' draw never lands on a token without probability where its f32 prefix sums
/// rise there by rounding: rows of `kept` equally likely tokens among masked ones (`-inf`),
/// drawn at uniforms around each masked token whose sum (the program's Hillis–Steele scan,
/// redone here in f32) is past the one before it, and around the top of `[0, 1)`, where the
/// sums may end below the uniform and the last token with a probability is drawn.
#[test]
fn a_draw_never_lands_on_a_token_without_probability() {
    let client = client();
    let sampling = Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0 };
    let vocab = 64;
    let (mut state, mut rows, mut risen, mut short) = (0x9e37_79b9_7f4a_7c15u64, 0, 0, 0);
    // Sums that end short are rare (about 1 row in 2,000): rows are made until one is seen.
    for _ in 0..100_000 {
        if rows >= 24 && short > 0 {
            break;
        }
        // A row: each token kept with probability 1/2 (an LCG's high bit), the last masked.
        let mut kept: Vec<bool> = (0..vocab)
            .map(|_| {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                state >> 63 == 1
            })
            .collect();
        kept[vocab - 1] = false;
        let n = kept.iter().filter(|&&k| k).count();
        if n < 3 {
            continue;
        }
        let p = 1.0f32 / n as f32;
        let mut sums: Vec<f32> = kept.iter().map(|&k| if k { p } else { 0.0 }).collect();
        let mut shift = 1;
        while shift < vocab {
            let before = sums.clone();
            for i in shift..vocab {
                sums[i] = before[i] + before[i - shift];
            }
            shift *= 2;
        }
        let ends_short = sums[vocab - 1] < 1.0f32.next_down();
        if rows >= 24 && !ends_short {
            continue;
        }
        let mut uniforms = Vec::new();
        let around = |x: f32, out: &mut Vec<f32>| {
            let mut u = x;
            for _ in 0..4 {
                u = u.next_down();
            }
            for _ in 0..9 {
                if (0.0..1.0).contains(&u) {
                    out.push(u);
                }
                u = u.next_up();
            }
        };
        for j in 1..vocab {
            if !kept[j] && sums[j] > sums[j - 1] {
                risen += 1;
                around(sums[j - 1], &mut uniforms);
            }
        }
        short += usize::from(ends_short);
        around(1.0f32.next_down(), &mut uniforms);
        let logits: Vec<f32> = kept.iter().map(|&k| if k { 0.0 } else { f32::NEG_INFINITY }).collect();
        let drawn = draws_at(&client, &logits, &sampling, &uniforms);
        for (u, token) in uniforms.iter().zip(drawn) {
            assert!(kept[token as usize], "at uniform {u:e}: token {token}, which has no probability ({kept:?})");
        }
        rows += 1;
    }
    // The rows reach both guards: sums that rise at a masked token, and sums that end short.
    assert!(risen > 0 && short > 0, "{risen} risen sums, {short} rows short of the top uniform");
}

/// `n` draws on one device from `logits` (one row) under `sampling`, record `r`'s at the
/// uniform of key (5, r, 0, 0), by the program a sampled decoding step chooses with.
fn device_draws(client: &siphon_runtime::Client, logits: &[f32], sampling: &Sampling, n: usize) -> Vec<u32> {
    let uniforms: Vec<f32> = (0..n).map(|r| uniform([5, r as u64, 0, 0])).collect();
    draws_at(client, logits, sampling, &uniforms)
}

/// A draw on one device from `logits` (one row) under `sampling` at each of `uniforms`, by the
/// program a sampled decoding step chooses with.
fn draws_at(client: &siphon_runtime::Client, logits: &[f32], sampling: &Sampling, uniforms: &[f32]) -> Vec<u32> {
    use siphon_runtime::{CompileOptions, HostArray};
    let (rows, vocab) = (uniforms.len().min(1000), logits.len());
    let program = siphon_models::sample::program(rows, vocab, sampling).unwrap();
    let exe = client.compile(&program, &CompileOptions::single_device(None)).unwrap();
    let device = exe.device_ids()[0];
    let tiled: Vec<f32> = (0..rows).flat_map(|_| logits.iter().copied()).collect();
    let logits = client.upload(&HostArray::from_slice(&[rows, vocab], &tiled).unwrap(), device).unwrap();
    let mut drawn = Vec::with_capacity(uniforms.len());
    for part in uniforms.chunks(rows) {
        let mut u = part.to_vec();
        u.resize(rows, 0.0);
        let u = client.upload(&HostArray::from_slice(&[rows], &u).unwrap(), device).unwrap();
        let out = exe.execute(&[vec![&logits, &u]]).unwrap();
        let got: Vec<i32> = out[0][0].to_host().unwrap().to_vec().unwrap();
        drawn.extend(got.into_iter().take(part.len()).map(|t| t as u32));
    }
    drawn
}

/// A sampled completion depends on the seed, record and sample only: the same on one device
/// with 3 slots fed 4 prompt tokens a step and on a 2 × 4 mesh with 4 fed 2 (prompts in
/// another order), drawn by the host (the CPU plugin's way) or by the devices (the TPU's
/// forms, on the mesh); another with another seed.
#[test]
fn sampled_completions_depend_on_seed_record_and_sample_only() {
    let model = LoadedModel::open(&fixture("tiny-qwen2")).unwrap();
    let g = golden(&fixture("tiny-qwen2"));
    let client = client();
    let sampling = Sampling { temperature: 1.0, top_k: 50, top_p: 0.95, min_p: 0.0 };
    let settings = Settings { seed: 11, ..greedy(12) };
    let prompts: Vec<Prompt> = (0..2u32)
        .flat_map(|sample| {
            g.prompts.iter().enumerate().map(move |(i, ids)| Prompt { record: i as u64, sample, ids: ids.clone() })
        })
        .collect();
    let run = |mesh: Mesh, slots: usize, chunk: usize, prompts: &[Prompt], settings: &Settings| {
        let on_devices = mesh.device_ids().len() > 1;
        let options = EngineOptions {
            mesh,
            plan: ShardingPlan::Megatron,
            decode: cache(24, chunk),
            sampling,
            tpu_forms: on_devices.then_some(true),
            ..Default::default()
        };
        let engine = Engine::new(&client, &model, Vec::new(), options).unwrap();
        let mut decoder = engine.decoder(slots).unwrap();
        assert_eq!(decoder.draws_on_devices(), on_devices);
        generate(&mut decoder, prompts, settings).unwrap()
    };
    let one = run(Mesh::single_device(), 3, 4, &prompts, &settings);
    let reversed: Vec<Prompt> = prompts.iter().rev().cloned().collect();
    let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
    let mut other = run(mesh, 4, 2, &reversed, &settings);
    other.reverse();
    assert_eq!(one, other);
    // Two samples of a record differ, and another seed gives other completions.
    assert_ne!(one[0].ids, one[3].ids);
    let reseeded = run(Mesh::single_device(), 3, 4, &prompts, &Settings { seed: 12, ..settings.clone() });
    assert_ne!(one, reseeded);
}

/// Steering vectors apply while decoding as in the forward: with a vector at
/// `blocks.0.hook_mlp_out` and another at `blocks.1.hook_resid_post`, each greedy token is the
/// steered forward's likeliest at the position before it (the forward's steering is held to
/// HF in next_token.rs), and the completions differ from the unsteered ones.
#[test]
fn steering_applies_while_decoding_as_in_the_forward() {
    use siphon_models::{HookKind, HookPoint, NextToken, Steering};
    let dir = fixture("tiny-qwen2");
    let model = LoadedModel::open(&dir).unwrap();
    let g = golden(&dir);
    let hidden = model.config.hidden_size;
    let vector = |seed: u32, scale: f32| -> Vec<f32> {
        (0..hidden as u32)
            .map(|i| scale * ((i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 16) as f32 / 65536.0 - 0.5))
            .collect()
    };
    let steering = vec![
        Steering {
            hook: HookPoint::block(0, HookKind::MlpOut),
            values: vector(1, 4.0),
            scale: 1.0,
            source: Default::default(),
        },
        Steering {
            hook: HookPoint::block(1, HookKind::ResidPost),
            values: vector(2, 6.0),
            scale: 1.0,
            source: Default::default(),
        },
    ];
    let client = client();
    let new_tokens = 12;
    let cache_len = 9 + new_tokens;
    let options = EngineOptions { decode: cache(cache_len, 4), steering: steering.clone(), ..Default::default() };
    let decoding = Engine::new(&client, &model, Vec::new(), options).unwrap();
    let mut decoder = decoding.decoder(3).unwrap();
    let prompts: Vec<Prompt> =
        g.prompts.iter().enumerate().map(|(i, ids)| Prompt { record: i as u64, sample: 0, ids: ids.clone() }).collect();
    let settings = greedy(new_tokens);
    let got = generate(&mut decoder, &prompts, &settings).unwrap();
    assert!(got.iter().zip(&g.completions).any(|(c, hf)| c.ids[..] != hf[..new_tokens]), "steering changed nothing");
    let outputs = NextToken { topk: 2, ..Default::default() };
    let options = EngineOptions { next_token: Some(outputs), steering, ..Default::default() };
    let forward = Engine::new(&client, &model, Vec::new(), options).unwrap();
    for (i, completion) in got.iter().enumerate() {
        let whole = [&g.prompts[i][..], &completion.ids[..]].concat();
        let acts = forward.run(&Batch::new(vec![whole.clone()], None).unwrap()).unwrap();
        let array = |name: &str| acts.next_token.iter().find(|(n, _)| n == name).unwrap().1.clone();
        let ids: Vec<i32> = array("output.topk_ids").to_vec().unwrap();
        let logprobs: Vec<f32> = array("output.topk_logprobs").to_vec().unwrap();
        let prompt = g.prompts[i].len();
        for (step, &token) in completion.ids.iter().enumerate() {
            let at = prompt - 1 + step;
            let tie = logprobs[2 * at] - logprobs[2 * at + 1] <= 1e-5;
            if ids[2 * at] as u32 != token {
                assert!(
                    tie,
                    "prompt {i} step {step}: decoded {token}, the steered forward's likeliest is {}",
                    ids[2 * at]
                );
                break;
            }
        }
    }
}
