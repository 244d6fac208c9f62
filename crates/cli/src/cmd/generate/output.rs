//! `generate`'s output: one JSON line per completion, in the requests' order, appended to
//! `OUT.partial` as completions end (each line written whole, flushed and synced), the settings
//! the run started with beside it (`OUT.partial.settings.json`); renamed to `OUT` once every
//! request is done. A run that finds a partial file of the same settings resumes after its
//! last whole line, each line checked against its request: since a completion depends only on
//! the settings, the record, the sample and the seed, a run killed at any point (kill -9,
//! SIGTERM) and started again writes what an uninterrupted run writes. A partial file of other
//! settings is refused, naming them. In a job of several processes each writes its own shard
//! ([`shard`]), renamed only once every process has all its lines.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use siphon_engine::decode::Prompt;

/// The output being written.
pub struct Output {
    out: PathBuf,
    partial: PathBuf,
    settings: PathBuf,
    file: File,
    /// The next request whose line is due, and the lines that ended before it.
    next: usize,
    waiting: BTreeMap<usize, String>,
    total: usize,
}

/// `path` with `suffix` appended to its name.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The file process `process` of a job of `processes` writes for `--out out`: `out` itself
/// for one process, else its shard beside it, `<stem>-<process>-of-<processes>[.<ext>]` with
/// five digits each (as Hugging Face datasets name shards: `completions-00001-of-00002.jsonl`).
pub fn shard(out: &Path, process: usize, processes: usize) -> PathBuf {
    if processes == 1 {
        return out.to_path_buf();
    }
    let stem = out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let ext = out.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
    out.with_file_name(format!("{stem}-{process:05}-of-{processes:05}{ext}"))
}

/// Refuses an `out` that exists (nothing is overwritten); called before any weight loads.
pub fn check(out: &Path) -> anyhow::Result<()> {
    if out.exists() {
        bail!("--out {} exists: remove it or name another file", out.display());
    }
    Ok(())
}

impl Output {
    /// Opens the partial file of `out` for `requests` made with `settings`: a new one, or one
    /// an earlier run of the same settings left (its whole lines kept, checked against their
    /// requests). Returns it and how many requests it holds already.
    pub fn open(out: &Path, settings: &serde_json::Value, requests: &[Prompt]) -> anyhow::Result<(Output, usize)> {
        check(out)?;
        let (partial, settings_path) = (beside(out, ".partial"), beside(out, ".partial.settings.json"));
        let mut done = 0;
        if partial.exists() {
            let earlier: serde_json::Value = std::fs::read_to_string(&settings_path)
                .ok()
                .and_then(|s| serde_json::from_str(&s).ok())
                .with_context(|| {
                    format!(
                        "{} has no readable {} beside it: remove it to start again",
                        partial.display(),
                        settings_path.display()
                    )
                })?;
            if let Some((key, was)) = differing(&earlier, settings) {
                bail!(
                    "{} was started with {key} = {was}, not {}: remove it to start again, or run with the same settings",
                    partial.display(),
                    settings[&key]
                );
            }
            let text = std::fs::read(&partial).with_context(|| format!("reading {}", partial.display()))?;
            let mut kept = 0;
            for line in text.split_inclusive(|&b| b == b'\n') {
                // A line cut short by a kill ends the usable part.
                let Some(line) = line.strip_suffix(b"\n") else { break };
                let value: serde_json::Value = match serde_json::from_slice(line) {
                    Ok(v) => v,
                    Err(_) => break,
                };
                let request = requests.get(done).with_context(|| {
                    format!("{} holds more lines than there are requests ({})", partial.display(), requests.len())
                })?;
                let same = value["record"] == request.record
                    && value["sample"] == request.sample
                    && value["prompt_ids"] == serde_json::json!(request.ids);
                if !same {
                    bail!(
                        "{} line {} is not request {done}'s (record {}, sample {}): remove it to start again",
                        partial.display(),
                        done + 1,
                        request.record,
                        request.sample
                    );
                }
                done += 1;
                kept += line.len() + 1;
            }
            let file = OpenOptions::new().write(true).open(&partial)?;
            file.set_len(kept as u64)?;
            file.sync_all()?;
            tracing::info!(done, partial = %partial.display(), "resuming after the completions written");
        } else {
            std::fs::write(&settings_path, serde_json::to_vec_pretty(settings)?)
                .with_context(|| format!("writing {}", settings_path.display()))?;
            File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
        }
        let file = OpenOptions::new().append(true).open(&partial)?;
        let output = Output {
            out: out.to_path_buf(),
            partial,
            settings: settings_path,
            file,
            next: done,
            waiting: BTreeMap::new(),
            total: requests.len(),
        };
        Ok((output, done))
    }

    /// Request `index`'s line (without its newline): written, with every line after it that
    /// waited for it, once the lines before it are.
    pub fn done(&mut self, index: usize, line: String) -> anyhow::Result<()> {
        self.waiting.insert(index, line);
        let mut wrote = false;
        while let Some(line) = self.waiting.remove(&self.next) {
            self.file.write_all(format!("{line}\n").as_bytes())?;
            self.next += 1;
            wrote = true;
        }
        if wrote {
            self.file.sync_data().with_context(|| format!("writing {}", self.partial.display()))?;
        }
        Ok(())
    }

    /// Checks that every request's line is in the partial file, on disk.
    pub fn complete(&self) -> anyhow::Result<()> {
        if self.next != self.total {
            bail!("{} of {} completions written", self.next, self.total);
        }
        Ok(self.file.sync_all()?)
    }

    /// Renames the partial file to the output once every request's line is in it.
    pub fn finish(self) -> anyhow::Result<()> {
        self.complete()?;
        std::fs::rename(&self.partial, &self.out).with_context(|| format!("writing {}", self.out.display()))?;
        let _ = std::fs::remove_file(&self.settings);
        Ok(())
    }
}

/// The first setting whose value differs (or is missing) between two runs.
fn differing(earlier: &serde_json::Value, now: &serde_json::Value) -> Option<(String, serde_json::Value)> {
    let now = now.as_object()?;
    now.iter()
        .find(|(k, v)| earlier.get(k.as_str()) != Some(v))
        .map(|(k, _)| (k.clone(), earlier.get(k.as_str()).cloned().unwrap_or(serde_json::Value::Null)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_process_writes_out_and_each_of_several_its_shard() {
        let out = Path::new("/runs/completions.jsonl");
        assert_eq!(shard(out, 0, 1), out);
        assert_eq!(shard(out, 1, 2), Path::new("/runs/completions-00001-of-00002.jsonl"));
        assert_eq!(shard(Path::new("out"), 0, 3), Path::new("out-00000-of-00003"));
    }
}
