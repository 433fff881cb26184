//! The fold of `bundle.*` journal records: which bundles this workspace holds.

use std::collections::BTreeMap;

use crate::store::RecordPayload;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::types::{Availability, BundleRef, BundleSummary};
use super::{BundleError, Prepared, digest};

/// Journal record kind written when a bundle becomes available.
pub const SYNCED_KIND: &str = "bundle.synced";

/// One synced bundle. The body lives in the blob store under `blob`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncedBundle {
    pub digest: String,
    /// Hex sha256 of the canonical body (the blob's address).
    pub blob: String,
    pub summary: BundleSummary,
    pub synced_seq: u64,
    pub synced_ms: u64,
}

impl SyncedBundle {
    pub fn availability(&self) -> Availability {
        Availability {
            reference: BundleRef {
                id: self.summary.id.clone(),
                digest: self.digest.clone(),
            },
            summary: self.summary.clone(),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BundleState {
    /// By bundle id.
    pub bundles: BTreeMap<String, SyncedBundle>,
}

/// What a sync amounts to against the current state.
#[derive(Clone, Debug)]
pub enum SyncOutcome {
    /// The same id and digest is already here; nothing to write.
    AlreadySynced(Availability),
    /// A new bundle: write this record (after storing the blob).
    New {
        kind: &'static str,
        payload: Value,
        availability: Availability,
    },
}

impl BundleState {
    /// Decides a sync: idempotent for the same id + digest, refused for another digest.
    pub fn plan_sync(&self, prepared: &Prepared) -> Result<SyncOutcome, BundleError> {
        let id = &prepared.summary.id;
        let digest = &prepared.summary.digest;
        if let Some(existing) = self.bundles.get(id) {
            if existing.digest == *digest {
                return Ok(SyncOutcome::AlreadySynced(existing.availability()));
            }
            return Err(BundleError::DigestMismatch {
                id: id.clone(),
                expected: existing.digest.clone(),
                actual: digest.clone(),
            });
        }
        let payload = json!({
            "id": id,
            "digest": digest,
            "blob": digest::digest_hex(digest),
            "summary": prepared.summary,
        });
        Ok(SyncOutcome::New {
            kind: SYNCED_KIND,
            payload,
            availability: Availability {
                reference: prepared.reference(),
                summary: prepared.summary.clone(),
            },
        })
    }

    /// Availability of `reference`, or why it is not available.
    pub fn check(&self, reference: &BundleRef) -> Result<&SyncedBundle, BundleError> {
        let found = self
            .bundles
            .get(&reference.id)
            .ok_or_else(|| BundleError::Missing {
                id: reference.id.clone(),
            })?;
        if found.digest != reference.digest {
            return Err(BundleError::DigestMismatch {
                id: reference.id.clone(),
                expected: found.digest.clone(),
                actual: reference.digest.clone(),
            });
        }
        Ok(found)
    }

    pub fn list(&self) -> Vec<BundleSummary> {
        self.bundles.values().map(|b| b.summary.clone()).collect()
    }

    /// Folds one journal record (the workspace dispatches `bundle.*` here). Bundles cause no
    /// notifications.
    pub fn apply(
        &mut self,
        rec: &crate::workspace::Record,
        _out: &mut Vec<crate::workspace::Notice>,
    ) {
        self.apply_record(&rec.kind, rec.seq, rec.time_ms, &*rec.payload);
    }

    /// Folds one record in. Records were validated before they were written; anything that
    /// does not decode is logged and skipped so a damaged record cannot stop the fold.
    pub fn apply_record(
        &mut self,
        kind: &str,
        seq: u64,
        time_ms: u64,
        payload: &(impl RecordPayload + ?Sized),
    ) {
        if kind != SYNCED_KIND {
            tracing::debug!(kind, seq, "bundle state ignores unknown record kind");
            return;
        }
        #[derive(Deserialize)]
        struct Synced {
            id: String,
            digest: String,
            blob: String,
            summary: BundleSummary,
        }
        let rec: Synced = match payload.decode() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(seq, error = %e, "skipping undecodable bundle.synced record");
                return;
            }
        };
        if let Some(existing) = self.bundles.get(&rec.id) {
            if existing.digest != rec.digest {
                tracing::warn!(seq, id = %rec.id, "skipping bundle.synced that would rebind an id");
            }
            return;
        }
        self.bundles.insert(
            rec.id,
            SyncedBundle {
                digest: rec.digest,
                blob: rec.blob,
                summary: rec.summary,
                synced_seq: seq,
                synced_ms: time_ms,
            },
        );
    }
}
