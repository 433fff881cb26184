//! Read-only integrity check of a whole store (`gaffer store verify`).

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::segment::{self, SegmentEnd};
use super::{FORMAT_VERSION, StoreError, blob, durable, snapshot};
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
        blobs: 0,
        blobs_corrupt: 0,
        problems: Vec::new(),
        warnings: Vec::new(),
        ok: true,
    };
    if !report.exists {
        return Ok(report);
    }
    verify_journal(dir, &mut report)?;
    verify_snapshot(dir, &mut report);
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

fn verify_journal(dir: &Path, report: &mut VerifyReport) -> Result<(), StoreError> {
    let journal = dir.join("journal");
    let numbers = segment::list_segments(&journal)?;
    // The seq the next record must carry; None after damage, to resynchronise quietly.
    let mut expected: Option<u64> = Some(1);
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
        let scanned = segment::scan(&path, 0, is_last, |record, offset, _| {
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
                report.problems.push(Problem::from_error(&path, e));
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

fn verify_snapshot(dir: &Path, report: &mut VerifyReport) {
    let path = dir.join(snapshot::FILE_NAME);
    let loaded = match snapshot::load(dir) {
        Ok(Some(loaded)) => loaded,
        Ok(None) => return,
        Err(e) => {
            report.problems.push(Problem::from_error(&path, e));
            return;
        }
    };
    let seq = loaded.snapshot.seq;
    let from = loaded.journal_from;
    report.snapshot = Some(SnapshotReport {
        seq,
        journal_from: from,
        state_bytes: loaded.state_bytes,
    });
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
            match fs::read(&path) {
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
