//! Execution: re-derive the plan from its text (decode, resolve afresh, classify), authorize
//! it in the claim commit, run it once, and settle the outcome (proven, or reconciled).

use std::sync::Arc;

use super::super::adapter::{Adapter, AdapterCtx, FailureKind, Outcome, Resolved};
use super::super::authorize::{Check, authorize};
use super::super::lifecycle::{OpState, codes};
use super::super::plan::Plan;
use super::super::policy::{Classification, Policy};
use super::super::state::{ApprovalChange, ApprovalEffect, Operation, UseState};
use super::*;
use crate::anchor::ClaimRefused;

/// The outcome of an execution, as recorded.
#[derive(Clone)]
pub(super) enum Settle {
    Succeeded(Outcome),
    Failed {
        code: String,
        message: String,
        effect: ApprovalEffect,
    },
}

/// An approval's use as signed: claimed again on the anchor before the effect.
struct Spend {
    approval_id: String,
    max_uses: u32,
    expires_at_ms: u64,
}

/// What the claim commit decided.
enum Claim {
    Run {
        spend: Option<Spend>,
        /// The policy that authorized the claim (its sandbox setting governs the run).
        policy: Arc<Policy>,
    },
    /// The operation changed before the claim (another process took it, or it moved on).
    Skip,
    /// A trust record arrived after the authority was looked up: look it up again.
    Stale,
    /// Refused and recorded as failed.
    Refused,
}

/// A plan read back from its text and checked by its adapter now.
pub(super) struct Rederived {
    pub plan: Plan,
    pub digest: String,
    pub class: Classification,
    pub adapter: Arc<dyn Adapter>,
}

/// Why a stored plan cannot run: (code, message) for the audit log.
pub(super) type Unfit = (&'static str, String);

impl OperationRuntime {
    pub(super) fn spawn_drive(&self, id: String) {
        if !self.autorun.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let Some(me) = self.me.upgrade() else { return };
        tokio::spawn(async move { me.drive(&id).await });
    }

    /// Runs an operation claimed in the submit commit, under the policy that authorized it.
    pub(super) fn spawn_execute(
        &self,
        id: String,
        plan: Plan,
        approval_id: Option<String>,
        policy: Arc<Policy>,
    ) {
        let Some(me) = self.me.upgrade() else { return };
        tokio::spawn(async move {
            failpoint("after_claim");
            let run = me.execute_claimed(&id, Box::new(plan), approval_id, &policy);
            if let Err(e) = run.await {
                tracing::error!(operation = %id, error = %e, "operation could not be executed");
            }
        });
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
        let Some(op) = self.ws.read(|s| s.operations.get(id).cloned()) else {
            return Ok(());
        };
        if op.state != OpState::Approved {
            return Ok(());
        }
        // A process that cannot verify signatures leaves approved work to one that can,
        // rather than failing it for a reason that is its own.
        if op.approval_id.is_some() && crate::operator::current_public().is_none() {
            tracing::warn!(
                operation = id,
                "no operator public key here; leaving the approved operation to a process that has one"
            );
            return Ok(());
        }
        if self.belongs_to_its_submitter(&op) {
            return Ok(());
        }
        let now = crate::util::now_ms();
        let derived = self.rederive(&op, now, true).await;
        let claim = self.claim(&op, &derived, now).await?;
        if !matches!(claim, Claim::Skip) {
            self.unvouch(id);
        }
        let (Claim::Run { spend, policy }, Ok(d)) = (claim, derived) else {
            return Ok(());
        };
        failpoint("after_claim");
        let approval_id = spend.as_ref().map(|s| s.approval_id.clone());
        if let Some(spend) = spend
            && let Err(why) = self.spend_here(id, spend).await
        {
            tracing::error!(operation = id, reason = %why, "approval use refused by the anchor");
            let settle = Settle::Failed {
                code: codes::APPROVAL_UNAVAILABLE.into(),
                message: format!("the approval cannot be used: {why}"),
                effect: ApprovalEffect::Release,
            };
            return self.finish(id, &op.operation, approval_id, settle).await;
        }
        self.execute_claimed(id, Box::new(d.plan), approval_id, &policy)
            .await
    }

    /// Claims the approval's use on this machine's anchor, outside the workspace, before the
    /// effect: the journal's reservation alone can be undone by whoever writes the store.
    async fn spend_here(&self, id: &str, spend: Spend) -> Result<(), ClaimRefused> {
        let anchor = self
            .ws
            .anchor()
            .ok_or_else(|| ClaimRefused::Unrecorded("the store does not stand intact".into()))?;
        let id = id.to_string();
        tokio::task::spawn_blocking(move || {
            anchor.claim(&spend.approval_id, &id, spend.max_uses, spend.expires_at_ms)
        })
        .await
        .unwrap_or_else(|e| Err(ClaimRefused::Unrecorded(e.to_string())))
    }

    /// Gives back, on the anchor, a use this process claimed for an effect that never started.
    async fn unspend_here(&self, id: &str, approval_id: &str) {
        let Some(anchor) = self.ws.anchor() else {
            return;
        };
        let (id, aid) = (id.to_string(), approval_id.to_string());
        let released = tokio::task::spawn_blocking(move || anchor.release(&aid, &id)).await;
        if let Ok(Err(e)) = released {
            tracing::warn!(operation = %approval_id, error = %e, "the released use stays spent");
        }
    }

    /// An operation whose authority depends on who submitted it (a policy rule, or a window
    /// grant over another operation) is executed by the process that accepted it. While another
    /// gaffer process lives, this one leaves it alone instead of failing it for want of a vouch
    /// that is not its to give. (The stored approval fields only steer this choice; the claim
    /// re-checks everything.)
    fn belongs_to_its_submitter(&self, op: &Operation) -> bool {
        if self.vouched(&op.id) {
            return false;
        }
        let needs_vouch = match self.ws.read(|s| s.operations.approval_of(op).cloned()) {
            None => true,
            Some(a) => a.mode == super::super::policy::GrantMode::Window && a.operation_id != op.id,
        };
        needs_vouch && {
            let peers = super::super::live_executors(&self.ws.gaffer_dir().join("peers"));
            peers.iter().any(|e| *e != self.executor)
        }
    }

    /// Reads the plan back from its text and has its adapter check it as if it were new:
    /// the text decodes to itself, the target resolves to the same place now (paths
    /// normalised and confined, `.gaffer/` refused), and the classification comes from the
    /// text, not from any stored copy.
    ///
    /// Reconciling an interrupted execution passes `resolve: false`: the effect may already
    /// have happened (a deleted file no longer resolves), and reconciling only reads back.
    pub(super) async fn rederive(
        &self,
        op: &Operation,
        now: u64,
        resolve: bool,
    ) -> Result<Rederived, Unfit> {
        let stored = |m: &str| (codes::INVALID_STORED, m.to_string());
        let (text, digest) = op
            .plan
            .as_deref()
            .zip(op.plan_digest.as_deref())
            .ok_or_else(|| stored("the operation has no stored plan"))?;
        let plan = Plan::verify(text, digest, &op.id, &op.client_id, now, resolve)
            .map_err(|e| stored(&format!("the stored plan is not usable: {e}")))?;
        let adapter = self
            .registry
            .lookup(&plan.operation)
            .filter(|_| plan.operation == op.operation)
            .cloned()
            .ok_or_else(|| stored("the stored plan names an operation without an adapter"))?;
        let decoded = adapter
            .decode(&plan.target, &plan.arguments)
            .await
            .map_err(|e| {
                stored(&format!(
                    "the plan's input no longer decodes: {}",
                    redact(&e.message)
                ))
            })?;
        if decoded.target != plan.target || decoded.arguments != plan.arguments {
            return Err(stored(
                "the plan's input is not in the adapter's canonical form",
            ));
        }
        if resolve {
            let ctx = self.ctx(&op.id, &op.client_id);
            let fresh = adapter.resolve(&ctx, decoded).await.map_err(|e| {
                stored(&format!(
                    "the plan's target does not resolve now: {}",
                    redact(&e.message)
                ))
            })?;
            if fresh.target != plan.target {
                return Err(stored("the plan's target resolves to another place now"));
            }
        }
        let class = adapter.authorize(&plan.resolved()).await.map_err(|e| {
            stored(&format!(
                "the plan cannot be classified: {}",
                redact(&e.message)
            ))
        })?;
        Ok(Rederived {
            digest: Plan::digest_of(text),
            plan,
            class,
            adapter,
        })
    }

    /// The journal head the operation's approval was signed at lies on this chain (no
    /// approval: nothing to check).
    fn signed_head_on_chain(&self, op: &Operation) -> bool {
        let head = self.ws.read(|s| {
            let d = s.operations.approval_of(op)?.decision.as_ref()?;
            Some(d.operator_signature.head.clone())
        });
        head.is_none_or(|h| self.head_on_chain(&h))
    }

    /// The claim commit: `approved -> executing` plus the approval's reservation when the one
    /// authorization check passes, else `failed` with its reason (the audit log says why).
    async fn claim(
        &self,
        op: &Operation,
        derived: &Result<Rederived, Unfit>,
        now: u64,
    ) -> Result<Claim, OpError> {
        // The policy and key that authorize are the ones in force when the claim is staged: a
        // trust record folded in, or the policy file or key changed, while this claim waited
        // for its batch sends it back for a fresh look-up (bounded: these are operator acts).
        for _ in 0..8 {
            match self.claim_under(op, derived, now, self.authority()).await? {
                Claim::Stale => continue,
                decided => return Ok(decided),
            }
        }
        tracing::warn!(
            operation = %op.id,
            "the trust records, the policy file or the operator key changed before each of 8 \
             claims was committed; the operation stays approved until its next drive"
        );
        Ok(Claim::Skip)
    }

    async fn claim_under(
        &self,
        op: &Operation,
        derived: &Result<Rederived, Unfit>,
        now: u64,
        authority: Authority,
    ) -> Result<Claim, OpError> {
        let Authority {
            policy,
            grounds,
            trust_seq,
        } = authority;
        let watch = Arc::clone(&self.grounds);
        let workspace_id = self.ws.workspace_id();
        let chain_ok = self.ws.chain_ok() && self.signed_head_on_chain(op);
        let store_refusal = self.ws.standing().refusal();
        let executor = self.executor.clone();
        let vouch = self.vouch_of(&op.id);
        let lane_scope = self.lane_scope(&op.client_id);
        let (id, revision) = (op.id.clone(), op.revision);
        let checked = match derived {
            Ok(d) => Ok((
                d.digest.clone(),
                d.class.clone(),
                d.adapter.descriptor().requires_approval,
                d.adapter.descriptor().approval_ttl_seconds,
            )),
            Err(e) => Err(e.clone()),
        };
        let sealer = self.sealer();
        self.commit(move |s: &crate::workspace::State| {
            let ops = &s.operations;
            let Some(op) = ops
                .get(&id)
                .filter(|o| o.state == OpState::Approved && o.revision == revision)
            else {
                return Ok((vec![], Claim::Skip));
            };
            if s.trust.last_seq != trust_seq || watch.at_staging() != grounds {
                return Ok((vec![], Claim::Stale));
            }
            let key = &grounds.key;
            let fail = |code: &str, msg: &str| -> Result<(Vec<NewRecord>, Claim), OpError> {
                tracing::warn!(operation = %op.id, code, reason = msg, "execution refused");
                let t = transition(op, OpState::Failed, now).error(code, msg);
                Ok((
                    vec![transition_rec(sealer.as_deref(), op, t)?],
                    Claim::Refused,
                ))
            };
            if let Some(why) = store_refusal.as_deref() {
                return fail(codes::STORE_ROLLED_BACK, why);
            }
            let (digest, class, requires_approval, approval_ttl_seconds) = match &checked {
                Ok(c) => c,
                Err((code, msg)) => return fail(code, msg),
            };
            let check = Check {
                operation_id: &op.id,
                client: &op.client_id,
                operation: &op.operation,
                plan_digest: digest,
                class,
                requires_approval: *requires_approval,
                approval_ttl_seconds: *approval_ttl_seconds,
                approval: ops.approval_of(op),
                points_at_approval: op.approval_id.is_some(),
                policy: &policy,
                key: key.as_ref(),
                workspace_id: workspace_id.as_deref(),
                chain_ok,
                store_refusal: store_refusal.as_deref(),
                // Vouched only for the client and plan accepted: the operation under this id
                // now, its plan read from its text.
                vouched: vouch
                    .as_ref()
                    .is_some_and(|v| v.client == op.client_id && v.plan_digest == *digest),
                lane_scope: lane_scope.as_deref(),
                now_ms: now,
            };
            let spend = match authorize(&check) {
                Ok(super::super::authorize::Authority::Approval {
                    approval_id,
                    max_uses,
                    expires_at_ms,
                }) => Some(Spend {
                    approval_id,
                    max_uses,
                    expires_at_ms,
                }),
                Ok(super::super::authorize::Authority::Policy { .. }) => None,
                Err(r) => return fail(r.code, &r.message),
            };
            let mut t = transition(op, OpState::Executing, now).approval(spend.as_ref().map(|s| {
                ApprovalChange {
                    approval_id: s.approval_id.clone(),
                    effect: ApprovalEffect::Reserve,
                }
            }));
            t.executor = Some(executor);
            Ok((
                vec![transition_rec(sealer.as_deref(), op, t)?],
                Claim::Run {
                    spend,
                    policy: Arc::clone(&policy),
                },
            ))
        })
        .await
        .map_err(commit_err)
    }

    /// Runs an operation this process has claimed (`executing` is durable), then settles it.
    async fn execute_claimed(
        &self,
        id: &str,
        plan: Box<Plan>,
        approval_id: Option<String>,
        policy: &Policy,
    ) -> Result<(), OpError> {
        let Some(adapter) = self.registry.lookup(&plan.operation).cloned() else {
            return Ok(());
        };
        let who = self.ws.read(|s| {
            let op = s.operations.get(id)?;
            Some((op.client_id.clone(), op.operation.clone()))
        });
        let Some((client, operation)) = who else {
            return Ok(());
        };
        let ctx = self.ctx_with(id, &client, policy);
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
        if let (Settle::Failed { effect, .. }, Some(aid)) = (&settle, &approval_id)
            && *effect == ApprovalEffect::Release
        {
            self.unspend_here(id, aid).await;
        }
        let (succeeded, exit_code) = match &settle {
            Settle::Succeeded(o) => (
                true,
                o.result
                    .as_ref()
                    .and_then(|r| r.get("exit_code"))
                    .and_then(|c| c.as_i64()),
            ),
            Settle::Failed { .. } => (false, None),
        };
        self.remember_execution(
            id,
            super::ExecutedHere {
                client,
                operation: operation.clone(),
                succeeded,
                exit_code,
            },
        );
        self.finish(id, &operation, approval_id, settle).await?;
        adapter.cleanup(&ctx, &resolved).await;
        Ok(())
    }

    pub(super) async fn reconcile_or_fail(
        &self,
        adapter: &dyn Adapter,
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

    pub(super) async fn finish(
        &self,
        id: &str,
        operation: &str,
        approval_id: Option<String>,
        settle: Settle,
    ) -> Result<(), OpError> {
        let id = id.to_string();
        let operation = operation.to_string();
        let now = crate::util::now_ms();
        let sealer = self.sealer();
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
            Ok((vec![transition_rec(sealer.as_deref(), op, t)?], ()))
        })
        .await
        .map_err(commit_err)
    }
}
