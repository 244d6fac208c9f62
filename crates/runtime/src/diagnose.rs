//! Why a plugin could not start, in words a user can act on.
//!
//! PJRT's own message for a plugin on the wrong machine is often cryptic (libtpu on a host
//! without a TPU, the CUDA plugin without a GPU or driver). [`PluginKind::of`] tells from the
//! file which platform a plugin is for, [`Machine::probe`] looks at what this host has (device
//! files, the NVIDIA driver library, `CUDA_VISIBLE_DEVICES`), and [`likely_cause`] names what
//! is missing. The runtime attaches that sentence to every load, initialize and client-create
//! failure ([`crate::Error::PluginStart`], [`crate::Error::LoadFailed`]), and [`preflight`]
//! refuses a TPU or CUDA plugin on a machine that certainly lacks its devices before loading it
//! ([`crate::Error::DevicesMissing`]).
//!
//! Reading device files and environment only: nothing here opens a device or calls a plugin
//! (the CUDA check loads the driver library `libcuda.so.1`, nothing else).

use std::fmt;
use std::path::{Path, PathBuf};

/// Which platform a plugin file is for, judged from its name and location.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PluginKind {
    /// libtpu (PyPI `libtpu`): Cloud TPU.
    Tpu,
    /// The CUDA plugin (PyPI `jax-cuda12-pjrt` / `jax-cuda13-pjrt`): NVIDIA GPUs.
    Cuda,
    /// An XLA CPU plugin.
    Cpu,
    /// Anything else.
    Other,
}

impl PluginKind {
    /// The kind of the plugin at `path`: `libtpu*.so` is TPU, a file or directory name with
    /// `cuda` is CUDA, one with `cpu` is CPU.
    pub fn of(path: &Path) -> PluginKind {
        let name = path.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
        let parent = path.parent().map(|p| p.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
        if name.starts_with("libtpu") {
            PluginKind::Tpu
        } else if name.contains("cuda") || parent.contains("xla_cuda") {
            PluginKind::Cuda
        } else if name.contains("cpu") {
            PluginKind::Cpu
        } else {
            PluginKind::Other
        }
    }
}

impl fmt::Display for PluginKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PluginKind::Tpu => "the TPU plugin (libtpu)",
            PluginKind::Cuda => "the CUDA plugin",
            PluginKind::Cpu => "the CPU plugin",
            PluginKind::Other => "the PJRT plugin",
        })
    }
}

/// What this host has for a plugin to run on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Machine {
    /// TPU device files: `/dev/accel*` (TPU v2–v5e) or `/dev/vfio/<n>` (v5p, v6e and later).
    pub tpu_devices: Vec<PathBuf>,
    /// NVIDIA device files: `/dev/nvidia<n>`.
    pub nvidia_devices: Vec<PathBuf>,
    /// Whether the NVIDIA driver's `libcuda.so.1` can be loaded.
    pub libcuda: bool,
    /// `CUDA_VISIBLE_DEVICES`, when set.
    pub cuda_visible_devices: Option<String>,
}

impl Machine {
    /// Looks at this host (device files under `/dev`, the driver library, the environment).
    pub fn probe() -> Machine {
        let mut machine = Machine::probe_dev(Path::new("/dev"));
        // SAFETY: loading the NVIDIA driver library runs its initializers, which is what the
        // CUDA plugin itself does first; it is only tried for the CUDA plugin's diagnosis.
        machine.libcuda = unsafe { libloading::Library::new("libcuda.so.1") }.is_ok();
        machine.cuda_visible_devices = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        machine
    }

    /// How many GPUs the CUDA plugin will see here: the entries of `CUDA_VISIBLE_DEVICES`
    /// when set, else the `/dev/nvidia<n>` device files.
    pub fn visible_gpus(&self) -> usize {
        match &self.cuda_visible_devices {
            Some(list) => list.split(',').filter(|d| !d.trim().is_empty()).count(),
            None => self.nvidia_devices.len(),
        }
    }

    /// The device files under `dev` (a directory laid out like `/dev`); no library check.
    pub fn probe_dev(dev: &Path) -> Machine {
        let names = |dir: &Path| -> Vec<PathBuf> {
            let mut found: Vec<PathBuf> =
                std::fs::read_dir(dir).map(|entries| entries.flatten().map(|e| e.path()).collect()).unwrap_or_default();
            found.sort();
            found
        };
        let file_name = |p: &PathBuf| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let numbered = |name: &str, prefix: &str| {
            name.strip_prefix(prefix).is_some_and(|rest| !rest.is_empty() && rest.chars().all(|c| c.is_ascii_digit()))
        };
        let top = names(dev);
        let mut tpu_devices: Vec<PathBuf> = top.iter().filter(|p| numbered(&file_name(p), "accel")).cloned().collect();
        tpu_devices.extend(names(&dev.join("vfio")).into_iter().filter(|p| numbered(&file_name(p), "")));
        let nvidia_devices = top.iter().filter(|p| numbered(&file_name(p), "nvidia")).cloned().collect();
        Machine { tpu_devices, nvidia_devices, libcuda: false, cuda_visible_devices: None }
    }
}

/// Bytes of memory this host can still give a process: `/proc/meminfo`'s `MemAvailable`,
/// capped by the process's cgroup limit (`memory.max` of cgroup v2 less what the group already
/// uses: a container's or a Kubernetes pod's limit). `None` where neither can be read.
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let host = meminfo.as_deref().and_then(|text| meminfo_bytes(text, "MemAvailable"));
    let cgroup = cgroup_path().and_then(|dir| {
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        let max: u64 = read("memory.max")?.trim().parse().ok()?;
        let current: u64 = read("memory.current").and_then(|c| c.trim().parse().ok()).unwrap_or(0);
        Some(max.saturating_sub(current))
    });
    match (host, cgroup) {
        (Some(h), Some(c)) => Some(h.min(c)),
        (h, c) => h.or(c),
    }
}

/// A `/proc/meminfo` field (`MemAvailable:   123 kB`) in bytes.
fn meminfo_bytes(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.split(':').next() == Some(field))?;
    let kib: u64 = line.split(':').nth(1)?.trim().trim_end_matches("kB").trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// This process's cgroup v2 directory (`0::/path` in `/proc/self/cgroup`).
fn cgroup_path() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/')))
}

/// What this machine lacks for a plugin of `kind`, as a sentence; `None` when nothing obvious
/// is missing (then PJRT's own message is all there is).
pub fn likely_cause(kind: PluginKind, machine: &Machine) -> Option<String> {
    match kind {
        PluginKind::Tpu if machine.tpu_devices.is_empty() => Some(
            "this machine has no TPU (no /dev/accel* or /dev/vfio/<n> device): libtpu runs only on a Cloud TPU VM \
             or a GKE TPU node; elsewhere use the CPU plugin (scripts/install-plugin.sh) or the CUDA plugin \
             (pass --plugin or set SIPHON_PJRT_PLUGIN)"
                .to_string(),
        ),
        PluginKind::Tpu => Some(format!(
            "this machine has TPU devices ({}); if another process holds them (only one process per host can \
             open a TPU), stop it: `sudo lsof -w /dev/accel* /dev/vfio/*` shows which",
            machine.tpu_devices.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )),
        PluginKind::Cuda => {
            if let Some(visible) = &machine.cuda_visible_devices
                && (visible.trim().is_empty() || visible.trim() == "-1" || visible.trim() == "NoDevFiles")
            {
                return Some(format!("CUDA_VISIBLE_DEVICES='{visible}' hides every GPU from the CUDA plugin"));
            }
            if machine.nvidia_devices.is_empty() && !machine.libcuda {
                return Some(
                    "this machine has no NVIDIA GPU (no /dev/nvidia<n> device and no driver library libcuda.so.1): \
                     the CUDA plugin needs a GPU node with the NVIDIA driver (in a container: the NVIDIA container \
                     toolkit, e.g. `docker run --gpus all`); elsewhere use the CPU plugin (scripts/install-plugin.sh)"
                        .to_string(),
                );
            }
            if !machine.libcuda {
                return Some(
                    "the NVIDIA driver library libcuda.so.1 cannot be loaded: install the driver, or in a container \
                     run with the NVIDIA container toolkit (`--gpus all`)"
                        .to_string(),
                );
            }
            if machine.nvidia_devices.is_empty() {
                return Some(
                    "no /dev/nvidia<n> device is visible: is this process allowed to see the GPUs?".to_string(),
                );
            }
            None
        }
        PluginKind::Cpu | PluginKind::Other => None,
    }
}

/// The environment variable that skips [`preflight`].
pub const SKIP_DEVICE_CHECK_ENV: &str = "SIPHON_SKIP_DEVICE_CHECK";

/// Refuses to load a plugin on a machine that certainly lacks its devices, before any of the
/// plugin's code runs: libtpu on a host without TPU device files (libtpu itself then spends
/// minutes retrying the GCE metadata server before it fails, measured with PyPI libtpu 0.0.51),
/// the CUDA plugin on a host with neither NVIDIA device files nor the driver library. Returns
/// the reason; `SIPHON_SKIP_DEVICE_CHECK=1` turns the check off (devices this check does not
/// know about).
pub fn preflight(path: &Path) -> Result<(), (PluginKind, String)> {
    if std::env::var_os(SKIP_DEVICE_CHECK_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
        return Ok(());
    }
    let kind = PluginKind::of(path);
    let refused = match kind {
        PluginKind::Tpu => Machine::probe_dev(Path::new("/dev")).tpu_devices.is_empty(),
        PluginKind::Cuda => {
            let machine = Machine::probe();
            machine.nvidia_devices.is_empty() && !machine.libcuda
        }
        PluginKind::Cpu | PluginKind::Other => false,
    };
    match refused {
        true => Err((kind, likely_cause(kind, &Machine::probe()).unwrap_or_default())),
        false => Ok(()),
    }
}

/// The likely cause for the plugin at `path` on this machine, probing it only for TPU and CUDA
/// plugins.
pub(crate) fn likely_cause_for(path: &Path) -> Option<String> {
    let kind = PluginKind::of(path);
    match kind {
        PluginKind::Tpu | PluginKind::Cuda => likely_cause(kind, &Machine::probe()),
        PluginKind::Cpu | PluginKind::Other => None,
    }
}

/// A hint for a library the dynamic loader refused, from the loader's message and the plugin's
/// platform.
pub(crate) fn load_failure_hint(path: &Path, reason: &str) -> Option<String> {
    if reason.contains("GLIBC_") {
        return Some("the plugin needs a newer C library (glibc) than this system has".to_string());
    }
    likely_cause_for(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn available_memory_reads_meminfo_and_is_known_here() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(meminfo_bytes(text, "MemAvailable"), Some(20_000_000 * 1024));
        assert_eq!(meminfo_bytes(text, "Mem"), None);
        let here = available_memory().expect("Linux reports MemAvailable");
        assert!(here > 1 << 20, "{here}");
    }

    #[test]
    fn kinds_from_file_names() {
        let kind = |p: &str| PluginKind::of(Path::new(p));
        assert_eq!(kind("/venv/lib/python3.11/site-packages/libtpu/libtpu.so"), PluginKind::Tpu);
        assert_eq!(kind("/x/jax_plugins/xla_cuda12/xla_cuda_plugin.so"), PluginKind::Cuda);
        assert_eq!(kind("/cache/pjrt/xla-cpu-2026.6.23/libpjrt_cpu.so"), PluginKind::Cpu);
        assert_eq!(kind("/opt/libpjrt_rocm.so"), PluginKind::Other);
    }

    #[test]
    fn device_files_are_found_under_a_dev_directory() {
        let dev = tempfile::tempdir().unwrap();
        for name in ["accel0", "accel1", "accelerometer", "nvidia0", "nvidiactl", "null"] {
            std::fs::write(dev.path().join(name), b"").unwrap();
        }
        std::fs::create_dir(dev.path().join("vfio")).unwrap();
        for name in ["vfio", "3"] {
            std::fs::write(dev.path().join("vfio").join(name), b"").unwrap();
        }
        let machine = Machine::probe_dev(dev.path());
        let names = |paths: &[PathBuf]| {
            paths.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect::<Vec<_>>()
        };
        assert_eq!(names(&machine.tpu_devices), ["accel0", "accel1", "3"]);
        assert_eq!(names(&machine.nvidia_devices), ["nvidia0"]);
        assert_eq!(Machine::probe_dev(&dev.path().join("missing")), Machine::default());
    }

    #[test]
    fn causes_name_what_is_missing() {
        let bare = Machine::default();
        assert!(likely_cause(PluginKind::Tpu, &bare).unwrap().contains("no TPU"));
        let tpu = Machine { tpu_devices: vec!["/dev/vfio/0".into()], ..Machine::default() };
        assert!(likely_cause(PluginKind::Tpu, &tpu).unwrap().contains("another process"));
        assert!(likely_cause(PluginKind::Cuda, &bare).unwrap().contains("no NVIDIA GPU"));
        let gpu = Machine { nvidia_devices: vec!["/dev/nvidia0".into()], libcuda: true, ..Machine::default() };
        assert_eq!(likely_cause(PluginKind::Cuda, &gpu), None);
        let hidden = Machine { cuda_visible_devices: Some("".into()), ..gpu.clone() };
        assert!(likely_cause(PluginKind::Cuda, &hidden).unwrap().contains("CUDA_VISIBLE_DEVICES"));
        let no_driver = Machine { libcuda: false, ..gpu };
        assert!(likely_cause(PluginKind::Cuda, &no_driver).unwrap().contains("libcuda.so.1"));
        assert_eq!(likely_cause(PluginKind::Cpu, &bare), None);
    }
}
