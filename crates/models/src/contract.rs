//! The forward program's contract: what a family's builder is asked for ([`ForwardSpec`]) and
//! what it returns ([`ForwardProgram`]).
//!
//! The program's arguments are, in order: every weight of [`ForwardProgram::params`] (in
//! the compute dtype, Hugging Face layout; exactly the weights its graph reads, in the
//! family's inventory order), then `input_ids`, `attention_mask` (1 = real
//! token) and `position_ids`, each `[batch, seq]` i32. Its results are the requested hooks
//! in the requested order, each `[batch, seq, *per-token shape]` in the output dtype (the
//! per-token shape is the hook's [`crate::hooks::HookShape`]: `[hidden]`, `[d_mlp]`, `[1]`,
//! `[heads, head_dim]` or `[heads, seq]`). With dictionaries ([`ForwardSpec::dictionaries`]),
//! each one's tensors follow the inputs (f32, replicated; [`crate::dictionary::Dictionary`]'s
//! order) and its latents follow the hooks ([`LatentsInfo`]). With the model's next-token
//! outputs ([`ForwardSpec::next_token`]) a fourth input, `next_ids`, follows the three (each
//! token's next token, −1 where it has none) and the outputs follow the latents
//! ([`NextTokenInfo`]). With steering vectors ([`ForwardSpec::steering`]) each one's vector
//! follows the dictionaries' tensors (f32 `[hidden]`, replicated). Position ids
//! are an input so that the caller decides them: `cumsum(mask) - 1` for padded rows makes
//! left- and right-padded rows give the activations of an unpadded run.
//!
//! Numerics follow Hugging Face transformers: RMSNorm and softmax in f32, RoPE tables in
//! f32 rounded to the compute dtype, masked scores replaced by the most negative f32 (not
//! -inf, so a query row whose keys are all padding gives a uniform average, not NaN).
//!
//! Layout choices for speed: the residual stream is `[batch*seq, hidden]` so every
//! projection is one large 2-D matmul against the `[out, in]` weight (contracting the
//! weight's second dimension, no transpose op), and attention uses batched dot_generals
//! over `[batch, kv_head]` with the query heads of a group kept together (GQA without
//! materialising repeated keys).

use std::collections::{BTreeSet, HashMap};

use siphon_hlo::DType;
use siphon_mesh::{Mesh, PartitionSpec};

use crate::config::{ModelConfig, ParamInfo};
use crate::dictionary::{DictionaryHook, LatentsInfo};
use crate::hooks::HookPoint;
use crate::stored::StoredForm;

/// The most rows a CPU decoding step's products take weight first at
/// ([`ForwardSpec::weight_first`]): on the CPU plugin's YNNPACK, `w · xᵀ` is 1.2–5× faster
/// than `x · wᵀ` at 32–128 rows and no faster from 256 (`dot_bench`, docs/BENCHMARKS.md).
pub const WEIGHT_FIRST_ROWS: usize = 128;

/// What to build: shapes, hooks, dtypes and sharding.
#[derive(Debug, Clone)]
pub struct ForwardSpec {
    /// Rows per batch.
    pub batch: usize,
    /// Tokens per row.
    pub seq: usize,
    /// The activations to return, in result order. Blocks after the last one needed are
    /// not built.
    pub hooks: Vec<HookPoint>,
    /// Dtype of the weights and of the compute (`F32` or `BF16`).
    pub compute_dtype: DType,
    /// Dtype of the returned activations (`F32`, `BF16` or `F16`), or `F8E4M3FN`: each token's
    /// row of a hook quantized with its own f32 scale, returned as bytes
    /// (`forward::FP8_MAX`).
    pub output_dtype: DType,
    /// The device mesh. A mesh without axes means one device and no sharding annotations.
    pub mesh: Mesh,
    /// Partition spec per weight, by Hugging Face name; a missing name is replicated.
    pub param_specs: HashMap<String, PartitionSpec>,
    /// Partition spec of the three `[batch, seq]` inputs; `None` is replicated.
    pub input_spec: Option<PartitionSpec>,
    /// Rows per expert in each dispatch round of a mixture (see `expert_capacity`); `None`
    /// chooses from the mean load.
    pub expert_capacity: Option<usize>,
    /// Weights taken in their stored form and dequantized in the program, by Hugging Face
    /// name (see [`crate::stored::StoredForm`]); the others are taken in the compute dtype.
    pub stored: HashMap<String, StoredForm>,
    /// Whether weights kept stored decode without byte tables — FP8 by XLA's `f8E4M3FN`
    /// conversion, MXFP4's nibbles and scales by their bits — rather than by a gather from a
    /// table (the same values): a TPU program's form, where libtpu costs a table's gather at
    /// kilobytes an element. Off by default (CPU and CUDA programs as before).
    pub decode_without_tables: bool,
    /// Whether a per-head norm (Qwen3's and Gemma 3's q/k norms) reduces over the last
    /// dimension of `[tokens, heads, head_dim]` in place rather than over the rows of
    /// `[tokens·heads, head_dim]`: the same values, and on a mesh the heads stay split over
    /// `model` (a TPU program's form: for rows, libtpu's partitioner gathers q and k over
    /// `model` in f32). Off by default (CPU and CUDA programs as before).
    pub norm_heads_in_place: bool,
    /// Whether the program may call siphon's CPU kernels (`siphon-kernels`, registered with
    /// the CPU plugin: `siphon_runtime::Client::cpu_kernels`) where they are faster than XLA's
    /// ops: a mixture's experts on one device in f32.
    pub cpu_kernels: bool,
    /// Whether a mixture's experts on one device run as grouped products
    /// (`siphon_kernels::grouped`: every expert's projection in one call, cuBLAS's grouped
    /// products on a CUDA plugin, a plain loop on the CPU plugin), gating, biases and the
    /// router's weights in XLA's ops around them. Before the CPU kernels when both are on.
    pub grouped_experts: bool,
    /// When given, a mixture's experts run as XLA's grouped products, `chlo.ragged_dot`
    /// (`jax.lax.ragged_dot`: no loop; libtpu compiles it natively), on one device and on a
    /// mesh (each device its tokens through its part of the experts, as their weights lie),
    /// gating, biases and router weights in XLA's ops around them: a TPU program's form,
    /// before the grouped products and the CPU kernels. [`RaggedDot::Masked`] gives the same
    /// values on the CPU plugin, which has no `ragged-dot`.
    pub ragged_experts: Option<RaggedDot>,
    /// Whether the program runs on a CUDA plugin over right-padded rows (real tokens first):
    /// each block whose attention cuDNN's fused kernel takes calls it
    /// (the layers' `cudnn.rs`), the others keep XLA's ops. Off (the default, and for
    /// left-padded rows), every block keeps XLA's ops.
    pub cudnn_attention: bool,
    /// When given, each product of at most this many rows with a weight is computed weight
    /// first (`w · xᵀ`, then transposed: [`siphon_hlo::Builder::matmul_t_weight_first`]), and
    /// a decoding step's scores of as few rows keys first (its cache, then the queries): the
    /// same products, where the CPU plugin's libraries would otherwise repack the whole weight
    /// (or cache) on every call — most of a product's time at a decoding step's few rows, and
    /// none worth avoiding at a prompt chunk's many. `None` by default (extract's programs as
    /// before); the engine's CPU decoding steps give [`WEIGHT_FIRST_ROWS`].
    pub weight_first: Option<usize>,
    /// When given, a block's gated MLP runs over the sequence in chunks whose intermediate
    /// (gate or up) holds at most this many elements, where none of its intermediates is read
    /// (the layers' `mlp.rs`): on a CUDA plugin (`MLP_CHUNK_ELEMENTS`), where
    /// once cuDNN takes the attention the MLP's gate and up are a step's largest temporaries.
    /// `None` (the default): in one piece (every CPU and TPU program).
    pub mlp_chunk: Option<usize>,
    /// The model's own next-token outputs the program computes from its logits, chunked over
    /// the sequence so that `[tokens, vocab]` never exists whole (`None`: no logits at all).
    pub next_token: Option<NextToken>,
    /// The hooks a steering vector is added to (`crate::steering`), each an argument `[hidden]`
    /// f32 in this order: from that hook on, the forward carries the hook's value plus it.
    pub steering: Vec<HookPoint>,
    /// Sparse dictionaries whose latents the program computes from the hooks they read (which
    /// need not be among `hooks`), in order.
    pub dictionaries: Vec<DictionaryHook>,
    /// The weights the program declares, by Hugging Face name. `None` (the default): exactly
    /// those its graph reads, which `build_forward` learns by building once with every
    /// weight of the blocks it builds. Given (as an engine passes what its first build
    /// found), it must be exactly that set: a weight read but not given, or given but never
    /// read, is an error naming it.
    pub weights: Option<BTreeSet<String>>,
    /// When given, the program is a decoding step (built by `build_decode_step`): each attention block's
    /// keys and values are read from and written to a cache of this many positions per row,
    /// and the program returns each row's next-token logits and the caches instead of hooks.
    pub decode: Option<DecodeStep>,
    /// How a decoding step chooses each row's next token (`sample.rs`): greedy by default;
    /// where it draws, the step takes each row's uniform in `[0, 1)` as the input `uniforms`
    /// `[batch]` f32.
    pub sampling: Sampling,
    /// Whether a row may hold several documents, each attending its own tokens only: the
    /// positions (`position_ids`) restart at each document's first token, and query `i`
    /// attends key `j` where their positions differ by `i - j` (the same document). Each
    /// document then gets the activations it gets alone; Gated DeltaNet's convolution and
    /// recurrence start afresh at each document (a token whose position id is 0).
    pub isolated: bool,
    /// When given, chosen rows: each row returns this many rows per hook (and its
    /// dictionaries read them), each a weighted sum of its tokens, the weights the program's
    /// `select` input `[batch, rows, seq]` f32 (the forward's `select.rs`): the last token of
    /// a document, a mean over its tokens. Not with the next-token outputs.
    pub select: Option<usize>,
}

/// A decoding step's cache: per row (a slot) and attention block, the keys and values of
/// positions `0..cache_len`, at the index of their position — a block with a sliding window
/// keeps the last [`DecodeStep::ring`] positions only, position `p` at index `p mod ring` —
/// and per Gated DeltaNet block, its state after the row's last token: see
/// [`DecodeInfo::caches`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DecodeStep {
    /// Positions a sequence holds: its prompt and completion together.
    pub cache_len: usize,
    /// New tokens a row takes in one step at most (a prompt's chunk): every step over these
    /// caches is at most this wide.
    pub chunk: usize,
}

impl DecodeStep {
    /// The positions the cache of a block attending `window` keys back holds: all of them
    /// without a window; else a ring of the window and a step's other new tokens (`window +
    /// chunk - 1`), what a step's queries read once its keys are written — fewer where the
    /// sequence is shorter.
    pub fn ring(&self, window: Option<usize>) -> usize {
        window.map_or(self.cache_len, |w| (w + self.chunk - 1).min(self.cache_len))
    }
}

/// A decoding step's results ([`ForwardSpec::decode`]): the logits, each row's next token, then
/// each cache after the step, in the order of the cache arguments (which follow the steering
/// vectors).
#[derive(Debug, Clone)]
pub struct DecodeInfo {
    /// Each row's logits at its last real token, `[batch, vocab]` f32 (the family's final
    /// soft-cap applied).
    pub logits: NextTokenInfo,
    /// Each row's next token, `[batch]` i32, chosen as [`ForwardSpec::sampling`] says: the
    /// index of its first largest logit (a NaN never chosen), or drawn after the warpers at
    /// the row's `uniforms` input (−1 where no logit is finite) — so a step's logits need not
    /// leave the devices.
    pub choice: NextTokenInfo,
    /// Each cache argument (and its result): an attention block's `blocks.{l}.k` /
    /// `blocks.{l}.v`, `[batch, kv_heads, positions, head width]` in the compute dtype
    /// (`cache_len` positions, or a windowed block's [`DecodeStep::ring`]); a latent attention's
    /// `blocks.{l}.latent`, `[batch, cache_len, kv_lora_rank + rope]`; a Gated DeltaNet
    /// block's `blocks.{l}.conv_q` / `conv_k` / `conv_v`, `[batch, K - 1, width]` in the
    /// compute dtype, and `blocks.{l}.state`, `[batch, heads, dk, dv]` f32. Zeros before a
    /// slot's first step.
    pub caches: Vec<NextTokenInfo>,
}

/// The model's next-token outputs a program computes per token from its logits (the family's
/// final norm and unembedding, and its own rule after them: Gemma's final soft-cap), in f32
/// whatever the compute and output dtypes; each is a result `[batch, seq, …]` after the
/// latents, in this order: `output.nll`, `output.entropy`, `output.topk_logprobs` and
/// `output.topk_ids` (`[K]` each), those asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct NextToken {
    /// `output.nll`: −log p of the token `next_ids` names; NaN where it names none (−1).
    pub nll: bool,
    /// `output.entropy`: −Σ p log p over the vocabulary.
    pub entropy: bool,
    /// `output.topk_logprobs` and `output.topk_ids` (i32) of the `topk` likeliest tokens,
    /// likeliest first, a lower id first among equal ones; 0: neither.
    pub topk: usize,
    /// Sequence positions per chunk of the logits; `None` chooses so that a data group's
    /// chunk holds at most [`LOGITS_CHUNK_ELEMENTS`] logits.
    pub chunk: Option<usize>,
}

/// The most logits a data group's chunk holds when [`NextToken::chunk`] is not given
/// (64 MiB in f32): a 262k vocabulary at 32 × 1024 tokens is computed 64 rows of positions at
/// a time, never `[tokens, vocab]` at once.
pub const LOGITS_CHUNK_ELEMENTS: usize = 1 << 24;

impl NextToken {
    /// The results' names, in result order.
    pub fn names(&self) -> Vec<&'static str> {
        let mut names = Vec::new();
        if self.nll {
            names.push("output.nll");
        }
        if self.entropy {
            names.push("output.entropy");
        }
        if self.topk > 0 {
            names.extend(["output.topk_logprobs", "output.topk_ids"]);
        }
        names
    }

    /// Sequence positions per chunk for rows of `seq` positions, `rows` of them per data
    /// group, over a vocabulary of `vocab` (`vocab_ways` ways split): [`NextToken::chunk`]
    /// where given, else the fewest chunks of at most [`LOGITS_CHUNK_ELEMENTS`] logits, as even
    /// as they can be (the last chunk's padding is computed and dropped: 128 positions of
    /// which 42 fit go as 4 × 32, not 4 × 42).
    pub fn chunk_for(&self, seq: usize, rows: usize, vocab: usize, vocab_ways: usize) -> usize {
        let seq = seq.max(1);
        if let Some(chunk) = self.chunk {
            return chunk.clamp(1, seq);
        }
        let per_position = (rows * vocab.div_ceil(vocab_ways.max(1))).max(1);
        let most = (LOGITS_CHUNK_ELEMENTS / per_position).clamp(1, seq);
        seq.div_ceil(seq.div_ceil(most))
    }
}

/// One next-token result of the program ([`NextToken`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextTokenInfo {
    /// `output.nll`, `output.entropy`, `output.topk_logprobs` or `output.topk_ids`; then a
    /// spliced dictionary's (`output.nll.spliced.<hook>`, …).
    pub name: String,
    /// `[batch, seq]`, or `[batch, seq, K]` for the top-k.
    pub shape: Vec<usize>,
    /// `F32`, or `I32` for the ids.
    pub dtype: DType,
    /// How it comes back split over the mesh (its rows as the inputs').
    pub spec: PartitionSpec,
}

/// How a program writes a grouped product ([`ForwardSpec::ragged_experts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaggedDot {
    /// `chlo.ragged_dot` itself (TPU; GPU).
    Native,
    /// Its values by ordinary ops, as JAX lowers `jax.lax.ragged_dot` for the CPU: each
    /// group's rows masked and one product over all groups (`siphon_hlo`'s
    /// `ragged_dot_masked`).
    Masked,
}

impl ForwardSpec {
    /// One device, f32 in and out, no sharding.
    pub fn new(batch: usize, seq: usize, hooks: Vec<HookPoint>) -> ForwardSpec {
        ForwardSpec {
            batch,
            seq,
            hooks,
            compute_dtype: DType::F32,
            output_dtype: DType::F32,
            mesh: Mesh::single_device(),
            param_specs: HashMap::new(),
            input_spec: None,
            expert_capacity: None,
            stored: HashMap::new(),
            decode_without_tables: false,
            norm_heads_in_place: false,
            cpu_kernels: false,
            grouped_experts: false,
            ragged_experts: None,
            cudnn_attention: false,
            weight_first: None,
            mlp_chunk: None,
            next_token: None,
            steering: Vec::new(),
            dictionaries: Vec::new(),
            weights: None,
            decode: None,
            sampling: Sampling::default(),
            isolated: false,
            select: None,
        }
    }

    /// Whether the program computes logits (the next-token outputs, or a decoding step's): it
    /// then reads the final norm's output and the unembedding.
    pub fn computes_logits(&self) -> bool {
        self.next_token.is_some() || self.decode.is_some()
    }

    /// The hooks the graph must produce: the requested ones, then those only dictionaries
    /// read, then the final norm's output where the logits read it.
    pub fn read_hooks(&self) -> Vec<HookPoint> {
        let mut hooks = self.hooks.clone();
        let final_norm = self.computes_logits().then(|| HookPoint::model(crate::hooks::HookKind::LnFinalOut));
        for hook in self.dictionaries.iter().map(|d| d.hook).chain(final_norm) {
            if !hooks.contains(&hook) {
                hooks.push(hook);
            }
        }
        hooks
    }

    /// Uses `mesh` with the fixed Megatron-style plan of [`crate::sharding::megatron_specs`].
    pub fn with_megatron_plan(mut self, config: &ModelConfig, mesh: Mesh) -> ForwardSpec {
        let (params, input) = crate::sharding::megatron_specs(config, &mesh);
        self.param_specs = params;
        self.input_spec = Some(input);
        self.mesh = mesh;
        self
    }
}

/// How one block's softmax attention is computed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttentionForm {
    /// cuDNN's fused flash attention, rows right-padded through per-row lengths.
    Cudnn,
    /// XLA's ops (scores materialized), and why not cuDNN's.
    Xla(String),
}

impl std::fmt::Display for AttentionForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttentionForm::Cudnn => write!(f, "cuDNN fused"),
            AttentionForm::Xla(why) => write!(f, "XLA ({why})"),
        }
    }
}

/// The forms of a program's blocks in one line, blocks grouped by form in order of first
/// appearance: `cuDNN fused: blocks 0-5, 7; XLA (its scores or pattern are hooked): block 6`.
pub fn attention_summary(forms: &[(usize, AttentionForm)]) -> String {
    let mut groups: Vec<(&AttentionForm, Vec<usize>)> = Vec::new();
    for (layer, form) in forms {
        match groups.iter_mut().find(|(f, _)| *f == form) {
            Some((_, layers)) => layers.push(*layer),
            None => groups.push((form, vec![*layer])),
        }
    }
    let ranges = |layers: &[usize]| {
        let mut out: Vec<String> = Vec::new();
        let mut i = 0;
        while i < layers.len() {
            let mut j = i;
            while j + 1 < layers.len() && layers[j + 1] == layers[j] + 1 {
                j += 1;
            }
            out.push(if j > i { format!("{}-{}", layers[i], layers[j]) } else { layers[i].to_string() });
            i = j + 1;
        }
        format!("block{} {}", if layers.len() > 1 { "s" } else { "" }, out.join(", "))
    };
    groups.iter().map(|(form, layers)| format!("{form}: {}", ranges(layers))).collect::<Vec<_>>().join("; ")
}

/// One `[batch, seq]` i32 input of the program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputInfo {
    /// `input_ids`, `attention_mask`, `position_ids` or `next_ids`.
    pub name: &'static str,
    /// `[batch, seq]`.
    pub shape: Vec<usize>,
    /// Always `I32`.
    pub dtype: DType,
    /// How it is split over the mesh.
    pub spec: PartitionSpec,
}

/// One result of the program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputInfo {
    /// Which activation.
    pub hook: HookPoint,
    /// `[batch, seq, *per-token shape]`.
    pub shape: Vec<usize>,
    /// The output dtype.
    pub dtype: DType,
    /// How it comes back split over the mesh.
    pub spec: PartitionSpec,
}

/// A built forward pass: the program text and the order and meaning of its arguments and
/// results.
#[derive(Debug, Clone)]
pub struct ForwardProgram {
    /// StableHLO module text (entry function `@main`).
    pub text: String,
    /// Weight arguments, in argument order.
    pub params: Vec<ParamInfo>,
    /// Partition spec of each weight (same order as `params`).
    pub param_specs: Vec<PartitionSpec>,
    /// Each weight's stored form when the program takes it as its parts (same order as
    /// `params`): its arguments are then [`StoredForm::parts`], split by
    /// [`StoredForm::part_specs`], instead of one array in `param_dtype`.
    pub param_forms: Vec<Option<StoredForm>>,
    /// Dtype of every weight taken whole.
    pub param_dtype: DType,
    /// The inputs that follow the weights: `input_ids`, `attention_mask`, `position_ids`,
    /// and `next_ids` where the program computes `output.nll`.
    pub inputs: Vec<InputInfo>,
    /// The hooks' results, in order.
    pub outputs: Vec<OutputInfo>,
    /// The dictionaries' results, after the hooks', three each.
    pub latents: Vec<LatentsInfo>,
    /// The next-token results, after the latents' ([`ForwardSpec::next_token`]).
    pub next_token: Vec<NextTokenInfo>,
    /// The mesh the program is partitioned over.
    pub mesh: Mesh,
    /// Number of blocks the program runs.
    pub n_blocks: usize,
    /// The form each softmax attention takes, by block, in block order.
    pub attention: Vec<(usize, AttentionForm)>,
    /// A decoding step's logits and caches, in place of hooks ([`ForwardSpec::decode`]).
    pub decode: Option<DecodeInfo>,
    /// Declared weights the graph never read (only where [`ForwardSpec::weights`] is `None`:
    /// `build_forward` then builds again without them).
    pub(crate) unread: Vec<String>,
}

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sampling {
    /// 0: greedy; else the logits are divided by it.
    pub temperature: f64,
    /// Keep the `top_k` likeliest (ties with the last kept too); 0: all.
    pub top_k: usize,
    /// Keep the likeliest whose probabilities reach `top_p` (at least one); 1: all.
    pub top_p: f64,
    /// Drop tokens less likely than `min_p` times the likeliest; 0: none.
    pub min_p: f64,
}

impl Default for Sampling {
    fn default() -> Sampling {
        Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0 }
    }
}

impl Sampling {
    /// Whether the settings can be applied: what is wrong, named by the setting's flag.
    pub fn check(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!("--temperature {} (0 for greedy, or a positive number)", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("--top-p {} (in (0, 1])", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("--min-p {} (in [0, 1])", self.min_p));
        }
        Ok(())
    }

    /// Whether tokens are drawn (a positive temperature) rather than taken greedily.
    pub fn draws(&self) -> bool {
        self.temperature > 0.0
    }
}
