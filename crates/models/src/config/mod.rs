//! Model configuration in two layers, like candle's `LlamaConfig::into_config`:
//! [`crate::hf_config::HfConfig`] mirrors `config.json` with optional fields, and [`ModelConfig`] is the
//! plain validated form every other part of siphon uses: the sizes, and the settings of the
//! shared layer pieces that families choose between. [`ModelConfig::params`] lists every
//! weight tensor the forward needs, by its Hugging Face name, with its shape and
//! [`ParamClass`]; the planner shards by class and the loaders fill tensors by name.

mod attention;
mod layers;
mod mixers;
mod mixture;
mod rope;

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub use self::attention::Attention;
pub use self::layers::{LayerShape, LayerSpec, Layers};
pub use self::mixers::{LinearAttention, Mla};
pub use self::mixture::Moe;
pub use self::rope::{Rope, RopeScaling};
pub use crate::arch::Arch;
use crate::error::ModelError;

/// Per-layer input embeddings: a second embedding table of `width` per layer, and a
/// projection of the token embeddings, mixed into each block after its MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerLayerInput {
    /// Width of one layer's input (`hidden_size_per_layer_input`).
    pub width: usize,
    /// Rows of the per-layer table (`vocab_size_per_layer_input`).
    pub vocab_size: usize,
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

/// Settings a family's builder alone reads, defined in the family's file: the configuration
/// keeps them by key, so that it names no family.
pub trait FamilyExtra: Serialize + DeserializeOwned {
    /// Its key in the configuration, and in run.json.
    const KEY: &'static str;
}

/// The [`FamilyExtra`]s of a configuration, each as its family serializes it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Extras(BTreeMap<String, serde_json::Value>);

impl Extras {
    /// Keeps `extra` under its key.
    pub fn set<T: FamilyExtra>(&mut self, extra: &T) {
        let value = serde_json::to_value(extra).expect("a family's extra serializes to JSON");
        self.0.insert(T::KEY.to_string(), value);
    }

    /// The extra kept under `T`'s key, if any (one that does not read as `T`, which `set`
    /// never writes, is absent: the family's builder then refuses the config).
    pub fn get<T: FamilyExtra>(&self) -> Option<T> {
        self.0.get(T::KEY).and_then(|v| serde_json::from_value(v.clone()).ok())
    }
}

/// The validated configuration of a supported model. `Default` is no model (every size 0):
/// a start for tests and for a family's `from_hf`, never valid as it is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// The attention's heads and the settings families choose between.
    #[serde(flatten)]
    pub attention: Attention,
    /// RoPE's base, scaling and rotated width.
    #[serde(flatten)]
    pub rope: Rope,
    /// Longest context the model supports.
    pub max_position_embeddings: usize,
    /// Whether lm_head shares the embedding table (no separate `lm_head.weight`).
    pub tie_word_embeddings: bool,
    /// The MLP's activation.
    #[serde(default, skip_serializing_if = "Activation::is_silu")]
    pub activation: Activation,
    /// What each block is where blocks differ: its window, sizes, shared keys and values,
    /// NoPE; empty when every block is the same. Serialized as its per-layer lists.
    #[serde(flatten)]
    pub layers: Layers,
    /// Per-layer input embeddings (Gemma 4's E2B/E4B), mixed into every block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_layer_input: Option<PerLayerInput>,
    /// The routed experts that replace every block's MLP (Qwen3-MoE, Mixtral).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<Moe>,
    /// The linear-attention (Gated DeltaNet) layers of a hybrid decoder (Qwen3.5, Qwen3-Next).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear_attention: Option<LinearAttention>,
    /// Multi-head latent attention in place of q/k/v projections (DeepSeek-V3, Kimi K2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<Mla>,
    /// The final logits' soft-cap, `cap · tanh(logits / cap)` (the Gemmas'
    /// `final_logit_softcapping`); only the next-token outputs read it.
    #[serde(default, rename = "final_logit_softcapping", skip_serializing_if = "Option::is_none")]
    pub final_softcap: Option<f64>,
    /// What only one family's builder reads (Gemma 4's, GPT-OSS's, DeepSeek-V3's router), each
    /// a [`FamilyExtra`] its family's file defines, serialized beside the fields above under
    /// its key.
    #[serde(flatten, default)]
    pub extras: Extras,
}

/// What role a weight tensor plays; the planner shards by class. Shapes are the ones the
/// forward program takes: linear weights `[out, in]` whatever their stored layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamClass {
    /// Token embeddings `[vocab, hidden]`.
    Embedding,
    /// Learned position embeddings `[n_positions, hidden]` (GPT-2).
    PosEmbedding,
    /// The unembedding `[vocab, hidden]` (absent when tied; siphon never computes logits).
    LmHead,
    /// Query projection `[n_heads*head_dim, hidden]`.
    AttnQ,
    /// Key projection `[n_kv_heads*head_dim, hidden]`.
    AttnK,
    /// Value projection `[n_kv_heads*head_dim, hidden]`.
    AttnV,
    /// Output projection `[hidden, n_heads*head_dim]`.
    AttnO,
    /// Query bias `[n_heads*head_dim]`.
    QBias,
    /// Key bias `[n_kv_heads*head_dim]`.
    KBias,
    /// Value bias `[n_kv_heads*head_dim]`.
    VBias,
    /// Output projection bias `[hidden]`, added once after the row-parallel sum.
    OBias,
    /// Attention sinks, one logit per query head `[n_heads]` (GPT-OSS).
    AttnSinks,
    /// MLP gate projection `[intermediate, hidden]`.
    MlpGate,
    /// MLP up projection (the input projection of a plain MLP) `[intermediate, hidden]`.
    MlpUp,
    /// MLP down projection `[hidden, intermediate]`.
    MlpDown,
    /// Up projection bias `[intermediate]`.
    MlpUpBias,
    /// Down projection bias `[hidden]`.
    MlpDownBias,
    /// A mixture's router `[n_experts, hidden]`, or its bias `[n_experts]`.
    Router,
    /// A mixture's stacked expert biases `[n_experts, width]` (GPT-OSS).
    ExpertBias,
    /// Every expert's gate projection, stacked `[n_experts, expert_size, hidden]`.
    ExpertGate,
    /// Every expert's up projection, stacked `[n_experts, expert_size, hidden]`.
    ExpertUp,
    /// Every expert's down projection, stacked `[n_experts, hidden, expert_size]`.
    ExpertDown,
    /// A norm's gain, `[hidden]` or `[head_dim]` (or `[heads*head_dim]` for OLMo 2's q/k norms).
    Norm,
    /// A LayerNorm's bias `[hidden]`.
    NormBias,
    /// A linear-attention layer's query or key projection `[nk*dk, hidden]`, split by key heads.
    LinearKeys,
    /// A linear-attention layer's value, output-gate, beta or decay projection
    /// (`[nv*dv, hidden]` or `[nv, hidden]`), split by value heads.
    LinearValues,
    /// A linear-attention layer's per-head decay parameters (`A_log`, `dt_bias`) `[nv]`.
    LinearHeads,
    /// A linear-attention layer's causal convolution `[channels, 1, K]`; replicated.
    LinearConv,
    /// A linear-attention layer's output projection `[hidden, nv*dv]`, split by value heads.
    LinearOut,
    /// A low-rank projection every head reads, `[rank, hidden]` (MLA's `q_a_proj` and
    /// `kv_a_proj_with_mqa`); not split over `model`.
    Latent,
    /// Scalars and small vectors a block multiplies by, replicated (Gemma 4's `layer_scalar`
    /// `[1]`, its router's `scale` `[hidden]` and `per_expert_scale` `[experts]`).
    Scalar,
    /// The projections of Gemma 4's per-layer inputs (`per_layer_model_projection`
    /// `[layers * width, hidden]`, a block's `per_layer_input_gate` `[width, hidden]` and
    /// `per_layer_projection` `[hidden, width]`); small, replicated.
    PerLayerInput,
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
    pub(crate) fn conv1d(
        name: impl Into<String>,
        shape: &[usize],
        class: ParamClass,
        layer: Option<usize>,
    ) -> ParamInfo {
        let name = name.into();
        let slice = Slice {
            tensor: name.clone(),
            stored: vec![shape[1], shape[0]],
            transposed: true,
            groups: 1,
            start: 0,
            len: shape[0],
        };
        ParamInfo { source: Some(slice), ..ParamInfo::new(name, shape, class, layer) }
    }

    /// A part of a stored tensor (see [`Slice`]) named `name`; `shape` is the part's.
    pub(crate) fn part(
        name: impl Into<String>,
        shape: &[usize],
        class: ParamClass,
        layer: Option<usize>,
        slice: Slice,
    ) -> ParamInfo {
        ParamInfo { source: Some(slice), ..ParamInfo::new(name, shape, class, layer) }
    }

    /// The stored tensors `stack`, each of `shape[1..]`, stacked into one weight named `name`.
    pub(crate) fn stacked(
        name: impl Into<String>,
        shape: &[usize],
        class: ParamClass,
        layer: Option<usize>,
        stack: Vec<String>,
    ) -> ParamInfo {
        debug_assert_eq!(stack.len(), shape[0]);
        ParamInfo { stack, ..ParamInfo::new(name, shape, class, layer) }
    }

    /// The name of the stored tensor this weight is read from.
    pub fn stored_name(&self) -> &str {
        self.source.as_ref().map_or(&self.name, |s| &s.tensor)
    }
}

/// `value`, when it is a positive finite number; else an error naming `what`. Every float a
/// configuration holds is one (a base, an epsilon, a factor, a scale, a cap) or is derived
/// from them, and each piece's check calls this.
pub(crate) fn positive(what: &str, value: f64) -> Result<f64, ModelError> {
    match value > 0.0 && value.is_finite() {
        true => Ok(value),
        false => Err(ModelError::Config(format!("{what} {value} must be a positive finite number"))),
    }
}

/// Checks that a length the configuration names (a context length) is at least 1.
pub(crate) fn positive_count(what: &str, value: usize) -> Result<(), ModelError> {
    match value {
        0 => Err(ModelError::Config(format!("{what} 0 must be at least 1"))),
        _ => Ok(()),
    }
}

/// The most blocks a config may declare ([`ModelConfig::validate`]).
pub const MAX_LAYERS: usize = 4096;

/// The largest width, head count, vocabulary or expert count a config may declare
/// ([`ModelConfig::validate`]): 2^21, far above any model's (the largest vocabularies have
/// ~262K entries), and small enough that a weight's element count — at most three of them
/// multiplied — fits in 64 bits.
pub const MAX_SIZE: usize = 1 << 21;

impl ModelConfig {
    /// This config with `extra` kept among its [`Extras`].
    pub fn with_extra<T: FamilyExtra>(mut self, extra: &T) -> ModelConfig {
        self.extras.set(extra);
        self
    }

    /// Checks the relations the forward relies on, and the ranges of its numbers (each piece
    /// checks its own: [`Attention`]'s scale and cap, [`Rope`]'s base, scaling and
    /// frequencies).
    pub fn validate(&self) -> Result<(), ModelError> {
        let fail = |m: String| Err(ModelError::Config(m));
        if self.vocab_size == 0 || self.hidden_size == 0 || self.n_layers == 0 || self.attention.head_dim == 0 {
            return fail("vocab_size, hidden_size, num_hidden_layers and head_dim must be positive".into());
        }
        // Far above any model's depth (the deepest have ~130 blocks): a corrupt layer count is
        // refused here, before every block's weight list is built for it.
        if self.n_layers > MAX_LAYERS {
            return fail(format!("num_hidden_layers {} is more than {MAX_LAYERS}: a corrupt config?", self.n_layers));
        }
        if let Some((name, size)) = self.sizes().into_iter().find(|&(_, size)| size > MAX_SIZE) {
            return fail(format!("{name} {size} is more than {MAX_SIZE}: a corrupt config?"));
        }
        let layers = self.layers.len();
        if layers != 0 && layers != self.n_layers {
            return fail(format!("the per-layer lists give {layers} layers, the model has {}", self.n_layers));
        }
        let shapes = self.layers.iter().filter(|l| l.shape.is_some()).count();
        if shapes != 0 && shapes != layers {
            return fail(format!("layer_shapes gives {shapes} of the {layers} layers' sizes"));
        }
        let rotary = self.arch.family().features.contains(&crate::hooks::feature::Feature::Rotary);
        for layer in 0..self.n_layers {
            let (kv, d) = (self.kv_heads_at(layer), self.head_dim_at(layer));
            let at = if shapes == 0 { String::new() } else { format!(" (layer {layer})") };
            if kv == 0 || !self.attention.n_heads.is_multiple_of(kv) {
                return fail(format!(
                    "num_attention_heads {} is not a multiple of num_key_value_heads {kv}{at}",
                    self.attention.n_heads
                ));
            }
            let rotated = self.rope.rotary_dim.unwrap_or(d);
            if d == 0 || rotary && (!rotated.is_multiple_of(2) || rotated > d) {
                return fail(format!("the rotary width {rotated} must be even and at most head_dim {d}{at}"));
            }
        }
        for layer in 0..self.n_layers {
            if let Some(source) = self.kv_source(layer) {
                let same = (self.head_dim_at(source), self.kv_heads_at(source))
                    == (self.head_dim_at(layer), self.kv_heads_at(layer));
                if source >= layer || !same {
                    return fail(format!("layer {layer} cannot attend over layer {source}'s keys and values"));
                }
            }
        }
        positive(
            "rms_norm_eps (the norms' epsilon; GPT-2's layer_norm_epsilon, GPT-NeoX's layer_norm_eps)",
            self.rms_norm_eps,
        )?;
        self.attention.check()?;
        if let Some(cap) = self.final_softcap {
            positive("final_logit_softcapping", cap)?;
        }
        if rotary {
            let mut head_dims: Vec<usize> = (0..self.n_layers).map(|l| self.head_dim_at(l)).collect();
            head_dims.sort_unstable();
            head_dims.dedup();
            self.rope.check(&head_dims)?;
        }
        Ok(())
    }

    /// Every size a weight's shape is made of, by its `config.json` name (for
    /// [`ModelConfig::validate`]'s bound).
    fn sizes(&self) -> Vec<(&'static str, usize)> {
        let a = &self.attention;
        let mut sizes = vec![
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", a.n_heads),
            ("num_key_value_heads", a.n_kv_heads),
            ("head_dim", a.head_dim),
            ("rotary_dim", self.rope.rotary_dim.unwrap_or(0)),
        ];
        for shape in self.layers.iter().filter_map(|l| l.shape.as_ref()) {
            sizes.extend([
                ("a layer's head_dim", shape.head_dim),
                ("a layer's num_key_value_heads", shape.n_kv_heads),
                ("a layer's intermediate_size", shape.intermediate_size),
            ]);
        }
        if let Some(p) = &self.per_layer_input {
            sizes.extend([("hidden_size_per_layer_input", p.width), ("vocab_size_per_layer_input", p.vocab_size)]);
        }
        if let Some(m) = &self.moe {
            sizes.extend([
                ("num_experts", m.n_experts),
                ("num_experts_per_tok", m.top_k),
                ("moe_intermediate_size", m.expert_size),
                ("shared_expert_intermediate_size", m.shared_expert.unwrap_or(0)),
            ]);
        }
        if let Some(l) = &self.linear_attention {
            sizes.extend([
                ("linear_num_key_heads", l.n_key_heads),
                ("linear_num_value_heads", l.n_value_heads),
                ("linear_key_head_dim", l.key_head_dim),
                ("linear_value_head_dim", l.value_head_dim),
                ("linear_conv_kernel_dim", l.conv_kernel),
            ]);
        }
        if let Some(m) = &self.mla {
            sizes.extend([
                ("q_lora_rank", m.q_lora_rank.unwrap_or(0)),
                ("kv_lora_rank", m.kv_lora_rank),
                ("qk_nope_head_dim", m.nope),
                ("qk_rope_head_dim", m.rope),
                ("v_head_dim", m.v_head_dim),
            ]);
        }
        sizes
    }

    /// Every weight tensor the forward pass reads, for the first `n_layers` blocks
    /// (pass `self.n_layers` for all), as the architecture's file lists them. The lm_head is
    /// listed only when untied and `with_lm_head` is set: activation extraction never
    /// computes logits.
    pub fn params(&self, n_layers: usize, with_lm_head: bool) -> Vec<ParamInfo> {
        (self.arch.family().params)(self, n_layers.min(self.n_layers), with_lm_head)
    }

    /// Block `layer`'s attention window, `None` for full causal attention.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.layers.get(layer).window
    }

    /// Block `layer`'s head width.
    pub fn head_dim_at(&self, layer: usize) -> usize {
        self.layers.get(layer).shape.map_or(self.attention.head_dim, |s| s.head_dim)
    }

    /// Block `layer`'s key/value heads.
    pub fn kv_heads_at(&self, layer: usize) -> usize {
        self.layers.get(layer).shape.map_or(self.attention.n_kv_heads, |s| s.n_kv_heads)
    }

    /// Whether block `layer`'s MLP is the mixture (not one of the dense first blocks).
    pub fn is_mixture_layer(&self, layer: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| layer >= m.first_dense)
    }

    /// Block `layer`'s MLP width.
    pub fn intermediate_at(&self, layer: usize) -> usize {
        self.layers.get(layer).shape.map_or(self.intermediate_size, |s| s.intermediate_size)
    }

    /// The layer block `layer` takes its keys and values from, when it reuses an earlier
    /// layer's instead of computing its own (Gemma 4's KV sharing).
    pub fn kv_source(&self, layer: usize) -> Option<usize> {
        self.layers.get(layer).kv_source
    }

    /// Every distinct number of key/value heads among the layers, in ascending order.
    pub fn kv_head_counts(&self) -> Vec<usize> {
        let mut counts: Vec<usize> = (0..self.n_layers).map(|l| self.kv_heads_at(l)).collect();
        counts.push(self.attention.n_kv_heads);
        counts.sort_unstable();
        counts.dedup();
        counts
    }

    /// Whether block `layer`'s attention applies RoPE.
    pub fn rotates(&self, layer: usize) -> bool {
        !self.layers.get(layer).skips_rope
    }

    /// Number of weights (elements) of the whole model, lm_head included when untied.
    pub fn n_params(&self) -> usize {
        self.params(self.n_layers, true).iter().map(|p| p.shape.iter().product::<usize>()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Knob {
        width: usize,
    }

    impl FamilyExtra for Knob {
        const KEY: &'static str = "knob";
    }

    #[test]
    fn a_family_extra_is_kept_by_its_key_beside_the_fields() {
        let config = ModelConfig { vocab_size: 3, ..ModelConfig::default() }.with_extra(&Knob { width: 7 });
        assert_eq!(config.extras.get::<Knob>(), Some(Knob { width: 7 }));
        let json = serde_json::to_value(&config).unwrap();
        assert_eq!(json["knob"], serde_json::json!({"width": 7}));
        assert_eq!(json["vocab_size"], 3);
        let back: ModelConfig = serde_json::from_value(json).unwrap();
        assert_eq!(back, config);
        assert_eq!(ModelConfig::default().extras.get::<Knob>(), None);
    }
}
