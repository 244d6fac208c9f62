//! The job's sparse dictionaries, from `--sae` to the store's latents columns: opening each
//! on its hook with its cap, its files fetched first where it is a URL ([`open`],
//! [`open_capped`]; `forward` and `plan` open them too),
//! the outputs that can hold latents ([`check_outputs`]),
//! the identity every host must share ([`fingerprint`]), how run.json describes each
//! ([`columns`]), a step's latents as the writer takes them ([`for_writer`]) and `forward`'s
//! cap check ([`check_caps`], the store's rule). The engine computes them on the devices
//! (`siphon_models::dictionary::encoder`); the store writes them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use bytes::Bytes;
use serde_json::json;
use siphon_models::dictionary::{Dictionary, Encoder, gemma_scope, llama_scope, saelens, sparsify};
use siphon_models::{DictionaryHook, HookPoint, Latents, ModelConfig};
use siphon_runtime::HostArray;
use siphon_store::{BatchLatents, LatentsColumn};

use crate::args::SaeArgs;

/// The dictionaries `--sae` names (`DIR[@HOOK]`), each on the hook it reads, keeping
/// `--latent-cap` latents a token (default: a TopK's k, else every latent).
pub fn open(args: &SaeArgs, config: &ModelConfig) -> anyhow::Result<Vec<DictionaryHook>> {
    if args.latent_cap == Some(0) {
        bail!("--latent-cap must be at least 1");
    }
    let opened = args
        .sae
        .iter()
        .map(|spec| {
            let (dir, hook) = match spec.rsplit_once('@') {
                // A hook name has no '/' (an `@` before one is a Hub revision).
                Some((dir, hook)) if !hook.contains('/') && !Path::new(spec).exists() => (dir, Some(hook)),
                _ => (spec.as_str(), None),
            };
            let dir = local_path(dir).with_context(|| format!("--sae {spec}"))?;
            let mut dictionary = Dictionary::open(&dir, hook).with_context(|| format!("--sae {spec}"))?;
            if args.splices(&dictionary.name) {
                dictionary = dictionary.with_decoder(&dir).with_context(|| format!("--sae {spec} --splice"))?;
            }
            let hook = HookPoint::parse(&dictionary.hook, config)
                .with_context(|| format!("--sae {spec}: its hook {} is not one of this model's", dictionary.hook))?;
            // A TopK keeps at most its k: a larger cap would only carry `-1`s.
            let cap = match dictionary.encoder {
                Encoder::TopK { k } => args.latent_cap.map_or(k, |cap| cap.min(k)),
                _ => args.latent_cap.unwrap_or(dictionary.d_sae),
            }
            .min(dictionary.d_sae);
            let opened = DictionaryHook { hook, dictionary: Arc::new(dictionary), cap };
            // Every command that opens one (plan, forward, extract) checks its width here, before
            // anything is counted or built; a hook whose width depends on the row's length has
            // none to check against.
            if opened.hook.dims(config, 1) != opened.hook.dims(config, 2) {
                bail!(
                    "--sae {spec}: its hook {} has no fixed per-token width (it grows with the sequence)",
                    opened.hook
                );
            }
            opened.width(config, 1).with_context(|| format!("--sae {spec}"))?;
            Ok(opened)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let names: Vec<&str> = opened.iter().map(|d| d.dictionary.name.as_str()).collect();
    args.check_splice(&names)?;
    Ok(opened)
}

/// A local directory for the dictionary `spec`: unchanged when it is not a URL, else its files
/// downloaded once ([`super::fetch::local_directory`]); a bare `OWNER/NAME[@REVISION]/PATH`
/// that is no directory here is read as `hf://`. Whichever format the files are in: `cfg.json`
/// with SAELens's or sparsify's weights, else Llama Scope's `hyperparams.json` with its
/// checkpoint, else Gemma Scope's `params.npz`.
fn local_path(spec: &str) -> anyhow::Result<PathBuf> {
    let relative = !(spec.starts_with(['/', '.', '~']) || spec.ends_with('/'));
    if !spec.contains("://") && !Path::new(spec).exists() && relative && spec.contains('/') {
        return local_path(&format!("hf://{spec}"))
            .with_context(|| format!("{spec} is no directory here, so it was read as a Hub id"));
    }
    super::fetch::local_directory(spec, "dictionary", |files| {
        if files.file("cfg.json", false)? {
            if !files.file(saelens::WEIGHTS, false)? {
                files.file(sparsify::WEIGHTS, true)?;
            }
        } else if files.file(llama_scope::HYPERPARAMS, false)? {
            files.file(llama_scope::WEIGHTS, true)?;
        } else if !files.file(gemma_scope::PARAMS, false)? {
            bail!(
                "{spec}: neither cfg.json (SAELens, sparsify), {} (Llama Scope) nor {} (Gemma Scope) is there",
                llama_scope::HYPERPARAMS,
                gemma_scope::PARAMS
            );
        }
        Ok(())
    })
}

/// Refuses `--sae` with outputs that cannot hold latents: an fp8 `--dtype` (latents are stored
/// as f32, bf16 or f16) or a `stream://` output (it carries hooks only).
pub fn check_outputs(args: &SaeArgs, dtype: &str, output: &str) -> anyhow::Result<()> {
    if args.sae.is_empty() {
        return Ok(());
    }
    if dtype == "fp8" {
        bail!("--sae: latents are stored as f32, bf16 or f16, not fp8; choose another --dtype");
    }
    if siphon_stream::address(output).is_some() {
        bail!("--sae: a dictionary's latents are written to shards; a stream:// output carries hooks only");
    }
    Ok(())
}

/// [`open`] for a run over a corpus: a dictionary that is not a TopK needs `--latent-cap`
/// (else every one of its latents would be kept for every token).
pub fn open_capped(args: &SaeArgs, config: &ModelConfig) -> anyhow::Result<Vec<DictionaryHook>> {
    let opened = open(args, config)?;
    if args.latent_cap.is_none()
        && let Some(d) = opened.iter().find(|d| !matches!(d.dictionary.encoder, Encoder::TopK { .. }))
    {
        bail!(
            "--sae: dictionary {} ({:?}) fires a varying number of latents per token: give --latent-cap N, at \
             least the most any stored token fires (a token firing more stops the run, never truncated)",
            d.dictionary.name,
            d.dictionary.encoder
        );
    }
    Ok(opened)
}

/// A dictionary's identity, which every host must share: sha256 over its encoder's description
/// and its tensors' (its decoder's too, where it is spliced) names, shapes and f32 values, as siphon computes with them (hosts that read
/// different files under one path are caught at the configuration check).
pub fn fingerprint(d: &Dictionary) -> String {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(format!("{}|{}|{}|{:?}|{:?}|{}", d.hook, d.d_in, d.d_sae, d.encoder, d.normalize, d.subtract_b_dec));
    for t in d.program_tensors() {
        hasher.update(format!("|{}{:?}|", t.name, t.shape));
        for chunk in t.values.chunks(1 << 14) {
            hasher.update(chunk.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
        }
    }
    format!("{:x}", hasher.finalize())
}

/// The store's latents columns of the run's dictionaries: named as SAELens's
/// `HookedSAETransformer` names them, each described in run.json.
pub fn columns(dictionaries: &[DictionaryHook], fingerprints: &[String]) -> Vec<LatentsColumn> {
    let names = DictionaryHook::names(dictionaries);
    dictionaries
        .iter()
        .zip(names)
        .zip(fingerprints)
        .map(|((d, name), sha256)| LatentsColumn {
            name,
            hook: d.hook.to_string(),
            width: d.dictionary.d_sae,
            cap: d.cap,
            dictionary: json!({
                "name": d.dictionary.name,
                "source": d.dictionary.source.display().to_string(),
                "d_in": d.dictionary.d_in,
                "encoder": format!("{:?}", d.dictionary.encoder),
                "normalize": format!("{:?}", d.dictionary.normalize),
                "subtract_b_dec": d.dictionary.subtract_b_dec,
                "sha256": sha256,
            }),
        })
        .collect()
}

/// A member's latents of each column (`(name, cap)`, in the dictionaries' order) as the store
/// takes them: the batch's own `tokens` rows (its tokens, or its chosen rows; a short last
/// batch's filler rows dropped).
pub fn for_writer(columns: &[(String, usize)], tokens: usize, latents: Vec<Latents<HostArray>>) -> Vec<BatchLatents> {
    columns
        .iter()
        .zip(latents)
        .map(|((name, cap), l)| {
            let rows =
                |array: HostArray, per_token: usize| Bytes::from(array.into_bytes()).slice(..tokens * per_token * 4);
            BatchLatents {
                name: name.clone(),
                cap: *cap,
                indices: rows(l.indices, *cap),
                values: rows(l.values, *cap),
                firings: rows(l.firings, 1),
            }
        })
        .collect()
}

/// Refuses a token of `siphon forward`'s batch that fired more of a dictionary's latents than
/// it keeps, by the store's rule ([`siphon_store::kept_firings`]), naming the dictionary and
/// token.
pub fn check_caps(dictionaries: &[DictionaryHook], latents: &[Latents<HostArray>]) -> anyhow::Result<()> {
    for (d, l) in dictionaries.iter().zip(latents) {
        let seq = l.firings.shape().get(1).copied().unwrap_or(1).max(1);
        let firings = l.firings.bytes().chunks_exact(4).map(|w| i32::from_le_bytes([w[0], w[1], w[2], w[3]]));
        for (t, firings) in firings.enumerate() {
            siphon_store::kept_firings(firings, d.cap).map_err(|e| {
                let name = &d.dictionary.name;
                anyhow::anyhow!("dictionary {name}: the token at row {} position {} {e}", t / seq, t % seq)
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dictionarys_fingerprint_follows_its_values_and_description() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/dictionaries/saelens-topk");
        let d = Dictionary::open(&dir, None).unwrap();
        let same = Dictionary::open(&dir, None).unwrap();
        assert_eq!(fingerprint(&d), fingerprint(&same));
        assert_eq!(fingerprint(&d).len(), 64);
        let mut value = d.clone();
        value.tensors[0].values[7] += 1e-6;
        let mut encoder = d.clone();
        encoder.subtract_b_dec = !encoder.subtract_b_dec;
        for other in [value, encoder] {
            assert_ne!(fingerprint(&d), fingerprint(&other));
        }
    }
}
