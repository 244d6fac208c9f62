//! `--steer HOOK=FILE[:SCALE]`: steering vectors added to a hook's value for the rest of the
//! forward (`siphon_models::Steering`), as `siphon forward` and `siphon extract` read them, and
//! what a run records of each ([`SteerRecord`]: the hook, the file's sha256 and the scale, so
//! that a resume with another vector or scale is refused).

use std::path::Path;

use anyhow::{Context, bail};
use serde::Serialize;
use sha2::{Digest, Sha256};
use siphon_models::{ModelConfig, Steering};

/// The most bytes a steering vector's file may have (a vector of 2^20 float64 values).
const MAX_VECTOR_BYTES: u64 = 8 << 20;

/// What a run records of one steering vector.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SteerRecord {
    /// The hook it is added to.
    pub hook: String,
    /// The sha256 of its file's bytes (the path is not recorded: a moved file is the same
    /// vector).
    pub sha256: String,
    /// The scale it is multiplied by.
    pub scale: f32,
}

/// Every `--steer` of `args` on `config`'s model, each hook once and each one siphon steers,
/// with what a run records of each.
pub fn open_all(args: &[String], config: &ModelConfig) -> anyhow::Result<(Vec<Steering>, Vec<SteerRecord>)> {
    let opened = args.iter().map(|arg| open(arg, config)).collect::<anyhow::Result<Vec<_>>>()?;
    let hooks: Vec<_> = opened.iter().map(|(s, _)| s.hook).collect();
    siphon_models::steering::check_all(&hooks, config).context("--steer")?;
    Ok(opened.into_iter().unzip())
}

/// `HOOK=FILE[:SCALE]` as the steering vector it names (a scale only where the text after the
/// last `:` is a number, so a path may hold colons) and its record.
fn open(arg: &str, config: &ModelConfig) -> anyhow::Result<(Steering, SteerRecord)> {
    let (hook, file) = arg.split_once('=').with_context(|| format!("--steer {arg:?}: expected HOOK=FILE[:SCALE]"))?;
    let (file, scale) = match file.rsplit_once(':').map(|(f, s)| (f, s.parse::<f32>())) {
        Some((file, Ok(scale))) => (file, scale),
        _ => (file, 1.0),
    };
    let hooks = siphon_models::resolve_hooks(hook, config).with_context(|| format!("--steer {arg:?}"))?;
    let [hook] = hooks[..] else { bail!("--steer {arg:?}: {hook} names {} hooks, one expected", hooks.len()) };
    let path = Path::new(file);
    super::files::check_regular(path, "--steer", MAX_VECTOR_BYTES)?;
    let steering = Steering::read(hook, path, scale, config).with_context(|| format!("--steer {arg:?}"))?;
    let bytes = std::fs::read(path).with_context(|| format!("cannot read --steer {}", path.display()))?;
    let sha256 = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    Ok((steering, SteerRecord { hook: hook.to_string(), sha256, scale }))
}
