//! The hash chain against an attacker who knows the framing: records are edited, deleted,
//! reordered or inserted and re-framed with valid lengths, flags and crc32 (and renumbered so
//! seqs stay contiguous). Readers must keep every record and report the first broken link.

use super::chain::GENESIS;
use super::codec::{FLAG_FIRST, FLAG_LAST, FRAME_PREFIX, Frame};
use super::*;
use proptest::prelude::*;
use serde_json::json;
use std::fs;
use std::path::Path;

/// One record as the attacker handles it: the segment it sits in and its body bytes.
#[derive(Clone, Debug)]
struct Raw {
    segment: u64,
    body: Vec<u8>,
}

fn rec(seq: u64, text: &str) -> Record {
    Record {
        seq,
        time_ms: 1_700_000_000_000 + seq,
        kind: "test.event".into(),
        payload: crate::store::raw_payload(json!({ "n": seq, "text": text })),
    }
}

/// Two appenders taking turns with `batches` (who, texts); a snapshot (and rotation) after
/// batch `snapshot_after`. Returns the number of records.
fn build(dir: &Path, batches: &[(usize, Vec<String>)], snapshot_after: Option<usize>) -> u64 {
    let mut stores = [Store::open(dir).unwrap(), Store::open(dir).unwrap()];
    let mut n = 0;
    for (i, (who, texts)) in batches.iter().enumerate() {
        let mut txn = stores[*who].begin().unwrap();
        let next = txn.next_seq();
        let batch: Vec<Record> = texts
            .iter()
            .enumerate()
            .map(|(j, t)| rec(next + j as u64, t))
            .collect();
        txn.append(&batch).unwrap();
        n = next - 1 + texts.len() as u64;
        if snapshot_after == Some(i) {
            txn.write_snapshot(&Snapshot {
                seq: n,
                state: json!({ "upto": n }),
            })
            .unwrap();
        }
    }
    n
}

fn segments(dir: &Path) -> Vec<u64> {
    segment::list_segments(&dir.join("journal")).unwrap()
}

fn read_raw(dir: &Path) -> Vec<Raw> {
    let mut out = Vec::new();
    for n in segments(dir) {
        let bytes = fs::read(segment::segment_path(&dir.join("journal"), n)).unwrap();
        let mut at = HEADER_LEN;
        while at < bytes.len() {
            let Frame::Whole { len, .. } = codec::decode(&bytes[at..]) else {
                panic!("untampered journal must decode");
            };
            out.push(Raw {
                segment: n,
                body: bytes[at + FRAME_PREFIX..at + len].to_vec(),
            });
            at += len;
        }
    }
    out
}

/// A frame as a batch of one, with a valid crc: exactly what the writer would produce.
fn frame(body: &[u8]) -> Vec<u8> {
    let word = body.len() as u32 | FLAG_FIRST | FLAG_LAST;
    let mut h = crc32fast::Hasher::new();
    h.update(&word.to_le_bytes());
    h.update(body);
    let mut out = word.to_le_bytes().to_vec();
    out.extend_from_slice(&h.finalize().to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// Rewrites every segment (keeping empty ones) with `raws`, renumbered 1.. in order.
fn write_raw(dir: &Path, raws: &[Raw]) {
    for n in segments(dir) {
        let mut bytes = codec::header().to_vec();
        for (i, raw) in raws.iter().enumerate() {
            if raw.segment == n {
                bytes.extend(frame(&renumber(&raw.body, i as u64 + 1)));
            }
        }
        fs::write(segment::segment_path(&dir.join("journal"), n), bytes).unwrap();
    }
}

/// `body` with its leading `{"seq":N` replaced by `seq`; every other byte kept.
fn renumber(body: &[u8], seq: u64) -> Vec<u8> {
    let digits = body[7..].iter().take_while(|b| b.is_ascii_digit()).count();
    let mut out = format!("{{\"seq\":{seq}").into_bytes();
    out.extend_from_slice(&body[7 + digits..]);
    out
}

/// What a full replay of the store sees: records kept, first break, head.
fn replay(dir: &Path) -> Result<(u64, Option<u64>, Head), StoreError> {
    let mut store = Store::open(dir)?;
    let mut count = 0;
    store.replay(0, |_| {
        count += 1;
        Ok::<(), StoreError>(())
    })?;
    let status = store.chain_status();
    Ok((count, status.broken_at.map(|b| b.seq), status.head))
}

#[derive(Clone, Debug)]
enum Tamper {
    /// XOR a byte of record k's payload with a non-zero mask.
    Flip {
        k: usize,
        at: usize,
        mask: u8,
    },
    Delete {
        k: usize,
    },
    /// Swap records k and k + 1.
    Swap {
        k: usize,
    },
    /// A forged record at position k, correctly linked to record k - 1.
    Insert {
        k: usize,
    },
}

fn arb_tamper() -> impl Strategy<Value = Tamper> {
    prop_oneof![
        (any::<usize>(), any::<usize>(), 1u8..=255).prop_map(|(k, at, mask)| Tamper::Flip {
            k,
            at,
            mask
        }),
        any::<usize>().prop_map(|k| Tamper::Delete { k }),
        any::<usize>().prop_map(|k| Tamper::Swap { k }),
        any::<usize>().prop_map(|k| Tamper::Insert { k }),
    ]
}

/// What a reader must then report.
#[derive(Debug, PartialEq)]
enum Expect {
    /// A break at this seq, with this many records kept.
    Break { seq: u64, records: u64 },
    /// No break, but the head is no longer the one an operator may have signed.
    HeadMoved { records: u64 },
    /// The frame no longer decodes: refused as corrupt, or cut as a torn last record.
    Undecodable,
}

/// Applies `t` (indices taken modulo the journal) and says what readers must report.
fn tamper(raws: &mut Vec<Raw>, t: &Tamper) -> Expect {
    let n = raws.len();
    match *t {
        Tamper::Flip { k, at, mask } => {
            let i = k % n;
            let body = &mut raws[i].body;
            let start = find(body, b"\"payload\":") + 10;
            let pos = start + at % (body.len() - 1 - start);
            body[pos] ^= mask;
            if !matches!(codec::decode(&frame(body)), Frame::Whole { .. }) {
                return Expect::Undecodable;
            }
            if i + 1 == n {
                return Expect::HeadMoved { records: n as u64 };
            }
            Expect::Break {
                seq: i as u64 + 2,
                records: n as u64,
            }
        }
        Tamper::Delete { k } => {
            let i = k % n;
            raws.remove(i);
            if i + 1 == n {
                return Expect::HeadMoved {
                    records: n as u64 - 1,
                };
            }
            Expect::Break {
                seq: i as u64 + 1,
                records: n as u64 - 1,
            }
        }
        Tamper::Swap { k } => {
            let i = k % (n - 1);
            let (a, b) = (raws[i].body.clone(), raws[i + 1].body.clone());
            raws[i].body = b;
            raws[i + 1].body = a;
            Expect::Break {
                seq: i as u64 + 1,
                records: n as u64,
            }
        }
        Tamper::Insert { k } => {
            let i = k % (n + 1);
            let prev = if i == 0 {
                GENESIS
            } else {
                chain::record_hash(&renumber(&raws[i - 1].body, i as u64))
            };
            let body = format!(
                r#"{{"seq":{},"prev":"{prev}","time_ms":1,"kind":"operation.approved","payload":{{"forged":true}}}}"#,
                i + 1
            );
            let segment = raws.get(i).unwrap_or(&raws[n - 1]).segment;
            raws.insert(
                i,
                Raw {
                    segment,
                    body: body.into_bytes(),
                },
            );
            if i == n {
                return Expect::HeadMoved {
                    records: n as u64 + 1,
                };
            }
            Expect::Break {
                seq: i as u64 + 2,
                records: n as u64 + 1,
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or(0)
}

fn arb_batches() -> impl Strategy<Value = Vec<(usize, Vec<String>)>> {
    prop::collection::vec(
        (0usize..2, prop::collection::vec("[a-z]{1,12}", 1..4)),
        2..7,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn prop_tampering_is_reported_at_the_right_seq(
        batches in arb_batches(),
        snapshot_after in prop::option::of(0usize..6),
        t in arb_tamper(),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let n = build(dir, &batches, snapshot_after);
        let (count, broken, original_head) = replay(dir).unwrap();
        prop_assert_eq!((count, broken), (n, None));

        let mut raws = read_raw(dir);
        prop_assert_eq!(raws.len() as u64, n);
        let expect = tamper(&mut raws, &t);
        write_raw(dir, &raws);
        let replayed = replay(dir);
        let report = verify(dir).unwrap();
        let verified_break = report.chain.broken_at.as_ref().map(|b| b.seq);
        match expect {
            Expect::Break { seq, records } => {
                // Nothing is lost and nothing stops: the break is reported.
                let (count, broken, _) = replayed.unwrap();
                prop_assert_eq!(count, records);
                prop_assert_eq!(broken, Some(seq));
                prop_assert_eq!(verified_break, Some(seq));
                prop_assert_eq!(report.chain.verified_to, Some(seq - 1).filter(|s| *s > 0));
                prop_assert!(!report.ok);
            }
            Expect::HeadMoved { records } => {
                let (count, broken, head) = replayed.unwrap();
                prop_assert_eq!((count, broken), (records, None));
                prop_assert_ne!(head.hash, original_head.hash);
                prop_assert_eq!(verified_break, None);
            }
            Expect::Undecodable => match replayed {
                Err(StoreError::Corrupt { .. }) => prop_assert!(!report.ok),
                Ok((count, broken, _)) => {
                    // Only the very last record can be cut as a torn tail.
                    prop_assert_eq!((count, broken), (n - 1, None));
                    prop_assert!(!report.warnings.is_empty());
                }
                Err(other) => prop_assert!(false, "unexpected error {other}"),
            },
        }
    }
}

#[test]
fn snapshot_and_rotation_keep_the_chain_and_it_continues_from_the_snapshot_head() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let texts = |k: usize| (0..k).map(|i| format!("t{i}")).collect::<Vec<_>>();
    build(dir, &[(0, texts(3)), (1, texts(2)), (0, texts(2))], Some(1));
    let full = replay(dir).unwrap();
    assert_eq!((full.0, full.1), (7, None));
    // Opening from the snapshot chains the later records from the snapshot's head.
    let mut store = Store::open(dir).unwrap();
    store.replay(5, |_| Ok::<(), StoreError>(())).unwrap();
    assert_eq!(store.chain_status().broken_at, None);
    assert_eq!(store.chain_status().head, full.2);
    // The segment before the snapshot rotated away: still verifiable from the snapshot head.
    fs::remove_file(dir.join("journal/000001.log")).unwrap();
    let report = verify(dir).unwrap();
    assert!(report.ok, "{:?}", report.problems);
    assert_eq!(report.chain.verified_from, Some(6));
    assert_eq!(report.chain.verified_to, Some(7));
    // A snapshot whose head is not the chain's makes the first later record a break.
    let path = dir.join(snapshot::FILE_NAME);
    let loaded = snapshot::load(dir).unwrap().unwrap();
    let forged = snapshot::encode(&loaded.snapshot, loaded.journal_from, GENESIS, None).unwrap();
    fs::write(&path, forged).unwrap();
    let mut store = Store::open(dir).unwrap();
    store.replay(5, |_| Ok::<(), StoreError>(())).unwrap();
    assert_eq!(store.chain_status().broken_at.map(|b| b.seq), Some(6));
    let report = verify(dir).unwrap();
    assert_eq!(report.chain.broken_at.map(|b| b.seq), Some(6));
}

/// Appends a record carrying `operator_signature.head` = the store's current head.
fn sign_head(store: &mut Store) -> Head {
    let mut txn = store.begin().unwrap();
    let head = txn.store.head();
    let seq = txn.next_seq();
    let payload = json!({ "operator_signature": { "head": head, "sig": "…" } });
    txn.append(&[Record::new(seq, "approval.decided", payload)])
        .unwrap();
    head
}

#[test]
fn verify_reports_what_each_operator_signature_vouches_for() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    build(
        dir,
        &[(0, vec!["a".into(), "b".into()]), (1, vec!["c".into()])],
        None,
    );
    let mut store = Store::open(dir).unwrap();
    store.replay(0, |_| Ok::<(), StoreError>(())).unwrap();
    let signed = sign_head(&mut store);
    assert_eq!(signed.seq, 3);
    let report = verify(dir).unwrap();
    assert!(report.ok, "{:?}", report.problems);
    let sig = &report.chain.signatures[0];
    assert_eq!(
        (sig.seq, sig.head_matches, sig.vouches_for),
        (4, true, Some([1, 3]))
    );

    // The attacker rewrites record 2 and re-chains everything after it: every link holds,
    // but the signed head is no longer on the chain.
    let mut raws = read_raw(dir);
    let edited = String::from_utf8(raws[1].body.clone()).unwrap();
    assert!(edited.contains(r#""text":"b""#), "{edited}");
    raws[1].body = edited
        .replace(r#""text":"b""#, r#""text":"x""#)
        .into_bytes();
    let mut prev = chain::record_hash(&raws[0].body);
    for raw in raws.iter_mut().skip(1) {
        let text = String::from_utf8(raw.body.clone()).unwrap();
        let old = &text[text.find("\"prev\":\"").unwrap() + 8..][..64];
        raw.body = text.replacen(old, &prev.to_hex(), 1).into_bytes();
        prev = chain::record_hash(&raw.body);
    }
    write_raw(dir, &raws);
    let report = verify(dir).unwrap();
    assert_eq!(report.chain.broken_at, None);
    let sig = &report.chain.signatures[0];
    assert_eq!((sig.head_matches, sig.vouches_for), (false, None));
}
