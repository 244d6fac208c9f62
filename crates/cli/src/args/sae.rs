//! The sparse dictionaries' flags (`--sae`, `--latent-cap`, …) of `forward`, `plan` and
//! `extract` ([`SaeArgs`]).

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use siphon_models::dictionary::{Dictionary, Encoder};
use siphon_models::{DictionaryHook, HookPoint, ModelConfig};

/// Sparse dictionaries' flags (`forward`, `plan`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SaeArgs {
    /// Sparse dictionaries (SAEs, transcoders) whose latents to compute on the devices,
    /// comma-separated: a directory as SAELens, EleutherAI sparsify or Gemma Scope saves one (or
    /// its URL: `hf://OWNER/NAME[@REVISION]/PATH`, gs://, s3://, https://, downloaded once),
    /// `DIR@HOOK` to name the hook it reads where its files do not. `forward` writes each as
    /// `<hook>.hook_sae_acts_post[.<dictionary>].{indices,values,firings}`: each token's largest
    /// latents (`[batch, seq, cap]` i32 indices, -1 past its firings, and f32 values) and its
    /// number of firings.
    #[arg(long, value_name = "DIR[@HOOK]", value_delimiter = ',')]
    pub sae: Vec<String>,
    /// Latents kept per token for every dictionary (its largest); a token firing more is an
    /// error, never truncated. A TopK dictionary keeps at most its k; the default for others is
    /// their width (`extract` asks for the cap).
    #[arg(long, value_name = "N")]
    pub latent_cap: Option<usize>,
}

impl SaeArgs {
    /// The dictionaries `--sae` names (`DIR[@HOOK]`), each on the hook it reads, keeping
    /// `--latent-cap` latents a token (default: a TopK's k, else every latent).
    pub fn open(&self, config: &ModelConfig) -> anyhow::Result<Vec<DictionaryHook>> {
        if self.latent_cap == Some(0) {
            bail!("--latent-cap must be at least 1");
        }
        self.sae
            .iter()
            .map(|spec| {
                let (dir, hook) = match spec.rsplit_once('@') {
                    // A hook name has no '/' (an `@` before one is a Hub revision).
                    Some((dir, hook)) if !hook.contains('/') && !Path::new(spec).exists() => (dir, Some(hook)),
                    _ => (spec.as_str(), None),
                };
                let dir = crate::job::fetch::local_dictionary_path(dir).with_context(|| format!("--sae {spec}"))?;
                let dictionary = Dictionary::open(&dir, hook).with_context(|| format!("--sae {spec}"))?;
                let hook = HookPoint::parse(&dictionary.hook, config).with_context(|| {
                    format!("--sae {spec}: its hook {} is not one of this model's", dictionary.hook)
                })?;
                // A TopK keeps at most its k: a larger cap would only carry `-1`s.
                let cap = match dictionary.encoder {
                    Encoder::TopK { k } => self.latent_cap.map_or(k, |cap| cap.min(k)),
                    _ => self.latent_cap.unwrap_or(dictionary.d_sae),
                }
                .min(dictionary.d_sae);
                Ok(DictionaryHook { hook, dictionary: Arc::new(dictionary), cap })
            })
            .collect()
    }
}

impl SaeArgs {
    /// [`SaeArgs::open`] for a run over a corpus: a dictionary that is not a TopK needs
    /// `--latent-cap` (else every one of its latents would be kept for every token).
    pub fn open_capped(&self, config: &ModelConfig) -> anyhow::Result<Vec<DictionaryHook>> {
        let opened = self.open(config)?;
        if self.latent_cap.is_none()
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
}
