//! Journal segments on disk: naming, listing, creation, and the bulk scanner every reader uses.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{OnceLock, mpsc};

use super::codec::{self, FRAME_PREFIX, Frame, HEADER_LEN, HeaderCheck};
use super::durable;
use super::{Entry, FORMAT_VERSION, StoreError};

/// Largest read issued by the scanner; big enough that a replay costs few syscalls.
const READ_CHUNK: usize = 4 * 1024 * 1024;

pub fn segment_name(n: u64) -> String {
    format!("{n:06}.log")
}

pub fn segment_path(journal: &Path, n: u64) -> PathBuf {
    journal.join(segment_name(n))
}

/// Parses `NNNNNN.log` (at least six digits); anything else in the directory is ignored.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".log")?;
    if stem.len() < 6 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok().filter(|n| *n > 0)
}

/// Segment numbers present in `journal`, ascending. A missing directory has none.
pub fn list_segments(journal: &Path) -> Result<Vec<u64>, StoreError> {
    let entries = match fs::read_dir(journal) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(StoreError::Io {
                path: journal.to_path_buf(),
                source,
            });
        }
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(StoreError::io(journal))?;
        if let Some(n) = entry.file_name().to_str().and_then(parse_segment_name) {
            out.push(n);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Creates segment `n` holding only its header, atomically, so a segment never exists without
/// a whole header because of us.
pub fn create_segment(journal: &Path, n: u64) -> Result<PathBuf, StoreError> {
    let path = segment_path(journal, n);
    if path.exists() {
        return Err(StoreError::Io {
            path,
            source: io::Error::new(
                io::ErrorKind::AlreadyExists,
                "refusing to replace an existing journal segment",
            ),
        });
    }
    durable::write_atomic(&path, &codec::header())?;
    Ok(path)
}

/// Reads and checks only the header of a segment (used by `open` to refuse newer formats).
/// Returns false when the header is incomplete.
pub fn check_segment_header(path: &Path, is_last: bool) -> Result<bool, StoreError> {
    let mut file = open_for_reading(path).map_err(StoreError::io(path))?;
    let head = read_up_to(&mut file, HEADER_LEN).map_err(StoreError::io(path))?;
    header_verdict(path, &head, is_last)
}

fn header_verdict(path: &Path, head: &[u8], is_last: bool) -> Result<bool, StoreError> {
    match codec::check_header(head) {
        HeaderCheck::Valid => Ok(true),
        HeaderCheck::Incomplete if is_last => Ok(false),
        HeaderCheck::Incomplete => Err(StoreError::Corrupt {
            segment: path.to_path_buf(),
            offset: head.len() as u64,
            reason: "segment ends inside its header".into(),
        }),
        HeaderCheck::Version(found) if found < FORMAT_VERSION => Err(StoreError::OutdatedVersion {
            path: path.to_path_buf(),
            found,
            supported: FORMAT_VERSION,
        }),
        HeaderCheck::Version(found) => Err(StoreError::UnsupportedVersion {
            path: path.to_path_buf(),
            found,
            supported: FORMAT_VERSION,
        }),
        HeaderCheck::Bad(reason) => Err(StoreError::Corrupt {
            segment: path.to_path_buf(),
            offset: 0,
            reason,
        }),
    }
}

/// Whether nothing but zeros follows `offset` in the first frame prefix's worth of `file`
/// (or the file ends there): no record starts at `offset` yet. A frame never starts with
/// zeros; zeros are space allocated ahead and not written.
pub fn unwritten_at(file: &File, offset: u64) -> bool {
    let mut prefix = [0u8; FRAME_PREFIX];
    let mut got = 0;
    while got < FRAME_PREFIX {
        match read_at(file, &mut prefix[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    prefix[..got].iter().all(|b| *b == 0)
}

/// Whether nothing follows `offset` of the segment open as `file` ([`unwritten_at`]) and the
/// segment after it, `next`, does not exist (segments are created in order, so one `stat` of
/// the next suffices).
pub fn nothing_after(file: &File, offset: u64, next: &Path) -> bool {
    unwritten_at(file, offset)
        && matches!(std::fs::symlink_metadata(next), Err(e) if e.kind() == io::ErrorKind::NotFound)
}

/// A segment opened for appending or cutting: never through a symlink put in its place (which
/// would make gaffer write or truncate a file outside the store), and only a regular file (a
/// FIFO there must not block the writer).
pub fn open_for_writing(path: &Path, read: bool) -> io::Result<File> {
    open_segment(path, std::fs::OpenOptions::new().read(read).write(true))
}

/// A segment opened for reading only: not through a symlink put in its place, and only a
/// regular file (a FIFO named like a segment must not block the reader holding the lock).
pub fn open_for_reading(path: &Path) -> io::Result<File> {
    open_segment(path, std::fs::OpenOptions::new().read(true))
}

fn open_segment(path: &Path, options: &mut std::fs::OpenOptions) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = options
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a journal segment must be a regular file",
        ));
    }
    Ok(file)
}

#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    file.read_at(buf, offset)
}

#[cfg(not(unix))]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut file = file;
    file.seek(SeekFrom::Start(offset))?;
    file.read(buf)
}

fn read_up_to(file: &mut File, n: usize) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(n);
    file.by_ref().take(n as u64).read_to_end(&mut out)?;
    Ok(out)
}

/// How a segment scan stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SegmentEnd {
    /// Every byte up to `end` belongs to a whole record; after it the file ends or holds only
    /// zeros (space preallocated and never written).
    Clean { end: u64 },
    /// Whole records end at `end`; what follows is an incomplete or damaged tail with no whole
    /// record after it. Only possible in the last segment.
    Torn { end: u64, reason: String },
}

/// Calls `on(entry, offset, end_offset)` for every whole record of the segment at `path`
/// from byte `start` (0 or below the header length means "check the header first").
///
/// In the last segment a damaged or incomplete tail is reported as [`SegmentEnd::Torn`], but
/// only when no whole record follows it; otherwise (or in any earlier segment) the damage is a
/// [`StoreError::Corrupt`] naming the segment and offset.
///
/// Large reads are pipelined: a helper thread reads, checks and parses records while the
/// calling thread runs `on`, so parsing overlaps with whatever `on` does (folding state).
pub fn scan<E: From<StoreError>>(
    path: &Path,
    start: u64,
    is_last: bool,
    on: impl FnMut(Entry, u64, u64) -> Result<(), E>,
) -> Result<SegmentEnd, E> {
    let remaining = fs::metadata(path).map_or(0, |m| m.len().saturating_sub(start));
    if remaining < PIPELINE_MIN_BYTES || !pipelining_helps() {
        return scan_serial(path, start, is_last, on);
    }
    scan_pipelined(path, start, is_last, on)
}

/// Below this many unread bytes a scan stays on the calling thread.
const PIPELINE_MIN_BYTES: u64 = 1024 * 1024;
/// Records handed from the parsing thread to the caller at a time.
const PIPELINE_BATCH: usize = 1024;

fn pipelining_helps() -> bool {
    static MANY_CORES: OnceLock<bool> = OnceLock::new();
    *MANY_CORES.get_or_init(|| std::thread::available_parallelism().is_ok_and(|n| n.get() > 1))
}

type Batch = Vec<(Entry, u64, u64)>;

fn scan_pipelined<E: From<StoreError>>(
    path: &Path,
    start: u64,
    is_last: bool,
    mut on: impl FnMut(Entry, u64, u64) -> Result<(), E>,
) -> Result<SegmentEnd, E> {
    let (tx, rx) = mpsc::sync_channel::<Batch>(4);
    std::thread::scope(|scope| {
        let spawned = crate::util::spawn_scoped(scope, "gaffer-store-scan", move || {
            let mut batch = Vec::with_capacity(PIPELINE_BATCH);
            let result = scan_serial::<Stopped>(path, start, is_last, |record, offset, end| {
                batch.push((record, offset, end));
                if batch.len() == PIPELINE_BATCH {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(PIPELINE_BATCH));
                    tx.send(full).map_err(|_| Stopped::ByCaller)?;
                }
                Ok(())
            });
            if !batch.is_empty() {
                let _ = tx.send(batch);
            }
            result
        });
        let Some(parser) = spawned else {
            return scan_serial(path, start, is_last, &mut on);
        };
        let mut failed = None;
        'batches: for batch in rx.iter() {
            for (record, offset, end) in batch {
                if let Err(e) = on(record, offset, end) {
                    failed = Some(e);
                    break 'batches;
                }
            }
        }
        // Dropping the receiver unblocks a parser waiting to send.
        drop(rx);
        let parsed = crate::util::join_scoped(parser);
        if let Some(e) = failed {
            return Err(e);
        }
        match parsed {
            Ok(end) => Ok(end),
            Err(Stopped::Store(e)) => Err(E::from(e)),
            // The parser stops early only once `on` failed, which returned above.
            Err(Stopped::ByCaller) => Err(E::from(StoreError::Io {
                path: path.to_path_buf(),
                source: io::Error::other("segment scan stopped early"),
            })),
        }
    })
}

/// Why the parsing thread of a pipelined scan stopped.
enum Stopped {
    Store(StoreError),
    ByCaller,
}

impl From<StoreError> for Stopped {
    fn from(e: StoreError) -> Self {
        Stopped::Store(e)
    }
}

fn scan_serial<E: From<StoreError>>(
    path: &Path,
    start: u64,
    is_last: bool,
    mut on: impl FnMut(Entry, u64, u64) -> Result<(), E>,
) -> Result<SegmentEnd, E> {
    let io_err = |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = open_for_reading(path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => StoreError::SegmentMissing {
            path: path.to_path_buf(),
        },
        _ => io_err(source),
    })?;
    let base = if start < HEADER_LEN as u64 {
        let head = read_up_to(&mut file, HEADER_LEN).map_err(io_err)?;
        if !header_verdict(path, &head, is_last)? {
            return Ok(SegmentEnd::Torn {
                end: 0,
                reason: format!("segment header incomplete ({} bytes)", head.len()),
            });
        }
        HEADER_LEN as u64
    } else {
        file.seek(SeekFrom::Start(start)).map_err(io_err)?;
        start
    };
    let mut window = Window::new(file, base).map_err(io_err)?;
    let mut batch = OpenBatch::new(base);
    loop {
        // Decode every whole frame already buffered.
        let mut incomplete: Option<Option<usize>> = None;
        while !window.buffered().is_empty() {
            let offset = window.offset();
            match codec::decode(window.buffered()) {
                Frame::Whole {
                    entry,
                    len,
                    first,
                    last,
                } => {
                    batch.check_link(path, offset, first)?;
                    window.lo += len;
                    batch.add(entry, offset, window.offset(), first, last, &mut on)?;
                }
                Frame::Incomplete { needed } => {
                    incomplete = Some(needed);
                    break;
                }
                Frame::Bad(reason) => {
                    let at = batch.damage_at(offset);
                    let Window {
                        file, buf, lo, hi, ..
                    } = &mut window;
                    return damaged(path, file, &buf[*lo..*hi], at, reason, is_last)
                        .map_err(E::from);
                }
            }
        }
        if window.eof {
            return batch.at_eof(path, &mut window, incomplete, is_last);
        }
        window.read_more().map_err(io_err)?;
    }
}

/// The part of a segment a scan holds: `buf[lo..hi]` is the file from offset `base + lo`.
struct Window {
    file: File,
    buf: Vec<u8>,
    lo: usize,
    hi: usize,
    base: u64,
    /// The file has no more bytes after `hi`.
    eof: bool,
}

impl Window {
    fn new(file: File, base: u64) -> io::Result<Self> {
        let file_len = file.metadata()?.len();
        let remaining = file_len.saturating_sub(base) as usize;
        Ok(Window {
            file,
            buf: vec![0u8; remaining.clamp(4096, READ_CHUNK) + FRAME_PREFIX],
            lo: 0,
            hi: 0,
            base,
            eof: false,
        })
    }

    /// The offset in the file of the first byte not yet decoded.
    fn offset(&self) -> u64 {
        self.base + self.lo as u64
    }

    fn buffered(&self) -> &[u8] {
        &self.buf[self.lo..self.hi]
    }

    /// Keeps the unfinished frame at the front and reads more behind it (growing the buffer
    /// when the frame fills it); sets `eof` when the file has no more.
    fn read_more(&mut self) -> io::Result<()> {
        if self.lo > 0 {
            self.buf.copy_within(self.lo..self.hi, 0);
            self.hi -= self.lo;
            self.base += self.lo as u64;
            self.lo = 0;
        }
        if self.hi == self.buf.len() {
            let grown = (self.buf.len() * 2).max(self.hi + 4096);
            self.buf.resize(grown, 0);
        }
        let n = loop {
            match self.file.read(&mut self.buf[self.hi..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            self.eof = true;
        } else {
            self.hi += n;
        }
        Ok(())
    }
}

/// The batch a scan is inside. Its records are delivered only once its last record is read: a
/// batch is all or nothing. A scan resuming mid-segment may start inside a batch whose earlier
/// records were already delivered (the caller stopped midway), so it accepts continuation
/// records until the next batch starts.
struct OpenBatch {
    pending: Vec<(Entry, u64, u64)>,
    /// Where the unfinished batch starts, if one is.
    start: Option<u64>,
    resuming: bool,
}

impl OpenBatch {
    fn new(base: u64) -> Self {
        let resuming = base > HEADER_LEN as u64;
        OpenBatch {
            pending: Vec::new(),
            start: resuming.then_some(base),
            resuming,
        }
    }

    /// No batch is left unfinished here.
    fn settled(&self) -> bool {
        self.pending.is_empty() || self.resuming
    }

    /// A whole record at `offset` must start a batch exactly when none is open, except that a
    /// scan resuming inside a batch may meet the next batch's start before anything else.
    fn check_link<E: From<StoreError>>(
        &self,
        path: &Path,
        offset: u64,
        first: bool,
    ) -> Result<(), E> {
        if first && self.start.is_some() && !self.resuming {
            return Err(E::from(StoreError::Corrupt {
                segment: path.to_path_buf(),
                offset: self.start.unwrap_or(offset),
                reason:
                    "a batch starting here never ends: a new batch begins before its last record"
                        .into(),
            }));
        }
        if !first && self.start.is_none() {
            return Err(E::from(StoreError::Corrupt {
                segment: path.to_path_buf(),
                offset,
                reason: "record continues a batch that never began".into(),
            }));
        }
        Ok(())
    }

    /// Takes a whole record (after [`Self::check_link`]); delivers the batch at its last.
    fn add<E>(
        &mut self,
        entry: Entry,
        offset: u64,
        end: u64,
        first: bool,
        last: bool,
        on: &mut impl FnMut(Entry, u64, u64) -> Result<(), E>,
    ) -> Result<(), E> {
        if first {
            self.start = Some(offset);
        }
        self.resuming = false;
        self.pending.push((entry, offset, end));
        if last {
            for (entry, offset, end) in self.pending.drain(..) {
                on(entry, offset, end)?;
            }
            self.start = None;
        }
        Ok(())
    }

    /// Where damage met at `offset` sits in the batch.
    fn damage_at(&self, offset: u64) -> Damage {
        Damage {
            offset,
            tail: self.start.unwrap_or(offset),
            settled: self.settled(),
        }
    }

    /// How the segment ends once the file has no more bytes: cleanly after a whole batch, or
    /// with a batch lacking its last record or a record cut short (judged by [`damaged`]).
    fn at_eof<E: From<StoreError>>(
        &self,
        path: &Path,
        window: &mut Window,
        incomplete: Option<Option<usize>>,
        is_last: bool,
    ) -> Result<SegmentEnd, E> {
        let offset = window.offset();
        let left = window.hi - window.lo;
        if left == 0 {
            if self.settled() {
                return Ok(SegmentEnd::Clean { end: offset });
            }
            let reason = format!(
                "batch of {} whole record(s) lacks its last record",
                self.pending.len()
            );
            let tail = self.start.unwrap_or(offset);
            let at = Damage {
                offset: tail,
                tail,
                settled: false,
            };
            return damaged(path, &mut window.file, &[], at, reason, is_last).map_err(E::from);
        }
        let reason = match incomplete.flatten() {
            Some(needed) => format!("incomplete record: {left} of {needed} bytes present"),
            None => format!("incomplete record prefix: {left} bytes"),
        };
        let at = self.damage_at(offset);
        let Window {
            file, buf, lo, hi, ..
        } = window;
        damaged(path, file, &buf[*lo..*hi], at, reason, is_last).map_err(E::from)
    }
}

/// Where a scan met bytes that are not a whole frame.
#[derive(Clone, Copy)]
struct Damage {
    /// The frame boundary the bytes start at.
    offset: u64,
    /// Where the unfinished batch containing them starts (the cut point of a torn tail).
    tail: u64,
    /// No batch is left unfinished at `offset`.
    settled: bool,
}

/// Decides what the bytes from a frame boundary that are not a whole frame are: space never
/// written, a torn tail, or corruption. `buffered` holds the bytes from `at.offset` already
/// read; the rest of the file is read behind them.
///
/// Zeros from a settled boundary to the end of the file are space never written: a writer
/// that preallocates its segment ([`super::Store::preallocate`]) leaves them there, and no
/// frame starts with zeros (a length of 0 is refused). Only the last batch can be torn: a
/// writer starts a batch only after the previous one was fdatasynced. So the damage is a torn
/// tail when nothing whole follows it except later records of the same batch (a crash can
/// persist a batch's pages out of order); a whole record that starts a new batch after it
/// proves the damaged batch had been acknowledged. Unless the damaged batch is whole when
/// read again: a reader without the store lock met an append in progress (or space it had
/// yet to fill) and read on into later appends; its scan ends before that batch.
fn damaged(
    path: &Path,
    file: &mut File,
    buffered: &[u8],
    at: Damage,
    reason: String,
    is_last: bool,
) -> Result<SegmentEnd, StoreError> {
    let Damage {
        offset,
        tail,
        settled,
    } = at;
    let corrupt = |why: String| StoreError::Corrupt {
        segment: path.to_path_buf(),
        offset,
        reason: why,
    };
    let mut rest = buffered.to_vec();
    file.read_to_end(&mut rest).map_err(StoreError::io(path))?;
    if settled && rest.iter().all(|b| *b == 0) {
        return Ok(SegmentEnd::Clean { end: offset });
    }
    // Only the last segment is ever being appended to.
    if is_last && overtaken(file, tail).map_err(StoreError::io(path))? {
        // A reader without the store lock read this space before an append filled it, and
        // what follows once later appends had landed: the scan ran ahead of a writer. It
        // ends before the unfinished batch; the next read resumes there.
        return Ok(SegmentEnd::Clean { end: tail });
    }
    if !is_last {
        return Err(corrupt(format!(
            "{reason} (in a segment that is not the last)"
        )));
    }
    // Bytes that could only be judged by checksumming most of them again for every candidate
    // are crafted: refused as corruption, never cut as a torn tail.
    let mut budget = codec::search_budget(rest.len());
    let exhausted = |_| {
        corrupt(format!(
            "{reason}; the bytes after it claim more records than they can hold"
        ))
    };
    let mut from = 1;
    while let Some(found) = codec::find_whole_frame(&rest, from, &mut budget).map_err(exhausted)? {
        if found.first {
            return Err(corrupt(format!(
                "{reason}; a later batch follows at offset {}",
                offset + found.at as u64
            )));
        }
        if found.last {
            // The damaged batch ends here; anything whole after it is a later batch.
            let end = found.at + found.len;
            if let Some(later) =
                codec::find_whole_frame(&rest, end, &mut budget).map_err(exhausted)?
            {
                return Err(corrupt(format!(
                    "{reason}; a later record follows at offset {}",
                    offset + later.at as u64
                )));
            }
            break;
        }
        from = found.at + 1;
    }
    Ok(SegmentEnd::Torn { end: tail, reason })
}

/// True when a whole batch now starts at `tail` (the start of the batch a scan found damaged):
/// the file changed since the scan read it. Read unchanged, the same bytes give the same
/// damage.
fn overtaken(file: &File, tail: u64) -> io::Result<bool> {
    let len = file.metadata()?.len();
    let mut at = tail;
    let mut buf = vec![0u8; 4096];
    loop {
        let mut n = read_at_most(file, &mut buf, at)?;
        if let Frame::Incomplete {
            needed: Some(total),
        } = codec::decode(&buf[..n])
            && n == buf.len()
            && (total as u64) <= len.saturating_sub(at)
        {
            buf.resize(total, 0);
            n = read_at_most(file, &mut buf, at)?;
        }
        match codec::decode(&buf[..n]) {
            Frame::Whole { len, last, .. } => {
                if last {
                    return Ok(true);
                }
                at += len as u64;
            }
            _ => return Ok(false),
        }
    }
}

/// Fills `buf` from `offset` as far as the file goes; returns how much was read.
fn read_at_most(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match read_at(file, &mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(
        seqs: std::ops::RangeInclusive<u64>,
        prev: crate::store::chain::Digest32,
    ) -> (Vec<u8>, crate::store::chain::Digest32) {
        let records: Vec<crate::store::Record> = seqs
            .map(|seq| crate::store::Record {
                seq,
                time_ms: 1_700_000_000_000 + seq,
                kind: "test.event".into(),
                payload: crate::store::raw_payload(serde_json::json!({ "n": seq })),
            })
            .collect();
        let mut out = Vec::new();
        let hashes = codec::encode_batch_into(&records, prev, &mut out).expect("encode");
        (out, *hashes.last().expect("a record"))
    }

    /// What `damaged` decides about damage met at `at` by a scan that had buffered `seen`
    /// from there, given what the file holds by the time it reads the rest.
    fn judge(file_now: &[u8], seen: &[u8], at: Damage) -> Result<SegmentEnd, StoreError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("000001.log");
        fs::write(&path, file_now).expect("write");
        let mut file = File::open(&path).expect("open");
        file.seek(SeekFrom::Start(at.offset + seen.len() as u64))
            .expect("seek");
        let reason = "damage as the scan saw it".to_string();
        damaged(&path, &mut file, seen, at, reason, true)
    }

    /// A reader without the store lock can read space ahead of the writer as zeros, or a
    /// batch half copied in, and then (reading on) the batches appended meanwhile: that is the
    /// end of what was written when it looked, not corruption. Zeros that are still there
    /// before a later batch are.
    #[test]
    fn a_batch_filled_in_while_reading_ends_the_scan_but_a_hole_is_corrupt() {
        let (first, head) = batch(1..=2, crate::store::chain::GENESIS);
        let (later, _) = batch(3..=3, head);
        let filled = [first.clone(), later.clone()].concat();
        let zeros_at_start = Damage {
            offset: 0,
            tail: 0,
            settled: true,
        };
        match judge(&filled, &[0u8; 64], zeros_at_start) {
            Ok(SegmentEnd::Clean { end }) => assert_eq!(end, 0),
            other => panic!("expected a clean end where the append began, got {other:?}"),
        }
        // Record 1 whole and nothing after it when read: the batch lacked its last record.
        let lacking_last = Damage {
            offset: 0,
            tail: 0,
            settled: false,
        };
        match judge(&filled, &[], lacking_last) {
            Ok(SegmentEnd::Clean { end }) => assert_eq!(end, 0),
            other => panic!("expected a clean end where the batch began, got {other:?}"),
        }
        let hole = [vec![0u8; first.len()], later].concat();
        match judge(&hole, &[0u8; 64], zeros_at_start) {
            Err(StoreError::Corrupt { offset, reason, .. }) => {
                assert_eq!(offset, 0);
                assert!(reason.contains("a later batch follows"), "{reason}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    #[test]
    fn segment_names() {
        assert_eq!(segment_name(1), "000001.log");
        assert_eq!(segment_name(1_234_567), "1234567.log");
        assert_eq!(parse_segment_name("000001.log"), Some(1));
        assert_eq!(parse_segment_name("1234567.log"), Some(1_234_567));
        assert_eq!(parse_segment_name("000000.log"), None);
        assert_eq!(parse_segment_name("00001.log"), None);
        assert_eq!(parse_segment_name(".000001.log.tmp-1-0"), None);
        assert_eq!(parse_segment_name("00000a.log"), None);
        assert_eq!(parse_segment_name("000001.txt"), None);
    }
}
