//! Every way the store can fail, each naming the file (and byte offset) involved.

use std::path::PathBuf;

/// An error from the workspace store. Messages name the file, and the byte offset where it
/// matters, so an operator can find the damage without a debugger.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store I/O error on {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("journal segment {} is corrupt at byte offset {offset}: {reason}", segment.display())]
    Corrupt {
        segment: PathBuf,
        offset: u64,
        reason: String,
    },

    #[error(
        "{} uses store format version {found}, but this gaffer understands only version {supported}; upgrade gaffer to open this workspace",
        path.display()
    )]
    UnsupportedVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },

    #[error(
        "{} uses store format version {found}, written by an older gaffer before the journal was hash-chained (version {supported}); records of both formats are never mixed: move `.gaffer/` aside to start a new store (the old one stays readable by the older gaffer)",
        path.display()
    )]
    OutdatedVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },

    #[error("snapshot {} is unusable: {reason}", path.display())]
    SnapshotCorrupt { path: PathBuf, reason: String },

    #[error(
        "snapshot refused: it covers seq {snapshot_seq} but the journal ends at seq {last_seq}; fold every record first"
    )]
    SnapshotNotAtTail { snapshot_seq: u64, last_seq: u64 },

    #[error(
        "append refused: record {index} of the batch has seq {found} where seq {expected} was due; nothing was written"
    )]
    NonContiguous {
        index: usize,
        expected: u64,
        found: u64,
    },

    #[error(
        "append refused: record seq {seq} encodes to {size} bytes, over the {max}-byte record limit; nothing was written"
    )]
    RecordTooLarge { seq: u64, size: usize, max: usize },

    #[error("could not encode record seq {seq}: {source}")]
    Encode {
        seq: u64,
        #[source]
        source: serde_json::Error,
    },

    #[error(
        "this write transaction is unusable: an earlier append failed and could not be rolled back from {}; start a new transaction",
        segment.display()
    )]
    Poisoned { segment: PathBuf },

    #[error("journal segment {} disappeared while it was being read", path.display())]
    SegmentMissing { path: PathBuf },

    #[error("blob name {name:?} is not a sha256 digest (64 lowercase hex characters)")]
    InvalidBlobName { name: String },

    #[error("blob {hex} is missing (expected at {})", path.display())]
    BlobMissing { hex: String, path: PathBuf },

    #[error("blob {} is corrupt: its content hashes to {actual}, not {expected}", path.display())]
    BlobCorrupt {
        path: PathBuf,
        expected: String,
        actual: String,
    },
}

impl StoreError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> StoreError {
        let path = path.into();
        move |source| StoreError::Io { path, source }
    }
}
