//! A stream served on 127.0.0.1 and read by gRPC clients: the producer starts once every
//! consumer pulls, each consumer gets its batches in order, the producer waits while
//! `buffer` batches are unsent, a consumer that pulls again gets the batches it pulls from,
//! a producer that starts again starts where its consumers stand, and the stream ends for
//! every consumer after the last batch.

use std::time::Duration;

use bytes::Bytes;
use siphon_stream::{Bounds, DescribeRequest, PullRequest, Serving, Start, StreamClient, StreamError, StreamSink};

const LONG: Duration = Duration::from_secs(30);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn open_to_all(buffer: usize, keep: usize) -> Serving {
    Serving { bounds: Bounds { buffer, keep }, token: None, tls: None }
}

fn serve(buffer: usize, keep: usize) -> (StreamSink, String) {
    let sink = StreamSink::serve("127.0.0.1:0", r#"{"run": "test"}"#.into(), open_to_all(buffer, keep)).unwrap();
    let addr = sink.addr().to_string();
    (sink, addr)
}

/// Consumer `consumer` of `consumers`' stream from batch `start` (with the position of the
/// batch before), opened (the server has counted it).
async fn open(
    addr: &str,
    consumer: u32,
    consumers: u32,
    start: u64,
    position: &str,
) -> Result<tonic::Streaming<siphon_stream::Batch>, tonic::Status> {
    let mut client = StreamClient::connect(format!("http://{addr}")).await.unwrap();
    let pull = PullRequest { consumer, consumers, start, position: position.into() };
    Ok(client.pull(pull).await?.into_inner())
}

/// The next `n` batches of `stream` (all of them with `None`), as (index, payload, position).
async fn take(
    stream: &mut tonic::Streaming<siphon_stream::Batch>,
    n: Option<usize>,
) -> Result<Vec<(u64, Bytes, String)>, tonic::Status> {
    let mut out = Vec::new();
    while n.is_none_or(|n| out.len() < n) {
        let Some(batch) = stream.message().await? else { break };
        out.push((batch.index, batch.shard, batch.position));
    }
    Ok(out)
}

fn payload(k: u64) -> Bytes {
    Bytes::from(format!("batch {k}").into_bytes())
}

fn after(k: u64) -> String {
    format!("after {k}")
}

/// Pushes batches `range` and finishes, on a thread of its own.
fn produce(sink: StreamSink, range: std::ops::Range<u64>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        for k in range {
            sink.push(k, payload(k), after(k), LONG).unwrap();
        }
        sink.finish(LONG).unwrap()
    })
}

fn batches(ks: impl IntoIterator<Item = u64>) -> Vec<(u64, Bytes, String)> {
    ks.into_iter().map(|k| (k, payload(k), after(k))).collect()
}

#[test]
fn the_producer_starts_once_every_consumer_pulls_and_each_gets_its_batches_once_in_order() {
    let (sink, addr) = serve(2, 0);
    let early = sink.push(0, payload(0), after(0), LONG).unwrap_err();
    assert!(matches!(early, StreamError::Order(_)) && early.to_string().contains("where the start comes next"));
    let rt = runtime();
    let description = rt.block_on(async {
        let mut client = StreamClient::connect(format!("http://{addr}")).await.unwrap();
        client.describe(DescribeRequest {}).await.unwrap().into_inner().run_json
    });
    assert_eq!(description, r#"{"run": "test"}"#);
    let mut first = rt.block_on(open(&addr, 0, 2, 0, "")).unwrap();
    let alone = sink.start(Duration::from_millis(200)).unwrap_err().to_string();
    assert!(alone.contains("did not start within") && alone.contains("consumer(s) 1 of 2 have not pulled"), "{alone}");
    let second = rt.block_on(open(&addr, 1, 2, 1, "")).unwrap();
    // Consumers that count differently, or a start that is not the consumer's, are refused by name.
    let refused = rt.block_on(open(&addr, 0, 3, 0, "")).unwrap_err();
    assert!(refused.message().contains("read by 2 consumers; the pull says 3"), "{refused:?}");
    let wrong = rt.block_on(open(&addr, 1, 2, 2, "")).unwrap_err();
    assert!(wrong.message().contains("start = consumer mod consumers"), "{wrong:?}");
    assert_eq!(sink.start(LONG).unwrap(), Start { first: 0, resume: None });
    let skipped = sink.push(1, payload(1), after(1), LONG).unwrap_err();
    assert!(skipped.to_string().contains("batch 1 pushed to the stream on") && skipped.to_string().contains("where 0"));
    let producer = produce(sink, 0..9);
    let other = rt.spawn(async move {
        let mut second = second;
        take(&mut second, None).await
    });
    assert_eq!(rt.block_on(take(&mut first, None)).unwrap(), batches((0..9).step_by(2)));
    assert_eq!(rt.block_on(other).unwrap().unwrap(), batches((1..9).step_by(2)));
    assert_eq!(producer.join().unwrap(), 9);
}

#[test]
fn the_producer_waits_for_its_consumers_within_its_patience() {
    let (sink, addr) = serve(2, 0);
    // A consumer that pulled and went away (its connection closed, and seen closed by now):
    // two batches fit, the third waits and gives up.
    let rt = runtime();
    drop(rt.block_on(open(&addr, 0, 1, 0, "")).unwrap());
    drop(rt);
    std::thread::sleep(Duration::from_millis(300));
    sink.start(LONG).unwrap();
    sink.push(0, payload(0), after(0), LONG).unwrap();
    sink.push(1, payload(1), after(1), LONG).unwrap();
    let err = sink.push(2, payload(2), after(2), Duration::from_millis(200)).unwrap_err().to_string();
    assert!(err.contains("no consumer took a batch") && err.contains("2 batches wait"), "{err}");
    let end = sink.finish(Duration::from_millis(200)).unwrap_err().to_string();
    assert!(end.contains("did not end within") && end.contains("consumer 0 of 1 has not taken its last batches"));
    let (nobody, taken) = serve(4, 0);
    let err = nobody.start(Duration::from_millis(200)).unwrap_err().to_string();
    assert!(err.contains("no consumer has pulled"), "{err}");
    let busy = StreamSink::serve(&taken, "{}".into(), open_to_all(1, 0)).err().unwrap().to_string();
    assert!(busy.starts_with(&format!("cannot serve the stream on {taken}")), "{busy}");
}

#[test]
fn a_consumer_that_pulls_again_gets_the_kept_batches_from_where_it_asks() {
    let (sink, addr) = serve(8, 2);
    let rt = runtime();
    let mut first = rt.block_on(open(&addr, 0, 1, 0, "")).unwrap();
    sink.start(LONG).unwrap();
    for k in 0..4 {
        sink.push(k, payload(k), after(k), LONG).unwrap();
    }
    assert_eq!(rt.block_on(take(&mut first, Some(4))).unwrap(), batches(0..4));
    // Restarted from a checkpoint at batch 2: the producer kept batches 2 and 3, not 1.
    let gone = rt.block_on(open(&addr, 0, 1, 1, "")).unwrap_err();
    assert!(gone.message().contains("batch 1 (consumer 0 of 1) is no longer held"), "{gone:?}");
    assert!(gone.message().contains("keeps the last 2 batches it sent. Restart it with the same command"));
    let ahead = rt.block_on(open(&addr, 0, 1, 5, "")).unwrap_err();
    assert!(ahead.message().contains("pulls from batch 5, but was sent none from batch 4 on"), "{ahead:?}");
    let mut again = rt.block_on(open(&addr, 0, 1, 2, &after(1))).unwrap();
    // The earlier pull is over, with an error (never as if its batches had ended).
    let replaced = rt.block_on(first.message()).unwrap_err();
    assert!(replaced.message().contains("consumer 0 of 1 pulled again: a later pull replaced this one"));
    let producer = produce(sink, 4..6);
    assert_eq!(rt.block_on(take(&mut again, None)).unwrap(), batches(2..6));
    assert_eq!(producer.join().unwrap(), 6);
}

#[test]
fn a_producer_that_starts_again_starts_at_the_earliest_batch_its_consumers_need() {
    let (sink, addr) = serve(8, 0);
    let rt = runtime();
    // Consumer 0 had batches up to 2 (next: 4), consumer 1 up to 5 (next: 7).
    let mut zero = rt.block_on(open(&addr, 0, 2, 4, &after(2))).unwrap();
    let mut one = rt.block_on(open(&addr, 1, 2, 7, &after(5))).unwrap();
    // Batch 4 is made from batch 3's start, consumer 0's position; batch 5, which consumer 1
    // has, is not sent again.
    assert_eq!(sink.start(LONG).unwrap(), Start { first: 4, resume: Some((3, after(2))) });
    let producer = produce(sink, 4..10);
    assert_eq!(rt.block_on(take(&mut zero, None)).unwrap(), batches([4, 6, 8]));
    assert_eq!(rt.block_on(take(&mut one, None)).unwrap(), batches([7, 9]));
    assert_eq!(producer.join().unwrap(), 10);
}

#[test]
fn a_producer_that_stops_early_ends_its_consumers_streams_with_an_error() {
    let (sink, addr) = serve(4, 0);
    let rt = runtime();
    let mut stream = rt.block_on(open(&addr, 0, 1, 0, "")).unwrap();
    sink.start(LONG).unwrap();
    sink.push(0, payload(0), after(0), LONG).unwrap();
    assert_eq!(rt.block_on(take(&mut stream, Some(1))).unwrap(), batches([0]));
    // The consumer waits for its next batch; the producer goes away instead.
    let next = rt.spawn(async move { stream.message().await });
    drop(sink);
    let err = rt.block_on(next).unwrap().unwrap_err();
    assert!(err.message().contains("stopped before its last batch"), "{err:?}");
}

/// A CA and a certificate it signed for localhost: (CA PEM, cert PEM, key PEM).
fn make_pki() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string()]).unwrap().signed_by(&key, &ca).unwrap();
    (ca.pem(), cert.pem(), key.serialize_pem())
}

#[test]
fn over_tls_a_reader_needs_the_ca_and_the_job_token() {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity, ServerTlsConfig};
    let (ca, cert, key) = make_pki();
    let serving = Serving {
        bounds: Bounds { buffer: 1, keep: 0 },
        token: Some("job-secret".into()),
        tls: Some(ServerTlsConfig::new().identity(Identity::from_pem(&cert, &key))),
    };
    let sink = StreamSink::serve("127.0.0.1:0", r#"{"run": "tls"}"#.into(), serving).unwrap();
    let port = sink.addr().port();
    let rt = runtime();
    let describe = |tls: bool, token: Option<&'static str>| {
        let ca = ca.clone();
        rt.block_on(async move {
            let scheme = if tls { "https" } else { "http" };
            let mut endpoint = Channel::from_shared(format!("{scheme}://localhost:{port}")).unwrap();
            if tls {
                let config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)).domain_name("localhost");
                endpoint = endpoint.tls_config(config).unwrap();
            }
            let channel = endpoint.connect().await.map_err(|e| e.to_string())?;
            let mut request = tonic::Request::new(DescribeRequest {});
            if let Some(token) = token {
                request.metadata_mut().insert(siphon_stream::TOKEN_HEADER, token.parse().unwrap());
            }
            let reply = StreamClient::new(channel).describe(request).await.map_err(|e| e.message().to_string())?;
            Ok::<String, String>(reply.into_inner().run_json)
        })
    };
    assert_eq!(describe(true, Some("job-secret")).unwrap(), r#"{"run": "tls"}"#);
    assert_eq!(describe(true, None).unwrap_err(), "missing or wrong job token");
    assert_eq!(describe(true, Some("guess")).unwrap_err(), "missing or wrong job token");
    assert!(describe(false, Some("job-secret")).is_err(), "a plaintext reader gets nothing");
}
