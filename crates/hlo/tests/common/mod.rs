//! Programs shared by the snapshot tests and the CPU-plugin tests.
#![allow(dead_code)]

use siphon_hlo::{Builder, CompareDir, DType, DotDims, TensorType};
use siphon_mesh::{Mesh, PartitionSpec};

pub fn f32t(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims)
}

pub fn mesh_2x4() -> Mesh {
    Mesh::new(&[("data", 2), ("model", 4)], (0..8).collect()).unwrap()
}

/// Every op once, single device.
pub fn all_ops_module() -> String {
    let mut b = Builder::new("all_ops");
    let x = b.arg(f32t(&[4, 8]), None).unwrap();
    let w = b.arg(f32t(&[8, 6]), None).unwrap();
    let ids = b.arg(TensorType::new(DType::I32, &[2, 3]), None).unwrap();
    let y = b.matmul(x, w).unwrap(); // [4, 6]
    let y2 = b.add(y, y).unwrap();
    let y3 = b.sub(y2, y).unwrap();
    let y4 = b.mul(y3, y).unwrap();
    let y5 = b.div(y4, y2).unwrap();
    let y6 = b.max(y5, y).unwrap();
    let y7 = b.min(y6, y).unwrap();
    let y8 = b.neg(y7).unwrap();
    let e = b.exp(y8).unwrap();
    let l = b.log(e).unwrap();
    let s = b.logistic(l).unwrap();
    let t = b.tanh(s).unwrap();
    let r = b.rsqrt(e).unwrap();
    let q = b.sqrt(e).unwrap();
    let p = b.pow(q, r).unwrap();
    let sum = b.reduce_sum(p, &[1]).unwrap(); // [4]
    let mx = b.reduce_max(t, &[0]).unwrap(); // [6]
    let bs = b.broadcast_in_dim(sum, &[4, 6], &[0]).unwrap();
    let bm = b.broadcast_to(mx, &[4, 6]).unwrap();
    let lt = b.compare(CompareDir::Lt, bs, bm).unwrap();
    let sel = b.select(lt, bs, bm).unwrap();
    let tr = b.transpose(sel, &[1, 0]).unwrap(); // [6, 4]
    let rs = b.reshape(tr, &[3, 8]).unwrap();
    let sl = b.slice(rs, &[0, 1], &[2, 8], &[1, 2]).unwrap(); // [2, 4]
    let cat = b.concatenate(&[sl, sl], 0).unwrap(); // [4, 4]
    let io = b.iota(TensorType::new(DType::I32, &[4, 4]), 1).unwrap();
    let iof = b.convert(io, DType::F32).unwrap();
    let sum2 = b.add(cat, iof).unwrap();
    let bf = b.convert(sum2, DType::BF16).unwrap();
    let emb = b.take_rows(x, ids).unwrap(); // [2, 3, 8]
    let c = b.constant_f32(&[1.0, -2.5, 0.0, 3.0], &[4]).unwrap();
    let half = b.splat(0.5, f32t(&[2, 3, 8])).unwrap();
    let emb2 = b.mul(emb, half).unwrap();
    let bx = b.reshape(x, &[2, 2, 8]).unwrap();
    let bw = b.reshape(x, &[2, 8, 2]).unwrap();
    let bd = b.dot_general(bx, bw, &DotDims::batched(&[0], &[0], &[2], &[1])).unwrap(); // [2,2,2]
    b.finish(&[bf, emb2, c, bd]).unwrap()
}

/// A tensor-parallel MLP on a 2x4 mesh with shardings on arguments, results and inside.
/// Without a mesh, the same program with no annotations (the single-device reference).
pub fn sharded_mlp_module(mesh: Option<Mesh>) -> String {
    let sharded = mesh.is_some();
    let mut b = match mesh {
        Some(mesh) => Builder::with_mesh("sharded_mlp", mesh),
        None => Builder::new("sharded_mlp"),
    };
    let p = |dims: &[&[&str]]| sharded.then(|| PartitionSpec::new(dims));
    let x = b.arg(f32t(&[8, 16]), p(&[&["data"], &[]])).unwrap();
    let up = b.arg(f32t(&[32, 16]), p(&[&["model"], &[]])).unwrap();
    let down = b.arg(f32t(&[16, 32]), p(&[&[], &["model"]])).unwrap();
    let h = b.matmul_t(x, up).unwrap(); // [8, 32]
    let h = match sharded {
        true => b.sharding_constraint(h, &PartitionSpec::new(&[&["data"], &["model"]])).unwrap(),
        false => h,
    };
    let h = b.logistic(h).unwrap();
    let y = b.matmul_t(h, down).unwrap(); // [8, 16]
    b.finish_sharded(&[(y, p(&[&["data"], &[]])), (h, p(&[&["data"], &["model"]]))]).unwrap()
}
