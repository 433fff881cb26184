//! The envelope an operator decision travels in: the RFC 8785 text of a payload and an
//! Ed25519 signature over exactly those bytes. Whoever checks authority opens the envelope
//! with the public key and reads the payload from the signed text, never from fields beside
//! it, so nothing unsigned can change what a signature means.

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::keys::{OperatorPublic, OperatorSigner};
use crate::operations::canonical::{Exact, jcs};

/// A journal position (the store's chain head type): the seq of a record and its hash.
pub use crate::store::chain::Head;

/// A payload the operator signs. Its `domain` keeps a signature for one purpose from ever
/// being accepted for another; its `head` is the journal position the operator saw.
pub trait Payload: Serialize + DeserializeOwned {
    const DOMAIN: &'static str;
    fn domain(&self) -> &str;
    fn head(&self) -> &Head;
}

/// Implements [`Payload`] for a struct with `domain: String` and `head: Head` fields.
macro_rules! signed_payload {
    ($t:ty, $domain:literal) => {
        impl $crate::operator::signed::Payload for $t {
            const DOMAIN: &'static str = $domain;
            fn domain(&self) -> &str {
                &self.domain
            }
            fn head(&self) -> &$crate::operator::signed::Head {
                &self.head
            }
        }
    };
}
pub(crate) use signed_payload;

/// Every payload domain gaffer signs or accepts.
pub const DOMAINS: [&str; 5] = [
    crate::operations::decision::DecisionPayload::DOMAIN,
    crate::operations::decision::RevokePayload::DOMAIN,
    crate::operations::trust::TrustPayload::DOMAIN,
    crate::clients::CredentialPayload::DOMAIN,
    crate::clients::ClientRevokePayload::DOMAIN,
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OperatorSignature {
    /// The payload's `head`, repeated where `gaffer store verify` reads it; checked equal to
    /// the signed one whenever the envelope is opened.
    pub head: Head,
    /// RFC 8785 text of the signed payload.
    pub payload: String,
    /// base64url Ed25519 signature over the payload's UTF-8 bytes.
    pub signature: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the operator signature does not verify under the operator's public key")]
    BadSignature,
    #[error("the signed payload is not RFC 8785 canonical JSON")]
    NotCanonical,
    #[error("the signed payload does not decode: {0}")]
    Malformed(String),
    #[error("the signature is for {found:?}, not {expected:?}")]
    WrongDomain { expected: String, found: String },
    #[error("the journal head beside the signature differs from the signed one")]
    HeadMismatch,
}

/// RFC 8785 text of a payload.
pub fn canonical_text<P: Serialize>(payload: &P) -> String {
    // Plain derived data always serialises.
    jcs(&serde_json::to_value(payload).unwrap_or(serde_json::Value::Null))
}

/// Checks that `text` is canonical JSON whose `domain` is one gaffer knows (what `gaffer
/// operator sign` accepts before signing for an editor).
pub fn check_signable(text: &str) -> Result<String, SignatureError> {
    let exact = Exact::parse_object(text).map_err(|e| SignatureError::Malformed(e.to_string()))?;
    if exact.jcs_text().ok().as_deref() != Some(text) {
        return Err(SignatureError::NotCanonical);
    }
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| SignatureError::Malformed(e.to_string()))?;
    let domain = v.get("domain").and_then(|d| d.as_str()).unwrap_or_default();
    if !DOMAINS.contains(&domain) && domain != super::login::DOMAIN {
        return Err(SignatureError::WrongDomain {
            expected: DOMAINS.join("|"),
            found: domain.to_string(),
        });
    }
    Ok(domain.to_string())
}

impl OperatorSignature {
    pub fn sign<P: Payload>(signer: &OperatorSigner, payload: &P) -> OperatorSignature {
        let text = canonical_text(payload);
        OperatorSignature {
            head: payload.head().clone(),
            signature: signer.sign(text.as_bytes()),
            payload: text,
        }
    }

    /// An envelope from parts that came over the wire (an editor signed `payload` itself).
    pub fn from_parts<P: Payload>(
        payload: String,
        signature: String,
    ) -> Result<OperatorSignature, SignatureError> {
        let p: P = decode::<P>(&payload)?;
        Ok(OperatorSignature {
            head: p.head().clone(),
            payload,
            signature,
        })
    }

    /// Verifies the signature and decodes the payload it covers.
    pub fn open<P: Payload>(&self, key: &OperatorPublic) -> Result<P, SignatureError> {
        if !key.verify(self.payload.as_bytes(), &self.signature) {
            return Err(SignatureError::BadSignature);
        }
        let p = decode::<P>(&self.payload)?;
        if *p.head() != self.head {
            return Err(SignatureError::HeadMismatch);
        }
        Ok(p)
    }
}

fn decode<P: Payload>(text: &str) -> Result<P, SignatureError> {
    let exact = Exact::parse_object(text).map_err(|e| SignatureError::Malformed(e.to_string()))?;
    if exact.jcs_text().ok().as_deref() != Some(text) {
        return Err(SignatureError::NotCanonical);
    }
    let p: P = serde_json::from_str(text).map_err(|e| SignatureError::Malformed(e.to_string()))?;
    if p.domain() != P::DOMAIN {
        return Err(SignatureError::WrongDomain {
            expected: P::DOMAIN.into(),
            found: p.domain().into(),
        });
    }
    Ok(p)
}
