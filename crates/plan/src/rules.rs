//! Partition specs per parameter class, from the one sharding table,
//! [`siphon_models::sharding::rule`] (whose doc lists every class's rule). Shapes are the
//! program's (`[out, in]` for linear layers, fused projections already cut into their parts
//! by [`siphon_models::Slice`]); the input token ids `[batch, seq]` are split by batch over
//! `data`.
//!
//! The embedding table is split by vocabulary over the whole weight-sharding group (the seed's
//! `P(fsdp, None)` left it replicated on a `model`-only mesh, where it is the largest tensor).
//!
//! Whole heads: the mesh planner only builds meshes whose `model` size divides the number of
//! heads and KV heads, so the `out` dimension of q/k/v splits at head boundaries. Any other
//! dimension that does not divide its axes (an odd vocabulary, an intermediate size) falls
//! back to a smaller split — for a multi-axis dimension, the largest subset of its axes that
//! divides, else replication — with a `tracing::warn!` and a [`TensorSharding::fallback`]
//! note that the plan reports.

use siphon_mesh::{Mesh, PartitionSpec};
use siphon_models::ParamClass;
use siphon_models::sharding::ExpertSplit;

use crate::mesh::DATA;

/// The spec chosen for one tensor, and why it differs from the class rule if it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSharding {
    /// The spec to use.
    pub spec: PartitionSpec,
    /// What the class rule wanted, when a dimension did not divide and was split less.
    pub fallback: Option<String>,
}

/// The class rule, the experts split as `experts` says: per dimension, the axes it should
/// be split over.
fn wanted(class: ParamClass, experts: ExpertSplit) -> Vec<Vec<&'static str>> {
    siphon_models::sharding::rule_for(class, experts).into_iter().map(|dim| dim.planned.to_vec()).collect()
}

fn size(mesh: &Mesh, axis: &str) -> usize {
    mesh.axis_size_or_one(axis)
}

/// The spec for a tensor of `class` and `shape` on `mesh`, a mixture's experts split as
/// `experts` says. Axes the mesh lacks (or has with size 1) are left out; a dimension that
/// does not divide is split over fewer axes.
pub fn param_spec(class: ParamClass, shape: &[usize], mesh: &Mesh, experts: ExpertSplit) -> TensorSharding {
    let mut rule = wanted(class, experts);
    if rule.len() != shape.len() {
        // A rank the rule does not know (never for siphon-models' own params): replicate.
        rule = vec![Vec::new(); shape.len()];
    }
    let mut dims: Vec<Vec<String>> = Vec::with_capacity(shape.len());
    let mut notes: Vec<String> = Vec::new();
    for (dim, (&extent, axes)) in shape.iter().zip(&rule).enumerate() {
        let present: Vec<&str> = axes.iter().copied().filter(|a| size(mesh, a) > 1).collect();
        let chosen = largest_dividing_subset(&present, extent, mesh);
        if chosen.len() != present.len() {
            let ways: usize = present.iter().map(|a| size(mesh, a)).product();
            notes.push(format!(
                "dim {dim} ({extent}) does not divide over {} ({ways} ways), split over {}",
                present.join("*"),
                if chosen.is_empty() { "nothing (replicated)".to_string() } else { chosen.join("*") }
            ));
        }
        dims.push(chosen.into_iter().map(String::from).collect());
    }
    let spec = PartitionSpec::from_dims(dims);
    let fallback = (!notes.is_empty()).then(|| notes.join("; "));
    if let Some(note) = &fallback {
        tracing::warn!(?class, ?shape, %spec, "sharding fallback: {note}");
    }
    TensorSharding { spec, fallback }
}

/// The subset of `axes` (order kept) with the most ways that divides `extent`; all of them
/// when possible. Ties prefer the earlier (more major) axes.
fn largest_dividing_subset<'a>(axes: &[&'a str], extent: usize, mesh: &Mesh) -> Vec<&'a str> {
    let mut best: Vec<&str> = Vec::new();
    let mut best_ways = 1;
    for mask in (1..(1u32 << axes.len())).rev() {
        let subset: Vec<&str> =
            axes.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, a)| *a).collect();
        let ways: usize = subset.iter().map(|a| size(mesh, a)).product();
        if extent.is_multiple_of(ways) && ways > best_ways {
            best = subset;
            best_ways = ways;
        }
    }
    best
}

/// The spec of the token-id input `[batch, seq]`: batch over `data`.
pub fn input_spec(mesh: &Mesh) -> PartitionSpec {
    if size(mesh, DATA) > 1 { PartitionSpec::new(&[&[DATA], &[]]) } else { PartitionSpec::replicated(2) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh(axes: &[(&str, usize)]) -> Mesh {
        let n = axes.iter().map(|a| a.1).product();
        Mesh::new(axes, (0..n).collect()).unwrap()
    }

    #[test]
    fn megatron_on_model_fsdp_on_hidden() {
        let m = mesh(&[("data", 2), ("fsdp", 2), ("model", 4)]);
        let q = param_spec(ParamClass::AttnQ, &[256, 128], &m, ExpertSplit::Experts);
        assert_eq!(q.spec, PartitionSpec::new(&[&["model"], &["fsdp"]]));
        assert_eq!(q.fallback, None);
        let o = param_spec(ParamClass::AttnO, &[128, 256], &m, ExpertSplit::Experts);
        assert_eq!(o.spec, PartitionSpec::new(&[&["fsdp"], &["model"]]));
        let down = param_spec(ParamClass::MlpDown, &[128, 512], &m, ExpertSplit::Experts);
        assert_eq!(down.spec, PartitionSpec::new(&[&["fsdp"], &["model"]]));
        let bias = param_spec(ParamClass::KBias, &[64], &m, ExpertSplit::Experts);
        assert_eq!(bias.spec, PartitionSpec::new(&[&["model"]]));
        let norm = param_spec(ParamClass::Norm, &[128], &m, ExpertSplit::Experts);
        assert!(norm.spec.is_replicated());
        let emb = param_spec(ParamClass::Embedding, &[1024, 128], &m, ExpertSplit::Experts);
        assert_eq!(emb.spec, PartitionSpec::new(&[&["fsdp", "model"], &[]]));
        assert_eq!(emb.spec.shard_shape(&[1024, 128], &m).unwrap(), vec![128, 128]);
        assert_eq!(input_spec(&m), PartitionSpec::new(&[&["data"], &[]]));
    }

    #[test]
    fn absent_axes_are_not_named() {
        let m = mesh(&[("data", 2), ("model", 4)]);
        let gate = param_spec(ParamClass::MlpGate, &[512, 128], &m, ExpertSplit::Experts);
        assert_eq!(gate.spec, PartitionSpec::new(&[&["model"], &[]]));
        let emb = param_spec(ParamClass::Embedding, &[1024, 128], &m, ExpertSplit::Experts);
        assert_eq!(emb.spec, PartitionSpec::new(&[&["model"], &[]]));
        let single = Mesh::single_device();
        assert!(param_spec(ParamClass::AttnQ, &[8, 8], &single, ExpertSplit::Experts).spec.is_replicated());
        assert!(input_spec(&single).is_replicated());
    }

    #[test]
    fn experts_split_whole_or_by_width() {
        let m = mesh(&[("data", 2), ("fsdp", 2), ("model", 4)]);
        let [gate, down] = [(ParamClass::ExpertGate, [8, 64, 32]), (ParamClass::ExpertDown, [8, 32, 64])];
        let spec = |(class, shape): (ParamClass, [usize; 3]), split| param_spec(class, &shape, &m, split).spec;
        assert_eq!(spec(gate, ExpertSplit::Experts), PartitionSpec::new(&[&["model"], &[], &["fsdp"]]));
        assert_eq!(spec(down, ExpertSplit::Experts), PartitionSpec::new(&[&["model"], &["fsdp"], &[]]));
        assert_eq!(spec(gate, ExpertSplit::Width), PartitionSpec::new(&[&[], &["model"], &["fsdp"]]));
        assert_eq!(spec(down, ExpertSplit::Width), PartitionSpec::new(&[&[], &["fsdp"], &["model"]]));
        // The others as before.
        let q = param_spec(ParamClass::AttnQ, &[64, 32], &m, ExpertSplit::Width).spec;
        assert_eq!(q, PartitionSpec::new(&[&["model"], &["fsdp"]]));
    }

    #[test]
    fn non_dividing_dimensions_fall_back_and_say_so() {
        let m = mesh(&[("fsdp", 2), ("model", 4)]);
        // Vocab 1020 divides by 4 but not by 8: split over model only.
        let emb = param_spec(ParamClass::Embedding, &[1020, 128], &m, ExpertSplit::Experts);
        assert_eq!(emb.spec, PartitionSpec::new(&[&["model"], &[]]));
        assert!(emb.fallback.as_deref().unwrap().contains("1020"), "{emb:?}");
        // Vocab 1021 is prime: replicated.
        let emb = param_spec(ParamClass::Embedding, &[1021, 128], &m, ExpertSplit::Experts);
        assert!(emb.spec.is_replicated());
        assert!(emb.fallback.as_deref().unwrap().contains("replicated"));
        // An intermediate size of 510 does not divide over model=4: that dim replicates.
        let up = param_spec(ParamClass::MlpUp, &[510, 128], &m, ExpertSplit::Experts);
        assert_eq!(up.spec, PartitionSpec::new(&[&[], &["fsdp"]]));
        assert!(up.fallback.is_some());
        // Every chosen spec is valid on the mesh.
        assert!(emb.spec.validate(&[1021, 128], &m).is_ok());
        assert!(up.spec.validate(&[510, 128], &m).is_ok());
    }
}
