//! Per-host timing of a run, kept beside the dataset (`{run}/timing/{host}.json`) so that
//! `siphon inspect` can report throughput. Not part of the dataset: verification ignores it.

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use siphon_store::{HostId, StoreLocation};

/// One host's figures for its latest (possibly resumed) session.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HostTiming {
    /// `machine_{m:03}_host_{h:02}`.
    pub host: String,
    /// Token rows this session processed.
    pub tokens: u64,
    /// Wall-clock seconds of the loop.
    pub seconds: f64,
    /// Seconds the devices spent on the programs (device-only compute; before the output
    /// path was timed by stage, the forward with its copies to the host).
    pub compute_seconds: f64,
    /// Steps in flight (`--pipeline-depth`).
    #[serde(default)]
    pub depth: usize,
    /// The output path's stages up to the writers: programs, copies to the host, hand-over,
    /// and which side waited for the other.
    #[serde(default)]
    pub path: super::pipeline::PathTiming,
    /// The writer's stages: conversion into shards, sealing, upload and commit.
    #[serde(default)]
    pub writer: siphon_store::WriterTiming,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

/// Writes this host's timing (replacing an earlier session's).
pub fn write_timing(output: &str, run: &str, host: HostId, timing: &HostTiming) -> anyhow::Result<()> {
    let location = StoreLocation::open(output, &[])?;
    let path: Path = location.run_dir(run).join("timing").join(format!("{}.json", host.dir_name()));
    let body = serde_json::to_vec_pretty(timing)?;
    runtime()?.block_on(location.store().put(&path, PutPayload::from(body)))?;
    Ok(())
}

/// Every host's timing of a run (empty when none was written).
pub fn read_timing(output: &str, run: &str) -> anyhow::Result<Vec<HostTiming>> {
    let location = StoreLocation::open(output, &[])?;
    let prefix: Path = location.run_dir(run).join("timing");
    runtime()?.block_on(async {
        use futures::TryStreamExt;
        let store = location.store();
        let objects: Vec<_> = store.list(Some(&prefix)).try_collect().await?;
        let mut out = Vec::new();
        for object in objects {
            if let Some(bytes) = location.get_optional(&object.location).await? {
                out.push(serde_json::from_slice(&bytes)?);
            }
        }
        Ok(out)
    })
}
