//! SIGTERM and SIGINT in `siphon extract` (and `siphon generate`, whose written completions
//! are whole lines a run started again resumes after: [`install_for_generate`]): whatever the job is doing — loading the model,
//! uploading it, compiling, stepping or committing — the process ends in its documented exit
//! code, [`siphon_coord::EXIT_PREEMPTED`] (75) for SIGTERM and 130 for SIGINT, never by a crash.
//!
//! Two handlers share the work. Until the job has joined its coordinator, [`install`]'s ends
//! the process itself: a line on stderr, then `_exit(2)` (nothing is written yet, so there is
//! nothing to commit; `_exit` skips the plugins' C++ static destructors, which crash under
//! their own threads). Once the coordinator's handlers are registered
//! (`Coordination::install_failure_reporting`), [`hand_over`] leaves the ending to them
//! (reporting to the other hosts, a cooperative stop in the loop) and this handler only
//! records the signal, so that a job that ends on its own just after one ([`received`]) still
//! exits with the signal's code rather than 0 or 1.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// The first SIGTERM or SIGINT received (0: none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);
/// Whether the coordinator's handlers end the process now.
static HANDED_OVER: AtomicBool = AtomicBool::new(false);
/// Whether the process is `siphon generate` (its own lines).
static GENERATE: AtomicBool = AtomicBool::new(false);

/// [`install`] for `siphon generate`: a signal ends it at once with the same codes, the
/// completions it wrote kept for the next run.
pub fn install_for_generate() {
    GENERATE.store(true, Ordering::SeqCst);
    HANDED_OVER.store(false, Ordering::SeqCst);
    register();
}

/// Installs the handlers (first thing in `siphon extract`, and again once `extract
/// --generate`'s completions are written: whatever handled signals before stands down).
pub fn install() {
    GENERATE.store(false, Ordering::SeqCst);
    HANDED_OVER.store(false, Ordering::SeqCst);
    register();
}

fn register() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: `on_signal` only touches atomics and calls write(2) and _exit(2), all
        // async-signal-safe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// The coordinator's handlers are registered: from now on they end the process.
pub fn hand_over() {
    HANDED_OVER.store(true, Ordering::SeqCst);
}

/// The signal this process received, if any, with the code it must end with.
pub fn received() -> Option<(&'static str, i32)> {
    match RECEIVED.load(Ordering::SeqCst) {
        libc::SIGTERM => Some(("SIGTERM", siphon_coord::EXIT_PREEMPTED)),
        libc::SIGINT => Some(("SIGINT", 130)),
        _ => None,
    }
}

extern "C" fn on_signal(signal: libc::c_int) {
    let _ = RECEIVED.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
    if HANDED_OVER.load(Ordering::SeqCst) {
        return;
    }
    let (line, code): (&[u8], i32) = match (signal, GENERATE.load(Ordering::SeqCst)) {
        (libc::SIGTERM, true) => (
            b"siphon: received SIGTERM: preempted; the completions written are kept (OUT.partial); exiting with 75 (run the same command again to go on)\n",
            siphon_coord::EXIT_PREEMPTED,
        ),
        (_, true) => (b"error: received SIGINT; the completions written are kept (OUT.partial); exiting with 130\n", 130),
        (libc::SIGTERM, false) => (
            b"siphon: received SIGTERM before the job started: preempted, nothing written; exiting with 75 (run the same command again)\n",
            siphon_coord::EXIT_PREEMPTED,
        ),
        (_, false) => (b"error: received SIGINT before the job started; exiting with 130\n", 130),
    };
    // SAFETY: write(2) and _exit(2) are async-signal-safe; `line` is static.
    unsafe {
        libc::write(2, line.as_ptr().cast(), line.len());
        libc::_exit(code);
    }
}
