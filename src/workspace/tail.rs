//! When the tailer looks for other processes' appends. On Linux it sleeps until the journal
//! directory changes (inotify), then folds: another process's commit is noticed at once, or
//! within 25 ms when this process has just appended itself (its own appends change the
//! journal too, so a look that found only them keeps the next [`TAIL_INTERVAL`] away, as the
//! poll did). An idle server's tailer wakes once a second (the fallback below) where the
//! fixed poll woke it 40 times. The events only say when to look: what is folded is read and
//! checked from the journal as always, so an agent writing into `.gaffer/` gains nothing but
//! a look every interval.
//!
//! [`TAIL_INTERVAL`]: super::TAIL_INTERVAL
//!
//! Until the journal directory exists (a workspace nobody has written yet) the watch is on
//! `.gaffer/` or the workspace root, for its creation; and [`FALLBACK`] bounds every sleep, so
//! a change the watch could not see (a watch refused by the inotify limits) is still found by a
//! periodic look. A journal directory replaced under the watch is watched afresh.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Longest the tailer sleeps without an event from the watch.
pub(super) const FALLBACK: Duration = Duration::from_secs(1);

/// What the tailer waits on.
pub(super) struct JournalWatch {
    gaffer_dir: PathBuf,
    #[cfg(target_os = "linux")]
    inotify: Option<std::os::fd::OwnedFd>,
    /// Whether the journal directory itself is watched.
    watching_journal: bool,
    /// The journal directory's watch.
    #[cfg(target_os = "linux")]
    journal_wd: Option<libc::c_int>,
    /// Watches on the journal's parents, for its creation, until it exists.
    #[cfg(target_os = "linux")]
    creation_watches: Vec<libc::c_int>,
}

impl JournalWatch {
    pub(super) fn new(gaffer_dir: &Path) -> JournalWatch {
        let mut watch = JournalWatch {
            gaffer_dir: gaffer_dir.to_path_buf(),
            #[cfg(target_os = "linux")]
            inotify: inotify_init(),
            watching_journal: false,
            #[cfg(target_os = "linux")]
            journal_wd: None,
            #[cfg(target_os = "linux")]
            creation_watches: Vec::new(),
        };
        watch.arm();
        watch
    }

    /// Sleeps until the journal may have changed, or for at most `FALLBACK`; at least
    /// `interval` after the last return (events meanwhile are kept, not lost). Where nothing
    /// can be watched, a plain poll: sleeps `interval`.
    /// True when a change woke it.
    pub(super) fn wait(&mut self, interval: Duration) -> bool {
        std::thread::sleep(interval);
        #[cfg(target_os = "linux")]
        if let Some(fd) = &self.inotify {
            let changed = wait_readable(fd, FALLBACK);
            if changed {
                for wd in drain(fd) {
                    self.lost(wd);
                }
            }
            if !self.watching_journal {
                self.arm();
            }
            return changed;
        }
        false
    }

    /// A watch the kernel dropped or whose directory moved away (the journal directory
    /// replaced, a parent deleted): the journal is watched afresh at the next arm.
    #[cfg(target_os = "linux")]
    fn lost(&mut self, wd: libc::c_int) {
        if self.journal_wd == Some(wd) {
            if let Some(fd) = &self.inotify {
                remove_watch(fd, wd);
            }
            self.journal_wd = None;
            self.watching_journal = false;
        }
        self.creation_watches.retain(|w| *w != wd);
    }

    /// Watches the journal directory; while it does not exist, the nearest of `.gaffer/` and
    /// the workspace root that does, for its creation (dropped once the journal is watched).
    fn arm(&mut self) {
        #[cfg(target_os = "linux")]
        if let Some(fd) = &self.inotify {
            use libc::{IN_CREATE, IN_DELETE_SELF, IN_MODIFY, IN_MOVE_SELF, IN_MOVED_TO};
            let journal = self.gaffer_dir.join("journal");
            let mask = IN_MODIFY | IN_CREATE | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF;
            if let Some(wd) = add_watch(fd, &journal, mask) {
                self.watching_journal = true;
                self.journal_wd = Some(wd);
                for wd in self.creation_watches.drain(..) {
                    remove_watch(fd, wd);
                }
                return;
            }
            let parents = [Some(self.gaffer_dir.as_path()), self.gaffer_dir.parent()];
            if let Some(wd) = parents
                .into_iter()
                .flatten()
                .find_map(|dir| add_watch(fd, dir, IN_CREATE | IN_MOVED_TO))
                && !self.creation_watches.contains(&wd)
            {
                self.creation_watches.push(wd);
            }
        }
    }
}

#[cfg(target_os = "linux")]
fn inotify_init() -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: no pointers; a non-negative result is a descriptor this process now owns.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// The watch descriptor of `dir` (an existing one when `dir` was watched already).
#[cfg(target_os = "linux")]
fn add_watch(fd: &std::os::fd::OwnedFd, dir: &Path, mask: u32) -> Option<libc::c_int> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // A symlink the agent put in place is not followed: the watch only says when to look, but
    // it is on the workspace's own directories or on nothing.
    let mask = mask | libc::IN_ONLYDIR | libc::IN_DONT_FOLLOW;
    // SAFETY: `path` is a NUL-terminated string that outlives the call.
    let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), path.as_ptr(), mask) };
    (wd >= 0).then_some(wd)
}

#[cfg(target_os = "linux")]
fn remove_watch(fd: &std::os::fd::OwnedFd, wd: libc::c_int) {
    use std::os::fd::AsRawFd;
    // SAFETY: no pointers; a stale `wd` is refused with EINVAL.
    unsafe { libc::inotify_rm_watch(fd.as_raw_fd(), wd) };
}

/// Whether `fd` became readable within `timeout`.
#[cfg(target_os = "linux")]
fn wait_readable(fd: &std::os::fd::OwnedFd, timeout: Duration) -> bool {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one pollfd, valid for the call.
    unsafe { libc::poll(&mut pfd, 1, ms) > 0 }
}

/// Reads the queued events; returns the watches they say are gone (dropped by the kernel,
/// or their directory moved away). The other events only mattered by arriving.
#[cfg(target_os = "linux")]
fn drain(fd: &std::os::fd::OwnedFd) -> Vec<libc::c_int> {
    use std::os::fd::AsRawFd;
    const GONE: u32 = libc::IN_IGNORED | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF;
    let mut buf = [0u8; 4096];
    let mut gone = Vec::new();
    loop {
        // SAFETY: reads into a buffer of the length given; the descriptor is non-blocking.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        let Ok(n) = usize::try_from(n) else {
            return gone;
        };
        if n == 0 {
            return gone;
        }
        // Each event: wd (i32), mask, cookie, name length (u32 each), then the name.
        let mut at = 0;
        while let Some(head) = buf[..n].get(at..at + 16) {
            let word = |i: usize| [head[i], head[i + 1], head[i + 2], head[i + 3]];
            let wd = i32::from_ne_bytes(word(0));
            let mask = u32::from_ne_bytes(word(4));
            let name_len = u32::from_ne_bytes(word(12)) as usize;
            if mask & GONE != 0 && !gone.contains(&wd) {
                gone.push(wd);
            }
            at += 16 + name_len;
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::Write;

    /// Another process's append wakes the watch; so does the journal's creation in a
    /// workspace nobody had written, after which its appends are watched too.
    #[test]
    fn appends_and_the_journals_creation_wake_the_watch() {
        let root = tempfile::tempdir().expect("tempdir");
        let gaffer = root.path().join(".gaffer");
        let mut watch = JournalWatch::new(&gaffer);
        assert!(!watch.watching_journal);
        std::fs::create_dir(&gaffer).expect(".gaffer");
        assert!(watch.wait(Duration::ZERO), ".gaffer created in the root");
        std::fs::create_dir(gaffer.join("journal")).expect("journal");
        assert!(watch.wait(Duration::ZERO), "journal created in .gaffer");
        assert!(watch.watching_journal);
        assert!(
            watch.creation_watches.is_empty(),
            "the parents' watches dropped"
        );
        let mut segment =
            std::fs::File::create(gaffer.join("journal/000001.log")).expect("segment");
        assert!(watch.wait(Duration::ZERO), "segment created");
        segment.write_all(b"appended").expect("append");
        assert!(watch.wait(Duration::ZERO), "append");
        std::fs::write(root.path().join("unrelated.txt"), b"x").expect("write");
        assert!(!watch.wait(Duration::ZERO), "the root is no longer watched");
        // The journal directory replaced (moved away, a new one made): the new one is watched.
        std::fs::rename(gaffer.join("journal"), gaffer.join("old")).expect("move away");
        assert!(watch.wait(Duration::ZERO), "the move");
        std::fs::create_dir(gaffer.join("journal")).expect("new journal");
        watch.wait(Duration::ZERO);
        assert!(
            watch.watching_journal,
            "the new journal directory is watched"
        );
        std::fs::write(gaffer.join("journal/000001.log"), b"x").expect("append to the new one");
        assert!(
            watch.wait(Duration::ZERO),
            "an append to the new journal directory"
        );
    }
}
