//! What went wrong reading or building a model: [`ModelError`].

/// What went wrong reading or building a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// A config file is missing a field or holds inconsistent values.
    #[error("invalid model config: {0}")]
    Config(String),
    /// The architecture, activation or RoPE variant is not one siphon builds.
    #[error("unsupported model: {0}")]
    UnsupportedArch(String),
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file is truncated or does not follow its format.
    #[error("{}: {detail}", path.display())]
    Corrupt {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong, with offsets where they help.
        detail: String,
    },
    /// The forward needs a tensor the checkpoint does not have.
    #[error("tensor {name:?} is missing from {source_desc}")]
    MissingTensor {
        /// Hugging Face tensor name.
        name: String,
        /// The file or index searched.
        source_desc: String,
    },
    /// A tensor's stored shape differs from what the config implies.
    #[error("tensor {name:?} in {source_desc} has shape {found:?}, the config implies {expected:?}")]
    ShapeMismatch {
        /// Hugging Face tensor name.
        name: String,
        /// Shape implied by the config.
        expected: Vec<usize>,
        /// Shape in the file.
        found: Vec<usize>,
        /// The file or index.
        source_desc: String,
    },
    /// A tensor holds a value that is not finite (NaN or infinity), or a scale that makes
    /// one: every activation it reaches would carry it.
    #[error("tensor {name:?} in {}: {detail}", path.display())]
    NonFinite {
        /// Hugging Face tensor name (or the stored tensor's, for a scale).
        name: String,
        /// The file it is stored in.
        path: std::path::PathBuf,
        /// Which value, and what it is.
        detail: String,
    },
    /// A tensor encoding (dtype or GGUF quantization) siphon cannot read.
    #[error("unsupported tensor encoding: {0}")]
    UnsupportedQuant(String),
    /// The tokenizer files could not be read or built.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A hook name is unknown, out of range or repeated.
    #[error("hook {0}")]
    Hook(String),
    /// A partition spec does not fit the model's weights, the inputs or the mesh.
    #[error("sharding: {0}")]
    Sharding(String),
    /// The forward graph could not be built (a shape or dtype bug caught before XLA).
    #[error("building the forward graph: {0}")]
    Graph(#[from] siphon_hlo::HloError),
}

impl ModelError {
    /// An I/O error on `path`.
    pub fn io(path: &std::path::Path, source: std::io::Error) -> ModelError {
        ModelError::Io { path: path.to_path_buf(), source }
    }
}
