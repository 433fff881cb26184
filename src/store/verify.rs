//! Read-only integrity check of a whole store (`gaffer store verify`).

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::chain::{self, Digest32, GENESIS, Head};
use super::segment::{self, SegmentEnd};
use super::{Entry, FORMAT_VERSION, StoreError, blob, durable, snapshot};
use crate::util::sha256_hex;

/// What `verify` found. `ok` is true when `problems` is empty; `warnings` are harmless
/// leftovers (a torn tail the next writer will cut, stray temp files).
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub dir: PathBuf,
    pub exists: bool,
    pub format_version: u32,
    pub segments: Vec<SegmentReport>,
    pub records: u64,
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    pub snapshot: Option<SnapshotReport>,
    pub chain: ChainReport,
    pub blobs: u64,
    pub blobs_corrupt: u64,
    pub problems: Vec<Problem>,
    pub warnings: Vec<Problem>,
    pub ok: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct SegmentReport {
    pub path: PathBuf,
    pub bytes: u64,
    pub records: u64,
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// Offset where an incomplete tail starts (last segment only).
    pub torn_tail_at: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SnapshotReport {
    pub seq: u64,
    pub journal_from: u64,
    pub state_bytes: usize,
    /// The chain head recorded in the snapshot (hash of record `seq`).
    pub head: String,
}

/// The hash chain: how far it verifies, where it first breaks, and what each operator
/// signature in the journal vouches for.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ChainReport {
    /// First seq whose link was checked: 1 (from genesis), or the seq after the snapshot when
    /// the segments before it are gone (then the chain starts from the snapshot's head).
    pub verified_from: Option<u64>,
    /// Last seq up to which every link holds.
    pub verified_to: Option<u64>,
    /// The last record read (even past a break).
    pub head: Option<Head>,
    /// From the `store.created` record (or the snapshot).
    pub workspace_id: Option<String>,
    pub broken_at: Option<BreakReport>,
    pub signatures: Vec<SignatureReport>,
}

/// The first record whose link does not hold (or where the journal stops being readable).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BreakReport {
    pub seq: u64,
    pub segment: PathBuf,
    pub offset: u64,
    pub reason: String,
}

/// A record carrying `operator_signature.head` (seq + hash). Whether the signature itself is
/// the operator's is checked elsewhere; here: does the signed head lie on this chain.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SignatureReport {
    /// The record that carries the signature.
    pub seq: u64,
    pub kind: String,
    pub head: Head,
    /// The chain's hash at `head.seq` equals the signed one (false when it differs or is not
    /// in the journal or the snapshot).
    pub head_matches: bool,
    /// Records this signature vouches for: `[from, to]` with `to` = head.seq, when the chain
    /// verifies from `from` (1, or the snapshot's seq + 1) through head.seq and the head matches.
    pub vouches_for: Option<[u64; 2]>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Problem {
    pub path: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    pub message: String,
}

impl Problem {
    fn new(path: impl Into<PathBuf>, offset: Option<u64>, message: impl Into<String>) -> Problem {
        Problem {
            path: path.into(),
            offset,
            message: message.into(),
        }
    }

    fn from_error(fallback: &Path, e: StoreError) -> Problem {
        match e {
            StoreError::Corrupt {
                segment,
                offset,
                reason,
            } => Problem::new(segment, Some(offset), reason),
            other => Problem::new(fallback, None, other.to_string()),
        }
    }
}

/// Checks every segment (header, record checksums, seq continuity), the snapshot (format,
/// checksum, agreement with the journal) and every blob (hash). Never writes. Errors only
/// when the store directory itself cannot be read.
pub fn verify(dir: &Path) -> Result<VerifyReport, StoreError> {
    let mut report = VerifyReport {
        dir: dir.to_path_buf(),
        exists: dir.is_dir(),
        format_version: FORMAT_VERSION,
        segments: Vec::new(),
        records: 0,
        first_seq: None,
        last_seq: None,
        snapshot: None,
        chain: ChainReport::default(),
        blobs: 0,
        blobs_corrupt: 0,
        problems: Vec::new(),
        warnings: Vec::new(),
        ok: true,
    };
    if !report.exists {
        return Ok(report);
    }
    let loaded = verify_snapshot_file(dir, &mut report);
    let start = loaded
        .as_ref()
        .map(|l| (l.snapshot.seq, l.journal_from, l.head));
    let mut check = ChainCheck::new(start, loaded.and_then(|l| l.workspace_id));
    verify_journal(dir, &mut report, &mut check)?;
    verify_snapshot(dir, &mut report, &check);
    report.chain = check.finish(&mut report.problems);
    verify_blobs(dir, &mut report)?;
    for entry in fs::read_dir(dir).map_err(StoreError::io(dir))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if durable::is_temp_name(&name) {
            report.warnings.push(Problem::new(
                entry.path(),
                None,
                "leftover temp file of an interrupted write",
            ));
        }
    }
    report.ok = report.problems.is_empty();
    Ok(report)
}

fn verify_journal(
    dir: &Path,
    report: &mut VerifyReport,
    check: &mut ChainCheck,
) -> Result<(), StoreError> {
    let journal = dir.join("journal");
    let numbers = segment::list_segments(&journal)?;
    // The seq the next record must carry; None after damage, to resynchronise quietly. When
    // the segments before the snapshot are gone, the journal continues after its seq.
    let mut expected: Option<u64> = Some(check.first_expected(numbers.first().copied()));
    for (i, n) in numbers.iter().enumerate() {
        let path = segment::segment_path(&journal, *n);
        let is_last = i + 1 == numbers.len();
        let mut seg = SegmentReport {
            path: path.clone(),
            bytes: fs::metadata(&path).map(|m| m.len()).unwrap_or(0),
            records: 0,
            first_seq: None,
            last_seq: None,
            torn_tail_at: None,
        };
        if i > 0 && numbers[i - 1] + 1 != *n {
            report.problems.push(Problem::new(
                &path,
                None,
                format!(
                    "segment {} is missing",
                    segment::segment_name(numbers[i - 1] + 1)
                ),
            ));
        }
        let mut gaps = Vec::new();
        let scanned = segment::scan(&path, 0, is_last, |entry: Entry, offset, _| {
            check.record(&entry, &path, offset);
            let record = &entry.record;
            if let Some(want) = expected
                && record.seq != want
            {
                gaps.push(Problem::new(
                    &path,
                    Some(offset),
                    format!("record has seq {} where seq {want} was due", record.seq),
                ));
            }
            expected = Some(record.seq + 1);
            seg.records += 1;
            seg.first_seq.get_or_insert(record.seq);
            seg.last_seq = Some(record.seq);
            Ok::<(), StoreError>(())
        });
        report.problems.append(&mut gaps);
        match scanned {
            Ok(SegmentEnd::Clean { .. }) => {}
            Ok(SegmentEnd::Torn { end, reason }) => {
                seg.torn_tail_at = Some(end);
                report.warnings.push(Problem::new(
                    &path,
                    Some(end),
                    format!("torn tail ({reason}); the next writer cuts it"),
                ));
            }
            Err(e) => {
                let problem = Problem::from_error(&path, e);
                check.unreadable(&problem);
                report.problems.push(problem);
                expected = None;
            }
        }
        report.records += seg.records;
        if report.first_seq.is_none() {
            report.first_seq = seg.first_seq;
        }
        if seg.last_seq.is_some() {
            report.last_seq = seg.last_seq;
        }
        report.segments.push(seg);
    }
    Ok(())
}

/// Loads the snapshot (reporting it, or why it is unusable).
fn verify_snapshot_file(dir: &Path, report: &mut VerifyReport) -> Option<snapshot::Loaded> {
    let path = dir.join(snapshot::FILE_NAME);
    match snapshot::load(dir) {
        Ok(Some(loaded)) => {
            report.snapshot = Some(SnapshotReport {
                seq: loaded.snapshot.seq,
                journal_from: loaded.journal_from,
                state_bytes: loaded.state_bytes,
                head: loaded.head.to_hex(),
            });
            Some(loaded)
        }
        Ok(None) => None,
        Err(e) => {
            report.problems.push(Problem::from_error(&path, e));
            None
        }
    }
}

/// Checks that the snapshot agrees with the journal: its seq and its chain head.
fn verify_snapshot(dir: &Path, report: &mut VerifyReport, check: &ChainCheck) {
    let path = dir.join(snapshot::FILE_NAME);
    let Some(snap) = report.snapshot.clone() else {
        return;
    };
    let (seq, from) = (snap.seq, snap.journal_from);
    if let Some(actual) = check.hash_at(seq)
        && actual.to_hex() != snap.head
    {
        report.problems.push(Problem::new(
            &path,
            None,
            format!(
                "the snapshot's head {} is not the journal's hash {actual} of seq {seq}",
                snap.head
            ),
        ));
    }
    let numbers: Vec<u64> = report
        .segments
        .iter()
        .filter_map(|s| {
            s.path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(segment::parse_segment_name)
        })
        .collect();
    let covered_last = report
        .segments
        .iter()
        .zip(&numbers)
        .filter(|(_, n)| **n < from)
        .filter_map(|(s, _)| s.last_seq)
        .max();
    if let Some(last) = covered_last
        && last > seq
    {
        report.problems.push(Problem::new(
            &path,
            None,
            format!(
                "segments before {} hold records up to seq {last}, past the snapshot's seq {seq}; opening would skip them",
                segment::segment_name(from)
            ),
        ));
    }
    let first_after = report
        .segments
        .iter()
        .zip(&numbers)
        .filter(|(_, n)| **n >= from)
        .find_map(|(s, _)| s.first_seq);
    if let Some(first) = first_after
        && first != seq + 1
    {
        report.problems.push(Problem::new(
            &path,
            None,
            format!(
                "the journal after the snapshot starts at seq {first}, but the snapshot covers through seq {seq}"
            ),
        ));
    }
    if report.last_seq.is_some_and(|last| last < seq) && covered_last.is_some() {
        report.problems.push(Problem::new(
            &path,
            None,
            format!(
                "the snapshot covers seq {seq} but the journal ends at seq {}",
                report.last_seq.unwrap_or(0)
            ),
        ));
    }
}

fn verify_blobs(dir: &Path, report: &mut VerifyReport) -> Result<(), StoreError> {
    let root = blob::blobs_root(dir);
    let Ok(fanout) = fs::read_dir(&root) else {
        return Ok(());
    };
    for sub in fanout.flatten() {
        let sub_path = sub.path();
        let sub_name = sub.file_name().to_string_lossy().into_owned();
        if !sub_path.is_dir() {
            report.warnings.push(Problem::new(
                &sub_path,
                None,
                "unexpected file among blob directories",
            ));
            continue;
        }
        for entry in fs::read_dir(&sub_path)
            .map_err(StoreError::io(&sub_path))?
            .flatten()
        {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if durable::is_temp_name(&name) {
                report.warnings.push(Problem::new(
                    &path,
                    None,
                    "leftover temp file of an interrupted blob write",
                ));
                continue;
            }
            if !blob::is_valid_name(&name) || !name.starts_with(&sub_name) {
                report.warnings.push(Problem::new(
                    &path,
                    None,
                    "unexpected file in the blob store",
                ));
                continue;
            }
            report.blobs += 1;
            match crate::util::read_regular_file(&path, Some(crate::util::STORE_FILE_LIMIT)) {
                Ok(bytes) => {
                    let actual = sha256_hex(&bytes);
                    if actual != name {
                        report.blobs_corrupt += 1;
                        report.problems.push(Problem::new(
                            &path,
                            None,
                            format!("content hashes to {actual}, not to its name"),
                        ));
                    }
                }
                Err(e) => {
                    report.blobs_corrupt += 1;
                    report
                        .problems
                        .push(Problem::new(&path, None, format!("unreadable: {e}")));
                }
            }
        }
    }
    Ok(())
}

/// Follows the hash chain through a verify scan.
struct ChainCheck {
    /// Snapshot seq, its first segment and head, when there is a snapshot.
    snapshot: Option<(u64, u64, Digest32)>,
    /// Seq of `hashes[0]`; `hashes[i]` is the hash of record `base + i`. Every hash is kept so
    /// any signed head can be looked up (32 bytes a record, for a one-off check).
    base: u64,
    hashes: Vec<Digest32>,
    started: bool,
    report: ChainReport,
}

impl ChainCheck {
    fn new(snapshot: Option<(u64, u64, Digest32)>, workspace_id: Option<String>) -> ChainCheck {
        ChainCheck {
            snapshot,
            base: 0,
            hashes: vec![GENESIS],
            started: false,
            report: ChainReport {
                workspace_id,
                ..ChainReport::default()
            },
        }
    }

    /// The seq the journal must start with: 1, or the one after the snapshot when the
    /// segments before the snapshot's are gone (the chain then starts from its head).
    fn first_expected(&mut self, first_segment: Option<u64>) -> u64 {
        match (self.snapshot, first_segment) {
            (Some((seq, from, head)), Some(first)) if first > 1 && first == from => {
                self.base = seq;
                self.hashes = vec![head];
                seq + 1
            }
            _ => 1,
        }
    }

    fn hash_at(&self, seq: u64) -> Option<Digest32> {
        let i = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        self.hashes.get(i).copied()
    }

    fn record(&mut self, entry: &Entry, path: &Path, offset: u64) {
        let seq = entry.record.seq;
        if !self.started {
            self.started = true;
            self.report.verified_from = Some(self.base + 1);
        }
        if self.report.broken_at.is_none() {
            let due = self.base + self.hashes.len() as u64;
            let head = self.hashes.last().copied().unwrap_or(GENESIS);
            let reason = if seq != due {
                Some(format!("seq {seq} stands where seq {due} was due"))
            } else if entry.prev != head {
                Some(format!(
                    "prev is {}, but record {} hashes to {head}",
                    entry.prev,
                    seq - 1
                ))
            } else {
                None
            };
            match reason {
                Some(reason) => self.broke(seq, path, offset, reason),
                None => self.report.verified_to = Some(seq),
            }
        }
        if seq == self.base + self.hashes.len() as u64 {
            self.hashes.push(entry.hash);
        }
        let r = &entry.record;
        if let Some(id) = chain::declared_workspace_id(seq, &r.kind, r.payload.get()) {
            self.report.workspace_id = Some(id);
        }
        self.report.head = Some(Head {
            seq,
            hash: entry.hash.to_hex(),
        });
        if let Some(head) = signed_head(&r.payload_value()) {
            self.signature(seq, &r.kind, head);
        }
    }

    /// Damage the scan could not read past ends what the chain can vouch for.
    fn unreadable(&mut self, problem: &Problem) {
        if self.report.broken_at.is_none() {
            let seq = self.base + self.hashes.len() as u64;
            let offset = problem.offset.unwrap_or(0);
            self.broke(seq, &problem.path, offset, problem.message.clone());
        }
    }

    fn broke(&mut self, seq: u64, path: &Path, offset: u64, reason: String) {
        self.report.broken_at = Some(BreakReport {
            seq,
            segment: path.to_path_buf(),
            offset,
            reason,
        });
    }

    fn signature(&mut self, seq: u64, kind: &str, head: Head) {
        let actual = (head.seq < seq).then(|| self.hash_at(head.seq)).flatten();
        let head_matches = actual.is_some_and(|h| h.to_hex() == head.hash);
        let verified = self.report.verified_to.is_some_and(|to| to >= head.seq)
            || (head.seq == self.base && self.report.broken_at.is_none());
        let vouches_for = (head_matches && verified && head.seq > 0)
            .then_some([self.report.verified_from.unwrap_or(1), head.seq])
            .filter(|[from, to]| from <= to);
        self.report.signatures.push(SignatureReport {
            seq,
            kind: kind.to_string(),
            head,
            head_matches,
            vouches_for,
        });
    }

    fn finish(self, problems: &mut Vec<Problem>) -> ChainReport {
        if let Some(b) = &self.report.broken_at {
            let message = format!("hash chain broken at seq {}: {}", b.seq, b.reason);
            let problem = Problem::new(&b.segment, Some(b.offset), message);
            if !problems
                .iter()
                .any(|p| p.path == b.segment && p.offset == Some(b.offset))
            {
                problems.push(problem);
            }
        }
        self.report
    }
}

/// `operator_signature.head` of a payload, when it has the documented shape.
fn signed_head(payload: &serde_json::Value) -> Option<Head> {
    let head = payload.get("operator_signature")?.get("head")?;
    Some(Head {
        seq: head.get("seq")?.as_u64()?,
        hash: head.get("hash")?.as_str()?.to_string(),
    })
}
