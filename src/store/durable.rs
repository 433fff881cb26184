//! Small filesystem primitives that make writes survive a crash: atomic file replacement and
//! directory fsync.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::StoreError;

/// Makes a rename or a new directory entry inside `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    #[cfg(unix)]
    {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(StoreError::io(dir))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// A temp path beside `target`, unique within this machine for this process's lifetime, and
/// hidden (leading dot) so listings that look for real names skip it.
pub fn temp_path_for(target: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = target
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    target.with_file_name(format!(".{name}.tmp-{}-{n}", std::process::id()))
}

/// Whether `name` is one of our temp files (left behind only by a crash).
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(".tmp-")
}

/// Writes the temp file of an atomic replacement, fsynced; the caller renames it.
pub fn write_temp(target: &Path, bytes: &[u8]) -> Result<PathBuf, StoreError> {
    let tmp = temp_path_for(target);
    let result = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(source) = result {
        let _ = fs::remove_file(&tmp);
        return Err(StoreError::Io { path: tmp, source });
    }
    Ok(tmp)
}

/// Renames a fsynced temp file over `target` and makes the rename durable.
pub fn commit_temp(tmp: &Path, target: &Path) -> Result<(), StoreError> {
    if let Err(source) = fs::rename(tmp, target) {
        let _ = fs::remove_file(tmp);
        return Err(StoreError::Io {
            path: target.to_path_buf(),
            source,
        });
    }
    match target.parent() {
        Some(parent) => sync_dir(parent),
        None => Ok(()),
    }
}

/// Replaces `target` with `bytes` so that after a crash it holds either the old or the new
/// content, never a mix: temp file, fsync, rename, directory fsync.
pub fn write_atomic(target: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let tmp = write_temp(target, bytes)?;
    commit_temp(&tmp, target)
}

/// Creates `dir` (and missing parents) if needed; returns whether it had to be created. Each
/// new directory's entry is fsynced in its parent so the whole chain survives a crash.
pub fn ensure_dir(dir: &Path) -> Result<bool, StoreError> {
    if dir.is_dir() {
        return Ok(false);
    }
    let missing: Vec<&Path> = dir.ancestors().take_while(|p| !p.is_dir()).collect();
    for level in missing.into_iter().rev() {
        match fs::create_dir(level) {
            Ok(()) => {}
            // Another process may be creating the same layout.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && level.is_dir() => continue,
            Err(source) => {
                return Err(StoreError::Io {
                    path: level.to_path_buf(),
                    source,
                });
            }
        }
        if let Some(parent) = level.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    Ok(true)
}

/// Reserves `len` bytes of `file` from `offset` (extending its length): the space reads as
/// zeros whatever reaches the disk, also after a crash that left the file's new size but not
/// the data written there. Fails where the filesystem has no `fallocate`.
pub fn allocate(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
        };
        // SAFETY: fallocate only reads its integer arguments; the fd is open for writing.
        if unsafe { libc::fallocate(file.as_raw_fd(), 0, offset, len) } == 0 {
            return Ok(());
        }
        Err(std::io::Error::last_os_error())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (file, offset, len);
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }
}

/// Writes `len` zero bytes into `file` from `offset` (extending its length), so that later
/// writes there overwrite blocks the file already has. On ext4 a write into space reserved by
/// `fallocate` converts an unwritten extent, and the fdatasync after it must write that
/// metadata as well as the data; over written blocks it writes the data only (an 7.7 KB batch:
/// 130 against 188 µs per write+fdatasync on this machine). The zeros reach the disk with the
/// next fdatasync of the file.
pub fn write_zeros(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
    let mut at = offset;
    let end = offset.saturating_add(len);
    while at < end {
        let n = usize::try_from(end - at).map_or(ZEROS.len(), |left| left.min(ZEROS.len()));
        write_at(file, &ZEROS[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// Writes all of `buf` at `offset` (one `pwrite` on unix).
pub(super) fn write_at(file: &File, buf: &[u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        file.write_all_at(buf, offset)
    }
    #[cfg(not(unix))]
    {
        use std::io::{Seek, SeekFrom};
        let mut file = file;
        file.seek(SeekFrom::Start(offset))?;
        file.write_all(buf)
    }
}
