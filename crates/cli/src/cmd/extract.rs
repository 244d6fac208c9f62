//! `siphon extract`: the whole job — the same command on every host.
//!
//! Flags and/or a TOML file (`--config run.toml`; keys are the long flag names, e.g.
//! `seq-len = 512`, `layers = "20-27"`, `pack = true`). Flags win: the file's entries are
//! turned into arguments placed *before* the command line's, and clap lets a later occurrence
//! of an option override an earlier one. So a TOML file is validated exactly like flags.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{FromArgMatches, Parser};

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

/// Re-parses `siphon extract` arguments with the TOML file's entries in front.
#[derive(Parser)]
#[command(name = "siphon extract", no_binary_name = true, args_override_self = true)]
struct Reparse {
    #[command(flatten)]
    args: Args,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let args = match &args.config {
        None => args,
        Some(path) => with_config_file(path)?,
    };
    job::run(args.options)
}

/// Parses the process's `extract` arguments again with the TOML file's entries first.
fn with_config_file(path: &std::path::Path) -> anyhow::Result<Args> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    let from_file = toml_to_args(&text).with_context(|| format!("in the config file {}", path.display()))?;
    let from_command_line: Vec<String> = std::env::args()
        .skip_while(|a| a != "extract")
        .skip(1)
        .collect();
    let all: Vec<String> = from_file.into_iter().chain(from_command_line).collect();
    let matches = <Reparse as clap::CommandFactory>::command()
        .try_get_matches_from(&all)
        .map_err(|e| anyhow::anyhow!("{}", e.render()))?;
    Ok(Reparse::from_arg_matches(&matches)?.args)
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
        let args = toml_to_args("seq-len = 128\npack = true\nshuffle = false\nhooks = [\"a\", \"b\"]\nmodel = \"m\"")
            .unwrap();
        assert_eq!(args, ["--hooks", "a,b", "--model", "m", "--pack", "--seq-len", "128"]);
        assert!(toml_to_args("config = \"x\"").is_err());
        assert!(toml_to_args("seq-len = ").is_err());
    }

    #[test]
    fn later_flags_override_the_file() {
        let file = toml_to_args("seq-len = 128\nbatch-size = 2").unwrap();
        let cli = ["--seq-len", "64", "--model", "m", "--corpus", "c", "--output", "o", "--layers", "1"];
        let all: Vec<String> = file.into_iter().chain(cli.iter().map(|s| s.to_string())).collect();
        let parsed = Reparse::try_parse_from(&all).unwrap().args.options;
        assert_eq!(parsed.seq_len, 64);
        assert_eq!(parsed.batch_size, 2);
    }
}
