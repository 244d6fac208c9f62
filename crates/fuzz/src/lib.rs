//! Generated inputs for every reader of outside bytes (test-only).
//!
//! A reader of a user's files (a GGUF, a safetensors header, a `config.json`, a shard, a
//! manifest line, a stream message) must answer every input with a value or an `Err` whose
//! message says what is wrong — never a panic, an abort, an allocation larger than the input
//! could justify, or a hang. This crate checks that with property tests (`proptest`, no fork,
//! no persistence files) over mutations of valid inputs:
//!
//! - [`bytes`]: truncation at every length class, flipped bits, integers overwritten with 0,
//!   1, -1, 2^31, 2^32, 2^40, 2^63 and `u64::MAX` at any width, runs of edge bytes, spans
//!   duplicated or deleted — most of them within the first `hot` bytes, where headers are.
//! - [`json`]: a JSON document with fields removed, values of the wrong type, numbers set to
//!   0 / -1 / huge / fractional, strings emptied or made long, arrays emptied or grown.
//! - [`grpc`]: raw gRPC calls, for the readers behind a service.
//! - [`check`]: runs a reader on generated cases; a case fails on a panic, an `Err` with an
//!   empty message, or an allocation over [`Bounded`]'s limit (set up as the test binary's
//!   global allocator); a case running past the hang limit aborts the binary naming it. A
//!   failing case is shrunk to its fewest mutations and printed: keep it as a regular test.
//!
//! `SIPHON_FUZZ_CASES` multiplies every target's case count (CI runs the default, 1) and
//! `SIPHON_FUZZ_SEED` changes the otherwise fixed seed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

pub mod bytes;
pub mod grpc;
pub mod json;

/// A global allocator that refuses, while a case runs, any single allocation above `limit`
/// bytes: it returns null (so `try_reserve` sees an error) and records the size, and the case
/// fails even when the reader handled the refusal — on a real machine the allocation would
/// have succeeded. Declare it in each test binary that uses [`check`]:
///
/// ```ignore
/// #[global_allocator]
/// static ALLOC: siphon_fuzz::Bounded = siphon_fuzz::Bounded::new(1 << 30);
/// ```
pub struct Bounded {
    limit: usize,
}

/// Whether a case runs (the bound applies only then: fixtures may be large).
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The largest refused allocation of the running case (0: none).
static REFUSED: AtomicUsize = AtomicUsize::new(0);
/// The limit of the binary's [`Bounded`] allocator (0: none declared).
static LIMIT: AtomicUsize = AtomicUsize::new(0);

impl Bounded {
    /// An allocator refusing single allocations above `limit` bytes while a case runs.
    pub const fn new(limit: usize) -> Bounded {
        Bounded { limit }
    }

    fn refuses(&self, size: usize) -> bool {
        if size > self.limit && ACTIVE.load(Ordering::Relaxed) {
            LIMIT.store(self.limit, Ordering::Relaxed);
            REFUSED.fetch_max(size, Ordering::Relaxed);
            // Named now: a reader that cannot handle the refusal aborts the binary before
            // `check` could shrink and print the case (writing a `&str` allocates nothing).
            if let Ok(case) = CASE.try_lock() {
                use std::io::Write;
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(b"siphon-fuzz: an allocation over the bound, reading ");
                let _ = err.write_all(case.as_bytes());
                let _ = err.write_all(b"\n");
            }
            return true;
        }
        false
    }
}

// SAFETY: every call is forwarded to `System` unchanged, or answered with null (allowed: an
// allocator may fail any request).
unsafe impl GlobalAlloc for Bounded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if self.refuses(layout.size()) {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if self.refuses(layout.size()) {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if self.refuses(new_size) {
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Seconds a single case may run before the watchdog aborts the test binary, naming it.
pub const HANG_SECONDS: u64 = 30;

/// Start of the running case in milliseconds since [`epoch`] (0: none).
static CASE_START: AtomicU64 = AtomicU64::new(0);
/// The running case, as text, for the watchdog's message.
static CASE: Mutex<String> = Mutex::new(String::new());

fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn start_watchdog() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        epoch();
        std::thread::spawn(|| {
            loop {
                std::thread::sleep(Duration::from_millis(250));
                let start = CASE_START.load(Ordering::Relaxed);
                let now = epoch().elapsed().as_millis() as u64;
                if start != 0 && now.saturating_sub(start) > HANG_SECONDS * 1000 {
                    let case = CASE.lock().map(|c| c.clone()).unwrap_or_default();
                    // Straight to the file descriptor: libtest captures `eprintln!` of a thread
                    // a test spawned, and the abort would lose it.
                    use std::io::Write;
                    let line = format!("siphon-fuzz: a case ran past {HANG_SECONDS} s (a hang): {case}\n");
                    let _ = std::io::stderr().write_all(line.as_bytes());
                    std::process::abort();
                }
            }
        });
    });
}

/// Cases per target: `default` × `SIPHON_FUZZ_CASES` (1 unless set).
pub fn cases(default: u32) -> u32 {
    let factor: u32 = std::env::var("SIPHON_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    default.saturating_mul(factor.max(1))
}

fn runner(cases: u32) -> TestRunner {
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 2048,
        // A reader's `Err` is a pass, not a rejection: no case is ever rejected.
        max_global_rejects: 0,
        ..Config::default()
    };
    let rng = match std::env::var("SIPHON_FUZZ_SEED").ok().and_then(|s| s.parse::<u64>().ok()) {
        Some(seed) => {
            let mut bytes = [0u8; 32];
            bytes[..8].copy_from_slice(&seed.to_le_bytes());
            TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
        }
        None => TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    };
    TestRunner::new_with_rng(config, rng)
}

/// What a reader made of one generated input.
pub type Outcome = Result<(), String>;

/// Runs `read` on `cases` inputs drawn from `strategy`; panics with the smallest failing input
/// (a panic in the reader, an `Err` with an empty message, an allocation over the bound).
/// `read` answers `Ok` for an input it accepted and `Err(message)` for one it refused.
pub fn check<S>(name: &str, cases: u32, strategy: S, read: impl FnMut(&S::Value) -> Outcome)
where
    S: Strategy,
    S::Value: std::fmt::Debug,
{
    start_watchdog();
    let mut runner = runner(cases);
    // proptest's runner takes a `Fn`.
    let read = std::cell::RefCell::new(read);
    let (accepted, refused) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0u32));
    let result = runner.run(&strategy, |input| {
        if let Ok(mut case) = CASE.lock() {
            *case = format!("{name}: {input:?}");
            case.truncate(4096);
        }
        REFUSED.store(0, Ordering::Relaxed);
        ACTIVE.store(true, Ordering::Relaxed);
        CASE_START.store(epoch().elapsed().as_millis().max(1) as u64, Ordering::Relaxed);
        let outcome = catch_unwind(AssertUnwindSafe(|| (read.borrow_mut())(&input)));
        CASE_START.store(0, Ordering::Relaxed);
        ACTIVE.store(false, Ordering::Relaxed);
        let refused_bytes = REFUSED.swap(0, Ordering::Relaxed);
        if refused_bytes > 0 {
            return Err(TestCaseError::fail(format!(
                "asked for an allocation of {refused_bytes} bytes (bound {})",
                LIMIT.load(Ordering::Relaxed)
            )));
        }
        match outcome {
            Err(panic) => Err(TestCaseError::fail(format!("panicked: {}", panic_text(&*panic)))),
            Ok(Err(message)) if message.trim().is_empty() => Err(TestCaseError::fail("an error with no message")),
            Ok(Err(_)) => {
                refused.set(refused.get() + 1);
                Ok(())
            }
            Ok(Ok(())) => {
                accepted.set(accepted.get() + 1);
                Ok(())
            }
        }
    });
    if let Err(err) = result {
        panic!("{name}: {err}");
    }
    eprintln!(
        "{name}: {cases} generated inputs: {} accepted, {} refused with a message",
        accepted.get(),
        refused.get()
    );
}

/// Silences the default panic message of the panics [`check`] catches (each is reported once,
/// shrunk); other threads' panics still print.
pub fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !ACTIVE.load(Ordering::Relaxed) {
                default(info);
            }
        }));
    });
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a panic without a message)".to_string()
    }
}

/// Maps any reader's result to an [`Outcome`], keeping its error's whole chain as the message.
pub fn outcome<T, E: std::fmt::Display>(result: Result<T, E>) -> Outcome {
    result.map(|_| ()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static ALLOC: Bounded = Bounded::new(64 << 20);

    #[test]
    #[should_panic(expected = "panicked: index out of bounds")]
    fn a_panicking_reader_fails() {
        quiet_panics();
        check("panics", 64, bytes::mutations(b"abcdefgh", 8), |input| {
            let _ = input[..][input.len().saturating_sub(1) + 1];
            let v: Vec<u8> = Vec::new();
            let _ = v[input.len()];
            Ok(())
        });
    }

    #[test]
    #[should_panic(expected = "allocation of")]
    fn an_allocation_over_the_bound_fails_even_when_handled() {
        check("allocates", 64, bytes::mutations(&[0u8; 16], 16), |input| {
            let n = u64::from_le_bytes(input.get(..8).and_then(|b| b.try_into().ok()).unwrap_or([0; 8]));
            let mut v: Vec<u8> = Vec::new();
            v.try_reserve(n.min(1 << 40) as usize).map_err(|e| e.to_string())?;
            Ok(())
        });
    }

    #[test]
    #[should_panic(expected = "no message")]
    fn an_error_without_a_message_fails() {
        check("silent", 16, bytes::mutations(b"x", 1), |_| Err(String::new()));
    }

    #[test]
    fn a_careful_reader_passes() {
        check("careful", 256, bytes::mutations(b"\x04\0\0\0abcd", 12), |input| {
            let n = u32::from_le_bytes(input.get(..4).and_then(|b| b.try_into().ok()).ok_or("short header")?);
            let body = input.get(4..).unwrap_or_default();
            if n as usize != body.len() {
                return Err(format!("header says {n} bytes, {} follow", body.len()));
            }
            Ok(())
        });
    }
}
