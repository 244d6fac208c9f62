//! Generated inputs for the stream's reader of outside bytes: a consumer's `PullRequest`
//! (who it is, how many consumers read the stream, the batch it continues from and the data
//! position before it), decoded from mutated bytes and then taken through everything the host
//! does with it — counting the pull, starting where the consumers stand, holding, sending and
//! forgetting batches, and pulls again once the stream runs. Each must end in a stream or a
//! status saying what is wrong: never a panic, an allocation no pull could justify, or a hang.

use std::sync::{Condvar, Mutex};

use bytes::Bytes;
use proptest::prelude::*;
use prost::Message;
use siphon_fuzz::bytes::{Mutated, edge, mutations};
use tokio::sync::watch;

use super::*;

#[global_allocator]
static ALLOC: siphon_fuzz::Bounded = siphon_fuzz::Bounded::new(256 << 20);

const CONSUMERS: u32 = 3;

/// The valid pull of consumer `c` of 3: a later pull (with the position of its batch before)
/// for consumers 0 and 2, a first one for consumer 1.
fn valid_pull(c: u32) -> PullRequest {
    let start = [3, 1, 8][c as usize];
    let position =
        if start >= u64::from(CONSUMERS) { format!(r#"{{"file":{c},"row":{}}}"#, 100 * start) } else { String::new() };
    PullRequest { consumer: c, consumers: CONSUMERS, start, position }
}

fn shared(buffer: usize, keep: usize) -> Shared {
    Shared {
        state: Mutex::new(State::default()),
        taken: Condvar::new(),
        changed: watch::Sender::new(0),
        bounds: Bounds { buffer, keep },
        description: "{}".into(),
    }
}

/// A pull as generated: bytes (valid, or mutated), or a message with fields at their edges.
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

impl Pull {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Pull::Bytes(mutated) => mutated.bytes.clone(),
            Pull::Fields(pull) => pull.encode_to_vec(),
        }
    }
}

/// `valid` with its fields set to edge values: out-of-range consumers, counts of 0 or
/// billions, starts near `u64::MAX`, positions empty or long.
fn edge_pull(valid: &PullRequest) -> impl Strategy<Value = Pull> + use<> {
    let position = prop_oneof![
        2 => Just(valid.position.clone()),
        1 => Just(String::new()),
        1 => Just("9".repeat(1 << 16)),
    ];
    let (consumer, consumers, start) = (valid.consumer, valid.consumers, valid.start);
    (edge(consumer.into(), u32::MAX.into()), edge(consumers.into(), u32::MAX.into()), edge(start, u64::MAX), position)
        .prop_map(|(consumer, consumers, start, position)| {
            Pull::Fields(PullRequest { consumer: consumer as u32, consumers: consumers as u32, start, position })
        })
}

/// A pull's bytes: the valid encoding of `valid`, a mutation of those bytes, or the encoding
/// of `valid` with fields at their edges.
fn pull_bytes(valid: &PullRequest) -> impl Strategy<Value = Pull> + use<> {
    let bytes = valid.encode_to_vec();
    prop_oneof![
        3 => Just(Pull::Bytes(Mutated { ops: Vec::new(), bytes: bytes.clone() })),
        1 => mutations(&bytes, bytes.len()).prop_map(Pull::Bytes),
        1 => edge_pull(valid),
    ]
}

/// A pull decoded and counted: its consumer and number among the consumer's pulls.
fn join(shared: &Shared, bytes: &[u8]) -> Result<(u32, u64), String> {
    let pull = PullRequest::decode(bytes).map_err(|e| format!("undecodable pull: {e}"))?;
    let number = shared.join(&pull).map_err(|status| status.message().to_string())?;
    Ok((pull.consumer, number))
}

/// Takes what each consumer's latest pull is sent now; checks each batch is the consumer's.
fn deliver(shared: &Shared, pulls: &BTreeMap<u32, u64>, errors: &mut Vec<String>) {
    for (&consumer, &number) in pulls {
        for _ in 0..64 {
            match shared.next(consumer, number) {
                Next::Send(batch) => {
                    let n = shared.lock().next.len() as u64;
                    assert_eq!(
                        batch.index % n,
                        u64::from(consumer),
                        "batch {} sent to consumer {consumer}",
                        batch.index
                    );
                }
                Next::Fail(status) => {
                    errors.push(status.message().to_string());
                    break;
                }
                Next::End | Next::Wait => break,
            }
        }
    }
}

/// The host's side of one run: the consumers' first pulls (`first`), the start, six batches
/// made (sent as the consumers take them), pulls again (`later`) and the end.
fn run(first: &[&[u8]], later: &[&[u8]]) -> Result<(), String> {
    let shared = shared(2, 1);
    let mut errors = Vec::new();
    let mut pulls = BTreeMap::new();
    for bytes in first {
        match join(&shared, bytes) {
            Ok((consumer, number)) => _ = pulls.insert(consumer, number),
            Err(e) => errors.push(e),
        }
    }
    if !shared.lock().all_joined() {
        errors.push("not every consumer pulled".into());
        return Err(errors.join("; "));
    }
    let start = shared.lock().begin();
    if let Some((at, _)) = &start.resume {
        assert!(*at <= start.first, "resumes at batch {at} after the first batch {}", start.first);
    }
    for (i, index) in (0..6).map_while(|i| start.first.checked_add(i)).enumerate() {
        while shared.lock().unsent() >= shared.bounds.buffer {
            let before = shared.lock().unsent();
            deliver(&shared, &pulls, &mut errors);
            if shared.lock().unsent() == before {
                // No consumer takes its batches any more (its pull was replaced): the producer
                // would wait out its patience here.
                errors.push("stalled".into());
                return Err(errors.join("; "));
            }
        }
        shared.lock().add(index, Held { shard: Bytes::from_static(b"shard"), position: format!("after {index}") });
        if let Some(bytes) = later.get(i) {
            match join(&shared, bytes) {
                Ok((consumer, number)) => _ = pulls.insert(consumer, number),
                Err(e) => errors.push(e),
            }
        }
        deliver(&shared, &pulls, &mut errors);
    }
    shared.lock().finished = true;
    deliver(&shared, &pulls, &mut errors);
    if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
}

#[test]
fn mutated_pulls_get_a_stream_or_a_status_naming_the_problem() {
    siphon_fuzz::quiet_panics();
    let valid: Vec<PullRequest> = (0..CONSUMERS).map(valid_pull).collect();
    let encoded: Vec<Vec<u8>> = valid.iter().map(Message::encode_to_vec).collect();
    let first: Vec<&[u8]> = encoded.iter().map(Vec::as_slice).collect();
    run(&first, &[]).expect("the valid pulls start a stream");
    let strategy = (
        pull_bytes(&valid[0]),
        pull_bytes(&valid[1]),
        pull_bytes(&valid[2]),
        proptest::collection::vec(
            prop_oneof![pull_bytes(&valid[0]), pull_bytes(&valid[1]), pull_bytes(&valid[2])],
            0..3,
        ),
    );
    siphon_fuzz::check("stream pull", siphon_fuzz::cases(1500), strategy, |(a, b, c, later)| {
        let first = [a.bytes(), b.bytes(), c.bytes()];
        let later: Vec<Vec<u8>> = later.iter().map(Pull::bytes).collect();
        let first: Vec<&[u8]> = first.iter().map(Vec::as_slice).collect();
        run(&first, &later.iter().map(Vec::as_slice).collect::<Vec<_>>())
    });
}

/// Found by the test above: a pull saying the stream has 4294967295 consumers made the host
/// allocate a slot for each (128 GiB) before anyone else pulled.
#[test]
fn a_pull_naming_four_billion_consumers_is_refused() {
    let shared = shared(2, 1);
    let pull = PullRequest { consumer: 1, consumers: u32::MAX, start: 1, position: String::new() };
    let status = shared.join(&pull).unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("at most 65536 consumers"), "{}", status.message());
}

/// Found by the test above: a pull from batch `u64::MAX` started the producer there, and the
/// index after it overflowed (a panic in the producer, or batch 0 again in a release build).
#[test]
fn a_pull_from_the_last_u64_batch_is_refused() {
    let shared = shared(2, 1);
    let pull = PullRequest { consumer: 0, consumers: 1, start: u64::MAX, position: "{}".into() };
    let status = shared.join(&pull).unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("batch indices stop below"), "{}", status.message());
}
