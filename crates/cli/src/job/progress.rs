//! Progress of one host: an indicatif bar on a terminal, a log line every few seconds
//! otherwise (so that logs of many hosts stay readable and machine-parseable).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use siphon_store::{HostId, HostSummary};

const LOG_EVERY: Duration = Duration::from_secs(10);

pub struct Progress {
    bar: Option<ProgressBar>,
    tokens: u64,
    batches: u64,
    started: Instant,
    last_log: Instant,
}

impl Progress {
    /// `total_tokens`: this host's token budget, when there is one.
    pub fn new(host: HostId, total_tokens: Option<u64>) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = match total_tokens {
                Some(total) => ProgressBar::new(total),
                None => ProgressBar::no_length(),
            };
            let template = format!(
                "[m{:03} h{:02}] {{bar:30}} {{human_pos}} tokens {{per_sec}} {{msg}} eta {{eta}}",
                host.machine, host.host
            );
            bar.set_style(ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar()));
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        let now = Instant::now();
        Progress { bar, tokens: 0, batches: 0, started: now, last_log: now }
    }

    /// Tokens already committed before a restart.
    pub fn resumed(&mut self, tokens: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(tokens);
            bar.reset_eta();
        }
    }

    /// One batch of `tokens` handed to the writer.
    pub fn batch(&mut self, tokens: u64) {
        self.tokens += tokens;
        self.batches += 1;
        if let Some(bar) = &self.bar {
            bar.inc(tokens);
            bar.set_message(format!("{} batches", self.batches));
        } else if self.last_log.elapsed() >= LOG_EVERY {
            self.last_log = Instant::now();
            let seconds = self.started.elapsed().as_secs_f64();
            tracing::info!(
                tokens = self.tokens,
                batches = self.batches,
                tokens_per_second = (self.tokens as f64 / seconds).round(),
                "progress"
            );
        }
    }

    /// The writer finished: shards written and uploaded.
    pub fn finish(&mut self, summary: &HostSummary) {
        if let Some(bar) = self.bar.take() {
            bar.finish_with_message(format!("{} shards committed", summary.shards));
        }
    }
}
