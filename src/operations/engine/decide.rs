//! Operator decisions. The operator's own process signs: [`OperationRuntime::prepare_decision`]
//! builds the exact payload (plan digest, classification digest, client, operation, mode,
//! narrowing, limits, expiry, revision, journal head) from the plan text, the operator signs
//! it with the private key (the CLI, an editor via `node:crypto`, or `gaffer operator sign`),
//! and [`OperationRuntime::decide`] records it after checking the signature with the public
//! key. Serving processes never hold the private key. Both bound an approval's mode, uses and
//! duration by what the trusted policy grants for the plan now ([`GrantBound`]), never by the
//! stored request alone.

use super::super::decision::{DecisionPayload, RevokePayload, classification_digest};
use super::super::grant::{GrantBound, Scope};
use super::super::lifecycle::{OpState, codes};
use super::super::policy::PolicyRequest;
use super::super::state::{
    self as st, ApprovalChange, ApprovalEffect, ApprovalStatus, DecisionKind, KIND_DECIDED,
    KIND_REVOKED, Operation, OperationState, Revoked,
};
use super::super::views::{ApprovalView, PlanShown};
use super::execute::Rederived;
use super::*;
use crate::operator::signed::{OperatorSignature, Payload, canonical_text};

/// What the operator asks to decide.
#[derive(Debug, Clone)]
pub struct DecisionRequest {
    /// Approval id or operation id.
    pub id: String,
    pub decision: DecisionKind,
    /// The approval revision the operator looked at.
    pub expected_revision: u64,
    /// The digest of the plan the operator was shown (`plan_digest` of the approval they
    /// read): required to approve, so a plan swapped behind the same ids is never signed.
    pub expected_plan_digest: Option<String>,
    pub narrowing: Narrowing,
    /// Deny only: passed to the agent in the operation's error.
    pub reason: Option<String>,
}

/// A payload ready to sign, and the approval as the operator will be deciding it.
#[derive(Debug, Clone)]
pub struct PreparedDecision {
    pub payload: DecisionPayload,
    /// The RFC 8785 text to sign.
    pub text: String,
    pub approval: ApprovalView,
}

fn no_approval() -> OpError {
    OpError::new(ErrorKind::NotFound, codes::NOT_FOUND, "no such approval")
}

fn signature_error(e: impl std::fmt::Display) -> OpError {
    OpError::new(
        ErrorKind::Forbidden,
        "operator_signature_invalid",
        format!("the decision is not validly signed by the operator: {e}"),
    )
}

/// The request's mode, uses and duration must be the ones its plan text asks for: the plan's
/// digest (what the operator reviews, and `--expect` pins) then binds what an approval grants,
/// and a request re-created with a wider scope under the same ids and plan is refused.
fn request_as_planned(
    a: &crate::operations::state::Approval,
    planned: &crate::operations::plan::PlanAuthorization,
) -> Result<(), OpError> {
    let same = planned.mode == Some(a.mode)
        && planned.requested_duration_seconds == Some(a.requested_duration_seconds)
        && planned.requested_max_uses == Some(a.requested_max_uses);
    if same {
        return Ok(());
    }
    Err(OpError::new(
        ErrorKind::Conflict,
        codes::PLAN_CHANGED,
        format!(
            "the request asks for {:?}, {} s and {} use(s), but its plan asks for {:?}, {:?} s \
             and {:?} use(s): nothing is signed",
            a.mode,
            a.requested_duration_seconds,
            a.requested_max_uses,
            planned.mode,
            planned.requested_duration_seconds,
            planned.requested_max_uses
        ),
    ))
}

/// The plan the operator was shown must be the one the payload binds.
fn shown_plan(expected: Option<&str>, approve: bool, actual: &str) -> Result<(), OpError> {
    match expected {
        None if approve => Err(OpError::invalid(
            "expected_plan_digest",
            "approving needs the digest of the plan you were shown (`plan_digest` of the \
             approval you read)",
        )),
        Some(shown) if shown != actual => Err(OpError::new(
            ErrorKind::Conflict,
            codes::PLAN_CHANGED,
            format!(
                "the plan is not the one you were shown: its digest is {actual}, not {shown}; \
                 read the approval again"
            ),
        )),
        _ => Ok(()),
    }
}

fn revision_conflict(at: u64, want: u64) -> OpError {
    OpError::new(
        ErrorKind::Conflict,
        codes::REVISION_CONFLICT,
        format!("the approval is at revision {at}, not {want}"),
    )
}

/// Finds an approval by its id or by its operation's id.
fn approval_id_for(s: &OperationState, id: &str) -> Option<String> {
    if s.approvals.contains_key(id) {
        return Some(id.to_string());
    }
    s.get(id).and_then(|op| op.approval_id.clone())
}

impl OperationRuntime {
    /// Renders a plan for an operator from its text: digest checked, decoded by its adapter,
    /// presented by the adapter. Never from the record's own target or presentation.
    pub(super) async fn show(&self, op: &Operation) -> Result<PlanShown, String> {
        if op.plan.is_none() && op.state.is_terminal() {
            // History, not something to decide: the plan text goes once the operation ends.
            return Ok(PlanShown {
                target: (*op.target).clone(),
                arguments: (*op.arguments).clone(),
                presentation: op.presentation.clone(),
                classification: Default::default(),
            });
        }
        let d = self
            .rederive(op, crate::util::now_ms(), false)
            .await
            .map_err(|(_, m)| m)?;
        shown(&d).await
    }
}

/// The adapter's presentation of a plan read back from its text.
async fn shown(d: &Rederived) -> Result<PlanShown, String> {
    let presentation = d
        .adapter
        .present(&d.plan.resolved())
        .await
        .and_then(|p| p.bounded())
        .map_err(|e| redact(&e.message))?;
    Ok(PlanShown {
        target: d.plan.target.clone(),
        arguments: d.plan.arguments.clone(),
        presentation,
        classification: d.class.clone(),
    })
}

impl OperationRuntime {
    async fn view(&self, approval_id: &str) -> Result<ApprovalView, OpError> {
        let (a, op) = self
            .ws
            .read(|s| {
                let a = s.operations.approvals.get(approval_id)?.clone();
                let op = s.operations.get(&a.operation_id).cloned();
                Some((a, op))
            })
            .ok_or_else(no_approval)?;
        let shown = match &op {
            Some(op) => self.show(op).await,
            None => Err("the operation was pruned".to_string()),
        };
        let verified = op.as_ref().is_some_and(|o| self.sealed_here(o, Some(&a)));
        Ok(ApprovalView::of(
            &a,
            op.as_ref(),
            verified,
            shown.as_ref().map_err(String::as_str),
        ))
    }

    /// Approval requests (pending only unless `all`), and how many were left out because no
    /// gaffer on this machine accepted them (unless `include_unverified`): a request the
    /// agent wrote into the store is not put before the operator unasked.
    pub async fn approvals(&self, all: bool, include_unverified: bool) -> (Vec<ApprovalView>, u64) {
        let ids: Vec<String> = self.ws.read(|s| {
            s.operations
                .approvals
                .values()
                .filter(|a| all || a.status == ApprovalStatus::Pending)
                .map(|a| a.id.clone())
                .collect()
        });
        let mut out = Vec::with_capacity(ids.len());
        let mut hidden = 0;
        for id in ids {
            match self.view(&id).await {
                Ok(v) if v.requester_verified || include_unverified => out.push(v),
                Ok(_) => hidden += 1,
                Err(_) => {}
            }
        }
        (out, hidden)
    }

    /// One approval by approval or operation id.
    pub async fn approval(&self, id: &str) -> Result<ApprovalView, OpError> {
        let aid = self
            .ws
            .read_fresh(|s| approval_id_for(&s.operations, id))
            .ok_or_else(no_approval)?;
        let mut view = self.view(&aid).await?;
        view.detail = self.detail_of(&aid).await;
        Ok(view)
    }

    /// Builds the payload the operator signs, from the plan text as it is now. An approval's
    /// scope (mode, uses, duration) is the stored request's as narrowed by the operator, and
    /// must lie within what the trusted policy grants for the plan now: the stored request
    /// is the agent's to write, so one that asks for more is refused, naming what differs.
    pub async fn prepare_decision(
        &self,
        req: &DecisionRequest,
    ) -> Result<PreparedDecision, OpError> {
        if let Some(r) = &req.reason
            && r.len() > MAX_REASON_BYTES
        {
            return Err(OpError::invalid(
                "reason",
                format!("reason must be at most {MAX_REASON_BYTES} bytes"),
            ));
        }
        let (a, op) = self.pending_at(&req.id, req.expected_revision)?;
        let approve = req.decision == DecisionKind::Approve;
        shown_plan(
            req.expected_plan_digest.as_deref(),
            approve,
            op.plan_digest.as_deref().unwrap_or_default(),
        )?;
        let now = crate::util::now_ms();
        let derived = self.rederive(&op, now, true).await;
        let class_digest = match &derived {
            Ok(d) => classification_digest(&d.class),
            Err((_, m)) if approve => return Err(unfit_for_approval(m)),
            Err(_) => classification_digest(&a.classification),
        };
        if approve && let Ok(d) = &derived {
            request_as_planned(&a, &d.plan.authorization)?;
        }
        let (duration, max_uses) = narrowed(&a, &req.narrowing)?;
        if approve && let Ok(d) = &derived {
            let scope = Scope {
                mode: a.mode,
                duration_ms: duration.saturating_mul(1000),
                max_uses,
            };
            let excess = self.grant_bound(d, now)?.excess(scope);
            within_policy(
                &excess,
                "approving this request would grant",
                REQUEST_ADVICE,
            )?;
        }
        // Last, so a request that also breaks a rule above is refused naming that.
        let verified = self.sealed_here(&op, Some(&a));
        if approve && !verified {
            if self.sealer().is_none() {
                return Err(OpError::new(
                    ErrorKind::Unavailable,
                    codes::REQUEST_UNVERIFIED,
                    "this gaffer has no seal key (it could not read or create seal.key in the \
                     state directory: see its log), so no request can be verified or approved",
                ));
            }
            return Err(unverified_request(&op.client_id));
        }
        let payload = DecisionPayload {
            domain: DecisionPayload::DOMAIN.into(),
            workspace_id: self
                .ws
                .workspace_id()
                .ok_or_else(|| OpError::store("no workspace id"))?,
            approval_id: a.id.clone(),
            operation_id: op.id.clone(),
            client: op.client_id.clone(),
            operation: op.operation.clone(),
            plan_digest: op.plan_digest.clone().unwrap_or_default(),
            classification_digest: class_digest,
            mode: a.mode,
            decision: req.decision,
            revision: a.revision + 1,
            decided_at_ms: now,
            expires_at_ms: approve.then(|| now.saturating_add(duration.saturating_mul(1000))),
            max_uses,
            narrowed_duration_seconds: req.narrowing.duration_seconds,
            narrowed_max_uses: req.narrowing.max_uses,
            reason: (!approve).then(|| req.reason.clone()).flatten(),
            head: self.ws.journal_head(),
        };
        let shown = match &derived {
            Ok(d) => shown(d).await,
            Err((_, m)) => Err(m.clone()),
        };
        Ok(PreparedDecision {
            text: canonical_text(&payload),
            approval: ApprovalView::of(
                &a,
                Some(&op),
                verified,
                shown.as_ref().map_err(String::as_str),
            ),
            payload,
        })
    }

    /// The pending approval `id` names (or its operation's), at the revision the operator
    /// looked at, and its operation.
    fn pending_at(&self, id: &str, revision: u64) -> Result<(st::Approval, Operation), OpError> {
        let (a, op) = self
            .ws
            .read_fresh(|s| {
                let aid = approval_id_for(&s.operations, id)?;
                let a = s.operations.approvals.get(&aid)?.clone();
                let op = s.operations.get(&a.operation_id).cloned();
                Some((a, op))
            })
            .ok_or_else(no_approval)?;
        let op = op.ok_or_else(OpError::not_found)?;
        if a.status != ApprovalStatus::Pending {
            return Err(OpError::new(
                ErrorKind::Conflict,
                codes::APPROVAL_NOT_PENDING,
                format!("the approval is {:?}, not pending", a.status).to_lowercase(),
            ));
        }
        if a.revision != revision {
            return Err(revision_conflict(a.revision, revision));
        }
        Ok((a, op))
    }

    /// The most the trusted policy lets one approval of this plan grant now, decided from the
    /// plan text as a submission of it would be (active grants aside).
    fn grant_bound(&self, d: &Rederived, now: u64) -> Result<GrantBound, OpError> {
        let scope = self.lane_scope(&d.plan.client_id);
        let req = PolicyRequest {
            client: &d.plan.client_id,
            operation: &d.plan.operation,
            class: &d.class,
            lane_scope: scope.as_deref(),
        };
        let decision = self.policy().decide(&req, &[], now);
        let ttl = d.adapter.descriptor().approval_ttl_seconds;
        GrantBound::of_decision(&decision, ttl).map_err(|e| {
            OpError::new(
                ErrorKind::Conflict,
                codes::EXCEEDS_POLICY,
                format!("the trusted policy lets no approval of this plan be signed: {e}"),
            )
        })
    }

    /// Whether a decision under `idem` could still be recorded: the request is pending and the
    /// key new (a replay, or a decision on a closed request, records nothing and is answered
    /// by the commit).
    fn would_record(&self, approval_id: &str, idem: &str) -> bool {
        self.ws.read_fresh(|s| {
            s.operations.approvals.get(approval_id).is_some_and(|a| {
                a.status == ApprovalStatus::Pending && !a.decision_keys.contains_key(idem)
            })
        })
    }

    /// A signed approval grants no more than the trusted policy grants for its plan now,
    /// however its payload was prepared: editors sign what a server prepared, and the policy
    /// may have changed since.
    async fn signed_within_policy(&self, p: &DecisionPayload) -> Result<(), OpError> {
        let op = self
            .ws
            .read_fresh(|s| s.operations.get(&p.operation_id).cloned())
            .ok_or_else(OpError::not_found)?;
        let now = crate::util::now_ms();
        let d = self
            .rederive(&op, now, true)
            .await
            .map_err(|(_, m)| unfit_for_approval(&m))?;
        if d.digest != p.plan_digest {
            return Err(signature_error("the signed payload is for another plan"));
        }
        let excess = self.grant_bound(&d, now)?.excess(Scope::signed(p));
        within_policy(&excess, "the signed decision grants", "prepare it again")
    }

    /// Records a decision the operator signed. The signature is checked against the public
    /// key, and the payload against the approval and the operation's plan as stored.
    pub async fn decide(
        &self,
        sig: OperatorSignature,
        idempotency_key: &str,
    ) -> Result<ApprovalView, OpError> {
        let idem = idempotency_key.trim().to_string();
        if idem.is_empty() || idem.len() > MAX_KEY_BYTES {
            return Err(OpError::invalid(
                "idempotency_key",
                "idempotency_key must be 1..=128 bytes",
            ));
        }
        let p = self.open::<DecisionPayload>(&sig)?;
        if p.decision == DecisionKind::Approve && self.would_record(&p.approval_id, &idem) {
            self.signed_within_policy(&p).await?;
        }
        let command_digest = crate::util::sha256_hex(sig.payload.as_bytes());
        let now = crate::util::now_ms();
        let aid = p.approval_id.clone();
        let sealer = self.sealer();
        let (approved_op, expired) = self
            .commit(move |s: &crate::workspace::State| {
                decide_records(s, &p, sig, idem, command_digest, now, sealer.as_deref())
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
        self.view(&aid).await
    }

    /// Verifies an envelope with the operator's public key, for this workspace.
    fn open<P: Payload + HasWorkspace>(&self, sig: &OperatorSignature) -> Result<P, OpError> {
        let key = crate::operator::current_public().ok_or_else(|| {
            OpError::new(
                ErrorKind::Forbidden,
                "operator_key_missing",
                "no operator public key on this machine; run `gaffer operator init`",
            )
        })?;
        let p: P = sig.open(&key).map_err(signature_error)?;
        if Some(p.workspace_id()) != self.ws.workspace_id().as_deref() {
            return Err(signature_error("it was signed for another workspace"));
        }
        if !self.head_on_chain(p.head()) {
            return Err(signature_error(
                "it names a journal head this journal never had",
            ));
        }
        Ok(p)
    }

    /// A signed head is at or before this journal's head and, when its record is among those
    /// this process has read recently, has that record's hash.
    pub(super) fn head_on_chain(&self, head: &crate::operator::Head) -> bool {
        head.seq <= self.ws.seq() && self.ws.hash_at(head.seq).is_none_or(|h| h == head.hash)
    }

    /// The payload that revokes an active approval (or withdraws a pending request).
    pub fn prepare_revoke(
        &self,
        id: &str,
        expected_revision: Option<u64>,
    ) -> Result<(RevokePayload, String), OpError> {
        let a = self
            .ws
            .read_fresh(|s| {
                approval_id_for(&s.operations, id)
                    .and_then(|aid| s.operations.approvals.get(&aid).cloned())
            })
            .ok_or_else(no_approval)?;
        if let Some(r) = expected_revision
            && r != a.revision
        {
            return Err(revision_conflict(a.revision, r));
        }
        let payload = RevokePayload {
            domain: RevokePayload::DOMAIN.into(),
            workspace_id: self
                .ws
                .workspace_id()
                .ok_or_else(|| OpError::store("no workspace id"))?,
            approval_id: a.id,
            revision: a.revision + 1,
            revoked_at_ms: crate::util::now_ms(),
            head: self.ws.journal_head(),
        };
        let text = canonical_text(&payload);
        Ok((payload, text))
    }

    pub async fn revoke(
        &self,
        sig: OperatorSignature,
        idempotency_key: Option<&str>,
    ) -> Result<ApprovalView, OpError> {
        let p = self.open::<RevokePayload>(&sig)?;
        let idem = idempotency_key.map(|k| k.trim().to_string());
        let aid = p.approval_id.clone();
        let now = crate::util::now_ms();
        let sealer = self.sealer();
        self.commit(move |s: &crate::workspace::State| {
            revoke_records(s, &p, sig, idem, now, sealer.as_deref())
        })
        .await
        .map_err(commit_err)?;
        self.anchor_revocation(&aid, now).await;
        self.view(&aid).await
    }

    /// Remembers the revocation on this machine's anchor, outside the workspace, until the
    /// approval's signed expiry has passed: a store rewritten to forget it changes nothing.
    async fn anchor_revocation(&self, aid: &str, now: u64) {
        const FALLBACK_MS: u64 = 400 * 24 * 3600 * 1000;
        // Recorded whatever the store's standing: a revocation only restricts, and it must
        // still hold once the operator accepts a rolled-back store.
        let Some(anchor) = self.ws.restricting_anchor() else {
            tracing::error!(
                approval = aid,
                "no workspace anchor; the revocation is only in the journal"
            );
            return;
        };
        let sig = self.ws.read(|s| {
            let d = s.operations.approvals.get(aid)?.decision.as_ref()?;
            Some(d.operator_signature.clone())
        });
        let key = crate::operator::current_public();
        let expires = sig
            .zip(key)
            .and_then(|(sig, key)| sig.open::<DecisionPayload>(&key).ok())
            .and_then(|p| p.expires_at_ms)
            .unwrap_or(now.saturating_add(FALLBACK_MS));
        let aid = aid.to_string();
        let done = tokio::task::spawn_blocking(move || anchor.revoke(&aid, expires)).await;
        if let Ok(Err(e)) = done {
            tracing::error!(error = %e, "the revocation cannot be anchored");
        }
    }
}

/// Payloads that name their workspace.
pub trait HasWorkspace {
    fn workspace_id(&self) -> &str;
}
impl HasWorkspace for DecisionPayload {
    fn workspace_id(&self) -> &str {
        &self.workspace_id
    }
}
impl HasWorkspace for RevokePayload {
    fn workspace_id(&self) -> &str {
        &self.workspace_id
    }
}

const REQUEST_ADVICE: &str = "an agent can write approval requests into the store: deny it, \
     or (when only uses or duration differ) approve it narrowed to what the policy grants";

fn unfit_for_approval(why: &str) -> OpError {
    OpError::new(
        ErrorKind::Conflict,
        codes::INVALID_STORED,
        format!("this plan cannot run, so it cannot be approved: {why}"),
    )
}

/// Refuses to approve a request no gaffer on this machine accepted: its client name is only
/// what its record says.
fn unverified_request(client: &str) -> OpError {
    OpError::new(
        ErrorKind::Conflict,
        codes::REQUEST_UNVERIFIED,
        format!(
            "no gaffer on this machine accepted this request from {}: its record carries no \
             seal of this machine (written into the store by something else, on another \
             machine, or before gaffer sealed requests), so it cannot be approved; deny it, \
             or have the client submit it again",
            crate::util::visible(client)
        ),
    )
}

/// Refuses a scope that reaches past the policy's bound, naming each field that does.
fn within_policy(excess: &[String], what: &str, advice: &str) -> Result<(), OpError> {
    if excess.is_empty() {
        return Ok(());
    }
    Err(OpError::new(
        ErrorKind::Conflict,
        codes::EXCEEDS_POLICY,
        format!(
            "{what} more than the trusted policy grants for this plan: {}; {advice}",
            excess.join(", ")
        ),
    ))
}

/// Duration and uses after the operator's narrowing, within what was requested.
fn narrowed(a: &super::super::state::Approval, n: &Narrowing) -> Result<(u64, u32), OpError> {
    let exceeded = |field: &str, message: String| OpError {
        kind: ErrorKind::Conflict,
        code: codes::CONSTRAINT_EXCEEDED.into(),
        message,
        field: Some(field.into()),
    };
    let duration = n.duration_seconds.unwrap_or(a.requested_duration_seconds);
    if duration == 0 || duration > a.requested_duration_seconds {
        return Err(exceeded(
            "constraints.duration_seconds",
            format!(
                "duration_seconds must be between 1 and the requested {}",
                a.requested_duration_seconds
            ),
        ));
    }
    let max_uses = n.max_uses.unwrap_or(a.requested_max_uses);
    if max_uses == 0 || max_uses > a.requested_max_uses {
        return Err(exceeded(
            "constraints.max_uses",
            format!(
                "max_uses must be between 1 and the requested {}",
                a.requested_max_uses
            ),
        ));
    }
    Ok((duration, max_uses))
}

/// What the decision commit reports: (operation to drive, whether the request had expired).
type Decided = (Option<String>, bool);

/// The decision commit.
fn decide_records(
    s: &crate::workspace::State,
    p: &DecisionPayload,
    sig: OperatorSignature,
    idem: String,
    command_digest: String,
    now: u64,
    sealer: Option<&Sealer>,
) -> Result<(Vec<NewRecord>, Decided), OpError> {
    let ops = &s.operations;
    let a = ops.approvals.get(&p.approval_id).ok_or_else(no_approval)?;
    if let Some(prev) = a.decision_keys.get(&idem) {
        return if *prev == command_digest {
            Ok((vec![], (None, false)))
        } else {
            Err(conflict())
        };
    }
    if a.status != ApprovalStatus::Pending {
        return Err(OpError::new(
            ErrorKind::Conflict,
            codes::APPROVAL_NOT_PENDING,
            format!("the approval is {:?}, not pending", a.status).to_lowercase(),
        ));
    }
    if a.revision + 1 != p.revision {
        return Err(revision_conflict(a.revision, p.revision.saturating_sub(1)));
    }
    let op = ops.get(&a.operation_id).ok_or_else(OpError::not_found)?;
    let matches = p.operation_id == op.id
        && p.client == op.client_id
        && p.operation == op.operation
        && op.plan_digest.as_deref() == Some(p.plan_digest.as_str())
        && p.mode == a.mode;
    if !matches {
        return Err(signature_error("the signed payload is for another plan"));
    }
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
            recs.push(transition_rec(sealer, op, t)?);
        }
        return Ok((recs, (None, true)));
    }
    // Checked again here: a payload can be signed without `approvals/prepare`.
    if p.decision == DecisionKind::Approve && !sealer.is_some_and(|k| k.checks(op, Some(a))) {
        return Err(unverified_request(&op.client_id));
    }
    let mut recs = vec![rec(
        KIND_DECIDED,
        &st::Decided {
            approval_id: a.id.clone(),
            operator_signature: sig,
            idempotency_key: idem,
            command_digest,
        },
    )?];
    let mut approved = None;
    if op.state == OpState::Pending {
        let t = match p.decision {
            DecisionKind::Approve => {
                approved = Some(op.id.clone());
                transition(op, OpState::Approved, now)
            }
            DecisionKind::Deny => transition(op, OpState::Denied, now).error(
                codes::APPROVAL_DENIED,
                match &p.reason {
                    Some(r) => format!("the operator denied the request: {r}"),
                    None => "the operator denied the request".to_string(),
                },
            ),
        };
        recs.push(transition_rec(sealer, op, t)?);
    }
    Ok((recs, (approved, false)))
}

fn revoke_records(
    s: &crate::workspace::State,
    p: &RevokePayload,
    sig: OperatorSignature,
    idem: Option<String>,
    now: u64,
    sealer: Option<&Sealer>,
) -> Result<(Vec<NewRecord>, ()), OpError> {
    let ops = &s.operations;
    let a = ops.approvals.get(&p.approval_id).ok_or_else(no_approval)?;
    let digest = crate::util::sha256_hex(sig.payload.as_bytes());
    if let Some(k) = &idem
        && let Some(prev) = a.decision_keys.get(k)
    {
        return if *prev == digest {
            Ok((vec![], ()))
        } else {
            Err(conflict())
        };
    }
    if a.revision + 1 != p.revision {
        return Err(revision_conflict(a.revision, p.revision.saturating_sub(1)));
    }
    let op = ops.get(&a.operation_id);
    match a.status {
        ApprovalStatus::Active => {
            let mut recs = vec![rec(
                KIND_REVOKED,
                &Revoked {
                    approval_id: a.id.clone(),
                    revision: p.revision,
                    at_ms: now,
                    operator_signature: sig,
                    idempotency_key: idem.clone(),
                    command_digest: idem.as_ref().map(|_| digest.clone()),
                },
            )?];
            if let Some(op) = op.filter(|o| o.state == OpState::Approved) {
                let t = transition(op, OpState::Canceled, now)
                    .error(codes::CANCELED, "the operator revoked the approval");
                recs.push(transition_rec(sealer, op, t)?);
            }
            Ok((recs, ()))
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
            Ok((vec![transition_rec(sealer, op, t)?], ()))
        }
        other => Err(OpError::new(
            ErrorKind::Conflict,
            codes::APPROVAL_NOT_PENDING,
            format!("the approval is {other:?} and cannot be revoked").to_lowercase(),
        )),
    }
}
