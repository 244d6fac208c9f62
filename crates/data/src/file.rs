//! Local files the data path reads whole (a tokenizer.json, a chat template) or lists (a
//! corpus's files): each must be a regular file, checked before it is opened — opening a FIFO
//! blocks until something writes to it, and a device never ends.

use std::path::Path;

use crate::error::{Error, Result};

/// Refuses `path` unless it is a regular file (or a link to one), naming what it is instead.
pub fn check_regular_file(path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
    match meta.is_file() {
        true => Ok(()),
        false => Err(not_a_file(path, siphon_files::kind(&meta.file_type()))),
    }
}

/// Reads `path`, a regular file, as UTF-8 text.
pub fn read_text_file(path: &Path) -> Result<String> {
    check_regular_file(path)?;
    std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.display().to_string(), source })
}

fn not_a_file(path: &Path, what: &str) -> Error {
    Error::NotAFile { path: path.display().to_string(), what: what.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_and_links_to_them_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.json");
        std::fs::write(&file, "{}").unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_text_file(&link).unwrap(), "{}");
        let fifo = dir.path().join("fifo.json");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let fifo_link = dir.path().join("fifo-link.json");
        std::os::unix::fs::symlink(&fifo, &fifo_link).unwrap();
        for (path, what) in [(&fifo, "FIFO"), (&fifo_link, "FIFO"), (&dir.path().to_path_buf(), "directory")] {
            let err = read_text_file(path).unwrap_err().to_string();
            assert!(err.contains(&path.display().to_string()) && err.contains(what), "{err}");
        }
        let err = check_regular_file(Path::new("/dev/null")).unwrap_err().to_string();
        assert!(err.contains("a character device"), "{err}");
    }
}
