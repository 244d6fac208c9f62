//! Phase 8, the loop: each step reads every member's next batch, agrees with the other
//! processes whether any reader still has one (a vote through the coordinator when the mesh
//! spans processes), takes a free slot of host buffers and launches the program; the
//! pipeline's drain thread copies and writes it while the next step runs. It stops when no
//! reader has a batch, at the token budget, on SIGTERM or another host's preemption, and fails
//! at once when another host failed.

use std::time::{Duration, Instant};

use anyhow::Context;
use siphon_coord::Coordination;

use super::compute::Compute;
use super::progress::Progress;
use super::resume::{Lane, Resumed};
use super::{BARRIER_TIMEOUT, Job, RunSpec, output, pipeline};

/// How the loop ended: the sinks back from the pipeline, and what the host reports.
pub struct Ended {
    pub sinks: Vec<pipeline::Sink>,
    pub path: pipeline::PathTiming,
    /// Stopped by SIGTERM or another host's preemption, not by the end of the corpus.
    pub preempted: bool,
    pub progress: Progress,
    pub started: Instant,
}

/// The batches each reader runs under `--max-tokens` (whole batches of `rows` sequences), if
/// it is given.
pub fn budget_batches(spec: &RunSpec, partition: siphon_data::Partition, rows: usize) -> Option<u64> {
    spec.max_tokens.map(|tokens| {
        let per_worker = tokens.div_ceil(partition.workers());
        per_worker.div_ceil((rows * spec.corpus.seq_len) as u64)
    })
}

/// Runs the steps until the corpus slice, the budget or a stop ends them.
pub fn run(
    job: &Job,
    compute: &Compute,
    resumed: Resumed,
    mut documents: Option<super::documents::Documents>,
) -> anyhow::Result<Ended> {
    let Job { coord, host, spec, run: run_name, options } = *job;
    let Resumed { mut lanes, sinks, committed_tokens, latents, partition, .. } = resumed;
    let budget_batches = budget_batches(spec, partition, compute.reader_rows());
    let mut progress = Progress::new(
        host,
        budget_batches.map(|b| b.saturating_mul((compute.reader_rows() * spec.corpus.seq_len) as u64)),
    );
    progress.resumed(committed_tokens);
    // The output path: `--pipeline-depth` steps' worth of reused host buffers (pipeline.rs).
    let sizes = compute.slot_sizes(spec.corpus.seq_len);
    let slots = (0..options.pipeline_depth)
        .map(|_| pipeline::Slot::new(&sizes, |n| compute.host_buffer(n)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    tracing::info!(
        depth = slots.len(),
        bytes_per_step = sizes.iter().flatten().sum::<usize>(),
        pinned = slots.first().is_some_and(pipeline::Slot::pinned),
        "host buffers ready"
    );
    let writes = sinks.iter().any(|sink| sink.writer.is_some());
    let batches = pipeline::Batches {
        dtype: compute.output_dtype(),
        shapes: compute.hook_shapes(spec.corpus.seq_len),
        roles: spec.chat_template.is_some(),
        pooled: spec.positions.as_ref().is_some_and(siphon_data::Positions::pools),
        latents,
        outputs: super::next_token::columns(spec.outputs, compute.dictionaries()),
        allow_non_finite: spec.allow_non_finite,
    };
    // The writers keep rows where they lie until their shards are uploaded: the pool grows by
    // what they may hold.
    let held_steps = sinks
        .iter()
        .zip(&sizes)
        .filter_map(|(sink, member)| match &sink.writer {
            Some((output::Output::Shards(writer), _)) => {
                let (batches, bytes) = writer.holds_at_most();
                // A step of no hook rows (a dictionary's latents alone) lends the writer nothing.
                let held = match member.iter().sum::<usize>() as u64 {
                    0 => 0,
                    step => bytes.div_ceil(step) as usize,
                };
                Some(batches + held + 1)
            }
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let mut pipeline = pipeline::Pipeline::start(slots, options.pipeline_depth + held_steps, sinks, batches)?;
    let started = Instant::now();
    // Test hook: slows the loop down so that tests can kill a host mid-run.
    let slow_batch =
        std::env::var("SIPHON_TEST_SLOW_BATCH_MS").ok().and_then(|v| v.parse().ok()).map(Duration::from_millis);
    // From here SIGTERM stops the loop instead of the process (see siphon_coord::stop).
    let stop = coord.stop_signal();
    stop.arm();
    let mut preempted = false;
    let mut unchosen = Unchosen::default();
    crate::fatal::enter(crate::fatal::Phase::Step);
    for step in 0u64.. {
        crate::fatal::set_step(step);
        if let Some(delay) = slow_batch {
            std::thread::sleep(delay);
        }
        if let Some(err) = coord.job_error()
            && !err.is_preemption()
        {
            return Err(anyhow::Error::new(err).context("another host failed"));
        }
        if stop.requested() || coord.preempted() {
            preempted = true;
            break;
        }
        let mut batches = Vec::with_capacity(lanes.len());
        for lane in &mut lanes {
            let batch = match lane.done {
                true => None,
                false => lane.next()?,
            };
            let batch = batch.filter(|b| budget_batches.is_none_or(|limit| b.index < limit));
            lane.done = batch.is_none();
            batches.push(batch);
        }
        match step_vote(coord, compute, run_name, step, &lanes, &batches) {
            Ok(true) => {}
            Ok(false) => break,
            Err(_) if coord.preempted() => {
                preempted = true;
                break;
            }
            Err(err) => return Err(err),
        }
        // A slot frees up when the writers have taken an earlier step; if the output path
        // failed instead, its error is the job's.
        let more = || pipeline::Slot::new(&sizes, |n| compute.host_buffer(n)).context("host buffers for one more step");
        let slot = match pipeline.slot(more) {
            Ok(slot) => slot,
            Err(err) if pipeline.running() => return Err(err),
            Err(_) => return Err(output_path_failed(pipeline)),
        };
        let launched_at = Instant::now();
        let fed: Vec<Option<&siphon_data::Batch>> = batches.iter().map(Option::as_ref).collect();
        let chosen = compute.choose(&fed);
        for (lane, chosen) in lanes.iter().zip(&chosen) {
            if let Some(chosen) = chosen.as_ref().filter(|_| lane.member.writes) {
                unchosen.count(chosen);
            }
        }
        let launched = compute.launch(&fed, &chosen)?;
        // The kept columns of the documents each writing member stores rows of.
        let mut kept = Vec::with_capacity(lanes.len());
        for ((lane, batch), chosen) in lanes.iter().zip(&fed).zip(&chosen) {
            kept.push(match (&mut documents, batch) {
                (Some(documents), Some(batch)) if lane.member.writes => {
                    documents.of(super::documents::stored(batch, chosen.as_ref(), spec.keep_excluded))?
                }
                _ => Vec::new(),
            });
        }
        // Progress counts what this process writes, or, writing nothing, what it feeds.
        let bound = pipeline.timing().bound();
        for ((lane, batch), process) in lanes.iter().zip(&batches).zip(0..) {
            if let Some(batch) = batch
                && (lane.member.writes || (!writes && process == 0))
            {
                progress.batch((batch.len() * batch.seq_len) as u64, bound);
            }
        }
        if pipeline.send(pipeline::Step { launched, slot, batches, chosen, documents: kept, launched_at }).is_err() {
            return Err(output_path_failed(pipeline));
        }
    }
    unchosen.report();
    // Every step in flight reaches its writers first.
    tracing::info!(slots = pipeline.slots(), "host buffers used (steps' worth)");
    let (sinks, path) = pipeline.finish()?;
    Ok(Ended { sinks, path, preempted, progress, started })
}

/// Whether any member of the job still has a batch for step `step`. Within a host (hosts
/// data-parallel, or every simulated host in this process) that is known here; on a mesh
/// spanning processes every process must enter the step or none, so each votes through the
/// coordinator with its batch's fingerprint (or none) and reads every other process's vote:
/// processes of one reader must hold the same batch. The same check runs on this process's
/// members (simulated hosts of one reader read their slice separately).
fn step_vote(
    coord: &Coordination,
    compute: &Compute,
    run: &str,
    step: u64,
    lanes: &[Lane],
    batches: &[Option<siphon_data::Batch>],
) -> anyhow::Result<bool> {
    let fingerprint =
        |b: &Option<siphon_data::Batch>| b.as_ref().map(|b| format!("{}:{:016x}", b.index, fingerprint(&b.tokens)));
    let mut votes: Vec<(u32, u32, Option<String>)> =
        lanes.iter().zip(batches).map(|(l, b)| (l.member.process, l.member.reader, fingerprint(b))).collect();
    if compute.spans_processes() {
        let me = coord.process_id();
        let machine = coord.identity().machine_id;
        let key = |step: u64, process: u32| format!("step/{run}/{machine}/{step}/{process}");
        coord.kv_set(&key(step, me), serde_json::to_vec(&votes[0].2)?.as_slice(), true)?;
        for (process, &reader) in compute.reader_of().iter().enumerate() {
            let process = process as u32;
            if process != me {
                let vote: Option<String> =
                    serde_json::from_slice(&coord.kv_get(&key(step, process), BARRIER_TIMEOUT)?)?;
                votes.push((process, reader, vote));
            }
        }
        // Every process read step - 1's votes before voting on this one.
        if step >= 2 {
            coord.kv_delete(&key(step - 2, me))?;
        }
    }
    count_votes(step, &votes)
}

/// Whether any vote `(process, reader, batch fingerprint)` of step `step` holds a batch; an
/// error when two processes of one reader hold different batches.
fn count_votes(step: u64, votes: &[(u32, u32, Option<String>)]) -> anyhow::Result<bool> {
    for (i, (process, reader, vote)) in votes.iter().enumerate() {
        if let Some((other, _, theirs)) = votes[..i].iter().find(|(_, r, v)| r == reader && v != vote) {
            anyhow::bail!(
                "collective desync at step {step}: hosts {other} and {process} read the same corpus slice but hold \
                 different batches ({theirs:?} and {vote:?})"
            );
        }
    }
    Ok(votes.iter().any(|(_, _, v)| v.is_some()))
}

/// FNV-1a over token ids: a batch's fingerprint in a step vote.
fn fingerprint(tokens: &[u32]) -> u64 {
    tokens
        .iter()
        .flat_map(|t| t.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// Why the output path stopped taking steps: the drain thread's error (a copy or a writer
/// failed).
fn output_path_failed(pipeline: pipeline::Pipeline) -> anyhow::Error {
    match pipeline.finish() {
        Err(err) => err.context("writing the activations failed"),
        Ok(_) => anyhow::anyhow!("the output path stopped taking steps"),
    }
}

/// The documents `--positions` gave no row, counted and the first few named in the log: those
/// without `after:`'s marker and those not whole in their row.
#[derive(Default)]
struct Unchosen {
    without_marker: u64,
    cut: u64,
}

impl Unchosen {
    /// The documents named in the log, of each kind.
    const NAMED: u64 = 10;

    fn count(&mut self, chosen: &siphon_data::Selection) {
        let name = |doc: i64| format!("unit {} record {}", doc >> 32, doc & 0xffff_ffff);
        for &doc in &chosen.without_marker {
            if self.without_marker < Self::NAMED {
                tracing::warn!(document = %name(doc), "--positions after: the marker never occurs: no row");
            }
            self.without_marker += 1;
        }
        for &doc in &chosen.cut {
            if self.cut < Self::NAMED {
                tracing::warn!(document = %name(doc), "--positions: the document is not whole in its row (longer than --seq-len): no row");
            }
            self.cut += 1;
        }
    }

    fn report(&self) {
        if self.without_marker + self.cut > 0 {
            tracing::warn!(
                without_marker = self.without_marker,
                not_whole = self.cut,
                "--positions: documents that gave no row (the first {} of each named above)",
                Self::NAMED
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_runs_while_any_reader_has_a_batch_and_a_desync_stops_it() {
        let vote = |p, r, v: Option<&str>| (p, r, v.map(str::to_string));
        // Reader 0 (hosts 0, 1) is done, reader 1 (hosts 2, 3) is not: the step runs.
        let votes = [vote(0, 0, None), vote(1, 0, None), vote(2, 1, Some("7:ab")), vote(3, 1, Some("7:ab"))];
        assert!(count_votes(7, &votes).unwrap());
        assert!(!count_votes(8, &[vote(0, 0, None), vote(1, 1, None)]).unwrap());
        // Host 3 read another batch than host 2.
        let votes = [vote(2, 1, Some("7:ab")), vote(3, 1, Some("7:cd")), vote(0, 0, Some("7:ab"))];
        let err = count_votes(7, &votes).unwrap_err().to_string();
        assert!(err.contains("collective desync at step 7: hosts 2 and 3"), "{err}");
        // One host of a reader done, the other not: a desync too.
        assert!(count_votes(9, &[vote(0, 0, Some("9:ab")), vote(1, 0, None)]).is_err());
    }
}
