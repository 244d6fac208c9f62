//! Flag groups several commands flatten in (`#[command(flatten)]`): a job's identity and
//! coordinator, a corpus and its packing, sparse dictionaries, the model's next-token outputs
//! (`outputs`), steering vectors (`steer`); the bounds every count, size
//! and duration flag is checked against before work starts (`limits`), and how a file a flag
//! names is read (`files`: a regular file of a bounded size). The commands (`cmd/`) and the
//! job (`job/`) both read them; neither reaches into the other for them.

pub mod cluster;
pub mod corpus;
pub mod files;
pub mod limits;
pub mod outputs;
pub mod sae;
pub mod steer;

pub use cluster::ClusterArgs;
pub use corpus::CorpusArgs;
pub use sae::SaeArgs;
