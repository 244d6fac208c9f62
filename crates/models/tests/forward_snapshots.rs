//! Snapshots of the emitted forward programs for two tiny configs, so a change in the
//! graph shows up as a reviewable text diff. Run with `UPDATE_EXPECT=1` to accept changes.

use siphon_mesh::Mesh;
use siphon_models::config::{Attention, Rope};
use siphon_models::{Arch, ForwardSpec, HookKind, HookPoint, ModelConfig, build_forward};

fn expect_snapshot(name: &str, actual: &str) {
    let path = format!("{}/tests/snapshots/{name}.mlir", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e} (run with UPDATE_EXPECT=1 to create it)"));
    assert!(expected == actual, "snapshot {name} differs (UPDATE_EXPECT=1 to accept):\n{actual}");
}

fn tiny(name: &str) -> ModelConfig {
    let arch: Arch = name.parse().unwrap();
    ModelConfig {
        arch,
        vocab_size: 16,
        hidden_size: 8,
        intermediate_size: 12,
        n_layers: 2,
        rms_norm_eps: 1e-6,
        max_position_embeddings: 32,
        tie_word_embeddings: true,
        attention: Attention {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 2,
            qkv_bias: name == "qwen2",
            ..Default::default()
        },
        rope: Rope { theta: 10000.0, ..Default::default() },
        ..ModelConfig::default()
    }
}

#[test]
fn tiny_llama_one_block_snapshot() {
    let c = tiny("llama");
    let p = build_forward(
        &c,
        &ForwardSpec::new(2, 3, vec![HookPoint::block(0, HookKind::MlpOut), HookPoint::block(0, HookKind::AttnOut)]),
    )
    .unwrap();
    expect_snapshot("tiny_llama_block0", &p.text);
}

#[test]
fn tiny_qwen2_sharded_snapshot() {
    let c = tiny("qwen2");
    let mesh = Mesh::new(&[("data", 2), ("model", 2)], (0..4).collect()).unwrap();
    let spec = ForwardSpec::new(2, 3, vec![HookPoint::block(0, HookKind::ResidPost)]).with_megatron_plan(&c, mesh);
    let p = build_forward(&c, &spec).unwrap();
    expect_snapshot("tiny_qwen2_sharded_block0", &p.text);
}
