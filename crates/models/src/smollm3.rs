//! SmolLM3 (`model_type` `smollm3`): the Llama decoder ([`crate::llama`]: RMSNorm before
//! attention and the MLP, grouped-query attention, SiLU-gated MLP, no biases, tied
//! embeddings by default) whose attention skips RoPE on some layers (NoPE): `no_rope_layers`
//! holds 1 for a layer that rotates and 0 for one that does not, by default every
//! `no_rope_layer_interval`-th layer (4) skips it. Windows only with `use_sliding_window`,
//! by default on the NoPE layers.
//!
//! Hooks: Llama's. On a NoPE layer `attn.hook_rot_q` / `hook_rot_k` are the queries and
//! keys as they enter attention, unrotated.

use crate::arch::{Arch, Family, FinalNorm};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::forward::{ForwardProgram, ForwardSpec, decoder_params, self_attention_decoder};
use crate::hf_config::{Defaults, HfConfig};
use crate::llama::FEATURES;

/// The family's handle.
pub(crate) const ARCH: Arch = Arch::of(&FAMILY);

/// Llama's weights and hooks.
pub(crate) static FAMILY: Family = Family {
    model_types: &["smollm3"],
    architectures: &["SmolLM3ForCausalLM"],
    from_hf,
    build,
    params: |c, n, lm_head| decoder_params(c, n, lm_head, &[]),
    features: FEATURES,
    renames: &[],
    final_norm: FinalNorm::PLAIN,
};

/// SmolLM3Config's: tied, eps 1e-6, windows as [`windows`] says.
const DEFAULTS: Defaults = Defaults { tie_word_embeddings: true, windows, ..Defaults::LLAMA };

fn from_hf(hf: HfConfig) -> Result<ModelConfig, ModelError> {
    // Either puts biases on projections the inventory does not list (o_proj included).
    for (key, set) in [("attention_bias", hf.attention_bias), ("mlp_bias", hf.key::<bool>("mlp_bias")?)] {
        if set == Some(true) {
            return Err(ModelError::UnsupportedArch(format!("smollm3 with {key} = true")));
        }
    }
    let c = hf.decoder(ARCH, &DEFAULTS)?;
    let rotates = rotating_layers(&hf, c.n_layers)?;
    Ok(ModelConfig { layers: c.layers.with(c.n_layers, |layer, spec| spec.skips_rope = !rotates[layer]), ..c })
}

/// Per layer, whether it applies RoPE: `no_rope_layers` (1 rotates), by default all but every
/// `no_rope_layer_interval`-th layer.
fn rotating_layers(hf: &HfConfig, n_layers: usize) -> Result<Vec<bool>, ModelError> {
    match hf.key::<Vec<u8>>("no_rope_layers")? {
        Some(flags) if flags.len() != n_layers => Err(ModelError::Config(format!(
            "no_rope_layers lists {} layers, num_hidden_layers is {n_layers}",
            flags.len()
        ))),
        Some(flags) => Ok(flags.into_iter().map(|f| f != 0).collect()),
        None => {
            let interval: usize = hf.key("no_rope_layer_interval")?.unwrap_or(4);
            if interval == 0 {
                return Err(ModelError::Config("no_rope_layer_interval 0".into()));
            }
            Ok((0..n_layers).map(|l| (l + 1) % interval != 0).collect())
        }
    }
}

/// `use_sliding_window` with a `sliding_window`: the window on the layers `layer_types`
/// marks, by default the NoPE layers. Hugging Face's eager attention windows the layers
/// `layer_types` marks even without `use_sliding_window`, its flash attention does not: such
/// a config is refused rather than computed one way.
fn windows(hf: &HfConfig, n_layers: usize, _: Arch) -> Result<Vec<Option<usize>>, ModelError> {
    let sliding_types = hf.layer_types.as_ref().is_some_and(|types| types.iter().any(|t| t == "sliding_attention"));
    match (hf.use_sliding_window.unwrap_or(false), hf.sliding_window()?.flatten()) {
        (true, Some(window)) => Ok(match hf.windows_by_layer_types(n_layers, window)? {
            Some(windows) => windows,
            None => rotating_layers(hf, n_layers)?.into_iter().map(|rotates| (!rotates).then_some(window)).collect(),
        }),
        _ if sliding_types => Err(ModelError::UnsupportedArch(
            "smollm3 config whose layer_types has sliding layers without use_sliding_window and a sliding_window \
             (transformers' attention implementations disagree on it)"
                .into(),
        )),
        _ => Ok(Vec::new()),
    }
}

/// Builds the SmolLM3 forward for `spec`.
fn build(config: &ModelConfig, spec: &ForwardSpec) -> Result<ForwardProgram, ModelError> {
    if config.arch != ARCH || config.attention.qkv_bias || config.attention.qk_norm {
        return Err(ModelError::UnsupportedArch(format!("smollm3 builder given a {:?} config", config.arch)));
    }
    self_attention_decoder(config, spec)
}

#[cfg(test)]
mod tests {
    use crate::config::ModelConfig;
    use crate::hf_config::HfConfig;

    fn parse(extra: &str) -> Result<ModelConfig, crate::error::ModelError> {
        let base = r#"{"model_type": "smollm3", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 8, "num_attention_heads": 4"#;
        HfConfig::from_json(&format!("{base}{extra}}}")).unwrap().into_config()
    }

    #[test]
    fn defaults_follow_smollm3config() {
        let c = parse("").unwrap();
        let rotating: Vec<bool> = (0..8).map(|l| c.rotates(l)).collect();
        assert_eq!(rotating, [true, true, true, false, true, true, true, false]);
        assert!(c.layers.windows().is_empty() && c.tie_word_embeddings);
        // A window goes on the NoPE layers, and only with use_sliding_window.
        assert!(parse(r#", "sliding_window": 5"#).unwrap().layers.windows().is_empty());
        let c =
            parse(r#", "use_sliding_window": true, "sliding_window": 5, "no_rope_layers": [1, 0, 1, 1, 1, 1, 0, 1]"#)
                .unwrap();
        assert_eq!(c.layers.windows(), [None, Some(5), None, None, None, None, Some(5), None]);
        assert!(!c.rotates(1) && c.rotates(3));
    }

    #[test]
    fn what_siphon_does_not_build_is_refused_by_name() {
        for (extra, named) in [
            (r#", "mlp_bias": true"#, "mlp_bias"),
            (r#", "attention_bias": true"#, "attention_bias"),
            (r#", "no_rope_layers": [1, 0]"#, "no_rope_layers lists 2"),
            (
                r#", "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention"]"#,
                "use_sliding_window",
            ),
        ] {
            let err = parse(extra).unwrap_err().to_string();
            assert!(err.contains(named), "{extra}: {err}");
        }
    }
}
