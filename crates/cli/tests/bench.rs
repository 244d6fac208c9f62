//! `siphon bench memory` on the CPU plugin's virtual devices: measured per-device bytes equal
//! the planner's prediction — total/fsdp sharded, total gathered.
//!
//! Needs the plugin from `SIPHON_PJRT_PLUGIN` (scripts/test.sh sets it after
//! scripts/install-plugin.sh); without that variable the tests print a note and return.

use std::process::Command;

use serde_json::Value;

fn bench(args: &[&str]) -> Option<Value> {
    let Some(plugin) = std::env::var_os("SIPHON_PJRT_PLUGIN") else {
        eprintln!("note: SIPHON_PJRT_PLUGIN is unset; skipping the PJRT memory bench");
        return None;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_siphon"))
        .args(["bench", "memory", "--json", "--plugin"])
        .arg(plugin)
        .args(args)
        .env("TF_CPP_MIN_LOG_LEVEL", "2")
        .output()
        .expect("running siphon");
    assert!(out.status.success(), "siphon bench memory {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    Some(serde_json::from_slice(&out.stdout).expect("JSON on stdout"))
}

fn u(v: &Value, path: &[&str]) -> u64 {
    let mut v = v;
    for key in path {
        v = &v[*key];
    }
    v.as_u64().unwrap_or_else(|| panic!("{path:?} is not a number in {v}"))
}

fn assert_sharded_and_gathered(result: &Value, fsdp: u64) {
    let total = u(result, &["total_bytes"]);
    assert!(total >= 4 << 20 && total.is_multiple_of(fsdp), "{result}");
    // Planner prediction.
    assert_eq!(u(result, &["predicted_sharded_bytes"]), total / fsdp, "{result}");
    assert_eq!(u(result, &["predicted_gathered_bytes"]), total, "{result}");
    // PJRT's on-device sizes: every device's shard is total/fsdp (the CPU allocator adds no
    // padding to these f32 shapes), every gathered or replicated copy is total.
    assert_eq!(u(result, &["sharded_on_device", "min"]), total / fsdp, "{result}");
    assert_eq!(u(result, &["sharded_on_device", "max"]), total / fsdp, "{result}");
    for key in ["replicated_on_device", "gathered_on_device"] {
        assert_eq!(u(result, &[key, "min"]), total, "{key}: {result}");
        assert_eq!(u(result, &[key, "max"]), total, "{key}: {result}");
    }
    // XLA's compiled memory stats agree: the program's argument is the shard, the all-gather's
    // output the whole weight.
    assert_eq!(u(result, &["sharded_program", "argument"]), total / fsdp, "{result}");
    assert_eq!(u(result, &["gather_program", "argument"]), total / fsdp, "{result}");
    assert_eq!(u(result, &["gather_program", "output"]), total, "{result}");
    assert_eq!(result["matches"], true);
}

#[test]
fn fsdp_over_8_and_16_devices_matches_the_planner() {
    for devices in [8u64, 16] {
        let n = devices.to_string();
        let Some(result) = bench(&["--cpu-devices", &n, "--target-bytes", "4194304"]) else { return };
        assert_eq!(u(&result, &["shape", "fsdp"]), devices, "{result}");
        assert_sharded_and_gathered(&result, devices);
    }
}

#[test]
fn data_by_fsdp_shards_over_fsdp_only() {
    // The seed's data=4 × fsdp=4: each device holds a quarter.
    let Some(result) = bench(&["--cpu-devices", "16", "--data", "4", "--fsdp", "4", "--target-bytes", "4194304"])
    else {
        return;
    };
    assert_eq!(result["mesh"], "[data=4, fsdp=4]");
    assert_sharded_and_gathered(&result, 4);
}

#[test]
fn a_mesh_that_does_not_hold_the_devices_is_an_error() {
    let Some(plugin) = std::env::var_os("SIPHON_PJRT_PLUGIN") else { return };
    let out = Command::new(env!("CARGO_BIN_EXE_siphon"))
        .args(["bench", "memory", "--cpu-devices", "8", "--data", "3", "--plugin"])
        .arg(plugin)
        .env("TF_CPP_MIN_LOG_LEVEL", "2")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not hold the 8 devices"));
}
