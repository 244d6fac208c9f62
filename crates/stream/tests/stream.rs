//! A stream served on 127.0.0.1 and read by gRPC clients: each consumer gets its batches in
//! order and once, the producer waits while `capacity` batches are unsent, and the stream
//! ends for every consumer after the last batch.

use std::time::Duration;

use bytes::Bytes;
use siphon_stream::{DescribeRequest, PullRequest, StreamClient, StreamError, StreamSink};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Consumer `consumer` of `consumers`' stream, opened (the server has counted it).
async fn open(
    addr: &str,
    consumer: u32,
    consumers: u32,
) -> Result<tonic::Streaming<siphon_stream::Batch>, tonic::Status> {
    let mut client = StreamClient::connect(format!("http://{addr}")).await.unwrap();
    Ok(client.pull(PullRequest { consumer, consumers }).await?.into_inner())
}

/// Every batch of `stream`, as (index, payload).
async fn drain(mut stream: tonic::Streaming<siphon_stream::Batch>) -> Result<Vec<(u64, Bytes)>, tonic::Status> {
    let mut out = Vec::new();
    while let Some(batch) = stream.message().await? {
        out.push((batch.index, batch.shard));
    }
    Ok(out)
}

fn payload(k: u64) -> Bytes {
    Bytes::from(format!("batch {k}").into_bytes())
}

#[test]
fn two_consumers_get_every_batch_once_in_order_and_the_producer_waits_for_them() {
    let sink = StreamSink::serve("127.0.0.1:0", r#"{"run": "test"}"#.into(), 2).unwrap();
    let addr = sink.addr().to_string();
    // Nobody pulls yet: two batches fit, the third waits and gives up.
    sink.push(payload(0), Duration::from_secs(1)).unwrap();
    sink.push(payload(1), Duration::from_secs(1)).unwrap();
    let err = sink.push(payload(2), Duration::from_millis(200)).unwrap_err();
    assert!(matches!(err, StreamError::Stalled(_)) && err.to_string().contains("no consumer has connected"), "{err}");
    let rt = runtime();
    let description = rt.block_on(async {
        let mut client = StreamClient::connect(format!("http://{addr}")).await.unwrap();
        client.describe(DescribeRequest {}).await.unwrap().into_inner().run_json
    });
    assert_eq!(description, r#"{"run": "test"}"#);
    let streams: Vec<_> = (0..2).map(|c| rt.block_on(open(&addr, c, 2)).unwrap()).collect();
    // A consumer that counts differently is refused by name.
    let refused = rt.block_on(open(&addr, 0, 3)).unwrap_err();
    assert!(refused.message().contains("read by 2 consumers; the pull says 3"), "{refused:?}");
    let consumers: Vec<_> = streams.into_iter().map(|s| rt.spawn(drain(s))).collect();
    let producer = std::thread::spawn(move || {
        for k in 2..9 {
            sink.push(payload(k), Duration::from_secs(30)).unwrap();
        }
        sink.finish(Duration::from_secs(30)).unwrap()
    });
    let got: Vec<Vec<(u64, Bytes)>> = consumers.into_iter().map(|c| rt.block_on(c).unwrap().unwrap()).collect();
    assert_eq!(producer.join().unwrap(), 9);
    for (c, batches) in got.iter().enumerate() {
        let want: Vec<(u64, Bytes)> = (0..9).filter(|k| k % 2 == c as u64).map(|k| (k, payload(k))).collect();
        assert_eq!(batches, &want, "consumer {c}");
    }
}

#[test]
fn a_stream_nobody_reads_ends_with_an_error_naming_it() {
    let sink = StreamSink::serve("127.0.0.1:0", "{}".into(), 4).unwrap();
    sink.push(payload(0), Duration::from_secs(1)).unwrap();
    let err = sink.finish(Duration::from_millis(200)).unwrap_err().to_string();
    assert!(err.contains("did not end within") && err.contains("no consumer has connected"), "{err}");
    let taken = StreamSink::serve("127.0.0.1:0", "{}".into(), 4).unwrap();
    let busy = StreamSink::serve(&taken.addr().to_string(), "{}".into(), 4).err().unwrap().to_string();
    assert!(busy.starts_with(&format!("cannot serve the stream on {}", taken.addr())), "{busy}");
}

#[test]
fn a_producer_that_stops_early_ends_its_consumers_streams_with_an_error() {
    let sink = StreamSink::serve("127.0.0.1:0", "{}".into(), 4).unwrap();
    let addr = sink.addr().to_string();
    sink.push(payload(0), Duration::from_secs(1)).unwrap();
    let rt = runtime();
    let mut stream = rt.block_on(open(&addr, 0, 1)).unwrap();
    assert_eq!(rt.block_on(stream.message()).unwrap().unwrap().index, 0);
    // The consumer waits for its next batch; the producer goes away instead.
    let next = rt.spawn(async move { stream.message().await });
    drop(sink);
    let err = rt.block_on(next).unwrap().unwrap_err();
    assert!(err.message().contains("stopped before its last batch"), "{err:?}");
}
