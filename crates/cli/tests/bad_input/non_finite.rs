//! Activations that are NaN or ±Inf: the run stops at the first shard that holds one, naming
//! the hook and the step, and writes no shard; with `--allow-non-finite` they are stored and
//! counted, `stats.json` holds `null` where they reach, and `siphon inspect` fails the run
//! unless told to allow them.

use std::time::Duration;

use crate::{Setup, extract_args, run, setup, siphon};

/// The tiny model with its last MLP's down projection scaled past f32's range: finite weights
/// whose products overflow, so the last block's output is ±Inf.
fn overflowing(s: &Setup) {
    let path = s.root.join("model/model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let huge: Vec<u8> = f32::MAX.to_le_bytes().repeat(64 * crate::common::HIDDEN);
    let name = format!("model.layers.{}.mlp.down_proj.weight", crate::common::LAYERS - 1);
    let tensors: Vec<(String, safetensors::tensor::TensorView)> = file
        .tensors()
        .into_iter()
        .map(|(n, view)| match n == name {
            true => (n, safetensors::tensor::TensorView::new(view.dtype(), view.shape().to_vec(), &huge).unwrap()),
            false => (n, view),
        })
        .collect();
    let out = safetensors::serialize(tensors, None).unwrap();
    std::fs::write(&path, out).unwrap();
}

#[test]
fn non_finite_activations_stop_the_run_naming_hook_and_step_unless_allowed() {
    let s = setup();
    overflowing(&s);
    let (output, took) = run(siphon(&extract_args(&s, "r", &[])), Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let line = stderr.lines().find(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.contains("hook blocks.1.hook_resid_post") && line.contains("NaN or ±Inf"), "{line}");
    assert!(line.contains("at step 0") && line.contains("--allow-non-finite"), "{line}");
    assert!(took < Duration::from_secs(60), "{took:?}");
    let host = s.root.join("out/r/machine_000_host_00");
    let shards = std::fs::read_dir(&host).map_or(0, |d| {
        d.filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "safetensors")).count()
    });
    assert_eq!(shards, 0, "a shard was written");

    // Allowed: stored, counted, null in stats.json; inspect fails unless allowed too.
    let (output, _) = run(siphon(&extract_args(&s, "a", &["--allow-non-finite"])), Duration::from_secs(120));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(s.root.join("out/a/stats.json")).unwrap()).unwrap();
    let hook = &stats["hooks"]["blocks.1.hook_resid_post"];
    assert!(hook["non_finite"].as_u64().unwrap() > 0, "{hook}");
    assert!(hook["mean"].as_array().unwrap().iter().any(|v| v.is_null()), "{hook}");
    let inspect = |extra: &[&str]| {
        let mut args = vec!["inspect".to_string(), s.root.join("out/a").display().to_string()];
        args.extend(extra.iter().map(|a| a.to_string()));
        run(siphon(&args), Duration::from_secs(60)).0
    };
    let refused = inspect(&[]);
    let text = String::from_utf8_lossy(&refused.stderr).to_string() + &String::from_utf8_lossy(&refused.stdout);
    assert!(!refused.status.success() && text.contains("blocks.1.hook_resid_post holds"), "{text}");
    let allowed = inspect(&["--allow-non-finite"]);
    let text = String::from_utf8_lossy(&allowed.stdout);
    let problems = String::from_utf8_lossy(&allowed.stderr);
    assert!(allowed.status.success() && text.contains("NaN or ±Inf"), "{text}{problems}");
}

#[test]
fn forward_refuses_non_finite_hooks_unless_allowed() {
    let s = setup();
    overflowing(&s);
    let out = s.root.join("acts.safetensors");
    let args = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = ["forward", "--model", s.root.join("model").to_str().unwrap(), "--ids"]
            .iter()
            .map(|a| a.to_string())
            .collect();
        let ids = s.root.join("ids.json");
        std::fs::write(&ids, "[[1, 2, 3, 4]]").unwrap();
        args.extend([ids.display().to_string(), "--hooks".into(), "blocks.1.hook_resid_post".into()]);
        args.extend(["--out".into(), out.display().to_string()]);
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    };
    let (output, _) = run(siphon(&args(&[])), Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && !out.exists(), "{stderr}");
    assert!(stderr.contains("hook blocks.1.hook_resid_post holds") && stderr.contains("row 0, token 0"), "{stderr}");
    let (output, _) = run(siphon(&args(&["--allow-non-finite"])), Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success() && out.exists() && stderr.contains("warning: hook"), "{stderr}");
}
