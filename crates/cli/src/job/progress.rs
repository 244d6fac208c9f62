//! Progress of one host (an extraction's tokens, or `generate`'s completions), shown one of
//! three ways:
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
    /// `generate`'s completions written, and how many the host writes in all (the tokens
    /// are then the new tokens of this session's completions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completions: Option<[u64; 2]>,
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

/// The bar style shared by a host's own bar and the launcher's bars (their label the bar's
/// prefix): tokens, or `generate`'s completions.
pub fn bar_style(completions: bool) -> ProgressStyle {
    let template = match completions {
        false => "{prefix} {bar:30} {human_pos} tokens {per_sec} {msg} eta {eta}",
        true => "{prefix} {bar:30} {human_pos}/{human_len} completions {msg} eta {eta}",
    };
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}

/// Applies a report to a bar.
pub fn show(bar: &ProgressBar, report: &Report) {
    if let Some([done, of]) = report.completions {
        bar.set_style(bar_style(true));
        bar.set_length(of);
        bar.set_position(done);
        bar.set_message(format!("{} new tokens", report.tokens));
        return;
    }
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
        let report = Report { total: total_tokens, ..Report::default() };
        Progress::labelled(&format!("[m{:03} h{:02}]", host.machine, host.host), report)
    }

    /// `generate`'s process `process`, which writes `of` completions, `done` of them before
    /// a restart.
    pub fn completions(process: usize, done: u64, of: u64) -> Progress {
        let report = Report { completions: Some([done, of]), ..Report::default() };
        Progress::labelled(&format!("[process {process}]"), report)
    }

    fn labelled(label: &str, report: Report) -> Progress {
        let now = Instant::now();
        let display = if std::env::var_os(PIPE_ENV).is_some() {
            Display::Pipe { last: now }
        } else if std::io::stderr().is_terminal() {
            let length = report.completions.map(|[_, of]| of).or(report.total);
            let bar = length.map_or_else(ProgressBar::no_length, ProgressBar::new);
            bar.set_style(bar_style(report.completions.is_some()));
            bar.set_prefix(label.to_string());
            if report.completions.is_some() {
                show(&bar, &report);
                bar.reset_eta();
            }
            bar.enable_steady_tick(Duration::from_millis(200));
            Display::Bar(bar)
        } else {
            Display::Log { last: now }
        };
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
        self.report.batches += 1;
        self.advance(tokens);
    }

    /// One completion of `tokens` new tokens written ([`Progress::completions`]).
    pub fn completion(&mut self, tokens: u64) {
        if let Some([done, _]) = &mut self.report.completions {
            *done += 1;
        }
        self.advance(tokens);
    }

    fn advance(&mut self, tokens: u64) {
        self.report.tokens += tokens;
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
                    let rate = (self.session_tokens as f64 / seconds).round();
                    match self.report.completions {
                        Some([done, of]) => {
                            tracing::info!(
                                completions = done,
                                of,
                                new_tokens = self.report.tokens,
                                tokens_per_second = rate,
                                "progress"
                            )
                        }
                        None => tracing::info!(
                            tokens = self.report.tokens,
                            batches = self.report.batches,
                            tokens_per_second = rate,
                            bound = %self.report.bound.map_or("-".to_string(), |b| b.to_string()),
                            "progress"
                        ),
                    }
                }
            }
        }
    }

    /// The writer finished: every shard committed.
    pub fn finish(&mut self, summary: &HostSummary) {
        self.report.shards = Some(summary.shards);
        self.end();
    }

    /// The last report: a bar finished, the launcher told.
    pub fn end(&self) {
        match &self.display {
            Display::Bar(bar) => {
                show(bar, &self.report);
                if !bar.is_finished() {
                    bar.finish();
                }
            }
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
