//! The operation runtime of one gaffer process: submit, execute-once dispatch, approval
//! decisions, cancellation, expiry and startup recovery. Every state change is a
//! `Workspace::commit` whose closure validates against the freshly folded state, so two
//! processes on one workspace never both claim an operation.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_json::Value;

use super::adapter::{AdapterCtx, AdapterError, FailureKind, Outcome, Registry, Resolved};
use super::canonical::Exact;
use super::lifecycle::{OpState, codes};
use super::operator::OperatorKey;
use super::plan::{PLAN_SCHEMA, Plan, PlanAuthorization};
use super::policy::{ActiveGrant, DecisionEffect, GrantMode, GrantPolicy, Policy, PolicyRequest};
use super::state::{
    Approval, ApprovalChange, ApprovalEffect, ApprovalStatus, Created, Decided, DecisionKind,
    KIND_CREATED, KIND_DECIDED, KIND_PRUNED, KIND_REVOKED, KIND_TRANSITIONED, NOTICE_CHANGED,
    OpFailure, Operation, OperationState, Pruned, Revoked, SignedDecision, Transitioned, UseState,
};
use super::trust::TrustStatus;
use super::views::{ApprovalView, OperationView};
use crate::workspace::{CommitError, NewRecord, Workspace};

pub const MAX_KEY_BYTES: usize = 128;
pub const MAX_REASON_BYTES: usize = 2000;
pub const MAX_TARGET_BYTES: usize = 16 * 1024;
pub const MAX_ARGUMENTS_BYTES: usize = 1 << 20;
pub const MAX_RESULT_BYTES: usize = 2 << 20;
pub const MAX_WAIT_SECONDS: u64 = 30;
/// Most uses a window approval may carry.
pub const MAX_GRANT_USES: u32 = 25;
/// Test-only crash injection: the process exits at the named step.
pub const FAILPOINT_ENV: &str = "GAFFER_TEST_FAILPOINT";

/// A refusal with a stable machine code; `message` is safe to show an agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct OpError {
    pub kind: ErrorKind,
    pub code: String,
    pub message: String,
    pub field: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Invalid,
    NotFound,
    Conflict,
    Forbidden,
    Unavailable,
    Store,
}

impl OpError {
    pub fn new(kind: ErrorKind, code: &str, message: impl Into<String>) -> OpError {
        OpError {
            kind,
            code: code.into(),
            message: message.into(),
            field: None,
        }
    }
    pub fn invalid(field: &str, message: impl Into<String>) -> OpError {
        OpError {
            kind: ErrorKind::Invalid,
            code: codes::INVALID_REQUEST.into(),
            message: message.into(),
            field: Some(field.into()),
        }
    }
    fn not_found() -> OpError {
        OpError::new(ErrorKind::NotFound, codes::NOT_FOUND, "no such operation")
    }
    fn store(e: impl std::fmt::Display) -> OpError {
        tracing::error!(error = %e, "operation store failure");
        OpError::new(
            ErrorKind::Store,
            codes::STORE_UNAVAILABLE,
            "the operation store is unavailable; see the server log",
        )
    }
    fn from_adapter(e: AdapterError) -> OpError {
        let kind = if e.code == codes::INPUT_INVALID {
            ErrorKind::Invalid
        } else if e.code == codes::PRECONDITION_FAILED {
            ErrorKind::Conflict
        } else {
            ErrorKind::Unavailable
        };
        OpError {
            kind,
            code: e.code,
            message: redact(&e.message),
            field: e.field,
        }
    }
}

/// Provider text reaches agents only bounded and without control characters.
pub fn redact(s: &str) -> String {
    let clean: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(500)
        .collect();
    if clean.trim().is_empty() {
        "the provider gave no detail".into()
    } else {
        clean
    }
}

fn commit_err(e: CommitError<OpError>) -> OpError {
    match e {
        CommitError::Rejected(e) => e,
        CommitError::Store(e) => OpError::store(e),
    }
}

fn rec(kind: &str, payload: impl serde::Serialize) -> Result<NewRecord, OpError> {
    NewRecord::new(kind, payload).map_err(OpError::store)
}

fn new_id(prefix: &str) -> Result<String, OpError> {
    crate::util::new_id(prefix).map_err(OpError::store)
}

fn failpoint(step: &str) {
    if std::env::var(FAILPOINT_ENV).ok().as_deref() == Some(step) {
        tracing::warn!(step, "test failpoint: exiting");
        std::process::exit(86);
    }
}

/// What `operations/submit` receives.
#[derive(Debug, Clone)]
pub struct SubmitInput {
    pub operation: String,
    pub target: Box<serde_json::value::RawValue>,
    pub arguments: Box<serde_json::value::RawValue>,
    pub reason: String,
    pub idempotency_key: String,
}

#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub states: Vec<OpState>,
    pub operation: Option<String>,
    pub limit: Option<usize>,
}

/// Operator narrowing of an approval.
#[derive(Debug, Clone, Default)]
pub struct Narrowing {
    pub duration_seconds: Option<u64>,
    pub max_uses: Option<u32>,
}

#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Terminal operations older than this are pruned (their keys become reusable).
    pub retention_ms: u64,
}

/// Overrides the 30-day retention of terminal operations (whole hours).
pub const RETENTION_ENV: &str = "GAFFER_OPERATIONS_RETENTION_HOURS";

impl Default for RuntimeConfig {
    /// 30 days, or `$GAFFER_OPERATIONS_RETENTION_HOURS` when it holds a number.
    fn default() -> Self {
        let hours = std::env::var(RETENTION_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(30 * 24);
        RuntimeConfig {
            retention_ms: hours.saturating_mul(3600 * 1000),
        }
    }
}

/// (mtime, size) of a file, `None` when it cannot be read.
type FileStamp = Option<(Option<std::time::SystemTime>, u64)>;
/// policy.yaml, trust.json and the operator key: a change to any of them re-checks trust.
type PolicyStamp = [FileStamp; 3];

fn file_stamp(path: &std::path::Path) -> FileStamp {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.modified().ok(), m.len()))
}

/// Whose approval an execution claim relies on, decided inside the claim commit.
enum Claim {
    Run {
        plan: Box<Plan>,
        approval_id: Option<String>,
    },
    Skip,
}

/// (client, idempotency key)
type SubmitKey = (String, String);

pub struct OperationRuntime {
    ws: Arc<Workspace>,
    registry: Registry,
    config: RuntimeConfig,
    /// This process, recorded as executor of what it claims.
    executor: String,
    running: Mutex<HashSet<String>>,
    submit_locks: Mutex<HashMap<SubmitKey, Weak<tokio::sync::Mutex<()>>>>,
    policy_cache: Mutex<Option<(PolicyStamp, Policy)>>,
    /// Whether `providers.yaml` was trusted when this process loaded its providers.
    providers_trust: std::sync::OnceLock<TrustStatus>,
    /// Only a serving process executes; one-shot CLI processes leave approved work to it.
    autorun: std::sync::atomic::AtomicBool,
    me: Weak<OperationRuntime>,
}

impl std::fmt::Debug for OperationRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperationRuntime")
            .field("registry", &self.registry)
            .finish()
    }
}

pub fn executor_id(pid: u32, started_ms: u64) -> String {
    format!("{pid}:{started_ms}")
}

impl OperationRuntime {
    pub fn new(
        ws: Arc<Workspace>,
        registry: Registry,
        config: RuntimeConfig,
        executor: String,
    ) -> Arc<OperationRuntime> {
        Arc::new_cyclic(|me| OperationRuntime {
            ws,
            registry,
            config,
            executor,
            running: Mutex::new(HashSet::new()),
            submit_locks: Mutex::new(HashMap::new()),
            policy_cache: Mutex::new(None),
            providers_trust: std::sync::OnceLock::new(),
            autorun: std::sync::atomic::AtomicBool::new(false),
            me: me.clone(),
        })
    }

    /// Every operations change goes through the workspace's one commit path: the closure
    /// validates against state that already holds every other process's records.
    async fn commit<T, F>(&self, f: F) -> Result<T, CommitError<OpError>>
    where
        F: FnOnce(&crate::workspace::State) -> Result<(Vec<NewRecord>, T), OpError>
            + Send
            + 'static,
        T: Send + 'static,
    {
        self.ws.commit(f).await
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn workspace(&self) -> &Arc<Workspace> {
        &self.ws
    }

    fn ctx(&self, op: &Operation) -> AdapterCtx {
        AdapterCtx {
            workspace_root: self.ws.root().to_path_buf(),
            operation_id: op.id.clone(),
            client_id: op.client_id.clone(),
        }
    }

    /// The policy to decide with. An untrusted `policy.yaml` (not signed by the operator, or
    /// changed since) keeps only its deny rules. Cached until the policy file, `trust.json` or
    /// the operator key changes; the cached value always comes from bytes that were checked.
    fn policy(&self) -> Result<Policy, OpError> {
        let dir = self.ws.gaffer_dir();
        // Stamps are taken before reading, so a change after the read shows as a new stamp.
        let stamp: PolicyStamp = [
            file_stamp(&dir.join(super::policy::POLICY_FILE)),
            file_stamp(&dir.join(super::trust::TRUST_FILE)),
            super::operator::key_path()
                .ok()
                .and_then(|p| file_stamp(&p)),
        ];
        let mut cache = self.policy_cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((cached, p)) = cache.as_ref()
            && *cached == stamp
        {
            return Ok(p.clone());
        }
        let invalid = |e: String| {
            tracing::error!(error = %e, "policy file is invalid");
            OpError::new(
                ErrorKind::Unavailable,
                "policy_invalid",
                format!("the workspace policy is invalid: {e}"),
            )
        };
        let checked = super::trust::check(&dir, super::policy::POLICY_FILE)
            .map_err(|e| invalid(e.to_string()))?;
        let p = match &checked.bytes {
            None => Policy::default(),
            Some(bytes) => {
                let file = dir.join(super::policy::POLICY_FILE);
                let text = std::str::from_utf8(bytes)
                    .map_err(|_| invalid(format!("{}: not UTF-8", file.display())))?;
                let parsed = Policy::parse(text, &file).map_err(|e| invalid(e.to_string()))?;
                if checked.status.is_trusted() {
                    parsed
                } else {
                    tracing::warn!(
                        status = ?checked.status,
                        "policy.yaml is not trusted by the operator; only its deny rules apply \
                         and every other operation waits for approval (run `gaffer trust`)"
                    );
                    parsed.into_untrusted()
                }
            }
        };
        *cache = Some((stamp, p.clone()));
        Ok(p)
    }

    /// Where `policy.yaml` stands now.
    pub fn policy_trust(&self) -> TrustStatus {
        super::trust::check(&self.ws.gaffer_dir(), super::policy::POLICY_FILE)
            .map(|c| c.status)
            .unwrap_or(TrustStatus::NeverTrusted)
    }

    /// Where `providers.yaml` stood when this process decided which providers to start.
    pub fn providers_trust(&self) -> TrustStatus {
        self.providers_trust
            .get()
            .copied()
            .unwrap_or(TrustStatus::Absent)
    }

    /// Records the trust check [`super::open_runtime`] made before starting providers.
    pub fn set_providers_trust(&self, status: TrustStatus) {
        let _ = self.providers_trust.set(status);
    }

    // ---------- submit ----------

    pub async fn submit(
        &self,
        client: &str,
        input: SubmitInput,
    ) -> Result<(OperationView, bool), OpError> {
        let key = input.idempotency_key.trim().to_string();
        if key.is_empty() || key.len() > MAX_KEY_BYTES {
            return Err(OpError::invalid(
                "idempotency_key",
                format!("idempotency_key must be 1..={MAX_KEY_BYTES} bytes after trimming"),
            ));
        }
        let reason = input.reason.trim().to_string();
        if reason.is_empty() || reason.len() > MAX_REASON_BYTES {
            return Err(OpError::invalid(
                "reason",
                format!("reason must be 1..={MAX_REASON_BYTES} bytes after trimming"),
            ));
        }
        if input.operation.is_empty() || input.operation.len() > 128 {
            return Err(OpError::invalid(
                "operation",
                "operation must be 1..=128 bytes",
            ));
        }
        let parse_obj = |field: &str, raw: &str, max: usize, max_props: usize| {
            if raw.len() > max {
                return Err(OpError::invalid(
                    field,
                    format!("{field} is larger than {max} bytes"),
                ));
            }
            let ex = Exact::parse_object(raw)
                .map_err(|e| OpError::invalid(field, format!("{field}: {e}")))?;
            if let Exact::Object(m) = &ex
                && m.len() > max_props
            {
                return Err(OpError::invalid(
                    field,
                    format!("{field} has more than {max_props} properties"),
                ));
            }
            Ok(ex)
        };
        let target_ex = parse_obj("target", input.target.get(), MAX_TARGET_BYTES, 32)?;
        let args_ex = parse_obj("arguments", input.arguments.get(), MAX_ARGUMENTS_BYTES, 128)?;
        let submitted = Exact::Object(BTreeMap::from([
            (
                "operation".to_string(),
                Exact::String(input.operation.clone()),
            ),
            ("reason".to_string(), Exact::String(reason.clone())),
            ("target".to_string(), target_ex),
            ("arguments".to_string(), args_ex),
        ]))
        .exact_text();
        // Only the digest is kept: equal digests mean byte-equal exact forms.
        let submitted = crate::util::sha256_hex(submitted.as_bytes());

        // Replays never resolve, decide or write anything.
        if let Some(v) = self.replay(client, &key, &submitted)? {
            return Ok((v, false));
        }
        let lock = self.submit_lock(client, &key);
        let _guard = lock.lock().await;
        if let Some(v) = self.replay(client, &key, &submitted)? {
            return Ok((v, false));
        }

        let Some(adapter) = self.registry.lookup(&input.operation).cloned() else {
            return Err(OpError {
                kind: ErrorKind::Invalid,
                code: codes::NOT_REGISTERED.into(),
                message: format!("no provider offers operation {:?}", input.operation),
                field: Some("operation".into()),
            });
        };
        let desc = adapter.descriptor().clone();
        let target: Value = serde_json::from_str(input.target.get())
            .map_err(|e| OpError::invalid("target", e.to_string()))?;
        let arguments: Value = serde_json::from_str(input.arguments.get())
            .map_err(|e| OpError::invalid("arguments", e.to_string()))?;
        let decoded = adapter
            .decode(&target, &arguments)
            .await
            .map_err(OpError::from_adapter)?;
        adapter
            .validate_client(&decoded, client, &key)
            .map_err(OpError::from_adapter)?;
        let id = new_id("op_")?;
        let now = crate::util::now_ms();
        let actx = AdapterCtx {
            workspace_root: self.ws.root().to_path_buf(),
            operation_id: id.clone(),
            client_id: client.to_string(),
        };
        let resolved = adapter
            .resolve(&actx, decoded)
            .await
            .map_err(OpError::from_adapter)?;
        let class = adapter
            .authorize(&resolved)
            .await
            .map_err(OpError::from_adapter)?;
        let presentation = adapter
            .present(&resolved)
            .await
            .and_then(|p| p.bounded())
            .map_err(OpError::from_adapter)?;

        let policy = self.policy()?;
        let grants = self.ws.read(|s| active_grants(&s.operations, client, now));
        let mut decision = policy.decide(
            &PolicyRequest {
                client,
                operation: &desc.name,
                class: &class,
            },
            &grants,
            now,
        );
        if desc.requires_approval && decision.effect == DecisionEffect::Allow {
            decision.effect = DecisionEffect::Request;
            decision.reason = "approval_required".into();
            decision.grant_id = None;
            decision.grant_policy = Some(GrantPolicy::default_for_missing_policy());
        }

        let mut state = OpState::Pending;
        let mut error = None;
        let mut approval = None;
        let mut approval_id = None;
        let mut mode = None;
        let (mut req_duration, mut req_uses, mut pending_s) = (None, None, 0u64);
        match decision.effect {
            DecisionEffect::Allow => {
                state = OpState::Approved;
                approval_id = decision.grant_id.clone();
            }
            DecisionEffect::Deny | DecisionEffect::NoMatch => {
                state = OpState::Denied;
                error = Some(OpFailure::new(
                    codes::POLICY_DENIED,
                    if decision.effect == DecisionEffect::Deny {
                        "the workspace policy denies this operation"
                    } else {
                        "no policy rule allows this operation"
                    },
                ));
            }
            DecisionEffect::Request => {
                let gp = decision
                    .grant_policy
                    .clone()
                    .unwrap_or_else(GrantPolicy::default_for_missing_policy);
                match approval_intent(&gp, desc.approval_ttl_seconds, desc.request_ttl_seconds) {
                    Ok((dur, uses, pend)) => {
                        mode = Some(gp.mode);
                        req_duration = Some(dur);
                        req_uses = Some(uses);
                        pending_s = pend;
                        approval_id = Some(new_id("ap_")?);
                    }
                    Err(msg) => {
                        state = OpState::Failed;
                        error = Some(OpFailure::new(codes::APPROVAL_REQUEST_FAILED, msg));
                    }
                }
            }
        }
        let expires_at_ms = match state {
            OpState::Pending => now + (pending_s + req_duration.unwrap_or(0)) * 1000,
            _ => now + desc.approval_ttl_seconds * 1000,
        };
        let plan = Plan {
            schema: PLAN_SCHEMA.into(),
            operation: desc.name.clone(),
            operation_revision: desc.operation_revision,
            provider: desc.provider.clone(),
            client_id: client.to_string(),
            operation_id: id.clone(),
            target: resolved.target.clone(),
            arguments: resolved.arguments.clone(),
            preconditions: resolved.preconditions.clone(),
            presentation: presentation.clone(),
            authorization: PlanAuthorization {
                classification: class.clone(),
                policy_effect: decision.effect,
                rule_ids: decision.rule_ids.clone(),
                mode,
                requested_duration_seconds: req_duration,
                requested_max_uses: req_uses,
            },
            created_at_ms: now,
            expires_at_ms,
        };
        let plan_text = plan.canonical();
        let digest = Plan::digest_of(&plan_text);
        if state == OpState::Pending
            && let (Some(aid), Some(m), Some(dur), Some(uses)) =
                (&approval_id, mode, req_duration, req_uses)
        {
            approval = Some(Approval {
                id: aid.clone(),
                operation_id: id.clone(),
                client_id: client.to_string(),
                operation: desc.name.clone(),
                plan_digest: digest.clone(),
                classification: class.clone(),
                mode: m,
                status: ApprovalStatus::Pending,
                revision: 1,
                created_at_ms: now,
                pending_expires_at_ms: now + pending_s * 1000,
                requested_duration_seconds: dur,
                requested_max_uses: uses,
                decision: None,
                uses: BTreeMap::new(),
                decision_keys: BTreeMap::new(),
            });
        }
        let op = Operation {
            id: id.clone(),
            client_id: client.to_string(),
            idempotency_key: key.clone(),
            operation: desc.name.clone(),
            provider: desc.provider.clone(),
            submitted: submitted.clone(),
            reason,
            target: resolved.target.clone(),
            arguments: resolved.arguments.clone(),
            state,
            revision: 1,
            approval_id,
            created_at_ms: now,
            updated_at_ms: now,
            terminal_at_ms: state.is_terminal().then_some(now),
            presentation,
            plan_digest: Some(digest),
            plan: Some(plan_text),
            result: None,
            upstream_status: None,
            error,
            executor: None,
        };
        let client_s = client.to_string();
        // A static allow in a serving process claims in the same commit: the execution is
        // durable as `executing` before it starts, without a second round trip to the disk.
        let claim_now = state == OpState::Approved
            && op.approval_id.is_none()
            && self.autorun.load(std::sync::atomic::Ordering::Acquire);
        let executor = self.executor.clone();
        let created_at = now;
        let (view, created, claimed) = self
            .commit(move |s: &crate::workspace::State| {
                if let Some(existing) = s.operations.by_idempotency(&client_s, &key) {
                    // Another process created it while we resolved.
                    if existing.submitted == submitted {
                        return Ok((vec![], (OperationView::of(existing), false, false)));
                    }
                    return Err(conflict());
                }
                let mut recs = vec![];
                let view = if claim_now {
                    let mut t = transition(&op, OpState::Executing, created_at);
                    t.executor = Some(executor);
                    let v = view_after(&op, &t);
                    recs.push(rec(
                        KIND_CREATED,
                        Created {
                            operation: op,
                            approval,
                        },
                    )?);
                    recs.push(rec(KIND_TRANSITIONED, &t)?);
                    v
                } else {
                    let v = OperationView::of(&op);
                    recs.push(rec(
                        KIND_CREATED,
                        Created {
                            operation: op,
                            approval,
                        },
                    )?);
                    v
                };
                Ok((recs, (view, true, claim_now)))
            })
            .await
            .map_err(commit_err)?;
        if created {
            failpoint("after_submit");
            if view.state.is_terminal() {
                adapter.cleanup(&actx, &resolved).await;
            }
            if claimed {
                if let Some(me) = self.me.upgrade() {
                    let id = view.id.clone();
                    tokio::spawn(async move {
                        failpoint("after_claim");
                        if let Err(e) = me.execute_claimed(&id, Box::new(plan), None).await {
                            tracing::error!(operation = %id, error = %e, "operation could not be executed");
                        }
                    });
                }
            } else if view.state == OpState::Approved {
                self.spawn_drive(view.id.clone());
            }
        }
        Ok((view, created))
    }

    fn replay(
        &self,
        client: &str,
        key: &str,
        submitted: &str,
    ) -> Result<Option<OperationView>, OpError> {
        self.ws
            .read(|s| match s.operations.by_idempotency(client, key) {
                Some(op) if op.submitted == submitted => Ok(Some(OperationView::of(op))),
                Some(_) => Err(conflict()),
                None => Ok(None),
            })
    }

    fn submit_lock(&self, client: &str, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.submit_locks.lock().unwrap_or_else(|p| p.into_inner());
        if locks.len() > 1024 {
            locks.retain(|_, w| w.strong_count() > 0);
        }
        let k = (client.to_string(), key.to_string());
        if let Some(l) = locks.get(&k).and_then(Weak::upgrade) {
            return l;
        }
        let l = Arc::new(tokio::sync::Mutex::new(()));
        locks.insert(k, Arc::downgrade(&l));
        l
    }

    // ---------- reads ----------

    pub fn get(&self, client: Option<&str>, id: &str) -> Result<OperationView, OpError> {
        self.ws.read(|s| {
            s.operations
                .get(id)
                .filter(|op| client.is_none_or(|c| c == op.client_id))
                .map(OperationView::of)
                .ok_or_else(OpError::not_found)
        })
    }

    pub fn list(&self, client: Option<&str>, f: &ListFilter) -> Vec<OperationView> {
        let limit = f.limit.unwrap_or(100).min(1000);
        self.ws.read(|s| {
            let mut v: Vec<&Operation> = s
                .operations
                .operations
                .values()
                .filter(|op| client.is_none_or(|c| c == op.client_id))
                .filter(|op| f.states.is_empty() || f.states.contains(&op.state))
                .filter(|op| f.operation.as_ref().is_none_or(|o| *o == op.operation))
                .collect();
            v.sort_by(|a, b| (b.created_at_ms, &b.id).cmp(&(a.created_at_ms, &a.id)));
            v.into_iter().take(limit).map(OperationView::of).collect()
        })
    }

    /// Returns once the revision passes `after_revision` or the operation is terminal, else
    /// after `wait_seconds` with the current state.
    pub async fn wait(
        &self,
        client: Option<&str>,
        id: &str,
        after_revision: u64,
        wait_seconds: u64,
    ) -> Result<OperationView, OpError> {
        if wait_seconds > MAX_WAIT_SECONDS {
            return Err(OpError::invalid(
                "wait_seconds",
                format!("wait_seconds must be at most {MAX_WAIT_SECONDS}"),
            ));
        }
        let mut rx = self.ws.subscribe();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(wait_seconds);
        loop {
            let v = self.get(client, id)?;
            if v.revision > after_revision || v.state.is_terminal() {
                return Ok(v);
            }
            loop {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Err(_) => return self.get(client, id),
                    Ok(Ok(n)) => {
                        if n.method == NOTICE_CHANGED
                            && n.params.get("id").and_then(Value::as_str) == Some(id)
                        {
                            break;
                        }
                    }
                    // Missed notices: re-read the state.
                    Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => break,
                    Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) => {
                        tokio::time::sleep_until(deadline).await;
                        return self.get(client, id);
                    }
                }
            }
        }
    }

    // ---------- cancel ----------

    pub async fn cancel(&self, client: Option<&str>, id: &str) -> Result<OperationView, OpError> {
        let client = client.map(str::to_string);
        let id_s = id.to_string();
        let now = crate::util::now_ms();
        let view = self
            .commit(move |s: &crate::workspace::State| {
                let ops = &s.operations;
                let op = ops
                    .get(&id_s)
                    .filter(|op| client.as_deref().is_none_or(|c| c == op.client_id))
                    .ok_or_else(OpError::not_found)?;
                if op.state.is_terminal() {
                    return Ok((vec![], OperationView::of(op)));
                }
                if op.state == OpState::Executing {
                    return Err(OpError::new(
                        ErrorKind::Conflict,
                        codes::NOT_CANCELABLE,
                        "the operation is executing and cannot be canceled",
                    ));
                }
                // Only the operation's own approval is canceled; a shared window grant stays.
                let change = ops
                    .approval_of(op)
                    .filter(|a| a.operation_id == op.id)
                    .map(|a| ApprovalChange {
                        approval_id: a.id.clone(),
                        effect: ApprovalEffect::Cancel,
                    });
                let t = transition(op, OpState::Canceled, now)
                    .error(codes::CANCELED, "the requester canceled the operation")
                    .approval(change);
                Ok((vec![rec(KIND_TRANSITIONED, &t)?], view_after(op, &t)))
            })
            .await
            .map_err(commit_err)?;
        Ok(view)
    }

    // ---------- operator ----------

    pub fn approvals(&self, all: bool) -> Vec<ApprovalView> {
        self.ws.read(|s| {
            let ops = &s.operations;
            ops.approvals
                .values()
                .filter(|a| all || a.status == ApprovalStatus::Pending)
                .map(|a| ApprovalView::of(a, ops.get(&a.operation_id)))
                .collect()
        })
    }

    /// Finds an approval by its id or by its operation's id.
    fn approval_id_for(s: &OperationState, id: &str) -> Option<String> {
        if s.approvals.contains_key(id) {
            return Some(id.to_string());
        }
        s.get(id).and_then(|op| op.approval_id.clone())
    }

    pub async fn decide(
        &self,
        id: &str,
        decision: DecisionKind,
        expected_revision: u64,
        idempotency_key: &str,
        narrowing: Narrowing,
        key: &OperatorKey,
    ) -> Result<ApprovalView, OpError> {
        let idem = idempotency_key.trim().to_string();
        if idem.is_empty() || idem.len() > MAX_KEY_BYTES {
            return Err(OpError::invalid(
                "idempotency_key",
                "idempotency_key must be 1..=128 bytes",
            ));
        }
        let command = serde_json::json!({
            "decision": decision,
            "expected_revision": expected_revision,
            "duration_seconds": narrowing.duration_seconds,
            "max_uses": narrowing.max_uses,
        });
        let command_digest = crate::util::sha256_hex(super::canonical::jcs(&command).as_bytes());
        let id = id.to_string();
        let key = key.clone();
        let now = crate::util::now_ms();
        let (view, approved_op, expired) = self
            .commit(move |s: &crate::workspace::State| {
                let ops = &s.operations;
                let aid = Self::approval_id_for(ops, &id).ok_or_else(|| {
                    OpError::new(ErrorKind::NotFound, codes::NOT_FOUND, "no such approval")
                })?;
                let a = &ops.approvals[&aid];
                let op = ops.get(&a.operation_id);
                if let Some(prev) = a.decision_keys.get(&idem) {
                    if *prev == command_digest {
                        return Ok((vec![], (ApprovalView::of(a, op), None, false)));
                    }
                    return Err(conflict());
                }
                if a.status != ApprovalStatus::Pending {
                    return Err(OpError::new(
                        ErrorKind::Conflict,
                        codes::APPROVAL_NOT_PENDING,
                        format!("the approval is {:?}, not pending", a.status).to_lowercase(),
                    ));
                }
                if a.revision != expected_revision {
                    return Err(OpError::new(
                        ErrorKind::Conflict,
                        codes::REVISION_CONFLICT,
                        format!(
                            "the approval is at revision {}, not {expected_revision}",
                            a.revision
                        ),
                    ));
                }
                let Some(op) = op else {
                    return Err(OpError::not_found());
                };
                if now >= a.pending_expires_at_ms {
                    // Too late: record the expiry and refuse the decision.
                    let mut recs = vec![];
                    if op.state == OpState::Pending {
                        let t = transition(op, OpState::Expired, now)
                            .error(
                                codes::APPROVAL_EXPIRED,
                                "nobody decided before the request expired",
                            )
                            .approval(Some(ApprovalChange {
                                approval_id: a.id.clone(),
                                effect: ApprovalEffect::Expire,
                            }));
                        recs.push(rec(KIND_TRANSITIONED, &t)?);
                    }
                    return Ok((recs, (ApprovalView::of(a, Some(op)), None, true)));
                }
                let duration = narrowing
                    .duration_seconds
                    .unwrap_or(a.requested_duration_seconds);
                if duration == 0 || duration > a.requested_duration_seconds {
                    return Err(OpError {
                        kind: ErrorKind::Conflict,
                        code: codes::CONSTRAINT_EXCEEDED.into(),
                        message: format!(
                            "duration_seconds must be between 1 and the requested {}",
                            a.requested_duration_seconds
                        ),
                        field: Some("constraints.duration_seconds".into()),
                    });
                }
                let max_uses = narrowing.max_uses.unwrap_or(a.requested_max_uses);
                if max_uses == 0 || max_uses > a.requested_max_uses {
                    return Err(OpError {
                        kind: ErrorKind::Conflict,
                        code: codes::CONSTRAINT_EXCEEDED.into(),
                        message: format!(
                            "max_uses must be between 1 and the requested {}",
                            a.requested_max_uses
                        ),
                        field: Some("constraints.max_uses".into()),
                    });
                }
                let mut d = SignedDecision {
                    decision,
                    revision: a.revision + 1,
                    decided_at_ms: now,
                    expires_at_ms: (decision == DecisionKind::Approve)
                        .then_some(now + duration * 1000),
                    max_uses,
                    hmac: String::new(),
                };
                d.hmac = key.sign(&a.decision_message(&d));
                let mut after = a.clone();
                after.status = match decision {
                    DecisionKind::Approve => ApprovalStatus::Active,
                    DecisionKind::Deny => ApprovalStatus::Denied,
                };
                after.revision = d.revision;
                after.decision = Some(d.clone());
                let mut recs = vec![rec(
                    KIND_DECIDED,
                    &Decided {
                        approval_id: a.id.clone(),
                        decision: d,
                        idempotency_key: idem,
                        command_digest,
                    },
                )?];
                let mut approved = None;
                if op.state == OpState::Pending {
                    let t = match decision {
                        DecisionKind::Approve => {
                            approved = Some(op.id.clone());
                            transition(op, OpState::Approved, now)
                        }
                        DecisionKind::Deny => transition(op, OpState::Denied, now)
                            .error(codes::APPROVAL_DENIED, "the operator denied the request"),
                    };
                    recs.push(rec(KIND_TRANSITIONED, &t)?);
                }
                Ok((recs, (ApprovalView::of(&after, Some(op)), approved, false)))
            })
            .await
            .map_err(commit_err)?;
        if expired {
            return Err(OpError::new(
                ErrorKind::Conflict,
                codes::APPROVAL_EXPIRED,
                "the request expired before the decision",
            ));
        }
        if let Some(op) = approved_op {
            self.spawn_drive(op);
        }
        Ok(view)
    }

    pub async fn revoke(
        &self,
        id: &str,
        expected_revision: Option<u64>,
        idempotency_key: Option<&str>,
    ) -> Result<ApprovalView, OpError> {
        let id = id.to_string();
        let idem = idempotency_key.map(|k| k.trim().to_string());
        let now = crate::util::now_ms();
        self.commit(move |s: &crate::workspace::State| {
            let ops = &s.operations;
            let aid = Self::approval_id_for(ops, &id).ok_or_else(|| {
                OpError::new(ErrorKind::NotFound, codes::NOT_FOUND, "no such approval")
            })?;
            let a = &ops.approvals[&aid];
            let digest = crate::util::sha256_hex(b"revoke");
            if let Some(k) = &idem
                && let Some(prev) = a.decision_keys.get(k)
            {
                if *prev == digest {
                    return Ok((vec![], ApprovalView::of(a, ops.get(&a.operation_id))));
                }
                return Err(conflict());
            }
            if let Some(r) = expected_revision
                && r != a.revision
            {
                return Err(OpError::new(
                    ErrorKind::Conflict,
                    codes::REVISION_CONFLICT,
                    format!("the approval is at revision {}, not {r}", a.revision),
                ));
            }
            let op = ops.get(&a.operation_id);
            match a.status {
                ApprovalStatus::Active => {
                    let mut recs = vec![rec(
                        KIND_REVOKED,
                        &Revoked {
                            approval_id: a.id.clone(),
                            revision: a.revision + 1,
                            at_ms: now,
                            idempotency_key: idem.clone(),
                            command_digest: idem.as_ref().map(|_| digest.clone()),
                        },
                    )?];
                    let mut after = a.clone();
                    after.status = ApprovalStatus::Revoked;
                    after.revision += 1;
                    if let Some(op) = op.filter(|o| o.state == OpState::Approved) {
                        let t = transition(op, OpState::Canceled, now)
                            .error(codes::CANCELED, "the operator revoked the approval");
                        recs.push(rec(KIND_TRANSITIONED, &t)?);
                    }
                    Ok((recs, ApprovalView::of(&after, op)))
                }
                ApprovalStatus::Pending => {
                    // Revoking a request nobody decided yet cancels it.
                    let op = op.ok_or_else(OpError::not_found)?;
                    let t = transition(op, OpState::Canceled, now)
                        .error(codes::CANCELED, "the operator withdrew the request")
                        .approval(Some(ApprovalChange {
                            approval_id: a.id.clone(),
                            effect: ApprovalEffect::Cancel,
                        }));
                    let mut after = a.clone();
                    after.status = ApprovalStatus::Canceled;
                    after.revision += 1;
                    Ok((
                        vec![rec(KIND_TRANSITIONED, &t)?],
                        ApprovalView::of(&after, Some(op)),
                    ))
                }
                other => Err(OpError::new(
                    ErrorKind::Conflict,
                    codes::APPROVAL_NOT_PENDING,
                    format!("the approval is {other:?} and cannot be revoked").to_lowercase(),
                )),
            }
        })
        .await
        .map_err(commit_err)
    }

    // ---------- execution ----------

    fn spawn_drive(&self, id: String) {
        if !self.autorun.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let Some(me) = self.me.upgrade() else { return };
        tokio::spawn(async move { me.drive(&id).await });
    }

    /// Claims an approved operation and runs it. Safe to call from every process at once.
    pub async fn drive(&self, id: &str) {
        {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            if !running.insert(id.to_string()) {
                return;
            }
        }
        let r = self.drive_inner(id).await;
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        if let Err(e) = r {
            tracing::error!(operation = id, error = %e, "operation could not be driven");
        }
    }

    async fn drive_inner(&self, id: &str) -> Result<(), OpError> {
        let Some((approved, needs_key)) = self.ws.read(|s| {
            s.operations
                .get(id)
                .map(|op| (op.state == OpState::Approved, op.approval_id.is_some()))
        }) else {
            return Ok(());
        };
        if !approved {
            return Ok(());
        }
        // The key is read only when an approval must be checked.
        let key = if needs_key {
            OperatorKey::load().ok()
        } else {
            None
        };
        let policy = self.policy().ok();
        let id_s = id.to_string();
        let executor = self.executor.clone();
        let registry = self.registry.clone();
        let now = crate::util::now_ms();
        let claim = self
            .commit(move |s: &crate::workspace::State| {
                claim_records(
                    &s.operations,
                    &registry,
                    &id_s,
                    now,
                    key.as_ref(),
                    policy.as_ref(),
                    &executor,
                )
            })
            .await
            .map_err(commit_err)?;
        let Claim::Run { plan, approval_id } = claim else {
            return Ok(());
        };
        failpoint("after_claim");
        self.execute_claimed(id, plan, approval_id).await
    }

    /// Runs an operation this process has claimed (`executing` is durable), then settles it.
    async fn execute_claimed(
        &self,
        id: &str,
        plan: Box<Plan>,
        approval_id: Option<String>,
    ) -> Result<(), OpError> {
        let Some(adapter) = self.registry.lookup(&plan.operation).cloned() else {
            return Ok(());
        };
        let op = self.ws.read(|s| s.operations.get(id).cloned());
        let Some(op) = op else { return Ok(()) };
        let ctx = self.ctx(&op);
        let resolved = plan.resolved();
        let exec = adapter.execute(&ctx, &resolved).await;
        failpoint("after_execute");
        let settle = match exec {
            Ok(o) if o.proven => Settle::Succeeded(o),
            Ok(o) => {
                self.reconcile_or_fail(&*adapter, &ctx, &resolved, Some(o), None)
                    .await
            }
            Err(e) => match e.kind {
                FailureKind::NotStarted => Settle::Failed {
                    code: e.code,
                    message: redact(&e.message),
                    effect: ApprovalEffect::Release,
                },
                FailureKind::Definitive => Settle::Failed {
                    code: e.code,
                    message: redact(&e.message),
                    effect: ApprovalEffect::Commit,
                },
                FailureKind::PossiblyPartial => {
                    self.reconcile_or_fail(&*adapter, &ctx, &resolved, None, Some(e.message))
                        .await
                }
            },
        };
        self.finish(&op, approval_id, settle).await?;
        adapter.cleanup(&ctx, &resolved).await;
        Ok(())
    }

    async fn reconcile_or_fail(
        &self,
        adapter: &dyn super::adapter::Adapter,
        ctx: &AdapterCtx,
        plan: &Resolved,
        exec: Option<Outcome>,
        exec_msg: Option<String>,
    ) -> Settle {
        match adapter.reconcile(ctx, plan).await {
            Ok(r) if r.proven => Settle::Succeeded(Outcome {
                proven: true,
                result: r.result.or(exec.as_ref().and_then(|e| e.result.clone())),
                upstream_status: r.upstream_status.or(exec.and_then(|e| e.upstream_status)),
            }),
            _ => Settle::Failed {
                code: codes::UPSTREAM_UNKNOWN.into(),
                message: match exec_msg {
                    Some(m) => format!("the outcome could not be proven ({})", redact(&m)),
                    None => "the outcome could not be proven".into(),
                },
                effect: ApprovalEffect::Retain,
            },
        }
    }

    async fn finish(
        &self,
        op: &Operation,
        approval_id: Option<String>,
        settle: Settle,
    ) -> Result<(), OpError> {
        let id = op.id.clone();
        let operation = op.operation.clone();
        let now = crate::util::now_ms();
        self.commit(move |s: &crate::workspace::State| {
            let ops = &s.operations;
            let Some(op) = ops.get(&id) else {
                return Ok((vec![], ()));
            };
            if op.state != OpState::Executing {
                return Ok((vec![], ()));
            }
            // Only an approval holding a reservation for this operation is settled.
            let reserved = approval_id
                .as_ref()
                .and_then(|a| ops.approvals.get(a))
                .filter(|a| a.uses.get(&id) == Some(&UseState::Reserved))
                .map(|a| a.id.clone());
            let change = |effect| {
                reserved.clone().map(|approval_id| ApprovalChange {
                    approval_id,
                    effect,
                })
            };
            let t = match settle {
                Settle::Succeeded(o) => {
                    let result = o.result.unwrap_or_else(
                        || serde_json::json!({"operation": operation, "reconciled": true}),
                    );
                    let size = serde_json::to_string(&result)
                        .map(|t| t.len())
                        .unwrap_or(usize::MAX);
                    if !result.is_object() || size > MAX_RESULT_BYTES {
                        transition(op, OpState::Failed, now)
                            .error(
                                codes::STORE_UNAVAILABLE,
                                "the operation ran but its result could not be stored",
                            )
                            .approval(change(ApprovalEffect::Commit))
                    } else {
                        let mut t = transition(op, OpState::Succeeded, now)
                            .approval(change(ApprovalEffect::Commit));
                        t.result = Some(result);
                        t.upstream_status = o.upstream_status;
                        t
                    }
                }
                Settle::Failed {
                    code,
                    message,
                    effect,
                } => transition(op, OpState::Failed, now)
                    .error(&code, message)
                    .approval(change(effect)),
            };
            Ok((vec![rec(KIND_TRANSITIONED, &t)?], ()))
        })
        .await
        .map_err(commit_err)
    }

    // ---------- recovery, expiry, retention ----------

    /// Startup recovery and the background loop: drives approved operations, reconciles
    /// executions whose process is gone, expires overdue requests, prunes old terminal ones.
    pub fn start(
        self: &Arc<Self>,
        live_executors: impl Fn() -> Vec<String> + Send + Sync + 'static,
    ) {
        if self.autorun.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut rx = me.ws.subscribe();
            me.recover(&live_executors()).await;
            me.prune().await;
            let mut last_prune = std::time::Instant::now();
            loop {
                let next = me.ws.read(|s| next_deadline(&s.operations));
                let now = crate::util::now_ms();
                let sleep = next
                    .map(|d| Duration::from_millis(d.saturating_sub(now).max(5)))
                    .unwrap_or(Duration::from_secs(3600))
                    .min(Duration::from_secs(60));
                tokio::select! {
                    n = rx.recv() => match n {
                        Ok(n) if n.method == NOTICE_CHANGED => {
                            if n.params.get("state").and_then(Value::as_str) == Some("approved")
                                && let Some(id) = n.params.get("id").and_then(Value::as_str)
                            {
                                me.spawn_drive(id.to_string());
                            }
                        }
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                            me.recover(&live_executors()).await;
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                    },
                    _ = tokio::time::sleep(sleep) => {
                        me.expire_due().await;
                        if last_prune.elapsed() > Duration::from_secs(3600) {
                            me.prune().await;
                            last_prune = std::time::Instant::now();
                        }
                    }
                }
            }
        });
    }

    /// One recovery pass. `live_executors` are the executor ids of processes still running.
    pub async fn recover(&self, live_executors: &[String]) {
        self.expire_due().await;
        let (approved, executing): (Vec<String>, Vec<(String, Option<String>)>) =
            self.ws.read(|s| {
                let mut a = vec![];
                let mut e = vec![];
                for op in s.operations.operations.values() {
                    match op.state {
                        OpState::Approved => a.push(op.id.clone()),
                        OpState::Executing => e.push((op.id.clone(), executor_of(op))),
                        _ => {}
                    }
                }
                (a, e)
            });
        for (id, exec) in executing {
            let alive = exec
                .as_ref()
                .is_some_and(|x| *x == self.executor || live_executors.contains(x));
            if alive {
                continue;
            }
            if let Err(e) = self.reconcile_interrupted(&id).await {
                tracing::error!(operation = %id, error = %e, "recovery failed");
            }
        }
        for id in approved {
            self.drive(&id).await;
        }
    }

    /// An execution whose process died: prove the outcome by reading back, never re-run.
    pub async fn reconcile_interrupted(&self, id: &str) -> Result<(), OpError> {
        let op = self.ws.read(|s| s.operations.get(id).cloned());
        let Some(op) = op else { return Ok(()) };
        if op.state != OpState::Executing {
            return Ok(());
        }
        let verified = op
            .plan
            .as_deref()
            .zip(op.plan_digest.as_deref())
            .ok_or(())
            .and_then(|(t, d)| Plan::verify(t, d, &op.id, &op.client_id, 0, false).map_err(|_| ()));
        let adapter = verified
            .as_ref()
            .ok()
            .and_then(|p| self.registry.lookup(&p.operation).cloned());
        let settle = match (verified, adapter) {
            (Ok(plan), Some(adapter)) => {
                let ctx = self.ctx(&op);
                let resolved = plan.resolved();
                let s = match adapter.reconcile(&ctx, &resolved).await {
                    Ok(o) if o.proven => {
                        let missing = self.ws.read(|s| {
                            s.operations.approval_of(&op).is_some_and(|a| {
                                !matches!(a.uses.get(&op.id), Some(UseState::Reserved | UseState::Committed))
                            })
                        });
                        if missing {
                            Settle::Failed {
                                code: codes::APPROVAL_RESERVATION_MISSING.into(),
                                message: "the approval shows no reservation for this execution".into(),
                                effect: ApprovalEffect::Retain,
                            }
                        } else {
                            Settle::Succeeded(o)
                        }
                    }
                    _ => Settle::Failed {
                        code: codes::UPSTREAM_UNKNOWN.into(),
                        message: "the execution was interrupted and its outcome could not be proven after restart".into(),
                        effect: ApprovalEffect::Retain,
                    },
                };
                adapter.cleanup(&ctx, &resolved).await;
                s
            }
            _ => Settle::Failed {
                code: codes::INVALID_STORED.into(),
                message: "the stored plan could not be loaded".into(),
                effect: ApprovalEffect::Retain,
            },
        };
        self.finish(&op, op.approval_id.clone(), settle).await
    }

    /// Moves pending requests and unused approvals past their deadline to `expired`.
    pub async fn expire_due(&self) {
        let now = crate::util::now_ms();
        let r = self
            .commit(move |s: &crate::workspace::State| {
                let ops = &s.operations;
                let mut recs = vec![];
                for op in ops.operations.values() {
                    let a = ops.approval_of(op);
                    let due = match (op.state, a) {
                        (OpState::Pending, Some(a)) => {
                            a.status == ApprovalStatus::Pending && now >= a.pending_expires_at_ms
                        }
                        (OpState::Approved, Some(a)) => a
                            .decision
                            .as_ref()
                            .and_then(|d| d.expires_at_ms)
                            .is_some_and(|e| now >= e),
                        _ => false,
                    };
                    if !due {
                        continue;
                    }
                    let own = a
                        .filter(|a| a.operation_id == op.id)
                        .map(|a| ApprovalChange {
                            approval_id: a.id.clone(),
                            effect: ApprovalEffect::Expire,
                        });
                    let t = transition(op, OpState::Expired, now)
                        .error(
                            codes::APPROVAL_EXPIRED,
                            "the approval expired before the operation ran",
                        )
                        .approval(own);
                    recs.push(rec(KIND_TRANSITIONED, &t)?);
                }
                Ok((recs, ()))
            })
            .await;
        if let Err(e) = r {
            tracing::error!(error = %commit_err(e), "expiry sweep failed");
        }
    }

    pub async fn prune(&self) {
        let before = crate::util::now_ms().saturating_sub(self.config.retention_ms);
        let r = self
            .commit(move |s: &crate::workspace::State| {
                let due = s
                    .operations
                    .terminal
                    .first()
                    .is_some_and(|(t, _)| *t < before);
                if !due {
                    return Ok((vec![], ()));
                }
                Ok((vec![rec(KIND_PRUNED, &Pruned { before_ms: before })?], ()))
            })
            .await;
        if let Err(e) = r {
            tracing::error!(error = %commit_err(e), "retention sweep failed");
        }
    }
}

#[derive(Clone)]
enum Settle {
    Succeeded(Outcome),
    Failed {
        code: String,
        message: String,
        effect: ApprovalEffect,
    },
}

fn conflict() -> OpError {
    OpError::new(
        ErrorKind::Conflict,
        codes::IDEMPOTENCY_CONFLICT,
        "this idempotency key was used for a different request",
    )
}

/// Chosen approval bounds: (duration seconds, uses, pending seconds), or why they break the
/// rule's own limits.
fn approval_intent(
    gp: &GrantPolicy,
    approval_ttl: u64,
    request_ttl: u64,
) -> Result<(u64, u32, u64), String> {
    if gp.default_minutes > gp.max_minutes {
        return Err("the request rule's default duration exceeds its maximum".into());
    }
    match gp.mode {
        GrantMode::Execution => {
            if gp.default_max_uses != 1 || gp.max_uses != Some(1) {
                return Err("an execution approval authorises exactly one use".into());
            }
        }
        GrantMode::Window => {
            if gp.max_uses.is_some_and(|m| gp.default_max_uses > m)
                || gp.default_max_uses > MAX_GRANT_USES
            {
                return Err("the request rule's default uses exceed its limit".into());
            }
        }
    }
    let duration = (u64::from(gp.default_minutes) * 60).min(approval_ttl);
    let pending = (u64::from(gp.request_ttl_minutes) * 60).min(request_ttl);
    Ok((duration, gp.default_max_uses, pending))
}

fn active_grants(s: &OperationState, client: &str, now: u64) -> Vec<ActiveGrant> {
    s.approvals
        .values()
        .filter(|a| {
            a.client_id == client
                && a.mode == GrantMode::Window
                && a.status == ApprovalStatus::Active
                && !a.has_retained()
        })
        .filter_map(|a| {
            let d = a.decision.as_ref()?;
            Some(ActiveGrant {
                id: a.id.clone(),
                client: a.client_id.clone(),
                operation: a.operation.clone(),
                class: a.classification.clone(),
                expires_at_ms: d.expires_at_ms?,
                uses_left: Some(d.max_uses.saturating_sub(a.uses_spent())),
            })
        })
        .filter(|g| now < g.expires_at_ms)
        .collect()
}

fn next_deadline(s: &OperationState) -> Option<u64> {
    s.operations
        .values()
        .filter_map(|op| {
            let a = s.approval_of(op)?;
            match op.state {
                OpState::Pending if a.status == ApprovalStatus::Pending => {
                    Some(a.pending_expires_at_ms)
                }
                OpState::Approved => a.decision.as_ref()?.expires_at_ms,
                _ => None,
            }
        })
        .min()
}

fn executor_of(op: &Operation) -> Option<String> {
    op.executor.clone()
}

/// Builder for a transition record.
fn transition(op: &Operation, to: OpState, now: u64) -> Transitioned {
    Transitioned {
        id: op.id.clone(),
        from: op.state,
        to,
        revision: op.revision + 1,
        at_ms: now,
        error: None,
        result: None,
        upstream_status: None,
        approval: None,
        executor: None,
    }
}

impl Transitioned {
    fn error(mut self, code: &str, message: impl Into<String>) -> Transitioned {
        self.error = Some(OpFailure::new(code, message));
        self
    }
    fn approval(mut self, change: Option<ApprovalChange>) -> Transitioned {
        self.approval = change;
        self
    }
}

fn view_after(op: &Operation, t: &Transitioned) -> OperationView {
    let mut o = op.clone();
    o.state = t.to;
    o.revision = t.revision;
    o.updated_at_ms = t.at_ms.max(o.updated_at_ms);
    if t.error.is_some() {
        o.error = t.error.clone();
    }
    if t.to.is_terminal() {
        o.terminal_at_ms = Some(o.updated_at_ms);
    }
    OperationView::of(&o)
}

/// Validates an approved operation for execution and, if it may run, writes the claim:
/// `approved -> executing` plus the approval's reservation, in one record.
fn claim_records(
    ops: &OperationState,
    registry: &Registry,
    id: &str,
    now: u64,
    key: Option<&OperatorKey>,
    policy: Option<&Policy>,
    executor: &str,
) -> Result<(Vec<NewRecord>, Claim), OpError> {
    let Some(op) = ops.get(id) else {
        return Ok((vec![], Claim::Skip));
    };
    if op.state != OpState::Approved {
        return Ok((vec![], Claim::Skip));
    }
    let fail = |code: &str, msg: &str| -> Result<(Vec<NewRecord>, Claim), OpError> {
        let t = transition(op, OpState::Failed, now).error(code, msg);
        Ok((vec![rec(KIND_TRANSITIONED, &t)?], Claim::Skip))
    };
    let plan = match op
        .plan
        .as_deref()
        .zip(op.plan_digest.as_deref())
        .map(|(t, d)| Plan::verify(t, d, &op.id, &op.client_id, now, true))
    {
        Some(Ok(p)) => p,
        _ => {
            return fail(
                codes::INVALID_STORED,
                "the stored plan is missing, altered or expired",
            );
        }
    };
    if plan.operation != op.operation || registry.lookup(&plan.operation).is_none() {
        return fail(
            codes::INVALID_STORED,
            "the stored plan names an operation without an adapter",
        );
    }
    let mut reserve = None;
    match ops.approval_of(op) {
        None if op.approval_id.is_some() => {
            return fail(
                codes::APPROVAL_INVALID,
                "the operation's approval is missing",
            );
        }
        None => {
            // Direct path: a static allow rule must still allow it now.
            let allowed = policy.is_some_and(|p| {
                let d = p.decide(
                    &PolicyRequest {
                        client: &op.client_id,
                        operation: &op.operation,
                        class: &plan.authorization.classification,
                    },
                    &[],
                    now,
                );
                d.effect == DecisionEffect::Allow && d.grant_id.is_none()
            });
            if !allowed || plan.authorization.policy_effect != DecisionEffect::Allow {
                return fail(
                    codes::APPROVAL_INVALID,
                    "no approval and no allow rule covers this operation",
                );
            }
        }
        Some(a) => {
            let Some(d) = a
                .decision
                .as_ref()
                .filter(|d| d.decision == DecisionKind::Approve)
            else {
                return fail(codes::APPROVAL_INVALID, "the approval was never granted");
            };
            let signed = key.is_some_and(|k| k.verify(&a.decision_message(d), &d.hmac));
            let bound = a.client_id == op.client_id
                && a.operation == op.operation
                && (a.plan_digest == plan_digest(op)
                    || (a.mode == GrantMode::Window
                        && a.classification == plan.authorization.classification));
            if !signed || !bound {
                return fail(
                    codes::APPROVAL_INVALID,
                    "the approval is not validly signed for this plan",
                );
            }
            let usable = a.status == ApprovalStatus::Active
                && d.expires_at_ms.is_some_and(|e| now < e)
                && a.uses_spent() < d.max_uses
                && !a.has_retained()
                && !a.uses.contains_key(&op.id);
            if !usable {
                return fail(
                    codes::APPROVAL_UNAVAILABLE,
                    "the approval can no longer be used",
                );
            }
            reserve = Some(a.id.clone());
        }
    }
    let mut t =
        transition(op, OpState::Executing, now).approval(reserve.clone().map(|approval_id| {
            ApprovalChange {
                approval_id,
                effect: ApprovalEffect::Reserve,
            }
        }));
    t.executor = Some(executor.to_string());
    Ok((
        vec![rec(KIND_TRANSITIONED, &t)?],
        Claim::Run {
            plan: Box::new(plan),
            approval_id: reserve,
        },
    ))
}

fn plan_digest(op: &Operation) -> String {
    op.plan_digest.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operations::adapter::{Catalog, Presentation};
    use crate::operations::policy::Classification;
    use crate::operations::state::KIND_CREATED;
    use std::path::Path;

    fn registry() -> Registry {
        let cats: Vec<Catalog> = vec![crate::operations::adapters::workspace::catalog()];
        Registry::new(&cats, crate::operations::adapters::workspace::adapters()).unwrap()
    }

    fn key() -> (tempfile::TempDir, OperatorKey) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("k");
        OperatorKey::init(&p, None).unwrap();
        let k = OperatorKey::load_from(&p).unwrap();
        (d, k)
    }

    /// A pending operation with its approval, folded into a fresh state.
    fn pending(expires_in: u64) -> OperationState {
        let plan = Plan {
            schema: PLAN_SCHEMA.into(),
            operation: "file.write".into(),
            operation_revision: 1,
            provider: "workspace".into(),
            client_id: "agent".into(),
            operation_id: "op_1".into(),
            target: serde_json::json!({"path": "a"}),
            arguments: serde_json::json!({"content": "x"}),
            preconditions: serde_json::json!({"prior_sha256": null}),
            presentation: Presentation {
                title: "Write a".into(),
                summary: String::new(),
            },
            authorization: PlanAuthorization {
                classification: Classification::default(),
                policy_effect: DecisionEffect::Request,
                rule_ids: vec![],
                mode: Some(GrantMode::Execution),
                requested_duration_seconds: Some(60),
                requested_max_uses: Some(1),
            },
            created_at_ms: 1_000,
            expires_at_ms: 1_000 + expires_in,
        };
        let text = plan.canonical();
        let digest = Plan::digest_of(&text);
        let mut op = crate::operations::state::tests::op("op_1", OpState::Pending, Some("ap_1"));
        op.plan = Some(text);
        op.plan_digest = Some(digest.clone());
        let mut a = crate::operations::state::tests::approval("ap_1", "op_1");
        a.plan_digest = digest;
        a.pending_expires_at_ms = 100_000;
        let mut s = OperationState::default();
        s.apply_record(
            KIND_CREATED,
            &serde_json::to_value(Created {
                operation: op,
                approval: Some(a),
            })
            .unwrap(),
            &mut vec![],
        )
        .unwrap();
        s
    }

    fn approve(s: &mut OperationState, key: &OperatorKey, max_uses: u32) {
        let a = s.approvals["ap_1"].clone();
        let mut d = SignedDecision {
            decision: DecisionKind::Approve,
            revision: 2,
            decided_at_ms: 1_500,
            expires_at_ms: Some(50_000),
            max_uses,
            hmac: String::new(),
        };
        d.hmac = key.sign(&a.decision_message(&d));
        let rec = Decided {
            approval_id: "ap_1".into(),
            decision: d,
            idempotency_key: "k".into(),
            command_digest: "c".into(),
        };
        s.apply_record(
            KIND_DECIDED,
            &serde_json::to_value(rec).unwrap(),
            &mut vec![],
        )
        .unwrap();
        let op = s.get("op_1").unwrap().clone();
        let t = transition(&op, OpState::Approved, 1_600);
        s.apply_record(
            KIND_TRANSITIONED,
            &serde_json::to_value(t).unwrap(),
            &mut vec![],
        )
        .unwrap();
    }

    fn outcome(recs: &[NewRecord]) -> (OpState, Option<String>, Option<ApprovalEffect>) {
        let t: Transitioned = serde_json::from_value(recs[0].payload.clone()).unwrap();
        (t.to, t.error.map(|e| e.code), t.approval.map(|a| a.effect))
    }

    #[test]
    fn a_signed_approval_for_this_plan_claims_and_reserves() {
        let (_d, k) = key();
        let mut s = pending(60_000);
        approve(&mut s, &k, 1);
        let (recs, claim) =
            claim_records(&s, &registry(), "op_1", 2_000, Some(&k), None, "me").unwrap();
        assert!(matches!(claim, Claim::Run { .. }));
        assert_eq!(
            outcome(&recs),
            (OpState::Executing, None, Some(ApprovalEffect::Reserve))
        );
        // Claiming again after the fold is a no-op: one winner.
        s.apply_record(KIND_TRANSITIONED, &recs[0].payload, &mut vec![])
            .unwrap();
        let (recs, claim) =
            claim_records(&s, &registry(), "op_1", 2_000, Some(&k), None, "me").unwrap();
        assert!(recs.is_empty() && matches!(claim, Claim::Skip));
        assert_eq!(s.get("op_1").unwrap().executor.as_deref(), Some("me"));
    }

    #[test]
    fn without_the_key_or_with_another_key_the_approval_is_invalid() {
        let (_d, k) = key();
        let (_d2, other) = key();
        let mut s = pending(60_000);
        approve(&mut s, &k, 1);
        for key in [None, Some(&other)] {
            let (recs, _) = claim_records(&s, &registry(), "op_1", 2_000, key, None, "me").unwrap();
            assert_eq!(
                outcome(&recs),
                (OpState::Failed, Some(codes::APPROVAL_INVALID.into()), None)
            );
        }
    }

    #[test]
    fn a_tampered_or_expired_plan_is_an_invalid_stored_operation() {
        let (_d, k) = key();
        let mut s = pending(60_000);
        approve(&mut s, &k, 1);
        let mut tampered = s.clone();
        let op = tampered.operations.get_mut("op_1").unwrap();
        op.plan = op
            .plan
            .as_ref()
            .map(|p| p.replace("\"content\":\"x\"", "\"content\":\"y\""));
        let (recs, _) =
            claim_records(&tampered, &registry(), "op_1", 2_000, Some(&k), None, "me").unwrap();
        assert_eq!(outcome(&recs).1.as_deref(), Some(codes::INVALID_STORED));
        // Re-digesting the tampered plan does not help: the approval was signed for the old one.
        let op = tampered.operations.get_mut("op_1").unwrap();
        op.plan_digest = op.plan.as_deref().map(Plan::digest_of);
        let (recs, _) =
            claim_records(&tampered, &registry(), "op_1", 2_000, Some(&k), None, "me").unwrap();
        assert_eq!(outcome(&recs).1.as_deref(), Some(codes::APPROVAL_INVALID));
        let (recs, _) =
            claim_records(&s, &registry(), "op_1", 70_000, Some(&k), None, "me").unwrap();
        assert_eq!(outcome(&recs).1.as_deref(), Some(codes::INVALID_STORED));
    }

    #[test]
    fn an_expired_or_retained_approval_is_unavailable() {
        let (_d, k) = key();
        let mut s = pending(600_000);
        approve(&mut s, &k, 1);
        let (recs, _) =
            claim_records(&s, &registry(), "op_1", 50_000, Some(&k), None, "me").unwrap();
        assert_eq!(
            outcome(&recs).1.as_deref(),
            Some(codes::APPROVAL_UNAVAILABLE)
        );
        let mut r = s.clone();
        r.approvals
            .get_mut("ap_1")
            .unwrap()
            .uses
            .insert("op_0".into(), UseState::Retained);
        let (recs, _) =
            claim_records(&r, &registry(), "op_1", 2_000, Some(&k), None, "me").unwrap();
        assert_eq!(
            outcome(&recs).1.as_deref(),
            Some(codes::APPROVAL_UNAVAILABLE)
        );
    }

    #[test]
    fn direct_operations_need_a_current_allow_rule() {
        let mut s = pending(60_000);
        let op = s.operations.get_mut("op_1").unwrap();
        op.approval_id = None;
        op.state = OpState::Approved;
        let allow =
            Policy::parse("rules:\n  - id: all\n    effect: allow\n", Path::new("p")).unwrap();
        // The plan itself recorded a request decision, so even an allow rule now is not enough.
        let (recs, _) =
            claim_records(&s, &registry(), "op_1", 2_000, None, Some(&allow), "me").unwrap();
        assert_eq!(outcome(&recs).1.as_deref(), Some(codes::APPROVAL_INVALID));
    }

    #[test]
    fn approval_bounds_follow_the_rule_and_the_descriptor() {
        let gp = GrantPolicy::default_for_missing_policy();
        assert_eq!(approval_intent(&gp, 300, 60), Ok((300, 1, 60)));
        let bad = GrantPolicy {
            default_minutes: 90,
            ..gp.clone()
        };
        assert!(approval_intent(&bad, 9_999, 9_999).is_err());
        let two = GrantPolicy {
            default_max_uses: 2,
            max_uses: Some(2),
            ..gp.clone()
        };
        assert!(approval_intent(&two, 600, 600).is_err());
        let window = GrantPolicy {
            mode: GrantMode::Window,
            ..two
        };
        assert_eq!(approval_intent(&window, 600, 600), Ok((600, 2, 600)));
    }
}
