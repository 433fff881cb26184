//! Byte-level encoding of journal segments: the segment header and record frames.
//!
//! Pure functions over slices; no I/O, so they are easy to test and fuzz.

use super::{FORMAT_VERSION, Record, StoreError};

/// First bytes of every segment file.
pub const MAGIC: [u8; 8] = *b"GAFFERJ\n";
/// Magic (8) + format version (u32 LE) + reserved (u32 LE, zero).
pub const HEADER_LEN: usize = 16;
/// Length (u32 LE) + crc32 of the body (u32 LE).
pub const FRAME_PREFIX: usize = 8;
/// Largest record body accepted on write or read.
pub const MAX_RECORD_BODY: usize = 64 * 1024 * 1024;

/// Every record body starts with this, because `Record` serialises `seq` first. The torn-tail
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

/// Appends the frame of `record` to `out`. Refuses bodies over the cap.
pub fn encode_into(record: &Record, out: &mut Vec<u8>) -> Result<(), StoreError> {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_PREFIX]);
    serde_json::to_writer(&mut *out, record).map_err(|source| StoreError::Encode {
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
    let crc = crc32fast::hash(&out[start + FRAME_PREFIX..]);
    out[start..start + 4].copy_from_slice(&(body_len as u32).to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

#[cfg(test)]
pub fn encode(record: &Record) -> Result<Vec<u8>, StoreError> {
    let mut out = Vec::new();
    encode_into(record, &mut out)?;
    Ok(out)
}

/// The result of looking at the bytes at one record boundary.
#[derive(Debug)]
pub enum Frame {
    /// A whole, checksum-valid record occupying `len` bytes.
    Whole { record: Record, len: usize },
    /// Too few bytes to decide; `needed` is the total frame size if the prefix was readable.
    Incomplete { needed: Option<usize> },
    /// Bytes that cannot be a record frame.
    Bad(String),
}

pub fn decode(buf: &[u8]) -> Frame {
    if buf.len() < FRAME_PREFIX {
        return Frame::Incomplete { needed: None };
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let crc = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
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
    let actual = crc32fast::hash(body);
    if actual != crc {
        return Frame::Bad(format!(
            "checksum mismatch (stored {crc:08x}, computed {actual:08x})"
        ));
    }
    // Validating UTF-8 once over the body is cheaper than serde_json doing it per string.
    let Ok(text) = std::str::from_utf8(body) else {
        return Frame::Bad("checksum-valid body is not UTF-8".into());
    };
    match serde_json::from_str::<Record>(text) {
        Ok(record) => Frame::Whole { record, len: total },
        Err(e) => Frame::Bad(format!("checksum-valid body is not a record: {e}")),
    }
}

/// Offset (within `buf`) of the first whole, valid record frame starting after position 0.
/// Used to tell a torn tail (nothing valid follows) from corruption (something valid follows).
pub fn find_whole_frame_after(buf: &[u8]) -> Option<usize> {
    let mut from = 1usize;
    while from + FRAME_PREFIX + BODY_START.len() <= buf.len() {
        let window = &buf[from + FRAME_PREFIX..];
        let hit = window
            .windows(BODY_START.len())
            .position(|w| w == BODY_START)?;
        let start = from + hit;
        if let Frame::Whole { .. } = decode(&buf[start..]) {
            return Some(start);
        }
        from = start + 1;
    }
    None
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
            payload: json!({"n": seq, "s": "x\ny\"z", "a": [1, 2.5, null, true]}),
        }
    }

    #[test]
    fn frame_roundtrip_and_layout() {
        let r = rec(7);
        let bytes = encode(&r).unwrap();
        let len = u32::from_le_bytes(bytes[0..4].try_into().unwrap()) as usize;
        assert_eq!(len, bytes.len() - FRAME_PREFIX);
        let crc = u32::from_le_bytes(bytes[4..8].try_into().unwrap());
        assert_eq!(crc, crc32fast::hash(&bytes[8..]));
        assert!(bytes[8..].starts_with(BODY_START));
        match decode(&bytes) {
            Frame::Whole { record, len } => {
                assert_eq!(record, r);
                assert_eq!(len, bytes.len());
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
        let mut bytes = (body.len() as u32).to_le_bytes().to_vec();
        bytes.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
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
            payload: serde_json::Value::String("x".repeat(MAX_RECORD_BODY)),
        };
        let mut out = b"keep".to_vec();
        match encode_into(&big, &mut out) {
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
        assert_eq!(find_whole_frame_after(&bytes), Some(second_at));
        // Damage in the last frame: nothing whole follows.
        let mut tail = encode(&rec(3)).unwrap();
        tail[12] ^= 0x01;
        assert_eq!(find_whole_frame_after(&tail), None);
    }
}
