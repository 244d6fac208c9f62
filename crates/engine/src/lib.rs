//! Runs a model's forward on a device mesh: weights sharded onto devices, batches in, hook
//! activations out.
//!
//! An [`Engine`] is built once per (model, hooks, mesh, dtypes): it builds the forward with
//! `siphon-models`, reads each weight the program needs from the memory-mapped checkpoint
//! (converted to the compute dtype on the way), splits it by the program's
//! [`PartitionSpec`](siphon_mesh::PartitionSpec) and uploads to each device only its shard. [`Engine::run`] then takes a
//! [`Batch`] of token ids and an attention mask, compiles the program for that
//! `(batch, seq)` shape the first time it is seen (cached after), runs it and copies the
//! requested activations back to the host as [`Activations`].
//!
//! Designed for the extraction loop: compile once per shape, upload weights once, run many
//! batches; everything here blocks (PJRT waits on its events) and is CPU-heavy, so call it
//! from a plain thread or `spawn_blocking`, never on an async executor's worker.
//!
//! Architecture invariants: the engine never computes logits (the forward stops after the
//! last block a hook needs); weights live on the devices once, shared by every compiled
//! shape; position ids are `cumsum(mask) - 1` clamped at 0 unless the caller gives them, so
//! left- and right-padded rows give the activations of the unpadded sequence.
//!
//! ```no_run
//! use siphon_engine::{Batch, Engine, EngineOptions};
//! use siphon_models::{HookKind, HookPoint, LoadedModel};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let plugin = siphon_runtime::Plugin::load(std::path::Path::new("libpjrt_cpu.so"))?;
//! let client = siphon_runtime::Client::new(&plugin, siphon_runtime::ClientOptions::new())?;
//! let model = LoadedModel::open(std::path::Path::new("fixtures/models/tiny-llama"))?;
//! let hooks = siphon_models::resolve_hooks("blocks.1.hook_resid_post", &model.config)?;
//! let engine = Engine::new(&client, &model, hooks, EngineOptions::default())?;
//! let batch = Batch::new(vec![vec![1, 2, 3]], None)?;
//! let acts = engine.run(&batch)?;
//! println!("{:?}", acts.get(siphon_models::HookPoint::block(1, HookKind::ResidPost)).unwrap().shape());
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

pub mod aot;
mod batch;
pub mod decode;
mod engine;
mod error;
mod launched;
mod options;

pub use batch::{Activations, Batch, next_in_row, positions_from_mask};
pub use decode::Decoder;
pub use engine::{Engine, LoadStats, draws_on_devices};
pub use error::EngineError;
pub use launched::Launched;
pub use options::{EngineOptions, ShardingPlan, WeightForm};
