//! The per-host manifest: one JSON line per committed shard.
//!
//! A shard is part of the dataset exactly when its line is in the manifest. Object stores have
//! no append, so each commit rewrites the whole `manifest.jsonl` with one put (atomic on S3, GCS,
//! Azure, and on local disk where object_store writes a temporary file and renames it). A
//! manifest of N lines costs N * ~300 bytes per commit, small next to a ~256 MB shard.

use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};
use crate::shard::SealedShard;

/// One committed shard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestLine {
    /// Object name inside the host directory, `shard_{n:06}.safetensors`.
    pub shard: String,
    /// Shard index (0, 1, 2, ... without gaps).
    pub index: u64,
    /// Object size.
    pub bytes: u64,
    /// CRC32C (Castagnoli) of the object, 8 hex digits: what shards are checked by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<String>,
    /// Hex sha256 of the object: what shards written before the CRC were checked by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Token rows in the shard.
    pub tokens: u64,
    /// Rows included by the mask (equal to `tokens` when excluded tokens are dropped).
    pub included_tokens: u64,
    /// Host-local samples `[start, end)` in the shard.
    pub samples: [u64; 2],
    /// Data-stream position after the shard's last batch: where a restart resumes.
    pub data_position_after: serde_json::Value,
}

impl ManifestLine {
    /// The line for a sealed shard.
    pub fn for_shard(shard: &SealedShard) -> Self {
        ManifestLine {
            shard: crate::location::shard_name(shard.index),
            index: shard.index,
            bytes: shard.bytes,
            crc32c: Some(format!("{:08x}", shard.crc32c)),
            sha256: None,
            tokens: shard.tokens,
            included_tokens: shard.included_tokens,
            samples: [shard.samples.0, shard.samples.1],
            data_position_after: shard.data_position_after.clone(),
        }
    }
}

impl ManifestLine {
    /// The checksum the line records, as `crc32c 1a2b3c4d` or `sha256 …`.
    pub fn checksum(&self) -> String {
        match (&self.crc32c, &self.sha256) {
            (Some(crc), _) => format!("crc32c {crc}"),
            (None, Some(sha)) => format!("sha256 {sha}"),
            (None, None) => "no checksum".into(),
        }
    }

    /// Checks `bytes` (the whole object) against the line's checksum; the error says what
    /// was found and what the line records.
    pub fn check(&self, bytes: &[u8]) -> std::result::Result<(), String> {
        let found = match (&self.crc32c, &self.sha256) {
            (Some(_), _) => format!("crc32c {:08x}", crc32c::crc32c(bytes)),
            (None, Some(_)) => {
                use sha2::Digest;
                format!("sha256 {}", hex::encode(sha2::Sha256::digest(bytes)))
            }
            (None, None) => return Err("the manifest line records no checksum (crc32c or sha256)".into()),
        };
        if found == self.checksum() { Ok(()) } else { Err(format!("{found}, the manifest says {}", self.checksum())) }
    }
}

/// Parses `manifest.jsonl` text; blank lines are ignored.
pub fn parse_manifest(path: &str, text: &str) -> Result<Vec<ManifestLine>> {
    match parse_manifest_torn(path, text)? {
        (lines, None) => Ok(lines),
        (_, Some(torn)) => Err(StoreError::Corrupt { path: path.to_string(), reason: torn }),
    }
}

/// Parses `manifest.jsonl` text that may end in a torn write: a last line that is cut short
/// (no newline, not valid JSON), what a filesystem without atomic renames leaves after a power
/// loss. Returns the complete lines and, for a torn last line, what is wrong with it; any
/// other bad line is an error.
pub fn parse_manifest_torn(path: &str, text: &str) -> Result<(Vec<ManifestLine>, Option<String>)> {
    if !text.is_empty() && !text.ends_with('\n') {
        let (complete, last) = text.rsplit_once('\n').unwrap_or(("", text));
        if serde_json::from_str::<ManifestLine>(last).is_err() {
            let n = complete.lines().count() + 1;
            let torn = format!("line {n} is cut short ({} bytes, no newline): a torn write", last.len());
            return Ok((parse_lines(path, complete)?, Some(torn)));
        }
    }
    Ok((parse_lines(path, text)?, None))
}

fn parse_lines(path: &str, text: &str) -> Result<Vec<ManifestLine>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| StoreError::Corrupt { path: path.to_string(), reason: format!("line {}: {e}", i + 1) })
        })
        .collect()
}

/// Renders lines as `manifest.jsonl` text.
pub fn render_manifest(lines: &[ManifestLine]) -> String {
    let mut out = String::new();
    for line in lines {
        out.push_str(&serde_json::to_string(line).expect("manifest lines serialize"));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_round_trips_and_reports_bad_lines() {
        let line = ManifestLine {
            shard: "shard_000000.safetensors".into(),
            index: 0,
            bytes: 10,
            crc32c: Some("0000abcd".into()),
            sha256: None,
            tokens: 3,
            included_tokens: 2,
            samples: [0, 4],
            data_position_after: serde_json::json!({"batch": 1}),
        };
        let text = render_manifest(&[line.clone(), line.clone()]);
        assert_eq!(parse_manifest("m", &text).unwrap(), vec![line.clone(), line]);
        let err = parse_manifest("m", &format!("{text}{{oops\n")).unwrap_err().to_string();
        assert!(err.contains("line 3"), "{err}");
        // A last line cut short is a torn write: the complete lines survive; a bad line that
        // ends in a newline, or one in the middle, is corruption.
        for cut in [1, 40, text.len() / 2 - 2] {
            let torn = format!("{text}{}", &text[..cut]);
            let (lines, why) = parse_manifest_torn("m", &torn).unwrap();
            assert_eq!(lines.len(), 2, "{cut}");
            assert!(why.unwrap().contains("line 3 is cut short"));
            assert!(parse_manifest("m", &torn).unwrap_err().to_string().contains("torn"));
        }
        assert!(parse_manifest_torn("m", &format!("{{oops\n{text}")).is_err());
        assert_eq!(parse_manifest_torn("m", text.trim_end()).unwrap().1, None, "a whole last line without its newline");
    }
}
