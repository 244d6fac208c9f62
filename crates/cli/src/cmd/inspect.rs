//! `siphon inspect URL`: verifies a finished run and prints a summary.
//!
//! URL is the run directory (`{output}/{run}`, local path or object-store URL). Every
//! manifest line's object must exist with its checksum (CRC32C; sha256 in older runs), sample ranges must have no gap or
//! duplicate, token counts must add up, `stats.json` must hold exactly the statistics of the
//! committed shards, and every host of the partition recorded in run.json must be present.
//! Prints checksums of the shards and of `stats.json`. Exits non-zero on any problem.
//!
//! Prints the dataset format (`siphon-activations/1` or `/2`) and each hook with its per-token
//! shape (from run.json, or from the first shard when run.json records none, as in format 1).
//! A format-1 dataset's `ln_final.hook_normalized` is the final norm's output after its gain,
//! not TransformerLens's x/RMS(x): inspect says so.

use anyhow::{Context, bail};

#[derive(clap::Args)]
pub struct Args {
    /// The run directory: `{output}/{run}` (a local path or gs:// s3:// az:// file:// URL).
    url: String,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Accept hooks whose values are NaN or ±Inf (a run written with `extract
    /// --allow-non-finite`): each is printed as a note instead of failing the check.
    #[arg(long)]
    allow_non_finite: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let (output, run) = split_run_url(&args.url)?;
    let report = siphon_store::verify_run_blocking(&output, &[], &run)
        .with_context(|| format!("cannot read the run at {}", args.url))?;
    let (mut problems, mut notes) = match args.allow_non_finite {
        true => (report.problems_allowing_non_finite(), report.non_finite.clone()),
        false => (report.all_problems(), Vec::new()),
    };
    let timing = crate::job::read_timing(&output, &run).unwrap_or_default();

    let format = match (&report.run_json, report.format_version) {
        (Some(run_json), _) => run_json.format.clone(),
        (None, Some(version)) => format!("siphon-activations/{version}"),
        (None, None) => "?".to_string(),
    };
    let shapes_from = if report.run_json.as_ref().is_some_and(|r| !r.descriptor.hook_shapes.is_empty()) {
        "run.json"
    } else {
        "shards"
    };
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
    if let Some(expected) = expected_hosts
        && report.hosts.len() as u64 != expected
    {
        problems.push(format!(
            "run.json's partition has {expected} hosts but {} host directories exist",
            report.hosts.len()
        ));
    }
    notes.extend(format_notes(report.format_version, &hooks));
    let latents = latents_summary(&report);
    let outputs = outputs_summary(&report);
    let splices = splice_summary(&report, &outputs, &latents);
    let bytes: u64 = report.hosts.iter().map(|h| h.bytes).sum();
    let seconds = timing.iter().map(|t| t.seconds).fold(0.0, f64::max);
    // What a row is (`--positions`) and the documents' kept columns (`--keep-columns`).
    let config = report.run_json.as_ref().map(|r| &r.descriptor.config);
    let positions = config.map_or(serde_json::Value::Null, |c| c["positions"].clone());
    let kept_columns = config.map_or(serde_json::Value::Null, |c| c["keep_columns"].clone());

    if args.json {
        let hosts: Vec<_> = report
            .hosts
            .iter()
            .map(|h| {
                serde_json::json!({
                    "host": h.host.dir_name(), "shards": h.shards, "tokens": h.tokens,
                    "included_tokens": h.included_tokens, "samples": h.samples_end, "bytes": h.bytes,
                    "shards_sha256": h.shards_sha256,
                })
            })
            .collect();
        let out = serde_json::json!({
            "url": args.url, "ok": problems.is_empty(), "problems": problems, "format": format,
            "format_version": report.format_version, "hooks": hooks, "hook_shapes": report.hook_shapes,
            "hook_shapes_from": shapes_from, "positions": positions, "kept_columns": kept_columns, "latents": latents, "outputs": outputs, "splices": splices, "notes": notes, "dtype": dtype, "tokens": report.tokens, "included_tokens": report.included_tokens,
            "bytes": bytes, "hosts": hosts, "shards_sha256": report.shards_sha256,
            "stats_sha256": report.stats_sha256, "seconds": seconds, "timing": timing,
            "tokens_per_second": if seconds > 0.0 { report.tokens as f64 / seconds } else { 0.0 },
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("run {}", args.url);
        println!("  format {format}");
        println!("  hooks ({}), per-token shape from {shapes_from}:", hooks.len());
        for hook in &hooks {
            println!("    {hook} {}", report.hook_shapes.get(hook).map_or("?".to_string(), |s| format!("{s:?}")));
        }
        if !positions.is_null() {
            let which = positions.as_str().map_or_else(|| positions.to_string(), str::to_string);
            println!("  rows: --positions {which} of each document");
        }
        if let Some(columns) = kept_columns.as_array().filter(|c| !c.is_empty()) {
            let named: Vec<String> = columns
                .iter()
                .map(|c| format!("{} ({})", c[0].as_str().unwrap_or("?"), c[1].as_str().unwrap_or("?")))
                .collect();
            println!("  documents' kept columns, per shard: {}", named.join(", "));
        }
        if !latents.is_empty() {
            println!("  dictionaries' latents ({}), CSR per shard:", latents.len());
        }
        for l in &latents {
            println!(
                "    {} [{} latents, cap {}] L0 {:.2}, {} never fired",
                l["name"].as_str().unwrap_or("?"),
                l["width"],
                l["cap"],
                l["l0"].as_f64().unwrap_or(f64::NAN),
                l["dead"]
            );
        }
        if !outputs.is_empty() {
            println!("  the model's outputs ({}), per token:", outputs.len());
        }
        for o in &outputs {
            let mean = match o["mean"].as_array() {
                Some(m) if !m.is_empty() => {
                    let m: Vec<String> = m.iter().map(|v| format!("{:.4}", v.as_f64().unwrap_or(f64::NAN))).collect();
                    format!(" mean {}", m.join(", "))
                }
                _ => String::new(),
            };
            let undefined = o["undefined"]
                .as_u64()
                .filter(|&n| n > 0)
                .map_or(String::new(), |n| format!(" ({n} tokens with no next token, NaN)"));
            let (name, dtype) = (o["name"].as_str().unwrap_or("?"), o["dtype"].as_str().unwrap_or("?"));
            println!("    {name} {dtype} {}{mean}{undefined}", o["shape"]);
        }
        for s in &splices {
            let f = |key: &str| s[key].as_f64().unwrap_or(f64::NAN);
            let l0 = s["l0"].as_f64().map_or(String::new(), |l0| format!("; L0 {l0:.2}"));
            let fvu = match s["fvu"].as_f64() {
                Some(fvu) => format!("FVU {fvu:.4}"),
                None => format!("FVU: store {} too (--hooks)", s["hook"].as_str().unwrap_or("its hook")),
            };
            println!(
                "    spliced {}: CE clean {:.4}, spliced {:.4}, ablated {:.4}: ce_loss_score {:.4}; KL spliced {:.4}, \
                 ablated {:.4}: kl_div_score {:.4}; {fvu}{l0}",
                s["spliced"].as_str().unwrap_or("?"),
                f("ce_clean"),
                f("ce_spliced"),
                f("ce_ablated"),
                f("ce_loss_score"),
                f("kl_spliced"),
                f("kl_ablated"),
                f("kl_div_score")
            );
        }
        println!(
            "  dtype {dtype}; {} tokens ({} kept) in {}",
            report.tokens,
            report.included_tokens,
            human_bytes(bytes)
        );
        for h in &report.hosts {
            println!(
                "  {}: {} shards, {} tokens ({} kept), {} samples, {}, shards sha256 {}",
                h.host.dir_name(),
                h.shards,
                h.tokens,
                h.included_tokens,
                h.samples_end,
                human_bytes(h.bytes),
                h.shards_sha256
            );
        }
        println!(
            "  checksums: shards sha256 {}, stats.json sha256 {}",
            report.shards_sha256,
            report.stats_sha256.as_deref().unwrap_or("(missing)")
        );
        if seconds > 0.0 {
            println!("  {:.1} s, {:.0} tokens/s over all hosts", seconds, report.tokens as f64 / seconds);
        }
        for t in timing.iter().filter(|t| t.path.steps > 0) {
            println!("  {}: {}", t.host, stage_line(t));
        }
        for note in &notes {
            println!("  note: {note}");
        }
        if problems.is_empty() {
            println!(
                "OK: every shard present with its checksum, no gap or duplicate, counts add up, stats.json holds exactly the shards' statistics"
            );
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

/// Where one host's time went, stage by stage: busy seconds, their share of the loop, and the
/// rate of the stages that move bytes.
fn stage_line(t: &crate::job::HostTiming) -> String {
    let share = |s: f64| if t.seconds > 0.0 { 100.0 * s / t.seconds } else { 0.0 };
    let rate =
        |bytes: u64, s: f64| if s > 0.0 { format!(" {:.2} GB/s", bytes as f64 / s / 1e9) } else { String::new() };
    let (p, w) = (&t.path, &t.writer);
    format!(
        "{}-bound at depth {}: program {:.2} s ({:.0}%), copy {:.2} s{}, hand-over {:.2} s, convert {:.2} s{}, \
         seal {:.2} s{}, upload {:.2} s{}; the loop waited {:.2} s for the host, the host {:.2} s for the device",
        p.bound(),
        t.depth,
        p.program_s,
        share(p.program_s),
        p.copy_s,
        rate(p.copy_bytes, p.copy_s),
        p.push_s,
        w.convert_s,
        rate(w.convert_bytes, w.convert_s),
        w.seal_s,
        rate(w.seal_bytes, w.seal_s),
        w.upload_s,
        rate(w.upload_bytes, w.upload_s),
        p.wait_host_s,
        p.wait_device_s,
    )
}

/// What a reader must know about the hooks of a dataset of this format version.
fn format_notes(format_version: Option<u32>, hooks: &[String]) -> Vec<String> {
    let mut notes = Vec::new();
    if format_version == Some(1) && hooks.iter().any(|h| h == "ln_final.hook_normalized") {
        notes.push(
            "format 1: in this dataset ln_final.hook_normalized is the final norm's output after its gain \
             (what format 2 calls ln_final.hook_out), not TransformerLens's x/RMS(x) before the gain"
                .to_string(),
        );
    }
    notes
}

/// `…/out/run-1` → (`…/out`, `run-1`).
fn split_run_url(url: &str) -> anyhow::Result<(String, String)> {
    let trimmed = url.trim_end_matches('/');
    match trimmed.rsplit_once('/') {
        Some((output, run))
            if !run.is_empty() && !output.is_empty() && !output.ends_with(':') && !output.ends_with(":/") =>
        {
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

/// Each latents column of the run: its width and cap, and from the run's statistics its mean
/// firings per counted token (L0) and the latents that never fired.
fn latents_summary(report: &siphon_store::VerifyReport) -> Vec<serde_json::Value> {
    let Some(run_json) = &report.run_json else { return Vec::new() };
    run_json
        .descriptor
        .latents
        .iter()
        .map(|c| {
            let stats = report.stats.as_ref().and_then(|s| s.latents.get(&c.name));
            let l0 = stats.map(|s| s.firings.iter().sum::<u64>() as f64 / s.count.max(1) as f64);
            let dead = stats.map(|s| s.firings.iter().filter(|&&f| f == 0).count());
            serde_json::json!({ "name": c.name, "hook": c.hook, "width": c.width, "cap": c.cap, "l0": l0, "dead": dead })
        })
        .collect()
}

/// Each output column of the run: its dtype and shape, and from the run's statistics the mean
/// of each element's finite values (the mean NLL is the cross-entropy) and the tokens whose
/// first element is not (`output.nll` where a token has no next token).
fn outputs_summary(report: &siphon_store::VerifyReport) -> Vec<serde_json::Value> {
    let Some(run_json) = &report.run_json else { return Vec::new() };
    run_json
        .descriptor
        .outputs
        .iter()
        .map(|c| {
            let stats = report.stats.as_ref().and_then(|s| s.outputs.get(&c.name));
            let mean = stats.map(siphon_store::OutputStats::mean);
            let undefined = stats.and_then(|s| s.defined.first().map(|d| s.count - d));
            serde_json::json!({
                "name": c.name, "dtype": c.dtype, "shape": c.shape, "count": stats.map(|s| s.count),
                "mean": mean, "undefined": undefined,
            })
        })
        .collect()
}

/// Each spliced dictionary's SAELens metrics from the outputs' means (`outputs_summary`): the
/// mean NLLs over the tokens with a next token, the mean KLs over every counted token;
/// `ce_loss_score` = (CE ablated − CE spliced) / (CE ablated − CE clean), `kl_div_score` =
/// (KL ablated − KL spliced) / KL ablated; the fraction of variance unexplained, the mean
/// squared error over the hook's total variance per token (where the hook is stored: its
/// statistics); and the latents' L0 (`latents_summary`).
fn splice_summary(
    report: &siphon_store::VerifyReport,
    outputs: &[serde_json::Value],
    latents: &[serde_json::Value],
) -> Vec<serde_json::Value> {
    let mean = |name: &str| {
        let o = outputs.iter().find(|o| o["name"] == name)?;
        o["mean"].as_array()?.first()?.as_f64()
    };
    let names: Vec<&str> = outputs.iter().filter_map(|o| o["name"].as_str()).collect();
    names
        .iter()
        .filter_map(|n| n.strip_prefix("output.nll.spliced."))
        .filter_map(|spliced| {
            // The ablation of the hook it reads: `<hook>` is `spliced` or its start.
            let hook = names
                .iter()
                .filter_map(|n| n.strip_prefix("output.nll.ablated."))
                .find(|hook| spliced == *hook || spliced.starts_with(&format!("{hook}.")))?;
            let ce_clean = mean("output.nll")?;
            let ce_spliced = mean(&format!("output.nll.spliced.{spliced}"))?;
            let ce_ablated = mean(&format!("output.nll.ablated.{hook}"))?;
            let kl_spliced = mean(&format!("output.kl.spliced.{spliced}"))?;
            let kl_ablated = mean(&format!("output.kl.ablated.{hook}"))?;
            let squared_error = mean(&format!("output.sq_error.spliced.{spliced}"));
            let variance =
                report.stats.as_ref().and_then(|s| s.hooks.get(hook)).map(|h| h.variance.iter().sum::<f64>());
            let fvu = squared_error.zip(variance).map(|(e, v)| e / v);
            let column = format!("{hook}.hook_sae_acts_post{}", &spliced[hook.len()..]);
            let l0 = latents.iter().find(|l| l["name"] == column.as_str()).and_then(|l| l["l0"].as_f64());
            Some(serde_json::json!({
                "spliced": spliced, "hook": hook,
                "ce_clean": ce_clean, "ce_spliced": ce_spliced, "ce_ablated": ce_ablated,
                "ce_loss_score": (ce_ablated - ce_spliced) / (ce_ablated - ce_clean),
                "kl_spliced": kl_spliced, "kl_ablated": kl_ablated,
                "kl_div_score": (kl_ablated - kl_spliced) / kl_ablated,
                "mean_squared_error": squared_error, "fvu": fvu, "l0": l0,
            }))
        })
        .collect()
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

    #[test]
    fn format_1_ln_final_gets_a_note() {
        let hooks = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let notes = format_notes(Some(1), &hooks(&["blocks.0.hook_resid_post", "ln_final.hook_normalized"]));
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("ln_final.hook_normalized is the final norm's output after its gain"), "{notes:?}");
        assert!(notes[0].contains("ln_final.hook_out") && notes[0].contains("x/RMS(x)"), "{notes:?}");
        assert!(format_notes(Some(2), &hooks(&["ln_final.hook_normalized"])).is_empty());
        assert!(format_notes(Some(1), &hooks(&["blocks.0.hook_resid_post"])).is_empty());
        assert!(format_notes(None, &hooks(&["ln_final.hook_normalized"])).is_empty());
    }
}
