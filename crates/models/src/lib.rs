//! Model configs, weight loading (HF safetensors, GGUF) and one forward-pass builder per
//! architecture.
//!
//! # Code map
//!
//! - `hf_config/`: `HfConfig`, a serde mirror of `config.json` (keys several families read as
//!   fields, the rest kept by name for the one family that reads them; a key of the wrong type
//!   named by its path), and the reading families
//!   share: `HfConfig::decoder` (sizes, heads, activation, windows, RoPE; in `decode.rs`, the one part that knows
//!   a family's `Arch`) with the `Defaults` a family's configuration class fills in, the window rules several families use,
//!   RoPE from `rope_theta` / `rope_scaling` or transformers 5's `rope_parameters`, per layer type
//!   where the family reads it so (`rope.rs`: every key of a RoPE object read with its type
//!   checked, a key its `rope_type` does not read refused by name), a mixture's expert counts. `HfConfig::into_config` (in `family.rs`) finds the family in the
//!   registry and calls its `from_hf`.
//! - `arch.rs`: `Family`, what siphon knows of one family (its names, `from_hf`, build function,
//!   inventory, hook features, renames, its `FinalNorm`: the final norm's gain and how
//!   TransformerLens folds it into `W_U`, which `unembedding.rs` turns into the tensors a
//!   dictionary's logit effects read), and `Arch`, the handle a configuration keeps of it (a
//!   `&'static Family`, written as the family's name, its first `model_type`, in messages and in
//!   what siphon serializes). `contract.rs`: the program's contract, `ForwardSpec` in and
//!   `ForwardProgram` out (arguments, results, numerics).
//! - `config/`: the validated `ModelConfig`: the sizes, and the settings of the shared layer
//!   pieces families choose between, a typed piece each — `Attention` (heads, biases, q/k norms,
//!   score scale and soft-cap, output gate; `attention.rs`), `Rope` (base, scaling, local base,
//!   rotated width, and the inverse frequencies they give; `rope.rs`), `Moe` (`mixture.rs`), the token mixers' `Mla` and
//!   `LinearAttention` (`mixers.rs`), each serialized flat under the names `run.json` has always
//!   held; what each block is where blocks differ, one `LayerSpec` per layer — window, sizes,
//!   the layer whose keys and values it reads, NoPE — serialized as the per-layer lists
//!   (`layers.rs`); `Default` for tests and `from_hf`; what one family alone reads is a
//!   `FamilyExtra` its file defines, kept in `ModelConfig::extras` by its key and serialized
//!   beside the other fields. `ModelConfig::validate` checks the relations the forward relies
//!   on and every number's range, each in the piece that owns it (`config::positive`: bases,
//!   epsilons, factors, scales and caps positive and finite; RoPE's frequencies finite). And what a weight is (`ParamInfo`: HF name, shape, `ParamClass`,
//!   and a `Slice` for parts of fused or Conv1D
//!   tensors); `ModelConfig::params` asks the family (through `Arch`) for its list.
//! - Loading: `LoadedModel::open` turns an HF directory (`config.json`, `model.safetensors` or a
//!   sharded index, `tokenizer.json`/`tokenizer_config.json`) or a GGUF file into a `ModelConfig`,
//!   a `Weights` source keyed by HF tensor name (cutting and transposing `Slice`d parts as it reads them) and an optional `TextTokenizer`;
//!   every file the crate reads, a dictionary's too, is opened through `file.rs`, which refuses
//!   one that is not a regular file (a FIFO, a device) by its path before opening it; every
//!   tensor `Weights` reads is refused naming it and its file when it holds a NaN or an
//!   infinity (`finite.rs`'s scan of its encoded bytes; a stored form's scales as its format
//!   tells: `fp8.rs`, `mxfp4.rs`, the GGUF blocks' f16 scales). GGUF conversion
//!   follows transformers' `gguf_file=` loading (names and config per architecture, llama.cpp's
//!   stored forms undone as each tensor is read: the q/k RoPE permutation, GPT-2's transposed
//!   Conv1D, GPT-NeoX's regrouped qkv, Gemma's `1 + w` norms, a mixture's stacked experts split
//!   per expert; tokenizers built as transformers builds them); `gguf/dequant.rs` dequantizes
//!   F16/BF16/Q8_0/Q4_0/Q4_1/Q4_K/Q6_K, and `mxfp4.rs` the MXFP4 `…_blocks` + `…_scales` pairs of
//!   safetensors checkpoints (GPT-OSS's experts), read under the `…_blocks` name with their
//!   dequantized shape, to exactly transformers' values; `fp8.rs` likewise the FP8 block-scaled
//!   weights of `quantization_config` `fp8` checkpoints (F8_E4M3 beside `…_scale_inv`, in blocks
//!   of the config's `weight_block_size`, partial at the edges), for any family. `stored.rs`
//!   keeps such weights in their stored form on the devices instead (`StoredForm`: FP8, MXFP4,
//!   GGUF Q8_0/Q4_0/Q4_1/Q4_K/Q6_K; `Weights::stored_form` / `load_stored` give a parameter's parts, GGUF
//!   rows reordered and experts stacked as for dequantized reads): a `ForwardSpec::stored`
//!   weight is declared as its parts (`StoredForm::part_specs`: split as the weight, on whole
//!   blocks) and dequantized by the program (byte tables, nibble shifts, block scales broadcast)
//!   to exactly the host readers' values.
//! - `hooks/`: the hook table (`kinds.rs`). `KINDS` has one row per kind of activation: its TransformerLens
//!   name, the TransformerBridge names accepted as aliases, its scope (before the blocks, in a
//!   block, after them), its per-token shape (`[d_model]`, `[d_mlp]`, `[1]`, per head, a
//!   pattern row `[heads, seq]`, or the q/k-norm parts, per head or over the whole projection as
//!   `qk_norm_whole` says) and the block feature it needs (`HookKind::needs`, from the same row: norms before
//!   or after the sublayers, q/k norms, a gated MLP, RoPE, a mid-block residual, learned
//!   positions); a family declares the features it has, and its hook list is every kind it can
//!   produce (`hook_kinds`: the family's features less the optional parts its config leaves out,
//!   Gemma 4's per-layer inputs and mixture). A block that attends over an earlier block's keys
//!   and values (`LayerSpec::kv_source`) has no key/value hooks of its own
//!   (`layer_hook_kinds`); asked for, they are refused naming the block that holds them. A few bridge names mean what the block's shape makes them
//!   (`STRUCTURAL_ALIASES`: OLMo's `attn.hook_in` is the block's input, a mixture's
//!   `mlp.hook_pre` its input), resolved by the family's features before the table; the bridge's
//!   `ln_final.hook_in` is the last block's `hook_resid_post`. `resolve_hooks` expands `--hooks` patterns (`blocks.*.…`, `{a..b}`, `{a,b}`,
//!   `blocks.3.*`), checks layers and the family, and suggests the nearest names for a misspelt
//!   one (`hooks/mod.rs`).
//! - `family.rs`: the registry, every family's `Family` in `FAMILIES` (and `REFUSED`, the
//!   `model_type`s refused by name with what siphon lacks for them), and the lookups by name: an
//!   `Arch` read back from its name (`FromStr`, serde), a `config.json`'s family by `model_type`
//!   or `architectures`. A `Family` holds the `model_type`s and `architectures` names that select
//!   it, its `from_hf` (its configuration class's defaults, its own keys, a refusal naming any
//!   setting siphon does not build), its build function, its parameter inventory (every weight
//!   with its HF name, program shape, `ParamClass` and, for a part of a fused or Conv1D tensor,
//!   the `Slice` that cuts it out when read), its hook features and the other prefixes its
//!   checkpoints use (`transformer.`-less GPT-2, `language_model.` Gemma 3).
//! - `forward/`: the program. `mod.rs` holds `build_forward` (the family's builder, through
//!   `Arch`, for the contract of `contract.rs`); `blocks_needed` /
//!   `forward_params`, the blocks and weights a forward for given hooks builds, which the planner
//!   counts too; `fp8_rows`, the `f8E4M3FN` output: each token's row of a hook as its f32 scale,
//!   the row's largest magnitude times `1/448`, then its values rounded to E4M3, as bytes; bit for
//!   bit what ml_dtypes gives). `graph.rs` is `Graph`'s plumbing: the declared weights, each noted
//!   when `Graph::w` reads it (`build_forward` first declares every weight of the blocks it builds
//!   and the model's own, then builds again with the ones read, so no hook set declares a weight it
//!   does not read or reads one it did not declare), the inputs, the hooks recorded, the
//!   per-batch tables, and `Graph::finish`. `decoder.rs` is the decoder loop every family's
//!   block plugs into (`Graph::blocks`: each block's `hook_resid_pre`, the family's block, the
//!   residual pinned to the tokens' layout and recorded as `hook_resid_post`), `pre_norm_decoder`
//!   (embed → pre-norm blocks → final norm around a family's own per-block tables, token mixer and
//!   MLP; `self_attention_decoder`, the Llama-like decoder nine families
//!   build through; `decoder_params`, its inventory; `Graph::finish_decoder`).
//! - `layers/`: the shared layers, a file each, each adding its `Graph` methods and recording its
//!   own hooks: `norm.rs` (RMSNorm with its gain plain, `(1 + w)` or in f32, LayerNorm, per-head
//!   norms: scale, normalized, output), `rope.rs` (partial rotary,
//!   Llama-3/linear/LongRoPE/proportional scaling, per layer head width, one set of tables per
//!   base: `Graph::layer_rope`), `attention.rs` (one causal mask per window, `Graph::layer_mask`;
//!   GQA attention, `Graph::attend` and `Graph::attend_with_sinks` with scores, pattern and z;
//!   `self_attention`, the block most families share), `cudnn.rs` (with
//!   `ForwardSpec::cudnn_attention`, a CUDA program of right-padded rows, each block whose
//!   attention cuDNN's fused kernel takes — bf16, head dim ≤ 128 and a multiple of 8, values as
//!   wide as keys, no soft-cap or sinks, its own causal mask, scores and pattern not hooked, on a
//!   mesh heads and KV heads split over `model` and the sequence whole — calls
//!   `__cudnn$fmhaSoftmax` with JAX's backend config and per-row lengths, named `blocks.N.attn`
//!   (`cudnn::call_block` reads it back from a compiled program), on a mesh in a manual
//!   computation over each device's rows and heads; `ForwardProgram::attention` says which form
//!   each block took and why, `cudnn::summary` in one line), `mlp.rs` (the gated and the plain MLP:
//!   pre, pre_linear, post, output; SiLU, tanh GELU, exact GELU through `chlo.erf`; with
//!   `ForwardSpec::mlp_chunk`, a CUDA program's, a block's gated MLP over the sequence in chunks of
//!   at most `MLP_CHUNK_ELEMENTS` intermediate elements where none of its intermediates is read),
//!   and `moe/` (`mod.rs`; `grouped.rs`, the grouped dispatch),
//!   `gated_deltanet.rs` and `mla.rs` below.
//! - `decode.rs`: a decoding step (`ForwardSpec::decode`, `build_decode_step`): each block's
//!   caches (`[batch, kv_heads, positions, head_dim]`, a window's ring, MLA's latent), their
//!   masks and writes, and what a step returns; `sample.rs`, each row's next token on the
//!   devices (greedy, or transformers' warpers and the draw at the row's uniform:
//!   `ForwardSpec::sampling`, `sample::program`).
//! - `sharding.rs`: the one sharding table, `rule(class)`: per dimension of each `ParamClass`,
//!   the axes the planner splits it over and the unit (heads, experts, features) the fixed
//!   Megatron plan (`megatron_specs`, the engine's plan for `--mesh data=2,model=4`) splits it by;
//!   `rule_for(class, ExpertSplit)` the same with a mixture's experts split by width (a TPU
//!   target's, `PlanRequest::experts`).
//! - Families: one file per architecture, each holding its `FAMILY`, its weights and its forward: `llama.rs`
//!   (Llama's family: the shared decoder as it is), `qwen2.rs` (biases), `mistral.rs`
//!   (windows), `qwen3.rs` (per-head q/k norms), `phi3.rs` (Llama's forward over fused weights cut
//!   on read), `gemma2.rs` (pre- and post-norms with `(1 + w)` gains, scaled embeddings, GeGLU,
//!   soft-capped logits), `gemma3.rs` (that block with q/k norms; local layers with their own
//!   RoPE base), `gemma4.rs` (the sandwich block with f32 gains, a scale-free v-norm, global
//!   layers with their own heads (`LayerSpec::shape`, which the shared attention, hook
//!   shapes, Megatron specs and the planner read per layer), values from the keys and
//!   proportional RoPE, per-layer inputs (`PerLayerInput`), layer scalars, KV shared by the last
//!   layers (`LayerSpec::kv_source`), a mixture beside the MLP through `Graph::top_k` and
//!   `Graph::experts`), `olmo2.rs` (post-norms only, whole-projection q/k norms), `olmo3.rs` (that
//!   block with windows and RoPE per layer type), `smollm3.rs` (Llama's block with RoPE skipped
//!   on some layers), `gpt2.rs` (learned
//!   positions, LayerNorm, Conv1D), `gpt_neox.rs` (parallel block, partial rotary, per-head fused
//!   qkv), `qwen3_moe.rs`, `mixtral.rs` and `olmoe.rs` (the decoder with `Graph::moe_mlp`;
//!   experts stacked per layer on read, `[E, out, in]`, and sharded whole over `model`),
//!   `gpt_oss.rs` (its own block: biased attention with a sink per head, `Graph::attend_with_sinks`;
//!   YaRN RoPE; a biased router taking the top-k logits; experts with biases and a clamped SwiGLU,
//!   cut per expert from transformers' fused tensors or read from MXFP4). `layers/moe/` is the mixture
//!   they share: softmax router and top-k (`Graph::top_k`), then `Graph::experts` (or
//!   `Graph::routed` with per-slot weights, biases and a `Glu`), which sorts
//!   each token group's choices by expert and sends every token through its chosen experts only
//!   — on one device a loop over the experts taking each queue in chunks (weights on the left,
//!   `W·xᵀ`, which the CPU's kernels stream without repacking), on a mesh rounds of batched
//!   products over whole experts; both loop on the device until every queue is done, so no
//!   choice is dropped whatever the routing (`stablehlo.sort`, `while`, batched gathers and
//!   dynamic slices from `siphon-hlo`). On the CPU in f32 (`ForwardSpec::cpu_kernels`), SiLU
//!   and tanh-GELU experts without biases and GPT-OSS's go instead through `siphon-kernels`' experts kernel, one custom call
//!   over the sorted queues that reads each expert's weights in place. With
//!   `ForwardSpec::grouped_experts` (a CUDA client with siphon's kernels, or asked for on the CPU)
//!   each projection of every expert is one `siphon_grouped_matmul` over the sorted rows, biases
//!   gathered by each row's expert and the gating in XLA's ops between them; on a mesh in a manual
//!   computation, each device its own tokens through the experts it holds (whole experts over
//!   `model`), the other devices' choices sorted last into no group and masked, the devices'
//!   parts summed. A TPU program (`ForwardSpec::ragged_experts`, `RaggedDot::Native`) writes the
//!   same dispatch with XLA's own grouped product, `chlo.ragged_dot` (`Builder::ragged_dot`; libtpu
//!   compiles it with no loop), its experts split by width (`sharding::ExpertSplit::Width`,
//!   `rule_for`: every device all its tokens' routed rows through its columns of every expert,
//!   the down parts summed; the devices that gather the hidden dimension over `fsdp` share out
//!   the tokens; the router and MLA's latents split by their outputs, `Graph::keep_outputs_split`),
//!   decodes weights kept stored without byte tables (`ForwardSpec::decode_without_tables`: FP8 by
//!   `f8E4M3FN` conversion, MXFP4 from its bits) and normalizes q/k per head in place
//!   (`ForwardSpec::norm_heads_in_place`, so the heads stay split over `model`); on the CPU plugin, which has no `ragged-dot`, `RaggedDot::Masked`
//!   gives its values by ordinary ops (`Builder::ragged_dot_masked`, JAX's CPU lowering), which is
//!   how the engine's tests check the TPU form against the goldens (`EngineOptions::tpu_forms`). `layers/gated_deltanet.rs` is the hybrids' linear attention
//!   (`Graph::gated_deltanet`: padding zeroed, projections cut per part from either stored
//!   layout, a causal depthwise conv, and the gated delta rule as transformers' chunked torch
//!   path computes it — per chunk of 64 the pairwise decays and a unit lower-triangular solve
//!   (`stablehlo.triangular_solve`), then a `while` loop over the chunks carrying each head's
//!   `[dk, dv]` state in f32); `qwen3_next.rs` holds the hybrid decoder (linear or gated full
//!   attention per `layer_types`, `(1 + w)` norms, the mixture with a gated shared expert) and
//!   `qwen3_5.rs` states what Qwen3.5 (dense and mixture) changes. A hybrid's layers have the
//!   hooks of their token mixer only (`hooks::layer_hook_kinds`). `layers/mla.rs` is multi-head latent
//!   attention (`Graph::mla_attention`: low-rank q and kv latents with their norms, a RoPE key
//!   shared by the heads, interleaved RoPE as a permutation before the shared rotate-half,
//!   values narrower than keys through `Graph::attention`; per-kind hook widths in
//!   `Mla::hook_dims`); `deepseek_v3.rs` (DeepSeek-V3, Kimi K2) puts it in Llama's block with
//!   dense first blocks (`Moe::first_dense`: such a family's blocks have their own MLP's hooks,
//!   `hooks::layer_features`) and a mixture whose router (sigmoid scores, correction bias,
//!   group-limited choice via `Graph::top_k_choice`) feeds `Graph::routed`, plus ungated shared
//!   experts. What a family
//!   changes in the shared pieces is a field of `ModelConfig` its `from_hf` sets as its HF
//!   configuration class decides it (`attention`, `rope`, `moe`, `mla`, `linear_attention`,
//!   `layers`: each block's window, sizes, key/value source and NoPE; `per_layer_input`,
//!   `activation`); a hook name that means different tensors
//!   in different families (Gemma's `attn.hook_out`) resolves within the family's own kinds
//!   first.
//!
//! Adding a family: a `<family>.rs`, its `mod` line in `lib.rs` and its line in `FAMILIES`
//! (`family.rs`); the file holds everything about it — its `FAMILY` (and `ARCH`, its handle) with
//! its `model_type`s, its
//! `from_hf` (start from `HfConfig::decoder` with its configuration class's `Defaults`, or from
//! the family it differs from, like `qwen3_moe::from_hf` from Qwen3's defaults; values HF's
//! class would fill in, never guesses; a setting not built is refused by name), build function,
//! weights and hook features (a new kind of weight gets a `ParamClass`, and the one sharding
//! table, `models/src/sharding.rs`'s `rule`, which the planner and the fixed Megatron plan both
//! read, will not compile until it has a row for it; a new kind of hook
//! is a row in `KINDS` and, if only some families have it, a `Feature`). A family whose GGUF
//! siphon reads also has its names in `gguf/convert.rs`. Then a tiny random model in
//! `scripts/fixtures/gen_fixtures.py` and `gen_tl_fixtures.py` and its test lines in
//! `crates/engine/tests/{fixtures,transformer_lens}.rs` and `crates/plan/tests/engine.rs`.
//!
//! Sparse dictionaries (SAEs, transcoders) are a room of their own, `dictionary/`, standing in
//! three of those layers: `mod.rs` describes one (the hook it reads, widths, `Encoder` — ReLU, JumpReLU, TopK,
//! gated —, input normalisation, whether `b_dec` is subtracted, its encoder's tensors in f32 under
//! fixed names) and its `Latents` as a program returns them; `files.rs` and a file per format read
//! the formats their libraries write, safetensors through `Weights` (`Dictionary::open`:
//! SAELens's `cfg.json` + `sae_weights.safetensors` in 6.x and older layouts, Gemma Scope's
//! `params.npz` with the hook from the Hub's layout, sparsify's `<hookpoint>/` checkpoints, Llama
//! Scope's `hyperparams.json` + `checkpoints/final.safetensors` as lm-saes loads the release), each
//! refusing by name what it does not compute exactly; `encoder.rs` builds the encoder into a
//! program: the dense latents as the library computes them in
//! f32, then each token's `cap` largest by XLA's TopK (`Builder::top_k`, `chlo.top_k`: the lower
//! latent first among ties; indices, `-1` past its firings;
//! values) and its number of firings. `ForwardSpec::dictionaries` puts them in the forward: each
//! reads its hook where the graph makes it (requested or not), its tensors are arguments after
//! the inputs and its three results follow the hooks' (`ForwardProgram::latents`). The fixtures
//! under `fixtures/dictionaries/` were saved by SAELens and sparsify themselves, with the library's
//! latents of TransformerLens's hook values as goldens (`scripts/gen-sae-fixtures.sh`).
#![deny(missing_docs)]

mod arch;
pub mod config;
mod contract;
pub mod decode;
mod deepseek_v3;
pub mod dictionary;
mod error;
mod family;
mod file;
mod finite;
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
pub mod sample;
pub mod sharding;
mod smollm3;
pub mod steering;
mod stored;
pub mod tokenizer;
mod unembedding;
pub mod weights;

pub use config::{
    Activation, Arch, LayerShape, ModelConfig, Moe, ParamClass, ParamInfo, PerLayerInput, RopeScaling, Slice,
};
pub use decode::build_decode_step;
pub use dictionary::{DictionaryHook, Latents, LatentsInfo};
pub use error::ModelError;
pub use forward::{
    AttentionForm, DecodeInfo, DecodeStep, ForwardProgram, ForwardSpec, InputInfo, NextToken, NextTokenInfo,
    OutputInfo, RaggedDot, Sampling, WEIGHT_FIRST_ROWS, build_forward,
};
pub use gemma4::Gemma4;
pub use gpt_oss::GptOss;
pub use hf::LoadedModel;
pub use hf_config::HfConfig;
pub use hooks::{HookKind, HookPoint, HookShape, KINDS, hook_kinds, layer_hook_kinds, resolve_hooks};
pub use layers::mlp::MLP_CHUNK_ELEMENTS;
pub use layers::moe::{capacity as expert_capacity, chunk_rows as expert_chunk};
pub use layers::{cudnn, gated_deltanet, mla};
pub use steering::Steering;
pub use stored::{Part as StoredPart, StoredForm, TensorMeta, fp8_forms, mxfp4_forms};
pub use tokenizer::TextTokenizer;
pub use unembedding::Unembedding;
pub use weights::{DType, HostTensor, Weights};
