//! What siphon knows of one family ([`Family`]) and the handle a configuration keeps of it
//! ([`Arch`]). Each family's file defines its `Family`; the registry (`family.rs`) lists them
//! and finds one by name.

use serde::{Deserialize, Serialize};

use crate::config::{ModelConfig, ParamInfo};
use crate::contract::{ForwardProgram, ForwardSpec};
use crate::error::ModelError;
use crate::hf_config::HfConfig;
use crate::hooks::Feature;

/// An architecture siphon can build a forward pass for: a handle on its family's `Family`,
/// whose file's `//!` says what its block is. An architecture is written as its family's name
/// (its first `model_type`) in messages, in `run.json` and wherever it is serialized; read
/// back through the registry (`"llama".parse::<Arch>()`).
#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(into = "&'static str", try_from = "String")]
pub struct Arch(&'static Family);

impl Arch {
    /// The handle on `family`.
    pub(crate) const fn of(family: &'static Family) -> Arch {
        Arch(family)
    }

    /// The family's name: its first `model_type`.
    pub fn name(self) -> &'static str {
        self.0.model_types[0]
    }

    /// What siphon knows of the family.
    pub(crate) fn family(self) -> &'static Family {
        self.0
    }
}

/// Two handles are the same architecture when they name the same family (names are unique:
/// the registry's test).
impl PartialEq for Arch {
    fn eq(&self, other: &Arch) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Arch {}

impl std::hash::Hash for Arch {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name().hash(state);
    }
}

impl std::fmt::Debug for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl From<Arch> for &'static str {
    fn from(arch: Arch) -> &'static str {
        arch.name()
    }
}

/// What siphon knows of one architecture, all of it defined in the architecture's file.
pub(crate) struct Family {
    /// The `model_type` values of its `config.json`; the first is the family's name
    /// ([`Arch::name`]).
    pub model_types: &'static [&'static str],
    /// The `architectures` class names that identify it in a `config.json` without
    /// `model_type`.
    pub architectures: &'static [&'static str],
    /// Reads `config.json` as the family's Hugging Face configuration class does: its
    /// defaults, its own keys, and a refusal naming any setting siphon does not build.
    pub from_hf: fn(HfConfig) -> Result<ModelConfig, ModelError>,
    /// Builds the forward program.
    pub build: fn(&ModelConfig, &ForwardSpec) -> Result<ForwardProgram, ModelError>,
    /// Every weight the forward of the first `n` blocks reads, in argument order: embeddings,
    /// blocks, final norm (and the untied lm_head when asked for, last).
    pub params: fn(&ModelConfig, usize, bool) -> Vec<ParamInfo>,
    /// The block features whose hooks the family has (see [`crate::hooks::HookKind::needs`]).
    pub features: &'static [Feature],
    /// Other places checkpoints of the family keep the same tensors: `(prefix, instead)` tried
    /// in order when a name starting with `prefix` is missing (GPT-2 checkpoints without the
    /// `transformer.` prefix, the text tower of multimodal Gemma 3 checkpoints).
    pub renames: &'static [(&'static str, &'static str)],
    /// The final norm: how it applies its gain (the norm the forward's `finish_decoder`
    /// builds) and how TransformerLens folds it into the unembedding that a dictionary's logit
    /// effects read (the models crate's `Unembedding`).
    pub final_norm: FinalNorm,
}

/// How a norm applies its gain `w`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gain {
    /// `w * x` (Llama and most families).
    Plain,
    /// `(1 + w) * x` in f32 (Gemma).
    UnitOffset,
    /// `w * x` in f32 before the cast back (OLMo 2).
    F32,
}

/// A family's final norm, and its unembedding as TransformerLens's `from_pretrained` processes
/// it by default (what SAEDashboard's logit tables multiply by).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FinalNorm {
    /// How the norm applies its gain.
    pub gain: Gain,
    /// Whether TransformerLens folds the gain into `W_U` (`fold_ln`; not for the post-norm
    /// architectures, OLMo 2 and 3).
    pub folded: bool,
    /// Whether it centres `W_U` over the vocabulary (`center_unembed`; not where the final
    /// logits are soft-capped, which centring would change: Gemma 2, Gemma 4).
    pub centred: bool,
}

impl FinalNorm {
    /// `w · x`, folded and centred (Llama and most families).
    pub const PLAIN: FinalNorm = FinalNorm { gain: Gain::Plain, folded: true, centred: true };
    /// `w · x` in f32, folded and centred.
    pub const F32: FinalNorm = FinalNorm { gain: Gain::F32, ..FinalNorm::PLAIN };
    /// `(1 + w) · x` in f32 (Gemma's, Qwen3-Next's), folded as `1 + w` and centred.
    pub const UNIT_OFFSET: FinalNorm = FinalNorm { gain: Gain::UnitOffset, ..FinalNorm::PLAIN };
}
