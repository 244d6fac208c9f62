//! Datasets on the Hugging Face Hub, read where they lie: `hf://datasets/OWNER/NAME[@REVISION]/PATH`
//! (PATH a file, a directory or a glob), or a dataset's split by name (`OWNER/NAME` with a
//! config and a split, resolved as `datasets.load_dataset` resolves them).
//!
//! Listing goes through the Hub's tree API (`/api/datasets/{repo}/tree/{revision}/{path}`,
//! paginated by `Link` headers); reads are ranged GETs of `/datasets/{repo}/resolve/{revision}/
//! {path}` through object_store's HTTP store, which follows the Hub's redirects to its CDN. Like
//! `huggingface_hub`, `HF_ENDPOINT` replaces `https://huggingface.co` and `HF_TOKEN` (or
//! `HUGGING_FACE_HUB_TOKEN`) is sent as a bearer token (never across a redirect to another
//! host). Nothing is downloaded whole: the corpus plan reads parquet footers, the stream reads
//! the units its worker owns.

use std::sync::Arc;

use object_store::ObjectStore;
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::percent::percent_decode;

/// The Hub's default endpoint.
const HUB: &str = "https://huggingface.co";
/// The revision the Hub's dataset viewer writes each config's splits to as parquet.
const PARQUET_REVISION: &str = "refs/convert/parquet";

/// One revision of a dataset repository on the Hub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HubDataset {
    endpoint: String,
    /// `OWNER/NAME`.
    pub repo: String,
    pub revision: String,
    token: Option<String>,
}

/// A file of the repository, as the tree API lists it.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    pub path: String,
    #[serde(default)]
    size: u64,
    /// Set for files stored in LFS (or Xet), with their real size.
    #[serde(default)]
    lfs: Option<LfsInfo>,
}

#[derive(Clone, Debug, Deserialize)]
struct LfsInfo {
    size: u64,
}

impl TreeEntry {
    /// The file's size in bytes (an LFS file's own, not its pointer's).
    pub fn size(&self) -> u64 {
        self.lfs.as_ref().map_or(self.size, |l| l.size)
    }
}

impl HubDataset {
    /// The dataset `repo` (`OWNER/NAME`) at `revision`, on the endpoint and with the token the
    /// environment gives.
    pub fn new(repo: &str, revision: &str) -> Result<HubDataset> {
        if !is_repo_name(repo) {
            return Err(Error::BadSource {
                spec: repo.to_string(),
                reason: "a Hub dataset is named OWNER/NAME (letters, digits, '-', '_', '.')".into(),
            });
        }
        let endpoint = std::env::var("HF_ENDPOINT").unwrap_or_else(|_| HUB.into()).trim_end_matches('/').to_string();
        let token =
            ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"].iter().find_map(|v| std::env::var(v).ok()).filter(|t| !t.is_empty());
        Ok(HubDataset { endpoint, repo: repo.to_string(), revision: revision.to_string(), token })
    }

    /// Parses `hf://datasets/OWNER/NAME[@REVISION]/PATH` into the dataset and the path in it
    /// (a percent-encoded revision, like `refs%2Fconvert%2Fparquet`, is decoded).
    pub fn parse(spec: &str) -> Result<(HubDataset, String)> {
        let bad = |reason: &str| Error::BadSource { spec: spec.to_string(), reason: reason.to_string() };
        let rest = spec.strip_prefix("hf://").ok_or_else(|| bad("not an hf:// URL"))?;
        let rest = rest.strip_prefix("datasets/").ok_or_else(|| {
            bad("a corpus on the Hub is hf://datasets/OWNER/NAME[@REVISION]/PATH (models are not corpora)")
        })?;
        let mut parts = rest.splitn(3, '/');
        let (owner, name_rev, path) =
            (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let (name, revision) = name_rev.split_once('@').unwrap_or((name_rev, "main"));
        let revision = percent_decode(revision);
        Ok((HubDataset::new(&format!("{owner}/{name}"), &revision)?, path.to_string()))
    }

    /// This dataset at another revision.
    pub fn at(&self, revision: &str) -> HubDataset {
        HubDataset { revision: revision.to_string(), ..self.clone() }
    }

    /// How its files are named in messages: `hf://datasets/OWNER/NAME@REVISION/`.
    pub fn display_root(&self) -> String {
        format!("hf://datasets/{}@{}/", self.repo, self.revision)
    }

    /// An object store over the repository's files at this revision (ranged reads only).
    pub fn store(&self) -> Result<Arc<dyn ObjectStore>> {
        let base = format!("{}/datasets/{}/resolve/{}", self.endpoint, self.repo, encode(&self.revision));
        let mut options = object_store::ClientOptions::new().with_allow_http(base.starts_with("http://"));
        if let Some(token) = &self.token {
            let mut headers = object_store::HeaderMap::new();
            let value = format!("Bearer {token}")
                .parse()
                .map_err(|_| Error::Config("HF_TOKEN is not a valid header value".into()))?;
            headers.insert("authorization", value);
            options = options.with_default_headers(headers);
        }
        let store = object_store::http::HttpBuilder::new()
            .with_url(base.clone())
            .with_client_options(options)
            .build()
            .map_err(|source| Error::Store { location: base, source })?;
        Ok(Arc::new(store))
    }

    fn client(&self) -> Result<reqwest::Client> {
        reqwest::Client::builder().build().map_err(|e| self.failed("start an HTTP client", e.to_string()))
    }

    fn failed(&self, what: &str, reason: String) -> Error {
        Error::BadSource { spec: self.display_root(), reason: format!("cannot {what}: {reason}") }
    }

    /// GET `url` from the Hub's API as JSON, with the `Link` header's next page if any.
    async fn get_json<T: for<'de> Deserialize<'de>>(
        &self,
        client: &reqwest::Client,
        url: &str,
    ) -> Result<(T, Option<String>)> {
        let mut request = client.get(url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| self.failed(&format!("reach {url}"), e.to_string()))?;
        let status = response.status();
        if !status.is_success() {
            let hint = match status.as_u16() {
                401 | 403 => match self.token {
                    Some(_) => " (HF_TOKEN was sent: does it grant access to this dataset?)",
                    None => " (a gated or private dataset needs HF_TOKEN)",
                },
                404 => " (no such dataset, revision or path)",
                _ => "",
            };
            let body = response.text().await.unwrap_or_default();
            return Err(self.failed(&format!("read {url}"), format!("HTTP {status}{hint}: {}", body.trim())));
        }
        let next = response
            .headers()
            .get_all("link")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .find(|link| link.contains("rel=\"next\""))
            .and_then(|link| {
                link.split_once('<').and_then(|(_, rest)| rest.split_once('>')).map(|(url, _)| url.to_string())
            });
        let value = response.json().await.map_err(|e| self.failed(&format!("parse {url}"), e.to_string()))?;
        Ok((value, next))
    }

    /// Every file under `path` (the repository's root when empty), recursively, in the tree
    /// API's order.
    pub async fn list(&self, path: &str) -> Result<Vec<TreeEntry>> {
        let client = self.client()?;
        let path = path.trim_matches('/');
        let mut url = format!(
            "{}/api/datasets/{}/tree/{}{}{}?recursive=true",
            self.endpoint,
            self.repo,
            encode(&self.revision),
            if path.is_empty() { "" } else { "/" },
            path.split('/').map(encode).collect::<Vec<_>>().join("/")
        );
        let mut files = Vec::new();
        loop {
            let (page, next): (Vec<TreeEntry>, _) = self.get_json(&client, &url).await?;
            files.extend(page.into_iter().filter(|e| e.kind == "file"));
            match next {
                Some(next) => url = next,
                None => return Ok(files),
            }
        }
    }

    /// The dataset card's metadata (`cardData`), if it has any.
    async fn card(&self) -> Result<Option<serde_json::Value>> {
        let client = self.client()?;
        let url = format!("{}/api/datasets/{}/revision/{}", self.endpoint, self.repo, encode(&self.revision));
        let (info, _): (serde_json::Value, _) = self.get_json(&client, &url).await?;
        Ok(info.get("cardData").cloned())
    }

    /// The files of split `split` of config `config`, as `datasets.load_dataset` finds them:
    /// the `data_files` globs the dataset card's `configs` give, or, for a dataset without
    /// them, the parquet files the Hub converted the split to (`refs/convert/parquet`,
    /// `CONFIG/SPLIT/*.parquet`). Returns the revision they lie at and the globs.
    pub async fn split_files(&self, config: Option<&str>, split: &str) -> Result<(HubDataset, Vec<String>)> {
        if let Some(configs) = self.card().await?.as_ref().and_then(|c| c.get("configs")).and_then(|c| c.as_array()) {
            let configs: Vec<CardConfig> = configs
                .iter()
                .map(|c| serde_json::from_value(c.clone()))
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| self.failed("read the dataset card's configs", e.to_string()))?;
            let chosen = choose_config(&configs, config).map_err(|reason| self.failed("choose a config", reason))?;
            let globs = chosen.split_globs(split).map_err(|reason| self.failed("choose a split", reason))?;
            return Ok((self.clone(), globs));
        }
        // No configs in the card: the Hub's parquet conversion, one directory per config.
        let converted = self.at(PARQUET_REVISION);
        let files = converted.list("").await?;
        let mut names: Vec<&str> = files.iter().filter_map(|f| f.path.split_once('/').map(|(c, _)| c)).collect();
        names.dedup();
        let config = match config {
            Some(c) => c.to_string(),
            None if names.contains(&"default") => "default".into(),
            None if names.len() == 1 => names[0].to_string(),
            None => {
                return Err(
                    self.failed("choose a config", format!("the dataset has configs {names:?}: pass --hf-config"))
                );
            }
        };
        let has = |dir: &str| files.iter().any(|f| f.path.starts_with(&format!("{config}/{dir}/")));
        if !has(split) {
            let reason = if has(&format!("partial-{split}")) {
                format!(
                    "the Hub converted only the start of split {split:?} of config {config:?} to parquet \
                     (partial-{split}); name the dataset's own files with hf://datasets/{}/PATH",
                    self.repo
                )
            } else {
                format!("config {config:?} has no split {split:?} in the Hub's parquet conversion")
            };
            return Err(self.failed("find the split", reason));
        }
        Ok((converted, vec![format!("{config}/{split}/*.parquet")]))
    }
}

/// One entry of a dataset card's `configs`.
#[derive(Debug, Deserialize)]
struct CardConfig {
    config_name: String,
    #[serde(default)]
    default: bool,
    #[serde(default)]
    data_files: Option<DataFiles>,
}

/// `data_files`: a glob or globs (the `train` split), or per split.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum DataFiles {
    One(String),
    Many(Vec<String>),
    Splits(Vec<SplitFiles>),
}

#[derive(Debug, Deserialize)]
struct SplitFiles {
    split: String,
    path: Globs,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Globs {
    One(String),
    Many(Vec<String>),
}

impl CardConfig {
    fn split_globs(&self, split: &str) -> std::result::Result<Vec<String>, String> {
        let globs = |g: &Globs| match g {
            Globs::One(s) => vec![s.clone()],
            Globs::Many(v) => v.clone(),
        };
        match &self.data_files {
            None => Err(format!("config {:?} names no data_files", self.config_name)),
            Some(DataFiles::One(g)) if split == "train" => Ok(vec![g.clone()]),
            Some(DataFiles::Many(g)) if split == "train" => Ok(g.clone()),
            Some(DataFiles::One(_) | DataFiles::Many(_)) => {
                Err(format!("config {:?} has only the split \"train\", not {split:?}", self.config_name))
            }
            Some(DataFiles::Splits(splits)) => {
                splits.iter().find(|s| s.split == split).map(|s| globs(&s.path)).ok_or_else(|| {
                    let names: Vec<&str> = splits.iter().map(|s| s.split.as_str()).collect();
                    format!("config {:?} has splits {names:?}, not {split:?}", self.config_name)
                })
            }
        }
    }
}

/// The config named `name`, else the card's default (marked `default`, or named `default`,
/// or the only one).
fn choose_config<'a>(configs: &'a [CardConfig], name: Option<&str>) -> std::result::Result<&'a CardConfig, String> {
    let names = || configs.iter().map(|c| c.config_name.as_str()).collect::<Vec<_>>();
    let found = match name {
        Some(name) => configs.iter().find(|c| c.config_name == name),
        None => configs.iter().find(|c| c.default).or_else(|| configs.iter().find(|c| c.config_name == "default")).or(
            match configs {
                [only] => Some(only),
                _ => None,
            },
        ),
    };
    found.ok_or_else(|| match name {
        Some(name) => format!("no config {name:?} (the card has {:?})", names()),
        None => format!("the dataset has configs {:?}: pass --hf-config", names()),
    })
}

/// Whether `name` is a Hub repository name, `OWNER/NAME`.
pub(crate) fn is_repo_name(name: &str) -> bool {
    let ok = |part: &str| {
        !part.is_empty()
            && part.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && !part.starts_with('.')
    };
    matches!(name.split_once('/'), Some((owner, repo)) if ok(owner) && ok(repo))
}

/// Percent-encodes one path segment of a URL (a revision with slashes becomes one segment).
fn encode(segment: &str) -> String {
    url::form_urlencoded::byte_serialize(segment.as_bytes()).collect::<String>().replace('+', "%20")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_names_parse() {
        let (d, path) =
            HubDataset::parse("hf://datasets/org/set@refs%2Fconvert%2Fparquet/default/train/*.parquet").unwrap();
        assert_eq!(
            (d.repo.as_str(), d.revision.as_str(), path.as_str()),
            ("org/set", "refs/convert/parquet", "default/train/*.parquet")
        );
        assert_eq!(encode(&d.revision), "refs%2Fconvert%2Fparquet");
        let (d, path) = HubDataset::parse("hf://datasets/org/set").unwrap();
        assert_eq!((d.revision.as_str(), path.as_str()), ("main", ""));
        assert!(HubDataset::parse("hf://org/model").unwrap_err().to_string().contains("models are not corpora"));
        assert!(is_repo_name("HuggingFaceFW/fineweb-edu") && !is_repo_name("a/b/c") && !is_repo_name("./x"));
    }

    #[test]
    fn configs_and_splits_resolve_as_datasets_does() {
        let mut configs: Vec<CardConfig> = serde_json::from_str(
            r#"[{"config_name": "sample-10BT", "data_files": [{"split": "train", "path": "sample/10BT/*"}]},
                {"config_name": "default", "data_files": [{"split": "train", "path": ["data/a-*", "data/b-*"]},
                                                          {"split": "test", "path": "test/*"}]},
                {"config_name": "flat", "data_files": "flat/*.parquet"}]"#,
        )
        .unwrap();
        let default = choose_config(&configs, None).unwrap();
        assert_eq!(default.split_globs("train").unwrap(), ["data/a-*", "data/b-*"]);
        assert_eq!(default.split_globs("test").unwrap(), ["test/*"]);
        assert!(default.split_globs("validation").unwrap_err().contains("has splits [\"train\", \"test\"]"));
        assert_eq!(choose_config(&configs, Some("flat")).unwrap().split_globs("train").unwrap(), ["flat/*.parquet"]);
        assert!(choose_config(&configs, Some("flat")).unwrap().split_globs("test").is_err());
        assert!(choose_config(&configs, Some("nope")).unwrap_err().contains("no config \"nope\""));
        assert!(choose_config(&configs[..1], None).is_ok());
        assert!(choose_config(&[configs.remove(2), configs.remove(0)], None).unwrap_err().contains("pass --hf-config"));
    }
}
