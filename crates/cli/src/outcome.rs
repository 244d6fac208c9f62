//! How a command ends other than well: its error told on one line ([`describe`]), or a
//! preemption ([`Preempted`], [`is_preemption`]), which exits with
//! [`siphon_coord::EXIT_PREEMPTED`] rather than 1.

/// This host stopped because the job was preempted (SIGTERM here or on another host): what was
/// complete is committed, and the same command resumes the run. `siphon` exits with
/// [`siphon_coord::EXIT_PREEMPTED`].
#[derive(Debug)]
pub struct Preempted {
    pub(crate) message: String,
    /// Shards committed by this host when it stopped in its loop.
    pub(crate) shards: Option<u64>,
}

impl Preempted {
    /// A preemption seen from outside a host (the launcher's hosts exited preempted).
    pub fn new(message: impl Into<String>) -> Preempted {
        Preempted { message: message.into(), shards: None }
    }
}

impl std::fmt::Display for Preempted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "preempted: {}", self.message)?;
        if let Some(shards) = self.shards {
            write!(f, "; {shards} shards of this host are committed")?;
        }
        write!(f, "; run the same command again to resume")
    }
}

impl std::error::Error for Preempted {}

/// Whether a command ended because its job was preempted (exit [`siphon_coord::EXIT_PREEMPTED`]
/// rather than 1): a host that stopped for it, a coordinator call failed by it, or a launch
/// whose hosts were.
pub fn is_preemption(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause.downcast_ref::<Preempted>().is_some()
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
