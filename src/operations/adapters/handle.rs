//! Workspace files by handle, never by path string: each directory on the way is opened with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` relative to the one before, and the final
//! name is opened, replaced or removed relative to that directory handle (a `cap_std::fs::Dir`),
//! so a directory swapped for a symlink after the check changes nothing. Only regular files
//! are read (FIFOs, devices, sockets and directories are refused without blocking), reads
//! stream with a size cap, and callers run all of this on blocking threads.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};
use sha2::{Digest, Sha256};

/// Largest file the workspace provider reads (to digest, compare or replace).
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;
const READ_CHUNK: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{0} is a symbolic link or leaves the workspace")]
    Link(String),
    #[error("{path} is a {kind}, not a regular file")]
    NotRegular { path: String, kind: &'static str },
    #[error("{path} is {size} bytes, more than the {limit}-byte limit")]
    TooLarge { path: String, size: u64, limit: u64 },
    #[error("{path}: {kind}")]
    Io {
        path: String,
        kind: std::io::ErrorKind,
    },
}

impl FileError {
    fn io(path: &str, e: &std::io::Error) -> FileError {
        match e.raw_os_error() {
            Some(libc::ELOOP | libc::EXDEV | libc::ENOTDIR) => FileError::Link(path.to_string()),
            _ => FileError::Io {
                path: path.to_string(),
                kind: e.kind(),
            },
        }
    }
}

/// The directory holding a workspace file, opened by handle, and the file's name in it.
pub struct Parent {
    pub dir: Dir,
    pub name: String,
    rel: String,
}

fn openat2_dir(dirfd: i32, name: &str) -> std::io::Result<OwnedFd> {
    crate::util::openat2(
        dirfd,
        Path::new(name),
        libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
    )
}

/// Opens (with `create`, making missing directories) the parent of `rel` under `root`.
pub fn parent(root: &Path, rel: &str, create: bool) -> Result<Parent, FileError> {
    use std::os::fd::AsRawFd;
    let fail = |e: &std::io::Error| FileError::io(rel, e);
    let mut names: Vec<String> = Vec::new();
    for c in Path::new(rel).components() {
        match c {
            Component::Normal(n) => names.push(String::from_utf8_lossy(n.as_bytes()).into()),
            _ => return Err(FileError::Link(rel.to_string())),
        }
    }
    let name = names
        .pop()
        .ok_or_else(|| FileError::Link(rel.to_string()))?;
    let mut fd: OwnedFd = std::fs::File::open(root).map_err(|e| fail(&e))?.into();
    for n in &names {
        fd = match openat2_dir(fd.as_raw_fd(), n) {
            Err(e) if create && e.kind() == std::io::ErrorKind::NotFound => {
                let c = CString::new(n.as_str()).map_err(|_| FileError::Link(rel.to_string()))?;
                // SAFETY: valid dirfd and NUL-terminated name.
                if unsafe { libc::mkdirat(fd.as_raw_fd(), c.as_ptr(), 0o777) } != 0 {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::AlreadyExists {
                        return Err(fail(&e));
                    }
                }
                openat2_dir(fd.as_raw_fd(), n).map_err(|e| fail(&e))?
            }
            other => other.map_err(|e| fail(&e))?,
        };
    }
    Ok(Parent {
        dir: Dir::from_std_file(std::fs::File::from(fd)),
        name,
        rel: rel.to_string(),
    })
}

fn kind_of(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "directory"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_block_device() || ft.is_char_device() {
        "device"
    } else if ft.is_symlink() {
        "symbolic link"
    } else {
        "special file"
    }
}

impl Parent {
    /// sha256 hex of the file, `None` when it does not exist. Streams with the size cap.
    pub fn digest(&self) -> Result<Option<String>, FileError> {
        let mut opts = OpenOptions::new();
        // O_NONBLOCK: opening a FIFO must not wait for a writer; O_NOFOLLOW: no final link.
        opts.read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
        let file = match self.dir.open_with(&self.name, &opts) {
            Ok(f) => f.into_std(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(FileError::io(&self.rel, &e)),
        };
        let meta = file.metadata().map_err(|e| FileError::io(&self.rel, &e))?;
        if !meta.file_type().is_file() {
            return Err(FileError::NotRegular {
                path: self.rel.clone(),
                kind: kind_of(&meta.file_type()),
            });
        }
        if meta.len() > MAX_FILE_BYTES {
            return Err(FileError::TooLarge {
                path: self.rel.clone(),
                size: meta.len(),
                limit: MAX_FILE_BYTES,
            });
        }
        let mut h = Sha256::new();
        let mut buf = vec![0u8; READ_CHUNK];
        let mut total = 0u64;
        let mut r = file.take(MAX_FILE_BYTES + 1);
        loop {
            let n = r.read(&mut buf).map_err(|e| FileError::io(&self.rel, &e))?;
            if n == 0 {
                break;
            }
            total += n as u64;
            h.update(&buf[..n]);
        }
        if total > MAX_FILE_BYTES {
            return Err(FileError::TooLarge {
                path: self.rel.clone(),
                size: total,
                limit: MAX_FILE_BYTES,
            });
        }
        Ok(Some(crate::util::hex(&h.finalize())))
    }

    /// Writes `content` to a fresh temporary name in this directory and renames it over the
    /// file, both relative to the directory handle.
    pub fn replace(&self, tmp: &str, content: &[u8]) -> Result<(), ReplaceError> {
        let mut opts = OpenOptions::new();
        opts.write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW);
        let written = self.dir.open_with(tmp, &opts).and_then(|f| {
            let mut f = f.into_std();
            f.write_all(content)?;
            f.sync_all()
        });
        if written.is_err() {
            let _ = self.dir.remove_file(tmp);
            return Err(ReplaceError::NotWritten);
        }
        if self.dir.rename(tmp, &self.dir, &self.name).is_err() {
            let _ = self.dir.remove_file(tmp);
            return Err(ReplaceError::NotRenamed);
        }
        self.sync().map_err(|_| ReplaceError::NotDurable)
    }

    pub fn remove(&self) -> std::io::Result<()> {
        self.dir.remove_file(&self.name)
    }

    /// fsync of the directory, making a rename or removal durable.
    pub fn sync(&self) -> std::io::Result<()> {
        self.dir.try_clone()?.into_std_file().sync_all()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplaceError {
    #[error("cannot write the new content")]
    NotWritten,
    #[error("cannot move the new content in place")]
    NotRenamed,
    #[error("cannot make the rename durable")]
    NotDurable,
}

/// sha256 of the regular file at workspace-relative `rel` (normalised, `.gaffer/` refused),
/// opened by handle; `None` when it does not exist. Blocking: call off the async threads.
pub fn digest_file(root: &Path, rel: &str) -> Result<Option<String>, String> {
    let rel = super::paths::normalize_relative("path", rel).map_err(|e| e.message)?;
    match parent(root, &rel, false) {
        Ok(p) => p.digest().map_err(|e| e.to_string()),
        Err(FileError::Io {
            kind: std::io::ErrorKind::NotFound,
            ..
        }) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}
