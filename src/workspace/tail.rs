//! When the tailer looks for other processes' appends. On Linux it sleeps until the journal
//! directory changes (inotify). Its own appends change the journal too, and the events do not
//! say who wrote, so a change is first checked without any lock
//! ([`JournalPeek`](crate::store::end::JournalPeek): is anything past where this process last
//! read or wrote?); only when something is does the tailer take the store's lock to fold it.
//!
//! Looks are at least [`MIN_SPACING`] apart, so an agent appending record by record cannot
//! keep the tailer folding back to back. While this process appends more often than once a
//! millisecond, for a run of batches, and nobody else appends ([`Pace`]), they are
//! [`TAIL_INTERVAL`] apart, as the poll was: a steady writer's own appends would otherwise wake
//! the tailer at their rate. Another process's commit is thus noticed within a millisecond or
//! two (an operator's decision on the operation this process has just submitted), or within
//! 25 ms while this process commits more than a thousand batches a second.
//!
//! An idle server's tailer wakes once a second (the fallback below) where the fixed poll woke
//! it 40 times; that look reads under the lock whatever the peek says. The events only say
//! when to look: what is folded is read and checked from the journal as always. An agent
//! writing into `.gaffer/` gains a look every millisecond only by appending whole, chained
//! records; bytes that are no record get one every [`TAIL_INTERVAL`].
//!
//! While this process is such a steady writer, the watch stops asking for modifications: the
//! tailer looks every [`TAIL_INTERVAL`] whatever they say, and each of this process's appends
//! would otherwise queue an event in the kernel (about 4 µs of CPU per operation for one
//! client, two appends). Creations and moves in the journal directory are still watched.
//! When the run ends, modifications are watched again and the tailer looks once at once, for
//! what another process appended while they were not.
//!
//! [`TAIL_INTERVAL`]: super::TAIL_INTERVAL
//!
//! Until the journal directory exists (a workspace nobody has written yet) the watch is on
//! `.gaffer/` or the workspace root, for its creation; and [`FALLBACK`] bounds every sleep, so
//! a change the watch could not see (a watch refused by the inotify limits) is still found by a
//! periodic look. A journal directory replaced under the watch is watched afresh.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Longest the tailer sleeps without an event from the watch.
pub(super) const FALLBACK: Duration = Duration::from_secs(1);

/// The shortest spacing between two looks.
pub(super) const MIN_SPACING: Duration = Duration::from_millis(1);

/// This process appending more often than once per this, since the last look, is busy; busy
/// for [`STEADY_RUN`] batches on end, it is a steady writer, whose own appends would wake the
/// tailer at their rate. (A claim and its result, a burst of two or three, are not a run.)
const STEADY_GAP: Duration = Duration::from_millis(1);
const STEADY_RUN: u64 = 8;

/// How far apart the tailer's looks are, from how often this process itself appends.
pub(super) struct Pace {
    appends: u64,
    at: Instant,
    /// Batches appended since this process last went quiet (fewer than one per
    /// [`STEADY_GAP`] between two looks).
    run: u64,
    /// The last spacing chosen was the steady one.
    steady: bool,
}

impl Pace {
    pub(super) fn new(appends: u64) -> Pace {
        Pace {
            appends,
            at: Instant::now(),
            run: 0,
            steady: false,
        }
    }

    /// Whether this process is appending steadily and nobody else is (the last spacing chosen
    /// was the steady one).
    pub(super) fn steady(&self) -> bool {
        self.steady
    }

    /// The spacing before the next look, after one that found other processes' records or
    /// not, this process having appended `appends` batches in all: [`MIN_SPACING`], except
    /// `steady` while this process appends steadily and nobody else does.
    pub(super) fn next(&mut self, found_others: bool, appends: u64, steady: Duration) -> Duration {
        let now = Instant::now();
        let batches = appends.saturating_sub(self.appends);
        let elapsed = now.duration_since(self.at);
        self.appends = appends;
        self.at = now;
        let busy = u32::try_from(batches).map_or(true, |b| STEADY_GAP * b > elapsed);
        self.run = if busy {
            self.run.saturating_add(batches)
        } else {
            0
        };
        self.steady = !found_others && self.run >= STEADY_RUN;
        if self.steady { steady } else { MIN_SPACING }
    }
}

/// Tells the tailer to end, and wakes it from its wait at once (a dropped workspace's tailer
/// would otherwise hold the workspace's state until its next look, up to [`FALLBACK`]).
pub(super) struct TailStop {
    stopped: AtomicBool,
    #[cfg(target_os = "linux")]
    wake: Option<std::os::fd::OwnedFd>,
}

impl TailStop {
    pub(super) fn new() -> TailStop {
        TailStop {
            stopped: AtomicBool::new(false),
            #[cfg(target_os = "linux")]
            wake: eventfd(),
        }
    }

    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        #[cfg(target_os = "linux")]
        if let Some(fd) = &self.wake {
            use std::os::fd::AsRawFd;
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live buffer to an eventfd this struct owns.
            unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
    }

    pub(super) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }
}

/// What the tailer waits on.
pub(super) struct JournalWatch {
    gaffer_dir: PathBuf,
    #[cfg(target_os = "linux")]
    inotify: Option<std::os::fd::OwnedFd>,
    /// Whether the journal directory itself is watched.
    watching_journal: bool,
    /// Whether modifications in it are watched (not while this process appends steadily).
    appends_watched: bool,
    /// Modifications were just watched again: the next wait ends in a look without waiting
    /// for an event, for appends made while they were not watched.
    look_once: bool,
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
            appends_watched: true,
            look_once: false,
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
    /// can be watched, a plain poll: sleeps `interval`. Returns early once `stop` is told.
    /// True when a change woke it.
    ///
    /// While appends are not watched ([`Self::watch_appends`]), and once after they are
    /// watched again, every wait ends in a look (true) after `interval`.
    pub(super) fn wait(&mut self, interval: Duration, stop: &TailStop) -> bool {
        std::thread::sleep(interval);
        #[cfg(target_os = "linux")]
        if let Some(fd) = &self.inotify {
            let look_anyway = self.watching_journal
                && (!self.appends_watched || std::mem::take(&mut self.look_once));
            let changed = look_anyway || wait_readable(fd, stop.wake.as_ref(), FALLBACK);
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

    /// Watches modifications in the journal directory, or stops watching them (while this
    /// process appends steadily, its own appends would each queue an event). Creations and
    /// moves stay watched either way.
    pub(super) fn watch_appends(&mut self, on: bool) {
        if self.appends_watched == on {
            return;
        }
        self.appends_watched = on;
        self.look_once = on;
        #[cfg(target_os = "linux")]
        if self.watching_journal
            && let Some(fd) = &self.inotify
        {
            // The same directory watched again: the kernel replaces its watch's mask. Another
            // directory now at that path gets a watch of its own, which replaces the old one.
            match add_watch(fd, &self.gaffer_dir.join("journal"), self.journal_mask()) {
                Some(wd) => {
                    if let Some(old) = self.journal_wd.replace(wd).filter(|old| *old != wd) {
                        remove_watch(fd, old);
                    }
                }
                None => self.forget_journal_watch(),
            }
        }
    }

    /// What the journal directory's watch asks for.
    #[cfg(target_os = "linux")]
    fn journal_mask(&self) -> u32 {
        use libc::{IN_CREATE, IN_DELETE_SELF, IN_MODIFY, IN_MOVE_SELF, IN_MOVED_TO};
        let mask = IN_CREATE | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF;
        if self.appends_watched {
            mask | IN_MODIFY
        } else {
            mask
        }
    }

    /// The journal directory's watch is gone: armed again at the next wait.
    #[cfg(target_os = "linux")]
    fn forget_journal_watch(&mut self) {
        if let (Some(fd), Some(wd)) = (&self.inotify, self.journal_wd.take()) {
            remove_watch(fd, wd);
        }
        self.watching_journal = false;
    }

    /// Whether changes can be waited for (otherwise every wait is a plain sleep).
    pub(super) fn watches(&self) -> bool {
        #[cfg(target_os = "linux")]
        return self.inotify.is_some();
        #[cfg(not(target_os = "linux"))]
        false
    }

    /// A watch the kernel dropped or whose directory moved away (the journal directory
    /// replaced, a parent deleted): the journal is watched afresh at the next arm.
    #[cfg(target_os = "linux")]
    fn lost(&mut self, wd: libc::c_int) {
        if self.journal_wd == Some(wd) {
            self.forget_journal_watch();
        }
        self.creation_watches.retain(|w| *w != wd);
    }

    /// Watches the journal directory; while it does not exist, the nearest of `.gaffer/` and
    /// the workspace root that does, for its creation (dropped once the journal is watched).
    fn arm(&mut self) {
        #[cfg(target_os = "linux")]
        if let Some(fd) = &self.inotify {
            use libc::{IN_CREATE, IN_MOVED_TO};
            let journal = self.gaffer_dir.join("journal");
            if let Some(wd) = add_watch(fd, &journal, self.journal_mask()) {
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

/// Whether `fd` became readable within `timeout`; returns early (false) when `stop` does.
#[cfg(target_os = "linux")]
fn wait_readable(
    fd: &std::os::fd::OwnedFd,
    stop: Option<&std::os::fd::OwnedFd>,
    timeout: Duration,
) -> bool {
    use std::os::fd::AsRawFd;
    let entry = |fd: libc::c_int| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // A negative fd is ignored by poll.
    let mut pfds = [
        entry(fd.as_raw_fd()),
        entry(stop.map_or(-1, |s| s.as_raw_fd())),
    ];
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: two pollfds, valid for the call.
    let ready = unsafe { libc::poll(pfds.as_mut_ptr(), 2, ms) };
    ready > 0 && pfds[0].revents != 0
}

#[cfg(target_os = "linux")]
fn eventfd() -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: no pointers; a non-negative result is a descriptor this process now owns.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
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
        assert!(woke(&mut watch), ".gaffer created in the root");
        std::fs::create_dir(gaffer.join("journal")).expect("journal");
        assert!(woke(&mut watch), "journal created in .gaffer");
        assert!(watch.watching_journal);
        assert!(
            watch.creation_watches.is_empty(),
            "the parents' watches dropped"
        );
        let mut segment =
            std::fs::File::create(gaffer.join("journal/000001.log")).expect("segment");
        assert!(woke(&mut watch), "segment created");
        segment.write_all(b"appended").expect("append");
        assert!(woke(&mut watch), "append");
        std::fs::write(root.path().join("unrelated.txt"), b"x").expect("write");
        assert!(!woke(&mut watch), "the root is no longer watched");
        // The journal directory replaced (moved away, a new one made): the new one is watched.
        std::fs::rename(gaffer.join("journal"), gaffer.join("old")).expect("move away");
        assert!(woke(&mut watch), "the move");
        std::fs::create_dir(gaffer.join("journal")).expect("new journal");
        woke(&mut watch);
        assert!(
            watch.watching_journal,
            "the new journal directory is watched"
        );
        std::fs::write(gaffer.join("journal/000001.log"), b"x").expect("append to the new one");
        assert!(woke(&mut watch), "an append to the new journal directory");
    }

    /// While this process appends steadily its own appends queue no event (creations still
    /// do), and when it stops, the next wait ends in a look without an event: appends another
    /// process made in between are read then, not at the next periodic look.
    #[test]
    fn a_steady_writer_is_not_woken_by_its_own_appends_and_looks_once_when_it_stops() {
        let root = tempfile::tempdir().expect("tempdir");
        let journal = root.path().join(".gaffer/journal");
        std::fs::create_dir_all(&journal).expect("journal");
        let mut segment = std::fs::File::create(journal.join("000001.log")).expect("segment");
        let mut watch = JournalWatch::new(&root.path().join(".gaffer"));
        assert!(watch.watching_journal);
        let pending = |watch: &JournalWatch| {
            let fd = watch.inotify.as_ref().expect("inotify");
            wait_readable(fd, None, Duration::ZERO)
        };
        segment.write_all(b"appended").expect("append");
        assert!(pending(&watch), "an append queues an event");
        assert!(woke(&mut watch));
        watch.watch_appends(false);
        segment.write_all(b"appended while steady").expect("append");
        assert!(!pending(&watch), "no event for an append while steady");
        assert!(woke(&mut watch), "a steady wait ends in a look");
        std::fs::File::create(journal.join("000002.log")).expect("next segment");
        assert!(pending(&watch), "a new segment still queues one");
        assert!(woke(&mut watch));
        watch.watch_appends(true);
        assert!(!pending(&watch));
        assert!(woke(&mut watch), "one look once appends are watched again");
        segment.write_all(b"appended after").expect("append");
        assert!(pending(&watch), "appends queue events again");
        assert!(woke(&mut watch));
        assert!(watch.watching_journal && watch.creation_watches.is_empty());
    }

    /// Stopping and resuming watching appends where another directory now stands at the
    /// journal's path watches that one.
    #[test]
    fn resuming_watching_appends_follows_a_replaced_journal_directory() {
        let root = tempfile::tempdir().expect("tempdir");
        let gaffer = root.path().join(".gaffer");
        std::fs::create_dir_all(gaffer.join("journal")).expect("journal");
        let mut watch = JournalWatch::new(&gaffer);
        watch.watch_appends(false);
        std::fs::rename(gaffer.join("journal"), gaffer.join("old")).expect("move away");
        std::fs::create_dir(gaffer.join("journal")).expect("new journal");
        watch.watch_appends(true);
        let fd = watch.inotify.as_ref().expect("inotify");
        let new_wd = add_watch(fd, &gaffer.join("journal"), watch.journal_mask());
        assert!(new_wd.is_some());
        assert_eq!(
            watch.journal_wd, new_wd,
            "the watch kept is the new directory's"
        );
        assert!(woke(&mut watch));
        assert!(watch.watching_journal && watch.journal_wd == new_wd);
        std::fs::write(gaffer.join("journal/000001.log"), b"x").expect("append");
        let fd = watch.inotify.as_ref().expect("inotify");
        assert!(
            wait_readable(fd, None, Duration::ZERO),
            "the new directory is watched"
        );
    }

    /// Whether a change woke the watch.
    fn woke(watch: &mut JournalWatch) -> bool {
        watch.wait(Duration::ZERO, &TailStop::new())
    }

    /// A stop wakes a tailer waiting for changes at once, not at its next periodic look
    /// (without the wake, the wait below lasts the whole [`FALLBACK`]).
    #[test]
    fn a_stop_ends_the_wait_at_once() {
        let root = tempfile::tempdir().expect("tempdir");
        let mut watch = JournalWatch::new(&root.path().join(".gaffer"));
        let stop = std::sync::Arc::new(TailStop::new());
        let stopper = std::sync::Arc::clone(&stop);
        let started = std::time::Instant::now();
        let waiter = std::thread::spawn(move || {
            let changed = watch.wait(Duration::ZERO, &stop);
            (changed, started.elapsed())
        });
        std::thread::sleep(Duration::from_millis(50));
        stopper.stop();
        let (changed, waited) = waiter.join().expect("waiter");
        assert!(!changed, "nothing changed");
        assert!(
            waited < FALLBACK / 2,
            "the stop ended the wait ({waited:?})"
        );
    }

    /// Looks stay a millisecond apart unless this process appends more often than once a
    /// millisecond for a run of batches and nobody else appends.
    #[test]
    fn the_spacing_widens_only_for_a_steady_writer_of_its_own() {
        let steady = Duration::from_millis(25);
        let mut pace = Pace::new(0);
        std::thread::sleep(Duration::from_millis(20));
        let mut next = |others, appends| {
            let spacing = pace.next(others, appends, steady);
            assert_eq!(pace.steady(), spacing == steady);
            spacing
        };
        assert_eq!(next(false, 3), MIN_SPACING, "3 batches in 20 ms");
        assert_eq!(next(false, 6), MIN_SPACING, "a burst of 3: no run");
        assert_eq!(next(false, 106), steady, "100 at once");
        assert_eq!(next(false, 206), steady, "and on");
        assert_eq!(next(true, 306), MIN_SPACING, "others' records");
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(next(false, 307), MIN_SPACING, "quiet: one in 5 ms");
        assert_eq!(next(false, 310), MIN_SPACING, "a new burst of 3");
    }
}
