//! `config.json` as Hugging Face writes it ([`HfConfig`], a key of the wrong type named) and
//! the reading several families share: a decoder's sizes, heads, activation and RoPE
//! ([`HfConfig::decoder`], in `decode.rs` with the defaults a family's configuration class
//! fills in, [`Defaults`]; RoPE's keys in `rope.rs`), sliding windows, and a mixture's experts. What only one family reads — its own keys, defaults and refusals — is
//! in that family's file (its `from_hf`); [`HfConfig::into_config`] finds the family in the
//! registry (`family.rs`) by `model_type` or `architectures`.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

mod decode;
mod rope;

use crate::config::{MAX_LAYERS, MAX_SIZE};
use crate::error::ModelError;

pub(crate) use decode::{ActivationKey, Defaults, qwen_windows, windows_on_every_layer};

/// `config.json` as Hugging Face writes it; every field optional so that a missing one gets
/// a clear error or the architecture's default in [`HfConfig::into_config`]. Keys several
/// families read are fields; a key only one family reads stays in `extra`, read by name in
/// that family's file (`HfConfig::key`).
#[derive(Debug, Clone, Default, Deserialize)]
#[allow(missing_docs)]
pub struct HfConfig {
    pub architectures: Option<Vec<String>>,
    pub model_type: Option<String>,
    pub vocab_size: Option<usize>,
    pub hidden_size: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub rms_norm_eps: Option<f64>,
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<Value>,
    /// transformers ≥5 writes `rope_parameters` (with `rope_theta` and `rope_type` inside)
    /// instead of `rope_scaling` + `rope_theta`.
    pub rope_parameters: Option<Value>,
    pub partial_rotary_factor: Option<f64>,
    pub original_max_position_embeddings: Option<usize>,
    pub max_position_embeddings: Option<usize>,
    pub tie_word_embeddings: Option<bool>,
    pub attention_bias: Option<bool>,
    pub hidden_act: Option<String>,
    pub bos_token_id: Option<Value>,
    pub eos_token_id: Option<Value>,
    pub pad_token_id: Option<Value>,
    pub torch_dtype: Option<String>,
    /// A window size, or null (no window); absent is distinguished from null.
    #[serde(default, deserialize_with = "present")]
    pub sliding_window: Option<Value>,
    pub use_sliding_window: Option<bool>,
    pub max_window_layers: Option<usize>,
    pub layer_types: Option<Vec<String>>,
    /// The text model's config inside a multimodal one (Gemma 3).
    pub text_config: Option<Box<HfConfig>>,
    /// Mixture-of-experts keys (Qwen3-MoE, Mixtral; transformers 5 writes `num_local_experts`
    /// for both).
    pub num_experts: Option<usize>,
    pub num_local_experts: Option<usize>,
    pub num_experts_per_tok: Option<usize>,
    pub norm_topk_prob: Option<bool>,
    /// Every other key, for the one family that reads it.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

/// The numbers among the family keys ([`HfConfig::key`]) that are not sizes.
const NOT_SIZES: [&str; 6] = [
    "rotary_emb_base",
    "layer_norm_eps",
    "layer_norm_epsilon",
    "routed_scaling_factor",
    "swiglu_alpha",
    "swiglu_limit",
];

impl HfConfig {
    /// Parses `config.json` text; a key of the wrong type is named (`text_config.rope_theta`).
    pub fn from_json(text: &str) -> Result<HfConfig, ModelError> {
        let json: Value = serde_json::from_str(text).map_err(|e| ModelError::Config(format!("config.json: {e}")))?;
        HfConfig::from_value(&json, "")
    }

    /// `json` as an [`HfConfig`], the object under `at` (`""` for the top). serde's error does
    /// not say which key failed: the key that fails alone is the one named.
    fn from_value(json: &Value, at: &str) -> Result<HfConfig, ModelError> {
        HfConfig::deserialize(json).map_err(|e| {
            let alone = |(key, value): &(&String, &Value)| {
                HfConfig::deserialize(Value::Object([((*key).clone(), (*value).clone())].into_iter().collect()))
                    .is_err()
            };
            match json.as_object().and_then(|object| object.iter().find(alone)) {
                Some((key, value)) if key == "text_config" => HfConfig::from_value(value, &format!("{at}text_config."))
                    .err()
                    .unwrap_or(ModelError::Config(format!("config.json: {e}"))),
                Some((key, _)) => ModelError::Config(format!("config.json {at}{key}: {e}")),
                None => ModelError::Config(format!("config.json: {e}")),
            }
        })
    }

    /// A multimodal checkpoint's text model (Gemma 3, Gemma 4): its `text_config` as
    /// `model_type`, tied as the outer config says where the text config does not say.
    pub(crate) fn text_tower(mut self, model_type: &str) -> Result<HfConfig, ModelError> {
        let outer = self.model_type.clone().unwrap_or_default();
        let mut text = *self
            .text_config
            .take()
            .ok_or_else(|| ModelError::Config(format!("a {outer} (multimodal) config.json without text_config")))?;
        text.model_type = Some(model_type.into());
        text.tie_word_embeddings = text.tie_word_embeddings.or(self.tie_word_embeddings);
        Ok(text)
    }

    /// The `weight_block_size` of an `fp8` `quantization_config`, if the config has one.
    pub fn fp8_block_size(&self) -> Result<Option<[usize; 2]>, ModelError> {
        let Some(q) = self.key::<Value>("quantization_config")? else { return Ok(None) };
        if q.get("quant_method").and_then(Value::as_str) != Some("fp8") {
            return Ok(None);
        }
        match q.get("weight_block_size") {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match <[usize; 2]>::deserialize(v) {
                Ok(block) if block.iter().all(|&b| (1..=MAX_SIZE).contains(&b)) => Ok(Some(block)),
                Ok(_) => Err(ModelError::Config(format!(
                    "quantization_config weight_block_size {v}: each side must be 1 to {MAX_SIZE}"
                ))),
                Err(e) => Err(ModelError::Config(format!("quantization_config weight_block_size {v}: {e}"))),
            },
        }
    }

    /// Refuses a size no model has before any family computes with it: a width, head count,
    /// vocabulary or expert count above [`MAX_SIZE`], a layer count above [`MAX_LAYERS`] (here
    /// and in the `text_config`; the keys only one family reads are bounded by
    /// [`HfConfig::key`]).
    pub(crate) fn check_sizes(&self) -> Result<(), ModelError> {
        let sizes = [
            ("vocab_size", self.vocab_size, MAX_SIZE),
            ("hidden_size", self.hidden_size, MAX_SIZE),
            ("intermediate_size", self.intermediate_size, MAX_SIZE),
            ("num_attention_heads", self.num_attention_heads, MAX_SIZE),
            ("num_key_value_heads", self.num_key_value_heads, MAX_SIZE),
            ("head_dim", self.head_dim, MAX_SIZE),
            ("num_experts", self.num_experts, MAX_SIZE),
            ("num_local_experts", self.num_local_experts, MAX_SIZE),
            ("num_experts_per_tok", self.num_experts_per_tok, MAX_SIZE),
            ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
        ];
        for (name, size, most) in sizes {
            if let Some(size) = size.filter(|&size| size > most) {
                return Err(ModelError::Config(format!("{name} {size} is more than {most}: a corrupt config?")));
            }
        }
        self.text_config.as_ref().map_or(Ok(()), |text| text.check_sizes())
    }

    /// A key only one family reads, as `T`; `None` when absent or null. An integer above
    /// [`MAX_SIZE`] is refused where the key is a size, a count or a layer's index (all but
    /// the [`NOT_SIZES`]: a RoPE base of 10^7 is a real one).
    pub(crate) fn key<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, ModelError> {
        match self.extra.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) if v.as_u64().is_some_and(|n| n > MAX_SIZE as u64) && !NOT_SIZES.contains(&name) => {
                Err(ModelError::Config(format!("{name} {v} is more than {MAX_SIZE}: a corrupt config?")))
            }
            Some(v) => T::deserialize(v).map(Some).map_err(|e| ModelError::Config(format!("{name} {v}: {e}"))),
        }
    }

    /// `max_position_embeddings`, 4096 when absent.
    pub(crate) fn max_positions(&self) -> usize {
        self.max_position_embeddings.unwrap_or(4096)
    }

    /// `sliding_window`: absent (`None`), null (`Some(None)`, no window) or a positive size.
    pub(crate) fn sliding_window(&self) -> Result<Option<Option<usize>>, ModelError> {
        Ok(match &self.sliding_window {
            None => None,
            Some(Value::Null) => Some(None),
            Some(v) => Some(Some(
                v.as_u64()
                    .filter(|&w| w > 0)
                    .ok_or_else(|| ModelError::Config(format!("sliding_window {v} is not a positive integer")))?
                    as usize,
            )),
        })
    }

    /// `window` on the layers `layer_types` marks `sliding_attention`, `None` when the config
    /// has no `layer_types`.
    pub(crate) fn windows_by_layer_types(
        &self,
        n_layers: usize,
        window: usize,
    ) -> Result<Option<Vec<Option<usize>>>, ModelError> {
        let Some(types) = &self.layer_types else { return Ok(None) };
        if types.len() != n_layers {
            return Err(ModelError::Config(format!(
                "layer_types lists {} layers, num_hidden_layers is {n_layers}",
                types.len()
            )));
        }
        types
            .iter()
            .map(|t| match t.as_str() {
                "full_attention" => Ok(None),
                "sliding_attention" => Ok(Some(window)),
                other => Err(ModelError::UnsupportedArch(format!("layer type {other:?}"))),
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }

    /// `window` on the layers `layer_types` marks, by default on all but every `full`-th
    /// layer (Gemma's, OLMo 3's `sliding_window_pattern`-like defaults).
    pub(crate) fn windows_by_types_or_every(
        &self,
        n_layers: usize,
        window: usize,
        full: usize,
    ) -> Result<Vec<Option<usize>>, ModelError> {
        Ok(match self.windows_by_layer_types(n_layers, window)? {
            Some(windows) => windows,
            None => (0..n_layers).map(|l| ((l + 1) % full != 0).then_some(window)).collect(),
        })
    }

    /// Experts per block and experts per token (Qwen3-MoE, Mixtral).
    pub(crate) fn experts(&self) -> Result<(usize, usize), ModelError> {
        let n_experts = need(self.num_local_experts.or(self.num_experts), "num_experts")?;
        let top_k = need(self.num_experts_per_tok, "num_experts_per_tok")?;
        if top_k == 0 || top_k > n_experts {
            return Err(ModelError::Config(format!("num_experts_per_tok {top_k} with {n_experts} experts")));
        }
        Ok((n_experts, top_k))
    }
}

/// `v`, or an error naming the key config.json lacks.
pub(crate) fn need<T>(v: Option<T>, name: &str) -> Result<T, ModelError> {
    v.ok_or_else(|| ModelError::Config(format!("config.json lacks {name}")))
}

/// Deserializes a field that is present (even as null) into `Some`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Activation, ModelConfig, RopeScaling};

    #[test]
    fn a_large_rope_base_is_no_corrupt_size() {
        let text = r#"{"model_type": "gpt_neox", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 96,
            "num_attention_heads": 4, "num_hidden_layers": 2, "rotary_emb_base": 10000000, "rotary_pct": 0.25}"#;
        let config = HfConfig::from_json(text).unwrap().into_config().unwrap();
        assert_eq!(config.rope.theta, 1e7);
    }
    use crate::config::Moe;

    const QWEN25_05B: &str = r#"{
      "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
      "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
      "num_attention_heads": 14, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
      "rope_theta": 1000000.0, "tie_word_embeddings": true, "vocab_size": 151936,
      "max_position_embeddings": 32768, "rope_scaling": null }"#;

    #[test]
    fn qwen_defaults_and_param_count() {
        let c = HfConfig::from_json(QWEN25_05B).unwrap().into_config().unwrap();
        assert_eq!(c.arch, crate::qwen2::ARCH);
        assert_eq!(c.attention.head_dim, 64);
        assert!(c.attention.qkv_bias && c.tie_word_embeddings);
        // Qwen2.5-0.5B has 494,032,768 parameters.
        assert_eq!(c.n_params(), 494_032_768);
    }

    #[test]
    fn a_corrupt_layer_count_is_refused_by_name() {
        let text = QWEN25_05B.replace("\"num_hidden_layers\": 24", "\"num_hidden_layers\": 500000000");
        let err = HfConfig::from_json(&text).unwrap().into_config().unwrap_err().to_string();
        assert!(err.contains("num_hidden_layers 500000000"), "{err}");
    }

    #[test]
    fn llama3_rope_scaling_parses() {
        let text = r#"{"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
          "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
          "num_key_value_heads": 8, "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
          "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}"#;
        let c = HfConfig::from_json(text).unwrap().into_config().unwrap();
        assert!(matches!(c.rope.scaling, Some(RopeScaling::Llama3 { factor, .. }) if factor == 32.0));
        assert!(!c.attention.qkv_bias);
    }

    #[test]
    fn transformers5_rope_parameters_parse() {
        let text = r#"{"model_type": "llama", "vocab_size": 256, "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
          "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 500.0}}"#;
        let c = HfConfig::from_json(text).unwrap().into_config().unwrap();
        assert_eq!(c.rope.theta, 500.0);
        assert!(matches!(c.rope.scaling, Some(RopeScaling::Llama3 { original_max_position_embeddings: 16, .. })));
        // The default type reads no scaling: llama3's keys left in it are refused, not dropped.
        let err = HfConfig::from_json(&text.replace("llama3", "default")).unwrap().into_config().unwrap_err();
        assert!(err.to_string().contains("rope_parameters.factor: not a setting siphon reads"), "{err}");
        let text = text.replace(
            r#""rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16,"#,
            r#""rope_type": "default","#,
        );
        let c = HfConfig::from_json(&text).unwrap().into_config().unwrap();
        assert_eq!((c.rope.theta, c.rope.scaling), (500.0, None));
    }

    /// A small Llama whose config.json is `LLAMA` with `edit` merged in (null removes a key).
    fn llama(edit: serde_json::Value) -> Result<ModelConfig, ModelError> {
        let mut json = serde_json::json!({"model_type": "llama", "vocab_size": 256, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "rms_norm_eps": 1e-5,
            "rope_theta": 1e4, "max_position_embeddings": 64, "rope_scaling": {"rope_type": "llama3",
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}});
        for (key, value) in edit.as_object().unwrap() {
            match value {
                serde_json::Value::Null => json.as_object_mut().unwrap().remove(key),
                v => json.as_object_mut().unwrap().insert(key.clone(), v.clone()),
            };
        }
        HfConfig::from_json(&json.to_string())?.into_config()
    }

    /// The values that gave an all-NaN dataset with exit 0, and their siblings, are refused
    /// naming the value.
    #[test]
    fn a_value_out_of_its_range_is_refused_by_name() {
        use serde_json::json;
        assert!(llama(json!({})).is_ok());
        let scaling = |edit: serde_json::Value| {
            let mut s = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16});
            s.as_object_mut().unwrap().extend(edit.as_object().unwrap().clone());
            json!({ "rope_scaling": s })
        };
        for (edit, named) in [
            (json!({"rope_theta": -1}), "rope_theta (the RoPE base) -1"),
            (json!({"rope_theta": 0}), "rope_theta (the RoPE base) 0"),
            (
                json!({"rms_norm_eps": -1}),
                "rms_norm_eps (the norms' epsilon; GPT-2's layer_norm_epsilon, GPT-NeoX's layer_norm_eps) -1",
            ),
            (json!({"rms_norm_eps": 0}), "rms_norm_eps"),
            (json!({"partial_rotary_factor": 0}), "partial_rotary_factor 0 is not in (0, 1]"),
            (json!({"partial_rotary_factor": 1.5}), "partial_rotary_factor 1.5"),
            (scaling(json!({"factor": 0})), "(llama3) factor 0"),
            (scaling(json!({"low_freq_factor": 4, "high_freq_factor": 1})), "high_freq_factor 1 must be above"),
            (scaling(json!({"original_max_position_embeddings": 0})), "original_max_position_embeddings 0"),
            (scaling(json!({"rope_theta": -5})), "rope_theta (the RoPE base) -5"),
            (
                json!({"rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 16, "beta_fast": -2}}),
                "(yarn) beta_fast -2",
            ),
            (
                json!({"rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 16, "attention_factor": 0}}),
                "(yarn) attention_factor",
            ),
            (
                json!({"rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 16, "mscale": 1, "mscale_all_dim": -100}}),
                "(yarn) attention_factor",
            ),
            (json!({"rope_scaling": {"rope_type": "linear", "factor": -1}}), "(linear) factor -1"),
        ] {
            let err = llama(edit.clone()).unwrap_err().to_string();
            assert!(err.contains(named), "{edit}: {err}");
        }
    }

    /// A setting siphon does not understand is refused naming it, never dropped: a RoPE
    /// object that is not one, a key its type does not read, a key of the wrong JSON type.
    #[test]
    fn a_setting_not_understood_is_refused_by_name() {
        use serde_json::json;
        for (edit, named) in [
            (json!({"rope_parameters": "garbage"}), "rope_parameters \"garbage\" is not an object"),
            (json!({"rope_scaling": 8}), "rope_scaling 8 is not an object"),
            (
                json!({"rope_scaling": {"rope_type": "linear", "factor": 2, "low_freq_factor": 1}}),
                "rope_scaling.low_freq_factor: not a setting siphon reads for rope_type \"linear\"",
            ),
            (
                json!({"rope_scaling": {"rope_type": "llama3", "factor": "8", "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 16}}),
                "rope_scaling.factor \"8\" is not a number",
            ),
            (
                json!({"rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 16, "truncate": "no"}}),
                "rope_scaling.truncate \"no\" is not true or false",
            ),
            (
                json!({"rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 16.5}}),
                "original_max_position_embeddings 16.5 is not a non-negative integer",
            ),
            (json!({"rope_scaling": {"rope_type": "dynamic", "factor": 2}}), "rope_type \"dynamic\""),
            (
                json!({"rope_scaling": {"rope_type": "linear", "type": "yarn", "factor": 2}}),
                "gives rope_type \"linear\" and type \"yarn\"",
            ),
            (
                json!({"rope_scaling": {"rope_type": "linear", "factor": 2}, "rope_parameters": {"rope_type": "linear", "factor": 3}}),
                "both rope_parameters and rope_scaling",
            ),
            (json!({"rope_theta": "10000"}), "config.json rope_theta: invalid type: string \"10000\", expected f64"),
            (json!({"rms_norm_eps": [1e-5]}), "config.json rms_norm_eps: invalid type"),
            (json!({"num_hidden_layers": -2}), "config.json num_hidden_layers: invalid value"),
        ] {
            let err = llama(edit.clone()).unwrap_err().to_string();
            assert!(err.contains(named), "{edit}: {err}");
        }
        // Within a multimodal config's text model, the key is named by its path.
        let text = r#"{"model_type": "gemma3", "text_config": {"vocab_size": 50, "rope_theta": "x"}}"#;
        let err = HfConfig::from_json(text).unwrap_err().to_string();
        assert!(err.contains("config.json text_config.rope_theta: invalid type"), "{err}");
        // A family's own key of the wrong type, and a value JSON cannot hold.
        let err = llama(json!({"model_type": "gemma2", "query_pre_attn_scalar": "256"})).unwrap_err().to_string();
        assert!(err.contains("query_pre_attn_scalar"), "{err}");
        let err = llama(json!({"model_type": "gemma2", "query_pre_attn_scalar": -256})).unwrap_err().to_string();
        assert!(err.contains("query_pre_attn_scalar (the scores' scale) -256"), "{err}");
        let err = llama(json!({"model_type": "gemma2", "attn_logit_softcapping": 0})).unwrap_err().to_string();
        assert!(err.contains("attn_logit_softcapping 0"), "{err}");
    }

    #[test]
    fn sliding_windows_follow_hugging_face() {
        let base = r#"{"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 4, "num_attention_heads": 4"#;
        let parse = |extra: &str| HfConfig::from_json(&format!("{base}, {extra}}}")).unwrap().into_config();
        // Mistral: every layer; MistralConfig's default 4096 when absent; null turns it off.
        let c = parse(r#""model_type": "mistral", "sliding_window": 28"#).unwrap();
        assert_eq!((c.arch, c.layers.windows()), (crate::mistral::ARCH, vec![Some(28); 4]));
        assert_eq!(parse(r#""model_type": "mistral""#).unwrap().layers.windows(), vec![Some(4096); 4]);
        assert!(parse(r#""model_type": "mistral", "sliding_window": null"#).unwrap().layers.windows().is_empty());
        // Qwen2: only with use_sliding_window, from max_window_layers on, or as layer_types says.
        assert!(parse(r#""model_type": "qwen2", "sliding_window": 8"#).unwrap().layers.windows().is_empty());
        let c =
            parse(r#""model_type": "qwen2", "sliding_window": 8, "use_sliding_window": true, "max_window_layers": 2"#)
                .unwrap();
        assert_eq!(c.layers.windows(), vec![None, None, Some(8), Some(8)]);
        let c = parse(
            r#""model_type": "qwen2", "sliding_window": 8, "use_sliding_window": true,
               "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]"#,
        )
        .unwrap();
        assert_eq!(c.layers.windows(), vec![Some(8), None, Some(8), None]);
        // Llama: Hugging Face ignores a window, so siphon refuses one instead of guessing.
        let err = parse(r#""model_type": "llama", "sliding_window": 28"#).unwrap_err().to_string();
        assert!(err.contains("sliding_window 28") && err.contains("ignores"), "{err}");
        assert!(parse(r#""model_type": "llama", "sliding_window": null"#).is_ok());
        for bad in
            [r#""model_type": "mistral", "sliding_window": 0"#, r#""model_type": "mistral", "sliding_window": "x""#]
        {
            assert!(parse(bad).unwrap_err().to_string().contains("sliding_window"), "{bad}");
        }
        let err = parse(r#""model_type": "qwen2", "sliding_window": 8, "use_sliding_window": true, "layer_types": ["full_attention"]"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("layer_types"), "{err}");
    }

    #[test]
    fn newer_families_follow_their_config_classes() {
        let parse = |text: &str| HfConfig::from_json(text).unwrap().into_config();
        // GPT-2's own key names; n_inner null is 4 × n_embd; GELU-new; tied.
        let c = parse(r#"{"model_type": "gpt2", "vocab_size": 50, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 32, "n_inner": null}"#).unwrap();
        assert_eq!(
            (c.arch, c.hidden_size, c.intermediate_size, c.attention.head_dim, c.max_position_embeddings),
            (crate::gpt2::ARCH, 64, 256, 16, 32)
        );
        assert_eq!(
            (c.activation, c.rms_norm_eps, c.tie_word_embeddings, c.attention.qkv_bias),
            (Activation::GeluTanh, 1e-5, true, true)
        );
        let err = parse(r#"{"model_type": "gpt2", "vocab_size": 50, "n_embd": 64, "n_layer": 2, "n_head": 4, "scale_attn_by_inverse_layer_idx": true}"#).unwrap_err();
        assert!(err.to_string().contains("scale_attn_by_inverse_layer_idx"), "{err}");
        // Pythia as the hub writes it (rotary_pct, rotary_emb_base): exact GELU, untied.
        let pythia = r#"{"model_type": "gpt_neox", "vocab_size": 50, "hidden_size": 64, "intermediate_size": 256,
            "num_hidden_layers": 2, "num_attention_heads": 4, "rotary_pct": 0.25, "rotary_emb_base": 10000, "hidden_act": "gelu""#;
        let c = parse(&format!("{pythia}}}")).unwrap();
        assert_eq!(
            (c.rope.rotary_dim, c.activation, c.tie_word_embeddings, c.attention.qkv_bias),
            (Some(4), Activation::Gelu, false, true)
        );
        let err = parse(&format!("{pythia}, \"use_parallel_residual\": false}}")).unwrap_err();
        assert!(err.to_string().contains("use_parallel_residual"), "{err}");
        // Phi-3's LongRoPE as older configs write it: attention factor from the two lengths.
        let c = parse(
            r#"{"model_type": "phi3", "vocab_size": 50, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096, "rope_scaling": {"type": "longrope",
            "short_factor": [1, 1, 1, 1, 1, 1, 1, 1], "long_factor": [2, 2, 2, 2, 2, 2, 2, 2]}}"#,
        )
        .unwrap();
        let Some(RopeScaling::LongRope { attention_factor, original_max_position_embeddings: 4096, .. }) =
            c.rope.scaling
        else {
            panic!("{:?}", c.rope.scaling)
        };
        assert!((attention_factor - (1.0 + 32f64.ln() / 4096f64.ln()).sqrt()).abs() < 1e-12);
        // Mixtures: Qwen3-MoE's dense layers are refused by name; Mixtral always renormalises.
        let moe = r#"{"model_type": "qwen3_moe", "vocab_size": 50, "hidden_size": 64, "intermediate_size": 96,
            "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2"#;
        let c = parse(&format!("{moe}}}")).unwrap();
        assert_eq!(
            c.moe,
            Some(Moe { n_experts: 8, top_k: 2, norm_topk: false, expert_size: 32, ..Default::default() })
        );
        let err = parse(&format!("{moe}, \"mlp_only_layers\": [1]}}")).unwrap_err();
        assert!(err.to_string().contains("mlp_only_layers"), "{err}");
        let c = parse(&format!(
            "{}}}",
            moe.replace("qwen3_moe", "mixtral").replace("\"num_experts\"", "\"num_local_experts\"")
        ))
        .unwrap();
        assert_eq!(c.moe.map(|m| (m.norm_topk, m.expert_size)), Some((true, 96)));
        // A multimodal Gemma 3 config gives its text model.
        let c = parse(
            r#"{"model_type": "gemma3", "text_config": {"vocab_size": 50, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4}, "vision_config": {}}"#,
        )
        .unwrap();
        assert_eq!((c.arch, c.attention.qk_norm), (crate::gemma3::ARCH, true));
    }

    #[test]
    fn bad_configs_name_the_problem() {
        let err = HfConfig::from_json(r#"{"model_type": "bert"}"#).unwrap().into_config().unwrap_err();
        assert!(err.to_string().contains("bert"), "{err}");
        let err =
            HfConfig::from_json(r#"{"model_type": "llama", "hidden_size": 8}"#).unwrap().into_config().unwrap_err();
        assert!(err.to_string().contains("num_attention_heads"), "{err}");
    }
}
