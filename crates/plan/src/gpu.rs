//! GPU nodes by the names users rent them by (`h100`, `h100x8`, `h200x8`, `a100-80x8`,
//! `b200x8`): the device the CUDA plugin's target description names, GPUs per node, nodes,
//! and each GPU's published figures (memory, dense bf16 peak, memory bandwidth).
//!
//! The CUDA plugin's own description of the device (its `GpuTargetConfigProto`, read by the
//! runtime) is what the program is compiled for; the figures here are for the planner (before
//! any plugin is loaded) and the roofline. Pure data.

use serde::Serialize;

use crate::error::PlanError;
use crate::mesh::Topology;

/// The share of a GPU's memory the CUDA plugin's allocator takes by default (XLA's
/// `GpuAllocatorConfig::memory_fraction`, JAX's `XLA_PYTHON_CLIENT_MEM_FRACTION`): what a
/// `siphon extract` on the GPU may use.
pub const CUDA_ALLOCATOR_FRACTION: f64 = 0.75;

/// A GPU model and its published figures (NVIDIA's data sheets, SXM parts); serialized as
/// siphon's name for it (`h100`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuModel {
    /// H100 SXM 80 GB: 989 TFLOP/s dense bf16, 3.35 TB/s.
    H100,
    /// H100 PCIe 80 GB: 756 TFLOP/s dense bf16, 2.04 TB/s.
    H100Pcie,
    /// H200 SXM 141 GB: 989 TFLOP/s dense bf16, 4.8 TB/s.
    H200,
    /// A100 SXM4 80 GB: 312 TFLOP/s dense bf16, 2.04 TB/s.
    A100_80,
    /// A100 SXM4 40 GB: 312 TFLOP/s dense bf16, 1.56 TB/s.
    A100_40,
    /// B200 180 GB: 2,250 TFLOP/s dense bf16, 7.7 TB/s.
    B200,
}

/// Every model with the names `--target gpu:NAME` takes for it.
const MODELS: &[(&str, GpuModel)] = &[
    ("h100", GpuModel::H100),
    ("h100-sxm", GpuModel::H100),
    ("h100-pcie", GpuModel::H100Pcie),
    ("h200", GpuModel::H200),
    ("a100-80", GpuModel::A100_80),
    ("a100", GpuModel::A100_80),
    ("a100-40", GpuModel::A100_40),
    ("b200", GpuModel::B200),
];

impl GpuModel {
    /// The device's name as CUDA reports it, and as the CUDA plugin's target description
    /// (`device_description_str`) names it.
    pub fn device_name(self) -> &'static str {
        match self {
            GpuModel::H100 => "NVIDIA H100 80GB HBM3",
            GpuModel::H100Pcie => "NVIDIA H100 PCIe",
            GpuModel::H200 => "NVIDIA H200 141GB HBM3e",
            GpuModel::A100_80 => "NVIDIA A100-SXM4-80GB",
            GpuModel::A100_40 => "NVIDIA A100-SXM4-40GB",
            GpuModel::B200 => "NVIDIA B200",
        }
    }

    /// The name siphon gives it (`--target gpu:NAME`).
    pub fn name(self) -> &'static str {
        MODELS.iter().find(|(_, m)| *m == self).map_or("?", |(n, _)| n)
    }

    /// Memory of one GPU: the `device_memory_size` of the CUDA plugin's description of it (a
    /// test holds the two equal).
    pub fn memory_bytes(self) -> u64 {
        match self {
            GpuModel::H100 => 84_942_979_072,
            GpuModel::H100Pcie => 84_942_979_072,
            GpuModel::H200 => 151_397_597_184,
            GpuModel::A100_80 => 85_100_068_864,
            GpuModel::A100_40 => 42_331_013_120,
            GpuModel::B200 => 191_514_411_008,
        }
    }

    /// What a job may use of it: [`CUDA_ALLOCATOR_FRACTION`] of its memory.
    pub fn usable_bytes(self) -> u64 {
        (self.memory_bytes() as f64 * CUDA_ALLOCATOR_FRACTION) as u64
    }

    /// Peak dense bf16 operations per second.
    pub fn peak_bf16_flops(self) -> f64 {
        match self {
            GpuModel::H100 | GpuModel::H200 => 989e12,
            GpuModel::H100Pcie => 756e12,
            GpuModel::A100_80 | GpuModel::A100_40 => 312e12,
            GpuModel::B200 => 2250e12,
        }
    }

    /// Peak memory bytes per second.
    pub fn memory_bytes_per_second(self) -> f64 {
        match self {
            GpuModel::H100 => 3.35e12,
            GpuModel::H100Pcie => 2.04e12,
            GpuModel::H200 => 4.8e12,
            GpuModel::A100_80 => 2.039e12,
            GpuModel::A100_40 => 1.555e12,
            GpuModel::B200 => 7.7e12,
        }
    }
}

impl Serialize for GpuModel {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// GPU nodes: `hosts` nodes of `gpus_per_host` GPUs of one model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuTarget {
    /// The name as given, e.g. `h100x8`.
    pub name: String,
    /// The GPU.
    pub model: GpuModel,
    /// GPUs on each node.
    pub gpus_per_host: usize,
    /// Nodes (`--hosts`).
    pub hosts: usize,
}

impl GpuTarget {
    /// The GPUs `name` names (`h100`, `h100x8`, `a100-80x8`, …: a model, then `xN` GPUs a node,
    /// 1 when left out) on `hosts` nodes; an unknown model or count is refused, listing the
    /// names there are.
    pub fn parse(name: &str, hosts: usize) -> Result<GpuTarget, PlanError> {
        let unknown = |why: String| {
            let names: Vec<&str> = MODELS.iter().map(|(n, _)| *n).collect();
            PlanError::Request(format!(
                "GPU target {name:?}: {why}; name a GPU as MODEL or MODELxN (N GPUs a node, 1 to 16), MODEL one of \
                 {}: e.g. gpu:h100x8",
                names.join(", ")
            ))
        };
        if hosts == 0 {
            return Err(PlanError::Request("--hosts must be at least 1".into()));
        }
        let lower = name.to_ascii_lowercase();
        let (model_name, count) = match lower.rsplit_once('x') {
            Some((m, n)) if !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()) => (m, n.parse().ok()),
            _ => (lower.as_str(), Some(1)),
        };
        let model = MODELS
            .iter()
            .find(|(n, _)| *n == model_name)
            .map(|(_, m)| *m)
            .ok_or_else(|| unknown(format!("unknown GPU {model_name:?}")))?;
        let gpus_per_host = match count {
            Some(n @ 1..=16) => n,
            _ => return Err(unknown("a node has 1 to 16 GPUs".into())),
        };
        if hosts.saturating_mul(gpus_per_host) > crate::mesh::MAX_DEVICES {
            return Err(PlanError::Request(format!(
                "{hosts} nodes of {gpus_per_host} GPUs is more than siphon plans for"
            )));
        }
        Ok(GpuTarget { name: name.to_string(), model, gpus_per_host, hosts })
    }

    /// GPUs of every node together.
    pub fn devices(&self) -> usize {
        self.hosts * self.gpus_per_host
    }

    /// The planner's hosts × devices per host for these nodes.
    pub fn planner_topology(&self) -> Result<Topology, PlanError> {
        Topology::uniform(self.hosts, self.gpus_per_host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_give_models_and_counts() {
        let t = GpuTarget::parse("h100x8", 1).unwrap();
        assert_eq!((t.model, t.gpus_per_host, t.hosts, t.devices()), (GpuModel::H100, 8, 1, 8));
        let t = GpuTarget::parse("a100-80x8", 2).unwrap();
        assert_eq!((t.model, t.devices()), (GpuModel::A100_80, 16));
        assert_eq!(GpuTarget::parse("H200", 1).unwrap().gpus_per_host, 1);
        assert_eq!(GpuTarget::parse("b200x8", 1).unwrap().model.device_name(), "NVIDIA B200");
        for bad in ["h100x0", "h100x17", "v100", "h100x", "x8", ""] {
            let err = GpuTarget::parse(bad, 1).unwrap_err().to_string();
            assert!(err.contains("MODELxN"), "{bad}: {err}");
        }
        assert!(GpuTarget::parse("h100", 0).is_err());
    }

    #[test]
    fn a_job_gets_the_allocators_share() {
        let m = GpuModel::H100;
        assert_eq!(m.usable_bytes(), (84_942_979_072f64 * 0.75) as u64);
        assert_eq!(m.name(), "h100");
    }
}
