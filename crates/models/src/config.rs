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
    /// Phi-3: Llama with fused qkv and gate/up projections and a sliding window.
    Phi3,
    /// OLMo 2: norms after attention and the MLP (none before), q/k norms over the whole
    /// projection.
    Olmo2,
    /// GPT-2: learned positions, LayerNorm with bias, fused Conv1D projections, GELU MLP.
    Gpt2,
    /// GPT-NeoX / Pythia: parallel attention and MLP, partial rotary, LayerNorm with bias.
    #[serde(rename = "gpt_neox")]
    GptNeox,
    /// Qwen3-MoE: Qwen3's attention with a routed mixture of SiLU-gated experts.
    #[serde(rename = "qwen3_moe")]
    Qwen3Moe,
    /// Mixtral: Mistral's attention with a routed mixture of SiLU-gated experts.
    Mixtral,
}

/// A routed mixture of experts in place of every block's MLP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moe {
    /// Experts per block.
    pub n_experts: usize,
    /// Experts each token is routed to.
    pub top_k: usize,
    /// Whether the top-k routing weights are divided by their sum (Mixtral always;
    /// Qwen3-MoE as `norm_topk_prob` says).
    pub norm_topk: bool,
    /// Width of one expert's gate/up projections.
    pub expert_size: usize,
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
    /// Exact GELU, `x * Φ(x)` through `erf` (`gelu`).
    Gelu,
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
            Arch::Phi3 => "phi3",
            Arch::Olmo2 => "olmo2",
            Arch::Gpt2 => "gpt2",
            Arch::GptNeox => "gpt_neox",
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::Mixtral => "mixtral",
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
    /// Phi-3's LongRoPE with the short factors (the ones Hugging Face uses while the batch
    /// is no longer than `original_max_position_embeddings`, which siphon requires): each
    /// frequency divided by its factor, cos and sin multiplied by `attention_factor`.
    LongRope {
        /// One factor per frequency (`rotary_dim / 2`).
        short_factor: Vec<f64>,
        /// Context length the factors were fitted for; longer sequences are refused.
        original_max_position_embeddings: usize,
        /// Multiplies cos and sin.
        attention_factor: f64,
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
    /// GPT-2's names.
    pub n_embd: Option<usize>,
    pub n_layer: Option<usize>,
    pub n_head: Option<usize>,
    #[serde(default, deserialize_with = "present")]
    pub n_inner: Option<serde_json::Value>,
    pub n_positions: Option<usize>,
    pub layer_norm_epsilon: Option<f64>,
    pub activation_function: Option<String>,
    pub scale_attn_weights: Option<bool>,
    pub scale_attn_by_inverse_layer_idx: Option<bool>,
    pub reorder_and_upcast_attn: Option<bool>,
    pub add_cross_attention: Option<bool>,
    /// GPT-NeoX's names.
    pub layer_norm_eps: Option<f64>,
    pub rotary_pct: Option<f64>,
    pub rotary_emb_base: Option<f64>,
    pub use_parallel_residual: Option<bool>,
    pub partial_rotary_factor: Option<f64>,
    pub original_max_position_embeddings: Option<usize>,
    /// The text model's config inside a multimodal one (Gemma 3).
    pub text_config: Option<Box<HfConfig>>,
    /// Mixture-of-experts keys (Qwen3-MoE, Mixtral; transformers 5 writes `num_local_experts`
    /// for both).
    pub num_experts: Option<usize>,
    pub num_local_experts: Option<usize>,
    pub num_experts_per_tok: Option<usize>,
    pub norm_topk_prob: Option<bool>,
    pub moe_intermediate_size: Option<usize>,
    pub decoder_sparse_step: Option<usize>,
    pub mlp_only_layers: Option<Vec<usize>>,
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
    /// The q/k norms normalise the whole projection (`n_heads * head_dim`, OLMo 2) rather
    /// than each head.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm_whole: bool,
    /// Leading dimensions of each head that RoPE rotates (GPT-NeoX's `rotary_pct`, Phi-3's
    /// `partial_rotary_factor`); `None`: all of `head_dim`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotary_dim: Option<usize>,
    /// The routed experts that replace every block's MLP (Qwen3-MoE, Mixtral).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<Moe>,
}

impl HfConfig {
    /// Parses `config.json` text.
    pub fn from_json(text: &str) -> Result<HfConfig, ModelError> {
        serde_json::from_str(text).map_err(|e| ModelError::Config(format!("config.json: {e}")))
    }

    /// Validates and fills architecture defaults.
    pub fn into_config(mut self) -> Result<ModelConfig, ModelError> {
        if self.model_type.as_deref() == Some("gemma3") {
            // A multimodal checkpoint: its text tower is a gemma3_text model whose weights
            // sit under `language_model.` (the family's renames find them).
            let mut text = *self.text_config.take().ok_or_else(|| {
                ModelError::Config("a gemma3 (multimodal) config.json without text_config".into())
            })?;
            text.model_type = Some("gemma3_text".into());
            text.tie_word_embeddings = text.tie_word_embeddings.or(self.tie_word_embeddings);
            return text.into_config();
        }
        // GPT-2 spells the sizes its own way.
        self.hidden_size = self.hidden_size.or(self.n_embd);
        self.num_hidden_layers = self.num_hidden_layers.or(self.n_layer);
        self.num_attention_heads = self.num_attention_heads.or(self.n_head);
        self.max_position_embeddings = self.max_position_embeddings.or(self.n_positions);
        let arch = match self.model_type.as_deref() {
            Some("llama") => Arch::Llama,
            Some("mistral") => Arch::Mistral,
            Some("qwen2") => Arch::Qwen2,
            Some("qwen3") => Arch::Qwen3,
            Some("gemma2") => Arch::Gemma2,
            Some("gemma3_text") => Arch::Gemma3,
            Some("phi3") => Arch::Phi3,
            Some("olmo2") => Arch::Olmo2,
            Some("gpt2") => Arch::Gpt2,
            Some("gpt_neox") => Arch::GptNeox,
            Some("qwen3_moe") => Arch::Qwen3Moe,
            Some("mixtral") => Arch::Mixtral,
            Some(other) => {
                return Err(ModelError::UnsupportedArch(format!(
                    "model_type {other:?} (supported: gemma2, gemma3, gemma3_text, gpt2, gpt_neox, llama, \
                     mistral, mixtral, olmo2, phi3, qwen2, qwen3, qwen3_moe)"
                )));
            }
            None => match self.architectures.as_deref().and_then(|a| a.first()).map(String::as_str) {
                Some("LlamaForCausalLM") => Arch::Llama,
                Some("MistralForCausalLM") => Arch::Mistral,
                Some("Qwen2ForCausalLM") => Arch::Qwen2,
                Some("Qwen3ForCausalLM") => Arch::Qwen3,
                Some("Gemma2ForCausalLM") => Arch::Gemma2,
                Some("Gemma3ForCausalLM") => Arch::Gemma3,
                Some("Phi3ForCausalLM") => Arch::Phi3,
                Some("Olmo2ForCausalLM") => Arch::Olmo2,
                Some("GPT2LMHeadModel") => Arch::Gpt2,
                Some("GPTNeoXForCausalLM") => Arch::GptNeox,
                Some("Qwen3MoeForCausalLM") => Arch::Qwen3Moe,
                Some("MixtralForCausalLM") => Arch::Mixtral,
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
            None if matches!(arch, Arch::Qwen3 | Arch::Qwen3Moe) => 128,
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
            // GPT-2 names it `activation_function`; GPT-NeoX's default is the exact GELU.
            Arch::Gpt2 | Arch::GptNeox => {
                let (key, act) = match arch {
                    Arch::Gpt2 => ("activation_function", self.activation_function.as_deref().unwrap_or("gelu_new")),
                    _ => ("hidden_act", self.hidden_act.as_deref().unwrap_or("gelu")),
                };
                match act {
                    "gelu" => Activation::Gelu,
                    "gelu_new" | "gelu_pytorch_tanh" => Activation::GeluTanh,
                    other => {
                        return Err(ModelError::UnsupportedArch(format!(
                            "{key} {other:?} (supported: gelu, gelu_new, gelu_pytorch_tanh)"
                        )));
                    }
                }
            }
            _ => match self.hidden_act.as_deref() {
                None | Some("silu") => Activation::Silu,
                Some(act) => return Err(ModelError::UnsupportedArch(format!("hidden_act {act:?} (only silu)"))),
            },
        };
        let refuse = |what: &str| Err(ModelError::UnsupportedArch(format!("{arch} with {what}")));
        match arch {
            Arch::Gpt2 if self.scale_attn_weights == Some(false) => return refuse("scale_attn_weights = false"),
            Arch::Gpt2 if self.scale_attn_by_inverse_layer_idx == Some(true) => {
                return refuse("scale_attn_by_inverse_layer_idx = true");
            }
            Arch::Gpt2 if self.reorder_and_upcast_attn == Some(true) => return refuse("reorder_and_upcast_attn = true"),
            Arch::Gpt2 if self.add_cross_attention == Some(true) => return refuse("add_cross_attention = true"),
            Arch::GptNeox if self.use_parallel_residual == Some(false) => {
                return refuse("use_parallel_residual = false (only the parallel block of Pythia and GPT-NeoX-20B)");
            }
            Arch::Phi3 | Arch::Olmo2 | Arch::Qwen3Moe | Arch::Mixtral if self.attention_bias == Some(true) => {
                return refuse("attention_bias = true");
            }
            _ => {}
        }
        let moe = match arch {
            Arch::Qwen3Moe | Arch::Mixtral => {
                let n_experts = need(self.num_local_experts.or(self.num_experts), "num_experts")?;
                let top_k = need(self.num_experts_per_tok, "num_experts_per_tok")?;
                if top_k == 0 || top_k > n_experts {
                    return Err(ModelError::Config(format!("num_experts_per_tok {top_k} with {n_experts} experts")));
                }
                // Qwen3-MoE may keep dense MLPs on some layers; every released checkpoint
                // routes every layer, and siphon builds only that.
                if arch == Arch::Qwen3Moe
                    && (self.decoder_sparse_step.unwrap_or(1) != 1 || self.mlp_only_layers.as_ref().is_some_and(|l| !l.is_empty()))
                {
                    return refuse("dense MLP layers (decoder_sparse_step != 1 or mlp_only_layers)");
                }
                let expert_size = match arch {
                    Arch::Qwen3Moe => need(self.moe_intermediate_size, "moe_intermediate_size")?,
                    _ => need(self.intermediate_size, "intermediate_size")?,
                };
                Some(Moe { n_experts, top_k, norm_topk: arch == Arch::Mixtral || self.norm_topk_prob.unwrap_or(false), expert_size })
            }
            _ => None,
        };
        let intermediate_size = match (arch, &self.n_inner) {
            // GPT2Config: `n_inner` null or absent means 4 × n_embd.
            (Arch::Gpt2, None | Some(serde_json::Value::Null)) => 4 * hidden_size,
            (Arch::Gpt2, Some(v)) => {
                v.as_u64().ok_or_else(|| ModelError::Config(format!("n_inner {v} is not a number")))? as usize
            }
            (_, _) if moe.is_some() => self.intermediate_size.unwrap_or(0),
            _ => need(self.intermediate_size, "intermediate_size")?,
        };
        let norm_eps = match arch {
            Arch::Gpt2 => self.layer_norm_epsilon.unwrap_or(1e-5),
            Arch::GptNeox => self.layer_norm_eps.unwrap_or(1e-5),
            Arch::Phi3 | Arch::Olmo2 => self.rms_norm_eps.unwrap_or(1e-5),
            _ => self.rms_norm_eps.unwrap_or(1e-6),
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
        // GPT-NeoX's older names; transformers 5 moves both into `rope_parameters`.
        let mut rope_theta = self.rope_theta.or(self.rotary_emb_base);
        let mut rotary_fraction = self.partial_rotary_factor.or(self.rotary_pct);
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
            if let Some(fraction) = params.get("partial_rotary_factor").and_then(|t| t.as_f64()) {
                rotary_fraction = Some(fraction);
            }
            let kind = params.get("rope_type").or_else(|| params.get("type")).and_then(|t| t.as_str());
            if !matches!(kind, None | Some("default")) {
                rope_scaling_json = Some(params);
            }
        }
        let max_position_embeddings = self.max_position_embeddings.unwrap_or(4096);
        let rotary_dim = match rotary_fraction {
            // Hugging Face: int(head_dim * fraction).
            Some(f) if f != 1.0 => Some((head_dim as f64 * f) as usize),
            _ => None,
        };
        let rope_scaling = match rope_scaling_json {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(parse_rope_scaling(
                &v,
                max_position_embeddings,
                self.original_max_position_embeddings,
                rotary_dim.unwrap_or(head_dim),
            )?),
        };
        let config = ModelConfig {
            arch,
            vocab_size: need(self.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            rms_norm_eps: norm_eps,
            rope_theta: rope_theta.unwrap_or(10_000.0),
            rope_scaling,
            max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(matches!(arch, Arch::Gemma2 | Arch::Gpt2)),
            qkv_bias: arch == Arch::Gpt2 || self.attention_bias.unwrap_or(matches!(arch, Arch::Qwen2 | Arch::GptNeox)),
            activation,
            attn_scalar,
            attn_softcap,
            qk_norm: matches!(arch, Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3 | Arch::Olmo2),
            local_rope_theta,
            layer_windows,
            qk_norm_whole: arch == Arch::Olmo2,
            rotary_dim,
            moe,
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
        // MixtralConfig: no window unless set.
        Arch::Mixtral => vec![sliding_window.flatten(); n_layers],
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
        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => match (c.use_sliding_window.unwrap_or(false), sliding_window.flatten()) {
            (false, _) | (true, None) => Vec::new(),
            (true, Some(window)) => by_types(window)?,
        },
        // Phi-3 windows every layer when the key is set (Phi-3-mini: 2047), like Mistral.
        Arch::Phi3 => vec![sliding_window.flatten(); n_layers],
        Arch::Llama | Arch::Olmo2 | Arch::Gpt2 | Arch::GptNeox => {
            if let Some(window) = sliding_window.flatten() {
                return Err(ModelError::UnsupportedArch(format!(
                    "{arch} config with sliding_window {window}: Hugging Face's {arch} ignores it and \
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

/// RoPE scaling from its JSON (`rope_scaling`, or `rope_parameters` in transformers 5), with
/// the config's context lengths and the rotated width (LongRoPE has a factor per frequency).
fn parse_rope_scaling(
    v: &serde_json::Value,
    max_position_embeddings: usize,
    original_max: Option<usize>,
    rotary_dim: usize,
) -> Result<RopeScaling, ModelError> {
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
        Some("longrope" | "su") => {
            let factors = |name: &str| -> Result<Vec<f64>, ModelError> {
                let list = v.get(name).and_then(|f| f.as_array()).ok_or_else(|| ModelError::Config(format!("rope_scaling lacks {name}")))?;
                let out: Vec<f64> = list.iter().filter_map(|x| x.as_f64()).collect();
                if out.len() != list.len() || out.len() != rotary_dim / 2 {
                    return Err(ModelError::Config(format!(
                        "rope_scaling {name} has {} numbers, the rotary width {rotary_dim} needs {}",
                        list.len(),
                        rotary_dim / 2
                    )));
                }
                Ok(out)
            };
            factors("long_factor")?;
            let original = original_max
                .or_else(|| v.get("original_max_position_embeddings").and_then(|x| x.as_u64()).map(|x| x as usize))
                .ok_or_else(|| ModelError::Config("longrope scaling without original_max_position_embeddings".into()))?;
            // Hugging Face's _compute_longrope_parameters.
            let factor = max_position_embeddings as f64 / original as f64;
            let attention_factor = match v.get("attention_factor").and_then(|x| x.as_f64()) {
                Some(a) => a,
                None if factor <= 1.0 => 1.0,
                None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
            };
            Ok(RopeScaling::LongRope {
                short_factor: factors("short_factor")?,
                original_max_position_embeddings: original,
                attention_factor,
            })
        }
        other => Err(ModelError::UnsupportedArch(format!(
            "rope_scaling type {other:?} (supported: llama3, linear, longrope)"
        ))),
    }
}

/// What role a weight tensor plays; the planner shards by class. Shapes are the ones the
/// forward program takes: linear weights `[out, in]` whatever their stored layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamClass {
    /// Token embeddings [vocab, hidden].
    Embedding,
    /// Learned position embeddings [n_positions, hidden] (GPT-2).
    PosEmbedding,
    /// The unembedding [vocab, hidden] (absent when tied; siphon never computes logits).
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
    /// Output projection bias [hidden], added once after the row-parallel sum.
    OBias,
    /// MLP gate projection [intermediate, hidden].
    MlpGate,
    /// MLP up projection (the input projection of a plain MLP) [intermediate, hidden].
    MlpUp,
    /// MLP down projection [hidden, intermediate].
    MlpDown,
    /// Up projection bias [intermediate].
    MlpUpBias,
    /// Down projection bias [hidden].
    MlpDownBias,
    /// A mixture's router [n_experts, hidden].
    Router,
    /// Every expert's gate projection, stacked [n_experts, expert_size, hidden].
    ExpertGate,
    /// Every expert's up projection, stacked [n_experts, expert_size, hidden].
    ExpertUp,
    /// Every expert's down projection, stacked [n_experts, hidden, expert_size].
    ExpertDown,
    /// A norm's gain, [hidden] or [head_dim] (or [heads*head_dim] for OLMo 2's q/k norms).
    Norm,
    /// A LayerNorm's bias [hidden].
    NormBias,
}

/// One weight tensor of the model, as the forward program takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamInfo {
    /// Hugging Face tensor name, e.g. `model.layers.3.self_attn.q_proj.weight`; a part of a
    /// fused tensor is named as unfused checkpoints name it (Phi-3's `qkv_proj` gives
    /// `q_proj`, `k_proj` and `v_proj`), or after the tensor and the part (`c_attn.weight[q]`).
    pub name: String,
    /// Shape the program takes (`[out, in]` for linear layers).
    pub shape: Vec<usize>,
    /// Role of the tensor.
    pub class: ParamClass,
    /// Block index, `None` for embeddings, final norm and lm_head.
    pub layer: Option<usize>,
    /// Where it comes from when it is not a stored tensor as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Slice>,
    /// Stored tensors stacked along a new first dimension to make this one (the experts of a
    /// mixture, one `[out, in]` tensor each); empty for a single stored tensor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stack: Vec<String>,
}

/// A weight cut from a stored tensor: the tensor transposed when it is stored `[in, out]`
/// (GPT-2's Conv1D), then, with its rows seen as `groups` equal blocks, rows
/// `start..start + len` of every block. Fused projections become one weight per part this
/// way (Phi-3's `qkv_proj`: one block; GPT-NeoX's per-head interleaved `query_key_value`: a
/// block per head), so that every part shards on whole heads like an unfused weight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slice {
    /// The stored tensor's Hugging Face name.
    pub tensor: String,
    /// Its shape as stored.
    pub stored: Vec<usize>,
    /// Whether it is stored `[in, out]` and transposed first.
    pub transposed: bool,
    /// Blocks the (transposed) rows form.
    pub groups: usize,
    /// First row taken within each block.
    pub start: usize,
    /// Rows taken from each block.
    pub len: usize,
}

impl ParamInfo {
    /// A stored tensor taken as it is.
    pub fn new(name: impl Into<String>, shape: &[usize], class: ParamClass, layer: Option<usize>) -> ParamInfo {
        ParamInfo { name: name.into(), shape: shape.to_vec(), class, layer, source: None, stack: Vec::new() }
    }

    /// A whole stored `[in, out]` weight (GPT-2's Conv1D), taken as `[out, in]` = `shape`.
    pub(crate) fn conv1d(name: impl Into<String>, shape: &[usize], class: ParamClass, layer: Option<usize>) -> ParamInfo {
        let name = name.into();
        let slice = Slice { tensor: name.clone(), stored: vec![shape[1], shape[0]], transposed: true, groups: 1, start: 0, len: shape[0] };
        ParamInfo { source: Some(slice), ..ParamInfo::new(name, shape, class, layer) }
    }

    /// A part of a stored tensor (see [`Slice`]) named `name`; `shape` is the part's.
    pub(crate) fn part(name: impl Into<String>, shape: &[usize], class: ParamClass, layer: Option<usize>, slice: Slice) -> ParamInfo {
        ParamInfo { source: Some(slice), ..ParamInfo::new(name, shape, class, layer) }
    }

    /// The stored tensors `stack`, each of `shape[1..]`, stacked into one weight named `name`.
    pub(crate) fn stacked(name: impl Into<String>, shape: &[usize], class: ParamClass, layer: Option<usize>, stack: Vec<String>) -> ParamInfo {
        debug_assert_eq!(stack.len(), shape[0]);
        ParamInfo { stack, ..ParamInfo::new(name, shape, class, layer) }
    }

    /// The name of the stored tensor this weight is read from.
    pub fn stored_name(&self) -> &str {
        self.source.as_ref().map_or(&self.name, |s| &s.tensor)
    }
}

impl ModelConfig {
    /// Checks the relations the forward relies on.
    pub fn validate(&self) -> Result<(), ModelError> {
        let fail = |m: String| Err(ModelError::Config(m));
        if self.vocab_size == 0 || self.hidden_size == 0 || self.n_layers == 0 || self.head_dim == 0
        {
            return fail("vocab_size, hidden_size, num_hidden_layers and head_dim must be positive".into());
        }
        if self.n_kv_heads == 0 || !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return fail(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.n_heads, self.n_kv_heads
            ));
        }
        let rotated = self.rotary_dim.unwrap_or(self.head_dim);
        if self.arch != Arch::Gpt2 && (!rotated.is_multiple_of(2) || rotated > self.head_dim) {
            return fail(format!("the rotary width {rotated} must be even and at most head_dim {}", self.head_dim));
        }
        Ok(())
    }

    /// Every weight tensor the forward pass reads, for the first `n_layers` blocks
    /// (pass `self.n_layers` for all), as the architecture's file lists them. The lm_head is
    /// listed only when untied and `with_lm_head` is set: activation extraction never
    /// computes logits.
    pub fn params(&self, n_layers: usize, with_lm_head: bool) -> Vec<ParamInfo> {
        (crate::family::family(self.arch).params)(self, n_layers.min(self.n_layers), with_lm_head)
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
    fn newer_families_follow_their_config_classes() {
        let parse = |text: &str| HfConfig::from_json(text).unwrap().into_config();
        // GPT-2's own key names; n_inner null is 4 × n_embd; GELU-new; tied.
        let c = parse(r#"{"model_type": "gpt2", "vocab_size": 50, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 32, "n_inner": null}"#).unwrap();
        assert_eq!((c.arch, c.hidden_size, c.intermediate_size, c.head_dim, c.max_position_embeddings), (Arch::Gpt2, 64, 256, 16, 32));
        assert_eq!((c.activation, c.rms_norm_eps, c.tie_word_embeddings, c.qkv_bias), (Activation::GeluTanh, 1e-5, true, true));
        let err = parse(r#"{"model_type": "gpt2", "vocab_size": 50, "n_embd": 64, "n_layer": 2, "n_head": 4, "scale_attn_by_inverse_layer_idx": true}"#).unwrap_err();
        assert!(err.to_string().contains("scale_attn_by_inverse_layer_idx"), "{err}");
        // Pythia as the hub writes it (rotary_pct, rotary_emb_base): exact GELU, untied.
        let pythia = r#"{"model_type": "gpt_neox", "vocab_size": 50, "hidden_size": 64, "intermediate_size": 256,
            "num_hidden_layers": 2, "num_attention_heads": 4, "rotary_pct": 0.25, "rotary_emb_base": 10000, "hidden_act": "gelu""#;
        let c = parse(&format!("{pythia}}}")).unwrap();
        assert_eq!((c.rotary_dim, c.activation, c.tie_word_embeddings, c.qkv_bias), (Some(4), Activation::Gelu, false, true));
        let err = parse(&format!("{pythia}, \"use_parallel_residual\": false}}")).unwrap_err();
        assert!(err.to_string().contains("use_parallel_residual"), "{err}");
        // Phi-3's LongRoPE as older configs write it: attention factor from the two lengths.
        let c = parse(r#"{"model_type": "phi3", "vocab_size": 50, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096, "rope_scaling": {"type": "longrope",
            "short_factor": [1, 1, 1, 1, 1, 1, 1, 1], "long_factor": [2, 2, 2, 2, 2, 2, 2, 2]}}"#)
        .unwrap();
        let Some(RopeScaling::LongRope { attention_factor, original_max_position_embeddings: 4096, .. }) = c.rope_scaling else {
            panic!("{:?}", c.rope_scaling)
        };
        assert!((attention_factor - (1.0 + 32f64.ln() / 4096f64.ln()).sqrt()).abs() < 1e-12);
        // Mixtures: Qwen3-MoE's dense layers are refused by name; Mixtral always renormalises.
        let moe = r#"{"model_type": "qwen3_moe", "vocab_size": 50, "hidden_size": 64, "intermediate_size": 96,
            "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2"#;
        let c = parse(&format!("{moe}}}")).unwrap();
        assert_eq!(c.moe, Some(Moe { n_experts: 8, top_k: 2, norm_topk: false, expert_size: 32 }));
        let err = parse(&format!("{moe}, \"mlp_only_layers\": [1]}}")).unwrap_err();
        assert!(err.to_string().contains("mlp_only_layers"), "{err}");
        let c = parse(&format!("{}}}", moe.replace("qwen3_moe", "mixtral").replace("\"num_experts\"", "\"num_local_experts\""))).unwrap();
        assert_eq!(c.moe.map(|m| (m.norm_topk, m.expert_size)), Some((true, 96)));
        // A multimodal Gemma 3 config gives its text model.
        let c = parse(r#"{"model_type": "gemma3", "text_config": {"vocab_size": 50, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4}, "vision_config": {}}"#).unwrap();
        assert_eq!((c.arch, c.qk_norm), (Arch::Gemma3, true));
    }

    #[test]
    fn bad_configs_name_the_problem() {
        let err = HfConfig::from_json(r#"{"model_type": "bert"}"#).unwrap().into_config().unwrap_err();
        assert!(err.to_string().contains("bert"), "{err}");
        let err = HfConfig::from_json(r#"{"model_type": "llama", "hidden_size": 8}"#)
            .unwrap()
            .into_config()
            .unwrap_err();
        assert!(err.to_string().contains("num_attention_heads"), "{err}");
    }
}
