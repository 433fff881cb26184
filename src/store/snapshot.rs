//! `snapshot.json`: folded state up to a seq, with its own format version and checksum.
//!
//! On disk: `{"format":2,"seq":N,"head":"<hex>","workspace_id":..,"journal_from":K,
//! "state_sha256":"<hex>","state":<json>}`. `head` is the hash of record N, from which the
//! records after the snapshot chain; `workspace_id` is the store's (absent when its journal
//! declared none); `journal_from` is the first segment holding records after `seq`; `state_sha256` is the
//! sha256 of the exact `state` bytes as stored, so damage anywhere in the state is detected.

use std::fs;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::chain::Digest32;
use super::durable;
use super::{FORMAT_VERSION, RawSnapshot, StoreError};
use crate::util::sha256_hex;

pub const FILE_NAME: &str = "snapshot.json";

/// What identifies a snapshot file: its header and the checksum of its state. A process that
/// writes a snapshot gets its mark back so it can remember, outside the workspace, that it
/// wrote exactly this one (the checksum alone proves nothing: anyone can compute it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotMark {
    pub seq: u64,
    pub head: String,
    pub journal_from: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<String>,
    pub state_sha256: String,
}

/// A snapshot as loaded, plus where the journal continues after it.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub snapshot: RawSnapshot,
    pub journal_from: u64,
    pub state_bytes: usize,
    /// Hash of the record at the snapshot's seq.
    pub head: Digest32,
    pub workspace_id: Option<String>,
    pub mark: SnapshotMark,
}

#[derive(Deserialize)]
struct FormatOnly {
    format: u32,
}

/// Everything but the state, in the order written: the state follows as the last field.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    format: u32,
    seq: u64,
    head: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    workspace_id: Option<String>,
    journal_from: u64,
    state_sha256: String,
}

/// The whole envelope, for files not laid out as [`encode`] writes them (unknown fields
/// ignored, as they always were).
#[derive(Deserialize)]
struct Envelope<'a> {
    format: u32,
    seq: u64,
    head: String,
    #[serde(default)]
    workspace_id: Option<String>,
    journal_from: u64,
    state_sha256: String,
    #[serde(borrow)]
    state: &'a RawValue,
}

/// Where the state starts after the header.
const STATE_KEY: &[u8] = b",\"state\":";

pub fn encode(
    snap: &RawSnapshot,
    journal_from: u64,
    head: Digest32,
    workspace_id: Option<&str>,
) -> Result<Vec<u8>, StoreError> {
    let state = snap.state_json();
    let header = Header {
        format: FORMAT_VERSION,
        seq: snap.seq,
        head: head.to_hex(),
        workspace_id: workspace_id.map(str::to_string),
        journal_from,
        state_sha256: sha256_hex(state),
    };
    let mut out = serde_json::to_vec(&header).map_err(|source| StoreError::Encode {
        seq: snap.seq,
        source,
    })?;
    // `{..header..}` becomes `{..header..,"state":<state>}`: the state is copied once, as is.
    out.pop();
    out.reserve(STATE_KEY.len() + state.len() + 1);
    out.extend_from_slice(STATE_KEY);
    out.extend_from_slice(state);
    out.push(b'}');
    Ok(out)
}

/// The header and the state's byte range, as [`encode`] lays them out: the header object up to
/// the first `,"state":`, which then runs to the closing brace. None for any other layout
/// (the header is parsed whole, unknown fields refused, so that `,"state":` is the top level's).
fn split_written(bytes: &[u8]) -> Option<(Header, std::ops::Range<usize>)> {
    let at = bytes
        .windows(STATE_KEY.len())
        .position(|w| w == STATE_KEY)?;
    let mut head = bytes[..at].to_vec();
    head.push(b'}');
    let header: Header = serde_json::from_slice(&head).ok()?;
    let end = bytes.len().checked_sub(1)?;
    (bytes.get(end) == Some(&b'}')).then_some((header, at + STATE_KEY.len()..end))
}

/// The header and the state's range in any valid envelope (one full parse of the text).
fn split_any(bytes: &[u8]) -> Result<(Header, std::ops::Range<usize>), serde_json::Error> {
    let e = serde_json::from_slice::<Envelope<'_>>(bytes)?;
    let state = e.state.get().as_bytes();
    let start = state.as_ptr() as usize - bytes.as_ptr() as usize;
    let header = Header {
        format: e.format,
        seq: e.seq,
        head: e.head,
        workspace_id: e.workspace_id,
        journal_from: e.journal_from,
        state_sha256: e.state_sha256,
    };
    Ok((header, start..start + state.len()))
}

pub fn decode(path: &Path, bytes: Vec<u8>) -> Result<Loaded, StoreError> {
    let bad = |reason: String| StoreError::SnapshotCorrupt {
        path: path.to_path_buf(),
        reason,
    };
    // The usual case reads the header alone and leaves the state to its reader: one pass over
    // the state (its checksum) before it is decoded. When the layout is another, the whole
    // envelope is parsed; when it does not parse, or parses with another version, the version
    // alone decides the error, so a newer or older layout is refused as such, not as damage.
    let parsed = split_written(&bytes).map_or_else(|| split_any(&bytes), Ok);
    let format = match &parsed {
        Ok((header, _)) => header.format,
        Err(_) => {
            serde_json::from_slice::<FormatOnly>(&bytes)
                .map_err(|e| bad(format!("not a snapshot envelope: {e}")))?
                .format
        }
    };
    if format < FORMAT_VERSION {
        return Err(StoreError::OutdatedVersion {
            path: path.to_path_buf(),
            found: format,
            supported: FORMAT_VERSION,
        });
    }
    if format != FORMAT_VERSION {
        return Err(StoreError::UnsupportedVersion {
            path: path.to_path_buf(),
            found: format,
            supported: FORMAT_VERSION,
        });
    }
    let (header, range) = parsed.map_err(|e| bad(format!("malformed envelope: {e}")))?;
    let actual = sha256_hex(&bytes[range.clone()]);
    if actual != header.state_sha256 {
        return Err(bad(format!(
            "state checksum mismatch (stored {}, computed {actual})",
            header.state_sha256
        )));
    }
    if header.journal_from == 0 {
        return Err(bad("journal_from must be at least 1".into()));
    }
    let head = Digest32::from_hex(&header.head)
        .ok_or_else(|| bad("head is not 64 lower-case hex digits".into()))?;
    // The state stays text, inside the file's bytes: its reader decodes it into its own type.
    let state_bytes = range.len();
    let mark = SnapshotMark {
        seq: header.seq,
        head: header.head,
        journal_from: header.journal_from,
        workspace_id: header.workspace_id.clone(),
        state_sha256: header.state_sha256,
    };
    Ok(Loaded {
        snapshot: RawSnapshot::within(header.seq, bytes, range),
        journal_from: header.journal_from,
        state_bytes,
        head,
        workspace_id: header.workspace_id,
        mark,
    })
}

/// Loads `<dir>/snapshot.json`; `None` when there is none.
pub fn load(dir: &Path) -> Result<Option<Loaded>, StoreError> {
    let path = dir.join(FILE_NAME);
    match crate::util::read_regular_file(&path, Some(crate::util::STORE_FILE_LIMIT)) {
        Ok(bytes) => decode(&path, bytes).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StoreError::Io { path, source }),
    }
}

/// Durably replaces `<dir>/snapshot.json`.
pub fn store(
    dir: &Path,
    snap: &RawSnapshot,
    journal_from: u64,
    head: Digest32,
    workspace_id: Option<&str>,
) -> Result<SnapshotMark, StoreError> {
    let bytes = encode(snap, journal_from, head, workspace_id)?;
    durable::write_atomic(&dir.join(FILE_NAME), &bytes)?;
    Ok(SnapshotMark {
        seq: snap.seq,
        head: head.to_hex(),
        journal_from,
        workspace_id: workspace_id.map(str::to_string),
        state_sha256: sha256_hex(snap.state_json()),
    })
}

/// Removes temp files of snapshot writes that a crash interrupted. Call only under the lock,
/// and only while this process has no snapshot write of its own in flight. Snapshots are
/// written without the lock, so a temp named by another live process (`/proc/<pid>` exists)
/// may be one in progress and is left alone.
pub fn remove_stale_temps(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let prefix = format!(".{FILE_NAME}.tmp-");
    let own = std::process::id();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
        let live_other = pid.is_some_and(|p| p != own && Path::new(&format!("/proc/{p}")).exists());
        if !live_other {
            let _ = fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Snapshot;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn roundtrip() {
        let snap = RawSnapshot::from_value(&Snapshot {
            seq: 42,
            state: json!({"b": [1, 2], "a": {"z": "y"}}),
        })
        .unwrap();
        let bytes = encode(&snap, 3, Digest32([7; 32]), Some("ws_a")).unwrap();
        let loaded = decode(Path::new("s.json"), bytes).unwrap();
        assert_eq!(loaded.snapshot.seq, 42);
        assert_eq!(loaded.snapshot.state_json(), snap.state_json());
        assert_eq!(loaded.journal_from, 3);
        assert_eq!(loaded.head, Digest32([7; 32]));
        assert_eq!(loaded.workspace_id.as_deref(), Some("ws_a"));
    }

    #[test]
    fn stale_temps_go_but_another_live_process_keeps_its_write_in_progress() {
        let dir = tempfile::tempdir().unwrap();
        let name = |pid: &str| dir.path().join(format!(".{FILE_NAME}.tmp-{pid}-0"));
        let own = std::process::id().to_string();
        // pid 1 is alive on every Linux system; u32::MAX is never a pid.
        for pid in ["1", own.as_str(), "4294967295", "junk"] {
            fs::write(name(pid), b"partial").unwrap();
        }
        remove_stale_temps(dir.path());
        assert!(
            name("1").exists(),
            "a live process's write in progress stays"
        );
        for pid in [own.as_str(), "4294967295", "junk"] {
            assert!(!name(pid).exists(), "{pid}: stale temp removed");
        }
    }

    #[test]
    fn damaged_state_is_detected() {
        let snap = RawSnapshot::from_value(&Snapshot {
            seq: 1,
            state: json!({"count": 12345}),
        })
        .unwrap();
        let bytes = encode(&snap, 1, Digest32::default(), None).unwrap();
        let text = String::from_utf8(bytes).unwrap().replace("12345", "12346");
        match decode(Path::new("s.json"), text.into_bytes()) {
            Err(StoreError::SnapshotCorrupt { reason, .. }) => {
                assert!(reason.contains("checksum"), "{reason}")
            }
            other => panic!("expected SnapshotCorrupt, got {other:?}"),
        }
    }

    #[test]
    fn newer_format_is_refused_as_such() {
        let text = br#"{"format":3,"something_new":true}"#;
        match decode(Path::new("/w/.gaffer/snapshot.json"), text.to_vec()) {
            Err(e @ StoreError::UnsupportedVersion { found: 3, .. }) => {
                assert!(e.to_string().contains("snapshot.json"), "{e}");
            }
            other => panic!("expected UnsupportedVersion, got {other:?}"),
        }
    }

    #[test]
    fn unchained_format_1_is_refused_as_outdated() {
        let text = br#"{"format":1,"seq":1,"journal_from":1,"state_sha256":"x","state":{}}"#;
        match decode(Path::new("/w/.gaffer/snapshot.json"), text.to_vec()) {
            Err(e @ StoreError::OutdatedVersion { found: 1, .. }) => {
                assert!(e.to_string().contains("older gaffer"), "{e}");
            }
            other => panic!("expected OutdatedVersion, got {other:?}"),
        }
    }

    #[test]
    fn truncated_snapshot_is_corrupt() {
        let bytes = encode(
            &RawSnapshot::from_value(&Snapshot {
                seq: 1,
                state: json!([1, 2, 3]),
            })
            .unwrap(),
            1,
            Digest32::default(),
            None,
        )
        .unwrap();
        let cut = &bytes[..bytes.len() - 3];
        assert!(matches!(
            decode(Path::new("s.json"), cut.to_vec()),
            Err(StoreError::SnapshotCorrupt { .. })
        ));
    }

    /// A JSON value with strings that look like the envelope's own keys.
    fn value() -> impl Strategy<Value = serde_json::Value> {
        let text = prop_oneof![
            Just(",\"state\":".to_string()),
            Just("\"}{\\".to_string()),
            "[a-z\"\\\\,:{} ]{0,12}",
        ];
        let leaf = prop_oneof![
            text.clone().prop_map(serde_json::Value::String),
            any::<i64>().prop_map(|n| json!(n)),
            any::<bool>().prop_map(|b| json!(b)),
            Just(serde_json::Value::Null),
        ];
        leaf.prop_recursive(3, 24, 4, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                proptest::collection::btree_map(text.clone(), inner, 0..4).prop_map(|m| json!(m)),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Whatever the state and the workspace id hold, a snapshot decodes to what was
        /// encoded, through the header-only path or the full parse of any other layout.
        #[test]
        fn prop_encode_decode_round_trips(
            state in value(),
            seq in any::<u64>(),
            from in 1..u64::MAX,
            head in any::<[u8; 32]>(),
            id in proptest::option::of("[a-z_\",:\\\\]{0,16}"),
        ) {
            let snap = RawSnapshot::from_value(&Snapshot { seq, state: state.clone() }).unwrap();
            let bytes = encode(&snap, from, Digest32(head), id.as_deref()).unwrap();
            // The same envelope with the state first: another layout, the same bytes of state.
            let (header, range) = split_written(&bytes).unwrap();
            let mut other = b"{\"state\":".to_vec();
            other.extend_from_slice(&bytes[range]);
            other.push(b',');
            other.extend_from_slice(&serde_json::to_vec(&header).unwrap()[1..]);
            prop_assert!(split_written(&other).is_none());
            for text in [bytes, other] {
                let loaded = decode(Path::new("s.json"), text).unwrap();
                prop_assert_eq!(loaded.snapshot.seq, seq);
                prop_assert_eq!(loaded.journal_from, from);
                prop_assert_eq!(loaded.head, Digest32(head));
                prop_assert_eq!(&loaded.workspace_id, &id);
                let back: serde_json::Value = loaded.snapshot.decode().unwrap();
                prop_assert_eq!(&back, &state);
            }
        }
    }

    fn sample() -> Vec<u8> {
        let snap = RawSnapshot::from_value(&Snapshot {
            seq: 9,
            state: json!({"ops": {"op_1": {"state": "denied", "n": 12}}, "s": ",\"state\":{}"}),
        })
        .unwrap();
        encode(&snap, 2, Digest32([3; 32]), Some("ws_x")).unwrap()
    }

    /// A snapshot cut anywhere short of its end is refused, never loaded.
    #[test]
    fn a_snapshot_cut_at_any_byte_is_refused() {
        let bytes = sample();
        for cut in 0..bytes.len() {
            let r = decode(Path::new("s.json"), bytes[..cut].to_vec());
            assert!(
                matches!(r, Err(StoreError::SnapshotCorrupt { .. })),
                "cut at {cut}: {r:?}"
            );
        }
    }

    /// Any byte of the state changed is caught (by the checksum or by the envelope).
    #[test]
    fn a_change_to_any_byte_of_the_state_is_refused() {
        let bytes = sample();
        let (_, range) = split_written(&bytes).unwrap();
        for at in range.clone() {
            for flip in [0x01u8, 0x20, 0x80] {
                let mut bad = bytes.clone();
                bad[at] ^= flip;
                let r = decode(Path::new("s.json"), bad);
                assert!(
                    matches!(r, Err(StoreError::SnapshotCorrupt { .. })),
                    "byte {at} ^ {flip:#x}: {r:?}"
                );
            }
        }
    }
}
