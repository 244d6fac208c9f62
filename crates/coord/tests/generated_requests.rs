//! Generated inputs through a real coordinator on 127.0.0.1: gRPC frames whose body is a
//! mutated request, sent as raw bytes by a registered task to the service's RPCs. Each gets an
//! answer or a status with a message, and the service goes on answering after every one.

use std::time::Duration;

use proptest::prelude::*;
use prost::Message;
use siphon_coord::proto;
use siphon_coord::service::{self, INCARNATION_HEADER, ServiceConfig, TASK_HEADER, TOKEN_HEADER};
use siphon_fuzz::bytes::EDGE_INTEGERS;
use siphon_fuzz::grpc::{Raw, broken};
use tonic::Status;
use tonic::codegen::http::uri::PathAndQuery;

#[global_allocator]
static ALLOC: siphon_fuzz::Bounded = siphon_fuzz::Bounded::new(256 << 20);

const TOKEN: &str = "test-token";

/// The RPCs a task may send anything to without failing the job (ReportError would), each
/// with a valid body; blocking ones wait 50 ms.
fn rpcs() -> Vec<(&'static str, Vec<u8>)> {
    let path = |name| -> &'static str { Box::leak(format!("/siphon.coord.v1.Coordination/{name}").into_boxed_str()) };
    vec![
        (path("Register"), proto::RegisterRequest {}.encode_to_vec()),
        (
            path("Barrier"),
            proto::BarrierRequest { id: "step".into(), counter: 1, timeout_ms: 50, participants: vec![0, 1] }
                .encode_to_vec(),
        ),
        (path("CancelBarrier"), proto::CancelBarrierRequest { id: "step".into(), counter: 2 }.encode_to_vec()),
        (
            path("KvSet"),
            proto::KvSetRequest { key: "siphon/config".into(), value: b"{}".to_vec(), allow_overwrite: true }
                .encode_to_vec(),
        ),
        (path("KvGet"), proto::KvGetRequest { key: "siphon/config".into(), timeout_ms: 50 }.encode_to_vec()),
        (path("KvTryGet"), proto::KvKey { key: "siphon/config".into() }.encode_to_vec()),
        (path("KvIncrement"), proto::KvIncrementRequest { key: "n".into(), delta: 7 }.encode_to_vec()),
        (path("KvList"), proto::KvKey { key: "siphon/".into() }.encode_to_vec()),
        (path("KvDelete"), proto::KvDeleteRequest { key: "siphon/x".into(), prefix: true }.encode_to_vec()),
        (path("GetAliveTasks"), proto::AliveTasksRequest { tasks: vec![0, 1] }.encode_to_vec()),
        (path("Shutdown"), proto::ShutdownRequest { timeout_ms: 50 }.encode_to_vec()),
    ]
}

/// Requests with their numeric fields (task ids, counters, timeouts, deltas) at their edges:
/// (path, what the body holds, the body).
fn edge_requests() -> impl Strategy<Value = (&'static str, String, Vec<u8>)> {
    let path = |name| -> &'static str { Box::leak(format!("/siphon.coord.v1.Coordination/{name}").into_boxed_str()) };
    let (alive, barrier, increment, get) = (path("GetAliveTasks"), path("Barrier"), path("KvIncrement"), path("KvGet"));
    let edge = || proptest::sample::select(EDGE_INTEGERS.to_vec());
    let tasks = proptest::collection::vec(prop_oneof![0u32..3, edge().prop_map(|v| v as u32)], 0..4);
    let shown = |m: &dyn std::fmt::Debug| format!("{m:?}");
    prop_oneof![
        tasks.clone().prop_map(move |tasks| {
            let m = proto::AliveTasksRequest { tasks };
            (alive, shown(&m), m.encode_to_vec())
        }),
        (tasks, edge(), prop_oneof![Just(20u64), edge()]).prop_map(move |(participants, counter, timeout_ms)| {
            let m = proto::BarrierRequest { id: "edge".into(), counter, timeout_ms, participants };
            (barrier, shown(&m), m.encode_to_vec())
        }),
        edge().prop_map(move |delta| {
            let m = proto::KvIncrementRequest { key: "n".into(), delta: delta as i64 };
            (increment, shown(&m), m.encode_to_vec())
        }),
        edge().prop_map(move |timeout_ms| {
            let m = proto::KvGetRequest { key: "absent".into(), timeout_ms };
            (get, shown(&m), m.encode_to_vec())
        }),
    ]
}

#[test]
fn raw_mutated_requests_get_an_answer_or_a_status_and_the_service_stays_up() {
    siphon_fuzz::quiet_panics();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (handle, server) =
        runtime.block_on(service::bind(ServiceConfig::new(2, TOKEN), "127.0.0.1:0".parse().unwrap())).unwrap();
    let server = runtime.spawn(server);
    let channel = runtime
        .block_on(tonic::transport::Endpoint::from_shared(format!("http://{}", handle.local_addr())).unwrap().connect())
        .unwrap();
    // Task 0 of 2 (incarnation 0xabc) calls; `wait` bounds a call that blocks on task 1.
    let call = |path: &'static str, body: Vec<u8>, wait: Duration| -> Option<Result<Vec<u8>, Status>> {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        runtime.block_on(async move {
            let mut request = tonic::Request::new(body);
            request.metadata_mut().insert(TOKEN_HEADER, TOKEN.parse().unwrap());
            request.metadata_mut().insert(TASK_HEADER, "0".parse().unwrap());
            request.metadata_mut().insert(INCARNATION_HEADER, "abc".parse().unwrap());
            let call = async {
                grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
                grpc.unary(request, PathAndQuery::from_static(path), Raw).await.map(|r| r.into_inner())
            };
            tokio::time::timeout(wait, call).await.ok()
        })
    };
    let rpcs = rpcs();
    let (register, try_get) = (rpcs[0].clone(), rpcs[5].clone());
    call(register.0, register.1, Duration::from_secs(5)).unwrap().expect("task 0 registers");
    let mutated = proptest::sample::select(rpcs).prop_flat_map(|(path, body)| {
        let hot = body.len();
        (Just(path), siphon_fuzz::bytes::mutations(&body, hot))
            .prop_map(|(path, mutated)| (path, format!("{mutated:?}"), mutated.bytes))
    });
    let strategy = prop_oneof![mutated, edge_requests()];
    siphon_fuzz::check("raw coordinator requests", siphon_fuzz::cases(200), strategy, |(path, _, body)| {
        // A call still waiting for task 1 (a barrier, a get) after 150 ms is a wait, not a hang.
        let outcome = call(path, body.clone(), Duration::from_millis(150));
        let alive = call(try_get.0, try_get.1.clone(), Duration::from_secs(5));
        match alive {
            Some(Ok(_)) => {}
            other => panic!("the service stopped answering after {path}: {other:?}"),
        }
        match outcome {
            None | Some(Ok(_)) => Ok(()),
            Some(Err(status)) if broken(&status) => {
                panic!("{path} broke the call: {status:?}")
            }
            Some(Err(status)) => Err(format!("{path}: {}", status.message())),
        }
    });
    assert!(handle.job_error().is_none(), "{:?}", handle.job_error());
    drop(channel);
    handle.stop();
    runtime.block_on(server).unwrap().unwrap();
}
