//! Content-addressed blobs at `<dir>/blobs/sha256/<first two hex>/<hex>`.

use std::io;
use std::path::{Path, PathBuf};

use super::StoreError;
use super::durable;
use crate::util::sha256_hex;

pub fn blobs_root(dir: &Path) -> PathBuf {
    dir.join("blobs").join("sha256")
}

/// Whether `name` is a sha256 digest in our spelling: 64 lowercase hex characters.
pub fn is_valid_name(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

pub fn blob_path(dir: &Path, hex: &str) -> Result<PathBuf, StoreError> {
    if !is_valid_name(hex) {
        return Err(StoreError::InvalidBlobName {
            name: hex.to_string(),
        });
    }
    Ok(blobs_root(dir).join(&hex[..2]).join(hex))
}

/// Stores `bytes` under their sha256 and returns the hex digest. Idempotent; a damaged copy
/// already on disk is replaced.
pub fn put(dir: &Path, bytes: &[u8]) -> Result<String, StoreError> {
    let hex = sha256_hex(bytes);
    let path = blob_path(dir, &hex)?;
    if let Ok(existing) = crate::util::read_regular_file(&path, Some(crate::util::STORE_FILE_LIMIT))
        && sha256_hex(&existing) == hex
    {
        // A writer that crashed after its rename may not have made the entry durable.
        if let Some(parent) = path.parent() {
            durable::sync_dir(parent)?;
        }
        return Ok(hex);
    }
    if let Some(parent) = path.parent() {
        durable::ensure_dir(parent)?;
    }
    durable::write_atomic(&path, bytes)?;
    Ok(hex)
}

/// Reads a blob and checks that it still hashes to its name.
pub fn get(dir: &Path, hex: &str) -> Result<Vec<u8>, StoreError> {
    let path = blob_path(dir, hex)?;
    let bytes = match crate::util::read_regular_file(&path, Some(crate::util::STORE_FILE_LIMIT)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(StoreError::BlobMissing {
                hex: hex.to_string(),
                path,
            });
        }
        Err(source) => return Err(StoreError::Io { path, source }),
    };
    let actual = sha256_hex(&bytes);
    if actual != hex {
        return Err(StoreError::BlobCorrupt {
            path,
            expected: hex.to_string(),
            actual,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn put_get_roundtrip_and_layout() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(".gaffer");
        let hex = put(&dir, b"hello blob").unwrap();
        assert_eq!(hex, sha256_hex(b"hello blob"));
        let path = dir.join("blobs/sha256").join(&hex[..2]).join(&hex);
        assert_eq!(fs::read(&path).unwrap(), b"hello blob");
        assert_eq!(get(&dir, &hex).unwrap(), b"hello blob");
        // Idempotent.
        assert_eq!(put(&dir, b"hello blob").unwrap(), hex);
    }

    #[test]
    fn corrupt_blob_is_detected_and_repaired_by_put() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let hex = put(dir, b"original").unwrap();
        let path = blob_path(dir, &hex).unwrap();
        fs::write(&path, b"tampered").unwrap();
        match get(dir, &hex) {
            Err(e @ StoreError::BlobCorrupt { .. }) => {
                assert!(e.to_string().contains(&hex), "{e}")
            }
            other => panic!("expected BlobCorrupt, got {other:?}"),
        }
        put(dir, b"original").unwrap();
        assert_eq!(get(dir, &hex).unwrap(), b"original");
    }

    #[test]
    fn missing_blob() {
        let tmp = tempfile::tempdir().unwrap();
        let hex = sha256_hex(b"never stored");
        assert!(matches!(
            get(tmp.path(), &hex),
            Err(StoreError::BlobMissing { .. })
        ));
    }

    #[test]
    fn non_hex_names_are_rejected() {
        let tmp = tempfile::tempdir().unwrap();
        let good = sha256_hex(b"x");
        for name in [
            "",
            "../../etc/passwd",
            &good[..63],
            &format!("{good}0"),
            &good.to_uppercase(),
            &format!("../{}", &good[3..]),
        ] {
            assert!(
                matches!(
                    get(tmp.path(), name),
                    Err(StoreError::InvalidBlobName { .. })
                ),
                "{name:?}"
            );
        }
    }
}
