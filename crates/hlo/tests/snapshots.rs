//! Snapshot tests of emitted StableHLO text, and shape/dtype error tests.
//!
//! Each snapshot lives in `tests/snapshots/<name>.mlir`. Run with `UPDATE_EXPECT=1` to
//! rewrite the files after an intended change, then review the diff.

mod common;

use common::{all_ops_module, f32t, mesh_2x4, sharded_mlp_module};
use siphon_hlo::{Builder, DType, DotDims, HloError, TensorType};
use siphon_mesh::PartitionSpec;

fn expect_snapshot(name: &str, actual: &str) {
    let path = format!("{}/tests/snapshots/{name}.mlir", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e} (run with UPDATE_EXPECT=1 to create it)"));
    if expected != actual {
        panic!(
            "snapshot {name} differs (run with UPDATE_EXPECT=1 to accept):\n--- expected\n{expected}\n--- actual\n{actual}"
        );
    }
}

#[test]
fn all_ops_snapshot() {
    expect_snapshot("all_ops", &all_ops_module());
}

#[test]
fn sharded_mlp_snapshot() {
    expect_snapshot("sharded_mlp", &sharded_mlp_module(Some(mesh_2x4())));
}

#[test]
fn splat_constants_are_exact_bit_patterns() {
    let mut b = Builder::new("consts");
    let a = b.scalar(1.0, DType::F32).unwrap();
    let n = b.scalar(f64::NEG_INFINITY, DType::F32).unwrap();
    let h = b.scalar(1.0, DType::BF16).unwrap();
    let i = b.scalar(-3.0, DType::I32).unwrap();
    let p = b.scalar(1.0, DType::Pred).unwrap();
    let text = b.finish(&[a, n, h, i, p]).unwrap();
    assert!(text.contains("dense<0x3F800000> : tensor<f32>"), "{text}");
    assert!(text.contains("dense<0xFF800000> : tensor<f32>"), "{text}");
    assert!(text.contains("dense<0x3F80> : tensor<bf16>"), "{text}");
    assert!(text.contains("dense<-3> : tensor<i32>"), "{text}");
    assert!(text.contains("dense<true> : tensor<i1>"), "{text}");
}

fn is_shape_err(r: Result<siphon_hlo::Value, HloError>, needle: &str) {
    match r {
        Err(e @ HloError::Shape { .. }) => assert!(e.to_string().contains(needle), "{e} lacks {needle:?}"),
        other => panic!("expected a shape error containing {needle:?}, got {other:?}"),
    }
}

#[test]
fn shape_errors_name_the_shapes() {
    let mut b = Builder::new("bad");
    let a = b.arg(f32t(&[2, 3]), None).unwrap();
    let c = b.arg(f32t(&[3, 2]), None).unwrap();
    is_shape_err(b.add(a, c), "tensor<2x3xf32> vs tensor<3x2xf32>");
    is_shape_err(b.matmul(a, a), "lhs dimension 1 (3) != rhs dimension 0 (2)");
    is_shape_err(b.dot_general(a, c, &DotDims::contract(&[1, 1], &[0, 1])), "repeated");
    is_shape_err(b.reshape(a, &[4, 2]), "cannot reshape tensor<2x3xf32> to tensor<4x2xf32>");
    is_shape_err(b.transpose(a, &[0, 0]), "not a permutation");
    is_shape_err(b.slice(a, &[0, 2], &[2, 4], &[1, 1]), "bad range 2:4:1 for dimension 1");
    is_shape_err(b.concatenate(&[a, c], 0), "does not fit");
    is_shape_err(b.broadcast_in_dim(a, &[2, 4], &[0, 1]), "cannot broadcast");
    is_shape_err(b.reduce_sum(a, &[2]), "bad dimensions [2]");
    is_shape_err(b.iota(f32t(&[3]), 1), "out of range");
    // A failed op leaves the builder usable and adds nothing.
    let ok = b.add(a, a).unwrap();
    let text = b.finish(&[ok]).unwrap();
    assert_eq!(text.matches(" = stablehlo.").count(), 1, "{text}");
}

#[test]
fn dtype_errors_name_the_dtypes() {
    let mut b = Builder::new("bad");
    let f = b.arg(f32t(&[2]), None).unwrap();
    let i = b.arg(TensorType::new(DType::I32, &[2]), None).unwrap();
    let err = b.add(f, i).unwrap_err();
    assert!(matches!(err, HloError::DType { .. }) && err.to_string().contains("i32"), "{err}");
    assert!(matches!(b.rsqrt(i), Err(HloError::DType { .. })));
    assert!(matches!(b.take_rows(f, f), Err(HloError::DType { .. })));
    assert!(matches!(b.select(f, f, f), Err(HloError::DType { .. })));
}

#[test]
fn foreign_values_are_rejected() {
    let mut one = Builder::new("one");
    let mut two = Builder::new("two");
    let a = one.arg(f32t(&[2]), None).unwrap();
    let _ = two.arg(f32t(&[2]), None).unwrap();
    assert!(matches!(two.add(a, a), Err(HloError::ForeignValue { .. })));
}

#[test]
fn sharding_errors_are_errors() {
    let mut plain = Builder::new("plain");
    let err = plain.arg(f32t(&[8]), Some(PartitionSpec::new(&[&["data"]]))).unwrap_err();
    assert!(matches!(err, HloError::NoMesh(_)), "{err}");

    let mut b = Builder::with_mesh("m", mesh_2x4());
    let err = b.arg(f32t(&[6, 4]), Some(PartitionSpec::new(&[&["model"], &[]]))).unwrap_err();
    assert!(err.to_string().contains("argument 0") && err.to_string().contains("4 ways"), "{err}");
    let err = b.arg(f32t(&[8]), Some(PartitionSpec::new(&[&["fsdp"]]))).unwrap_err();
    assert!(err.to_string().contains("fsdp"), "{err}");
    let x = b.arg(f32t(&[8, 6]), None).unwrap();
    // Uneven splits are allowed inside (Shardy pads) but not on results.
    let c = b.sharding_constraint(x, &PartitionSpec::new(&[&[], &["model"]])).unwrap();
    let err = b.sharding_constraint(x, &PartitionSpec::new(&[&["data"]])).unwrap_err();
    assert!(err.to_string().contains("dimensions"), "{err}");
    let err = b.finish_sharded(&[(c, Some(PartitionSpec::new(&[&[], &["model"]])))]).unwrap_err();
    assert!(err.to_string().contains("result 0"), "{err}");
}

#[test]
fn empty_results_are_an_error() {
    let b = Builder::new("empty");
    assert!(matches!(b.finish(&[]), Err(HloError::NoResults(_))));
}

/// A library call of XLA's older convention (cuDNN's fused attention takes this form): two
/// results, a JSON backend config escaped into the attribute, row-major operand layouts and
/// the given result layouts; targets, result layouts and result counts are checked.
#[test]
fn library_call_snapshot() {
    let mut b = Builder::new("library_call");
    let bf16 = |dims: &[usize]| TensorType::new(DType::BF16, dims);
    let q = b.arg(bf16(&[2, 16, 4, 8]), None).unwrap();
    let k = b.arg(bf16(&[2, 16, 2, 8]), None).unwrap();
    let lengths = b.arg(TensorType::new(DType::I32, &[2]), None).unwrap();
    let results = [bf16(&[2, 4, 16, 8]), TensorType::new(DType::U8, &[0])];
    let config = r#"{"cudnn_fmha_backend_config":{"mask_type":"PADDING_CAUSAL","path":"a\b"}}"#;
    let layouts = vec![vec![3, 1, 2, 0], vec![0]];
    let bad = b.library_call("no spaces", &[q], &results, config, &layouts, None);
    assert!(bad.unwrap_err().to_string().contains("not an identifier"));
    let bad = b.library_call("__cudnn$fmhaSoftmax", &[q], &results, config, &layouts[..1], None);
    assert!(bad.unwrap_err().to_string().contains("2 results, 1 layouts"));
    let bad = b.library_call("__cudnn$fmhaSoftmax", &[q], &results, config, &[vec![3, 1, 1, 0], vec![0]], None);
    assert!(bad.unwrap_err().to_string().contains("not a permutation"));
    let bad = b.library_call("__cudnn$fmhaSoftmax", &[q], &results, config, &layouts, Some("a \"b\""));
    assert!(bad.unwrap_err().to_string().contains("op name"));
    let out =
        b.library_call("__cudnn$fmhaSoftmax", &[q, k, k, lengths, lengths], &results, config, &layouts, None).unwrap();
    assert_eq!(out.len(), 2);
    expect_snapshot("library_call", &b.finish(&[out[0]]).unwrap());
    // A named call carries its name as the op's location.
    let mut b = Builder::new("named");
    let q = b.arg(bf16(&[2, 16, 4, 8]), None).unwrap();
    let out = b.library_call("__cudnn$fmhaSoftmax", &[q], &results, config, &layouts, Some("blocks.3.attn")).unwrap();
    let text = b.finish(&[out[0]]).unwrap();
    let line = text.lines().find(|l| l.contains("custom_call")).unwrap();
    assert!(line.ends_with(r#"tensor<0xui8>) loc("blocks.3.attn")"#), "{line}");
}
