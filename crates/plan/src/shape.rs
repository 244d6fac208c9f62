//! A mesh's shape: the sizes of its three axes ([`MeshShape`]; what it means for devices and
//! weights is `mesh`'s).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Sizes of the three axes; their product is the device count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MeshShape {
    /// Batch-splitting axis.
    pub data: usize,
    /// Weight-sharding axis on the hidden dimension.
    pub fsdp: usize,
    /// Tensor-parallel axis (whole heads, intermediate).
    pub model: usize,
}

impl fmt::Display for MeshShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}×{}×{}", self.data, self.fsdp, self.model)
    }
}
