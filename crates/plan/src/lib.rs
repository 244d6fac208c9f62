//! Mesh and sharding planner: chooses a mesh shape over the hosts' devices, a partition spec
//! for every weight tensor, and predicts per-device memory — all before any plugin is loaded.
//!
//! The planner is pure: it reads a validated [`siphon_models::ModelConfig`], a device
//! [`Topology`] (hosts × local devices, as PJRT reports them) and a [`PlanRequest`], and
//! returns a [`Plan`] or a [`PlanError`] naming what is wrong. It does no I/O and never links
//! PJRT, so `siphon plan` and the extraction command's pre-flight check run the exact same
//! code in milliseconds, before weights are read or devices touched.
//!
//! Seven pieces, one module each:
//! - [`bounds`]: what can be counted at all (every term of a plan sized before the exact
//!   counts, which then cannot overflow) and the model's context limit.
//! - [`mesh`]: the mesh kinds (`1d`, `2d`, `3d`, `auto`), the axes `data` × `fsdp` × `model`
//!   and the device order that keeps `fsdp`/`model` groups inside a host; impossible shapes
//!   are errors that list the valid ones.
//! - [`rules`]: the partition spec of each parameter class (Megatron-style on `model`, the
//!   other weight dimension on `fsdp`), with divisibility checks and a logged fallback to
//!   replication of a dimension that does not divide.
//! - [`memory`]: per-device bytes of weights (sharded and gathered), activations of a batch,
//!   and whether that fits a device's memory with headroom.
//! - [`flops`]: the forward's analytic operations per token, to hold a compiler's count against.
//! - [`gpu`]: GPU nodes by the names users rent them by (`h100x8`): the device the CUDA
//!   plugin's description names, GPUs per node, a GPU's memory and peaks, for compiling for
//!   them on any machine (`siphon plan --target gpu:…`).
//! - [`tpu`]: TPU slices by their Cloud TPU names (`v5litepod-64`, `v5p-128`): libtpu's
//!   topology for each, hosts × chips, and a chip's memory and peaks, for planning a slice
//!   and compiling for it on any machine (`siphon plan --target tpu:…`).
//!
//! ```
//! use siphon_models::HfConfig;
//! use siphon_plan::{plan, MeshKind, PlanRequest, Topology};
//! let config = HfConfig::from_json(r#"{"model_type": "llama", "vocab_size": 32000,
//!     "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
//!     "num_attention_heads": 8, "num_key_value_heads": 4}"#).unwrap().into_config().unwrap();
//! let topology = Topology::uniform(2, 4).unwrap();
//! let mut request = PlanRequest::default();
//! request.mesh.kind = MeshKind::TwoD;
//! request.batch = Some(8);
//! let plan = plan(&config, &topology, &request).unwrap();
//! assert_eq!(plan.mesh.to_string(), "[data=2, model=4]");
//! // A batch the data axis cannot split is refused before anything expensive happens.
//! request.batch = Some(3);
//! assert!(siphon_plan::plan(&config, &topology, &request).is_err());
//! ```
#![deny(missing_docs)]

pub mod bounds;
mod error;
pub mod flops;
pub mod gpu;
pub mod memory;
pub mod mesh;
mod planner;
pub mod rules;
mod shape;
pub mod tpu;

pub use bounds::check_context;
pub use error::PlanError;
pub use flops::{decode_flops_per_token, forward_flops_per_token};
pub use gpu::{GpuModel, GpuTarget};
pub use memory::{
    ActivationMemory, DType, DeviceLayout, DictionaryMemory, DictionaryShape, HostMemory, MemoryEstimate, WeightMemory,
};
pub use mesh::{DeviceInfo, MeshKind, MeshRequest, Topology};
pub use planner::{ClassPlan, Fallback, Plan, PlanRequest, Suggestion, cuda_attention, every_hidden_state, plan};
pub use rules::{TensorSharding, input_spec, param_spec};
pub use shape::MeshShape;
pub use tpu::{TpuGeneration, TpuSlice};
