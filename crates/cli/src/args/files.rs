//! Files a flag names that a command reads whole (`extract --config`, `forward --ids`, `plan
//! --config`, `--job-token-file`): each must be a regular file (a link to one is fine) of at
//! most a stated size, checked before it is opened — a FIFO would block the read forever, a
//! device such as `/dev/zero` never ends, a huge file would be read into memory — with the
//! flag and the path named in the error.

use std::path::Path;

use anyhow::{Context, bail};

/// The most bytes of a small text file a flag names (a TOML or JSON config, a job token).
pub const MAX_TEXT_BYTES: u64 = 16 << 20;

/// The text of `path`, which `what` (the flag, or what the file is) names, when it is a
/// regular file of at most `max_bytes`.
pub fn read_text(path: &Path, what: &str, max_bytes: u64) -> anyhow::Result<String> {
    check_regular(path, what, max_bytes)?;
    std::fs::read_to_string(path).with_context(|| format!("cannot read {what} {}", path.display()))
}

/// Refuses `path` unless it is a regular file of at most `max_bytes`, without opening it.
pub fn check_regular(path: &Path, what: &str, max_bytes: u64) -> anyhow::Result<()> {
    let metadata =
        siphon_files::check_regular(path).with_context(|| format!("cannot read {what} {}", path.display()))?;
    if metadata.len() > max_bytes {
        bail!("{what} {} has {} bytes, more than the {max_bytes} it may have", path.display(), metadata.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_of_their_size_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("run.toml");
        std::fs::write(&file, "seq-len = 8\n").unwrap();
        assert_eq!(read_text(&file, "--config", 100).unwrap(), "seq-len = 8\n");
        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_text(&link, "--config", 100).unwrap(), "seq-len = 8\n");

        let err = read_text(&file, "--config", 4).unwrap_err().to_string();
        assert!(err.contains("--config") && err.contains("12 bytes, more than the 4"), "{err}");
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        for (path, is) in [
            (fifo.as_path(), "a FIFO (named pipe)"),
            (Path::new("/dev/zero"), "a character device"),
            (dir.path(), "a directory"),
        ] {
            let err = format!("{:#}", read_text(path, "--ids", MAX_TEXT_BYTES).unwrap_err());
            assert_eq!(err, format!("cannot read --ids {}: {is}, not a regular file", path.display()));
        }
        let err = format!("{:#}", read_text(&dir.path().join("missing"), "--ids", 1).unwrap_err());
        assert!(err.contains("cannot read --ids") && err.contains("missing"), "{err}");
    }
}
