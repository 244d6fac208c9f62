//! Bounds of the count, size and duration flags, checked where clap reads them: a value past
//! its bound is refused naming the flag and the range before anything starts, so no later
//! product of flags can overflow the integers XLA and the host buffers use, no `Duration`
//! overflows, and no count starts more processes or rounds than a machine can hold (the
//! planner sizes what is left: `siphon_plan::bounds`). Every flag states its range here, in
//! one of two ways: [`count`] for whole numbers, [`Reals`] (through [`seconds`], [`megabytes`],
//! [`gib`], [`share`]) for real ones.

use std::fmt;

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
/// Processes of a job, machines of a run (what the coordinator holds a slot for).
pub const MAX_PROCESSES: u64 = siphon_coord::MAX_PROCESSES as u64;
/// Processes one command starts on this machine (`launch --local-hosts`, `cluster bench
/// --processes`): each is a whole siphon process, so more would only exhaust the machine.
pub const MAX_LOCAL_PROCESSES: u64 = 256;
/// Rounds of a measurement (each a round trip of every process; its samples are kept).
pub const MAX_ROUNDS: u64 = 1_000_000;
/// Bytes of one buffer a command is asked to make (a PiB: past any device's or host's memory;
/// what the machine really has is checked before it is allocated).
pub const MAX_BYTES: u64 = 1 << 50;
/// Latents kept per token (their indices are `i32`).
pub const MAX_LATENTS: u64 = i32::MAX as u64;
/// Seconds of any timeout (about 31 years).
pub const MAX_SECONDS: f64 = 1e9;
/// Megabytes of a shard (1 TB).
pub const MAX_SHARD_MB: f64 = 1e6;
/// GiB of one device's memory (about a PiB).
pub const MAX_DEVICE_GIB: f64 = 1e6;

/// A whole number in `min..=max`, read as `usize`.
pub fn count(min: u64, max: u64) -> RangedU64ValueParser<usize> {
    count_of(min, max)
}

/// A whole number in `min..=max`, read as `T` (`u32`, `u16`, … where a flag holds one).
pub fn count_of<T: TryFrom<u64> + Clone + Send + Sync + 'static>(min: u64, max: u64) -> RangedU64ValueParser<T> {
    RangedU64ValueParser::new().range(min..=max)
}

/// A range of real numbers a flag takes, and what they count. NaN and the infinities are in
/// none: a `Duration` cannot hold them, nor a byte count.
#[derive(Debug, Clone, Copy)]
pub struct Reals {
    /// What a value is, for the error (`a number of seconds`).
    what: &'static str,
    /// The smallest value, or the bound every value is above.
    min: f64,
    /// Whether `min` itself is taken.
    min_included: bool,
    /// The largest value, or the bound every value is below.
    max: f64,
    /// Whether `max` itself is taken.
    max_included: bool,
}

/// Seconds of a timeout or a grace period; 0 is "at once".
pub const SECONDS: Reals =
    Reals { what: "a number of seconds", min: 0.0, min_included: true, max: MAX_SECONDS, max_included: true };
/// Seconds of a timeout that cannot be 0 (a write that may fail for no time at all never runs).
pub const POSITIVE_SECONDS: Reals = Reals { min_included: false, ..SECONDS };
/// Megabytes of a shard (at least a byte).
pub const MEGABYTES: Reals =
    Reals { what: "a number of megabytes", min: 1e-6, min_included: true, max: MAX_SHARD_MB, max_included: true };
/// GiB of a device's memory.
pub const GIB: Reals =
    Reals { what: "a number of GiB", min: 0.0, min_included: false, max: MAX_DEVICE_GIB, max_included: true };
/// A share of something, such as the device memory kept free.
pub const SHARE: Reals = Reals { what: "a share", min: 0.0, min_included: true, max: 1.0, max_included: false };

impl Reals {
    /// `text` as a number in this range, or why not.
    pub fn parse(&self, text: &str) -> Result<f64, String> {
        let value: f64 = text.trim().parse().map_err(|_| format!("{text:?} is not {}", self.what))?;
        if !self.contains(value) {
            return Err(format!("{} is not {} in {self}", short(value), self.what));
        }
        Ok(value)
    }

    /// Whether `value` lies in the range (never a NaN).
    fn contains(&self, value: f64) -> bool {
        let above = if self.min_included { value >= self.min } else { value > self.min };
        let below = if self.max_included { value <= self.max } else { value < self.max };
        above && below
    }
}

impl fmt::Display for Reals {
    /// The interval as `[0, 1e9]`, `(0, 1e6]` or `[0, 1)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (open, close) = (if self.min_included { '[' } else { '(' }, if self.max_included { ']' } else { ')' });
        write!(f, "{open}{}, {}{close}", short(self.min), short(self.max))
    }
}

/// `x` as written for people: `1e300` and `1e-7` in exponent form, `0.5` and `256` plainly.
fn short(x: f64) -> String {
    match x != 0.0 && !(1e-3..1e6).contains(&x.abs()) {
        true => format!("{x:e}"),
        false => format!("{x}"),
    }
}

/// [`SECONDS`], as clap's parser.
pub fn seconds(text: &str) -> Result<f64, String> {
    SECONDS.parse(text)
}

/// [`POSITIVE_SECONDS`], as clap's parser.
pub fn positive_seconds(text: &str) -> Result<f64, String> {
    POSITIVE_SECONDS.parse(text)
}

/// [`MEGABYTES`], as clap's parser.
pub fn megabytes(text: &str) -> Result<f64, String> {
    MEGABYTES.parse(text)
}

/// [`GIB`], as clap's parser.
pub fn gib(text: &str) -> Result<f64, String> {
    GIB.parse(text)
}

/// [`SHARE`], as clap's parser.
pub fn share(text: &str) -> Result<f64, String> {
    SHARE.parse(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_finite_and_in_range() {
        assert_eq!(seconds("1.5"), Ok(1.5));
        assert_eq!(seconds("0"), Ok(0.0));
        for bad in ["-1", "NaN", "inf", "-inf", "1e300", "x", ""] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
        assert_eq!(seconds("1e300").unwrap_err(), "1e300 is not a number of seconds in [0, 1e9]");
        assert!(positive_seconds("0").unwrap_err().contains("(0, 1e9]"));
        assert_eq!(positive_seconds("0.25"), Ok(0.25));
    }

    #[test]
    fn each_range_keeps_its_ends() {
        assert_eq!(megabytes("1000000"), Ok(1e6));
        assert!(megabytes("1000001").is_err());
        // Less than a byte would be a shard of none.
        assert_eq!(megabytes("1e-7").unwrap_err(), "1e-7 is not a number of megabytes in [1e-6, 1e6]");
        assert!(gib("0").is_err() && gib("1e7").is_err() && gib("NaN").is_err());
        assert_eq!(gib("80"), Ok(80.0));
        assert_eq!(share("0"), Ok(0.0));
        assert_eq!(share("1").unwrap_err(), "1 is not a share in [0, 1)");
        assert!(share("-0.1").is_err());
    }

    #[test]
    fn counts_refuse_what_their_type_or_range_cannot_hold() {
        use clap::builder::TypedValueParser;
        let command = clap::Command::new("t");
        let parse = |parser: &RangedU64ValueParser<u32>, text: &str| {
            parser.parse_ref(&command, None, std::ffi::OsStr::new(text)).map_err(|e| e.to_string())
        };
        let processes = count_of::<u32>(1, MAX_PROCESSES);
        assert_eq!(parse(&processes, "4"), Ok(4));
        for bad in ["0", "4294967295", "18446744073709551615", "-1", "x"] {
            assert!(parse(&processes, bad).is_err(), "{bad}");
        }
    }
}
