//! Models and directories that are not on local disk: `hf://org/name[@revision]` (the Hugging
//! Face hub, or `HF_ENDPOINT` as huggingface_hub reads it), `gs://`, `s3://`, `az://` and
//! `http(s)://` URLs of a model directory or a `.gguf` file ([`local_model_path`]), or of a
//! directory whose files its reader chooses ([`local_directory`]: a dictionary's,
//! `super::dictionary`). The files are downloaded once into `$SIPHON_CACHE/models/`, each
//! written under a temporary name and renamed, so an interrupted download never leaves a
//! half-written file that a later run would trust.
//!
//! Before its first download from an `http(s)://` host (the Hub, a mirror) a process checks
//! that the host answers at all ([`reachable`]: its name resolves and a connection opens, within
//! seconds): an offline machine is told so at once instead of after the store client's retries,
//! which are for errors that pass. A file already in the cache needs no network.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use object_store::ObjectStoreExt;
use siphon_store::StoreLocation;

/// Files of an HF model directory besides the weights; the first is required.
const DIR_FILES: [&str; 3] = ["config.json", "tokenizer.json", "tokenizer_config.json"];

/// A local path for `spec`: unchanged when it is not a URL, else the cached download.
pub fn local_model_path(spec: &Path) -> anyhow::Result<PathBuf> {
    let text = spec.to_string_lossy();
    let Some((scheme, rest)) = text.split_once("://") else { return Ok(spec.to_path_buf()) };
    let base = match scheme {
        "hf" => {
            let (repo, revision) = rest.split_once('@').unwrap_or((rest, "main"));
            let endpoint = std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into());
            format!("{}/{repo}/resolve/{revision}", endpoint.trim_end_matches('/'))
        }
        "file" => return Ok(PathBuf::from(rest)),
        "gs" | "s3" | "az" | "http" | "https" => text.to_string(),
        other => bail!("unsupported model URL scheme {other:?} (use a path, hf://, gs://, s3://, az:// or https://)"),
    };
    let cache = siphon_runtime::siphon_cache_dir().join("models").join(sanitize(&text));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let options = download_options(&base);
    if base.ends_with(".gguf") {
        let (dir, file) = base.rsplit_once('/').context("a .gguf URL needs a directory part")?;
        let location = StoreLocation::open(dir, &options)?;
        let dest = cache.join(file);
        runtime.block_on(download(&location, file, &dest, true))?;
        return Ok(dest);
    }
    let location = StoreLocation::open(&base, &options)?;
    runtime.block_on(async {
        for (i, name) in DIR_FILES.iter().enumerate() {
            download(&location, name, &cache.join(name), i == 0).await?;
        }
        let index = "model.safetensors.index.json";
        if download(&location, index, &cache.join(index), false).await? {
            for shard in shard_names(&cache.join(index))? {
                download(&location, &shard, &cache.join(&shard), true).await?;
            }
        } else {
            download(&location, "model.safetensors", &cache.join("model.safetensors"), true).await?;
        }
        anyhow::Ok(())
    })?;
    Ok(cache)
}

/// A local directory for `spec`: unchanged when it is not a URL, else the files `fetch` asks
/// for, downloaded once into `$SIPHON_CACHE/models/` — `hf://OWNER/NAME[@REVISION]/PATH` (a
/// directory of the repository, kept under its own path, so that a layout that names what the
/// directory holds, as Gemma Scope's does, still does), or a `gs://`, `s3://`, `az://` or
/// `http(s)://` URL of the directory. `what` the directory holds names it in errors.
pub fn local_directory(
    spec: &str,
    what: &str,
    fetch: impl FnOnce(&Directory) -> anyhow::Result<()>,
) -> anyhow::Result<PathBuf> {
    let Some((scheme, rest)) = spec.split_once("://") else { return Ok(PathBuf::from(spec)) };
    let (base, cache) = match scheme {
        "hf" => {
            let mut parts = rest.splitn(3, '/');
            let (owner, name, path) = (parts.next(), parts.next(), parts.next());
            let (Some(owner), Some(name)) = (owner, name) else {
                bail!("{spec}: a {what} on the Hub is hf://OWNER/NAME[@REVISION]/PATH");
            };
            let (name, revision) = name.split_once('@').unwrap_or((name, "main"));
            let path = path.unwrap_or("").trim_matches('/');
            let endpoint = std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into());
            let base = format!("{}/{owner}/{name}/resolve/{revision}/{path}", endpoint.trim_end_matches('/'));
            let root = siphon_runtime::siphon_cache_dir()
                .join("models")
                .join(sanitize(&format!("hf://{owner}/{name}@{revision}")));
            (base.trim_end_matches('/').to_string(), root.join(path))
        }
        "file" => return Ok(PathBuf::from(rest)),
        "gs" | "s3" | "az" | "http" | "https" => (
            spec.trim_end_matches('/').to_string(),
            siphon_runtime::siphon_cache_dir().join("models").join(sanitize(spec)),
        ),
        other => bail!("unsupported {what} URL scheme {other:?} (use a path, hf://, gs://, s3://, az:// or https://)"),
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let location = StoreLocation::open(&base, &download_options(&base))?;
    fetch(&Directory { location, cache: cache.clone(), runtime })?;
    Ok(cache)
}

/// A directory's files at a URL as [`local_directory`] fetches them.
pub struct Directory {
    location: StoreLocation,
    cache: PathBuf,
    runtime: tokio::runtime::Runtime,
}

impl Directory {
    /// Downloads the file `name` (a path inside the directory) unless it is there already;
    /// `Ok(false)` when an optional file does not exist remotely.
    pub fn file(&self, name: &str, required: bool) -> anyhow::Result<bool> {
        self.runtime.block_on(download(&self.location, name, &self.cache.join(name), required))
    }
}

/// The store client's options for downloads from `base`: plain http only when asked for
/// explicitly (a local mirror, `HF_ENDPOINT=http://...`); a connection must open within
/// [`CONNECT_TIMEOUT`], and a transfer may take as long as its file needs (the client's own
/// bound on a whole request, made for a shard's upload parts, would cut a weight file short).
fn download_options(base: &str) -> Vec<(String, String)> {
    let mut options = vec![
        ("connect_timeout".to_string(), format!("{}s", CONNECT_TIMEOUT.as_secs())),
        ("timeout".to_string(), "24h".to_string()),
    ];
    if base.starts_with("http://") {
        options.push(("allow_http".into(), "true".into()));
    }
    options
}

/// How long a host may take to resolve, and a connection to it to open.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether the host of an `http(s)://` URL answers: its name resolves and a TCP connection
/// opens, each within [`CONNECT_TIMEOUT`] (checked once per host and process). Other schemes
/// pass: their clients find their own endpoints.
fn reachable(url: &str) -> anyhow::Result<()> {
    static ANSWERED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let parsed = url::Url::parse(url).with_context(|| format!("{url} is not a URL"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Ok(());
    }
    let (Some(host), Some(port)) = (parsed.host_str(), parsed.port_or_known_default()) else {
        bail!("{url} names no host");
    };
    let address = format!("{host}:{port}");
    if ANSWERED.lock().unwrap_or_else(|e| e.into_inner()).contains(&address) {
        return Ok(());
    }
    let (sender, answer) = std::sync::mpsc::channel();
    let probed = address.clone();
    // A thread of its own: a name lookup has no timeout of its own.
    std::thread::spawn(move || {
        use std::net::ToSocketAddrs;
        let result =
            probed.to_socket_addrs().map_err(|e| format!("its name does not resolve ({e})")).and_then(|mut addrs| {
                let addr = addrs.next().ok_or_else(|| "its name resolves to no address".to_string())?;
                std::net::TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
                    .map(drop)
                    .map_err(|e| format!("no connection to {addr} ({e})"))
            });
        let _ = sender.send(result);
    });
    let why = match answer.recv_timeout(CONNECT_TIMEOUT * 2) {
        Ok(Ok(())) => {
            ANSWERED.lock().unwrap_or_else(|e| e.into_inner()).push(address);
            return Ok(());
        }
        Ok(Err(why)) => why,
        Err(_) => format!("no answer within {:?}", CONNECT_TIMEOUT * 2),
    };
    bail!(
        "cannot reach {address}: {why}; is this machine offline? Download the files where there is a \
         network and give their local path (or set HF_ENDPOINT to a mirror this machine reaches)"
    )
}

/// Downloads `name` to `dest` unless it is there already; `Ok(false)` when an optional file
/// does not exist remotely.
async fn download(location: &StoreLocation, name: &str, dest: &Path, required: bool) -> anyhow::Result<bool> {
    if dest.exists() {
        return Ok(true);
    }
    reachable(location.url())?;
    // A file in a folder (Llama Scope's checkpoints/): one path part per folder.
    let mut parts = name.split('/');
    let first = location.run_dir(parts.next().unwrap_or(name));
    let path = parts.fold(first, |path, part| path.join(part));
    let bytes = match location.store().get(&path).await {
        Ok(result) => result.bytes().await.with_context(|| format!("downloading {name} from {}", location.url()))?,
        Err(object_store::Error::NotFound { .. }) if !required => return Ok(false),
        Err(err) => return Err(err).with_context(|| format!("cannot fetch {name} from {}", location.url())),
    };
    let dir = dest.parent().context("download destination without a directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let partial = dest.with_extension("partial");
    std::fs::write(&partial, &bytes).with_context(|| format!("cannot write {}", partial.display()))?;
    std::fs::rename(&partial, dest).with_context(|| format!("cannot write {}", dest.display()))?;
    tracing::info!(file = name, bytes = bytes.len(), from = location.url(), "downloaded");
    Ok(true)
}

/// The distinct shard files of a sharded safetensors index.
fn shard_names(index: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(index).with_context(|| format!("cannot read {}", index.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", index.display()))?;
    let map = json["weight_map"].as_object().with_context(|| format!("{} has no weight_map", index.display()))?;
    let mut names: Vec<String> = map.values().filter_map(|v| v.as_str().map(String::from)).collect();
    names.sort();
    names.dedup();
    if let Some(bad) = names.iter().find(|n| n.contains('/') || n.starts_with('.')) {
        bail!("{} names a shard outside the model directory: {bad:?}", index.display());
    }
    Ok(names)
}

/// A directory name for a URL.
fn sanitize(url: &str) -> String {
    url.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' { c } else { '_' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_paths_pass_through_and_odd_schemes_are_refused() {
        assert_eq!(local_model_path(Path::new("/models/x")).unwrap(), PathBuf::from("/models/x"));
        assert_eq!(local_model_path(Path::new("file:///models/x")).unwrap(), PathBuf::from("/models/x"));
        assert!(local_model_path(Path::new("ftp://host/x")).is_err());
        assert_eq!(sanitize("hf://org/name@main"), "hf___org_name_main");
    }
}
