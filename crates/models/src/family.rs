//! The registry of model families: every [`Arch`] with its [`Family`], which holds what siphon
//! knows of it, all of it defined in the family's own file — the `model_type` and
//! `architectures` names its checkpoints carry, how its configuration class reads
//! `config.json`, its weights, its forward and the hooks it has.
//!
//! Adding a family: a variant of [`Arch`], a `<family>.rs` defining its `FAMILY`, its line in
//! [`FAMILIES`], and its variant in this file's test (whose `match` does not compile without
//! it).

use serde::{Deserialize, Serialize};

use crate::config::{ModelConfig, ParamInfo};
use crate::forward::{ForwardProgram, ForwardSpec};
use crate::hooks::Feature;
use crate::{HfConfig, ModelError};

/// The architectures siphon can build a forward pass for; each file's `//!` says what its
/// block is. An architecture is written as its family's name (its first `model_type`) in
/// messages, in `run.json` and wherever it is serialized.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "&'static str", try_from = "String")]
#[allow(missing_docs)]
pub enum Arch {
    #[default]
    Llama,
    Qwen2,
    Mistral,
    Qwen3,
    Gemma2,
    Gemma3,
    Phi3,
    Olmo2,
    Gpt2,
    GptNeox,
    Qwen3Moe,
    Mixtral,
    Olmo3,
    Gemma4,
    SmolLM3,
    Olmoe,
    GptOss,
    Qwen3Next,
    Qwen3_5,
    Qwen3_5Moe,
    DeepseekV3,
}

impl Arch {
    /// The family's name: its first `model_type`.
    pub fn name(self) -> &'static str {
        family(self).model_types[0]
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

impl TryFrom<String> for Arch {
    type Error = String;

    fn try_from(name: String) -> Result<Arch, String> {
        FAMILIES.iter().find(|f| f.model_types[0] == name).map(|f| f.arch).ok_or_else(|| {
            let known: Vec<&str> = FAMILIES.iter().map(|f| f.model_types[0]).collect();
            format!("unknown architecture {name:?} (known: {})", known.join(", "))
        })
    }
}

/// What siphon knows of one architecture, all of it defined in the architecture's file.
pub(crate) struct Family {
    /// Its registry key.
    pub arch: Arch,
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
}

/// Every family, in the order `model_type`s are listed in errors.
pub(crate) const FAMILIES: &[&Family] = &[
    &crate::deepseek_v3::FAMILY,
    &crate::gemma2::FAMILY,
    &crate::gemma3::FAMILY,
    &crate::gemma4::FAMILY,
    &crate::gpt2::FAMILY,
    &crate::gpt_oss::FAMILY,
    &crate::gpt_neox::FAMILY,
    &crate::llama::FAMILY,
    &crate::mistral::FAMILY,
    &crate::mixtral::FAMILY,
    &crate::olmo2::FAMILY,
    &crate::olmo3::FAMILY,
    &crate::olmoe::FAMILY,
    &crate::phi3::FAMILY,
    &crate::qwen2::FAMILY,
    &crate::qwen3::FAMILY,
    &crate::qwen3_5::FAMILY,
    &crate::qwen3_5::MOE_FAMILY,
    &crate::qwen3_moe::FAMILY,
    &crate::qwen3_next::FAMILY,
    &crate::smollm3::FAMILY,
];

/// `model_type`s of families siphon does not build, with what it lacks: refused by name
/// rather than as unknown.
const REFUSED: &[(&str, &str)] = &[(
    "deepseek_v32",
    "DeepSeek-V3.2's sparse attention (its lightning indexer's top-k choice of keys) is not built; \
     DeepSeek-V3 and V3.1 checkpoints are deepseek_v3",
)];

/// The family of `arch`.
pub(crate) fn family(arch: Arch) -> &'static Family {
    FAMILIES.iter().copied().find(|f| f.arch == arch).expect("every Arch has a family in FAMILIES (tested)")
}

/// The family a `config.json` is for: by `model_type`, else by its first `architectures`
/// class name.
pub(crate) fn for_hf(c: &HfConfig) -> Result<&'static Family, ModelError> {
    match (c.model_type.as_deref(), c.architectures.as_deref().and_then(|a| a.first())) {
        (Some(model_type), _) => {
            if let Some((_, why)) = REFUSED.iter().find(|(t, _)| *t == model_type) {
                return Err(ModelError::UnsupportedArch(format!("model_type {model_type:?}: {why}")));
            }
            FAMILIES.iter().copied().find(|f| f.model_types.contains(&model_type)).ok_or_else(|| {
                let mut known: Vec<&str> = FAMILIES.iter().flat_map(|f| f.model_types.iter().copied()).collect();
                known.sort_unstable();
                ModelError::UnsupportedArch(format!("model_type {model_type:?} (supported: {})", known.join(", ")))
            })
        }
        (None, class) => FAMILIES
            .iter()
            .copied()
            .find(|f| class.is_some_and(|class| f.architectures.contains(&class.as_str())))
            .ok_or_else(|| {
                ModelError::UnsupportedArch(format!("config.json has no model_type and architectures {class:?}"))
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant; the `match` does not compile when one is missing.
    fn every_arch() -> Vec<Arch> {
        use Arch::*;
        let all = vec![
            Llama, Qwen2, Mistral, Qwen3, Gemma2, Gemma3, Phi3, Olmo2, Gpt2, GptNeox, Qwen3Moe, Mixtral, Olmo3,
            SmolLM3, Gemma4, Olmoe, GptOss, Qwen3Next, Qwen3_5, Qwen3_5Moe, DeepseekV3,
        ];
        for arch in &all {
            match arch {
                Llama | Qwen2 | Mistral | Qwen3 | Gemma2 | Gemma3 | Phi3 | Olmo2 | Gpt2 | GptNeox | Qwen3Moe
                | Mixtral | Olmo3 | SmolLM3 | Gemma4 | Olmoe | GptOss | Qwen3Next | Qwen3_5 | Qwen3_5Moe
                | DeepseekV3 => {}
            }
        }
        all
    }

    /// Each architecture's name, as run.json files of earlier versions hold it (serde's
    /// names then) and messages write it.
    #[test]
    fn an_architecture_is_one_name_everywhere() {
        let names = [
            "llama",
            "qwen2",
            "mistral",
            "qwen3",
            "gemma2",
            "gemma3",
            "phi3",
            "olmo2",
            "gpt2",
            "gpt_neox",
            "qwen3_moe",
            "mixtral",
            "olmo3",
            "smollm3",
            "gemma4",
            "olmoe",
            "gpt_oss",
            "qwen3_next",
            "qwen3_5",
            "qwen3_5_moe",
            "deepseek_v3",
        ];
        for (arch, name) in every_arch().into_iter().zip(names) {
            assert_eq!(arch.to_string(), name);
            assert_eq!(serde_json::to_string(&arch).unwrap(), format!("{name:?}"));
            assert_eq!(serde_json::from_str::<Arch>(&format!("{name:?}")).unwrap(), arch);
        }
        let unknown = serde_json::from_str::<Arch>("\"gemma4_text\"").unwrap_err().to_string();
        assert!(unknown.contains("unknown architecture \"gemma4_text\"") && unknown.contains("gemma4,"), "{unknown}");
    }

    #[test]
    fn every_family_is_registered_once_under_its_arch() {
        let archs = every_arch();
        assert_eq!(archs.len(), FAMILIES.len());
        for arch in archs {
            assert_eq!(family(arch).arch, arch);
        }
        for f in FAMILIES {
            let json = format!("{{\"model_type\": {:?}}}", f.model_types[0]);
            let found = for_hf(&HfConfig::from_json(&json).unwrap()).unwrap();
            assert_eq!(found.arch, f.arch);
        }
        let mut names: Vec<&str> = FAMILIES.iter().flat_map(|f| f.model_types.iter().copied()).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a model_type belongs to one family");
    }
}
