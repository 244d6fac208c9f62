//! GPUs described without a GPU: the target descriptions XLA's CUDA plugin carries for the
//! devices it knows (`xla/backends/gpu/target_config/specs/*.txtpb`, a
//! `stream_executor.GpuTargetConfigProto` in text form each: the device's figures, its
//! platform, its cuDNN version), read out of the plugin file itself, and the create options
//! that make a [`crate::Topology`] of such devices.
//!
//! The plugin embeds each description as one NUL-terminated text; siphon reads the one whose
//! `device_description_str` names the device and hands it back unchanged as the topology's
//! `target_config`, so the compiler sees exactly the figures its own authors wrote for it.

use std::path::Path;

use crate::error::{Error, Result};
use crate::named::OptionValue;

/// The key each embedded description ends with: the device's name as CUDA reports it.
const NAME_KEY: &[u8] = b"device_description_str: \"";

/// One GPU as the CUDA plugin describes it (`GpuTargetConfigProto` text).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuTargetConfig {
    /// The device's name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// The description as the plugin holds it: what `target_config` takes.
    pub text: String,
}

impl GpuTargetConfig {
    /// Every description embedded in the plugin file at `plugin`, in file order.
    pub fn embedded(plugin: &Path) -> Result<Vec<GpuTargetConfig>> {
        let file = std::fs::File::open(plugin).map_err(|_| Error::PluginNotFound { path: plugin.to_path_buf() })?;
        // SAFETY: the plugin file is only read, and siphon never writes plugin files; a file
        // changed underneath would at worst yield garbled text, which the compiler refuses.
        let bytes = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| Error::Unexpected(format!("reading {}: {e}", plugin.display())))?;
        Ok(embedded_in(&bytes))
    }

    /// The description of the device named `name` among those embedded in `plugin`, or an
    /// error listing the names it has.
    pub fn find(plugin: &Path, name: &str) -> Result<GpuTargetConfig> {
        let all = GpuTargetConfig::embedded(plugin)?;
        if let Some(config) = all.iter().find(|c| c.name == name) {
            return Ok(config.clone());
        }
        let names: Vec<&str> = all.iter().map(|c| c.name.as_str()).collect();
        Err(Error::InvalidArgument(format!(
            "the CUDA plugin {} describes no device named {name:?} (it has: {})",
            plugin.display(),
            if names.is_empty() { "none".to_string() } else { names.join(", ") }
        )))
    }

    /// A top-level or `gpu_device_info` number of the description, e.g. `device_memory_size`
    /// or `core_count` (the first line `key: value` with that key).
    pub fn number(&self, key: &str) -> Option<f64> {
        self.text.lines().find_map(|line| {
            let (k, v) = line.trim().split_once(':')?;
            (k == key).then(|| v.trim().parse().ok())?
        })
    }

    /// The device's memory in bytes (`device_memory_size`).
    pub fn memory_bytes(&self) -> Option<u64> {
        self.number("device_memory_size").map(|b| b as u64)
    }
}

/// The descriptions in a plugin's bytes: each `device_description_str: "…"` key, widened to
/// the NUL-terminated text around it.
fn embedded_in(bytes: &[u8]) -> Vec<GpuTargetConfig> {
    let mut out = Vec::new();
    for at in memchr::memmem::find_iter(bytes, NAME_KEY) {
        let start = memchr::memrchr(0, &bytes[..at]).map_or(0, |i| i + 1);
        let end = memchr::memchr(0, &bytes[at..]).map_or(bytes.len(), |i| at + i);
        let Ok(text) = std::str::from_utf8(&bytes[start..end]) else { continue };
        // Only whole descriptions: the plugin also holds the key in its parser's strings.
        if !text.contains("gpu_device_info") || !text.contains("platform_name") {
            continue;
        }
        let name_at = at - start + NAME_KEY.len();
        let Some(name) = text[name_at..].split('"').next() else { continue };
        if !out.iter().any(|c: &GpuTargetConfig| c.name == name) {
            out.push(GpuTargetConfig { name: name.to_string(), text: text.to_string() });
        }
    }
    out
}

/// Before a CUDA plugin compiles without a GPU: cuDNN, which builds and checks each fused
/// attention's graph for the target, loads the CUDA driver library (`libcuda.so.1`) even
/// then. A machine with a driver has it; elsewhere the copy `scripts/setup-cuda-compiler.sh`
/// installs beside the plugin (`libcuda/libcuda.so.1` under the install's root) is loaded
/// once, globally, so that cuDNN's own `dlopen` finds it by name. Never in a process that
/// creates a CUDA client: only [`crate::Plugin::load_for_compiling`] calls this.
pub(crate) fn driver_for_compiling(plugin: &Path) {
    static LOADED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    LOADED.get_or_init(|| {
        use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
        // SAFETY: loading the driver library runs its initializers, as the plugin's own load of
        // it would; it is never unloaded (forgotten below).
        if let Ok(system) = unsafe { Library::open(Some("libcuda.so.1"), RTLD_NOW | RTLD_GLOBAL) } {
            std::mem::forget(system);
            return;
        }
        let Some(root) = plugin.parent().and_then(Path::parent).and_then(Path::parent) else { return };
        let copy = root.join("libcuda").join("libcuda.so.1");
        if !copy.is_file() {
            tracing::debug!("no CUDA driver library: cuDNN cannot check its graphs ({} absent)", copy.display());
            return;
        }
        // SAFETY: as above; the file is the driver library the set-up script installed.
        match unsafe { Library::open(Some(&copy), RTLD_NOW | RTLD_GLOBAL) } {
            Ok(lib) => std::mem::forget(lib),
            Err(e) => tracing::warn!("could not load {}: {e}", copy.display()),
        }
    });
}

/// The CUDA plugin's create options for a topology of `target`'s devices:
/// `partitions × hosts × devices` (`topology` `"1x2x8"`: two hosts of eight GPUs).
pub fn gpu_topology_options(
    target: &GpuTargetConfig,
    hosts: usize,
    devices_per_host: usize,
) -> Vec<(String, OptionValue)> {
    vec![
        ("target_config".to_string(), OptionValue::String(target.text.clone())),
        ("topology".to_string(), OptionValue::String(format!("1x{hosts}x{devices_per_host}"))),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn description(name: &str, memory: u64) -> String {
        format!(
            "# a comment\ngpu_device_info {{\n  core_count: 132\n  device_memory_size: {memory}\n  name: \"{name}\"\n}}\n\
             platform_name: \"CUDA\"\ndevice_description_str: \"{name}\"\n"
        )
    }

    #[test]
    fn descriptions_are_read_between_their_nuls() {
        let mut bytes = b"\x7fELF junk\0device_description_str: \"not one\"\0".to_vec();
        bytes.extend_from_slice(description("NVIDIA H100 80GB HBM3", 84942979072).as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(b"\x01\x02");
        bytes.extend_from_slice(description("NVIDIA H200 141GB HBM3e", 151397597184).as_bytes());
        let found = embedded_in(&bytes);
        let names: Vec<&str> = found.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["NVIDIA H100 80GB HBM3", "NVIDIA H200 141GB HBM3e"]);
        assert!(found[0].text.starts_with("# a comment\ngpu_device_info"), "{}", found[0].text);
        assert!(found[0].text.ends_with("HBM3\"\n"));
        assert_eq!(found[0].memory_bytes(), Some(84942979072));
        assert_eq!(found[1].number("core_count"), Some(132.0));
        assert_eq!(found[1].number("no_such_key"), None);
    }

    #[test]
    fn the_topology_names_hosts_and_devices() {
        let target = GpuTargetConfig { name: "x".into(), text: "t".into() };
        let options = gpu_topology_options(&target, 2, 8);
        assert_eq!(options[1], ("topology".to_string(), OptionValue::String("1x2x8".into())));
        assert_eq!(options[0].1, OptionValue::String("t".into()));
    }
}
