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
        // Quoted: a process names itself, and `x) or pid 1 (sh` must not read as two.
        write!(f, "pid {} ({:?})", self.pid, self.program)
    }
}

/// Who holds a `flock` on the file `file` is open on (Linux): the process `/proc/locks` names
/// if it still has the file open, else every other process that has it open (the one that
/// took the lock may have exited and left it to a child, and its pid may be another's by
/// now). Empty when nobody holds one or nobody can be named.
pub fn holders(file: &File) -> Vec<Holder> {
    let Some((dev, ino)) = identity(file) else {
        return Vec::new();
    };
    let Ok(locks) = std::fs::read_to_string("/proc/locks") else {
        return Vec::new();
    };
    let Some(taker) = taker_in(&locks, dev, ino) else {
        return Vec::new();
    };
    let has_it = |pid: u32| has_open(pid, dev, ino);
    if taker != 0 && has_it(taker) {
        return vec![holder(taker)];
    }
    let me = std::process::id();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && has_it(pid))
        .take(8)
        .map(holder)
        .collect()
}

/// [`holders`], as one phrase for a message.
pub fn named_holders(file: &File) -> String {
    let all = holders(file);
    if all.is_empty() {
        return "a process gaffer cannot name".into();
    }
    all.iter()
        .map(Holder::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn holder(pid: u32) -> Holder {
    let program = std::fs::read(format!("/proc/{pid}/comm")).map_or_else(
        |_| "?".into(),
        |c| String::from_utf8_lossy(&c).trim_end().to_string(),
    );
    Holder { pid, program }
}

/// Whether process `pid` has the file `dev`/`ino` open (one of its `/proc/PID/fd` links).
fn has_open(pid: u32, dev: u64, ino: u64) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten()
        .any(|fd| identity_at(&fd.path()) == Some((dev, ino)))
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

/// What the file at `path` is (following links: a `/proc/PID/fd` entry leads to its file).
#[cfg(unix)]
fn identity_at(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn identity_at(_: &std::path::Path) -> Option<(u64, u64)> {
    None
}

/// The pid that took the `FLOCK` on device `dev`, inode `ino` in `/proc/locks` text, e.g.
/// `1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234567 0 EOF` (device as hex major:minor; 0 when
/// it lies outside this pid namespace).
fn taker_in(locks: &str, dev: u64, ino: u64) -> Option<u32> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let want = format!("{major:02x}:{minor:02x}:{ino}");
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // Waiters are listed after a `->` and hold nothing.
        if fields.get(1) != Some(&"FLOCK") || fields.get(5) != Some(&want.as_str()) {
            return None;
        }
        fields.get(4)?.parse().ok()
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
            // Due waits are told with the list unlocked: reading /proc must not hold up
            // writers registering or done.
            let now = Instant::now();
            let mut due = Vec::new();
            for w in &mut waits.list {
                if now >= w.told.map_or(w.since + PATIENCE, |t| t + REPEAT) {
                    w.told = Some(now);
                    let file = w.file.as_ref().and_then(|f| f.try_clone().ok());
                    due.push((w.path.clone(), w.since.elapsed().as_secs(), file));
                }
            }
            drop(waits);
            for (path, waited_s, file) in due {
                let who = file
                    .as_ref()
                    .map_or_else(|| "a process gaffer cannot name".to_string(), named_holders);
                tracing::warn!(
                    path = %path.display(),
                    waited_s,
                    "waiting for the store's lock: {who} holds it; every write to this workspace waits until it lets go",
                );
            }
            waits = self.lock();
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
    fn the_taker_is_read_from_proc_locks_by_device_and_inode() {
        let text = "1: POSIX  ADVISORY  WRITE 11 fd:01:77 0 EOF\n\
                    2: FLOCK  ADVISORY  WRITE 4242 fd:01:77 0 EOF\n\
                    2: -> FLOCK  ADVISORY  WRITE 4343 fd:01:77 0 EOF\n\
                    3: FLOCK  ADVISORY  WRITE 99 fd:01:78 0 EOF\n";
        let dev = libc::makedev(0xfd, 0x01);
        assert_eq!(taker_in(text, dev, 77), Some(4242));
        assert_eq!(taker_in(text, dev, 78), Some(99));
        assert_eq!(taker_in(text, dev, 79), None);
    }

    #[test]
    fn a_lock_this_process_holds_through_another_handle_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("lock");
        let a = File::create(&path).expect("lock file");
        let b = File::open(&path).expect("second handle");
        assert_eq!(holders(&b), vec![]);
        a.lock().expect("lock");
        let named = holders(&b);
        assert_eq!(named.len(), 1, "{named:?}");
        assert_eq!(named[0].pid, std::process::id());
    }

    /// The process that took the lock exits and leaves it to its child: the child is named,
    /// never the dead pid (which may be another process's by now).
    #[test]
    fn a_lock_left_to_a_child_names_the_child() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("lock");
        File::create(&path).expect("lock file");
        let script = "import fcntl, os, sys, time\n\
                      f = open(sys.argv[1], 'r+')\n\
                      fcntl.flock(f, fcntl.LOCK_EX)\n\
                      if os.fork() == 0:\n    print(os.getpid(), flush=True)\n    time.sleep(30)\n\
                      os._exit(0)\n";
        let mut taker = std::process::Command::new("python3")
            .args(["-c", script])
            .arg(&path)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(taker.stdout.take().expect("stdout")),
            &mut line,
        )
        .expect("the child's pid");
        // The taker exits at once; its child keeps the lock.
        taker.wait().expect("the taker exits");
        let child: u32 = line.trim().parse().expect("a pid");
        let named = holders(&File::open(&path).expect("handle"));
        // SAFETY: kill only sends a signal to the child this test started.
        unsafe { libc::kill(child as i32, libc::SIGKILL) };
        assert_eq!(named.iter().map(|h| h.pid).collect::<Vec<_>>(), vec![child]);
        assert!(
            named[0]
                .to_string()
                .starts_with(&format!("pid {child} (\""))
        );
    }
}
