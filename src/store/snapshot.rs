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

/// A snapshot as loaded, plus where the journal continues after it.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub snapshot: RawSnapshot,
    pub journal_from: u64,
    pub state_bytes: usize,
    /// Hash of the record at the snapshot's seq.
    pub head: Digest32,
    pub workspace_id: Option<String>,
}

#[derive(Deserialize)]
struct FormatOnly {
    format: u32,
}

#[derive(Serialize, Deserialize)]
struct Envelope<'a> {
    format: u32,
    seq: u64,
    head: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    workspace_id: Option<String>,
    journal_from: u64,
    state_sha256: String,
    #[serde(borrow)]
    state: &'a RawValue,
}

pub fn encode(
    snap: &RawSnapshot,
    journal_from: u64,
    head: Digest32,
    workspace_id: Option<&str>,
) -> Result<Vec<u8>, StoreError> {
    let encode_err = |source| StoreError::Encode {
        seq: snap.seq,
        source,
    };
    let raw: &RawValue = &snap.state;
    let envelope = Envelope {
        format: FORMAT_VERSION,
        seq: snap.seq,
        head: head.to_hex(),
        workspace_id: workspace_id.map(str::to_string),
        journal_from,
        state_sha256: sha256_hex(raw.get().as_bytes()),
        state: raw,
    };
    serde_json::to_vec(&envelope).map_err(encode_err)
}

pub fn decode(path: &Path, bytes: &[u8]) -> Result<Loaded, StoreError> {
    let bad = |reason: String| StoreError::SnapshotCorrupt {
        path: path.to_path_buf(),
        reason,
    };
    // One pass over the text in the usual case. When the envelope does not parse, or parses
    // with another version, the version alone decides the error, so a newer or older layout is
    // refused as such rather than as damage.
    let parsed = serde_json::from_slice::<Envelope<'_>>(bytes);
    let format = match &parsed {
        Ok(envelope) => envelope.format,
        Err(_) => {
            serde_json::from_slice::<FormatOnly>(bytes)
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
    let envelope = parsed.map_err(|e| bad(format!("malformed envelope: {e}")))?;
    let actual = sha256_hex(envelope.state.get().as_bytes());
    if actual != envelope.state_sha256 {
        return Err(bad(format!(
            "state checksum mismatch (stored {}, computed {actual})",
            envelope.state_sha256
        )));
    }
    if envelope.journal_from == 0 {
        return Err(bad("journal_from must be at least 1".into()));
    }
    let head = Digest32::from_hex(&envelope.head)
        .ok_or_else(|| bad("head is not 64 lower-case hex digits".into()))?;
    // The state stays raw text: its reader deserializes it straight into its own type.
    let state = envelope.state.to_owned();
    Ok(Loaded {
        snapshot: RawSnapshot {
            seq: envelope.seq,
            state,
        },
        journal_from: envelope.journal_from,
        state_bytes: envelope.state.get().len(),
        head,
        workspace_id: envelope.workspace_id,
    })
}

/// Loads `<dir>/snapshot.json`; `None` when there is none.
pub fn load(dir: &Path) -> Result<Option<Loaded>, StoreError> {
    let path = dir.join(FILE_NAME);
    match fs::read(&path) {
        Ok(bytes) => decode(&path, &bytes).map(Some),
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
) -> Result<(), StoreError> {
    let bytes = encode(snap, journal_from, head, workspace_id)?;
    durable::write_atomic(&dir.join(FILE_NAME), &bytes)
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
    use serde_json::json;

    #[test]
    fn roundtrip() {
        let snap = RawSnapshot::from_value(&Snapshot {
            seq: 42,
            state: json!({"b": [1, 2], "a": {"z": "y"}}),
        })
        .unwrap();
        let bytes = encode(&snap, 3, Digest32([7; 32]), Some("ws_a")).unwrap();
        let loaded = decode(Path::new("s.json"), &bytes).unwrap();
        assert_eq!(loaded.snapshot.seq, 42);
        assert_eq!(loaded.snapshot.state.get(), snap.state.get());
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
        match decode(Path::new("s.json"), text.as_bytes()) {
            Err(StoreError::SnapshotCorrupt { reason, .. }) => {
                assert!(reason.contains("checksum"), "{reason}")
            }
            other => panic!("expected SnapshotCorrupt, got {other:?}"),
        }
    }

    #[test]
    fn newer_format_is_refused_as_such() {
        let text = br#"{"format":3,"something_new":true}"#;
        match decode(Path::new("/w/.gaffer/snapshot.json"), text) {
            Err(e @ StoreError::UnsupportedVersion { found: 3, .. }) => {
                assert!(e.to_string().contains("snapshot.json"), "{e}");
            }
            other => panic!("expected UnsupportedVersion, got {other:?}"),
        }
    }

    #[test]
    fn unchained_format_1_is_refused_as_outdated() {
        let text = br#"{"format":1,"seq":1,"journal_from":1,"state_sha256":"x","state":{}}"#;
        match decode(Path::new("/w/.gaffer/snapshot.json"), text) {
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
            decode(Path::new("s.json"), cut),
            Err(StoreError::SnapshotCorrupt { .. })
        ));
    }
}
