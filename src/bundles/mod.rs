//! Config bundles: the content-addressed configuration workers are pinned to.
//!
//! A bundle arrives as JSON or YAML text (or an already-parsed JSON value), is validated
//! against the boundary rules ([`validate`]), put in canonical order and hashed ([`digest`],
//! [`jcs`]). Its canonical bytes become a blob and a `bundle.synced` journal record makes it
//! available; [`BundleState`] is the fold of those records. Ids are write-once per workspace.

pub mod digest;
pub use crate::jcs;
pub mod state;
pub mod types;
pub mod validate;

pub use state::{BundleState, SYNCED_KIND, SyncOutcome, SyncedBundle};
pub use types::{
    Availability, Bundle, BundleRef, BundleSummary, Declaration, DeclarationKind, InputMode,
    Metadata, Profile, ProfileSelector, Provenance,
};
pub use validate::FieldError;

use serde_json::Value;

/// Why a bundle operation was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    #[error("invalid bundle: {0}")]
    Invalid(#[from] FieldError),
    /// `expected` is the digest on record (or stated by the client), `actual` the other one.
    #[error("bundle {id}: digest {actual} does not match {expected}")]
    DigestMismatch {
        id: String,
        expected: String,
        actual: String,
    },
    #[error("bundle {id} has not been synced to this workspace")]
    Missing { id: String },
}

/// Parses bundle text: JSON when it starts with `{`, YAML otherwise.
pub fn parse_text(text: &str) -> Result<Bundle, FieldError> {
    if text.len() > validate::MAX_BUNDLE_BYTES {
        return Err(FieldError::new(
            "bundle",
            format!(
                "is {} bytes; the limit is {}",
                text.len(),
                validate::MAX_BUNDLE_BYTES
            ),
        ));
    }
    let value: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text)
            .map_err(|e| FieldError::new("bundle", format!("is not valid JSON: {e}")))?
    } else {
        serde_yaml::from_str(text)
            .map_err(|e| FieldError::new("bundle", format!("is not valid YAML: {e}")))?
    };
    parse_value(value)
}

/// Turns a JSON value into a typed bundle, naming the field that does not fit.
pub fn parse_value(value: Value) -> Result<Bundle, FieldError> {
    if !value.is_object() {
        return Err(FieldError::new("bundle", "must be an object"));
    }
    serde_path_to_error::deserialize::<_, Bundle>(value).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." || path.is_empty() {
            "bundle".to_string()
        } else {
            path
        };
        FieldError::new(field, e.into_inner().to_string())
    })
}

/// A validated bundle ready to be stored.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub canonical: digest::Canonical,
    pub summary: BundleSummary,
}

impl Prepared {
    pub fn reference(&self) -> BundleRef {
        BundleRef {
            id: self.summary.id.clone(),
            digest: self.summary.digest.clone(),
        }
    }
}

/// Validates `bundle`, computes its digest and checks it against the one the client stated.
pub fn prepare(bundle: &Bundle) -> Result<Prepared, BundleError> {
    validate::validate_bundle(bundle)?;
    let canonical = digest::canonicalize(bundle);
    // Text input is bounded before parsing; a bundle sent as a JSON object is bounded here.
    if canonical.bytes.len() > validate::MAX_BUNDLE_BYTES {
        return Err(BundleError::Invalid(FieldError::new(
            "bundle",
            format!(
                "is {} bytes in canonical form; the limit is {}",
                canonical.bytes.len(),
                validate::MAX_BUNDLE_BYTES
            ),
        )));
    }
    if let Some(stated) = &bundle.metadata.digest
        && *stated != canonical.digest
    {
        return Err(BundleError::DigestMismatch {
            id: bundle.metadata.id.clone(),
            expected: stated.clone(),
            actual: canonical.digest.clone(),
        });
    }
    let summary = summarize(bundle, &canonical);
    Ok(Prepared { canonical, summary })
}

fn summarize(bundle: &Bundle, c: &digest::Canonical) -> BundleSummary {
    let m = &bundle.metadata;
    BundleSummary {
        id: m.id.clone(),
        digest: c.digest.clone(),
        digest_algorithm: "sha256".to_string(),
        revision: m.revision.clone(),
        created_at: m.created_at.clone(),
        provenance: m.provenance.clone(),
        profile_count: bundle.profiles.len(),
        declaration_count: bundle.declarations.len(),
        profiles: c.profiles.clone(),
        size_bytes: c.bytes.len(),
    }
}

/// Parses a stored blob back into the bundle (it holds the canonical bytes).
pub fn from_blob(bytes: &[u8]) -> Result<Bundle, FieldError> {
    serde_json::from_slice(bytes)
        .map_err(|e| FieldError::new("bundle", format!("stored bundle is unreadable: {e}")))
}

#[cfg(test)]
mod tests;

/// Why a pinned bundle cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinnedError {
    #[error("the bundle {0} is not synced")]
    NotSynced(String),
    #[error("the bundle body is unreadable")]
    Unreadable,
    #[error("the stored bundle does not have the pinned digest")]
    DigestMismatch,
    #[error("the stored bundle breaks the boundary rules: {0}")]
    Invalid(FieldError),
}

/// The bundle a reference pins, read from the store with its digest recomputed from the body
/// and the boundary rules checked again: a record saying "synced" is not enough (the agent
/// may write `.gaffer/`, blob and record alike, around sync's checks).
pub fn load_pinned(
    ws: &crate::workspace::Workspace,
    pinned: &BundleRef,
) -> Result<Bundle, PinnedError> {
    let synced = ws
        .read(|s| s.bundles.bundles.get(&pinned.id).cloned())
        .ok_or_else(|| PinnedError::NotSynced(pinned.id.clone()))?;
    let bytes = ws
        .get_blob(&synced.blob)
        .map_err(|_| PinnedError::Unreadable)?;
    let bundle = from_blob(&bytes).map_err(|_| PinnedError::Unreadable)?;
    if digest::digest(&bundle) != pinned.digest {
        return Err(PinnedError::DigestMismatch);
    }
    validate::validate_bundle(&bundle).map_err(PinnedError::Invalid)?;
    Ok(bundle)
}
