//! The service and clients in one process, over gRPC on port 0 of 127.0.0.1.

use std::time::{Duration, Instant};

use siphon_coord::service::{self, CoordinatorHandle, ServiceConfig};
use siphon_coord::{Client, ClientOptions, CoordError};

const TOKEN: &str = "test-token";

async fn start(num_tasks: u32) -> CoordinatorHandle {
    let mut config = ServiceConfig::new(num_tasks, TOKEN);
    config.grace = Duration::from_millis(200);
    let (handle, server) = service::bind(config, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    tokio::spawn(server);
    handle
}

fn options() -> ClientOptions {
    ClientOptions {
        connect_timeout: Duration::from_secs(5),
        register_timeout: Duration::from_secs(5),
        heartbeat_interval: Duration::from_millis(200),
        ..ClientOptions::default()
    }
}

async fn join_all(handle: &CoordinatorHandle, n: u32) -> Vec<Client> {
    let address = handle.local_addr().to_string();
    let joins = (0..n).map(|task| {
        let address = address.clone();
        async move { Client::connect(&address, task, TOKEN, &options()).await.unwrap() }
    });
    futures::future::join_all(joins).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn barriers_and_kv_across_tasks() {
    let handle = start(3).await;
    let clients = join_all(&handle, 3).await;
    for round in 0..5 {
        let waits = clients.iter().map(|c| c.barrier("step", Duration::from_secs(5)));
        for result in futures::future::join_all(waits).await {
            result.unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
    }
    // Subset barrier: tasks 0 and 2 only.
    let (a, b) = tokio::join!(
        clients[0].barrier_among("pair", Duration::from_secs(5), &[0, 2]),
        clients[2].barrier_among("pair", Duration::from_secs(5), &[0, 2]),
    );
    a.unwrap();
    b.unwrap();
    // Blocking get waits for a later set.
    let getter = {
        let c = clients[1].clone();
        tokio::spawn(async move { c.kv_get("late", Duration::from_secs(5)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    clients[0].kv_set("late", b"value", false).await.unwrap();
    assert_eq!(getter.await.unwrap().unwrap(), b"value");
    assert!(matches!(clients[2].kv_set("late", b"again", false).await, Err(CoordError::AlreadyExists(_))));
    clients[2].kv_set("late", b"again", true).await.unwrap();
    assert_eq!(clients[0].kv_try_get("late").await.unwrap(), Some(b"again".to_vec()));
    assert_eq!(clients[0].kv_try_get("absent").await.unwrap(), None);
    let short = clients[0].kv_get("absent", Duration::from_millis(100)).await.unwrap_err();
    assert!(matches!(&short, CoordError::DeadlineExceeded(m) if m.contains("absent")), "{short:?}");
    // Counters from every task.
    let increments = clients.iter().map(|c| c.kv_increment("n", 2));
    let mut values: Vec<i64> = futures::future::join_all(increments).await.into_iter().map(Result::unwrap).collect();
    values.sort();
    assert_eq!(values, [2, 4, 6]);
    clients[1].kv_set("p/a", b"1", false).await.unwrap();
    clients[1].kv_set("p/b", b"2", false).await.unwrap();
    let listed = clients[2].kv_list("p/").await.unwrap();
    assert_eq!(listed, vec![("p/a".to_string(), b"1".to_vec()), ("p/b".to_string(), b"2".to_vec())]);
    clients[0].kv_delete_prefix("p/").await.unwrap();
    assert!(clients[2].kv_list("p/").await.unwrap().is_empty());
    clients[0].kv_delete("n").await.unwrap();
    assert_eq!(clients[0].kv_try_get("n").await.unwrap(), None);
    assert_eq!(clients[0].alive_tasks(&[]).await.unwrap(), vec![0, 1, 2]);
    // Shutdown barrier, then nobody's disconnect is a failure.
    let shutdowns = clients.iter().map(|c| c.shutdown(Duration::from_secs(5)));
    for result in futures::future::join_all(shutdowns).await {
        result.unwrap();
    }
    drop(clients);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(handle.job_error(), None);
    handle.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn barrier_timeout_names_missing_tasks_and_cancel_reaches_everyone() {
    let handle = start(3).await;
    let clients = join_all(&handle, 3).await;
    let started = Instant::now();
    let first = {
        let c = clients[0].clone();
        tokio::spawn(async move { c.barrier("slow", Duration::from_millis(300)).await })
    };
    // Task 2 arrives second, with a longer timeout that must not extend the deadline.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let b = clients[2].barrier("slow", Duration::from_secs(60)).await;
    let a = first.await.unwrap();
    // The deadline started at the first arrival (300 ms), not the longer one.
    assert!(started.elapsed() < Duration::from_secs(3));
    for error in [a.unwrap_err(), b.unwrap_err()] {
        assert!(
            matches!(&error, CoordError::DeadlineExceeded(m) if m.contains("task(s) [1] did not arrive")),
            "{error:?}"
        );
    }
    let waiter = {
        let c = clients[1].clone();
        tokio::spawn(async move { c.barrier_with("cancel-me", 1, Duration::from_secs(30), &[]).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    clients[0].cancel_barrier("cancel-me", 1).await.unwrap();
    let error = waiter.await.unwrap().unwrap_err();
    assert!(matches!(&error, CoordError::Cancelled(m) if m.contains("cancelled by task 0")), "{error:?}");
    // Neither a timeout nor a cancel fails the job.
    clients[0].kv_set("still", b"ok", false).await.unwrap();
    assert_eq!(handle.job_error(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_token_and_unknown_task_are_rejected() {
    let handle = start(2).await;
    let address = handle.local_addr().to_string();
    let error = Client::connect_only(&address, 0, "not-the-token", &options()).await.err().unwrap();
    assert!(matches!(error, CoordError::Unauthenticated(_)), "{error:?}");
    assert!(!error.to_string().contains(TOKEN));
    let error = Client::connect_only(&address, 7, TOKEN, &options()).await.err().unwrap();
    assert!(matches!(&error, CoordError::InvalidArgument(m) if m.contains("unknown task 7")), "{error:?}");
    assert_eq!(handle.job_error(), None, "rejected clients do not fail the job");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_count_no_job_has_is_refused_before_any_slot_is_made() {
    for tasks in [0, siphon_coord::MAX_PROCESSES + 1, u32::MAX] {
        let config = ServiceConfig::new(tasks, TOKEN);
        let error = service::bind(config, "127.0.0.1:0".parse().unwrap()).await.err().unwrap();
        assert!(matches!(&error, CoordError::InvalidArgument(m) if m.contains("1..=1048576")), "{error:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_error_reaches_every_waiting_task_at_once() {
    let handle = start(3).await;
    let clients = join_all(&handle, 3).await;
    let waiter = {
        let c = clients[0].clone();
        tokio::spawn(async move { c.barrier("never", Duration::from_secs(60)).await })
    };
    let getter = {
        let c = clients[2].clone();
        tokio::spawn(async move { c.kv_get("never", Duration::from_secs(60)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let reported = Instant::now();
    clients[1].report_error("out of disk").await.unwrap();
    for result in [waiter.await.unwrap(), getter.await.unwrap().map(|_| ())] {
        let error = result.unwrap_err();
        assert!(matches!(&error, CoordError::JobFailed { task: Some(1), .. }), "{error:?}");
        assert!(error.to_string().contains("out of disk"), "{error}");
    }
    assert!(reported.elapsed() < Duration::from_secs(1), "took {:?}", reported.elapsed());
    // Sticky on every task, even for calls that would otherwise succeed.
    let error = clients[2].kv_try_get("x").await.unwrap_err();
    assert!(error.to_string().contains("out of disk"), "{error}");
    assert!(clients[0].job_error().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_task_fails_the_barrier_naming_it() {
    let handle = start(3).await;
    let mut clients = join_all(&handle, 3).await;
    let gone = clients.remove(1);
    let waits: Vec<_> = clients
        .iter()
        .map(|c| {
            let c = c.clone();
            tokio::spawn(async move { c.barrier("b", Duration::from_secs(60)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let dropped = Instant::now();
    drop(gone);
    for wait in waits {
        let error = wait.await.unwrap().unwrap_err();
        assert!(error.to_string().contains("task 1 was lost"), "{error}");
    }
    assert!(dropped.elapsed() < Duration::from_secs(2), "took {:?}", dropped.elapsed());
    assert_eq!(clients[0].alive_tasks(&[]).await.err().map(|e| e.to_string().contains("task 1")), Some(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_coordinator_fails_every_call() {
    let handle = start(2).await;
    let clients = join_all(&handle, 2).await;
    let waiter = {
        let c = clients[0].clone();
        tokio::spawn(async move { c.barrier("b", Duration::from_secs(60)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stopped = Instant::now();
    handle.stop();
    let error = waiter.await.unwrap().unwrap_err();
    assert!(error.to_string().contains("coordinator"), "{error}");
    assert!(stopped.elapsed() < Duration::from_secs(1), "took {:?}", stopped.elapsed());
    let error = clients[1].wait_for_error().await;
    assert!(error.to_string().contains("lost the coordinator"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_times_out_naming_the_absent_task() {
    let handle = start(3).await;
    let address = handle.local_addr().to_string();
    let mut short = options();
    short.register_timeout = Duration::from_millis(400);
    let (a, b) =
        tokio::join!(Client::connect(&address, 0, TOKEN, &short), Client::connect(&address, 2, TOKEN, &short),);
    for result in [a, b] {
        let error = result.err().unwrap();
        assert!(matches!(&error, CoordError::DeadlineExceeded(m) if m.contains("[1] did not arrive")), "{error:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_retries_until_the_coordinator_appears_or_the_timeout() {
    // Reserve a port, free it, start the service there a bit after the client starts trying.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let address = format!("127.0.0.1:{port}");
    let mut quick = options();
    quick.connect_timeout = Duration::from_millis(300);
    let started = Instant::now();
    let error = Client::connect(&address, 0, TOKEN, &quick).await.err().unwrap();
    assert!(matches!(&error, CoordError::Unavailable(m) if m.contains("could not reach")), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(2));

    let late = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let config = ServiceConfig::new(1, TOKEN);
        let (handle, server) = service::bind(config, format!("127.0.0.1:{port}").parse().unwrap()).await.unwrap();
        tokio::spawn(server);
        handle
    });
    let client = Client::connect(&address, 0, TOKEN, &options()).await.unwrap();
    client.barrier("x", Duration::from_secs(1)).await.unwrap();
    late.await.unwrap().stop();
}
