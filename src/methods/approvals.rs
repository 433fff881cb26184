//! `approvals/*`: operator-only listing, decisions and revocation.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::App;
use super::operations::rpc_error;
use crate::operations::engine::Narrowing;
use crate::operations::operator::OperatorKey;
use crate::operations::state::DecisionKind;
use crate::operations::views::ApprovalView;
use crate::rpc::{Access, AppCode, Audience, CallCtx, MethodDef, Router, RpcError};

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Include decided, expired and canceled approvals too.
    #[serde(default)]
    pub all: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListResult {
    pub approvals: Vec<ApprovalView>,
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

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideParams {
    /// Approval id (`ap_…`) or the operation id (`op_…`).
    pub id: String,
    pub decision: DecisionKind,
    /// The approval revision the operator looked at.
    pub expected_revision: u64,
    /// Replaying the same key returns the original decision.
    pub idempotency_key: String,
    #[serde(default)]
    pub constraints: Option<Constraints>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeParams {
    pub id: String,
    #[serde(default)]
    pub expected_revision: Option<u64>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

fn operator_key() -> Result<OperatorKey, RpcError> {
    OperatorKey::load().map_err(|e| {
        tracing::error!(error = %e, "operator key unavailable");
        RpcError::app(
            AppCode::Forbidden,
            "operator_key_missing",
            "the operator key is not available to this process; run `gaffer operator init`",
        )
    })
}

pub fn register(r: &mut Router<App>) {
    r.add(
        MethodDef {
            name: "approvals/list",
            doc: "Approval requests (pending only unless `all`).",
            access: Access::Read,
            audience: Audience::Operator,
            mcp_tool: None,
        },
        |app: Arc<App>, _ctx: CallCtx, p: ListParams| async move {
            Ok::<_, RpcError>(ListResult {
                approvals: app.operations.approvals(p.all),
            })
        },
    );
    r.add(
        MethodDef {
            name: "approvals/decide",
            doc: "Approve or deny a pending request at `expected_revision`; optional narrowing of duration and uses.",
            access: Access::Write,
            audience: Audience::Operator,
            mcp_tool: None,
        },
        |app: Arc<App>, _ctx: CallCtx, p: DecideParams| async move {
            let key = operator_key()?;
            let c = p.constraints.unwrap_or_default();
            app.operations
                .decide(
                    &p.id,
                    p.decision,
                    p.expected_revision,
                    &p.idempotency_key,
                    Narrowing {
                        duration_seconds: c.duration_seconds,
                        max_uses: c.max_uses,
                    },
                    &key,
                )
                .await
                .map_err(rpc_error)
        },
    );
    r.add(
        MethodDef {
            name: "approvals/revoke",
            doc: "Revoke an active approval (or withdraw a pending request); an operation not yet executing is canceled.",
            access: Access::Write,
            audience: Audience::Operator,
            mcp_tool: None,
        },
        |app: Arc<App>, _ctx: CallCtx, p: RevokeParams| async move {
            app.operations
                .revoke(&p.id, p.expected_revision, p.idempotency_key.as_deref())
                .await
                .map_err(rpc_error)
        },
    );
    r.notification::<crate::operations::state::ApprovalRequested>(
        "approvals/requested",
        "A new approval request (operator connections only, from every gaffer process on the workspace).",
    );
}
