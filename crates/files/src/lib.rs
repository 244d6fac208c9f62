//! The files a user names, read safely. A path siphon reads as a file must be a regular file (a
//! symlink to one is fine), checked before it is opened: a FIFO in its place blocks the open
//! forever, a device such as `/dev/zero` never ends, and a directory gives an OS error that
//! does not say what is wrong. Every crate that reads a file a user names (a model's, a
//! corpus's, a run's, a flag's) checks it with [`check_regular`] and names the file in its own
//! error; [`kind`] says what a path is instead.

#![deny(missing_docs)]

use std::fs::{FileType, Metadata};
use std::io;
use std::path::Path;

/// The metadata of `path` (following symlinks) when it is a regular file; otherwise the OS's
/// error (a path that does not exist), or an [`io::ErrorKind::InvalidInput`] error saying what
/// it is instead: `a FIFO (named pipe), not a regular file`.
pub fn check_regular(path: &Path) -> io::Result<Metadata> {
    let metadata = std::fs::metadata(path)?;
    match metadata.is_file() {
        true => Ok(metadata),
        false => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}, not a regular file", kind(&metadata.file_type())),
        )),
    }
}

/// What a file type is, in words: `a directory`, `a FIFO (named pipe)`, `a socket`, `a
/// character device`, `a block device`, `a regular file`, else `a special file`.
pub fn kind(file_type: &FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    match file_type {
        t if t.is_file() => "a regular file",
        t if t.is_dir() => "a directory",
        t if t.is_fifo() => "a FIFO (named pipe)",
        t if t.is_socket() => "a socket",
        t if t.is_char_device() => "a character device",
        t if t.is_block_device() => "a block device",
        _ => "a special file",
    }
}

/// What `metadata` is when it is neither a regular file nor a directory (a FIFO, a socket, a
/// device): what a directory's listing must not hand on as a file.
pub fn special(metadata: &Metadata) -> Option<&'static str> {
    let file_type = metadata.file_type();
    (!file_type.is_file() && !file_type.is_dir()).then(|| kind(&file_type))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_and_links_to_them_pass() {
        let dir = tempfile::tempdir().unwrap();
        let (file, link, fifo) = (dir.path().join("a.json"), dir.path().join("link"), dir.path().join("fifo"));
        std::fs::write(&file, "{}").unwrap();
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        assert!(check_regular(&file).is_ok() && check_regular(&link).is_ok());
        for (path, what) in [
            (&fifo, "a FIFO (named pipe), not a regular file"),
            (&dir.path().to_path_buf(), "a directory, not a regular file"),
        ] {
            let err = check_regular(path).unwrap_err();
            assert_eq!((err.kind(), err.to_string()), (io::ErrorKind::InvalidInput, what.to_string()));
        }
        assert_eq!(
            check_regular(Path::new("/dev/null")).unwrap_err().to_string(),
            "a character device, not a regular file"
        );
        assert_eq!(check_regular(&dir.path().join("none")).unwrap_err().kind(), io::ErrorKind::NotFound);
        assert_eq!(special(&std::fs::metadata(&fifo).unwrap()), Some("a FIFO (named pipe)"));
        assert_eq!(special(&std::fs::metadata(dir.path()).unwrap()), None);
    }
}
