//! The extraction job that `siphon extract` runs on every host.
//!
//! The phases, each only after the previous one succeeded, and every check that can fail
//! cheaply before anything expensive, with the module that holds each:
//!
//! | phase | module |
//! |---|---|
//! | 1. identity | here ([`run`]) |
//! | 2. validation and plan: model config, hooks, dictionaries, corpus listing, mesh | here, [`options`], [`dictionary`], [`plan`], [`fits`] |
//! | 3. coordinator | here |
//! | 4. config broadcast and hash check; the run's name | [`agree`] |
//! | 5–6. plugin and client, model on the mesh | [`compute`] |
//! | 7. outputs and resume points, published by every host | [`resume`] (outputs in [`output`]) |
//! | 8. the loop | [`steps`] (the output path in [`pipeline`], reports in [`progress`]) |
//! | 9. last shards, completion barrier, stats merge, shutdown barrier | [`finish`] ([`timing`]) |
//!
//! Hosts are data-parallel: each reads its own part of the corpus and writes its own shards,
//! so the loop never waits for another host. Hosts meet only at start-up, at the end, and
//! through the coordinator's error watch, which the loop polls every batch so that one
//! failed host stops the others at once.
//!
//! Unless the mesh spans hosts (a model larger than one): then every step is one program over
//! every host's devices. The corpus is partitioned over readers (the processes holding the
//! same data groups read one slice together, and the lowest of them writes its rows), and
//! before each step the processes vote through the coordinator whether any reader still has
//! a batch, each vote carrying its batch's fingerprint: every host enters each step with the
//! same step index, and processes of one reader that read different batches stop the job
//! (the seeds' "collective desync", caught instead of hanging).
//!
//! Preemption: SIGTERM (or another host's preemption, learned through the coordinator) stops
//! the loop before its next batch; the writer commits the shards the pushed batches complete
//! and drops the partial one (`ShardWriter::stop`), and the host exits with
//! `siphon_coord::EXIT_PREEMPTED` ([`Preempted`]). The stop timeout bounds it all; the same
//! command resumes after the last committed shard.

mod agree;
mod compute;
pub(crate) mod dictionary;
mod documents;
pub(crate) mod fetch;
mod finish;
pub(crate) mod fits;
mod next_token;
mod options;
mod output;
mod pipeline;
mod plan;
pub mod progress;
mod resume;
mod steps;
mod timing;

use std::time::Duration;

use anyhow::Context;

use siphon_coord::{Coordination, JoinOptions};
use siphon_store::HostId;

pub use options::{ExtractOptions, RunSpec, check_run_name};
pub use timing::{HostTiming, read_timing};

use crate::outcome::Preempted;
use compute::Compute;
use resume::Reading;

/// How long hosts wait for each other at the barriers around the loop.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(600);

/// `--positions after:TEXT`'s marker as the tokenizer reads it (no special tokens added):
/// each token's id and text, as run.json states them; a text of no tokens is refused.
fn marker_tokens(tokenizer: &siphon_data::Tokenizer, text: &str) -> anyhow::Result<Vec<(u32, String)>> {
    let encoding = tokenizer
        .encode(text, false)
        .map_err(|e| anyhow::anyhow!("--positions after:{text}: cannot tokenize the marker: {e}"))?;
    let tokens: Vec<(u32, String)> =
        encoding.get_ids().iter().zip(encoding.get_tokens()).map(|(&id, t)| (id, t.clone())).collect();
    if tokens.is_empty() {
        anyhow::bail!("--positions after:{text}: the marker is no token at all");
    }
    tracing::info!(marker = ?tokens, "--positions after: the marker's tokens (a document holding them in this order gives a row)");
    Ok(tokens)
}

/// Runs the job on this host.
pub fn run(options: ExtractOptions) -> anyhow::Result<()> {
    // 1. Identity.
    let identity = options.cluster.identity()?;
    let host = HostId { machine: identity.machine_id, host: identity.process_id };
    crate::fatal::set_host(host.machine, host.host);
    let _span = tracing::info_span!("host", m = host.machine, h = host.host).entered();

    // 2. Validation and plan, before anything expensive.
    crate::fatal::enter(crate::fatal::Phase::Load);
    let model_spec = options.model.clone().context("missing --model (or `model` in the --config file)")?;
    let model_path = fetch::local_model_path(&model_spec)
        .with_context(|| format!("cannot fetch the model {}", model_spec.display()))?;
    let model = siphon_models::LoadedModel::open(&model_path)
        .with_context(|| format!("cannot open the model {}", model_path.display()))?;
    let mut spec = options.resolve(Some(&model.config), identity.total_machines)?;
    let dictionaries = dictionary::open_capped(&options.dictionaries, &model.config)?;
    let (steering, records) = crate::args::steer::open_all(&options.steer, &model.config)?;
    spec.steering = records;
    let fingerprints: Vec<String> = dictionaries.iter().map(|d| dictionary::fingerprint(&d.dictionary)).collect();
    let corpus = options.corpus.open()?;
    let tokenizer = plan::tokenizer(&model, spec.tokenizer.as_deref())?;
    let text_tokenizer = model.tokenizer.as_ref();
    let chat = options.corpus.chat(
        &corpus,
        text_tokenizer.and_then(|t| t.chat_template.as_deref()),
        text_tokenizer.map_or(&[][..], |t| &t.special_tokens),
    )?;
    spec.chat_template = chat.as_ref().map(|c| c.source().to_string());
    if !spec.keep_columns.is_empty() {
        let names: Vec<String> = spec.keep_columns.iter().map(|(name, _)| name.clone()).collect();
        let kinds = corpus.check_columns(&names).context("--keep-columns")?;
        spec.keep_columns = kinds.into_iter().map(|(name, kind)| (name, kind.to_string())).collect();
    }
    if let Some(siphon_data::Positions::After(text)) = &spec.positions {
        spec.positions_marker = Some(marker_tokens(&tokenizer, text)?);
    }
    let pack = options.corpus.pack_config(&tokenizer, siphon_data::SpecialTokens::detect(&tokenizer))?;
    let plugin = siphon_runtime::locate_plugin(options.plugin.as_deref()).context("no PJRT plugin")?;
    let compute_plan = plan::Plan::new(
        &model,
        &spec,
        identity.num_processes as usize,
        options.simulate_hosts,
        &plugin.path,
        options.pipeline_depth,
        plan::Attached { dictionaries, steering },
    )?;
    tracing::info!(
        model = %model_path.display(), hooks = spec.hooks.len(), units = corpus.units().len(),
        plugin = %plugin.path.display(), "configuration valid"
    );

    // 3. Coordinator.
    let (token, _) = options.cluster.job_token(&identity)?;
    let mut join = JoinOptions::new(token);
    join.client.register_timeout = Duration::from_secs_f64(options.register_timeout);
    join.client.connect_timeout = Duration::from_secs_f64(options.connect_timeout);
    join.stop_timeout = Duration::from_secs_f64(options.stop_timeout.max(0.0));
    join.bind = options.cluster.bind_addr(&identity)?;
    join.tls = options.cluster.tls()?;
    if options.cluster.external_coordinator {
        join.host_service = Some(false);
    }
    let coordinator = identity.coordinator.clone();
    let coord = Coordination::join(&identity, join).with_context(|| {
        format!(
            "cannot join the job through the coordinator at {coordinator}: check that process 0 runs the \
             same command, that the address is right (--coordinator or the detected one), and that \
             firewalls let this host reach that port"
        )
    })?;
    coord.install_failure_reporting();
    crate::interrupt::hand_over();

    let reading = Reading { corpus, tokenizer, pack, chat };
    let prepared = Prepared { spec, model, compute_plan, plugin, fingerprints, reading };
    let result = run_joined(&coord, host, prepared, &options);
    if let Err(err) = &result
        && coord.job_error().is_none()
    {
        let _ = coord.report_error(&format!(
            "host {} (machine {}): {}",
            host.host,
            host.machine,
            crate::outcome::describe(err)
        ));
    }
    match result {
        // Whatever this host was doing, the job stopped to be resumed (a barrier or get that
        // another host's preemption failed is no error of this host's).
        Err(err) if coord.preempted() && err.downcast_ref::<Preempted>().is_none() => {
            Err(anyhow::Error::new(Preempted::new(crate::outcome::describe(&err))))
        }
        other => other,
    }
}

/// Everything step 2 checked and opened, handed to the steps that need the other hosts.
struct Prepared {
    spec: RunSpec,
    model: siphon_models::LoadedModel,
    compute_plan: plan::Plan,
    plugin: siphon_runtime::LocatedPlugin,
    /// Each dictionary's [`dictionary::fingerprint`].
    fingerprints: Vec<String>,
    reading: Reading,
}

/// What every phase after the configuration check works in: this host, the agreed run.
#[derive(Clone, Copy)]
struct Job<'a> {
    coord: &'a Coordination,
    host: HostId,
    spec: &'a RunSpec,
    /// The run's name (`--run`, or derived from the agreed configuration).
    run: &'a str,
    options: &'a ExtractOptions,
}

/// Steps 4 to 9, with the other hosts.
fn run_joined(coord: &Coordination, host: HostId, prepared: Prepared, options: &ExtractOptions) -> anyhow::Result<()> {
    let Prepared { spec, model, compute_plan, plugin, fingerprints, reading } = prepared;
    // 4. Config broadcast: every host must run the same code on the same configuration.
    let run = agree::run_name(coord, &spec, &model.config, &reading.corpus, &plugin.path, &fingerprints)?;
    // 5–6. Plugin, client, model on the mesh.
    let compute = Compute::start(&plugin, &spec, compute_plan, &model, coord)?;
    drop(model);
    let job = Job { coord, host, spec: &spec, run: &run, options };
    // 7. Output and resume point of every writing member, shared with its reader's others.
    let resumed = resume::open(&job, &compute, &reading, &fingerprints)?;
    let streaming = resumed.streaming;
    // 8. The loop.
    let names: Vec<String> = spec.keep_columns.iter().map(|(name, _)| name.clone()).collect();
    let documents = (!names.is_empty()).then(|| documents::Documents::new(reading.corpus.clone(), names));
    let ended = steps::run(&job, &compute, resumed, documents)?;
    // 9. The last shards, completion, statistics, shutdown.
    finish::finish(&job, ended, streaming)
}
