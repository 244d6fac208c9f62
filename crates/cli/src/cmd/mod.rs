//! One module per subcommand. Each exposes `Args` (or `Command`) and `run`.

pub mod bench;
pub mod cluster;
pub mod coordinator;
pub mod data;
pub mod doctor;
pub mod forward;
pub mod plan;

/// Log lines go to stderr; `RUST_LOG` filters them (default `info`).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}
