//! `siphon launch --local-hosts N -- <subcommand ...>`: a multi-host job on one machine.
//!
//! Starts N copies of this binary, each told its identity through the same environment
//! variables a real cluster would set (`SIPHON_PROCESS_ID`, `SIPHON_NUM_PROCESSES`,
//! `SIPHON_COORDINATOR`), a coordinator address on 127.0.0.1 and the job token
//! (`SIPHON_JOB_TOKEN` when set, which a stream's readers then give, else a fresh one). Every
//! output line is prefixed with its host. When one host fails the others are stopped
//! (SIGTERM, then SIGKILL after a grace period), so a local job never hangs either; the
//! launcher's own error names the failed host's first `error:` line, read after its output has
//! drained (a host that fails at once exits before its forwarded lines are printed). Hosts
//! still running when the launcher itself stops for any reason are killed with it.
//!
//! Preemption passes through: SIGTERM to the launcher goes on to every host, and when hosts
//! exit preempted (75) the launcher waits for the rest (up to the grace period) and exits 75
//! itself, so whatever restarts it resumes the job.
//!
//! On a terminal the launcher draws one progress bar per host from the `SIPHON_PROGRESS`
//! lines its hosts print (see `job::progress`); elsewhere the hosts log their progress.

use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use siphon_coord::EXIT_PREEMPTED;

use crate::args::limits;
use crate::job::progress;

/// How long a finished host's output may take to reach the launcher before it reports the
/// host (a grandchild holding the pipes open must not hold the launcher).
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

#[derive(clap::Args)]
pub struct Args {
    /// Number of host processes to start.
    #[arg(long, default_value_t = 2, value_parser = limits::count(1, limits::MAX_LOCAL_PROCESSES))]
    local_hosts: usize,
    /// Virtual CPU devices per host (sets `SIPHON_CPU_DEVICES` for each host).
    #[arg(long, value_parser = limits::count(1, limits::MAX_CPU_DEVICES))]
    cpu_devices_per_host: Option<usize>,
    /// Port for the coordinator on 127.0.0.1 (default: a free one).
    #[arg(long, value_parser = limits::count_of::<u16>(1, u16::MAX.into()))]
    port: Option<u16>,
    /// Seconds between SIGTERM and SIGKILL when stopping the remaining hosts, and the time
    /// preempted hosts get to commit and exit (keep it above the hosts' --stop-timeout).
    #[arg(long, default_value_t = 15.0, value_parser = limits::seconds)]
    grace_seconds: f64,
    /// The siphon subcommand and its arguments that every host runs, after `--`.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the siphon executable to launch")?;
    let port = match args.port {
        Some(port) => port,
        None => free_port()?,
    };
    let coordinator = format!("127.0.0.1:{port}");
    // The user's token when they give one (readers of a stream then know it), else a fresh one.
    let given = std::env::var("SIPHON_JOB_TOKEN").ok().filter(|t| !t.trim().is_empty());
    let made = given.is_none();
    let token = match given {
        Some(token) => token,
        None => job_token()?,
    };
    eprintln!(
        "launching {} local hosts, coordinator {coordinator}: siphon {}",
        args.local_hosts,
        args.command.join(" ")
    );

    // One bar per host when someone is watching; the hosts then report instead of logging.
    let bars = std::io::stderr().is_terminal().then(indicatif::MultiProgress::new);
    let mut started = Hosts(Vec::with_capacity(args.local_hosts));
    for process_id in 0..args.local_hosts {
        let mut command = Command::new(&exe);
        command
            .args(&args.command)
            .env("SIPHON_PROCESS_ID", process_id.to_string())
            .env("SIPHON_NUM_PROCESSES", args.local_hosts.to_string())
            .env("SIPHON_COORDINATOR", &coordinator)
            .env("SIPHON_JOB_TOKEN", &token)
            .env_remove(crate::args::cluster::LAUNCH_MADE_TOKEN)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if made {
            command.env(crate::args::cluster::LAUNCH_MADE_TOKEN, "1");
        }
        if let Some(devices) = args.cpu_devices_per_host {
            command.env("SIPHON_CPU_DEVICES", devices.to_string());
        }
        if bars.is_some() {
            command.env(progress::PIPE_ENV, "1");
        }
        let mut child = command.spawn().with_context(|| format!("cannot start host {process_id}"))?;
        let prefix = format!("[host {process_id}] ");
        let output = Output {
            prefix,
            bars: bars.clone(),
            bar: bars.as_ref().map(|multi| {
                let bar = multi.add(indicatif::ProgressBar::no_length());
                bar.set_style(progress::bar_style(false));
                bar.set_prefix(format!("[host {process_id}]"));
                bar
            }),
        };
        let (drained, done) = mpsc::channel();
        let first_error = Arc::new(OnceLock::new());
        forward_lines(child.stdout.take(), output.clone(), None, drained.clone());
        forward_lines(child.stderr.take(), output, Some(first_error.clone()), drained);
        started.0.push(Host { process_id, child, status: None, done, first_error });
    }
    let hosts = &mut started.0;

    // Ctrl-C reaches the children too (same process group); the launcher then stops the rest.
    // SIGTERM to the launcher (its pod or VM preempted) is passed on to every host, which
    // stop as preempted.
    let signal = Arc::new(AtomicI32::new(0));
    on_signal_set(signal.clone());
    let grace = Duration::from_secs_f64(args.grace_seconds);
    let mut preempted = None;
    let mut sigterm_forwarded = false;
    // Once hosts stop as preempted, the rest get `grace` to commit and exit.
    let mut stop_deadline: Option<Instant> = None;
    loop {
        let mut failed = None;
        for host in hosts.iter_mut().filter(|h| h.status.is_none()) {
            if let Some(status) = host.child.try_wait().context("waiting for a host")? {
                host.status = Some(status);
                if status.code() == Some(EXIT_PREEMPTED) {
                    preempted.get_or_insert(host.process_id);
                } else if !status.success() && failed.is_none() {
                    failed = Some((host.process_id, status));
                }
            }
        }
        if let Some((process_id, status)) = failed {
            let said = hosts[process_id].said();
            eprintln!("host {process_id} failed ({}); stopping the other hosts", describe(status));
            stop_all(hosts, grace);
            bail!("host {process_id} failed ({}){said}", describe(status));
        }
        match signal.load(Ordering::SeqCst) {
            libc::SIGTERM if !sigterm_forwarded => {
                eprintln!("received SIGTERM: stopping every host as preempted (at most {grace:?})");
                signal_all(hosts, libc::SIGTERM);
                sigterm_forwarded = true;
                stop_deadline.get_or_insert(Instant::now() + grace);
            }
            libc::SIGINT => {
                stop_all(hosts, grace);
                bail!("interrupted");
            }
            _ => {}
        }
        if let Some(process_id) = preempted
            && stop_deadline.is_none()
        {
            eprintln!("host {process_id} was preempted; waiting for the other hosts to commit and stop");
            stop_deadline = Some(Instant::now() + grace);
        }
        if stop_deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            stop_all(hosts, Duration::ZERO);
        }
        if hosts.iter().all(|h| h.status.is_some()) {
            if preempted.is_some() || sigterm_forwarded {
                let stopped: Vec<String> = hosts
                    .iter()
                    .filter_map(|h| {
                        h.status.filter(|s| !s.success()).map(|s| format!("host {}: {}", h.process_id, describe(s)))
                    })
                    .collect();
                return Err(anyhow::Error::new(crate::outcome::Preempted::new(format!(
                    "the hosts were preempted ({})",
                    if stopped.is_empty() { "all had finished".to_string() } else { stopped.join(", ") }
                ))));
            }
            eprintln!("all {} hosts finished", hosts.len());
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Host {
    process_id: usize,
    child: Child,
    status: Option<ExitStatus>,
    /// Disconnected once both of the host's pipes reached their end (every forwarding thread
    /// holds a sender).
    done: mpsc::Receiver<()>,
    /// The first line of the host's stderr that starts with `error:`.
    first_error: Arc<OnceLock<String>>,
}

impl Host {
    /// `: <the host's first error line>` once its output drained (at most [`DRAIN_LIMIT`]),
    /// or nothing when it printed none.
    fn said(&self) -> String {
        // Nothing is ever sent: the wait ends when every sender is gone, or at the limit.
        let _ = self.done.recv_timeout(DRAIN_LIMIT);
        self.first_error.get().map(|line| format!(": {line}")).unwrap_or_default()
    }
}

/// The started hosts; those still running when the launcher returns (an error of its own, a
/// panic) are killed, never left running alone.
struct Hosts(Vec<Host>);

impl Drop for Hosts {
    fn drop(&mut self) {
        stop_all(&mut self.0, Duration::ZERO);
    }
}

/// `signal` to every running host.
fn signal_all(hosts: &[Host], signal: libc::c_int) {
    for host in hosts.iter().filter(|h| h.status.is_none()) {
        // SAFETY: kill(2) on a pid we spawned and have not reaped yet.
        unsafe { libc::kill(host.child.id() as libc::pid_t, signal) };
    }
}

/// SIGTERM to every running host, SIGKILL to those still running after `grace`.
fn stop_all(hosts: &mut [Host], grace: Duration) {
    if !grace.is_zero() {
        signal_all(hosts, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        let mut running = false;
        for host in hosts.iter_mut().filter(|h| h.status.is_none()) {
            match host.child.try_wait() {
                Ok(Some(status)) => host.status = Some(status),
                _ => running = true,
            }
        }
        if !running {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for host in hosts.iter_mut().filter(|h| h.status.is_none()) {
        let _ = host.child.kill();
        host.status = host.child.wait().ok();
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}{}", signal_name(signal)),
        _ => "unknown status".to_string(),
    }
}

/// Where one host's output goes: prefixed lines, and its bar when bars are drawn.
#[derive(Clone)]
struct Output {
    prefix: String,
    bars: Option<indicatif::MultiProgress>,
    bar: Option<indicatif::ProgressBar>,
}

/// Prints a host's pipe line by line, prefixed (stdout's to stdout, stderr's to stderr), and
/// keeps the first `error:` line of stderr in `first_error` (`None` for stdout). `drained` is
/// dropped when the pipe ends.
fn forward_lines(
    pipe: Option<impl std::io::Read + Send + 'static>,
    output: Output,
    first_error: Option<Arc<OnceLock<String>>>,
    drained: mpsc::Sender<()>,
) {
    let Some(pipe) = pipe else { return };
    std::thread::spawn(move || {
        let _drained = drained;
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if let Some(first) = &first_error
                && line.starts_with("error:")
            {
                let _ = first.set(line.clone());
            }
            if let (Some(bar), Some(json)) = (&output.bar, line.strip_prefix(progress::LINE_PREFIX))
                && let Ok(report) = serde_json::from_str::<progress::Report>(json)
            {
                progress::show(bar, &report);
                continue;
            }
            let text = format!("{}{line}", output.prefix);
            match &output.bars {
                // Printed above the bars, which are redrawn below.
                Some(bars) => {
                    let _ = bars.println(text);
                }
                None if first_error.is_some() => {
                    let _ = writeln!(std::io::stderr().lock(), "{text}");
                }
                None => {
                    let _ = writeln!(std::io::stdout().lock(), "{text}");
                }
            }
        }
    });
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("no free port on 127.0.0.1")?;
    Ok(listener.local_addr()?.port())
}

/// 32 random bytes from the OS, hex encoded. Never printed.
fn job_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .context("cannot read /dev/urandom for the job token")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Stores the signal's number in `slot` on SIGINT/SIGTERM (SIGINT wins over SIGTERM).
fn on_signal_set(slot: Arc<AtomicI32>) {
    static SLOT: std::sync::OnceLock<Arc<AtomicI32>> = std::sync::OnceLock::new();
    extern "C" fn on_signal(signal: libc::c_int) {
        if let Some(slot) = SLOT.get()
            && slot.load(Ordering::SeqCst) != libc::SIGINT
        {
            slot.store(signal, Ordering::SeqCst);
        }
    }
    let _ = SLOT.set(slot);
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(signal, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
}

/// ` (SIGSEGV)` for the signals a host dies of.
fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGSEGV => " (SIGSEGV)",
        libc::SIGBUS => " (SIGBUS)",
        libc::SIGILL => " (SIGILL)",
        libc::SIGFPE => " (SIGFPE)",
        libc::SIGABRT => " (SIGABRT)",
        libc::SIGKILL => " (SIGKILL: killed, or out of memory)",
        libc::SIGTERM => " (SIGTERM)",
        libc::SIGINT => " (SIGINT)",
        _ => "",
    }
}
