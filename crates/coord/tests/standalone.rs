//! The service run on its own (`siphon coordinator`), joined by processes that do not host it.

use std::sync::mpsc;
use std::time::Duration;

use siphon_coord::service::{ServiceConfig, run_standalone};
use siphon_coord::{Coordination, Identity, IdentityFlags, JoinOptions, identity};

fn start(n: u32) -> (String, std::thread::JoinHandle<siphon_coord::Result<()>>) {
    let (sender, receiver) = mpsc::channel();
    let service = std::thread::spawn(move || {
        run_standalone(ServiceConfig::new(n, "tok"), "127.0.0.1:0".parse().unwrap(), |addr| {
            sender.send(addr).unwrap();
        })
    });
    let addr = receiver.recv_timeout(Duration::from_secs(10)).expect("service listening");
    (addr.to_string(), service)
}

fn member(address: &str, task: u32, n: u32) -> siphon_coord::Result<Coordination> {
    let flags = IdentityFlags {
        process_id: Some(task),
        num_processes: Some(n),
        coordinator: Some(address.to_string()),
        ..Default::default()
    };
    let me: Identity = identity::resolve(&flags, &Default::default(), None)?;
    let mut options = JoinOptions::new("tok");
    options.host_service = Some(false);
    options.client.register_timeout = Duration::from_secs(10);
    Coordination::join(&me, options)
}

#[test]
fn standalone_service_ends_cleanly_after_everyone_shuts_down() {
    let (address, service) = start(2);
    let workers: Vec<_> = (0..2)
        .map(|task| {
            let address = address.clone();
            std::thread::spawn(move || -> siphon_coord::Result<String> {
                let job = member(&address, task, 2)?;
                assert!(job.hosted_service().is_none());
                job.barrier("b", Duration::from_secs(10))?;
                let run = job.broadcast_config(&serde_json::json!({"same": true}), Duration::from_secs(10))?;
                job.shutdown(Duration::from_secs(10))?;
                Ok(run["run_name"].as_str().unwrap_or_default().to_string())
            })
        })
        .collect();
    let names: Vec<String> = workers.into_iter().map(|w| w.join().unwrap().unwrap()).collect();
    assert_eq!(names[0], names[1], "both processes got rank 0's run name");
    service.join().unwrap().expect("the service ends with success");
}

#[test]
fn standalone_service_reports_the_job_failure() {
    let (address, service) = start(2);
    let workers: Vec<_> = (0..2)
        .map(|task| {
            let address = address.clone();
            std::thread::spawn(move || -> siphon_coord::Result<()> {
                let job = member(&address, task, 2)?;
                if task == 1 {
                    job.report_error("bad shard")?;
                }
                job.barrier("never", Duration::from_secs(30))
            })
        })
        .collect();
    for worker in workers {
        let error = worker.join().unwrap().unwrap_err();
        assert!(error.to_string().contains("bad shard"), "{error}");
    }
    let error = service.join().unwrap().unwrap_err();
    assert!(error.to_string().contains("task 1 reported an error: bad shard"), "{error}");
}

#[test]
fn coordination_is_shared_across_threads_like_pjrt_kv_callbacks() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Coordination>();
    assert_send_sync::<siphon_coord::Client>();
    let me = identity::resolve(&IdentityFlags::default(), &Default::default(), None).unwrap();
    let job = std::sync::Arc::new(Coordination::join(&me, JoinOptions::new("tok")).unwrap());
    // Several threads block in gets at once while another thread sets the keys: blocking
    // calls from many threads on one handle must neither deadlock nor serialize behind a get.
    let getters: Vec<_> = (0..4)
        .map(|i| {
            let job = job.clone();
            std::thread::spawn(move || job.kv_get(&format!("k{i}"), Duration::from_secs(10)))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    for i in 0..4 {
        job.kv_set(&format!("k{i}"), format!("v{i}").as_bytes(), false).unwrap();
        assert_eq!(job.kv_try_get(&format!("k{i}")).unwrap(), Some(format!("v{i}").into_bytes()));
    }
    for (i, getter) in getters.into_iter().enumerate() {
        assert_eq!(getter.join().unwrap().unwrap(), format!("v{i}").into_bytes());
    }
    job.shutdown(Duration::from_secs(5)).unwrap();
}
