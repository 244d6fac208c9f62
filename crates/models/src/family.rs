//! The registry of model families: every family's [`Family`], defined in its own file — the
//! `model_type` and `architectures` names its checkpoints carry, how its configuration class
//! reads `config.json`, its weights, its forward and the hooks it has — and the lookups by
//! name: an [`Arch`] read back from its name, a `config.json`'s family.
//!
//! Adding a family: a `<family>.rs` defining its `FAMILY` (and its `ARCH` handle), its `mod`
//! line in `lib.rs` and its line in [`FAMILIES`].

use std::str::FromStr;

use crate::arch::{Arch, Family};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::hf_config::HfConfig;

/// The architecture of a configuration that names none: Llama's.
impl Default for Arch {
    fn default() -> Arch {
        crate::llama::ARCH
    }
}

impl FromStr for Arch {
    type Err = String;

    /// The architecture named `name` (its family's first `model_type`).
    fn from_str(name: &str) -> Result<Arch, String> {
        FAMILIES.iter().find(|f| f.model_types[0] == name).map(|f| Arch::of(f)).ok_or_else(|| {
            let known: Vec<&str> = FAMILIES.iter().map(|f| f.model_types[0]).collect();
            format!("unknown architecture {name:?} (known: {})", known.join(", "))
        })
    }
}

impl TryFrom<String> for Arch {
    type Error = String;

    fn try_from(name: String) -> Result<Arch, String> {
        name.parse()
    }
}

impl HfConfig {
    /// The family's validated configuration, with its architecture's defaults filled in.
    pub fn into_config(self) -> Result<ModelConfig, ModelError> {
        self.check_sizes()?;
        let family = for_hf(&self)?;
        let config = (family.from_hf)(self)?;
        config.validate()?;
        Ok(config)
    }
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

    /// Each architecture's name, as run.json files of earlier versions hold it (serde's
    /// names then) and messages write it, in the registry's order.
    #[test]
    fn an_architecture_is_one_name_everywhere() {
        let names = [
            "deepseek_v3",
            "gemma2",
            "gemma3",
            "gemma4",
            "gpt2",
            "gpt_oss",
            "gpt_neox",
            "llama",
            "mistral",
            "mixtral",
            "olmo2",
            "olmo3",
            "olmoe",
            "phi3",
            "qwen2",
            "qwen3",
            "qwen3_5",
            "qwen3_5_moe",
            "qwen3_moe",
            "qwen3_next",
            "smollm3",
        ];
        assert_eq!(FAMILIES.len(), names.len());
        for (family, name) in FAMILIES.iter().zip(names) {
            let arch = Arch::of(family);
            assert_eq!((arch.to_string(), format!("{arch:?}")), (name.to_string(), name.to_string()));
            assert_eq!(serde_json::to_string(&arch).unwrap(), format!("{name:?}"));
            assert_eq!(serde_json::from_str::<Arch>(&format!("{name:?}")).unwrap(), arch);
            assert!(std::ptr::eq(name.parse::<Arch>().unwrap().family(), *family));
        }
        let unknown = serde_json::from_str::<Arch>("\"gemma4_text\"").unwrap_err().to_string();
        assert!(unknown.contains("unknown architecture \"gemma4_text\"") && unknown.contains("gemma4,"), "{unknown}");
        assert_eq!(Arch::default(), crate::llama::ARCH);
    }

    #[test]
    fn every_family_is_found_by_its_model_types() {
        for f in FAMILIES {
            for model_type in f.model_types {
                let json = format!("{{\"model_type\": {model_type:?}}}");
                assert!(std::ptr::eq(for_hf(&HfConfig::from_json(&json).unwrap()).unwrap(), *f), "{model_type}");
            }
        }
        let mut names: Vec<&str> = FAMILIES.iter().flat_map(|f| f.model_types.iter().copied()).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a model_type belongs to one family");
    }
}
