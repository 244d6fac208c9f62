//! Helpers shared by the engine's test binaries.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use siphon_runtime::{Client, ClientOptions, Plugin};

/// A client of 8 CPU devices per test (the plugin is loaded once): a client kept in a static
/// until the process exits races XLA's own static destructors.
pub fn client() -> Client {
    static PLUGIN: OnceLock<Arc<Plugin>> = OnceLock::new();
    let plugin = PLUGIN.get_or_init(|| {
        let path = std::env::var_os("SIPHON_PJRT_PLUGIN")
            .map(PathBuf::from)
            .unwrap_or_else(siphon_runtime::default_cpu_plugin_path);
        assert!(path.is_file(), "no PJRT plugin at {}: run scripts/install-plugin.sh", path.display());
        Plugin::load(&path).expect("load the PJRT plugin")
    });
    Client::new(plugin, ClientOptions::new().cpu_device_count(8)).expect("CPU client")
}

/// A model fixture under `fixtures/models`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models").join(name)
}
