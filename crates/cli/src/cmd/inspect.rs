//! `siphon inspect URL`: verifies a finished run and prints a summary.
//!
//! URL is the run directory (`{output}/{run}`, local path or object-store URL). Every
//! manifest line's object must exist with its sha256, sample ranges must have no gap or
//! duplicate, token counts and statistics must add up, and every host of the partition
//! recorded in run.json must be present. Exits non-zero on any problem.

use anyhow::{bail, Context};

#[derive(clap::Args)]
pub struct Args {
    /// The run directory: `{output}/{run}` (a local path or gs:// s3:// az:// file:// URL).
    url: String,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let (output, run) = split_run_url(&args.url)?;
    let report = siphon_store::verify_run_blocking(&output, &[], &run)
        .with_context(|| format!("cannot read the run at {}", args.url))?;
    let mut problems = report.all_problems();
    let timing = crate::job::read_timing(&output, &run).unwrap_or_default();

    let (hooks, dtype, expected_hosts) = match &report.run_json {
        Some(run_json) => {
            let partition = &run_json.descriptor.partition;
            let machines = partition["machines"].as_u64().unwrap_or(1);
            let hosts = partition["hosts"].as_u64().unwrap_or(1);
            (
                run_json.descriptor.hooks.clone(),
                format!("{:?}", run_json.shard_format.dtype).to_lowercase(),
                Some(machines * hosts),
            )
        }
        None => (Vec::new(), "?".to_string(), None),
    };
    if let Some(expected) = expected_hosts {
        if report.hosts.len() as u64 != expected {
            problems.push(format!(
                "run.json's partition has {expected} hosts but {} host directories exist",
                report.hosts.len()
            ));
        }
    }
    let bytes: u64 = report.hosts.iter().map(|h| h.bytes).sum();
    let seconds = timing.iter().map(|t| t.seconds).fold(0.0, f64::max);

    if args.json {
        let hosts: Vec<_> = report
            .hosts
            .iter()
            .map(|h| {
                serde_json::json!({
                    "host": h.host.dir_name(), "shards": h.shards, "tokens": h.tokens,
                    "included_tokens": h.included_tokens, "samples": h.samples_end, "bytes": h.bytes,
                })
            })
            .collect();
        let out = serde_json::json!({
            "url": args.url, "ok": problems.is_empty(), "problems": problems, "hooks": hooks,
            "dtype": dtype, "tokens": report.tokens, "included_tokens": report.included_tokens,
            "bytes": bytes, "hosts": hosts, "seconds": seconds,
            "tokens_per_second": if seconds > 0.0 { report.tokens as f64 / seconds } else { 0.0 },
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("run {}", args.url);
        println!("  hooks ({}): {}", hooks.len(), hooks.join(", "));
        println!("  dtype {dtype}; {} tokens ({} kept) in {}", report.tokens, report.included_tokens, human_bytes(bytes));
        for h in &report.hosts {
            println!(
                "  {}: {} shards, {} tokens ({} kept), {} samples, {}",
                h.host.dir_name(), h.shards, h.tokens, h.included_tokens, h.samples_end, human_bytes(h.bytes)
            );
        }
        if seconds > 0.0 {
            println!("  {:.1} s, {:.0} tokens/s over all hosts", seconds, report.tokens as f64 / seconds);
        }
        if problems.is_empty() {
            println!("OK: every shard present with its sha256, no gap or duplicate, counts and statistics add up");
        }
    }
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("problem: {p}");
        }
        bail!("{} problem(s) in {}", problems.len(), args.url);
    }
    Ok(())
}

/// `…/out/run-1` → (`…/out`, `run-1`).
fn split_run_url(url: &str) -> anyhow::Result<(String, String)> {
    let trimmed = url.trim_end_matches('/');
    match trimmed.rsplit_once('/') {
        Some((output, run)) if !run.is_empty() && !output.is_empty() && !output.ends_with(':') && !output.ends_with(":/") => {
            Ok((output.to_string(), run.to_string()))
        }
        _ => bail!("{url:?} is not a run directory: give {{output}}/{{run}}"),
    }
}

fn human_bytes(bytes: u64) -> String {
    let units = ["B", "KB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < units.len() {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.1} {}", units[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_urls_split_into_output_and_run() {
        assert_eq!(split_run_url("/tmp/out/run-1/").unwrap(), ("/tmp/out".into(), "run-1".into()));
        assert_eq!(split_run_url("s3://bucket/acts/r").unwrap(), ("s3://bucket/acts".into(), "r".into()));
        assert!(split_run_url("run-1").is_err());
        assert!(split_run_url("s3://bucket").is_err());
    }
}
