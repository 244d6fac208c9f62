//! Converts a directory of .txt files into a parquet dataset (columns `id`, `text`; several
//! files and row groups). Used by `scripts/setup-corpus.sh` to build the Shakespeare demo
//! corpus. A binary, not an example, so that building it takes none of the crate's test-only
//! dependencies (`scripts/demo.sh` builds it with siphon).
//!
//! `cargo run -p siphon-data --bin make-parquet -- --from DIR --out DIR [--exclude NAME,..]
//!  [--files N] [--rows-per-group N] [--max-row-bytes N]`

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let mut from = None;
    let mut out = None;
    let mut options = siphon_data::ConvertOptions::default();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--from" => from = Some(PathBuf::from(value()?)),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--exclude" => options.exclude.extend(value()?.split(',').map(str::to_string)),
            "--files" => options.files = number(value()?)?,
            "--rows-per-group" => options.rows_per_group = number(value()?)?,
            "--max-row-bytes" => options.max_row_bytes = number(value()?)?,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let (from, out) = (from.ok_or("--from is required")?, out.ok_or("--out is required")?);
    let report = siphon_data::text_dir_to_parquet(&from, &out, &options).map_err(|e| e.to_string())?;
    eprintln!(
        "{} works -> {} rows in {} files under {}",
        report.works,
        report.rows,
        report.outputs.len(),
        out.display()
    );
    Ok(())
}
