//! What went wrong planning a mesh and its shardings: [`PlanError`].

use crate::shape::MeshShape;

/// What went wrong planning a mesh and its shardings.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum PlanError {
    /// The device topology itself is unusable (no devices, hosts of different sizes).
    #[error("invalid device topology: {0}")]
    Topology(String),
    /// The requested mesh shape cannot be built on this topology for this model.
    #[error("{}", invalid_mesh_text(.requested, .reason, .valid))]
    InvalidMesh {
        /// What was asked for, e.g. `2d with --model-parallel 16`.
        requested: String,
        /// Why it is impossible.
        reason: String,
        /// Every shape that would work on this topology for this model.
        valid: Vec<MeshShape>,
    },
    /// The global batch cannot be split evenly over the `data` axis.
    #[error(
        "batch {batch} is not divisible by the data axis ({data} ways, mesh {mesh}); \
         use a batch that is a multiple of {data}"
    )]
    BatchNotDivisible {
        /// The requested global batch.
        batch: usize,
        /// Size of the data axis.
        data: usize,
        /// The mesh, as text.
        mesh: String,
    },
    /// A request value is out of range (zero batch, headroom outside [0, 1), ...).
    #[error("invalid plan request: {0}")]
    Request(String),
    /// `auto` needs to know the device memory to choose a shape.
    #[error("--mesh auto chooses the smallest sharding that fits, so it needs the device memory (--device-memory GiB)")]
    AutoNeedsMemory,
    /// The plan needs more memory per device than the budget allows.
    #[error("{0}")]
    DoesNotFit(String),
    /// A term of the plan is past what the planner, XLA and the host buffers can count.
    #[error(
        "{what} would take {bytes:.3e} bytes, past the 4 PiB (2^52 bytes) siphon counts: far past any device's \
         or host's memory, and near the integer sizes XLA and the host buffers use; choose a smaller batch, \
         sequence or model"
    )]
    Uncountable {
        /// The term, e.g. `the attention scores of a step of batch 4 × seq 1000000000`.
        what: String,
        /// Its size at 8 bytes a value.
        bytes: f64,
        /// Whether it grows with the step's batch and sequence (else: the model's own).
        per_step: bool,
    },
    /// The sequence is longer than the model's context.
    #[error(
        "a sequence of {seq} tokens is longer than the model's context (max_position_embeddings {limit}): positions \
         past it were never trained; use at most {limit} tokens, or allow it explicitly (--allow-long-context)"
    )]
    LongContext {
        /// The requested sequence length.
        seq: usize,
        /// The model's `max_position_embeddings`.
        limit: usize,
    },
    /// Building the mesh or applying a spec failed (a bug in the planner's own arithmetic).
    #[error(transparent)]
    Mesh(#[from] siphon_mesh::MeshError),
}

fn invalid_mesh_text(requested: &str, reason: &str, valid: &[MeshShape]) -> String {
    // Thousands of devices have hundreds of shapes; the first ones (smallest weight-sharding
    // groups) are the useful ones.
    const SHOWN: usize = 40;
    let mut list: Vec<String> = valid.iter().take(SHOWN).map(|s| s.to_string()).collect();
    if valid.len() > SHOWN {
        list.push(format!("… and {} more", valid.len() - SHOWN));
    }
    if list.is_empty() {
        format!("mesh {requested} is impossible: {reason}; no mesh shape is valid on these devices")
    } else {
        format!("mesh {requested} is impossible: {reason}; valid shapes (data×fsdp×model): {}", list.join(", "))
    }
}
