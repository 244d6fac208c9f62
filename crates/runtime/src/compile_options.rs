//! How XLA compiles a program (`CompileOptions`, `XlaOption`), checked against the devices
//! before XLA sees it.

use std::collections::HashSet;

use siphon_mesh::Mesh;

use crate::client::ClientInner;
use crate::error::{Error, Result};

/// How XLA compiles a program: replicas × partitions, SPMD/Shardy and the device assignment.
///
/// Every field is validated against the client before anything reaches XLA, because XLA
/// aborts the process (a failed `CHECK`) on some inconsistent options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileOptions {
    /// Number of replicas (data-parallel copies outside SPMD); siphon uses 1.
    pub num_replicas: usize,
    /// Number of SPMD partitions (devices one program is split over).
    pub num_partitions: usize,
    /// Let XLA's SPMD partitioner split the program according to its sharding annotations.
    pub use_spmd_partitioning: bool,
    /// Use Shardy (`sdy.*` annotations) instead of GSPMD. Needs `use_spmd_partitioning`.
    pub use_shardy_partitioner: bool,
    /// Device ids as `[replica][partition]`. `None`: the first `num_replicas *
    /// num_partitions` addressable devices, in the client's order.
    pub device_assignment: Option<Vec<Vec<usize>>>,
    /// XLA debug options by name (the names `XLA_FLAGS` takes), sent with the program
    /// (`env_option_overrides`); XLA refuses a name it does not know. On the CPU plugin
    /// [`Client::compile`](crate::Client::compile) adds [`CPU_DEFAULTS`](crate::CPU_DEFAULTS)
    /// where this does not name them.
    pub xla_options: Vec<(String, XlaOption)>,
}

/// The value of one XLA debug option (`CompileOptionsProto.env_option_overrides`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XlaOption {
    /// A boolean option.
    Bool(bool),
    /// An integer option.
    Int(i64),
    /// Strings, lists and enum values (by their names).
    Str(String),
}

impl Default for CompileOptions {
    fn default() -> CompileOptions {
        CompileOptions::single_device(None)
    }
}

impl CompileOptions {
    /// One replica, one partition, on `device_id` (the first addressable device if `None`).
    pub fn single_device(device_id: Option<usize>) -> CompileOptions {
        CompileOptions {
            num_replicas: 1,
            num_partitions: 1,
            use_spmd_partitioning: false,
            use_shardy_partitioner: false,
            device_assignment: device_id.map(|id| vec![vec![id]]),
            xla_options: Vec::new(),
        }
    }

    /// SPMD over every device of `mesh` with Shardy: partition `p` runs on
    /// `mesh.device_ids()[p]`, the order `sdy.mesh` assumes.
    pub fn spmd(mesh: &Mesh) -> CompileOptions {
        CompileOptions {
            num_replicas: 1,
            num_partitions: mesh.num_devices(),
            use_spmd_partitioning: true,
            use_shardy_partitioner: true,
            device_assignment: Some(vec![mesh.device_ids().to_vec()]),
            xla_options: Vec::new(),
        }
    }

    /// Checks the options against `client` and returns the full `[replica][partition]`
    /// device assignment to send.
    pub(crate) fn resolve(&self, client: &ClientInner) -> Result<Vec<Vec<usize>>> {
        let devices: Vec<(usize, bool)> = client.devices.iter().map(|d| (d.info.id, d.info.addressable)).collect();
        self.resolve_against(&devices, &format!("process {}", client.process_index))
    }

    /// Checks the options against `devices` (each id and whether the compiling side may
    /// address it; `whose` names that side in errors) and returns the full
    /// `[replica][partition]` device assignment to send.
    pub(crate) fn resolve_against(&self, devices: &[(usize, bool)], whose: &str) -> Result<Vec<Vec<usize>>> {
        let invalid = |message: String| Err(Error::InvalidCompileOptions(message));
        if self.num_replicas < 1 {
            return invalid("num_replicas must be at least 1".into());
        }
        if self.num_partitions < 1 {
            return invalid("num_partitions must be at least 1".into());
        }
        if self.num_partitions > 1 && !self.use_spmd_partitioning {
            return invalid(format!(
                "{} partitions need use_spmd_partitioning (siphon only runs SPMD programs)",
                self.num_partitions
            ));
        }
        if self.use_shardy_partitioner && !self.use_spmd_partitioning {
            return invalid("use_shardy_partitioner needs use_spmd_partitioning".into());
        }
        let total = self.num_replicas.saturating_mul(self.num_partitions);
        let assignment = match &self.device_assignment {
            Some(assignment) => assignment.clone(),
            None => {
                let addressable: Vec<usize> =
                    devices.iter().filter(|(_, addressable)| *addressable).map(|(id, _)| *id).collect();
                if addressable.len() < total {
                    return invalid(format!(
                        "{} replicas x {} partitions need {total} devices but {whose} has {} addressable",
                        self.num_replicas,
                        self.num_partitions,
                        addressable.len()
                    ));
                }
                addressable[..total].chunks(self.num_partitions).map(|c| c.to_vec()).collect()
            }
        };
        if assignment.len() != self.num_replicas || assignment.iter().any(|row| row.len() != self.num_partitions) {
            let rows: Vec<usize> = assignment.iter().map(Vec::len).collect();
            return invalid(format!(
                "device assignment has rows of lengths {rows:?}; expected {} rows of {} devices",
                self.num_replicas, self.num_partitions
            ));
        }
        let mut seen = HashSet::new();
        let mut any_addressable = false;
        for &id in assignment.iter().flatten() {
            let Some(&(_, addressable)) = devices.iter().find(|(device, _)| *device == id) else {
                return invalid(format!(
                    "device assignment names device {id}, which {whose} does not have (devices: {:?})",
                    devices.iter().map(|(id, _)| *id).collect::<Vec<_>>()
                ));
            };
            if !seen.insert(id) {
                return invalid(format!("device assignment uses device {id} twice"));
            }
            any_addressable |= addressable;
        }
        if !any_addressable {
            return invalid(format!("no device in the assignment is addressable from {whose}"));
        }
        Ok(assignment)
    }
}
