//! `siphon cluster`: identity and pre-flight checks of a multi-host job, plus the control-plane
//! benchmark. [`ClusterArgs`] holds the identity/coordinator flags every multi-host command
//! flattens in (`#[command(flatten)]`).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use siphon_coord::check::{CheckOptions, CheckReport, Latency};
use siphon_coord::{Coordination, Identity, IdentityFlags, JoinOptions, identity};

/// Identity and coordinator flags shared by every command that joins a job.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ClusterArgs {
    /// This process's id in the job (else SIPHON_PROCESS_ID, then TPU/GKE/SLURM/MPI/torchrun).
    #[arg(long)]
    pub process_id: Option<u32>,
    /// How many processes the job has (else SIPHON_NUM_PROCESSES, then the platform).
    #[arg(long)]
    pub num_processes: Option<u32>,
    /// The coordinator, hosted by process 0 (else SIPHON_COORDINATOR, then the platform).
    #[arg(long, value_name = "HOST:PORT")]
    pub coordinator: Option<String>,
    /// Address the coordination service listens on (default: the coordinator address itself;
    /// give 0.0.0.0 explicitly to listen everywhere). An IP alone takes the coordinator's port.
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<String>,
    /// File holding the job token (else SIPHON_JOB_TOKEN). The token is never printed.
    #[arg(long, value_name = "PATH")]
    pub job_token_file: Option<PathBuf>,
    /// Which machine (pod, with its own coordinator) of a several-machine run this is.
    #[arg(long)]
    pub machine_id: Option<u32>,
    /// How many machines the run has.
    #[arg(long)]
    pub total_machines: Option<u32>,
    /// The service runs elsewhere (`siphon coordinator`): process 0 does not host it.
    #[arg(long)]
    pub external_coordinator: bool,
    /// CA certificate (PEM) the coordinator's certificate must be signed by; turns on TLS for
    /// the coordinator (every host needs the same TLS flags).
    #[arg(long, env = "SIPHON_COORDINATOR_CA", value_name = "PEM")]
    pub coordinator_ca: Option<PathBuf>,
    /// Certificate (PEM, chain) the coordinator serves TLS with; needed where it is hosted.
    #[arg(long, env = "SIPHON_COORDINATOR_CERT", value_name = "PEM", requires = "coordinator_ca")]
    pub coordinator_cert: Option<PathBuf>,
    /// Private key (PEM) of --coordinator-cert.
    #[arg(long, env = "SIPHON_COORDINATOR_KEY", value_name = "PEM", requires = "coordinator_cert")]
    pub coordinator_key: Option<PathBuf>,
    /// Name the coordinator's certificate must hold (default: the host of the coordinator address).
    #[arg(long, env = "SIPHON_COORDINATOR_TLS_NAME", value_name = "NAME", requires = "coordinator_ca")]
    pub coordinator_tls_name: Option<String>,
}

/// Where the job token came from (never the token itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `--job-token-file`.
    File(PathBuf),
    /// `SIPHON_JOB_TOKEN`.
    Env,
    /// Generated for a single-process run.
    Generated,
}

impl std::fmt::Display for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenSource::File(path) => write!(f, "file {}", path.display()),
            TokenSource::Env => f.write_str("SIPHON_JOB_TOKEN"),
            TokenSource::Generated => f.write_str("generated (single process)"),
        }
    }
}

impl ClusterArgs {
    fn flags(&self) -> IdentityFlags {
        IdentityFlags {
            process_id: self.process_id,
            num_processes: self.num_processes,
            coordinator: self.coordinator.clone(),
            machine_id: self.machine_id,
            total_machines: self.total_machines,
        }
    }

    /// Resolves this process's identity (flags, then environment, then platform).
    pub fn identity(&self) -> anyhow::Result<Identity> {
        identity::resolve_from_process(&self.flags()).context("cannot resolve this process's identity")
    }

    /// The job token and where it came from. A job of several processes must be given one.
    pub fn job_token(&self, identity: &Identity) -> anyhow::Result<(String, TokenSource)> {
        self.job_token_from(identity, std::env::var("SIPHON_JOB_TOKEN").ok())
    }

    fn job_token_from(&self, identity: &Identity, env_token: Option<String>) -> anyhow::Result<(String, TokenSource)> {
        if let Some(path) = &self.job_token_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the job token file {}", path.display()))?;
            let token = text.trim().to_string();
            if token.is_empty() {
                bail!("the job token file {} is empty", path.display());
            }
            return Ok((token, TokenSource::File(path.clone())));
        }
        if let Some(token) = env_token {
            if token.trim().is_empty() {
                bail!("SIPHON_JOB_TOKEN is set but empty");
            }
            return Ok((token.trim().to_string(), TokenSource::Env));
        }
        if identity.num_processes == 1 && !self.external_coordinator {
            return Ok((siphon_coord::generate_job_token(), TokenSource::Generated));
        }
        bail!(
            "no job token for a job of {} processes: set SIPHON_JOB_TOKEN or pass --job-token-file \
             (the launcher generates one per job and gives it to every process)",
            identity.num_processes
        )
    }

    /// The coordinator's TLS material, when `--coordinator-ca` (or its variable) is set.
    pub fn tls(&self) -> anyhow::Result<Option<siphon_coord::TlsOptions>> {
        let Some(ca) = &self.coordinator_ca else {
            if self.coordinator_cert.is_some() || self.coordinator_key.is_some() {
                bail!(
                    "--coordinator-cert and --coordinator-key need --coordinator-ca (the CA clients check the certificate against)"
                );
            }
            return Ok(None);
        };
        let tls = siphon_coord::TlsOptions::from_files(
            ca,
            self.coordinator_cert.as_deref(),
            self.coordinator_key.as_deref(),
        )?;
        Ok(Some(tls.with_server_name(self.coordinator_tls_name.clone())))
    }

    /// The address the hosted service binds.
    pub fn bind_addr(&self, identity: &Identity) -> anyhow::Result<Option<SocketAddr>> {
        let Some(bind) = &self.bind else { return Ok(None) };
        if let Ok(addr) = bind.parse::<SocketAddr>() {
            return Ok(Some(addr));
        }
        if let Ok(ip) = bind.trim_matches(['[', ']']).parse::<IpAddr>() {
            let port = identity
                .coordinator
                .rsplit_once(':')
                .and_then(|(_, port)| port.parse::<u16>().ok())
                .with_context(|| format!("the coordinator address {} has no port", identity.coordinator))?;
            return Ok(Some(SocketAddr::new(ip, port)));
        }
        let addr = bind
            .to_socket_addrs()
            .with_context(|| format!("--bind {bind}: not an address"))?
            .next()
            .with_context(|| format!("--bind {bind} resolves to nothing"))?;
        Ok(Some(addr))
    }

    /// Joins the job (hosting the service on process 0 unless `--external-coordinator`), with
    /// failure reporting installed: a panic or SIGINT fails every process, SIGTERM stops every
    /// process as preempted.
    pub fn join(&self) -> anyhow::Result<Coordination> {
        let identity = self.identity()?;
        let (token, _) = self.job_token(&identity)?;
        let mut options = JoinOptions::new(token);
        options.bind = self.bind_addr(&identity)?;
        options.tls = self.tls()?;
        if self.external_coordinator {
            options.host_service = Some(false);
        }
        let job = Coordination::join(&identity, options).with_context(|| {
            format!(
                "process {} of {} could not join the job at {}",
                identity.process_id, identity.num_processes, identity.coordinator
            )
        })?;
        job.install_failure_reporting();
        Ok(job)
    }
}

#[derive(clap::Subcommand)]
pub enum Command {
    /// Print the resolved identity and where each part came from.
    Info(InfoArgs),
    /// Join the job and run barriers and key-value round trips with every process (pre-flight).
    Check(CheckArgs),
    /// Benchmark: run `siphon cluster check` as N local processes on 127.0.0.1.
    Bench(BenchArgs),
}

#[derive(clap::Args)]
pub struct InfoArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Rounds of each measurement.
    #[arg(long, default_value_t = 200)]
    pub rounds: u32,
    /// Timeout of each barrier and get, in seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout_s: u64,
    /// Print the report as one JSON line.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Process counts to run, e.g. 2,8,32.
    #[arg(long, value_delimiter = ',', default_value = "2,8,32")]
    pub processes: Vec<u32>,
    /// Rounds of each measurement in every run.
    #[arg(long, default_value_t = 1000)]
    pub rounds: u32,
    /// Print one JSON line per run as well.
    #[arg(long)]
    pub json: bool,
}

pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Info(args) => info(args),
        Command::Check(args) => check(args),
        Command::Bench(args) => bench(args),
    }
}

fn info(args: InfoArgs) -> anyhow::Result<()> {
    let identity = args.cluster.identity()?;
    let token = match args.cluster.job_token(&identity) {
        Ok((_, source)) => source.to_string(),
        Err(error) => format!("missing ({})", super::describe(&error)),
    };
    let [id_source, count_source, coordinator_source] = identity.field_sources;
    if args.json {
        let value = serde_json::json!({
            "process_id": identity.process_id,
            "num_processes": identity.num_processes,
            "coordinator": identity.coordinator,
            "machine_id": identity.machine_id,
            "total_machines": identity.total_machines,
            "source": identity.source.to_string(),
            "sources": {
                "process_id": id_source.to_string(),
                "num_processes": count_source.to_string(),
                "coordinator": coordinator_source.to_string(),
            },
            "job_token": token,
        });
        println!("{value}");
        return Ok(());
    }
    println!("process id:    {}  (from {id_source})", identity.process_id);
    println!("processes:     {}  (from {count_source})", identity.num_processes);
    println!("coordinator:   {}  (from {coordinator_source})", identity.coordinator);
    println!("machine:       {} of {}", identity.machine_id, identity.total_machines);
    println!("hosts service: {}", identity.process_id == 0 && !args.cluster.external_coordinator);
    println!("job token:     {token}");
    println!("source:        {}", identity.source);
    Ok(())
}

fn check(args: CheckArgs) -> anyhow::Result<()> {
    let job = args.cluster.join()?;
    let options = CheckOptions { rounds: args.rounds, timeout: Duration::from_secs(args.timeout_s.max(1)) };
    let report = siphon_coord::check::run_check(&job, &options).context("the cluster check failed")?;
    job.shutdown(options.timeout).context("shutting down after the check")?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report, job.identity());
    }
    Ok(())
}

fn ms(latency: &Latency) -> String {
    format!(
        "p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms  ({} samples)",
        latency.p50_us / 1e3,
        latency.p99_us / 1e3,
        latency.max_us / 1e3,
        latency.samples
    )
}

fn print_report(report: &CheckReport, identity: &Identity) {
    println!(
        "cluster check: process {} of {}, coordinator {}",
        report.process_id, report.num_processes, identity.coordinator
    );
    if let Some(alive) = &report.alive {
        println!("alive processes:          {} of {}", alive.len(), report.num_processes);
    }
    if let Some(all) = &report.barrier_all_processes {
        println!("barrier (all processes):  {}", ms(all));
    }
    println!("barrier (this process):   {}", ms(&report.barrier));
    println!("kv set+get round trip:    {}", ms(&report.kv_round_trip));
    if let Some(broadcast) = &report.kv_broadcast {
        println!("kv broadcast to {} (set → all read → acked): {}", report.num_processes - 1, ms(broadcast));
    }
}

fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the siphon executable")?;
    let check_args: Vec<String> =
        ["cluster", "check", "--json", "--rounds", &args.rounds.to_string()].iter().map(|s| s.to_string()).collect();
    println!("{}", bench_header());
    for &n in &args.processes {
        let report = siphon_coord::check::run_local(&exe, &check_args, n, Duration::from_secs(600))
            .with_context(|| format!("the {n}-process run failed"))?;
        println!("{}", bench_row(&report));
        if args.json {
            println!("{}", serde_json::to_string(&report)?);
        }
    }
    Ok(())
}

/// Header of the benchmark table (Markdown).
pub fn bench_header() -> String {
    "| processes | barrier p50 | barrier p99 | kv set+get p50 | kv broadcast p50 | kv broadcast p99 |\n\
     |---|---|---|---|---|---|"
        .to_string()
}

/// One row of the benchmark table (Markdown).
pub fn bench_row(report: &CheckReport) -> String {
    let barrier = report.barrier_all_processes.clone().unwrap_or_else(|| report.barrier.clone());
    let ms = |us: f64| format!("{:.3} ms", us / 1e3);
    let (bp50, bp99) =
        report.kv_broadcast.as_ref().map(|b| (ms(b.p50_us), ms(b.p99_us))).unwrap_or_else(|| ("-".into(), "-".into()));
    format!(
        "| {} | {} | {} | {} | {bp50} | {bp99} |",
        report.num_processes,
        ms(barrier.p50_us),
        ms(barrier.p99_us),
        ms(report.kv_round_trip.p50_us)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(num_processes: u32) -> Identity {
        let flags = IdentityFlags {
            process_id: Some(0),
            num_processes: Some(num_processes),
            coordinator: Some("10.0.0.5:9000".into()),
            ..Default::default()
        };
        identity::resolve(&flags, &Default::default(), None).unwrap()
    }

    #[test]
    fn job_token_sources_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "  s3cret\n").unwrap();
        let args = ClusterArgs { job_token_file: Some(file.clone()), ..Default::default() };
        let (token, source) = args.job_token_from(&identity(4), Some("from-env".into())).unwrap();
        assert_eq!((token.as_str(), source), ("s3cret", TokenSource::File(file.clone())), "the file wins");
        std::fs::write(&file, "\n").unwrap();
        let error = args.job_token_from(&identity(4), None).unwrap_err().to_string();
        assert!(error.contains("is empty"), "{error}");

        let none = ClusterArgs::default();
        let (token, source) = none.job_token_from(&identity(4), Some("from-env".into())).unwrap();
        assert_eq!((token.as_str(), source), ("from-env", TokenSource::Env));
        let error = none.job_token_from(&identity(4), None).unwrap_err().to_string();
        assert!(error.contains("SIPHON_JOB_TOKEN") && error.contains("4 processes"), "{error}");
        let (token, source) = none.job_token_from(&identity(1), None).unwrap();
        assert_eq!(source, TokenSource::Generated);
        assert_eq!(token.len(), 64);
        // The source is printable, the token never is.
        assert!(!TokenSource::Env.to_string().contains("from-env"));
    }

    #[test]
    fn bind_defaults_to_the_coordinator_and_an_ip_takes_its_port() {
        let me = identity(2);
        assert_eq!(ClusterArgs::default().bind_addr(&me).unwrap(), None);
        let args = ClusterArgs { bind: Some("0.0.0.0".into()), ..Default::default() };
        assert_eq!(args.bind_addr(&me).unwrap(), Some("0.0.0.0:9000".parse().unwrap()));
        let args = ClusterArgs { bind: Some("127.0.0.1:7000".into()), ..Default::default() };
        assert_eq!(args.bind_addr(&me).unwrap(), Some("127.0.0.1:7000".parse().unwrap()));
        let args = ClusterArgs { bind: Some("not an address".into()), ..Default::default() };
        assert!(args.bind_addr(&me).is_err());
    }
}
