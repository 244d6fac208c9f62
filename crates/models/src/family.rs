//! The registry of model families: for each [`Arch`], the functions and facts of its file.
//! Adding a family is one new file that defines a [`Family`] and one arm here (plus its
//! `model_type` in [`crate::config`]).

use crate::config::{Arch, ModelConfig, ParamInfo};
use crate::forward::{ForwardProgram, ForwardSpec};
use crate::hooks::Feature;
use crate::ModelError;

/// What siphon knows of one architecture, all of it defined in the architecture's file.
pub(crate) struct Family {
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
}

/// The family of `arch`.
pub(crate) fn family(arch: Arch) -> &'static Family {
    match arch {
        Arch::Llama => &crate::llama::FAMILY,
        Arch::Qwen2 => &crate::qwen2::FAMILY,
        Arch::Mistral => &crate::mistral::FAMILY,
        Arch::Qwen3 => &crate::qwen3::FAMILY,
        Arch::Gemma2 => &crate::gemma2::FAMILY,
        Arch::Gemma3 => &crate::gemma3::FAMILY,
        Arch::Phi3 => &crate::phi3::FAMILY,
        Arch::Olmo2 => &crate::olmo2::FAMILY,
        Arch::Gpt2 => &crate::gpt2::FAMILY,
        Arch::GptNeox => &crate::gpt_neox::FAMILY,
        Arch::Qwen3Moe => &crate::qwen3_moe::FAMILY,
        Arch::Mixtral => &crate::mixtral::FAMILY,
    }
}
