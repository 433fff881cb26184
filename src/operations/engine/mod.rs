//! The operation runtime of one gaffer process, one file per lifecycle step:
//! [`submit`] (decode, resolve, classify, decide, record), [`decide`] (operator decisions
//! signed in the operator's own process), [`execute`] (re-derive the plan, authorize, claim,
//! run once, settle) and [`recover`] (restart recovery, expiry, retention). Every state change
//! is a `Workspace::commit` whose closure validates against the freshly folded state, so two
//! processes on one workspace never both claim an operation; every execution is authorized by
//! [`super::authorize::authorize`] at the moment of its claim.

mod deadlines;
mod decide;
mod detail;
mod execute;
mod grounds;
mod recover;
mod submit;

pub use decide::{DecisionRequest, PreparedDecision};

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::adapter::{AdapterCtx, AdapterError, Registry};
use super::adapters::external::ProviderFailure;
use super::lifecycle::{OpState, codes};
use super::policy::Policy;
use super::seal::Sealer;
use super::state::{
    ApprovalChange, ApprovalEffect, KIND_TRANSITIONED, NOTICE_CHANGED, OpFailure, Operation,
    Transitioned,
};
use super::trust::TrustStatus;
use super::views::OperationView;
use crate::workspace::{CommitError, NewRecord, Workspace};

pub const MAX_KEY_BYTES: usize = 128;
pub const MAX_REASON_BYTES: usize = 2000;
pub const MAX_TARGET_BYTES: usize = 16 * 1024;
/// Deepest nesting accepted in `target` and `arguments`: every record and snapshot that
/// carries them nests them a few levels further, and all of it must read back.
pub const MAX_VALUE_DEPTH: usize = 32;
pub const MAX_ARGUMENTS_BYTES: usize = 1 << 20;
pub const MAX_RESULT_BYTES: usize = 2 << 20;
pub const MAX_WAIT_SECONDS: u64 = 30;
pub use super::grant::MAX_GRANT_USES;
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
    pub(crate) fn not_found() -> OpError {
        OpError::new(ErrorKind::NotFound, codes::NOT_FOUND, "no such operation")
    }
    pub(crate) fn store(e: impl std::fmt::Display) -> OpError {
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

/// A created or transitioned record, keeping its value for this process's fold.
fn typed_rec<T>(kind: &str, payload: T) -> Result<NewRecord, OpError>
where
    T: serde::Serialize + Clone + Send + Sync + 'static,
{
    NewRecord::typed(kind, payload).map_err(OpError::store)
}

fn new_id(prefix: &str) -> Result<String, OpError> {
    crate::util::new_id(prefix).map_err(OpError::store)
}

fn failpoint(step: &str) {
    // Set when the process starts (tests spawn it so), read once: not an env lookup and a
    // copy of the value at every step of every operation.
    static FAILPOINT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let armed = FAILPOINT.get_or_init(|| std::env::var(FAILPOINT_ENV).ok());
    if armed.as_deref() == Some(step) {
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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

/// The trust records folded and the files the policy is read from: a change to any of them
/// rebuilds the policy.
type PolicyStamp = (u64, grounds::Grounds);

/// The policy to decide and authorize with, what it was built from (the operator key it was
/// checked against among them), and the trust records folded when it was: a commit refuses to
/// record a decision or claim made with it once more have been folded or its grounds changed.
#[derive(Clone)]
pub(super) struct Authority {
    pub policy: Arc<Policy>,
    pub grounds: grounds::Grounds,
    pub trust_seq: u64,
}

/// (client, idempotency key)
type SubmitKey = (String, String);

/// What this process accepted under an operation id: the client whose identity it checked
/// and the digest of the plan it accepted. Only that pair is vouched for: the journal can
/// hold another operation under the same id by the time it is claimed (cancelled, pruned and
/// created again by whoever writes the store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Vouch {
    pub client: String,
    pub plan_digest: String,
}

pub struct OperationRuntime {
    ws: Arc<Workspace>,
    registry: Registry,
    config: RuntimeConfig,
    /// This process, recorded as executor of what it claims.
    executor: String,
    running: Mutex<HashSet<String>>,
    /// Operations this process accepted from an authenticated connection and has not yet run,
    /// with what it accepted (see [`super::authorize::Check::vouched`]). In memory only:
    /// nothing on disk vouches.
    vouched: Mutex<HashMap<String, Vouch>>,
    submit_locks: Mutex<HashMap<SubmitKey, Weak<tokio::sync::Mutex<()>>>>,
    policy_cache: Mutex<Option<(PolicyStamp, Arc<Policy>)>>,
    /// The policy file and the operator key, looked at once per commit batch.
    grounds: Arc<grounds::GroundsWatch>,
    /// Whether `providers.yaml` was trusted when this process loaded its providers.
    providers_trust: std::sync::OnceLock<(TrustStatus, Vec<ProviderFailure>)>,
    /// Only a serving process executes; one-shot CLI processes leave approved work to it.
    autorun: std::sync::atomic::AtomicBool,
    /// The plan lanes this process runs (their scopes feed `lane_scope` rules).
    lanes: std::sync::OnceLock<Arc<crate::plans::LaneRegistry>>,
    /// Outcomes of the plan lanes' operations this process executed itself, as it saw them
    /// (evidence a plan's ledger accepts; journal records of an outcome are claims).
    executed: Mutex<HashMap<String, ExecutedHere>>,
    /// The timeouts of `wait`, kept by one timer.
    deadlines: deadlines::Deadlines,
    /// This machine's seal for the workspace, loaded when first needed once the store has
    /// an id and an anchor (None: its key could not be read or made; told once, and by
    /// `gaffer doctor`, not looked for again on every request).
    sealer: std::sync::OnceLock<Option<Arc<Sealer>>>,
    me: Weak<OperationRuntime>,
}

/// An execution this process ran and settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutedHere {
    pub client: String,
    pub operation: String,
    pub succeeded: bool,
    /// `exit_code` of the result (command.run).
    pub exit_code: Option<i64>,
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
            grounds: Arc::new(grounds::GroundsWatch::new(&ws)),
            ws,
            registry,
            config,
            executor,
            running: Mutex::new(HashSet::new()),
            vouched: Mutex::new(HashMap::new()),
            submit_locks: Mutex::new(HashMap::new()),
            policy_cache: Mutex::new(None),
            providers_trust: std::sync::OnceLock::new(),
            autorun: std::sync::atomic::AtomicBool::new(false),
            sealer: std::sync::OnceLock::new(),
            lanes: std::sync::OnceLock::new(),
            executed: Mutex::new(HashMap::new()),
            deadlines: deadlines::Deadlines::default(),
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

    /// This machine's seal for the workspace; None while the store has no id yet or the
    /// state directory cannot keep the key (then nothing this process accepts is sealed, and
    /// nothing checks).
    fn sealer(&self) -> Option<Arc<Sealer>> {
        if let Some(s) = self.sealer.get() {
            return s.clone();
        }
        let workspace_id = self.ws.workspace_id()?;
        let anchor = self.ws.restricting_anchor()?;
        self.sealer
            .get_or_init(|| match anchor.seal_key() {
                Ok(key) => Some(Arc::new(Sealer::new(key, &workspace_id))),
                Err(e) => {
                    tracing::error!(
                        error = %e,
                        "no seal key: no request can be verified or approved until gaffer restarts with one"
                    );
                    None
                }
            })
            .clone()
    }

    /// Whether a gaffer on this machine accepted the operation `id` (see [`super::seal`]).
    pub fn operation_sealed_here(&self, id: &str) -> bool {
        let Some(sealer) = self.sealer() else {
            return false;
        };
        self.ws.read(|s| {
            let ops = &s.operations;
            ops.get(id)
                .is_some_and(|op| sealer.checks(op, ops.approval_of(op)))
        })
    }

    /// Whether a gaffer on this machine accepted `op` (with `approval`, the one it names)
    /// from a client whose identity it checked (see [`super::seal`]).
    pub fn sealed_here(&self, op: &Operation, approval: Option<&super::state::Approval>) -> bool {
        self.sealer().is_some_and(|s| s.checks(op, approval))
    }

    /// What the policy would decide for `client` submitting a plan of this classification (a
    /// dry run: nothing is written).
    pub fn preview(
        &self,
        client: &str,
        operation: &str,
        class: &super::policy::Classification,
    ) -> super::policy::Decision {
        let now = crate::util::now_ms();
        let scope = self.lane_scope(client);
        let req = super::policy::PolicyRequest {
            client,
            operation,
            class,
            lane_scope: scope.as_deref(),
        };
        let policy = self.policy();
        // An operation the catalog lacks is never submitted: no window covers it.
        let grants = match self.registry.lookup(operation) {
            Some(a) => {
                let fits = submit::window_fits(&policy, &req, a.descriptor(), now);
                self.ws
                    .read(|s| submit::active_grants(&s.operations, client, now, fits))
            }
            None => vec![],
        };
        policy.decide(&req, &grants, now)
    }

    /// How a lane's operation this process executed itself ended, if it did.
    pub fn executed_here(&self, id: &str) -> Option<ExecutedHere> {
        self.executed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// Remembers how an execution of a lane's operation ended: a plan this process runs
    /// takes a lane's operation evidence from this account, not from the journal. Kept by the
    /// client's form, not by the lanes running now: a lane's operation may end after its plan
    /// did. Other clients' executions are not kept (nothing reads them, and a long-lived
    /// server would hold one entry per operation it ever ran).
    pub(super) fn remember_execution(&self, id: &str, e: ExecutedHere) {
        if !crate::plans::state::is_lane_client(&e.client) {
            return;
        }
        self.executed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), e);
    }

    /// Connects the plan lanes this process runs (set once, by the app).
    pub fn set_lanes(&self, lanes: Arc<crate::plans::LaneRegistry>) {
        let _ = self.lanes.set(lanes);
    }

    /// The scope of `client` when it is a plan lane this process runs.
    pub(crate) fn lane_scope(&self, client: &str) -> Option<Vec<String>> {
        self.lanes.get()?.get(client).map(|l| l.scope)
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn workspace(&self) -> &Arc<Workspace> {
        &self.ws
    }

    fn ctx(&self, op_id: &str, client: &str) -> AdapterCtx {
        self.ctx_with(op_id, client, &self.policy())
    }

    /// [`Self::ctx`] under a policy already looked up (the one that decided or authorized).
    fn ctx_with(&self, op_id: &str, client: &str, policy: &Policy) -> AdapterCtx {
        AdapterCtx {
            workspace_root: self.ws.root().to_path_buf(),
            operation_id: op_id.to_string(),
            client_id: client.to_string(),
            sandbox: policy.sandbox,
        }
    }

    /// The policy as its files stand now (one stat of each): for what no commit checks again.
    fn policy(&self) -> Arc<Policy> {
        self.authority_on(self.grounds.now()).policy
    }

    /// The policy to decide or claim with, from the latest look at its files (no stat): the
    /// commit that records the decision or claim checks them again and refuses a stale one.
    fn authority(&self) -> Authority {
        self.authority_on(self.grounds.latest())
    }

    /// The policy these grounds and the trust records folded now make, rebuilt only when one
    /// of them changed.
    fn authority_on(&self, grounds: grounds::Grounds) -> Authority {
        let trust_seq = self.ws.read(|s| s.trust.last_seq);
        let mut cache = self.policy_cache.lock().unwrap_or_else(|p| p.into_inner());
        let policy = match cache.as_ref() {
            Some(((seq, built_on), p)) if *seq == trust_seq && *built_on == grounds => {
                Arc::clone(p)
            }
            _ => {
                let p = Arc::new(super::trust::effective_policy(
                    &self.ws,
                    grounds.key.as_ref(),
                ));
                *cache = Some(((trust_seq, grounds.clone()), Arc::clone(&p)));
                p
            }
        };
        Authority {
            policy,
            grounds,
            trust_seq,
        }
    }

    /// Where `policy.yaml` stands now.
    pub fn policy_trust(&self) -> TrustStatus {
        let key = crate::operator::current_public();
        super::trust::check(&self.ws, super::policy::POLICY_FILE, key.as_ref())
            .map(|c| c.status)
            .unwrap_or(TrustStatus::NeverTrusted)
    }

    /// Where `providers.yaml` stood when this process decided which providers to start.
    pub fn providers_trust(&self) -> TrustStatus {
        self.providers_trust
            .get()
            .map_or(TrustStatus::Absent, |(status, _)| *status)
    }

    /// The trusted providers that did not start, and why.
    pub fn providers_failed(&self) -> &[ProviderFailure] {
        self.providers_trust
            .get()
            .map_or(&[], |(_, failed)| failed.as_slice())
    }

    /// Records the trust check [`super::open_runtime`] made before starting providers, and
    /// which of them did not start.
    pub fn set_providers_trust(&self, status: TrustStatus, failed: Vec<ProviderFailure>) {
        let _ = self.providers_trust.set((status, failed));
    }

    // ---------- reads ----------

    pub fn get(&self, client: Option<&str>, id: &str) -> Result<OperationView, OpError> {
        let look = |s: &crate::workspace::State| {
            s.operations
                .get(id)
                .filter(|op| client.is_none_or(|c| c == op.client_id))
                .map(OperationView::of)
        };
        // A miss is checked against the journal as it is now: the id may come from another
        // process that committed it after this one last looked.
        self.ws
            .read(look)
            .or_else(|| self.ws.read_fresh(look))
            .ok_or_else(OpError::not_found)
    }

    pub fn list(&self, client: Option<&str>, f: &ListFilter) -> Vec<OperationView> {
        let limit = f.limit.unwrap_or(100).min(1000);
        self.ws.read(|s| {
            // Newest first from the narrowest index; filtering stops at the limit.
            let ops = &s.operations;
            ops.index
                .newest_first(client, &f.states)
                .filter_map(|(_, id)| ops.get(id))
                .filter(|op| client.is_none_or(|c| c == op.client_id))
                .filter(|op| f.states.is_empty() || f.states.contains(&op.state))
                .filter(|op| f.operation.as_ref().is_none_or(|o| *o == op.operation))
                .take(limit)
                .map(OperationView::of)
                .collect()
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
        let watched = id.to_string();
        let wake = self.ws.wake_on(move |n| {
            &*n.method == NOTICE_CHANGED && n.params.str_field("id") == Some(watched.as_str())
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(wait_seconds);
        loop {
            // A view is built only for the answer, not for every notice that wakes the wait.
            let done = self.ws.read(|s| {
                let op = s
                    .operations
                    .get(id)
                    .filter(|op| client.is_none_or(|c| c == op.client_id))
                    .ok_or_else(OpError::not_found)?;
                let done = op.revision > after_revision || op.state.is_terminal();
                Ok::<_, OpError>(done.then(|| OperationView::of(op)))
            })?;
            if let Some(v) = done {
                return Ok(v);
            }
            tokio::select! {
                biased;
                () = wake.notified() => {}
                () = self.deadlines.until(deadline) => return self.get(client, id),
            }
        }
    }

    // ---------- cancel ----------

    pub async fn cancel(&self, client: Option<&str>, id: &str) -> Result<OperationView, OpError> {
        let client = client.map(str::to_string);
        let id_s = id.to_string();
        let now = crate::util::now_ms();
        let sealer = self.sealer();
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
                let view = OperationView::after(op, &t);
                Ok((vec![transition_rec(sealer.as_deref(), op, t)?], view))
            })
            .await
            .map_err(commit_err)?;
        Ok(view)
    }
}

fn conflict() -> OpError {
    OpError::new(
        ErrorKind::Conflict,
        codes::IDEMPOTENCY_CONFLICT,
        "this idempotency key was used for a different request",
    )
}

/// Builder for a transition record.
pub(crate) fn transition(op: &Operation, to: OpState, now: u64) -> Transitioned {
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
        seal: None,
    }
}

/// The record of transition `t` of `op`, sealed by this machine unless `op` stands as a
/// change gaffer did not make left it (see [`super::seal`]).
fn transition_rec(
    sealer: Option<&Sealer>,
    op: &Operation,
    mut t: Transitioned,
) -> Result<NewRecord, OpError> {
    t.seal = sealer.and_then(|s| s.seal_step(op, &t));
    typed_rec(KIND_TRANSITIONED, t)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A lane's execution is kept by its client's form, also once the lane no longer runs
    /// here (its plan may end before the operation does); any other client's is not kept.
    #[test]
    fn executions_are_kept_for_lane_clients_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = Workspace::open(dir.path()).expect("open");
        let registry = Registry::new(&[], vec![]).expect("registry");
        let rt = OperationRuntime::new(ws, registry, RuntimeConfig::default(), "test:0".into());
        let ended = |client: &str| ExecutedHere {
            client: client.into(),
            operation: "command.run".into(),
            succeeded: true,
            exit_code: Some(0),
        };
        rt.remember_execution("op_lane", ended("plan_1/lane-1-builder"));
        rt.remember_execution("op_host", ended("agent"));
        assert_eq!(
            rt.executed_here("op_lane"),
            Some(ended("plan_1/lane-1-builder"))
        );
        assert_eq!(rt.executed_here("op_host"), None);
    }
}
