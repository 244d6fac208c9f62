//! Softmax attention through cuDNN's fused flash attention (`__cudnn$fmhaSoftmax`, a library
//! call of XLA's CUDA backend) where a block can take it, XLA's ops elsewhere; which form each
//! block takes is recorded in the program ([`crate::forward::ForwardProgram::attention`]).
//!
//! The call, as JAX's `jax/_src/cudnn/fused_attention_stablehlo.py` builds it for inference:
//! q `[B, T, N, H]`, k and v `[B, S, KV, H]` (BTNH; GQA with fewer KV heads), then the per-row
//! lengths `q_seqlen` and `kv_seqlen` (i32 `[B]`) of mask type `PADDING_CAUSAL` — keys valid
//! from a row's first token, so right-padded rows only —; results the output `[B, N, T, H]` in
//! the layout of `[B, T, N, H]` (`minor_to_major` 3, 1, 2, 0) and an empty u8 workspace.
//! Every query row is given (`q_seqlen` = T): a padding position attends the real keys before
//! it, as XLA's form and Hugging Face's mask have it, rather than being left undefined.
//! A window `w` (query i sees key j when i − j < w) is cuDNN's `sliding_window_length` w.
//! On a mesh the call runs on each device's part (an `sdy.manual_computation`: its rows of
//! the batch, its heads where `model` splits them), as XLA's form would be split; the call
//! itself has no sharding rule. Each call is named `blocks.N.attn`, so that a compiled
//! program says which block's call it kept. Compiled for an H100 by XLA's CUDA plugin, cuDNN
//! building each graph (`crates/plan/tests/cuda_compile.rs`); run on no GPU yet.

use serde_json::json;
use siphon_hlo::{Builder, DType, HloError, TensorType, Value};
use siphon_mesh::PartitionSpec;

use crate::contract::AttentionForm;
use crate::error::ModelError;
use crate::forward::Graph;
use crate::hooks::{HookKind, HookPoint};
use crate::sharding::MODEL;

/// The library call's target.
pub const TARGET: &str = "__cudnn$fmhaSoftmax";

/// The op name block `layer`'s call carries (`loc("blocks.N.attn")`).
fn call_name(layer: usize) -> String {
    format!("blocks.{layer}.attn")
}

/// The block whose call a compiled instruction's op name names: XLA keeps the call's name as
/// its `op_name`, prefixed on a mesh by the computation that holds it (`call.2/blocks.0.attn`).
pub fn call_block(op_name: &str) -> Option<usize> {
    op_name.rsplit('/').next()?.strip_prefix("blocks.")?.strip_suffix(".attn")?.parse().ok()
}

pub use crate::contract::attention_summary as summary;

impl Graph<'_> {
    /// Which form block `layer`'s attention takes, with values `hv` wide per head, when
    /// `sinks` a sink logit per head, and (`causal`) the block's own causal mask or another.
    pub(crate) fn attention_form(&self, layer: usize, hv: usize, sinks: bool, causal: bool) -> AttentionForm {
        let c = self.config;
        let hd = c.head_dim_at(layer);
        let at = |kind| HookPoint::block(layer, kind);
        let model = self.spec.mesh.axis_size(MODEL).unwrap_or(1);
        let why = if !self.spec.cudnn_attention {
            "not a CUDA program of right-padded rows".to_string()
        } else if self.sharded() && !self.input_spec().dims()[1].is_empty() {
            "a sequence split over the mesh".into()
        } else if !(c.attention.n_heads.is_multiple_of(model) && c.kv_heads_at(layer).is_multiple_of(model)) {
            format!("{} heads and {} KV heads over model = {model}", c.attention.n_heads, c.kv_heads_at(layer))
        } else if self.dt != DType::BF16 {
            format!("{} compute (cuDNN takes bf16)", self.dt)
        } else if hd > 128 || !hd.is_multiple_of(8) {
            format!("head dim {hd} (cuDNN: at most 128, a multiple of 8)")
        } else if hv != hd {
            format!("values {hv} wide, keys {hd}")
        } else if c.attention.softcap.is_some() {
            "soft-capped scores".into()
        } else if sinks {
            "attention sinks".into()
        } else if !causal {
            "a mask other than the block's causal one".into()
        } else if self.wants(at(HookKind::AttnScores)) || self.wants(at(HookKind::AttnPattern)) {
            "its scores or pattern are hooked".into()
        } else {
            return AttentionForm::Cudnn;
        };
        AttentionForm::Xla(why)
    }

    /// Block `layer`'s attention through cuDNN: `q` `[tokens, n_heads*head_dim]` (RoPE
    /// applied), `k` and `v` `[tokens, n_kv_heads*head_dim]`; returns z,
    /// `[tokens, n_heads*head_dim]`, as [`Graph::attention`] does.
    pub(crate) fn cudnn_attention(&mut self, layer: usize, q: Value, k: Value, v: Value) -> Result<Value, ModelError> {
        let c = self.config;
        let (bsz, s, n, nkv, hd) =
            (self.spec.batch, self.spec.seq, c.attention.n_heads, c.kv_heads_at(layer), c.head_dim_at(layer));
        let lengths = self.row_lengths()?;
        let (sharded, mesh) = (self.sharded(), self.spec.mesh.clone());
        let rows: Vec<String> = self.input_spec().dims()[0].clone();
        let b = &mut self.b;
        let q = b.reshape(q, &[bsz, s, n, hd])?;
        let k = b.reshape(k, &[bsz, s, nkv, hd])?;
        let v = b.reshape(v, &[bsz, s, nkv, hd])?;
        let scale = c.attention.scalar.unwrap_or(hd as f64).powf(-0.5);
        let window = c.window(layer).filter(|&w| w < s).unwrap_or(0);
        let name = call_name(layer);
        let out = if sharded {
            // Each device its rows and, over `model`, its heads (the KV heads split alike, so
            // that each query head's KV head is on its device).
            let rows: Vec<&str> = rows.iter().map(String::as_str).collect();
            let heads: &[&str] = if mesh.axis_size(MODEL).unwrap_or(1) > 1 { &[MODEL] } else { &[] };
            let split = PartitionSpec::new(&[&rows, &[], heads, &[]]);
            let specs = [split.clone(), split.clone(), split.clone(), PartitionSpec::new(&[&rows])];
            b.manual_computation(&[q, k, v, lengths], &specs, &[split], |b, p| {
                let [local_b, _, local_n, _] = b.dims(p[0])?.try_into().expect("q is [B, S, N, H]");
                let dims = [local_b, s, local_n, hd];
                Ok(vec![fused(b, [p[0], p[1], p[2]], p[3], dims, scale, window, Some(&name))?])
            })?[0]
        } else {
            fused(b, [q, k, v], lengths, [bsz, s, n, hd], scale, window, Some(&name))?
        };
        Ok(b.reshape(out, &[bsz * s, n * hd])?)
    }

    /// Each row's real tokens, i32 `[batch]`: the per-row lengths of right-padded rows (built
    /// once).
    fn row_lengths(&mut self) -> Result<Value, ModelError> {
        if let Some(lengths) = self.row_lengths {
            return Ok(lengths);
        }
        let (bsz, s) = (self.spec.batch, self.spec.seq);
        let b = &mut self.b;
        let zero = b.splat(0.0, TensorType::new(DType::I32, &[bsz, s]))?;
        let real = b.compare(siphon_hlo::CompareDir::Ne, self.attention_mask, zero)?;
        let real = b.convert(real, DType::I32)?;
        let lengths = b.reduce_sum(real, &[1])?;
        self.row_lengths = Some(lengths);
        Ok(lengths)
    }
}

/// cuDNN's causal attention over `q` `[B, S, N, H]` and `k`, `v` `[B, S, KV, H]` (bf16) of
/// right-padded rows of `lengths` `[B]` (i32) real tokens, every query row given: `[B, S, N, H]`.
fn fused(
    b: &mut Builder,
    [q, k, v]: [Value; 3],
    lengths: Value,
    [bsz, s, n, hd]: [usize; 4],
    scale: f64,
    window: usize,
    name: Option<&str>,
) -> Result<Value, HloError> {
    let every_query = b.splat(s as f64, TensorType::new(DType::I32, &[bsz]))?;
    let config = backend_config(bsz, n, s, scale, window);
    let results = [TensorType::new(DType::BF16, &[bsz, n, s, hd]), TensorType::new(DType::U8, &[0])];
    let out = b.library_call(
        TARGET,
        &[q, k, v, every_query, lengths],
        &results,
        &config,
        &[vec![3, 1, 2, 0], vec![0]],
        name,
    )?;
    b.transpose(out[0], &[0, 2, 1, 3])
}

/// cuDNN's causal attention alone as a whole program, for timing it against other kernels
/// (`scripts/bench/bench_attention.py`): arguments q `[batch, seq, heads, head_dim]`, k and v
/// `[batch, seq, kv_heads, head_dim]` (bf16) and each row's real tokens `[batch]` (i32);
/// result `[batch, seq, heads, head_dim]`.
pub fn program(batch: usize, seq: usize, heads: usize, kv_heads: usize, head_dim: usize) -> Result<String, HloError> {
    let mut b = Builder::new("cudnn_attention");
    let bf16 = |h: usize| TensorType::new(DType::BF16, &[batch, seq, h, head_dim]);
    let q = b.arg(bf16(heads), None)?;
    let k = b.arg(bf16(kv_heads), None)?;
    let v = b.arg(bf16(kv_heads), None)?;
    let lengths = b.arg(TensorType::new(DType::I32, &[batch]), None)?;
    let dims = [batch, seq, heads, head_dim];
    let out = fused(&mut b, [q, k, v], lengths, dims, (head_dim as f64).powf(-0.5), 0, None)?;
    b.finish(&[out])
}

/// The call's backend config: JAX's fields for a forward pass without dropout or bias.
fn backend_config(batch: usize, heads: usize, seq: usize, scale: f64, window: usize) -> String {
    let strings = |v: &[usize]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
    let dims = |lc: usize, rc: usize, lb: &[usize], rb: &[usize]| {
        json!({
            "lhs_contracting_dimensions": strings(&[lc]),
            "rhs_contracting_dimensions": strings(&[rc]),
            "lhs_batch_dimensions": strings(lb),
            "rhs_batch_dimensions": strings(rb),
        })
    };
    json!({
        "operation_queue_id": "0",
        "cudnn_fmha_backend_config": {
            "algorithm": {
                "algo_id": "0",
                "math_type": "TENSOR_OP_MATH",
                "tuning_knobs": {"17": "1", "24": "0"},
                "is_cudnn_frontend": true,
                "workspace_size": "0",
            },
            "fmha_scale": scale,
            "intermediate_tensor_shape": {
                "element_type": "BF16",
                "dimensions": strings(&[batch, heads, seq, seq]),
                "tuple_shapes": [],
                "layout": {
                    "dim_level_types": [],
                    "dim_unique": [],
                    "dim_ordered": [],
                    "minor_to_major": ["3", "2", "1", "0"],
                    "tiles": [],
                    "element_size_in_bits": "0",
                    "memory_space": "0",
                    "index_primitive_type": "PRIMITIVE_TYPE_INVALID",
                    "pointer_primitive_type": "PRIMITIVE_TYPE_INVALID",
                    "dynamic_shape_metadata_prefix_bytes": "0",
                },
                "is_dynamic_dimension": [false, false, false, false],
            },
            "is_flash_attention": true,
            "mask_type": "PADDING_CAUSAL",
            // BTNH: q·k over H with (B, N) batched; probabilities·v over S.
            "bmm1_dot_dimension_numbers": dims(3, 3, &[0, 2], &[0, 2]),
            "bmm2_dot_dimension_numbers": dims(3, 1, &[0, 1], &[0, 2]),
            "dropout_rate": 0.0,
            "seed": 42,
            "sliding_window_length": window,
            "max_seg_per_batch": 1,
            "is_paged_attention": false,
        },
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_calls_block_is_read_from_its_op_name() {
        for (op_name, block) in [
            ("blocks.3.attn", Some(3)),
            ("call.2/blocks.11.attn", Some(11)),
            ("blocks.3.attn.x", None),
            ("blocks.x.attn", None),
            ("", None),
        ] {
            assert_eq!(super::call_block(op_name), block, "{op_name:?}");
        }
        assert_eq!(super::call_block(&super::call_name(7)), Some(7));
    }
}
