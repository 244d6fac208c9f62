//! Control plane: the gRPC coordination service, its client, worker identity and config broadcast.

pub mod error;
mod state;

/// Generated protobuf messages and gRPC stubs of `proto/coord.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("siphon.coord.v1");
}

pub use error::{CoordError, ErrorCode, Result};
pub mod broadcast {
    //! tmp
    /// tmp
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct FieldDiff { pub path: String }
    impl std::fmt::Display for FieldDiff { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{}", self.path) } }
}
