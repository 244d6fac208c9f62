//! Checking that an output location can hold a dataset before a job starts (`siphon doctor
//! --output`): write one small object, read it back, list it and delete it, timing each step.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutPayload};

use crate::error::{Result, StoreError};
use crate::location::StoreLocation;

/// Size of the probe object.
pub const PROBE_BYTES: usize = 64 << 10;

/// How long each step of a [`probe`] took.
#[derive(Debug, Clone)]
pub struct ProbeReport {
    /// The object written and deleted (relative to the store).
    pub object: String,
    /// Writing it.
    pub put: Duration,
    /// Reading it back (and comparing).
    pub get: Duration,
    /// Listing its directory.
    pub list: Duration,
    /// Deleting it.
    pub delete: Duration,
}

/// Writes [`PROBE_BYTES`] to `{root}/.siphon-probe/{unique name}`, reads them back and compares,
/// finds the object by listing, and deletes it. An error names the step and the object.
pub async fn probe(location: &StoreLocation) -> Result<ProbeReport> {
    let store = location.store();
    let dir = location.run_dir(".siphon-probe");
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    let object = dir.clone().join(format!("{}-{nanos}", std::process::id()));
    let bytes: Vec<u8> = (0..PROBE_BYTES).map(|i| (i * 31 % 251) as u8).collect();

    let started = Instant::now();
    store.put(&object, PutPayload::from(bytes.clone())).await.map_err(|e| StoreError::store("put", &object, e))?;
    let put = started.elapsed();

    let started = Instant::now();
    let read = store
        .get(&object)
        .await
        .map_err(|e| StoreError::store("get", &object, e))?
        .bytes()
        .await
        .map_err(|e| StoreError::store("get", &object, e))?;
    if read.as_ref() != bytes.as_slice() {
        return Err(StoreError::Corrupt {
            path: object.to_string(),
            reason: format!("read back {} bytes that differ from the {} written", read.len(), bytes.len()),
        });
    }
    let get = started.elapsed();

    let started = Instant::now();
    let listed: Vec<_> = store
        .list(Some(&dir))
        .map_ok(|meta| meta.location)
        .try_collect()
        .await
        .map_err(|e| StoreError::store("list", &dir, e))?;
    if !listed.contains(&object) {
        return Err(StoreError::Corrupt {
            path: dir.to_string(),
            reason: format!("listing it does not show {object}, which was just written"),
        });
    }
    let list = started.elapsed();

    let started = Instant::now();
    store.delete(&object).await.map_err(|e| StoreError::store("delete", &object, e))?;
    let delete = started.elapsed();
    if let Some(local) = location.local_dir() {
        // object_store leaves the emptied directory behind on disk.
        let _ = std::fs::remove_dir(local.join(dir.as_ref()));
    }
    Ok(ProbeReport { object: object.to_string(), put, get, list, delete })
}

/// Blocking form of [`probe`]: opens `output` with the store timeout `give_up_after` first.
pub fn probe_blocking(output: &str, options: &[(String, String)], give_up_after: Duration) -> Result<ProbeReport> {
    crate::verify::block_on(async {
        let location = StoreLocation::open_with_timeout(output, options, give_up_after)?;
        probe(&location).await
    })
}
