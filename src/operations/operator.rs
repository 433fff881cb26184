//! The operator key: a random secret kept in the user's config directory (never in the
//! workspace). It authenticates operator connections and signs approval decisions, so an
//! approval forged into the journal without the key is refused at execution.

use std::io::Write;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const KEY_FILE_ENV: &str = "GAFFER_OPERATOR_KEY_FILE";
/// Hex characters in a key file (32 random bytes).
const KEY_HEX_LEN: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum OperatorKeyError {
    #[error("cannot locate the operator key: set {KEY_FILE_ENV}, XDG_CONFIG_HOME or HOME")]
    NoLocation,
    #[error("no operator key at {0}; run `gaffer operator init`")]
    Missing(PathBuf),
    #[error("operator key file {0} already exists")]
    Exists(PathBuf),
    #[error("operator key file {0} is malformed")]
    Malformed(PathBuf),
    #[error("operator key file {path} must not be inside the workspace {workspace}")]
    InsideWorkspace { path: PathBuf, workspace: PathBuf },
    #[error("operator key file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("operator authentication failed")]
    Rejected,
}

/// Where the key lives: `$GAFFER_OPERATOR_KEY_FILE`, else `$XDG_CONFIG_HOME/gaffer/operator.key`,
/// else `~/.config/gaffer/operator.key`.
pub fn key_path() -> Result<PathBuf, OperatorKeyError> {
    let non_empty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(p) = non_empty(KEY_FILE_ENV) {
        return Ok(PathBuf::from(p));
    }
    if let Some(x) = non_empty("XDG_CONFIG_HOME") {
        return Ok(PathBuf::from(x).join("gaffer").join("operator.key"));
    }
    if let Some(h) = non_empty("HOME") {
        return Ok(PathBuf::from(h)
            .join(".config")
            .join("gaffer")
            .join("operator.key"));
    }
    Err(OperatorKeyError::NoLocation)
}

/// The loaded secret. Debug output never shows it.
#[derive(Clone)]
pub struct OperatorKey {
    bytes: Vec<u8>,
}

impl std::fmt::Debug for OperatorKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OperatorKey(..)")
    }
}

impl OperatorKey {
    /// Creates a new key file (mode 0600, parent 0700). Refuses to overwrite an existing one
    /// and refuses a location inside `workspace` (when given).
    pub fn init(path: &Path, workspace: Option<&Path>) -> Result<(), OperatorKeyError> {
        let io = |source| OperatorKeyError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(ws) = workspace {
            let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
            let ws_abs = ws.canonicalize().unwrap_or_else(|_| abs(ws));
            let parent_abs = path
                .parent()
                .and_then(|p| p.canonicalize().ok())
                .unwrap_or_else(|| abs(path));
            if parent_abs.starts_with(&ws_abs) {
                return Err(OperatorKeyError::InsideWorkspace {
                    path: path.to_path_buf(),
                    workspace: ws_abs,
                });
            }
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            let mut b = std::fs::DirBuilder::new();
            b.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
            b.create(parent).map_err(io)?;
        }
        let key = crate::util::random_bytes(32).map_err(io)?;
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let mut f = opts.open(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                OperatorKeyError::Exists(path.to_path_buf())
            } else {
                io(e)
            }
        })?;
        let mut text = crate::util::hex(&key);
        text.push('\n');
        f.write_all(text.as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        Ok(())
    }

    pub fn load_from(path: &Path) -> Result<OperatorKey, OperatorKeyError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(OperatorKeyError::Missing(path.to_path_buf()));
            }
            Err(source) => {
                return Err(OperatorKeyError::Io {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        let t = text.trim();
        if t.len() != KEY_HEX_LEN || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(OperatorKeyError::Malformed(path.to_path_buf()));
        }
        Ok(OperatorKey {
            bytes: t.as_bytes().to_vec(),
        })
    }

    pub fn load() -> Result<OperatorKey, OperatorKeyError> {
        OperatorKey::load_from(&key_path()?)
    }

    /// Constant-time comparison with a presented key text.
    pub fn matches(&self, presented: &str) -> bool {
        let p = presented.trim().as_bytes();
        // Compare through HMAC tags so the timing does not depend on where bytes differ,
        // nor on the presented length.
        let tag = |b: &[u8]| {
            let mut m = <Hmac<Sha256> as Mac>::new_from_slice(b"gaffer operator key check")
                .expect("HMAC accepts any key length");
            m.update(b);
            m.finalize().into_bytes()
        };
        let (a, b) = (tag(&self.bytes), tag(p));
        let mut diff = 0u8;
        for (x, y) in a.iter().zip(b.iter()) {
            diff |= x ^ y;
        }
        diff == 0
    }

    /// HMAC-SHA256 (hex) of `message` under this key.
    pub fn sign(&self, message: &[u8]) -> String {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.bytes)
            .expect("HMAC accepts any key length");
        m.update(message);
        crate::util::hex(&m.finalize().into_bytes())
    }

    /// Constant-time check of a hex HMAC produced by [`OperatorKey::sign`].
    pub fn verify(&self, message: &[u8], tag_hex: &str) -> bool {
        let Some(tag) = unhex(tag_hex) else {
            return false;
        };
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.bytes)
            .expect("HMAC accepts any key length");
        m.update(message);
        m.verify_slice(&tag).is_ok()
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Checks a key presented by a connection that wants the operator role against the key file.
/// This is the hook the session layer calls on `initialize` with role operator.
pub fn authenticate_operator(presented_key: &str) -> Result<(), OperatorKeyError> {
    let key = OperatorKey::load()?;
    if key.matches(presented_key) {
        Ok(())
    } else {
        Err(OperatorKeyError::Rejected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_creates_a_private_random_key_and_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cfg/gaffer/operator.key");
        OperatorKey::init(&path, None).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.trim().len(), 64);
        assert!(matches!(
            OperatorKey::init(&path, None),
            Err(OperatorKeyError::Exists(_))
        ));
        let other = dir.path().join("other.key");
        OperatorKey::init(&other, None).unwrap();
        assert_ne!(text, std::fs::read_to_string(&other).unwrap());
    }

    #[test]
    fn init_refuses_a_path_inside_the_workspace() {
        let ws = tempfile::tempdir().unwrap();
        let path = ws.path().join(".gaffer/operator.key");
        assert!(matches!(
            OperatorKey::init(&path, Some(ws.path())),
            Err(OperatorKeyError::InsideWorkspace { .. })
        ));
        assert!(!path.exists());
    }

    #[test]
    fn matches_sign_and_verify() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        OperatorKey::init(&path, None).unwrap();
        let key = OperatorKey::load_from(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(key.matches(&text));
        assert!(key.matches(text.trim()));
        assert!(!key.matches(""));
        assert!(!key.matches(&"0".repeat(64)));
        let tag = key.sign(b"approve");
        assert!(key.verify(b"approve", &tag));
        assert!(!key.verify(b"approvE", &tag));
        assert!(!key.verify(b"approve", "zz"));
        assert!(!key.verify(b"approve", &"00".repeat(32)));
        assert!(!format!("{key:?}").contains(text.trim()));
    }

    #[test]
    fn malformed_and_missing_files_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        assert!(matches!(
            OperatorKey::load_from(&path),
            Err(OperatorKeyError::Missing(_))
        ));
        std::fs::write(&path, "short").unwrap();
        assert!(matches!(
            OperatorKey::load_from(&path),
            Err(OperatorKeyError::Malformed(_))
        ));
    }
}
