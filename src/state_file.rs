//! Files the agent's state lives in (the shutdown state, the isolation record, the last
//! controller contact, logind's drop-in): each is replaced whole, so a crash or a power
//! cut mid-write leaves the old file or the new one, never half of either.

use std::io::Write;
use std::path::Path;

use serde::Serialize;

/// Replace `path` with `contents` atomically (mode 0644), creating the parent directory.
pub fn atomic_write(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    replace(path, contents, true)
}

/// [`atomic_write`] without the fsyncs: the new file outlives the process (a SIGKILL, a
/// crash) but not necessarily a power cut. For state that a reboot makes moot anyway, on a
/// path written often enough that an fsync would cost (the API writes still owed).
pub fn replace_unsynced(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    replace(path, contents, false)
}

fn replace(path: &Path, contents: &[u8], durable: bool) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(".tmp-{file_name}-{}", std::process::id()));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&temp)?;
        file.write_all(contents)?;
        if durable {
            file.sync_all()?;
        }
        drop(file);
        std::fs::rename(&temp, path)?;
        if durable {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// `value` as indented JSON with a final newline, replaced atomically.
pub fn write_json(path: &Path, value: &impl Serialize) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    atomic_write(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_whole_and_leaves_no_temporary_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deeper/state.json");
        write_json(&path, &serde_json::json!({"phase": 1})).unwrap();
        write_json(&path, &serde_json::json!({"phase": 2})).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\n  \"phase\": 2\n}\n"
        );
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["state.json"]);
    }

    #[test]
    fn a_failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        // The target is a directory: the rename fails after the temporary is written.
        let path = dir.path().join("taken");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("inside"), "old").unwrap();
        assert!(atomic_write(&path, b"new").is_err());
        assert_eq!(std::fs::read_to_string(path.join("inside")).unwrap(), "old");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["taken"]);
    }
}
