//! Plugin discovery order, hermetic: every input of the locator is a temp directory.

use std::path::{Path, PathBuf};

use siphon_runtime::{Error, PluginLocator, PluginSource, cpu_plugin_path_in};

fn touch(path: &Path) -> PathBuf {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, b"\x7fELF").unwrap();
    path.to_path_buf()
}

/// A locator that sees nothing of this machine.
fn bare() -> PluginLocator {
    PluginLocator::new().env_value(None::<&str>).cache_dir(None::<&str>).site_packages(Vec::new())
}

#[test]
fn explicit_path_wins_over_env_cache_and_python() {
    let dir = tempfile::tempdir().unwrap();
    let explicit = touch(&dir.path().join("explicit.so"));
    let env = touch(&dir.path().join("env.so"));
    let cache = dir.path().join("cache");
    touch(&cpu_plugin_path_in(&cache));
    let site = dir.path().join("site");
    touch(&site.join("libtpu/libtpu.so"));
    let locator = bare()
        .explicit(Some(&explicit))
        .env_value(Some(&env))
        .cache_dir(Some(&cache))
        .site_packages(vec![site.clone()]);
    let choice = locator.clone().locate().unwrap();
    assert_eq!((choice.path, choice.source), (explicit, PluginSource::Explicit));

    let choice = locator.clone().explicit(None::<&str>).locate().unwrap();
    assert_eq!((choice.path, choice.source), (env, PluginSource::EnvVar));
    assert!(choice.reason.contains("SIPHON_PJRT_PLUGIN"));

    let choice = locator.clone().explicit(None::<&str>).env_value(None::<&str>).locate().unwrap();
    assert_eq!((choice.path, choice.source), (cpu_plugin_path_in(&cache), PluginSource::CacheDir));
    assert!(choice.reason.contains("cache"));

    let choice = locator.explicit(None::<&str>).env_value(None::<&str>).cache_dir(None::<&str>).locate().unwrap();
    assert_eq!(choice.path, site.join("libtpu/libtpu.so"));
    assert_eq!(choice.source, PluginSource::PythonPackage { package: "libtpu" });
}

#[test]
fn cuda_plugin_is_found_in_site_packages() {
    let dir = tempfile::tempdir().unwrap();
    let empty_site = dir.path().join("a");
    std::fs::create_dir_all(&empty_site).unwrap();
    let site = dir.path().join("b");
    let cuda = touch(&site.join("jax_plugins/xla_cuda12/xla_cuda_plugin.so"));
    let choice = bare().site_packages(vec![empty_site, site.clone()]).locate().unwrap();
    assert_eq!(choice.path, cuda);
    assert_eq!(choice.source, PluginSource::PythonPackage { package: "jax-cuda12-pjrt" });
    assert!(choice.reason.contains(&site.display().to_string()));
}

#[test]
fn configured_paths_that_do_not_exist_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    touch(&cpu_plugin_path_in(&cache));
    // A wrong SIPHON_PJRT_PLUGIN is reported even though the cache has a plugin.
    let err = bare().env_value(Some(dir.path().join("gone.so"))).cache_dir(Some(&cache)).locate().unwrap_err();
    assert!(matches!(err, Error::ConfiguredPluginMissing { from: "SIPHON_PJRT_PLUGIN", .. }), "{err:?}");
    assert!(err.to_string().contains("gone.so"));
}

#[test]
fn nothing_found_lists_what_was_tried() {
    let dir = tempfile::tempdir().unwrap();
    let err = bare().cache_dir(Some(dir.path())).locate().unwrap_err();
    assert!(matches!(err, Error::NoPluginFound { .. }));
    let text = err.to_string();
    assert!(text.contains(&cpu_plugin_path_in(dir.path()).display().to_string()), "{text}");
    assert!(text.contains("libtpu"), "{text}");
    assert!(text.contains("install-plugin.sh"), "{text}");
}

/// libtpu to compile TPU programs with: `--plugin`, `SIPHON_PJRT_PLUGIN` only when it is libtpu
/// (a test run points it at the CPU plugin), the pinned one in the cache, the Python package;
/// none of them: the one command that installs it.
#[test]
fn libtpu_for_tpu_plans_is_found_past_a_cpu_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let cpu = touch(&dir.path().join("cpu/libpjrt_cpu.so"));
    let cache = dir.path().join("cache");
    let cached = touch(&siphon_runtime::libtpu_path_in(&cache));
    let site = dir.path().join("site");
    let package = touch(&site.join("libtpu/libtpu.so"));
    let locator = bare().env_value(Some(&cpu)).cache_dir(Some(&cache)).site_packages(vec![site.clone()]);

    let choice = locator.clone().locate_libtpu().unwrap();
    assert_eq!((choice.path, choice.source), (cached.clone(), PluginSource::CacheDir));
    assert!(choice.reason.contains("the pinned libtpu 0.0.51"), "{}", choice.reason);
    let env = touch(&dir.path().join("env/libtpu.so"));
    let choice = locator.clone().env_value(Some(&env)).locate_libtpu().unwrap();
    assert_eq!((choice.path, choice.source), (env, PluginSource::EnvVar));
    let choice = locator.clone().cache_dir(None::<&str>).locate_libtpu().unwrap();
    assert_eq!((choice.path, choice.source), (package, PluginSource::PythonPackage { package: "libtpu" }));
    // The CPU plugin itself is still what `locate` finds for runs.
    assert_eq!(locator.clone().locate().unwrap().path, cpu);

    let err = locator.cache_dir(None::<&str>).site_packages(Vec::new()).locate_libtpu().unwrap_err();
    assert!(matches!(err, Error::NoLibtpuFound { .. }), "{err}");
    let text = err.to_string();
    for expected in ["(not libtpu)", "pip install libtpu==0.0.51", "scripts/setup-libtpu.sh"] {
        assert!(text.contains(expected), "{expected:?} missing from {text}");
    }
}
