//! The grouped dispatch: each projection of every expert in one grouped product over the
//! choices sorted by expert — siphon's grouped kernel (cuBLAS on a CUDA plugin) or XLA's
//! `chlo.ragged_dot` (TPU) — on one device ([`Routing::grouped`]) and on a mesh
//! ([`Graph::grouped_on_mesh`]).

use siphon_hlo::{Builder, CompareDir, DType, HloError, TensorType, Value};
use siphon_mesh::PartitionSpec;

use super::{Experts, Routing, in_range};
use crate::contract::RaggedDot;
use crate::error::ModelError;
use crate::forward::Graph;

impl Graph<'_> {
    /// [`Graph::routed`] as grouped products on a mesh: an `sdy.manual_computation` in which
    /// each device routes its own tokens (those of its part of the token split; all of them
    /// where tokens are not split) through its part of the experts, as the stacked weights
    /// lie: whole experts over the axes their expert dimension is split over (`model` in the
    /// default rule: expert parallelism), and its part of every expert's intermediate width
    /// over the axes that width is split over (`model` in the rule TPU programs take,
    /// [`crate::sharding::ExpertSplit::Width`]). Other splits (`fsdp` over the hidden
    /// dimension) are gathered as the device enters, and the devices that gather them share
    /// their tokens out. A choice of an expert another device holds is sorted after the
    /// device's own, in no group (the grouped product leaves its row unwritten, or 0), and
    /// masked; a width split gives each device a part of every row's down projection (the
    /// down bias added on the first part only). Each device's part of each token's sum comes
    /// out along a new first dimension split like the experts and their width, summed outside
    /// (the partitioner adds the parts across the devices). Exactly the routed rows are
    /// multiplied, each on the devices holding its expert.
    pub(super) fn grouped_on_mesh(
        &mut self,
        x: Value,
        experts: &Experts,
        chosen: Value,
        indices: Value,
        product: Product,
    ) -> Result<Value, ModelError> {
        let mesh = self.spec.mesh.clone();
        let e = self.b.dims(experts.weights[0])?[0];
        let gate_spec = self.weight_spec(experts.weights[0]).map(|s| s.dims().to_vec()).unwrap_or_default();
        let axes_of = |dim: usize| gate_spec.get(dim).cloned().unwrap_or_default();
        let (expert_axes, width_axes) = (axes_of(0), axes_of(1));
        let ways = |axes: &[String]| -> usize { axes.iter().map(|a| mesh.axis_size(a).unwrap_or(1)).product() };
        let (m, w) = (ways(&expert_axes), ways(&width_axes));
        // The devices that gather the weights' hidden dimension (`fsdp`) would otherwise
        // route the same tokens: they share them out instead.
        let mut token_axes = self.token_axes().to_vec();
        let gathered: Vec<String> = axes_of(2).into_iter().filter(|a| !token_axes.contains(a)).collect();
        let t = self.b.dims(x)?[0];
        if t.is_multiple_of(ways(&token_axes) * ways(&gathered)) {
            token_axes.extend(gathered);
        }
        let tokens: Vec<&str> = token_axes.iter().map(String::as_str).collect();
        let by_expert: Vec<&str> = expert_axes.iter().map(String::as_str).collect();
        let by_width: Vec<&str> = width_axes.iter().map(String::as_str).collect();
        let rows = PartitionSpec::new(&[&tokens, &[]]);
        let mut operands = vec![x, chosen, indices];
        let mut specs = vec![rows.clone(), rows.clone(), rows];
        // gate and up `[E, I, H]`, down `[E, H, I]`, their biases `[E, I]`, `[E, I]`, `[E, H]`:
        // the dimension each splits by width.
        let width_dims = [Some(1), Some(1), Some(2), Some(1), Some(1), None];
        for (i, v) in experts.all().into_iter().enumerate() {
            let rank = self.b.dims(v)?.len();
            let mut dims: Vec<&[&str]> = vec![&[]; rank];
            dims[0] = &by_expert;
            if let Some(d) = width_dims[i] {
                dims[d] = &by_width;
            }
            operands.push(v);
            specs.push(PartitionSpec::new(&dims));
        }
        let held = experts.all().len();
        // Each device's index along the experts' split and along the width's.
        for (parts, axes) in [(m, &by_expert), (w, &by_width)] {
            if parts > 1 {
                operands.push(self.b.iota(TensorType::new(DType::I32, &[parts]), 0)?);
                specs.push(PartitionSpec::new(&[axes]));
            }
        }
        let parts: Vec<&str> = by_expert.iter().chain(&by_width).copied().collect();
        let out_spec = match m * w {
            1 => PartitionSpec::new(&[&tokens, &[]]),
            _ => PartitionSpec::new(&[&parts, &tokens, &[]]),
        };
        let dt = self.dt;
        let out = self.b.manual_computation(&operands, &specs, &[out_spec], |b, v| {
            let (x, chosen, indices) = (v[0], v[1], v[2]);
            let mut own = experts.with(&v[3..3 + held]);
            let mut index = 3 + held;
            let mut next_index = |b: &mut Builder, parts: usize| -> Result<Option<Value>, HloError> {
                if parts == 1 {
                    return Ok(None);
                }
                index += 1;
                Ok(Some(b.reshape(v[index - 1], &[])?))
            };
            let (expert_index, width_index) = (next_index(b, m)?, next_index(b, w)?);
            if let (Some(first), Some(biases)) = (width_index, own.biases.as_mut()) {
                // Every width part adds its share of the down product; the bias once.
                let zero = b.scalar(0.0, DType::I32)?;
                let is_first = b.compare(CompareDir::Eq, first, zero)?;
                let dims = b.dims(biases[2])?.to_vec();
                let is_first = b.broadcast_in_dim(is_first, &dims, &[])?;
                let none = b.splat(0.0, b.ty(biases[2])?.clone())?;
                biases[2] = b.select(is_first, biases[2], none)?;
            }
            let e_local = e / m;
            let expert = b.convert(indices, DType::I32)?;
            let t = b.dims(expert)?[0];
            let (key, keep) = match expert_index {
                Some(index) => {
                    // The device's experts are `first .. first + e_local`; the others' key is
                    // `e_local`, sorted last.
                    let size = b.scalar(e_local as f64, DType::I32)?;
                    let first = b.mul(index, size)?;
                    let (local, keep, size) = in_range(b, expert, first, e_local)?;
                    (b.select(keep, local, size)?, Keep::Held(keep))
                }
                None => (expert, Keep::All),
            };
            let routing = Routing::new(b, e_local + usize::from(m > 1), chosen, key, 1)?;
            let y = routing.grouped(b, x, &own, dt, product, keep)?;
            let y = match m * w {
                1 => y,
                _ => {
                    let h = b.dims(y)?[1];
                    b.reshape(y, &[1, t, h])?
                }
            };
            Ok(vec![y])
        })?;
        Ok(match m * w {
            1 => out[0],
            _ => self.b.reduce_sum(out[0], &[0])?,
        })
    }
}

/// The call a grouped dispatch makes for each projection of every expert at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Product {
    /// siphon's grouped product (`siphon_kernels::grouped`): cuBLAS's grouped products on a
    /// CUDA plugin, a plain loop on the CPU plugin.
    Kernel,
    /// XLA's own `chlo.ragged_dot` (`jax.lax.ragged_dot`), which libtpu compiles with no
    /// loop, or its values by ordinary ops.
    Ragged(RaggedDot),
}

/// Which of a grouped dispatch's choices are of experts the device holds.
#[derive(Debug, Clone, Copy)]
pub(super) enum Keep {
    /// Every choice.
    All,
    /// Those marked (`[tokens, k]`); the routing's last expert stands for the others.
    Held(Value),
}

impl Routing {
    /// One device, as grouped products (`siphon_kernels::grouped`): the choices' token rows in
    /// the sorted order, each projection of every expert in one call over the experts' queues
    /// (each expert's weights read in place), each bias gathered by the row's expert, the
    /// gating in XLA's ops; then each output, by slot, times its router weight and each
    /// token's `k` summed, as [`Routing::cpu_kernel`] does. Needs one group. With
    /// [`Keep::Held`], the routing's last expert is "elsewhere": its rows are in no group of
    /// the products and its slots give 0.
    pub(super) fn grouped(
        &self,
        b: &mut Builder,
        x: Value,
        w: &Experts,
        dt: DType,
        product: Product,
        keep: Keep,
    ) -> Result<Value, HloError> {
        let (t, k, a, h) = (self.n, self.k, self.n * self.k, b.dims(x)?[1]);
        let held = matches!(keep, Keep::Held(_));
        let e = self.e - usize::from(held);
        let at_rows = |b: &mut Builder, table: Value, index: Value| -> Result<Value, HloError> {
            let dims = b.dims(table)?.to_vec();
            let table = b.reshape(table, &[&[1][..], &dims].concat())?;
            let index = b.reshape(index, &[1, a, 1])?;
            let rows = b.take_along(table, 0, &[1], index)?;
            b.reshape(rows, &[&[a][..], &dims[1..]].concat())
        };
        let rows = at_rows(b, x, self.sorted_token)?;
        let counts = b.reshape(self.counts, &[self.e])?;
        let counts = if held { b.slice_dim(counts, 0, 0, e)? } else { counts };
        let [gate, up, down] = [w.weights[0], w.weights[1], w.weights[2]];
        let [gb, ub, db] = w.biases.map_or([None; 3], |bs| bs.map(Some));
        let project = |b: &mut Builder, v: Value, weight: Value, bias: Option<Value>| -> Result<Value, HloError> {
            let y = match product {
                Product::Kernel => {
                    let n = b.dims(weight)?[1];
                    b.custom_call(siphon_kernels::grouped::TARGET, &[v, counts, weight], TensorType::new(dt, &[a, n]))?
                }
                // Hugging Face's `[E, out, in]`: the input contracted with each matrix's last.
                Product::Ragged(RaggedDot::Native) => b.ragged_dot(v, weight, counts, 2)?,
                Product::Ragged(RaggedDot::Masked) => b.ragged_dot_masked(v, weight, counts, 2)?,
            };
            match bias {
                // The rows of experts held elsewhere gather a clamped index's bias (a gather
                // clamps its indices); they are masked below.
                Some(bias) => {
                    let bias = at_rows(b, bias, self.sorted_expert)?;
                    b.add(y, bias)
                }
                None => Ok(y),
            }
        };
        let g = project(b, rows, gate, gb)?;
        let u = project(b, rows, up, ub)?;
        let act = w.glu.apply(b, g, u, dt)?;
        let y = project(b, act, down, db)?;
        let y = at_rows(b, y, self.rank)?;
        let y = match keep {
            Keep::Held(keep) => {
                let keep = b.reshape(keep, &[a])?;
                let keep = b.broadcast_in_dim(keep, &[a, h], &[0])?;
                let zero = b.splat(0.0, TensorType::new(dt, &[a, h]))?;
                b.select(keep, y, zero)?
            }
            Keep::All => y,
        };
        let y = b.reshape(y, &[t, k, h])?;
        let weights = b.broadcast_in_dim(self.chosen_weights, &[t, k, h], &[0, 1])?;
        let y = b.mul(y, weights)?;
        b.reduce_sum(y, &[1])
    }
}
