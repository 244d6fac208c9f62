//! A mixture's gated experts over tokens sorted by expert (Hugging Face's
//! `down(silu(gate(x)) * up(x))` per expert, the same with tanh GELU, or GPT-OSS's clamped
//! SwiGLU with a bias after each projection), each expert's weights read where they lie in the stacked tensors.
//!
//! Operands: the tokens `x` `[T, H]` (f32); the `A` routed choices sorted by expert, each
//! one's token and slot (`[A]`, s32: the row of `x` it reads and the row of the result it
//! writes) and each expert's number of them (`[E]`, s32); the stacked weights `gate`, `up`
//! `[E, I, H]` and `down` `[E, H, I]`. Result: each choice's expert output `[A, H]`, by slot.
//! The router's weights and each token's sum over its choices are left to the program.
//!
//! The machine's cores take the experts one at a time, longest queue first. Each expert's
//! queue goes in blocks of 16 or 32 choices (their tokens' rows become the lanes of vector
//! registers, transposed into a scratch buffer), and each projection streams the expert's
//! weight rows once per block, every weight broadcast against the block's tokens; each output
//! is one dot product summed in order over the contracting dimension, in f32 (fused
//! multiply-adds where the CPU has them).

use crate::xla_ffi::{self, CallFrame, DataType, FfiError};

/// The custom-call target of SiLU-gated experts without biases (Qwen3-MoE, Mixtral, OLMoE):
/// operands `x, token, slot, counts, gate, up, down`.
pub const TARGET: &str = "siphon_cpu_experts_silu";

/// The custom-call target of tanh-GELU-gated experts without biases (Gemma 4's mixture): the
/// operands of [`TARGET`].
pub const TARGET_GELU_TANH: &str = "siphon_cpu_experts_gelu_tanh";

/// The custom-call target of GPT-OSS's experts: its clamped SwiGLU ([`Gating::ClampedSwiglu`])
/// and a bias after each projection. Operands: [`TARGET`]'s, then the biases `gate_bias`,
/// `up_bias` `[E, I]`, `down_bias` `[E, H]` and `[alpha, limit]` (`[2]`, f32).
pub const TARGET_CLAMPED_SWIGLU: &str = "siphon_cpu_experts_clamped_swiglu";

/// Vector lanes of one token block: 16 f32s, one AVX-512 register.
const LANES: usize = 16;

/// The XLA FFI handler for [`TARGET`].
///
/// # Safety
/// Called by XLA with a valid call frame.
pub unsafe extern "C" fn handler(frame: *mut CallFrame) -> *mut FfiError {
    // SAFETY: XLA's frame; `execute` reads its buffers only.
    unsafe { xla_ffi::handle(frame, |frame| execute(frame, TARGET)) }
}

/// The XLA FFI handler for [`TARGET_GELU_TANH`].
///
/// # Safety
/// Called by XLA with a valid call frame.
pub unsafe extern "C" fn handler_gelu_tanh(frame: *mut CallFrame) -> *mut FfiError {
    // SAFETY: XLA's frame; `execute` reads its buffers only.
    unsafe { xla_ffi::handle(frame, |frame| execute(frame, TARGET_GELU_TANH)) }
}

/// The XLA FFI handler for [`TARGET_CLAMPED_SWIGLU`].
///
/// # Safety
/// Called by XLA with a valid call frame.
pub unsafe extern "C" fn handler_clamped_swiglu(frame: *mut CallFrame) -> *mut FfiError {
    // SAFETY: XLA's frame; `execute` reads its buffers only.
    unsafe { xla_ffi::handle(frame, |frame| execute(frame, TARGET_CLAMPED_SWIGLU)) }
}

fn execute(frame: &CallFrame, target: &str) -> Result<(), String> {
    let args = xla_ffi::buffers(&frame.args)?;
    let rets = xla_ffi::buffers(&frame.rets)?;
    let operands = if target == TARGET_CLAMPED_SWIGLU { 11 } else { 7 };
    let wrong =
        || format!("{target}: expected {operands} operands and 1 result, got {} and {}", args.len(), rets.len());
    let ([x, token, slot, counts, gate, up, down, extra @ ..], [out]) = (&args[..], &rets[..]) else {
        return Err(wrong());
    };
    if args.len() != operands {
        return Err(wrong());
    }
    let (&[t, h], &[a], &[e, i, _]) = (&x.dims[..], &token.dims[..], &gate.dims[..]) else {
        return Err(format!(
            "{target}: x {:?}, token {:?} or gate {:?} of the wrong rank",
            x.dims, token.dims, gate.dims
        ));
    };
    // SAFETY: each slice is checked against its buffer's dtype and dims; XLA keeps the
    // operands alive and the result to this call for its duration.
    unsafe {
        let (f32s, s32s) = (DataType::F32, DataType::S32);
        let queues = Queues {
            token: token.slice("token", s32s, &[a])?,
            slot: slot.slice("slot", s32s, &[a])?,
            counts: counts.slice("counts", s32s, &[e])?,
        };
        let weights = [
            gate.slice("gate", f32s, &[e, i, h])?,
            up.slice("up", f32s, &[e, i, h])?,
            down.slice("down", f32s, &[e, h, i])?,
        ];
        let (biases, gating) = match extra {
            [gate_bias, up_bias, down_bias, params] => {
                let biases = [
                    gate_bias.slice("gate_bias", f32s, &[e, i])?,
                    up_bias.slice("up_bias", f32s, &[e, i])?,
                    down_bias.slice("down_bias", f32s, &[e, h])?,
                ];
                let &[alpha, limit] = params.slice::<f32>("[alpha, limit]", f32s, &[2])? else {
                    unreachable!("a slice of 2")
                };
                (Some(biases), Gating::ClampedSwiglu { alpha, limit })
            }
            _ if target == TARGET_GELU_TANH => (None, Gating::GeluTanh),
            _ => (None, Gating::Silu),
        };
        experts(
            Shape { experts: e, hidden: h, inner: i },
            x.slice("x", f32s, &[t, h])?,
            &queues,
            &Experts { weights, biases, gating },
            out.slice_mut("out", f32s, &[a, h])?,
        )
    }
}

/// The widths of one mixture.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub experts: usize,
    pub hidden: usize,
    pub inner: usize,
}

/// The routed choices, sorted by expert: each one's token (the row of `x` it reads) and slot
/// (the row of the output it writes), and each expert's number of them (its queue, in order).
#[derive(Debug, Clone, Copy)]
pub struct Queues<'a> {
    pub token: &'a [i32],
    pub slot: &'a [i32],
    pub counts: &'a [i32],
}

/// How an expert combines its gate and up projections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Gating {
    /// `silu(gate) · up`.
    Silu,
    /// `gelu(gate) · up`, GELU's tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
    /// GPT-OSS's `(clamp(up, ±limit) + 1) · g · σ(alpha · g)` with `g = min(gate, limit)`.
    ClampedSwiglu { alpha: f32, limit: f32 },
}

impl Gating {
    #[inline(always)]
    fn apply(self, gate: f32, up: f32) -> f32 {
        let sigmoid = |z: f32| 1.0 / (1.0 + (-z).exp());
        match self {
            Gating::Silu => gate * sigmoid(gate) * up,
            Gating::GeluTanh => {
                let inner = (gate + gate * gate * gate * 0.044715) * (2.0 / std::f64::consts::PI).sqrt() as f32;
                gate * 0.5 * (inner.tanh() + 1.0) * up
            }
            Gating::ClampedSwiglu { alpha, limit } => {
                let g = gate.min(limit);
                (up.clamp(-limit, limit) + 1.0) * (g * sigmoid(g * alpha))
            }
        }
    }
}

/// A mixture's experts: the stacked weights `gate`, `up` `[E, I, H]` and `down` `[E, H, I]`,
/// the biases added after each projection (`[E, I]`, `[E, I]`, `[E, H]`) if any, the gating.
#[derive(Debug, Clone, Copy)]
pub struct Experts<'a> {
    pub weights: [&'a [f32]; 3],
    pub biases: Option<[&'a [f32]; 3]>,
    pub gating: Gating,
}

impl<'a> Experts<'a> {
    /// Expert `ex` alone, of checked stacks.
    fn expert(&self, ex: usize, (h, i): (usize, usize)) -> Experts<'a> {
        let n = i * h;
        Experts {
            weights: self.weights.map(|w| &w[ex * n..(ex + 1) * n]),
            biases: self.biases.map(|[g, u, d]| [&g[ex * i..][..i], &u[ex * i..][..i], &d[ex * h..][..h]]),
            gating: self.gating,
        }
    }

    /// The custom-call target computing these experts, which names them in errors.
    fn target(&self) -> &'static str {
        match self.gating {
            Gating::Silu => TARGET,
            Gating::GeluTanh => TARGET_GELU_TANH,
            Gating::ClampedSwiglu { .. } => TARGET_CLAMPED_SWIGLU,
        }
    }
}

/// `out[slot] = down_e · gating(gate_e · x[token], up_e · x[token])` (each projection plus
/// its bias, if any) for every choice of each expert `e`'s queue. Refuses queues that do not
/// cover the choices, tokens outside `x`, slots that are not each output row once, and
/// weights or biases of other sizes.
pub fn experts(shape: Shape, x: &[f32], queues: &Queues<'_>, w: &Experts<'_>, out: &mut [f32]) -> Result<(), String> {
    let Shape { experts: e, hidden: h, inner: i } = shape;
    let target = w.target();
    let (t, a) = (x.len() / h.max(1), queues.token.len());
    let total: i64 = queues.counts.iter().map(|&c| c as i64).sum();
    if queues.counts.len() != e || queues.counts.iter().any(|&c| c < 0) || total != a as i64 {
        return Err(format!("{target}: {e} experts' queues {:?} do not hold the {a} choices", queues.counts));
    }
    if queues.slot.len() != a || out.len() != a * h || x.len() != t * h {
        return Err(format!(
            "{target}: {} slots and {} outputs for {a} choices",
            queues.slot.len(),
            out.len() / h.max(1)
        ));
    }
    if let Some(bad) = queues.token.iter().find(|&&v| v < 0 || v as usize >= t) {
        return Err(format!("{target}: token {bad} outside the {t} rows of x"));
    }
    let mut seen = vec![false; a];
    for &v in queues.slot {
        if v < 0 || v as usize >= a || std::mem::replace(&mut seen[v as usize], true) {
            return Err(format!("{target}: slot {v} outside the {a} outputs or given twice"));
        }
    }
    if w.weights.map(|w| w.len()) != [e * i * h; 3] {
        return Err(format!("{target}: weights of {:?} values, expected {e} x {i} x {h}", w.weights.map(|w| w.len())));
    }
    if let Some(biases) = w.biases.filter(|b| b.map(|b| b.len()) != [e * i, e * i, e * h]) {
        return Err(format!(
            "{target}: biases of {:?} values, expected {e} x {i} and {e} x {h}",
            biases.map(|b| b.len())
        ));
    }
    run(Isa::detect(), shape, x, queues, w, out);
    Ok(())
}

/// The output rows, written from several threads: each row by the one choice whose slot it is.
#[derive(Clone, Copy)]
struct Rows(*mut f32);

// SAFETY: the slots are checked to be every row once, so no two threads write one row, and
// nothing reads the rows until the threads are joined.
unsafe impl Send for Rows {}
unsafe impl Sync for Rows {}

/// [`experts`] with `isa`'s instructions, on checked queues.
fn run(isa: Isa, shape: Shape, x: &[f32], queues: &Queues<'_>, w: &Experts<'_>, out: &mut [f32]) {
    let Shape { experts: e, hidden: h, inner: i } = shape;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(queues.token.len().max(1));
    let starts: Vec<usize> =
        queues.counts.iter().scan(0, |s, &c| Some(std::mem::replace(s, *s + c as usize))).collect();
    // The experts with choices, longest queue first; each core takes the next one left.
    let mut order: Vec<usize> = (0..e).filter(|&x| queues.counts[x] > 0).collect();
    order.sort_by_key(|&x| std::cmp::Reverse(queues.counts[x]));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let rows = Rows(out.as_mut_ptr());
    let work = || {
        let mut scratch = Scratch::new(h, i, isa.max_block());
        while let Some(&ex) = order.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
            let range = starts[ex]..starts[ex] + queues.counts[ex] as usize;
            let choices = (&queues.token[range.clone()], &queues.slot[range]);
            expert(isa, &w.expert(ex, (h, i)), x, choices, rows, (h, i), &mut scratch);
        }
    };
    // The calling thread is one of the cores.
    std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(work);
        }
        work();
    });
}

/// One core's buffers: a block of tokens transposed (`[H, lanes]`), the gate's and up's
/// outputs (`[I, lanes]`) and the down projection's (`[H, lanes]`).
struct Scratch {
    xt: Vec<f32>,
    gt: Vec<f32>,
    ut: Vec<f32>,
    yt: Vec<f32>,
}

impl Scratch {
    fn new(h: usize, i: usize, lanes: usize) -> Scratch {
        Scratch {
            xt: vec![0.0; h * lanes],
            gt: vec![0.0; i * lanes],
            ut: vec![0.0; i * lanes],
            yt: vec![0.0; h * lanes],
        }
    }
}

/// One expert's queue, its choices' `(tokens, slots)`: the rows of `x` the tokens name through
/// its weights (and biases), into the output rows the slots name.
fn expert(
    isa: Isa,
    w: &Experts<'_>,
    x: &[f32],
    (tokens, slots): (&[i32], &[i32]),
    out: Rows,
    (h, i): (usize, usize),
    s: &mut Scratch,
) {
    let n = tokens.len();
    let mut first = 0;
    while first < n {
        let lanes = if n - first > LANES { isa.max_block() } else { LANES };
        let m = (n - first).min(lanes);
        // Tokens into lanes; lanes past the block's tokens stay zero.
        let xt = &mut s.xt[..h * lanes];
        xt.fill(0.0);
        for (lane, &token) in tokens[first..first + m].iter().enumerate() {
            for (k, &v) in x[token as usize * h..][..h].iter().enumerate() {
                xt[k * lanes + lane] = v;
            }
        }
        let (gt, ut, yt) = (&mut s.gt[..i * lanes], &mut s.ut[..i * lanes], &mut s.yt[..h * lanes]);
        let [gate, up, down] = w.weights;
        let bias = |part: usize, yt: &mut [f32]| {
            for (row, &b) in w.biases.map_or(&[][..], |biases| biases[part]).iter().enumerate() {
                yt[row * lanes..][..lanes].iter_mut().for_each(|v| *v += b);
            }
        };
        isa.project(gate, h, xt, gt, lanes);
        bias(0, gt);
        isa.project(up, h, xt, ut, lanes);
        bias(1, ut);
        for (g, &u) in gt.iter_mut().zip(ut.iter()) {
            *g = w.gating.apply(*g, u);
        }
        isa.project(down, i, gt, yt, lanes);
        bias(2, yt);
        for (lane, &slot) in slots[first..first + m].iter().enumerate() {
            // SAFETY: `slot` is one of the output's rows, this choice's alone (checked).
            let row = unsafe { std::slice::from_raw_parts_mut(out.0.add(slot as usize * h), h) };
            for (k, v) in row.iter_mut().enumerate() {
                *v = yt[k * lanes + lane];
            }
        }
        first += m;
    }
}

/// The vector instructions the kernel is compiled for, chosen once per call.
#[derive(Debug, Clone, Copy)]
enum Isa {
    Avx512,
    Avx2,
    Generic,
}

impl Isa {
    fn detect() -> Isa {
        Isa::available()[0]
    }

    /// The instruction sets this CPU runs, widest first.
    fn available() -> Vec<Isa> {
        let mut isas = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("fma") {
                isas.push(Isa::Avx512);
            }
            if has!("avx2") && has!("fma") {
                isas.push(Isa::Avx2);
            }
        }
        isas.push(Isa::Generic);
        isas
    }

    /// The widest token block: 32 where 32 registers hold two blocks' accumulators.
    fn max_block(self) -> usize {
        match self {
            Isa::Avx512 => 2 * LANES,
            _ => LANES,
        }
    }

    /// `yt[r] = Σ_k w[r, k] · xt[k]` over `lanes` token lanes, for every row `r` of `w`
    /// (`[n, k]`).
    fn project(self, w: &[f32], k: usize, xt: &[f32], yt: &mut [f32], lanes: usize) {
        match (self, lanes) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: detected.
            (Isa::Avx512, 32) => unsafe { x86::avx512_32(w, k, xt, yt) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: detected.
            (Isa::Avx512, _) => unsafe { x86::avx512_16(w, k, xt, yt) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: detected.
            (Isa::Avx2, _) => unsafe { x86::avx2_16(w, k, xt, yt) },
            _ => project::<1, 4, false>(w, k, xt, yt),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::project;

    #[target_feature(enable = "avx512f,fma")]
    pub(super) fn avx512_32(w: &[f32], k: usize, xt: &[f32], yt: &mut [f32]) {
        project::<2, 12, true>(w, k, xt, yt)
    }

    #[target_feature(enable = "avx512f,fma")]
    pub(super) fn avx512_16(w: &[f32], k: usize, xt: &[f32], yt: &mut [f32]) {
        project::<1, 12, true>(w, k, xt, yt)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn avx2_16(w: &[f32], k: usize, xt: &[f32], yt: &mut [f32]) {
        project::<1, 6, true>(w, k, xt, yt)
    }
}

/// How far ahead of each weight row's reads [`project`] asks for its lines, in weights: four
/// lines. The hardware's prefetchers stop at each 4 KiB page and restart on each new row (a
/// down projection's rows are 3 KiB for Qwen3-30B-A3B); asking ahead keeps the rows streaming.
const PREFETCH: usize = 4 * LANES;

/// Asks for the cache line holding `v`, into every level.
#[inline(always)]
fn prefetch(v: &f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it reads nothing and cannot fault.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((v as *const f32).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = v;
}

/// `a · b + c`, fused where `FMA`.
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// [`Isa::project`] for `B` blocks of [`LANES`] tokens, `R` weight rows at a time (`R · B`
/// accumulator registers): each weight is broadcast against the `B · LANES` tokens of its
/// column of `xt`.
#[inline(always)]
fn project<const B: usize, const R: usize, const FMA: bool>(w: &[f32], k: usize, xt: &[f32], yt: &mut [f32]) {
    let lanes = B * LANES;
    let n = w.len() / k;
    let mut r0 = 0;
    while r0 < n {
        let rows = (n - r0).min(R);
        let mut acc = [[[0f32; LANES]; B]; R];
        let w_rows: [&[f32]; R] = std::array::from_fn(|r| &w[(r0 + r.min(rows - 1)) * k..][..k]);
        for k0 in (0..k).step_by(LANES) {
            // Every 16 weights, each row's line `PREFETCH` ahead; past a row's end, the line of
            // the row the next group reads in its place.
            for r in 0..R {
                let ahead = k0 + PREFETCH;
                let at = if ahead < k { (r0 + r) * k + ahead } else { (r0 + r + R) * k + ahead - k };
                if let Some(v) = w.get(at) {
                    prefetch(v);
                }
            }
            for kk in k0..(k0 + LANES).min(k) {
                let x = &xt[kk * lanes..(kk + 1) * lanes];
                for r in 0..R {
                    let b = w_rows[r][kk];
                    for blk in 0..B {
                        for l in 0..LANES {
                            acc[r][blk][l] = madd::<FMA>(b, x[blk * LANES + l], acc[r][blk][l]);
                        }
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate().take(rows) {
            for (blk, acc) in acc.iter().enumerate() {
                let at = (r0 + r) * lanes + blk * LANES;
                yt[at..at + LANES].copy_from_slice(acc);
            }
        }
        r0 += rows;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The same sums in f64, one choice at a time (HF's `down(gating(gate(x), up(x)))`).
    fn reference(shape: Shape, x: &[f32], q: &Queues<'_>, w: &Experts<'_>) -> Vec<f64> {
        let Shape { hidden: h, inner: i, .. } = shape;
        let [gate, up, down] = w.weights;
        let bias = |part: usize, at: usize| w.biases.map_or(0.0, |b| b[part][at] as f64);
        let sigmoid = |z: f64| 1.0 / (1.0 + (-z).exp());
        let mut out = vec![0.0; q.token.len() * h];
        let experts = q.counts.iter().enumerate().flat_map(|(ex, &c)| std::iter::repeat_n(ex, c as usize));
        for ((ex, &token), &slot) in experts.zip(q.token).zip(q.slot) {
            let xr = &x[token as usize * h..][..h];
            let act: Vec<f64> = (0..i)
                .map(|j| {
                    let dot = |w: &[f32]| (0..h).map(|k| w[(ex * i + j) * h + k] as f64 * xr[k] as f64).sum::<f64>();
                    let (g, u) = (dot(gate) + bias(0, ex * i + j), dot(up) + bias(1, ex * i + j));
                    match w.gating {
                        Gating::Silu => g * sigmoid(g) * u,
                        Gating::GeluTanh => {
                            let inner = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
                            0.5 * g * (1.0 + inner.tanh()) * u
                        }
                        Gating::ClampedSwiglu { alpha, limit } => {
                            let (g, limit) = (g.min(limit as f64), limit as f64);
                            (u.clamp(-limit, limit) + 1.0) * g * sigmoid(alpha as f64 * g)
                        }
                    }
                })
                .collect();
            for o in 0..h {
                out[slot as usize * h + o] =
                    (0..i).map(|j| down[(ex * h + o) * i + j] as f64 * act[j]).sum::<f64>() + bias(2, ex * h + o);
            }
        }
        out
    }

    /// `n` pseudo-random values in [-0.25, 0.25], the same for a `seed` (the crate's tests' inputs).
    pub(crate) fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32 - 0.5) * 0.5
            })
            .collect()
    }

    #[test]
    fn matches_the_sums_in_f64_for_every_queue_length_and_gating() {
        // Queues of 0 (an expert no token chose), 1, a block of 16 and one over, 32 and 33
        // choices: every block width and every remainder of weight rows (I = 29, H = 23); the
        // tokens repeat (several choices of one token) and the slots are shuffled. SiLU and tanh
        // GELU without biases, GPT-OSS's clamped SwiGLU with biases at a limit the values cross.
        let shape = Shape { experts: 7, hidden: 23, inner: 29 };
        let counts = [3, 0, 16, 17, 1, 32, 33];
        let a: usize = counts.iter().sum::<i32>() as usize;
        let (t, h, i, e) = (41, shape.hidden, shape.inner, shape.experts);
        let token: Vec<i32> = (0..a).map(|c| (c * 7 % t) as i32).collect();
        let slot: Vec<i32> = (0..a).map(|c| (c * 37 % a) as i32).collect();
        let q = Queues { token: &token, slot: &slot, counts: &counts };
        let x = values(t * h, 1);
        let (gate, up, down) = (values(e * i * h, 2), values(e * i * h, 3), values(e * h * i, 4));
        let (gate_b, up_b, down_b) = (values(e * i, 5), values(e * i, 6), values(e * h, 7));
        let silu = Experts { weights: [&gate, &up, &down], biases: None, gating: Gating::Silu };
        let clamped = Experts {
            biases: Some([&gate_b, &up_b, &down_b]),
            gating: Gating::ClampedSwiglu { alpha: 1.702, limit: 0.05 },
            ..silu
        };
        let gelu = Experts { gating: Gating::GeluTanh, ..silu };
        for w in [silu, gelu, clamped] {
            let want = reference(shape, &x, &q, &w);
            let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
            let check = |out: &[f32], isa: &str| {
                for (r, (&got, &want)) in out.iter().zip(&want).enumerate() {
                    assert!(
                        (got as f64 - want).abs() <= 1e-5 * scale,
                        "{:?}, {isa}: row {} col {}: {got} vs {want}",
                        w.gating,
                        r / h,
                        r % h
                    );
                }
            };
            let mut out = vec![f32::NAN; a * h];
            experts(shape, &x, &q, &w, &mut out).unwrap();
            check(&out, "detected");
            for isa in Isa::available() {
                let mut out = vec![f32::NAN; a * h];
                run(isa, shape, &x, &q, &w, &mut out);
                check(&out, &format!("{isa:?}"));
            }
        }
    }

    #[test]
    fn queues_tokens_and_slots_are_checked() {
        let shape = Shape { experts: 2, hidden: 2, inner: 2 };
        let (x, w) = (vec![0.0; 4], vec![0.0; 8]);
        let mut out = vec![0.0; 6];
        let silu = Experts { weights: [&w, &w, &w], biases: None, gating: Gating::Silu };
        let mut run = |token: &[i32], slot: &[i32], counts: &[i32]| {
            experts(shape, &x, &Queues { token, slot, counts }, &silu, &mut out).unwrap_err()
        };
        let err = run(&[0, 1, 1], &[0, 1, 2], &[1, 1]);
        assert!(err.contains("queues [1, 1] do not hold the 3 choices"), "{err}");
        let err = run(&[0, 2, 1], &[0, 1, 2], &[1, 2]);
        assert!(err.contains("token 2 outside the 2 rows of x"), "{err}");
        let err = run(&[0, 1, 1], &[0, 1, 1], &[1, 2]);
        assert!(err.contains("slot 1 outside the 3 outputs or given twice"), "{err}");
        let q = Queues { token: &[0, 1, 1], slot: &[0, 1, 2], counts: &[1, 2] };
        let short = [0.0; 3];
        let biased = Experts { biases: Some([&w[..4], &w[..4], &short]), ..silu };
        let err = experts(shape, &x, &q, &biased, &mut out).unwrap_err();
        assert!(err.contains("biases of [4, 4, 3] values, expected 2 x 2 and 2 x 2"), "{err}");
    }
}
