//! `siphon extract`: the whole job — the same command on every host.
//!
//! Flags and/or a TOML file (`--config run.toml`; keys are the long flag names, e.g.
//! `seq-len = 512`, `layers = "20-27"`, `pack = true`). Flags win: the file's entries are
//! turned into arguments placed *before* the command line's, and clap lets a later occurrence
//! of an option override an earlier one. So a TOML file is validated exactly like flags.

use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::args::files;
use crate::job::{self, ExtractOptions};

/// The flags of `siphon extract`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// TOML file with any of these options (long names as keys); flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub options: ExtractOptions,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    crate::interrupt::install();
    let mut options = args.options;
    if let Some(flags) = options.generate.take() {
        options = super::generate::completions_first(options, &flags)?;
        crate::interrupt::install();
    }
    job::run(options)
}

/// Expands `extract --config FILE` in a command line: the file's entries become arguments
/// right after `extract`, so that the command line's own flags, coming later, override them.
/// Returns the arguments unchanged when there is no extract config.
pub fn expand_config_file(args: Vec<String>) -> anyhow::Result<Vec<String>> {
    let Some(at) = args.iter().position(|a| a == "extract") else { return Ok(args) };
    let mut path = None;
    for (i, arg) in args.iter().enumerate().skip(at + 1) {
        if arg == "--config" {
            path = Some(args.get(i + 1).context("--config needs a file")?.clone());
        } else if let Some(value) = arg.strip_prefix("--config=") {
            path = Some(value.to_string());
        }
    }
    let Some(path) = path else { return Ok(args) };
    let text = files::read_text(path.as_ref(), "the config file", files::MAX_TEXT_BYTES)?;
    let from_file = toml_to_args(&text).with_context(|| format!("in the config file {path}"))?;
    let mut out = args[..=at].to_vec();
    out.extend(from_file);
    out.extend_from_slice(&args[at + 1..]);
    Ok(out)
}

/// `key = value` entries as `--key value` arguments; `true` booleans as bare flags.
fn toml_to_args(text: &str) -> anyhow::Result<Vec<String>> {
    let table: toml::Table = text.parse().context("not valid TOML")?;
    let mut args = Vec::new();
    for (key, value) in table {
        if key == "config" {
            bail!("a config file cannot name another config file");
        }
        let flag = format!("--{}", key.replace('_', "-"));
        match value {
            toml::Value::Boolean(true) => args.push(flag),
            toml::Value::Boolean(false) => {}
            toml::Value::String(s) => args.extend([flag, s]),
            toml::Value::Integer(i) => args.extend([flag, i.to_string()]),
            toml::Value::Float(f) => args.extend([flag, f.to_string()]),
            toml::Value::Array(items) => {
                let parts: Vec<String> = items
                    .iter()
                    .map(|item| match item {
                        toml::Value::String(s) => Ok(s.clone()),
                        toml::Value::Integer(i) => Ok(i.to_string()),
                        other => bail!("{key}: unsupported list item {other}"),
                    })
                    .collect::<anyhow::Result<_>>()?;
                args.extend([flag, parts.join(",")]);
            }
            other => bail!("{key}: unsupported value {other}"),
        }
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_entries_become_flags() {
        let args =
            toml_to_args("seq-len = 128\npack = true\nshuffle = false\nhooks = [\"a\", \"b\"]\nmodel = \"m\"").unwrap();
        assert_eq!(args, ["--hooks", "a,b", "--model", "m", "--pack", "--seq-len", "128"]);
        assert!(toml_to_args("config = \"x\"").is_err());
        assert!(toml_to_args("seq-len = ").is_err());
    }

    #[test]
    fn later_flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.toml");
        std::fs::write(&path, "seq-len = 128\nbatch-size = 2\ncorpus = \"c\"").unwrap();
        let argv: Vec<String> =
            ["siphon", "extract", "--config", path.to_str().unwrap(), "--seq-len", "64", "--model", "m"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        let expanded = expand_config_file(argv).unwrap();
        let cli = <crate::Cli as clap::Parser>::try_parse_from(&expanded).unwrap();
        let crate::Command::Extract(args) = cli.command else { panic!("not extract") };
        assert_eq!(args.options.corpus.seq_len, 64);
        assert_eq!(args.options.corpus.batch_size, 2);
        assert_eq!(args.options.corpus.corpus, "c");
        assert!(expand_config_file(vec!["siphon".into(), "extract".into(), "--config".into()]).is_err());
    }
}
