//! The process never dies silently.
//!
//! - A panic prints one line: the version, what panicked and where (a backtrace too with
//!   `RUST_BACKTRACE=1`); the process then exits non-zero as the panic's thread decides, and
//!   in a job the coordinator's hook (`siphon_coord::Coordination::install_failure_reporting`,
//!   installed after this one and calling it) first tells the other hosts, which stop.
//! - A fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT: a fault in a PJRT plugin's native
//!   code, an abort) prints one line naming the signal, the version, the host and the job's
//!   step, with `write(2)` alone (all a signal handler may do), then ends the process by the
//!   same signal, so `siphon launch` and schedulers see it as before. The other hosts learn of
//!   it from the coordinator (a host that stops answering fails the job).
//!
//! `SIPHON_TEST_CRASH=panic@N` or `segv@N` makes a job fail that way at step N (the tests'; with
//! `SIPHON_TEST_CRASH_HOST=h`, only host h). `SIPHON_TEST_SIGNAL=PHASE:SIGTERM` (or `SIGINT`)
//! sends this process the signal as it enters the job's [`Phase`] of that name, which it then
//! goes on doing while the signal is handled (the tests of `crate::interrupt`).

use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering};

/// The job's step, -1 before the loop.
static STEP: AtomicI64 = AtomicI64::new(-1);
/// The host as `machine << 32 | host`, `u64::MAX` before it is known.
static HOST: AtomicU64 = AtomicU64::new(u64::MAX);
/// The job's [`Phase`] (as its index in [`Phase::ALL`] plus one), 0 before the job.
static PHASE: AtomicU8 = AtomicU8::new(0);

/// The phases of the job the fatal lines name, and where the tests send signals.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Phase {
    /// Fetching and opening the model, the checks and the plan (before the coordinator).
    Load,
    /// Loading the plugin, making its client and putting the weights on the devices.
    Upload,
    /// Compiling the forward pass.
    Compile,
    /// The loop of steps.
    Step,
    /// The last shards, the completion barrier and the statistics' merge.
    Commit,
}

impl Phase {
    /// Every phase, in the job's order.
    pub const ALL: [Phase; 5] = [Phase::Load, Phase::Upload, Phase::Compile, Phase::Step, Phase::Commit];

    /// Its name in `SIPHON_TEST_SIGNAL`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Load => "load",
            Phase::Upload => "upload",
            Phase::Compile => "compile",
            Phase::Step => "step",
            Phase::Commit => "commit",
        }
    }

    /// What the process is doing in it, for the fatal lines.
    fn doing(self) -> &'static str {
        match self {
            Phase::Load => "loading the model",
            Phase::Upload => "starting the devices and uploading the weights",
            Phase::Compile => "compiling the forward pass",
            Phase::Step => "stepping",
            Phase::Commit => "committing the last shards",
        }
    }
}

/// Records that the job enters `phase`; sends the signal `SIPHON_TEST_SIGNAL` asks for there.
pub fn enter(phase: Phase) {
    let index = Phase::ALL.iter().position(|&p| p == phase).unwrap_or(0);
    PHASE.store(index as u8 + 1, Ordering::Relaxed);
    let Ok(asked) = std::env::var("SIPHON_TEST_SIGNAL") else { return };
    let signal = match asked.split_once(':') {
        Some((name, "SIGTERM")) if name == phase.name() => libc::SIGTERM,
        Some((name, "SIGINT")) if name == phase.name() => libc::SIGINT,
        _ => return,
    };
    // SAFETY: kill(2) of this process, as a scheduler or a terminal would send it.
    unsafe { _ = libc::kill(libc::getpid(), signal) };
}

fn phase() -> Option<Phase> {
    match PHASE.load(Ordering::Relaxed) {
        0 => None,
        n => Phase::ALL.get(n as usize - 1).copied(),
    }
}

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Installs the panic hook and the fatal-signal handlers (once, first thing in `main`).
pub fn install() {
    std::panic::set_hook(Box::new(|info| {
        let location = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        let payload = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into());
        let thread = std::thread::current().name().unwrap_or("unnamed").to_string();
        let message = payload.replace('\n', " ");
        eprintln!(
            "siphon {VERSION}: internal error{}: thread '{thread}' panicked{location}: {message} (a bug in siphon: \
             please report this line)",
            where_text()
        );
        if std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0") {
            eprintln!("{}", std::backtrace::Backtrace::force_capture());
        }
    }));
    for signal in [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGABRT] {
        // SAFETY: `on_fatal_signal` only formats into a stack buffer, calls write(2) and
        // raise(3) (async-signal-safe); SA_RESETHAND restores the default action first, so the
        // re-raised signal ends the process as it would have.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_fatal_signal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESETHAND | libc::SA_ONSTACK | libc::SA_NODEFER;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// Records which host this process is (for the fatal lines).
pub fn set_host(machine: u32, host: u32) {
    HOST.store((machine as u64) << 32 | host as u64, Ordering::Relaxed);
}

/// Records the job's current step; fails it as `SIPHON_TEST_CRASH` asks.
pub fn set_step(step: u64) {
    STEP.store(step as i64, Ordering::Relaxed);
    static CRASH: std::sync::OnceLock<Option<(String, u64)>> = std::sync::OnceLock::new();
    let crash = CRASH.get_or_init(|| {
        let text = std::env::var("SIPHON_TEST_CRASH").ok()?;
        let (kind, at) = text.split_once('@')?;
        // `SIPHON_TEST_CRASH_HOST=h`: only host h (a launcher gives every host one environment).
        let host = std::env::var("SIPHON_TEST_CRASH_HOST").ok().and_then(|h| h.parse::<u64>().ok());
        if host.is_some_and(|h| h != HOST.load(Ordering::Relaxed) & 0xffff_ffff) {
            return None;
        }
        Some((kind.to_string(), at.parse().ok()?))
    });
    match crash {
        Some((kind, at)) if *at == step && kind == "panic" => panic!("SIPHON_TEST_CRASH at step {step}"),
        // SAFETY: raising a signal in this process, as a fault in native code would.
        Some((kind, at)) if *at == step && kind == "segv" => unsafe { _ = libc::raise(libc::SIGSEGV) },
        _ => {}
    }
}

fn where_text() -> String {
    let host = HOST.load(Ordering::Relaxed);
    let step = STEP.load(Ordering::Relaxed);
    let mut text = String::new();
    if host != u64::MAX {
        text += &format!(" in host {} (machine {})", host & 0xffff_ffff, host >> 32);
    }
    match phase() {
        Some(Phase::Step) | None if step >= 0 => text += &format!(" at step {step}"),
        Some(phase) => text += &format!(" while {}", phase.doing()),
        None => {}
    }
    text
}

/// A fixed-size line built without allocating.
struct Line {
    bytes: [u8; 512],
    len: usize,
}

impl Line {
    fn push(&mut self, text: &[u8]) {
        let n = text.len().min(self.bytes.len() - self.len);
        self.bytes[self.len..self.len + n].copy_from_slice(&text[..n]);
        self.len += n;
    }

    fn number(&mut self, mut value: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (value % 10) as u8;
            value /= 10;
            if value == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
}

extern "C" fn on_fatal_signal(signal: libc::c_int) {
    let name: &[u8] = match signal {
        libc::SIGSEGV => {
            b"SIGSEGV (an invalid memory access: a fault in a PJRT plugin or native code, or a stack overflow)"
        }
        libc::SIGBUS => b"SIGBUS (a bad memory access: a truncated memory-mapped file, or a fault in native code)",
        libc::SIGILL => b"SIGILL (an illegal instruction: a plugin built for another CPU)",
        libc::SIGFPE => b"SIGFPE (an arithmetic fault in native code)",
        _ => b"SIGABRT (an abort: a failed allocation or a plugin's check)",
    };
    let mut line = Line { bytes: [0; 512], len: 0 };
    line.push(b"siphon ");
    line.push(VERSION.as_bytes());
    line.push(b": fatal signal ");
    line.push(name);
    let host = HOST.load(Ordering::Relaxed);
    if host != u64::MAX {
        line.push(b" in host ");
        line.number(host & 0xffff_ffff);
        line.push(b" (machine ");
        line.number(host >> 32);
        line.push(b")");
    }
    let step = STEP.load(Ordering::Relaxed);
    match phase() {
        Some(Phase::Step) | None if step >= 0 => {
            line.push(b" at step ");
            line.number(step as u64);
        }
        Some(phase) => {
            line.push(b" while ");
            line.push(phase.doing().as_bytes());
        }
        None => {}
    }
    line.push(b"\n");
    // SAFETY: write(2) and raise(3) are async-signal-safe; the buffer lives on this stack.
    unsafe {
        libc::write(2, line.bytes.as_ptr().cast(), line.len);
        libc::raise(signal);
    }
}
