//! The Python interpreter that runs `python -m siphon` for the commands whose work is the
//! `siphon` Python package's (the exports, the dashboards): `--python`, `SIPHON_PYTHON`, the
//! `python` beside this executable (a venv's `bin/`), then `python3` on `PATH`.

use std::path::PathBuf;
use std::process::Command as Process;

use anyhow::{Context, bail};

/// The interpreter to run `python -m siphon` with, once it imports `module`.
pub(crate) fn checked(given: Option<PathBuf>, module: &str, extra: &str) -> anyhow::Result<PathBuf> {
    let python = python(given);
    let probe = Process::new(&python)
        .args(["-c", &format!("import {module}")])
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !probe.status.success() {
        bail!(
            "{} cannot import the siphon Python package ({}): `pip install <siphon checkout>`{extra}, or name another interpreter with --python",
            python.display(),
            String::from_utf8_lossy(&probe.stderr).trim().lines().last().unwrap_or("no output")
        );
    }
    Ok(python)
}

fn python(given: Option<PathBuf>) -> PathBuf {
    if let Some(python) = given {
        return python;
    }
    let beside =
        std::env::current_exe().ok().and_then(|exe| exe.parent().map(|dir| dir.join("python"))).filter(|p| p.exists());
    beside.unwrap_or_else(|| PathBuf::from("python3"))
}
