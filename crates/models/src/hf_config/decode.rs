//! How a family's `config.json` becomes its [`ModelConfig`]: the defaults its Hugging Face
//! configuration class fills in ([`Defaults`]), where it names its activation
//! ([`ActivationKey`]) and which layers attend through a window ([`WindowRule`]), and
//! [`HfConfig::decoder`], which reads a decoder's sizes, heads, activation and RoPE with them.

use crate::arch::Arch;
use crate::config::{Activation, Attention, Layers, ModelConfig};
use crate::error::ModelError;

use super::{HfConfig, need};

/// What a family's Hugging Face configuration class fills in for the keys `config.json`
/// leaves out, and how the family reads its activation and windows.
pub(crate) struct Defaults {
    /// `head_dim` when absent (Qwen3's 128, Gemma's 256); `None`: `hidden_size / heads`.
    pub head_dim: Option<usize>,
    /// `rms_norm_eps` when absent.
    pub norm_eps: f64,
    /// The RoPE base when absent.
    pub rope_theta: f64,
    /// Keys of the RoPE object the family's text model reads to no effect (a multimodal
    /// RoPE's sections, which the equal position ids of text make plain RoPE).
    pub rope_no_effect: &'static [&'static str],
    /// `tie_word_embeddings` when absent.
    pub tie_word_embeddings: bool,
    /// `attention_bias` when absent.
    pub attention_bias: bool,
    /// The key naming the MLP's activation, its default and the values siphon builds.
    pub activation: ActivationKey,
    /// Which layers attend through a window, for `n_layers` layers of `arch`.
    pub windows: WindowRule,
}

/// A family's rule for which of `n_layers` layers of `arch` attend through which window.
pub(crate) type WindowRule = fn(&HfConfig, usize, Arch) -> Result<Vec<Option<usize>>, ModelError>;

impl Defaults {
    /// `LlamaConfig`'s: eps 1e-6, base 1e4, untied, no biases, SiLU, no windows (a config
    /// that sets one is refused).
    pub const LLAMA: Defaults = Defaults {
        head_dim: None,
        norm_eps: 1e-6,
        rope_theta: 10_000.0,
        rope_no_effect: &[],
        tie_word_embeddings: false,
        attention_bias: false,
        activation: ActivationKey::SILU,
        windows: no_windows,
    };
}

/// Where a family's configuration names its activation.
pub(crate) struct ActivationKey {
    /// The key (`hidden_act`, Gemma's `hidden_activation`, GPT-2's `activation_function`).
    pub key: &'static str,
    /// Its value when absent.
    pub default: &'static str,
    /// The values siphon builds.
    pub accepted: &'static [(&'static str, Activation)],
}

impl ActivationKey {
    /// `hidden_act`, SiLU only.
    pub const SILU: ActivationKey =
        ActivationKey { key: "hidden_act", default: "silu", accepted: &[("silu", Activation::Silu)] };
    /// The GELU names of GPT-2 and GPT-NeoX: exact (`gelu`) or tanh-approximated.
    pub const GELUS: &[(&str, Activation)] =
        &[("gelu", Activation::Gelu), ("gelu_new", Activation::GeluTanh), ("gelu_pytorch_tanh", Activation::GeluTanh)];
}

impl HfConfig {
    /// The decoder every family starts from: sizes, heads, norm epsilon, activation, windows
    /// and RoPE (`rope_theta`, `partial_rotary_factor`, `rope_scaling` or transformers 5's
    /// `rope_parameters`) as `config.json` gives them, else as `defaults` says. No q/k norms,
    /// soft-cap, scalar or experts: a family that has them sets them.
    pub(crate) fn decoder(&self, arch: Arch, defaults: &Defaults) -> Result<ModelConfig, ModelError> {
        let hidden_size = need(self.hidden_size, "hidden_size")?;
        let n_heads = need(self.num_attention_heads, "num_attention_heads")?;
        let n_kv_heads = self.num_key_value_heads.unwrap_or(n_heads);
        let head_dim = match self.head_dim.or(defaults.head_dim) {
            Some(d) => d,
            None if n_heads > 0 && hidden_size % n_heads == 0 => hidden_size / n_heads,
            None => {
                return Err(ModelError::Config(format!(
                    "hidden_size {hidden_size} is not divisible by num_attention_heads {n_heads}"
                )));
            }
        };
        let n_layers = need(self.num_hidden_layers, "num_hidden_layers")?;
        let windows = (defaults.windows)(self, n_layers, arch)?;
        let activation = self.activation(&defaults.activation)?;
        let rope = self.rope(arch, head_dim, defaults)?;
        let max_position_embeddings = self.max_positions();
        Ok(ModelConfig {
            arch,
            vocab_size: need(self.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: need(self.intermediate_size, "intermediate_size")?,
            n_layers,
            rms_norm_eps: self.rms_norm_eps.unwrap_or(defaults.norm_eps),
            attention: Attention {
                n_heads,
                n_kv_heads,
                head_dim,
                qkv_bias: self.attention_bias.unwrap_or(defaults.attention_bias),
                ..Attention::default()
            },
            rope,
            max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(defaults.tie_word_embeddings),
            activation,
            layers: Layers::default().with(windows.len(), |layer, spec| spec.window = windows[layer]),
            ..ModelConfig::default()
        })
    }

    /// The MLP's activation as `key` names it.
    fn activation(&self, key: &ActivationKey) -> Result<Activation, ModelError> {
        let value = match key.key {
            "hidden_act" => self.hidden_act.clone(),
            other => self.key::<String>(other)?,
        };
        let value = value.as_deref().unwrap_or(key.default);
        match key.accepted.iter().find(|(name, _)| *name == value) {
            Some((_, act)) => Ok(*act),
            None => {
                let names: Vec<&str> = key.accepted.iter().map(|(name, _)| *name).collect();
                Err(ModelError::UnsupportedArch(format!("{} {value:?} (supported: {})", key.key, names.join(", "))))
            }
        }
    }
}

/// The modeling file has no window (Llama, OLMo 2, GPT-2, GPT-NeoX): Hugging Face ignores a
/// `sliding_window` and attends to the whole context, so a config that sets one is refused
/// rather than silently computed without it.
pub(crate) fn no_windows(c: &HfConfig, _n_layers: usize, arch: Arch) -> Result<Vec<Option<usize>>, ModelError> {
    if let Some(window) = c.sliding_window()?.flatten() {
        return Err(ModelError::UnsupportedArch(format!(
            "{arch} config with sliding_window {window}: Hugging Face's {arch} ignores it and \
             attends to the whole context, so siphon refuses rather than guess (use \
             model_type mistral for windowed attention, or drop the key)"
        )));
    }
    Ok(Vec::new())
}

/// The window on every layer when `sliding_window` is set (Mixtral, Phi-3; Mistral's default
/// of 4096 is its family's).
pub(crate) fn windows_on_every_layer(
    c: &HfConfig,
    n_layers: usize,
    _arch: Arch,
) -> Result<Vec<Option<usize>>, ModelError> {
    Ok(vec![c.sliding_window()?.flatten(); n_layers])
}

/// Qwen2's rule (Qwen3 and Qwen3-MoE too): windows only with `use_sliding_window`, on the
/// layers `layer_types` marks, by default those from `max_window_layers` (28) on.
pub(crate) fn qwen_windows(c: &HfConfig, n_layers: usize, _arch: Arch) -> Result<Vec<Option<usize>>, ModelError> {
    match (c.use_sliding_window.unwrap_or(false), c.sliding_window()?.flatten()) {
        (false, _) | (true, None) => Ok(Vec::new()),
        (true, Some(window)) => Ok(match c.windows_by_layer_types(n_layers, window)? {
            Some(windows) => windows,
            None => {
                let first = c.max_window_layers.unwrap_or(28);
                (0..n_layers).map(|l| (l >= first).then_some(window)).collect()
            }
        }),
    }
}
