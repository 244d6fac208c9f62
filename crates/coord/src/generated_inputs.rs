//! Generated inputs for every reader of bytes another process sent the coordinator or its
//! clients: the service's requests (caller headers and protobuf bodies, decoded after byte
//! mutations and taken through what the service does with them: task ids, barrier
//! participants, timeouts, key-value keys, values and counters), a status's job error and a
//! heartbeat event (what a client makes of the coordinator's answers), and the configuration
//! task 0 publishes for the others to compare theirs with. Each must give a value or an error
//! saying what is wrong: never a panic, an allocation no message could justify, or a hang.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use prost::Message;
use serde_json::{Value, json};
use siphon_fuzz::bytes::{Mutated, edge, mutations};
use tonic::metadata::AsciiMetadataValue;

use crate::error::{CoordError, job_error_from_proto};
use crate::proto;
use crate::service::{Caller, INCARNATION_HEADER, TASK_HEADER, TOKEN_HEADER, auth_interceptor, timeout_from_ms};
use crate::state::{Arrival, Lookup, SHUTDOWN_BARRIER, State};

#[global_allocator]
static ALLOC: siphon_fuzz::Bounded = siphon_fuzz::Bounded::new(256 << 20);

const TASKS: u32 = 4;
const TOKEN: &str = "job-secret";

/// The incarnation task `t` registered with (task 3 registers during the calls).
fn incarnation(t: u32) -> u64 {
    0x5eed_0000 + u64::from(t)
}

/// Either the valid bytes or a mutation of them.
fn valid_or_mutated(valid: Vec<u8>, hot: usize) -> BoxedStrategy<Mutated> {
    prop_oneof![
        1 => Just(Mutated { ops: Vec::new(), bytes: valid.clone() }),
        3 => mutations(&valid, hot.max(1)),
    ]
    .boxed()
}

/// The RPCs of `proto/coord.proto` that take a request body (the heartbeat's beats carry only
/// a sequence number the service echoes).
#[derive(Debug, Clone, Copy)]
enum Rpc {
    Register,
    Barrier,
    CancelBarrier,
    KvSet,
    KvGet,
    KvTryGet,
    KvIncrement,
    KvList,
    KvDelete,
    ReportError,
    AliveTasks,
    Shutdown,
}

/// A valid body of each RPC.
fn valid_body(rpc: Rpc) -> Vec<u8> {
    match rpc {
        Rpc::Register => proto::RegisterRequest {}.encode_to_vec(),
        Rpc::Barrier => {
            proto::BarrierRequest { id: "step".into(), counter: 3, timeout_ms: 5_000, participants: vec![0, 2, 3] }
                .encode_to_vec()
        }
        Rpc::CancelBarrier => proto::CancelBarrierRequest { id: "step".into(), counter: 3 }.encode_to_vec(),
        Rpc::KvSet => proto::KvSetRequest {
            key: "siphon/config".into(),
            value: br#"{"hash":"ab","compared":{}}"#.to_vec(),
            allow_overwrite: false,
        }
        .encode_to_vec(),
        Rpc::KvGet => proto::KvGetRequest { key: "siphon/config".into(), timeout_ms: 1_000 }.encode_to_vec(),
        Rpc::KvTryGet => proto::KvKey { key: "siphon/config".into() }.encode_to_vec(),
        Rpc::KvIncrement => proto::KvIncrementRequest { key: "siphon/done".into(), delta: 1 }.encode_to_vec(),
        Rpc::KvList => proto::KvKey { key: "siphon/".into() }.encode_to_vec(),
        Rpc::KvDelete => proto::KvDeleteRequest { key: "siphon/".into(), prefix: true }.encode_to_vec(),
        Rpc::ReportError => {
            proto::ReportErrorRequest { message: "out of memory".into(), preempted: false }.encode_to_vec()
        }
        Rpc::AliveTasks => proto::AliveTasksRequest { tasks: vec![1, 3] }.encode_to_vec(),
        Rpc::Shutdown => proto::ShutdownRequest { timeout_ms: 1_000 }.encode_to_vec(),
    }
}

/// A request body as generated: bytes (valid, or mutated), or a message with fields at their
/// edges (shown as the message).
#[derive(Clone)]
enum Body {
    Bytes(Mutated),
    Fields(String, Vec<u8>),
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Body::Bytes(mutated) => mutated.fmt(f),
            Body::Fields(shown, _) => f.write_str(shown),
        }
    }
}

impl std::ops::Deref for Body {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Body::Bytes(mutated) => mutated,
            Body::Fields(_, bytes) => bytes,
        }
    }
}

/// Task ids: none, a few (valid, repeated, out of range), or many.
fn task_ids() -> BoxedStrategy<Vec<u32>> {
    let id = prop_oneof![2 => 0..TASKS + 1, 1 => edge(0, u32::MAX.into()).prop_map(|v| v as u32)];
    prop_oneof![
        3 => proptest::collection::vec(id, 0..6),
        1 => (0..TASKS).prop_map(|t| vec![t; 100_000]),
    ]
    .boxed()
}

/// The RPC's request with its numeric fields (counters, timeouts, deltas, task ids) at their
/// edges, encoded.
fn edge_body(rpc: Rpc) -> BoxedStrategy<Body> {
    fn fields<M: Message + std::fmt::Debug>(m: M) -> Body {
        let bytes = m.encode_to_vec();
        let shown = format!("{m:?}").chars().take(300).collect();
        Body::Fields(shown, bytes)
    }
    let u64s = u64::MAX;
    let delta = prop_oneof![Just(1i64), Just(-1), Just(i64::MIN), Just(i64::MAX), edge(1, u64s).prop_map(|v| v as i64)];
    match rpc {
        Rpc::Barrier => {
            (edge(3, u64s), edge(5_000, u64s), task_ids(), prop_oneof![Just("step"), Just(SHUTDOWN_BARRIER), Just("")])
                .prop_map(|(counter, timeout_ms, participants, id)| {
                    fields(proto::BarrierRequest { id: id.into(), counter, timeout_ms, participants })
                })
                .boxed()
        }
        Rpc::CancelBarrier => {
            edge(3, u64s).prop_map(|counter| fields(proto::CancelBarrierRequest { id: "step".into(), counter })).boxed()
        }
        Rpc::KvGet => edge(1_000, u64s)
            .prop_map(|timeout_ms| fields(proto::KvGetRequest { key: "siphon/config".into(), timeout_ms }))
            .boxed(),
        Rpc::KvIncrement => (delta, prop_oneof![Just("siphon/done"), Just("siphon/config"), Just("")])
            .prop_map(|(delta, key)| fields(proto::KvIncrementRequest { key: key.into(), delta }))
            .boxed(),
        Rpc::AliveTasks => task_ids().prop_map(|tasks| fields(proto::AliveTasksRequest { tasks })).boxed(),
        Rpc::Shutdown => edge(1_000, u64s).prop_map(|timeout_ms| fields(proto::ShutdownRequest { timeout_ms })).boxed(),
        Rpc::ReportError => (any::<bool>(), prop_oneof![Just(String::new()), Just("é".repeat(1 << 16))])
            .prop_map(|(preempted, message)| fields(proto::ReportErrorRequest { message, preempted }))
            .boxed(),
        _ => Just(Body::Bytes(Mutated { ops: Vec::new(), bytes: valid_body(rpc) })).boxed(),
    }
}

/// One call: the RPC, its caller's task and incarnation headers, its body.
#[derive(Debug, Clone)]
struct Call {
    rpc: Rpc,
    task: Mutated,
    incarnation: Mutated,
    body: Body,
}

fn call() -> impl Strategy<Value = Call> {
    // Each RPC as often as its weight.
    let weighted: Vec<Rpc> = [
        (Rpc::Register, 1),
        (Rpc::Barrier, 4),
        (Rpc::CancelBarrier, 1),
        (Rpc::KvSet, 3),
        (Rpc::KvGet, 2),
        (Rpc::KvTryGet, 1),
        (Rpc::KvIncrement, 3),
        (Rpc::KvList, 1),
        (Rpc::KvDelete, 1),
        (Rpc::ReportError, 1),
        (Rpc::AliveTasks, 2),
        (Rpc::Shutdown, 1),
    ]
    .into_iter()
    .flat_map(|(rpc, weight)| std::iter::repeat_n(rpc, weight))
    .collect();
    let rpc = proptest::sample::select(weighted);
    (rpc, 0..TASKS).prop_flat_map(|(rpc, t)| {
        let task = prop_oneof![4 => Just(Mutated { ops: Vec::new(), bytes: t.to_string().into_bytes() }), 1 => mutations(t.to_string().as_bytes(), 2)];
        let incarnation = format!("{:x}", incarnation(t)).into_bytes();
        let incarnation = prop_oneof![6 => Just(Mutated { ops: Vec::new(), bytes: incarnation.clone() }), 1 => mutations(&incarnation, 8)];
        let body = valid_body(rpc);
        let hot = body.len();
        let body = prop_oneof![
            3 => valid_or_mutated(body, hot).prop_map(Body::Bytes),
            1 => edge_body(rpc),
        ];
        (Just(rpc), task, incarnation, body)
            .prop_map(|(rpc, task, incarnation, body)| Call { rpc, task, incarnation, body })
    })
}

/// The caller of `call`, as the service's interceptor reads its headers.
fn caller(call: &Call) -> Result<Caller, String> {
    let mut request = tonic::Request::new(());
    let header = |bytes: &[u8]| {
        AsciiMetadataValue::try_from(bytes).map_err(|_| "not a header value (HTTP/2 refuses it)".to_string())
    };
    request.metadata_mut().insert(TOKEN_HEADER, AsciiMetadataValue::from_static(TOKEN));
    request.metadata_mut().insert(TASK_HEADER, header(&call.task)?);
    request.metadata_mut().insert(INCARNATION_HEADER, header(&call.incarnation)?);
    let mut intercept = auth_interceptor(TOKEN.to_string(), TASKS);
    let request = intercept(request).map_err(|status| status.message().to_string())?;
    request.extensions().get::<Caller>().copied().ok_or_else(|| "the interceptor named no caller".to_string())
}

fn status(error: CoordError) -> String {
    error.to_status().message().to_string()
}

fn decode<M: Message + Default>(bytes: &[u8]) -> Result<M, String> {
    M::decode(bytes).map_err(|e| format!("undecodable request: {e}"))
}

/// What the service does with `call` (`crate::service`'s handlers, without the network);
/// barriers that wait are remembered in `waiting`.
fn serve(state: &mut State, call: &Call, now: Instant, waiting: &mut Vec<(String, u64)>) -> Result<(), String> {
    let caller = caller(call)?;
    if !matches!(call.rpc, Rpc::Register) {
        state.check_caller(caller.task, caller.incarnation).map_err(status)?;
    }
    let body = &call.body[..];
    let map = |e: tonic::Status| e.message().to_string();
    match call.rpc {
        Rpc::Register => {
            decode::<proto::RegisterRequest>(body)?;
            let n = state.register(caller.task, caller.incarnation, now).map_err(status)?;
            assert_eq!(n, TASKS);
        }
        Rpc::Barrier | Rpc::Shutdown => {
            let (key, timeout, participants) = if let Rpc::Barrier = call.rpc {
                let request: proto::BarrierRequest = decode(body)?;
                let timeout = timeout_from_ms(request.timeout_ms, &format!("barrier '{}'", request.id)).map_err(map)?;
                ((request.id, request.counter), timeout, request.participants)
            } else {
                let request: proto::ShutdownRequest = decode(body)?;
                let timeout = timeout_from_ms(request.timeout_ms, "shutdown").map_err(map)?;
                ((SHUTDOWN_BARRIER.to_string(), 0), timeout, Vec::new())
            };
            match state.barrier(caller.task, key.clone(), timeout, &participants, now) {
                Arrival::Done(outcome) => outcome.map_err(status)?,
                Arrival::Wait(_, deadline) => {
                    // The deadline is the first arrival's, at least 1 ms ahead.
                    assert!(deadline > now && deadline <= now + Duration::from_secs(7 * 24 * 3600), "deadline");
                    waiting.push(key);
                }
            }
        }
        Rpc::CancelBarrier => {
            let request: proto::CancelBarrierRequest = decode(body)?;
            state.cancel_barrier(caller.task, (request.id, request.counter), now).map_err(status)?;
        }
        Rpc::KvSet => {
            let request: proto::KvSetRequest = decode(body)?;
            state.kv_set(&request.key, request.value, request.allow_overwrite).map_err(status)?;
        }
        Rpc::KvGet => {
            let request: proto::KvGetRequest = decode(body)?;
            timeout_from_ms(request.timeout_ms, &format!("get of key '{}'", request.key)).map_err(map)?;
            match state.kv_get(&request.key).map_err(status)? {
                Lookup::Found(_) | Lookup::Wait(_) => {}
            }
        }
        Rpc::KvTryGet => {
            let request: proto::KvKey = decode(body)?;
            state.kv_try_get(&request.key).map_err(status)?;
        }
        Rpc::KvIncrement => {
            let request: proto::KvIncrementRequest = decode(body)?;
            state.kv_increment(&request.key, request.delta).map_err(status)?;
        }
        Rpc::KvList => {
            let request: proto::KvKey = decode(body)?;
            state.kv_list(&request.key).map_err(status)?;
        }
        Rpc::KvDelete => {
            let request: proto::KvDeleteRequest = decode(body)?;
            state.kv_delete(&request.key, request.prefix).map_err(status)?;
        }
        Rpc::ReportError => {
            let request: proto::ReportErrorRequest = decode(body)?;
            if request.preempted {
                state.report_preemption(caller.task, &request.message);
            } else {
                state.report_error(caller.task, &request.message);
            }
        }
        Rpc::AliveTasks => {
            let request: proto::AliveTasksRequest = decode(body)?;
            let alive = state.alive_tasks(&request.tasks).map_err(status)?;
            assert!(alive.iter().all(|&t| t < TASKS), "alive tasks {alive:?} of {TASKS}");
        }
    }
    Ok(())
}

#[test]
fn mutated_requests_get_an_answer_or_a_status_naming_the_problem() {
    siphon_fuzz::quiet_panics();
    let strategy = proptest::collection::vec(call(), 1..10);
    siphon_fuzz::check("coordinator requests", siphon_fuzz::cases(1500), strategy, |calls| {
        let (mut state, _errors) = State::new(TASKS);
        let now = Instant::now();
        for t in 0..3 {
            state.register(t, incarnation(t), now).expect("registers");
        }
        let (mut waiting, mut refused) = (Vec::new(), Vec::new());
        for call in calls {
            if let Err(message) = serve(&mut state, call, now, &mut waiting) {
                if message.trim().is_empty() {
                    return Err(String::new());
                }
                refused.push(message);
            }
        }
        // Then the barriers still waiting time out, naming who did not arrive, and silent
        // tasks are swept.
        let later = now + Duration::from_secs(8 * 24 * 3600);
        for key in &waiting {
            if let Some(Err(error)) = state.expire_barrier(key, later)
                && status(error).trim().is_empty()
            {
                return Err(String::new());
            }
        }
        state.sweep(later, Duration::from_secs(10));
        if refused.is_empty() { Ok(()) } else { Err(refused.join("; ")) }
    });
}

/// The job error a coordinator sends in a status's details.
fn valid_job_error() -> proto::JobError {
    proto::JobError { code: proto::ErrorCode::Preempted as i32, message: "task 3: SIGTERM".into(), task: Some(3) }
}

#[test]
fn mutated_statuses_and_heartbeat_events_read_as_errors_saying_what_happened() {
    siphon_fuzz::quiet_panics();
    let details = valid_job_error().encode_to_vec();
    let codes = vec![
        tonic::Code::Aborted,
        tonic::Code::InvalidArgument,
        tonic::Code::Unavailable,
        tonic::Code::Unknown,
        tonic::Code::NotFound,
        tonic::Code::DataLoss,
    ];
    let strategy = (proptest::sample::select(codes), mutations(&details, details.len()), ".{0,40}");
    siphon_fuzz::check("status details", siphon_fuzz::cases(600), strategy, |(code, details, message)| {
        let status = tonic::Status::with_details(*code, message.clone(), details.bytes.clone().into());
        let error = CoordError::from_status(&status);
        let _ = (error.code(), error.is_preemption());
        if error.to_string().trim().is_empty() {
            return Err(String::new());
        }
        // Whether the details read as a job error at all.
        siphon_fuzz::outcome(proto::JobError::decode(&details[..]))
    });

    let event = proto::Event { ack: 0, error: Some(valid_job_error()) }.encode_to_vec();
    siphon_fuzz::check("heartbeat events", siphon_fuzz::cases(600), mutations(&event, event.len()), |bytes| {
        let event = proto::Event::decode(&bytes[..]).map_err(|e| format!("undecodable event: {e}"))?;
        if let Some(job) = &event.error {
            let error = job_error_from_proto(job);
            assert!(matches!(error, CoordError::JobFailed { .. }));
            let _ = (error.to_string(), error.is_preemption(), error.clone().into_job_failure(Some(0)));
        }
        Ok(())
    });
}

/// A rank's canonical config (the compared arguments, version and plugin hash).
fn config() -> Value {
    json!({
        "model": {"path": "/models/qwen3-0.6b", "dtype": "bf16", "layers": 28},
        "hooks": ["blocks.6.hook_resid_post", "blocks.12.hook_mlp_out"],
        "data": {"files": ["a.parquet", "b.parquet"], "column": "text", "seq_len": 1024, "batch": 32},
        "output": "stream://0.0.0.0:7070",
        "version": "0.1.0",
        "plugin_sha256": "4e1f"
    })
}

/// What task 0 publishes for a config.
fn published(config: &Value) -> String {
    let resolved = json!({"run_name": "siphon-20260101-000000-abcd", "start_time": "2026-01-01T00:00:00Z"});
    crate::broadcast::canonical_json(
        &json!({"hash": crate::broadcast::config_hash(config), "compared": config, "resolved": resolved}),
    )
}

/// Reads a publication on task 1, checking what a mismatch's error says.
fn read(bytes: &[u8], ours: &Value) -> Result<(), String> {
    let hash = crate::broadcast::config_hash(ours);
    match crate::broadcast::read_published(bytes, ours, &hash, 1) {
        Ok(_) => Ok(()),
        Err(error) => {
            if let CoordError::ConfigMismatch { fields, .. } = &error {
                let paths: BTreeSet<&str> = fields.iter().map(|f| f.path.as_str()).collect();
                assert_eq!(paths.len(), fields.len(), "each differing field listed once");
            }
            Err(error.to_string())
        }
    }
}

#[test]
fn mutated_published_configs_are_read_or_refused_naming_what_differs() {
    siphon_fuzz::quiet_panics();
    let ours = config();
    let valid = published(&ours);
    read(valid.as_bytes(), &ours).expect("the valid publication reads");
    siphon_fuzz::check(
        "published config (JSON)",
        siphon_fuzz::cases(800),
        siphon_fuzz::json::mutations(&valid),
        |doc| read(doc.text.as_bytes(), &ours),
    );
    siphon_fuzz::check("published config (bytes)", siphon_fuzz::cases(400), mutations(valid.as_bytes(), 64), |bytes| {
        read(bytes, &ours)
    });
    // This rank's own config differs from task 0's in generated ways.
    let text = ours.to_string();
    siphon_fuzz::check("compared config", siphon_fuzz::cases(400), siphon_fuzz::json::mutations(&text), |doc| {
        let mine: Value = serde_json::from_str(&doc.text).map_err(|e| e.to_string())?;
        read(valid.as_bytes(), &mine)
    });
}
