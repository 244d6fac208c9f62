//! What went wrong loading or running a model: [`EngineError`].

/// What went wrong loading or running a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// Reading the checkpoint or building the forward failed.
    #[error(transparent)]
    Model(#[from] siphon_models::ModelError),
    /// PJRT failed (upload, compile, execute, download).
    #[error("{context}: {source}")]
    Runtime {
        /// What the engine was doing.
        context: String,
        /// The runtime's error (boxed: it is large, and every `Result` of the engine carries
        /// its size).
        source: Box<siphon_runtime::Error>,
    },
    /// A partition spec does not fit a tensor on the mesh.
    #[error("{context}: {source}")]
    Mesh {
        /// Which tensor.
        context: String,
        /// The mesh crate's error.
        source: siphon_mesh::MeshError,
    },
    /// The batch is malformed (ragged rows, mask of the wrong size, ...).
    #[error("invalid batch: {0}")]
    Batch(String),
    /// Options that cannot work together.
    #[error("invalid engine options: {0}")]
    Options(String),
}

pub(crate) fn rt<T>(context: impl FnOnce() -> String, r: siphon_runtime::Result<T>) -> Result<T, EngineError> {
    r.map_err(|source| EngineError::Runtime { context: context(), source: Box::new(source) })
}
