//! `plans/*`: launch a selected pattern as running lanes (one gated `plan.launch`), read plans
//! with their evidence verified now, record evidence from a lane, waive with an operator
//! signature, stop. Also the lane connections: each lane worker's descriptor 3 is a session
//! whose identity is the lane, whatever the worker sends.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{App, Server, store_error};
use crate::bundles::BundleRef;
use crate::operations::adapters::plan::{OPERATION, classify};
use crate::operations::engine::SubmitInput;
use crate::operations::policy::DecisionEffect;
use crate::operator::signed::OperatorSignature;
use crate::plans::evidence::{Facts, WaivePayload, file_digests};
use crate::plans::spec::{self, LaunchError, LaunchSpec, LaunchTarget, codes};
use crate::plans::state::{Created, EvidenceRecord, EvidenceRef, PlanEntry, kinds, lane_client};
use crate::plans::view::{PlanView, ViewCtx, plan_view};
use crate::plans::{LaneIdentity, LaneServer};
use crate::rpc::session::{self, Host, ProfileChoice, Push};
use crate::rpc::{Access, AppCode, Audience, CallCtx, MethodDef, Profile, Role, Router, RpcError};
use crate::workspace::{CommitError, NewRecord, Notice, State};

pub fn register(r: &mut Router<App>) {
    r.add(
        MethodDef {
            name: "plans/launch",
            doc: "Run a worker pattern's lanes as workers: give the selection `request` (as for `select_worker_pattern`) or the `plan_digest` of an earlier launch, the `config_bundle` {id, digest} from `sync_bundle`, `lane_profiles` (lane role → bundle profile name; for persistent_workers the roster's names are used), optionally `mechanism` (the plan's primary by default; a fallback only if the plan lists it) and an `idempotency_key`. The launch is one gated operation: it may wait for the operator. `dry_run` shows the lanes, the workers that would start and the policy verdict, and starts nothing. Returns the plan (`plan_id`, `status`, lanes). Next: `get_plan` to follow it.",
            access: Access::Write,
            audience: Audience::Anyone,
            mcp_tool: Some("launch_plan"),
        },
        launch,
    );
    r.add(
        MethodDef {
            name: "plans/get",
            doc: "Read one plan by `plan_id`: its status (pending_approval, starting, running, completed, incomplete, stopped, refused), each lane's status and worker, every proof expectation with its evidence verified now, and what is still `missing`.",
            access: Access::Read,
            audience: Audience::Anyone,
            mcp_tool: Some("get_plan"),
        },
        get,
    );
    r.add(
        MethodDef {
            name: "plans/list",
            doc: "List plans, newest first (at most `limit`, default 50).",
            access: Access::Read,
            audience: Audience::Anyone,
            mcp_tool: None,
        },
        list,
    );
    r.add(
        MethodDef {
            name: "plans/evidence",
            doc: "Record evidence for one of your lane's proof expectations (`plan_id`, `lane_id`, `expectation` such as `e1`, `kind`): `operation` (`operation_id` of an operation your lane submitted, e.g. a `command.run` of the tests; it verifies when it succeeded, exit 0), `file` (`path`; gaffer records its sha256 now), `worker_output` (`from_seq`..`to_seq` of your lane worker's transcript) or `note` (`text`; counted as claimed, never verified). Only the lane's own connection (or the operator) records for a lane.",
            access: Access::Write,
            audience: Audience::Anyone,
            mcp_tool: Some("record_evidence"),
        },
        evidence,
    );
    r.add(
        MethodDef {
            name: "plans/waive",
            doc: "Waive one lane expectation with the operator's signature over a `gaffer/plan-waive/v1` payload (`payload` text, `signature`).",
            access: Access::Write,
            audience: Audience::Anyone,
            mcp_tool: None,
        },
        waive,
    );
    r.add(
        MethodDef {
            name: "plans/stop",
            doc: "Stop a plan (its creator or the operator): its running lane workers are stopped and no lane starts any more.",
            access: Access::Write,
            audience: Audience::Anyone,
            mcp_tool: None,
        },
        stop,
    );
    r.notification::<ChangedNotice>(
        "plans/changed",
        "A plan was created, started, a lane changed, evidence or a waiver was recorded, or it ended.",
    );
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LaunchParams {
    /// The selection request (the `select_worker_pattern` vocabulary).
    #[serde(default)]
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    pub request: Option<Value>,
    /// Or: the selection digest of an earlier launch in this workspace, launched again.
    #[serde(default)]
    pub plan_digest: Option<String>,
    pub config_bundle: BundleRef,
    /// Lane role → bundle profile name.
    #[serde(default)]
    pub lane_profiles: BTreeMap<String, String>,
    #[serde(default)]
    pub mechanism: Option<String>,
    /// Replaying the same key with the same request returns the same plan. Required unless
    /// `dry_run`.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub dry_run: bool,
}

/// The policy's verdict on a launch.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Verdict {
    /// `allow` (runs at once), `approval` (waits for the operator) or `deny`.
    pub effect: &'static str,
    pub reason: String,
    pub rule_ids: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct LaunchResult {
    pub dry_run: bool,
    /// The launch plan: every lane with its profile, argv, prompt, dependencies and
    /// expectations (what would start, on a dry run, where `plan_id` is still empty: a plan's
    /// id is its launch operation's).
    pub launch: LaunchSpec,
    pub verdict: Verdict,
    /// The plan as recorded (absent on a dry run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanView>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanIdParams {
    pub plan_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    #[serde(default)]
    pub limit: Option<usize>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct PlanResult {
    pub plan: PlanView,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListResult {
    pub plans: Vec<PlanView>,
}

#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceKind {
    Operation,
    File,
    WorkerOutput,
    Note,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvidenceParams {
    pub plan_id: String,
    pub lane_id: String,
    /// `e1`, `e2`, … (see the lane's `expectations`).
    pub expectation: String,
    pub kind: EvidenceKind,
    #[serde(default)]
    pub operation_id: Option<String>,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub from_seq: Option<u64>,
    #[serde(default)]
    pub to_seq: Option<u64>,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaiveParams {
    /// RFC 8785 text of a `gaffer/plan-waive/v1` payload.
    pub payload: String,
    /// base64url Ed25519 signature over it.
    pub signature: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StopParams {
    pub plan_id: String,
    pub reason: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ChangedNotice {
    pub plan_id: String,
    pub seq: u64,
}

fn launch_refusal(e: LaunchError) -> RpcError {
    if e.code == codes::REQUEST_INVALID {
        return RpcError::invalid_params(e.field.as_deref().unwrap_or("request"), e.message);
    }
    let mut r = RpcError::app(AppCode::Failed, e.code, e.message);
    if let Some(f) = e.field {
        r = r.with_data("field", f);
    }
    r
}

fn not_found(plan_id: &str) -> RpcError {
    RpcError::app(
        AppCode::NotFound,
        "plan_not_found",
        format!("no plan {plan_id}"),
    )
    .with_data("field", "plan_id")
}

fn is_lane(client: &str) -> bool {
    client.contains('/')
}

async fn launch(app: Arc<App>, ctx: CallCtx, p: LaunchParams) -> Result<LaunchResult, RpcError> {
    let client = ctx.client.id.clone();
    if is_lane(&client) {
        return Err(RpcError::app(
            AppCode::Forbidden,
            "lane_cannot_launch",
            "a plan lane cannot launch plans",
        ));
    }
    let request = launch_request(&app, &p)?;
    let key = match (&p.idempotency_key, p.dry_run) {
        (Some(k), _) if !k.trim().is_empty() => k.clone(),
        (_, true) => "dry-run".to_string(),
        _ => {
            return Err(RpcError::invalid_params(
                "idempotency_key",
                "a launch needs an idempotency_key (replays return the same plan)",
            ));
        }
    };
    let target = LaunchTarget {
        request,
        config_bundle: p.config_bundle.clone(),
        lane_profiles: p.lane_profiles.clone(),
        mechanism: p.mechanism.clone(),
    };
    let ws = Arc::clone(&app.workspace);
    let t = target.clone();
    // The plan's id is its operation's, known once submitted; the checks here need none.
    let launch = tokio::task::spawn_blocking(move || spec::derive(&ws, &t, ""))
        .await
        .map_err(|_| RpcError::internal("deriving the launch plan"))?
        .map_err(launch_refusal)?;
    if let Some(d) = &p.plan_digest
        && *d != launch.selection_digest
    {
        return Err(RpcError::app(
            AppCode::Conflict,
            codes::PLAN_CHANGED,
            "the selector now chooses differently for that request (its policy changed); launch the request again to see the new plan",
        )
        .with_data("field", "plan_digest"));
    }
    let decision = app
        .operations
        .preview(&client, OPERATION, &classify(&launch));
    let verdict = Verdict {
        effect: match decision.effect {
            DecisionEffect::Allow => "allow",
            DecisionEffect::Request => "approval",
            // With a policy, what no rule covers is refused.
            DecisionEffect::Deny | DecisionEffect::NoMatch => "deny",
        },
        reason: decision.reason.clone(),
        rule_ids: decision.rule_ids.clone(),
    };
    if p.dry_run {
        return Ok(LaunchResult {
            dry_run: true,
            launch,
            verdict,
            plan: None,
        });
    }
    let plan = submit_launch(&app, &client, &key, &target, &launch).await?;
    Ok(LaunchResult {
        dry_run: false,
        launch: LaunchSpec {
            plan_id: plan.plan_id.clone(),
            ..launch
        },
        verdict,
        plan: Some(plan),
    })
}

/// The request to launch: given, or the one an earlier launch with that digest pinned.
fn launch_request(app: &App, p: &LaunchParams) -> Result<Value, RpcError> {
    match (&p.request, &p.plan_digest) {
        (Some(r), None) => Ok(r.clone()),
        (None, Some(d)) => app
            .workspace
            .read(|s| {
                s.plans
                    .by_selection_digest(d)
                    .map(|p| p.request.clone())
                    .filter(|r| !r.is_null())
            })
            .ok_or_else(|| {
                RpcError::invalid_params(
                    "plan_digest",
                    "no earlier launch in this workspace has that selection digest",
                )
            }),
        _ => Err(RpcError::invalid_params(
            "request",
            "give exactly one of `request` and `plan_digest`",
        )),
    }
}

async fn submit_launch(
    app: &Arc<App>,
    client: &str,
    key: &str,
    target: &LaunchTarget,
    launch: &LaunchSpec,
) -> Result<PlanView, RpcError> {
    let bad = |_| RpcError::internal("encoding the launch");
    let input = SubmitInput {
        operation: OPERATION.into(),
        target: serde_json::value::to_raw_value(target).map_err(bad)?,
        arguments: serde_json::value::to_raw_value(&serde_json::json!({})).map_err(bad)?,
        reason: format!("launch plan: {}", launch.objective),
        idempotency_key: format!("plan.launch:{key}"),
    };
    let (op, _) = app
        .operations
        .submit(client, input)
        .await
        .map_err(super::operations::rpc_error)?;
    let plan_id = spec::plan_id(&op.id);
    let created = Created {
        plan_id: plan_id.clone(),
        operation_id: op.id.clone(),
        client_id: client.to_string(),
        request: target.request.clone(),
        spec: LaunchSpec {
            plan_id: plan_id.clone(),
            ..launch.clone()
        },
    };
    let rec = NewRecord::new(kinds::CREATED, &created)
        .map_err(|e| store_error("recording a plan", &e))?;
    let id = plan_id.clone();
    app.workspace
        .commit(move |s: &State| {
            // Absent, or started already by an allowed launch that the record completes.
            let fresh = s.plans.get(&id).is_none_or(|p| p.client_id.is_empty());
            Ok::<_, RpcError>((if fresh { vec![rec] } else { vec![] }, ()))
        })
        .await
        .map_err(commit_error)?;
    view_one(app, &plan_id)
        .await?
        .ok_or_else(|| not_found(&plan_id))
}

fn commit_error(e: CommitError<RpcError>) -> RpcError {
    match e {
        CommitError::Rejected(e) => e,
        CommitError::Store(e) => store_error("recording a plan", &e),
    }
}

/// Views of the given plans, evidence verified now (file digests read off the async threads
/// and outside the state lock).
async fn views(app: &Arc<App>, entries: Vec<PlanEntry>) -> Result<Vec<PlanView>, RpcError> {
    let root = app.workspace.root().to_path_buf();
    let (entries, files) = tokio::task::spawn_blocking(move || {
        let files = file_digests(&root, &entries.iter().collect::<Vec<_>>());
        (entries, files)
    })
    .await
    .map_err(|_| RpcError::internal("reading evidence files"))?;
    let key = crate::operator::current_public();
    let ws_id = app.workspace.workspace_id();
    let executed = |id: &str| app.operations.executed_here(id);
    let accounts: Vec<Option<crate::plans::runner::RunState>> = entries
        .iter()
        .map(|p| app.plans.attested(&p.plan_id))
        .collect();
    Ok(app.workspace.read(|s| {
        entries
            .iter()
            .zip(&accounts)
            .map(|(p, account)| {
                let cx = ViewCtx {
                    files: &files,
                    key: key.as_ref(),
                    workspace_id: ws_id.as_deref(),
                    facts: match account {
                        Some(run) => Facts::Attested {
                            run,
                            executed: &executed,
                        },
                        None => Facts::Journal,
                    },
                };
                plan_view(s, &cx, p)
            })
            .collect()
    }))
}

async fn view_one(app: &Arc<App>, plan_id: &str) -> Result<Option<PlanView>, RpcError> {
    let Some(entry) = app.workspace.read(|s| s.plans.get(plan_id).cloned()) else {
        return Ok(None);
    };
    Ok(views(app, vec![entry]).await?.pop())
}

/// Agents see the plans they launched and the plan they are a lane of; operators see all.
fn visible(ctx: &CallCtx, p: &PlanEntry) -> bool {
    ctx.client.role == Role::Operator || seen_by(&ctx.client.id, p)
}

/// [`visible`] for an agent identity `me` (requests and notifications alike).
pub(crate) fn seen_by(me: &str, p: &PlanEntry) -> bool {
    p.client_id == *me
        || me
            .split_once('/')
            .is_some_and(|(plan, _)| plan == p.plan_id)
}

async fn get(app: Arc<App>, ctx: CallCtx, p: PlanIdParams) -> Result<PlanResult, RpcError> {
    let entry = app
        .workspace
        .read(|s| s.plans.get(&p.plan_id).cloned())
        .filter(|e| visible(&ctx, e))
        .ok_or_else(|| not_found(&p.plan_id))?;
    let plan = views(&app, vec![entry])
        .await?
        .pop()
        .ok_or_else(|| not_found(&p.plan_id))?;
    Ok(PlanResult { plan })
}

async fn list(app: Arc<App>, ctx: CallCtx, p: ListParams) -> Result<ListResult, RpcError> {
    let limit = p.limit.unwrap_or(50).min(500);
    let entries: Vec<PlanEntry> = app.workspace.read(|s| {
        s.plans
            .list()
            .filter(|e| visible(&ctx, e))
            .take(limit)
            .cloned()
            .collect()
    });
    Ok(ListResult {
        plans: views(&app, entries).await?,
    })
}

async fn evidence(app: Arc<App>, ctx: CallCtx, p: EvidenceParams) -> Result<PlanResult, RpcError> {
    let (entry, expectations) = app
        .workspace
        .read(|s| {
            let e = s.plans.get(&p.plan_id)?;
            let lane = e.spec.lanes.iter().find(|l| l.lane_id == p.lane_id)?;
            Some((e.clone(), lane.expectations.len()))
        })
        .ok_or_else(|| {
            RpcError::app(
                AppCode::NotFound,
                "lane_not_found",
                format!("no lane {} in plan {}", p.lane_id, p.plan_id),
            )
            .with_data("field", "lane_id")
        })?;
    let lane_id = lane_client(&p.plan_id, &p.lane_id);
    if ctx.client.role != Role::Operator && ctx.client.id != lane_id {
        return Err(RpcError::app(
            AppCode::Forbidden,
            "not_this_lane",
            format!(
                "evidence for {} comes from that lane's own connection; this connection is {}",
                p.lane_id, ctx.client.id
            ),
        ));
    }
    let n: Option<usize> = p.expectation.strip_prefix('e').and_then(|n| n.parse().ok());
    if !n.is_some_and(|n| (1..=expectations).contains(&n)) {
        return Err(RpcError::invalid_params(
            "expectation",
            format!("the lane's expectations are e1..e{expectations}"),
        ));
    }
    let evidence = evidence_ref(&app, &entry, &p).await?;
    let rec = EvidenceRecord {
        evidence_id: crate::util::new_id("ev_").map_err(|_| RpcError::internal("an id"))?,
        plan_id: p.plan_id.clone(),
        lane_id: p.lane_id.clone(),
        expectation: p.expectation.clone(),
        evidence,
        recorded_by: ctx.client.id.clone(),
    };
    let recorded = rec.clone();
    let rec =
        NewRecord::new(kinds::EVIDENCE, &rec).map_err(|e| store_error("recording evidence", &e))?;
    let id = p.plan_id.clone();
    app.workspace
        .commit(move |s: &State| {
            let n = s.plans.get(&id).map(|p| p.evidence.len()).unwrap_or(0);
            if n >= crate::plans::state::MAX_EVIDENCE {
                return Err(RpcError::app(
                    AppCode::Conflict,
                    "evidence_full",
                    "the plan holds as much evidence as it can",
                ));
            }
            Ok((vec![rec], ()))
        })
        .await
        .map_err(commit_error)?;
    // Recorded through this process: its attested view counts it (a journal record alone
    // never is).
    app.plans.attest_evidence(&recorded);
    let plan = view_one(&app, &p.plan_id)
        .await?
        .ok_or_else(|| not_found(&p.plan_id))?;
    Ok(PlanResult { plan })
}

fn need<T: Clone>(v: &Option<T>, field: &str, kind: &str) -> Result<T, RpcError> {
    v.clone().ok_or_else(|| {
        RpcError::invalid_params(field, format!("`{kind}` evidence needs `{field}`"))
    })
}

async fn evidence_ref(
    app: &Arc<App>,
    entry: &PlanEntry,
    p: &EvidenceParams,
) -> Result<EvidenceRef, RpcError> {
    Ok(match p.kind {
        EvidenceKind::Operation => EvidenceRef::Operation {
            operation_id: need(&p.operation_id, "operation_id", "operation")?,
        },
        EvidenceKind::File => {
            let path = need(&p.path, "path", "file")?;
            let path = crate::operations::adapters::paths::normalize_relative("path", &path)
                .map_err(|e| RpcError::invalid_params("path", e.message))?;
            let root = app.workspace.root().to_path_buf();
            let rel = path.clone();
            let digest = tokio::task::spawn_blocking(move || {
                crate::operations::adapters::handle::digest_file(&root, &rel)
            })
            .await
            .map_err(|_| RpcError::internal("reading the file"))?
            .map_err(|e| RpcError::invalid_params("path", e))?
            .ok_or_else(|| RpcError::invalid_params("path", format!("{path} does not exist")))?;
            EvidenceRef::File {
                path,
                sha256: digest,
            }
        }
        EvidenceKind::WorkerOutput => {
            let worker_id = entry
                .lanes
                .get(&p.lane_id)
                .and_then(|l| l.worker_id.clone())
                .ok_or_else(|| RpcError::invalid_params("lane_id", "the lane has no worker yet"))?;
            let from_seq = need(&p.from_seq, "from_seq", "worker_output")?;
            let to_seq = need(&p.to_seq, "to_seq", "worker_output")?;
            if to_seq < from_seq {
                return Err(RpcError::invalid_params(
                    "to_seq",
                    "to_seq must not be below from_seq",
                ));
            }
            EvidenceRef::WorkerOutput {
                worker_id,
                from_seq,
                to_seq,
            }
        }
        EvidenceKind::Note => {
            let text = need(&p.text, "text", "note")?;
            if text.trim().is_empty() || text.chars().count() > 4000 {
                return Err(RpcError::invalid_params(
                    "text",
                    "a note is 1..=4000 characters",
                ));
            }
            EvidenceRef::Note { text }
        }
    })
}

async fn waive(app: Arc<App>, _ctx: CallCtx, p: WaiveParams) -> Result<PlanResult, RpcError> {
    let forbid = |m: String| RpcError::app(AppCode::Forbidden, "waiver_invalid", m);
    let sig = OperatorSignature::from_parts::<WaivePayload>(p.payload, p.signature)
        .map_err(|e| RpcError::invalid_params("payload", e.to_string()))?;
    let key = crate::operator::current_public()
        .ok_or_else(|| forbid("no operator public key here to check the waiver".into()))?;
    let payload: WaivePayload = sig.open(&key).map_err(|e| forbid(e.to_string()))?;
    if app.workspace.workspace_id().as_deref() != Some(payload.workspace_id.as_str()) {
        return Err(forbid("the waiver was signed for another workspace".into()));
    }
    let known = app.workspace.read(|s| {
        s.plans.get(&payload.plan_id).is_some_and(|e| {
            e.spec.lanes.iter().any(|l| {
                l.lane_id == payload.lane_id
                    && payload
                        .expectation
                        .strip_prefix('e')
                        .and_then(|n| n.parse::<usize>().ok())
                        .is_some_and(|n| (1..=l.expectations.len()).contains(&n))
            })
        })
    });
    if !known {
        return Err(RpcError::invalid_params(
            "payload",
            "the waiver names no expectation of a known plan lane",
        ));
    }
    let rec = crate::plans::state::Waived {
        plan_id: payload.plan_id.clone(),
        operator_signature: sig,
    };
    let rec =
        NewRecord::new(kinds::WAIVED, &rec).map_err(|e| store_error("recording a waiver", &e))?;
    let id = payload.plan_id.clone();
    app.workspace
        .commit(move |s: &State| {
            let n = s.plans.get(&id).map(|p| p.waivers.len()).unwrap_or(0);
            if n >= crate::plans::state::MAX_WAIVERS {
                return Err(RpcError::app(
                    AppCode::Conflict,
                    "waivers_full",
                    "the plan holds as many waivers as it can",
                ));
            }
            Ok((vec![rec], ()))
        })
        .await
        .map_err(commit_error)?;
    let plan = view_one(&app, &payload.plan_id)
        .await?
        .ok_or_else(|| not_found(&payload.plan_id))?;
    Ok(PlanResult { plan })
}

async fn stop(app: Arc<App>, ctx: CallCtx, p: StopParams) -> Result<PlanResult, RpcError> {
    let creator = app
        .workspace
        .read(|s| s.plans.get(&p.plan_id).map(|e| e.client_id.clone()))
        .ok_or_else(|| not_found(&p.plan_id))?;
    if ctx.client.role != Role::Operator && creator != ctx.client.id {
        return Err(RpcError::app(
            AppCode::Forbidden,
            "not_plan_creator",
            "only the plan's creator or the operator may stop it",
        ));
    }
    app.plans
        .stop(&p.plan_id, p.reason, ctx.client.id.clone())
        .await
        .map_err(|e| RpcError::app(AppCode::Failed, "plan_stop_failed", e.to_string()))?;
    let plan = view_one(&app, &p.plan_id)
        .await?
        .ok_or_else(|| not_found(&p.plan_id))?;
    Ok(PlanResult { plan })
}

// ----- lane connections ----------------------------------------------------------------------

/// Serves lane connections on this process's app.
pub struct LaneSessions {
    app: Weak<App>,
}

impl LaneSessions {
    pub fn new(app: &Arc<App>) -> Self {
        LaneSessions {
            app: Arc::downgrade(app),
        }
    }
}

impl LaneServer for LaneSessions {
    fn serve(&self, lane: LaneIdentity, stream: std::os::unix::net::UnixStream) {
        let Some(app) = self.app.upgrade() else {
            return;
        };
        let stream = match stream
            .set_nonblocking(true)
            .and_then(|()| tokio::net::UnixStream::from_std(stream))
        {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "lane connection unusable");
                return;
            }
        };
        let (read, write) = stream.into_split();
        let host = Arc::new(LaneHost { app, lane });
        tokio::spawn(async move {
            let router = Arc::new(super::router());
            if let Err(e) = session::serve(host, router, ProfileChoice::Auto, read, write).await {
                tracing::debug!(error = %e, "lane session ended");
            }
        });
    }
}

/// A lane's session: the app this process runs, and an identity that is the lane's, whatever
/// token or name the worker presents; it can never log in as the operator.
struct LaneHost {
    app: Arc<App>,
    lane: LaneIdentity,
}

impl Host for LaneHost {
    type State = App;
    type Notice = Notice;

    fn attach(&self, _init: Option<&Value>) -> Result<Arc<App>, RpcError> {
        Ok(Arc::clone(&self.app))
    }

    fn identify(&self, _state: &App, _init: &Value, _profile: Profile) -> Result<String, RpcError> {
        Ok(self.lane.client_id.clone())
    }

    fn identify_early(&self, _init: &Value) -> Result<Option<String>, RpcError> {
        Ok(Some(self.lane.client_id.clone()))
    }

    fn login_challenge(&self, _state: &App, _connection_id: &str) -> Result<String, RpcError> {
        Err(RpcError::app(
            AppCode::Forbidden,
            "lane_not_operator",
            "a plan lane's connection cannot log in as the operator",
        ))
    }

    fn login_verify(&self, state: &App, challenge: &str, _sig: &str) -> Result<(), RpcError> {
        self.login_challenge(state, challenge).map(|_| ())
    }

    fn subscribe(&self, state: &App) -> crate::fanout::Subscription<Notice> {
        state.workspace.subscribe()
    }

    fn operator_visible(&self, state: &App, notice: &Notice) -> bool {
        super::operator_notice_visible(state, notice)
    }

    fn visible(&self, state: &App, client: Option<&str>, notice: &Notice) -> bool {
        super::notice_visible(state, client, notice)
    }

    fn push(n: Notice) -> Push {
        Server::push(n)
    }

    fn server_info(&self) -> (&'static str, &'static str) {
        ("gaffer", env!("CARGO_PKG_VERSION"))
    }

    fn instructions(&self) -> &'static str {
        "You are a lane of a gaffer plan; this connection is your identity. Submit operations \
         with submit_operation, and record the evidence for your proof expectations with \
         record_evidence (an operation you ran, a file, your output); a note alone never \
         completes an expectation."
    }

    async fn detach(&self, _app: Arc<App>) {}
}
