//! The coordination service's state: plain synchronous state machines (tasks, barriers, the
//! key-value store, the job's sticky error). The gRPC layer holds it behind one mutex and only
//! awaits the receivers it hands out, so every rule here is unit-tested without a network.

mod barrier;
mod kv;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};

use crate::error::{CoordError, Result};
pub(crate) use barrier::{Arrival, BarrierKey};
pub(crate) use kv::Lookup;

/// The barrier every task passes once after registering (the all-tasks registration barrier).
pub const REGISTER_BARRIER: &str = "siphon/register";
/// The barrier every task passes before leaving; after it, disconnects are not failures.
pub const SHUTDOWN_BARRIER: &str = "siphon/shutdown";

/// Where one task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskStatus {
    /// Never registered.
    Absent,
    /// Registered, no heartbeat stream open.
    Registered,
    /// Registered with its heartbeat stream open.
    Connected,
    /// Its heartbeat stream dropped; failed unless it comes back within the grace period.
    Disconnected,
    /// Lost or reported an error.
    Failed,
    /// Passed the shutdown barrier.
    ShutDown,
}

#[derive(Debug, Clone)]
struct TaskSlot {
    incarnation: u64,
    status: TaskStatus,
    // Each heartbeat stream gets a new generation, so that the end of an old stream cannot
    // mark a task that reconnected meanwhile.
    generation: u64,
    // Whether the stream of `generation` is still open (whatever the status says): the hosting
    // process waits for peers to close theirs before it stops the service.
    stream_open: bool,
    last_seen: Instant,
}

pub(crate) struct State {
    tasks: Vec<TaskSlot>,
    job_error: Option<CoordError>,
    error_tx: watch::Sender<Option<CoordError>>,
    barriers: barrier::Barriers,
    kv: kv::Kv,
}

impl State {
    pub(crate) fn new(num_tasks: u32) -> (State, watch::Receiver<Option<CoordError>>) {
        let (error_tx, error_rx) = watch::channel(None);
        let now = Instant::now();
        let slot =
            TaskSlot { incarnation: 0, status: TaskStatus::Absent, generation: 0, stream_open: false, last_seen: now };
        let state = State {
            tasks: vec![slot; num_tasks as usize],
            job_error: None,
            error_tx,
            barriers: barrier::Barriers::default(),
            kv: kv::Kv::default(),
        };
        (state, error_rx)
    }

    pub(crate) fn num_tasks(&self) -> u32 {
        self.tasks.len() as u32
    }

    pub(crate) fn job_error(&self) -> Option<&CoordError> {
        self.job_error.as_ref()
    }

    fn sticky(&self) -> Result<()> {
        match &self.job_error {
            Some(error) => Err(error.clone()),
            None => Ok(()),
        }
    }

    pub(crate) fn check_task_id(&self, task: u32) -> Result<()> {
        if task >= self.num_tasks() {
            return Err(CoordError::InvalidArgument(format!(
                "unknown task {task}: this job has tasks 0..{}",
                self.num_tasks()
            )));
        }
        Ok(())
    }

    /// Checks that `task` registered with this incarnation (every RPC but Register).
    pub(crate) fn check_caller(&self, task: u32, incarnation: u64) -> Result<()> {
        self.check_task_id(task)?;
        let slot = &self.tasks[task as usize];
        if slot.status == TaskStatus::Absent {
            return Err(CoordError::InvalidArgument(format!("task {task} has not registered")));
        }
        if slot.incarnation != incarnation {
            return Err(CoordError::Aborted(format!(
                "task {task} calls with incarnation {incarnation:x} but registered as {:x}",
                slot.incarnation
            )));
        }
        Ok(())
    }

    pub(crate) fn register(&mut self, task: u32, incarnation: u64, now: Instant) -> Result<u32> {
        self.check_task_id(task)?;
        self.sticky()?;
        let slot = &mut self.tasks[task as usize];
        match slot.status {
            TaskStatus::Absent => {
                slot.incarnation = incarnation;
                slot.status = TaskStatus::Registered;
                slot.last_seen = now;
            }
            // A retried Register of the same process is harmless.
            _ if slot.incarnation == incarnation => {}
            _ => {
                let error = CoordError::Aborted(format!(
                    "task {task} registered again as a new process (it restarted); \
                     a job does not survive the restart of one of its processes"
                ));
                self.fail(Some(task), error.clone());
                return Err(error);
            }
        }
        Ok(self.num_tasks())
    }

    /// A heartbeat stream opened; returns its generation.
    pub(crate) fn connect(&mut self, task: u32, now: Instant) -> u64 {
        let slot = &mut self.tasks[task as usize];
        slot.generation += 1;
        slot.stream_open = true;
        slot.last_seen = now;
        if matches!(slot.status, TaskStatus::Registered | TaskStatus::Disconnected) {
            slot.status = TaskStatus::Connected;
        }
        slot.generation
    }

    pub(crate) fn beat(&mut self, task: u32, generation: u64, now: Instant) {
        let slot = &mut self.tasks[task as usize];
        if slot.generation == generation {
            slot.last_seen = now;
        }
    }

    /// A heartbeat stream ended. Returns whether the task must be failed unless it reconnects
    /// within the grace period (false when it shut down cleanly or is already failed).
    pub(crate) fn disconnect(&mut self, task: u32, generation: u64) -> bool {
        let slot = &mut self.tasks[task as usize];
        if slot.generation == generation {
            slot.stream_open = false;
        }
        if slot.generation != generation || slot.status != TaskStatus::Connected {
            return false;
        }
        slot.status = TaskStatus::Disconnected;
        true
    }

    /// The grace period after a disconnect ended: fail the task if it did not come back.
    pub(crate) fn grace_expired(&mut self, task: u32, generation: u64, grace: Duration) {
        let slot = &self.tasks[task as usize];
        if slot.generation == generation && slot.status == TaskStatus::Disconnected {
            let error = CoordError::Unavailable(format!(
                "task {task} was lost: its heartbeat stream broke and it did not reconnect within {grace:?} \
                 (the process died, was killed, or its host lost the network)"
            ));
            self.fail(Some(task), error);
        }
    }

    /// Fails connected tasks whose last beat is older than `timeout` (a hung host whose TCP
    /// connection stays open).
    pub(crate) fn sweep(&mut self, now: Instant, timeout: Duration) {
        let stale: Vec<u32> = (0..self.num_tasks())
            .filter(|&t| {
                let slot = &self.tasks[t as usize];
                slot.status == TaskStatus::Connected && now.duration_since(slot.last_seen) > timeout
            })
            .collect();
        for task in stale {
            let error = CoordError::DeadlineExceeded(format!(
                "task {task} sent no heartbeat for {timeout:?} (hung or partitioned)"
            ));
            self.fail(Some(task), error);
        }
    }

    /// A task reports an error: it becomes the job's error if the job has none yet.
    pub(crate) fn report_error(&mut self, task: u32, message: &str) {
        let error = CoordError::Internal(format!("task {task} reported an error: {message}"));
        self.fail(Some(task), error);
    }

    /// A task reports that it was preempted: the job stops as preempted (every task exits to
    /// be resumed) if it has no error yet; an earlier failure stays the job's error.
    pub(crate) fn report_preemption(&mut self, task: u32, message: &str) {
        self.fail(Some(task), CoordError::Preempted(format!("task {task}: {message}")));
    }

    /// Sets the job's first error (later ones are only logged), fails the task if any, and
    /// wakes every waiter with it.
    pub(crate) fn fail(&mut self, task: Option<u32>, error: CoordError) {
        if let Some(task) = task {
            let slot = &mut self.tasks[task as usize];
            if slot.status != TaskStatus::ShutDown {
                slot.status = TaskStatus::Failed;
            }
        }
        if self.job_error.is_some() {
            tracing::info!(%error, "further error after the job already failed");
            return;
        }
        let job_error = error.into_job_failure(task);
        tracing::error!(error = %job_error, "the job failed");
        self.job_error = Some(job_error.clone());
        self.barriers.fail_all(&job_error);
        self.kv.fail_all(&job_error);
        self.error_tx.send_replace(Some(job_error));
    }

    fn participants(&self, requested: &[u32]) -> Result<BTreeSet<u32>> {
        if requested.is_empty() {
            return Ok((0..self.num_tasks()).collect());
        }
        let mut set = BTreeSet::new();
        for &task in requested {
            self.check_task_id(task)?;
            set.insert(task);
        }
        Ok(set)
    }

    pub(crate) fn barrier(
        &mut self,
        task: u32,
        key: BarrierKey,
        timeout: Duration,
        participants: &[u32],
        now: Instant,
    ) -> Arrival {
        if let Err(error) = self.sticky() {
            return Arrival::Done(Err(error));
        }
        let participants = match self.participants(participants) {
            Ok(set) => set,
            Err(error) => return Arrival::Done(Err(error)),
        };
        let shutdown = key.0 == SHUTDOWN_BARRIER;
        let key_copy = if shutdown { Some(key.clone()) } else { None };
        let arrival = self.barriers.arrive(key, task, participants.clone(), timeout, now);
        if let Some(key) = key_copy
            && self.barriers.passed(&key)
        {
            for &t in &participants {
                self.tasks[t as usize].status = TaskStatus::ShutDown;
            }
        }
        arrival
    }

    pub(crate) fn expire_barrier(&mut self, key: &BarrierKey, now: Instant) -> Option<Result<()>> {
        self.barriers.expire(key, now)
    }

    pub(crate) fn cancel_barrier(&mut self, task: u32, key: BarrierKey, now: Instant) -> Result<()> {
        self.sticky()?;
        let all = self.participants(&[])?;
        self.barriers.cancel(key, all, now, task);
        Ok(())
    }

    pub(crate) fn kv_set(&mut self, key: &str, value: Vec<u8>, allow_overwrite: bool) -> Result<()> {
        self.sticky()?;
        self.kv.set(key, value, allow_overwrite)
    }

    pub(crate) fn kv_get(&mut self, key: &str) -> Result<Lookup> {
        self.sticky()?;
        Ok(self.kv.get(key))
    }

    pub(crate) fn kv_try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.sticky()?;
        Ok(self.kv.try_get(key))
    }

    pub(crate) fn kv_increment(&mut self, key: &str, delta: i64) -> Result<i64> {
        self.sticky()?;
        self.kv.increment(key, delta)
    }

    pub(crate) fn kv_list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        self.sticky()?;
        Ok(self.kv.list(prefix))
    }

    pub(crate) fn kv_delete(&mut self, key: &str, prefix: bool) -> Result<usize> {
        self.sticky()?;
        Ok(self.kv.delete(key, prefix))
    }

    /// The tasks (of `subset`, or all) that are registered and neither lost nor failed.
    pub(crate) fn alive_tasks(&self, subset: &[u32]) -> Result<Vec<u32>> {
        let tasks = self.participants(subset)?;
        Ok(tasks
            .into_iter()
            .filter(|&t| {
                matches!(
                    self.tasks[t as usize].status,
                    TaskStatus::Registered | TaskStatus::Connected | TaskStatus::Disconnected
                )
            })
            .collect())
    }

    /// Whether no task but `except` holds a heartbeat stream any more (checked before the
    /// hosting process stops the service).
    pub(crate) fn all_gone(&self, except: Option<u32>) -> bool {
        self.tasks.iter().enumerate().all(|(task, slot)| !slot.stream_open || Some(task as u32) == except)
    }

    /// Whether every task passed the shutdown barrier.
    pub(crate) fn all_shut_down(&self) -> bool {
        self.tasks.iter().all(|slot| slot.status == TaskStatus::ShutDown)
    }

    #[cfg(test)]
    pub(crate) fn status(&self, task: u32) -> TaskStatus {
        self.tasks[task as usize].status
    }
}

/// Waits for a barrier receiver until `deadline`, then asks the state to expire it.
pub(crate) async fn await_barrier(
    receiver: oneshot::Receiver<Result<()>>,
    deadline: Instant,
    expire: impl FnOnce(Instant) -> Option<Result<()>>,
) -> Result<()> {
    match tokio::time::timeout_at(deadline.into(), receiver).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(_)) => Err(CoordError::Internal("barrier state dropped".into())),
        Err(_) => expire(Instant::now()).unwrap_or_else(|| Err(CoordError::Internal("barrier expired early".into()))),
    }
}

#[cfg(test)]
mod tests;
