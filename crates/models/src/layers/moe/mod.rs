//! The routed mixture of experts the mixture families share: the router's top-k choice and
//! the dispatch that sends each token through its chosen experts only.
//!
//! Routing, per group of tokens (one group per part of the token split over the mesh, so a
//! group never leaves its devices): the `k` choices of the group's `n` tokens are sorted by
//! expert, stably (ties keep token order), which lines each expert's choices up as a queue
//! in the sorted order. No choice is ever dropped, whatever the routing; the router's
//! scores, top-k and renormalisation are computed as before the dispatch existed.
//!
//! Dispatch on one device ([`Routing::per_expert`]): a loop over the experts; each takes its
//! queue `chunk` rows at a time (the mean load rounded up to a power of two from 8 to 32:
//! [`chunk_rows`]) through its own weights, weights on the left (`[I, H]·xᵀ`, so the CPU's
//! kernels stream them as stored rather than repacking them on every call), and writes the
//! outputs, times their router weights, to its rows of the sorted order; each token then sums
//! its `k` rows. An expert no token chose costs nothing. Compute: `Σ_e ⌈count_e / chunk⌉ ·
//! chunk` rows against the `n · k` routed ones (under `1 + experts · chunk / (n · k)` times,
//! about 1.4× at 16 choices per expert, 1.25× at 64); memory: the sorted rows and outputs,
//! `2 · (n·k + chunk) · H`, and one expert's weights (sliced out of the stacks on each step).
//!
//! Dispatch on one device as grouped products ([`Routing::grouped`], `siphon_kernels::grouped`:
//! cuBLAS on a CUDA plugin): the sorted rows through each projection of every expert in one
//! call, each expert's queue times its own weights where they lie; exactly the routed rows.
//! On a mesh the same, on each device's part ([`Graph::grouped_on_mesh`], an
//! `sdy.manual_computation`): each device routes its own tokens through the experts it holds
//! (experts split whole over `model`: expert parallelism), its choices of other devices'
//! experts sorted last, in no group, and masked; the devices' parts are summed.
//!
//! Dispatch as XLA's grouped product (a TPU program's form, [`crate::forward::ForwardSpec::ragged_experts`]):
//! the same as [`Routing::grouped`], each projection one `chlo.ragged_dot` over the sorted
//! rows (no loop: libtpu compiles it natively), on a mesh with the experts as their weights
//! lie (on TPU each expert's width over `model`, so every device multiplies exactly its
//! tokens' routed rows by its columns). On the CPU plugin, which has no `ragged-dot`, the same
//! values come from ordinary ops ([`crate::forward::RaggedDot::Masked`]).
//!
//! Dispatch on a mesh ([`Routing::in_rounds`]): rounds of `[experts, capacity]` buffers,
//! each holding the rows at positions `round·capacity …` of every queue, through one
//! batched product per projection (weights on the left too), so that experts split whole
//! over `model` (expert
//! parallelism) stay where they are; each choice adds its output, times its router weight,
//! to its token. Rounds repeat on the device until the longest queue is done. Compute:
//! `experts · capacity · rounds` rows; the automatic capacity (the mean load plus three of a
//! uniform router's standard deviations, rounded up to 8) makes it about 2× the routed rows
//! at 16 choices per expert and 1.1× at 2,000, more rounds only where routing is that
//! uneven.

use siphon_hlo::{Builder, CompareDir, DType, DotDims, HloError, TensorType, Value};

use crate::config::{Activation, ModelConfig, ParamClass, ParamInfo, Slice};
use crate::error::ModelError;
use crate::forward::Graph;
use crate::hooks::{HookKind, HookPoint};
use crate::layers::attention::softmax_last;
use crate::layers::mlp::activate;

mod grouped;
use grouped::{Keep, Product};

impl Graph<'_> {
    /// The routed mixture of SiLU-gated experts in block `layer` (Hugging Face's
    /// `Qwen3MoeSparseMoeBlock` / `MixtralSparseMoeBlock`): router logits `x·Wᵀ`, softmax in
    /// f32, the `top_k` largest kept (ties to the lower expert, as `torch.topk`), divided by
    /// their sum when `norm_topk`, cast to the compute dtype; then each token through its
    /// chosen experts' `down(silu(gate(x)) * up(x))`, summed with those weights
    /// ([`Graph::experts`]). Weights: `model.layers.{layer}.mlp.gate.weight` `[E, H]` and the
    /// stacked `model.layers.{layer}.mlp.experts.{gate,up,down}_proj`.
    pub fn moe_mlp(&mut self, x: Value, layer: usize) -> Result<Value, ModelError> {
        let moe =
            self.config.moe.clone().ok_or_else(|| ModelError::Config("moe_mlp on a model without experts".into()))?;
        let p = format!("model.layers.{layer}.mlp");
        let logits = self.linear(x, &format!("{p}.gate.weight"), None)?;
        let at = |kind| HookPoint::block(layer, kind);
        self.hook(at(HookKind::MlpRouterLogits), logits);
        let logits = self.b.convert(logits, DType::F32)?;
        let probs = softmax_last(&mut self.b, logits)?;
        let (weights, indices) = self.top_k(probs, moe.top_k, moe.norm_topk)?;
        let weights = self.b.convert(weights, self.dt)?;
        self.hook(at(HookKind::MlpExpertWeights), weights);
        self.hook(at(HookKind::MlpExpertIndices), indices);
        let [gate, up, down] = ["gate_proj", "up_proj", "down_proj"].map(|n| format!("{p}.experts.{n}"));
        self.experts(x, [&gate, &up, &down], weights, indices)
    }

    /// Top-k routing of `probs` `[tokens, experts]` (f32): each token's `k` largest, the
    /// lower index first among exact ties (`torch.topk` breaks those by its partial sort),
    /// kept — divided by their sum when `renormalize` — and the others 0, and the chosen
    /// experts' indices, largest first, `[tokens, k]` as f32.
    pub fn top_k(&mut self, probs: Value, k: usize, renormalize: bool) -> Result<(Value, Value), ModelError> {
        let (weights, indices, _) = self.top_k_values(probs, k, renormalize)?;
        Ok((weights, indices))
    }

    /// [`Graph::top_k`], with the chosen values themselves, `[tokens, k]` (f32, largest
    /// first, not renormalised).
    pub fn top_k_values(
        &mut self,
        probs: Value,
        k: usize,
        renormalize: bool,
    ) -> Result<(Value, Value, Value), ModelError> {
        let (chosen, indices, values) = self.top_k_choice(probs, k)?;
        let dims = self.b.dims(probs)?.to_vec();
        let b = &mut self.b;
        let zero = b.splat(0.0, TensorType::new(DType::F32, &dims))?;
        let mut weights = b.select(chosen, probs, zero)?;
        if renormalize {
            let sum = b.reduce_sum(weights, &[1])?;
            let sum = b.broadcast_in_dim(sum, &dims, &[0])?;
            weights = b.div(weights, sum)?;
        }
        Ok((weights, indices, values))
    }

    /// The choice behind [`Graph::top_k_values`]: which of `scores` `[tokens, n]` (f32) are
    /// each token's `k` largest (a `[tokens, n]` predicate), their indices and their values
    /// (`[tokens, k]`, f32, largest first, the lower index first among ties); at least `k`
    /// scores of each row must be finite.
    pub fn top_k_choice(&mut self, probs: Value, k: usize) -> Result<(Value, Value, Value), ModelError> {
        let dims = self.b.dims(probs)?.to_vec();
        let (t, e) = (dims[0], dims[1]);
        let b = &mut self.b;
        // Top-k by repeated argmax; -inf marks the ones taken.
        let te = TensorType::new(DType::F32, &[t, e]);
        let rev = {
            let iota = b.iota(TensorType::new(DType::F32, &[t, e]), 1)?;
            let n = b.splat(e as f64, te.clone())?;
            b.sub(n, iota)? // E - index: larger for lower experts
        };
        let zero = b.splat(0.0, te.clone())?;
        let taken = b.splat(f64::NEG_INFINITY, te.clone())?;
        let mut remaining = probs;
        let mut chosen = b.splat(0.0, te.with_dtype(DType::Pred))?;
        let mut indices = Vec::with_capacity(k);
        let mut values = Vec::with_capacity(k);
        for _ in 0..k {
            let m = b.reduce_max(remaining, &[1])?;
            values.push(b.reshape(m, &[t, 1])?);
            let m = b.broadcast_in_dim(m, &[t, e], &[0])?;
            let is_max = b.compare(CompareDir::Eq, remaining, m)?;
            let candidates = b.select(is_max, rev, zero)?;
            let first = b.reduce_max(candidates, &[1])?;
            let n = b.splat(e as f64, TensorType::new(DType::F32, &[t]))?;
            let index = b.sub(n, first)?;
            indices.push(b.reshape(index, &[t, 1])?);
            let first = b.broadcast_in_dim(first, &[t, e], &[0])?;
            let pick = b.compare(CompareDir::Eq, rev, first)?;
            chosen = b.or(chosen, pick)?;
            remaining = b.select(pick, taken, remaining)?;
        }
        let indices = b.concatenate(&indices, 1)?;
        let values = b.concatenate(&values, 1)?;
        Ok((chosen, indices, values))
    }

    /// Each token of `x` `[tokens, hidden]` through the experts `indices` `[tokens, k]` (f32,
    /// from [`Graph::top_k`]) chose for it, weighted by its row of `weights`
    /// `[tokens, experts]` (compute dtype): `Σ_j weights[t, e_j] · down_e(act(gate_e(x)) *
    /// up_e(x))` with the stacked expert weights `gate`, `up` `[E, I, H]` and `down`
    /// `[E, H, I]`, dispatched as the module documentation says.
    pub fn experts(
        &mut self,
        x: Value,
        [gate, up, down]: [&str; 3],
        weights: Value,
        indices: Value,
    ) -> Result<Value, ModelError> {
        let idx = self.b.convert(indices, DType::I32)?;
        let [t, k] = self.b.dims(idx)?.try_into().map_err(|_| ModelError::Config("indices not [tokens, k]".into()))?;
        let idx3 = self.b.reshape(idx, &[t, k, 1])?;
        let chosen = self.b.take_along(weights, 0, &[1], idx3)?;
        let weights = [gate, up, down].map(|n| self.w(n)).into_iter().collect::<Result<Vec<_>, _>>()?;
        let experts = Experts { weights, biases: None, glu: Glu::Act(self.config.activation) };
        self.routed(x, &experts, chosen, indices)
    }

    /// Each token of `x` through the `k` experts `indices` `[tokens, k]` (f32) chose for it,
    /// weighted by `chosen` `[tokens, k]` (compute dtype).
    pub(crate) fn routed(
        &mut self,
        x: Value,
        experts: &Experts,
        chosen: Value,
        indices: Value,
    ) -> Result<Value, ModelError> {
        let [t, k] =
            self.b.dims(indices)?.try_into().map_err(|_| ModelError::Config("indices not [tokens, k]".into()))?;
        let e = self.b.dims(experts.weights[0])?[0];
        let product = match (self.spec.ragged_experts, self.spec.grouped_experts) {
            (Some(form), _) => Some(Product::Ragged(form)),
            (None, true) => Some(Product::Kernel),
            (None, false) => None,
        };
        if let Some(product) = product.filter(|_| self.sharded()) {
            return self.grouped_on_mesh(x, experts, chosen, indices, product);
        }
        let groups = Some(self.token_groups()).filter(|g| t % g == 0).unwrap_or(1);
        let n = t / groups;
        let routing = Routing::new(&mut self.b, e, chosen, indices, groups)?;
        let dt = self.dt;
        let out = if self.sharded() && product.is_none() {
            let cap = self.spec.expert_capacity.unwrap_or_else(|| capacity(n, k, e)).clamp(1, n);
            routing.in_rounds(&mut self.b, x, experts, dt, cap)?
        } else if let Some(product) = product {
            routing.grouped(&mut self.b, x, experts, dt, product, Keep::All)?
        } else if let Some(target) = experts.cpu_kernel(dt).filter(|_| self.spec.cpu_kernels) {
            routing.cpu_kernel(&mut self.b, x, experts, target)?
        } else {
            let chunk = self.spec.expert_capacity.unwrap_or_else(|| chunk_rows(n, k, e)).clamp(1, n);
            routing.per_expert(&mut self.b, x, experts, dt, chunk)?
        };
        Ok(out)
    }
}

/// How an expert gates: `act(gate) · up` with a model's activation, or GPT-OSS's clamped
/// SwiGLU, `(clamp(up, ±limit) + 1) · g · σ(alpha · g)` with `g = min(gate, limit)`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Glu {
    Act(Activation),
    Clamped { alpha: f64, limit: f64 },
}

impl Glu {
    fn apply(self, b: &mut Builder, gate: Value, up: Value, dt: DType) -> Result<Value, HloError> {
        match self {
            Glu::Act(activation) => {
                let act = activate(b, activation, gate, dt)?;
                b.mul(act, up)
            }
            Glu::Clamped { alpha, limit } => {
                let ty = b.ty(gate)?.clone();
                let hi = b.splat(limit, ty.clone())?;
                let lo = b.splat(-limit, ty.clone())?;
                let g = b.min(gate, hi)?;
                let u = b.min(up, hi)?;
                let u = b.max(u, lo)?;
                let a = b.splat(alpha, ty.clone())?;
                let s = b.mul(g, a)?;
                let s = b.logistic(s)?;
                let glu = b.mul(g, s)?;
                let one = b.splat(1.0, ty)?;
                let u = b.add(u, one)?;
                b.mul(u, glu)
            }
        }
    }
}

/// One block's experts: their stacked weights `[gate, up, down]` (`[E, I, H]`, `[E, I, H]`,
/// `[E, H, I]`), optional biases (`[E, I]`, `[E, I]`, `[E, H]`), and their gating.
pub(crate) struct Experts {
    pub weights: Vec<Value>,
    pub biases: Option<[Value; 3]>,
    pub glu: Glu,
}

impl Experts {
    /// Every weight and bias, in the order the dispatch loops carry them.
    fn all(&self) -> Vec<Value> {
        let mut all = self.weights.clone();
        all.extend(self.biases.iter().flatten());
        all
    }

    /// The custom-call target of siphon's CPU kernel for these experts in `dt`, if it has one
    /// (`siphon_kernels::experts`, f32): SiLU- or tanh-GELU-gated without biases, or GPT-OSS's
    /// clamped SwiGLU with them.
    fn cpu_kernel(&self, dt: DType) -> Option<&'static str> {
        match (self.glu, self.biases) {
            _ if dt != DType::F32 => None,
            (Glu::Act(Activation::Silu), None) => Some(siphon_kernels::experts::TARGET),
            (Glu::Act(Activation::GeluTanh), None) => Some(siphon_kernels::experts::TARGET_GELU_TANH),
            (Glu::Clamped { .. }, Some(_)) => Some(siphon_kernels::experts::TARGET_CLAMPED_SWIGLU),
            _ => None,
        }
    }

    /// Rebuilds the list [`Experts::all`] gave from `values` (inside a loop).
    fn with(&self, values: &[Value]) -> Experts {
        let biases = self.biases.map(|_| [values[3], values[4], values[5]]);
        Experts { weights: values[..3].to_vec(), biases, glu: self.glu }
    }

    /// `down(glu(gate(x), up(x)))`, weights on the left (`W·xᵀ`: the CPU's kernels then stream
    /// the weights as stored, packing only the few token rows), for one expert (weights
    /// `[I, H]`, `[I, H]`, `[H, I]`, biases `[I]`, `[I]`, `[H]`, `x` `[rows, H]`) or for every
    /// expert at once (each with an `[E]` dimension first, `x` `[E, rows, H]`): the output
    /// transposed, `[H, rows]` or `[E, H, rows]`.
    fn mlp_t(&self, b: &mut Builder, x: Value, dt: DType) -> Result<Value, HloError> {
        let [gate, up, down] = [self.weights[0], self.weights[1], self.weights[2]];
        let batch: Vec<usize> = (0..b.dims(gate)?.len() - 2).collect();
        let n = batch.len();
        let bias = |b: &mut Builder, v: Value, bias: Option<Value>| -> Result<Value, HloError> {
            let Some(bias) = bias else { return Ok(v) };
            let dims = b.dims(v)?.to_vec();
            let bias = b.broadcast_in_dim(bias, &dims, &(0..=n).collect::<Vec<_>>())?;
            b.add(v, bias)
        };
        let [gb, ub, db] = self.biases.map_or([None; 3], |bs| bs.map(Some));
        let over = DotDims::batched(&batch, &batch, &[n + 1], &[n + 1]);
        let g = b.dot_general(gate, x, &over)?;
        let g = bias(b, g, gb)?;
        let u = b.dot_general(up, x, &over)?;
        let u = bias(b, u, ub)?;
        let act = self.glu.apply(b, g, u, dt)?;
        let y = b.dot_general(down, act, &DotDims::batched(&batch, &batch, &[n + 1], &[n]))?;
        bias(b, y, db)
    }
}

/// The routing of one mixture, per group of `n` tokens: each of the `a = n·k` choices'
/// expert, and the choices sorted by expert (stably) with their slot and token.
struct Routing {
    groups: usize,
    n: usize,
    k: usize,
    e: usize,
    /// `[groups, a]`: each choice's expert.
    expert: Value,
    /// `[groups, a]`: the sorted choices' experts, slots (`token·k + j`) and tokens.
    sorted_expert: Value,
    sorted_slot: Value,
    sorted_token: Value,
    /// `[groups, a]`: where each slot landed in the sorted order.
    rank: Value,
    /// `[groups, E]`: each expert's choices, and where its queue starts in the sorted order.
    counts: Value,
    starts: Value,
    /// `[tokens, k]`: each choice's router weight.
    chosen_weights: Value,
}

impl Routing {
    fn new(
        b: &mut Builder,
        e: usize,
        chosen_weights: Value,
        indices: Value,
        groups: usize,
    ) -> Result<Routing, HloError> {
        let (t, k) = (b.dims(indices)?[0], b.dims(indices)?[1]);
        let (n, a) = (t / groups, t / groups * k);
        let idx = b.convert(indices, DType::I32)?;
        let expert = b.reshape(idx, &[groups, a])?;
        let slot = b.iota(i32t(&[groups, a]), 1)?;
        let token = b.iota(i32t(&[groups, n, k]), 1)?;
        let token = b.reshape(token, &[groups, a])?;
        let sorted = b.sort_by_first(&[expert, slot, token], 1)?;
        let (sorted_expert, sorted_slot, sorted_token) = (sorted[0], sorted[1], sorted[2]);
        let rank = b.sort_by_first(&[sorted_slot, slot], 1)?[1];
        let gae = [groups, a, e];
        let each = b.broadcast_in_dim(expert, &gae, &[0, 1])?;
        let ids = b.iota(i32t(&gae), 2)?;
        let (one, zero) = (b.splat(1.0, i32t(&gae))?, b.splat(0.0, i32t(&gae))?);
        let mut count = |dir| -> Result<Value, HloError> {
            let hit = b.compare(dir, each, ids)?;
            let hit = b.select(hit, one, zero)?;
            b.reduce_sum(hit, &[1])
        };
        let counts = count(CompareDir::Eq)?;
        let starts = count(CompareDir::Lt)?;
        Ok(Routing {
            groups,
            n,
            k,
            e,
            expert,
            sorted_expert,
            sorted_slot,
            sorted_token,
            rank,
            counts,
            starts,
            chosen_weights,
        })
    }

    /// One device: a loop over the experts, each taking its queue `chunk` rows at a time
    /// (`⌈count / chunk⌉` products with its own weights; an expert no token chose costs
    /// nothing), writing its weighted outputs to the sorted rows; then each token sums its
    /// `k` rows. Needs one group.
    fn per_expert(&self, b: &mut Builder, x: Value, w: &Experts, dt: DType, chunk: usize) -> Result<Value, HloError> {
        let (a, h, e) = (self.n * self.k, b.dims(x)?[1], self.e);
        let pad_i = b.splat(0.0, i32t(&[1, chunk]))?;
        let tokens = b.concatenate(&[self.sorted_token, pad_i], 1)?;
        let tokens = b.reshape(tokens, &[1, a + chunk, 1])?;
        let xg = b.reshape(x, &[1, self.n, h])?;
        let rows = b.take_along(xg, 0, &[1], tokens)?;
        let rows = b.reshape(rows, &[a + chunk, h])?;
        let slot_w = b.reshape(self.chosen_weights, &[1, a])?;
        let sorted_slot = b.reshape(self.sorted_slot, &[1, a, 1])?;
        let slot_w = b.take_along(slot_w, 0, &[1], sorted_slot)?;
        let pad_w = b.splat(0.0, TensorType::new(dt, &[1, chunk]))?;
        let slot_w = b.concatenate(&[slot_w, pad_w], 1)?;
        let slot_w = b.reshape(slot_w, &[a + chunk])?;
        let counts = b.reshape(self.counts, &[e])?;
        let starts = b.reshape(self.starts, &[e])?;
        // Outputs transposed, one column per sorted choice (see below).
        let out = b.splat(0.0, TensorType::new(dt, &[h, a + chunk]))?;
        let zero = b.scalar(0.0, DType::I32)?;
        let n_experts = b.scalar(e as f64, DType::I32)?;
        let state = [zero, out, rows, slot_w, counts, starts, n_experts];
        let done = b.while_loop(
            &[&state[..], &w.all()].concat(),
            |b, s| b.compare(CompareDir::Lt, s[0], s[6]),
            |b, s| {
                let [ex, out, rows, slot_w, counts, starts, n_experts] = s[..7].try_into().expect("the loop state");
                let zero = b.scalar(0.0, DType::I32)?;
                let at = |b: &mut Builder, v: Value| -> Result<Value, HloError> {
                    let one = b.dynamic_slice(v, &[ex], &[1])?;
                    b.reshape(one, &[])
                };
                let (count, start) = (at(b, counts)?, at(b, starts)?);
                // This expert's weights and biases.
                let own = |b: &mut Builder, v: Value| -> Result<Value, HloError> {
                    let dims = b.dims(v)?.to_vec();
                    let mut starts = vec![ex];
                    starts.resize(dims.len(), zero);
                    let mut sizes = dims.clone();
                    sizes[0] = 1;
                    let one = b.dynamic_slice(v, &starts, &sizes)?;
                    b.reshape(one, &dims[1..])
                };
                let own: Vec<Value> = s[7..].iter().map(|&v| own(b, v)).collect::<Result<_, _>>()?;
                let inner = [zero, out, rows, slot_w, count, start];
                let out = b.while_loop(
                    &[&inner[..], &own].concat(),
                    |b, s| {
                        let c = b.scalar(chunk as f64, DType::I32)?;
                        let done = b.mul(s[0], c)?;
                        b.compare(CompareDir::Lt, done, s[4])
                    },
                    |b, s| {
                        let [j, out, rows, slot_w, count, start] = s[..6].try_into().expect("the chunk loop state");
                        let zero = b.scalar(0.0, DType::I32)?;
                        let c = b.scalar(chunk as f64, DType::I32)?;
                        let done = b.mul(j, c)?;
                        let first = b.add(start, done)?;
                        let x = b.dynamic_slice(rows, &[first, zero], &[chunk, h])?;
                        // Weights first, `[I, H]·xᵀ`: the CPU's kernels stream them as
                        // stored instead of repacking every expert's on each call, and the
                        // output stays transposed, `[H, chunk]`.
                        let y = w.with(&s[6..]).mlp_t(b, x, dt)?;
                        // Rows past the queue's end belong to later experts (which overwrite
                        // them) or to the padding: zero here.
                        let wts = b.dynamic_slice(slot_w, &[first], &[chunk])?;
                        let left = b.sub(count, done)?;
                        let left = b.broadcast_in_dim(left, &[chunk], &[])?;
                        let row = b.iota(i32t(&[chunk]), 0)?;
                        let mine = b.compare(CompareDir::Lt, row, left)?;
                        let none = b.splat(0.0, TensorType::new(dt, &[chunk]))?;
                        let wts = b.select(mine, wts, none)?;
                        let wts = b.broadcast_in_dim(wts, &[h, chunk], &[1])?;
                        let y = b.mul(y, wts)?;
                        let out = b.dynamic_update_slice(out, y, &[zero, first])?;
                        let one = b.scalar(1.0, DType::I32)?;
                        Ok([&[b.add(j, one)?, out, rows, slot_w, count, start], &s[6..]].concat())
                    },
                )?[1];
                let one = b.scalar(1.0, DType::I32)?;
                Ok([&[b.add(ex, one)?, out, rows, slot_w, counts, starts, n_experts], &s[7..]].concat())
            },
        )?[1];
        // Each token's k rows, summed.
        let t = self.n;
        let out = b.transpose(done, &[1, 0])?;
        let out = b.reshape(out, &[1, a + chunk, h])?;
        let rank = b.reshape(self.rank, &[1, a, 1])?;
        let mine = b.take_along(out, 0, &[1], rank)?;
        let mine = b.reshape(mine, &[t, self.k, h])?;
        b.reduce_sum(mine, &[1])
    }

    /// One device, on siphon's CPU kernel (`siphon_kernels::experts`): each choice's token
    /// through its expert, the expert's weights read in place, into the choice's slot; then
    /// each output times its router weight and each token's `k` summed, as
    /// [`Routing::per_expert`] does. Needs one group.
    fn cpu_kernel(&self, b: &mut Builder, x: Value, w: &Experts, target: &str) -> Result<Value, HloError> {
        let (t, k, a, h, e) = (self.n, self.k, self.n * self.k, b.dims(x)?[1], self.e);
        let token = b.reshape(self.sorted_token, &[a])?;
        let slot = b.reshape(self.sorted_slot, &[a])?;
        let counts = b.reshape(self.counts, &[e])?;
        let mut operands = [&[x, token, slot, counts][..], &w.all()].concat();
        if let Glu::Clamped { alpha, limit } = w.glu {
            operands.push(b.constant_f32(&[alpha as f32, limit as f32], &[2])?);
        }
        let y = b.custom_call(target, &operands, TensorType::new(DType::F32, &[a, h]))?;
        let y = b.reshape(y, &[t, k, h])?;
        let weights = b.broadcast_in_dim(self.chosen_weights, &[t, k, h], &[0, 1])?;
        let y = b.mul(y, weights)?;
        b.reduce_sum(y, &[1])
    }

    /// On a mesh: rounds of `[groups, E, cap]` buffers, every expert's rows at positions
    /// `round·cap …` of its queue, through one batched product per projection (so experts
    /// split whole over `model` stay there), until the longest queue is done.
    fn in_rounds(&self, b: &mut Builder, x: Value, w: &Experts, dt: DType, cap: usize) -> Result<Value, HloError> {
        let (groups, n, k, e, a) = (self.groups, self.n, self.k, self.e, self.n * self.k);
        let (t, h) = (groups * n, b.dims(x)?[1]);
        // Each slot's position in its expert's queue.
        let expert3 = b.reshape(self.expert, &[groups, a, 1])?;
        let start = b.take_along(self.starts, 0, &[1], expert3)?;
        let position = b.sub(self.rank, start)?;
        let longest = b.reduce_max(self.counts, &[0, 1])?;
        let round = b.scalar(0.0, DType::I32)?;
        let sum = b.splat(0.0, TensorType::new(dt, &[t, h]))?;
        let state =
            [round, sum, longest, x, self.sorted_token, self.starts, self.expert, position, self.chosen_weights];
        let cap_rows = |b: &mut Builder, round: Value| -> Result<Value, HloError> {
            let c = b.scalar(cap as f64, DType::I32)?;
            b.mul(round, c)
        };
        let out = b.while_loop(
            &[&state[..], &w.all()].concat(),
            |b, s| {
                let done = cap_rows(b, s[0])?;
                b.compare(CompareDir::Lt, done, s[2])
            },
            |b, s| {
                let [round, sum, longest, x, sorted_token, starts, expert, position, chosen_weights] =
                    s[..9].try_into().expect("the loop state");
                let first = cap_rows(b, round)?;
                // Dispatch: queue rows first..first+cap of every expert, [groups, E, cap, H].
                let gec = [groups, e, cap];
                let first_b = b.broadcast_in_dim(first, &gec, &[])?;
                let offset = b.iota(i32t(&gec), 2)?;
                let offset = b.add(first_b, offset)?;
                let starts_b = b.broadcast_in_dim(starts, &gec, &[0, 1])?;
                let at = b.add(starts_b, offset)?;
                let at = b.reshape(at, &[groups, e, cap, 1])?;
                let rows = b.take_along(sorted_token, 0, &[1], at)?;
                let rows = b.reshape(rows, &[groups, e, cap, 1])?;
                let xg = b.reshape(x, &[groups, n, h])?;
                let xd = b.take_along(xg, 0, &[1], rows)?;
                let xd = b.transpose(xd, &[1, 0, 2, 3])?;
                let xd = b.reshape(xd, &[e, groups * cap, h])?;
                // Every expert at once, [E, H, groups·cap], then as [E, H, groups, cap].
                let y = w.with(&s[9..]).mlp_t(b, xd, dt)?;
                let y = b.reshape(y, &[e, h, groups, cap])?;
                // Combine: each slot whose position falls in this round takes its row.
                let (local, here, _) = in_range(b, position, first, cap)?;
                let pick = [b.reshape(expert, &[groups, a, 1])?, b.reshape(local, &[groups, a, 1])?];
                let pick = b.concatenate(&pick, 2)?;
                let mine = b.take_along(y, 2, &[0, 3], pick)?;
                let mine = b.reshape(mine, &[t, k, h])?;
                let here = b.reshape(here, &[t, k])?;
                let here = b.broadcast_in_dim(here, &[t, k, h], &[0, 1])?;
                let none = b.splat(0.0, TensorType::new(dt, &[t, k, h]))?;
                let mine = b.select(here, mine, none)?;
                let wts = b.broadcast_in_dim(chosen_weights, &[t, k, h], &[0, 1])?;
                let mine = b.mul(mine, wts)?;
                let mine = b.reduce_sum(mine, &[1])?;
                let one = b.scalar(1.0, DType::I32)?;
                let next = [b.add(round, one)?, b.add(sum, mine)?, longest, x, sorted_token, starts, expert];
                Ok([&next[..], &[position, chosen_weights], &s[9..]].concat())
            },
        )?;
        Ok(out[1])
    }
}

fn i32t(dims: &[usize]) -> TensorType {
    TensorType::new(DType::I32, dims)
}

/// `x - first` for `x` (i32) and the scalar `first`, whether it lies in `0..size`, and `size`
/// in `x`'s shape: the rows of one round (the rounds loop) or of one device's experts (the
/// grouped form on a mesh).
fn in_range(b: &mut Builder, x: Value, first: Value, size: usize) -> Result<(Value, Value, Value), HloError> {
    let dims = b.dims(x)?.to_vec();
    let first = b.broadcast_in_dim(first, &dims, &[])?;
    let local = b.sub(x, first)?;
    let zero = b.splat(0.0, i32t(&dims))?;
    let size = b.splat(size as f64, i32t(&dims))?;
    let above = b.compare(CompareDir::Ge, local, zero)?;
    let below = b.compare(CompareDir::Lt, local, size)?;
    Ok((local, b.and(above, below)?, size))
}

/// Rows per product on one device for `n` tokens choosing `k` of `e` experts each: the
/// mean load rounded up to a power of two, from 8 to 32 rows, at most `n`. Smaller chunks
/// stream an expert's weights more often, larger ones pad its last chunk with more rows;
/// on the CPU 16 and 32 rows also suit the dot kernels better than 24 or 48 (the
/// Qwen3-30B-A3B shape: 32 rows 6% faster than 64 at 1,024 tokens, 13% faster than 128 at
/// 2,048; docs/BENCHMARKS.md).
pub fn chunk_rows(n: usize, k: usize, e: usize) -> usize {
    (n * k).div_ceil(e).next_power_of_two().clamp(8, 32).min(n).max(1)
}

/// Rows per expert in a dispatch round for `n` tokens choosing `k` of `e` experts each: the
/// mean load plus three standard deviations of a uniform router's, rounded up to 8, at most
/// `n` (no expert gets more).
pub fn capacity(n: usize, k: usize, e: usize) -> usize {
    let mean = (n * k) as f64 / e as f64;
    let c = (mean + 3.0 * mean.sqrt()).ceil() as usize;
    c.next_multiple_of(8).min(n).max(1)
}

/// The routed experts of block `l` as the forward takes them (see
/// [`crate::forward::Graph::moe_mlp`]), none without a mixture: the router, and each
/// projection of every expert stacked, read from Qwen3-MoE's names (`mlp.gate`,
/// `mlp.experts.{e}.{gate,up,down}_proj`; Mixtral renames the stored tensors).
pub(crate) fn moe_params(c: &ModelConfig, l: usize) -> Vec<ParamInfo> {
    use ParamClass::*;
    let Some(moe) = &c.moe else { return Vec::new() };
    let (h, e, i) = (c.hidden_size, moe.n_experts, moe.expert_size);
    let p = format!("model.layers.{l}.mlp");
    // The router as stored, named for the program by the same name.
    let whole = Slice {
        tensor: format!("{p}.gate.weight"),
        stored: vec![e, h],
        transposed: false,
        groups: 1,
        start: 0,
        len: e,
    };
    let mut out = vec![ParamInfo::part(format!("{p}.gate.weight"), &[e, h], Router, Some(l), whole)];
    for (proj, shape, class) in
        [("gate_proj", [e, i, h], ExpertGate), ("up_proj", [e, i, h], ExpertUp), ("down_proj", [e, h, i], ExpertDown)]
    {
        let stack = (0..e).map(|x| format!("{p}.experts.{x}.{proj}.weight")).collect();
        out.push(ParamInfo::stacked(format!("{p}.experts.{proj}"), &shape, class, Some(l), stack));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{capacity, chunk_rows};

    #[test]
    fn chunks_are_the_mean_load_rounded_up_to_a_power_of_two_from_8_to_32() {
        assert_eq!(chunk_rows(256, 8, 128), 16); // mean 16
        assert_eq!(chunk_rows(272, 8, 128), 32); // mean 17
        assert_eq!(chunk_rows(1024, 8, 128), 32); // mean 64
        assert_eq!(chunk_rows(100, 2, 64), 8); // mean 3.1
        assert_eq!(chunk_rows(4, 2, 2), 4); // at most the tokens
    }

    #[test]
    fn capacity_covers_a_uniform_router_and_never_exceeds_the_tokens() {
        assert_eq!(capacity(256, 8, 128), 32); // mean 16
        assert_eq!(capacity(4096, 8, 128), 304); // mean 256
        assert_eq!(capacity(24, 2, 4), 24); // mean 12: all the group's tokens
        assert_eq!(capacity(1, 1, 64), 1);
    }
}
