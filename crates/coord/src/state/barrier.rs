//! Barriers: a set of participants, the arrivals so far, a deadline fixed by the first arrival,
//! and the waiters to wake with the outcome.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::error::{CoordError, Result};

/// The identity of one barrier instance: its name and how many times it was used before.
pub(crate) type BarrierKey = (String, u64);

pub(crate) struct Barrier {
    participants: BTreeSet<u32>,
    arrived: BTreeSet<u32>,
    deadline: Instant,
    timeout: Duration,
    waiters: Vec<oneshot::Sender<Result<()>>>,
    outcome: Option<Result<()>>,
}

/// What an arrival gets: the outcome now, or a receiver plus the deadline to wait until.
pub(crate) enum Arrival {
    Done(Result<()>),
    Wait(oneshot::Receiver<Result<()>>, Instant),
}

#[derive(Default)]
pub(crate) struct Barriers {
    by_key: HashMap<BarrierKey, Barrier>,
}

impl Barriers {
    /// Records `task`'s arrival. `participants` is already resolved (never empty).
    pub(crate) fn arrive(
        &mut self,
        key: BarrierKey,
        task: u32,
        participants: BTreeSet<u32>,
        timeout: Duration,
        now: Instant,
    ) -> Arrival {
        if !participants.contains(&task) {
            return Arrival::Done(Err(CoordError::InvalidArgument(format!(
                "task {task} is not a participant of barrier '{}' (participants: {})",
                key.0,
                list(&participants)
            ))));
        }
        // Keep memory bounded over long runs: a finished instance of the same barrier with a
        // lower counter is no longer needed once a newer one starts.
        if !self.by_key.contains_key(&key) {
            self.by_key
                .retain(|(id, counter), barrier| !(id == &key.0 && *counter < key.1 && barrier.outcome.is_some()));
        }
        let barrier = self.by_key.entry(key.clone()).or_insert_with(|| Barrier {
            participants: participants.clone(),
            arrived: BTreeSet::new(),
            deadline: now + timeout,
            timeout,
            waiters: Vec::new(),
            outcome: None,
        });
        if barrier.participants != participants {
            return Arrival::Done(Err(CoordError::InvalidArgument(format!(
                "barrier '{}' (counter {}) was started with participants {} but task {task} named {}",
                key.0,
                key.1,
                list(&barrier.participants),
                list(&participants)
            ))));
        }
        if let Some(outcome) = &barrier.outcome {
            return Arrival::Done(outcome.clone());
        }
        barrier.arrived.insert(task);
        if barrier.arrived == barrier.participants {
            finish(barrier, Ok(()));
            return Arrival::Done(Ok(()));
        }
        let (sender, receiver) = oneshot::channel();
        barrier.waiters.push(sender);
        Arrival::Wait(receiver, barrier.deadline)
    }

    /// Fails the barrier with a timeout naming the missing tasks, if its deadline has passed.
    pub(crate) fn expire(&mut self, key: &BarrierKey, now: Instant) -> Option<Result<()>> {
        let barrier = self.by_key.get_mut(key)?;
        if let Some(outcome) = &barrier.outcome {
            return Some(outcome.clone());
        }
        if now < barrier.deadline {
            return None;
        }
        let missing: BTreeSet<u32> = barrier.participants.difference(&barrier.arrived).copied().collect();
        let error = CoordError::DeadlineExceeded(format!(
            "barrier '{}' timed out after {:?}: task(s) {} did not arrive",
            key.0,
            barrier.timeout,
            list(&missing)
        ));
        finish(barrier, Err(error.clone()));
        Some(Err(error))
    }

    /// Cancels a barrier (creating it as cancelled if nobody arrived yet, so later arrivals fail).
    pub(crate) fn cancel(&mut self, key: BarrierKey, participants: BTreeSet<u32>, now: Instant, by: u32) {
        let barrier = self.by_key.entry(key.clone()).or_insert_with(|| Barrier {
            participants,
            arrived: BTreeSet::new(),
            deadline: now,
            timeout: Duration::ZERO,
            waiters: Vec::new(),
            outcome: None,
        });
        if barrier.outcome.is_none() {
            let error =
                CoordError::Cancelled(format!("barrier '{}' (counter {}) was cancelled by task {by}", key.0, key.1));
            finish(barrier, Err(error));
        }
    }

    /// Fails every unfinished barrier with the job's error.
    pub(crate) fn fail_all(&mut self, error: &CoordError) {
        for barrier in self.by_key.values_mut() {
            if barrier.outcome.is_none() {
                finish(barrier, Err(error.clone()));
            }
        }
    }

    /// Whether the barrier has passed (all participants arrived).
    pub(crate) fn passed(&self, key: &BarrierKey) -> bool {
        matches!(self.by_key.get(key).and_then(|b| b.outcome.as_ref()), Some(Ok(())))
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }
}

fn finish(barrier: &mut Barrier, outcome: Result<()>) {
    for waiter in barrier.waiters.drain(..) {
        // A waiter whose RPC was dropped (its client went away) has closed its receiver.
        let _ = waiter.send(outcome.clone());
    }
    barrier.outcome = Some(outcome);
}

pub(crate) fn list(tasks: &BTreeSet<u32>) -> String {
    let shown: Vec<String> = tasks.iter().take(32).map(|t| t.to_string()).collect();
    let more = tasks.len().saturating_sub(32);
    if more > 0 { format!("[{} and {more} more]", shown.join(", ")) } else { format!("[{}]", shown.join(", ")) }
}
