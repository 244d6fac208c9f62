//! Whether the job fits this machine, checked before anything is compiled or allocated: the
//! host's memory (`MemAvailable` within the cgroup's limit) against the output path's buffers,
//! the shuffle window and, on the CPU plugin, every device's planned bytes; a device's memory
//! as its plugin reports it against the plan's bytes per device.

use anyhow::{Context, bail};
use siphon_runtime::PluginKind;

/// What `extract` can change when a device cannot hold its step ([`device_memory`]).
pub(crate) const EXTRACT_DEVICE: &str = "choose a smaller --batch-size or --seq-len, fewer hooks, or a mesh that \
     shards the weights more (--fsdp, --model-parallel)";
/// What `extract` can change when the host cannot hold its buffers ([`machine_memory`]).
pub(crate) const EXTRACT_HOST: &str =
    "choose a smaller --batch-size or --seq-len, fewer hooks, or a smaller --pipeline-depth";

/// Stops, before the weights are uploaded or the program compiled, a job whose planned bytes
/// per device exceed what a device's plugin reports programs may use (a GPU's allocator limit;
/// the CPU plugin reports none: its devices were checked against the host's memory). `remedy`
/// says what the command can change ([`EXTRACT_DEVICE`]).
pub(crate) fn device_memory(
    client: &siphon_runtime::Client,
    local: &[usize],
    planned: &siphon_plan::Plan,
    remedy: &str,
) -> anyhow::Result<()> {
    use siphon_plan::memory::gib;
    let need = planned.memory.required_bytes;
    for &id in local {
        let Some(limit) = client.device_memory_limit(id).context("asking a device for its memory")? else { continue };
        if need > limit {
            let kind = client.device(id).map(|d| d.kind).unwrap_or_default();
            bail!(
                "the plan needs {} per device ({} of weights, {} of activations: `siphon plan` shows the terms) but \
                 device {id} ({kind}) reports {} for programs: {remedy}",
                gib(need),
                gib(planned.memory.weights.sharded_bytes + planned.memory.weights.fsdp_gather_bytes),
                gib(planned.memory.activations.map_or(0, |a| a.total_bytes)),
                gib(limit)
            );
        }
    }
    Ok(())
}

/// Stops, before anything is compiled or allocated, a job that needs more of this host's
/// memory than the machine reports available: the output path's buffers (`--pipeline-depth`
/// steps) and shuffle window on every plugin, and on the CPU plugin, whose devices are this
/// host's memory, every device's planned bytes too. `processes` is how many hosts' buffers
/// this process holds (`--simulate-hosts`); `remedy` says what the command can change
/// ([`EXTRACT_HOST`]).
pub(crate) fn machine_memory(
    planned: &siphon_plan::Plan,
    kind: PluginKind,
    devices: usize,
    processes: usize,
    window: Option<usize>,
    remedy: &str,
) -> anyhow::Result<()> {
    use siphon_plan::memory::gib;
    let Some(available) = siphon_runtime::diagnose::available_memory() else { return Ok(()) };
    let Some(host) = planned.memory.host else { return Ok(()) };
    let mut parts = vec![(
        host.total_bytes.saturating_mul(processes as u64),
        format!("the output path's buffers (--pipeline-depth {} steps)", host.depth),
    )];
    if let Some(window) = window.filter(|&w| w > 1) {
        let bytes = host.step_bytes.saturating_mul(window as u64).saturating_mul(processes as u64);
        parts.push((bytes, format!("the shuffle window (--shuffle-tokens-window {window} batches)")));
    }
    if kind == PluginKind::Cpu {
        let bytes = planned.memory.required_bytes.saturating_mul(devices as u64);
        let each = gib(planned.memory.required_bytes);
        parts.push((bytes, format!("the CPU plugin's {devices} devices ({each} each, in this host's memory)")));
    }
    let need = parts.iter().fold(0u64, |sum, (bytes, _)| sum.saturating_add(*bytes));
    if need > available {
        let parts: Vec<String> = parts.iter().map(|(bytes, what)| format!("{} for {what}", gib(*bytes))).collect();
        bail!(
            "this job needs {} of this host's memory ({}) but the machine reports {} available (MemAvailable, \
             within the cgroup's limit): {remedy}",
            gib(need),
            parts.join(", "),
            gib(available)
        );
    }
    Ok(())
}
