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
pub mod inspect;
pub mod launch;
pub mod limits;
pub mod plan;
mod python;

/// Whether a command ended because its job was preempted (exit [`siphon_coord::EXIT_PREEMPTED`]
/// rather than 1): a host that stopped for it, a coordinator call failed by it, or a launch
/// whose hosts were.
pub fn is_preemption(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause.downcast_ref::<crate::job::Preempted>().is_some()
            || cause.downcast_ref::<siphon_coord::CoordError>().is_some_and(|e| e.is_preemption())
    })
}

/// An error and its causes on one line, `a: b: c`, leaving out a cause whose text its
/// predecessor already shows (many libraries' errors print their source in their own message).
pub fn describe(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&cause);
        }
    }
    text
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

#[cfg(test)]
mod tests {
    use super::describe;

    #[test]
    fn a_cause_already_in_its_parents_message_is_not_repeated() {
        /// An error that prints its source in its own message, as object_store's do.
        #[derive(Debug)]
        struct Echoes(std::io::Error);
        impl std::fmt::Display for Echoes {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "writing shard 3: {}", self.0)
            }
        }
        impl std::error::Error for Echoes {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let disk = || std::io::Error::from(std::io::ErrorKind::StorageFull);
        let echoed = anyhow::Error::new(Echoes(disk())).context("the writer stopped");
        assert_eq!(describe(&echoed), format!("the writer stopped: writing shard 3: {}", disk()));
        let plain = anyhow::Error::new(disk()).context("the writer stopped");
        assert_eq!(describe(&plain), format!("the writer stopped: {}", disk()));
    }
}
