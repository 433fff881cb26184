//! Submit: check the request, let the adapter decode, resolve, classify and present it,
//! decide with the trusted policy (and the client's active window grants), and record the
//! operation with its immutable plan. A static allow in a serving process claims in the same
//! commit, authorized by the same check every execution goes through.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use super::super::adapter::{Adapter, AdapterCtx, Presentation, Resolved};
use super::super::authorize::{Check, authorize};
use super::super::canonical::{Exact, Member, exact_object_of_sorted};
use super::super::grant::{GrantBound, Scope, window_covers};
use super::super::lifecycle::{OpState, codes};
use super::super::plan::{PLAN_SCHEMA, Plan, PlanAuthorization};
use super::super::policy::{
    ActiveGrant, Classification, Decision, DecisionEffect, GrantMode, GrantPolicy, Policy,
    PolicyRequest,
};
use super::super::seal::Sealer;
use super::super::state::{
    Approval, ApprovalStatus, Created, KIND_CREATED, OpFailure, Operation, OperationState,
};
use super::super::views::OperationView;
use super::*;

/// The adapter's view of a submission.
struct Prepared {
    adapter: Arc<dyn Adapter>,
    ctx: AdapterCtx,
    resolved: Resolved,
    class: Classification,
    presentation: Presentation,
}

/// What the policy decided, in the terms the records need.
struct Outcome {
    state: OpState,
    error: Option<OpFailure>,
    approval_id: Option<String>,
    mode: Option<GrantMode>,
    requested: Option<(u64, u32)>,
    pending_s: u64,
}

/// Attempts at deciding a submission whose policy file or key changes before its commit.
const DECIDE_ATTEMPTS: usize = 8;

impl OperationRuntime {
    pub async fn submit(
        &self,
        client: &str,
        input: SubmitInput,
    ) -> Result<(OperationView, bool), OpError> {
        let (key, reason, submitted) = check_input(&input)?;
        // A plan lane is an identity only while this process runs its plan.
        if client.contains('/') && self.lane_scope(client).is_none() {
            return Err(OpError::new(
                ErrorKind::Forbidden,
                "lane_ended",
                "this plan lane's plan is no longer running here",
            ));
        }
        // Replays never resolve, decide or write anything.
        if let Some(v) = self.replay(client, &key, &submitted)? {
            return Ok((v, false));
        }
        let lock = self.submit_lock(client, &key);
        let _guard = lock.lock().await;
        if let Some(v) = self.replay(client, &key, &submitted)? {
            return Ok((v, false));
        }
        let id = new_id("op_")?;
        for _ in 0..DECIDE_ATTEMPTS {
            if let Some(done) = self
                .decide_and_record(client, &id, &key, &reason, &submitted, &input)
                .await?
            {
                return Ok(done);
            }
        }
        Err(OpError::new(
            ErrorKind::Unavailable,
            codes::POLICY_CHANGING,
            "the policy file or the operator key changed while each attempt to record this \
             submission waited for its commit; submit it again",
        ))
    }

    /// One attempt: prepare, decide and record. `None` when the policy file or the operator key
    /// changed before the commit that records the decision (nothing was written).
    async fn decide_and_record(
        &self,
        client: &str,
        id: &str,
        key: &str,
        reason: &str,
        submitted: &str,
        input: &SubmitInput,
    ) -> Result<Option<(OperationView, bool)>, OpError> {
        // One policy for the adapter's context, the decision and the claim that may follow it
        // in the same commit (which refuses both if its grounds changed since, and the claim if
        // trust records were folded).
        let auth = self.authority();
        let prepared = self.prepare(client, key, id, input, &auth.policy).await?;
        let now = crate::util::now_ms();
        let decision = decide_policy(
            &auth.policy,
            &self.ws,
            client,
            self.lane_scope(client),
            &prepared,
            now,
        );
        let outcome = outcome_of(&decision, prepared.adapter.descriptor())?;
        let (op, approval, plan) = build(
            client,
            id,
            key.to_string(),
            reason.to_string(),
            submitted.to_string(),
            &prepared,
            &decision,
            &outcome,
            now,
        );
        // This process checked the connection's identity: it seals what it accepts (with the
        // workspace id, which a fresh store gets from its first record).
        if self.ws.workspace_id().is_none() {
            self.ws
                .ensure_workspace_id()
                .await
                .map_err(OpError::store)?;
        }
        let sandbox_policy = Arc::clone(&auth.policy);
        let accepted_digest = op.plan_digest.clone();
        let Some((view, created, claimed)) = self.record(op, approval, &prepared, auth).await?
        else {
            prepared
                .adapter
                .cleanup(&prepared.ctx, &prepared.resolved)
                .await;
            return Ok(None);
        };
        if created {
            // The request seal binds the seq of the first record the commit returned: a
            // commit that put another record first would leave every request unverified.
            debug_assert!(
                self.sealer().is_none() || self.operation_sealed_here(&view.id),
                "a request staged here does not check"
            );
            if view.state == OpState::Approved
                && let Some(digest) = &accepted_digest
            {
                self.vouch(&view.id, client, digest);
            }
            failpoint("after_submit");
            if view.state.is_terminal() {
                prepared
                    .adapter
                    .cleanup(&prepared.ctx, &prepared.resolved)
                    .await;
            }
            if claimed {
                self.spawn_execute(view.id.clone(), plan, None, sandbox_policy);
            } else if view.state == OpState::Approved {
                self.spawn_drive(view.id.clone());
            }
        }
        Ok(Some((view, created)))
    }

    async fn prepare(
        &self,
        client: &str,
        key: &str,
        id: &str,
        input: &SubmitInput,
        policy: &Policy,
    ) -> Result<Prepared, OpError> {
        let Some(adapter) = self.registry.lookup(&input.operation).cloned() else {
            return Err(self.not_registered(&input.operation));
        };
        let target: Value = serde_json::from_str(input.target.get())
            .map_err(|e| OpError::invalid("target", e.to_string()))?;
        let arguments: Value = serde_json::from_str(input.arguments.get())
            .map_err(|e| OpError::invalid("arguments", e.to_string()))?;
        let decoded = adapter
            .decode(&target, &arguments)
            .await
            .map_err(OpError::from_adapter)?;
        adapter
            .validate_client(&decoded, client, key)
            .map_err(OpError::from_adapter)?;
        let ctx = self.ctx_with(id, client, policy);
        let resolved = adapter
            .resolve(&ctx, decoded)
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
        Ok(Prepared {
            adapter,
            ctx,
            resolved,
            class,
            presentation,
        })
    }

    /// An unknown operation's error lists the ones that exist.
    fn not_registered(&self, name: &str) -> OpError {
        let mut known = self.registry.names();
        known.sort_unstable();
        OpError {
            kind: ErrorKind::Invalid,
            code: codes::NOT_REGISTERED.into(),
            message: format!(
                "no provider offers operation {name:?}; the catalog has: {}",
                known.join(", ")
            ),
            field: Some("operation".into()),
        }
    }

    /// Writes the operation (and its approval request); a static allow in a serving process
    /// is claimed in the same commit, after the one authorization check.
    async fn record(
        &self,
        op: Operation,
        approval: Option<Approval>,
        p: &Prepared,
        auth: Authority,
    ) -> Result<Option<(OperationView, bool, bool)>, OpError> {
        let claim_now = op.state == OpState::Approved
            && op.approval_id.is_none()
            && self.autorun.load(std::sync::atomic::Ordering::Acquire);
        let executor = self.executor.clone();
        let lane_scope = self.lane_scope(&op.client_id);
        let Authority {
            policy,
            grounds,
            trust_seq,
        } = auth;
        let watch = Arc::clone(&self.grounds);
        let workspace_id = self.ws.workspace_id();
        let chain_ok = self.ws.chain_ok();
        let store_refusal = self.ws.standing().refusal();
        let class = p.class.clone();
        let requires_approval = p.adapter.descriptor().requires_approval;
        let approval_ttl_seconds = p.adapter.descriptor().approval_ttl_seconds;
        let digest = op.plan_digest.clone().unwrap_or_default();
        let sealer = self.sealer();
        let unsealed = sealer.as_deref().map(|k| k.request(&op, approval.as_ref()));
        self.commit(move |s: &crate::workspace::State| {
            if let Some(existing) = s
                .operations
                .by_idempotency(&op.client_id, &op.idempotency_key)
            {
                // Another process created it while we resolved.
                if existing.submitted == op.submitted {
                    replayable(
                        sealer.as_deref(),
                        existing,
                        s.operations.approval_of(existing),
                    )?;
                    return Ok((vec![], Some((OperationView::of(existing), false, false))));
                }
                return Err(conflict());
            }
            // Decided on a policy file or key that has changed since: decided again.
            if watch.at_staging() != grounds {
                return Ok((vec![], None));
            }
            let key = &grounds.key;
            let now = op.created_at_ms;
            let mut follow = None;
            let mut claimed = false;
            // Trust records folded since the policy was built: the claim is left to `drive`,
            // which authorizes with the policy they make.
            if claim_now && s.trust.last_seq == trust_seq {
                let check = Check {
                    operation_id: &op.id,
                    client: &op.client_id,
                    operation: &op.operation,
                    plan_digest: &digest,
                    class: &class,
                    requires_approval,
                    approval_ttl_seconds,
                    approval: None,
                    points_at_approval: false,
                    policy: &policy,
                    key: key.as_ref(),
                    workspace_id: workspace_id.as_deref(),
                    chain_ok,
                    store_refusal: store_refusal.as_deref(),
                    vouched: true,
                    lane_scope: lane_scope.as_deref(),
                    now_ms: now,
                };
                follow = Some(match authorize(&check) {
                    Ok(_) => {
                        claimed = true;
                        let mut t = transition(&op, OpState::Executing, now);
                        t.executor = Some(executor);
                        t
                    }
                    Err(r) => transition(&op, OpState::Failed, now).error(r.code, r.message),
                });
            }
            let view = match &follow {
                Some(t) => OperationView::after(&op, t),
                None => OperationView::of(&op),
            };
            let mut op = op;
            op.request_seal = unsealed.map(|r| r.at(s.staging_seq));
            // Its claim, if any, is sealed as a step of the operation as it will be folded
            // (the fold sets the seq from the record; the text never carries it).
            op.created_seq = s.staging_seq;
            let follow = follow
                .map(|t| transition_rec(sealer.as_deref(), &op, t))
                .transpose()?;
            op.created_seq = 0;
            let mut recs = vec![typed_rec(
                KIND_CREATED,
                Created {
                    operation: op,
                    approval,
                },
            )?];
            recs.extend(follow);
            Ok((recs, Some((view, true, claimed))))
        })
        .await
        .map_err(commit_err)
    }

    fn vouch(&self, id: &str, client: &str, plan_digest: &str) {
        let mut v = self.vouched.lock().unwrap_or_else(|p| p.into_inner());
        v.insert(
            id.to_string(),
            Vouch {
                client: client.to_string(),
                plan_digest: plan_digest.to_string(),
            },
        );
    }

    /// Whether this process accepted something under `id` from a connection whose identity
    /// it checked (what it accepted is [`Self::vouch_of`]'s to say).
    pub(super) fn vouched(&self, id: &str) -> bool {
        let v = self.vouched.lock().unwrap_or_else(|p| p.into_inner());
        v.contains_key(id)
    }

    /// What this process accepted under `id`, if anything.
    pub(super) fn vouch_of(&self, id: &str) -> Option<Vouch> {
        let v = self.vouched.lock().unwrap_or_else(|p| p.into_inner());
        v.get(id).cloned()
    }

    pub(super) fn unvouch(&self, id: &str) {
        let mut v = self.vouched.lock().unwrap_or_else(|p| p.into_inner());
        v.remove(id);
    }

    fn replay(
        &self,
        client: &str,
        key: &str,
        submitted: &str,
    ) -> Result<Option<OperationView>, OpError> {
        let sealer = self.sealer();
        self.ws.read(|s| {
            let ops = &s.operations;
            match ops.by_idempotency(client, key) {
                Some(op) if op.submitted == submitted => {
                    replayable(sealer.as_deref(), op, ops.approval_of(op))?;
                    Ok(Some(OperationView::of(op)))
                }
                Some(_) => Err(conflict()),
                None => Ok(None),
            }
        })
    }

    fn submit_lock(&self, client: &str, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.submit_locks.lock().unwrap_or_else(|p| p.into_inner());
        if locks.len() > 1024 {
            locks.retain(|_, w| w.strong_count() > 0);
        }
        let k = (client.to_string(), key.to_string());
        if let Some(l) = locks.get(&k).and_then(std::sync::Weak::upgrade) {
            return l;
        }
        let l = Arc::new(tokio::sync::Mutex::new(()));
        locks.insert(k, Arc::downgrade(&l));
        l
    }
}

/// A submission is answered with the operation already recorded under its idempotency key
/// only if a gaffer on this machine accepted that operation from this client and made its last
/// change, if any, from a state it had left: a record the agent wrote under another client's
/// key, or a change it appended to a genuine operation, would otherwise report an outcome that
/// never happened.
fn replayable(
    sealer: Option<&Sealer>,
    op: &Operation,
    approval: Option<&Approval>,
) -> Result<(), OpError> {
    let (request, outcome) =
        sealer.map_or((false, false), |s| (s.checks(op, approval), s.stands(op)));
    let what = match (request, outcome) {
        (true, true) => return Ok(()),
        (false, _) => "the operation recorded under this idempotency key",
        (true, false) => "the last change recorded for the operation under this idempotency key",
    };
    Err(OpError::new(
        ErrorKind::Conflict,
        codes::REQUEST_UNVERIFIED,
        format!(
            "{what} carries no seal of this machine (written into the store by something \
             else, on another machine, or before gaffer sealed requests), so it is not \
             reported as this request's; read the effect itself before submitting again \
             under a new idempotency key"
        ),
    ))
}

/// The policy's verdict (with the client's active window grants), a catalog-required
/// approval overriding an allow.
fn decide_policy(
    policy: &Policy,
    ws: &crate::workspace::Workspace,
    client: &str,
    lane_scope: Option<Vec<String>>,
    p: &Prepared,
    now: u64,
) -> Decision {
    let desc = p.adapter.descriptor();
    let req = PolicyRequest {
        client,
        operation: &desc.name,
        class: &p.class,
        lane_scope: lane_scope.as_deref(),
    };
    let fits = window_fits(policy, &req, desc, now);
    let grants = ws.read(|s| active_grants(&s.operations, client, now, fits));
    let mut decision = policy.decide(&req, &grants, now);
    if desc.requires_approval && decision.effect == DecisionEffect::Allow {
        decision.effect = DecisionEffect::Request;
        decision.reason = "approval_required".into();
        decision.grant_id = None;
        decision.grant_policy = Some(GrantPolicy::default_for_missing_policy());
    }
    decision
}

/// Bounds and exact form of the request: (trimmed key, trimmed reason, digest of the exact
/// submission, compared on replay).
fn check_input(input: &SubmitInput) -> Result<(String, String, String), OpError> {
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
        if crate::util::json_deeper_than(raw.as_bytes(), MAX_VALUE_DEPTH) {
            return Err(OpError::invalid(
                field,
                format!("{field} nests deeper than {MAX_VALUE_DEPTH} levels"),
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
    let submitted = exact_object_of_sorted(&[
        ("arguments", Member::Exact(&args_ex)),
        ("operation", Member::Str(&input.operation)),
        ("reason", Member::Str(&reason)),
        ("target", Member::Exact(&target_ex)),
    ]);
    // Only the digest is kept: equal digests mean byte-equal exact forms.
    Ok((key, reason, crate::util::sha256_hex(submitted.as_bytes())))
}

fn outcome_of(
    decision: &Decision,
    desc: &super::super::adapter::Descriptor,
) -> Result<Outcome, OpError> {
    let mut o = Outcome {
        state: OpState::Pending,
        error: None,
        approval_id: None,
        mode: None,
        requested: None,
        pending_s: 0,
    };
    match decision.effect {
        DecisionEffect::Allow => {
            o.state = OpState::Approved;
            o.approval_id = decision.grant_id.clone();
        }
        DecisionEffect::Deny | DecisionEffect::NoMatch => {
            o.state = OpState::Denied;
            // A policy that cannot be used refuses everything: say why, so the file is fixed.
            let unusable = (decision.reason == "policy_unavailable")
                .then(|| decision.rule_ids.first())
                .flatten();
            let message = match unusable {
                Some(why) => format!("the workspace policy cannot be used: {why}"),
                None if decision.effect == DecisionEffect::Deny => {
                    "the workspace policy denies this operation".to_string()
                }
                None => "no policy rule allows this operation".to_string(),
            };
            o.error = Some(OpFailure::new(codes::POLICY_DENIED, message));
        }
        DecisionEffect::Request => {
            let gp = decision
                .grant_policy
                .clone()
                .unwrap_or_else(GrantPolicy::default_for_missing_policy);
            match approval_intent(&gp, desc.approval_ttl_seconds, desc.request_ttl_seconds) {
                Ok((dur, uses, pend)) => {
                    o.mode = Some(gp.mode);
                    o.requested = Some((dur, uses));
                    o.pending_s = pend;
                    o.approval_id = Some(new_id("ap_")?);
                }
                Err(msg) => {
                    o.state = OpState::Failed;
                    o.error = Some(OpFailure::new(codes::APPROVAL_REQUEST_FAILED, msg));
                }
            }
        }
    }
    Ok(o)
}

/// The operation record, its approval request and the immutable plan.
#[allow(clippy::too_many_arguments)]
fn build(
    client: &str,
    id: &str,
    key: String,
    reason: String,
    submitted: String,
    p: &Prepared,
    decision: &Decision,
    o: &Outcome,
    now: u64,
) -> (Operation, Option<Approval>, Plan) {
    let desc = p.adapter.descriptor();
    let expires_at_ms = match o.state {
        OpState::Pending => now + (o.pending_s + o.requested.map_or(0, |r| r.0)) * 1000,
        _ => now + desc.approval_ttl_seconds * 1000,
    };
    let plan = Plan {
        schema: PLAN_SCHEMA.into(),
        operation: desc.name.clone(),
        operation_revision: desc.operation_revision,
        provider: desc.provider.clone(),
        client_id: client.to_string(),
        operation_id: id.to_string(),
        target: p.resolved.target.clone(),
        arguments: p.resolved.arguments.clone(),
        preconditions: p.resolved.preconditions.clone(),
        presentation: p.presentation.clone(),
        authorization: PlanAuthorization {
            classification: p.class.clone(),
            policy_effect: decision.effect,
            rule_ids: decision.rule_ids.clone(),
            mode: o.mode,
            requested_duration_seconds: o.requested.map(|r| r.0),
            requested_max_uses: o.requested.map(|r| r.1),
        },
        created_at_ms: now,
        expires_at_ms,
    };
    let plan_text = plan.canonical();
    let digest = Plan::digest_of(&plan_text);
    let approval = match (o.state, &o.approval_id, o.mode, o.requested) {
        (OpState::Pending, Some(aid), Some(mode), Some((dur, uses))) => Some(Approval {
            id: aid.clone(),
            operation_id: id.to_string(),
            client_id: client.to_string(),
            operation: desc.name.clone(),
            plan_digest: digest.clone(),
            classification: p.class.clone(),
            mode,
            status: ApprovalStatus::Pending,
            revision: 1,
            created_at_ms: now,
            pending_expires_at_ms: now + o.pending_s * 1000,
            requested_duration_seconds: dur,
            requested_max_uses: uses,
            decision: None,
            uses: BTreeMap::new(),
            decision_keys: BTreeMap::new(),
        }),
        _ => None,
    };
    let op = Operation {
        id: id.to_string(),
        client_id: client.to_string(),
        idempotency_key: key,
        operation: desc.name.clone(),
        provider: desc.provider.clone(),
        submitted,
        reason,
        target: Arc::new(p.resolved.target.clone()),
        arguments: Arc::new(p.resolved.arguments.clone()),
        state: o.state,
        revision: 1,
        approval_id: o.approval_id.clone(),
        created_at_ms: now,
        updated_at_ms: now,
        terminal_at_ms: o.state.is_terminal().then_some(now),
        presentation: p.presentation.clone(),
        plan_digest: Some(digest),
        plan: Some(plan_text),
        result: None,
        upstream_status: None,
        error: o.error.clone(),
        executor: None,
        request_seal: None,
        created_seq: 0,
        step_seal: None,
    };
    (op, approval, plan)
}

/// Chosen approval bounds: (duration seconds, uses, pending seconds), or why they break the
/// rule's own limits. The decision is bounded by the same [`GrantBound`] again, from the
/// policy then, not from what is recorded here.
pub(super) fn approval_intent(
    gp: &GrantPolicy,
    approval_ttl: u64,
    request_ttl: u64,
) -> Result<(u64, u32, u64), String> {
    let b = GrantBound::of_rule(gp, approval_ttl).map_err(|e| e.to_string())?;
    let pending = (u64::from(gp.request_ttl_minutes) * 60).min(request_ttl);
    Ok((b.duration_seconds, b.max_uses, pending))
}

/// A client's window approvals that may cover a new submission. The policy uses them only
/// to route the submission; the claim verifies the signature before anything runs. `fits`
/// says whether a window's signed scope may still cover the plan (see [`window_fits`]).
pub(super) fn active_grants(
    s: &OperationState,
    client: &str,
    now: u64,
    fits: impl Fn(Scope) -> bool,
) -> Vec<ActiveGrant> {
    // The index holds the client's active window approvals; the rest is checked here.
    s.index
        .windows
        .get(client)
        .into_iter()
        .flatten()
        .filter_map(|id| s.approvals.get(id))
        .filter(|a| {
            a.client_id == client
                && a.mode == GrantMode::Window
                && a.status == ApprovalStatus::Active
                && !a.has_retained()
        })
        .filter_map(|a| {
            let d = a.decision.as_ref()?;
            let scope = Scope {
                mode: a.mode,
                duration_ms: d.expires_at_ms?.saturating_sub(d.decided_at_ms),
                max_uses: d.max_uses,
            };
            fits(scope).then_some(())?;
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

/// Which window scopes the claim would still accept for a plan the policy decides like `req`
/// ([`window_covers`]): a submission routed to a window the claim refuses would fail each time
/// until the window is revoked, where without it the plan asks for an approval under the
/// policy now. The policy's own verdict is looked up once, and only if the client has windows.
pub(super) fn window_fits<'a>(
    policy: &'a Policy,
    req: &'a PolicyRequest<'a>,
    desc: &'a super::super::adapter::Descriptor,
    now: u64,
) -> impl Fn(Scope) -> bool + 'a {
    let verdict = std::cell::OnceCell::new();
    move |s| {
        let d = verdict.get_or_init(|| policy.decide(req, &[], now));
        window_covers(d, desc.requires_approval, desc.approval_ttl_seconds, s).is_ok()
    }
}
