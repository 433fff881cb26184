//! The bundle digest.
//!
//! Algorithm (version 1, what a client must reproduce to send a matching digest):
//! 1. Take the bundle as parsed (JSON or YAML; both yield the same data model).
//! 2. Drop `metadata.digest`.
//! 3. Put the lists whose order carries no meaning in a fixed order: `profiles` sorted by
//!    selector (`kind`, then `value`, as byte strings), `declarations` sorted by (`kind`,
//!    `name`, `reference`), each profile's `toolsets` sorted. `command` keeps its order (argv
//!    order is meaning).
//! 4. Write defaults explicitly where a field has one (`input_mode`, default `stdin_text`) and
//!    omit absent optional fields and empty lists, so "left out" and "written as the default"
//!    give the same digest.
//! 5. Encode with RFC 8785 (JCS, see [`super::jcs`]) and hash the bytes with SHA-256.
//! 6. The digest is `sha256:` followed by the 64 lower-case hex digits.
//!
//! The canonical bytes are also what gaffer stores as the bundle's blob, so the blob's own
//! content address equals the hex part of the digest.

use super::jcs;
use super::types::Bundle;

/// Prefix of every bundle digest.
pub const DIGEST_PREFIX: &str = "sha256:";

/// A bundle put in canonical order with its encoding and digest.
#[derive(Clone, Debug)]
pub struct Canonical {
    /// The normalised bundle, `metadata.digest` cleared.
    pub bundle: Bundle,
    /// RFC 8785 bytes of `bundle`.
    pub bytes: Vec<u8>,
    /// `sha256:<hex>` of `bytes`.
    pub digest: String,
}

/// The bundle in canonical order, without its stated digest.
pub fn normalize(bundle: &Bundle) -> Bundle {
    let mut b = bundle.clone();
    b.metadata.digest = None;
    b.profiles.sort_by(|x, y| x.selector.cmp(&y.selector));
    for p in &mut b.profiles {
        p.toolsets.sort();
    }
    b.declarations.sort_by(|x, y| {
        (x.kind.as_str(), &x.name, &x.reference).cmp(&(y.kind.as_str(), &y.name, &y.reference))
    });
    b
}

/// Normalises, encodes and hashes `bundle`.
pub fn canonicalize(bundle: &Bundle) -> Canonical {
    let bundle = normalize(bundle);
    // Serialising our own plain data types to a JSON value cannot fail (no maps with
    // non-string keys, no non-finite floats).
    let value = serde_json::to_value(&bundle).unwrap_or(serde_json::Value::Null);
    let bytes = jcs::canonicalize(&value);
    let digest = format!("{DIGEST_PREFIX}{}", crate::util::sha256_hex(&bytes));
    Canonical {
        bundle,
        bytes,
        digest,
    }
}

/// The digest of `bundle` (see the module documentation).
pub fn digest(bundle: &Bundle) -> String {
    canonicalize(bundle).digest
}

/// The hex part of a `sha256:<hex>` digest.
pub fn digest_hex(digest: &str) -> &str {
    digest.strip_prefix(DIGEST_PREFIX).unwrap_or(digest)
}
