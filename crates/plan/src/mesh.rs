//! Mesh shapes over hosts × local devices.
//!
//! Every siphon mesh is a sub-grid of `data` × `fsdp` × `model` (major to minor):
//! - `model` splits whole attention heads and the MLP's intermediate dimension (Megatron-style
//!   tensor parallelism; one all-reduce per attention and per MLP block).
//! - `fsdp` splits the other weight dimension (hidden); XLA all-gathers a layer's weights over
//!   `fsdp` just before using them.
//! - `data` splits the batch; weights are replicated along it.
//!
//! `fsdp` × `model` is the *weight-sharding group*: the devices that together hold one copy of
//! the weights. Devices are ordered host-major (all of host 0, then host 1, ...), and the mesh
//! is row-major with `data` most significant, so a group of `g` devices is `g` consecutive
//! devices: when `g` divides the devices per host every group lies inside one host and only
//! `data` crosses hosts — weight traffic stays on the fast intra-host links. A group larger
//! than a host must be a whole number of hosts ("spans hosts"); that is allowed but reported.
//!
//! Axes of size 1 are left out of the [`Mesh`] and never named by a partition spec.
//!
//! Kinds (`--mesh`):
//! - `1d`: every device on `model`.
//! - `2d`: `data` across hosts (or `--data N`) × the rest within a host. Within the group,
//!   `model` takes the largest size that splits whole heads and KV heads, `fsdp` the rest, so
//!   a model whose heads do not divide the host's device count still shards its weights over
//!   the whole host.
//! - `3d`: `data` × `fsdp` × `model`, `fsdp` defaulting to 2 like the seed scripts.
//! - `auto`: the smallest weight-sharding group whose per-device memory fits (see
//!   [`crate::plan`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use siphon_mesh::Mesh;
use siphon_models::ModelConfig;

use crate::error::PlanError;
pub use crate::shape::MeshShape;

pub use siphon_models::sharding::{DATA, FSDP, MODEL};

/// The largest job the planner accepts (larger counts are almost certainly a typo, and the
/// device list is materialized).
pub const MAX_DEVICES: usize = 1 << 16;

/// One device as PJRT reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// The PJRT device id (global across hosts).
    pub id: usize,
    /// Which host (process) owns the device.
    pub process_index: usize,
}

/// The devices of a job: `hosts` hosts with `devices_per_host` devices each, host-major.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    hosts: usize,
    devices_per_host: usize,
    device_ids: Vec<usize>,
}

impl Topology {
    /// `hosts` × `devices_per_host` devices with ids `0..hosts*devices_per_host`, host-major
    /// (the numbering PJRT multi-host clients use).
    pub fn uniform(hosts: usize, devices_per_host: usize) -> Result<Topology, PlanError> {
        if hosts == 0 || devices_per_host == 0 {
            return Err(PlanError::Topology(format!(
                "{hosts} hosts × {devices_per_host} devices: both must be at least 1"
            )));
        }
        if hosts.saturating_mul(devices_per_host) > MAX_DEVICES {
            return Err(PlanError::Topology(format!(
                "{hosts} hosts × {devices_per_host} devices is more than the {MAX_DEVICES} devices siphon plans for"
            )));
        }
        Ok(Topology { hosts, devices_per_host, device_ids: (0..hosts * devices_per_host).collect() })
    }

    /// The topology of the devices a PJRT client lists: grouped by process index (ascending),
    /// by id within a host. Every host must have the same number of devices.
    pub fn from_devices(devices: &[DeviceInfo]) -> Result<Topology, PlanError> {
        if devices.is_empty() {
            return Err(PlanError::Topology("no devices".into()));
        }
        let mut sorted = devices.to_vec();
        sorted.sort_by_key(|d| (d.process_index, d.id));
        if let Some(w) = sorted.windows(2).find(|w| w[0].id == w[1].id) {
            return Err(PlanError::Topology(format!("device id {} is listed twice", w[0].id)));
        }
        let mut counts: Vec<(usize, usize)> = Vec::new();
        for d in &sorted {
            match counts.last_mut() {
                Some((p, n)) if *p == d.process_index => *n += 1,
                _ => counts.push((d.process_index, 1)),
            }
        }
        let per_host = counts[0].1;
        if let Some((p, n)) = counts.iter().find(|(_, n)| *n != per_host) {
            return Err(PlanError::Topology(format!(
                "host {} has {per_host} devices but host {p} has {n}; siphon needs the same number on every host",
                counts[0].0
            )));
        }
        Ok(Topology {
            hosts: counts.len(),
            devices_per_host: per_host,
            device_ids: sorted.iter().map(|d| d.id).collect(),
        })
    }

    /// Number of hosts.
    pub fn hosts(&self) -> usize {
        self.hosts
    }

    /// Devices on each host.
    pub fn devices_per_host(&self) -> usize {
        self.devices_per_host
    }

    /// All devices.
    pub fn num_devices(&self) -> usize {
        self.device_ids.len()
    }

    /// Device ids, host-major.
    pub fn device_ids(&self) -> &[usize] {
        &self.device_ids
    }
}

/// The `--mesh` choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MeshKind {
    /// Every device on `model`.
    #[serde(rename = "1d")]
    OneD,
    /// `data` across hosts × weight sharding within a host.
    #[serde(rename = "2d")]
    TwoD,
    /// `data` × `fsdp` × `model`.
    #[serde(rename = "3d")]
    ThreeD,
    /// The smallest weight-sharding group that fits the device memory.
    #[serde(rename = "auto")]
    Auto,
}

impl fmt::Display for MeshKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MeshKind::OneD => "1d",
            MeshKind::TwoD => "2d",
            MeshKind::ThreeD => "3d",
            MeshKind::Auto => "auto",
        })
    }
}

impl FromStr for MeshKind {
    type Err = String;
    fn from_str(s: &str) -> Result<MeshKind, String> {
        match s.to_ascii_lowercase().as_str() {
            "1d" => Ok(MeshKind::OneD),
            "2d" => Ok(MeshKind::TwoD),
            "3d" => Ok(MeshKind::ThreeD),
            "auto" => Ok(MeshKind::Auto),
            other => Err(format!("unknown mesh kind {other:?} (expected 1d, 2d, 3d or auto)")),
        }
    }
}

/// A mesh request: the kind plus optional fixed axis sizes (`--data`, `--fsdp`,
/// `--model-parallel`). Unset sizes are chosen by the kind's rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeshRequest {
    /// Which layout.
    pub kind: MeshKind,
    /// Fixed size of the `data` axis.
    pub data: Option<usize>,
    /// Fixed size of the `fsdp` axis.
    pub fsdp: Option<usize>,
    /// Fixed size of the `model` axis.
    pub model: Option<usize>,
}

impl Default for MeshRequest {
    fn default() -> MeshRequest {
        MeshRequest { kind: MeshKind::TwoD, data: None, fsdp: None, model: None }
    }
}

impl fmt::Display for MeshRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        let mut flags = Vec::new();
        if let Some(n) = self.data {
            flags.push(format!("--data {n}"));
        }
        if let Some(n) = self.fsdp {
            flags.push(format!("--fsdp {n}"));
        }
        if let Some(n) = self.model {
            flags.push(format!("--model-parallel {n}"));
        }
        if !flags.is_empty() {
            write!(f, " with {}", flags.join(" "))?;
        }
        Ok(())
    }
}

impl MeshShape {
    /// Devices that together hold one copy of the weights (`fsdp` × `model`).
    pub fn weight_group(&self) -> usize {
        // Saturating: sizes can come straight from flags.
        self.fsdp.saturating_mul(self.model)
    }

    /// Total devices.
    pub fn num_devices(&self) -> usize {
        self.data.saturating_mul(self.fsdp).saturating_mul(self.model)
    }

    /// True when a weight-sharding group is larger than one host.
    pub fn spans_hosts(&self, topology: &Topology) -> bool {
        self.weight_group() > topology.devices_per_host()
    }

    /// The command-line flags that request exactly this shape.
    pub fn flags(&self) -> String {
        format!("--mesh 3d --data {} --fsdp {} --model-parallel {}", self.data, self.fsdp, self.model)
    }

    /// Builds the named mesh over the topology's devices (host-major), leaving out size-1
    /// axes. Call [`MeshShape::check`] first for a readable error.
    pub fn build(&self, topology: &Topology) -> Result<Mesh, PlanError> {
        let axes: Vec<(&str, usize)> = [(DATA, self.data), (FSDP, self.fsdp), (MODEL, self.model)]
            .into_iter()
            .filter(|&(_, size)| size > 1)
            .collect();
        Ok(Mesh::new(&axes, topology.device_ids().to_vec())?)
    }

    /// Why this shape cannot be used for `config` on `topology`, or `None` when it can.
    pub fn check(&self, config: &ModelConfig, topology: &Topology) -> Option<String> {
        let n = topology.num_devices();
        let per_host = topology.devices_per_host();
        if self.data == 0 || self.fsdp == 0 || self.model == 0 {
            return Some(format!("axis sizes {self} must all be at least 1"));
        }
        if self.num_devices() != n {
            return Some(format!("data×fsdp×model = {self} holds {} devices but there are {n}", self.num_devices()));
        }
        let kv_heads = config.kv_head_counts();
        if !config.attention.n_heads.is_multiple_of(self.model)
            || kv_heads.iter().any(|kv| !kv.is_multiple_of(self.model))
        {
            let kv: Vec<String> = kv_heads.iter().map(usize::to_string).collect();
            return Some(format!(
                "model={} does not divide num_attention_heads {} and num_key_value_heads {} \
                 (the model axis splits whole heads)",
                self.model,
                config.attention.n_heads,
                kv.join(" and ")
            ));
        }
        // Groups must line up with host boundaries: inside one host, or whole hosts.
        for (name, size) in [("model", self.model), ("fsdp×model", self.weight_group())] {
            if !aligned(size, per_host) {
                return Some(format!(
                    "{name}={size} neither divides nor is a multiple of the {per_host} devices per host, \
                     so its groups would straddle host boundaries"
                ));
            }
        }
        None
    }
}

fn aligned(size: usize, per_host: usize) -> bool {
    per_host.is_multiple_of(size) || size.is_multiple_of(per_host)
}

fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).collect()
}

/// Every usable shape for `config` on `topology`, by weight-sharding group then `model`.
pub fn valid_shapes(config: &ModelConfig, topology: &Topology) -> Vec<MeshShape> {
    let n = topology.num_devices();
    let mut out = Vec::new();
    for group in divisors(n) {
        for model in divisors(group) {
            let shape = MeshShape { data: n / group, fsdp: group / model, model };
            if shape.check(config, topology).is_none() {
                out.push(shape);
            }
        }
    }
    out
}

/// The largest `model` size dividing `group` that splits whole heads and stays inside a host
/// (tensor parallelism all-reduces activations twice per block: keep it off the slower
/// inter-host links; only `1d` or an explicit `--model-parallel` puts `model` across hosts).
pub fn best_model(config: &ModelConfig, topology: &Topology, group: usize) -> usize {
    divisors(group)
        .into_iter()
        .rev()
        .find(|&m| {
            config.attention.n_heads.is_multiple_of(m)
                && config.kv_head_counts().iter().all(|kv| kv.is_multiple_of(m))
                && topology.devices_per_host().is_multiple_of(m)
        })
        .unwrap_or(1)
}

/// The shape a fixed kind (`1d`, `2d`, `3d`) asks for, checked; `auto` is resolved by the
/// planner, which needs memory estimates. With `auto` this resolves like `2d` with the
/// weight-sharding group of the request's fixed sizes.
pub fn resolve(request: &MeshRequest, config: &ModelConfig, topology: &Topology) -> Result<MeshShape, PlanError> {
    let n = topology.num_devices();
    let invalid = |reason: String| PlanError::InvalidMesh {
        requested: request.to_string(),
        reason,
        valid: valid_shapes(config, topology),
    };
    for (name, value) in [("--data", request.data), ("--fsdp", request.fsdp), ("--model-parallel", request.model)] {
        match value {
            Some(0) => return Err(invalid(format!("{name} must be at least 1"))),
            Some(v) if !n.is_multiple_of(v) => {
                return Err(invalid(format!("{name} {v} does not divide the {n} devices")));
            }
            _ => {}
        }
    }
    let shape = match request.kind {
        MeshKind::OneD => {
            let shape = MeshShape { data: 1, fsdp: 1, model: n };
            let conflicting = request.data.is_some_and(|d| d != 1)
                || request.fsdp.is_some_and(|f| f != 1)
                || request.model.is_some_and(|m| m != n);
            if conflicting {
                return Err(invalid(format!("1d puts all {n} devices on model; use 2d or 3d to set other axis sizes")));
            }
            shape
        }
        MeshKind::TwoD | MeshKind::ThreeD | MeshKind::Auto => {
            let data = match (request.data, request.fsdp, request.model) {
                (Some(d), _, _) => d,
                (None, Some(f), Some(m)) if n.is_multiple_of(f * m) => n / (f * m),
                _ => topology.hosts(),
            };
            let group = n / data;
            let default_fsdp = if request.kind == MeshKind::ThreeD { 2.min(group) } else { 1 };
            let (fsdp, model) = match (request.fsdp, request.model) {
                (Some(f), Some(m)) => (f, m),
                (Some(f), None) => (f, group / f.max(1)),
                (None, Some(m)) => (group / m, m),
                (None, None) => {
                    let m = best_model(config, topology, group / default_fsdp);
                    (group / m, m)
                }
            };
            MeshShape { data, fsdp, model }
        }
    };
    match shape.check(config, topology) {
        None => Ok(shape),
        Some(reason) => Err(invalid(reason)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use siphon_models::HfConfig;

    fn config(heads: usize, kv_heads: usize) -> ModelConfig {
        HfConfig::from_json(&format!(
            r#"{{"model_type": "llama", "vocab_size": 1024, "hidden_size": {}, "intermediate_size": 512,
               "num_hidden_layers": 2, "num_attention_heads": {heads}, "num_key_value_heads": {kv_heads}}}"#,
            heads * 16
        ))
        .unwrap()
        .into_config()
        .unwrap()
    }

    fn req(kind: MeshKind, data: Option<usize>, fsdp: Option<usize>, model: Option<usize>) -> MeshRequest {
        MeshRequest { kind, data, fsdp, model }
    }

    #[test]
    fn from_devices_groups_by_process_and_rejects_uneven_hosts() {
        let devices: Vec<DeviceInfo> =
            [(5, 1), (0, 0), (4, 1), (1, 0)].map(|(id, p)| DeviceInfo { id, process_index: p }).to_vec();
        let t = Topology::from_devices(&devices).unwrap();
        assert_eq!((t.hosts(), t.devices_per_host()), (2, 2));
        assert_eq!(t.device_ids(), &[0, 1, 4, 5]);
        let uneven = [(0, 0), (1, 0), (2, 1)].map(|(id, p)| DeviceInfo { id, process_index: p });
        let err = Topology::from_devices(&uneven).unwrap_err();
        assert!(err.to_string().contains("same number"), "{err}");
        assert!(Topology::uniform(0, 4).is_err());
        let err = Topology::uniform(100_000, 100_000).unwrap_err();
        assert!(err.to_string().contains("more than"), "{err}");
    }

    #[test]
    fn seed_conventions() {
        let c = config(16, 16);
        let t = Topology::uniform(4, 4).unwrap();
        let one = resolve(&req(MeshKind::OneD, None, None, None), &c, &t).unwrap();
        assert_eq!(one, MeshShape { data: 1, fsdp: 1, model: 16 });
        assert!(one.spans_hosts(&t));
        let two = resolve(&req(MeshKind::TwoD, None, None, None), &c, &t).unwrap();
        assert_eq!(two, MeshShape { data: 4, fsdp: 1, model: 4 });
        assert_eq!(two.build(&t).unwrap().to_string(), "[data=4, model=4]");
        let three = resolve(&req(MeshKind::ThreeD, None, None, None), &c, &t).unwrap();
        assert_eq!(three, MeshShape { data: 4, fsdp: 2, model: 2 });
        assert_eq!(three.build(&t).unwrap().to_string(), "[data=4, fsdp=2, model=2]");
    }

    #[test]
    fn groups_stay_inside_a_host() {
        let c = config(16, 8);
        let t = Topology::uniform(2, 4).unwrap();
        let mesh = resolve(&req(MeshKind::TwoD, None, None, None), &c, &t).unwrap().build(&t).unwrap();
        // Partitions 0..4 (data=0) are host 0's devices, 4..8 host 1's.
        for p in 0..8 {
            assert_eq!(mesh.coords(p)[0], mesh.device_ids()[p] / 4);
        }
    }

    #[test]
    fn heads_that_do_not_divide_go_to_fsdp_in_2d_and_error_when_forced() {
        // 28 heads / 4 KV heads on 16 devices per host: model=4, fsdp=4.
        let c = config(28, 4);
        let t = Topology::uniform(4, 16).unwrap();
        let shape = resolve(&req(MeshKind::TwoD, None, None, None), &c, &t).unwrap();
        assert_eq!(shape, MeshShape { data: 4, fsdp: 4, model: 4 });
        let err = resolve(&req(MeshKind::TwoD, None, None, Some(16)), &c, &t).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("heads") && text.contains("valid shapes"), "{text}");
        assert!(text.contains("4×4×4"), "{text}");
        let err = resolve(&req(MeshKind::OneD, None, None, None), &c, &t).unwrap_err();
        assert!(err.to_string().contains("does not divide num_attention_heads 28"), "{err}");
    }

    #[test]
    fn impossible_shapes_list_valid_ones() {
        let c = config(8, 8);
        let t = Topology::uniform(2, 4).unwrap();
        let err = resolve(&req(MeshKind::TwoD, Some(3), None, None), &c, &t).unwrap_err();
        let PlanError::InvalidMesh { valid, reason, .. } = &err else { panic!("{err}") };
        assert!(reason.contains("--data 3"), "{reason}");
        assert!(valid.contains(&MeshShape { data: 2, fsdp: 1, model: 4 }));
        assert!(valid.iter().all(|s| s.check(&c, &t).is_none() && s.num_devices() == 8));
        // A group of 3 devices straddles hosts of 4: never listed.
        let t = Topology::uniform(3, 4).unwrap();
        assert!(valid_shapes(&c, &t).iter().all(|s| aligned(s.weight_group(), 4)));
        let err = resolve(&req(MeshKind::ThreeD, Some(2), Some(3), Some(2)), &c, &t).unwrap_err();
        assert!(err.to_string().contains("straddle"), "{err}");
    }

    #[test]
    fn mesh_kind_parses() {
        assert_eq!("2D".parse::<MeshKind>().unwrap(), MeshKind::TwoD);
        assert!("4d".parse::<MeshKind>().unwrap_err().contains("expected 1d"));
    }
}
