//! The forward graphs run on the PJRT CPU plugin and compared with a plain-Rust reference
//! forward (f64 accumulation) written here from Hugging Face's definitions, at every hook
//! point, for left- and right-padded rows; and the 2x4-mesh run against the single-device
//! run. The plugin path comes from `SIPHON_PJRT_PLUGIN` (set by scripts/test.sh), else
//! siphon's cache directory (`scripts/install-plugin.sh` puts it there).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use siphon_hlo::DType;
use siphon_mesh::Mesh;
use siphon_models::config::{Attention, Rope};
use siphon_models::{Arch, ForwardProgram, ForwardSpec, HookKind, HookPoint, ModelConfig, RopeScaling, build_forward};
use siphon_runtime::{Client, ClientOptions, CompileOptions, HostArray, Plugin};

/// A fresh 8-device client per test, dropped when the test ends: a client left alive in a
/// static until process exit races XLA's own static destructors (abort at exit).
fn client() -> Client {
    static PLUGIN: OnceLock<Arc<Plugin>> = OnceLock::new();
    let plugin = PLUGIN.get_or_init(|| {
        let path = std::env::var_os("SIPHON_PJRT_PLUGIN")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(siphon_runtime::default_cpu_plugin_path);
        assert!(path.is_file(), "no PJRT CPU plugin at {}: run scripts/install-plugin.sh", path.display());
        Plugin::load(&path).expect("load the CPU plugin")
    });
    Client::new(plugin, ClientOptions::new().cpu_device_count(8)).unwrap()
}

fn config(name: &str, n_heads: usize, n_kv_heads: usize) -> ModelConfig {
    let arch: Arch = name.parse().unwrap();
    ModelConfig {
        arch,
        vocab_size: 50,
        hidden_size: 32,
        intermediate_size: 48,
        n_layers: 3,
        rms_norm_eps: 1e-5,
        max_position_embeddings: 64,
        tie_word_embeddings: name == "qwen2",
        attention: Attention { n_heads, n_kv_heads, head_dim: 8, qkv_bias: name == "qwen2", ..Default::default() },
        rope: Rope { theta: 10000.0, ..Default::default() },
        ..ModelConfig::default()
    }
}

/// Deterministic pseudo-random weights, scaled by 1/sqrt(fan-in) so activations stay O(1);
/// norm weights around 1.
fn weights(c: &ModelConfig, seed: u64) -> HashMap<String, Vec<f32>> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 33) as f64 / (1u64 << 31) as f64) as f32 * 2.0 - 1.0
    };
    c.params(c.n_layers, false)
        .into_iter()
        .map(|p| {
            let n: usize = p.shape.iter().product();
            let values: Vec<f32> = if p.name.contains("norm") {
                (0..n).map(|_| 1.0 + 0.2 * next()).collect()
            } else {
                let scale =
                    if p.shape.len() == 2 && !p.name.contains("embed") { (p.shape[1] as f32).powf(-0.5) } else { 0.5 };
                (0..n).map(|_| next() * scale).collect()
            };
            (p.name, values)
        })
        .collect()
}

/// Runs `program` on the weights and inputs; returns each output as f32, row-major.
fn run(
    program: &ForwardProgram,
    w: &HashMap<String, Vec<f32>>,
    ids: &[i32],
    mask: &[i32],
    pos: &[i32],
) -> Vec<Vec<f32>> {
    let client = client();
    let mut arrays: Vec<HostArray> = program
        .params
        .iter()
        .map(|p| {
            let v = &w[&p.name];
            match program.param_dtype {
                DType::BF16 => {
                    let v: Vec<half::bf16> = v.iter().map(|&x| half::bf16::from_f32(x)).collect();
                    HostArray::from_slice(&p.shape, &v).unwrap()
                }
                _ => HostArray::from_slice(&p.shape, v).unwrap(),
            }
        })
        .collect();
    for (input, data) in program.inputs.iter().zip([ids, mask, pos]) {
        arrays.push(HostArray::from_slice(&input.shape, data).unwrap());
    }
    let mesh = &program.mesh;
    if mesh.axes().is_empty() {
        let exe = client.compile(&program.text, &CompileOptions::single_device(None)).unwrap();
        let device = exe.device_ids()[0];
        let bufs: Vec<_> = arrays.iter().map(|a| client.upload(a, device).unwrap()).collect();
        let out = exe.execute(&[bufs.iter().collect()]).unwrap();
        out[0].iter().map(|b| b.to_host().unwrap().to_f32()).collect()
    } else {
        let exe = client.compile(&program.text, &CompileOptions::spmd(mesh)).unwrap();
        let specs = program.param_specs.iter().chain(program.inputs.iter().map(|i| &i.spec));
        let args: Vec<_> = arrays.iter().zip(specs).map(|(a, s)| client.upload_sharded(a, s, mesh).unwrap()).collect();
        let out_specs: Vec<_> = program.outputs.iter().map(|o| o.spec.clone()).collect();
        let out = exe.execute_sharded(mesh, &args.iter().collect::<Vec<_>>(), &out_specs).unwrap();
        out.iter().map(|a| a.to_host().unwrap().to_f32()).collect()
    }
}

// ------------------------------------------------------------------ reference forward

/// `x [t, k] · w[n, k]ᵀ (+ b)`.
fn linear(x: &[f64], w: &[f32], b: Option<&[f32]>, t: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; t * n];
    for i in 0..t {
        for j in 0..n {
            let mut s: f64 = (0..k).map(|l| x[i * k + l] * w[j * k + l] as f64).sum();
            if let Some(b) = b {
                s += b[j] as f64;
            }
            out[i * n + j] = s;
        }
    }
    out
}

fn rms_norm(x: &[f64], w: &[f32], eps: f64, h: usize) -> Vec<f64> {
    x.chunks(h)
        .flat_map(|row| {
            let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / h as f64 + eps).sqrt();
            row.iter().zip(w).map(move |(v, &g)| v * inv * g as f64)
        })
        .collect()
}

fn inv_freq(c: &ModelConfig) -> Vec<f64> {
    let factor = match c.rope.scaling {
        Some(RopeScaling::Linear { factor }) => factor,
        None => 1.0,
        _ => panic!("the reference knows linear scaling only"),
    };
    (0..c.attention.head_dim / 2)
        .map(|i| c.rope.theta.powf(-((2 * i) as f64) / c.attention.head_dim as f64) / factor)
        .collect()
}

/// Rotates each head of `x [t, heads*d]` in place (rotate-half).
fn rope(x: &mut [f64], pos: &[i32], freqs: &[f64], heads: usize, d: usize) {
    for (ti, &p) in pos.iter().enumerate() {
        for h in 0..heads {
            let base = ti * heads * d + h * d;
            for i in 0..d / 2 {
                let (s, c) = (p as f64 * freqs[i]).sin_cos();
                let (a, b) = (x[base + i], x[base + i + d / 2]);
                x[base + i] = a * c - b * s;
                x[base + i + d / 2] = b * c + a * s;
            }
        }
    }
}

/// Hugging Face semantics; returns every hook of every block, each `[b*s, hidden]`.
fn reference(
    c: &ModelConfig,
    w: &HashMap<String, Vec<f32>>,
    bsz: usize,
    s: usize,
    ids: &[i32],
    mask: &[i32],
    pos: &[i32],
) -> HashMap<HookPoint, Vec<f64>> {
    let (h, d, nh, nkv, inter) =
        (c.hidden_size, c.attention.head_dim, c.attention.n_heads, c.attention.n_kv_heads, c.intermediate_size);
    let t = bsz * s;
    let freqs = inv_freq(c);
    let emb = &w["model.embed_tokens.weight"];
    let mut x: Vec<f64> =
        ids.iter().flat_map(|&i| emb[i as usize * h..(i as usize + 1) * h].iter().map(|&v| v as f64)).collect();
    let mut hooks = HashMap::new();
    for l in 0..c.n_layers {
        let p = |n: &str| format!("model.layers.{l}.{n}");
        let bias = |n: &str| c.attention.qkv_bias.then(|| w[&p(n)].as_slice());
        hooks.insert(HookPoint::block(l, HookKind::ResidPre), x.clone());
        let n = rms_norm(&x, &w[&p("input_layernorm.weight")], c.rms_norm_eps, h);
        let mut q = linear(&n, &w[&p("self_attn.q_proj.weight")], bias("self_attn.q_proj.bias"), t, h, nh * d);
        let mut k = linear(&n, &w[&p("self_attn.k_proj.weight")], bias("self_attn.k_proj.bias"), t, h, nkv * d);
        let v = linear(&n, &w[&p("self_attn.v_proj.weight")], bias("self_attn.v_proj.bias"), t, h, nkv * d);
        rope(&mut q, pos, &freqs, nh, d);
        rope(&mut k, pos, &freqs, nkv, d);
        let mut attn = vec![0.0; t * nh * d];
        for b in 0..bsz {
            for head in 0..nh {
                let kvh = head / (nh / nkv);
                for i in 0..s {
                    let qi = &q[(b * s + i) * nh * d + head * d..][..d];
                    let allowed: Vec<usize> = (0..=i).filter(|&j| mask[b * s + j] != 0).collect();
                    if allowed.is_empty() {
                        continue; // a pad query with no real key: not compared
                    }
                    let scores: Vec<f64> = allowed
                        .iter()
                        .map(|&j| {
                            let kj = &k[(b * s + j) * nkv * d + kvh * d..][..d];
                            qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt()
                        })
                        .collect();
                    let mx = scores.iter().cloned().fold(f64::MIN, f64::max);
                    let z: f64 = scores.iter().map(|s| (s - mx).exp()).sum();
                    for (&j, sc) in allowed.iter().zip(&scores) {
                        let pj = (sc - mx).exp() / z;
                        for e in 0..d {
                            attn[(b * s + i) * nh * d + head * d + e] += pj * v[(b * s + j) * nkv * d + kvh * d + e];
                        }
                    }
                }
            }
        }
        let a = linear(&attn, &w[&p("self_attn.o_proj.weight")], None, t, nh * d, h);
        hooks.insert(HookPoint::block(l, HookKind::AttnOut), a.clone());
        let hs: Vec<f64> = x.iter().zip(&a).map(|(x, a)| x + a).collect();
        let n = rms_norm(&hs, &w[&p("post_attention_layernorm.weight")], c.rms_norm_eps, h);
        let g = linear(&n, &w[&p("mlp.gate_proj.weight")], None, t, h, inter);
        let u = linear(&n, &w[&p("mlp.up_proj.weight")], None, t, h, inter);
        let act: Vec<f64> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
        let m = linear(&act, &w[&p("mlp.down_proj.weight")], None, t, inter, h);
        hooks.insert(HookPoint::block(l, HookKind::MlpOut), m.clone());
        x = hs.iter().zip(&m).map(|(a, b)| a + b).collect();
        hooks.insert(HookPoint::block(l, HookKind::ResidPost), x.clone());
    }
    hooks.insert(HookPoint::model(HookKind::LnFinalOut), rms_norm(&x, &w["model.norm.weight"], c.rms_norm_eps, h));
    hooks
}

// ------------------------------------------------------------------ inputs

/// Row 0 right-padded (3 pads), row 1 left-padded (2 pads), positions cumsum(mask)-1
/// (pads get 1, as Hugging Face's `masked_fill` does).
fn padded_batch(s: usize, vocab: usize) -> (Vec<i32>, Vec<i32>, Vec<i32>) {
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    for row in 0..2 {
        for i in 0..s {
            ids.push(((row * 7 + i * 13 + 3) % vocab) as i32);
            let real = if row == 0 { i < s - 3 } else { i >= 2 };
            mask.push(real as i32);
        }
    }
    (ids.clone(), mask.clone(), positions(&mask, s))
}

fn positions(mask: &[i32], s: usize) -> Vec<i32> {
    mask.chunks(s)
        .flat_map(|row| {
            let mut seen = 0;
            row.iter().map(move |&m| {
                seen += m;
                if m == 0 { 1 } else { seen - 1 }
            })
        })
        .collect()
}

fn all_hooks(n_layers: usize) -> Vec<HookPoint> {
    let mut hooks = vec![HookPoint::model(HookKind::LnFinalOut)];
    for l in 0..n_layers {
        hooks.extend([
            HookPoint::block(l, HookKind::ResidPre),
            HookPoint::block(l, HookKind::AttnOut),
            HookPoint::block(l, HookKind::MlpOut),
            HookPoint::block(l, HookKind::ResidPost),
        ]);
    }
    hooks
}

/// Max |a - b| over real-token rows.
fn max_diff_real(a: &[f32], b: &[f64], mask: &[i32], h: usize) -> f64 {
    let mut worst = 0.0f64;
    for (t, &m) in mask.iter().enumerate() {
        if m != 0 {
            for e in 0..h {
                worst = farther(worst, a[t * h + e] as f64 - b[t * h + e]);
            }
        }
    }
    worst
}

fn check_against_reference(c: &ModelConfig) {
    check_spec_against_reference(c, |_| ());
}

/// [`check_against_reference`] with the spec changed by `with` (a program form that must not
/// change a value).
fn check_spec_against_reference(c: &ModelConfig, with: impl Fn(&mut ForwardSpec)) {
    let s = 7;
    let w = weights(c, 11);
    let (ids, mask, pos) = padded_batch(s, c.vocab_size);
    let hooks = all_hooks(c.n_layers);
    let mut spec = ForwardSpec::new(2, s, hooks.clone());
    with(&mut spec);
    let program = build_forward(c, &spec).unwrap();
    let outs = run(&program, &w, &ids, &mask, &pos);
    let want = reference(c, &w, 2, s, &ids, &mask, &pos);
    for (out, info) in outs.iter().zip(&program.outputs) {
        assert_eq!(out.len(), 2 * s * c.hidden_size);
        assert!(out.iter().all(|v| v.is_finite()), "{}: non-finite values (pad rows included)", info.hook);
        let diff = max_diff_real(out, &want[&info.hook], &mask, c.hidden_size);
        assert!(diff <= 1e-4, "{:?} {}: max-abs diff {diff}", c.arch, info.hook);
    }
    // A padded row gives the activations of the same tokens run alone, unpadded.
    let real: Vec<usize> = (0..s).filter(|&i| mask[s + i] != 0).collect();
    let alone_ids: Vec<i32> = real.iter().map(|&i| ids[s + i]).collect();
    let n = alone_ids.len();
    let alone = build_forward(c, &ForwardSpec::new(1, n, vec![HookPoint::model(HookKind::LnFinalOut)])).unwrap();
    let alone_out = run(&alone, &w, &alone_ids, &vec![1; n], &(0..n as i32).collect::<Vec<_>>());
    let h = c.hidden_size;
    let padded = &outs[0];
    for (k, &i) in real.iter().enumerate() {
        for e in 0..h {
            let (a, b) = (alone_out[0][k * h + e], padded[(s + i) * h + e]);
            assert!((a - b).abs() <= 1e-5, "left-padded row differs from unpadded run at {i},{e}: {a} vs {b}");
        }
    }
}

#[test]
fn qwen2_matches_reference_at_every_hook_with_padding() {
    check_against_reference(&config("qwen2", 4, 2));
}

#[test]
fn llama_matches_reference_at_every_hook_with_padding() {
    let mut c = config("llama", 4, 1);
    c.rope.scaling = Some(RopeScaling::Linear { factor: 2.0 });
    check_against_reference(&c);
}

/// The MLP over the sequence in chunks (a CUDA program's form, here 3 + 3 + 1 positions of
/// the 7): every hook as Hugging Face computes it.
#[test]
fn llama_with_its_mlp_in_chunks_matches_reference() {
    let c = config("llama", 4, 1);
    let chunks = |spec: &mut ForwardSpec| spec.mlp_chunk = Some(2 * 3 * c.intermediate_size);
    let program = |with: &dyn Fn(&mut ForwardSpec)| {
        let mut spec = ForwardSpec::new(2, 7, vec![HookPoint::block(0, HookKind::MlpOut)]);
        with(&mut spec);
        build_forward(&c, &spec).unwrap().text
    };
    let slices = |text: &str| text.matches("stablehlo.slice").count();
    assert_eq!(slices(&program(&chunks)), slices(&program(&|_| ())) + 3, "three chunks of block 0's MLP");
    check_spec_against_reference(&c, chunks);
}

#[test]
fn mesh_2x4_equals_single_device() {
    let mesh = Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap();
    // Four kv heads split evenly over model=4, and two kv heads (each split in halves).
    for (nh, nkv) in [(8, 4), (4, 2)] {
        let c = config("qwen2", nh, nkv);
        let w = weights(&c, 5);
        let (bsz, s) = (4, 6);
        let ids: Vec<i32> = (0..bsz * s).map(|i| ((i * 17 + 5) % c.vocab_size) as i32).collect();
        let mask: Vec<i32> = (0..bsz * s).map(|i| (i % s >= (i / s) % 3) as i32).collect();
        let pos = positions(&mask, s);
        let hooks = vec![
            HookPoint::block(1, HookKind::AttnOut),
            HookPoint::block(0, HookKind::ResidPost),
            HookPoint::model(HookKind::LnFinalOut),
            HookPoint::block(2, HookKind::MlpOut),
        ];
        let single = build_forward(&c, &ForwardSpec::new(bsz, s, hooks.clone())).unwrap();
        let sharded = ForwardSpec::new(bsz, s, hooks).with_megatron_plan(&c, mesh.clone());
        // and with the MLP in chunks of 2 positions, as a CUDA program runs it
        let mut chunked = sharded.clone();
        chunked.mlp_chunk = Some(bsz * 2 * c.intermediate_size);
        let a = run(&single, &w, &ids, &mask, &pos);
        for (form, spec) in [("", sharded), (" (MLP in chunks)", chunked)] {
            let b = run(&build_forward(&c, &spec).unwrap(), &w, &ids, &mask, &pos);
            for ((x, y), info) in a.iter().zip(&b).zip(&single.outputs) {
                let diff = x.iter().zip(y).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
                assert!(
                    diff <= 1e-5,
                    "heads {nh}/{nkv} {}: 2x4 mesh{form} differs from one device by {diff}",
                    info.hook
                );
            }
        }
    }
}

#[test]
fn bf16_compute_and_f16_output_track_f32() {
    let c = config("qwen2", 4, 2);
    let w = weights(&c, 3);
    let (ids, mask, pos) = padded_batch(5, c.vocab_size);
    let hooks = vec![HookPoint::block(2, HookKind::ResidPost)];
    let f32_run = run(&build_forward(&c, &ForwardSpec::new(2, 5, hooks.clone())).unwrap(), &w, &ids, &mask, &pos);
    let mut spec = ForwardSpec::new(2, 5, hooks);
    spec.compute_dtype = DType::BF16;
    spec.output_dtype = DType::F16;
    let program = build_forward(&c, &spec).unwrap();
    assert_eq!(program.outputs[0].dtype, DType::F16);
    let low = run(&program, &w, &ids, &mask, &pos);
    let scale = f32_run[0].iter().map(|v| v.abs()).fold(0.0f32, f32::max);
    for (t, &m) in mask.iter().enumerate() {
        if m == 0 {
            continue;
        }
        for e in 0..c.hidden_size {
            let (a, b) = (f32_run[0][t * c.hidden_size + e], low[0][t * c.hidden_size + e]);
            assert!((a - b).abs() <= 0.05 * scale, "bf16 run strays at {t},{e}: {a} vs {b}");
        }
    }
}

/// fp8 activations: each token's row quantized on the device to `f8E4M3FN` with its own f32
/// scale, against the bytes ml_dtypes gives for the same rows
/// (fixtures/models/quant/fp8-rows.safetensors, scripts/fixtures/gen_fp8_fixtures.py): rows
/// of scales from 1e-6 to 1e4, a row of zeros, one non-zero value, ties to even.
#[test]
fn fp8_rows_match_ml_dtypes_bit_for_bit() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/quant/fp8-rows.safetensors");
    let bytes = std::fs::read(path).unwrap();
    let golden = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (x, want) = (golden.tensor("x").unwrap(), golden.tensor("rows").unwrap());
    let mut b = siphon_hlo::Builder::new("fp8_rows");
    let input = b.arg(siphon_hlo::TensorType::new(DType::F32, x.shape()), None).unwrap();
    let rows = siphon_models::forward::fp8_rows(&mut b, input).unwrap();
    assert_eq!(b.dims(rows).unwrap(), want.shape());
    let text = b.finish(&[rows]).unwrap();
    let client = client();
    let exe = client.compile(&text, &CompileOptions::single_device(None)).unwrap();
    let values: Vec<f32> = x.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let arg = client.upload(&HostArray::from_slice(x.shape(), &values).unwrap(), exe.device_ids()[0]).unwrap();
    let out = exe.execute(&[vec![&arg]]).unwrap();
    let got = out[0][0].to_host().unwrap();
    let row = want.shape()[2];
    for (i, (g, w)) in got.bytes().chunks(row).zip(want.data().chunks(row)).enumerate() {
        assert_eq!(g, w, "row {i}: the device's bytes differ from ml_dtypes'");
    }
}

/// The larger of `worst` and `|d|`, a NaN `d` counting as infinitely far (`max` would drop it).
fn farther(worst: f64, d: f64) -> f64 {
    if d.is_nan() { f64::INFINITY } else { worst.max(d.abs()) }
}
