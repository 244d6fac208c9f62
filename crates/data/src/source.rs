//! Resolving a corpus source (`/data/dir`, `shards/*.parquet`, `s3://bucket/prefix/`,
//! `file:///abs/path`) into a sorted list of files on one object store.
//!
//! Every source, local ones included, is read through `object_store`, so the code that
//! tests exercise on local files is the code that reads S3 or GCS in production.

use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::file::check_regular_file;
use crate::hub::HubDataset;
use crate::percent::percent_decode;

/// How the records of a file are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum FileFormat {
    /// Apache Parquet with a string column (the Hugging Face datasets layout).
    Parquet,
    /// One JSON object per line; the text lives in a configurable field.
    Jsonl,
    /// Plain UTF-8 text; see [`TextRecords`](crate::TextRecords) for what a record is.
    Text,
}

impl FileFormat {
    /// The format implied by a file name's extension, if it is one siphon reads.
    pub fn from_name(name: &str) -> Option<FileFormat> {
        let lower = name.to_ascii_lowercase();
        let ext = lower.rsplit_once('.').map(|(_, e)| e)?;
        match ext {
            "parquet" | "pq" => Some(FileFormat::Parquet),
            "jsonl" | "ndjson" | "json" => Some(FileFormat::Jsonl),
            "txt" | "text" => Some(FileFormat::Text),
            _ => None,
        }
    }

    /// Lower-case name, as accepted by `--format`.
    pub fn name(self) -> &'static str {
        match self {
            FileFormat::Parquet => "parquet",
            FileFormat::Jsonl => "jsonl",
            FileFormat::Text => "text",
        }
    }
}

/// One corpus file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorpusFile {
    /// Location within the store.
    pub path: StorePath,
    /// Human-readable location (a local path or a URL), used in messages and positions.
    pub display: String,
    /// Size in bytes.
    pub size: u64,
    /// How its records are encoded.
    pub format: FileFormat,
}

/// A resolved source: the store and its files in the global (sorted) order.
#[derive(Clone, Debug)]
pub(crate) struct Resolved {
    pub store: Arc<dyn ObjectStore>,
    pub files: Vec<CorpusFile>,
}

/// Where the files of a source live, before listing.
pub(crate) struct Located {
    pub store: Arc<dyn ObjectStore>,
    /// Prefix put in front of a store path to display it (`/`, `s3://bucket/`).
    pub display_root: String,
    /// The path part of the source inside the store (may contain glob characters).
    pub path: String,
    /// True for local paths: directories can be told from files without a request.
    pub local: bool,
    /// A dataset on the Hugging Face Hub, listed through its tree API.
    pub hub: Option<HubDataset>,
}

/// Turns a source string into a store and a path inside it; does not touch the data.
pub(crate) fn locate(spec: &str) -> Result<Located> {
    let bad = |reason: String| Error::BadSource { spec: spec.to_string(), reason };
    if spec.trim().is_empty() {
        // An empty path would be the current directory.
        return Err(bad("the source is empty (give a file, a directory, a glob or a URL)".into()));
    }
    if let Some((scheme, _)) = spec.split_once("://") {
        let url = url::Url::parse(spec).map_err(|e| bad(e.to_string()))?;
        if scheme == "file" {
            let local = url.to_file_path().map_err(|()| bad("not an absolute file path".into()))?;
            return locate_local(spec, &local.to_string_lossy());
        }
        if scheme == "hf" {
            let (hub, path) = HubDataset::parse(spec)?;
            let path = percent_decode(&path);
            return Ok(Located {
                store: hub.store()?,
                display_root: hub.display_root(),
                path,
                local: false,
                hub: Some(hub),
            });
        }
        if !matches!(scheme, "s3" | "s3a" | "gs" | "az" | "abfs" | "abfss" | "http" | "https") {
            return Err(bad(format!(
                "unsupported scheme {scheme:?} (use a local path, file://, s3://, gs://, az://, https:// or \
                 hf://datasets/...)"
            )));
        }
        // Glob characters are not valid in URLs as typed by users; percent-decode the path
        // ourselves so that `s3://b/x/*.parquet` keeps its `*`.
        let raw_path = url.path().trim_start_matches('/').to_string();
        let path = percent_decode(&raw_path);
        // Credentials and endpoints come from the environment (AWS_*, GOOGLE_*, AZURE_*),
        // as with every other object_store based tool.
        let mut root_url = url.clone();
        root_url.set_path("/");
        let (store, _) = object_store::parse_url_opts(&root_url, std::env::vars()).map_err(|e| bad(e.to_string()))?;
        let display_root = format!("{}://{}/", scheme, url.host_str().unwrap_or_default());
        return Ok(Located { store: Arc::from(store), display_root, path, local: false, hub: None });
    }
    locate_local(spec, spec)
}

fn locate_local(spec: &str, path: &str) -> Result<Located> {
    let bad = |reason: String| Error::BadSource { spec: spec.to_string(), reason };
    let (base, rest) = split_glob(path);
    let base_fs = if base.is_empty() { ".".to_string() } else { base.clone() };
    let abs = std::fs::canonicalize(&base_fs).map_err(|source| Error::Io { path: base_fs.clone(), source })?;
    let abs = abs.to_str().ok_or_else(|| bad("path is not valid UTF-8".into()))?.trim_end_matches('/').to_string();
    let full = match rest {
        Some(pattern) => format!("{abs}/{pattern}"),
        None => abs,
    };
    let store = object_store::local::LocalFileSystem::new();
    Ok(Located {
        store: Arc::new(store),
        display_root: "/".into(),
        path: full.trim_start_matches('/').to_string(),
        local: true,
        hub: None,
    })
}

/// Splits `a/b/*.x` into (`a/b`, Some(`*.x`)); a path without glob characters into (path, None).
fn split_glob(path: &str) -> (String, Option<String>) {
    let components: Vec<&str> = path.split('/').collect();
    match components.iter().position(|c| has_glob(c)) {
        None => (path.to_string(), None),
        Some(i) => {
            let base = components[..i].join("/");
            let base = if base.is_empty() && path.starts_with('/') { "/".to_string() } else { base };
            (base, Some(components[i..].join("/")))
        }
    }
}

fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Lists the files of a located source, sorted by path. `forced` overrides extension-based
/// format detection (and then a directory yields all its visible files).
pub(crate) async fn resolve(spec: &str, located: Located, forced: Option<FileFormat>) -> Result<Resolved> {
    let Located { store, display_root, path, local, hub } = located;
    let display = |p: &StorePath| format!("{display_root}{p}");
    let (base, pattern) = split_glob(&path);
    let mut listed: Vec<(StorePath, u64)> = Vec::new();
    // A single file, or everything under `base` to filter.
    let single = match (&pattern, local, &hub) {
        (Some(_), _, _) => false,
        (None, true, _) => {
            let fs_path = format!("/{path}");
            let meta = std::fs::metadata(&fs_path).map_err(|source| Error::Io { path: fs_path.clone(), source })?;
            if let Some(what) = siphon_files::special(&meta) {
                return Err(Error::NotAFile { path: fs_path, what: what.into() });
            }
            meta.is_file()
        }
        (None, false, Some(_)) => false,
        (None, false, None) => {
            let p = store_path(spec, &path)?;
            match store.head(&p).await {
                Ok(meta) => {
                    listed.push((p, meta.size));
                    true
                }
                Err(object_store::Error::NotFound { .. }) => false,
                Err(source) => return Err(Error::Store { location: display(&p), source }),
            }
        }
    };
    if let Some(hub) = &hub {
        // The tree API lists directories: list the parent of a path that may name a file.
        let parent = match pattern {
            Some(_) => base.as_str(),
            None => path.rsplit_once('/').map_or("", |(parent, _)| parent),
        };
        for entry in hub.list(parent).await? {
            listed.push((store_path(spec, &entry.path)?, entry.size()));
        }
    } else if single && local {
        let p = store_path(spec, &path)?;
        let meta = store.head(&p).await.map_err(|source| Error::Store { location: display(&p), source })?;
        listed.push((p, meta.size));
    } else if !single {
        let prefix = store_path(spec, &base)?;
        let metas: Vec<object_store::ObjectMeta> = store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|source| Error::Store { location: display(&prefix), source })?;
        listed.extend(metas.into_iter().map(|m| (m.location, m.size)));
    }
    let single = single || (hub.is_some() && pattern.is_none() && listed.iter().any(|(p, _)| p.as_ref() == path));
    if local && !single {
        // The listing leaves out what is not a regular file; one that would be a corpus file
        // is refused as a FIFO given by name is, not skipped.
        let specials = special_files(std::path::Path::new(&format!("/{base}")));
        if let Ok(files) = select(spec, &display_root, &base, pattern.as_deref(), None, specials, forced)
            && let Some(file) = files.first()
        {
            check_regular_file(std::path::Path::new(&format!("/{}", file.path)))?;
        }
    }
    let files =
        select(spec, &display_root, &base, pattern.as_deref(), single.then_some(path.as_str()), listed, forced)?;
    Ok(Resolved { store, files })
}

/// The files under the local directory `root` (links followed, as the store lists them) that
/// are neither regular files nor directories, as store paths (sizes 0).
fn special_files(root: &std::path::Path) -> Vec<(StorePath, u64)> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    let mut seen = std::collections::HashSet::new();
    while let Some(dir) = dirs.pop() {
        // A link back up the tree is walked once.
        if !std::fs::canonicalize(&dir).is_ok_and(|real| seen.insert(real)) {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::metadata(&path) else { continue };
            if meta.is_dir() {
                dirs.push(path);
            } else if siphon_files::special(&meta).is_some()
                && let Some(store) = path.to_str().and_then(|p| StorePath::parse(p.trim_start_matches('/')).ok())
            {
                found.push((store, 0));
            }
        }
    }
    found
}

/// The corpus files among `listed` (paths and sizes): the file `single` names, or those under
/// `base` matching `pattern`, with a format (forced, or told by the extension), sorted.
fn select(
    spec: &str,
    display_root: &str,
    base: &str,
    pattern: Option<&str>,
    single: Option<&str>,
    listed: Vec<(StorePath, u64)>,
    forced: Option<FileFormat>,
) -> Result<Vec<CorpusFile>> {
    let format_of = |p: &StorePath| forced.or_else(|| FileFormat::from_name(p.filename().unwrap_or_default()));
    let mut files = Vec::new();
    if let Some(single) = single {
        let (path, size) = listed
            .into_iter()
            .find(|(p, _)| p.as_ref() == single.trim_end_matches('/'))
            .ok_or_else(|| Error::BadSource { spec: spec.to_string(), reason: "the file is not there".into() })?;
        let format = format_of(&path).ok_or_else(|| Error::BadSource {
            spec: spec.to_string(),
            reason: "cannot tell the file format from the extension; pass --format".into(),
        })?;
        files.push(CorpusFile { display: format!("{display_root}{path}"), path, size, format });
        return Ok(files);
    }
    let prefix = store_path(spec, base)?;
    let matcher = pattern.map(|p| Glob::new(format!("{base}/{p}").trim_start_matches('/')));
    for (path, size) in listed {
        let Some(rel) = path.prefix_match(&prefix).map(|it| it.collect::<Vec<_>>()) else { continue };
        // Hidden files, `_SUCCESS`-style markers and a dataset repository's README or
        // LICENSE are never corpus data.
        if rel.is_empty()
            || rel.iter().any(|part| part.as_ref().starts_with(['.', '_']))
            || is_repo_doc(path.filename().unwrap_or_default())
        {
            continue;
        }
        if let Some(m) = &matcher
            && !m.matches(path.as_ref())
        {
            continue;
        }
        let Some(format) = format_of(&path) else { continue };
        files.push(CorpusFile { display: format!("{display_root}{path}"), path, size, format });
    }
    if files.is_empty() {
        let looked_for = match forced {
            Some(f) => format!("{} files", f.name()),
            None => "*.parquet, *.jsonl, *.ndjson, *.json, *.txt, *.text".to_string(),
        };
        return Err(Error::NoFiles { spec: spec.to_string(), looked_for });
    }
    files.sort_by(|a, b| a.path.as_ref().cmp(b.path.as_ref()));
    Ok(files)
}

/// The files of split `split` of config `config` of the Hub dataset `repo` (see
/// [`HubDataset::split_files`]).
pub(crate) async fn resolve_hub_split(
    repo: &str,
    config: Option<&str>,
    split: &str,
    forced: Option<FileFormat>,
) -> Result<Resolved> {
    let (dataset, globs) = HubDataset::new(repo, "main")?.split_files(config, split).await?;
    let spec = format!("{repo} (config {}, split {split})", config.unwrap_or("default"));
    let listed: Vec<(StorePath, u64)> = dataset
        .list("")
        .await?
        .into_iter()
        .map(|e| Ok((store_path(&spec, &e.path)?, e.size())))
        .collect::<Result<_>>()?;
    let mut files = Vec::new();
    for glob in &globs {
        let (base, pattern) = split_glob(glob.trim_start_matches("./"));
        let matched = select(&spec, &dataset.display_root(), &base, pattern.as_deref(), None, listed.clone(), forced);
        match matched {
            Ok(found) => files.extend(found),
            Err(Error::NoFiles { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    files.sort_by(|a, b| a.path.as_ref().cmp(b.path.as_ref()));
    files.dedup_by(|a, b| a.path == b.path);
    if files.is_empty() {
        return Err(Error::NoFiles { spec, looked_for: format!("files matching {globs:?}") });
    }
    Ok(Resolved { store: dataset.store()?, files })
}

fn is_repo_doc(name: &str) -> bool {
    let stem = name.split('.').next().unwrap_or_default().to_ascii_uppercase();
    matches!(stem.as_str(), "README" | "LICENSE" | "LICENCE" | "CHANGELOG" | "NOTICE")
}

fn store_path(spec: &str, path: &str) -> Result<StorePath> {
    StorePath::parse(path.trim_end_matches('/'))
        .map_err(|e| Error::BadSource { spec: spec.to_string(), reason: e.to_string() })
}

/// A small glob matcher over `/`-separated paths: `*` and `?` stay within one component,
/// `**` spans components, `[abc]`/`[a-z]`/`[!x]` are character classes.
#[derive(Debug)]
pub(crate) struct Glob {
    pattern: Vec<char>,
}

impl Glob {
    pub fn new(pattern: &str) -> Glob {
        Glob { pattern: pattern.chars().collect() }
    }

    pub fn matches(&self, text: &str) -> bool {
        let text: Vec<char> = text.chars().collect();
        glob_match(&self.pattern, &text)
    }
}

fn glob_match(p: &[char], t: &[char]) -> bool {
    match p.first() {
        None => t.is_empty(),
        Some('*') if p.get(1) == Some(&'*') => {
            // `**/` may also match zero directories.
            let rest = if p.get(2) == Some(&'/') { &p[3..] } else { &p[2..] };
            (0..=t.len()).any(|i| glob_match(rest, &t[i..])) || (p.get(2) == Some(&'/') && glob_match(&p[2..], t))
        }
        Some('*') => {
            let mut i = 0;
            loop {
                if glob_match(&p[1..], &t[i..]) {
                    return true;
                }
                if i >= t.len() || t[i] == '/' {
                    return false;
                }
                i += 1;
            }
        }
        Some('?') => t.first().is_some_and(|c| *c != '/') && glob_match(&p[1..], &t[1..]),
        Some('[') => {
            let Some(close) = p.iter().skip(2).position(|c| *c == ']').map(|i| i + 2) else {
                return t.first() == Some(&'[') && glob_match(&p[1..], &t[1..]);
            };
            let Some(&c) = t.first() else { return false };
            let (negate, class) = match p[1] {
                '!' | '^' => (true, &p[2..close]),
                _ => (false, &p[1..close]),
            };
            let mut hit = false;
            let mut i = 0;
            while i < class.len() {
                if i + 2 < class.len() && class[i + 1] == '-' {
                    hit |= class[i] <= c && c <= class[i + 2];
                    i += 3;
                } else {
                    hit |= class[i] == c;
                    i += 1;
                }
            }
            hit != negate && c != '/' && glob_match(&p[close + 1..], &t[1..])
        }
        Some(&c) => t.first() == Some(&c) && glob_match(&p[1..], &t[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_semantics() {
        let g = Glob::new("data/*.parquet");
        assert!(g.matches("data/a.parquet"));
        assert!(!g.matches("data/sub/a.parquet"));
        assert!(!g.matches("data/a.jsonl"));
        let g = Glob::new("data/**/*.parquet");
        assert!(g.matches("data/a.parquet"));
        assert!(g.matches("data/x/y/a.parquet"));
        let g = Glob::new("d/part-0[0-2]?.txt");
        assert!(g.matches("d/part-001.txt"));
        assert!(!g.matches("d/part-031.txt"));
        assert!(Glob::new("d/[!a]*").matches("d/b1"));
        assert!(!Glob::new("d/[!a]*").matches("d/a1"));
    }

    #[test]
    fn split_and_formats() {
        assert_eq!(split_glob("/a/b/*.x"), ("/a/b".to_string(), Some("*.x".to_string())));
        assert_eq!(split_glob("/a/b"), ("/a/b".to_string(), None));
        assert_eq!(FileFormat::from_name("x/train-00001.parquet"), Some(FileFormat::Parquet));
        assert_eq!(FileFormat::from_name("a.JSONL"), Some(FileFormat::Jsonl));
        assert_eq!(FileFormat::from_name("README"), None);
        assert_eq!(FileFormat::from_name("README.md"), None);
        assert!(is_repo_doc("README.txt") && is_repo_doc("LICENSE") && !is_repo_doc("readings.txt"));
    }

    #[test]
    fn an_empty_source_is_refused_not_read_as_the_current_directory() {
        for spec in ["", "  "] {
            let err = locate(spec).err().expect("refused").to_string();
            assert!(err.contains("the source is empty"), "{err}");
        }
    }

    #[test]
    fn a_fifo_as_a_corpus_file_is_refused_by_name_through_a_directory_or_a_glob() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap().to_string();
        std::fs::write(dir.path().join("good.jsonl"), "{\"text\": \"x\"}\n").unwrap();
        let mkfifo = |name: &str| {
            let path = dir.path().join(name);
            assert!(std::process::Command::new("mkfifo").arg(&path).status().unwrap().success());
            path
        };
        // Not corpus files: never opened, no error.
        mkfifo(".hidden.jsonl");
        mkfifo("notes.md");
        let open = |spec: &str| crate::Corpus::open(spec, &crate::CorpusConfig::default()).map(|c| c.files().len());
        assert_eq!(open(&root).unwrap(), 1);
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let fifo = mkfifo("sub/part.jsonl");
        for spec in
            [root.clone(), format!("{root}/sub/*.jsonl"), format!("{root}/**/*.jsonl"), fifo.display().to_string()]
        {
            let err = open(&spec).err().unwrap_or_else(|| panic!("{spec}: accepted")).to_string();
            assert!(err.contains("sub/part.jsonl") && err.contains("FIFO"), "{spec}: {err}");
        }
        // Only the good file matches.
        assert_eq!(open(&format!("{root}/good.*")).unwrap(), 1);
    }

    #[test]
    fn unsupported_scheme_is_named() {
        let err = locate("ftp://host/x").err().expect("ftp must be refused");
        assert!(err.to_string().contains("unsupported scheme \"ftp\""), "{err}");
    }
}
