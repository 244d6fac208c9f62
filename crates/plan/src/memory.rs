//! Per-device memory prediction.
//!
//! Weights (per device, dtype bytes `w`):
//! - `sharded`: Σ over tensors of the shard each device holds, `w · Π shard_shape` — what is
//!   resident between forwards.
//! - `gathered`: Σ of whole tensors — what a device holds if every weight is replicated (the
//!   seed's "all-gathered" measurement).
//! - `fsdp_gather`: the transient working set of FSDP. Before a block runs, XLA all-gathers its
//!   weights over `fsdp` (still split over `model`); with the next block's gather overlapping
//!   the current one, two blocks are live: `2 · max_layer Σ (tensor split over model alone − shard)`.
//!   The embedding is not gathered: a lookup into a vocabulary-split table is partitioned
//!   (masked gather + all-reduce) by XLA.
//!
//! Activations for a global batch `B` × sequence `S` on a mesh with `data` = `D`, `model` = `M`
//! (local batch `b = B / D`, activation dtype bytes `a`, hidden `h`, intermediate `I`,
//! `q = heads · head_dim`, `kv = kv_heads · head_dim`):
//! - `input`: token ids, attention mask and positions, `3 · 4 · b · S` (i32).
//! - `hooks`: every requested hook output stays live until the forward returns,
//!   `Σ_hooks b · S · width · o` in the stored dtype (`o` its bytes; an fp8 row `width + 4`), where a hook's per-token width is its shape's size
//!   (`h`, `I`, `heads · head_dim`, `1`, or `heads · S` for attention scores and patterns,
//!   which makes those quadratic in `S`); hook outputs are replicated over `fsdp`/`model`.
//! - `working`: one block's transients, freed before the next block:
//!   `a · b · S · (3h + (q + 2kv)/M + 3I/M)` (residual, normed input, attention output; local
//!   q/k/v; gate, up and their product) plus attention scores and probabilities in f32,
//!   `2 · 4 · b · (heads/M) · S²`. A hybrid's linear-attention layers (Gated DeltaNet, `nv`
//!   value heads of `dv` over `nk` key heads of `dk`) hold instead, when that is more, their
//!   projections and convolved q/k/v, `2 · a · b · S · (2·nk·dk + 2·nv·dv) / M`, and the
//!   chunked recurrence's f32 buffers and state, `4 · b · (nv/M) · (S′ · (8·dk + 6·dv + 3·64) +
//!   dk·dv)` (`S′` = `S` rounded up to whole chunks of 64). A mixture of experts (its `n = b · S` local tokens each
//!   choosing `k` of `E` experts `I_e` wide) adds its routing's i32 comparisons,
//!   `2 · 4 · n · k · E`, the chosen rows' outputs, `2 · a · n · k · h`, and its dispatch:
//!   on one device the sorted rows and their
//!   outputs, `2 · a · (n·k + c) · h`, and one expert's three weights sliced out, `3 · a · I_e · h`
//!   (`c` = `siphon_models::expert_chunk`); on a mesh one round's rows, gate, up, product and
//!   outputs, `a · (E/M) · C · (2h + 3·I_e)` (`C` = `siphon_models::expert_capacity`); a shared
//!   expert `I_s` wide adds `3 · a · n · I_s / M`. A dense
//!   MLP beside it (Gemma 4) counts as `I`.
//!
//! Host memory of the output path (one host, not part of the device's budget): `depth` steps
//! in flight, each holding the host's rows of every hook in the stored dtype,
//! `depth · (B / hosts) · S · Σ_hooks row bytes` (an fp8 row is its values and a 4-byte scale).
//!
//! Every array above is counted at the bytes its device lays it out in ([`DeviceLayout`]):
//! its values on a CPU or GPU; on a TPU, padded to the tiles of its layout (what libtpu's
//! compiler reports as a program's argument and output bytes).
//!
//! Fits when `sharded + fsdp_gather + activations ≤ device_memory · (1 − headroom)`. The
//! default headroom of 10% covers what the formula leaves out: the runtime's own buffers,
//! compiled code, allocator padding and fragmentation.

use serde::{Deserialize, Serialize};
use siphon_mesh::{Mesh, PartitionSpec};
use std::collections::HashMap;

use siphon_models::{HookPoint, ModelConfig, ParamInfo, StoredForm};

use crate::error::PlanError;
use crate::mesh::{DATA, FSDP, MODEL};

/// Default share of device memory kept free.
pub const DEFAULT_HEADROOM: f64 = 0.10;

pub use siphon_dtype::DType;

/// How a device lays an array out in its memory, for counting the array's bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceLayout {
    /// The values alone, row-major (XLA's CPU layouts).
    #[default]
    Dense,
    /// A GPU's: the values alone, row-major; a program's results, when more than one, come
    /// with a table of their addresses, 8 bytes each (as XLA's CUDA compiler counts them).
    Gpu,
    /// A TPU's tiled layouts, as libtpu 0.0.51 lays out a program's arguments and results
    /// (measured by compiling one-array programs for v5e): one dimension in the 128 lanes
    /// (padded to a multiple of 128), another in the rows (padded to a multiple of 8, or to a
    /// power of two below 8), the others major; the compiler picks the pair that pads least.
    /// A vector is padded to a power of two from 128 up to 1024 values and to a multiple of
    /// 1024 beyond; every array to a multiple of 512 bytes. A program's results, when more
    /// than one, come with a table of them, 4 bytes each in 512-byte units (512 bytes for 8 to
    /// 109 results, 1024 for 226).
    TpuTiled,
}

impl DeviceLayout {
    /// Bytes of an array of `shape` with `element` bytes a value.
    pub fn array_bytes(self, shape: &[usize], element: usize) -> u64 {
        let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        match self {
            DeviceLayout::Dense | DeviceLayout::Gpu => dims.iter().product::<u64>() * element as u64,
            DeviceLayout::TpuTiled => {
                let values = match dims.as_slice() {
                    [] => 1,
                    [n] if *n <= 1024 => n.next_power_of_two().max(128),
                    [n] => n.next_multiple_of(1024),
                    _ => tiled_values(&dims),
                };
                (values * element as u64).next_multiple_of(512)
            }
        }
    }
}

impl DeviceLayout {
    /// Bytes a program's `results` take beyond their arrays (a TPU's or GPU's table of a
    /// tuple).
    pub fn results_table_bytes(self, results: usize) -> u64 {
        match self {
            DeviceLayout::Dense => 0,
            DeviceLayout::Gpu if results > 1 => 8 * results as u64,
            DeviceLayout::Gpu => 0,
            DeviceLayout::TpuTiled if results > 1 => (4 * results as u64).next_multiple_of(512),
            DeviceLayout::TpuTiled => 0,
        }
    }
}

/// Values of an array of two or more dimensions in a TPU's tiles: the least over the choices
/// of its lane and row dimensions.
fn tiled_values(dims: &[u64]) -> u64 {
    let all: u64 = dims.iter().product();
    let mut least = u64::MAX;
    for lanes in 0..dims.len() {
        for rows in (0..dims.len()).filter(|&r| r != lanes) {
            let (r, l) = (dims[rows], dims[lanes]);
            let major = if r == 0 || l == 0 { 0 } else { all / (r * l) };
            let r = if r >= 8 { r.next_multiple_of(8) } else { r.next_power_of_two() };
            least = least.min(major * r * l.next_multiple_of(128));
        }
    }
    least
}

/// Per-device weight bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightMemory {
    /// Bytes of all planned weights together (one copy).
    pub total_bytes: u64,
    /// Bytes each device holds with the plan's shardings (the largest over devices; every
    /// device holds the same amount with even splits).
    pub sharded_bytes: u64,
    /// Bytes each device would hold with every weight replicated (= `total_bytes`).
    pub gathered_bytes: u64,
    /// Transient bytes of FSDP all-gathers (two blocks gathered over `fsdp`).
    pub fsdp_gather_bytes: u64,
}

/// Per-device activation bytes for one batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActivationMemory {
    /// Global batch (sequences).
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Sequences per device (`batch / data`).
    pub local_batch: usize,
    /// Number of hook outputs requested.
    pub hooks: usize,
    /// Token ids, attention mask and positions.
    pub input_bytes: u64,
    /// Hook outputs (and the device's table of them).
    pub hook_bytes: u64,
    /// One block's transients.
    pub working_bytes: u64,
    /// Sum of the three.
    pub total_bytes: u64,
}

/// One host's memory for the output path: the reused buffers of the steps in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostMemory {
    /// Steps in flight (`--pipeline-depth`).
    pub depth: usize,
    /// The stored dtype of the activations.
    pub dtype: DType,
    /// One step's rows of every hook on this host.
    pub step_bytes: u64,
    /// `depth · step_bytes`.
    pub total_bytes: u64,
}

/// [`HostMemory`] for a global `batch` × `seq` over `hosts` hosts returning `hooks` stored in
/// `dtype`.
pub fn host_memory(
    config: &ModelConfig,
    batch: usize,
    seq: usize,
    hosts: usize,
    hooks: &[HookPoint],
    dtype: DType,
    depth: usize,
) -> HostMemory {
    let rows = batch.div_ceil(hosts.max(1)) as u64 * seq as u64;
    let row: u64 = hooks.iter().map(|h| dtype.row_bytes(h.dims(config, seq).iter().product::<usize>()) as u64).sum();
    let step_bytes = rows * row;
    HostMemory { depth, dtype, step_bytes, total_bytes: depth as u64 * step_bytes }
}

/// The whole per-device estimate and the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MemoryEstimate {
    /// Weights.
    pub weights: WeightMemory,
    /// Activations, when a batch and sequence length were given.
    pub activations: Option<ActivationMemory>,
    /// `weights.sharded + weights.fsdp_gather + activations.total`.
    pub required_bytes: u64,
    /// Memory of one device, when given.
    pub device_memory_bytes: Option<u64>,
    /// Share of device memory kept free.
    pub headroom: f64,
    /// `device_memory · (1 − headroom)`.
    pub budget_bytes: Option<u64>,
    /// Whether `required ≤ budget`; `None` without a device memory.
    pub fits: Option<bool>,
    /// One host's output-path memory, when a batch and sequence length were given (host
    /// memory: not in `required_bytes`).
    pub host: Option<HostMemory>,
    /// Sparse dictionaries' memory, when any were asked for with a batch and sequence length
    /// (in `required_bytes`).
    pub dictionaries: Option<DictionaryMemory>,
    /// The next-token outputs' memory, when asked for with a batch and sequence length (in
    /// `required_bytes`; the unembedding is among the weights).
    #[serde(default)]
    pub next_token: Option<NextTokenMemory>,
    /// A decoding step's caches and logits, when planned for one (in `required_bytes`).
    #[serde(default)]
    pub decode: Option<DecodeMemory>,
}

/// A sparse dictionary as the planner counts it: its encoder's tensors (f32, whole on every
/// device) and the latents it keeps per token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DictionaryShape {
    /// Its name.
    pub name: String,
    /// The hook it reads (its blocks' weights are counted).
    pub hook: HookPoint,
    /// Its tensors' shapes (`siphon_models::dictionary::Dictionary::tensors`).
    pub tensors: Vec<Vec<usize>>,
    /// Its number of latents.
    pub d_sae: usize,
    /// Latents kept per token.
    pub cap: usize,
}

impl DictionaryShape {
    /// The shape of a dictionary the program reads.
    pub fn of(d: &siphon_models::DictionaryHook) -> DictionaryShape {
        DictionaryShape {
            name: d.dictionary.name.clone(),
            hook: d.hook,
            tensors: d.dictionary.tensors.iter().map(|t| t.shape.clone()).collect(),
            d_sae: d.dictionary.d_sae,
            cap: d.cap,
        }
    }
}

/// Per-device bytes of the dictionaries a program computes latents of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DictionaryMemory {
    /// Their tensors (program arguments, replicated).
    pub tensor_bytes: u64,
    /// Their results, three each (`[b, s, cap]` i32 indices and f32 values, `[b, s]` i32
    /// firings), and their share of the results' table.
    pub output_bytes: u64,
    /// The encoders' transients: per local token and latent, the pre-activations, the latents
    /// and a sort's keys and indices, in and out (XLA may take the top latents by sorting), 4
    /// bytes each, summed over dictionaries.
    pub working_bytes: u64,
}

/// The bytes of `dictionaries` on each device for `local_batch` sequences of `seq` tokens,
/// beside `hooks` hook results.
pub fn dictionary_memory(
    dictionaries: &[DictionaryShape],
    local_batch: usize,
    seq: usize,
    hooks: usize,
    layout: DeviceLayout,
) -> DictionaryMemory {
    let tokens = (local_batch * seq) as u64;
    let tensor_bytes = dictionaries.iter().flat_map(|d| &d.tensors).map(|shape| layout.array_bytes(shape, 4)).sum();
    let latents: u64 = dictionaries
        .iter()
        .map(|d| 2 * layout.array_bytes(&[local_batch, seq, d.cap], 4) + layout.array_bytes(&[local_batch, seq], 4))
        .sum();
    let table = layout.results_table_bytes(hooks + 3 * dictionaries.len()) - layout.results_table_bytes(hooks);
    let working_bytes = dictionaries.iter().map(|d| 6 * 4 * tokens * d.d_sae as u64).sum();
    DictionaryMemory { tensor_bytes, output_bytes: latents + table, working_bytes }
}

/// The model's next-token outputs as a device holds them (`siphon_models::NextToken`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NextTokenMemory {
    /// Sequence positions per chunk of the logits.
    pub chunk: usize,
    /// Their results (`[b, s]` f32 each, `[b, s, K]` f32 and i32 for the top-k) and their
    /// share of the results' table.
    pub output_bytes: u64,
    /// One chunk's logits and what the log-softmax makes of them (the logits, their exponent,
    /// the log-probabilities and the next token's mask or the entropy's products: 4 arrays of
    /// `[local rows, chunk, local vocabulary]`, 4 bytes each).
    pub working_bytes: u64,
}

/// The bytes of `outputs` on each device for `local_batch` sequences of `seq` tokens over a
/// vocabulary of `vocab` split `vocab_ways` ways, beside `results` other results.
pub fn next_token_memory(
    outputs: &siphon_models::NextToken,
    local_batch: usize,
    seq: usize,
    vocab: usize,
    vocab_ways: usize,
    results: usize,
    layout: DeviceLayout,
) -> NextTokenMemory {
    let chunk = outputs.chunk_for(seq, local_batch, vocab, vocab_ways);
    let names = outputs.names();
    let per_token: u64 = names
        .iter()
        .map(|name| match name.starts_with("output.topk") {
            true => layout.array_bytes(&[local_batch, seq, outputs.topk], 4),
            false => layout.array_bytes(&[local_batch, seq], 4),
        })
        .sum();
    let table = layout.results_table_bytes(results + names.len()) - layout.results_table_bytes(results);
    let working_bytes = 4 * layout.array_bytes(&[local_batch, chunk, vocab.div_ceil(vocab_ways.max(1))], 4);
    NextTokenMemory { chunk, output_bytes: per_token + table, working_bytes }
}

/// A decoding step's memory on each device (`siphon generate`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecodeMemory {
    /// Slots (rows) on each device.
    pub local_slots: usize,
    /// Positions each slot's sequence holds.
    pub cache_len: usize,
    /// New tokens a step takes at most (a windowed block's ring holds its window and these,
    /// less one).
    #[serde(default)]
    pub chunk: usize,
    /// Every block's caches for the device's slots (attention's keys and values, Gated
    /// DeltaNet's state), once: a step's caches are donated to the ones it returns, which it
    /// writes in place (an argument and a result aliased).
    pub cache_bytes: u64,
    /// The logits of the device's slots, `[slots, vocab]` f32, and their next tokens,
    /// `[slots]` i32.
    pub logits_bytes: u64,
    /// The step's transients, bounded by one more copy of the caches (what a block's
    /// attention reads of them: XLA's CUDA and TPU programs hold about half of that at their
    /// peak).
    pub working_bytes: u64,
    /// Where the step draws sampled tokens on the devices, its warpers' and draw's arrays
    /// ([`sampler_bytes`]); 0 where it chooses greedily or the host draws.
    #[serde(default)]
    pub sampler_bytes: u64,
}

/// A bound on what a decoding step's draw (`siphon_models::sample`) holds beside its logits,
/// `local_slots` rows of `vocab`: 4 arrays of `[slots, vocab]` f32 for the draw (the tempered
/// logits, their probabilities, prefix sums, a mask), 1 more for top-k's cut (where `top_k` is
/// under `vocab`: else the draw keeps every token and cuts nothing), 1 for min-p's,
/// 4 for top-p's sort (values, indices, their probabilities and prefix sums). XLA's programs
/// compiled for an H100 hold 2 (the draw alone), 3 (top-k), 4 (min-p) and 6 (top-p) at 32 ×
/// 49,152, 3.25 (the draw alone) at 256 × 151,936; for a v5e 2.25 and 5 (top-p) at 256 ×
/// 151,936.
pub fn sampler_bytes(
    local_slots: usize,
    vocab: usize,
    sampling: &siphon_models::Sampling,
    layout: DeviceLayout,
) -> u64 {
    if !sampling.draws() {
        return 0;
    }
    let arrays = 4
        + u64::from(sampling.top_k > 0 && sampling.top_k < vocab)
        + u64::from(sampling.min_p > 0.0)
        + 4 * u64::from(sampling.top_p < 1.0);
    arrays * layout.array_bytes(&[local_slots, vocab], 4)
}

/// The bytes a decoding step of `local_slots` slots over caches of `step` needs on each
/// device: the caches as the family's decoding step declares them (`siphon_models::decode`:
/// an attention block's keys and values — a windowed block's ring of them — a block reading
/// another's having none of their own; a Gated DeltaNet block's f32 state and its
/// convolutions' last inputs), each split over `model` ways where the step splits it (by
/// heads, where they divide).
pub fn decode_memory(
    config: &ModelConfig,
    local_slots: usize,
    step: siphon_models::DecodeStep,
    model: usize,
    dtype: DType,
    layout: DeviceLayout,
) -> Result<DecodeMemory, PlanError> {
    let mut spec = siphon_models::ForwardSpec::new(1, 1, Vec::new());
    spec.decode = Some(step);
    spec.compute_dtype = dtype.into();
    if model > 1 {
        spec.mesh =
            Mesh::new(&[(MODEL, model)], (0..model).collect()).map_err(|e| PlanError::Request(e.to_string()))?;
    }
    let program = siphon_models::build_decode_step(config, &spec).map_err(|e| PlanError::Request(e.to_string()))?;
    let info = program.decode.ok_or_else(|| PlanError::Request("the decoding step returned no caches".into()))?;
    let one: u64 = info
        .caches
        .iter()
        .map(|c| {
            let mut dims = c.shape.clone();
            dims[0] = local_slots;
            for (d, axes) in dims.iter_mut().zip(c.spec.dims()).skip(1) {
                if axes.iter().any(|a| a == MODEL) {
                    *d /= model;
                }
            }
            layout.array_bytes(&dims, c.dtype.byte_size())
        })
        .sum();
    // The logits and each slot's next token.
    let logits_bytes = layout.array_bytes(&[local_slots, config.vocab_size], 4) + layout.array_bytes(&[local_slots], 4);
    Ok(DecodeMemory {
        local_slots,
        cache_len: step.cache_len,
        chunk: step.chunk,
        cache_bytes: one,
        logits_bytes,
        working_bytes: one,
        sampler_bytes: 0,
    })
}

impl MemoryEstimate {
    /// Adds a decoding step's caches and logits to what the devices need, and decides again.
    pub fn with_decode(mut self, d: DecodeMemory) -> MemoryEstimate {
        self.required_bytes += d.cache_bytes + d.logits_bytes + d.working_bytes + d.sampler_bytes;
        self.fits = self.budget_bytes.map(|b| self.required_bytes <= b);
        self.decode = Some(d);
        self
    }

    /// Adds the next-token outputs' bytes to what the devices need, and decides again.
    pub fn with_next_token(mut self, n: NextTokenMemory) -> MemoryEstimate {
        self.required_bytes += n.output_bytes + n.working_bytes;
        self.fits = self.budget_bytes.map(|b| self.required_bytes <= b);
        self.next_token = Some(n);
        self
    }

    /// Adds the dictionaries' bytes to what the devices need, and decides again.
    pub fn with_dictionaries(mut self, d: DictionaryMemory) -> MemoryEstimate {
        self.required_bytes += d.tensor_bytes + d.output_bytes + d.working_bytes;
        self.fits = self.budget_bytes.map(|b| self.required_bytes <= b);
        self.dictionaries = Some(d);
        self
    }
}

fn fsdp_split(spec: &siphon_mesh::PartitionSpec) -> bool {
    spec.dims().iter().flatten().any(|a| a.as_str() == FSDP)
}

/// Bytes of `param` whole and of the shard each device holds under `spec`, as `layout` lays
/// them out: `dtype`'s per value, or its stored form's (`stored`, by name: blocks and scales,
/// each part an array) — refused where the split would cut a block.
pub fn param_bytes(
    param: &ParamInfo,
    spec: &siphon_mesh::PartitionSpec,
    mesh: &Mesh,
    dtype: DType,
    stored: &HashMap<String, StoredForm>,
    layout: DeviceLayout,
) -> Result<(u64, u64), PlanError> {
    let shard_shape = spec.shard_shape(&param.shape, mesh)?;
    let bytes = |shape: &[usize]| match stored.get(&param.name) {
        Some(form) => form.parts(shape).iter().map(|part| layout.array_bytes(&part.shape, part.dtype.size())).sum(),
        None => layout.array_bytes(shape, dtype.size()),
    };
    if let Some(form) = stored.get(&param.name) {
        form.part_specs(&param.name, &param.shape, spec, mesh).map_err(|e| PlanError::Request(e.to_string()))?;
    }
    Ok((bytes(&param.shape), bytes(&shard_shape)))
}

/// Weight bytes for `params` sharded by `specs` (same order) on `mesh`, in `dtype` or their
/// stored form, laid out by `layout` ([`param_bytes`]).
pub fn weight_memory(
    params: &[ParamInfo],
    specs: &[siphon_mesh::PartitionSpec],
    mesh: &Mesh,
    dtype: DType,
    stored: &HashMap<String, StoredForm>,
    layout: DeviceLayout,
) -> Result<WeightMemory, PlanError> {
    let mut total = 0u64;
    let mut sharded = 0u64;
    let mut per_layer: std::collections::BTreeMap<usize, u64> = Default::default();
    for (param, spec) in params.iter().zip(specs) {
        let (full, shard) = param_bytes(param, spec, mesh, dtype, stored, layout)?;
        total += full;
        sharded += shard;
        if let (Some(layer), true) = (param.layer, fsdp_split(spec)) {
            // Gathered over fsdp, still split over model.
            let on_model: Vec<Vec<String>> =
                spec.dims().iter().map(|axes| axes.iter().filter(|a| a.as_str() != FSDP).cloned().collect()).collect();
            let (_, gathered) = param_bytes(param, &PartitionSpec::from_dims(on_model), mesh, dtype, stored, layout)?;
            *per_layer.entry(layer).or_default() += gathered - shard;
        }
    }
    let max_layer = per_layer.values().copied().max().unwrap_or(0);
    Ok(WeightMemory {
        total_bytes: total,
        sharded_bytes: sharded,
        gathered_bytes: total,
        fsdp_gather_bytes: 2 * max_layer,
    })
}

/// Activation bytes per device for a global `batch` × `seq` computed in `dtype` returning
/// `hooks` in `output` (an fp8 row: its values and scale), each at its own per-token size, the
/// inputs and outputs laid out by `layout`.
/// `batch` must already be checked to divide over the mesh's `data` axis.
#[allow(clippy::too_many_arguments)]
pub fn activation_memory(
    config: &ModelConfig,
    mesh: &Mesh,
    batch: usize,
    seq: usize,
    hooks: &[HookPoint],
    dtype: DType,
    output: DType,
    layout: DeviceLayout,
) -> ActivationMemory {
    let a = dtype.size() as u64;
    let data = mesh.axis_size_or_one(DATA) as u64;
    let model = mesh.axis_size_or_one(MODEL) as u64;
    let b = batch as u64 / data;
    let s = seq as u64;
    let h = config.hidden_size as u64;
    // The widest layer's projections (Gemma 4's global layers are wider).
    let widest = |f: &dyn Fn(usize) -> usize| (0..config.n_layers).map(f).max().unwrap_or(0) as u64;
    let q = widest(&|l| config.attention.n_heads * config.head_dim_at(l));
    let kv = widest(&|l| config.kv_heads_at(l) * config.head_dim_at(l));
    let dense = siphon_models::hook_kinds(config).contains(&siphon_models::HookKind::MlpPost);
    let i = if dense { widest(&|l| config.intermediate_at(l)) } else { 0 };
    let mixture = config.moe.as_ref().map_or(0, |m| {
        let (n, k, e, ie) = (b * s, m.top_k as u64, m.n_experts as u64, m.expert_size as u64);
        let routing = 2 * 4 * n * k * e + 2 * a * n * k * h;
        let dispatch = if mesh.axes().is_empty() {
            let c = siphon_models::expert_chunk(n as usize, m.top_k, m.n_experts) as u64;
            2 * a * (n * k + c) * h + 3 * a * ie * h
        } else {
            let c = siphon_models::expert_capacity(n as usize, m.top_k, m.n_experts) as u64;
            a * e.div_ceil(model.min(e)) * c * (2 * h + 3 * ie)
        };
        // A shared expert's gate, up and product on every token.
        let shared = 3 * a * n * m.shared_expert.unwrap_or(0) as u64 / model;
        routing + dispatch + shared
    });
    let input_bytes = 3 * layout.array_bytes(&[b as usize, seq], 4);
    let hook_bytes = hooks
        .iter()
        .map(|hook| {
            let dims = hook.dims(config, seq);
            match output {
                // Rows of the scale's 4 bytes and the E4M3 values, as bytes.
                DType::Fp8 => layout.array_bytes(&[b as usize, seq, output.row_bytes(dims.iter().product())], 1),
                _ => layout.array_bytes(&[&[b as usize, seq][..], &dims].concat(), output.size()),
            }
        })
        .sum::<u64>()
        + layout.results_table_bytes(hooks.len());
    let attention = a * b * s * (q + 2 * kv) / model + 2 * 4 * b * (config.attention.n_heads as u64 / model) * s * s;
    let linear = config.linear_attention.as_ref().map_or(0, |la| {
        let (kd, vd) = (la.key_dim() as u64, la.value_dim() as u64);
        let (dk, dv, nv) = (la.key_head_dim as u64, la.value_head_dim as u64, la.n_value_heads as u64);
        let padded = s.next_multiple_of(siphon_models::gated_deltanet::CHUNK as u64);
        let chunk = siphon_models::gated_deltanet::CHUNK as u64;
        let projections = 2 * a * b * s * (2 * kd + 2 * vd) / model;
        let chunks = 4 * b * (nv / model.min(nv)) * (padded * (8 * dk + 6 * dv + 3 * chunk) + dk * dv);
        projections + chunks
    });
    let working_bytes = a * b * s * (3 * h + 3 * i / model) + attention.max(linear) + mixture;
    ActivationMemory {
        batch,
        seq,
        local_batch: b as usize,
        hooks: hooks.len(),
        input_bytes,
        hook_bytes,
        working_bytes,
        total_bytes: input_bytes + hook_bytes + working_bytes,
    }
}

/// Combines the parts and decides whether they fit.
pub fn estimate(
    weights: WeightMemory,
    activations: Option<ActivationMemory>,
    device_memory_bytes: Option<u64>,
    headroom: f64,
) -> MemoryEstimate {
    let required_bytes = weights.sharded_bytes + weights.fsdp_gather_bytes + activations.map_or(0, |a| a.total_bytes);
    let budget_bytes = device_memory_bytes.map(|m| (m as f64 * (1.0 - headroom)) as u64);
    MemoryEstimate {
        weights,
        activations,
        required_bytes,
        device_memory_bytes,
        headroom,
        budget_bytes,
        fits: budget_bytes.map(|b| required_bytes <= b),
        host: None,
        dictionaries: None,
        next_token: None,
        decode: None,
    }
}

/// Bytes as GiB text with two decimals, e.g. `13.21 GiB` (MiB or KiB below 1 GiB and 1 MiB,
/// so small tensors do not print as zero).
pub fn gib(bytes: u64) -> String {
    let b = bytes as f64;
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else if bytes >= 1 << 20 {
        format!("{:.2} MiB", b / (1u64 << 20) as f64)
    } else {
        format!("{:.2} KiB", b / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use siphon_mesh::PartitionSpec;
    use siphon_models::ParamClass;

    fn param(shape: &[usize], layer: Option<usize>) -> ParamInfo {
        ParamInfo::new("w", shape, ParamClass::MlpUp, layer)
    }

    fn step(cache_len: usize) -> siphon_models::DecodeStep {
        siphon_models::DecodeStep { cache_len, chunk: 8 }
    }

    /// A decoding step's caches: every attention block's keys and values of each slot, read and
    /// written; a Gemma 4 block reading another's keys and values adds none.
    #[test]
    fn a_decoding_step_counts_every_cache_once_and_the_logits() {
        let dims = r#""hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
            "max_position_embeddings": 512"#;
        let config = |json: &str| siphon_models::HfConfig::from_json(json).unwrap().into_config().unwrap();
        let llama = config(&format!(r#"{{"model_type": "llama", {dims}}}"#));
        let d = decode_memory(&llama, 4, step(100), 1, DType::Bf16, DeviceLayout::Dense).unwrap();
        // 3 blocks × (k + v) × 4 slots × 100 positions × 2 kv heads × 16 × 2 bytes.
        assert_eq!(d.cache_bytes, 3 * 2 * 4 * 100 * 32 * 2);
        // Split by heads over model = 2; not over 4, which 2 KV heads do not divide.
        let halves = decode_memory(&llama, 4, step(100), 2, DType::Bf16, DeviceLayout::Dense).unwrap();
        assert_eq!(halves.cache_bytes * 2, d.cache_bytes);
        assert_eq!(decode_memory(&llama, 4, step(100), 4, DType::Bf16, DeviceLayout::Dense).unwrap(), d);
        assert_eq!(d.logits_bytes, 4 * 256 * 4 + 4 * 4);
        let e = decode_memory(&llama, 4, step(1000), 1, DType::Bf16, DeviceLayout::Dense).unwrap_err().to_string();
        assert!(e.contains("past the model's context"), "{e}");
    }

    /// A block with a sliding window keeps a ring of its window and a step's other new tokens:
    /// 16 + 8 - 1 positions, not 100; the whole sequence where that is shorter.
    #[test]
    fn a_windowed_block_counts_its_ring() {
        let dims = r#""hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
            "max_position_embeddings": 512, "sliding_window": 16"#;
        let json = format!(r#"{{"model_type": "mistral", {dims}}}"#);
        let mistral = siphon_models::HfConfig::from_json(&json).unwrap().into_config().unwrap();
        let d = decode_memory(&mistral, 4, step(100), 1, DType::Bf16, DeviceLayout::Dense).unwrap();
        assert_eq!(d.cache_bytes, 3 * 2 * 4 * 23 * 32 * 2);
        let short = decode_memory(&mistral, 4, step(20), 1, DType::Bf16, DeviceLayout::Dense).unwrap();
        assert_eq!(short.cache_bytes, 3 * 2 * 4 * 20 * 32 * 2);
    }

    /// A latent attention caches each position's normed latent and RoPE key (16 + 8 values),
    /// not its 4 heads' keys (12 + 8 each) and values (10 each); whole on every device.
    #[test]
    fn a_latent_attention_counts_its_latent() {
        let json = include_str!("../../../fixtures/models/tiny-deepseek-v3/config.json");
        let deepseek = siphon_models::HfConfig::from_json(json).unwrap().into_config().unwrap();
        let d = decode_memory(&deepseek, 4, step(50), 1, DType::Bf16, DeviceLayout::Dense).unwrap();
        assert_eq!(d.cache_bytes, 3 * 4 * 50 * (16 + 8) * 2);
        assert_eq!(decode_memory(&deepseek, 4, step(50), 2, DType::Bf16, DeviceLayout::Dense).unwrap(), d);
    }

    /// A Gated DeltaNet block's caches: its f32 state `[slots, nv, dk, dv]` and its
    /// convolutions' last 3 inputs (q, k: `nk·dk` wide, v: `nv·dv`), each split over `model`
    /// where its heads divide.
    #[test]
    fn a_decoding_step_counts_gated_deltanet_state() {
        let json = include_str!("../../../fixtures/models/tiny-qwen3-next/config.json");
        let next = siphon_models::HfConfig::from_json(json).unwrap().into_config().unwrap();
        // Layers 0 and 2 linear (nk 2, nv 4, dk 8, dv 12, kernel 4), layer 1 full (2 KV heads of 16).
        let (conv_qk, conv_v, state) = (4 * 3 * 16 * 2, 4 * 3 * 48 * 2, 4 * 4 * 8 * 12 * 4);
        let kv = 2 * 4 * 100 * 32 * 2;
        let d = decode_memory(&next, 4, step(100), 1, DType::Bf16, DeviceLayout::Dense).unwrap();
        assert_eq!(d.cache_bytes, 2 * (2 * conv_qk + conv_v + state) + kv);
        let halves = decode_memory(&next, 4, step(100), 2, DType::Bf16, DeviceLayout::Dense).unwrap();
        assert_eq!(halves.cache_bytes * 2, d.cache_bytes);
        // Over 4: only the value heads (4) divide.
        let quarters = decode_memory(&next, 4, step(100), 4, DType::Bf16, DeviceLayout::Dense).unwrap();
        assert_eq!(quarters.cache_bytes, 2 * (2 * conv_qk + conv_v / 4 + state / 4) + kv);
    }

    #[test]
    fn sharded_is_total_over_ways_and_gathered_is_total() {
        let mesh = Mesh::new(&[("fsdp", 2), ("model", 4)], (0..8).collect()).unwrap();
        let params = [param(&[64, 32], Some(0)), param(&[32], None)];
        let specs = [PartitionSpec::new(&[&["model"], &["fsdp"]]), PartitionSpec::replicated(1)];
        let m = weight_memory(&params, &specs, &mesh, DType::Bf16, &HashMap::new(), DeviceLayout::Dense).unwrap();
        assert_eq!(m.total_bytes, (64 * 32 + 32) * 2);
        assert_eq!(m.gathered_bytes, m.total_bytes);
        assert_eq!(m.sharded_bytes, (64 * 32 / 8 + 32) * 2);
        // Layer 0 gathered over fsdp, still split over model: 64*32/4 elements; minus the shard.
        assert_eq!(m.fsdp_gather_bytes, 2 * (64 * 32 / 4 - 64 * 32 / 8) * 2);
        let f32 = weight_memory(&params, &specs, &mesh, DType::F32, &HashMap::new(), DeviceLayout::Dense).unwrap();
        assert_eq!(f32.sharded_bytes, 2 * m.sharded_bytes);
    }

    /// A hybrid's working set: its linear-attention layers' chunked recurrence where that is
    /// more than its attention's (long rows), the attention's quadratic scores otherwise.
    #[test]
    fn a_hybrids_linear_attention_is_counted() {
        let config = siphon_models::HfConfig::from_json(
            r#"{"model_type": "qwen3_5_text", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
                "linear_value_head_dim": 32}"#,
        )
        .unwrap()
        .into_config()
        .unwrap();
        let mesh = Mesh::single_device();
        let hooks = siphon_models::resolve_hooks("ln_final.hook_out", &config).unwrap();
        let (a, b, h, i) = (4u64, 2u64, 64u64, 128u64);
        for s in [100u64, 1000] {
            let act =
                activation_memory(&config, &mesh, 2, s as usize, &hooks, DType::F32, DType::F32, DeviceLayout::Dense);
            let attention = a * b * s * (64 + 2 * 32) + 8 * b * 4 * s * s;
            let padded = s.next_multiple_of(64);
            let linear =
                2 * a * b * s * (2 * 32 + 2 * 128) + 4 * b * 4 * (padded * (8 * 16 + 6 * 32 + 3 * 64) + 16 * 32);
            assert_eq!(act.working_bytes, a * b * s * (3 * h + 3 * i) + attention.max(linear), "seq {s}");
        }
    }

    #[test]
    fn activations_follow_the_formula_and_the_verdict_uses_headroom() {
        let config = siphon_models::HfConfig::from_json(
            r#"{"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}"#,
        )
        .unwrap()
        .into_config()
        .unwrap();
        let mesh = Mesh::new(&[("data", 2), ("model", 2)], (0..4).collect()).unwrap();
        let hooks = siphon_models::resolve_hooks("blocks.{0,1}.hook_resid_post,ln_final.hook_out", &config).unwrap();
        let act = activation_memory(&config, &mesh, 8, 16, &hooks, DType::F32, DType::F32, DeviceLayout::Dense);
        assert_eq!(act.local_batch, 4);
        assert_eq!(act.input_bytes, 3 * 4 * 4 * 16);
        assert_eq!(act.hook_bytes, 3 * 4 * 16 * 64 * 4);
        // Each hook at its own width: d_mlp, heads x head_dim, a scale, and a pattern row of
        // heads x seq per token (quadratic in seq).
        let hooks = siphon_models::resolve_hooks(
            "blocks.0.mlp.hook_post,blocks.0.attn.hook_z,blocks.0.ln1.hook_scale,blocks.0.attn.hook_pattern",
            &config,
        )
        .unwrap();
        let wide = activation_memory(&config, &mesh, 8, 16, &hooks, DType::F32, DType::F32, DeviceLayout::Dense);
        assert_eq!(wide.hook_bytes, 4 * 16 * (128 + 4 * 16 + 1 + 4 * 16) * 4);
        let longer = activation_memory(&config, &mesh, 8, 32, &hooks[3..], DType::F32, DType::F32, DeviceLayout::Dense);
        assert_eq!(longer.hook_bytes, 4 * 32 * (4 * 32) * 4);
        let expected_working = 4 * 4 * 16 * (3 * 64 + (64 + 2 * 32) / 2 + 3 * 128 / 2) + 8 * 4 * 2 * 16 * 16;
        assert_eq!(act.working_bytes, expected_working);
        let w = WeightMemory { total_bytes: 0, sharded_bytes: 1000, gathered_bytes: 0, fsdp_gather_bytes: 0 };
        let needed = 1000 + act.total_bytes;
        let fits = estimate(w, Some(act), Some(needed * 2), 0.1);
        assert_eq!(fits.fits, Some(true));
        let tight = estimate(w, Some(act), Some(needed), 0.1);
        assert_eq!(tight.fits, Some(false));
        assert_eq!(estimate(w, None, None, 0.1).fits, None);
    }

    #[test]
    fn dtype_names() {
        assert_eq!("bfloat16".parse::<DType>().unwrap(), DType::Bf16);
        assert_eq!("F32".parse::<DType>().unwrap().size(), 4);
        assert!("int8".parse::<DType>().is_err());
    }
}
