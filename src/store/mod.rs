//! The per-workspace durable store under `<workspace>/.gaffer/`: an append-only journal in
//! segments, a snapshot of folded state, and content-addressed blobs.
//!
//! # On-disk layout (format version 2)
//!
//! ```text
//! .gaffer/
//!   .gitignore            "*": the store never belongs in version control
//!   lock                  empty; writers hold an exclusive File::lock on it
//!   snapshot.json         optional; see below
//!   journal/000001.log    segments, numbered from 1, six or more decimal digits
//!   journal/000002.log
//!   blobs/sha256/ab/<64 hex>
//! ```
//!
//! **Segment** = 16-byte header, then records back to back.
//! Header: the magic bytes `GAFFERJ\n`, the format version as u32 little-endian, and four
//! reserved zero bytes. A reader refuses a segment whose version it does not know.
//!
//! **Record frame** = length word (u32 LE) + crc32 (u32 LE, `crc32fast`) + body.
//! The body is compact JSON `{"seq":..,"prev":..,"time_ms":..,"kind":..,"payload":..}` (a
//! [`Record`] plus `prev`, `seq` always first), at most 64 MiB. `prev` is the hash of the
//! record before (64 hex digits; see [`chain`] for the hash definition and the genesis value),
//! so the journal is a hash chain: readers check every link and report the first break
//! ([`ChainStatus`]) without refusing the data. The length word holds the body length in its low 30
//! bits (values over 64 MiB are invalid) and two batch flags: bit 31 marks the first record of
//! an `append` batch, bit 30 its last (a batch of one has both). The crc covers the length
//! word's four bytes followed by the body, so a damaged flag is caught like a damaged body.
//! Sequence numbers start at 1 and are contiguous across all segments; readers check this.
//! Version 1 stores (no chain) are refused with [`StoreError::OutdatedVersion`], never mixed.
//!
//! **Batches are atomic.** Readers deliver a batch's records only once its last record has
//! been read, so a poller never sees half an append and a crash never leaves half of one.
//! Because a writer starts a batch only after the previous one is durable, only the last batch
//! of the last segment can be torn: damage followed by nothing, or only by later records of the
//! same batch (pages of an unacknowledged write can persist out of order), is a torn tail cut
//! back to the batch's start; damage followed by a record starting a new batch is corruption.
//!
//! **Snapshot** = `{"format":2,"seq":N,"head":<hash of record N>,"workspace_id":..,
//! "journal_from":K,"state_sha256":..,"state":..}`: state folded through seq N, whose later
//! records start in segment K and chain from `head`. It is replaced
//! atomically (temp file, fsync, rename, directory fsync). Writing one rotates the journal to a
//! fresh segment first, so a crash at any point leaves either the old snapshot (and every
//! record after it) or the new one. Older segments stay as the audit trail ([`Store::read_all`]).
//!
//! # Concurrency and crashes
//!
//! Many processes may share one store. Readers never lock: they only trust whole,
//! checksum-valid records, and treat an incomplete tail of the last segment as "not written
//! yet". A writer takes the lock ([`Store::begin`]), reads what others appended, cuts a torn
//! tail left by a crashed writer, appends one batch with one write and one `fdatasync`, and
//! only then acknowledges. Damage anywhere except the tail of the last segment is corruption:
//! it is reported with the segment and byte offset, never skipped.

mod blob;
pub mod chain;
mod codec;
mod durable;
pub mod end;
mod error;
pub mod lock_wait;
mod segment;
mod snapshot;
mod verify;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub(crate) use chain::declared_workspace_id;
pub use chain::{ChainBreak, ChainStatus, ChainView, Digest32, GENESIS, Head, STORE_CREATED};
pub use codec::{HEADER_LEN, MAX_RECORD_BODY};
pub use durable::{allocate, write_zeros};
pub use error::StoreError;
pub use snapshot::SnapshotMark;
pub use verify::{
    ChainReport, Problem, SegmentReport, SignatureReport, SnapshotReport, VerifyReport, verify,
};

use chain::ChainLog;
use segment::SegmentEnd;

/// Version of the on-disk format written by this build; anything else is refused.
/// Version 2 added the hash chain (`prev` in every body, the head in the snapshot).
pub const FORMAT_VERSION: u32 = 2;

/// One journal entry. The payload is kept as the JSON text it was written or read as: folding
/// decodes it straight into each domain's type and the encoder copies it, with no
/// `serde_json::Value` tree built in between.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub seq: u64,
    pub time_ms: u64,
    pub kind: String,
    pub payload: Box<serde_json::value::RawValue>,
}

impl PartialEq for Record {
    fn eq(&self, other: &Record) -> bool {
        self.seq == other.seq
            && self.time_ms == other.time_ms
            && self.kind == other.kind
            && self.payload.get() == other.payload.get()
    }
}

impl Record {
    /// A record stamped with the current wall-clock time.
    pub fn new(seq: u64, kind: impl Into<String>, payload: serde_json::Value) -> Record {
        let payload =
            serde_json::value::to_raw_value(&payload).unwrap_or_else(|_| raw_json("null"));
        Record {
            seq,
            time_ms: crate::util::now_ms(),
            kind: kind.into(),
            payload,
        }
    }

    /// The payload decoded into `T`.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.payload.get())
    }

    /// The payload as a `serde_json::Value` (for tools and tests; folding uses [`Self::decode`]).
    pub fn payload_value(&self) -> serde_json::Value {
        self.decode().unwrap_or(serde_json::Value::Null)
    }
}

/// A record payload that decodes into a domain type: the journal's JSON text as folded, or a
/// `serde_json::Value` (tests and tools).
pub trait RecordPayload {
    fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error>;
}

impl RecordPayload for serde_json::Value {
    fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        T::deserialize(self)
    }
}

impl RecordPayload for serde_json::value::RawValue {
    fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.get())
    }
}

/// `value` as a record payload (its compact JSON text).
pub fn raw_payload(value: serde_json::Value) -> Box<serde_json::value::RawValue> {
    serde_json::value::to_raw_value(&value)
        .unwrap_or_else(|_| serde_json::value::RawValue::NULL.to_owned())
}

/// `text` (valid JSON) as a raw value.
fn raw_json(text: &str) -> Box<serde_json::value::RawValue> {
    serde_json::value::RawValue::from_string(text.to_string())
        .unwrap_or_else(|_| serde_json::value::RawValue::NULL.to_owned())
}

/// A record as read from the journal, with its chain link.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub record: Record,
    /// The hash of the record before, as written in this record's body.
    pub prev: Digest32,
    /// This record's hash ([`chain::record_hash`] of its body bytes).
    pub hash: Digest32,
}

/// A `store.created` record (seq 1) declaring a fresh random workspace id.
pub fn store_created_record() -> Result<Record, StoreError> {
    let id = crate::util::new_id("ws_").map_err(|source| StoreError::Io {
        path: "/dev/urandom".into(),
        source,
    })?;
    let now = crate::util::now_ms();
    let payload = serde_json::json!({ "workspace_id": id, "created_at_ms": now });
    Ok(Record::new(1, STORE_CREATED, payload))
}

/// Creates the store directory `dir` with its `.gitignore` if missing.
fn ensure_root(dir: &Path) -> Result<(), StoreError> {
    durable::ensure_dir(dir)?;
    let gitignore = dir.join(".gitignore");
    if !gitignore.exists() {
        durable::write_atomic(&gitignore, b"*\n")?;
    }
    Ok(())
}

/// [`Store::put_blob`] without a `Store`: a blob needs no lock (its name is its content), so a
/// caller need not wait for whoever holds the store for a commit.
pub fn put_blob_in(dir: &Path, bytes: &[u8]) -> Result<String, StoreError> {
    ensure_root(dir)?;
    blob::put(dir, bytes)
}

/// Durably replaces `target` with `bytes` (temp file, fsync, rename, directory fsync).
pub fn write_file_atomic(target: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    durable::write_atomic(target, bytes)
}

/// [`Store::get_blob`] without a `Store`, for the same reason.
pub fn get_blob_in(dir: &Path, hex: &str) -> Result<Vec<u8>, StoreError> {
    blob::get(dir, hex)
}

/// State folded through `seq`, as encoded JSON text: written and read without building a
/// `serde_json::Value` of a possibly large state. A loaded snapshot keeps the file's bytes
/// and points at the state inside them, so the text is held once while it is decoded.
#[derive(Clone, Debug)]
pub struct RawSnapshot {
    pub seq: u64,
    text: Vec<u8>,
    state: std::ops::Range<usize>,
}

impl RawSnapshot {
    /// Encodes `state` (any serializable type) as a snapshot at `seq`.
    pub fn of<T: Serialize>(seq: u64, state: &T) -> Result<RawSnapshot, StoreError> {
        let text =
            serde_json::to_vec(state).map_err(|source| StoreError::Encode { seq, source })?;
        Ok(RawSnapshot {
            seq,
            state: 0..text.len(),
            text,
        })
    }

    /// The state's text at `range` of `text` (a snapshot file as read).
    fn within(seq: u64, text: Vec<u8>, state: std::ops::Range<usize>) -> RawSnapshot {
        RawSnapshot { seq, text, state }
    }

    pub fn from_value(snap: &Snapshot) -> Result<RawSnapshot, StoreError> {
        Self::of(snap.seq, &snap.state)
    }

    /// The state's JSON text.
    pub fn state_json(&self) -> &[u8] {
        self.text.get(self.state.clone()).unwrap_or_default()
    }

    /// Decodes the state into `T` directly from the text.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(self.state_json())
    }
}

/// State folded through `seq`, as a JSON value (convenient for small states and tests).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Snapshot {
    pub seq: u64,
    pub state: serde_json::Value,
}

/// A position in the journal: byte `offset` of segment `segment`. Offset 0 means the segment's
/// header has not been read yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cursor {
    segment: u64,
    offset: u64,
}

/// What a journal read has delivered so far; kept up to date even when a read fails midway.
#[derive(Clone, Copy, Debug)]
struct Progress {
    cursor: Cursor,
    last_seq: u64,
    /// Hash of the record at `last_seq` (the snapshot's head, or genesis at 0).
    head: Digest32,
}

/// An incomplete or damaged tail at the end of the last segment.
#[derive(Debug)]
struct TornTail {
    path: PathBuf,
    offset: u64,
    reason: String,
}

/// The largest append buffer a [`Store`] keeps for its next append.
const KEEP_ENCODED_MAX: usize = 256 * 1024;

/// The store of one workspace, as seen by one process. Not meant to be shared between threads
/// without a lock (wrap it in a `Mutex`); open one per process per workspace.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    journal: PathBuf,
    snapshot: Option<RawSnapshot>,
    /// Seq of the snapshot the journal continues from (0 without one); kept when the snapshot's
    /// text is handed over ([`Store::take_raw_snapshot`]).
    snapshot_seq: u64,
    /// First segment holding records after the snapshot (1 without a snapshot).
    snapshot_from: u64,
    /// End of what this Store has read or written.
    cursor: Cursor,
    last_seq: u64,
    /// Hash of the record at `last_seq`: the `prev` of the next append.
    head: Digest32,
    /// The chain head the snapshot recorded (genesis without one).
    snapshot_head: Digest32,
    /// The mark of the snapshot this Store opened with (or last wrote).
    snapshot_mark: Option<snapshot::SnapshotMark>,
    /// Shared with readers that must not take the store's lock (the workspace's status).
    view: ChainView,
    /// Records read past by a write transaction's catch-up but not yet handed to the caller.
    undelivered: Vec<Record>,
    /// Write handle of the segment `cursor` is in, kept across transactions.
    writer: Option<SegmentWriter>,
    /// Bytes of space a writer allocates ahead of its appends (0: none); see
    /// [`Store::preallocate`].
    preallocate: u64,
    /// This Store has read its journal to the end under the lock (and cut any torn tail) since
    /// it was opened; until then [`Store::nothing_new`] is not trusted there.
    tail_checked: bool,
    warned_torn: Option<(PathBuf, u64)>,
    /// Handle of `<dir>/lock`, opened by the first `begin` (which also creates the layout) and
    /// kept so later transactions cost one `flock` each.
    lock_file: Option<File>,
    /// The encoding buffer of the last append, kept for the next (a batch grows it once).
    encoded: Scratch,
}

/// A reusable byte buffer; its Debug shows the size, not the bytes.
#[derive(Default)]
struct Scratch(Vec<u8>);

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scratch({} bytes reserved)", self.0.capacity())
    }
}

impl Store {
    /// Opens the store in `dir` (`<workspace>/.gaffer`). A missing directory is an empty store;
    /// nothing is created or repaired here, since another process may be mid-append.
    /// Refuses segments or a snapshot of an unknown format version.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Store, StoreError> {
        Self::open_with_view(dir, ChainView::default())
    }

    /// [`Store::open`] publishing the chain into `view` (reset here), so a holder of the view
    /// keeps it across a reopen.
    pub fn open_with_view(dir: impl Into<PathBuf>, view: ChainView) -> Result<Store, StoreError> {
        let dir = dir.into();
        let loaded = snapshot::load(&dir)?;
        Self::open_from(dir, view, loaded)
    }

    /// [`Store::open_with_view`] ignoring the snapshot: everything is replayed from the
    /// journal (for a snapshot that is damaged or does not decode; it is only a cache).
    pub fn open_without_snapshot(
        dir: impl Into<PathBuf>,
        view: ChainView,
    ) -> Result<Store, StoreError> {
        Self::open_from(dir.into(), view, None)
    }

    fn open_from(
        dir: PathBuf,
        view: ChainView,
        loaded: Option<snapshot::Loaded>,
    ) -> Result<Store, StoreError> {
        let journal = dir.join("journal");
        let segments = segment::list_segments(&journal)?;
        for (i, n) in segments.iter().enumerate() {
            let is_last = i + 1 == segments.len();
            segment::check_segment_header(&segment::segment_path(&journal, *n), is_last)?;
        }
        let (snapshot, snapshot_from, snapshot_head, workspace_id, snapshot_mark) = match loaded {
            Some(l) => (
                Some(l.snapshot),
                l.journal_from,
                l.head,
                l.workspace_id,
                Some(l.mark),
            ),
            None => (None, 1, GENESIS, None, None),
        };
        let last_seq = snapshot.as_ref().map_or(0, |s| s.seq);
        let snapshot_seq = last_seq;
        view.reset(last_seq, snapshot_head, workspace_id);
        Ok(Store {
            dir,
            journal,
            snapshot,
            snapshot_seq,
            snapshot_from,
            cursor: Cursor {
                segment: snapshot_from,
                offset: 0,
            },
            last_seq,
            head: snapshot_head,
            snapshot_head,
            snapshot_mark,
            view,
            undelivered: Vec::new(),
            writer: None,
            preallocate: 0,
            tail_checked: false,
            warned_torn: None,
            lock_file: None,
            encoded: Scratch::default(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The snapshot found at open (or written since by this Store), already verified.
    pub fn snapshot(&self) -> Result<Option<Snapshot>, StoreError> {
        self.snapshot
            .as_ref()
            .map(|raw| {
                let state = raw.decode().map_err(|e| StoreError::SnapshotCorrupt {
                    path: self.dir.join(snapshot::FILE_NAME),
                    reason: format!("state is not JSON: {e}"),
                })?;
                Ok(Snapshot {
                    seq: raw.seq,
                    state,
                })
            })
            .transpose()
    }

    /// The snapshot as encoded text, for readers that decode it into their own type.
    pub fn raw_snapshot(&self) -> Option<&RawSnapshot> {
        self.snapshot.as_ref()
    }

    /// Hands the snapshot's text over to a reader that decodes it into its own state, so it is
    /// not kept twice (text here, decoded there). Replays still start after its seq.
    pub fn take_raw_snapshot(&mut self) -> Option<RawSnapshot> {
        self.snapshot.take()
    }

    /// The mark of the snapshot the state starts from (none: replayed from the first record).
    pub fn snapshot_mark(&self) -> Option<&snapshot::SnapshotMark> {
        self.snapshot_mark.as_ref()
    }

    /// Seq of the last record this Store has read or written (the snapshot's seq before that).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Seq and hash of the last record this Store has read or written.
    pub fn head(&self) -> Head {
        Head {
            seq: self.last_seq,
            hash: self.head.to_hex(),
        }
    }

    /// The head and the first broken link read since the last full replay.
    pub fn chain_status(&self) -> ChainStatus {
        self.view.status()
    }

    /// The id declared by the journal's `store.created` record (or carried by the snapshot).
    pub fn workspace_id(&self) -> Option<String> {
        self.view.workspace_id()
    }

    /// The hash of record `seq`, if it is one of the last [`chain::RECENT_HASHES`] read.
    pub fn hash_at(&self, seq: u64) -> Option<String> {
        self.view.hash_at(seq)
    }

    /// A handle on the chain state that can be read without this Store.
    pub fn chain_view(&self) -> ChainView {
        self.view.clone()
    }

    /// Moves the cursor to where `progress` got and publishes what `log` learned.
    fn advance(&mut self, progress: Progress, log: ChainLog) {
        self.set_cursor(progress.cursor);
        self.last_seq = progress.last_seq;
        self.head = progress.head;
        self.view.publish(self.last_seq, self.head, log);
    }

    /// Calls `f` for every whole record with seq > `after_seq`, in order, and moves the read
    /// cursor to the end of what was read. With `after_seq` at or past the snapshot's seq only
    /// the segments after the snapshot are read; below it, the whole journal is. A torn tail of
    /// the last segment is ignored (warned once); damage before it is an error. Returns the
    /// journal's last seq: that of the last record read, or the snapshot's when none follows.
    pub fn replay<E: From<StoreError>>(
        &mut self,
        after_seq: u64,
        mut f: impl FnMut(Record) -> Result<(), E>,
    ) -> Result<u64, E> {
        let snap_seq = self.snapshot_seq;
        let mut progress = if after_seq >= snap_seq {
            Progress {
                cursor: Cursor {
                    segment: self.snapshot_from,
                    offset: 0,
                },
                last_seq: snap_seq,
                head: self.snapshot_head,
            }
        } else {
            Progress {
                cursor: Cursor {
                    segment: 1,
                    offset: 0,
                },
                last_seq: 0,
                head: GENESIS,
            }
        };
        self.undelivered.clear();
        let id = self.view.workspace_id();
        self.view.reset(progress.last_seq, progress.head, id);
        let mut log = ChainLog::default();
        let result = read_journal(&self.journal, &mut progress, &mut log, |entry| {
            if entry.record.seq > after_seq {
                f(entry.record)
            } else {
                Ok(())
            }
        });
        self.advance(progress, log);
        if let Some(torn) = result? {
            self.warn_torn(&torn);
        }
        Ok(self.last_seq)
    }

    /// Whole records appended (by anyone) after the read cursor, without taking the lock.
    /// An incomplete tail is "not written yet" and left for a later poll. Follows rotation into
    /// newer segments.
    pub fn poll(&mut self) -> Result<Vec<Record>, StoreError> {
        if self.undelivered.is_empty() && self.nothing_new() {
            return Ok(Vec::new());
        }
        let mut out = std::mem::take(&mut self.undelivered);
        let mut progress = self.progress();
        let mut log = ChainLog::default();
        let result = read_journal(&self.journal, &mut progress, &mut log, |entry| {
            out.push(entry.record);
            Ok::<(), StoreError>(())
        });
        self.advance(progress, log);
        match result {
            Ok(_) => Ok(out),
            Err(e) => {
                // Keep what was read so the next poll still hands it over.
                self.undelivered = out;
                self.publish_end();
                Err(e)
            }
        }
    }

    /// Takes the writer lock (creating the store directory with its `.gitignore` and `lock`
    /// on first use; `journal/` only appears with the first append), catches up with what
    /// others appended (see [`WriteTxn::take_new`]) and cuts a torn tail left by a crashed
    /// writer. Blocks while another writer holds the lock. The lock file handle is kept open
    /// for later transactions, so do not delete the store directory under a running process.
    pub fn begin(&mut self) -> Result<WriteTxn<'_>, StoreError> {
        let lock_path = self.lock_path();
        match self.begin_locking(true)? {
            Some(txn) => Ok(txn),
            // A blocking lock either succeeds or fails; it never reports "busy".
            None => Err(StoreError::Io {
                path: lock_path,
                source: std::io::Error::other("blocking lock returned without the lock"),
            }),
        }
    }

    /// Like [`begin`](Self::begin) but returns `Ok(None)` at once when another writer holds
    /// the lock, for callers that must not block (a health check, a UI thread).
    pub fn try_begin(&mut self) -> Result<Option<WriteTxn<'_>>, StoreError> {
        self.begin_locking(false)
    }

    /// The lock file's path: built when it is opened or an error names it, not per commit.
    fn lock_path(&self) -> PathBuf {
        self.dir.join("lock")
    }

    fn begin_locking(&mut self, block: bool) -> Result<Option<WriteTxn<'_>>, StoreError> {
        if self.lock_file.is_none() {
            let lock_path = self.lock_path();
            self.ensure_root()?;
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                // Not through a symlink the agent put there: the lock is the store's own file.
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&lock_path)
                .map_err(StoreError::io(&lock_path))?;
            self.lock_file = Some(file);
        }
        let Some(lock) = self.lock_file.as_ref() else {
            return Err(StoreError::Io {
                path: self.lock_path(),
                source: std::io::Error::other("lock file handle unavailable"),
            });
        };
        if block {
            lock_wait::lock_telling(lock, || self.lock_path()).map_err(|source| {
                StoreError::Io {
                    path: self.lock_path(),
                    source,
                }
            })?;
        } else {
            match lock.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
                Err(std::fs::TryLockError::Error(source)) => {
                    return Err(StoreError::Io {
                        path: self.lock_path(),
                        source,
                    });
                }
            }
        }
        if let Err(e) = self.catch_up_locked() {
            if let Some(lock) = self.lock_file.as_ref() {
                let _ = lock.unlock();
            }
            return Err(e);
        }
        Ok(Some(WriteTxn {
            store: self,
            poisoned: false,
        }))
    }

    /// Under the lock: reads what others appended, cuts a torn tail, makes sure a segment
    /// exists and the write handle points at the segment the cursor is in.
    ///
    /// The first time, it reads to the end whatever [`Store::nothing_new`] says: after a machine
    /// crash a torn batch in allocated space can start with a page that never reached the disk
    /// (zeros at the cursor) while its later pages did, and only a read to the end finds and
    /// cuts it. Later torn batches start where a live process wrote, so their first bytes are
    /// there to see: a process killed mid-write leaves a prefix of its write (the page cache
    /// keeps it), and a machine crash restarts every process.
    fn catch_up_locked(&mut self) -> Result<(), StoreError> {
        if !self.tail_checked || !self.nothing_new() {
            let mut fresh = Vec::new();
            let mut progress = self.progress();
            let mut log = ChainLog::default();
            let result = read_journal(&self.journal, &mut progress, &mut log, |entry| {
                fresh.push(entry.record);
                Ok::<(), StoreError>(())
            });
            self.advance(progress, log);
            self.undelivered.append(&mut fresh);
            self.publish_end();
            match result? {
                Some(torn) => self.cut_torn_tail(&torn)?,
                // A scan ends early where bytes filled in while it read (a reader without the
                // lock overtaking a writer). Nobody appends while this lock is held, so here
                // that means something writes the journal without it: refused, never
                // appended over.
                None if self.cursor.offset > 0 && !self.nothing_new() => {
                    return Err(StoreError::Corrupt {
                        segment: segment::segment_path(&self.journal, self.cursor.segment),
                        offset: self.cursor.offset,
                        reason: "the journal changed while read under the store lock".into(),
                    });
                }
                None => {}
            }
        }
        self.tail_checked = true;
        Ok(())
    }

    fn progress(&self) -> Progress {
        Progress {
            cursor: self.cursor,
            last_seq: self.last_seq,
            head: self.head,
        }
    }

    /// Under the lock, before writing: the write handle of the cursor's segment, creating
    /// `journal/` and the segment if the journal has none yet (a transaction that appends
    /// nothing leaves no journal behind).
    fn writer_locked(&mut self) -> Result<(u64, &mut SegmentWriter), StoreError> {
        if self.cursor.offset == 0 {
            durable::ensure_dir(&self.journal)?;
            segment::create_segment(&self.journal, self.cursor.segment)?;
            self.set_cursor(Cursor {
                offset: HEADER_LEN as u64,
                ..self.cursor
            });
            self.writer = None;
        }
        let current = self.cursor.segment;
        if !matches!(&self.writer, Some(w) if w.segment == current) {
            let path = segment::segment_path(&self.journal, current);
            self.writer = Some(SegmentWriter::open(current, &path)?);
        }
        match &mut self.writer {
            Some(w) => Ok((self.cursor.offset, w)),
            None => Err(StoreError::SegmentMissing {
                path: segment::segment_path(&self.journal, current),
            }),
        }
    }

    /// Lets this Store's appends write `bytes` of zeros into the segment ahead of them (0 turns
    /// it off). An append that grows the file makes its fdatasync write the inode too, and one
    /// into `fallocate`d space makes it write the extent it converts; one over zeros already
    /// written writes only the data (measured by `cargo bench --bench operations`). Readers
    /// take the zeros after the last record for space never written; rotation trims them from
    /// the segment it leaves.
    pub fn preallocate(&mut self, bytes: u64) {
        self.preallocate = bytes;
    }

    /// Cheap check that nothing follows the cursor: its segment ends there or only zeros
    /// (space allocated ahead) follow — one read of 8 bytes, on the write handle when this
    /// Store holds one — and no newer segment exists (segments are created in order, so one
    /// `stat` of the next suffices). False means "maybe": the caller reads.
    fn nothing_new(&self) -> bool {
        if self.cursor.offset == 0 {
            return false;
        }
        match &self.writer {
            Some(w) if w.segment == self.cursor.segment => {
                segment::nothing_after(&w.file, self.cursor.offset, &w.next)
            }
            // Opened as the tailer's peek opens it: a symlink in the segment's place is never
            // "nothing new", so the caller reads under the lock.
            _ => segment::open_for_reading(&segment::segment_path(
                &self.journal,
                self.cursor.segment,
            ))
            .is_ok_and(|f| {
                let next = segment::segment_path(&self.journal, self.cursor.segment + 1);
                segment::nothing_after(&f, self.cursor.offset, &next)
            }),
        }
    }

    /// Moves the cursor, and publishes where it is for readers without the lock
    /// ([`end::JournalPeek`]).
    fn set_cursor(&mut self, cursor: Cursor) {
        self.cursor = cursor;
        self.publish_end();
    }

    /// Publishes the cursor, or "not known" while records read past it are still to be handed
    /// over: a peek may call the journal up to the end read only when all of it was.
    fn publish_end(&self) {
        let end = self.view.end();
        if self.undelivered.is_empty() {
            end.publish(self.cursor.segment, self.cursor.offset);
        } else {
            end.publish(0, 0);
        }
    }

    /// Writes `snap` (whose seq must be the journal's last) and rotates the journal. Takes the
    /// lock for the duration; see [`WriteTxn::write_snapshot`].
    pub fn write_snapshot(&mut self, snap: &Snapshot) -> Result<(), StoreError> {
        self.begin()?.write_snapshot(snap)
    }

    /// [`Store::write_snapshot`] for an already encoded state.
    pub fn write_raw_snapshot(&mut self, snap: RawSnapshot) -> Result<(), StoreError> {
        self.begin()?.write_raw_snapshot(snap)
    }

    /// Every record of every segment, including those a snapshot covers, with seq >
    /// `after_seq`: the audit trail. Does not move the read cursor.
    pub fn read_all<E: From<StoreError>>(
        &self,
        after_seq: u64,
        mut f: impl FnMut(Record) -> Result<(), E>,
    ) -> Result<(), E> {
        self.read_all_entries(after_seq, |entry| f(entry.record))
    }

    /// [`Store::read_all`] with each record's chain link (`prev` and hash).
    pub fn read_all_entries<E: From<StoreError>>(
        &self,
        after_seq: u64,
        mut f: impl FnMut(Entry) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut progress = Progress {
            cursor: Cursor {
                segment: 1,
                offset: 0,
            },
            last_seq: 0,
            head: GENESIS,
        };
        read_journal(
            &self.journal,
            &mut progress,
            &mut ChainLog::default(),
            |entry| {
                if entry.record.seq > after_seq {
                    f(entry)
                } else {
                    Ok(())
                }
            },
        )?;
        Ok(())
    }

    /// Stores `bytes` at `<dir>/blobs/sha256/ab/<hex>` (temp file, fsync, rename) and returns
    /// the hex sha256. Idempotent; needs no lock since the name is the content.
    pub fn put_blob(&self, bytes: &[u8]) -> Result<String, StoreError> {
        put_blob_in(&self.dir, bytes)
    }

    /// Reads a blob, verifying its hash. Rejects names that are not 64 lowercase hex digits.
    pub fn get_blob(&self, hex: &str) -> Result<Vec<u8>, StoreError> {
        blob::get(&self.dir, hex)
    }

    /// Creates the store directory with its `.gitignore` if missing.
    fn ensure_root(&self) -> Result<(), StoreError> {
        ensure_root(&self.dir)
    }

    /// Under the lock: truncates the last segment back to its last whole record.
    fn cut_torn_tail(&mut self, torn: &TornTail) -> Result<(), StoreError> {
        tracing::warn!(
            segment = %torn.path.display(),
            offset = torn.offset,
            reason = %torn.reason,
            "cutting a torn journal tail left by an interrupted write"
        );
        let file =
            segment::open_for_writing(&torn.path, false).map_err(StoreError::io(&torn.path))?;
        let result = if torn.offset < HEADER_LEN as u64 {
            // Even the header was torn: rewrite it so the segment is valid and empty.
            file.set_len(0)
                .and_then(|_| (&file).write_all(&codec::header()))
        } else {
            file.set_len(torn.offset)
        };
        result
            .and_then(|_| file.sync_all())
            .map_err(StoreError::io(&torn.path))?;
        self.set_cursor(Cursor {
            offset: torn.offset.max(HEADER_LEN as u64),
            ..self.cursor
        });
        self.writer = None;
        Ok(())
    }

    fn warn_torn(&mut self, torn: &TornTail) {
        let key = (torn.path.clone(), torn.offset);
        if self.warned_torn.as_ref() != Some(&key) {
            tracing::warn!(
                segment = %torn.path.display(),
                offset = torn.offset,
                reason = %torn.reason,
                "ignoring an incomplete journal tail (an interrupted or in-progress write)"
            );
            self.warned_torn = Some(key);
        }
    }
}

/// Reads whole records from `progress.cursor` to the end of the journal, checking that seqs
/// continue from `progress.last_seq` and that each links to `progress.head` (a broken link is
/// noted in `log`, not refused), and advances `progress` past each record `on` accepts.
/// Returns the torn tail of the last segment, if any.
fn read_journal<E: From<StoreError>>(
    journal: &Path,
    progress: &mut Progress,
    log: &mut ChainLog,
    mut on: impl FnMut(Entry) -> Result<(), E>,
) -> Result<Option<TornTail>, E> {
    let segments: Vec<u64> = segment::list_segments(journal)?
        .into_iter()
        .filter(|n| *n >= progress.cursor.segment)
        .collect();
    let Some(&first) = segments.first() else {
        return Ok(None);
    };
    if first != progress.cursor.segment {
        if progress.cursor.offset > 0 {
            return Err(StoreError::SegmentMissing {
                path: segment::segment_path(journal, progress.cursor.segment),
            }
            .into());
        }
        progress.cursor = Cursor {
            segment: first,
            offset: 0,
        };
    }
    let last = segments[segments.len() - 1];
    for n in segments {
        if n != progress.cursor.segment {
            progress.cursor = Cursor {
                segment: n,
                offset: 0,
            };
        }
        let path = segment::segment_path(journal, n);
        let end = segment::scan(
            &path,
            progress.cursor.offset,
            n == last,
            |entry, offset, end| {
                let expected = progress.last_seq + 1;
                let record = &entry.record;
                if record.seq != expected {
                    return Err(E::from(StoreError::Corrupt {
                        segment: path.clone(),
                        offset,
                        reason: format!(
                            "record has seq {} where seq {expected} was due (seqs must be contiguous)",
                            record.seq
                        ),
                    }));
                }
                let (seq, prev, hash) = (record.seq, entry.prev, entry.hash);
                let id = chain::declared_workspace_id(seq, &record.kind, record.payload.get());
                on(entry)?;
                log.link(seq, progress.head, prev, hash);
                log.workspace_id = id.or(log.workspace_id.take());
                progress.last_seq = seq;
                progress.head = hash;
                progress.cursor.offset = end;
                Ok(())
            },
        )?;
        match end {
            SegmentEnd::Clean { end } => progress.cursor.offset = end,
            SegmentEnd::Torn { end, reason } => {
                progress.cursor.offset = end;
                return Ok(Some(TornTail {
                    path,
                    offset: end,
                    reason,
                }));
            }
        }
    }
    Ok(None)
}

/// The write handle of one segment, and how far its file's space reaches.
#[derive(Debug)]
struct SegmentWriter {
    segment: u64,
    file: File,
    /// The file's length as this handle last set or saw it.
    allocated: u64,
    /// The segment after this one, whose absence `nothing_new` checks before every append.
    next: PathBuf,
}

impl SegmentWriter {
    fn open(segment: u64, path: &Path) -> Result<SegmentWriter, StoreError> {
        // Read too: `nothing_new` looks at what follows the cursor through it.
        let file = segment::open_for_writing(path, true).map_err(StoreError::io(path))?;
        let allocated = file.metadata().map_err(StoreError::io(path))?.len();
        let next = path.with_file_name(segment::segment_name(segment + 1));
        Ok(SegmentWriter {
            segment,
            file,
            allocated,
            next,
        })
    }

    /// Before writing `len` bytes at `offset`: where they would grow the file, writes zeros up
    /// to `ahead` bytes (at least `len`) from `offset`, so the next appends' fdatasyncs write
    /// data only. Best effort: without room the append grows the file as usual.
    fn make_room(&mut self, offset: u64, len: u64, ahead: u64) {
        if ahead == 0 || offset + len <= self.allocated {
            return;
        }
        let want = ahead.max(len);
        // Reserved first, so that what a crash leaves there reads as zeros (on a filesystem
        // that may persist the new size before the data); then written as zeros after this
        // append's own bytes and flushed with them, so the next appends overwrite blocks the
        // file has and their fdatasyncs write data only.
        let _ = durable::allocate(&self.file, offset, want);
        self.allocated = match durable::write_zeros(&self.file, offset + len, want - len) {
            Ok(()) => offset + want,
            // Whatever got written stays; later appends do not write it again.
            Err(_) => self.file.metadata().map_or(self.allocated, |m| m.len()),
        };
    }
}

/// Rotation, under the lock: the segment left behind keeps its records and not the space
/// written ahead of them (by this Store or another process, whatever `allocated` says), and
/// the cut is made durable, since a segment that is no longer the last must end at its last
/// record. Best effort: readers take leftover zeros for space never written anyway.
fn trim_left_segment(store: &Store, segment: u64) {
    let end = store.cursor.offset;
    let path = segment::segment_path(&store.journal, segment);
    let opened;
    let file = match store.writer.as_ref().filter(|w| w.segment == segment) {
        Some(w) => &w.file,
        None => match segment::open_for_writing(&path, false) {
            Ok(f) => {
                opened = f;
                &opened
            }
            Err(_) => return,
        },
    };
    if file.metadata().is_ok_and(|m| m.len() > end) {
        let _ = file.set_len(end).and_then(|()| file.sync_data());
    }
}

/// The writer lock plus the right to append. Dropping it releases the lock.
#[derive(Debug)]
pub struct WriteTxn<'a> {
    store: &'a mut Store,
    poisoned: bool,
}

impl WriteTxn<'_> {
    /// Whole records others appended since this Store's cursor (read under the lock, so a torn
    /// tail there was a crash and has been cut). Records already returned by `poll` are not
    /// repeated.
    pub fn take_new(&mut self) -> Result<Vec<Record>, StoreError> {
        let new = std::mem::take(&mut self.store.undelivered);
        self.store.publish_end();
        Ok(new)
    }

    /// The seq the next appended record must carry.
    pub fn next_seq(&self) -> u64 {
        self.store.last_seq + 1
    }

    /// Appends `records`, whose seqs must run contiguously from [`next_seq`](Self::next_seq)
    /// (otherwise nothing is written), in one write followed by one `fdatasync`; returns only
    /// once they are durable. The batch is atomic: readers see all of it or none, also after
    /// a crash. A failed write is truncated away before the error is returned.
    pub fn append(&mut self, records: &[Record]) -> Result<(), StoreError> {
        // Named only in errors: built then, not for every append.
        let path = |store: &Store| segment::segment_path(&store.journal, store.cursor.segment);
        if self.poisoned {
            return Err(StoreError::Poisoned {
                segment: path(self.store),
            });
        }
        let Some(last) = records.last() else {
            return Ok(());
        };
        let next = self.next_seq();
        for (index, record) in records.iter().enumerate() {
            let expected = next + index as u64;
            if record.seq != expected {
                return Err(StoreError::NonContiguous {
                    index,
                    expected,
                    found: record.seq,
                });
            }
        }
        let mut buf = std::mem::take(&mut self.store.encoded.0);
        buf.clear();
        buf.reserve(codec::batch_size_hint(records));
        // (An error drops the buffer: the next append allocates one.)
        let hashes = codec::encode_batch_into(records, self.store.head, &mut buf)?;
        let ahead = self.store.preallocate;
        let (offset, writer) = self.store.writer_locked()?;
        writer.make_room(offset, buf.len() as u64, ahead);
        let file = &mut writer.file;
        let written = durable::write_at(file, &buf, offset).and_then(|_| file.sync_data());
        if let Err(source) = written {
            let rolled_back = file.set_len(offset).and_then(|_| file.sync_data());
            writer.allocated = offset;
            if rolled_back.is_err() {
                self.poisoned = true;
                self.store.writer = None;
            }
            return Err(StoreError::Io {
                path: path(self.store),
                source,
            });
        }
        self.store.set_cursor(Cursor {
            offset: offset + buf.len() as u64,
            ..self.store.cursor
        });
        self.store.view.end().appended();
        let mut log = ChainLog::default();
        let mut prev = self.store.head;
        for (record, hash) in records.iter().zip(&hashes) {
            log.link(record.seq, prev, prev, *hash);
            prev = *hash;
            let id = chain::declared_workspace_id(record.seq, &record.kind, record.payload.get());
            log.workspace_id = id.or(log.workspace_id.take());
        }
        self.store.last_seq = last.seq;
        self.store.head = prev;
        self.store.view.publish(last.seq, prev, log);
        // A rare large batch (bulk writes, a big result) is not held for the process's life.
        if buf.capacity() <= KEEP_ENCODED_MAX {
            self.store.encoded = Scratch(buf);
        }
        Ok(())
    }

    /// Writes `snap` as the store's snapshot and rotates the journal so later records go to a
    /// new segment. `snap.seq` must equal the journal's last seq (take and fold new records
    /// first). Order: new segment, then snapshot (temp, fsync, rename, dir fsync); a crash in
    /// between leaves the previous snapshot valid with every record after it.
    pub fn write_snapshot(&mut self, snap: &Snapshot) -> Result<(), StoreError> {
        self.write_raw_snapshot(RawSnapshot::from_value(snap)?)
    }

    /// [`WriteTxn::write_snapshot`] for an already encoded state.
    pub fn write_raw_snapshot(&mut self, snap: RawSnapshot) -> Result<(), StoreError> {
        let target = self.rotate_for_snapshot(snap.seq)?;
        let mark = target.write(&snap)?;
        let store = &mut *self.store;
        store.snapshot_mark = Some(mark);
        store.snapshot_seq = snap.seq;
        store.snapshot = Some(snap);
        store.snapshot_from = target.journal_from;
        store.snapshot_head = target.head;
        Ok(())
    }

    /// The part of a snapshot that needs the lock: checks that `seq` is the journal's last
    /// seq, removes temp files a crash left, and rotates the journal so later records go to a
    /// new segment. The returned target writes the snapshot itself, with no lock held (a crash
    /// before its rename leaves the previous snapshot valid with every record after it, since
    /// segments are never removed). Replays by this Store still start from the snapshot it
    /// opened with (or wrote through [`WriteTxn::write_raw_snapshot`]).
    pub fn rotate_for_snapshot(&mut self, seq: u64) -> Result<SnapshotTarget, StoreError> {
        let store = &mut *self.store;
        if seq != store.last_seq {
            return Err(StoreError::SnapshotNotAtTail {
                snapshot_seq: seq,
                last_seq: store.last_seq,
            });
        }
        snapshot::remove_stale_temps(&store.dir);
        let current = store.cursor.segment;
        let journal_from = if store.cursor.offset > HEADER_LEN as u64 {
            segment::create_segment(&store.journal, current + 1)?;
            current + 1
        } else {
            current
        };
        if journal_from != current {
            trim_left_segment(store, current);
            let path = segment::segment_path(&store.journal, journal_from);
            store.writer = Some(SegmentWriter::open(journal_from, &path)?);
            store.set_cursor(Cursor {
                segment: journal_from,
                offset: HEADER_LEN as u64,
            });
        }
        Ok(SnapshotTarget {
            dir: store.dir.clone(),
            seq,
            journal_from,
            head: store.head,
            workspace_id: store.view.workspace_id(),
        })
    }
}

/// Where a snapshot at `seq` goes, decided under the lock by [`WriteTxn::rotate_for_snapshot`].
#[derive(Debug, Clone)]
pub struct SnapshotTarget {
    dir: PathBuf,
    seq: u64,
    journal_from: u64,
    head: Digest32,
    workspace_id: Option<String>,
}

impl SnapshotTarget {
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Durably writes `snap` (temp, fsync, rename, directory fsync); needs no lock. Returns
    /// the mark of the file written.
    pub fn write(&self, snap: &RawSnapshot) -> Result<snapshot::SnapshotMark, StoreError> {
        if snap.seq != self.seq {
            return Err(StoreError::SnapshotNotAtTail {
                snapshot_seq: snap.seq,
                last_seq: self.seq,
            });
        }
        snapshot::store(
            &self.dir,
            snap,
            self.journal_from,
            self.head,
            self.workspace_id.as_deref(),
        )
    }
}

impl Drop for WriteTxn<'_> {
    fn drop(&mut self) {
        if let Some(lock) = self.store.lock_file.as_ref() {
            let _ = lock.unlock();
        }
    }
}

#[cfg(test)]
mod tamper_tests;
#[cfg(test)]
mod tests;
