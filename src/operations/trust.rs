//! Operator trust for the workspace files that grant power: `.gaffer/policy.yaml` (allow
//! rules) and `.gaffer/providers.yaml` (executables gaffer starts).
//!
//! The agent can write every file in the workspace, so a file's content counts only as far as
//! an operator-signed `trust.signed` journal record vouches for it. The signature binds the
//! workspace id, the file name, the sha256 of its bytes, a version and the journal head; the
//! trusted bytes are kept as a blob. The latest valid version is the trusted content whatever
//! happens to the file on disk afterwards: an edit, a deletion or an older copy restored
//! changes nothing that was trusted (its deny rules always hold) and its new allows count for
//! nothing until the operator trusts again. A record copied from another workspace names
//! another workspace id; a replayed older record has an older version.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::operator::signed::{Head, OperatorSignature, Payload};
use crate::operator::{OperatorPublic, OperatorSigner};
use crate::workspace::{NewRecord, Workspace};

pub const KIND_SIGNED: &str = "trust.signed";
/// The files whose content must be operator-signed before gaffer acts on it.
pub const TRUSTED_FILES: [&str; 2] = [
    super::policy::POLICY_FILE,
    super::adapters::external::PROVIDERS_FILE,
];
/// Records kept per file, so a flood cannot grow memory. When one more arrives, the one
/// claiming the lowest version goes and an exact copy of a kept one is dropped: replayed old
/// records cannot push the newest out. Records claiming versions they were never signed for can
/// (they do not verify), and then the version anchored outside the workspace refuses the older
/// trust that is left ([`TrustStatus::RolledBack`]).
const MAX_RECORDS_KEPT: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrustPayload {
    /// Always `gaffer/trust/v1`.
    pub domain: String,
    pub workspace_id: String,
    /// File name inside `.gaffer/`.
    pub file: String,
    /// sha256 of the trusted bytes; `None` trusts the file's absence.
    pub sha256: Option<String>,
    /// One more than the latest valid version the operator's process saw.
    pub version: u64,
    pub signed_at_ms: u64,
    pub head: Head,
}

crate::operator::signed::signed_payload!(TrustPayload, "gaffer/trust/v1");

/// A `trust.signed` record. `file` is repeated outside the signature only to index it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustRecord {
    pub file: String,
    pub operator_signature: OperatorSignature,
}

/// Trust records as folded (unverified: every check opens them again).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TrustState {
    #[serde(default)]
    pub files: BTreeMap<String, Vec<OperatorSignature>>,
    /// Seq of the last trust record folded (a cheap change stamp).
    #[serde(default)]
    pub last_seq: u64,
}

impl TrustState {
    pub fn apply(
        &mut self,
        rec: &crate::workspace::Record,
        _out: &mut Vec<crate::workspace::Notice>,
    ) {
        match rec.decode::<TrustRecord>() {
            Ok(r) if rec.kind == KIND_SIGNED && TRUSTED_FILES.contains(&r.file.as_str()) => {
                let v = self.files.entry(r.file).or_default();
                if !v.contains(&r.operator_signature) {
                    v.push(r.operator_signature);
                }
                if v.len() > MAX_RECORDS_KEPT
                    && let Some(lowest) = (0..v.len()).min_by_key(|i| claimed_version(&v[*i]))
                {
                    v.remove(lowest);
                }
                self.last_seq = rec.seq;
            }
            _ => tracing::warn!(seq = rec.seq, kind = %rec.kind, "trust record skipped"),
        }
    }

    /// The latest valid trust of `file` in `workspace_id`, and how many records did not verify.
    pub fn latest(
        &self,
        file: &str,
        key: &OperatorPublic,
        workspace_id: &str,
    ) -> (Option<TrustPayload>, usize) {
        let mut best: Option<TrustPayload> = None;
        let mut invalid = 0;
        for sig in self.files.get(file).into_iter().flatten() {
            match sig.open::<TrustPayload>(key) {
                Ok(p) if p.file == file && p.workspace_id == workspace_id => {
                    if best.as_ref().is_none_or(|b| p.version >= b.version) {
                        best = Some(p);
                    }
                }
                _ => invalid += 1,
            }
        }
        (best, invalid)
    }
}

/// The version a trust record says it has, unverified (only to choose which records to keep).
fn claimed_version(sig: &OperatorSignature) -> u64 {
    #[derive(Deserialize)]
    struct Version {
        version: u64,
    }
    serde_json::from_str::<Version>(&sig.payload).map_or(0, |v| v.version)
}

/// Where a trust-gated file stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TrustStatus {
    /// No file and no trust: nothing to trust.
    Absent,
    /// The file on disk is exactly what the operator trusted (or trusted as absent).
    Trusted,
    /// The file differs from the trusted content: the trusted content is enforced.
    Changed,
    /// The trusted file was deleted: the trusted content is enforced.
    Deleted,
    /// No valid trust record: only the file's deny rules count.
    NeverTrusted,
    /// No operator public key here, so nothing can be verified as trusted.
    NoOperatorKey,
    /// A valid trust record whose kept bytes are missing or corrupt: everything is refused.
    ContentMissing,
    /// The newest valid trust is older than the newest this machine verified (records were
    /// removed from the store), or the store was rolled back: everything is refused.
    RolledBack,
}

impl TrustStatus {
    /// The disk file is what gaffer enforces.
    pub fn is_trusted(self) -> bool {
        self == TrustStatus::Trusted
    }

    /// The disk differs from the trusted content (reported by doctor and status).
    pub fn is_drift(self) -> bool {
        matches!(self, TrustStatus::Changed | TrustStatus::Deleted)
    }

    /// Words for messages people read.
    pub fn describe(self) -> &'static str {
        match self {
            TrustStatus::Absent => "absent",
            TrustStatus::Trusted => "trusted",
            TrustStatus::Changed => {
                "changed since it was trusted (the trusted content is enforced)"
            }
            TrustStatus::Deleted => {
                "deleted since it was trusted (the trusted content is enforced)"
            }
            TrustStatus::NeverTrusted => "never trusted",
            TrustStatus::NoOperatorKey => "no operator public key on this machine",
            TrustStatus::ContentMissing => {
                "trusted, but the trusted bytes are missing from the store (everything is refused)"
            }
            TrustStatus::RolledBack => {
                "its newest trust is gone from the store, which was rolled back (everything is \
                 refused)"
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

/// A trust-gated file checked once, so the bytes checked are the bytes used.
#[derive(Debug, Clone)]
pub struct Checked {
    pub status: TrustStatus,
    /// The file on disk now (`None` when absent).
    pub disk: Option<Vec<u8>>,
    /// The latest valid trust, when there is one.
    pub trust: Option<TrustPayload>,
    /// The trusted bytes (`None` when trusted as absent, or when they are missing).
    pub trusted_bytes: Option<Vec<u8>>,
    /// Trust records for this file that do not verify (forged, copied, or another key's).
    pub invalid_records: usize,
}

impl Checked {
    /// The content gaffer acts on: the trusted bytes when there is a valid trust.
    pub fn enforced(&self) -> Option<&[u8]> {
        self.trusted_bytes.as_deref()
    }
}

/// One trust-gated file as `gaffer/status`, `gaffer trust --show` and doctor report it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct FileTrust {
    pub file: String,
    pub status: TrustStatus,
    pub detail: String,
    /// The file on disk differs from the trusted content (which is what gaffer enforces).
    pub drift: bool,
    /// sha256 of the file on disk now.
    pub sha256: Option<String>,
    pub trusted_sha256: Option<String>,
    pub trusted_version: Option<u64>,
    pub signed_at: Option<String>,
    /// Trust records for this file that do not verify (forged, copied, or another key's).
    pub invalid_records: usize,
}

/// Every trust-gated file's status, digests and drift.
pub fn report(ws: &Workspace, key: Option<&OperatorPublic>) -> Vec<FileTrust> {
    TRUSTED_FILES
        .iter()
        .map(|file| {
            let c = check(ws, file, key).unwrap_or_else(|e| {
                tracing::warn!(file, error = %e, "trust-gated file unreadable");
                Checked {
                    status: TrustStatus::NeverTrusted,
                    disk: None,
                    trust: None,
                    trusted_bytes: None,
                    invalid_records: 0,
                }
            });
            FileTrust {
                file: file.to_string(),
                status: c.status,
                detail: c.status.describe().to_string(),
                drift: c.status.is_drift(),
                sha256: c.disk.as_deref().map(crate::util::sha256_hex),
                trusted_sha256: c.trust.as_ref().and_then(|t| t.sha256.clone()),
                trusted_version: c.trust.as_ref().map(|t| t.version),
                signed_at: c
                    .trust
                    .as_ref()
                    .map(|t| super::views::rfc3339(t.signed_at_ms)),
                invalid_records: c.invalid_records,
            }
        })
        .collect()
}

fn read_disk(ws: &Workspace, file: &str) -> Result<Option<Vec<u8>>, TrustError> {
    let path = ws.gaffer_dir().join(file);
    match crate::util::read_regular_file(&path, Some(crate::util::CONFIG_FILE_LIMIT)) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TrustError::Io { path, source }),
    }
}

/// Checks `file` against the journal's trust records and the operator's public key.
pub fn check(
    ws: &Workspace,
    file: &str,
    key: Option<&OperatorPublic>,
) -> Result<Checked, TrustError> {
    let disk = read_disk(ws, file)?;
    let sigs = ws.read(|s| s.trust.clone_file(file));
    let mut out = Checked {
        status: TrustStatus::NeverTrusted,
        disk,
        trust: None,
        trusted_bytes: None,
        invalid_records: 0,
    };
    let (Some(key), Some(ws_id)) = (key, ws.workspace_id()) else {
        out.status = match (key, &out.disk) {
            (None, Some(_)) => TrustStatus::NoOperatorKey,
            (_, None) => TrustStatus::Absent,
            (Some(_), Some(_)) => TrustStatus::NeverTrusted,
        };
        return Ok(out);
    };
    let (latest, invalid) = sigs.latest(file, key, &ws_id);
    out.invalid_records = invalid;
    if !version_holds(ws, file, latest.as_ref().map_or(0, |t| t.version)) {
        out.status = TrustStatus::RolledBack;
        out.trust = latest;
        return Ok(out);
    }
    let disk_sha = out.disk.as_deref().map(crate::util::sha256_hex);
    out.status = match &latest {
        None if out.disk.is_none() => TrustStatus::Absent,
        None => TrustStatus::NeverTrusted,
        Some(t) if t.sha256 == disk_sha => TrustStatus::Trusted,
        Some(t) if t.sha256.is_some() && out.disk.is_none() => TrustStatus::Deleted,
        Some(_) => TrustStatus::Changed,
    };
    if let Some(sha) = latest.as_ref().and_then(|t| t.sha256.as_deref()) {
        match ws.get_blob(sha) {
            Ok(bytes) => out.trusted_bytes = Some(bytes),
            Err(e) => {
                tracing::error!(file, error = %e, "the trusted content is missing from the store");
                out.status = TrustStatus::ContentMissing;
            }
        }
    }
    out.trust = latest;
    Ok(out)
}

/// Whether `version` (0: none) is at least the newest trust of `file` this machine verified;
/// a newer one is anchored now. A store that does not stand intact holds no trust.
fn version_holds(ws: &Workspace, file: &str, version: u64) -> bool {
    if !ws.chain_ok() {
        tracing::error!(
            file,
            "the hash chain is broken, so no trust signature is accepted"
        );
        return false;
    }
    let Some(anchor) = ws.anchor() else {
        return ws.standing() == crate::anchor::Standing::Empty;
    };
    match anchor.trusted_version(file) {
        Ok(floor) if version < floor => {
            tracing::error!(
                file,
                version,
                floor,
                "the newest valid trust is older than one this machine verified"
            );
            false
        }
        Ok(floor) => {
            if version > floor
                && let Err(e) = anchor.raise_trusted(file, version)
            {
                tracing::warn!(file, error = %e, "the trust version cannot be anchored");
            }
            true
        }
        Err(e) => {
            tracing::error!(file, error = %e, "the workspace anchor cannot be read");
            false
        }
    }
}

impl TrustState {
    fn clone_file(&self, file: &str) -> TrustState {
        TrustState {
            files: self
                .files
                .get(file)
                .map(|v| BTreeMap::from([(file.to_string(), v.clone())]))
                .unwrap_or_default(),
            last_seq: self.last_seq,
        }
    }
}

/// What `sign` trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Signed {
    pub file: String,
    pub sha256: Option<String>,
    pub version: u64,
}

/// Signs the current content of `files` (each one of [`TRUSTED_FILES`]; an absent file is
/// trusted as absent) and appends the records. Refuses, writing nothing, unless each file in
/// `expect` still has the digest the operator reviewed, and refuses a file gaffer could not
/// load anyway.
pub async fn sign(
    ws: &std::sync::Arc<Workspace>,
    signer: &OperatorSigner,
    files: &[String],
    expect: &BTreeMap<String, String>,
) -> Result<Vec<Signed>, TrustError> {
    if let Some(unknown) = files.iter().find(|f| !TRUSTED_FILES.contains(&f.as_str())) {
        return Err(TrustError::Invalid(format!(
            "{unknown:?} is not one of {TRUSTED_FILES:?}"
        )));
    }
    let ws_id = ws
        .ensure_workspace_id()
        .await
        .map_err(|e| TrustError::Invalid(format!("cannot create the store: {e}")))?;
    let key = signer.public();
    let head = ws.journal_head();
    let mut records = Vec::new();
    let mut signed = Vec::new();
    for file in files {
        let disk = read_disk(ws, file)?;
        let sha256 = disk.as_deref().map(crate::util::sha256_hex);
        if let Some(bytes) = &disk {
            validate(ws, file, bytes)?;
        }
        if let Some(want) = expect.get(file)
            && sha256
                .as_deref()
                .is_none_or(|h| !want.eq_ignore_ascii_case(h))
        {
            return Err(TrustError::Invalid(format!(
                "{file} has sha256 {}, not the expected {want}; review it again",
                sha256.as_deref().unwrap_or("(absent)")
            )));
        }
        if let Some(bytes) = &disk {
            ws.put_blob(bytes)
                .map_err(|e| TrustError::Invalid(format!("cannot keep the trusted bytes: {e}")))?;
        }
        let (latest, _) = ws.read(|s| s.trust.latest(file, &key, &ws_id));
        let payload = TrustPayload {
            domain: TrustPayload::DOMAIN.into(),
            workspace_id: ws_id.clone(),
            file: file.clone(),
            sha256: sha256.clone(),
            // Above every version this machine verified too, so a store that lost its newest
            // trust (rolled back) is trusted again by this signature.
            version: latest.map_or(0, |l| l.version).max(floor(ws, file)) + 1,
            signed_at_ms: crate::util::now_ms(),
            head: head.clone(),
        };
        signed.push(Signed {
            file: file.clone(),
            sha256,
            version: payload.version,
        });
        let rec = TrustRecord {
            file: file.clone(),
            operator_signature: OperatorSignature::sign(signer, &payload),
        };
        records.push(
            NewRecord::new(KIND_SIGNED, &rec).map_err(|e| TrustError::Invalid(e.to_string()))?,
        );
    }
    ws.commit(move |_| Ok::<_, TrustError>((records, ())))
        .await
        .map_err(|e| match e {
            crate::workspace::CommitError::Rejected(e) => e,
            crate::workspace::CommitError::Store(e) => TrustError::Invalid(e.to_string()),
        })?;
    // The floor rises with the signature, not at some later check: removing this record
    // from the store can then never bring the version before it back.
    if let Some(anchor) = ws.restricting_anchor() {
        for s in &signed {
            if let Err(e) = anchor.raise_trusted(&s.file, s.version) {
                tracing::error!(file = %s.file, error = %e, "the trust version cannot be anchored");
            }
        }
    }
    Ok(signed)
}

/// The newest version of `file` this machine verified (0: none, or no anchor).
fn floor(ws: &Workspace, file: &str) -> u64 {
    ws.restricting_anchor()
        .and_then(|a| a.trusted_version(file).ok())
        .unwrap_or(0)
}

/// An operator should not sign a file gaffer would refuse to load anyway (nor a provider it
/// would refuse to start: one whose code lies in the workspace).
fn validate(ws: &Workspace, file: &str, bytes: &[u8]) -> Result<(), TrustError> {
    let path = ws.gaffer_dir().join(file);
    let text = std::str::from_utf8(bytes)
        .map_err(|_| TrustError::Invalid(format!("{}: not UTF-8", path.display())))?;
    // YAML ends a line at each of these too, so a review showing one line could hide several.
    if let Some((n, _)) = text
        .split('\n')
        .enumerate()
        .find(|(_, l)| l.contains(['\r', '\u{85}', '\u{2028}', '\u{2029}']))
    {
        return Err(TrustError::Invalid(format!(
            "{}:{}: a line break other than \\n (\\r, U+0085, U+2028 or U+2029), which YAML \
             takes for a line end the review does not show; write plain \\n line ends",
            path.display(),
            n + 1
        )));
    }
    if file == super::policy::POLICY_FILE {
        super::policy::Policy::parse(text, &path)
            .map_err(|e| TrustError::Invalid(e.to_string()))?;
    } else {
        super::adapters::external::check_declarations(text, &path, ws.root())
            .map_err(TrustError::Invalid)?;
    }
    Ok(())
}

/// The policy gaffer enforces now:
/// - a valid trust with kept bytes: that content, plus any deny rules of the file on disk
///   when it has drifted (an edit can add denies, never remove or widen);
/// - a valid trust of the file's absence: no rules (a human decides), plus the disk's denies;
/// - no valid trust: only the disk file's deny rules (every other operation waits for a human);
/// - a valid trust whose bytes are missing, or any unreadable trusted content: deny everything.
pub fn effective_policy(ws: &Workspace, key: Option<&OperatorPublic>) -> super::policy::Policy {
    use super::policy::{POLICY_FILE, Policy};
    let file = ws.gaffer_dir().join(POLICY_FILE);
    let parse = |bytes: &[u8]| {
        std::str::from_utf8(bytes)
            .map_err(|_| format!("{}: not UTF-8", file.display()))
            .and_then(|t| Policy::parse(t, &file).map_err(|e| e.to_string()))
    };
    let checked = match check(ws, POLICY_FILE, key) {
        Ok(c) => c,
        Err(e) => return Policy::refuse_all(format!("the policy cannot be read: {e}")),
    };
    if checked.status == TrustStatus::ContentMissing {
        return Policy::refuse_all("the trusted policy's bytes are missing from the store");
    }
    if checked.status == TrustStatus::RolledBack {
        return Policy::refuse_all(
            "the store was rolled back: its newest policy trust is not the newest this machine saw",
        );
    }
    let disk = match checked.disk.as_deref().map(parse) {
        None => None,
        Some(Ok(p)) => Some(p),
        Some(Err(e)) if checked.trust.is_none() => {
            return Policy::refuse_all(format!("the policy file is invalid: {e}"));
        }
        Some(Err(e)) => {
            tracing::warn!(error = %e, "the edited policy file is invalid; the trusted one holds");
            None
        }
    };
    let Some(_trust) = &checked.trust else {
        if let Some(p) = &disk {
            tracing::warn!(
                status = ?checked.status,
                "policy.yaml is not trusted by the operator; only its deny rules apply and every \
                 other operation waits for approval (run `gaffer trust`)"
            );
            return p.clone().into_untrusted();
        }
        return Policy::default();
    };
    let trusted = match checked.enforced().map(parse) {
        None => Policy::default(),
        Some(Ok(p)) => p,
        Some(Err(e)) => return Policy::refuse_all(format!("the trusted policy is invalid: {e}")),
    };
    match disk {
        Some(d) if checked.status.is_drift() => trusted.with_denies_of(d),
        _ => trusted,
    }
}
