//! `operations/*`: submit, get, list, wait, cancel and catalog, for agents and operators.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::App;
use crate::operations::adapter::Descriptor;
use crate::operations::engine::{ErrorKind, ListFilter, OpError, SubmitInput};
use crate::operations::lifecycle::OpState;
use crate::operations::trust::TrustStatus;
use crate::operations::views::OperationView;
use crate::rpc::{Access, AppCode, Audience, CallCtx, MethodDef, Role, Router, RpcError};

/// Maps a domain refusal to a reply with a stable `data.code`.
pub fn rpc_error(e: OpError) -> RpcError {
    let mut r = match e.kind {
        ErrorKind::Invalid => RpcError::invalid_params(e.field.as_deref().unwrap_or(""), e.message),
        ErrorKind::NotFound => RpcError::app(AppCode::NotFound, &e.code, e.message),
        ErrorKind::Conflict => RpcError::app(AppCode::Conflict, &e.code, e.message),
        ErrorKind::Forbidden => RpcError::app(AppCode::Forbidden, &e.code, e.message),
        ErrorKind::Unavailable => RpcError::app(AppCode::Unavailable, &e.code, e.message),
        ErrorKind::Store => RpcError::app(AppCode::Store, &e.code, e.message),
    };
    r = r.with_data("code", e.code.as_str());
    if let Some(f) = e.field {
        r = r.with_data("field", f);
    }
    r
}

/// An unknown operation's error names the operations that exist.
fn with_known_operations(app: &App, e: OpError) -> RpcError {
    if e.code != crate::operations::lifecycle::codes::NOT_REGISTERED {
        return rpc_error(e);
    }
    let registry = app.operations.registry();
    let known: Vec<&str> = registry.names();
    let mut r = rpc_error(e);
    r.message = format!("{}; known operations: {}", r.message, known.join(", "));
    r.with_data("known_operations", known)
}

/// Agents see their own operations; operators see everyone's.
fn scope(ctx: &CallCtx) -> Option<&str> {
    match ctx.client.role {
        Role::Operator => None,
        Role::Agent => Some(ctx.client.id.as_str()),
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitParams {
    /// Catalog operation name, e.g. `file.write`.
    pub operation: String,
    /// JSON object naming what the operation acts on (see `operations/catalog`).
    #[schemars(with = "serde_json::Map<String, Value>")]
    pub target: Box<serde_json::value::RawValue>,
    /// JSON object with the operation's arguments.
    #[schemars(with = "serde_json::Map<String, Value>")]
    pub arguments: Box<serde_json::value::RawValue>,
    /// Why the agent wants this (shown to the operator).
    pub reason: String,
    /// Replaying the same key with the same request returns the same operation.
    pub idempotency_key: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SubmitResult {
    #[serde(flatten)]
    pub operation: OperationView,
    /// False when this was a replay of an earlier submission.
    pub created: bool,
    /// Seconds to wait before polling again (absent once terminal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IdParams {
    pub id: String,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Only these states.
    #[serde(default)]
    pub states: Vec<OpState>,
    /// Only this operation name.
    #[serde(default)]
    pub operation: Option<String>,
    /// At most this many (default 100, max 1000), newest first.
    #[serde(default)]
    pub limit: Option<usize>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListResult {
    pub operations: Vec<OperationView>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitParams {
    pub id: String,
    /// Return as soon as the revision is greater than this. Default: the operation's current
    /// revision, so the call waits for the next change (or returns at once when terminal).
    #[serde(default)]
    pub after_revision: Option<u64>,
    /// Longest wait in seconds, 0..=30 (default 30).
    #[serde(default)]
    pub wait_seconds: Option<u64>,
}

/// `operations/wait` result: the operation, and whether the wait ran out.
#[derive(Debug, Serialize, JsonSchema)]
pub struct WaitResult {
    #[serde(flatten)]
    pub operation: OperationView,
    /// True when `wait_seconds` passed with no change past `after_revision` and the operation
    /// is not terminal: call again to keep waiting.
    pub timed_out: bool,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CatalogParams {}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CatalogResult {
    pub operations: Vec<Descriptor>,
    /// True when `.gaffer/policy.yaml` exists but the operator has not trusted its current
    /// content (`gaffer trust`): only its deny rules apply, and every other operation waits
    /// for approval with the default bounds.
    pub untrusted_policy: bool,
    /// Present when external providers are off, saying why (e.g. `providers.yaml` is not
    /// trusted). Only the built-in operations are listed then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_providers_disabled: Option<String>,
    /// Trusted providers that did not start, and why (their operations are not listed): a
    /// command or variable naming the workspace, a failed start or `describe`, a drifted or
    /// clashing catalog.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external_providers_failed: Vec<crate::operations::adapters::external::ProviderFailure>,
    /// Operator trust of each file that can grant power.
    pub trust: TrustReport,
}

/// Operator trust of `policy.yaml` (checked now) and `providers.yaml` (as checked when this
/// gaffer process started its providers).
#[derive(Debug, Serialize, JsonSchema)]
pub struct TrustReport {
    pub policy: TrustStatus,
    pub providers: TrustStatus,
}

/// `operations/changed`: folded as this type and sent as its JSON.
pub use crate::operations::state::ChangedNotice;

pub fn register(r: &mut Router<App>) {
    r.add(
        MethodDef {
            name: "operations/submit",
            doc: "Ask gaffer to perform a side effect (write a file, run a command, ...). Call `operation_catalog` first to learn the operation names and the JSON Schemas of their `target` and `arguments`. Policy decides: the operation runs now, waits for a human operator's approval, or is denied. Returns the operation (`id`, `state`, `revision`); `created` is false when the same `idempotency_key` was replayed. Next: call `wait_operation` with the `id` until `state` is terminal (succeeded, failed, denied, canceled, expired); do not resubmit while it waits.",
            access: Access::Write,
            audience: Audience::Anyone,
            mcp_tool: Some("submit_operation"),
        },
        |app: Arc<App>, ctx: CallCtx, p: SubmitParams| async move {
            let (op, created) = app
                .operations
                .submit(
                    &ctx.client.id,
                    SubmitInput {
                        operation: p.operation,
                        target: p.target,
                        arguments: p.arguments,
                        reason: p.reason,
                        idempotency_key: p.idempotency_key,
                    },
                )
                .await
                .map_err(|e| with_known_operations(&app, e))?;
            let retry = (!op.state.is_terminal()).then_some(2);
            Ok(SubmitResult {
                operation: op,
                created,
                retry_after_seconds: retry,
            })
        },
    );
    r.add(
        MethodDef {
            name: "operations/get",
            doc: "Read one of your operations by `id` now, without waiting: its `state`, `revision`, the plan, the approval (if any) and the result or error once finished. Use `wait_operation` instead to wait for a change.",
            access: Access::Read,
            audience: Audience::Anyone,
            mcp_tool: Some("get_operation"),
        },
        |app: Arc<App>, ctx: CallCtx, p: IdParams| async move {
            app.operations.get(scope(&ctx), &p.id).map_err(rpc_error)
        },
    );
    r.add(
        MethodDef {
            name: "operations/list",
            doc: "List your operations, newest first, optionally only some `states` or one `operation` name. Use it to find an operation id you lost; then `get_operation` or `wait_operation`.",
            access: Access::Read,
            audience: Audience::Anyone,
            mcp_tool: Some("list_operations"),
        },
        |app: Arc<App>, ctx: CallCtx, p: ListParams| async move {
            Ok::<_, RpcError>(ListResult {
                operations: app.operations.list(
                    scope(&ctx),
                    &ListFilter {
                        states: p.states,
                        operation: p.operation,
                        limit: p.limit,
                    },
                ),
            })
        },
    );
    r.add(
        MethodDef {
            name: "operations/wait",
            doc: "Wait for an operation to change: returns as soon as its `revision` passes `after_revision` (default: the current revision, so the next change) or it is terminal, else after `wait_seconds` (default and maximum 30). The result is the operation plus `timed_out` (true when nothing changed in time). Call it again with the returned `revision` as `after_revision` until `state` is terminal; an operation waiting for a human may take minutes.",
            access: Access::Read,
            audience: Audience::Anyone,
            mcp_tool: Some("wait_operation"),
        },
        |app: Arc<App>, ctx: CallCtx, p: WaitParams| async move {
            let wait = p.wait_seconds.unwrap_or(30);
            let ops = Arc::clone(&app.operations);
            let after = match p.after_revision {
                Some(r) => r,
                None => ops.get(scope(&ctx), &p.id).map_err(rpc_error)?.revision,
            };
            // Clients that passed a progress token see the wait as a long-running task.
            ctx.progress.begin(&format!("Waiting for operation {}", p.id));
            let r = tokio::select! {
                r = ops.wait(scope(&ctx), &p.id, after, wait) => r.map_err(rpc_error),
                _ = ctx.cancel.cancelled() => Err(RpcError::cancelled()),
            };
            match &r {
                Ok(v) => ctx.progress.end(&format!("{} at revision {}", v.state, v.revision)),
                Err(e) => ctx.progress.end(&e.message),
            }
            r.map(|operation| WaitResult {
                timed_out: operation.revision <= after && !operation.state.is_terminal(),
                operation,
            })
        },
    );
    r.add(
        MethodDef {
            name: "operations/cancel",
            doc: "Cancel one of your operations that has not started executing (pending or approved; its approval is canceled or revoked). Returns the operation in state `canceled`; an executing or finished operation gives an error saying so.",
            access: Access::Write,
            audience: Audience::Anyone,
            mcp_tool: Some("cancel_operation"),
        },
        |app: Arc<App>, ctx: CallCtx, p: IdParams| async move {
            app.operations.cancel(scope(&ctx), &p.id).await.map_err(rpc_error)
        },
    );
    r.add(
        MethodDef {
            name: "operations/catalog",
            doc: "List every operation you can submit: its name, what it does, and JSON Schemas of its `target` and `arguments`, plus whether the operator trusts the workspace policy (an untrusted policy means most operations wait for a human). Call this before `submit_operation`, and again when a submit says an operation is unknown.",
            access: Access::Read,
            audience: Audience::Anyone,
            mcp_tool: Some("operation_catalog"),
        },
        |app: Arc<App>, _ctx: CallCtx, _p: CatalogParams| async move {
            let ops = &app.operations;
            let (policy, providers) = (ops.policy_trust(), ops.providers_trust());
            let untrusted = |s: TrustStatus| !matches!(s, TrustStatus::Absent | TrustStatus::Trusted);
            Ok::<_, RpcError>(CatalogResult {
                operations: ops.registry().descriptors().cloned().collect(),
                untrusted_policy: untrusted(policy),
                external_providers_disabled: untrusted(providers).then(|| {
                    format!(
                        "providers.yaml is not trusted by the operator ({}); run `gaffer trust` and restart gaffer",
                        providers.describe()
                    )
                }),
                external_providers_failed: ops.providers_failed().to_vec(),
                trust: TrustReport { policy, providers },
            })
        },
    );
    r.notification::<ChangedNotice>(
        "operations/changed",
        "An operation changed state (sent to every client of every gaffer process on the workspace).",
    );
}
