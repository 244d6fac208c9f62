//! Opening the files a model or a dictionary is read from. Each must be a regular file (a
//! symlink to one is fine), checked before it is opened (`siphon_files`): a FIFO in its place
//! would block the open forever. Every file the crate reads goes through [`check_regular`],
//! through [`open`] and [`read_to_string`] where it reads it itself.

use std::fs::{File, FileType};
use std::path::Path;

use crate::error::ModelError;

/// Checks that `path` is a regular file, following symlinks; otherwise an error naming the
/// path and what it is instead ([`siphon_files::check_regular`]).
pub(crate) fn check_regular(path: &Path) -> Result<(), ModelError> {
    siphon_files::check_regular(path).map(drop).map_err(|e| ModelError::io(path, e))
}

/// `path` opened for reading, once it is known to be a regular file.
pub(crate) fn open(path: &Path) -> Result<File, ModelError> {
    check_regular(path)?;
    File::open(path).map_err(|e| ModelError::io(path, e))
}

/// The text of the regular file `path`.
pub(crate) fn read_to_string(path: &Path) -> Result<String, ModelError> {
    check_regular(path)?;
    std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))
}

/// The error for `path`, of type `found`, given where `wanted` was expected.
pub(crate) fn not_a(path: &Path, found: &FileType, wanted: &str) -> ModelError {
    let detail = format!("{}, not {wanted}", siphon_files::kind(found));
    ModelError::io(path, std::io::Error::new(std::io::ErrorKind::InvalidInput, detail))
}

/// Makes a FIFO at `path` (which must not exist), for the tests that put one where a file
/// is read.
#[cfg(test)]
pub(crate) fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo").arg(path).status().expect("run mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_and_links_to_them_are_opened() {
        let dir = tempfile::tempdir().unwrap();
        let (file, link, fifo) = (dir.path().join("a.json"), dir.path().join("link.json"), dir.path().join("fifo"));
        std::fs::write(&file, "{}").unwrap();
        std::os::unix::fs::symlink(&file, &link).unwrap();
        mkfifo(&fifo);
        assert_eq!(read_to_string(&link).unwrap(), "{}");
        for (path, kind) in
            [(fifo.as_path(), "a FIFO"), (dir.path(), "a directory"), (Path::new("/dev/null"), "a character device")]
        {
            let err = read_to_string(path).unwrap_err().to_string();
            assert!(err.contains(&path.display().to_string()) && err.contains(kind), "{err}");
            assert!(open(path).is_err());
        }
        let err = read_to_string(&dir.path().join("absent")).unwrap_err().to_string();
        assert!(err.contains("absent"), "{err}");
    }
}
