//! Operator login by challenge-response: the server hands out a fresh challenge bound to the
//! workspace and the connection, the operator's process signs it with the private key, and the
//! server checks the signature with the public key. The private key never crosses the wire,
//! and a signature answers exactly one challenge of one connection.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::keys::OperatorPublic;
use super::signed::canonical_text;

pub const DOMAIN: &str = "gaffer/login/v1";
/// A challenge must be answered within this time.
pub const CHALLENGE_TTL_MS: u64 = 120_000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Challenge {
    /// Always `gaffer/login/v1`.
    pub domain: String,
    /// `None` while the workspace has no store yet.
    pub workspace_id: Option<String>,
    pub workspace_root: String,
    /// Unique per connection of this process.
    pub connection_id: String,
    /// 18 random bytes, base64url.
    pub nonce: String,
    pub issued_at_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoginError {
    #[error("ask for a challenge first (`operator/challenge`)")]
    NoChallenge,
    #[error("the challenge expired; ask for a new one")]
    Expired,
    #[error("the signature does not answer the challenge under the operator's public key")]
    BadSignature,
    #[error("no operator public key on this machine; run `gaffer operator init`")]
    NoKey,
    #[error("no random source for a challenge")]
    NoRandom,
}

/// A fresh challenge's canonical text, which is exactly what the operator signs.
pub fn challenge(
    workspace_id: Option<String>,
    root: &Path,
    connection_id: &str,
) -> Result<(Challenge, String), LoginError> {
    let c = Challenge {
        domain: DOMAIN.into(),
        workspace_id,
        workspace_root: root.display().to_string(),
        connection_id: connection_id.into(),
        nonce: crate::util::random_bytes(18)
            .map(|b| crate::util::base64url(&b))
            .map_err(|_| LoginError::NoRandom)?,
        issued_at_ms: crate::util::now_ms(),
    };
    let text = canonical_text(&c);
    Ok((c, text))
}

/// Checks an answer to `issued` (the challenge this connection was given).
pub fn verify(
    issued: Option<&(Challenge, String)>,
    signature: &str,
    key: Option<&OperatorPublic>,
    now_ms: u64,
) -> Result<(), LoginError> {
    let (c, text) = issued.ok_or(LoginError::NoChallenge)?;
    if now_ms >= c.issued_at_ms + CHALLENGE_TTL_MS {
        return Err(LoginError::Expired);
    }
    let key = key.ok_or(LoginError::NoKey)?;
    if key.verify(text.as_bytes(), signature) {
        Ok(())
    } else {
        Err(LoginError::BadSignature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::OperatorSigner;

    #[test]
    fn only_the_operator_key_answers_this_connections_challenge_in_time() {
        let dir = tempfile::tempdir().unwrap();
        let (k, p) = (dir.path().join("k"), dir.path().join("k.pub"));
        let key = OperatorSigner::init(&k, &p, None).unwrap();
        let signer = OperatorSigner::load_from(&k).unwrap();
        let issued = challenge(Some("ws_a".into()), dir.path(), "c1").unwrap();
        let sig = signer.sign(issued.1.as_bytes());
        let now = issued.0.issued_at_ms;
        assert_eq!(verify(Some(&issued), &sig, Some(&key), now), Ok(()));
        let other = challenge(Some("ws_a".into()), dir.path(), "c2").unwrap();
        assert_eq!(
            verify(Some(&other), &sig, Some(&key), now),
            Err(LoginError::BadSignature),
            "a signature answers one challenge only"
        );
        assert_eq!(
            verify(Some(&issued), &sig, Some(&key), now + CHALLENGE_TTL_MS),
            Err(LoginError::Expired)
        );
        assert_eq!(
            verify(None, &sig, Some(&key), now),
            Err(LoginError::NoChallenge)
        );
        assert_eq!(
            verify(Some(&issued), &sig, None, now),
            Err(LoginError::NoKey)
        );
        assert!(issued.1.contains("\"domain\":\"gaffer/login/v1\""));
    }
}
