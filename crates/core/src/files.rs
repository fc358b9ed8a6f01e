//! Files the engine writes: atomically, so that a crash, a full disk or a
//! concurrent reader never sees half a file.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `path` through `write`: into a temporary file in the same
/// directory, flushed and synced, then renamed over `path` (and the
/// directory synced, so the rename survives a power cut). On any failure the
/// temporary file is removed and `path` is as it was. The error says which
/// step failed: `Create` (the path cannot be written: a caller's mistake) or
/// `Write` (disk full, I/O error: the machine's).
pub fn write_atomically(path: &Path, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<(), WriteError> {
    let tmp = temp_path(path);
    let file = File::create(&tmp).map_err(WriteError::Create)?;
    let written = (|| -> io::Result<()> {
        let mut w = BufWriter::with_capacity(1 << 20, file);
        write(&mut w)?;
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)?;
        sync_dir(path);
        Ok(())
    })();
    written.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        WriteError::Write(e)
    })
}

#[derive(Debug)]
pub enum WriteError {
    Create(io::Error),
    Write(io::Error),
}

/// A temporary name beside `path`, unique in this process.
fn temp_path(path: &Path) -> PathBuf {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{}.{seq}.tmp", std::process::id()))
}

/// Syncs the directory holding `path` (where the platform can open one).
fn sync_dir(path: &Path) {
    #[cfg(unix)]
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let dir = std::env::temp_dir().join(format!("llama-engine-files-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.bin");
        write_atomically(&path, |w| w.write_all(b"old")).unwrap();
        let e = write_atomically(&path, |w| {
            w.write_all(b"half")?;
            Err(io::Error::other("disk full"))
        });
        assert!(matches!(e, Err(WriteError::Write(_))));
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        assert!(matches!(write_atomically(&dir.join("no/such/dir/f"), |_| Ok(())), Err(WriteError::Create(_))));
        fs::remove_dir_all(&dir).unwrap();
    }
}
