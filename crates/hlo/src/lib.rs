//! A typed builder that emits StableHLO text with Shardy sharding annotations.
//!
//! siphon builds every XLA program it runs from Rust: a model's forward pass is a single
//! function whose arguments are weights and token ids and whose results are the requested
//! activations. This crate is that function's builder. A [`Builder`] hands out [`Value`]
//! handles (a `Copy` id; the builder knows each value's [`TensorType`]); every op checks
//! shapes and dtypes in Rust and returns an [`HloError`] on a mismatch, so a program that
//! reaches XLA is well-typed and XLA's own verifier never has to explain a shape bug.
//! [`Builder::finish`] returns the module as StableHLO text in MLIR's pretty form, which
//! the PJRT `mlir` program format accepts.
//!
//! Sharding uses Shardy: a builder made with [`Builder::with_mesh`] emits an `sdy.mesh`
//! from a [`siphon_mesh::Mesh`], `#sdy.sharding` attributes on arguments and results from
//! [`PartitionSpec`]s, and [`Builder::sharding_constraint`] inside the body. XLA's SPMD
//! partitioner then inserts the collectives.
//!
//! Architecture invariant: the builder does no I/O and never links PJRT; it produces text.
//! Whether that text compiles is checked by tests that dev-depend on `siphon-runtime`.
//!
//! ```
//! use siphon_hlo::{Builder, DType, TensorType};
//! use siphon_mesh::{Mesh, PartitionSpec};
//!
//! let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
//! let mut b = Builder::with_mesh("main", mesh);
//! let x = b.arg(TensorType::new(DType::F32, &[8, 16]), Some(PartitionSpec::new(&[&["data"], &[]]))).unwrap();
//! let w = b.arg(TensorType::new(DType::F32, &[16, 32]), Some(PartitionSpec::new(&[&[], &["model"]]))).unwrap();
//! let y = b.matmul(x, w).unwrap();
//! let y = b.logistic(y).unwrap();
//! assert_eq!(b.ty(y).unwrap().dims(), &[8, 32]);
//! let text = b.finish_sharded(&[(y, Some(PartitionSpec::new(&[&["data"], &["model"]])))]).unwrap();
//! assert!(text.contains("sdy.mesh @mesh = <[\"data\"=2, \"model\"=4]>"));
//! assert!(text.contains("stablehlo.dot_general"));
//! // A shape mismatch is an error, not a panic.
//! let mut b = Builder::new("bad");
//! let a = b.arg(TensorType::new(DType::F32, &[2, 3]), None).unwrap();
//! assert!(b.matmul(a, a).is_err());
//! ```
#![deny(missing_docs)]

mod builder;
mod types;

pub use builder::{Builder, CompareDir, DotDims, Value};
pub use siphon_mesh::{Mesh, PartitionSpec};
pub use types::{DType, TensorType, e4m3fn_bits};

/// What went wrong building a program. Every variant names the op and the offending
/// shapes or dtypes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HloError {
    /// Operand shapes do not fit the op.
    #[error("{op}: {detail}")]
    Shape {
        /// The op being built.
        op: &'static str,
        /// What does not fit, with the shapes.
        detail: String,
    },
    /// Operand dtypes do not fit the op.
    #[error("{op}: {detail}")]
    DType {
        /// The op being built.
        op: &'static str,
        /// What does not fit, with the dtypes.
        detail: String,
    },
    /// A value from another builder (or one that does not exist) was passed in.
    #[error("{op}: value %{id} does not belong to this builder")]
    ForeignValue {
        /// The op being built.
        op: &'static str,
        /// The value's id.
        id: usize,
    },
    /// A value defined outside a loop's region was used in it, or one defined in a
    /// finished region was used after it.
    #[error("{op}: value %{id} is out of scope here (carry it in the loop state)")]
    OutOfScope {
        /// The op being built.
        op: &'static str,
        /// The value's id.
        id: usize,
    },
    /// A partition spec does not fit the mesh or the tensor.
    #[error("sharding of {what}: {source}")]
    Sharding {
        /// Which argument, result or constraint.
        what: String,
        /// The mesh crate's explanation.
        source: siphon_mesh::MeshError,
    },
    /// A sharding was given to a builder without a mesh.
    #[error("sharding of {0} given, but the builder has no mesh (use Builder::with_mesh)")]
    NoMesh(String),
    /// A function must return at least one value.
    #[error("function @{0} returns nothing")]
    NoResults(String),
    /// A constant's data does not match its type.
    #[error("constant: {0}")]
    Constant(String),
}

/// Result alias for builder operations.
pub type Result<T, E = HloError> = std::result::Result<T, E>;
