//! Unit and property tests of the store as a whole.

use super::*;
use proptest::prelude::*;
use serde_json::json;
use std::fs;
use std::path::Path;

fn rec(seq: u64) -> Record {
    Record {
        seq,
        time_ms: 1_700_000_000_000 + seq,
        kind: "test.event".into(),
        payload: crate::store::raw_payload(
            json!({ "n": seq, "text": format!("record number {seq}") }),
        ),
    }
}

fn append_n(store: &mut Store, n: u64) {
    let mut txn = store.begin().unwrap();
    let start = txn.next_seq();
    let batch: Vec<Record> = (start..start + n).map(rec).collect();
    txn.append(&batch).unwrap();
}

fn replay_all(store: &mut Store, after: u64) -> Vec<Record> {
    let mut out = Vec::new();
    store
        .replay(after, |r| {
            out.push(r);
            Ok::<(), StoreError>(())
        })
        .unwrap();
    out
}

fn read_all(store: &Store, after: u64) -> Vec<Record> {
    let mut out = Vec::new();
    store
        .read_all(after, |r| {
            out.push(r);
            Ok::<(), StoreError>(())
        })
        .unwrap();
    out
}

fn seqs(records: &[Record]) -> Vec<u64> {
    records.iter().map(|r| r.seq).collect()
}

#[test]
fn missing_dir_is_an_empty_store_and_open_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(".gaffer");
    let mut store = Store::open(&dir).unwrap();
    assert_eq!(store.last_seq(), 0);
    assert!(store.snapshot().unwrap().is_none());
    assert!(replay_all(&mut store, 0).is_empty());
    assert!(store.poll().unwrap().is_empty());
    assert!(!dir.exists(), "open/replay/poll must not create the store");
}

#[test]
fn begin_creates_layout_with_gitignore() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(".gaffer");
    let mut store = Store::open(&dir).unwrap();
    append_n(&mut store, 1);
    assert_eq!(fs::read_to_string(dir.join(".gitignore")).unwrap(), "*\n");
    assert!(dir.join("lock").is_file());
    let seg = dir.join("journal/000001.log");
    let bytes = fs::read(&seg).unwrap();
    assert_eq!(&bytes[..HEADER_LEN], &codec::header());
}

#[test]
fn appended_records_replay_in_order_after_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = Store::open(tmp.path()).unwrap();
    append_n(&mut store, 3);
    append_n(&mut store, 2);
    assert_eq!(store.last_seq(), 5);
    let mut reopened = Store::open(tmp.path()).unwrap();
    let got = replay_all(&mut reopened, 0);
    assert_eq!(got, (1..=5).map(rec).collect::<Vec<_>>());
    assert_eq!(reopened.last_seq(), 5);
    assert_eq!(seqs(&replay_all(&mut reopened, 3)), vec![4, 5]);
}

#[test]
fn non_contiguous_append_is_refused_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = Store::open(tmp.path()).unwrap();
    append_n(&mut store, 2);
    let seg = tmp.path().join("journal/000001.log");
    let before = fs::read(&seg).unwrap();
    let mut txn = store.begin().unwrap();
    assert_eq!(txn.next_seq(), 3);
    for bad in [
        vec![rec(2)],
        vec![rec(4)],
        vec![rec(3), rec(5)],
        vec![rec(3), rec(3)],
    ] {
        match txn.append(&bad) {
            Err(e @ StoreError::NonContiguous { .. }) => {
                assert!(e.to_string().contains("nothing was written"), "{e}")
            }
            other => panic!("expected NonContiguous for {:?}, got {other:?}", seqs(&bad)),
        }
    }
    assert_eq!(fs::read(&seg).unwrap(), before);
    txn.append(&[rec(3)]).unwrap();
    drop(txn);
    assert_eq!(
        seqs(&replay_all(&mut Store::open(tmp.path()).unwrap(), 0)),
        vec![1, 2, 3]
    );
}

#[test]
fn oversized_record_is_refused_before_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = Store::open(tmp.path()).unwrap();
    let mut txn = store.begin().unwrap();
    let big = Record {
        payload: crate::store::raw_payload(serde_json::Value::String("x".repeat(MAX_RECORD_BODY))),
        ..rec(2)
    };
    assert!(matches!(
        txn.append(&[rec(1), big]),
        Err(StoreError::RecordTooLarge { seq: 2, .. })
    ));
    assert_eq!(txn.next_seq(), 1);
    drop(txn);
    assert!(!tmp.path().join("journal").exists(), "nothing was written");
}

#[test]
fn a_transaction_that_appends_nothing_creates_no_journal() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(".gaffer");
    let mut store = Store::open(&dir).unwrap();
    drop(store.begin().unwrap());
    assert!(dir.join("lock").is_file() && dir.join(".gitignore").is_file());
    assert!(!dir.join("journal").exists());
    assert!(Store::open(&dir).unwrap().poll().unwrap().is_empty());
    let report = verify(&dir).unwrap();
    assert!(report.ok && report.segments.is_empty());
    // The first append creates journal/ and the first segment.
    let mut txn = store.begin().unwrap();
    txn.append(&[rec(1)]).unwrap();
    drop(txn);
    assert_eq!(
        seqs(&replay_all(&mut Store::open(&dir).unwrap(), 0)),
        vec![1]
    );
}

/// A store of one record whose segment header claims format `version`.
fn store_with_segment_version(version: u32) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = Store::open(tmp.path()).unwrap();
    append_n(&mut store, 1);
    let seg = tmp.path().join("journal/000001.log");
    let mut bytes = fs::read(&seg).unwrap();
    bytes[8..12].copy_from_slice(&version.to_le_bytes());
    fs::write(&seg, &bytes).unwrap();
    tmp
}

#[test]
fn unchained_format_1_segment_is_refused_as_outdated() {
    let tmp = store_with_segment_version(1);
    match Store::open(tmp.path()) {
        Err(e @ StoreError::OutdatedVersion { found: 1, .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("000001.log") && msg.contains("older gaffer"),
                "{msg}"
            );
        }
        other => panic!("expected OutdatedVersion, got {other:?}"),
    }
}

#[test]
fn newer_segment_version_is_refused_on_open() {
    let tmp = store_with_segment_version(7);
    match Store::open(tmp.path()) {
        Err(
            e @ StoreError::UnsupportedVersion {
                found: 7,
                supported: FORMAT_VERSION,
                ..
            },
        ) => {
            let msg = e.to_string();
            assert!(
                msg.contains("000001.log") && msg.contains("version 7"),
                "{msg}"
            );
        }
        other => panic!("expected UnsupportedVersion, got {other:?}"),
    }
}

#[test]
fn newer_snapshot_version_is_refused_on_open() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(
        tmp.path().join("snapshot.json"),
        br#"{"format":3,"seq":1,"whatever":[]}"#,
    )
    .unwrap();
    assert!(matches!(
        Store::open(tmp.path()),
        Err(StoreError::UnsupportedVersion { found: 3, .. })
    ));
}

#[test]
fn foreign_file_as_segment_is_corrupt() {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir_all(tmp.path().join("journal")).unwrap();
    fs::write(
        tmp.path().join("journal/000001.log"),
        b"this is not a journal at all",
    )
    .unwrap();
    assert!(matches!(
        Store::open(tmp.path()),
        Err(StoreError::Corrupt { offset: 0, .. })
    ));
}

#[test]
fn poll_and_take_new_see_other_writers() {
    let tmp = tempfile::tempdir().unwrap();
    let mut a = Store::open(tmp.path()).unwrap();
    let mut b = Store::open(tmp.path()).unwrap();
    append_n(&mut a, 2);
    assert_eq!(seqs(&b.poll().unwrap()), vec![1, 2]);
    assert!(b.poll().unwrap().is_empty(), "poll does not repeat records");
    append_n(&mut a, 1);
    {
        let mut txn = b.begin().unwrap();
        assert_eq!(seqs(&txn.take_new().unwrap()), vec![3]);
        assert!(txn.take_new().unwrap().is_empty());
        assert_eq!(txn.next_seq(), 4);
        txn.append(&[rec(4)]).unwrap();
    }
    assert_eq!(seqs(&a.poll().unwrap()), vec![4]);
    assert!(
        b.poll().unwrap().is_empty(),
        "own appends are not polled back"
    );
}

#[test]
fn records_caught_up_by_begin_but_not_taken_are_polled_later() {
    let tmp = tempfile::tempdir().unwrap();
    let mut a = Store::open(tmp.path()).unwrap();
    let mut b = Store::open(tmp.path()).unwrap();
    append_n(&mut a, 2);
    drop(b.begin().unwrap());
    assert_eq!(b.last_seq(), 2);
    assert_eq!(seqs(&b.poll().unwrap()), vec![1, 2]);
}

#[test]
fn poll_ignores_an_incomplete_tail_until_it_is_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let mut writer = Store::open(tmp.path()).unwrap();
    append_n(&mut writer, 1);
    let mut reader = Store::open(tmp.path()).unwrap();
    assert_eq!(seqs(&reader.poll().unwrap()), vec![1]);
    // Simulate a write in progress: half a frame at the end.
    let seg = tmp.path().join("journal/000001.log");
    let frame = codec::encode(&rec(2)).unwrap();
    let mut bytes = fs::read(&seg).unwrap();
    let whole_len = bytes.len();
    bytes.extend_from_slice(&frame[..frame.len() / 2]);
    fs::write(&seg, &bytes).unwrap();
    assert!(reader.poll().unwrap().is_empty());
    bytes.truncate(whole_len);
    bytes.extend_from_slice(&frame);
    fs::write(&seg, &bytes).unwrap();
    assert_eq!(seqs(&reader.poll().unwrap()), vec![2]);
}

#[test]
fn begin_cuts_a_torn_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = Store::open(tmp.path()).unwrap();
    append_n(&mut store, 2);
    let seg = tmp.path().join("journal/000001.log");
    let good_len = fs::metadata(&seg).unwrap().len();
    let frame = codec::encode(&rec(3)).unwrap();
    let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
    f.write_all(&frame[..frame.len() - 1]).unwrap();
    drop(f);
    let mut reopened = Store::open(tmp.path()).unwrap();
    assert_eq!(seqs(&replay_all(&mut reopened, 0)), vec![1, 2]);
    assert_eq!(
        fs::metadata(&seg).unwrap().len(),
        good_len + frame.len() as u64 - 1,
        "open and replay never truncate"
    );
    let mut txn = reopened.begin().unwrap();
    assert_eq!(fs::metadata(&seg).unwrap().len(), good_len);
    txn.append(&[rec(3)]).unwrap();
    drop(txn);
    assert_eq!(
        seqs(&replay_all(&mut Store::open(tmp.path()).unwrap(), 0)),
        vec![1, 2, 3]
    );
}

#[test]
fn snapshot_rotates_and_reopen_uses_snapshot_plus_later_records() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = Store::open(tmp.path()).unwrap();
    append_n(&mut store, 3);
    store
        .write_snapshot(&Snapshot {
            seq: 3,
            state: json!({"count": 3}),
        })
        .unwrap();
    assert!(tmp.path().join("journal/000002.log").is_file());
    append_n(&mut store, 2);

    let mut reopened = Store::open(tmp.path()).unwrap();
    let snap = reopened.snapshot().unwrap().expect("snapshot");
    assert_eq!(snap.seq, 3);
    assert_eq!(snap.state, json!({"count": 3}));
    assert_eq!(reopened.last_seq(), 3);
    assert_eq!(seqs(&replay_all(&mut reopened, snap.seq)), vec![4, 5]);
    assert_eq!(reopened.last_seq(), 5);
    // Below the snapshot, replay reads the old segments too.
    assert_eq!(seqs(&replay_all(&mut reopened, 1)), vec![2, 3, 4, 5]);
    // The audit trail keeps everything.
    assert_eq!(seqs(&read_all(&reopened, 0)), vec![1, 2, 3, 4, 5]);
    assert_eq!(seqs(&read_all(&reopened, 4)), vec![5]);

    // A second snapshot with nothing after it does not pile up empty segments.
    reopened
        .write_snapshot(&Snapshot {
            seq: 5,
            state: json!({"count": 5}),
        })
        .unwrap();
    reopened
        .write_snapshot(&Snapshot {
            seq: 5,
            state: json!({"count": 5}),
        })
        .unwrap();
    assert_eq!(
        segment::list_segments(&tmp.path().join("journal")).unwrap(),
        vec![1, 2, 3]
    );
    let mut again = Store::open(tmp.path()).unwrap();
    assert!(replay_all(&mut again, 5).is_empty());
    append_n(&mut again, 1);
    assert_eq!(seqs(&read_all(&again, 0)), vec![1, 2, 3, 4, 5, 6]);
}

#[test]
fn snapshot_not_at_tail_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let mut a = Store::open(tmp.path()).unwrap();
    let mut b = Store::open(tmp.path()).unwrap();
    append_n(&mut a, 2);
    // b has not seen a's records: its state would be stale.
    match b.write_snapshot(&Snapshot {
        seq: 0,
        state: json!({}),
    }) {
        Err(StoreError::SnapshotNotAtTail {
            snapshot_seq: 0,
            last_seq: 2,
        }) => {}
        other => panic!("expected SnapshotNotAtTail, got {other:?}"),
    }
    assert!(!tmp.path().join("snapshot.json").exists());
    assert_eq!(
        seqs(&b.poll().unwrap()),
        vec![1, 2],
        "caught-up records are not lost"
    );
}

#[test]
fn crash_between_snapshot_temp_write_and_rename_keeps_old_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = Store::open(tmp.path()).unwrap();
    append_n(&mut store, 2);
    store
        .write_snapshot(&Snapshot {
            seq: 2,
            state: json!("old"),
        })
        .unwrap();
    append_n(&mut store, 1);
    // The first half of a snapshot write, then the "crash": no rename.
    let newer = snapshot::encode(
        &RawSnapshot::from_value(&Snapshot {
            seq: 3,
            state: json!("new"),
        })
        .unwrap(),
        3,
        GENESIS,
        None,
    )
    .unwrap();
    let tmp_file = durable::write_temp(&tmp.path().join(snapshot::FILE_NAME), &newer).unwrap();
    assert!(tmp_file.exists());

    let mut reopened = Store::open(tmp.path()).unwrap();
    let snap = reopened.snapshot().unwrap().unwrap();
    assert_eq!((snap.seq, snap.state), (2, json!("old")));
    assert_eq!(seqs(&replay_all(&mut reopened, 2)), vec![3]);
    let report = verify(tmp.path()).unwrap();
    assert!(report.ok, "{:?}", report.problems);
    assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);

    // The next snapshot write clears the leftover.
    reopened
        .write_snapshot(&Snapshot {
            seq: 3,
            state: json!("new"),
        })
        .unwrap();
    assert!(!tmp_file.exists());
}

#[test]
fn crash_between_rotation_and_snapshot_keeps_every_record() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = Store::open(tmp.path()).unwrap();
    append_n(&mut store, 2);
    // Rotation happened, the snapshot was never written.
    segment::create_segment(&tmp.path().join("journal"), 2).unwrap();
    let mut reopened = Store::open(tmp.path()).unwrap();
    assert_eq!(seqs(&replay_all(&mut reopened, 0)), vec![1, 2]);
    append_n(&mut reopened, 1);
    assert_eq!(seqs(&read_all(&reopened, 0)), vec![1, 2, 3]);
    let newest = fs::metadata(tmp.path().join("journal/000002.log")).unwrap();
    assert!(
        newest.len() > HEADER_LEN as u64,
        "appends go to the newest segment"
    );
}

#[test]
fn corrupt_snapshot_is_refused_with_its_path() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = Store::open(tmp.path()).unwrap();
    append_n(&mut store, 1);
    store
        .write_snapshot(&Snapshot {
            seq: 1,
            state: json!({"k": "value"}),
        })
        .unwrap();
    let path = tmp.path().join("snapshot.json");
    let text = fs::read_to_string(&path).unwrap().replace("value", "valuf");
    fs::write(&path, text).unwrap();
    match Store::open(tmp.path()) {
        Err(e @ StoreError::SnapshotCorrupt { .. }) => {
            assert!(e.to_string().contains("snapshot.json"), "{e}")
        }
        other => panic!("expected SnapshotCorrupt, got {other:?}"),
    }
}

#[test]
fn seq_gap_inside_journal_is_corruption() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = Store::open(tmp.path()).unwrap();
    append_n(&mut store, 1);
    // Forge a record with a gap directly into the segment.
    let seg = tmp.path().join("journal/000001.log");
    let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
    f.write_all(&codec::encode(&rec(5)).unwrap()).unwrap();
    drop(f);
    let mut reopened = Store::open(tmp.path()).unwrap();
    let err = reopened
        .replay(0, |_| Ok::<(), StoreError>(()))
        .unwrap_err();
    match &err {
        StoreError::Corrupt {
            segment,
            offset,
            reason,
        } => {
            assert!(segment.ends_with("000001.log"));
            assert!(*offset > HEADER_LEN as u64);
            assert!(reason.contains("seq 5"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let report = verify(tmp.path()).unwrap();
    assert!(!report.ok);
    assert_eq!(report.records, 2);
}

#[test]
fn replay_callback_errors_propagate_and_keep_cursor_consistent() {
    #[derive(Debug)]
    enum AppError {
        Store(#[allow(dead_code)] StoreError),
        Stop(u64),
    }
    impl From<StoreError> for AppError {
        fn from(e: StoreError) -> Self {
            AppError::Store(e)
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut store = Store::open(tmp.path()).unwrap();
    append_n(&mut store, 5);
    let mut reopened = Store::open(tmp.path()).unwrap();
    let err = reopened
        .replay(0, |r| {
            if r.seq == 3 {
                Err(AppError::Stop(3))
            } else {
                Ok(())
            }
        })
        .unwrap_err();
    assert!(matches!(err, AppError::Stop(3)));
    assert_eq!(reopened.last_seq(), 2);
    assert_eq!(seqs(&reopened.poll().unwrap()), vec![3, 4, 5]);
}

#[test]
fn verify_reports_a_clean_store_and_finds_damage() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = Store::open(tmp.path()).unwrap();
    append_n(&mut store, 4);
    store
        .write_snapshot(&Snapshot {
            seq: 4,
            state: json!({}),
        })
        .unwrap();
    append_n(&mut store, 2);
    let hex = store.put_blob(b"bundle bytes").unwrap();
    let report = verify(tmp.path()).unwrap();
    assert!(report.ok, "{:?}", report.problems);
    assert_eq!(report.records, 6);
    assert_eq!((report.first_seq, report.last_seq), (Some(1), Some(6)));
    assert_eq!(report.segments.len(), 2);
    assert_eq!(
        report.snapshot.as_ref().map(|s| (s.seq, s.journal_from)),
        Some((4, 2))
    );
    assert_eq!((report.blobs, report.blobs_corrupt), (1, 0));
    serde_json::to_string(&report).unwrap();

    // Damage: flip a byte inside the first record of the first segment, and tamper a blob.
    let seg = tmp.path().join("journal/000001.log");
    let mut bytes = fs::read(&seg).unwrap();
    bytes[HEADER_LEN + 12] ^= 0x01;
    fs::write(&seg, &bytes).unwrap();
    fs::write(blob::blob_path(tmp.path(), &hex).unwrap(), b"tampered").unwrap();
    let report = verify(tmp.path()).unwrap();
    assert!(!report.ok);
    assert_eq!(report.blobs_corrupt, 1);
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.path == seg && p.offset == Some(HEADER_LEN as u64)),
        "{:?}",
        report.problems
    );
}

#[test]
fn verify_of_missing_dir_is_empty_and_ok() {
    let tmp = tempfile::tempdir().unwrap();
    let report = verify(&tmp.path().join("nope")).unwrap();
    assert!(report.ok && !report.exists);
}

#[test]
fn store_blobs_roundtrip_and_detect_corruption() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(".gaffer");
    let store = Store::open(&dir).unwrap();
    let hex = store.put_blob(b"content").unwrap();
    assert_eq!(fs::read_to_string(dir.join(".gitignore")).unwrap(), "*\n");
    assert_eq!(store.get_blob(&hex).unwrap(), b"content");
    fs::write(blob::blob_path(&dir, &hex).unwrap(), b"contenT").unwrap();
    assert!(matches!(
        store.get_blob(&hex),
        Err(StoreError::BlobCorrupt { .. })
    ));
    assert!(matches!(
        store.get_blob("not-hex"),
        Err(StoreError::InvalidBlobName { .. })
    ));
}

// ---- property tests ----

fn arb_json() -> impl Strategy<Value = serde_json::Value> {
    // Floats are limited to values with short exact decimal forms: serde_json's default
    // (non float_roundtrip) parser is not guaranteed to round-trip every f64 bit pattern.
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        (-1_000_000i32..1_000_000).prop_map(|n| json!(f64::from(n) / 4.0)),
        ".*".prop_map(serde_json::Value::String),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            prop::collection::btree_map(".*", inner, 0..6)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arb_record_body() -> impl Strategy<Value = (u64, String, serde_json::Value)> {
    (any::<u64>(), ".*", arb_json())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn prop_codec_roundtrip(seq in any::<u64>(), (time_ms, kind, payload) in arb_record_body()) {
        let record = Record { seq, time_ms, kind, payload: crate::store::raw_payload(payload) };
        let bytes = codec::encode(&record).unwrap();
        match codec::decode(&bytes) {
            codec::Frame::Whole { entry, len, .. } => {
                prop_assert_eq!(entry.record, record);
                prop_assert_eq!(len, bytes.len());
            }
            other => prop_assert!(false, "not whole: {:?}", other),
        }
    }

    #[test]
    fn prop_batches_replay_equal(
        batches in prop::collection::vec(prop::collection::vec(arb_record_body(), 1..5), 1..6),
        snapshot_after in prop::option::of(0usize..6),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = Store::open(tmp.path()).unwrap();
        let mut expected = Vec::new();
        for (i, batch) in batches.into_iter().enumerate() {
            let mut txn = store.begin().unwrap();
            let next = txn.next_seq();
            let records: Vec<Record> = batch
                .into_iter()
                .enumerate()
                .map(|(j, (time_ms, kind, payload))| Record { seq: next + j as u64, time_ms, kind, payload: crate::store::raw_payload(payload) })
                .collect();
            txn.append(&records).unwrap();
            expected.extend(records);
            if snapshot_after == Some(i) {
                let seq = txn.next_seq() - 1;
                txn.write_snapshot(&Snapshot { seq, state: json!({"upto": seq}) }).unwrap();
            }
        }
        let mut reopened = Store::open(tmp.path()).unwrap();
        prop_assert_eq!(replay_all(&mut reopened, 0), expected.clone());
        prop_assert_eq!(read_all(&reopened, 0), expected.clone());
        let snap_seq = reopened.snapshot().unwrap().map_or(0, |s| s.seq);
        let mut fresh = Store::open(tmp.path()).unwrap();
        let after: Vec<Record> = expected.iter().filter(|r| r.seq > snap_seq).cloned().collect();
        prop_assert_eq!(replay_all(&mut fresh, snap_seq), after);
        prop_assert!(verify(tmp.path()).unwrap().ok);
    }

    #[test]
    fn prop_garbage_never_panics_the_reader(
        with_header in any::<bool>(),
        prefix_records in 0u64..3,
        garbage in prop::collection::vec(any::<u8>(), 0..600),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let journal = tmp.path().join("journal");
        fs::create_dir_all(&journal).unwrap();
        let mut bytes = Vec::new();
        if with_header {
            bytes.extend_from_slice(&codec::header());
            for seq in 1..=prefix_records {
                bytes.extend(codec::encode(&rec(seq)).unwrap());
            }
        }
        bytes.extend_from_slice(&garbage);
        fs::write(journal.join("000001.log"), &bytes).unwrap();
        fs::write(journal.join("000002.log"), &garbage).unwrap();
        if let Ok(mut store) = Store::open(tmp.path()) {
            let _ = store.replay(0, |_| Ok::<(), StoreError>(()));
            let _ = store.poll();
        }
        let _ = verify(tmp.path());
        // Alone as the last segment, garbage after whole records is a torn tail at worst.
        fs::remove_file(journal.join("000002.log")).unwrap();
        if let Ok(mut store) = Store::open(tmp.path()) {
            let mut n = 0;
            match store.replay(0, |_| { n += 1; Ok::<(), StoreError>(()) }) {
                Ok(_) => {
                    let floor = if with_header { prefix_records } else { 0 };
                    prop_assert!(n >= floor, "{} records replayed, {} expected at least", n, floor);
                }
                Err(StoreError::Corrupt { .. }) => {}
                Err(e) => prop_assert!(false, "unexpected error {}", e),
            }
        }
    }
}

/// A segment larger than the scanner's read buffer, with records straddling buffer edges.
#[test]
fn large_segment_replays_and_damage_is_still_located() {
    let big = |seq: u64| Record {
        payload: crate::store::raw_payload(
            json!({ "pad": "z".repeat(7000 + (seq as usize * 13) % 3000) }),
        ),
        ..rec(seq)
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut store = Store::open(tmp.path()).unwrap();
    let n = 1500u64;
    let mut txn = store.begin().unwrap();
    for chunk in (1..=n).collect::<Vec<_>>().chunks(100) {
        txn.append(&chunk.iter().copied().map(big).collect::<Vec<_>>())
            .unwrap();
    }
    drop(txn);
    let seg = tmp.path().join("journal/000001.log");
    assert!(fs::metadata(&seg).unwrap().len() > 2 * 4 * 1024 * 1024);
    let got = replay_all(&mut Store::open(tmp.path()).unwrap(), 0);
    assert_eq!(got.len() as u64, n);
    assert!(got.iter().zip(1..).all(|(r, s)| *r == big(s)));

    // Damage one record in the middle: the error names its offset.
    let pristine = fs::read(&seg).unwrap();
    let mut offset = HEADER_LEN;
    for seq in 1..n / 2 + 10 {
        offset += codec::encode(&big(seq)).unwrap().len();
    }
    let mut bytes = pristine.clone();
    bytes[offset + 20] ^= 0x04;
    fs::write(&seg, &bytes).unwrap();
    match Store::open(tmp.path())
        .unwrap()
        .replay(0, |_| Ok::<(), StoreError>(()))
    {
        Err(StoreError::Corrupt { offset: at, .. }) => assert_eq!(at, offset as u64),
        other => panic!("expected Corrupt, got {other:?}"),
    }

    // A torn tail after many records is ignored.
    let mut bytes = pristine;
    bytes.extend_from_slice(&codec::encode(&big(n + 1)).unwrap()[..5000]);
    fs::write(&seg, &bytes).unwrap();
    let mut reopened = Store::open(tmp.path()).unwrap();
    assert_eq!(replay_all(&mut reopened, 0).len() as u64, n);
    assert_eq!(reopened.last_seq(), n);
}

#[test]
fn poll_and_begin_follow_rotation_by_another_store() {
    let tmp = tempfile::tempdir().unwrap();
    let mut a = Store::open(tmp.path()).unwrap();
    let mut b = Store::open(tmp.path()).unwrap();
    append_n(&mut a, 2);
    assert_eq!(seqs(&b.poll().unwrap()), vec![1, 2]);
    // a rotates; segment 1 is unchanged, so only the next segment's existence tells b.
    a.write_snapshot(&Snapshot {
        seq: 2,
        state: json!(2),
    })
    .unwrap();
    assert!(b.poll().unwrap().is_empty());
    append_n(&mut a, 1);
    assert_eq!(seqs(&b.poll().unwrap()), vec![3]);
    a.write_snapshot(&Snapshot {
        seq: 3,
        state: json!(3),
    })
    .unwrap();
    append_n(&mut a, 1);
    {
        let mut txn = b.begin().unwrap();
        assert_eq!(seqs(&txn.take_new().unwrap()), vec![4]);
        txn.append(&[rec(5)]).unwrap();
    }
    assert_eq!(seqs(&a.poll().unwrap()), vec![5]);
    assert_eq!(
        segment::list_segments(&tmp.path().join("journal")).unwrap(),
        vec![1, 2, 3]
    );
    assert_eq!(seqs(&read_all(&b, 0)), vec![1, 2, 3, 4, 5]);
}

#[test]
fn transactions_reuse_the_lock_and_release_it_on_drop() {
    let tmp = tempfile::tempdir().unwrap();
    let mut a = Store::open(tmp.path()).unwrap();
    append_n(&mut a, 1);
    let txn = a.begin().unwrap();
    // While a holds the lock, another handle cannot take it.
    let other = File::open(tmp.path().join("lock")).unwrap();
    assert!(other.try_lock().is_err());
    let mut b = Store::open(tmp.path()).unwrap();
    assert!(b.try_begin().unwrap().is_none(), "try_begin does not wait");
    drop(txn);
    {
        let mut txn = b.try_begin().unwrap().expect("lock is free now");
        assert_eq!(seqs(&txn.take_new().unwrap()), vec![1]);
        assert!(other.try_lock().is_err());
    }
    other.try_lock().unwrap();
    other.unlock().unwrap();
    // A failed catch-up releases the lock too.
    let seg = tmp.path().join("journal/000001.log");
    let mut bytes = fs::read(&seg).unwrap();
    bytes.extend(codec::encode(&rec(7)).unwrap());
    bytes.extend(codec::encode(&rec(8)).unwrap());
    fs::write(&seg, &bytes).unwrap();
    assert!(matches!(
        a.begin().map(drop),
        Err(StoreError::Corrupt { .. })
    ));
    other.try_lock().unwrap();
}

/// Large reads run the parser on a helper thread; a failing callback must still stop the read
/// at the right record and leave the cursor right after the last accepted one.
#[test]
fn callback_error_during_a_large_replay_stops_at_that_record() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = Store::open(tmp.path()).unwrap();
    let n = 30_000u64;
    let mut txn = store.begin().unwrap();
    for chunk in (1..=n).collect::<Vec<_>>().chunks(7) {
        txn.append(&chunk.iter().copied().map(rec).collect::<Vec<_>>())
            .unwrap();
    }
    drop(txn);
    assert!(
        fs::metadata(tmp.path().join("journal/000001.log"))
            .unwrap()
            .len()
            > 2 << 20
    );
    #[derive(Debug, PartialEq)]
    enum Fold {
        Stop,
        Store(String),
    }
    impl From<StoreError> for Fold {
        fn from(e: StoreError) -> Self {
            Fold::Store(e.to_string())
        }
    }
    let mut reopened = Store::open(tmp.path()).unwrap();
    let mut seen = 0u64;
    let err = reopened.replay(0, |r| {
        if r.seq == 12_345 {
            return Err(Fold::Stop);
        }
        seen += 1;
        assert_eq!(r.seq, seen);
        Ok(())
    });
    assert_eq!(err, Err(Fold::Stop));
    assert_eq!(seen, 12_344);
    assert_eq!(reopened.last_seq(), 12_344);
    let rest = reopened.poll().unwrap();
    assert_eq!(rest.len() as u64, n - 12_344);
    assert_eq!(rest.first().map(|r| r.seq), Some(12_345));
    assert_eq!(reopened.last_seq(), n);
}

#[test]
fn store_types_cross_threads() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync + 'static>() {}
    send::<Store>();
    send_sync::<StoreError>();
    send_sync::<Record>();
    send_sync::<Snapshot>();
}

#[test]
fn nested_layout_is_created_level_by_level() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a/b/.gaffer");
    let store = Store::open(&dir).unwrap();
    let hex = store.put_blob(b"x").unwrap();
    assert!(
        dir.join("blobs/sha256")
            .join(&hex[..2])
            .join(&hex)
            .is_file()
    );
    assert!(!durable::ensure_dir(&dir).unwrap());
}

#[derive(Debug, Clone)]
enum Op {
    Append { who: usize, n: u64 },
    Poll { who: usize },
    Snapshot { who: usize },
    Reopen { who: usize },
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..2, 1u64..4).prop_map(|(who, n)| Op::Append { who, n }),
        3 => (0usize..2).prop_map(|who| Op::Poll { who }),
        1 => (0usize..2).prop_map(|who| Op::Snapshot { who }),
        1 => (0usize..2).prop_map(|who| Op::Reopen { who }),
    ]
}

/// A Store plus every seq it has been handed (replay, poll, take_new) or appended itself.
struct Peer {
    store: Store,
    seen: Vec<u64>,
}

impl Peer {
    fn open(dir: &Path) -> Peer {
        let mut store = Store::open(dir).unwrap();
        let after = store.snapshot().unwrap().map_or(0, |s| s.seq);
        let mut seen: Vec<u64> = (1..=after).collect();
        store
            .replay(after, |r| {
                seen.push(r.seq);
                Ok::<(), StoreError>(())
            })
            .unwrap();
        Peer { store, seen }
    }

    fn check(&self, journal_len: u64) -> Result<(), TestCaseError> {
        let want: Vec<u64> = (1..=self.seen.len() as u64).collect();
        prop_assert_eq!(&self.seen, &want, "seen seqs must be 1..=k, in order, once");
        prop_assert!(self.seen.len() as u64 <= journal_len);
        prop_assert_eq!(self.store.last_seq(), self.seen.len() as u64);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Two Stores on one directory, interleaving appends, polls, snapshots and reopens: each
    /// sees every record exactly once and in order, and the journal stays contiguous.
    #[test]
    fn prop_two_stores_interleaved(ops in prop::collection::vec(arb_op(), 1..30)) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut peers = [Peer::open(dir), Peer::open(dir)];
        let mut journal_len = 0u64;
        for op in ops {
            match op {
                Op::Append { who, n } => {
                    let peer = &mut peers[who];
                    let mut txn = peer.store.begin().unwrap();
                    peer.seen.extend(txn.take_new().unwrap().iter().map(|r| r.seq));
                    let next = txn.next_seq();
                    prop_assert_eq!(next, journal_len + 1);
                    txn.append(&(next..next + n).map(rec).collect::<Vec<_>>()).unwrap();
                    drop(txn);
                    peer.seen.extend(next..next + n);
                    journal_len += n;
                }
                Op::Poll { who } => {
                    let peer = &mut peers[who];
                    peer.seen.extend(peer.store.poll().unwrap().iter().map(|r| r.seq));
                    prop_assert_eq!(peer.seen.len() as u64, journal_len);
                }
                Op::Snapshot { who } => {
                    let peer = &mut peers[who];
                    let mut txn = peer.store.begin().unwrap();
                    peer.seen.extend(txn.take_new().unwrap().iter().map(|r| r.seq));
                    let seq = txn.next_seq() - 1;
                    txn.write_snapshot(&Snapshot { seq, state: json!({ "upto": seq }) }).unwrap();
                }
                Op::Reopen { who } => peers[who] = Peer::open(dir),
            }
            for peer in &peers {
                peer.check(journal_len)?;
            }
        }
        for peer in &mut peers {
            peer.seen.extend(peer.store.poll().unwrap().iter().map(|r| r.seq));
            prop_assert_eq!(peer.seen.len() as u64, journal_len);
            peer.check(journal_len)?;
        }
        let fresh = Peer::open(dir);
        prop_assert_eq!(fresh.seen.len() as u64, journal_len);
        if let Some(snap) = fresh.store.snapshot().unwrap() {
            prop_assert_eq!(snap.state, json!({ "upto": snap.seq }));
        }
        prop_assert_eq!(seqs(&read_all(&fresh.store, 0)), (1..=journal_len).collect::<Vec<_>>());
        let report = verify(dir).unwrap();
        prop_assert!(report.ok, "{:?}", report.problems);
        // Every appender chained onto what the others wrote, across rotations.
        prop_assert_eq!(report.chain.broken_at.clone(), None);
        prop_assert_eq!(report.chain.verified_to, (journal_len > 0).then_some(journal_len));
        let head = fresh.store.head();
        prop_assert_eq!(report.chain.head.clone().unwrap_or(head.clone()), head.clone());
        for peer in &peers {
            prop_assert_eq!(peer.store.head(), head.clone());
            prop_assert_eq!(peer.store.chain_status().broken_at, None);
            prop_assert_eq!(peer.store.chain_status().head, head.clone());
        }
        if journal_len > 0 {
            prop_assert_eq!(fresh.store.hash_at(journal_len), Some(head.hash.clone()));
        }
    }
}

/// A reader's cheap check opens the segment as the tailer's peek does: a symlink put in the
/// segment's place (an agent pointing it at a copy full of zeros after its records) is never
/// "nothing new", so the reader reads under the lock rather than trusting the link.
#[cfg(unix)]
#[test]
fn a_symlink_in_a_segments_place_is_never_nothing_new() {
    let tmp = tempfile::tempdir().unwrap();
    let mut writer = Store::open(tmp.path()).unwrap();
    writer.preallocate(64 * 1024);
    append_n(&mut writer, 1);
    let mut reader = Store::open(tmp.path()).unwrap();
    assert_eq!(reader.poll().unwrap().len(), 1);
    assert!(reader.nothing_new(), "read to the end");
    let segment = tmp.path().join("journal/000001.log");
    let copy = tmp.path().join("elsewhere.log");
    fs::copy(&segment, &copy).unwrap();
    fs::remove_file(&segment).unwrap();
    std::os::unix::fs::symlink(&copy, &segment).unwrap();
    assert!(
        !reader.nothing_new(),
        "a symlink is read under the lock, not peeked"
    );
}

/// An agent swaps the segment a store is about to append to for a symlink to a file outside
/// the store (after the store last read it): the append is refused and the file outside is
/// neither written nor cut.
#[cfg(unix)]
#[test]
fn a_symlink_swapped_in_before_an_append_is_never_written_through() {
    let tmp = tempfile::tempdir().unwrap();
    let mut first = Store::open(tmp.path()).unwrap();
    append_n(&mut first, 1);
    drop(first);
    let mut writer = Store::open(tmp.path()).unwrap();
    let segment = tmp.path().join("journal/000001.log");
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    let mut bytes = fs::read(&segment).unwrap();
    bytes.extend_from_slice(&[b'v'; 4096]);
    fs::write(&victim, &bytes).unwrap();
    fs::remove_file(&segment).unwrap();
    std::os::unix::fs::symlink(&victim, &segment).unwrap();
    let appended = writer.begin().and_then(|mut txn| {
        let next = txn.next_seq();
        txn.append(&[rec(next)])
    });
    assert!(appended.is_err(), "an append through a symlink is refused");
    assert_eq!(
        fs::read(&victim).unwrap(),
        bytes,
        "the file outside is untouched"
    );
}

/// A FIFO named like the next segment (planted by the agent) never blocks opening the store:
/// it is refused as not a regular file.
#[cfg(unix)]
#[test]
fn a_fifo_named_like_a_segment_never_blocks_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let mut first = Store::open(tmp.path()).unwrap();
    append_n(&mut first, 1);
    drop(first);
    let fifo = tmp.path().join("journal/000002.log");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let root = tmp.path().to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(Store::open(&root).map(|_| ()).map_err(|e| e.to_string()));
    });
    let opened = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("opening the store returned");
    assert!(opened.is_err(), "a FIFO is no segment");
}
