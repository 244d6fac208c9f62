//! Dictionaries' latents through the engine: tiny-llama on the tokens TransformerLens ran
//! (right-padded rows), every dictionary fixture (saved by SAELens, Gemma Scope's layout or
//! sparsify, with the library's latents of TransformerLens's hook values as goldens) read on
//! the devices from the hook it names — on one device and on a 3 x 2 mesh, with and without
//! hooks of its own — and a token firing more latents than the cap keeping its count.

mod common;
#[path = "../../models/tests/support/dictionary_fixtures.rs"]
mod dictionary_fixtures;

use std::sync::Arc;

use common::{client, fixture};
use dictionary_fixtures::dictionary_fixtures;
use safetensors::SafeTensors;
use siphon_engine::{Batch, Engine, EngineOptions};
use siphon_mesh::Mesh;
use siphon_models::dictionary::Dictionary;
use siphon_models::{DictionaryHook, HookKind, HookPoint, LoadedModel};

fn f32s(st: &SafeTensors, name: &str) -> Vec<f32> {
    st.tensor(name).unwrap().data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

/// Every dictionary fixture with its golden latents `[tokens, d_sae]`.
fn dictionaries() -> Vec<(Dictionary, Vec<f32>)> {
    dictionary_fixtures()
        .into_iter()
        .map(|dir| {
            let bytes = std::fs::read(dir.join("golden.safetensors")).unwrap();
            let latents = f32s(&SafeTensors::deserialize(&bytes).unwrap(), "latents");
            (Dictionary::open(&dir, None).unwrap(), latents)
        })
        .collect()
}

/// TransformerLens's golden rows of tiny-llama: the batch and each row's real tokens.
fn golden_batch() -> (Batch, Vec<usize>) {
    let bytes = std::fs::read(fixture("tiny-llama/golden-tl.safetensors")).unwrap();
    let tl = SafeTensors::deserialize(&bytes).unwrap();
    let ints = |name: &str| -> Vec<i64> {
        let t = tl.tensor(name).unwrap();
        match t.dtype() {
            safetensors::Dtype::I64 => {
                t.data().chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect()
            }
            _ => t.data().chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap()) as i64).collect(),
        }
    };
    let seq = tl.tensor("input_ids").unwrap().shape()[1];
    let lengths: Vec<usize> = ints("lengths").into_iter().map(|l| l as usize).collect();
    let ids: Vec<Vec<u32>> = ints("input_ids").chunks(seq).map(|r| r.iter().map(|&t| t as u32).collect()).collect();
    let mask = lengths.iter().map(|&l| (0..seq).map(|p| u8::from(p < l)).collect()).collect();
    (Batch::new(ids, Some(mask)).unwrap(), lengths)
}

fn hooks_of(model: &LoadedModel, dicts: &[(Dictionary, Vec<f32>)], cap: Option<usize>) -> Vec<DictionaryHook> {
    dicts
        .iter()
        .map(|(d, _)| DictionaryHook {
            hook: HookPoint::parse(&d.hook, &model.config).unwrap(),
            dictionary: Arc::new(d.clone()),
            cap: cap.unwrap_or(d.d_sae),
        })
        .collect()
}

#[test]
fn latents_through_the_engine_equal_the_librarys_on_one_device_and_a_mesh() {
    let model = LoadedModel::open(&fixture("tiny-llama")).unwrap();
    let dicts = dictionaries();
    assert!(dicts.len() >= 12);
    let (batch, lengths) = golden_batch();
    let seq = batch.seq();
    let mesh = Mesh::new(&[("data", 3), ("model", 2)], (0..6).collect()).unwrap();
    for (mesh, hooks) in [
        (Mesh::single_device(), vec![HookPoint::block(1, HookKind::ResidPost)]),
        (mesh.clone(), vec![HookPoint::block(1, HookKind::ResidPost)]),
        (Mesh::single_device(), vec![]),
    ] {
        let what = format!("{} devices, {} hooks", mesh.num_devices(), hooks.len());
        let options = EngineOptions { mesh, dictionaries: hooks_of(&model, &dicts, None), ..EngineOptions::default() };
        let engine = Engine::new(&client(), &model, hooks.clone(), options).unwrap();
        let acts = engine.run(&batch).unwrap();
        assert_eq!(acts.hooks.len(), hooks.len(), "{what}");
        assert_eq!(acts.latents.len(), dicts.len(), "{what}");
        for ((d, want), latents) in dicts.iter().zip(&acts.latents) {
            let n = d.d_sae;
            assert_eq!(latents.indices.shape(), [batch.batch(), seq, n]);
            let (indices, values, firings) =
                (latents.indices.to_f32(), latents.values.to_f32(), latents.firings.to_f32());
            let mut got = Vec::new();
            for (row, &len) in lengths.iter().enumerate() {
                for pos in 0..len {
                    let token = row * seq + pos;
                    let mut dense = vec![0f32; n];
                    for j in 0..n {
                        let i = indices[token * n + j];
                        if i >= 0.0 {
                            dense[i as usize] = values[token * n + j];
                        }
                    }
                    assert_eq!(dense.iter().filter(|&&v| v > 0.0).count(), firings[token] as usize, "{}", d.name);
                    got.extend(dense);
                }
            }
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = got.iter().zip(want).fold(0f32, |m, (g, w)| {
                // A NaN counts as infinitely far (`max` would drop it).
                let e = (g - w).abs();
                if e.is_nan() { f32::INFINITY } else { m.max(e) }
            });
            assert!(worst <= 1e-4 * scale, "{} ({what}): {worst} from the library's (scale {scale})", d.name);
            let differ = got.iter().zip(want).filter(|(g, w)| (**g > 0.0) != (**w > 0.0)).count();
            assert_eq!(differ, 0, "{} ({what}): firings differ from the library's", d.name);
        }
    }
}

#[test]
fn a_token_firing_more_latents_than_the_cap_keeps_its_count() {
    // The devices keep a token's `cap` largest latents and count all its firings: a count above
    // the cap is how whatever stores the latents knows to refuse the token (never truncated).
    let model = LoadedModel::open(&fixture("tiny-llama")).unwrap();
    let (batch, _) = golden_batch();
    for name in ["saelens-topk", "saelens-standard"] {
        let dicts: Vec<_> = dictionaries().into_iter().filter(|(d, _)| d.name == name).collect();
        let options = EngineOptions { dictionaries: hooks_of(&model, &dicts, Some(4)), ..EngineOptions::default() };
        let engine = Engine::new(&client(), &model, vec![], options).unwrap();
        let latents = &engine.run(&batch).unwrap().latents[0];
        let (indices, firings) = (latents.indices.to_f32(), latents.firings.to_f32());
        let over = firings.iter().position(|&f| f > 4.0).unwrap_or_else(|| panic!("{name}: no token fires past 4"));
        let kept = &indices[over * 4..(over + 1) * 4];
        assert!(kept.iter().all(|&i| i >= 0.0), "{name}: a token past the cap keeps 4 latents: {kept:?}");
    }
}

/// Chosen rows (`Batch::with_selection`): each row's last token picked on the devices, every
/// dictionary reads the chosen row, its latents the library's at that token.
#[test]
fn the_latents_of_a_chosen_row_are_the_librarys_at_its_token() {
    let model = LoadedModel::open(&fixture("tiny-llama")).unwrap();
    let dicts = dictionaries();
    let (batch, lengths) = golden_batch();
    let seq = batch.seq();
    let mut weights = vec![0f32; batch.batch() * seq];
    for (row, &len) in lengths.iter().enumerate() {
        weights[row * seq + len - 1] = 1.0;
    }
    let batch = batch.with_selection(1, weights).unwrap();
    let options = EngineOptions { dictionaries: hooks_of(&model, &dicts, None), ..EngineOptions::default() };
    let engine = Engine::new(&client(), &model, vec![HookPoint::block(1, HookKind::ResidPost)], options).unwrap();
    let acts = engine.run(&batch).unwrap();
    for ((d, want), latents) in dicts.iter().zip(&acts.latents) {
        let n = d.d_sae;
        assert_eq!(latents.indices.shape(), [batch.batch(), 1, n], "{}", d.name);
        let (indices, values) = (latents.indices.to_f32(), latents.values.to_f32());
        let mut before = 0;
        for (row, &len) in lengths.iter().enumerate() {
            let golden = &want[(before + len - 1) * n..(before + len) * n];
            before += len;
            let mut dense = vec![0f32; n];
            for j in 0..n {
                if indices[row * n + j] >= 0.0 {
                    dense[indices[row * n + j] as usize] = values[row * n + j];
                }
            }
            let scale = golden.iter().fold(1f32, |m, v| m.max(v.abs()));
            let worst = dense.iter().zip(golden).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
            assert!(worst <= 1e-4 * scale, "{} row {row}: {worst} from the library's", d.name);
        }
    }
}
