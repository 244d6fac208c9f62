//! Generated inputs through a real server on 127.0.0.1: gRPC frames whose body is a mutated
//! `PullRequest` (its bytes mutated, or its fields set to edge values), sent as raw bytes to
//! a stream's `Pull`. Each gets a stream or a status with
//! a message, and the server goes on answering (`Describe`) after every one.

use std::time::Duration;

use proptest::prelude::*;
use prost::Message;
use siphon_fuzz::bytes::{Mutated, edge, mutations};
use siphon_fuzz::grpc::{Raw, broken};
use siphon_stream::{Bounds, PullRequest, Serving, StreamSink};
use tonic::Status;
use tonic::codegen::http::uri::PathAndQuery;

#[global_allocator]
static ALLOC: siphon_fuzz::Bounded = siphon_fuzz::Bounded::new(256 << 20);

/// A pull as generated: mutated bytes, or a message with fields at their edges.
#[derive(Clone)]
enum Pull {
    Bytes(Mutated),
    Fields(PullRequest),
}

impl std::fmt::Debug for Pull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pull::Bytes(mutated) => mutated.fmt(f),
            Pull::Fields(p) => write!(
                f,
                "PullRequest {{ consumer: {}, consumers: {}, start: {}, position: {} bytes }}",
                p.consumer,
                p.consumers,
                p.start,
                p.position.len()
            ),
        }
    }
}

/// Consumer 0 of 3's first pull: its bytes mutated, or its fields at their edges.
fn pulls() -> impl Strategy<Value = Pull> {
    let valid = PullRequest { consumer: 0, consumers: 3, start: 0, position: String::new() };
    let bytes = valid.encode_to_vec();
    let position =
        prop_oneof![Just(String::new()), Just(r#"{"file":0,"row":300}"#.to_string()), Just("9".repeat(1 << 16))];
    let max = u64::from(u32::MAX);
    let fields =
        (edge(0, max), edge(3, max), edge(0, u64::MAX), position).prop_map(|(consumer, consumers, start, position)| {
            Pull::Fields(PullRequest { consumer: consumer as u32, consumers: consumers as u32, start, position })
        });
    prop_oneof![mutations(&bytes, bytes.len()).prop_map(Pull::Bytes), fields]
}

/// Calls `path` on `channel` with `body` as the request's bytes; a server-streaming call
/// answers once the stream opens.
async fn call(
    channel: &tonic::transport::Channel,
    path: &'static str,
    body: Vec<u8>,
    streaming: bool,
) -> Result<Vec<u8>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    let path = PathAndQuery::from_static(path);
    let call = async {
        if streaming {
            grpc.server_streaming(tonic::Request::new(body), path, Raw).await.map(|_| Vec::new())
        } else {
            grpc.unary(tonic::Request::new(body), path, Raw).await.map(|r| r.into_inner())
        }
    };
    tokio::time::timeout(Duration::from_secs(5), call).await.map_err(|_| Status::deadline_exceeded("no answer"))?
}

/// Each case pulls first from a stream of its own: the first pull fixes the consumers' count.
#[test]
fn raw_mutated_pulls_get_a_stream_or_a_status_and_the_server_stays_up() {
    siphon_fuzz::quiet_panics();
    siphon_fuzz::check("raw pulls", siphon_fuzz::cases(200), pulls(), |pull| {
        let body = match pull {
            Pull::Bytes(mutated) => mutated.bytes.clone(),
            Pull::Fields(pull) => pull.encode_to_vec(),
        };
        let serving = Serving { bounds: Bounds { buffer: 2, keep: 1 }, token: None, tls: None };
        let sink = StreamSink::serve("127.0.0.1:0", r#"{"run":"generated"}"#.into(), serving).unwrap();
        // A runtime of the case's own: dropped, it closes the connection, so the server
        // stops at once rather than after its grace period.
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (outcome, alive) = runtime.block_on(async {
            let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", sink.addr())).unwrap();
            let channel = endpoint.connect().await.unwrap();
            let outcome = call(&channel, "/siphon.stream.Stream/Pull", body, true).await;
            (outcome, call(&channel, "/siphon.stream.Stream/Describe", Vec::new(), false).await)
        });
        drop(runtime);
        drop(sink);
        let described = alive.unwrap_or_else(|status| panic!("the server stopped answering: {status:?}"));
        assert!(!described.is_empty(), "an empty description");
        match outcome {
            Ok(_) => Ok(()),
            Err(status) if broken(&status) => {
                panic!("the pull broke the call: {status:?}")
            }
            Err(status) => Err(status.message().to_string()),
        }
    });
}
