//! Progress of one host, shown one of three ways:
//! - on a terminal, an indicatif bar;
//! - under `siphon launch` on a terminal, `SIPHON_PROGRESS {json}` lines on stderr that the
//!   launcher turns into one bar per host (children's stderr is a pipe, not a terminal);
//! - otherwise a log line every few seconds, so that logs of many hosts stay readable and
//!   machine-parseable.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use siphon_store::{HostId, HostSummary};

/// Set by `siphon launch` when it draws bars for its hosts.
pub const PIPE_ENV: &str = "SIPHON_PROGRESS_PIPE";
/// Prefix of a progress line for the launcher.
pub const LINE_PREFIX: &str = "SIPHON_PROGRESS ";

const LOG_EVERY: Duration = Duration::from_secs(10);
const PIPE_EVERY: Duration = Duration::from_millis(250);

/// What a host reports to the launcher.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Report {
    /// Tokens processed (including those committed before a restart).
    pub tokens: u64,
    /// The host's token budget, when there is one.
    pub total: Option<u64>,
    /// Batches this session.
    pub batches: u64,
    /// Set once the host's writer finished.
    pub shards: Option<u64>,
    /// Which side bounds the run so far: `device` (the output path waits for the programs)
    /// or `host` (the programs wait for the output path).
    #[serde(default)]
    pub bound: Option<Bound>,
}

/// The side a run waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Bound {
    /// The output path waits for the programs.
    Device,
    /// The programs wait for the output path (copies, conversion, writing).
    Host,
}

impl std::fmt::Display for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Bound::Device => "device",
            Bound::Host => "host",
        })
    }
}

/// The bar style shared by a host's own bar and the launcher's bars.
pub fn bar_style(label: &str) -> ProgressStyle {
    let template = format!("{label} {{bar:30}} {{human_pos}} tokens {{per_sec}} {{msg}} eta {{eta}}");
    ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar())
}

/// Applies a report to a bar.
pub fn show(bar: &ProgressBar, report: &Report) {
    if let Some(total) = report.total {
        bar.set_length(total);
    }
    bar.set_position(report.tokens);
    match report.shards {
        Some(shards) => bar.finish_with_message(format!("{shards} shards committed")),
        None => bar.set_message(match report.bound {
            Some(bound) => format!("{} batches, {bound}-bound", report.batches),
            None => format!("{} batches", report.batches),
        }),
    }
}

enum Display {
    Bar(ProgressBar),
    Pipe { last: Instant },
    Log { last: Instant },
}

pub struct Progress {
    display: Display,
    report: Report,
    session_tokens: u64,
    started: Instant,
}

impl Progress {
    /// `total_tokens`: this host's token budget, when there is one.
    pub fn new(host: HostId, total_tokens: Option<u64>) -> Progress {
        let now = Instant::now();
        let display = if std::env::var_os(PIPE_ENV).is_some() {
            Display::Pipe { last: now }
        } else if std::io::stderr().is_terminal() {
            let bar = total_tokens.map_or_else(ProgressBar::no_length, ProgressBar::new);
            bar.set_style(bar_style(&format!("[m{:03} h{:02}]", host.machine, host.host)));
            bar.enable_steady_tick(Duration::from_millis(200));
            Display::Bar(bar)
        } else {
            Display::Log { last: now }
        };
        let report = Report { total: total_tokens, ..Report::default() };
        Progress { display, report, session_tokens: 0, started: now }
    }

    /// Tokens already committed before a restart.
    pub fn resumed(&mut self, tokens: u64) {
        self.report.tokens = tokens;
        if let Display::Bar(bar) = &self.display {
            bar.set_position(tokens);
            bar.reset_eta();
        }
    }

    /// One batch of `tokens` launched; `bound` says which side bounds the run so far.
    pub fn batch(&mut self, tokens: u64, bound: Bound) {
        self.report.bound = Some(bound);
        self.report.tokens += tokens;
        self.report.batches += 1;
        self.session_tokens += tokens;
        match &mut self.display {
            Display::Bar(bar) => show(bar, &self.report),
            Display::Pipe { last } => {
                if last.elapsed() >= PIPE_EVERY {
                    *last = Instant::now();
                    emit(&self.report);
                }
            }
            Display::Log { last } => {
                if last.elapsed() >= LOG_EVERY {
                    *last = Instant::now();
                    let seconds = self.started.elapsed().as_secs_f64();
                    tracing::info!(
                        tokens = self.report.tokens,
                        batches = self.report.batches,
                        tokens_per_second = (self.session_tokens as f64 / seconds).round(),
                        bound = %bound,
                        "progress"
                    );
                }
            }
        }
    }

    /// The writer finished: every shard committed.
    pub fn finish(&mut self, summary: &HostSummary) {
        self.report.shards = Some(summary.shards);
        match &self.display {
            Display::Bar(bar) => show(bar, &self.report),
            Display::Pipe { .. } => emit(&self.report),
            Display::Log { .. } => {}
        }
    }
}

fn emit(report: &Report) {
    if let Ok(json) = serde_json::to_string(report) {
        let _ = writeln!(std::io::stderr().lock(), "{LINE_PREFIX}{json}");
    }
}
