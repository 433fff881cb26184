//! Byte-level encoding of journal segments: the segment header and record frames.
//!
//! Pure functions over slices; no I/O, so they are easy to test and fuzz.

use serde::{Deserialize, Serialize};

use super::chain::{Digest32, record_hash};
use super::{Entry, FORMAT_VERSION, Record, StoreError};

/// First bytes of every segment file.
pub const MAGIC: [u8; 8] = *b"GAFFERJ\n";
/// Magic (8) + format version (u32 LE) + reserved (u32 LE, zero).
pub const HEADER_LEN: usize = 16;
/// Length word (u32 LE: body length + batch flags) + crc32 of length word and body (u32 LE).
pub const FRAME_PREFIX: usize = 8;
/// Length-word flag: first record of an `append` batch.
pub const FLAG_FIRST: u32 = 1 << 31;
/// Length-word flag: last record of an `append` batch (the batch's commit mark).
pub const FLAG_LAST: u32 = 1 << 30;
/// Length-word bits that hold the body length; the bits between it and the flags must be 0.
const LEN_MASK: u32 = (1 << 30) - 1;
/// Largest record body accepted on write or read.
pub const MAX_RECORD_BODY: usize = 64 * 1024 * 1024;

/// Every record body starts with this, because the body serialises `seq` first. The torn-tail
/// scan uses it to look cheaply for a whole record after a damaged one.
const BODY_START: &[u8] = b"{\"seq\":";

pub fn header() -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h
}

/// What the first bytes of a segment say about it.
#[derive(Debug, PartialEq, Eq)]
pub enum HeaderCheck {
    Valid,
    /// Shorter than a header but consistent with one being written.
    Incomplete,
    /// A well-formed header of another format version.
    Version(u32),
    Bad(String),
}

pub fn check_header(bytes: &[u8]) -> HeaderCheck {
    let expected = header();
    let n = bytes.len().min(HEADER_LEN);
    if bytes.len() >= 12 && bytes[..8] == MAGIC {
        let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if version != FORMAT_VERSION {
            return HeaderCheck::Version(version);
        }
    }
    if bytes[..n] != expected[..n] {
        return HeaderCheck::Bad(if bytes[..n.min(8)] != MAGIC[..n.min(8)] {
            "not a gaffer journal segment (bad magic bytes)".to_string()
        } else {
            "segment header has unexpected version or reserved bytes".to_string()
        });
    }
    if n < HEADER_LEN {
        HeaderCheck::Incomplete
    } else {
        HeaderCheck::Valid
    }
}

/// A record body as written: `seq` first (see [`BODY_START`]), then the chain link.
#[derive(Serialize)]
struct BodyOut<'a> {
    seq: u64,
    prev: &'a str,
    time_ms: u64,
    kind: &'a str,
    payload: &'a serde_json::value::RawValue,
}

#[derive(Deserialize)]
struct BodyIn<'a> {
    seq: u64,
    #[serde(borrow)]
    prev: &'a str,
    time_ms: u64,
    kind: String,
    payload: Box<serde_json::value::RawValue>,
}

/// Appends the frames of one `append` batch to `out`, flagging its first and last records and
/// chaining each from the one before (the first from `prev`). Returns each record's hash.
pub fn encode_batch_into(
    records: &[Record],
    prev: Digest32,
    out: &mut Vec<u8>,
) -> Result<Vec<Digest32>, StoreError> {
    let last = records.len().saturating_sub(1);
    let mut hashes = Vec::with_capacity(records.len());
    let mut prev = prev;
    for (i, record) in records.iter().enumerate() {
        let mut flags = 0;
        if i == 0 {
            flags |= FLAG_FIRST;
        }
        if i == last {
            flags |= FLAG_LAST;
        }
        prev = encode_into(record, prev, flags, out)?;
        hashes.push(prev);
    }
    Ok(hashes)
}

/// About the bytes [`encode_batch_into`] writes for `records`: each body's payload plus its
/// frame and envelope (seq, prev, time, kind), so a buffer reserved with it rarely regrows.
pub fn batch_size_hint(records: &[Record]) -> usize {
    records
        .iter()
        .map(|r| r.payload.get().len() + r.kind.len() + 160)
        .sum()
}

fn frame_crc(word: u32, body: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&word.to_le_bytes());
    hasher.update(body);
    hasher.finalize()
}

/// Appends the frame of `record`, linked to `prev`, with batch `flags` to `out`; returns the
/// record's hash. Refuses bodies over the cap.
pub fn encode_into(
    record: &Record,
    prev: Digest32,
    flags: u32,
    out: &mut Vec<u8>,
) -> Result<Digest32, StoreError> {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_PREFIX]);
    let prev_hex = prev.hex_digits();
    let body = BodyOut {
        seq: record.seq,
        prev: std::str::from_utf8(&prev_hex).expect("hex digits are ASCII"),
        time_ms: record.time_ms,
        kind: &record.kind,
        payload: &record.payload,
    };
    serde_json::to_writer(&mut *out, &body).map_err(|source| StoreError::Encode {
        seq: record.seq,
        source,
    })?;
    let body_len = out.len() - start - FRAME_PREFIX;
    if body_len > MAX_RECORD_BODY {
        out.truncate(start);
        return Err(StoreError::RecordTooLarge {
            seq: record.seq,
            size: body_len,
            max: MAX_RECORD_BODY,
        });
    }
    let word = body_len as u32 | flags;
    let body = &out[start + FRAME_PREFIX..];
    let (crc, hash) = (frame_crc(word, body), record_hash(body));
    out[start..start + 4].copy_from_slice(&word.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(hash)
}

/// The frame of `record` as a batch of one, chained from genesis.
#[cfg(test)]
pub fn encode(record: &Record) -> Result<Vec<u8>, StoreError> {
    let mut out = Vec::new();
    encode_into(
        record,
        super::chain::GENESIS,
        FLAG_FIRST | FLAG_LAST,
        &mut out,
    )?;
    Ok(out)
}

/// The result of looking at the bytes at one record boundary.
#[derive(Debug)]
pub enum Frame {
    /// A whole, checksum-valid record occupying `len` bytes; `first`/`last` are its batch flags.
    Whole {
        entry: Entry,
        len: usize,
        first: bool,
        last: bool,
    },
    /// Too few bytes to decide; `needed` is the total frame size if the prefix was readable.
    Incomplete { needed: Option<usize> },
    /// Bytes that cannot be a record frame.
    Bad(String),
}

pub fn decode(buf: &[u8]) -> Frame {
    if buf.len() < FRAME_PREFIX {
        return Frame::Incomplete { needed: None };
    }
    let word = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let crc = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let len = (word & LEN_MASK) as usize;
    if len == 0 || len > MAX_RECORD_BODY {
        return Frame::Bad(format!(
            "record length {len} is outside 1..={MAX_RECORD_BODY}"
        ));
    }
    let total = FRAME_PREFIX + len;
    if buf.len() < total {
        return Frame::Incomplete {
            needed: Some(total),
        };
    }
    let body = &buf[FRAME_PREFIX..total];
    let actual = frame_crc(word, body);
    if actual != crc {
        return Frame::Bad(format!(
            "checksum mismatch (stored {crc:08x}, computed {actual:08x})"
        ));
    }
    // Validating UTF-8 once over the body is cheaper than serde_json doing it per string.
    let Ok(text) = std::str::from_utf8(body) else {
        return Frame::Bad("checksum-valid body is not UTF-8".into());
    };
    let body = match serde_json::from_str::<BodyIn<'_>>(text) {
        Ok(body) => body,
        Err(e) => return Frame::Bad(format!("checksum-valid body is not a record: {e}")),
    };
    let Some(prev) = Digest32::from_hex(body.prev) else {
        return Frame::Bad("checksum-valid body has a prev that is not 64 lower-case hex".into());
    };
    Frame::Whole {
        entry: Entry {
            record: Record {
                seq: body.seq,
                time_ms: body.time_ms,
                kind: body.kind,
                payload: body.payload,
            },
            prev,
            hash: record_hash(text.as_bytes()),
        },
        len: total,
        first: word & FLAG_FIRST != 0,
        last: word & FLAG_LAST != 0,
    }
}

/// A whole frame found by [`find_whole_frame`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub at: usize,
    pub len: usize,
    pub first: bool,
    pub last: bool,
}

/// The search for a whole frame gave up: its candidates claimed more bytes to check than
/// [`search_budget`] allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SearchExhausted;

/// Bytes a search through `len` bytes may checksum in all. Real candidates are records laid end
/// to end, whose bodies add up to at most `len`; only crafted bytes (a prefix claiming a long
/// body before every `{"seq":`) make each candidate checksum most of the buffer, which without
/// a bound costs the square of the damage's length on every read of it.
pub fn search_budget(len: usize) -> usize {
    len.saturating_mul(4).saturating_add(1 << 20)
}

/// The first whole, valid record frame in `buf` starting at position `from` or later, within
/// `budget` bytes checksummed (spent from it). Used to tell a torn tail from corruption by
/// what, if anything, follows the damage.
pub fn find_whole_frame(
    buf: &[u8],
    from: usize,
    budget: &mut usize,
) -> Result<Option<Found>, SearchExhausted> {
    let mut from = from;
    while from + FRAME_PREFIX + BODY_START.len() <= buf.len() {
        let window = &buf[from + FRAME_PREFIX..];
        let Some(hit) = window
            .windows(BODY_START.len())
            .position(|w| w == BODY_START)
        else {
            return Ok(None);
        };
        let at = from + hit;
        let claimed = u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
        let cost = ((claimed & LEN_MASK) as usize).min(buf.len() - at);
        *budget = budget.checked_sub(cost).ok_or(SearchExhausted)?;
        if let Frame::Whole {
            len, first, last, ..
        } = decode(&buf[at..])
        {
            return Ok(Some(Found {
                at,
                len,
                first,
                last,
            }));
        }
        from = at + 1;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(seq: u64) -> Record {
        Record {
            seq,
            time_ms: 1_700_000_000_000 + seq,
            kind: "test.kind".into(),
            payload: crate::store::raw_payload(
                json!({"n": seq, "s": "x\ny\"z", "a": [1, 2.5, null, true]}),
            ),
        }
    }

    #[test]
    fn frame_roundtrip_and_layout() {
        let r = rec(7);
        let bytes = encode(&r).unwrap();
        let word = u32::from_le_bytes(bytes[0..4].try_into().unwrap());
        assert_eq!(word & FLAG_FIRST, FLAG_FIRST);
        assert_eq!(word & FLAG_LAST, FLAG_LAST);
        assert_eq!((word & LEN_MASK) as usize, bytes.len() - FRAME_PREFIX);
        let crc = u32::from_le_bytes(bytes[4..8].try_into().unwrap());
        let mut h = crc32fast::Hasher::new();
        h.update(&bytes[0..4]);
        h.update(&bytes[8..]);
        assert_eq!(crc, h.finalize());
        assert!(bytes[8..].starts_with(BODY_START));
        match decode(&bytes) {
            Frame::Whole {
                entry,
                len,
                first,
                last,
            } => {
                assert_eq!(entry.record, r);
                assert_eq!(entry.prev, super::super::chain::GENESIS);
                assert_eq!(entry.hash, record_hash(&bytes[FRAME_PREFIX..]));
                assert_eq!(len, bytes.len());
                assert!(first && last);
            }
            other => panic!("expected whole frame, got {other:?}"),
        }
    }

    #[test]
    fn every_strict_prefix_is_incomplete() {
        let bytes = encode(&rec(1)).unwrap();
        for cut in 0..bytes.len() {
            assert!(
                matches!(decode(&bytes[..cut]), Frame::Incomplete { .. }),
                "prefix of {cut} bytes"
            );
        }
    }

    #[test]
    fn flipped_body_byte_is_bad_checksum() {
        let mut bytes = encode(&rec(1)).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 0x20;
        match decode(&bytes) {
            Frame::Bad(reason) => assert!(reason.contains("checksum"), "{reason}"),
            other => panic!("expected bad frame, got {other:?}"),
        }
    }

    #[test]
    fn zero_and_oversized_lengths_are_bad() {
        let mut zero = vec![0u8; 16];
        assert!(matches!(decode(&zero), Frame::Bad(_)));
        zero[0..4].copy_from_slice(&((MAX_RECORD_BODY as u32) + 1).to_le_bytes());
        assert!(matches!(decode(&zero), Frame::Bad(_)));
    }

    #[test]
    fn checksum_valid_non_record_body_is_bad() {
        let body = br#"{"hello":1}"#;
        let word = body.len() as u32 | FLAG_FIRST | FLAG_LAST;
        let mut bytes = word.to_le_bytes().to_vec();
        bytes.extend_from_slice(&frame_crc(word, body).to_le_bytes());
        bytes.extend_from_slice(body);
        match decode(&bytes) {
            Frame::Bad(reason) => assert!(reason.contains("not a record"), "{reason}"),
            other => panic!("expected bad frame, got {other:?}"),
        }
    }

    #[test]
    fn oversized_record_is_refused_on_encode() {
        let big = Record {
            seq: 1,
            time_ms: 0,
            kind: "big".into(),
            payload: crate::store::raw_payload(serde_json::Value::String(
                "x".repeat(MAX_RECORD_BODY),
            )),
        };
        let mut out = b"keep".to_vec();
        match encode_into(&big, super::super::chain::GENESIS, 0, &mut out) {
            Err(StoreError::RecordTooLarge { seq: 1, .. }) => {}
            other => panic!("expected RecordTooLarge, got {other:?}"),
        }
        assert_eq!(
            out, b"keep",
            "nothing of the refused record stays in the buffer"
        );
    }

    #[test]
    fn header_checks() {
        let h = header();
        assert_eq!(check_header(&h), HeaderCheck::Valid);
        for cut in 0..HEADER_LEN {
            assert_eq!(
                check_header(&h[..cut]),
                HeaderCheck::Incomplete,
                "cut {cut}"
            );
        }
        let mut newer = h;
        newer[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        assert_eq!(
            check_header(&newer),
            HeaderCheck::Version(FORMAT_VERSION + 1)
        );
        let mut bad = h;
        bad[0] = b'X';
        assert!(matches!(check_header(&bad), HeaderCheck::Bad(_)));
        let mut reserved = h;
        reserved[15] = 1;
        assert!(matches!(check_header(&reserved), HeaderCheck::Bad(_)));
    }

    #[test]
    fn finds_next_whole_frame_after_damage() {
        let mut bytes = encode(&rec(1)).unwrap();
        let second_at = bytes.len();
        bytes.extend(encode(&rec(2)).unwrap());
        bytes[10] ^= 0xff;
        let find = |buf: &[u8], from| find_whole_frame(buf, from, &mut search_budget(buf.len()));
        let found = find(&bytes, 1).unwrap().unwrap();
        assert_eq!(found.at, second_at);
        assert!(found.first && found.last);
        assert_eq!(found.at + found.len, bytes.len());
        assert_eq!(find(&bytes, second_at + 1), Ok(None));
        // Damage in the last frame: nothing whole follows.
        let mut tail = encode(&rec(3)).unwrap();
        tail[12] ^= 0x01;
        assert_eq!(find(&tail, 1), Ok(None));
    }

    /// Crafted bytes whose every candidate claims a body reaching to the end exhaust the search
    /// instead of costing the square of their length; records laid end to end never do.
    #[test]
    fn a_search_through_crafted_candidates_gives_up_within_its_budget() {
        let mut crafted = Vec::new();
        while crafted.len() < 256 * 1024 {
            let claim = u32::try_from(256 * 1024 - crafted.len()).unwrap_or(u32::MAX);
            crafted.extend_from_slice(&claim.to_le_bytes());
            crafted.extend_from_slice(&[0xAB; 4]);
            crafted.extend_from_slice(BODY_START);
            crafted.extend_from_slice(b"1,");
        }
        let mut budget = search_budget(crafted.len());
        assert_eq!(
            find_whole_frame(&crafted, 0, &mut budget),
            Err(SearchExhausted)
        );
        let mut records = Vec::new();
        for seq in 1..=500 {
            records.extend(encode(&rec(seq)).unwrap());
        }
        records[3] ^= 0x10; // the first record's length: damaged
        let mut budget = search_budget(records.len());
        let found = find_whole_frame(&records, 1, &mut budget);
        assert!(matches!(found, Ok(Some(f)) if f.at > 0), "{found:?}");
    }

    #[test]
    fn batch_flags_mark_first_and_last() {
        let mut out = Vec::new();
        let start = record_hash(b"before");
        let hashes = encode_batch_into(&[rec(1), rec(2), rec(3)], start, &mut out).unwrap();
        let mut flags = vec![];
        let mut links = vec![];
        let mut at = 0;
        while at < out.len() {
            match decode(&out[at..]) {
                Frame::Whole {
                    entry,
                    len,
                    first,
                    last,
                } => {
                    flags.push((first, last));
                    links.push((entry.prev, entry.hash));
                    at += len;
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(flags, vec![(true, false), (false, false), (false, true)]);
        // Each record chains from the one before; the first from `start`.
        let expected_prev = [start, hashes[0], hashes[1]];
        for (i, (prev, hash)) in links.iter().enumerate() {
            assert_eq!(*prev, expected_prev[i], "record {i}");
            assert_eq!(*hash, hashes[i], "record {i}");
        }
    }

    #[test]
    fn flag_bits_are_covered_by_the_checksum() {
        let mut bytes = encode(&rec(1)).unwrap();
        bytes[3] ^= 0x40; // clear FLAG_LAST
        assert!(matches!(decode(&bytes), Frame::Bad(_)));
        let mut bytes = encode(&rec(1)).unwrap();
        bytes[3] ^= 0x20; // a reserved bit between length and flags
        assert!(matches!(decode(&bytes), Frame::Bad(_)));
    }
}
