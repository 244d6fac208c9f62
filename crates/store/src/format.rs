//! The dataset format's tag and versions: what a run.json and a shard's metadata carry, and
//! which of them this crate reads.

/// Format tag in every shard's metadata and in run.json.
///
/// Format 2 stores each hook as `[tokens, *per-token shape]` (run.json records the shapes)
/// and `ln_final.hook_normalized` is TransformerLens's x/RMS(x) before the final norm's gain.
/// In format 1 every hook was `[tokens, d_model]` and `ln_final.hook_normalized` was the final
/// norm's output after its gain (what format 2 calls `ln_final.hook_out`).
pub const FORMAT_TAG: &str = "siphon-activations/2";
/// The version number in [`FORMAT_TAG`].
pub const FORMAT_VERSION: u32 = 2;
/// Format versions this crate reads (verify, inspect, statistics); it writes only
/// [`FORMAT_VERSION`] and resumes only runs of that version.
pub const READABLE_FORMAT_VERSIONS: [u32; 2] = [1, 2];
const FORMAT_PREFIX: &str = "siphon-activations/";

/// The version of a format tag this crate reads (`siphon-activations/1` → 1); `None` for any
/// other tag.
pub fn format_version(tag: &str) -> Option<u32> {
    let version: u32 = tag.strip_prefix(FORMAT_PREFIX)?.parse().ok()?;
    READABLE_FORMAT_VERSIONS.contains(&version).then_some(version)
}

/// The readable format tags, for messages.
pub(crate) fn readable_formats() -> String {
    READABLE_FORMAT_VERSIONS.iter().map(|v| format!("{FORMAT_PREFIX}{v}")).collect::<Vec<_>>().join(" and ")
}
