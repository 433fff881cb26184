//! Client identity: a credential the operator issued, never a name the client chose.
//!
//! `gaffer client add NAME` draws a random secret, signs a [`CredentialPayload`] holding the
//! secret's sha256 with the operator key, and prints the token
//! (`base64url(payload) "." signature "." secret`). A host passes the token to gaffer
//! (`GAFFER_CLIENT_TOKEN`, or the `clientToken` initialize option); gaffer checks it with the
//! operator's public key, the workspace id, the secret's digest and the revocations (the
//! journal's, and those this machine remembers outside the workspace). Without a token a
//! connection is `anonymous`: one shared scope, matched only by policy rules naming it.
//! The `client.issued` and `client.revoked` records carry the operator's signatures so every
//! process can list and check them; the records themselves grant nothing, and since the secret
//! is never recorded (only its digest), an agent reading the journal cannot rebuild a token.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::operator::signed::{Head, OperatorSignature, Payload};
use crate::operator::{OperatorPublic, OperatorSigner};
use crate::util::{base64url, base64url_decode};

pub const ANONYMOUS: &str = "anonymous";
pub const TOKEN_ENV: &str = "GAFFER_CLIENT_TOKEN";
pub const KIND_ISSUED: &str = "client.issued";
pub const KIND_REVOKED: &str = "client.revoked";
/// Names a credential can never carry: they mean something else already.
const RESERVED: [&str; 3] = [ANONYMOUS, "operator", "cli"];
/// Revocation records kept per credential (a flood of forged ones cannot grow memory).
const MAX_REVOCATIONS_KEPT: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CredentialPayload {
    /// Always `gaffer/client/v2`.
    pub domain: String,
    pub workspace_id: String,
    /// Unique per credential (`cl_…`), so one name can be reissued and the old one revoked.
    pub credential_id: String,
    /// The identity policy rules, scoping and the audit log use.
    pub name: String,
    /// sha256 (hex) of the token's secret part; the secret itself is in no record.
    pub secret_sha256: String,
    pub issued_at_ms: u64,
    pub head: Head,
}

crate::operator::signed::signed_payload!(CredentialPayload, "gaffer/client/v2");

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientRevokePayload {
    /// Always `gaffer/client-revoke/v1`.
    pub domain: String,
    pub workspace_id: String,
    pub credential_id: String,
    pub revoked_at_ms: u64,
    pub head: Head,
}

crate::operator::signed::signed_payload!(ClientRevokePayload, "gaffer/client-revoke/v1");

/// `client.issued` / `client.revoked` record payloads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedRecord {
    pub credential_id: String,
    pub operator_signature: OperatorSignature,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("the client token is malformed")]
    Malformed,
    #[error(
        "the client token has the old two-part form, which the journal's record of it could \
         rebuild; ask the operator for a new one (`gaffer client add`)"
    )]
    Outdated,
    #[error("the client token's secret is not the one its credential was issued with")]
    BadSecret,
    #[error("this machine's record of revoked credentials cannot be read")]
    Unverifiable,
    #[error("the client token is not signed by this machine's operator key")]
    BadSignature,
    #[error("the client token was issued for another workspace")]
    OtherWorkspace,
    #[error("the client credential {0} was revoked by the operator")]
    Revoked(String),
    #[error(
        "the client credential {0} carries more revocation records than are kept, so it is \
         refused; the operator can revoke it and issue a new one"
    )]
    Flooded(String),
    #[error("no operator public key here, so no client token can be checked")]
    NoOperatorKey,
    #[error(
        "client name {0:?} must be 1..=64 of [A-Za-z0-9._-] and not anonymous, operator or cli"
    )]
    BadName(String),
}

/// The token a process was started with (`GAFFER_CLIENT_TOKEN`), if any.
pub fn token_from_env() -> Option<String> {
    std::env::var(TOKEN_ENV)
        .ok()
        .filter(|t| !t.trim().is_empty())
}

/// Checks a name the operator wants to issue.
pub fn check_name(name: &str) -> Result<(), CredentialError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !RESERVED.contains(&name);
    ok.then_some(())
        .ok_or_else(|| CredentialError::BadName(name.to_string()))
}

/// A newly issued credential: what it says, its `client.issued` record payload and the token
/// to hand to the client (shown once: its secret is recorded nowhere).
pub struct Issued {
    pub payload: CredentialPayload,
    pub record: SignedRecord,
    pub token: String,
}

/// The token text: the signed payload, its signature and the secret.
fn token(sig: &OperatorSignature, secret: &str) -> String {
    format!(
        "{}.{}.{secret}",
        base64url(sig.payload.as_bytes()),
        sig.signature
    )
}

/// Signs a new credential for `name` with a fresh secret.
pub fn issue(
    signer: &OperatorSigner,
    workspace_id: &str,
    name: &str,
    head: Head,
) -> Result<Issued, CredentialError> {
    check_name(name)?;
    let secret = crate::util::random_bytes(32)
        .map(|b| base64url(&b))
        .map_err(|_| CredentialError::Malformed)?;
    let payload = CredentialPayload {
        domain: CredentialPayload::DOMAIN.into(),
        workspace_id: workspace_id.into(),
        credential_id: crate::util::new_id("cl_").map_err(|_| CredentialError::Malformed)?,
        name: name.into(),
        secret_sha256: crate::util::sha256_hex(secret.as_bytes()),
        issued_at_ms: crate::util::now_ms(),
        head,
    };
    let sig = OperatorSignature::sign(signer, &payload);
    Ok(Issued {
        token: token(&sig, &secret),
        record: SignedRecord {
            credential_id: payload.credential_id.clone(),
            operator_signature: sig,
        },
        payload,
    })
}

/// Signs the revocation of `credential_id`: the `client.revoked` record payload.
pub fn revoke(
    signer: &OperatorSigner,
    workspace_id: &str,
    credential_id: &str,
    head: Head,
) -> SignedRecord {
    let payload = ClientRevokePayload {
        domain: ClientRevokePayload::DOMAIN.into(),
        workspace_id: workspace_id.into(),
        credential_id: credential_id.into(),
        revoked_at_ms: crate::util::now_ms(),
        head,
    };
    SignedRecord {
        credential_id: credential_id.into(),
        operator_signature: OperatorSignature::sign(signer, &payload),
    }
}

/// Issued credentials and revocations as folded from the journal (unverified: every check
/// opens the signatures again).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClientState {
    #[serde(default)]
    pub issued: BTreeMap<String, OperatorSignature>,
    #[serde(default)]
    pub revoked: BTreeMap<String, Vec<OperatorSignature>>,
}

impl ClientState {
    pub fn apply(
        &mut self,
        rec: &crate::workspace::Record,
        _out: &mut Vec<crate::workspace::Notice>,
    ) {
        let parsed: Result<SignedRecord, _> = rec.decode();
        let Ok(r) = parsed else {
            tracing::warn!(seq = rec.seq, kind = %rec.kind, "client record skipped: malformed");
            return;
        };
        match rec.kind.as_str() {
            KIND_ISSUED => {
                self.issued
                    .entry(r.credential_id)
                    .or_insert(r.operator_signature);
            }
            KIND_REVOKED => {
                let v = self.revoked.entry(r.credential_id).or_default();
                if v.len() < MAX_REVOCATIONS_KEPT {
                    v.push(r.operator_signature);
                }
            }
            other => tracing::warn!(kind = other, "unknown client record skipped"),
        }
    }

    /// Whether `credential_id` is refused: a valid operator signature revokes it in
    /// `workspace_id`, or it was flooded with revocation records (see [`Self::flooded`]).
    pub fn is_revoked(
        &self,
        key: &OperatorPublic,
        workspace_id: &str,
        credential_id: &str,
    ) -> bool {
        self.flooded(credential_id) || self.revoked_by_operator(key, workspace_id, credential_id)
    }

    /// Whether a valid operator signature among the records kept revokes `credential_id`.
    pub fn revoked_by_operator(
        &self,
        key: &OperatorPublic,
        workspace_id: &str,
        credential_id: &str,
    ) -> bool {
        self.revoked.get(credential_id).is_some_and(|sigs| {
            sigs.iter().any(|s| {
                s.open::<ClientRevokePayload>(key).is_ok_and(|p| {
                    p.workspace_id == workspace_id && p.credential_id == credential_id
                })
            })
        })
    }

    /// A credential with as many revocation records as are kept was flooded (the operator
    /// revokes once): the operator's own may be among those dropped, so it is refused. Only
    /// an operator's signature makes that lasting (the anchor records no flood).
    pub fn flooded(&self, credential_id: &str) -> bool {
        self.revoked
            .get(credential_id)
            .is_some_and(|sigs| sigs.len() >= MAX_REVOCATIONS_KEPT)
    }

    /// Credentials whose issuing signature verifies, with their revocation status (`revoked`:
    /// refused here; `revoked_by_operator`: an operator's signature in the journal says so).
    pub fn list(&self, key: &OperatorPublic, workspace_id: &str) -> Vec<Value> {
        self.issued
            .values()
            .filter_map(|s| s.open::<CredentialPayload>(key).ok())
            .filter(|p| p.workspace_id == workspace_id)
            .map(|p| {
                serde_json::json!({
                    "name": p.name,
                    "credential_id": p.credential_id,
                    "issued_at": crate::operations::views::rfc3339(p.issued_at_ms),
                    "revoked": self.is_revoked(key, workspace_id, &p.credential_id),
                    "revoked_by_operator": self.revoked_by_operator(key, workspace_id, &p.credential_id),
                })
            })
            .collect()
    }
}

/// Checks a presented token against the journal's records; returns the credential it proves.
/// The caller also asks this machine's anchor whether the credential was revoked
/// ([`crate::anchor::Anchor::client_revoked`]): the journal may have been cut back.
pub fn verify(
    token: &str,
    key: Option<&OperatorPublic>,
    workspace_id: Option<&str>,
    state: &ClientState,
) -> Result<CredentialPayload, CredentialError> {
    let mut parts = token.trim().split('.');
    let (Some(payload_b64), Some(signature)) = (parts.next(), parts.next()) else {
        return Err(CredentialError::Malformed);
    };
    let secret = match (parts.next(), parts.next()) {
        (Some(secret), None) => secret,
        (None, _) => return Err(CredentialError::Outdated),
        (Some(_), Some(_)) => return Err(CredentialError::Malformed),
    };
    let payload = base64url_decode(payload_b64)
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or(CredentialError::Malformed)?;
    let sig = OperatorSignature::from_parts::<CredentialPayload>(payload, signature.to_string())
        .map_err(|_| CredentialError::Malformed)?;
    let key = key.ok_or(CredentialError::NoOperatorKey)?;
    let p = sig
        .open::<CredentialPayload>(key)
        .map_err(|_| CredentialError::BadSignature)?;
    if Some(p.workspace_id.as_str()) != workspace_id {
        return Err(CredentialError::OtherWorkspace);
    }
    if crate::util::sha256_hex(secret.as_bytes()) != p.secret_sha256 {
        return Err(CredentialError::BadSecret);
    }
    if state.revoked_by_operator(key, &p.workspace_id, &p.credential_id) {
        return Err(CredentialError::Revoked(p.credential_id));
    }
    if state.flooded(&p.credential_id) {
        return Err(CredentialError::Flooded(p.credential_id));
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer(dir: &std::path::Path) -> OperatorSigner {
        let (k, p) = (dir.join("k"), dir.join("k.pub"));
        OperatorSigner::init(&k, &p, None).unwrap();
        OperatorSigner::load_from(&k).unwrap()
    }

    fn head() -> Head {
        Head {
            seq: 3,
            hash: "h".into(),
        }
    }

    #[test]
    fn a_token_proves_its_name_only_in_its_workspace_and_until_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let s = signer(dir.path());
        let key = s.public();
        let Issued {
            payload: p,
            token: t,
            ..
        } = issue(&s, "ws_a", "vscode", head()).unwrap();
        let mut state = ClientState::default();
        assert_eq!(verify(&t, Some(&key), Some("ws_a"), &state).unwrap(), p);
        assert_eq!(
            verify(&t, Some(&key), Some("ws_b"), &state),
            Err(CredentialError::OtherWorkspace)
        );
        assert_eq!(
            verify(&t, None, Some("ws_a"), &state),
            Err(CredentialError::NoOperatorKey)
        );
        let r = revoke(&s, "ws_a", &p.credential_id, head());
        state
            .revoked
            .insert(p.credential_id.clone(), vec![r.operator_signature]);
        assert!(matches!(
            verify(&t, Some(&key), Some("ws_a"), &state),
            Err(CredentialError::Revoked(_))
        ));
    }

    #[test]
    fn the_journals_record_of_a_credential_does_not_make_its_token() {
        let dir = tempfile::tempdir().unwrap();
        let s = signer(dir.path());
        let key = s.public();
        let issued = issue(&s, "ws_a", "ci-agent", head()).unwrap();
        let state = ClientState::default();
        // What the `client.issued` record holds, and every token it could be made into.
        let recorded = serde_json::to_string(&issued.record).unwrap();
        let secret = issued.token.rsplit('.').next().unwrap();
        assert!(!recorded.contains(secret), "{recorded}");
        let sig = &issued.record.operator_signature;
        let old_form = format!("{}.{}", base64url(sig.payload.as_bytes()), sig.signature);
        assert_eq!(
            verify(&old_form, Some(&key), Some("ws_a"), &state),
            Err(CredentialError::Outdated)
        );
        for guess in ["", "x", &issued.payload.secret_sha256] {
            let t = format!("{old_form}.{guess}");
            assert_eq!(
                verify(&t, Some(&key), Some("ws_a"), &state),
                Err(CredentialError::BadSecret),
                "{guess:?}"
            );
        }
        assert_eq!(
            verify(
                &format!("{}.x", issued.token),
                Some(&key),
                Some("ws_a"),
                &state
            ),
            Err(CredentialError::Malformed)
        );
        assert!(verify(&issued.token, Some(&key), Some("ws_a"), &state).is_ok());
    }

    #[test]
    fn forged_tokens_and_revocations_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let s = signer(dir.path());
        let other = signer(&dir.path().join("o"));
        let Issued {
            payload: p,
            record: rec,
            token: t,
        } = issue(&s, "ws_a", "editor", head()).unwrap();
        let key = s.public();
        let state = ClientState::default();
        // The agent renames itself inside the signed payload.
        let secret = t.rsplit('.').next().unwrap();
        let forged_payload = rec.operator_signature.payload.replace("editor", "vscode");
        let forged = format!(
            "{}.{}.{secret}",
            base64url(forged_payload.as_bytes()),
            rec.operator_signature.signature
        );
        assert_eq!(
            verify(&forged, Some(&key), Some("ws_a"), &state),
            Err(CredentialError::BadSignature)
        );
        let by_other = issue(&other, "ws_a", "editor", head()).unwrap();
        assert_eq!(
            verify(&by_other.token, Some(&key), Some("ws_a"), &state),
            Err(CredentialError::BadSignature)
        );
        assert_eq!(
            verify("nodot", Some(&key), Some("ws_a"), &state),
            Err(CredentialError::Malformed)
        );
        // A revocation signed by another key does not count.
        let mut st = ClientState::default();
        let r = revoke(&other, "ws_a", &p.credential_id, head());
        st.revoked
            .insert(p.credential_id.clone(), vec![r.operator_signature]);
        assert!(!st.is_revoked(&key, "ws_a", &p.credential_id));
    }

    #[test]
    fn names_are_checked() {
        for bad in ["", "anonymous", "operator", "cli", "a b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["vscode", "agent-1", "lane.a_b"] {
            assert!(check_name(good).is_ok());
        }
    }
}
