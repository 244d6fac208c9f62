//! One module per subcommand. Each exposes `Args` (or `Command`) and `run`.

pub mod bench;
pub mod cluster;
pub mod coordinator;
pub mod data;
pub mod doctor;
pub mod export;
pub mod extract;
pub mod forward;
pub mod inspect;
pub mod launch;
pub mod plan;

/// Whether a command ended because its job was preempted (exit [`siphon_coord::EXIT_PREEMPTED`]
/// rather than 1): a host that stopped for it, a coordinator call failed by it, or a launch
/// whose hosts were.
pub fn is_preemption(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause.downcast_ref::<crate::job::Preempted>().is_some()
            || cause.downcast_ref::<siphon_coord::CoordError>().is_some_and(|e| e.is_preemption())
    })
}

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
