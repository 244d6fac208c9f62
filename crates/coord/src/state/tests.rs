use std::time::{Duration, Instant};

use super::*;

fn registered(n: u32) -> State {
    let (mut state, _rx) = State::new(n);
    let now = Instant::now();
    for task in 0..n {
        state.register(task, 100 + u64::from(task), now).unwrap();
        state.connect(task, now);
    }
    state
}

fn key(id: &str) -> BarrierKey {
    (id.to_string(), 0)
}

fn wait(arrival: Arrival) -> (oneshot::Receiver<Result<()>>, Instant) {
    match arrival {
        Arrival::Wait(rx, deadline) => (rx, deadline),
        Arrival::Done(outcome) => panic!("expected to wait, got {outcome:?}"),
    }
}

#[test]
fn barrier_passes_when_all_arrive_and_wakes_waiters() {
    let mut state = registered(3);
    let now = Instant::now();
    let (mut rx0, _) = wait(state.barrier(0, key("b"), Duration::from_secs(5), &[], now));
    let (mut rx1, _) = wait(state.barrier(1, key("b"), Duration::from_secs(5), &[], now));
    assert!(rx0.try_recv().is_err(), "barrier must not pass before the last arrival");
    match state.barrier(2, key("b"), Duration::from_secs(5), &[], now) {
        Arrival::Done(Ok(())) => {}
        _ => panic!("last arrival must pass"),
    }
    assert_eq!(rx0.try_recv().unwrap(), Ok(()));
    assert_eq!(rx1.try_recv().unwrap(), Ok(()));
    // A retried arrival after the barrier passed gets the same outcome.
    assert!(matches!(state.barrier(1, key("b"), Duration::from_secs(5), &[], now), Arrival::Done(Ok(()))));
}

#[test]
fn barrier_deadline_starts_at_first_arrival_and_names_missing_tasks() {
    let mut state = registered(4);
    let t0 = Instant::now();
    let (_rx, deadline) = wait(state.barrier(2, key("b"), Duration::from_secs(3), &[], t0));
    assert_eq!(deadline, t0 + Duration::from_secs(3));
    // A later arrival with a longer timeout does not move the deadline.
    let (_rx1, deadline1) = wait(state.barrier(0, key("b"), Duration::from_secs(60), &[], t0 + Duration::from_secs(1)));
    assert_eq!(deadline1, deadline);
    assert!(state.expire_barrier(&key("b"), t0 + Duration::from_secs(2)).is_none(), "not yet due");
    let outcome = state.expire_barrier(&key("b"), t0 + Duration::from_secs(3)).unwrap();
    let message = outcome.unwrap_err().to_string();
    assert!(message.contains("task(s) [1, 3] did not arrive"), "{message}");
}

#[test]
fn barrier_subset_and_bad_participants() {
    let mut state = registered(4);
    let now = Instant::now();
    let (mut rx, _) = wait(state.barrier(1, key("s"), Duration::from_secs(5), &[1, 3], now));
    assert!(matches!(state.barrier(3, key("s"), Duration::from_secs(5), &[3, 1], now), Arrival::Done(Ok(()))));
    assert_eq!(rx.try_recv().unwrap(), Ok(()));
    match state.barrier(0, key("t"), Duration::from_secs(5), &[1, 2], now) {
        Arrival::Done(Err(CoordError::InvalidArgument(m))) => assert!(m.contains("not a participant"), "{m}"),
        _ => panic!("a non-participant must be rejected"),
    }
    match state.barrier(0, key("u"), Duration::from_secs(5), &[0, 9], now) {
        Arrival::Done(Err(CoordError::InvalidArgument(m))) => assert!(m.contains("unknown task 9"), "{m}"),
        _ => panic!("an unknown participant must be rejected"),
    }
}

#[test]
fn job_error_fails_pending_barriers_and_gets_and_is_sticky() {
    let mut state = registered(3);
    let now = Instant::now();
    let (mut rx, _) = wait(state.barrier(0, key("b"), Duration::from_secs(5), &[], now));
    let mut get = match state.kv_get("never").unwrap() {
        Lookup::Wait(rx) => rx,
        Lookup::Found(_) => panic!("key is not set"),
    };
    state.report_error(2, "disk full");
    let error = rx.try_recv().unwrap().unwrap_err();
    assert!(matches!(&error, CoordError::JobFailed { task: Some(2), .. }), "{error:?}");
    assert!(error.to_string().contains("task 2 reported an error: disk full"), "{error}");
    assert_eq!(get.try_recv().unwrap().unwrap_err(), error);
    // Sticky: every later call gets the first error, and a second error does not replace it.
    state.report_error(1, "other");
    assert_eq!(state.kv_try_get("x").unwrap_err(), error);
    assert!(
        matches!(state.barrier(1, key("c"), Duration::from_secs(5), &[], now), Arrival::Done(Err(e)) if e == error)
    );
    assert_eq!(state.status(2), TaskStatus::Failed);
}

#[test]
fn a_preemption_stops_the_job_with_its_own_code_but_never_replaces_a_failure() {
    let mut state = registered(2);
    let now = Instant::now();
    let (mut rx, _) = wait(state.barrier(0, key("b"), Duration::from_secs(5), &[], now));
    state.report_preemption(1, "received SIGTERM");
    let error = rx.try_recv().unwrap().unwrap_err();
    assert!(error.is_preemption(), "{error:?}");
    assert_eq!(error.to_string(), "the job stopped: preempted: task 1: received SIGTERM");
    // A later failure (a host lost while the others stop) does not turn it into a failure.
    state.report_error(0, "lost");
    assert!(state.kv_try_get("x").unwrap_err().is_preemption());

    let mut state = registered(2);
    state.report_error(0, "disk full");
    state.report_preemption(1, "received SIGTERM");
    let error = state.kv_try_get("x").unwrap_err();
    assert!(!error.is_preemption() && error.to_string().contains("disk full"), "{error}");
}

#[test]
fn disconnect_fails_task_after_grace_unless_reconnected() {
    let mut state = registered(2);
    let now = Instant::now();
    let generation = state.connect(1, now);
    assert!(state.disconnect(1, generation));
    // Reconnected within the grace period: the old stream's expiry does nothing.
    let newer = state.connect(1, now);
    state.grace_expired(1, generation, Duration::from_millis(500));
    assert!(state.job_error().is_none());
    assert!(state.disconnect(1, newer));
    state.grace_expired(1, newer, Duration::from_millis(500));
    let error = state.job_error().unwrap().to_string();
    assert!(error.contains("task 1 was lost"), "{error}");
}

#[test]
fn shutdown_barrier_makes_disconnects_harmless() {
    let mut state = registered(2);
    let now = Instant::now();
    let generation = state.connect(0, now);
    let _rx = wait(state.barrier(0, (SHUTDOWN_BARRIER.into(), 0), Duration::from_secs(5), &[], now));
    assert!(matches!(
        state.barrier(1, (SHUTDOWN_BARRIER.into(), 0), Duration::from_secs(5), &[], now),
        Arrival::Done(Ok(()))
    ));
    assert!(!state.disconnect(0, generation), "a shut-down task's disconnect is not a failure");
    assert!(state.job_error().is_none());
    assert!(!state.all_gone(None), "task 1's stream is still open");
    assert!(state.all_gone(Some(1)));
    let generation1 = state.connect(1, now);
    assert!(!state.disconnect(1, generation1));
    assert!(state.all_gone(None));
}

#[test]
fn heartbeat_timeout_fails_silent_task() {
    let mut state = registered(2);
    let t0 = Instant::now();
    let generation = state.connect(0, t0);
    state.beat(0, generation, t0 + Duration::from_secs(8));
    state.sweep(t0 + Duration::from_secs(11), Duration::from_secs(10));
    let error = state.job_error().expect("task 1 was silent for 11 s").to_string();
    assert!(error.contains("task 1 sent no heartbeat"), "{error}");
}

#[test]
fn register_rules() {
    let (mut state, _rx) = State::new(2);
    let now = Instant::now();
    assert!(matches!(state.register(5, 1, now), Err(CoordError::InvalidArgument(_))));
    assert_eq!(state.register(0, 7, now).unwrap(), 2);
    assert_eq!(state.register(0, 7, now).unwrap(), 2, "a retried register is fine");
    assert!(state.check_caller(1, 3).is_err(), "task 1 has not registered");
    assert!(state.check_caller(0, 8).is_err(), "wrong incarnation");
    assert!(state.check_caller(0, 7).is_ok());
    let restarted = state.register(0, 8, now).unwrap_err();
    assert!(restarted.to_string().contains("restarted"), "{restarted}");
    assert!(state.job_error().is_some(), "a restarted task fails the job");
}

#[test]
fn kv_semantics() {
    let mut state = registered(1);
    state.kv_set("a/1", b"x".to_vec(), false).unwrap();
    assert!(matches!(state.kv_set("a/1", b"y".to_vec(), false), Err(CoordError::AlreadyExists(_))));
    state.kv_set("a/1", b"y".to_vec(), true).unwrap();
    assert_eq!(state.kv_try_get("a/1").unwrap(), Some(b"y".to_vec()));
    assert_eq!(state.kv_try_get("a/2").unwrap(), None);
    let mut rx = match state.kv_get("a/2").unwrap() {
        Lookup::Wait(rx) => rx,
        Lookup::Found(_) => panic!("not set yet"),
    };
    state.kv_set("a/2", b"z".to_vec(), false).unwrap();
    assert_eq!(rx.try_recv().unwrap().unwrap(), b"z".to_vec());
    state.kv_set("b", b"q".to_vec(), false).unwrap();
    let listed: Vec<String> = state.kv_list("a/").unwrap().into_iter().map(|(k, _)| k).collect();
    assert_eq!(listed, vec!["a/1", "a/2"]);
    assert_eq!(state.kv_increment("n", 2).unwrap(), 2);
    assert_eq!(state.kv_increment("n", -5).unwrap(), -3);
    assert_eq!(state.kv_try_get("n").unwrap(), Some(b"-3".to_vec()));
    assert!(matches!(state.kv_increment("b", 1), Err(CoordError::InvalidArgument(_))));
    assert_eq!(state.kv_delete("a/", true).unwrap(), 2);
    assert_eq!(state.kv_delete("b", false).unwrap(), 1);
    assert_eq!(state.kv_list("").unwrap().len(), 1, "only the counter is left");
}

#[test]
fn cancel_fails_waiters_and_later_arrivals() {
    let mut state = registered(2);
    let now = Instant::now();
    let (mut rx, _) = wait(state.barrier(0, key("c"), Duration::from_secs(5), &[], now));
    state.cancel_barrier(0, key("c"), now).unwrap();
    assert!(matches!(rx.try_recv().unwrap(), Err(CoordError::Cancelled(_))));
    assert!(matches!(
        state.barrier(1, key("c"), Duration::from_secs(5), &[], now),
        Arrival::Done(Err(CoordError::Cancelled(_)))
    ));
    // The job itself is fine.
    assert!(state.job_error().is_none());
}

#[test]
fn finished_barriers_are_pruned_when_a_newer_counter_starts() {
    let mut state = registered(1);
    let now = Instant::now();
    for counter in 0..100 {
        assert!(matches!(
            state.barrier(0, ("loop".into(), counter), Duration::from_secs(1), &[], now),
            Arrival::Done(Ok(()))
        ));
    }
    assert_eq!(state.barriers.len(), 1);
}

#[test]
fn alive_tasks_excludes_failed_and_absent() {
    let (mut state, _rx) = State::new(3);
    let now = Instant::now();
    state.register(0, 1, now).unwrap();
    state.register(2, 3, now).unwrap();
    assert_eq!(state.alive_tasks(&[]).unwrap(), vec![0, 2]);
    state.report_error(2, "x");
    assert_eq!(state.alive_tasks(&[]).unwrap(), vec![0]);
}
