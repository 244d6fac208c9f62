//! Who am I in this job: (process id, process count, coordinator address), plus which
//! machine (pod) of a several-pod run this is.
//!
//! Each field comes from the first source that has it, in this order: flags, `SIPHON_*`
//! environment, Cloud TPU VM (env, then the GCE metadata server), GKE Indexed Job/JobSet,
//! SLURM, OpenMPI, torchrun. Every source is a pure function of an environment map and an
//! optional [`MetadataFetcher`], so all of them are tested with fixtures; lower sources are only
//! consulted (and the metadata server only queried) while a field is still missing.
//!
//! A coordinator address without a port gets [`DEFAULT_PORT`], or the port in
//! `SIPHON_COORDINATOR_PORT` ([`PORT_ENV`]).

use std::collections::HashMap;
use std::fmt;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::error::{CoordError, Result};

/// The coordinator port used when a source gives only a host (same as JAX's), unless
/// [`PORT_ENV`] says otherwise.
pub const DEFAULT_PORT: u16 = 8476;

/// The most processes a job may have, and machines a run: the service holds a slot for every
/// process, so a count from a flag or an environment past this (a million, one per device of
/// the largest mesh siphon plans) is refused before anything is allocated for it.
pub const MAX_PROCESSES: u32 = 1 << 20;

/// The environment variable that replaces [`DEFAULT_PORT`] for a coordinator address that
/// comes without a port (a TPU worker host name, the first SLURM node, `MASTER_ADDR`), e.g.
/// when JAX already uses 8476 on the same hosts.
pub const PORT_ENV: &str = "SIPHON_COORDINATOR_PORT";

/// Where an identity field came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// `--process-id`, `--num-processes`, `--coordinator`.
    Flags,
    /// `SIPHON_PROCESS_ID`, `SIPHON_NUM_PROCESSES`, `SIPHON_COORDINATOR`.
    SiphonEnv,
    /// Cloud TPU VM: `TPU_WORKER_ID`/`CLOUD_TPU_TASK_ID`, GCE metadata attributes.
    CloudTpu,
    /// GKE Indexed Job / JobSet: `JOB_COMPLETION_INDEX`, `TPU_WORKER_HOSTNAMES`.
    Gke,
    /// SLURM: `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_STEP_NODELIST`.
    Slurm,
    /// OpenMPI: `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`, `OMPI_MCA_orte_hnp_uri`.
    OpenMpi,
    /// torchrun: `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`.
    Torchrun,
    /// Nothing found: a single process hosting its own coordinator on 127.0.0.1.
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Flags => "flags",
            Source::SiphonEnv => "SIPHON_* environment",
            Source::CloudTpu => "Cloud TPU VM",
            Source::Gke => "GKE indexed job",
            Source::Slurm => "SLURM",
            Source::OpenMpi => "OpenMPI",
            Source::Torchrun => "torchrun",
            Source::Default => "default (single process)",
        })
    }
}

/// The identity flags of the command line (all optional).
#[derive(Debug, Clone, Default)]
pub struct IdentityFlags {
    /// `--process-id`.
    pub process_id: Option<u32>,
    /// `--num-processes`.
    pub num_processes: Option<u32>,
    /// `--coordinator HOST:PORT`.
    pub coordinator: Option<String>,
    /// `--machine-id`: which pod of a several-pod run (each pod has its own coordinator).
    pub machine_id: Option<u32>,
    /// `--total-machines`.
    pub total_machines: Option<u32>,
}

/// A resolved identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// This process's id, `0..num_processes`.
    pub process_id: u32,
    /// How many processes the job (this machine's part of the run) has.
    pub num_processes: u32,
    /// The coordinator's HOST:PORT.
    pub coordinator: String,
    /// Which machine (pod) of the run, `0..total_machines`.
    pub machine_id: u32,
    /// How many machines (pods, each with its own coordinator) the run has.
    pub total_machines: u32,
    /// The source of the process id: the one that "won".
    pub source: Source,
    /// The sources of (process id, process count, coordinator), in that order.
    pub field_sources: [Source; 3],
}

/// Reads GCE instance metadata attributes (`instance/attributes/<key>`).
pub trait MetadataFetcher {
    /// The attribute's value, `None` when the server says it does not exist.
    fn get_attribute(&self, key: &str) -> Result<Option<String>>;
}

/// The GCE metadata server over plain HTTP, with a short timeout. The host comes from
/// `GCE_METADATA_HOST` (as Google's client libraries read it), then `GCE_METADATA_IP`, then
/// `metadata.google.internal`.
#[derive(Debug, Clone)]
pub struct GceMetadata {
    /// HOST or HOST:PORT of the metadata server.
    pub host: String,
    /// Connect and read timeout of one request.
    pub timeout: Duration,
}

impl GceMetadata {
    /// The metadata server named by `env`.
    pub fn from_env(env: &HashMap<String, String>) -> GceMetadata {
        let host = env
            .get("GCE_METADATA_HOST")
            .or_else(|| env.get("GCE_METADATA_IP"))
            .cloned()
            .unwrap_or_else(|| "metadata.google.internal".to_string());
        GceMetadata { host, timeout: Duration::from_secs(2) }
    }
}

impl MetadataFetcher for GceMetadata {
    fn get_attribute(&self, key: &str) -> Result<Option<String>> {
        let fail = |why: String| {
            CoordError::Unavailable(format!("GCE metadata server {}: attribute '{key}': {why}", self.host))
        };
        let address = if self.host.contains(':') { self.host.clone() } else { format!("{}:80", self.host) };
        let socket = address
            .to_socket_addrs()
            .map_err(|e| fail(format!("cannot resolve: {e}")))?
            .next()
            .ok_or_else(|| fail("resolves to nothing".into()))?;
        let mut stream = TcpStream::connect_timeout(&socket, self.timeout).map_err(|e| fail(e.to_string()))?;
        stream.set_read_timeout(Some(self.timeout)).map_err(|e| fail(e.to_string()))?;
        stream.set_write_timeout(Some(self.timeout)).map_err(|e| fail(e.to_string()))?;
        let request = format!(
            "GET /computeMetadata/v1/instance/attributes/{key} HTTP/1.1\r\nHost: {}\r\n\
             Metadata-Flavor: Google\r\nConnection: close\r\n\r\n",
            self.host
        );
        stream.write_all(request.as_bytes()).map_err(|e| fail(e.to_string()))?;
        let mut response = Vec::new();
        stream.take(1 << 20).read_to_end(&mut response).map_err(|e| fail(e.to_string()))?;
        let text = String::from_utf8_lossy(&response);
        let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| fail("malformed HTTP answer".into()))?;
        let status: u16 = head
            .lines()
            .next()
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| fail("malformed HTTP status line".into()))?;
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            return Err(fail("chunked answers are not supported".into()));
        }
        match status {
            200 => Ok(Some(body.trim().to_string())),
            404 => Ok(None),
            other => Err(fail(format!("HTTP status {other}"))),
        }
    }
}

/// Resolves the identity of this process from its flags, its environment and (on a Cloud TPU
/// VM) the GCE metadata server.
pub fn resolve_from_process(flags: &IdentityFlags) -> Result<Identity> {
    let env: HashMap<String, String> = std::env::vars().collect();
    let metadata = GceMetadata::from_env(&env);
    let identity = resolve(flags, &env, Some(&metadata))?;
    tracing::info!(
        process_id = identity.process_id,
        num_processes = identity.num_processes,
        coordinator = %identity.coordinator,
        source = %identity.source,
        "resolved the process identity"
    );
    Ok(identity)
}

/// Partial identity from one source.
#[derive(Debug, Default)]
struct Partial {
    process_id: Option<u32>,
    num_processes: Option<u32>,
    coordinator: Option<String>,
}

/// Resolves the identity from `flags`, an environment map and an optional metadata fetcher.
pub fn resolve(
    flags: &IdentityFlags,
    env: &HashMap<String, String>,
    metadata: Option<&dyn MetadataFetcher>,
) -> Result<Identity> {
    let mut process_id: Option<(u32, Source)> = None;
    let mut num_processes: Option<(u32, Source)> = None;
    let mut coordinator: Option<(String, Source)> = None;
    type Reader<'a> = &'a dyn Fn() -> Result<Option<Partial>>;
    let sources: [(Source, Reader); 7] = [
        (Source::Flags, &|| {
            Ok(Some(Partial {
                process_id: flags.process_id,
                num_processes: flags.num_processes,
                coordinator: flags.coordinator.clone(),
            }))
        }),
        (Source::SiphonEnv, &|| siphon_env(env)),
        (Source::CloudTpu, &|| cloud_tpu(env, metadata)),
        (Source::Gke, &|| gke(env)),
        (Source::Slurm, &|| slurm(env)),
        (Source::OpenMpi, &|| open_mpi(env)),
        (Source::Torchrun, &|| torchrun(env)),
    ];
    for (source, read) in sources {
        if process_id.is_some() && num_processes.is_some() && coordinator.is_some() {
            break;
        }
        let Some(partial) = read()? else { continue };
        if process_id.is_none() {
            process_id = partial.process_id.map(|v| (v, source));
        }
        if num_processes.is_none() {
            num_processes = partial.num_processes.map(|v| (v, source));
        }
        if coordinator.is_none() {
            coordinator = partial.coordinator.map(|v| (v, source));
        }
    }
    let (process_id, id_source) = process_id.unwrap_or((0, Source::Default));
    let (num_processes, count_source) = match num_processes {
        Some(found) => found,
        None if process_id == 0 => (1, Source::Default),
        None => {
            return Err(CoordError::InvalidArgument(format!(
                "process id {process_id} came from {id_source} but no source gives the process count: \
                 pass --num-processes or set SIPHON_NUM_PROCESSES"
            )));
        }
    };
    if num_processes == 0 {
        return Err(CoordError::InvalidArgument(format!("the process count (from {count_source}) must be at least 1")));
    }
    if num_processes > MAX_PROCESSES {
        return Err(CoordError::InvalidArgument(format!(
            "the process count {num_processes} (from {count_source}) is more than the {MAX_PROCESSES} processes a job may have"
        )));
    }
    if process_id >= num_processes {
        return Err(CoordError::InvalidArgument(format!(
            "process id {process_id} (from {id_source}) is not below the process count {num_processes} (from {count_source})"
        )));
    }
    let default_port = match env.get(PORT_ENV) {
        None => DEFAULT_PORT,
        Some(text) => text.trim().parse::<u16>().ok().filter(|&port| port != 0).ok_or_else(|| {
            CoordError::InvalidArgument(format!("{PORT_ENV}='{text}' is not a port number (1-65535)"))
        })?,
    };
    let (coordinator, coordinator_source) = match coordinator {
        Some((address, source)) => (with_port(&address, source, default_port)?, source),
        None if num_processes == 1 => ("127.0.0.1:0".to_string(), Source::Default),
        None => {
            return Err(CoordError::InvalidArgument(format!(
                "{num_processes} processes but no coordinator address: pass --coordinator HOST:PORT \
                 or set SIPHON_COORDINATOR"
            )));
        }
    };
    let machine_id = match flags.machine_id {
        Some(id) => Some(id),
        None => first_number(env, &["SIPHON_MACHINE_ID", "MEGASCALE_SLICE_ID"])?,
    }
    .unwrap_or(0);
    let total_machines = match flags.total_machines {
        Some(n) => Some(n),
        None => first_number(env, &["SIPHON_TOTAL_MACHINES", "MEGASCALE_NUM_SLICES"])?,
    }
    .unwrap_or(1);
    if total_machines > MAX_PROCESSES {
        return Err(CoordError::InvalidArgument(format!(
            "the machine count {total_machines} is more than the {MAX_PROCESSES} machines a run may have"
        )));
    }
    if machine_id >= total_machines {
        return Err(CoordError::InvalidArgument(format!(
            "machine id {machine_id} is not below the machine count {total_machines}"
        )));
    }
    Ok(Identity {
        process_id,
        num_processes,
        coordinator,
        machine_id,
        total_machines,
        source: id_source,
        field_sources: [id_source, count_source, coordinator_source],
    })
}

fn with_port(address: &str, source: Source, default_port: u16) -> Result<String> {
    let address = address.trim();
    if address.is_empty() {
        return Err(CoordError::InvalidArgument(format!("the coordinator address from {source} is empty")));
    }
    // "[v6]:port", "host:port" or a bare host / bare IPv6 address.
    if let Some(rest) = address.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((_, "")) => Ok(format!("{address}:{default_port}")),
            Some((_, port)) if port.strip_prefix(':').is_some_and(|p| p.parse::<u16>().is_ok()) => {
                Ok(address.to_string())
            }
            _ => Err(CoordError::InvalidArgument(format!("bad coordinator address '{address}' from {source}"))),
        };
    }
    match address.matches(':').count() {
        0 => Ok(format!("{address}:{default_port}")),
        1 => {
            let (_, port) = address.split_once(':').unwrap_or_default();
            port.parse::<u16>().map_err(|_| {
                CoordError::InvalidArgument(format!("bad port in coordinator address '{address}' from {source}"))
            })?;
            Ok(address.to_string())
        }
        _ => Ok(format!("[{address}]:{default_port}")),
    }
}

fn number(env: &HashMap<String, String>, name: &str) -> Result<Option<u32>> {
    match env.get(name) {
        None => Ok(None),
        Some(text) => text
            .trim()
            .parse::<u32>()
            .map(Some)
            .map_err(|_| CoordError::InvalidArgument(format!("{name}='{text}' is not a non-negative integer"))),
    }
}

fn first_number(env: &HashMap<String, String>, names: &[&str]) -> Result<Option<u32>> {
    for name in names {
        if let Some(value) = number(env, name)? {
            return Ok(Some(value));
        }
    }
    Ok(None)
}

fn siphon_env(env: &HashMap<String, String>) -> Result<Option<Partial>> {
    Ok(Some(Partial {
        process_id: number(env, "SIPHON_PROCESS_ID")?,
        num_processes: number(env, "SIPHON_NUM_PROCESSES")?,
        coordinator: env.get("SIPHON_COORDINATOR").cloned(),
    }))
}

fn host_list(text: &str) -> Vec<String> {
    text.split(',').map(|h| h.trim().to_string()).filter(|h| !h.is_empty()).collect()
}

fn cloud_tpu(env: &HashMap<String, String>, metadata: Option<&dyn MetadataFetcher>) -> Result<Option<Partial>> {
    let markers = ["TPU_WORKER_ID", "CLOUD_TPU_TASK_ID", "TPU_ACCELERATOR_TYPE"];
    if !markers.iter().any(|m| env.contains_key(*m)) {
        return Ok(None);
    }
    let mut process_id = first_number(env, &["TPU_WORKER_ID", "CLOUD_TPU_TASK_ID"])?;
    let mut hosts = env.get("TPU_WORKER_HOSTNAMES").map(|h| host_list(h)).unwrap_or_default();
    if let Some(metadata) = metadata {
        if process_id.is_none()
            && let Some(text) = metadata.get_attribute("agent-worker-number")?
        {
            process_id = Some(text.trim().parse().map_err(|_| {
                CoordError::InvalidArgument(format!("GCE metadata agent-worker-number='{text}' is not a number"))
            })?);
        }
        if hosts.is_empty()
            && let Some(text) = metadata.get_attribute("worker-network-endpoints")?
        {
            // Entries look like "<id>:<name>:<ip>"; the address is the last part.
            hosts = text
                .split(',')
                .filter_map(|entry| entry.trim().rsplit(':').next().map(str::to_string))
                .filter(|ip| !ip.is_empty())
                .collect();
        }
    }
    Ok(Some(Partial {
        process_id,
        num_processes: (!hosts.is_empty()).then_some(hosts.len() as u32),
        coordinator: hosts.first().cloned(),
    }))
}

fn gke(env: &HashMap<String, String>) -> Result<Option<Partial>> {
    if !env.contains_key("JOB_COMPLETION_INDEX") && !env.contains_key("TPU_WORKER_HOSTNAMES") {
        return Ok(None);
    }
    let hosts = env.get("TPU_WORKER_HOSTNAMES").map(|h| host_list(h)).unwrap_or_default();
    Ok(Some(Partial {
        process_id: number(env, "JOB_COMPLETION_INDEX")?,
        num_processes: (!hosts.is_empty()).then_some(hosts.len() as u32),
        coordinator: hosts.first().cloned(),
    }))
}

fn slurm(env: &HashMap<String, String>) -> Result<Option<Partial>> {
    if !env.contains_key("SLURM_PROCID") {
        return Ok(None);
    }
    let nodes = env.get("SLURM_STEP_NODELIST").or_else(|| env.get("SLURM_JOB_NODELIST"));
    let coordinator = match nodes {
        Some(list) => Some(first_slurm_host(list)?),
        None => None,
    };
    Ok(Some(Partial {
        process_id: number(env, "SLURM_PROCID")?,
        num_processes: first_number(env, &["SLURM_NTASKS", "SLURM_NPROCS"])?,
        coordinator,
    }))
}

/// The first host of a SLURM hostlist such as `node[003-010,012],gpu7` (→ `node003`).
pub fn first_slurm_host(list: &str) -> Result<String> {
    let bad = || CoordError::InvalidArgument(format!("cannot read the SLURM node list '{list}'"));
    let list = list.trim();
    let head = match (list.find(','), list.find('[')) {
        (Some(comma), Some(bracket)) if comma < bracket => &list[..comma],
        (Some(comma), None) => &list[..comma],
        _ => list,
    };
    let Some((prefix, rest)) = head.split_once('[') else {
        return if head.is_empty() { Err(bad()) } else { Ok(head.to_string()) };
    };
    let (ranges, suffix) = rest.split_once(']').ok_or_else(bad)?;
    let first = ranges.split(',').next().ok_or_else(bad)?;
    let start = first.split('-').next().ok_or_else(bad)?;
    if start.is_empty() || !start.chars().all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    // The suffix may start another list entry ("n[1-2],m3"): keep only this host's part.
    let suffix = suffix.split(',').next().unwrap_or("");
    Ok(format!("{prefix}{start}{suffix}"))
}

fn open_mpi(env: &HashMap<String, String>) -> Result<Option<Partial>> {
    if !env.contains_key("OMPI_COMM_WORLD_RANK") {
        return Ok(None);
    }
    // "1234.0;tcp://10.0.0.1,172.17.0.1:41234": the launcher (mpirun) host, where rank 0 runs
    // in the common case; the coordinator uses siphon's own port there.
    let coordinator = env.get("OMPI_MCA_orte_hnp_uri").and_then(|uri| {
        let after = uri.split("tcp://").nth(1)?;
        let host = after.split([',', ';']).next()?;
        let host = host.rsplit_once(':').map(|(h, _)| h).unwrap_or(host);
        (!host.is_empty()).then(|| host.to_string())
    });
    Ok(Some(Partial {
        process_id: number(env, "OMPI_COMM_WORLD_RANK")?,
        num_processes: number(env, "OMPI_COMM_WORLD_SIZE")?,
        coordinator,
    }))
}

fn torchrun(env: &HashMap<String, String>) -> Result<Option<Partial>> {
    if !env.contains_key("RANK") && !env.contains_key("MASTER_ADDR") {
        return Ok(None);
    }
    let coordinator = env.get("MASTER_ADDR").map(|host| match number(env, "MASTER_PORT") {
        Ok(Some(port)) => format!("{host}:{port}"),
        _ => host.clone(),
    });
    Ok(Some(Partial { process_id: number(env, "RANK")?, num_processes: number(env, "WORLD_SIZE")?, coordinator }))
}

#[cfg(test)]
mod tests;
