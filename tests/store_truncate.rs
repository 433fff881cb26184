//! A journal cut at any byte offset opens to exactly the records wholly before the cut; damage
//! before the tail is refused with the segment and offset; damage in the last record is a torn
//! tail. A segment whose writer allocates space ahead of its appends ends in zeros that are
//! space never written: a write torn anywhere in it opens to exactly the committed prefix,
//! other stores see appends and nothing more, and a frame placed past the zeros is corruption.

use std::fs;
use std::path::{Path, PathBuf};

use gaffer::store::{HEADER_LEN, Record, Snapshot, Store, StoreError, verify};
use serde_json::json;

fn rec(seq: u64) -> Record {
    // Varied sizes so boundaries fall at irregular offsets.
    Record {
        seq,
        time_ms: 1_700_000_000_000 + seq,
        kind: format!("kind.{}", seq % 3),
        payload: gaffer::store::raw_payload(
            json!({ "seq": seq, "pad": "p".repeat((seq as usize * 7) % 40) }),
        ),
    }
}

/// Builds a store of `n` records, one append each; returns the segment path and the file
/// length after each record (index k = end of record k+1; index 0 entry is the header end).
fn build(dir: &Path, n: u64) -> (PathBuf, Vec<u64>) {
    let mut store = Store::open(dir).unwrap();
    let seg = dir.join("journal").join("000001.log");
    let mut ends = vec![];
    for seq in 1..=n {
        let mut txn = store.begin().unwrap();
        if seq == 1 {
            // The segment itself appears with the first append.
            ends.push(HEADER_LEN as u64);
        }
        txn.append(&[rec(seq)]).unwrap();
        drop(txn);
        ends.push(fs::metadata(&seg).unwrap().len());
    }
    (seg, ends)
}

fn replay_seqs(dir: &Path) -> Result<Vec<u64>, StoreError> {
    let mut store = Store::open(dir)?;
    let mut got = Vec::new();
    store.replay(0, |r: Record| {
        assert_eq!(
            r,
            rec(r.seq),
            "replayed record differs from what was written"
        );
        got.push(r.seq);
        Ok::<(), StoreError>(())
    })?;
    assert_eq!(store.last_seq(), got.last().copied().unwrap_or(0));
    Ok(got)
}

/// Copies the store into `dst` with its single segment replaced by `bytes`.
fn store_with_segment(dst: &Path, bytes: &[u8]) {
    if dst.exists() {
        fs::remove_dir_all(dst).unwrap();
    }
    fs::create_dir_all(dst.join("journal")).unwrap();
    fs::write(dst.join("journal").join("000001.log"), bytes).unwrap();
}

/// After a cut at `cut`, the store in `dst` holds records 1..=`whole`: replay and a fresh
/// poll see exactly those.
fn reads_the_prefix(dst: &Path, whole: u64, cut: usize) {
    let expected: Vec<u64> = (1..=whole).collect();
    let got = replay_seqs(dst).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
    assert_eq!(got, expected, "cut at {cut}");
    // Poll from a fresh store sees the same prefix and nothing more.
    let mut poller = Store::open(dst).unwrap();
    let polled: Vec<u64> = poller.poll().unwrap().iter().map(|r| r.seq).collect();
    assert_eq!(polled, expected, "poll, cut at {cut}");
}

/// Once a writer appended record `whole + 1` after the cut prefix: all of it replays, and
/// verify finds no torn tail and one chain through the new record.
fn repaired(dst: &Path, whole: u64, cut: usize) {
    let again = replay_seqs(dst).unwrap();
    assert_eq!(
        again,
        (1..=whole + 1).collect::<Vec<_>>(),
        "after repair, cut {cut}"
    );
    let report = verify(dst).unwrap();
    assert!(report.ok, "cut {cut}: {:?}", report.problems);
    assert!(
        report.segments.iter().all(|s| s.torn_tail_at.is_none()),
        "cut {cut}: tail still torn"
    );
    // The cut prefix chains, and the repairing append chained onto it.
    assert_eq!(report.chain.broken_at, None, "cut {cut}");
    assert_eq!(report.chain.verified_to, Some(whole + 1), "cut {cut}");
}

#[test]
fn every_truncation_offset_opens_to_the_committed_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let n = 10;
    let (seg, ends) = build(&src, n);
    assert_eq!(ends[0], HEADER_LEN as u64);
    let full = fs::read(&seg).unwrap();
    assert_eq!(full.len() as u64, ends[n as usize]);

    let dst = tmp.path().join("cut");
    for cut in 0..=full.len() {
        store_with_segment(&dst, &full[..cut]);
        let whole = ends[1..].iter().filter(|e| **e <= cut as u64).count() as u64;
        reads_the_prefix(&dst, whole, cut);

        // A writer cuts the torn tail and appends after the last whole record.
        let mut store = Store::open(&dst).unwrap();
        store.replay(0, |_| Ok::<(), StoreError>(())).unwrap();
        let seg_copy = dst.join("journal").join("000001.log");
        let mut txn = store.begin().unwrap();
        let boundary = ends[whole as usize];
        assert_eq!(
            fs::metadata(&seg_copy).unwrap().len(),
            boundary,
            "torn tail not cut at {cut}"
        );
        assert_eq!(txn.next_seq(), whole + 1);
        txn.append(&[rec(whole + 1)]).unwrap();
        drop(txn);
        repaired(&dst, whole, cut);
    }
}

#[test]
fn flipped_byte_in_a_middle_record_is_refused_with_segment_and_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let (seg, ends) = build(&src, 5);
    let full = fs::read(&seg).unwrap();
    let dst = tmp.path().join("flip");
    // Every byte of record 3 (frame prefix and body).
    let (start, end) = (ends[2] as usize, ends[3] as usize);
    for at in start..end {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut bytes = full.clone();
            bytes[at] ^= mask;
            store_with_segment(&dst, &bytes);
            let err = replay_seqs(&dst).expect_err("corruption must be refused");
            match &err {
                StoreError::Corrupt {
                    segment, offset, ..
                } => {
                    assert!(segment.ends_with("journal/000001.log"), "{err}");
                    assert_eq!(*offset, start as u64, "byte {at} mask {mask:#x}: {err}");
                }
                other => panic!("byte {at}: expected Corrupt, got {other}"),
            }
            let msg = err.to_string();
            assert!(
                msg.contains("000001.log") && msg.contains(&format!("offset {start}")),
                "{msg}"
            );
            // The poller refuses too, and so does a writer (it never cuts valid records).
            let mut store = Store::open(&dst).unwrap();
            assert!(matches!(store.poll(), Err(StoreError::Corrupt { .. })));
            assert!(matches!(
                Store::open(&dst).unwrap().begin().map(drop),
                Err(StoreError::Corrupt { .. })
            ));
            assert_eq!(fs::read(dst.join("journal/000001.log")).unwrap(), bytes);
            let report = verify(&dst).unwrap();
            assert!(!report.ok);
            assert!(
                report
                    .problems
                    .iter()
                    .any(|p| p.offset == Some(start as u64)),
                "{:?}",
                report.problems
            );
        }
    }
}

#[test]
fn flipped_byte_in_the_last_record_is_a_torn_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let (seg, ends) = build(&src, 5);
    let full = fs::read(&seg).unwrap();
    let dst = tmp.path().join("flip");
    let (start, end) = (ends[4] as usize, ends[5] as usize);
    for at in start..end {
        let mut bytes = full.clone();
        bytes[at] ^= 0x5a;
        store_with_segment(&dst, &bytes);
        let got = replay_seqs(&dst).unwrap_or_else(|e| panic!("byte {at}: {e}"));
        assert_eq!(got, vec![1, 2, 3, 4], "byte {at}");
        let mut store = Store::open(&dst).unwrap();
        let mut txn = store.begin().unwrap();
        assert_eq!(txn.next_seq(), 5);
        txn.append(&[rec(5)]).unwrap();
        drop(txn);
        assert_eq!(replay_seqs(&dst).unwrap(), vec![1, 2, 3, 4, 5], "byte {at}");
    }
}

#[test]
fn damage_in_an_earlier_segment_is_corruption_even_at_its_end() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut store = Store::open(dir).unwrap();
    let mut txn = store.begin().unwrap();
    txn.append(&[rec(1), rec(2)]).unwrap();
    txn.write_snapshot(&gaffer::store::Snapshot {
        seq: 2,
        state: json!(null),
    })
    .unwrap();
    txn.append(&[rec(3)]).unwrap();
    drop(txn);
    let first = dir.join("journal/000001.log");
    let len = fs::metadata(&first).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&first)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    // Opening from the snapshot does not read segment 1 ...
    let mut reopened = Store::open(dir).unwrap();
    let mut seen = vec![];
    reopened
        .replay(2, |r| {
            seen.push(r.seq);
            Ok::<(), StoreError>(())
        })
        .unwrap();
    assert_eq!(seen, vec![3]);
    // ... but the audit trail does, and refuses the damage.
    let err = reopened
        .read_all(0, |_| Ok::<(), StoreError>(()))
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt { segment, .. } if segment.ends_with("000001.log")),
        "{err}"
    );
    assert!(!verify(dir).unwrap().ok);
}

#[test]
fn every_truncation_of_the_segment_after_a_snapshot_keeps_snapshot_and_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let mut store = Store::open(&src).unwrap();
    let mut txn = store.begin().unwrap();
    txn.append(&[rec(1), rec(2), rec(3)]).unwrap();
    txn.write_snapshot(&gaffer::store::Snapshot {
        seq: 3,
        state: json!({"folded": 3}),
    })
    .unwrap();
    drop(txn);
    let second = src.join("journal/000002.log");
    let mut ends = vec![fs::metadata(&second).unwrap().len()];
    for seq in 4..=7 {
        let mut txn = store.begin().unwrap();
        txn.append(&[rec(seq)]).unwrap();
        drop(txn);
        ends.push(fs::metadata(&second).unwrap().len());
    }
    let full = fs::read(&second).unwrap();
    let first = fs::read(src.join("journal/000001.log")).unwrap();
    let snapshot = fs::read(src.join("snapshot.json")).unwrap();

    let dst = tmp.path().join("cut");
    for cut in 0..=full.len() {
        if dst.exists() {
            fs::remove_dir_all(&dst).unwrap();
        }
        fs::create_dir_all(dst.join("journal")).unwrap();
        fs::write(dst.join("snapshot.json"), &snapshot).unwrap();
        fs::write(dst.join("journal/000001.log"), &first).unwrap();
        fs::write(dst.join("journal/000002.log"), &full[..cut]).unwrap();
        let whole = ends[1..].iter().filter(|e| **e <= cut as u64).count() as u64;

        let mut store = Store::open(&dst).unwrap();
        let snap = store.snapshot().unwrap().expect("snapshot survives");
        assert_eq!((snap.seq, snap.state), (3, json!({"folded": 3})));
        let mut later = vec![];
        let last = store
            .replay(3, |r| {
                later.push(r.seq);
                Ok::<(), StoreError>(())
            })
            .unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        assert_eq!(later, (4..4 + whole).collect::<Vec<_>>(), "cut {cut}");
        assert_eq!(last, 3 + whole);
        let mut audit = vec![];
        store
            .read_all(0, |r| {
                audit.push(r.seq);
                Ok::<(), StoreError>(())
            })
            .unwrap();
        assert_eq!(audit, (1..=3 + whole).collect::<Vec<_>>(), "cut {cut}");

        let mut txn = store.begin().unwrap();
        assert_eq!(txn.next_seq(), 4 + whole);
        txn.append(&[rec(4 + whole)]).unwrap();
        drop(txn);
        assert_eq!(
            replay_seqs(&dst).unwrap(),
            (1..=4 + whole).collect::<Vec<_>>(),
            "cut {cut}"
        );
    }
}

/// Builds a store from `batches` (sizes), one append each; returns the segment path and the
/// file length after each batch (index 0: the header end).
fn build_batches(dir: &Path, batches: &[u64]) -> (PathBuf, Vec<u64>) {
    let mut store = Store::open(dir).unwrap();
    let seg = dir.join("journal").join("000001.log");
    let mut ends = vec![];
    let mut seq = 1;
    for (i, size) in batches.iter().enumerate() {
        let mut txn = store.begin().unwrap();
        if i == 0 {
            ends.push(HEADER_LEN as u64);
        }
        let batch: Vec<Record> = (seq..seq + size).map(rec).collect();
        txn.append(&batch).unwrap();
        drop(txn);
        seq += size;
        ends.push(fs::metadata(&seg).unwrap().len());
    }
    (seg, ends)
}

#[test]
fn a_batch_is_all_or_nothing_at_every_truncation_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let sizes = [3u64, 1, 4, 2];
    let (seg, ends) = build_batches(&tmp.path().join("src"), &sizes);
    let full = fs::read(&seg).unwrap();
    let dst = tmp.path().join("cut");
    for cut in 0..=full.len() {
        store_with_segment(&dst, &full[..cut]);
        let whole_batches = ends[1..].iter().filter(|e| **e <= cut as u64).count();
        let records: u64 = sizes[..whole_batches].iter().sum();
        assert_eq!(
            replay_seqs(&dst).unwrap(),
            (1..=records).collect::<Vec<_>>(),
            "cut at {cut}"
        );
        let mut poller = Store::open(&dst).unwrap();
        assert_eq!(
            poller.poll().unwrap().len() as u64,
            records,
            "poll, cut {cut}"
        );
        let mut store = Store::open(&dst).unwrap();
        let txn = store.begin().unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        assert_eq!(
            fs::metadata(dst.join("journal/000001.log")).unwrap().len(),
            ends[whole_batches],
            "cut {cut}: the partial batch is cut whole"
        );
        assert_eq!(txn.next_seq(), records + 1);
    }
}

/// After a power loss the pages of the unacknowledged last batch may persist out of order: a
/// damaged record followed by intact records of the same batch is still a torn tail.
#[test]
fn damage_inside_the_last_batch_is_torn_but_before_a_later_batch_is_corrupt() {
    let tmp = tempfile::tempdir().unwrap();
    let (seg, ends) = build_batches(&tmp.path().join("src"), &[2, 3, 1]);
    let full = fs::read(&seg).unwrap();
    let dst = tmp.path().join("d");

    // Record 4 (middle of batch [3,4,5]) damaged, batch [6] after it: corruption.
    // Frame length of record 3 from its length word (low 30 bits) + the 8-byte prefix.
    let at3 = ends[1] as usize;
    let word = u32::from_le_bytes(full[at3..at3 + 4].try_into().unwrap());
    let rec4_at = ends[1] + 8 + u64::from(word & ((1 << 30) - 1));
    let mut bytes = full.clone();
    bytes[rec4_at as usize + 12] ^= 0x10;
    store_with_segment(&dst, &bytes);
    match replay_seqs(&dst) {
        Err(StoreError::Corrupt { offset, .. }) => assert_eq!(offset, rec4_at),
        other => panic!("expected Corrupt, got {other:?}"),
    }

    // Without the later batch, the same damage is a torn tail: the whole batch goes.
    store_with_segment(&dst, &bytes[..ends[2] as usize]);
    assert_eq!(replay_seqs(&dst).unwrap(), vec![1, 2]);
    let mut store = Store::open(&dst).unwrap();
    let mut txn = store.begin().unwrap();
    assert_eq!(
        fs::metadata(dst.join("journal/000001.log")).unwrap().len(),
        ends[1]
    );
    txn.append(&[rec(3)]).unwrap();
    drop(txn);
    assert_eq!(replay_seqs(&dst).unwrap(), vec![1, 2, 3]);

    // Its first record damaged, the later records of that batch intact: torn as well.
    let mut bytes = full[..ends[2] as usize].to_vec();
    bytes[ends[1] as usize + 9] ^= 0x01;
    store_with_segment(&dst, &bytes);
    assert_eq!(replay_seqs(&dst).unwrap(), vec![1, 2]);
}

// ----- a segment whose writer allocates space ahead (`Store::preallocate`, as every workspace
// does): the zeros after its last record are space never written --------------------------

/// Space the writers of these tests allocate ahead (small, so tests cross its end).
const AHEAD: u64 = 4096;

fn writer(dir: &Path) -> Store {
    let mut store = Store::open(dir).unwrap();
    store.replay(0, |_| Ok::<(), StoreError>(())).unwrap();
    store.preallocate(AHEAD);
    store
}

fn append(store: &mut Store, seqs: std::ops::RangeInclusive<u64>) {
    let records: Vec<Record> = seqs.map(rec).collect();
    let mut txn = store.begin().unwrap();
    txn.append(&records).unwrap();
}

fn segment(dir: &Path, n: u64) -> std::path::PathBuf {
    dir.join("journal").join(format!("{n:06}.log"))
}

/// Where the first hole of `path` starts (its length when it has none), by `SEEK_HOLE`.
fn first_hole(path: &Path) -> u64 {
    use std::os::fd::AsRawFd;
    let f = fs::File::open(path).unwrap();
    // SAFETY: lseek on a descriptor this function owns; no pointers.
    let at = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_HOLE) };
    u64::try_from(at).unwrap_or_else(|_| panic!("SEEK_HOLE: {}", std::io::Error::last_os_error()))
}

#[test]
fn appends_allocate_ahead_and_another_store_sees_them_and_nothing_more() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut a = writer(dir);
    append(&mut a, 1..=3);
    let len = fs::metadata(segment(dir, 1)).unwrap().len();
    assert!(
        len >= HEADER_LEN as u64 + AHEAD,
        "space allocated ahead: {len}"
    );
    // Written zeros, not space reserved by fallocate (an unwritten extent, which every
    // fdatasync after a write into it must convert): the file has no hole before its end.
    assert_eq!(
        first_hole(&segment(dir, 1)),
        len,
        "the space ahead is written"
    );

    let mut b = Store::open(dir).unwrap();
    let seqs = |v: Vec<Record>| v.iter().map(|r| r.seq).collect::<Vec<_>>();
    assert_eq!(seqs(b.poll().unwrap()), vec![1, 2, 3]);
    assert_eq!(seqs(b.poll().unwrap()), Vec::<u64>::new());
    // Enough appends to run past the first allocation.
    for seq in 4..=80 {
        append(&mut a, seq..=seq);
    }
    assert!(
        fs::metadata(segment(dir, 1)).unwrap().len() > len,
        "allocated again"
    );
    assert_eq!(seqs(b.poll().unwrap()), (4..=80).collect::<Vec<_>>());
    assert_eq!(seqs(b.poll().unwrap()), Vec::<u64>::new());
    // The other store writes too (taking the lock, catching up first), and the first sees it.
    b.preallocate(AHEAD);
    append(&mut b, 81..=82);
    assert_eq!(seqs(a.poll().unwrap()), vec![81, 82]);

    assert_eq!(replay_seqs(dir).unwrap(), (1..=82).collect::<Vec<_>>());
    let report = verify(dir).unwrap();
    assert!(report.ok, "{:?}", report.problems);
    assert!(report.segments.iter().all(|s| s.torn_tail_at.is_none()));
    assert_eq!(report.chain.verified_to, Some(82));
}

/// A crash while a record was being written into allocated space leaves part of it and zeros
/// where the rest should be. Every such cut (from the header on: space is allocated only by
/// appends, after the header) opens to the records wholly before it, and a writer appends
/// after them.
#[test]
fn a_write_torn_anywhere_in_allocated_space_opens_to_the_committed_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    let (seg, ends) = build(&tmp.path().join("src"), 8);
    let full = fs::read(&seg).unwrap();
    let dst = tmp.path().join("cut");
    for cut in HEADER_LEN..=full.len() {
        let mut bytes = full[..cut].to_vec();
        bytes.resize(full.len() + AHEAD as usize, 0);
        store_with_segment(&dst, &bytes);
        let whole = ends[1..].iter().filter(|e| **e <= cut as u64).count() as u64;
        reads_the_prefix(&dst, whole, cut);
        append(&mut writer(&dst), whole + 1..=whole + 1);
        repaired(&dst, whole, cut);
    }
}

/// What an agent that can write the journal might try: a frame with a valid crc placed past
/// the zeros (where a plain append would land). It is never read as a record: the segment is
/// corrupt, and nothing after the committed records is taken.
#[test]
fn a_frame_placed_past_the_zeros_is_corruption_not_a_record() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let (seg, _) = build(&src, 3);
    let full = fs::read(&seg).unwrap();
    // The frame record 4 would be, as the store itself encodes it.
    let mut store = Store::open(&src).unwrap();
    store.replay(0, |_| Ok::<(), StoreError>(())).unwrap();
    append(&mut store, 4..=4);
    let with_four = fs::read(segment(&src, 1)).unwrap();
    let frame = &with_four[full.len()..];

    let dst = tmp.path().join("dst");
    let mut bytes = full.clone();
    bytes.resize(full.len() + AHEAD as usize, 0);
    bytes.extend_from_slice(frame);
    store_with_segment(&dst, &bytes);
    match replay_seqs(&dst) {
        Err(StoreError::Corrupt { offset, .. }) => assert_eq!(offset, full.len() as u64),
        other => panic!("expected corruption at the zeros, got {other:?}"),
    }
}

/// A snapshot moves appends to a new segment; the one left behind keeps its records and
/// gives back the space allocated after them.
#[test]
fn rotation_trims_the_space_after_the_last_record() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut store = writer(dir);
    append(&mut store, 1..=5);
    let mut txn = store.begin().unwrap();
    txn.write_snapshot(&Snapshot {
        seq: 5,
        state: json!({"n": 5}),
    })
    .unwrap();
    drop(txn);
    // The same batch written without allocating ahead.
    let exact_dir = tmp.path().join("exact");
    append(&mut Store::open(&exact_dir).unwrap(), 1..=5);
    let exact = fs::read(segment(&exact_dir, 1)).unwrap();
    assert_eq!(
        fs::read(segment(dir, 1)).unwrap(),
        exact,
        "trimmed to its records"
    );
    append(&mut store, 6..=7);
    assert!(fs::metadata(segment(dir, 2)).unwrap().len() >= HEADER_LEN as u64 + AHEAD);
    let mut reopened = Store::open(dir).unwrap();
    let mut seqs = Vec::new();
    reopened
        .replay(5, |r: Record| {
            seqs.push(r.seq);
            Ok::<(), StoreError>(())
        })
        .unwrap();
    assert_eq!(seqs, vec![6, 7]);
    let report = verify(dir).unwrap();
    assert!(report.ok, "{:?}", report.problems);

    // A store that never wrote the segment it rotates away from (another process did) trims
    // the zeros written ahead all the same.
    let other = tmp.path().join("other");
    append(&mut writer(&other), 1..=5);
    let mut rotator = Store::open(&other).unwrap();
    let mut txn = rotator.begin().unwrap();
    txn.write_snapshot(&Snapshot {
        seq: 5,
        state: json!({"n": 5}),
    })
    .unwrap();
    drop(txn);
    assert_eq!(
        fs::read(segment(&other, 1)).unwrap(),
        exact,
        "trimmed by a store that held no writer for it"
    );
}

/// Where each record frame of a segment's bytes starts, and where the last one ends (frames
/// stop at the zeros of allocated space).
fn frame_starts(bytes: &[u8]) -> (Vec<usize>, usize) {
    let (mut at, mut starts) = (HEADER_LEN, Vec::new());
    while at + 4 <= bytes.len() {
        let word = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        if word == 0 {
            break;
        }
        starts.push(at);
        at += 8 + (word & ((1 << 30) - 1)) as usize;
    }
    (starts, at)
}

/// A machine crash while a batch was being written into allocated space, its pages reaching
/// the disk out of order: the batch's first record (the bytes at the cursor) is zeros, its
/// later records are there. The next writer after the restart must find and cut them: left
/// behind its appends, a second crash of the same shape would put a batch-ending record in
/// front of them, and the journal would no longer open.
#[test]
fn a_torn_batch_whose_first_page_was_lost_is_cut_by_the_next_writer() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, scratch) = (tmp.path().join("ws"), tmp.path().join("scratch"));
    let mut first = writer(&dir);
    for seq in 1..=3 {
        append(&mut first, seq..=seq);
    }
    drop(first);
    // The batch [4, 5, 6] as the writer lays it out, from a copy.
    let crash = |dir: &Path, seqs: std::ops::RangeInclusive<u64>| {
        let (_, end) = frame_starts(&fs::read(segment(dir, 1)).unwrap());
        store_with_segment(&scratch, &fs::read(segment(dir, 1)).unwrap());
        append(&mut writer(&scratch), seqs);
        let copy = fs::read(segment(&scratch, 1)).unwrap();
        let (starts, batch_end) = frame_starts(&copy);
        let second = starts.iter().copied().find(|s| *s > end).unwrap();
        let mut torn = copy[end..batch_end].to_vec();
        torn[..second - end].fill(0);
        let file = fs::OpenOptions::new()
            .write(true)
            .open(segment(dir, 1))
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, &torn, end as u64).unwrap();
    };
    crash(&dir, 4..=6);
    reads_the_prefix(&dir, 3, 0);
    // The restarted server's first commit.
    append(&mut writer(&dir), 4..=4);
    repaired(&dir, 3, 0);
    // The same crash again, after record 4: still a committed prefix.
    crash(&dir, 5..=6);
    reads_the_prefix(&dir, 4, 0);
}

/// An agent that writes the journal appends bytes crafted so that every `{"seq":` in them
/// follows a frame prefix claiming a body to the end of the file: judging whether a whole
/// record follows the damage would checksum most of the bytes again for each candidate, the
/// square of their length on every read. The store refuses them as corruption after a
/// bounded search instead, naming where they start, and cuts nothing.
#[test]
fn crafted_bytes_after_the_last_record_are_refused_without_a_search_through_each_candidate() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let (seg, _) = build(&src, 3);
    let mut bytes = fs::read(&seg).unwrap();
    let records_end = bytes.len();
    let crafted_len = 1024 * 1024;
    while bytes.len() < records_end + crafted_len {
        let claim = u32::try_from(records_end + crafted_len - bytes.len()).unwrap();
        bytes.extend_from_slice(&claim.to_le_bytes());
        bytes.extend_from_slice(&[0xAB; 4]);
        bytes.extend_from_slice(b"{\"seq\":1,");
    }
    let dst = tmp.path().join("dst");
    store_with_segment(&dst, &bytes);
    match replay_seqs(&dst) {
        Err(StoreError::Corrupt { offset, reason, .. }) => {
            assert_eq!(offset, records_end as u64);
            assert!(reason.contains("claim more records"), "{reason}");
        }
        other => panic!("expected the crafted bytes refused, got {other:?}"),
    }
    assert_eq!(fs::read(segment(&dst, 1)).unwrap(), bytes, "nothing cut");
}
