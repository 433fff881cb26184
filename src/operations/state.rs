//! Operations and approvals as folded from the journal. `apply` is deterministic: every
//! process folding the same records reaches the same state and emits the same notices.

use std::collections::{BTreeMap, BTreeSet};

use crate::store::RecordPayload;
use crate::workspace::{Audience, NoticeParams};
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::adapter::Presentation;
use super::decision::DecisionPayload;
use super::index::{self, Id, Index};
use super::lifecycle::OpState;
use super::policy::{Classification, GrantMode};
use crate::operator::signed::OperatorSignature;

pub const KIND_CREATED: &str = "operation.created";
pub const KIND_TRANSITIONED: &str = "operation.transitioned";
pub const KIND_PRUNED: &str = "operation.pruned";
pub const KIND_DECIDED: &str = "approval.decided";
pub const KIND_REVOKED: &str = "approval.revoked";

pub const NOTICE_CHANGED: &str = "operations/changed";
pub const NOTICE_REQUESTED: &str = "approvals/requested";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OpFailure {
    pub code: String,
    pub message: String,
}

impl OpFailure {
    pub fn new(code: &str, message: impl Into<String>) -> OpFailure {
        OpFailure {
            code: code.into(),
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Operation {
    pub id: String,
    pub client_id: String,
    pub idempotency_key: String,
    pub operation: String,
    pub provider: String,
    /// sha256 of the exact form (token-exact numbers, canonical key order) of the submission,
    /// compared on replay.
    pub submitted: String,
    pub reason: String,
    /// Shared with the views built from it (a view is built for every answer).
    pub target: Arc<Value>,
    pub arguments: Arc<Value>,
    pub state: OpState,
    pub revision: u64,
    pub approval_id: Option<String>,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    pub terminal_at_ms: Option<u64>,
    pub presentation: Presentation,
    pub plan_digest: Option<String>,
    /// Canonical plan text; absent when the submission was refused before a plan existed.
    pub plan: Option<String>,
    pub result: Option<Value>,
    pub upstream_status: Option<u16>,
    pub error: Option<OpFailure>,
    /// The process (`pid:started_ms`) that claimed the execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<String>,
    /// This machine's seal over who asked for what (see [`super::seal`]): absent or failing
    /// on a request gaffer did not accept here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_seal: Option<String>,
    /// The journal seq of the record that created it, set by the fold (never read from a
    /// record: a copy appended later is folded at its own seq).
    #[serde(skip)]
    pub created_seq: u64,
    /// This machine's seal over the operation as its last change left it (see
    /// [`super::seal`]), from the record of that change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_seal: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatus {
    Pending,
    Active,
    Denied,
    Expired,
    Consumed,
    Revoked,
    Canceled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum UseState {
    Reserved,
    /// The outcome is unknown: the use stays spent and blocks the approval.
    Retained,
    Committed,
    Released,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    Approve,
    Deny,
}

/// An operator's decision: the signed envelope, and the facts read from its payload for
/// sweeps and views. Authority never comes from these copies: the execution check opens the
/// envelope with the public key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedDecision {
    pub decision: DecisionKind,
    /// Approval revision after the decision.
    pub revision: u64,
    pub decided_at_ms: u64,
    pub expires_at_ms: Option<u64>,
    pub max_uses: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub operator_signature: OperatorSignature,
}

impl SignedDecision {
    /// Reads the facts of an envelope without verifying it (the fold has no key; the
    /// execution check verifies).
    /// Also returns the approval id the payload names.
    pub fn unverified(sig: OperatorSignature) -> Result<(String, SignedDecision), String> {
        let p: DecisionPayload = serde_json::from_str(&sig.payload).map_err(|e| e.to_string())?;
        Ok((
            p.approval_id,
            SignedDecision {
                decision: p.decision,
                revision: p.revision,
                decided_at_ms: p.decided_at_ms,
                expires_at_ms: p.expires_at_ms,
                max_uses: p.max_uses,
                reason: p.reason,
                operator_signature: sig,
            },
        ))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    pub id: String,
    pub operation_id: String,
    pub client_id: String,
    pub operation: String,
    pub plan_digest: String,
    pub classification: Classification,
    pub mode: GrantMode,
    pub status: ApprovalStatus,
    pub revision: u64,
    pub created_at_ms: u64,
    pub pending_expires_at_ms: u64,
    pub requested_duration_seconds: u64,
    pub requested_max_uses: u32,
    pub decision: Option<SignedDecision>,
    /// Per-operation use records (reserve / commit / retain / release).
    pub uses: BTreeMap<String, UseState>,
    /// Operator decision idempotency: key -> digest of the command it carried.
    pub decision_keys: BTreeMap<String, String>,
}

impl Approval {
    pub fn uses_spent(&self) -> u32 {
        self.uses
            .values()
            .filter(|u| {
                matches!(
                    u,
                    UseState::Reserved | UseState::Retained | UseState::Committed
                )
            })
            .count() as u32
    }

    pub fn has_retained(&self) -> bool {
        self.uses.values().any(|u| *u == UseState::Retained)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalEffect {
    Reserve,
    Commit,
    Retain,
    Release,
    Cancel,
    Revoke,
    Expire,
    Deny,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalChange {
    pub approval_id: String,
    pub effect: ApprovalEffect,
}

// ---- record payloads ----

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Created {
    pub operation: Operation,
    pub approval: Option<Approval>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transitioned {
    pub id: String,
    pub from: OpState,
    pub to: OpState,
    /// Operation revision after the change.
    pub revision: u64,
    pub at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<OpFailure>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalChange>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<String>,
    /// This machine's seal over the operation as this change leaves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decided {
    pub approval_id: String,
    pub operator_signature: OperatorSignature,
    pub idempotency_key: String,
    pub command_digest: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Revoked {
    pub approval_id: String,
    pub revision: u64,
    pub at_ms: u64,
    pub operator_signature: OperatorSignature,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub command_digest: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pruned {
    /// Terminal operations that ended before this instant are dropped.
    pub before_ms: u64,
    /// This machine's seal over the cut-off and the record's seq ([`super::seal`]): a prune
    /// without one that checks is skipped, so the agent cannot make gaffer forget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal: Option<String>,
}

/// A notice for connected clients; `operators_only` maps to the workspace's operator audience.
#[derive(Debug, Clone)]
pub struct OpNotice {
    pub method: &'static str,
    pub params: Arc<dyn NoticeParams>,
    pub operators_only: bool,
}

// Kept typed until a client is sent it: watchers filter on `id` and `state` without JSON.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ChangedNotice {
    pub id: String,
    pub client_id: String,
    pub operation: String,
    pub state: OpState,
    pub revision: u64,
}

impl NoticeParams for ChangedNotice {
    fn str_field(&self, key: &str) -> Option<&str> {
        match key {
            "id" => Some(&self.id),
            "client_id" => Some(&self.client_id),
            "operation" => Some(&self.operation),
            "state" => Some(self.state.as_str()),
            _ => None,
        }
    }

    fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// Operations by id. Each is boxed: an `Operation` is ~500 bytes, and a tree node holding
/// eleven of them inline made every insert shift kilobytes and every bulk build copy them all.
pub type Operations = BTreeMap<String, Box<Operation>>;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(try_from = "Stored")]
pub struct OperationState {
    /// Stored in chunks of the compact form (see [`super::compact`]).
    #[serde(
        rename(serialize = "operation_chunks"),
        serialize_with = "super::compact::serialize_chunks"
    )]
    pub operations: Operations,
    pub approvals: BTreeMap<String, Approval>,
    /// client -> idempotency key -> operation id. Derived, like `terminal` and `index`: not
    /// stored (rebuilt when a snapshot is decoded, sharing one id per operation).
    #[serde(skip)]
    pub by_key: BTreeMap<String, BTreeMap<String, Id>>,
    /// (terminal_at_ms, id) of terminal operations, oldest first, for retention.
    #[serde(skip)]
    pub terminal: BTreeSet<(u64, Id)>,
    /// Records that could not be applied (kept for diagnostics; never silently lost).
    pub skipped: u64,
    #[serde(skip)]
    pub index: Index,
    /// Where prunes are checked (none: every prune is skipped).
    #[serde(skip)]
    pub seals: super::seal::SealSource,
}

/// [`OperationState`] as a snapshot stores it: everything but what is derived. (Snapshots
/// written before `by_key` and `terminal` were derived carry them too; they are ignored.)
#[derive(Deserialize)]
struct Stored {
    /// As snapshots store them now.
    #[serde(default, deserialize_with = "chunked")]
    operation_chunks: Option<Operations>,
    /// As older snapshots did: one array of compact operations, or a map of objects.
    #[serde(default, deserialize_with = "single")]
    operations: Option<Operations>,
    #[serde(deserialize_with = "crate::util::bulk_map")]
    approvals: BTreeMap<String, Approval>,
    skipped: u64,
}

fn chunked<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Operations>, D::Error> {
    super::compact::deserialize_chunks(d).map(Some)
}

fn single<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Operations>, D::Error> {
    super::compact::deserialize_ops(d).map(Some)
}

impl TryFrom<Stored> for OperationState {
    type Error = &'static str;

    /// Exactly one form of the operations, or the snapshot is refused (and the journal
    /// replayed): never a guess at which of two to trust, nor an empty set for a missing one.
    fn try_from(s: Stored) -> Result<OperationState, Self::Error> {
        let operations = match (s.operation_chunks, s.operations) {
            (Some(ops), None) | (None, Some(ops)) => ops,
            (Some(_), Some(_)) => return Err("both operation_chunks and operations are present"),
            (None, None) => return Err("missing field `operation_chunks`"),
        };
        let derived = index::derive(&operations, &s.approvals);
        Ok(OperationState {
            operations,
            approvals: s.approvals,
            by_key: derived.by_key,
            terminal: derived.terminal,
            skipped: s.skipped,
            index: derived.index,
            seals: Default::default(),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("payload does not decode: {0}")]
    Decode(#[from] serde_json::Error),
    #[error("{0}")]
    Invalid(String),
}

impl OperationState {
    /// The workspace fold entry point for kinds `operation.*` and `approval.*`.
    pub fn apply(
        &mut self,
        rec: &crate::workspace::Record,
        out: &mut Vec<crate::workspace::Notice>,
    ) {
        let mut notices = Vec::new();
        let folded = self.apply_record_at(&rec.kind, rec.seq, &*rec.payload, &mut notices);
        Self::emit(rec, folded, notices, out);
    }

    /// [`OperationState::apply`] for a record staged by this process, folding the value its
    /// committer encoded instead of decoding the text again. Anything but a created or a
    /// transitioned record, or a value of another type, takes the text path.
    pub fn apply_typed(
        &mut self,
        rec: &crate::workspace::Record,
        typed: crate::workspace::Typed,
        out: &mut Vec<crate::workspace::Notice>,
    ) {
        let mut notices = Vec::new();
        let folded = match rec.kind.as_str() {
            KIND_CREATED => match typed.take::<Created>() {
                Some(c) => {
                    same_as_text::<Created>(rec, &c);
                    self.apply_created(c, rec.seq, &mut notices)
                }
                None => return self.apply(rec, out),
            },
            KIND_TRANSITIONED => match typed.take::<Transitioned>() {
                Some(t) => {
                    same_as_text::<Transitioned>(rec, &t);
                    self.apply_transitioned(t, &mut notices)
                }
                None => return self.apply(rec, out),
            },
            _ => return self.apply(rec, out),
        };
        if folded.is_err() {
            self.skipped += 1;
        }
        Self::emit(rec, folded, notices, out);
    }

    fn emit(
        rec: &crate::workspace::Record,
        folded: Result<(), ApplyError>,
        notices: Vec<OpNotice>,
        out: &mut Vec<crate::workspace::Notice>,
    ) {
        if let Err(e) = folded {
            tracing::warn!(seq = rec.seq, kind = %rec.kind, error = %e, "operation record skipped");
            return;
        }
        for n in notices {
            let audience = if n.operators_only {
                Audience::Operators
            } else {
                Audience::Everyone
            };
            out.push(crate::workspace::Notice::to(audience, n.method, n.params));
        }
    }

    pub fn get(&self, id: &str) -> Option<&Operation> {
        self.operations.get(id).map(|o| &**o)
    }

    pub fn by_idempotency(&self, client: &str, key: &str) -> Option<&Operation> {
        self.by_key
            .get(client)
            .and_then(|m| m.get(key))
            .and_then(|id| self.operations.get(&**id))
            .map(|o| &**o)
    }

    pub fn approval_of(&self, op: &Operation) -> Option<&Approval> {
        op.approval_id.as_ref().and_then(|a| self.approvals.get(a))
    }

    /// Re-files operation `id`'s deadline from its state and approval.
    fn refresh_deadline(&mut self, id: &str) {
        let at = self
            .operations
            .get(id)
            .and_then(|op| index::deadline(op, &self.approvals));
        self.index.set_deadline(id, at);
    }

    /// Re-files approval `aid` (window membership) and the deadlines it decides.
    fn approval_changed(&mut self, aid: &str) {
        if let Some(a) = self.approvals.get(aid) {
            self.index.set_window(a);
        }
        for id in self.index.referring(aid) {
            self.refresh_deadline(&id);
        }
    }

    /// [`Self::apply_record_at`] for a record whose journal position does not matter (tests).
    pub fn apply_record(
        &mut self,
        kind: &str,
        payload: &(impl RecordPayload + ?Sized),
        out: &mut Vec<OpNotice>,
    ) -> Result<(), ApplyError> {
        self.apply_record_at(kind, 0, payload, out)
    }

    /// Folds one record of kind `operation.*` or `approval.*`, at journal position `seq`.
    /// Records that fail validation are logged and skipped; state is untouched by them.
    pub fn apply_record_at(
        &mut self,
        kind: &str,
        seq: u64,
        payload: &(impl RecordPayload + ?Sized),
        out: &mut Vec<OpNotice>,
    ) -> Result<(), ApplyError> {
        fn de<T: serde::de::DeserializeOwned>(
            v: &(impl RecordPayload + ?Sized),
        ) -> Result<T, ApplyError> {
            Ok(v.decode()?)
        }
        let r = match kind {
            KIND_CREATED => de(payload).and_then(|c| self.apply_created(c, seq, out)),
            KIND_TRANSITIONED => de(payload).and_then(|t| self.apply_transitioned(t, out)),
            KIND_DECIDED => de(payload).and_then(|d| self.apply_decided(d)),
            KIND_REVOKED => de(payload).and_then(|r| self.apply_revoked(r)),
            KIND_PRUNED => de(payload).and_then(|p| self.apply_pruned(p, seq)),
            other => Err(ApplyError::Invalid(format!("unknown kind {other}"))),
        };
        if r.is_err() {
            self.skipped += 1;
        }
        r
    }

    fn apply_created(
        &mut self,
        c: Created,
        seq: u64,
        out: &mut Vec<OpNotice>,
    ) -> Result<(), ApplyError> {
        let mut op = c.operation;
        op.created_seq = seq;
        if self.operations.contains_key(&op.id) {
            return Err(ApplyError::Invalid(format!("operation {} exists", op.id)));
        }
        if self
            .by_idempotency(&op.client_id, &op.idempotency_key)
            .is_some()
        {
            return Err(ApplyError::Invalid(format!(
                "idempotency key already used by client {}",
                op.client_id
            )));
        }
        if !op.state.valid_initial() || op.revision != 1 {
            return Err(ApplyError::Invalid(format!(
                "operation {} cannot start as {} revision {}",
                op.id, op.state, op.revision
            )));
        }
        if op.state.is_terminal() != op.terminal_at_ms.is_some() {
            return Err(ApplyError::Invalid(
                "terminal_at must be set iff terminal".into(),
            ));
        }
        if let Some(a) = &c.approval {
            // The request's copies of the plan digest, client and operation are what an
            // operator's view shows beside the plan: they must be the operation's own.
            if op.approval_id.as_deref() != Some(a.id.as_str())
                || a.operation_id != op.id
                || op.plan_digest.as_deref() != Some(a.plan_digest.as_str())
                || a.client_id != op.client_id
                || a.operation != op.operation
                || self.approvals.contains_key(&a.id)
                || a.status != ApprovalStatus::Pending
                || op.state != OpState::Pending
            {
                return Err(ApplyError::Invalid(format!(
                    "approval does not match operation {}",
                    op.id
                )));
            }
        } else if op.state == OpState::Pending {
            return Err(ApplyError::Invalid(
                "a pending operation needs an approval".into(),
            ));
        }
        if let Some(a) = c.approval {
            out.push(OpNotice {
                method: NOTICE_REQUESTED,
                params: Arc::new(approval_notice(&a, &op)),
                operators_only: true,
            });
            self.approvals.insert(a.id.clone(), a);
        }
        out.push(changed_notice(&op));
        if op.terminal_at_ms.is_some() {
            op.plan = None;
        }
        let shared = self.index.insert_op(&op);
        self.by_key
            .entry(op.client_id.clone())
            .or_default()
            .insert(op.idempotency_key.clone(), Arc::clone(&shared));
        if let Some(t) = op.terminal_at_ms {
            self.terminal.insert((t, shared));
        }
        let aid = op.approval_id.clone();
        self.index
            .set_deadline(&op.id, index::deadline(&op, &self.approvals));
        self.operations.insert(op.id.clone(), Box::new(op));
        if let Some(aid) = aid {
            self.approval_changed(&aid);
        }
        Ok(())
    }

    fn apply_transitioned(
        &mut self,
        t: Transitioned,
        out: &mut Vec<OpNotice>,
    ) -> Result<(), ApplyError> {
        // Each map is looked up once: a record checked and applied touches every operation
        // the same way (nothing is changed before the last check passes).
        let Some(op) = self.operations.get_mut(&t.id) else {
            return Err(ApplyError::Invalid(format!("no operation {}", t.id)));
        };
        if op.state != t.from || op.revision + 1 != t.revision || !t.from.can_move_to(t.to) {
            return Err(ApplyError::Invalid(format!(
                "operation {}: {} rev {} cannot become {} rev {}",
                t.id, op.state, op.revision, t.to, t.revision
            )));
        }
        if let Some(ch) = &t.approval {
            let Some(a) = self.approvals.get_mut(&ch.approval_id) else {
                return Err(ApplyError::Invalid(format!(
                    "no approval {}",
                    ch.approval_id
                )));
            };
            check_effect(a, &t.id, ch.effect)?;
            apply_effect(a, &t.id, ch.effect);
        }
        let shared = self.index.change_state(op, t.to);
        op.state = t.to;
        op.revision = t.revision;
        op.updated_at_ms = t.at_ms.max(op.updated_at_ms);
        if t.error.is_some() {
            op.error = t.error;
        }
        if t.result.is_some() {
            op.result = t.result;
        }
        if t.upstream_status.is_some() {
            op.upstream_status = t.upstream_status;
        }
        if t.executor.is_some() {
            op.executor = t.executor;
        }
        // Only the record of the last change speaks for the state it left.
        op.step_seal = t.seal;
        if t.to.is_terminal() {
            // The plan is needed only until the operation ends; the journal keeps it for audit.
            op.plan = None;
            op.terminal_at_ms = Some(op.updated_at_ms);
            self.terminal.insert((op.updated_at_ms, shared));
        }
        out.push(changed_notice(op));
        let aid = op.approval_id.clone();
        let at = index::deadline(op, &self.approvals);
        self.index.set_deadline(&t.id, at);
        for aid in t.approval.map(|c| c.approval_id).into_iter().chain(aid) {
            self.approval_changed(&aid);
        }
        Ok(())
    }

    fn apply_decided(&mut self, d: Decided) -> Result<(), ApplyError> {
        let Some(a) = self.approvals.get_mut(&d.approval_id) else {
            return Err(ApplyError::Invalid(format!(
                "no approval {}",
                d.approval_id
            )));
        };
        let (named, decision) = SignedDecision::unverified(d.operator_signature)
            .map_err(|e| ApplyError::Invalid(format!("decision payload: {e}")))?;
        if named != a.id
            || a.status != ApprovalStatus::Pending
            || a.revision + 1 != decision.revision
        {
            return Err(ApplyError::Invalid(format!(
                "approval {} is {:?} at revision {}",
                a.id, a.status, a.revision
            )));
        }
        a.status = match decision.decision {
            DecisionKind::Approve => ApprovalStatus::Active,
            DecisionKind::Deny => ApprovalStatus::Denied,
        };
        a.revision = decision.revision;
        a.decision_keys
            .insert(d.idempotency_key.clone(), d.command_digest.clone());
        a.decision = Some(decision);
        self.approval_changed(&d.approval_id);
        Ok(())
    }

    fn apply_revoked(&mut self, r: Revoked) -> Result<(), ApplyError> {
        let Some(a) = self.approvals.get_mut(&r.approval_id) else {
            return Err(ApplyError::Invalid(format!(
                "no approval {}",
                r.approval_id
            )));
        };
        if a.status != ApprovalStatus::Active || a.revision + 1 != r.revision {
            return Err(ApplyError::Invalid(format!(
                "approval {} cannot be revoked from {:?}",
                a.id, a.status
            )));
        }
        a.status = ApprovalStatus::Revoked;
        a.revision = r.revision;
        if let (Some(k), Some(c)) = (r.idempotency_key, r.command_digest) {
            a.decision_keys.insert(k, c);
        }
        self.approval_changed(&r.approval_id);
        Ok(())
    }

    /// Forgets the operations that ended before a prune's cut-off, if this machine sealed the
    /// prune ([`super::seal`]), but those the agent ended (`Sealer::keeps`).
    fn apply_pruned(&mut self, p: Pruned, seq: u64) -> Result<(), ApplyError> {
        let Some(sealer) = self
            .seals
            .sealer()
            .filter(|sealer| sealer.checks_prune(&p, seq))
        else {
            return Err(ApplyError::Invalid(
                "a prune not sealed by gaffer on this machine (nothing is forgotten)".into(),
            ));
        };
        let due: Vec<(u64, Id)> = self
            .terminal
            .iter()
            .take_while(|(t, _)| *t < p.before_ms)
            .cloned()
            .collect();
        for (t, id) in due {
            let kept = (self.operations.get(&*id))
                .is_some_and(|op| sealer.keeps(op, self.approval_of(op)));
            if !kept {
                self.terminal.remove(&(t, Arc::clone(&id)));
                self.forget(&id);
            }
        }
        Ok(())
    }

    /// Drops operation `id`, its key and the approval made with it.
    fn forget(&mut self, id: &str) {
        let Some(op) = self.operations.remove(id) else {
            return;
        };
        self.index.remove_op(&op);
        if let Some(keys) = self.by_key.get_mut(&op.client_id) {
            keys.remove(&op.idempotency_key);
            if keys.is_empty() {
                self.by_key.remove(&op.client_id);
            }
        }
        if let Some(aid) = &op.approval_id
            && self
                .approvals
                .get(aid)
                .is_some_and(|a| a.operation_id == op.id)
            && let Some(a) = self.approvals.remove(aid)
        {
            self.index.remove_window(&a.client_id, aid);
            for other in self.index.referring(aid) {
                self.refresh_deadline(&other);
            }
        }
    }
}

fn check_effect(a: &Approval, op_id: &str, e: ApprovalEffect) -> Result<(), ApplyError> {
    use ApprovalEffect::*;
    let ok = match e {
        Reserve => a.status == ApprovalStatus::Active && !a.uses.contains_key(op_id),
        Commit | Retain | Release => a.uses.get(op_id) == Some(&UseState::Reserved),
        Cancel | Expire | Deny => true,
        Revoke => true,
    };
    if ok {
        Ok(())
    } else {
        Err(ApplyError::Invalid(format!(
            "approval {} cannot take {e:?} for {op_id}",
            a.id
        )))
    }
}

fn apply_effect(a: &mut Approval, op_id: &str, e: ApprovalEffect) {
    use ApprovalEffect::*;
    let terminal_status = |s: ApprovalStatus| {
        matches!(
            s,
            ApprovalStatus::Denied
                | ApprovalStatus::Expired
                | ApprovalStatus::Consumed
                | ApprovalStatus::Revoked
                | ApprovalStatus::Canceled
        )
    };
    match e {
        Reserve => {
            a.uses.insert(op_id.to_string(), UseState::Reserved);
        }
        Commit => {
            a.uses.insert(op_id.to_string(), UseState::Committed);
            let max = a.decision.as_ref().map(|d| d.max_uses).unwrap_or(1);
            if a.status == ApprovalStatus::Active && a.uses_spent() >= max {
                a.status = ApprovalStatus::Consumed;
            }
        }
        Retain => {
            a.uses.insert(op_id.to_string(), UseState::Retained);
        }
        Release => {
            a.uses.insert(op_id.to_string(), UseState::Released);
        }
        Cancel => {
            if a.status == ApprovalStatus::Pending {
                a.status = ApprovalStatus::Canceled;
            } else if a.status == ApprovalStatus::Active {
                a.status = ApprovalStatus::Revoked;
            }
        }
        Revoke => {
            if !terminal_status(a.status) {
                a.status = ApprovalStatus::Revoked;
            }
        }
        Expire => {
            if matches!(a.status, ApprovalStatus::Pending | ApprovalStatus::Active) {
                a.status = ApprovalStatus::Expired;
            }
        }
        Deny => {
            if a.status == ApprovalStatus::Pending {
                a.status = ApprovalStatus::Denied;
            }
        }
    }
    a.revision += 1;
}

fn changed_notice(op: &Operation) -> OpNotice {
    OpNotice {
        method: NOTICE_CHANGED,
        params: Arc::new(ChangedNotice {
            id: op.id.clone(),
            client_id: op.client_id.clone(),
            operation: op.operation.clone(),
            state: op.state,
            revision: op.revision,
        }),
        operators_only: false,
    }
}

/// Params of `approvals/requested`: a nudge that a request is waiting. Its title and summary
/// are the record's, which whoever wrote the record chose: decide from `approvals/get`, which
/// renders the plan text.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ApprovalRequested {
    pub approval_id: String,
    pub operation_id: String,
    pub client_id: String,
    pub operation: String,
    pub title: String,
    pub summary: String,
    pub reason: String,
    /// Pass as `expected_revision` to `approvals/prepare`.
    pub revision: u64,
    pub pending_expires_at_ms: u64,
}

fn approval_notice(a: &Approval, op: &Operation) -> Value {
    serde_json::to_value(ApprovalRequested {
        approval_id: a.id.clone(),
        operation_id: op.id.clone(),
        client_id: op.client_id.clone(),
        operation: op.operation.clone(),
        title: op.presentation.title.clone(),
        summary: op.presentation.summary.clone(),
        reason: op.reason.clone(),
        revision: a.revision,
        pending_expires_at_ms: a.pending_expires_at_ms,
    })
    .unwrap_or(Value::Null)
}

/// Debug builds check that a value folded directly is what replay will decode from the text:
/// the journal, not this process's memory, is the record.
fn same_as_text<T>(rec: &crate::workspace::Record, value: &T)
where
    T: serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    if cfg!(debug_assertions) {
        let decoded: Result<T, _> = rec.payload.decode();
        assert_eq!(
            decoded.as_ref().ok(),
            Some(value),
            "record {} ({}) folds differently from its text",
            rec.seq,
            rec.kind
        );
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A stored state holds its operations in exactly one form: both, or neither, is refused
    /// (the snapshot is then skipped and the journal replayed), never guessed at; empty chunks
    /// are an empty set.
    #[test]
    fn a_stored_state_with_both_forms_of_operations_or_neither_is_refused() {
        let mut s = OperationState::default();
        s.operations
            .insert("op_1".into(), Box::new(op("op_1", OpState::Denied, None)));
        let written = serde_json::to_value(&s).unwrap();
        let back: OperationState = serde_json::from_str(&written.to_string()).unwrap();
        assert_eq!(back.operations, s.operations);
        let mut both = written.clone();
        both["operations"] = serde_json::json!([]);
        let mut neither = written.clone();
        neither.as_object_mut().unwrap().remove("operation_chunks");
        for (name, bad) in [("both", both), ("neither", neither)] {
            let r = serde_json::from_str::<OperationState>(&bad.to_string());
            assert!(r.is_err(), "{name}: {:?}", r.map(|s| s.operations.len()));
        }
        let mut empty = written;
        empty["operation_chunks"] = serde_json::json!([[], [], []]);
        let back: OperationState = serde_json::from_str(&empty.to_string()).unwrap();
        assert!(back.operations.is_empty());
    }

    pub(crate) fn op(id: &str, state: OpState, approval: Option<&str>) -> Operation {
        Operation {
            id: id.into(),
            client_id: "agent".into(),
            idempotency_key: format!("key-{id}"),
            operation: "file.write".into(),
            provider: "workspace".into(),
            submitted: "{}".into(),
            reason: "r".into(),
            target: serde_json::json!({}).into(),
            arguments: serde_json::json!({}).into(),
            state,
            revision: 1,
            approval_id: approval.map(str::to_string),
            created_at_ms: 10,
            updated_at_ms: 10,
            terminal_at_ms: state.is_terminal().then_some(10),
            presentation: Presentation {
                title: "t".into(),
                summary: "s".into(),
            },
            plan_digest: Some("d".into()),
            plan: Some("{}".into()),
            result: None,
            upstream_status: None,
            error: None,
            executor: None,
            request_seal: None,
            created_seq: 0,
            step_seal: None,
        }
    }

    pub(crate) fn approval(id: &str, op_id: &str) -> Approval {
        Approval {
            id: id.into(),
            operation_id: op_id.into(),
            client_id: "agent".into(),
            operation: "file.write".into(),
            plan_digest: "d".into(),
            classification: Classification::default(),
            mode: GrantMode::Execution,
            status: ApprovalStatus::Pending,
            revision: 1,
            created_at_ms: 10,
            pending_expires_at_ms: 1_000,
            requested_duration_seconds: 60,
            requested_max_uses: 1,
            decision: None,
            uses: BTreeMap::new(),
            decision_keys: BTreeMap::new(),
        }
    }

    pub(crate) fn created(o: Operation, a: Option<Approval>) -> Value {
        serde_json::to_value(Created {
            operation: o,
            approval: a,
        })
        .unwrap()
    }

    pub(crate) fn tr(
        id: &str,
        from: OpState,
        to: OpState,
        rev: u64,
        eff: Option<(&str, ApprovalEffect)>,
    ) -> Value {
        serde_json::to_value(Transitioned {
            id: id.into(),
            from,
            to,
            revision: rev,
            at_ms: 20 * rev,
            error: None,
            result: None,
            upstream_status: None,
            approval: eff.map(|(a, e)| ApprovalChange {
                approval_id: a.into(),
                effect: e,
            }),
            executor: None,
            seal: None,
        })
        .unwrap()
    }

    /// An unsigned envelope: the fold reads its facts; only execution verifies signatures.
    pub(crate) fn envelope(payload: &impl serde::Serialize) -> OperatorSignature {
        OperatorSignature {
            head: crate::operator::Head {
                seq: 1,
                hash: "h".into(),
            },
            payload: crate::operator::signed::canonical_text(payload),
            signature: "unsigned".into(),
        }
    }

    pub(crate) fn decided(a: &str, rev: u64, kind: DecisionKind) -> Value {
        let payload = DecisionPayload {
            domain: "gaffer/decision/v1".into(),
            workspace_id: "ws".into(),
            approval_id: a.into(),
            operation_id: "op_1".into(),
            client: "agent".into(),
            operation: "kv.set".into(),
            plan_digest: "d".into(),
            classification_digest: "c".into(),
            mode: GrantMode::Execution,
            decision: kind,
            revision: rev,
            decided_at_ms: 15,
            expires_at_ms: Some(500),
            max_uses: 1,
            narrowed_duration_seconds: None,
            narrowed_max_uses: None,
            reason: None,
            head: crate::operator::Head {
                seq: 1,
                hash: "h".into(),
            },
        };
        serde_json::to_value(Decided {
            approval_id: a.into(),
            operator_signature: envelope(&payload),
            idempotency_key: "k".into(),
            command_digest: "c".into(),
        })
        .unwrap()
    }

    /// Watchers read a changed notice's fields typed; clients get its JSON: the two agree,
    /// and the JSON is what the notice always sent.
    #[test]
    fn a_changed_notice_reads_as_the_json_it_sends() {
        for state in OpState::ALL {
            let mut o = op("op_1", state, None);
            o.revision = 7;
            let n = changed_notice(&o);
            let sent = n.params.to_value();
            assert_eq!(
                sent,
                serde_json::json!({
                    "id": "op_1",
                    "client_id": o.client_id,
                    "operation": o.operation,
                    "state": state,
                    "revision": 7,
                })
            );
            for key in [
                "id",
                "client_id",
                "operation",
                "state",
                "revision",
                "absent",
            ] {
                assert_eq!(n.params.str_field(key), sent[key].as_str(), "{key}");
            }
        }
    }

    /// Folds `op_1`, pending on its approval `ap_1`.
    fn create_pending_op_1(s: &mut OperationState, out: &mut Vec<OpNotice>) {
        s.apply_record(
            KIND_CREATED,
            &created(
                op("op_1", OpState::Pending, Some("ap_1")),
                Some(approval("ap_1", "op_1")),
            ),
            out,
        )
        .unwrap();
    }

    /// Folds the operator's approval of `ap_1` and `op_1` becoming approved.
    fn approve_op_1(s: &mut OperationState, out: &mut Vec<OpNotice>) {
        s.apply_record(
            KIND_DECIDED,
            &decided("ap_1", 2, DecisionKind::Approve),
            out,
        )
        .unwrap();
        s.apply_record(
            KIND_TRANSITIONED,
            &tr("op_1", OpState::Pending, OpState::Approved, 2, None),
            out,
        )
        .unwrap();
    }

    /// Folds `op_1` starting to execute on a use of `ap_1`.
    fn execute_op_1(s: &mut OperationState, out: &mut Vec<OpNotice>) {
        s.apply_record(
            KIND_TRANSITIONED,
            &tr(
                "op_1",
                OpState::Approved,
                OpState::Executing,
                3,
                Some(("ap_1", ApprovalEffect::Reserve)),
            ),
            out,
        )
        .unwrap();
    }

    #[test]
    fn approval_path_folds_to_succeeded_with_a_committed_use() {
        let mut s = OperationState::default();
        let mut out = vec![];
        create_pending_op_1(&mut s, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].method, NOTICE_REQUESTED);
        assert!(out[0].operators_only);
        assert_eq!(out[1].method, NOTICE_CHANGED);
        assert!(!out[1].operators_only);
        approve_op_1(&mut s, &mut out);
        assert_eq!(s.approvals["ap_1"].status, ApprovalStatus::Active);
        execute_op_1(&mut s, &mut out);
        assert_eq!(s.approvals["ap_1"].uses["op_1"], UseState::Reserved);
        s.apply_record(
            KIND_TRANSITIONED,
            &tr(
                "op_1",
                OpState::Executing,
                OpState::Succeeded,
                4,
                Some(("ap_1", ApprovalEffect::Commit)),
            ),
            &mut out,
        )
        .unwrap();
        let o = s.get("op_1").unwrap();
        assert_eq!(
            (o.state, o.revision, o.terminal_at_ms),
            (OpState::Succeeded, 4, Some(80))
        );
        assert!(
            o.plan.is_none(),
            "a finished operation drops its plan text from state"
        );
        assert!(o.plan_digest.is_some());
        let a = &s.approvals["ap_1"];
        assert_eq!(a.status, ApprovalStatus::Consumed);
        assert_eq!(a.uses["op_1"], UseState::Committed);
        assert_eq!(s.skipped, 0);
    }

    /// A transition refused on its approval (an effect the approval cannot take, an approval
    /// that does not exist) or on the operation, while naming a valid effect, changes
    /// neither the operation, nor any approval's uses or status, nor the deadlines.
    #[test]
    fn transitions_refused_on_their_approval_leave_the_state_untouched() {
        let mut s = OperationState::default();
        let mut out = vec![];
        create_pending_op_1(&mut s, &mut out);
        approve_op_1(&mut s, &mut out);
        let unchanged = |s: &OperationState| {
            (
                s.get("op_1").cloned(),
                s.approvals.clone(),
                s.index.next_deadline(),
            )
        };
        let approved = unchanged(&s);
        assert!(approved.2.is_some(), "an approved operation has a deadline");
        let refused = [
            // No use reserved to commit.
            tr(
                "op_1",
                OpState::Approved,
                OpState::Executing,
                3,
                Some(("ap_1", ApprovalEffect::Commit)),
            ),
            // No such approval.
            tr(
                "op_1",
                OpState::Approved,
                OpState::Executing,
                3,
                Some(("ap_none", ApprovalEffect::Reserve)),
            ),
            // An effect the approval could take, on a move the operation cannot make.
            tr(
                "op_1",
                OpState::Approved,
                OpState::Executing,
                5,
                Some(("ap_1", ApprovalEffect::Reserve)),
            ),
        ];
        for r in &refused {
            assert!(s.apply_record(KIND_TRANSITIONED, r, &mut out).is_err());
            assert_eq!(unchanged(&s), approved);
        }
        execute_op_1(&mut s, &mut out);
        let executing = unchanged(&s);
        // The use is reserved already.
        let again = tr(
            "op_1",
            OpState::Executing,
            OpState::Succeeded,
            4,
            Some(("ap_1", ApprovalEffect::Reserve)),
        );
        assert!(s.apply_record(KIND_TRANSITIONED, &again, &mut out).is_err());
        assert_eq!(unchanged(&s), executing);
        assert_eq!(s.approvals["ap_1"].uses["op_1"], UseState::Reserved);
        assert_eq!(s.skipped, 4);
    }

    #[test]
    fn invalid_records_are_skipped_without_touching_state() {
        let mut s = OperationState::default();
        let mut out = vec![];
        s.apply_record(
            KIND_CREATED,
            &created(op("op_1", OpState::Approved, None), None),
            &mut out,
        )
        .unwrap();
        let before = s.get("op_1").cloned();
        // Wrong revision, wrong from-state, disallowed transition, reuse of a key.
        assert!(
            s.apply_record(
                KIND_TRANSITIONED,
                &tr("op_1", OpState::Approved, OpState::Executing, 3, None),
                &mut out
            )
            .is_err()
        );
        assert!(
            s.apply_record(
                KIND_TRANSITIONED,
                &tr("op_1", OpState::Pending, OpState::Approved, 2, None),
                &mut out
            )
            .is_err()
        );
        assert!(
            s.apply_record(
                KIND_TRANSITIONED,
                &tr("op_1", OpState::Approved, OpState::Succeeded, 2, None),
                &mut out
            )
            .is_err()
        );
        let mut dup = op("op_2", OpState::Approved, None);
        dup.idempotency_key = "key-op_1".into();
        assert!(
            s.apply_record(KIND_CREATED, &created(dup, None), &mut out)
                .is_err()
        );
        // A pending operation without its approval, an unknown kind, a malformed payload.
        assert!(
            s.apply_record(
                KIND_CREATED,
                &created(op("op_3", OpState::Pending, None), None),
                &mut out
            )
            .is_err()
        );
        assert!(
            s.apply_record("operation.bogus", &serde_json::json!({}), &mut out)
                .is_err()
        );
        assert!(
            s.apply_record(KIND_CREATED, &serde_json::json!({"x": 1}), &mut out)
                .is_err()
        );
        assert_eq!(s.get("op_1").cloned(), before);
        assert_eq!(s.skipped, 7);
        assert!(s.get("op_2").is_none());
    }

    #[test]
    fn decisions_need_the_next_revision_and_a_pending_approval() {
        let mut s = OperationState::default();
        let mut out = vec![];
        s.apply_record(
            KIND_CREATED,
            &created(
                op("op_1", OpState::Pending, Some("ap_1")),
                Some(approval("ap_1", "op_1")),
            ),
            &mut out,
        )
        .unwrap();
        assert!(
            s.apply_record(
                KIND_DECIDED,
                &decided("ap_1", 3, DecisionKind::Approve),
                &mut out
            )
            .is_err()
        );
        s.apply_record(
            KIND_DECIDED,
            &decided("ap_1", 2, DecisionKind::Deny),
            &mut out,
        )
        .unwrap();
        assert!(
            s.apply_record(
                KIND_DECIDED,
                &decided("ap_1", 3, DecisionKind::Approve),
                &mut out
            )
            .is_err()
        );
        assert_eq!(s.approvals["ap_1"].status, ApprovalStatus::Denied);
        let rev = serde_json::to_value(Revoked {
            approval_id: "ap_1".into(),
            revision: 3,
            at_ms: 1,
            operator_signature: envelope(&serde_json::json!({})),
            idempotency_key: None,
            command_digest: None,
        })
        .unwrap();
        assert!(s.apply_record(KIND_REVOKED, &rev, &mut out).is_err());
    }

    #[test]
    fn cancel_effect_cancels_pending_and_revokes_active_approvals() {
        let mut a = approval("ap", "op");
        apply_effect(&mut a, "op", ApprovalEffect::Cancel);
        assert_eq!((a.status, a.revision), (ApprovalStatus::Canceled, 2));
        let mut b = approval("ap", "op");
        b.status = ApprovalStatus::Active;
        apply_effect(&mut b, "op", ApprovalEffect::Cancel);
        assert_eq!(b.status, ApprovalStatus::Revoked);
        let mut c = approval("ap", "op");
        c.status = ApprovalStatus::Active;
        apply_effect(&mut c, "op", ApprovalEffect::Reserve);
        apply_effect(&mut c, "op", ApprovalEffect::Retain);
        assert!(c.has_retained());
        assert_eq!(c.uses_spent(), 1);
        assert_eq!(c.status, ApprovalStatus::Active);
    }

    /// A state whose prunes are checked against `sealer_for_tests`'s seals.
    pub(crate) fn sealed_state() -> OperationState {
        OperationState {
            seals: crate::operations::seal::SealSource::fixed(sealer_for_tests()),
            ..OperationState::default()
        }
    }

    fn sealer_for_tests() -> crate::operations::seal::Sealer {
        crate::operations::seal::Sealer::new([7; crate::operations::seal::SEAL_KEY_LEN], "ws_t")
    }

    /// A prune's payload, sealed for seq `seq` (`apply_record` folds at seq 0).
    pub(crate) fn sealed_prune(before_ms: u64, seq: u64) -> serde_json::Value {
        let seal = sealer_for_tests().seal_prune(before_ms, seq);
        serde_json::json!({"before_ms": before_ms, "seal": seal})
    }

    #[test]
    fn only_a_prune_sealed_here_for_its_cut_off_and_seq_forgets_anything() {
        let mut out = vec![];
        let mut done = op("op_done", OpState::Denied, None);
        done.terminal_at_ms = Some(5);
        let forged = [
            serde_json::json!({"before_ms": 8}),
            // Another cut-off, another seq, another machine's key.
            serde_json::json!({"before_ms": 9, "seal": sealed_prune(8, 0)["seal"]}),
            sealed_prune(8, 1),
            serde_json::json!({"before_ms": 8, "seal": crate::operations::seal::Sealer::new(
                [8; crate::operations::seal::SEAL_KEY_LEN], "ws_t").seal_prune(8, 0)}),
        ];
        for payload in forged {
            let mut s = sealed_state();
            s.apply_record(KIND_CREATED, &created(done.clone(), None), &mut out)
                .unwrap();
            assert!(s.apply_record(KIND_PRUNED, &payload, &mut out).is_err());
            assert!(s.get("op_done").is_some(), "{payload}");
        }
        // Without a seal source (no anchor), nothing is pruned, even what was sealed.
        let mut s = OperationState::default();
        s.apply_record(KIND_CREATED, &created(done.clone(), None), &mut out)
            .unwrap();
        assert!(
            s.apply_record(KIND_PRUNED, &sealed_prune(8, 0), &mut out)
                .is_err()
        );
        assert!(s.get("op_done").is_some());
        let mut s = sealed_state();
        s.apply_record(KIND_CREATED, &created(done, None), &mut out)
            .unwrap();
        s.apply_record(KIND_PRUNED, &sealed_prune(8, 0), &mut out)
            .unwrap();
        assert!(s.get("op_done").is_none());
    }

    /// What the agent ended (a step without gaffer's seal after a request accepted here) is
    /// kept by a sealed prune; what gaffer ended goes.
    #[test]
    fn a_sealed_prune_keeps_a_request_accepted_here_that_the_agent_ended() {
        let sealer = sealer_for_tests();
        let mut s = sealed_state();
        let mut out = vec![];
        for (seq, id) in [(1, "op_agent_ended"), (2, "op_gaffer_ended")] {
            let mut o = op(id, OpState::Approved, None);
            o.request_seal = Some(sealer.request(&o, None).at(seq));
            s.apply_record_at(KIND_CREATED, seq, &created(o, None), &mut out)
                .unwrap();
        }
        let cancel = |s: &OperationState, id: &str, sealed: bool| {
            let o = s.get(id).unwrap();
            let mut t = crate::operations::engine::transition(o, OpState::Canceled, 20);
            if sealed {
                t.seal = sealer.seal_step(o, &t);
            }
            serde_json::to_value(&t).unwrap()
        };
        let by_agent = cancel(&s, "op_agent_ended", false);
        s.apply_record_at(KIND_TRANSITIONED, 3, &by_agent, &mut out)
            .unwrap();
        let by_gaffer = cancel(&s, "op_gaffer_ended", true);
        s.apply_record_at(KIND_TRANSITIONED, 4, &by_gaffer, &mut out)
            .unwrap();
        s.apply_record_at(KIND_PRUNED, 5, &sealed_prune(100, 5), &mut out)
            .unwrap();
        assert!(s.get("op_agent_ended").is_some());
        assert!(s.get("op_gaffer_ended").is_none());
    }

    #[test]
    fn pruning_drops_old_terminal_operations_and_frees_their_keys() {
        let mut s = sealed_state();
        let mut out = vec![];
        let mut old = op("op_old", OpState::Denied, None);
        old.terminal_at_ms = Some(5);
        s.apply_record(KIND_CREATED, &created(old, None), &mut out)
            .unwrap();
        s.apply_record(
            KIND_CREATED,
            &created(op("op_new", OpState::Failed, None), None),
            &mut out,
        )
        .unwrap();
        s.apply_record(
            KIND_CREATED,
            &created(op("op_live", OpState::Approved, None), None),
            &mut out,
        )
        .unwrap();
        s.apply_record(KIND_PRUNED, &sealed_prune(8, 0), &mut out)
            .unwrap();
        assert!(s.get("op_old").is_none());
        assert!(s.by_idempotency("agent", "key-op_old").is_none());
        assert!(s.get("op_new").is_some());
        assert!(s.get("op_live").is_some());
        // State survives a snapshot round trip.
        let text = serde_json::to_string(&s).unwrap();
        let back: OperationState = serde_json::from_str(&text).unwrap();
        assert_eq!(back.terminal.len(), 1);
        assert_eq!(back.operations.len(), 2);
    }
}
