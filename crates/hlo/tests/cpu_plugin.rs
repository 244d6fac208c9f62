//! The builder's programs compiled and run on the PJRT CPU plugin, checked against plain
//! Rust. The plugin path comes from `SIPHON_PJRT_PLUGIN` (set by scripts/test.sh), else
//! siphon's cache directory (`scripts/install-plugin.sh` puts it there).

mod common;

use std::sync::{Arc, OnceLock};

use common::{all_ops_module, f32t, mesh_2x4, sharded_mlp_module};
use siphon_hlo::{Builder, CompareDir, DType, DotDims, TensorType};
use siphon_mesh::PartitionSpec;
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

/// Compiles `text` for one device, runs it on `args`, returns each output as f32.
fn run_single(text: &str, args: &[HostArray]) -> Vec<Vec<f32>> {
    let client = client();
    let exe = client.compile(text, &CompileOptions::single_device(None)).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let device = exe.device_ids()[0];
    let bufs: Vec<_> = args.iter().map(|a| client.upload(a, device).unwrap()).collect();
    let refs: Vec<_> = bufs.iter().collect();
    let out = exe.execute(&[refs]).unwrap();
    out[0].iter().map(|b| b.to_host().unwrap().to_f32()).collect()
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    // Small deterministic values in [-1, 1).
    (0..n as u32)
        .map(|i| ((i.wrapping_mul(2654435761).wrapping_add(seed.wrapping_mul(97)) >> 8) % 2000) as f32 / 1000.0 - 1.0)
        .collect()
}

fn close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{what}[{i}]: {x} vs {y}");
    }
}

fn matmul_t(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|l| x[i * k + l] as f64 * w[j * k + l] as f64).sum::<f64>() as f32;
        }
    }
    out
}

#[test]
fn every_op_compiles_and_runs() {
    let x = data(32, 1);
    let w = data(48, 2);
    let ids = [0i32, 1, 2, 3, 1, 0];
    let out = run_single(
        &all_ops_module(),
        &[
            HostArray::from_slice(&[4, 8], &x).unwrap(),
            HostArray::from_slice(&[8, 6], &w).unwrap(),
            HostArray::from_slice(&[2, 3], &ids).unwrap(),
        ],
    );
    assert_eq!(out.len(), 4);
    assert_eq!(out[0].len(), 16);
    // Gathered rows times 0.5.
    let want: Vec<f32> =
        ids.iter().flat_map(|&r| x[r as usize * 8..r as usize * 8 + 8].iter().map(|v| v * 0.5)).collect();
    close(&out[1], &want, 0.0, "take_rows");
    close(&out[2], &[1.0, -2.5, 0.0, 3.0], 0.0, "constant");
    // Batched matmul of x viewed as [2,2,8] and [2,8,2].
    let mut want = vec![0.0f32; 8];
    for bi in 0..2 {
        for i in 0..2 {
            for j in 0..2 {
                want[bi * 4 + i * 2 + j] = (0..8).map(|k| x[bi * 16 + i * 8 + k] * x[bi * 16 + k * 2 + j]).sum();
            }
        }
    }
    close(&out[3], &want, 1e-6, "batched dot_general");
}

#[test]
fn weight_first_product_equals_x_times_w_transposed() {
    // [2, 3, k] rows: the product's shape and values are matmul_t's, its form w·xᵀ behind a
    // barrier, then transposed back.
    let (m, k, n) = (6, 8, 5);
    let mut b = Builder::new("weight_first");
    let x = b.arg(f32t(&[2, 3, k]), None).unwrap();
    let w = b.arg(f32t(&[n, k]), None).unwrap();
    let y = b.matmul_t_weight_first(x, w).unwrap();
    assert_eq!(b.dims(y).unwrap(), [2, 3, n]);
    let text = b.finish(&[y]).unwrap();
    assert!(text.contains("stablehlo.optimization_barrier"), "{text}");
    let (xs, ws) = (data(m * k, 4), data(n * k, 5));
    let out = run_single(
        &text,
        &[HostArray::from_slice(&[2, 3, k], &xs).unwrap(), HostArray::from_slice(&[n, k], &ws).unwrap()],
    );
    close(&out[0], &matmul_t(&xs, &ws, m, k, n), 1e-6, "w·xᵀ transposed");
}

#[test]
fn softmax_mask_and_shape_ops_match_rust() {
    // softmax(select(iota_row >= iota_col, x, -big)) over the last dim, then transpose,
    // slice and concatenate.
    let n = 4;
    let mut b = Builder::new("softmax");
    let x = b.arg(f32t(&[n, n]), None).unwrap();
    let r = b.iota(TensorType::new(DType::I32, &[n, n]), 0).unwrap();
    let c = b.iota(TensorType::new(DType::I32, &[n, n]), 1).unwrap();
    let keep = b.compare(CompareDir::Ge, r, c).unwrap();
    let floor = b.splat(f32::MIN as f64, f32t(&[n, n])).unwrap();
    let s = b.select(keep, x, floor).unwrap();
    let m = b.reduce_max(s, &[1]).unwrap();
    let m = b.broadcast_in_dim(m, &[n, n], &[0]).unwrap();
    let e = b.sub(s, m).unwrap();
    let e = b.exp(e).unwrap();
    let z = b.reduce_sum(e, &[1]).unwrap();
    let z = b.broadcast_in_dim(z, &[n, n], &[0]).unwrap();
    let p = b.div(e, z).unwrap();
    let t = b.transpose(p, &[1, 0]).unwrap();
    let top = b.slice_dim(t, 0, 0, 1).unwrap();
    let cat = b.concatenate(&[top, top], 0).unwrap();
    let text = b.finish(&[p, cat]).unwrap();
    let xs = data(n * n, 3);
    let out = run_single(&text, &[HostArray::from_slice(&[n, n], &xs).unwrap()]);
    let mut want = vec![0.0f32; n * n];
    for i in 0..n {
        let row = &xs[i * n..i * n + i + 1];
        let mx = row.iter().cloned().fold(f32::MIN, f32::max);
        let z: f32 = row.iter().map(|v| (v - mx).exp()).sum();
        for j in 0..=i {
            want[i * n + j] = (row[j] - mx).exp() / z;
        }
    }
    close(&out[0], &want, 1e-6, "masked softmax");
    let first_col: Vec<f32> = (0..n).map(|i| want[i * n]).collect();
    let want_cat: Vec<f32> = first_col.iter().chain(&first_col).cloned().collect();
    close(&out[1], &want_cat, 1e-6, "transpose/slice/concat");
}

#[test]
fn bf16_convert_and_mixed_dot_run() {
    let mut b = Builder::new("bf16");
    let x = b.arg(f32t(&[3, 4]), None).unwrap();
    let w = b.arg(f32t(&[5, 4]), None).unwrap();
    let xb = b.convert(x, DType::BF16).unwrap();
    let wb = b.convert(w, DType::BF16).unwrap();
    let y = b.dot_general_to(xb, wb, &DotDims::contract(&[1], &[1]), DType::F32).unwrap();
    let text = b.finish(&[y]).unwrap();
    let (xs, ws) = (data(12, 4), data(20, 5));
    let out = run_single(
        &text,
        &[HostArray::from_slice(&[3, 4], &xs).unwrap(), HostArray::from_slice(&[5, 4], &ws).unwrap()],
    );
    close(&out[0], &matmul_t(&xs, &ws, 3, 4, 5), 2e-2, "bf16 dot");
}

#[test]
fn sharded_mlp_on_2x4_mesh_equals_single_device_and_rust() {
    let client = client();
    let mesh = mesh_2x4();
    let (xs, ups, downs) = (data(8 * 16, 6), data(32 * 16, 7), data(16 * 32, 8));
    let arrays = [
        HostArray::from_slice(&[8, 16], &xs).unwrap(),
        HostArray::from_slice(&[32, 16], &ups).unwrap(),
        HostArray::from_slice(&[16, 32], &downs).unwrap(),
    ];
    let single = run_single(&sharded_mlp_module(None), &arrays);

    let text = sharded_mlp_module(Some(mesh.clone()));
    let exe = client.compile(&text, &CompileOptions::spmd(&mesh)).unwrap();
    let specs = [
        PartitionSpec::new(&[&["data"], &[]]),
        PartitionSpec::new(&[&["model"], &[]]),
        PartitionSpec::new(&[&[], &["model"]]),
    ];
    let args: Vec<_> = arrays.iter().zip(&specs).map(|(a, s)| client.upload_sharded(a, s, &mesh).unwrap()).collect();
    let arg_refs: Vec<_> = args.iter().collect();
    let out_specs = [PartitionSpec::new(&[&["data"], &[]]), PartitionSpec::new(&[&["data"], &["model"]])];
    let out = exe.execute_sharded(&mesh, &arg_refs, &out_specs).unwrap();
    let y = out[0].to_host().unwrap().to_f32();
    let h = out[1].to_host().unwrap().to_f32();
    close(&y, &single[0], 1e-5, "sharded vs single y");
    close(&h, &single[1], 1e-5, "sharded vs single h");
    let want_h: Vec<f32> = matmul_t(&xs, &ups, 8, 16, 32).iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect();
    close(&h, &want_h, 1e-5, "h vs rust");
    close(&y, &matmul_t(&want_h, &downs, 8, 32, 16), 1e-5, "y vs rust");
}

/// `manual_computation`: each device's body sees its own rows of `x` (split over `data`) and
/// its columns of `w` (over `model`), and the parts it returns, stacked by `model` on a new
/// first dimension, assemble into every device's product; summed over that dimension outside,
/// the partitioner adds them across `model`. Operands or results that do not split evenly, and
/// a body using a value from outside, are refused.
#[test]
fn manual_computation_runs_each_devices_part() {
    let client = client();
    let mesh = mesh_2x4();
    let (xs, ws) = (data(8 * 16, 11), data(16 * 8, 12));
    let mut b = Builder::with_mesh("manual", mesh.clone());
    let x = b.arg(f32t(&[8, 16]), Some(PartitionSpec::new(&[&["data"], &[]]))).unwrap();
    let w = b.arg(f32t(&[16, 8]), Some(PartitionSpec::new(&[&[], &[]]))).unwrap();
    let outside = b.splat(1.0, f32t(&[4, 2])).unwrap();
    let (in_specs, out_specs) = (
        [PartitionSpec::new(&[&["data"], &[]]), PartitionSpec::new(&[&[], &["model"]])],
        [PartitionSpec::new(&[&["model"], &["data"], &[]])],
    );
    let leak = b.manual_computation(&[x, w], &in_specs, &out_specs, |b, v| {
        let y = b.dot_general(v[0], v[1], &DotDims::contract(&[1], &[0]))?;
        Ok(vec![b.add(y, outside)?])
    });
    assert!(leak.is_err(), "a value from outside the body");
    let uneven = [PartitionSpec::new(&[&["model"], &[]]), in_specs[1].clone()];
    assert!(b.manual_computation(&[w, w], &uneven, &out_specs, |_, v| Ok(vec![v[0]])).is_err(), "16 rows over 4");
    let parts = b
        .manual_computation(&[x, w], &in_specs, &out_specs, |b, v| {
            assert_eq!((b.dims(v[0])?, b.dims(v[1])?), (&[4, 16][..], &[16, 2][..]));
            let y = b.dot_general(v[0], v[1], &DotDims::contract(&[1], &[0]))?;
            Ok(vec![b.reshape(y, &[1, 4, 2])?])
        })
        .unwrap();
    assert_eq!(b.dims(parts[0]).unwrap(), &[4, 8, 2]);
    let total = b.reduce_sum(parts[0], &[0]).unwrap();
    let spec = PartitionSpec::new(&[&["model"], &["data"], &[]]);
    let whole = PartitionSpec::new(&[&[], &[]]);
    let text = b.finish_sharded(&[(parts[0], Some(spec.clone())), (total, Some(whole.clone()))]).unwrap();
    let exe = client.compile(&text, &CompileOptions::spmd(&mesh)).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let arrays = [HostArray::from_slice(&[8, 16], &xs).unwrap(), HostArray::from_slice(&[16, 8], &ws).unwrap()];
    let specs = [PartitionSpec::new(&[&["data"], &[]]), PartitionSpec::new(&[&[], &[]])];
    let args: Vec<_> = arrays.iter().zip(&specs).map(|(a, s)| client.upload_sharded(a, s, &mesh).unwrap()).collect();
    let out = exe.execute_sharded(&mesh, &args.iter().collect::<Vec<_>>(), &[spec, whole]).unwrap();
    let (parts, total) = (out[0].to_host().unwrap().to_f32(), out[1].to_host().unwrap().to_f32());
    // Device (d, m) holds rows 4d.. of x times columns 2m.. of w at [m, 4d.., ..].
    let wt: Vec<f32> = (0..8).flat_map(|c| (0..16).map(move |r| (r, c))).map(|(r, c)| ws[r * 8 + c]).collect();
    let full = matmul_t(&xs, &wt, 8, 16, 8);
    for m in 0..4 {
        for row in 0..8 {
            for j in 0..2 {
                let got = parts[(m * 8 + row) * 2 + j];
                close(&[got], &[full[row * 8 + 2 * m + j]], 1e-5, &format!("part [{m}, {row}, {j}]"));
            }
        }
    }
    let want: Vec<f32> = (0..8)
        .flat_map(|row| (0..2).map(move |j| (row, j)))
        .map(|(row, j)| (0..4).map(|m| full[row * 8 + 2 * m + j]).sum::<f32>())
        .collect();
    close(&total, &want, 1e-5, "summed over model");
}

#[test]
fn malformed_text_is_an_error_not_a_crash() {
    let err = client().compile("module { func.func @main() -> () { bogus } }", &CompileOptions::single_device(None));
    assert!(err.is_err());
}

/// Sort (stable, by the first operand), batched gathers and a while loop, against Rust.
#[test]
fn sort_gather_and_while_match_rust() {
    let i32t = |dims: &[usize]| TensorType::new(DType::I32, dims);
    let mut b = Builder::new("control");
    // Sort: keys with ties, carried payload = position; each row on its own.
    let keys = b.arg(f32t(&[2, 6]), None).unwrap();
    let pos = b.iota(i32t(&[2, 6]), 1).unwrap();
    let sorted = b.sort_by_first(&[keys, pos], 1).unwrap();
    // take_along over one dimension: [2, 3, 4] rows by [2, 5, 1] indices (one out of range).
    let table = b.arg(f32t(&[2, 3, 4]), None).unwrap();
    let idx = b.constant_i32(&[2, 0, 1, 1, 7, 0, 0, 2, 1, 2], &[2, 5, 1]).unwrap();
    let rows = b.take_along(table, 0, &[1], idx).unwrap();
    // take_along over two dimensions with the batch in the middle: [3, 2, 4, 5] by (d0, d2).
    let cube = b.arg(f32t(&[3, 2, 4, 5]), None).unwrap();
    let idx2 = b.constant_i32(&[0, 3, 2, 1, 1, 0, 2, 2, 0, 0, 1, 3], &[2, 3, 2]).unwrap();
    let picked = b.take_along(cube, 1, &[0, 2], idx2).unwrap();
    // while i < 3: acc += x * i; i += 1.
    let x = b.arg(f32t(&[4]), None).unwrap();
    let i0 = b.scalar(0.0, DType::I32).unwrap();
    let acc0 = b.splat(0.0, f32t(&[4])).unwrap();
    let outside = b.scalar(1.0, DType::I32).unwrap();
    let err = b.while_loop(&[i0], |b, s| b.compare(CompareDir::Lt, s[0], outside), |_, s| Ok(s.to_vec()));
    assert!(matches!(err, Err(siphon_hlo::HloError::OutOfScope { .. })), "{err:?}");
    let out = b
        .while_loop(
            &[i0, acc0, x],
            |b, s| {
                let three = b.scalar(3.0, DType::I32)?;
                b.compare(CompareDir::Lt, s[0], three)
            },
            |b, s| {
                let f = b.convert(s[0], DType::F32)?;
                let f = b.broadcast_in_dim(f, &[4], &[])?;
                let step = b.mul(s[2], f)?;
                let one = b.scalar(1.0, DType::I32)?;
                Ok(vec![b.add(s[0], one)?, b.add(s[1], step)?, s[2]])
            },
        )
        .unwrap();
    assert!(b.add(out[1], out[2]).is_ok(), "the loop's results are usable after it");
    let text = b.finish(&[sorted[0], sorted[1], rows, picked, out[0], out[1]]).unwrap();

    let keys_v = [3.0, 1.0, 3.0, 0.0, 1.0, 3.0, 2.0, 2.0, 2.0, -1.0, 5.0, 2.0];
    let table_v = data(24, 5);
    let cube_v = data(120, 6);
    let x_v = [1.0, -2.0, 0.5, 4.0];
    let got = run_single(
        &text,
        &[
            HostArray::from_slice(&[2, 6], &keys_v).unwrap(),
            HostArray::from_slice(&[2, 3, 4], &table_v).unwrap(),
            HostArray::from_slice(&[3, 2, 4, 5], &cube_v).unwrap(),
            HostArray::from_slice(&[4], &x_v).unwrap(),
        ],
    );
    let (mut want_keys, mut want_pos) = (vec![], vec![]);
    for row in keys_v.chunks(6) {
        let mut order: Vec<usize> = (0..6).collect();
        order.sort_by(|&i, &j| row[i].partial_cmp(&row[j]).unwrap()); // stable
        want_keys.extend(order.iter().map(|&i| row[i]));
        want_pos.extend(order.iter().map(|&i| i as f32));
    }
    assert_eq!(got[0], want_keys, "sorted keys");
    assert_eq!(got[1], want_pos, "ties keep their order");
    let idx_v = [2, 0, 1, 1, 7, 0, 0, 2, 1, 2];
    let want_rows: Vec<f32> = (0..10)
        .flat_map(|m| {
            let (g, r) = (m / 5, idx_v[m].min(2));
            table_v[(g * 3 + r) * 4..(g * 3 + r + 1) * 4].to_vec()
        })
        .collect();
    assert_eq!(got[2], want_rows, "take_along one dimension (out of range clamped)");
    let idx2_v = [0, 3, 2, 1, 1, 0, 2, 2, 0, 0, 1, 3];
    let want_picked: Vec<f32> = (0..6)
        .flat_map(|m| {
            let (g, d0, d2) = (m / 3, idx2_v[2 * m] as usize, idx2_v[2 * m + 1] as usize);
            (0..5).map(move |r| ((d0 * 2 + g) * 4 + d2) * 5 + r).collect::<Vec<_>>()
        })
        .map(|i| cube_v[i])
        .collect();
    assert_eq!(got[3], want_picked, "take_along two dimensions around the batch");
    assert_eq!(got[4], vec![3.0], "three iterations");
    assert_eq!(got[5], x_v.iter().map(|v| v * 3.0).collect::<Vec<_>>(), "x * (0 + 1 + 2)");
}

/// `put_along` writes a batch element's updates at its own indices (an out-of-range one
/// dropped), leaving every other element of the table as it was: against Rust.
#[test]
fn put_along_writes_where_take_along_reads() {
    let mut b = Builder::new("put");
    let table = b.arg(f32t(&[2, 3, 4]), None).unwrap();
    let idx = b.constant_i32(&[2, 0, 1, 7], &[2, 2, 1]).unwrap();
    let updates = b.arg(f32t(&[2, 2, 4]), None).unwrap();
    let put = b.put_along(table, 0, &[1], idx, updates).unwrap();
    let wrong = b.arg(f32t(&[2, 2, 3]), None).unwrap();
    assert!(b.put_along(table, 0, &[1], idx, wrong).is_err(), "updates of the wrong shape");
    let text = b.finish(&[put]).unwrap();
    let (table_v, updates_v) = (data(24, 7), data(16, 8));
    let got = run_single(
        &text,
        &[
            HostArray::from_slice(&[2, 3, 4], &table_v).unwrap(),
            HostArray::from_slice(&[2, 2, 4], &updates_v).unwrap(),
            HostArray::from_slice(&[2, 2, 3], &[0f32; 12]).unwrap(),
        ],
    );
    let mut want = table_v.clone();
    for (g, t, row) in [(0, 0, 2), (0, 1, 0), (1, 0, 1)] {
        let from = (g * 2 + t) * 4;
        want[(g * 3 + row) * 4..(g * 3 + row + 1) * 4].copy_from_slice(&updates_v[from..from + 4]);
    }
    assert_eq!(got[0], want);
}

/// A donated argument: the program names the result it may be written into, runs as
/// without it, and a donation to a result of another type, or twice, is refused.
#[test]
fn a_donated_argument_aliases_its_result() {
    let mut b = Builder::new("donate");
    let state = b.arg(f32t(&[2, 3]), None).unwrap();
    let x = b.arg(f32t(&[2, 3]), None).unwrap();
    let sum = b.add(state, x).unwrap();
    let total = b.reduce_sum(sum, &[0, 1]).unwrap();
    b.donate(state, 1).unwrap();
    assert!(b.donate(state, 0).is_err(), "donated twice");
    let text = b.finish(&[total, sum]).unwrap();
    assert!(text.contains("%arg0: tensor<2x3xf32> {tf.aliasing_output = 1 : i32}"), "{text}");
    let (s, v) = (data(6, 3), data(6, 4));
    let got =
        run_single(&text, &[HostArray::from_slice(&[2, 3], &s).unwrap(), HostArray::from_slice(&[2, 3], &v).unwrap()]);
    let want: Vec<f32> = s.iter().zip(&v).map(|(a, b)| a + b).collect();
    assert_eq!(got[1], want);

    let mut b = Builder::new("donate_wrong");
    let state = b.arg(f32t(&[2, 3]), None).unwrap();
    let total = b.reduce_sum(state, &[0, 1]).unwrap();
    b.donate(state, 0).unwrap();
    assert!(b.finish(&[total]).is_err(), "a [2, 3] argument donated to a scalar result");
}

/// `solve_unit_lower` (batched, the diagonal and upper triangle ignored) and `log_plus_one`
/// against forward substitution and `ln_1p` in Rust.
#[test]
fn triangular_solve_and_log_plus_one_match_rust() {
    let (batch, n, m) = (2, 5, 3);
    let mut b = Builder::new("solve");
    let a = b.arg(f32t(&[batch, n, n]), None).unwrap();
    let rhs = b.arg(f32t(&[batch, n, m]), None).unwrap();
    let x = b.solve_unit_lower(a, rhs).unwrap();
    let small = b.arg(f32t(&[4]), None).unwrap();
    let l1p = b.log_plus_one(small).unwrap();
    assert!(b.solve_unit_lower(rhs, a).is_err(), "a non-square system is refused");
    let text = b.finish(&[x, l1p]).unwrap();
    let (av, bv) = (data(batch * n * n, 3), data(batch * n * m, 4));
    let tiny = [1e-7f32, -0.5, 2.0, 0.0];
    let out = run_single(
        &text,
        &[
            HostArray::from_slice(&[batch, n, n], &av).unwrap(),
            HostArray::from_slice(&[batch, n, m], &bv).unwrap(),
            HostArray::from_slice(&[4], &tiny).unwrap(),
        ],
    );
    let mut want = vec![0f32; batch * n * m];
    for g in 0..batch {
        for i in 0..n {
            for c in 0..m {
                let below: f64 =
                    (0..i).map(|j| av[(g * n + i) * n + j] as f64 * want[(g * n + j) * m + c] as f64).sum();
                want[(g * n + i) * m + c] = (bv[(g * n + i) * m + c] as f64 - below) as f32;
            }
        }
    }
    close(&out[0], &want, 1e-5, "solve_unit_lower");
    close(&out[1], &tiny.map(f32::ln_1p), 1e-7, "log_plus_one");
}

/// A custom call into siphon's experts kernel (registered by the runtime with the CPU
/// plugin): each choice's token through its expert into its slot, as the sums in Rust; a
/// target that is no identifier is refused by the builder, and operands the kernel refuses
/// (a slot given twice) are an execution error naming them.
#[test]
fn custom_call_runs_the_experts_kernel() {
    let i32t = |dims: &[usize]| TensorType::new(DType::I32, dims);
    let (t, h, e, i, a) = (3, 4, 2, 3, 4);
    let mut b = Builder::new("experts");
    let x = b.arg(f32t(&[t, h]), None).unwrap();
    let token = b.arg(i32t(&[a]), None).unwrap();
    let slot = b.arg(i32t(&[a]), None).unwrap();
    let counts = b.arg(i32t(&[e]), None).unwrap();
    let gate = b.arg(f32t(&[e, i, h]), None).unwrap();
    let up = b.arg(f32t(&[e, i, h]), None).unwrap();
    let down = b.arg(f32t(&[e, h, i]), None).unwrap();
    let bad = b.custom_call("no spaces", &[x], f32t(&[a, h]));
    assert!(matches!(bad, Err(siphon_hlo::HloError::Shape { .. })), "{bad:?}");
    let operands = [x, token, slot, counts, gate, up, down];
    let y = b.custom_call(siphon_kernels::experts::TARGET, &operands, f32t(&[a, h])).unwrap();
    let text = b.finish(&[y]).unwrap();

    let (x_v, gate_v, up_v, down_v) = (data(t * h, 7), data(e * i * h, 8), data(e * i * h, 9), data(e * h * i, 10));
    // Expert 0 takes tokens 0 and 2 into slots 0 and 3, expert 1 tokens 1 and 0 into 1 and 2.
    let (token_v, counts_v): ([i32; 4], [i32; 2]) = ([0, 2, 1, 0], [2, 2]);
    let args = |slots: &[i32]| {
        vec![
            HostArray::from_slice(&[t, h], &x_v).unwrap(),
            HostArray::from_slice(&[a], &token_v).unwrap(),
            HostArray::from_slice(&[a], slots).unwrap(),
            HostArray::from_slice(&[e], &counts_v).unwrap(),
            HostArray::from_slice(&[e, i, h], &gate_v).unwrap(),
            HostArray::from_slice(&[e, i, h], &up_v).unwrap(),
            HostArray::from_slice(&[e, h, i], &down_v).unwrap(),
        ]
    };
    let slot_v: [i32; 4] = [0, 3, 1, 2];
    let got = run_single(&text, &args(&slot_v));
    let mut want = vec![0.0f32; a * h];
    for (c, (&tok, &s)) in token_v.iter().zip(&slot_v).enumerate() {
        let ex = c / 2;
        let (tok, s) = (tok as usize, s as usize);
        let xr = &x_v[tok * h..(tok + 1) * h];
        let dot = |w: &[f32], row: usize, v: &[f32]| -> f32 {
            v.iter().enumerate().map(|(k, x)| w[row * v.len() + k] * x).sum()
        };
        let act: Vec<f32> = (0..i)
            .map(|j| {
                let (g, u) = (dot(&gate_v, ex * i + j, xr), dot(&up_v, ex * i + j, xr));
                g / (1.0 + (-g).exp()) * u
            })
            .collect();
        for o in 0..h {
            want[s * h + o] = dot(&down_v, ex * h + o, &act);
        }
    }
    close(&got[0], &want, 1e-6, "experts kernel");

    let client = client();
    let exe = client.compile(&text, &CompileOptions::single_device(None)).unwrap();
    let bufs: Vec<_> = args(&[0, 0, 1, 2]).iter().map(|v| client.upload(v, exe.device_ids()[0]).unwrap()).collect();
    let err = exe.execute(&[bufs.iter().collect()]).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("slot 0 outside the 4 outputs or given twice"), "{err}");
}

/// XLA reads a library call's text (cuDNN's fused attention as siphon emits it for CUDA): the
/// CPU plugin gets as far as the call itself, which it has no handler for, and says so by
/// name; malformed text would fail in the parser instead.
#[test]
fn a_library_call_parses_and_the_cpu_plugin_names_it() {
    let bf16 = |dims: &[usize]| TensorType::new(DType::BF16, dims);
    let mut b = Builder::new("library_call");
    let q = b.arg(bf16(&[2, 16, 4, 8]), None).unwrap();
    let k = b.arg(bf16(&[2, 16, 2, 8]), None).unwrap();
    let lengths = b.arg(TensorType::new(DType::I32, &[2]), None).unwrap();
    let results = [bf16(&[2, 4, 16, 8]), TensorType::new(DType::U8, &[0])];
    let out = b
        .library_call(
            "__cudnn$fmhaSoftmax",
            &[q, k, k, lengths, lengths],
            &results,
            r#"{"a":"b"}"#,
            &[vec![3, 1, 2, 0], vec![0]],
            Some("blocks.0.attn"),
        )
        .unwrap();
    let text = b.finish(&[out[0]]).unwrap();
    let Err(err) = client().compile(&text, &CompileOptions::single_device(None)) else {
        panic!("the CPU plugin compiled a call to cuDNN");
    };
    let message = err.to_string();
    // "No registered implementation for untyped custom call to __cudnn$fmhaSoftmax for Host".
    assert!(message.contains("custom call") && message.contains("__cudnn$fmhaSoftmax"), "{message}");
}

/// `top_k`: each row's k largest, largest first, the lower index first among equal values, as
/// a stable sort of the row by descending value gives them.
#[test]
fn top_k_gives_each_rows_largest_lower_index_first_among_ties() {
    let (rows, n, k) = (3, 10, 4);
    let mut b = Builder::new("top_k");
    let x = b.arg(f32t(&[rows, n]), None).unwrap();
    let (values, indices) = b.top_k(x, k).unwrap();
    let text = b.finish(&[values, indices]).unwrap();
    // Rounded to tenths, so that rows hold ties.
    let xs: Vec<f32> = data(rows * n, 7).iter().map(|v| (v * 10.0).round() / 10.0).collect();
    let out = run_single(&text, &[HostArray::from_slice(&[rows, n], &xs).unwrap()]);
    for r in 0..rows {
        let row = &xs[r * n..][..n];
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        let want_indices: Vec<f32> = order[..k].iter().map(|&i| i as f32).collect();
        let want_values: Vec<f32> = order[..k].iter().map(|&i| row[i]).collect();
        assert_eq!(&out[1][r * k..][..k], &want_indices[..], "row {r}: {row:?}");
        assert_eq!(&out[0][r * k..][..k], &want_values[..], "row {r}");
    }
    let mut b = Builder::new("top_k_bad");
    let x = b.arg(f32t(&[rows, n]), None).unwrap();
    assert!(b.top_k(x, n + 1).is_err() && b.top_k(x, 0).is_err());
}
