//! TPU slices by the names Cloud TPU gives them (`v5litepod-64`, `v5e-64`, `v6e-16`, `v4-32`,
//! `v5p-128`), and what the compiler and the planner need to know of each: the topology
//! libtpu describes it by (`v5e:8x8`, its chip configuration, chips per host, wrap-around
//! links), hosts × chips per host, and each chip's memory and peaks.
//!
//! Shapes follow Cloud TPU's slice table (as MaxText's `accelerator_to_spec_map.py` encodes
//! it): v5e and v6e slices are named by chips, in 2-D shapes, 4 chips a host (the 1-, 4- and
//! 8-chip slices are one host each); v4 and v5p slices are named by TensorCores (2 a chip,
//! fused into one device: "megacore"), in 3-D shapes, 4 chips a host, with wrap-around links
//! on every axis from a full 4 × 4 × 4 cube on. Pure data: libtpu is asked by the runtime.

use serde::Serialize;

use crate::error::PlanError;
use crate::mesh::Topology;

/// A TPU generation and its chip's figures (Cloud TPU's published specifications).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TpuGeneration {
    /// TPU v4: 32 GiB HBM, 275 TFLOP/s bf16, 1,228 GB/s.
    V4,
    /// TPU v5e (v5litepod): 16 GiB HBM, 197 TFLOP/s bf16, 819 GB/s.
    V5e,
    /// TPU v5p: 95 GiB HBM, 459 TFLOP/s bf16, 2,765 GB/s.
    V5p,
    /// TPU v6e (Trillium): 32 GiB HBM, 918 TFLOP/s bf16, 1,640 GB/s.
    V6e,
}

impl TpuGeneration {
    /// The name libtpu's topology names start with.
    fn topology_prefix(self) -> &'static str {
        match self {
            TpuGeneration::V4 => "v4",
            TpuGeneration::V5e => "v5e",
            TpuGeneration::V5p => "v5",
            TpuGeneration::V6e => "v6e",
        }
    }

    /// High-bandwidth memory of one device (a chip).
    pub fn hbm_bytes(self) -> u64 {
        const GIB: u64 = 1 << 30;
        match self {
            TpuGeneration::V4 | TpuGeneration::V6e => 32 * GIB,
            TpuGeneration::V5e => 16 * GIB,
            TpuGeneration::V5p => 95 * GIB,
        }
    }

    /// Peak bf16 operations per second of one device.
    pub fn peak_bf16_flops(self) -> f64 {
        match self {
            TpuGeneration::V4 => 275e12,
            TpuGeneration::V5e => 197e12,
            TpuGeneration::V5p => 459e12,
            TpuGeneration::V6e => 918e12,
        }
    }

    /// Peak HBM bytes per second of one device.
    pub fn hbm_bytes_per_second(self) -> f64 {
        match self {
            TpuGeneration::V4 => 1228e9,
            TpuGeneration::V5e => 819e9,
            TpuGeneration::V5p => 2765e9,
            TpuGeneration::V6e => 1640e9,
        }
    }

    /// Whether a slice's name counts TensorCores (2 a chip) rather than chips.
    fn named_by_cores(self) -> bool {
        matches!(self, TpuGeneration::V4 | TpuGeneration::V5p)
    }
}

/// One TPU slice (or `slices` identical ones joined over the data-center network).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TpuSlice {
    /// The name as Cloud TPU writes it, e.g. `v5litepod-64`.
    pub name: String,
    /// The generation.
    pub generation: TpuGeneration,
    /// Chips (devices) in one slice.
    pub chips: usize,
    /// libtpu's topology name, e.g. `v5e:8x8`.
    pub topology: String,
    /// `default`, or `megacore` where a chip's two TensorCores are one device (v4, v5p).
    pub chip_config: &'static str,
    /// The chips of one host along each axis.
    pub chips_per_host_bounds: [usize; 3],
    /// Which axes wrap around (a torus).
    pub wrap: [bool; 3],
    /// Slices joined into one job (`--slices`).
    pub slices: usize,
}

impl TpuSlice {
    /// The slice Cloud TPU calls `name` (`v5litepod-64`, `v5e-64`, `v6e-16`, `v4-32`,
    /// `v5p-128`), `slices` times over; a name it does not make is refused, listing the ones
    /// it does.
    pub fn parse(name: &str, slices: usize) -> Result<TpuSlice, PlanError> {
        let unknown = |why: String| {
            PlanError::Request(format!(
                "TPU slice {name:?}: {why}; slices are named as Cloud TPU names them: v5litepod-N or v5e-N and \
                 v6e-N (N chips: 1, 4, 8, 16, 32, 64, 128, 256), v4-N and v5p-N (N TensorCores, 2 a chip: \
                 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, and v5p-8192)"
            ))
        };
        if slices == 0 {
            return Err(PlanError::Request("--slices must be at least 1".into()));
        }
        let (family, count) = name.rsplit_once('-').ok_or_else(|| unknown("no size after the generation".into()))?;
        let generation = match family {
            "v5litepod" | "v5e" => TpuGeneration::V5e,
            "v6e" => TpuGeneration::V6e,
            "v4" => TpuGeneration::V4,
            "v5p" => TpuGeneration::V5p,
            other => return Err(unknown(format!("unknown generation {other:?}"))),
        };
        let count: usize = count.parse().map_err(|_| unknown(format!("size {count:?} is not a number")))?;
        let (chips, shape, bounds) = if generation.named_by_cores() {
            if !count.is_multiple_of(2) {
                return Err(unknown(format!("{count} TensorCores are not whole chips")));
            }
            let chips = count / 2;
            let shape = cube(chips).ok_or_else(|| unknown(format!("no {family} slice has {chips} chips")))?;
            (chips, shape, [2, 2, 1])
        } else {
            let (shape, bounds) = match count {
                1 => ([1, 1, 1], [1, 1, 1]),
                4 => ([2, 2, 1], [2, 2, 1]),
                8 => ([2, 4, 1], [2, 4, 1]),
                16 => ([4, 4, 1], [2, 2, 1]),
                32 => ([4, 8, 1], [2, 2, 1]),
                64 => ([8, 8, 1], [2, 2, 1]),
                128 => ([8, 16, 1], [2, 2, 1]),
                256 => ([16, 16, 1], [2, 2, 1]),
                _ => return Err(unknown(format!("no {family} slice has {count} chips"))),
            };
            (count, shape, bounds)
        };
        let three_d = generation.named_by_cores();
        let dims: Vec<String> = shape[..if three_d { 3 } else { 2 }].iter().map(usize::to_string).collect();
        let wrap = if three_d {
            // A full cube of 4 × 4 × 4 chips and larger has wrap-around links on every axis.
            let torus = shape.iter().all(|&d| d >= 4);
            [torus; 3]
        } else {
            // v5e and v6e: an axis of 16 chips wraps around.
            [shape[0] == 16, shape[1] == 16, false]
        };
        Ok(TpuSlice {
            name: name.to_string(),
            generation,
            chips,
            topology: format!("{}:{}", generation.topology_prefix(), dims.join("x")),
            chip_config: if generation.named_by_cores() { "megacore" } else { "default" },
            chips_per_host_bounds: bounds,
            wrap,
            slices,
        })
    }

    /// Cloud TPU's accelerator type of one slice, as a TPU VM's `TPU_ACCELERATOR_TYPE` holds
    /// it: `v5litepod-64` for `v5e-64`; v4 and v5p counted in TensorCores.
    pub fn accelerator_type(&self) -> String {
        let (family, count) = match self.generation {
            TpuGeneration::V5e => ("v5litepod", self.chips),
            TpuGeneration::V6e => ("v6e", self.chips),
            TpuGeneration::V4 => ("v4", 2 * self.chips),
            TpuGeneration::V5p => ("v5p", 2 * self.chips),
        };
        format!("{family}-{count}")
    }

    /// Chips of one host.
    pub fn chips_per_host(&self) -> usize {
        self.chips_per_host_bounds.iter().product::<usize>().min(self.chips)
    }

    /// Hosts of every slice together.
    pub fn hosts(&self) -> usize {
        self.slices * self.chips / self.chips_per_host()
    }

    /// Devices of every slice together.
    pub fn devices(&self) -> usize {
        self.slices * self.chips
    }

    /// The planner's hosts × devices per host for these slices.
    pub fn planner_topology(&self) -> Result<Topology, PlanError> {
        Topology::uniform(self.hosts(), self.chips_per_host())
    }
}

/// The 3-D shape Cloud TPU gives a v4 or v5p slice of `chips` chips.
fn cube(chips: usize) -> Option<[usize; 3]> {
    Some(match chips {
        4 => [2, 2, 1],
        8 => [2, 2, 2],
        16 => [2, 2, 4],
        32 => [2, 4, 4],
        64 => [4, 4, 4],
        128 => [4, 4, 8],
        256 => [4, 8, 8],
        512 => [8, 8, 8],
        1024 => [8, 8, 16],
        2048 => [8, 16, 16],
        4096 => [16, 16, 16],
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_cloud_tpus_shapes() {
        // (name, topology, chips per host bounds, wrap, hosts, devices), from Cloud TPU's table.
        let cases = [
            ("v5litepod-64", "v5e:8x8", [2, 2, 1], [false; 3], 16, 64),
            ("v5e-4", "v5e:2x2", [2, 2, 1], [false; 3], 1, 4),
            ("v5e-8", "v5e:2x4", [2, 4, 1], [false; 3], 1, 8),
            ("v5e-128", "v5e:8x16", [2, 2, 1], [false, true, false], 32, 128),
            ("v5e-256", "v5e:16x16", [2, 2, 1], [true, true, false], 64, 256),
            ("v6e-16", "v6e:4x4", [2, 2, 1], [false; 3], 4, 16),
            ("v4-32", "v4:2x2x4", [2, 2, 1], [false; 3], 4, 16),
            ("v4-128", "v4:4x4x4", [2, 2, 1], [true; 3], 16, 64),
            ("v5p-128", "v5:4x4x4", [2, 2, 1], [true; 3], 16, 64),
            ("v5p-8", "v5:2x2x1", [2, 2, 1], [false; 3], 1, 4),
        ];
        for (name, topology, bounds, wrap, hosts, devices) in cases {
            let slice = TpuSlice::parse(name, 1).unwrap();
            assert_eq!(slice.topology, topology, "{name}");
            assert_eq!(slice.chips_per_host_bounds, bounds, "{name}");
            assert_eq!(slice.wrap, wrap, "{name}");
            assert_eq!((slice.hosts(), slice.devices()), (hosts, devices), "{name}");
        }
        // Cloud TPU's accelerator types, whichever name was given.
        for (name, accelerator) in [("v5e-4", "v5litepod-4"), ("v5litepod-64", "v5litepod-64"), ("v4-32", "v4-32")] {
            assert_eq!(TpuSlice::parse(name, 1).unwrap().accelerator_type(), accelerator);
        }
        let two = TpuSlice::parse("v5e-16", 2).unwrap();
        assert_eq!((two.hosts(), two.devices()), (8, 32));
        assert_eq!(TpuSlice::parse("v4-8", 1).unwrap().chip_config, "megacore");
    }

    #[test]
    fn names_cloud_tpu_does_not_make_are_refused() {
        for (name, why) in [
            ("v5e-12", "no v5e slice has 12 chips"),
            ("v5p-7", "7 TensorCores are not whole chips"),
            ("v7-8", "unknown generation"),
            ("v5e", "no size"),
            ("v6e-x", "is not a number"),
        ] {
            let err = TpuSlice::parse(name, 1).unwrap_err().to_string();
            assert!(err.contains(why) && err.contains("v5litepod-N"), "{name}: {err}");
        }
        assert!(TpuSlice::parse("v5e-4", 0).is_err());
    }
}
