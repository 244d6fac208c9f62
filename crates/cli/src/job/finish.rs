//! After the loop, phase 9: each writing member commits its last shard and records its
//! timing (or, preempted, commits only the shards its pushed batches complete and stops with
//! [`Preempted`]); a live stream ends for its readers; then the completion barrier, the merge
//! of every host's statistics on host 0, and the shutdown barrier.

use anyhow::Context;
use siphon_store::{HostId, ShardWriter};

use super::steps::Ended;
use super::{BARRIER_TIMEOUT, Job, output, timing};
use crate::outcome::Preempted;

/// Ends this host's part of the job; `streaming` when the output is a live stream.
pub fn finish(job: &Job, ended: Ended, streaming: bool) -> anyhow::Result<()> {
    let Job { coord, host, spec, run: run_name, options } = *job;
    let Ended { sinks, path, preempted, mut progress, started } = ended;
    crate::fatal::enter(crate::fatal::Phase::Commit);
    let mut writing: Vec<(HostId, ShardWriter, u64)> = Vec::new();
    for sink in sinks {
        match sink.writer {
            Some((output::Output::Shards(writer), resumed)) => writing.push((sink.host, writer, resumed)),
            // Preempted, the stream ends with an error for its consumers (the sink dropped).
            Some((output::Output::Stream(streamed), _)) if !preempted => {
                let batches = streamed.finish()?;
                tracing::info!(batches, seconds = started.elapsed().as_secs_f64(), "stream finished");
            }
            _ => {}
        }
    }
    if preempted {
        // Commit the shards the pushed batches complete; the partial one is redone on resume.
        coord.stop_signal().start_deadline();
        let why = coord.job_error().map_or_else(|| "received SIGTERM".to_string(), |e| e.to_string());
        tracing::warn!(reason = %why, "preempted: committing the complete shards, then exiting");
        let mut shards = 0;
        for (_, writer, _) in writing {
            let summary = writer.stop().context("preempted, and committing the complete shards failed")?;
            shards += summary.shards;
        }
        tracing::info!(shards, seconds = started.elapsed().as_secs_f64(), "host stopped (preempted)");
        return Err(anyhow::Error::new(Preempted { message: why, shards: Some(shards) }));
    }
    for (host, writer, resumed) in writing {
        let summary = writer.finish()?;
        progress.finish(&summary);
        let seconds = started.elapsed().as_secs_f64();
        tracing::info!(
            host = host.host,
            shards = summary.shards,
            tokens = summary.tokens,
            kept = summary.included_tokens,
            seconds,
            program_seconds = path.program_s,
            bound = %path.bound(),
            "host finished"
        );
        let timing = timing::HostTiming {
            host: host.dir_name(),
            tokens: summary.tokens.saturating_sub(resumed),
            seconds,
            compute_seconds: path.program_s,
            depth: options.pipeline_depth,
            path,
            writer: summary.timing,
        };
        timing::write_timing(&spec.output, run_name, host, &timing).context("cannot write the host's timing")?;
    }

    // Completion, statistics, shutdown.
    coord.barrier("complete", BARRIER_TIMEOUT)?;
    if host.host == 0 && !streaming {
        siphon_store::finalize_run(&spec.output, &[], run_name).context("cannot merge the hosts' statistics")?;
        tracing::info!(output = %spec.output, run = %run_name, "dataset complete");
    }
    coord.shutdown(BARRIER_TIMEOUT)?;
    Ok(())
}
