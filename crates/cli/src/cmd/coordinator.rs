//! `siphon coordinator`: run the coordination service on its own, for jobs whose processes
//! join it with `--external-coordinator`. It exits 0 once every process passed the shutdown
//! barrier, 75 when the job was preempted (SIGTERM to it or to a process), 1 when it failed.

use anyhow::Context;
use siphon_coord::ServiceConfig;

use crate::args::ClusterArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut cluster = args.cluster;
    // The service is this process; the job's processes all connect to it.
    cluster.external_coordinator = true;
    let identity = cluster.identity()?;
    let (token, token_source) = cluster.job_token(&identity)?;
    let bind = match cluster.bind_addr(&identity)? {
        Some(addr) => addr,
        None => {
            use std::net::ToSocketAddrs;
            identity
                .coordinator
                .to_socket_addrs()
                .with_context(|| format!("cannot resolve the coordinator address {}", identity.coordinator))?
                .next()
                .with_context(|| format!("the coordinator address {} resolves to nothing", identity.coordinator))?
        }
    };
    let mut config = ServiceConfig::new(identity.num_processes, token);
    config.tls = cluster.tls()?;
    if config.tls.as_ref().is_some_and(|tls| !tls.can_serve()) {
        anyhow::bail!(
            "the coordinator serves TLS with --coordinator-cert and --coordinator-key (only --coordinator-ca was given)"
        );
    }
    tracing::info!(num_processes = identity.num_processes, %bind, token = %token_source, "starting the coordinator");
    siphon_coord::service::run_standalone(config, bind, |addr| {
        println!("coordinator listening on {addr} for {} processes", identity.num_processes);
    })
    .context("the job failed")
}
