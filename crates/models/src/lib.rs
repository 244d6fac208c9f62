//! Model configs, weight loading (HF safetensors, GGUF) and one forward-pass builder per
//! architecture.
#![deny(missing_docs)]

mod arch;
pub mod config;
mod contract;
mod deepseek_v3;
pub mod dictionary;
pub mod dictionary_files;
mod error;
mod family;
pub mod forward;
mod fp8;
mod gemma2;
mod gemma3;
mod gemma4;
pub mod gguf;
mod gpt2;
mod gpt_neox;
mod gpt_oss;
pub mod hf;
mod hf_config;
pub mod hooks;
mod layers;
mod llama;
mod mistral;
mod mixtral;
mod mxfp4;
mod olmo2;
mod olmo3;
mod olmoe;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen3_5;
mod qwen3_moe;
mod qwen3_next;
mod safetensors;
pub mod sharding;
mod smollm3;
mod stored;
pub mod tokenizer;
mod unembedding;
pub mod weights;

pub use config::{
    Activation, Arch, LayerShape, ModelConfig, Moe, ParamClass, ParamInfo, PerLayerInput, RopeScaling, Slice,
};
pub use error::ModelError;
pub use forward::{
    AttentionForm, DictionaryHook, ForwardProgram, ForwardSpec, InputInfo, LatentsInfo, OutputInfo, RaggedDot,
    build_forward,
};
pub use gemma4::Gemma4;
pub use gpt_oss::GptOss;
pub use hf::LoadedModel;
pub use hf_config::HfConfig;
pub use hooks::{HookKind, HookPoint, HookShape, KINDS, hook_kinds, layer_hook_kinds, resolve_hooks};
pub use layers::dictionary as latents;
pub use layers::mlp::MLP_CHUNK_ELEMENTS;
pub use layers::moe::{capacity as expert_capacity, chunk_rows as expert_chunk};
pub use layers::{cudnn, gated_deltanet, mla};
pub use stored::{Part as StoredPart, StoredForm, fp8_forms, mxfp4_forms};
pub use tokenizer::TextTokenizer;
pub use unembedding::Unembedding;
pub use weights::{DType, HostTensor, TensorMeta, Weights};
