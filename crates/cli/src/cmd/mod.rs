//! One module per subcommand. Each exposes `Args` (or `Command`) and `run`.

pub mod bench;
pub mod cluster;
pub mod coordinator;
pub mod dashboard;
pub mod data;
pub mod doctor;
pub mod export;
pub mod extract;
pub mod forward;
pub mod generate;
pub mod inspect;
pub mod launch;
pub mod plan;
mod python;

/// Log lines go to stderr; `RUST_LOG` filters them (default `info`). `json` gives one JSON
/// object per line (with the span fields, e.g. a host's machine and host ids) for log
/// collectors; otherwise plain text.
pub fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    if format == "json" {
        builder.json().with_current_span(true).with_span_list(false).init();
    } else {
        builder.init();
    }
}
