//! Key files: the private key as an Ed25519 JWK (`{"kty":"OKP","crv":"Ed25519","d","x"}`,
//! mode 0600) and the public key beside it (`x` only). JWK because `node:crypto` imports it
//! as it is, so an editor can sign without any code of ours.

use std::io::Write;
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::util::{base64url, base64url_decode};

pub const KEY_FILE_ENV: &str = "GAFFER_OPERATOR_KEY_FILE";
pub const PUBLIC_KEY_FILE_ENV: &str = "GAFFER_OPERATOR_PUBLIC_KEY_FILE";

#[derive(Debug, thiserror::Error)]
pub enum OperatorKeyError {
    #[error("cannot locate the operator key: set {KEY_FILE_ENV}, XDG_CONFIG_HOME or HOME")]
    NoLocation,
    #[error("no operator key at {0}; run `gaffer operator init`")]
    Missing(PathBuf),
    #[error("operator key file {0} already exists")]
    Exists(PathBuf),
    #[error("operator key file {0} is not an Ed25519 JWK")]
    Malformed(PathBuf),
    #[error(
        "{0} holds an old HMAC operator key, which gaffer no longer accepts: run \
         `gaffer operator init --rotate` to move it aside and create an Ed25519 key, then \
         `gaffer trust` each workspace again (old approvals and trust do not carry over)"
    )]
    LegacyHmac(PathBuf),
    #[error("public key {public} does not belong to the private key {private}")]
    PairMismatch { private: PathBuf, public: PathBuf },
    #[error("operator key file {path} must not be inside the workspace {workspace}")]
    InsideWorkspace { path: PathBuf, workspace: PathBuf },
    #[error(
        "operator public key {0} has other hard links (one may lie inside a workspace, where \
         the agent can write it): give it a file of its own"
    )]
    HardLinked(PathBuf),
    #[error("operator key file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn non_empty_env(k: &str) -> Option<PathBuf> {
    std::env::var_os(k)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The private key: `$GAFFER_OPERATOR_KEY_FILE`, else `$XDG_CONFIG_HOME/gaffer/operator.key`,
/// else `~/.config/gaffer/operator.key`.
pub fn key_path() -> Result<PathBuf, OperatorKeyError> {
    if let Some(p) = non_empty_env(KEY_FILE_ENV) {
        return Ok(p);
    }
    let config = non_empty_env("XDG_CONFIG_HOME")
        .or_else(|| non_empty_env("HOME").map(|h| h.join(".config")))
        .ok_or(OperatorKeyError::NoLocation)?;
    Ok(config.join("gaffer").join("operator.key"))
}

/// The public key: `$GAFFER_OPERATOR_PUBLIC_KEY_FILE`, else the private key's path with the
/// extension `pub` (`operator.key` → `operator.pub`).
pub fn public_key_path() -> Result<PathBuf, OperatorKeyError> {
    if let Some(p) = non_empty_env(PUBLIC_KEY_FILE_ENV) {
        return Ok(p);
    }
    Ok(key_path()?.with_extension("pub"))
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Jwk {
    kty: String,
    crv: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    d: Option<String>,
    x: String,
}

impl Jwk {
    fn bytes(field: &str) -> Option<[u8; 32]> {
        base64url_decode(field)?.try_into().ok()
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, OperatorKeyError> {
    std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => OperatorKeyError::Missing(path.to_path_buf()),
        _ => OperatorKeyError::Io {
            path: path.to_path_buf(),
            source: e,
        },
    })
}

fn parse_jwk(path: &Path, bytes: &[u8]) -> Result<Jwk, OperatorKeyError> {
    let text = std::str::from_utf8(bytes).unwrap_or("").trim();
    if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(OperatorKeyError::LegacyHmac(path.to_path_buf()));
    }
    match serde_json::from_str::<Jwk>(text) {
        Ok(j) if j.kty == "OKP" && j.crv == "Ed25519" => Ok(j),
        _ => Err(OperatorKeyError::Malformed(path.to_path_buf())),
    }
}

/// The public half: all a serving process ever holds.
#[derive(Clone, PartialEq, Eq)]
pub struct OperatorPublic {
    key: VerifyingKey,
}

impl std::fmt::Debug for OperatorPublic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OperatorPublic({})", self.fingerprint())
    }
}

impl OperatorPublic {
    pub fn from_bytes(bytes: &[u8; 32]) -> Option<OperatorPublic> {
        VerifyingKey::from_bytes(bytes)
            .ok()
            .map(|key| OperatorPublic { key })
    }

    pub fn load_from(path: &Path) -> Result<OperatorPublic, OperatorKeyError> {
        let jwk = parse_jwk(path, &read_file(path)?)?;
        Jwk::bytes(&jwk.x)
            .and_then(|b| OperatorPublic::from_bytes(&b))
            .ok_or_else(|| OperatorKeyError::Malformed(path.to_path_buf()))
    }

    /// Loads the public key from [`public_key_path`]; the private key is never opened.
    pub fn load() -> Result<OperatorPublic, OperatorKeyError> {
        OperatorPublic::load_from(&public_key_path()?)
    }

    /// Strict Ed25519 verification of a base64url signature over `message`.
    pub fn verify(&self, message: &[u8], signature_b64: &str) -> bool {
        let Some(sig) = base64url_decode(signature_b64).and_then(|b| <[u8; 64]>::try_from(b).ok())
        else {
            return false;
        };
        self.key
            .verify_strict(message, &Signature::from_bytes(&sig))
            .is_ok()
    }

    /// Short, stable name of the key (first 16 hex of the sha256 of its bytes).
    pub fn fingerprint(&self) -> String {
        crate::util::sha256_hex(self.key.as_bytes())[..16].to_string()
    }

    /// base64url of the 32 key bytes (the JWK `x`).
    pub fn x(&self) -> String {
        base64url(self.key.as_bytes())
    }
}

type Stamp = Option<(Option<std::time::SystemTime>, u64, PathBuf)>;
static PUBLIC_CACHE: std::sync::Mutex<Option<(Stamp, Option<OperatorPublic>)>> =
    std::sync::Mutex::new(None);

/// Workspaces this process opened: a public key inside one is the agent's to replace, so it
/// is never the operator's (`operator init` refuses to put one there; a configuration that
/// points into a workspace is refused here).
static WORKSPACE_ROOTS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Records that this process serves `root` (canonical): no public key under it is used.
pub fn refuse_keys_under(root: &Path) {
    let mut roots = WORKSPACE_ROOTS.lock().unwrap_or_else(|p| p.into_inner());
    if !roots.iter().any(|r| r == root) {
        roots.push(root.to_path_buf());
        // A key read before this root was known is judged again.
        *PUBLIC_CACHE.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// The public key as of now, re-read only when its file changes (a stat per call). `None`
/// when there is no readable public key, or when it lies inside a workspace this process
/// opened.
pub fn current_public() -> Option<OperatorPublic> {
    let path = public_key_path().ok()?;
    let stamp: Stamp = std::fs::metadata(&path)
        .ok()
        .map(|m| (m.modified().ok(), m.len(), path.clone()));
    let mut cache = PUBLIC_CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((s, k)) = cache.as_ref()
        && *s == stamp
        && stamp.is_some()
    {
        return k.clone();
    }
    let inside = WORKSPACE_ROOTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find_map(|root| refuse_inside(&path, root).err())
        .or_else(|| {
            use std::os::unix::fs::MetadataExt;
            let linked = std::fs::metadata(&path).is_ok_and(|m| m.nlink() > 1);
            linked.then(|| OperatorKeyError::HardLinked(path.clone()))
        });
    let key = match inside.map_or_else(|| OperatorPublic::load_from(&path), Err) {
        Ok(k) => Some(k),
        Err(e @ (OperatorKeyError::InsideWorkspace { .. } | OperatorKeyError::HardLinked(_))) => {
            tracing::error!(error = %e, "the operator public key is not used: the agent can replace it");
            None
        }
        Err(e) => {
            tracing::debug!(error = %e, "no operator public key");
            None
        }
    };
    *cache = Some((stamp, key.clone()));
    key
}

/// The private half. Only operator processes construct one; Debug never shows it.
pub struct OperatorSigner {
    key: SigningKey,
}

impl std::fmt::Debug for OperatorSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OperatorSigner({})", self.public().fingerprint())
    }
}

impl OperatorSigner {
    /// Creates a key pair: the private JWK at `path` (0600, parent 0700) and the public JWK
    /// at `public` (0644). Refuses to overwrite and refuses a location inside `workspace`.
    pub fn init(
        path: &Path,
        public: &Path,
        workspace: Option<&Path>,
    ) -> Result<OperatorPublic, OperatorKeyError> {
        if let Some(ws) = workspace {
            refuse_inside(path, ws)?;
        }
        let seed: [u8; 32] = crate::util::os_random_bytes(32)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| OperatorKeyError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::other("no random source"),
            })?;
        let signer = OperatorSigner {
            key: SigningKey::from_bytes(&seed),
        };
        let pubkey = signer.public();
        let private = Jwk {
            kty: "OKP".into(),
            crv: "Ed25519".into(),
            d: Some(base64url(&seed)),
            x: pubkey.x(),
        };
        write_new(path, &private, 0o600)?;
        let public_jwk = Jwk { d: None, ..private };
        if let Err(e) = write_new(public, &public_jwk, 0o644) {
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        Ok(pubkey)
    }

    pub fn load_from(path: &Path) -> Result<OperatorSigner, OperatorKeyError> {
        let jwk = parse_jwk(path, &read_file(path)?)?;
        let seed = jwk
            .d
            .as_deref()
            .and_then(Jwk::bytes)
            .ok_or_else(|| OperatorKeyError::Malformed(path.to_path_buf()))?;
        let signer = OperatorSigner {
            key: SigningKey::from_bytes(&seed),
        };
        if Jwk::bytes(&jwk.x) != Some(*signer.key.verifying_key().as_bytes()) {
            return Err(OperatorKeyError::Malformed(path.to_path_buf()));
        }
        Ok(signer)
    }

    /// Loads the private key and checks that the public key file beside it is its own, so a
    /// swapped public key is noticed by the operator before anything is signed.
    pub fn load() -> Result<OperatorSigner, OperatorKeyError> {
        let path = key_path()?;
        let signer = OperatorSigner::load_from(&path)?;
        let public = public_key_path()?;
        match OperatorPublic::load_from(&public) {
            Ok(p) if p == signer.public() => Ok(signer),
            Ok(_) => Err(OperatorKeyError::PairMismatch {
                private: path,
                public,
            }),
            Err(e) => Err(e),
        }
    }

    pub fn public(&self) -> OperatorPublic {
        OperatorPublic {
            key: self.key.verifying_key(),
        }
    }

    /// base64url Ed25519 signature over `message`.
    pub fn sign(&self, message: &[u8]) -> String {
        base64url(&self.key.sign(message).to_bytes())
    }
}

fn refuse_inside(path: &Path, ws: &Path) -> Result<(), OperatorKeyError> {
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let ws_abs = ws.canonicalize().unwrap_or_else(|_| abs(ws));
    let parent_abs = path
        .parent()
        .and_then(|p| p.canonicalize().ok())
        .unwrap_or_else(|| abs(path));
    // The file itself may be a symlink into the workspace (the agent writes its target).
    let target = path.canonicalize().ok();
    if parent_abs.starts_with(&ws_abs) || target.is_some_and(|t| t.starts_with(&ws_abs)) {
        return Err(OperatorKeyError::InsideWorkspace {
            path: path.to_path_buf(),
            workspace: ws_abs,
        });
    }
    Ok(())
}

fn write_new(path: &Path, jwk: &Jwk, mode: u32) -> Result<(), OperatorKeyError> {
    let io = |source| OperatorKeyError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        b.create(parent).map_err(io)?;
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, mode);
    let mut f = opts.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            OperatorKeyError::Exists(path.to_path_buf())
        } else {
            io(e)
        }
    })?;
    let mut text = serde_json::to_string(jwk).map_err(|e| io(std::io::Error::other(e)))?;
    text.push('\n');
    f.write_all(text.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)
}

/// Moves an old (HMAC) key file aside as `<path>.hmac-old` so `init` can create a new pair.
pub fn retire_legacy(path: &Path) -> Result<Option<PathBuf>, OperatorKeyError> {
    match read_file(path).and_then(|b| parse_jwk(path, &b).map(|_| ())) {
        Err(OperatorKeyError::LegacyHmac(_)) => {
            let aside = path.with_extension("hmac-old");
            std::fs::rename(path, &aside).map_err(|source| OperatorKeyError::Io {
                path: path.to_path_buf(),
                source,
            })?;
            Ok(Some(aside))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(dir: &Path) -> (PathBuf, PathBuf, OperatorPublic) {
        let (k, p) = (dir.join("cfg/operator.key"), dir.join("cfg/operator.pub"));
        let public = OperatorSigner::init(&k, &p, None).unwrap();
        (k, p, public)
    }

    #[test]
    fn init_writes_a_private_0600_jwk_and_its_public_half_and_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let (k, p, public) = pair(dir.path());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |f: &Path| std::fs::metadata(f).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&k), 0o600);
            assert_eq!(mode(&p), 0o644);
        }
        let pub_text = std::fs::read_to_string(&p).unwrap();
        assert!(!pub_text.contains("\"d\""), "{pub_text}");
        assert_eq!(OperatorPublic::load_from(&p).unwrap(), public);
        assert_eq!(OperatorSigner::load_from(&k).unwrap().public(), public);
        assert!(matches!(
            OperatorSigner::init(&k, &p, None),
            Err(OperatorKeyError::Exists(_))
        ));
        let (_, _, other) = pair(&dir.path().join("b"));
        assert_ne!(other, public);
    }

    #[test]
    fn signatures_verify_only_for_the_same_message_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let (k, _, public) = pair(dir.path());
        let signer = OperatorSigner::load_from(&k).unwrap();
        let sig = signer.sign(b"approve");
        assert!(public.verify(b"approve", &sig));
        assert!(!public.verify(b"approvE", &sig));
        assert!(!public.verify(b"approve", "zz"));
        assert!(!public.verify(b"approve", &base64url(&[0u8; 64])));
        let (_, _, other) = pair(&dir.path().join("b"));
        assert!(!other.verify(b"approve", &sig));
        let d = std::fs::read_to_string(&k).unwrap();
        assert!(!format!("{signer:?}").contains(&d[..20]));
    }

    #[test]
    fn an_old_hmac_key_gets_a_rotation_hint_and_can_be_retired() {
        let dir = tempfile::tempdir().unwrap();
        let k = dir.path().join("operator.key");
        std::fs::write(&k, format!("{}\n", "ab".repeat(32))).unwrap();
        let err = OperatorSigner::load_from(&k).unwrap_err();
        assert!(matches!(err, OperatorKeyError::LegacyHmac(_)));
        assert!(err.to_string().contains("gaffer operator init --rotate"));
        let aside = retire_legacy(&k).unwrap().unwrap();
        assert!(aside.exists() && !k.exists());
        std::fs::write(&k, "short").unwrap();
        assert!(matches!(
            OperatorSigner::load_from(&k),
            Err(OperatorKeyError::Malformed(_))
        ));
        assert!(matches!(
            OperatorPublic::load_from(&dir.path().join("none")),
            Err(OperatorKeyError::Missing(_))
        ));
    }

    #[test]
    fn init_refuses_a_path_inside_the_workspace() {
        let ws = tempfile::tempdir().unwrap();
        let k = ws.path().join(".gaffer/operator.key");
        assert!(matches!(
            OperatorSigner::init(&k, &ws.path().join("x.pub"), Some(ws.path())),
            Err(OperatorKeyError::InsideWorkspace { .. })
        ));
        assert!(!k.exists());
    }
}
