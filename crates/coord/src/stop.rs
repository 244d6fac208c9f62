//! Preemption: SIGTERM as a cooperative stop.
//!
//! Spot and preemptible VMs, and Kubernetes pods being evicted, get SIGTERM and a short grace
//! period before they are killed. A siphon process treats SIGTERM as "preempted, resume me":
//! it reports the preemption to the job (every other process then stops the same way, not as
//! failed), and then
//! - while its work loop runs (it [armed](StopSignal::arm) the [`StopSignal`]), the loop sees
//!   [`StopSignal::requested`], stops taking batches and commits what is complete; a deadline
//!   ([`StopSignal::start_deadline`], the job's stop timeout) ends the process anyway, since
//!   whatever is not committed by then is simply redone by the resumed run;
//! - otherwise (starting up, or a command without such a loop) it exits at once.
//!
//! Either way the exit status is [`EXIT_PREEMPTED`]. A second SIGTERM or a SIGINT during the
//! stop ends the process at once.
//!
//! A process that ends while other threads still work (a signal handler's exit while the main
//! thread compiles in a PJRT plugin) ends through [`exit_now`], never `std::process::exit`:
//! `exit(3)` runs the plugin's C++ static destructors under its own running threads, which
//! then die by SIGSEGV or SIGABRT ("Pure virtual function called!", "recursive_mutex lock
//! failed") instead of with the documented code.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Exit status of a preempted process (and of `siphon launch` when its hosts were preempted):
/// 75, `EX_TEMPFAIL` of sysexits.h, "a temporary failure; the user is invited to retry".
/// Distinct from a failure (1) and from being killed by a signal (128 + n, e.g. 143 for
/// SIGTERM), so that a scheduler can tell "resume me" from "broken" (a Kubernetes Job's
/// `podFailurePolicy` with `onExitCodes: [75]` and `action: Ignore`, systemd's
/// `RestartForceExitStatus=75`, a shell loop `until siphon ...; [ $? -ne 75 ]; do :; done`).
pub const EXIT_PREEMPTED: i32 = 75;

/// The stop request of one process and its deadline. Cheap to clone.
#[derive(Clone, Debug)]
pub struct StopSignal {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    requested: AtomicBool,
    armed: AtomicBool,
    deadline_started: AtomicBool,
    bound: Duration,
}

impl StopSignal {
    /// A signal whose deadline, once started, ends the process after `bound`.
    pub fn new(bound: Duration) -> StopSignal {
        StopSignal {
            inner: Arc::new(Inner {
                requested: AtomicBool::new(false),
                armed: AtomicBool::new(false),
                deadline_started: AtomicBool::new(false),
                bound,
            }),
        }
    }

    /// Whether this process received SIGTERM.
    pub fn requested(&self) -> bool {
        self.inner.requested.load(Ordering::SeqCst)
    }

    /// Marks this process as received SIGTERM (the signal handler does this).
    pub fn request(&self) {
        self.inner.requested.store(true, Ordering::SeqCst);
    }

    /// From now on, SIGTERM asks the caller's loop to stop (it polls [`StopSignal::requested`])
    /// instead of ending the process at once.
    pub fn arm(&self) {
        self.inner.armed.store(true, Ordering::SeqCst);
    }

    /// Whether a loop stops cooperatively on SIGTERM.
    pub fn is_armed(&self) -> bool {
        self.inner.armed.load(Ordering::SeqCst)
    }

    /// How long a stop may take before the process exits anyway.
    pub fn bound(&self) -> Duration {
        self.inner.bound
    }

    /// Starts the deadline (once; later calls do nothing): after [`StopSignal::bound`] the
    /// process exits with [`EXIT_PREEMPTED`] wherever it is.
    pub fn start_deadline(&self) {
        if self.inner.deadline_started.swap(true, Ordering::SeqCst) {
            return;
        }
        let bound = self.inner.bound;
        let spawned = std::thread::Builder::new().name("siphon-stop-deadline".into()).spawn(move || {
            std::thread::sleep(bound);
            eprintln!(
                "siphon: preempted: still committing after {bound:?}; exiting now (what is not committed is \
                 redone when the same command runs again)"
            );
            exit_now(EXIT_PREEMPTED);
        });
        if let Err(error) = spawned {
            tracing::warn!(%error, "cannot start the stop deadline; the stop is unbounded");
        }
    }
}

/// Ends the process with `code` at once, from any thread: stdout and stderr flushed, then
/// `_exit(2)` — no `atexit` handlers and no C++ static destructors, which would run under the
/// threads of a PJRT plugin still at work (a compile, a transfer) and crash them.
pub fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit(2) ends the process; it touches no memory of this one.
    unsafe { libc::_exit(code) }
}
