//! `approvals/*`: operator-only listing and decisions. Decisions arrive signed: the operator's
//! own process signs the payload `approvals/prepare` returns, and `approvals/decide` or
//! `approvals/revoke` checks that signature with the operator's public key.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::App;
use super::operations::rpc_error;
use crate::operations::decision::{DecisionPayload, RevokePayload};
use crate::operations::engine::{DecisionRequest, Narrowing, OpError};
use crate::operations::state::DecisionKind;
use crate::operations::views::ApprovalView;
use crate::operator::signed::OperatorSignature;
use crate::rpc::{Access, Audience, CallCtx, MethodDef, Router, RpcError};

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Include decided, expired and canceled approvals too.
    #[serde(default)]
    pub all: bool,
    /// Include requests no gaffer on this machine accepted (`requester_verified: false`).
    #[serde(default)]
    pub include_unverified: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListResult {
    pub approvals: Vec<ApprovalView>,
    /// Requests left out because no gaffer on this machine accepted them (records written
    /// into the store by something else); `include_unverified` lists them.
    pub unverified_hidden: u64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetParams {
    /// Approval id (`ap_…`) or the operation id (`op_…`).
    pub id: String,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Constraints {
    /// Approve for a shorter time than requested.
    #[serde(default)]
    pub duration_seconds: Option<u64>,
    /// Approve fewer uses than requested.
    #[serde(default)]
    pub max_uses: Option<u32>,
}

/// What the operator is about to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Approve,
    Deny,
    Revoke,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrepareParams {
    /// Approval id (`ap_…`) or the operation id (`op_…`).
    pub id: String,
    pub decision: Action,
    /// The approval revision the operator looked at.
    pub expected_revision: u64,
    /// The `plan_digest` of the approval the operator was shown: required to approve (a plan
    /// that no longer has it is refused with `plan_changed`), checked when given to deny.
    #[serde(default)]
    pub expected_plan_digest: Option<String>,
    #[serde(default)]
    pub constraints: Option<Constraints>,
    /// Deny only: the operator's words, passed to the agent in the operation's error.
    #[serde(default)]
    pub reason: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct PrepareResult {
    /// The exact RFC 8785 text to sign with the operator's Ed25519 key (base64url signature).
    pub payload: String,
    /// The approval as the decision will find it, rendered from the plan text (absent for
    /// a revocation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalView>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SignedParams {
    /// The `payload` text `approvals/prepare` returned, unchanged.
    pub payload: String,
    /// base64url Ed25519 signature of `payload` by the operator key.
    pub signature: String,
    /// Replaying the same key with the same payload returns the original decision.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

fn envelope<P: crate::operator::signed::Payload>(
    p: &SignedParams,
) -> Result<OperatorSignature, RpcError> {
    OperatorSignature::from_parts::<P>(p.payload.clone(), p.signature.clone())
        .map_err(|e| RpcError::invalid_params("payload", e.to_string()))
}

async fn prepare(app: &App, p: PrepareParams) -> Result<PrepareResult, OpError> {
    if p.decision == Action::Revoke {
        let (_, text) = app
            .operations
            .prepare_revoke(&p.id, Some(p.expected_revision))?;
        return Ok(PrepareResult {
            payload: text,
            approval: None,
        });
    }
    let c = p.constraints.unwrap_or_default();
    let prepared = app
        .operations
        .prepare_decision(&DecisionRequest {
            id: p.id,
            decision: match p.decision {
                Action::Approve => DecisionKind::Approve,
                _ => DecisionKind::Deny,
            },
            expected_revision: p.expected_revision,
            expected_plan_digest: p.expected_plan_digest,
            narrowing: Narrowing {
                duration_seconds: c.duration_seconds,
                max_uses: c.max_uses,
            },
            reason: p.reason,
        })
        .await?;
    Ok(PrepareResult {
        payload: prepared.text,
        approval: Some(prepared.approval),
    })
}

pub fn register(r: &mut Router<App>) {
    r.add(
        MethodDef {
            name: "approvals/list",
            doc: "Approval requests (pending only unless `all`; only those a gaffer on this machine accepted unless `include_unverified`), each rendered from its plan text.",
            access: Access::Read,
            audience: Audience::Operator,
            mcp_tool: None,
        },
        |app: Arc<App>, _ctx: CallCtx, p: ListParams| async move {
            let (approvals, unverified_hidden) =
                app.operations.approvals(p.all, p.include_unverified).await;
            Ok::<_, RpcError>(ListResult {
                approvals,
                unverified_hidden,
            })
        },
    );
    r.add(
        MethodDef {
            name: "approvals/get",
            doc: "One approval (by approval or operation id), rendered from its plan text.",
            access: Access::Read,
            audience: Audience::Operator,
            mcp_tool: None,
        },
        |app: Arc<App>, _ctx: CallCtx, p: GetParams| async move {
            app.operations.approval(&p.id).await.map_err(rpc_error)
        },
    );
    r.add(
        MethodDef {
            name: "approvals/prepare",
            doc: "The exact payload to sign for approving, denying or revoking an approval at `expected_revision` (optional narrowing, deny reason).",
            access: Access::Read,
            audience: Audience::Operator,
            mcp_tool: None,
        },
        |app: Arc<App>, _ctx: CallCtx, p: PrepareParams| async move {
            prepare(&app, p).await.map_err(rpc_error)
        },
    );
    r.add(
        MethodDef {
            name: "approvals/decide",
            doc: "Record an approve or deny decision: a payload from `approvals/prepare` and the operator's signature over it.",
            access: Access::Write,
            audience: Audience::Operator,
            mcp_tool: None,
        },
        |app: Arc<App>, _ctx: CallCtx, p: SignedParams| async move {
            let sig = envelope::<DecisionPayload>(&p)?;
            let key = p.idempotency_key.unwrap_or_else(|| crate::util::sha256_hex(p.payload.as_bytes()));
            app.operations.decide(sig, &key).await.map_err(rpc_error)
        },
    );
    r.add(
        MethodDef {
            name: "approvals/revoke",
            doc: "Revoke an active approval (or withdraw a pending request) with a signed payload from `approvals/prepare`; an operation not yet executing is canceled.",
            access: Access::Write,
            audience: Audience::Operator,
            mcp_tool: None,
        },
        |app: Arc<App>, _ctx: CallCtx, p: SignedParams| async move {
            let sig = envelope::<RevokePayload>(&p)?;
            app.operations
                .revoke(sig, p.idempotency_key.as_deref())
                .await
                .map_err(rpc_error)
        },
    );
    r.notification::<crate::operations::state::ApprovalRequested>(
        "approvals/requested",
        "A new approval request (operator connections only, from every gaffer process on the workspace).",
    );
}
