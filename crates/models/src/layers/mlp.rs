//! MLPs: gated (SwiGLU/GeGLU) and plain, a shared expert, the activations as PyTorch
//! computes them, and the hooks each records.

use siphon_hlo::{Builder, DType, HloError, Value};

use crate::config::Activation;
use crate::error::ModelError;
use crate::forward::Graph;
use crate::hooks::{HookKind, HookPoint};

/// An MLP's hookable parts (see [`Graph::gated_mlp`], [`Graph::plain_mlp`]), each
/// `[tokens, width]`.
pub(crate) struct Mlp {
    /// Gate projection (a plain MLP's input projection).
    pub pre: Value,
    /// Up projection beside the gate (gated MLPs only).
    pub pre_linear: Option<Value>,
    /// `act(pre) * pre_linear` (`act(pre)` in a plain MLP).
    pub post: Value,
    /// Down projection.
    pub out: Value,
}

/// The most intermediate elements (`[rows, intermediate]` of the gate, or of the up) one chunk
/// of a chunked MLP holds in a CUDA program: 2^26, 128 MiB in bf16.
pub const MLP_CHUNK_ELEMENTS: usize = 1 << 26;

impl Graph<'_> {
    /// The gated MLP: `down(act(gate(x)) * up(x))` with the config's activation (SiLU, or
    /// Gemma's tanh-approximated GELU), with its parts; the weights are
    /// `{prefix}.gate_proj.weight` and so on (`prefix` e.g. `model.layers.3.mlp`).
    pub fn gated_mlp(&mut self, x: Value, prefix: &str) -> Result<Mlp, ModelError> {
        let pre = self.linear(x, &format!("{prefix}.gate_proj.weight"), None)?;
        let up = self.linear(x, &format!("{prefix}.up_proj.weight"), None)?;
        let act = self.activation(pre)?;
        let post = self.b.mul(act, up)?;
        let out = self.linear(post, &format!("{prefix}.down_proj.weight"), None)?;
        Ok(Mlp { pre, pre_linear: Some(up), post, out })
    }

    /// Block `layer`'s dense gated MLP (`model.layers.{layer}.mlp.*`) with its hooks; returns
    /// its output.
    pub fn dense_mlp(&mut self, x: Value, layer: usize) -> Result<Value, ModelError> {
        self.block_mlp(x, &format!("model.layers.{layer}.mlp"), layer, HookKind::MlpOut)
    }

    /// Block `layer`'s gated MLP `prefix` with its hooks, its output recorded as `out`;
    /// returns the output. Where the spec asks for it ([`crate::forward::ForwardSpec::mlp_chunk`]) and
    /// none of its intermediates is read, it runs over the sequence in chunks, one after
    /// another in the compiled program: each position's row is computed as in one piece, and
    /// only one chunk's gate and up are live at once.
    pub fn block_mlp(&mut self, x: Value, prefix: &str, layer: usize, out: HookKind) -> Result<Value, ModelError> {
        let at = |kind| HookPoint::block(layer, kind);
        let read = [HookKind::MlpPre, HookKind::MlpPreLinear, HookKind::MlpPost].into_iter().any(|k| self.wants(at(k)));
        let step = self.mlp_chunk_positions(layer);
        if read || step >= self.spec.seq {
            let mlp = self.gated_mlp(x, prefix)?;
            self.hook_mlp(&mlp, layer, out);
            return Ok(mlp.out);
        }
        let (bsz, s) = (self.spec.batch, self.spec.seq);
        let width = self.b.dims(x)?[1];
        let rows = self.b.reshape(x, &[bsz, s, width])?;
        let mut parts = Vec::with_capacity(s.div_ceil(step));
        for start in (0..s).step_by(step) {
            let end = (start + step).min(s);
            let part = self.b.slice_dim(rows, 1, start, end)?;
            let part = self.b.reshape(part, &[bsz * (end - start), width])?;
            let y = self.gated_mlp(part, prefix)?.out;
            parts.push(self.b.reshape(y, &[bsz, end - start, width])?);
        }
        let joined = self.b.concatenate(&parts, 1)?;
        let y = self.b.reshape(joined, &[bsz * s, width])?;
        self.hook(at(out), y);
        Ok(y)
    }

    /// The positions of the sequence each chunk of block `layer`'s gated MLP holds: all of
    /// them unless the spec asks for chunks and the sequence is not split over the mesh; else
    /// as many as keep a chunk's intermediate (gate or up, `[batch·positions, intermediate]`)
    /// within the spec's elements, at least one.
    fn mlp_chunk_positions(&self, layer: usize) -> usize {
        let split_sequence = self.sharded() && !self.input_spec().dims()[1].is_empty();
        match self.spec.mlp_chunk {
            Some(most) if !split_sequence => {
                (most / (self.spec.batch * self.config.intermediate_at(layer)).max(1)).clamp(1, self.spec.seq)
            }
            _ => self.spec.seq,
        }
    }

    /// Block `layer`'s shared expert, the gated MLP `prefix` beside a mixture's routed
    /// experts, with its `mlp.shared_expert.*` hooks; returns its output.
    pub fn shared_expert(&mut self, x: Value, prefix: &str, layer: usize) -> Result<Value, ModelError> {
        let at = |kind| HookPoint::block(layer, kind);
        let shared = self.gated_mlp(x, prefix)?;
        self.hook(at(HookKind::SharedPre), shared.pre);
        if let Some(up) = shared.pre_linear {
            self.hook(at(HookKind::SharedPreLinear), up);
        }
        self.hook(at(HookKind::SharedPost), shared.post);
        self.hook(at(HookKind::SharedOut), shared.out);
        Ok(shared.out)
    }

    /// The plain MLP `down(act(up(x) + b) + b)` of GPT-2 and GPT-NeoX, with its parts: `up`
    /// and `down` name each projection's weight and bias.
    pub fn plain_mlp(&mut self, x: Value, up: [&str; 2], down: [&str; 2]) -> Result<Mlp, ModelError> {
        let pre = self.linear(x, up[0], Some(up[1]))?;
        let post = self.activation(pre)?;
        let out = self.linear(post, down[0], Some(down[1]))?;
        Ok(Mlp { pre, pre_linear: None, post, out })
    }

    /// The config's activation applied to `x`.
    pub fn activation(&mut self, x: Value) -> Result<Value, ModelError> {
        Ok(activate(&mut self.b, self.config.activation, x, self.dt)?)
    }

    /// Records an MLP's hooks in block `layer`, its output as `out` (`hook_mlp_out`, or
    /// `mlp.hook_out` where a post-norm follows).
    pub fn hook_mlp(&mut self, mlp: &Mlp, layer: usize, out: HookKind) {
        let at = |kind| HookPoint::block(layer, kind);
        self.hook(at(HookKind::MlpPre), mlp.pre);
        if let Some(up) = mlp.pre_linear {
            self.hook(at(HookKind::MlpPreLinear), up);
        }
        self.hook(at(HookKind::MlpPost), mlp.post);
        self.hook(at(out), mlp.out);
    }
}

/// `activation(x)` in the compute dtype `dt`.
pub(crate) fn activate(b: &mut Builder, activation: Activation, x: Value, dt: DType) -> Result<Value, HloError> {
    match activation {
        Activation::Silu => {
            let sig = b.logistic(x)?;
            b.mul(x, sig)
        }
        Activation::GeluTanh => gelu_tanh(b, x),
        Activation::Gelu => gelu_erf(b, x, dt),
    }
}

/// PyTorch's exact `gelu`, `x/2 * (1 + erf(x/√2))`, computed in f32 and cast back to `dt`.
fn gelu_erf(b: &mut Builder, x: Value, dt: DType) -> Result<Value, HloError> {
    let xf = b.convert(x, DType::F32)?;
    let ty = b.ty(xf)?.clone();
    let r = b.splat(std::f64::consts::FRAC_1_SQRT_2, ty.clone())?;
    let e = b.mul(xf, r)?;
    let e = b.erf(e)?;
    let one = b.splat(1.0, ty.clone())?;
    let e = b.add(e, one)?;
    let half = b.splat(0.5, ty)?;
    let hx = b.mul(xf, half)?;
    let y = b.mul(hx, e)?;
    b.convert(y, dt)
}

/// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`, PyTorch's `gelu(approximate="tanh")`, in
/// `x`'s dtype.
fn gelu_tanh(b: &mut Builder, x: Value) -> Result<Value, HloError> {
    let ty = b.ty(x)?.clone();
    let c = |b: &mut Builder, v: f64| b.splat(v, ty.clone());
    let x3 = b.mul(x, x)?;
    let x3 = b.mul(x3, x)?;
    let k = c(b, 0.044715)?;
    let inner = b.mul(x3, k)?;
    let inner = b.add(x, inner)?;
    let s = c(b, (2.0 / std::f64::consts::PI).sqrt())?;
    let inner = b.mul(inner, s)?;
    let t = b.tanh(inner)?;
    let one = c(b, 1.0)?;
    let t = b.add(t, one)?;
    let half = c(b, 0.5)?;
    let hx = b.mul(x, half)?;
    b.mul(hx, t)
}
