//! Finding a PJRT plugin: `--plugin PATH`, then `SIPHON_PJRT_PLUGIN`, then siphon's cache
//! directory, then plugins installed as Python packages (libtpu, jax-cuda12-pjrt).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The pinned CPU plugin version `scripts/install-plugin.sh` installs.
pub const CPU_PLUGIN_VERSION: &str = "2026.6.23";

/// The pinned libtpu version `scripts/setup-libtpu.sh` installs: the TPU compiler siphon plans
/// TPU slices with (`siphon plan --target tpu:…`), on any machine.
pub const LIBTPU_VERSION: &str = "0.0.51";

/// The pinned CUDA plugin (PyPI `jax-cuda12-pjrt`) `scripts/setup-cuda-compiler.sh` installs
/// with what compiling needs beside it: the GPU compiler siphon plans GPUs with (`siphon plan
/// --target gpu:…`), on any x86-64 Linux machine (no GPU needed).
pub const CUDA_COMPILER_VERSION: &str = "0.12.0.1";

/// The environment variable naming a plugin file.
pub const PLUGIN_ENV: &str = "SIPHON_PJRT_PLUGIN";

/// Where a located plugin came from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PluginSource {
    /// Given explicitly (`--plugin PATH`).
    Explicit,
    /// The `SIPHON_PJRT_PLUGIN` environment variable.
    EnvVar,
    /// siphon's cache directory (`scripts/install-plugin.sh` puts the CPU plugin there).
    CacheDir,
    /// A Python package in a site-packages directory.
    PythonPackage {
        /// The PyPI package, e.g. `libtpu` or `jax-cuda12-pjrt`.
        package: &'static str,
    },
}

/// A plugin path and why it was picked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginChoice {
    /// The plugin file.
    pub path: PathBuf,
    /// Which discovery step found it.
    pub source: PluginSource,
    /// A sentence saying why it was picked.
    pub reason: String,
}

/// Another name for [`PluginChoice`].
pub type LocatedPlugin = PluginChoice;

/// Shorthand for `PluginLocator::new().explicit(explicit).locate()`: the plugin this process
/// should use, given an optional `--plugin` path.
pub fn locate_plugin(explicit: Option<&Path>) -> Result<PluginChoice> {
    PluginLocator::new().explicit(explicit).locate()
}

/// The CUDA 12 plugin's Python package: (package, path inside site-packages).
const CUDA12_PACKAGE: (&str, &str) = ("jax-cuda12-pjrt", "jax_plugins/xla_cuda12/xla_cuda_plugin.so");

/// libtpu's Python package: (package, path inside site-packages).
const LIBTPU_PACKAGE: (&str, &str) = ("libtpu", "libtpu/libtpu.so");

/// Plugins shipped inside Python packages: (package, path inside site-packages).
const PYTHON_PLUGINS: &[(&str, &str)] =
    &[LIBTPU_PACKAGE, CUDA12_PACKAGE, ("jax-cuda13-pjrt", "jax_plugins/xla_cuda13/xla_cuda_plugin.so")];

/// Finds a PJRT plugin in siphon's discovery order. Each step's input can be overridden,
/// which keeps tests hermetic.
#[derive(Debug, Clone)]
pub struct PluginLocator {
    explicit: Option<PathBuf>,
    env_value: Option<OsString>,
    cache_dir: Option<PathBuf>,
    python: Option<OsString>,
    site_packages: Option<Vec<PathBuf>>,
}

impl Default for PluginLocator {
    fn default() -> PluginLocator {
        PluginLocator::new()
    }
}

impl PluginLocator {
    /// The locator for this process: `SIPHON_PJRT_PLUGIN` from the environment, siphon's
    /// cache directory, and `python3` from `PATH`.
    pub fn new() -> PluginLocator {
        PluginLocator {
            explicit: None,
            env_value: std::env::var_os(PLUGIN_ENV).filter(|v| !v.is_empty()),
            cache_dir: Some(siphon_cache_dir()),
            python: Some("python3".into()),
            site_packages: None,
        }
    }

    /// Uses `path` (from `--plugin`) before anything else.
    pub fn explicit(mut self, path: Option<impl Into<PathBuf>>) -> PluginLocator {
        self.explicit = path.map(Into::into);
        self
    }

    /// Overrides the `SIPHON_PJRT_PLUGIN` value (`None`: unset).
    pub fn env_value(mut self, value: Option<impl Into<OsString>>) -> PluginLocator {
        self.env_value = value.map(Into::into);
        self
    }

    /// Overrides siphon's cache directory (`None`: skip that step).
    pub fn cache_dir(mut self, dir: Option<impl Into<PathBuf>>) -> PluginLocator {
        self.cache_dir = dir.map(Into::into);
        self
    }

    /// Overrides the site-packages directories to search instead of asking Python
    /// (an empty list skips that step).
    pub fn site_packages(mut self, dirs: Vec<PathBuf>) -> PluginLocator {
        self.site_packages = Some(dirs);
        self
    }

    /// Finds the plugin. An explicit path or `SIPHON_PJRT_PLUGIN` that names a missing file
    /// is an error, not a reason to look elsewhere: the user asked for that file.
    pub fn locate(&self) -> Result<PluginChoice> {
        if let Some(path) = &self.explicit {
            let reason = format!("--plugin {}", path.display());
            return existing(path, PluginSource::Explicit, "--plugin", reason);
        }
        if let Some(value) = &self.env_value {
            let path = PathBuf::from(value);
            let reason = format!("{PLUGIN_ENV}={}", path.display());
            return existing(&path, PluginSource::EnvVar, PLUGIN_ENV, reason);
        }
        let mut tried = vec![format!("--plugin (not given)"), format!("{PLUGIN_ENV} (not set)")];
        let pinned = format!("XLA CPU plugin {CPU_PLUGIN_VERSION}");
        if let Some(choice) = self.cached_or_installed(cpu_plugin_path_in, &pinned, PYTHON_PLUGINS, &mut tried) {
            return Ok(choice);
        }
        Err(Error::NoPluginFound { tried: tried.join("; ") })
    }

    /// Finds libtpu to compile for a TPU topology with, on a machine that may have no TPU:
    /// `--plugin`, then `SIPHON_PJRT_PLUGIN` when it names libtpu (a CPU plugin there is
    /// for runs, not for this), then the pinned libtpu in siphon's cache, then the `libtpu`
    /// Python package.
    pub fn locate_libtpu(&self) -> Result<PluginChoice> {
        if let Some(path) = &self.explicit {
            let reason = format!("--plugin {}", path.display());
            return existing(path, PluginSource::Explicit, "--plugin", reason);
        }
        let mut tried = vec!["--plugin (not given)".to_string()];
        match &self.env_value {
            Some(value) if crate::PluginKind::of(Path::new(value)) == crate::PluginKind::Tpu => {
                let path = PathBuf::from(value);
                let reason = format!("{PLUGIN_ENV}={}", path.display());
                return existing(&path, PluginSource::EnvVar, PLUGIN_ENV, reason);
            }
            Some(value) => tried.push(format!("{PLUGIN_ENV}={} (not libtpu)", Path::new(value).display())),
            None => tried.push(format!("{PLUGIN_ENV} (not set)")),
        }
        let pinned = format!("libtpu {LIBTPU_VERSION}");
        if let Some(choice) = self.cached_or_installed(libtpu_path_in, &pinned, &[LIBTPU_PACKAGE], &mut tried) {
            return Ok(choice);
        }
        Err(Error::NoLibtpuFound { tried: tried.join("; "), version: LIBTPU_VERSION })
    }

    /// Finds the CUDA plugin to compile for a GPU topology with, on a machine that may have no
    /// GPU: `--plugin`, then `SIPHON_PJRT_PLUGIN` when it names a CUDA plugin, then the pinned
    /// one in siphon's cache (with the libraries it compiles with beside it), then the
    /// `jax-cuda12-pjrt` Python package.
    pub fn locate_cuda_compiler(&self) -> Result<PluginChoice> {
        if let Some(path) = &self.explicit {
            let reason = format!("--plugin {}", path.display());
            return existing(path, PluginSource::Explicit, "--plugin", reason);
        }
        let mut tried = vec!["--plugin (not given)".to_string()];
        match &self.env_value {
            Some(value) if crate::PluginKind::of(Path::new(value)) == crate::PluginKind::Cuda => {
                let path = PathBuf::from(value);
                let reason = format!("{PLUGIN_ENV}={}", path.display());
                return existing(&path, PluginSource::EnvVar, PLUGIN_ENV, reason);
            }
            Some(value) => tried.push(format!("{PLUGIN_ENV}={} (not a CUDA plugin)", Path::new(value).display())),
            None => tried.push(format!("{PLUGIN_ENV} (not set)")),
        }
        let pinned = format!("CUDA plugin {CUDA_COMPILER_VERSION}");
        if let Some(choice) = self.cached_or_installed(cuda_compiler_path_in, &pinned, &[CUDA12_PACKAGE], &mut tried) {
            return Ok(choice);
        }
        Err(Error::NoCudaCompilerFound { tried: tried.join("; "), version: CUDA_COMPILER_VERSION })
    }

    /// The pinned plugin (`pinned` names it) where `in_cache` puts it in siphon's cache, else
    /// the first of `packages` (PyPI name, path in site-packages) installed for Python; each
    /// place looked at is added to `tried`.
    fn cached_or_installed(
        &self,
        in_cache: fn(&Path) -> PathBuf,
        pinned: &str,
        packages: &[(&'static str, &'static str)],
        tried: &mut Vec<String>,
    ) -> Option<PluginChoice> {
        if let Some(cache) = &self.cache_dir {
            let path = in_cache(cache);
            if path.is_file() {
                return Some(PluginChoice {
                    reason: format!("found the pinned {pinned} in siphon's cache directory {}", cache.display()),
                    path,
                    source: PluginSource::CacheDir,
                });
            }
            tried.push(path.display().to_string());
        }
        let site_dirs = match &self.site_packages {
            Some(dirs) => dirs.clone(),
            None => python_site_dirs(self.python.as_deref()),
        };
        for &(package, relative) in packages {
            for dir in &site_dirs {
                let path = dir.join(relative);
                if path.is_file() {
                    return Some(PluginChoice {
                        reason: format!("found the {package} Python package's plugin in {}", dir.display()),
                        path,
                        source: PluginSource::PythonPackage { package },
                    });
                }
            }
            tried.push(format!("{relative} in {} site-packages dirs", site_dirs.len()));
        }
        None
    }
}

fn existing(path: &Path, source: PluginSource, from: &'static str, reason: String) -> Result<PluginChoice> {
    if !path.exists() {
        return Err(Error::ConfiguredPluginMissing { path: path.to_path_buf(), from });
    }
    Ok(PluginChoice { path: path.to_path_buf(), source, reason })
}

/// siphon's machine cache directory:
/// `${SIPHON_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/siphon}`.
pub fn siphon_cache_dir() -> PathBuf {
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = set("SIPHON_CACHE_DIR") {
        return dir;
    }
    let base = set("XDG_CACHE_HOME")
        .or_else(|| set("HOME").map(|home| home.join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("siphon")
}

/// Where `scripts/install-plugin.sh` installs the pinned CPU plugin under `cache`.
pub fn cpu_plugin_path_in(cache: &Path) -> PathBuf {
    cache.join("pjrt").join(format!("xla-cpu-{CPU_PLUGIN_VERSION}")).join("libpjrt_cpu.so")
}

/// Where `scripts/setup-libtpu.sh` installs the pinned libtpu under `cache`.
pub fn libtpu_path_in(cache: &Path) -> PathBuf {
    cache.join("pjrt").join(format!("libtpu-{LIBTPU_VERSION}")).join("libtpu.so")
}

/// Where `scripts/setup-cuda-compiler.sh` installs the pinned CUDA plugin under `cache`: laid
/// out as in site-packages (`nvidia/…` beside `jax_plugins/`), where the plugin's own search
/// paths find cuDNN, `ptxas` and libdevice.
pub fn cuda_compiler_path_in(cache: &Path) -> PathBuf {
    cache.join("pjrt").join(format!("xla-cuda12-{CUDA_COMPILER_VERSION}")).join(CUDA12_PACKAGE.1)
}

/// The default path of the pinned CPU plugin.
pub fn default_cpu_plugin_path() -> PathBuf {
    cpu_plugin_path_in(&siphon_cache_dir())
}

/// Site-packages directories: asked from `python` (5 s limit), plus common locations.
fn python_site_dirs(python: Option<&std::ffi::OsStr>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(python) = python {
        let script = "import site,sys\n\
            paths=list(getattr(site,'getsitepackages',lambda:[])())\n\
            paths.append(site.getusersitepackages())\n\
            paths.extend(sys.path)\n\
            print('\\n'.join(p for p in paths if p))";
        if let Some(output) = run_with_timeout(python, &["-c", script], Duration::from_secs(5)) {
            dirs.extend(output.lines().filter(|l| !l.is_empty()).map(PathBuf::from));
        }
    }
    // Common places, for when python3 is not on PATH (e.g. a venv not activated).
    let mut roots = vec![PathBuf::from("/usr/local/lib"), PathBuf::from("/usr/lib")];
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        roots.push(PathBuf::from(venv).join("lib"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(PathBuf::from(home).join(".local/lib"));
    }
    for root in roots {
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        let mut found: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("python3")))
            .flat_map(|p| [p.join("site-packages"), p.join("dist-packages")])
            .filter(|p| p.is_dir())
            .collect();
        found.sort();
        dirs.extend(found);
    }
    dirs.push(PathBuf::from("/usr/lib/python3/dist-packages"));
    let mut unique = Vec::new();
    for dir in dirs {
        if dir.is_dir() && !unique.contains(&dir) {
            unique.push(dir);
        }
    }
    unique
}

/// Runs a command, returning its stdout if it succeeds within `timeout` (killed otherwise).
fn run_with_timeout(program: &std::ffi::OsStr, args: &[&str], timeout: Duration) -> Option<String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(_)) => return None,
            Ok(None) if start.elapsed() < timeout => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let mut output = String::new();
    use std::io::Read;
    child.stdout.take()?.read_to_string(&mut output).ok()?;
    Some(output)
}
