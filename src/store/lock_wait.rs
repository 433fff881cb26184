//! Who holds the store's lock, said when a writer waits long for it.
//!
//! Writers hold the lock for one batch, so a wait longer than a moment means some process
//! keeps it: a gaffer stuck in I/O, or anything else that can open `.gaffer/lock` (an agent
//! running outside gaffer's sandbox can). Nothing takes the lock from it; gaffer names it. A
//! writer that finds the lock taken registers its wait with one watchdog thread (started at
//! the first contended wait, parked while nobody waits), which logs the holder's pid and
//! program name after [`PATIENCE`] and again every [`REPEAT`]. Never its command line: that
//! may carry a secret. `gaffer doctor` reports the holder too ([`holder`]).

use std::fs::File;
use std::path::PathBuf;
use std::sync::{Condvar, Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

/// How long a writer waits before saying who holds the lock.
pub const PATIENCE: Duration = Duration::from_secs(2);
/// How often it says so again while it waits.
pub const REPEAT: Duration = Duration::from_secs(30);

/// A process holding a lock: its pid and program name (`/proc/PID/comm`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub program: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} ({})", self.pid, self.program)
    }
}

/// The process holding a `flock` on the file `file` is open on, as `/proc/locks` lists it
/// (Linux; None elsewhere, when nobody holds one, or when the holder cannot be told).
pub fn holder(file: &File) -> Option<Holder> {
    let (dev, ino) = identity(file)?;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    holder_in(&locks, dev, ino)
}

#[cfg(unix)]
fn identity(file: &File) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata().ok()?;
    Some((m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn identity(_: &File) -> Option<(u64, u64)> {
    None
}

/// The holder of the `FLOCK` on device `dev`, inode `ino` in `/proc/locks` text, e.g.
/// `1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234567 0 EOF` (device as hex major:minor).
fn holder_in(locks: &str, dev: u64, ino: u64) -> Option<Holder> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let want = format!("{major:02x}:{minor:02x}:{ino}");
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // Waiters are listed after a `->` and hold nothing.
        if fields.get(1) != Some(&"FLOCK") || fields.get(5) != Some(&want.as_str()) {
            return None;
        }
        let pid: u32 = fields.get(4)?.parse().ok()?;
        let program = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| crate::util::visible(c.trim_end()).into_owned())
            .unwrap_or_else(|_| "?".into());
        Some(Holder { pid, program })
    })
}

/// Blocks until this process holds `file`'s exclusive lock (at `path`, asked only when the
/// lock is taken), saying who holds it while the wait lasts longer than [`PATIENCE`].
pub fn lock_telling(file: &File, path: impl FnOnce() -> PathBuf) -> std::io::Result<()> {
    match file.try_lock() {
        Ok(()) => return Ok(()),
        Err(std::fs::TryLockError::WouldBlock) => {}
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    }
    let waiting = Watchdog::get().register(file, path());
    let locked = file.lock();
    Watchdog::get().done(waiting);
    locked
}

struct Wait {
    id: u64,
    since: Instant,
    told: Option<Instant>,
    path: PathBuf,
    /// A handle on the same file, to find its holder by.
    file: Option<File>,
}

#[derive(Default)]
struct Waits {
    next: u64,
    list: Vec<Wait>,
}

struct Watchdog {
    waits: Mutex<Waits>,
    wake: Condvar,
}

impl Watchdog {
    /// The one watchdog, its thread started on first use.
    fn get() -> &'static Watchdog {
        static ONE: OnceLock<Watchdog> = OnceLock::new();
        static STARTED: Once = Once::new();
        let dog = ONE.get_or_init(|| Watchdog {
            waits: Mutex::new(Waits::default()),
            wake: Condvar::new(),
        });
        STARTED.call_once(|| {
            let spawned = std::thread::Builder::new()
                .name("gaffer-lock-watch".into())
                .spawn(|| dog.watch());
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "no thread to say who holds the store's lock");
            }
        });
        dog
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waits> {
        self.waits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn register(&self, file: &File, path: PathBuf) -> u64 {
        let mut waits = self.lock();
        waits.next += 1;
        let id = waits.next;
        waits.list.push(Wait {
            id,
            since: Instant::now(),
            told: None,
            path,
            file: file.try_clone().ok(),
        });
        self.wake.notify_one();
        id
    }

    fn done(&self, id: u64) {
        let mut waits = self.lock();
        if let Some(w) = waits.list.iter().position(|w| w.id == id) {
            let w = waits.list.swap_remove(w);
            if w.told.is_some() {
                tracing::info!(path = %w.path.display(), waited_ms = w.since.elapsed().as_millis() as u64, "got the store's lock");
            }
        }
    }

    fn watch(&self) {
        let mut waits = self.lock();
        loop {
            if waits.list.is_empty() {
                waits = self
                    .wake
                    .wait(waits)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            let now = Instant::now();
            for w in &mut waits.list {
                let due = w.told.map_or(w.since + PATIENCE, |t| t + REPEAT);
                if now >= due {
                    w.told = Some(now);
                    let who = w.file.as_ref().and_then(holder).map_or_else(
                        || "a process gaffer cannot name".to_string(),
                        |h| h.to_string(),
                    );
                    tracing::warn!(
                        path = %w.path.display(),
                        waited_s = w.since.elapsed().as_secs(),
                        "waiting for the store's lock: {who} holds it; every write to this workspace waits until it lets go",
                    );
                }
            }
            waits = self
                .wake
                .wait_timeout(waits, Duration::from_millis(250))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_is_read_from_proc_locks_by_device_and_inode() {
        let text = "1: POSIX  ADVISORY  WRITE 11 fd:01:77 0 EOF\n\
                    2: FLOCK  ADVISORY  WRITE 4242 fd:01:77 0 EOF\n\
                    2: -> FLOCK  ADVISORY  WRITE 4343 fd:01:77 0 EOF\n\
                    3: FLOCK  ADVISORY  WRITE 99 fd:01:78 0 EOF\n";
        let dev = libc::makedev(0xfd, 0x01);
        assert_eq!(holder_in(text, dev, 77).map(|h| h.pid), Some(4242));
        assert_eq!(holder_in(text, dev, 78).map(|h| h.pid), Some(99));
        assert_eq!(holder_in(text, dev, 79), None);
    }

    #[test]
    fn a_lock_this_process_holds_through_another_handle_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("lock");
        let a = File::create(&path).expect("lock file");
        let b = File::open(&path).expect("second handle");
        assert_eq!(holder(&b), None);
        a.lock().expect("lock");
        let h = holder(&b).expect("a holder");
        assert_eq!(h.pid, std::process::id());
    }
}
