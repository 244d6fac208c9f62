//! Bounds of the size flags, checked where clap reads them: a count past its bound is refused
//! naming the flag and the range before anything starts, so no later product of flags can
//! overflow the integers XLA and the host buffers use (the planner sizes what is left:
//! `siphon_plan::bounds`).

use clap::builder::RangedU64ValueParser;

/// Sequences per step: rows of every array the program takes (XLA's dimensions are checked
/// as `i32` by some kernels).
pub const MAX_BATCH: u64 = i32::MAX as u64;
/// Tokens per sequence: positions are `i32` in every program.
pub const MAX_SEQ: u64 = i32::MAX as u64;
/// Devices of a mesh axis (a million: past any slice or cluster).
pub const MAX_AXIS: u64 = 1 << 20;
/// Virtual devices of the CPU plugin (each runs its own threads).
pub const MAX_CPU_DEVICES: u64 = 1024;
/// Steps in flight on the output path, batches of a stream's buffers, threads.
pub const MAX_SMALL_COUNT: u64 = 4096;
/// Batches of a token-shuffle window (each held in host memory: the job checks the bytes).
pub const MAX_WINDOW: u64 = 1 << 20;
/// Seconds of any timeout (about 31 years).
pub const MAX_SECONDS: f64 = 1e9;
/// Megabytes of a shard (1 TB).
pub const MAX_SHARD_MB: f64 = 1e6;

/// A count in `min..=max`, read as `usize`.
pub fn count(min: u64, max: u64) -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(min..=max)
}

/// A number of seconds in `[0, MAX_SECONDS]` (a `Duration` cannot hold more, or a NaN).
pub fn seconds(text: &str) -> Result<f64, String> {
    let value: f64 = text.trim().parse().map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(0.0..=MAX_SECONDS).contains(&value) {
        return Err(format!("{value} is not a number of seconds in 0..={MAX_SECONDS:e}"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_finite_and_in_range() {
        assert_eq!(seconds("1.5"), Ok(1.5));
        for bad in ["-1", "NaN", "inf", "1e300", "x"] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
    }
}
