//! Crash points for the kill tests.
//!
//! `SIPHON_FAILPOINT=<name>` aborts the process (like `kill -9`: no destructors, no flushing)
//! when the writer reaches that point; `SIPHON_FAILPOINT_SHARD=<n>` limits it to shard `n`
//! (default: the first shard that reaches it). Names: `before_upload`, `mid_upload` (after the
//! first multipart part of a shard is stored), `after_upload_before_manifest`.
//! Unset in normal runs, where each check is one load of a cached value.

use std::sync::OnceLock;

/// A named point in the writer's pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failpoint {
    BeforeUpload,
    MidUpload,
    AfterUploadBeforeManifest,
}

impl Failpoint {
    fn name(self) -> &'static str {
        match self {
            Failpoint::BeforeUpload => "before_upload",
            Failpoint::MidUpload => "mid_upload",
            Failpoint::AfterUploadBeforeManifest => "after_upload_before_manifest",
        }
    }
}

fn armed() -> &'static Option<(String, Option<u64>)> {
    static ARMED: OnceLock<Option<(String, Option<u64>)>> = OnceLock::new();
    ARMED.get_or_init(|| {
        let name = std::env::var("SIPHON_FAILPOINT").ok().filter(|s| !s.is_empty())?;
        let shard = std::env::var("SIPHON_FAILPOINT_SHARD").ok().and_then(|s| s.parse().ok());
        Some((name, shard))
    })
}

/// Aborts the process if `point` is armed for `shard`.
pub(crate) fn hit(point: Failpoint, shard: u64) {
    if let Some((name, only)) = armed()
        && name == point.name()
        && only.is_none_or(|n| n == shard)
    {
        eprintln!("siphon-store: failpoint {name} reached at shard {shard}: aborting");
        std::process::abort();
    }
}
