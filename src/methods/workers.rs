//! `workers/create`, `workers/input`, `workers/get`, `workers/list`, `workers/transcript`,
//! `workers/stop`, and the `workers/changed` / `workers/output` notifications.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::App;
use super::bundles::{Checked, bundle_error, field_error};
use crate::operations::lifecycle::OpState;
use crate::rpc::{Access, AppCode, Audience, CallCtx, MethodDef, Role, Router, RpcError};
use crate::workers::request::{self, CreateRequest, InputShape};
use crate::workers::{Stream, TranscriptEntry, Worker, WorkerError, WorkerStatus};
use crate::workspace::State;

/// Maps a worker refusal to its stable error.
pub fn worker_error(e: &WorkerError) -> RpcError {
    match e {
        WorkerError::Invalid(f) => field_error("", f),
        WorkerError::Bundle(b) => bundle_error("config_bundle", b),
        WorkerError::ProfileNotInBundle { profile, bundle_id } => RpcError::invalid_params(
            "profile",
            format!("`profile`: {profile} is not part of bundle {bundle_id}"),
        ),
        WorkerError::IdempotencyConflict { key, worker_id } => RpcError::app(
            AppCode::Conflict,
            "idempotency_conflict",
            format!("idempotency key {key} was already used for a different request"),
        )
        .with_data("worker_id", worker_id.as_str()),
        WorkerError::BackendUnavailable { profile, message } => RpcError::app(
            AppCode::Unavailable,
            "execution_backend_unavailable",
            format!("no execution backend can run profile {profile}: {message}"),
        ),
        WorkerError::SpawnFailed {
            worker_id,
            diagnostic,
        } => RpcError::app(
            AppCode::Failed,
            "worker_spawn_failed",
            format!("worker {worker_id} could not be started: {diagnostic}"),
        )
        .with_data("worker_id", worker_id.as_str())
        .with_data("diagnostic", diagnostic.as_str()),
        WorkerError::NotFound { worker_id } => RpcError::app(
            AppCode::NotFound,
            "worker_not_found",
            format!("worker {worker_id} not found"),
        )
        .with_data("worker_id", worker_id.as_str()),
        WorkerError::NotInputCapable { worker_id, why } => RpcError::app(
            AppCode::Conflict,
            "worker_not_input_capable",
            format!("worker {worker_id} does not take input: {why}"),
        )
        .with_data("worker_id", worker_id.as_str()),
        WorkerError::Store(_) => RpcError::app(
            AppCode::Store,
            "store_unavailable",
            "the workspace store failed; see the server log",
        ),
    }
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct WorkerResult {
    pub worker: Worker,
}

/// `workers/input` params.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputParams {
    pub worker_id: String,
    /// Text, or `{"segments": [...]}` with text, paste and file_ref segments.
    pub input: InputShape,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct InputResult {
    pub worker_id: String,
    /// Transcript seq of the accepted input.
    pub seq: u64,
    pub worker: Worker,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetParams {
    pub worker_id: String,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Only workers in this status.
    #[serde(default)]
    pub status: Option<WorkerStatus>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListResult {
    pub workers: Vec<Worker>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TranscriptParams {
    pub worker_id: String,
    /// Entries with a seq greater than this (default 0: from the start).
    #[serde(default)]
    pub after_seq: u64,
    /// Page size (default 200, at most 1000).
    #[serde(default)]
    pub limit: Option<usize>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct TranscriptResult {
    pub worker_id: String,
    pub entries: Vec<TranscriptEntry>,
    /// Pass as `after_seq` for the next page.
    pub next_after_seq: u64,
    pub has_more: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StopParams {
    pub worker_id: String,
    #[serde(default)]
    pub reason: Option<String>,
}

/// `workers/changed` params.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ChangedNotice {
    pub worker_id: String,
    pub worker: Worker,
}

/// `workers/output` params.
#[derive(Debug, Serialize, JsonSchema)]
pub struct OutputNotice {
    pub worker_id: String,
    pub seq: u64,
    pub stream: Stream,
    pub text: String,
}

const TRANSCRIPT_DEFAULT: usize = 200;
/// How long `workers/create` waits for a start that policy allowed at once.
const START_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
const TRANSCRIPT_MAX: usize = 1000;

pub fn register(r: &mut Router<App>) {
    r.add(
        MethodDef {
            name: "workers/create",
            doc: "Start a worker process from a profile of a config bundle you synced with `sync_bundle` (pass `config_bundle` as the `{id, digest}` it returned, and the `profile` selector). Optional `initial_input` is delivered at start. Workers always run in the workspace root: raw paths, cwd, sockets and credentials are refused. Returns `worker` (its `id`, `status`). Next: `read_worker_transcript` for its output, `send_worker_input` to talk to it, `stop_worker` when done.",
            access: Access::Write,
            audience: Audience::Anyone,
            mcp_tool: Some("create_worker"),
        },
        create,
    );
    r.add(
        MethodDef {
            name: "workers/input",
            doc: "Send text (or segments) to the input of a running worker you created. Returns the transcript `seq` of the input; the worker's answer appears later in `read_worker_transcript` (pass `after_seq` = that seq to read only what came after).",
            access: Access::Write,
            audience: Audience::Anyone,
            mcp_tool: Some("send_worker_input"),
        },
        input,
    );
    r.add(
        MethodDef {
            name: "workers/get",
            doc: "Read one worker by `worker_id`: `status` (running, stopped, exited, failed), whether it takes input, its exit code and any diagnostic. Use `read_worker_transcript` for what it printed.",
            access: Access::Read,
            audience: Audience::Anyone,
            mcp_tool: Some("get_worker"),
        },
        get,
    );
    r.add(
        MethodDef {
            name: "workers/list",
            doc: "List the workers you created (operators: every worker) in creation order, optionally only one `status`. Use it to find a worker id; then `get_worker` or `read_worker_transcript`.",
            access: Access::Read,
            audience: Audience::Anyone,
            mcp_tool: Some("list_workers"),
        },
        list,
    );
    r.add(
        MethodDef {
            name: "workers/transcript",
            doc: "Read what a worker said and was told: its input, stdout/stderr output and system notes, oldest first, one page at a time (`limit`, default 200). Returns `entries`, `next_after_seq` and `has_more`: while `has_more` is true, call again with `after_seq` set to `next_after_seq`. To see new output later, call again with the last `next_after_seq`.",
            access: Access::Read,
            audience: Audience::Anyone,
            mcp_tool: Some("read_worker_transcript"),
        },
        transcript,
    );
    r.add(
        MethodDef {
            name: "workers/stop",
            doc: "Stop a worker you created (give a short `reason`); its process is ended by the gaffer process that runs it. Waits briefly and returns the worker, normally with `status` stopped. Stopping a worker that already ended returns it unchanged. Another client's worker is not found (operators may stop any).",
            access: Access::Write,
            audience: Audience::Anyone,
            mcp_tool: Some("stop_worker"),
        },
        stop,
    );
    r.notification::<ChangedNotice>(
        "workers/changed",
        "A worker was created or its status, input or stop request changed.",
    );
    r.notification::<OutputNotice>("workers/output", "New worker output (coalesced chunks, in seq order), from any gaffer process on the workspace.");
}

async fn create(
    app: Arc<App>,
    ctx: CallCtx,
    p: Checked<CreateRequest>,
) -> Result<WorkerResult, RpcError> {
    let mut req = request::parse_create(&p.value, Some(app.workspace.root()))
        .map_err(|e| field_error("", &e))?;
    req.created_by = Some(ctx.client.id.clone());
    let mut worker = app
        .workers
        .create(req)
        .await
        .map_err(|e| worker_error(&e))?;
    if worker.status == WorkerStatus::PendingApproval && worker.operation_id.is_none() {
        worker = request_start(&app, &ctx.client.id, worker).await?;
    }
    Ok(WorkerResult { worker })
}

/// Submits the `worker.start` operation that gates a pending worker (policy, approval,
/// execute-once) and records which one it is. Idempotent per worker.
async fn request_start(app: &App, client: &str, worker: Worker) -> Result<Worker, RpcError> {
    use crate::operations::adapters::worker::{OPERATION, StartTarget};
    let target = StartTarget {
        worker_id: worker.id.clone(),
        config_bundle: worker.config_bundle.clone(),
        profile: worker.profile.clone(),
    };
    let bad = |_| RpcError::internal("worker.start plan");
    let input = crate::operations::engine::SubmitInput {
        operation: OPERATION.into(),
        target: serde_json::value::to_raw_value(&target).map_err(bad)?,
        arguments: serde_json::value::to_raw_value(&serde_json::json!({})).map_err(bad)?,
        reason: format!("start worker {}", worker.id),
        idempotency_key: format!("worker.start:{}", worker.id),
    };
    let (op, _) = app
        .operations
        .submit(client, input)
        .await
        .map_err(super::operations::rpc_error)?;
    app.workers
        .link_operation(&worker.id, &op.id)
        .await
        .map_err(|e| worker_error(&e))?;
    if op.state == OpState::Approved {
        // A one-shot process (the CLI) has no background driver; driving is idempotent.
        app.operations.drive(&op.id).await;
    }
    if matches!(op.state, OpState::Approved | OpState::Executing) {
        // Authorized at once: answer with the started (or failed) worker, as a direct start would.
        settle(app, client, &op.id, op.revision).await;
    }
    let w = app
        .workspace
        .read(|s| s.workers.get(&worker.id).cloned())
        .ok_or_else(|| {
            worker_error(&WorkerError::NotFound {
                worker_id: worker.id,
            })
        })?;
    if w.status == WorkerStatus::Failed && w.exit.is_none() {
        let diagnostic = w
            .diagnostic
            .clone()
            .unwrap_or_else(|| "could not be started".into());
        return Err(worker_error(&WorkerError::SpawnFailed {
            worker_id: w.id,
            diagnostic,
        }));
    }
    Ok(w)
}

/// Waits (bounded) until the operation is terminal.
async fn settle(app: &App, client: &str, id: &str, mut revision: u64) {
    let deadline = tokio::time::Instant::now() + START_WAIT;
    while tokio::time::Instant::now() < deadline {
        match app.operations.wait(Some(client), id, revision, 1).await {
            Ok(v) if v.state.is_terminal() => return,
            Ok(v) => revision = v.revision,
            Err(_) => return,
        }
    }
}

async fn input(
    app: Arc<App>,
    ctx: CallCtx,
    p: Checked<InputParams>,
) -> Result<InputResult, RpcError> {
    let req = request::parse_input_request(&p.value, Some(app.workspace.root()))
        .map_err(|e| field_error("", &e))?;
    visible_worker(&app, &ctx, &req.worker_id)?;
    let (worker, seq) = app
        .workers
        .input(&req.worker_id, req.input)
        .await
        .map_err(|e| worker_error(&e))?;
    Ok(InputResult {
        worker_id: req.worker_id,
        seq,
        worker,
    })
}

/// Whether the caller may see and drive `w`: the client that created it (the identity its
/// connection established: an operator-issued credential, a lane connection, or `anonymous`),
/// the client that launched the plan a lane worker runs for (plans are scoped the same way),
/// and operators. `created_by` is written only by the creating process's own record, which no
/// later record changes.
fn visible(ctx: &CallCtx, s: &State, w: &Worker) -> bool {
    ctx.client.role == Role::Operator || seen_by(ctx.client.id.as_str(), s, w)
}

/// [`visible`] for an agent identity `me` (requests and notifications alike).
pub(crate) fn seen_by(me: &str, s: &State, w: &Worker) -> bool {
    let Some(by) = w.created_by.as_deref() else {
        return false;
    };
    by == me
        || by
            .split_once('/')
            .and_then(|(plan, _)| s.plans.get(plan))
            .is_some_and(|p| p.client_id == me)
}

/// The worker, when the caller may see it; another client's worker is as missing as one that
/// never existed (the same error), so its id tells the caller nothing.
fn visible_worker(app: &App, ctx: &CallCtx, id: &str) -> Result<Worker, RpcError> {
    app.workspace
        .read(|s| s.workers.get(id).filter(|w| visible(ctx, s, w)).cloned())
        .ok_or_else(|| {
            worker_error(&WorkerError::NotFound {
                worker_id: id.to_string(),
            })
        })
}

fn worker_id(raw: &str) -> Result<String, RpcError> {
    request::parse_worker_id("worker_id", &serde_json::Value::String(raw.to_string()))
        .map_err(|e| field_error("", &e))
}

async fn get(app: Arc<App>, ctx: CallCtx, p: GetParams) -> Result<WorkerResult, RpcError> {
    let id = worker_id(&p.worker_id)?;
    app.workers.ready().await;
    let worker = visible_worker(&app, &ctx, &id)?;
    Ok(WorkerResult { worker })
}

async fn list(app: Arc<App>, ctx: CallCtx, p: ListParams) -> Result<ListResult, RpcError> {
    app.workers.ready().await;
    let workers = app.workspace.read(|s| {
        s.workers
            .list()
            .filter(|w| p.status.is_none_or(|st| w.status == st) && visible(&ctx, s, w))
            .cloned()
            .collect()
    });
    Ok(ListResult { workers })
}

async fn transcript(
    app: Arc<App>,
    ctx: CallCtx,
    p: TranscriptParams,
) -> Result<TranscriptResult, RpcError> {
    let id = worker_id(&p.worker_id)?;
    let limit = p.limit.unwrap_or(TRANSCRIPT_DEFAULT);
    if limit == 0 || limit > TRANSCRIPT_MAX {
        return Err(RpcError::invalid_params(
            "limit",
            format!("`limit` must be between 1 and {TRANSCRIPT_MAX}"),
        ));
    }
    let found = app.workspace.read(|s| {
        s.workers
            .get(&id)
            .filter(|w| visible(&ctx, s, w))
            .map(|_| s.workers.transcript(&id, p.after_seq, limit))
    });
    let (entries, has_more) = found.ok_or_else(|| {
        worker_error(&WorkerError::NotFound {
            worker_id: id.clone(),
        })
    })?;
    let next_after_seq = entries.last().map(|e| e.seq).unwrap_or(p.after_seq);
    Ok(TranscriptResult {
        worker_id: id,
        entries,
        next_after_seq,
        has_more,
    })
}

async fn stop(app: Arc<App>, ctx: CallCtx, p: StopParams) -> Result<WorkerResult, RpcError> {
    let id = worker_id(&p.worker_id)?;
    if let Some(r) = &p.reason {
        crate::bundles::validate::check_text("reason", r).map_err(|e| field_error("", &e))?;
    }
    // Every profile alike: a client stops only the workers it may see.
    visible_worker(&app, &ctx, &id)?;
    let worker = app
        .workers
        .stop(&id, p.reason)
        .await
        .map_err(|e| worker_error(&e))?;
    Ok(WorkerResult { worker })
}
