//! `siphon extract --generate FLAGS`: the corpus's prompts completed first, as `siphon
//! generate` with those flags, into `OUTPUT/RUN.completions/` beside the run; the extraction
//! then reads the completions by their exact ids (`siphon_data::Record::Tokens`: the prompt's
//! tokens the user's, the completion's the assistant's), so one command gives the activations
//! of the model's own completions.
//!
//! The same command started again goes on where it stopped: generation resumes from its
//! partial files (`output.rs`), is skipped once its output is named, and the extraction
//! resumes its run; completions made with other generation flags are refused by name. On
//! several processes each host completes its share into its shard and the extraction reads
//! them all, so `--output` must be a directory every host sees.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Parser;

use super::{Args, output};
use crate::job::ExtractOptions;

/// Flags extract gives `generate` itself (from its own options), never taken in `FLAGS`.
const GIVEN: [&str; 12] = [
    "--model",
    "--corpus",
    "--ids",
    "--text",
    "--out",
    "--json-field",
    "--text-column",
    "--plugin",
    "--compute-dtype",
    "--process-id",
    "--num-processes",
    "--coordinator",
];

/// Where `FLAGS` of the completions kept beside a run are recorded.
const FLAGS_FILE: &str = "generate-flags.json";

/// `generate`'s flags alone, parsed as the command line parses them.
#[derive(Parser)]
#[command(no_binary_name = true)]
struct Standalone {
    #[command(flatten)]
    args: Args,
}

/// Completes `options`' corpus with `flags` (see the module docs); returns the options of
/// the extraction over the completions.
pub fn completions_first(mut options: ExtractOptions, flags: &str) -> anyhow::Result<ExtractOptions> {
    let words = shlex::split(flags).with_context(|| format!("--generate {flags:?}: unbalanced quotes"))?;
    if let Some(word) = words.iter().find(|w| GIVEN.contains(&w.split('=').next().unwrap_or(w))) {
        bail!(
            "--generate {flags:?}: {word} is extract's own (its --model, --corpus, devices and job; the completions go beside the run)"
        );
    }
    let model = options.model.clone().context("--generate needs --model")?;
    let run = options.run.clone().context("--generate needs --run (the completions are kept beside it)")?;
    crate::job::check_run_name(&run)?;
    let output = options.output.clone().context("--generate needs --output")?;
    if output.contains("://") {
        bail!("--generate writes the completions beside the run: --output must be a local directory, not {output}");
    }
    if options.corpus.hf_config.is_some() || options.corpus.hf_split.is_some() {
        bail!(
            "--generate reads the corpus's files: give --corpus hf://datasets/OWNER/NAME/PATH rather than --hf-config/--hf-split"
        );
    }
    let dir = Path::new(&output).join(format!("{run}.completions"));
    let out = dir.join("completions.jsonl");
    let mut argv: Vec<String> = vec!["--model".into(), model.display().to_string(), "--corpus".into()];
    argv.extend([options.corpus.corpus.clone(), "--json-field".into(), options.corpus.json_field.clone()]);
    argv.extend(["--text-column".into(), options.corpus.text_column.clone(), "--out".into()]);
    argv.extend([out.display().to_string(), "--compute-dtype".into(), options.compute_dtype.clone()]);
    if let Some(plugin) = &options.plugin {
        argv.extend(["--plugin".into(), plugin.display().to_string()]);
    }
    if let Some(n) = options.cpu_devices
        && !words.iter().any(|w| w.starts_with("--cpu-devices"))
    {
        argv.extend(["--cpu-devices".into(), n.to_string()]);
    }
    argv.extend(words);
    let mut args = Standalone::try_parse_from(&argv).map_err(|e| anyhow::anyhow!("--generate {flags:?}: {e}"))?.args;
    args.cluster = options.cluster.clone();

    let identity = args.cluster.identity()?;
    let processes = identity.num_processes as usize;
    let mine = output::shard(&out, identity.process_id as usize, processes);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let recorded = dir.join(FLAGS_FILE);
    let flags_now = serde_json::json!({ "generate": flags, "corpus": options.corpus.corpus });
    match std::fs::read_to_string(&recorded) {
        Ok(text) => {
            let earlier: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            if earlier != flags_now {
                bail!(
                    "{} holds completions of --generate {} over --corpus {}: remove it to start again, or give the same",
                    dir.display(),
                    earlier["generate"],
                    earlier["corpus"]
                );
            }
        }
        Err(_) => std::fs::write(&recorded, serde_json::to_vec_pretty(&flags_now)?)
            .with_context(|| format!("writing {}", recorded.display()))?,
    }
    if mine.exists() {
        tracing::info!(completions = %mine.display(), "the completions are written; extracting over them");
    } else {
        super::run(args)?;
    }

    // Every host's shard, which every host reads (the extraction splits them again).
    let shards: Vec<PathBuf> = (0..processes).map(|p| output::shard(&out, p, processes)).collect();
    if let Some(missing) = shards.iter().find(|s| !s.exists()) {
        bail!(
            "{} is not on this host: --generate on several hosts needs an --output directory they all see",
            missing.display()
        );
    }
    options.corpus.corpus = match processes {
        1 => out.display().to_string(),
        _ => dir.join("completions-*-of-*.jsonl").display().to_string(),
    };
    options.corpus.json_field = "text".into();
    options.corpus.text_column = "text".into();
    options.corpus.format = None;
    Ok(options)
}
