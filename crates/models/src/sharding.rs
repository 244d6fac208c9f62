//! How each class of weight is split over a mesh: one table ([`rule`], an exhaustive match, so a
//! [`ParamClass`] added without a rule does not compile), read by the planner (`siphon-plan`'s
//! `param_spec`) and by the fixed Megatron-style plan the engine uses when asked for a mesh by
//! its axes ([`megatron_specs`]).
//!
//! Each dimension of a class has two columns: the axes the planner splits it over (any that do
//! not divide it are dropped), and the unit the fixed plan splits it by over `model` (only when
//! `model` divides the count of that unit, so that no head is cut in pieces).
//!
//! | class                          | shape              | planner                   | fixed plan        |
//! |--------------------------------|--------------------|---------------------------|-------------------|
//! | q/k/v, gate/up (column-parallel) | `[out, hidden]`  | `P(model, fsdp)`          | out by heads / features |
//! | o, down (row-parallel)         | `[hidden, in]`     | `P(fsdp, model)`          | in by heads / features |
//! | q/k/v biases, up bias, sinks   | `[out]`            | `P(model)`                | by heads / features |
//! | embeddings                     | `[vocab, hidden]`  | `P((fsdp, model), None)`  | replicated        |
//! | lm_head                        | `[vocab, hidden]`  | `P(model, fsdp)`          | replicated        |
//! | position embeddings            | `[n_pos, hidden]`  | replicated                | replicated        |
//! | experts' gate/up (stacked)     | `[experts, out, hidden]` | `P(model, None, fsdp)` | by experts  |
//! | experts' down (stacked)        | `[experts, hidden, in]`  | `P(model, fsdp, None)` | by experts  |
//! | experts' biases (stacked)      | `[experts, width]` | `P(model, None)`          | by experts        |
//! | experts' gate/up, width split ([`ExpertSplit::Width`]) | `[experts, out, hidden]` | `P(None, model, fsdp)` | — |
//! | experts' down, width split     | `[experts, hidden, in]` | `P(None, fsdp, model)` | —            |
//! | router                         | `[experts, hidden]` | replicated               | replicated        |
//! | router, width split            | `[experts, hidden]` | `P(model, None)`         | —                 |
//! | a low-rank latent (MLA)        | `[rank, hidden]`   | `P(None, fsdp)`           | replicated        |
//! | a low-rank latent, width split | `[rank, hidden]`   | `P(model, fsdp)`          | —                 |
//! | norms, their biases, o/down biases | `[hidden]`     | replicated                | replicated        |
//! | a block's scalar (Gemma 4)     | `[1]`              | replicated                | replicated        |
//! | per-layer-input projections (Gemma 4) | `[out, in]` | replicated                | replicated        |
//! | linear attention's q/k, v/z/b/a | `[out, hidden]`   | `P(model, fsdp)`          | out by key / value heads |
//! | linear attention's out_proj    | `[hidden, in]`     | `P(fsdp, model)`          | in by value heads |
//! | linear attention's A_log, dt_bias | `[nv]`          | `P(model)`                | by value heads    |
//! | linear attention's conv1d      | `[channels, 1, K]` | replicated                | replicated        |

use std::collections::HashMap;

use siphon_mesh::{Mesh, PartitionSpec};

use crate::config::{ModelConfig, ParamClass};

/// The mesh axis that splits the batch.
pub const DATA: &str = "data";
/// The mesh axis that splits weights along their non-Megatron dimension.
pub const FSDP: &str = "fsdp";
/// The mesh axis for Megatron-style tensor parallelism (whole heads, intermediate).
pub const MODEL: &str = "model";

/// What a dimension of the fixed plan is split by over `model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Query heads.
    QHeads,
    /// Key/value heads (the block's own count).
    KvHeads,
    /// Linear attention's key heads.
    LinearKeyHeads,
    /// Linear attention's value heads.
    LinearValueHeads,
    /// Experts.
    Experts,
    /// The dimension's own features (an MLP's width).
    Features,
}

/// One dimension's rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dim {
    /// The axes the planner splits it over, major first.
    pub planned: &'static [&'static str],
    /// What the fixed plan splits it by over `model`; `None`: whole.
    pub fixed: Option<Unit>,
}

const fn d(planned: &'static [&'static str], fixed: Option<Unit>) -> Dim {
    Dim { planned, fixed }
}

const WHOLE: Dim = d(&[], None);
const HIDDEN: Dim = d(&[FSDP], None);

/// The rule of `class`, one [`Dim`] per dimension of its tensors.
pub fn rule(class: ParamClass) -> Vec<Dim> {
    use ParamClass::*;
    use Unit::*;
    match class {
        AttnQ => vec![d(&[MODEL], Some(QHeads)), HIDDEN],
        AttnK | AttnV => vec![d(&[MODEL], Some(KvHeads)), HIDDEN],
        MlpGate | MlpUp => vec![d(&[MODEL], Some(Features)), HIDDEN],
        AttnO => vec![HIDDEN, d(&[MODEL], Some(QHeads))],
        MlpDown => vec![HIDDEN, d(&[MODEL], Some(Features))],
        QBias => vec![d(&[MODEL], Some(QHeads))],
        KBias | VBias => vec![d(&[MODEL], Some(KvHeads))],
        MlpUpBias => vec![d(&[MODEL], Some(Features))],
        // One per query head, split with the heads.
        AttnSinks => vec![d(&[MODEL], Some(QHeads))],
        // The fixed plan keeps the embedding whole; the unembedding, which only the
        // next-token outputs read, splits its vocabulary over `model` as Megatron's output
        // layer does (each device its vocabulary's logits of a chunk).
        Embedding => vec![d(&[FSDP, MODEL], None), WHOLE],
        LmHead => vec![d(&[MODEL], Some(Features)), HIDDEN],
        // Small, and added where the activations are whole.
        PosEmbedding => vec![WHOLE, WHOLE],
        Norm | NormBias | OBias | MlpDownBias | Scalar => vec![WHOLE],
        // Gemma 4's per-layer-input projections: narrow (its per-layer width).
        PerLayerInput => vec![WHOLE, WHOLE],
        // Experts: whole experts over `model` (expert parallelism), each expert's hidden
        // dimension over `fsdp`; the router is small.
        ExpertGate | ExpertUp => vec![d(&[MODEL], Some(Experts)), WHOLE, HIDDEN],
        ExpertDown => vec![d(&[MODEL], Some(Experts)), HIDDEN, WHOLE],
        ExpertBias => vec![d(&[MODEL], Some(Experts)), WHOLE],
        Router => vec![WHOLE, WHOLE],
        Latent => vec![WHOLE, HIDDEN],
        // Linear attention: whole heads over `model` (q/k by key heads, the rest by value
        // heads), out_proj row-parallel; the depthwise convolution is small.
        LinearKeys => vec![d(&[MODEL], Some(LinearKeyHeads)), HIDDEN],
        LinearValues => vec![d(&[MODEL], Some(LinearValueHeads)), HIDDEN],
        LinearOut => vec![HIDDEN, d(&[MODEL], Some(LinearValueHeads))],
        LinearHeads => vec![d(&[MODEL], Some(LinearValueHeads))],
        LinearConv => vec![WHOLE, WHOLE, WHOLE],
    }
}

/// How a mixture's stacked experts are split over `model`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpertSplit {
    /// Whole experts over `model` (expert parallelism: [`rule`]'s).
    #[default]
    Experts,
    /// Every expert's intermediate width over `model`, the experts whole (as Megatron splits
    /// a dense MLP): each device multiplies every routed row by its columns, so a grouped
    /// product's rows are exactly the routed ones on every device (the form TPU programs
    /// take, `chlo.ragged_dot`). The router and MLA's low-rank latents are split by their
    /// outputs over `model` too, so that no chip repeats another's work (libtpu counted
    /// DeepSeek-V3's replicated latents and router as 5.5% of its flops).
    Width,
}

/// The rule of `class` with the experts split as `split` says ([`rule`] for the others).
pub fn rule_for(class: ParamClass, split: ExpertSplit) -> Vec<Dim> {
    use ParamClass::*;
    match (split, class) {
        (ExpertSplit::Width, ExpertGate | ExpertUp) => vec![WHOLE, d(&[MODEL], Some(Unit::Features)), HIDDEN],
        (ExpertSplit::Width, ExpertDown) => vec![WHOLE, HIDDEN, d(&[MODEL], Some(Unit::Features))],
        // The narrow projections every chip of `model` would otherwise repeat: split by their
        // outputs, which are small enough to gather.
        (ExpertSplit::Width, Router) => vec![d(&[MODEL], None), WHOLE],
        (ExpertSplit::Width, Latent) => vec![d(&[MODEL], None), HIDDEN],
        _ => rule(class),
    }
}

/// The fixed Megatron-style plan: every weight split over `model` as [`rule`]'s fixed column
/// says (q/k/v/gate/up and their biases by output features, o/down by input features, XLA
/// inserting the all-reduce), the rest replicated, the inputs split by batch over `data`. Axes
/// the mesh lacks are left out, so the plan works on any mesh.
///
/// Attention is split by whole heads only: when `model` does not divide the query heads, q/o
/// stay replicated, and when it does not divide the key/value heads, k/v stay replicated
/// (every device computes all kv heads, which are few under GQA), so that no head is cut in
/// pieces and XLA needs no activation all-gathers inside attention. Weights whose rule splits
/// nothing are left out of the map (replicated).
pub fn megatron_specs(config: &ModelConfig, mesh: &Mesh) -> (HashMap<String, PartitionSpec>, PartitionSpec) {
    let model_size = mesh.axis_size(MODEL);
    let data: &[&str] = if mesh.axis_size(DATA).is_some() { &[DATA] } else { &[] };
    let linear = config.linear_attention.as_ref().map_or((0, 0), |l| (l.n_key_heads, l.n_value_heads));
    let mut specs = HashMap::new();
    for p in config.params(config.n_layers, true) {
        let dims = rule(p.class);
        if dims.iter().all(|dim| dim.fixed.is_none()) {
            continue;
        }
        let count = |unit: Unit, dim: usize| match unit {
            Unit::QHeads => config.attention.n_heads,
            Unit::KvHeads => p.layer.map_or(config.attention.n_kv_heads, |l| config.kv_heads_at(l)),
            Unit::LinearKeyHeads => linear.0,
            Unit::LinearValueHeads => linear.1,
            Unit::Experts => config.moe.as_ref().map_or(0, |m| m.n_experts),
            Unit::Features => p.shape[dim],
        };
        let axes: Vec<&[&str]> = dims
            .iter()
            .enumerate()
            .map(|(i, dim)| match (dim.fixed, model_size) {
                (Some(unit), Some(m)) if count(unit, i).is_multiple_of(m) => &[MODEL][..],
                _ => &[][..],
            })
            .collect();
        specs.insert(p.name, PartitionSpec::new(&axes));
    }
    (specs, PartitionSpec::new(&[data, &[]]))
}
