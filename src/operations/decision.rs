//! What an operator signs when deciding: every fact the decision depends on, so that no
//! unsigned field of any record can change what was approved.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::policy::{Classification, GrantMode};
use super::state::DecisionKind;
use crate::operator::signed::Head;

/// An approve or deny decision on one approval request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionPayload {
    /// Always `gaffer/decision/v1`.
    pub domain: String,
    pub workspace_id: String,
    pub approval_id: String,
    pub operation_id: String,
    /// The authenticated identity that submitted the operation.
    pub client: String,
    pub operation: String,
    /// sha256 of the canonical plan text the operator was shown.
    pub plan_digest: String,
    /// sha256 of the RFC 8785 text of the plan's classification (what a window covers).
    pub classification_digest: String,
    pub mode: GrantMode,
    pub decision: DecisionKind,
    /// The approval's revision after this decision (the one decided on, plus one).
    pub revision: u64,
    pub decided_at_ms: u64,
    /// Approve only: the approval is unusable from this instant.
    pub expires_at_ms: Option<u64>,
    pub max_uses: u32,
    /// What the operator narrowed (`None` = as requested).
    pub narrowed_duration_seconds: Option<u64>,
    pub narrowed_max_uses: Option<u32>,
    /// Deny only: the operator's words, passed to the agent unchanged.
    pub reason: Option<String>,
    pub head: Head,
}

crate::operator::signed::signed_payload!(DecisionPayload, "gaffer/decision/v1");

/// Revoking an active approval (or withdrawing a pending request).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokePayload {
    /// Always `gaffer/revoke/v1`.
    pub domain: String,
    pub workspace_id: String,
    pub approval_id: String,
    /// The approval's revision after the revocation.
    pub revision: u64,
    pub revoked_at_ms: u64,
    pub head: Head,
}

crate::operator::signed::signed_payload!(RevokePayload, "gaffer/revoke/v1");

/// sha256 of the RFC 8785 text of a classification.
pub fn classification_digest(class: &Classification) -> String {
    crate::util::sha256_hex(crate::operator::signed::canonical_text(class).as_bytes())
}
