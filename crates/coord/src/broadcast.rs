//! Config broadcast and check: every process must run the same code with the same arguments.
//!
//! Rank 0 publishes its canonical config (sorted-key JSON, with its sha256) plus the values only
//! it resolves (run name, start time) in the key-value store. Every other rank compares the hash
//! of its own canonical config with rank 0's; on a mismatch it reports an error listing the
//! differing fields as dotted paths, which stops every process. All ranks then pass a barrier,
//! so no process goes on before every comparison is done. No shared filesystem is involved.
//!
//! The config is a `serde_json::Value` supplied by the caller (the extraction command passes its
//! resolved arguments plus the siphon version and the PJRT plugin's sha256), so this crate does
//! not depend on what the config holds.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::client::Client;
use crate::error::{CoordError, Result};

/// The key under which rank 0 publishes the config.
pub const CONFIG_KEY: &str = "siphon/config";
/// The barrier all ranks pass after comparing.
pub const CONFIG_BARRIER: &str = "siphon/config-checked";

pub use crate::error::FieldDiff;

/// JSON with object keys sorted at every level, so that equal configs hash equally whatever
/// order they were built in (serde_json may preserve insertion order).
pub fn canonical_json(value: &Value) -> String {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                Value::Object(entries.into_iter().map(|(k, v)| (k.clone(), sorted(v))).collect())
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    // Sorting into a fresh map is only order-preserving with `preserve_order`; without it the
    // map is a BTreeMap and sorted anyway. Either way the text is canonical.
    sorted(value).to_string()
}

/// sha256 (hex) of the canonical JSON.
pub fn config_hash(value: &Value) -> String {
    hex::encode(Sha256::digest(canonical_json(value).as_bytes()))
}

/// The fields that differ between `rank0` and `ours`, as dotted paths in sorted order.
pub fn diff(rank0: &Value, ours: &Value) -> Vec<FieldDiff> {
    let mut out = Vec::new();
    diff_into("", rank0, ours, &mut out);
    out
}

fn diff_into(path: &str, rank0: &Value, ours: &Value, out: &mut Vec<FieldDiff>) {
    match (rank0, ours) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let child = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => diff_into(&child, x, y, out),
                    (x, y) => {
                        out.push(FieldDiff { path: child, rank0: x.map(canonical_json), ours: y.map(canonical_json) })
                    }
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (index, (x, y)) in a.iter().zip(b).enumerate() {
                diff_into(&format!("{path}[{index}]"), x, y, out);
            }
        }
        (x, y) if x != y => out.push(FieldDiff {
            path: if path.is_empty() { "(root)".to_string() } else { path.to_string() },
            rank0: Some(canonical_json(x)),
            ours: Some(canonical_json(y)),
        }),
        _ => {}
    }
}

/// Publishes (rank 0) or checks (other ranks) the config, then passes the config barrier.
/// `compared` is this rank's canonical arguments (with version and plugin hash); `resolve`
/// runs on rank 0 only and yields what rank 0 alone decides (run name, start time). Returns
/// rank 0's resolved value on every rank.
pub async fn broadcast_config(
    client: &Client,
    compared: &Value,
    resolve: impl FnOnce() -> Value,
    timeout: Duration,
) -> Result<Value> {
    let hash = config_hash(compared);
    let resolved = if client.task() == 0 {
        let resolved = resolve();
        let published = serde_json::json!({ "hash": hash, "compared": compared, "resolved": resolved });
        client.kv_set(CONFIG_KEY, canonical_json(&published).as_bytes(), false).await?;
        resolved
    } else {
        let bytes = client.kv_get(CONFIG_KEY, timeout).await?;
        match read_published(&bytes, compared, &hash, client.task()) {
            Ok(resolved) => resolved,
            Err(error) => {
                if matches!(error, CoordError::ConfigMismatch { .. }) {
                    // Stop everyone: the report becomes the job's error on every process.
                    let _ = client.report_error(&error.to_string()).await;
                }
                return Err(error);
            }
        }
    };
    client.barrier(CONFIG_BARRIER, timeout).await?;
    Ok(resolved)
}

/// Reads what task 0 published (`bytes`, from the key-value store) on task `task`, whose
/// canonical config is `compared` with hash `hash`: task 0's resolved values, or why not (an
/// unreadable publication, or the fields that differ).
pub(crate) fn read_published(bytes: &[u8], compared: &Value, hash: &str, task: u32) -> Result<Value> {
    let published: Value = serde_json::from_slice(bytes)
        .map_err(|e| CoordError::Internal(format!("task 0 published an unreadable config: {e}")))?;
    if published.get("hash").and_then(Value::as_str) != Some(hash) {
        let fields = diff(published.get("compared").unwrap_or(&Value::Null), compared);
        return Err(CoordError::ConfigMismatch { task, fields });
    }
    Ok(published.get("resolved").cloned().unwrap_or(Value::Null))
}

/// Values rank 0 resolves for a run: a generated run name and the start time (UTC, RFC 3339).
pub fn new_run_identity() -> Value {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let (year, month, day, hour, minute, second) = civil_time(now);
    let suffix: u16 = rand::rng().random();
    serde_json::json!({
        "run_name": format!("siphon-{year:04}{month:02}{day:02}-{hour:02}{minute:02}{second:02}-{suffix:04x}"),
        "start_time": format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}Z"),
    })
}

/// (year, month, day, hour, minute, second) of a Unix time, UTC (days-from-civil inverse).
fn civil_time(unix: u64) -> (i64, u32, u32, u32, u32, u32) {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day, (secs / 3600) as u32, ((secs % 3600) / 60) as u32, (secs % 60) as u32)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn canonical_hash_ignores_key_order() {
        let a: Value = serde_json::from_str(r#"{"b": 1, "a": {"y": [1, 2], "x": "s"}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a": {"x": "s", "y": [1, 2]}, "b": 1}"#).unwrap();
        assert_eq!(canonical_json(&a), r#"{"a":{"x":"s","y":[1,2]},"b":1}"#);
        assert_eq!(config_hash(&a), config_hash(&b));
        assert_ne!(config_hash(&a), config_hash(&json!({"b": 2, "a": {"x": "s", "y": [1, 2]}})));
    }

    #[test]
    fn diff_lists_dotted_paths() {
        let rank0 = json!({"model": {"name": "qwen", "layers": [1, 2]}, "batch": 8, "only0": true, "v": "0.1"});
        let ours = json!({"model": {"name": "qwen", "layers": [1, 3]}, "batch": 16, "onlyhere": 1, "v": "0.1"});
        let fields = diff(&rank0, &ours);
        let paths: Vec<&str> = fields.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["batch", "model.layers[1]", "only0", "onlyhere"]);
        assert_eq!(fields[0].to_string(), "batch (task 0: 8, here: 16)");
        assert_eq!(fields[2].ours, None);
        assert!(diff(&rank0, &rank0).is_empty());
        // Arrays of different lengths differ as a whole.
        let whole = diff(&json!({"h": [1]}), &json!({"h": [1, 2]}));
        assert_eq!(whole[0].path, "h");
    }

    #[test]
    fn run_identity_is_well_formed() {
        assert_eq!(civil_time(0), (1970, 1, 1, 0, 0, 0));
        assert_eq!(civil_time(1_763_780_554), (2025, 11, 22, 3, 2, 34));
        assert_eq!(civil_time(951_782_400), (2000, 2, 29, 0, 0, 0));
        let run = new_run_identity();
        let name = run["run_name"].as_str().unwrap();
        assert!(name.starts_with("siphon-") && name.len() == "siphon-20261122-031234-abcd".len(), "{name}");
        assert!(run["start_time"].as_str().unwrap().ends_with('Z'));
    }
}
