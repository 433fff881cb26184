//! Where a [`Store`](super::Store) last left the journal, readable without its lock. A tailer
//! woken by a change to the journal directory asks [`JournalPeek::nothing_new`] whether the
//! journal holds anything this process has not read or written: one 8-byte read and one
//! `stat`, no lock. When nothing does, the change was this process's own append and no look is
//! needed, so a look never waits behind this process's commits just to find its own records.
//!
//! The answer is only ever "nothing new" or "maybe": bytes past the published end (another
//! process's append, or this process's own append not yet published) send the tailer to read
//! under the lock as before, and the tailer's periodic look reads whatever this says.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::segment;

/// Bits of the packed end that hold the offset in its segment.
const OFFSET_BITS: u32 = 40;
/// The packed value for "not known" (no journal read yet, or a position too large to pack).
const UNKNOWN: u64 = u64::MAX;

/// The published end of what a Store has read or written, and how many batches it appended.
#[derive(Debug)]
pub struct JournalEnd {
    /// `segment << OFFSET_BITS | offset`, or [`UNKNOWN`].
    packed: AtomicU64,
    appends: AtomicU64,
}

impl Default for JournalEnd {
    fn default() -> JournalEnd {
        JournalEnd {
            packed: AtomicU64::new(UNKNOWN),
            appends: AtomicU64::new(0),
        }
    }
}

impl JournalEnd {
    /// The Store's cursor moved to byte `offset` of `segment` (offset 0: header not read, so
    /// the end is not known).
    pub(super) fn publish(&self, segment: u64, offset: u64) {
        let packed =
            if offset == 0 || offset >> OFFSET_BITS != 0 || segment >> (64 - OFFSET_BITS) != 0 {
                UNKNOWN
            } else {
                segment << OFFSET_BITS | offset
            };
        self.packed.store(packed, Ordering::Release);
    }

    /// The Store appended one more batch.
    pub(super) fn appended(&self) {
        self.appends.fetch_add(1, Ordering::Relaxed);
    }

    /// Batches the Store has appended since it was opened.
    pub fn appends(&self) -> u64 {
        self.appends.load(Ordering::Relaxed)
    }

    /// (segment, offset), when known.
    fn get(&self) -> Option<(u64, u64)> {
        let packed = self.packed.load(Ordering::Acquire);
        (packed != UNKNOWN).then_some((packed >> OFFSET_BITS, packed & ((1 << OFFSET_BITS) - 1)))
    }
}

/// A reader's handle on the journal for [`JournalPeek::nothing_new`] (it keeps the current
/// segment open between peeks, as long as its path still names that file).
#[derive(Debug)]
pub struct JournalPeek {
    journal: PathBuf,
    open: Option<Peeked>,
}

/// The segment last peeked at.
#[derive(Debug)]
struct Peeked {
    number: u64,
    path: PathBuf,
    file: File,
    /// The file's identity (device, inode): a segment replaced under its name (a copy moved
    /// over it) is opened afresh, not read forever unchanged through the old handle.
    id: (u64, u64),
    next: PathBuf,
}

impl JournalPeek {
    /// A peek at the journal directory `journal` (`.gaffer/journal`).
    pub fn new(journal: &Path) -> JournalPeek {
        JournalPeek {
            journal: journal.to_path_buf(),
            open: None,
        }
    }

    /// True when nothing follows `end` in the journal: only zeros (or the file's end) at its
    /// offset and no newer segment. False means "maybe": read under the lock.
    pub fn nothing_new(&mut self, end: &JournalEnd) -> bool {
        let Some((number, offset)) = end.get() else {
            return false;
        };
        let current = self.open.as_ref().is_some_and(|p| {
            p.number == number
                && std::fs::symlink_metadata(&p.path).is_ok_and(|m| identity(&m) == p.id)
        });
        if !current {
            self.open = self.open_segment(number);
        }
        self.open
            .as_ref()
            .is_some_and(|p| segment::nothing_after(&p.file, offset, &p.next))
    }

    fn open_segment(&self, number: u64) -> Option<Peeked> {
        let path = segment::segment_path(&self.journal, number);
        let file = segment::open_for_reading(&path).ok()?;
        let id = identity(&file.metadata().ok()?);
        Some(Peeked {
            number,
            path,
            file,
            id,
            next: segment::segment_path(&self.journal, number + 1),
        })
    }
}

#[cfg(unix)]
fn identity(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

#[cfg(not(unix))]
fn identity(m: &std::fs::Metadata) -> (u64, u64) {
    // No inode to compare: the length changes with every append, which is enough to reopen.
    (m.len(), 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Record, Snapshot, Store};

    fn record(seq: u64) -> Record {
        Record::new(seq, "test.note", serde_json::json!({"n": seq}))
    }

    /// Another Store's append (and its rotation into a new segment) is "maybe new" to a peek
    /// at this Store's end; this Store's own append is not.
    #[test]
    fn a_peek_tells_another_stores_append_from_this_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut mine = Store::open(dir.path()).expect("store");
        mine.preallocate(64 * 1024);
        let end = mine.chain_view();
        let mut peek = JournalPeek::new(&dir.path().join("journal"));
        assert!(!peek.nothing_new(end.end()), "no journal read yet");
        let mut txn = mine.begin().expect("begin");
        let seq = txn.next_seq();
        txn.append(&[record(seq)]).expect("append");
        drop(txn);
        assert!(peek.nothing_new(end.end()), "only this Store's append");
        assert_eq!(end.end().appends(), 1);

        let mut theirs = Store::open(dir.path()).expect("other store");
        let mut txn = theirs.begin().expect("begin");
        let seq = txn.next_seq();
        txn.append(&[record(seq)]).expect("append");
        drop(txn);
        assert!(!peek.nothing_new(end.end()), "another Store appended");
        assert_eq!(mine.poll().expect("poll").len(), 1);
        assert!(peek.nothing_new(end.end()), "read by this Store now");

        theirs.poll().expect("poll");
        let seq = theirs.begin().expect("begin").next_seq();
        let snapshot = Snapshot {
            seq: seq - 1,
            state: serde_json::json!({}),
        };
        theirs.write_snapshot(&snapshot).expect("snapshot rotates");
        let mut txn = theirs.begin().expect("begin");
        let seq = txn.next_seq();
        txn.append(&[record(seq)]).expect("append");
        drop(txn);
        assert!(!peek.nothing_new(end.end()), "a newer segment");
    }

    /// A segment replaced under its name (a copy moved over it) is read afresh: appends to the
    /// new file are "maybe new", not hidden behind the old handle.
    #[test]
    fn a_segment_replaced_under_its_name_is_peeked_afresh() {
        let dir = tempfile::tempdir().expect("tempdir");
        let append = |store: &mut Store| {
            let mut txn = store.begin().expect("begin");
            let seq = txn.next_seq();
            txn.append(&[record(seq)]).expect("append");
        };
        let mut theirs = Store::open(dir.path()).expect("store");
        append(&mut theirs);
        let mut mine = Store::open(dir.path()).expect("reader");
        let view = mine.chain_view();
        assert_eq!(mine.poll().expect("poll").len(), 1);
        let mut peek = JournalPeek::new(&dir.path().join("journal"));
        assert!(peek.nothing_new(view.end()), "read to the end");
        let segment = dir.path().join("journal/000001.log");
        let copy = dir.path().join("journal/copy");
        std::fs::copy(&segment, &copy).expect("copy");
        std::fs::rename(&copy, &segment).expect("moved over the segment");
        append(&mut Store::open(dir.path()).expect("a fresh writer"));
        assert!(!peek.nothing_new(view.end()), "the new file's append");
    }
}
