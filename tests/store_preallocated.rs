//! A segment whose writer allocates space ahead of its appends (`Store::preallocate`, as every
//! workspace does) ends in zeros that are space never written: a write torn anywhere in it
//! opens to exactly the committed prefix, other processes see appends and nothing more, and
//! a frame placed past the zeros is corruption, never a record.

use std::fs;
use std::path::Path;

use gaffer::store::{HEADER_LEN, Record, Snapshot, Store, StoreError, verify};
use serde_json::json;

/// Space the writers of these tests allocate ahead (small, so tests cross its end).
const AHEAD: u64 = 4096;

fn rec(seq: u64) -> Record {
    Record {
        seq,
        time_ms: 1_700_000_000_000 + seq,
        kind: format!("kind.{}", seq % 3),
        payload: gaffer::store::raw_payload(
            json!({ "seq": seq, "pad": "p".repeat((seq as usize * 11) % 50) }),
        ),
    }
}

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
    Ok(got)
}

fn segment(dir: &Path, n: u64) -> std::path::PathBuf {
    dir.join("journal").join(format!("{n:06}.log"))
}

/// The bytes of a segment up to its last record, and where each record ends (index 0: the
/// header's end), as a store writing without preallocation lays them out.
fn exact_layout(dir: &Path, n: u64) -> (Vec<u8>, Vec<u64>) {
    let mut store = Store::open(dir).unwrap();
    let mut ends = vec![HEADER_LEN as u64];
    for seq in 1..=n {
        append(&mut store, seq..=seq);
        ends.push(fs::metadata(segment(dir, 1)).unwrap().len());
    }
    (fs::read(segment(dir, 1)).unwrap(), ends)
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
    let n = 8;
    let (full, ends) = exact_layout(&tmp.path().join("src"), n);
    let padded = full.len() + AHEAD as usize;
    let dst = tmp.path().join("cut");
    for cut in HEADER_LEN..=full.len() {
        if dst.exists() {
            fs::remove_dir_all(&dst).unwrap();
        }
        fs::create_dir_all(dst.join("journal")).unwrap();
        let mut bytes = full[..cut].to_vec();
        bytes.resize(padded, 0);
        fs::write(segment(&dst, 1), &bytes).unwrap();

        let whole = ends[1..].iter().filter(|e| **e <= cut as u64).count() as u64;
        let expected: Vec<u64> = (1..=whole).collect();
        let got = replay_seqs(&dst).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        assert_eq!(got, expected, "cut at {cut}");
        let mut poller = Store::open(&dst).unwrap();
        let polled: Vec<u64> = poller.poll().unwrap().iter().map(|r| r.seq).collect();
        assert_eq!(polled, expected, "poll, cut at {cut}");

        let mut store = writer(&dst);
        append(&mut store, whole + 1..=whole + 1);
        assert_eq!(
            replay_seqs(&dst).unwrap(),
            (1..=whole + 1).collect::<Vec<_>>(),
            "after repair, cut {cut}"
        );
        let report = verify(&dst).unwrap();
        assert!(report.ok, "cut {cut}: {:?}", report.problems);
        assert!(
            report.segments.iter().all(|s| s.torn_tail_at.is_none()),
            "cut {cut}: tail still torn"
        );
        assert_eq!(report.chain.verified_to, Some(whole + 1), "cut {cut}");
    }
}

/// What an agent that can write the journal might try: a frame with a valid crc placed past
/// the zeros (where a plain append would land). It is never read as a record: the segment is
/// corrupt, and nothing after the committed records is taken.
#[test]
fn a_frame_placed_past_the_zeros_is_corruption_not_a_record() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let (full, _) = exact_layout(&src, 3);
    // The frame record 4 would be, as the store itself encodes it.
    let mut store = Store::open(&src).unwrap();
    store.replay(0, |_| Ok::<(), StoreError>(())).unwrap();
    append(&mut store, 4..=4);
    let with_four = fs::read(segment(&src, 1)).unwrap();
    let frame = &with_four[full.len()..];

    let dst = tmp.path().join("dst");
    fs::create_dir_all(dst.join("journal")).unwrap();
    let mut bytes = full.clone();
    bytes.resize(full.len() + AHEAD as usize, 0);
    bytes.extend_from_slice(frame);
    fs::write(segment(&dst, 1), &bytes).unwrap();
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
}
