//! The operator's Ed25519 key pair, the only source of human authority in gaffer.
//!
//! The private half lives in the user's config directory (never the workspace) and is opened
//! only by the operator's own processes: `gaffer approve|deny|revoke|trust|client`, `gaffer
//! operator sign`, or an editor that signs with `node:crypto`. Serving processes load only the
//! public half, so nothing a serving process (or anything it starts) can read lets it sign.
//!
//! - [`keys`]: generation, the JWK files, loading, signing and verifying.
//! - [`signed`]: the signed-payload envelope every operator decision travels in.
//! - [`login`]: challenge-response for operator connections.

pub mod keys;
pub mod login;
pub mod signed;

pub use keys::{
    OperatorKeyError, OperatorPublic, OperatorSigner, current_public, key_path, public_key_path,
};
pub use signed::{Head, OperatorSignature, SignatureError};
