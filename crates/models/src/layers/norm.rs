//! Norms: RMSNorm with its gain applied as the family does ([`Gain`]), LayerNorm, a norm per
//! head, and the hooks each records (scale, normalized, out).

use siphon_hlo::{DType, TensorType, Value};

use crate::arch::Gain;
use crate::error::ModelError;
use crate::forward::Graph;
use crate::hooks::HookPoint;

/// A norm's hookable parts (see [`Graph::rms_norm_with`]).
pub(crate) struct Norm {
    /// `mean(x²) + eps`, `[rows]` (the input's shape less its last dimension), f32.
    pub var: Value,
    /// The input's shape, before the gain.
    pub normalized: Value,
    /// The input's shape, after the gain.
    pub out: Value,
}

impl Graph<'_> {
    /// Hugging Face's RMSNorm: `w * (x / sqrt(mean(x²) + eps))`, the normalisation in f32,
    /// cast back to the compute dtype before the weight multiply, with the gain applied as
    /// `gain` says ([`Gain::UnitOffset`] is Gemma's `(x / rms(x)) * (1 + w)`, the multiply in
    /// f32 before the cast back). Hands back the parts that TransformerLens hooks (see
    /// [`Graph::hook_norm`]).
    pub fn rms_norm_with(&mut self, x: Value, weight: &str, gain: Gain) -> Result<Norm, ModelError> {
        self.rms_norm_gain_eps(x, weight, gain, self.config.rms_norm_eps)
    }

    /// [`Graph::rms_norm_with`] with its own `eps` (MLA's latent norms).
    pub fn rms_norm_eps(&mut self, x: Value, weight: &str, eps: f64) -> Result<Norm, ModelError> {
        self.rms_norm_gain_eps(x, weight, Gain::Plain, eps)
    }

    fn rms_norm_gain_eps(&mut self, x: Value, weight: &str, gain: Gain, eps: f64) -> Result<Norm, ModelError> {
        let w = self.w(weight)?;
        let (var, normed, normalized) = self.rms_normalize(x, eps)?;
        let dims = self.b.dims(x)?.to_vec();
        let b = &mut self.b;
        let w = b.broadcast_in_dim(w, &dims, &[dims.len() - 1])?;
        let out = match gain {
            Gain::Plain => b.mul(normalized, w)?,
            Gain::F32 => {
                let wf = b.convert(w, DType::F32)?;
                let out = b.mul(normed, wf)?;
                b.convert(out, self.dt)?
            }
            Gain::UnitOffset => {
                let wf = b.convert(w, DType::F32)?;
                let one = b.splat(1.0, TensorType::new(DType::F32, &dims))?;
                let wf = b.add(wf, one)?;
                let out = b.mul(normed, wf)?;
                b.convert(out, self.dt)?
            }
        };
        Ok(Norm { var, normalized, out })
    }

    /// RMSNorm without a gain (Gemma 4's `v_norm` and router norm): its output is the
    /// normalized input.
    pub fn rms_norm_unscaled(&mut self, x: Value) -> Result<Norm, ModelError> {
        let (var, _, normalized) = self.rms_normalize(x, self.config.rms_norm_eps)?;
        Ok(Norm { var, normalized, out: normalized })
    }

    /// `x / sqrt(mean(x²) + eps)` over the last dimension of `x` (`[rows, hidden]`, or
    /// `[tokens, heads, head_dim]` for a norm per head), in f32: the variance plus eps (`x`'s
    /// shape less its last dimension), the f32 result, and the result in the compute dtype.
    fn rms_normalize(&mut self, x: Value, eps: f64) -> Result<(Value, Value, Value), ModelError> {
        let dims = self.b.dims(x)?.to_vec();
        let (rows, hidden) = dims.split_at(dims.len() - 1);
        let kept: Vec<usize> = (0..rows.len()).collect();
        let b = &mut self.b;
        let xf = b.convert(x, DType::F32)?;
        let sq = b.mul(xf, xf)?;
        let sum = b.reduce_sum(sq, &[rows.len()])?;
        let n = b.splat(hidden[0] as f64, TensorType::new(DType::F32, rows))?;
        let mean = b.div(sum, n)?;
        let eps = b.splat(eps, TensorType::new(DType::F32, rows))?;
        let var = b.add(mean, eps)?;
        let inv = b.rsqrt(var)?;
        let inv = b.broadcast_in_dim(inv, &dims, &kept)?;
        let normed = b.mul(xf, inv)?;
        let normalized = b.convert(normed, self.dt)?;
        Ok((var, normed, normalized))
    }

    /// `x + norm(y)` for a sublayer's output `y` normalised before it joins the residual
    /// stream `x` (Gemma's and OLMo 2's post-norms), recording the norm's scale, normalized
    /// and output hooks.
    pub fn add_post_normed(
        &mut self,
        x: Value,
        y: Value,
        weight: &str,
        gain: Gain,
        hooks: [HookPoint; 3],
    ) -> Result<Value, ModelError> {
        let mut post = self.rms_norm_with(y, weight, gain)?;
        // What joins the residual stream (hook_attn_out, hook_mlp_out) is where a vector is added.
        post.out = self.steer(hooks[2], post.out)?;
        self.hook_norm(&post, hooks[0], hooks[1], hooks[2])?;
        Ok(self.b.add(x, post.out)?)
    }

    /// PyTorch's LayerNorm: `(x - mean(x)) / sqrt(var(x) + eps) * w + bias`, all in f32, cast
    /// back to the compute dtype (the scale hook is `sqrt(var(x) + eps)`, the normalized one
    /// the centred input divided by it, as TransformerLens has them for LayerNorm).
    pub fn layer_norm(&mut self, x: Value, weight: &str, bias: &str) -> Result<Norm, ModelError> {
        let w = self.w(weight)?;
        let bias = self.w(bias)?;
        let dims = self.b.dims(x)?.to_vec();
        let (rows, hidden) = (dims[0], dims[1]);
        let b = &mut self.b;
        let row = TensorType::new(DType::F32, &[rows]);
        let xf = b.convert(x, DType::F32)?;
        let n = b.splat(hidden as f64, row.clone())?;
        let sum = b.reduce_sum(xf, &[1])?;
        let mean = b.div(sum, n)?;
        let mean = b.broadcast_in_dim(mean, &[rows, hidden], &[0])?;
        let centred = b.sub(xf, mean)?;
        let sq = b.mul(centred, centred)?;
        let sum = b.reduce_sum(sq, &[1])?;
        let var = b.div(sum, n)?;
        let eps = b.splat(self.config.rms_norm_eps, row)?;
        let var = b.add(var, eps)?;
        let inv = b.rsqrt(var)?;
        let inv = b.broadcast_in_dim(inv, &[rows, hidden], &[0])?;
        let normed = b.mul(centred, inv)?;
        let normalized = b.convert(normed, self.dt)?;
        let wf = b.convert(w, DType::F32)?;
        let wf = b.broadcast_in_dim(wf, &[rows, hidden], &[1])?;
        let bf = b.convert(bias, DType::F32)?;
        let bf = b.broadcast_in_dim(bf, &[rows, hidden], &[1])?;
        let out = b.mul(normed, wf)?;
        let out = b.add(out, bf)?;
        let out = b.convert(out, self.dt)?;
        Ok(Norm { var, normalized, out })
    }

    /// Records a norm's three hooks: its scale `sqrt(mean(x²) + eps)` (built only when
    /// requested), its normalized input and its output.
    pub fn hook_norm(
        &mut self,
        norm: &Norm,
        scale: HookPoint,
        normalized: HookPoint,
        out: HookPoint,
    ) -> Result<(), ModelError> {
        if self.wants(scale) {
            let s = self.b.sqrt(norm.var)?;
            self.hook(scale, s);
        }
        self.hook(normalized, norm.normalized);
        self.hook(out, norm.out);
        Ok(())
    }
}

/// RMSNorm over `head_dim` of every head of `x` `[tokens, heads, head_dim]` (the q/k norms of
/// Qwen3, and of Gemma 3 with its `(1 + w)` gain), recording its scale, normalized and output
/// hooks: over rows `[tokens·heads, head_dim]`, or in place where the program asks
/// ([`crate::forward::ForwardSpec::norm_heads_in_place`]; the same values).
pub(crate) fn head_norm(
    g: &mut Graph<'_>,
    x: Value,
    weight: &str,
    gain: Gain,
    hooks: [HookPoint; 3],
) -> Result<Value, ModelError> {
    let [scale, normalized, out] = hooks;
    if g.spec.norm_heads_in_place {
        let norm = g.rms_norm_with(x, weight, gain)?;
        g.hook_norm(&norm, scale, normalized, out)?;
        return Ok(norm.out);
    }
    let dims = g.b.dims(x)?.to_vec();
    let rows = g.b.reshape(x, &[dims[0] * dims[1], dims[2]])?;
    let norm = g.rms_norm_with(rows, weight, gain)?;
    g.hook_norm(&norm, scale, normalized, out)?;
    Ok(g.b.reshape(norm.out, &dims)?)
}
