//! What clients see of operations and approvals (no plan text, no signatures). What an
//! operator decides from is rendered from the plan text itself ([`PlanShown`]), never from
//! the unsigned fields beside it in a record.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use super::adapter::Presentation;
use super::lifecycle::OpState;
use super::policy::{Classification, GrantMode};
use super::state::{Approval, ApprovalStatus, OpFailure, Operation, Transitioned, UseState};

/// A plan as its adapter presents it, decoded from the digest-checked plan text.
#[derive(Debug, Clone)]
pub struct PlanShown {
    pub target: Value,
    pub arguments: Value,
    pub presentation: Presentation,
    pub classification: Classification,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct OperationView {
    pub id: String,
    pub client_id: String,
    pub idempotency_key: String,
    pub operation: String,
    pub target: Arc<Value>,
    pub arguments: Arc<Value>,
    pub reason: String,
    pub state: OpState,
    pub revision: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub terminal_at: Option<String>,
    pub presentation: Presentation,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_digest: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<OpFailure>,
}

impl OperationView {
    pub fn of(op: &Operation) -> OperationView {
        Self::at(
            op,
            op.state,
            op.revision,
            op.updated_at_ms,
            op.terminal_at_ms,
            None,
        )
    }

    /// `op` as it reads once `t` is folded into it (the fold's own rules for these fields),
    /// without a copy of the operation to fold it into.
    pub fn after(op: &Operation, t: &Transitioned) -> OperationView {
        let updated = t.at_ms.max(op.updated_at_ms);
        let terminal = if t.to.is_terminal() {
            Some(updated)
        } else {
            op.terminal_at_ms
        };
        Self::at(op, t.to, t.revision, updated, terminal, t.error.as_ref())
    }

    fn at(
        op: &Operation,
        state: OpState,
        revision: u64,
        updated_at_ms: u64,
        terminal_at_ms: Option<u64>,
        error: Option<&OpFailure>,
    ) -> OperationView {
        OperationView {
            id: op.id.clone(),
            client_id: op.client_id.clone(),
            idempotency_key: op.idempotency_key.clone(),
            operation: op.operation.clone(),
            target: op.target.clone(),
            arguments: op.arguments.clone(),
            reason: op.reason.clone(),
            state,
            revision,
            approval_id: op.approval_id.clone(),
            created_at: rfc3339(op.created_at_ms),
            updated_at: rfc3339(updated_at_ms),
            terminal_at: terminal_at_ms.map(rfc3339),
            presentation: op.presentation.clone(),
            plan_digest: op.plan_digest.clone(),
            result: op.result.clone(),
            upstream_status: op.upstream_status,
            error: error.or(op.error.as_ref()).cloned(),
        }
    }
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ApprovalView {
    pub approval_id: String,
    pub operation_id: String,
    pub client_id: String,
    /// Whether a gaffer on this machine accepted this request from `client_id`'s checked
    /// connection (its record carries this machine's seal). False for a request written into
    /// the store by anything else, by gaffer on another machine or before seals existed: such
    /// a request names a client nothing vouches for, is listed only on request and cannot be
    /// approved (deny it, or have the client submit again).
    pub requester_verified: bool,
    pub operation: String,
    pub status: ApprovalStatus,
    /// Pass this as `expected_revision` when deciding.
    pub revision: u64,
    pub plan_digest: String,
    pub mode: GrantMode,
    pub created_at: String,
    pub pending_expires_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    pub requested_duration_seconds: u64,
    pub requested_max_uses: u32,
    pub uses_spent: u32,
    pub retained: bool,
    /// The requester's stated reason (the agent's words, not part of what runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Rendered by the adapter from the plan text; absent when the plan does not verify.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// What would run, from the plan text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub classification: Option<Classification>,
    /// Why the plan cannot be shown (it does not verify, or its adapter refuses it now).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_problem: Option<String>,
    /// The operator's reason for a denial.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation_state: Option<OpState>,
    /// `approvals/get` only: the canonical plan, a file change's diff, a command's argv and
    /// limits, the allowed narrowings and the time left (absent when the plan does not verify).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<super::detail::ApprovalDetail>,
}

impl ApprovalView {
    pub fn of(
        a: &Approval,
        op: Option<&Operation>,
        requester_verified: bool,
        shown: Result<&PlanShown, &str>,
    ) -> ApprovalView {
        let plan = shown.ok();
        // The operation's digest (the one its plan text is checked against when shown), and
        // its client and name: what a decision binds, never the request's copies.
        ApprovalView {
            approval_id: a.id.clone(),
            operation_id: a.operation_id.clone(),
            client_id: op.map_or_else(|| a.client_id.clone(), |o| o.client_id.clone()),
            requester_verified,
            operation: op.map_or_else(|| a.operation.clone(), |o| o.operation.clone()),
            status: a.status,
            revision: a.revision,
            plan_digest: op
                .and_then(|o| o.plan_digest.clone())
                .unwrap_or_else(|| a.plan_digest.clone()),
            mode: a.mode,
            created_at: rfc3339(a.created_at_ms),
            pending_expires_at: rfc3339(a.pending_expires_at_ms),
            expires_at: a
                .decision
                .as_ref()
                .and_then(|d| d.expires_at_ms)
                .map(rfc3339),
            requested_duration_seconds: a.requested_duration_seconds,
            requested_max_uses: a.requested_max_uses,
            uses_spent: a.uses_spent(),
            retained: a.uses.values().any(|u| *u == UseState::Retained),
            reason: op.map(|o| o.reason.clone()),
            title: plan.map(|p| p.presentation.title.clone()),
            summary: plan.map(|p| p.presentation.summary.clone()),
            target: plan.map(|p| p.target.clone()),
            arguments: plan.map(|p| p.arguments.clone()),
            classification: plan.map(|p| p.classification.clone()),
            plan_problem: shown.err().map(str::to_string),
            decision_reason: a.decision.as_ref().and_then(|d| d.reason.clone()),
            operation_state: op.map(|o| o.state),
            detail: None,
        }
    }
}

/// `2026-11-29T08:32:33.123Z` from Unix milliseconds.
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    if !(0..=9999).contains(&y) {
        return format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
            rem / 3600,
            (rem % 3600) / 60,
            rem % 60,
            ms % 1000
        );
    }
    // Every view carries two or three of these: digits written directly, not through `format!`.
    let mut out = [0u8; 24];
    let mut put = |at: usize, width: usize, v: u64| {
        let mut v = v;
        for i in (at..at + width).rev() {
            out[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, 4, y as u64);
    put(5, 2, m as u64);
    put(8, 2, d as u64);
    put(11, 2, rem / 3600);
    put(14, 2, (rem % 3600) / 60);
    put(17, 2, rem % 60);
    put(20, 3, ms % 1000);
    for (i, c) in [
        (4, b'-'),
        (7, b'-'),
        (10, b'T'),
        (13, b':'),
        (16, b':'),
        (19, b'.'),
        (23, b'Z'),
    ] {
        out[i] = c;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(
            super::rfc3339(1_795_941_153_123),
            "2026-11-29T08:32:33.123Z"
        );
        // The fast path agrees with the general one over a spread of instants.
        for ms in (0..400u64).map(|i| i * 7_919_876_543 + i) {
            let secs = ms / 1000;
            let whole = super::rfc3339(ms);
            assert_eq!(whole.len(), 24, "{whole}");
            assert_eq!(&whole[20..23], format!("{:03}", ms % 1000), "{whole}");
            assert_eq!(&whole[17..19], format!("{:02}", secs % 60), "{whole}");
        }
    }
}
