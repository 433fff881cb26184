//! Operator trust for the workspace files that grant power: `.gaffer/policy.yaml` (allow rules)
//! and `.gaffer/providers.yaml` (executables gaffer starts). An agent may write files in the
//! workspace, so these files count only when `.gaffer/trust.json` holds an HMAC, under the
//! operator key kept outside the workspace, over their exact bytes.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::operator::OperatorKey;

pub const TRUST_FILE: &str = "trust.json";
/// The files whose content must be operator-signed before gaffer acts on it.
pub const TRUSTED_FILES: [&str; 2] = [
    super::policy::POLICY_FILE,
    super::adapters::external::PROVIDERS_FILE,
];
const TRUST_VERSION: u32 = 1;
/// Keeps a trust signature from ever being mistaken for any other HMAC made with the key.
const DOMAIN: &str = "gaffer-trust-v1";

/// One signed file in `trust.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustEntry {
    /// sha256 (hex) of the exact bytes that were trusted.
    pub sha256: String,
    /// HMAC-SHA256 (hex) under the operator key of [`message`].
    pub hmac: String,
    pub signed_at_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustFile {
    pub version: u32,
    /// Keyed by file name inside `.gaffer/`.
    #[serde(default)]
    pub files: BTreeMap<String, TrustEntry>,
}

/// Where a trust-gated file stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TrustStatus {
    /// The file does not exist (nothing to trust).
    Absent,
    /// Signed by the operator key and unchanged since.
    Trusted,
    /// Its bytes differ from the ones the operator signed.
    Changed,
    /// `trust.json` has no entry for it (or cannot be read).
    NeverTrusted,
    /// The entry's signature does not verify under this machine's operator key (forged, or
    /// signed with another key).
    BadSignature,
    /// There is no usable operator key here, so nothing can be trusted.
    NoOperatorKey,
}

impl TrustStatus {
    /// Whether gaffer may act on the file's content. An absent file grants nothing.
    pub fn is_trusted(self) -> bool {
        self == TrustStatus::Trusted
    }

    /// Words for messages people read.
    pub fn describe(self) -> &'static str {
        match self {
            TrustStatus::Absent => "absent",
            TrustStatus::Trusted => "trusted",
            TrustStatus::Changed => "changed since it was trusted",
            TrustStatus::NeverTrusted => "never trusted",
            TrustStatus::BadSignature => {
                "its trust signature does not verify under this operator key"
            }
            TrustStatus::NoOperatorKey => "no operator key on this machine",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

/// The signed message: domain, file name and digest, NUL-separated.
pub fn message(file: &str, sha256_hex: &str) -> Vec<u8> {
    format!("{DOMAIN}\0{file}\0{sha256_hex}").into_bytes()
}

/// Reads `trust.json`; a missing or unreadable one holds no entries (fails closed).
pub fn read_trust_file(gaffer_dir: &Path) -> TrustFile {
    let path = gaffer_dir.join(TRUST_FILE);
    let empty = TrustFile {
        version: TRUST_VERSION,
        files: BTreeMap::new(),
    };
    match std::fs::read(&path) {
        Ok(bytes) => match serde_json::from_slice::<TrustFile>(&bytes) {
            Ok(t) if t.version == TRUST_VERSION => t,
            Ok(t) => {
                tracing::warn!(
                    version = t.version,
                    "trust.json has an unknown version; ignoring it"
                );
                empty
            }
            Err(e) => {
                tracing::warn!(error = %e, "trust.json is malformed; ignoring it");
                empty
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => empty,
        Err(e) => {
            tracing::warn!(error = %e, "trust.json cannot be read; ignoring it");
            empty
        }
    }
}

/// Checks `bytes` (the current content of `file`, `None` when absent) against `trust`.
pub fn status_of(
    trust: &TrustFile,
    file: &str,
    bytes: Option<&[u8]>,
    key: Option<&OperatorKey>,
) -> TrustStatus {
    let Some(bytes) = bytes else {
        return TrustStatus::Absent;
    };
    let Some(key) = key else {
        return TrustStatus::NoOperatorKey;
    };
    let Some(entry) = trust.files.get(file) else {
        return TrustStatus::NeverTrusted;
    };
    let digest = crate::util::sha256_hex(bytes);
    if entry.sha256 != digest {
        return TrustStatus::Changed;
    }
    if key.verify(&message(file, &digest), &entry.hmac) {
        TrustStatus::Trusted
    } else {
        TrustStatus::BadSignature
    }
}

/// A trust-gated file read once, so the bytes checked are the bytes used.
#[derive(Debug, Clone)]
pub struct Checked {
    pub status: TrustStatus,
    /// The content (`None` when the file is absent).
    pub bytes: Option<Vec<u8>>,
}

/// Reads `<gaffer_dir>/<file>` and checks it against `trust.json` and the operator key.
pub fn check(gaffer_dir: &Path, file: &str) -> Result<Checked, TrustError> {
    let path = gaffer_dir.join(file);
    let bytes = match std::fs::read(&path) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(TrustError::Io { path, source }),
    };
    let key = match bytes {
        Some(_) => match OperatorKey::load() {
            Ok(k) => Some(k),
            Err(e) => {
                tracing::debug!(error = %e, "no operator key; workspace files cannot be trusted");
                None
            }
        },
        None => None,
    };
    let status = status_of(
        &read_trust_file(gaffer_dir),
        file,
        bytes.as_deref(),
        key.as_ref(),
    );
    Ok(Checked { status, bytes })
}

/// What `sign_files` trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Signed {
    pub file: String,
    pub sha256: String,
}

/// Signs the current content of every trust-gated file that exists and writes `trust.json`
/// atomically. Entries of files that no longer exist are dropped, so deleting a file and later
/// restoring an old version does not silently regain trust.
pub fn sign_files(gaffer_dir: &Path, key: &OperatorKey) -> Result<Vec<Signed>, TrustError> {
    sign_files_expecting(gaffer_dir, key, &BTreeMap::new())
}

/// [`sign_files`], refusing (and writing nothing) unless each file named in `expect` still
/// has the digest the operator reviewed, so a file swapped between review and signing is
/// not trusted.
pub fn sign_files_expecting(
    gaffer_dir: &Path,
    key: &OperatorKey,
    expect: &BTreeMap<String, String>,
) -> Result<Vec<Signed>, TrustError> {
    if let Some(unknown) = expect.keys().find(|f| !TRUSTED_FILES.contains(&f.as_str())) {
        return Err(TrustError::Invalid(format!(
            "expect: {unknown:?} is not one of {TRUSTED_FILES:?}"
        )));
    }
    let now = crate::util::now_ms();
    let mut out = TrustFile {
        version: TRUST_VERSION,
        files: BTreeMap::new(),
    };
    let mut signed = Vec::new();
    for file in TRUSTED_FILES {
        let path = gaffer_dir.join(file);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(TrustError::Io { path, source }),
        };
        validate(file, &path, &bytes)?;
        let sha256 = crate::util::sha256_hex(&bytes);
        if let Some(want) = expect.get(file)
            && !want.eq_ignore_ascii_case(&sha256)
        {
            return Err(TrustError::Invalid(format!(
                "{} has sha256 {sha256}, not the expected {want}; review it again",
                path.display()
            )));
        }
        out.files.insert(
            file.to_string(),
            TrustEntry {
                hmac: key.sign(&message(file, &sha256)),
                sha256: sha256.clone(),
                signed_at_ms: now,
            },
        );
        signed.push(Signed {
            file: file.to_string(),
            sha256,
        });
    }
    if let Some(missing) = expect.keys().find(|f| !out.files.contains_key(f.as_str())) {
        return Err(TrustError::Invalid(format!(
            "expect: {missing} does not exist"
        )));
    }
    write_atomic(&gaffer_dir.join(TRUST_FILE), &out)?;
    Ok(signed)
}

/// An operator should not sign a file gaffer would refuse to load anyway.
fn validate(file: &str, path: &Path, bytes: &[u8]) -> Result<(), TrustError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| TrustError::Invalid(format!("{}: not UTF-8", path.display())))?;
    if file == super::policy::POLICY_FILE {
        super::policy::Policy::parse(text, path).map_err(|e| TrustError::Invalid(e.to_string()))?;
    } else {
        super::adapters::external::parse_declarations(text, path).map_err(TrustError::Invalid)?;
    }
    Ok(())
}

fn write_atomic(path: &Path, value: &TrustFile) -> Result<(), TrustError> {
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| TrustError::Io { path: p, source }
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut text = serde_json::to_vec_pretty(value)
        .map_err(|e| TrustError::Invalid(format!("cannot encode trust.json: {e}")))?;
    text.push(b'\n');
    let suffix = crate::util::random_bytes(6)
        .map(|b| crate::util::hex(&b))
        .map_err(io(path))?;
    let tmp = dir.join(format!(".{TRUST_FILE}.{suffix}.tmp"));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io(&tmp))?;
        f.write_all(&text).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io(path))?;
        // The rename is durable only once the directory entry is.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(dir: &Path, name: &str) -> OperatorKey {
        let p = dir.join(name);
        OperatorKey::init(&p, None).unwrap();
        OperatorKey::load_from(&p).unwrap()
    }

    #[test]
    fn signing_then_editing_then_forging() {
        let cfg = tempfile::tempdir().unwrap();
        let ws = tempfile::tempdir().unwrap();
        let (k, other) = (key(cfg.path(), "a"), key(cfg.path(), "b"));
        let policy = "rules:\n  - id: r\n    effect: allow\n";
        std::fs::write(ws.path().join("policy.yaml"), policy).unwrap();
        let signed = sign_files(ws.path(), &k).unwrap();
        assert_eq!(signed.len(), 1);
        assert_eq!(signed[0].sha256, crate::util::sha256_hex(policy.as_bytes()));
        let t = read_trust_file(ws.path());
        let st = |t: &TrustFile, b: &[u8], k: Option<&OperatorKey>| {
            status_of(t, "policy.yaml", Some(b), k)
        };
        assert_eq!(st(&t, policy.as_bytes(), Some(&k)), TrustStatus::Trusted);
        assert_eq!(st(&t, b"rules: []\n", Some(&k)), TrustStatus::Changed);
        assert_eq!(
            st(&t, policy.as_bytes(), Some(&other)),
            TrustStatus::BadSignature
        );
        assert_eq!(st(&t, policy.as_bytes(), None), TrustStatus::NoOperatorKey);
        assert_eq!(
            status_of(&t, "providers.yaml", Some(b"providers: []\n"), Some(&k)),
            TrustStatus::NeverTrusted
        );
        assert_eq!(
            status_of(&t, "policy.yaml", None, Some(&k)),
            TrustStatus::Absent
        );
        // A signature for one file does not transfer to another with the same bytes.
        let mut moved = t.clone();
        let e = moved.files.remove("policy.yaml").unwrap();
        moved.files.insert("providers.yaml".into(), e);
        assert_eq!(
            status_of(&moved, "providers.yaml", Some(policy.as_bytes()), Some(&k)),
            TrustStatus::BadSignature
        );
        // No temp files are left behind.
        let names: Vec<String> = std::fs::read_dir(ws.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
    }

    #[test]
    fn an_invalid_policy_is_not_signed_and_nothing_is_written() {
        let cfg = tempfile::tempdir().unwrap();
        let ws = tempfile::tempdir().unwrap();
        let k = key(cfg.path(), "a");
        std::fs::write(
            ws.path().join("policy.yaml"),
            "rules:\n  - id: r\n    effect: maybe\n",
        )
        .unwrap();
        let e = sign_files(ws.path(), &k).unwrap_err();
        assert!(e.to_string().contains("rules[0].effect"), "{e}");
        assert!(!ws.path().join(TRUST_FILE).exists());
    }

    #[test]
    fn an_expected_digest_that_no_longer_matches_signs_nothing() {
        let cfg = tempfile::tempdir().unwrap();
        let ws = tempfile::tempdir().unwrap();
        let k = key(cfg.path(), "a");
        std::fs::write(ws.path().join("policy.yaml"), "rules: []\n").unwrap();
        let reviewed = crate::util::sha256_hex(b"rules: []\n");
        let expect = |f: &str, d: &str| BTreeMap::from([(f.to_string(), d.to_string())]);
        std::fs::write(ws.path().join("policy.yaml"), "rules: [] # swapped\n").unwrap();
        let e = sign_files_expecting(ws.path(), &k, &expect("policy.yaml", &reviewed)).unwrap_err();
        assert!(e.to_string().contains("not the expected"), "{e}");
        assert!(!ws.path().join(TRUST_FILE).exists());
        let e =
            sign_files_expecting(ws.path(), &k, &expect("providers.yaml", &reviewed)).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        let e = sign_files_expecting(ws.path(), &k, &expect("trust.json", &reviewed)).unwrap_err();
        assert!(e.to_string().contains("not one of"), "{e}");
        assert!(!ws.path().join(TRUST_FILE).exists());
        std::fs::write(ws.path().join("policy.yaml"), "rules: []\n").unwrap();
        let signed =
            sign_files_expecting(ws.path(), &k, &expect("policy.yaml", &reviewed)).unwrap();
        assert_eq!(signed[0].sha256, reviewed);
    }

    #[test]
    fn a_malformed_trust_file_trusts_nothing() {
        let ws = tempfile::tempdir().unwrap();
        std::fs::write(ws.path().join(TRUST_FILE), "{not json").unwrap();
        assert!(read_trust_file(ws.path()).files.is_empty());
    }
}
