//! Model configuration in two layers, like candle's `LlamaConfig::into_config`: [`HfConfig`]
//! mirrors `config.json` with optional fields, and [`ModelConfig`] is the plain validated form
//! every other part of siphon uses. [`ModelConfig::params`] lists every weight tensor the
//! forward needs, by its Hugging Face name, with its shape and [`ParamClass`]; the planner
//! shards by class and the loaders fill tensors by name.

use serde::{Deserialize, Serialize};

use crate::ModelError;

/// The architectures siphon can build a forward pass for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// Llama family (Llama 2/3, SmolLM2, Mistral-style configs without sliding window).
    Llama,
    /// Qwen2 / Qwen2.5: Llama with q/k/v biases.
    Qwen2,
    /// Mistral: Llama with sliding-window attention.
    Mistral,
    /// Qwen3: Llama with RMSNorm on each query and key head.
    Qwen3,
    /// Gemma 2: (1 + w) RMSNorms before and after attention and MLP, GeGLU, soft-capped
    /// attention logits, alternating sliding-window layers.
    Gemma2,
    /// Gemma 3 (text): Gemma 2 with (1 + w) q/k norms per head, no soft-cap by default, and a
    /// RoPE base of its own on the sliding-window layers.
    Gemma3,
}

/// The MLP's activation (of the gate, in a gated MLP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// `x * sigmoid(x)`.
    #[default]
    Silu,
    /// GELU with the tanh approximation (`gelu_pytorch_tanh`, `gelu_new`).
    GeluTanh,
}

impl Activation {
    fn is_silu(&self) -> bool {
        *self == Activation::Silu
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Mistral => "mistral",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3_text",
        })
    }
}

/// RoPE frequency scaling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RopeScaling {
    /// Llama 3's piecewise scaling of long wavelengths.
    Llama3 {
        /// Overall scale factor.
        factor: f64,
        /// Wavelengths shorter than `original_max / high_freq_factor` are kept.
        low_freq_factor: f64,
        /// Wavelengths longer than `original_max / low_freq_factor` are divided by `factor`.
        high_freq_factor: f64,
        /// Context length the model was pre-trained with.
        original_max_position_embeddings: usize,
    },
    /// Plain linear position interpolation: positions divided by `factor`.
    Linear {
        /// Scale factor.
        factor: f64,
    },
}

/// `config.json` as Hugging Face writes it; every field optional so that a missing one gets
/// a clear error or the architecture's default in [`HfConfig::into_config`].
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
    pub rope_scaling: Option<serde_json::Value>,
    /// transformers ≥5 writes `rope_parameters` (with `rope_theta` and `rope_type` inside)
    /// instead of `rope_scaling` + `rope_theta`.
    pub rope_parameters: Option<serde_json::Value>,
    pub max_position_embeddings: Option<usize>,
    pub tie_word_embeddings: Option<bool>,
    pub attention_bias: Option<bool>,
    pub hidden_act: Option<String>,
    pub bos_token_id: Option<serde_json::Value>,
    pub eos_token_id: Option<serde_json::Value>,
    pub pad_token_id: Option<serde_json::Value>,
    pub torch_dtype: Option<String>,
    /// A window size, or null (no window); absent is distinguished from null.
    #[serde(default, deserialize_with = "present")]
    pub sliding_window: Option<serde_json::Value>,
    pub use_sliding_window: Option<bool>,
    pub max_window_layers: Option<usize>,
    pub layer_types: Option<Vec<String>>,
    pub hidden_activation: Option<String>,
    pub query_pre_attn_scalar: Option<f64>,
    /// A cap, or null (none); absent is distinguished from null.
    #[serde(default, deserialize_with = "present")]
    pub attn_logit_softcapping: Option<serde_json::Value>,
    pub use_bidirectional_attention: Option<bool>,
    pub rope_local_base_freq: Option<f64>,
    pub sliding_window_pattern: Option<usize>,
}

/// The validated configuration of a supported model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Which forward builder to use.
    pub arch: Arch,
    /// Rows of the embedding table.
    pub vocab_size: usize,
    /// Width of the residual stream (d_model).
    pub hidden_size: usize,
    /// Width of the MLP's gate/up projections.
    pub intermediate_size: usize,
    /// Number of transformer blocks.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (GQA when fewer than `n_heads`).
    pub n_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE frequency scaling, if any.
    pub rope_scaling: Option<RopeScaling>,
    /// Longest context the model supports.
    pub max_position_embeddings: usize,
    /// Whether lm_head shares the embedding table (no separate `lm_head.weight`).
    pub tie_word_embeddings: bool,
    /// Whether q/k/v projections have biases (Qwen2 yes, Llama no).
    pub qkv_bias: bool,
    /// The MLP's activation.
    #[serde(default, skip_serializing_if = "Activation::is_silu")]
    pub activation: Activation,
    /// Attention scores are scaled by `attn_scalar^-0.5` (Gemma's `query_pre_attn_scalar`);
    /// `None` means `head_dim`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_scalar: Option<f64>,
    /// Attention logits soft-capped as `cap * tanh(s / cap)` before the mask (Gemma 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_softcap: Option<f64>,
    /// RoPE base of the sliding-window layers, which take no frequency scaling (Gemma 3);
    /// `None`: every layer uses `rope_theta` and `rope_scaling`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_rope_theta: Option<f64>,
    /// RMSNorm over `head_dim` on every query and key head before RoPE (Qwen3, Gemma 3).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm: bool,
    /// Per layer, the sliding attention window (a query attends the keys less than this many
    /// positions back, itself included); empty or `None` for full causal attention.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layer_windows: Vec<Option<usize>>,
}

impl HfConfig {
    /// Parses `config.json` text.
    pub fn from_json(text: &str) -> Result<HfConfig, ModelError> {
        serde_json::from_str(text).map_err(|e| ModelError::Config(format!("config.json: {e}")))
    }

    /// Validates and fills architecture defaults.
    pub fn into_config(self) -> Result<ModelConfig, ModelError> {
        let arch = match self.model_type.as_deref() {
            Some("llama") => Arch::Llama,
            Some("mistral") => Arch::Mistral,
            Some("qwen2") => Arch::Qwen2,
            Some("qwen3") => Arch::Qwen3,
            Some("gemma2") => Arch::Gemma2,
            Some("gemma3_text") => Arch::Gemma3,
            Some("gemma3") => {
                return Err(ModelError::UnsupportedArch(
                    "model_type \"gemma3\" (a multimodal checkpoint): siphon reads Gemma 3's text models \
                     (model_type gemma3_text); the text tower of a multimodal checkpoint is not supported yet"
                        .into(),
                ));
            }
            Some(other) => {
                return Err(ModelError::UnsupportedArch(format!(
                    "model_type {other:?} (supported: gemma2, gemma3_text, llama, mistral, qwen2, qwen3)"
                )));
            }
            None => match self.architectures.as_deref().and_then(|a| a.first()).map(String::as_str) {
                Some("LlamaForCausalLM") => Arch::Llama,
                Some("MistralForCausalLM") => Arch::Mistral,
                Some("Qwen2ForCausalLM") => Arch::Qwen2,
                Some("Qwen3ForCausalLM") => Arch::Qwen3,
                Some("Gemma2ForCausalLM") => Arch::Gemma2,
                Some("Gemma3ForCausalLM") => Arch::Gemma3,
                other => {
                    return Err(ModelError::UnsupportedArch(format!(
                        "config.json has no model_type and architectures {other:?}"
                    )));
                }
            },
        };
        fn need<T>(v: Option<T>, name: &str) -> Result<T, ModelError> {
            v.ok_or_else(|| ModelError::Config(format!("config.json lacks {name}")))
        }
        let hidden_size = need(self.hidden_size, "hidden_size")?;
        let n_heads = need(self.num_attention_heads, "num_attention_heads")?;
        let n_kv_heads = self.num_key_value_heads.unwrap_or(n_heads);
        let head_dim = match self.head_dim {
            Some(d) => d,
            // Qwen3Config's and Gemma2/3Config's defaults, not hidden / heads.
            None if arch == Arch::Qwen3 => 128,
            None if matches!(arch, Arch::Gemma2 | Arch::Gemma3) => 256,
            None if n_heads > 0 && hidden_size % n_heads == 0 => hidden_size / n_heads,
            None => {
                return Err(ModelError::Config(format!(
                    "hidden_size {hidden_size} is not divisible by num_attention_heads {n_heads}"
                )));
            }
        };
        let n_layers = need(self.num_hidden_layers, "num_hidden_layers")?;
        let layer_windows = layer_windows(arch, &self, n_layers)?;
        // Gemma's MLP reads `hidden_activation` (its `hidden_act` is unused); the others read
        // `hidden_act`.
        let activation = match arch {
            Arch::Gemma2 | Arch::Gemma3 => match self.hidden_activation.as_deref().unwrap_or("gelu_pytorch_tanh") {
                "gelu_pytorch_tanh" | "gelu_new" => Activation::GeluTanh,
                other => {
                    return Err(ModelError::UnsupportedArch(format!(
                        "hidden_activation {other:?} (supported: gelu_pytorch_tanh, gelu_new)"
                    )));
                }
            },
            _ => match self.hidden_act.as_deref() {
                None | Some("silu") => Activation::Silu,
                Some(act) => return Err(ModelError::UnsupportedArch(format!("hidden_act {act:?} (only silu)"))),
            },
        };
        let (attn_scalar, attn_softcap) = match arch {
            Arch::Gemma2 | Arch::Gemma3 => {
                if self.use_bidirectional_attention == Some(true) {
                    return Err(ModelError::UnsupportedArch(format!("{arch} with use_bidirectional_attention")));
                }
                let cap = match &self.attn_logit_softcapping {
                    // Gemma2Config caps at 50 by default, Gemma3TextConfig not at all.
                    None => (arch == Arch::Gemma2).then_some(50.0),
                    Some(serde_json::Value::Null) => None,
                    Some(v) => Some(v.as_f64().filter(|c| *c > 0.0).ok_or_else(|| {
                        ModelError::Config(format!("attn_logit_softcapping {v} is not a positive number"))
                    })?),
                };
                (Some(self.query_pre_attn_scalar.unwrap_or(256.0)), cap)
            }
            _ => (None, None),
        };
        let mut rope_theta = self.rope_theta;
        let mut rope_scaling_json = self.rope_scaling;
        let mut local_rope_theta = None;
        let mut rope_parameters = self.rope_parameters.filter(|p| !p.is_null());
        if arch == Arch::Gemma3 {
            // Gemma3TextConfig: global layers default to base 1e6, local ones to
            // `rope_local_base_freq` (1e4); transformers ≥5 writes both as `rope_parameters`
            // keyed by layer type.
            rope_theta = Some(rope_theta.unwrap_or(1_000_000.0));
            local_rope_theta = Some(self.rope_local_base_freq.unwrap_or(10_000.0));
            if let Some(by_type) = rope_parameters.take() {
                if let Some(local) = by_type.get("sliding_attention") {
                    let kind = local.get("rope_type").and_then(|t| t.as_str());
                    if !matches!(kind, None | Some("default")) {
                        return Err(ModelError::UnsupportedArch(format!(
                            "rope_type {kind:?} on gemma3's sliding-window layers (only default)"
                        )));
                    }
                    if let Some(theta) = local.get("rope_theta").and_then(|t| t.as_f64()) {
                        local_rope_theta = Some(theta);
                    }
                }
                rope_parameters = by_type.get("full_attention").cloned();
            }
        } else if rope_parameters.as_ref().is_some_and(|p| p.get("full_attention").is_some()) {
            return Err(ModelError::UnsupportedArch(format!(
                "rope_parameters per layer type in a {arch} config (only gemma3_text has them)"
            )));
        }
        if let Some(params) = rope_parameters {
            if let Some(theta) = params.get("rope_theta").and_then(|t| t.as_f64()) {
                rope_theta = Some(theta);
            }
            let kind = params.get("rope_type").or_else(|| params.get("type")).and_then(|t| t.as_str());
            if !matches!(kind, None | Some("default")) {
                rope_scaling_json = Some(params);
            }
        }
        let rope_scaling = match rope_scaling_json {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(parse_rope_scaling(&v)?),
        };
        let config = ModelConfig {
            arch,
            vocab_size: need(self.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: need(self.intermediate_size, "intermediate_size")?,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            rms_norm_eps: self.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: rope_theta.unwrap_or(10_000.0),
            rope_scaling,
            max_position_embeddings: self.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(arch == Arch::Gemma2),
            qkv_bias: self.attention_bias.unwrap_or(arch == Arch::Qwen2),
            activation,
            attn_scalar,
            attn_softcap,
            qk_norm: matches!(arch, Arch::Qwen3 | Arch::Gemma3),
            local_rope_theta,
            layer_windows,
        };
        config.validate()?;
        Ok(config)
    }
}

/// Which layers attend through a sliding window, as Hugging Face's modeling files decide:
/// Mistral windows every layer (`sliding_window`, 4096 when absent, none when null); Qwen2 only
/// with `use_sliding_window`, on the layers `layer_types` marks (by default those from
/// `max_window_layers` on); Llama's modeling file has no window, so a config that sets one is
/// refused rather than silently computed without it.
fn layer_windows(arch: Arch, c: &HfConfig, n_layers: usize) -> Result<Vec<Option<usize>>, ModelError> {
    let by_types = |window: usize| -> Result<Vec<Option<usize>>, ModelError> {
        match &c.layer_types {
            Some(types) if types.len() != n_layers => Err(ModelError::Config(format!(
                "layer_types lists {} layers, num_hidden_layers is {n_layers}",
                types.len()
            ))),
            Some(types) => types
                .iter()
                .map(|t| match t.as_str() {
                    "full_attention" => Ok(None),
                    "sliding_attention" => Ok(Some(window)),
                    other => Err(ModelError::UnsupportedArch(format!("layer type {other:?}"))),
                })
                .collect(),
            None => {
                let first = c.max_window_layers.unwrap_or(28);
                Ok((0..n_layers).map(|l| (l >= first).then_some(window)).collect())
            }
        }
    };
    // `Some(None)`: the key is there and null.
    let sliding_window: Option<Option<usize>> = match &c.sliding_window {
        None => None,
        Some(serde_json::Value::Null) => Some(None),
        Some(v) => Some(Some(v.as_u64().filter(|&w| w > 0).ok_or_else(|| {
            ModelError::Config(format!("sliding_window {v} is not a positive integer"))
        })? as usize)),
    };
    let windows = match arch {
        // A missing key is MistralConfig's default of 4096; null turns the window off.
        Arch::Mistral => vec![sliding_window.unwrap_or(Some(4096)); n_layers],
        // Gemma: `layer_types`, by default every other layer from the first (Gemma 2) or five
        // of every `sliding_window_pattern` (6) layers (Gemma 3).
        Arch::Gemma2 | Arch::Gemma3 => match sliding_window.unwrap_or(Some(4096)) {
            None => Vec::new(),
            Some(window) => match &c.layer_types {
                Some(_) => by_types(window)?,
                None => {
                    let pattern = if arch == Arch::Gemma2 { 2 } else { c.sliding_window_pattern.unwrap_or(6) };
                    (0..n_layers).map(|l| ((l + 1) % pattern != 0).then_some(window)).collect()
                }
            },
        },
        Arch::Qwen2 | Arch::Qwen3 => match (c.use_sliding_window.unwrap_or(false), sliding_window.flatten()) {
            (false, _) | (true, None) => Vec::new(),
            (true, Some(window)) => by_types(window)?,
        },
        Arch::Llama => {
            if let Some(window) = sliding_window.flatten() {
                return Err(ModelError::UnsupportedArch(format!(
                    "llama config with sliding_window {window}: Hugging Face's Llama ignores it and \
                     attends to the whole context, so siphon refuses rather than guess (use \
                     model_type mistral for windowed attention, or drop the key)"
                )));
            }
            Vec::new()
        }
    };
    Ok(if windows.iter().all(Option::is_none) { Vec::new() } else { windows })
}

/// Deserializes a field that is present (even as null) into `Some`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

fn parse_rope_scaling(v: &serde_json::Value) -> Result<RopeScaling, ModelError> {
    let kind = v.get("rope_type").or_else(|| v.get("type")).and_then(|t| t.as_str());
    let num = |name: &str| -> Result<f64, ModelError> {
        v.get(name)
            .and_then(|x| x.as_f64())
            .ok_or_else(|| ModelError::Config(format!("rope_scaling lacks {name}")))
    };
    match kind {
        Some("llama3") => Ok(RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_position_embeddings: num("original_max_position_embeddings")? as usize,
        }),
        Some("linear") => Ok(RopeScaling::Linear { factor: num("factor")? }),
        Some("default") => Ok(RopeScaling::Linear { factor: 1.0 }),
        other => Err(ModelError::UnsupportedArch(format!(
            "rope_scaling type {other:?} (supported: llama3, linear)"
        ))),
    }
}

/// What role a weight tensor plays; the planner shards by class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamClass {
    /// `model.embed_tokens.weight` [vocab, hidden].
    Embedding,
    /// `lm_head.weight` [vocab, hidden] (absent when tied; siphon never computes logits).
    LmHead,
    /// Query projection [n_heads*head_dim, hidden].
    AttnQ,
    /// Key projection [n_kv_heads*head_dim, hidden].
    AttnK,
    /// Value projection [n_kv_heads*head_dim, hidden].
    AttnV,
    /// Output projection [hidden, n_heads*head_dim].
    AttnO,
    /// Query bias [n_heads*head_dim].
    QBias,
    /// Key bias [n_kv_heads*head_dim].
    KBias,
    /// Value bias [n_kv_heads*head_dim].
    VBias,
    /// MLP gate projection [intermediate, hidden].
    MlpGate,
    /// MLP up projection [intermediate, hidden].
    MlpUp,
    /// MLP down projection [hidden, intermediate].
    MlpDown,
    /// An RMSNorm weight [hidden].
    Norm,
}

/// One weight tensor of the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamInfo {
    /// Hugging Face tensor name, e.g. `model.layers.3.self_attn.q_proj.weight`.
    pub name: String,
    /// Shape as stored by Hugging Face (out, in for linear layers).
    pub shape: Vec<usize>,
    /// Role of the tensor.
    pub class: ParamClass,
    /// Block index, `None` for embeddings, final norm and lm_head.
    pub layer: Option<usize>,
}

impl ModelConfig {
    /// Checks the relations the forward relies on.
    pub fn validate(&self) -> Result<(), ModelError> {
        let fail = |m: String| Err(ModelError::Config(m));
        if self.vocab_size == 0 || self.hidden_size == 0 || self.n_layers == 0 || self.head_dim == 0
        {
            return fail("vocab_size, hidden_size, num_hidden_layers and head_dim must be positive".into());
        }
        if self.n_kv_heads == 0 || self.n_heads % self.n_kv_heads != 0 {
            return fail(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.n_heads, self.n_kv_heads
            ));
        }
        if self.head_dim % 2 != 0 {
            return fail(format!("head_dim {} must be even for RoPE", self.head_dim));
        }
        Ok(())
    }

    /// Every weight tensor the forward pass reads, for the first `n_layers` blocks
    /// (pass `self.n_layers` for all). The lm_head is listed only when untied and
    /// `with_lm_head` is set: activation extraction never computes logits.
    pub fn params(&self, n_layers: usize, with_lm_head: bool) -> Vec<ParamInfo> {
        let h = self.hidden_size;
        let q = self.n_heads * self.head_dim;
        let kv = self.n_kv_heads * self.head_dim;
        let i = self.intermediate_size;
        let mut out = vec![ParamInfo {
            name: "model.embed_tokens.weight".into(),
            shape: vec![self.vocab_size, h],
            class: ParamClass::Embedding,
            layer: None,
        }];
        for l in 0..n_layers.min(self.n_layers) {
            let p = |suffix: &str, shape: Vec<usize>, class| ParamInfo {
                name: format!("model.layers.{l}.{suffix}"),
                shape,
                class,
                layer: Some(l),
            };
            out.push(p("input_layernorm.weight", vec![h], ParamClass::Norm));
            out.push(p("self_attn.q_proj.weight", vec![q, h], ParamClass::AttnQ));
            out.push(p("self_attn.k_proj.weight", vec![kv, h], ParamClass::AttnK));
            out.push(p("self_attn.v_proj.weight", vec![kv, h], ParamClass::AttnV));
            if self.qkv_bias {
                out.push(p("self_attn.q_proj.bias", vec![q], ParamClass::QBias));
                out.push(p("self_attn.k_proj.bias", vec![kv], ParamClass::KBias));
                out.push(p("self_attn.v_proj.bias", vec![kv], ParamClass::VBias));
            }
            if self.qk_norm {
                out.push(p("self_attn.q_norm.weight", vec![self.head_dim], ParamClass::Norm));
                out.push(p("self_attn.k_norm.weight", vec![self.head_dim], ParamClass::Norm));
            }
            out.push(p("self_attn.o_proj.weight", vec![h, q], ParamClass::AttnO));
            out.push(p("post_attention_layernorm.weight", vec![h], ParamClass::Norm));
            if matches!(self.arch, Arch::Gemma2 | Arch::Gemma3) {
                out.push(p("pre_feedforward_layernorm.weight", vec![h], ParamClass::Norm));
                out.push(p("post_feedforward_layernorm.weight", vec![h], ParamClass::Norm));
            }
            out.push(p("mlp.gate_proj.weight", vec![i, h], ParamClass::MlpGate));
            out.push(p("mlp.up_proj.weight", vec![i, h], ParamClass::MlpUp));
            out.push(p("mlp.down_proj.weight", vec![h, i], ParamClass::MlpDown));
        }
        out.push(ParamInfo {
            name: "model.norm.weight".into(),
            shape: vec![h],
            class: ParamClass::Norm,
            layer: None,
        });
        if with_lm_head && !self.tie_word_embeddings {
            out.push(ParamInfo {
                name: "lm_head.weight".into(),
                shape: vec![self.vocab_size, h],
                class: ParamClass::LmHead,
                layer: None,
            });
        }
        out
    }

    /// Number of weights (elements) of the whole model, lm_head included when untied.
    pub fn n_params(&self) -> usize {
        self.params(self.n_layers, true).iter().map(|p| p.shape.iter().product::<usize>()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN25_05B: &str = r#"{
      "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
      "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
      "num_attention_heads": 14, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
      "rope_theta": 1000000.0, "tie_word_embeddings": true, "vocab_size": 151936,
      "max_position_embeddings": 32768, "rope_scaling": null }"#;

    #[test]
    fn qwen_defaults_and_param_count() {
        let c = HfConfig::from_json(QWEN25_05B).unwrap().into_config().unwrap();
        assert_eq!(c.arch, Arch::Qwen2);
        assert_eq!(c.head_dim, 64);
        assert!(c.qkv_bias && c.tie_word_embeddings);
        // Qwen2.5-0.5B has 494,032,768 parameters.
        assert_eq!(c.n_params(), 494_032_768);
    }

    #[test]
    fn llama3_rope_scaling_parses() {
        let text = r#"{"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
          "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
          "num_key_value_heads": 8, "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
          "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}"#;
        let c = HfConfig::from_json(text).unwrap().into_config().unwrap();
        assert!(matches!(c.rope_scaling, Some(RopeScaling::Llama3 { factor, .. }) if factor == 32.0));
        assert!(!c.qkv_bias);
    }

    #[test]
    fn transformers5_rope_parameters_parse() {
        let text = r#"{"model_type": "llama", "vocab_size": 256, "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
          "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 500.0}}"#;
        let c = HfConfig::from_json(text).unwrap().into_config().unwrap();
        assert_eq!(c.rope_theta, 500.0);
        assert!(matches!(c.rope_scaling, Some(RopeScaling::Llama3 { original_max_position_embeddings: 16, .. })));
        let text = text.replace("llama3", "default");
        let c = HfConfig::from_json(&text).unwrap().into_config().unwrap();
        assert_eq!((c.rope_theta, c.rope_scaling), (500.0, None));
    }

    #[test]
    fn sliding_windows_follow_hugging_face() {
        let base = r#"{"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 4, "num_attention_heads": 4"#;
        let parse = |extra: &str| HfConfig::from_json(&format!("{base}, {extra}}}")).unwrap().into_config();
        // Mistral: every layer; MistralConfig's default 4096 when absent; null turns it off.
        let c = parse(r#""model_type": "mistral", "sliding_window": 28"#).unwrap();
        assert_eq!((c.arch, c.layer_windows.clone()), (Arch::Mistral, vec![Some(28); 4]));
        assert_eq!(parse(r#""model_type": "mistral""#).unwrap().layer_windows, vec![Some(4096); 4]);
        assert!(parse(r#""model_type": "mistral", "sliding_window": null"#).unwrap().layer_windows.is_empty());
        // Qwen2: only with use_sliding_window, from max_window_layers on, or as layer_types says.
        assert!(parse(r#""model_type": "qwen2", "sliding_window": 8"#).unwrap().layer_windows.is_empty());
        let c = parse(r#""model_type": "qwen2", "sliding_window": 8, "use_sliding_window": true, "max_window_layers": 2"#).unwrap();
        assert_eq!(c.layer_windows, vec![None, None, Some(8), Some(8)]);
        let c = parse(
            r#""model_type": "qwen2", "sliding_window": 8, "use_sliding_window": true,
               "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]"#,
        )
        .unwrap();
        assert_eq!(c.layer_windows, vec![Some(8), None, Some(8), None]);
        // Llama: Hugging Face ignores a window, so siphon refuses one instead of guessing.
        let err = parse(r#""model_type": "llama", "sliding_window": 28"#).unwrap_err().to_string();
        assert!(err.contains("sliding_window 28") && err.contains("ignores"), "{err}");
        assert!(parse(r#""model_type": "llama", "sliding_window": null"#).is_ok());
        for bad in [r#""model_type": "mistral", "sliding_window": 0"#, r#""model_type": "mistral", "sliding_window": "x""#] {
            assert!(parse(bad).unwrap_err().to_string().contains("sliding_window"), "{bad}");
        }
        let err = parse(r#""model_type": "qwen2", "sliding_window": 8, "use_sliding_window": true, "layer_types": ["full_attention"]"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("layer_types"), "{err}");
    }

    #[test]
    fn gemma2_defaults_follow_gemma2config() {
        let base = r#"{"model_type": "gemma2", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 4, "num_attention_heads": 4"#;
        let parse = |extra: &str| HfConfig::from_json(&format!("{base}{extra}}}")).unwrap().into_config();
        let c = parse("").unwrap();
        assert_eq!((c.arch, c.head_dim, c.activation), (Arch::Gemma2, 256, Activation::GeluTanh));
        assert_eq!((c.attn_scalar, c.attn_softcap, c.tie_word_embeddings), (Some(256.0), Some(50.0), true));
        assert_eq!(c.layer_windows, vec![Some(4096), None, Some(4096), None]);
        let c = parse(r#", "attn_logit_softcapping": null, "sliding_window": 8, "query_pre_attn_scalar": 144,
            "layer_types": ["full_attention", "sliding_attention", "full_attention", "full_attention"]"#)
        .unwrap();
        assert_eq!((c.attn_scalar, c.attn_softcap), (Some(144.0), None));
        assert_eq!(c.layer_windows, vec![None, Some(8), None, None]);
        // Gemma's MLP reads hidden_activation; an activation siphon does not build is named.
        let err = parse(r#", "hidden_activation": "gelu""#).unwrap_err().to_string();
        assert!(err.contains("hidden_activation \"gelu\""), "{err}");
        let err = parse(r#", "use_bidirectional_attention": true"#).unwrap_err().to_string();
        assert!(err.contains("bidirectional"), "{err}");
        // The parameter inventory has the pre- and post-feedforward norms.
        let names: Vec<String> = parse("").unwrap().params(1, false).into_iter().map(|p| p.name).collect();
        assert!(names.contains(&"model.layers.0.post_feedforward_layernorm.weight".to_string()), "{names:?}");
    }

    #[test]
    fn gemma3_defaults_and_rope_per_layer_type_follow_gemma3textconfig() {
        let base = r#"{"model_type": "gemma3_text", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 7, "num_attention_heads": 4"#;
        let parse = |extra: &str| HfConfig::from_json(&format!("{base}{extra}}}")).unwrap().into_config();
        let c = parse("").unwrap();
        assert_eq!((c.arch, c.head_dim, c.qk_norm, c.attn_softcap), (Arch::Gemma3, 256, true, None));
        assert_eq!((c.rope_theta, c.local_rope_theta), (1_000_000.0, Some(10_000.0)));
        // Five local layers for each global one.
        let local = Some(4096);
        assert_eq!(c.layer_windows, vec![local, local, local, local, local, None, local]);
        // transformers 4 spelling, then transformers 5's rope_parameters by layer type.
        let c = parse(r#", "rope_theta": 5e5, "rope_local_base_freq": 500.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0}"#).unwrap();
        assert_eq!((c.rope_theta, c.local_rope_theta), (5e5, Some(500.0)));
        assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 8.0 }));
        let c = parse(
            r#", "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e5},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}}"#,
        )
        .unwrap();
        assert_eq!((c.rope_theta, c.local_rope_theta), (1e5, Some(1000.0)));
        assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 4.0 }));
        let err = parse(r#", "rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0}}"#).unwrap_err();
        assert!(err.to_string().contains("sliding-window layers"), "{err}");
        // Per-layer-type RoPE elsewhere, and multimodal checkpoints, are refused by name.
        let err = HfConfig::from_json(&format!("{}, \"rope_parameters\": {{\"full_attention\": {{}}}}}}", base.replace("gemma3_text", "llama")))
            .unwrap()
            .into_config()
            .unwrap_err();
        assert!(err.to_string().contains("per layer type"), "{err}");
        let err = HfConfig::from_json(r#"{"model_type": "gemma3"}"#).unwrap().into_config().unwrap_err();
        assert!(err.to_string().contains("multimodal"), "{err}");
    }

    #[test]
    fn bad_configs_name_the_problem() {
        let err = HfConfig::from_json(r#"{"model_type": "gpt2"}"#).unwrap().into_config().unwrap_err();
        assert!(err.to_string().contains("gpt2"), "{err}");
        let err = HfConfig::from_json(r#"{"model_type": "llama", "hidden_size": 8}"#)
            .unwrap()
            .into_config()
            .unwrap_err();
        assert!(err.to_string().contains("num_attention_heads"), "{err}");
    }
}
