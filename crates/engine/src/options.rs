//! How an [`Engine`](crate::Engine) is built: dtypes, mesh, sharding and the weights' form
//! ([`EngineOptions`]), checked against the hooks before anything is loaded.

use std::collections::HashMap;

use siphon_mesh::{HostView, Mesh, PartitionSpec};
use siphon_models::sharding::megatron_specs;
use siphon_models::{DType, DictionaryHook, HookPoint, NextToken, Steering};

use crate::error::EngineError;

/// How weights are split over the mesh.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ShardingPlan {
    /// Every weight replicated; inputs split by batch over `data` when the mesh has it.
    Replicated,
    /// The fixed Megatron-style plan of `siphon_models::sharding::megatron_specs`.
    Megatron,
    /// Explicit specs per HF weight name (missing names replicated) and for the inputs.
    Explicit {
        /// Weight specs by name.
        params: HashMap<String, PartitionSpec>,
        /// Spec of the `[batch, seq]` inputs.
        input: Option<PartitionSpec>,
    },
}

/// Dtypes, mesh and sharding of an [`Engine`](crate::Engine).
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Weights and compute (`F32` or `Bf16`).
    pub compute_dtype: DType,
    /// Returned activations.
    pub output_dtype: DType,
    /// Devices; [`Mesh::single_device`] by default.
    pub mesh: Mesh,
    /// How weights and inputs are split over `mesh`.
    pub plan: ShardingPlan,
    /// A mixture's rows per expert in each dispatch round; `None` chooses from the mean
    /// load (`siphon_models::forward::ForwardSpec::expert_capacity`).
    pub expert_capacity: Option<usize>,
    /// How quantized weights reach the devices.
    pub weights: WeightForm,
    /// Whether programs may call siphon's CPU kernels where the client has them
    /// (`siphon_runtime::Client::cpu_kernels`); off, XLA's ops compute the same values.
    pub cpu_kernels: bool,
    /// Whether a mixture's experts on one device run as grouped products on the CPU plugin
    /// too (`siphon_kernels::grouped`'s plain loop: the CUDA form's program, checked on the
    /// CPU). A CUDA client whose plugin took siphon's CUDA kernels
    /// (`siphon_runtime::Client::cuda_kernels`) always runs them so, on cuBLAS.
    pub grouped_experts: bool,
    /// The forms a TPU program takes — a mixture's experts as XLA's `chlo.ragged_dot` (on
    /// the CPU plugin, which has no `ragged-dot`, its values by ordinary ops:
    /// `siphon_models::RaggedDot::Masked`) and FP8 weights kept stored decoded by conversion
    /// — on any client (`Some(true)`: how they are checked on the CPU), on none
    /// (`Some(false)`: a TPU program as the other clients' are, to compare), or on TPU
    /// clients only (`None`, the default).
    pub tpu_forms: Option<bool>,
    /// Whether the rows this engine runs are right-padded (real tokens first, as the
    /// extraction packs them): on a CUDA client, each block whose attention cuDNN's fused
    /// kernel takes then calls it (`siphon_models::cudnn`). Off (the default; left-padded rows,
    /// as `siphon forward` gives), XLA's form everywhere.
    pub right_padded: bool,
    /// Sparse dictionaries whose latents every run computes on the devices, each from the hook
    /// it reads (`siphon_models::DictionaryHook`), returned in [`Activations::latents`](crate::Activations::latents).
    pub dictionaries: Vec<DictionaryHook>,
    /// The model's next-token outputs every run computes on the devices from its logits
    /// (`siphon_models::NextToken`), returned in `Activations::next_token`; each token's next
    /// token is `Batch::next_ids`.
    pub next_token: Option<NextToken>,
    /// Steering vectors every run adds to their hooks (`siphon_models::Steering`), uploaded
    /// once, replicated.
    pub steering: Vec<Steering>,
    /// The processes whose partitions of `mesh` this engine runs. Empty: the whole mesh, in
    /// this process. In a job whose mesh spans processes, this process's [`HostView`]: it
    /// uploads only its partitions' weights, feeds only its data groups' rows and reads back
    /// only its partitions. Several views: the per-process paths of each, side by side in
    /// one process that holds every device (how a spanning job is verified without the
    /// hosts); [`Engine::run_processes`](crate::Engine::run_processes) takes and gives one batch per view.
    pub processes: Vec<HostView>,
    /// When given, the engine's program is a decoding step over caches of these positions a
    /// row, taking at most `chunk` new tokens a step (`siphon_models::decode`), run by a
    /// [`crate::Decoder`]: no hooks, dictionaries or next-token outputs.
    pub decode: Option<siphon_models::DecodeStep>,
    /// How a decoding step chooses each row's next token: greedy (the default), or drawn at
    /// a uniform each row's step is given — on the devices (`siphon_models::sample`), or by the
    /// host on the CPU plugin (`crate::Decoder::draws_on_devices`).
    pub sampling: siphon_models::Sampling,
    /// Whether a row may hold several documents, each attending only its own tokens
    /// (`siphon_models::ForwardSpec::isolated`): the batches' position ids restart at each
    /// document (`Batch::with_position_ids`).
    pub isolated: bool,
}

/// How a checkpoint's quantized weights reach the devices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WeightForm {
    /// Dequantized on the host to the compute dtype (every weight one array).
    #[default]
    Dequantized,
    /// Kept as stored where siphon has the form ([`siphon_models::StoredForm`]: FP8 blocks,
    /// MXFP4, GGUF Q8_0/Q4_0/Q4_1/Q4_K/Q6_K) and dequantized inside the program; others as
    /// [`WeightForm::Dequantized`].
    Stored,
}

impl std::str::FromStr for WeightForm {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<WeightForm, EngineError> {
        match s {
            "dequantized" => Ok(WeightForm::Dequantized),
            "stored" => Ok(WeightForm::Stored),
            other => Err(EngineError::Options(format!("weights {other:?} (dequantized or stored)"))),
        }
    }
}

impl ShardingPlan {
    /// Each weight's spec by name and the inputs' spec, for `config` on `mesh`.
    pub fn specs(
        &self,
        config: &siphon_models::ModelConfig,
        mesh: &Mesh,
    ) -> (HashMap<String, PartitionSpec>, Option<PartitionSpec>) {
        match self {
            ShardingPlan::Replicated => {
                let data: &[&str] = if mesh.axis_size("data").is_some() { &["data"] } else { &[] };
                (HashMap::new(), Some(PartitionSpec::new(&[data, &[]])))
            }
            ShardingPlan::Megatron => {
                let (p, i) = megatron_specs(config, mesh);
                (p, Some(i))
            }
            ShardingPlan::Explicit { params, input } => (params.clone(), input.clone()),
        }
    }
}

impl Default for EngineOptions {
    fn default() -> EngineOptions {
        EngineOptions {
            compute_dtype: DType::F32,
            output_dtype: DType::F32,
            mesh: Mesh::single_device(),
            plan: ShardingPlan::Megatron,
            expert_capacity: None,
            weights: WeightForm::Dequantized,
            cpu_kernels: true,
            grouped_experts: false,
            tpu_forms: None,
            right_padded: false,
            dictionaries: Vec::new(),
            next_token: None,
            steering: Vec::new(),
            processes: Vec::new(),
            decode: None,
            sampling: siphon_models::Sampling::default(),
            isolated: false,
        }
    }
}

/// What no engine program takes: no hooks (nor dictionaries, nor next-token outputs), or f16
/// compute.
pub(crate) fn check(hooks: &[HookPoint], options: &EngineOptions) -> Result<(), EngineError> {
    if options.decode.is_some() {
        if !hooks.is_empty() || !options.dictionaries.is_empty() || options.next_token.is_some() {
            return Err(EngineError::Options(
                "a decoding engine returns logits only: no hooks, dictionaries or next-token outputs".into(),
            ));
        }
        options.sampling.check().map_err(EngineError::Options)?;
    } else if hooks.is_empty() && options.dictionaries.is_empty() && options.next_token.is_none() {
        return Err(EngineError::Options("no hooks requested".into()));
    }
    if options.compute_dtype == DType::F16 {
        return Err(EngineError::Options("compute dtype f16 is not supported (use f32 or bf16)".into()));
    }
    Ok(())
}
