//! The key-value store: insert-once keys, blocking gets, counters, prefix listing and deletion.
//! Its get/set/try_get shape is what a multi-host PJRT client's key-value callbacks need.

use std::collections::{BTreeMap, HashMap};

use tokio::sync::oneshot;

use crate::error::{CoordError, Result};

/// What a blocking get gets: the value now, or a receiver woken by the set.
pub(crate) enum Lookup {
    Found(Vec<u8>),
    Wait(oneshot::Receiver<Result<Vec<u8>>>),
}

#[derive(Default)]
pub(crate) struct Kv {
    // Ordered so that prefix listing and deletion are range scans.
    entries: BTreeMap<String, Vec<u8>>,
    waiters: HashMap<String, Vec<oneshot::Sender<Result<Vec<u8>>>>>,
}

impl Kv {
    pub(crate) fn set(&mut self, key: &str, value: Vec<u8>, allow_overwrite: bool) -> Result<()> {
        if key.is_empty() {
            return Err(CoordError::InvalidArgument("a key must not be empty".into()));
        }
        if !allow_overwrite && self.entries.contains_key(key) {
            return Err(CoordError::AlreadyExists(format!("key '{key}' is already set")));
        }
        if let Some(waiters) = self.waiters.remove(key) {
            for waiter in waiters {
                let _ = waiter.send(Ok(value.clone()));
            }
        }
        self.entries.insert(key.to_string(), value);
        Ok(())
    }

    pub(crate) fn get(&mut self, key: &str) -> Lookup {
        match self.entries.get(key) {
            Some(value) => Lookup::Found(value.clone()),
            None => {
                let (sender, receiver) = oneshot::channel();
                let waiters = self.waiters.entry(key.to_string()).or_default();
                // Drop the waiters of gets that already timed out, so a key that is polled
                // but never set does not grow without bound.
                waiters.retain(|w| !w.is_closed());
                waiters.push(sender);
                Lookup::Wait(receiver)
            }
        }
    }

    pub(crate) fn try_get(&self, key: &str) -> Option<Vec<u8>> {
        self.entries.get(key).cloned()
    }

    /// Adds `delta` to the counter at `key` (absent counts as 0) and returns the new value.
    /// Counters are stored as decimal text so that a plain get reads them too.
    pub(crate) fn increment(&mut self, key: &str, delta: i64) -> Result<i64> {
        let current = match self.entries.get(key) {
            None => 0,
            Some(bytes) => std::str::from_utf8(bytes)
                .ok()
                .and_then(|text| text.parse::<i64>().ok())
                .ok_or_else(|| CoordError::InvalidArgument(format!("key '{key}' does not hold a counter")))?,
        };
        let next = current.checked_add(delta).ok_or_else(|| {
            CoordError::InvalidArgument(format!("counter '{key}' would overflow ({current} + {delta})"))
        })?;
        self.set(key, next.to_string().into_bytes(), true)?;
        Ok(next)
    }

    pub(crate) fn list(&self, prefix: &str) -> Vec<(String, Vec<u8>)> {
        self.entries
            .range(prefix.to_string()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect()
    }

    /// Deletes `key`, or every key starting with it when `prefix`; returns how many went.
    pub(crate) fn delete(&mut self, key: &str, prefix: bool) -> usize {
        if !prefix {
            return usize::from(self.entries.remove(key).is_some());
        }
        let doomed: Vec<String> = self.list(key).into_iter().map(|(k, _)| k).collect();
        for k in &doomed {
            self.entries.remove(k);
        }
        doomed.len()
    }

    pub(crate) fn fail_all(&mut self, error: &CoordError) {
        for (_, waiters) in self.waiters.drain() {
            for waiter in waiters {
                let _ = waiter.send(Err(error.clone()));
            }
        }
    }
}
